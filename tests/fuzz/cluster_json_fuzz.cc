// Fuzz target: cluster JSON (presets, generators and explicit graphs: cluster_from_json).
#include "core/cluster.h"
#include "core/json_reader.h"
#include "tests/fuzz/fuzz_target.h"
#include "tests/fuzz/reader_checks.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace parasol;
  return fuzz::run_reader(data, size, [](const std::string& text) {
    fuzz::check_cluster(cluster_from_json(parse_json(text, "cluster")));
  });
}
