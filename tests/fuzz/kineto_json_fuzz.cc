// Fuzz target: PyTorch profiler (Kineto) Chrome JSON (traces::import_kineto), as `parasol trace
// import`, `compare --measured` and `calibrate --measured` read it.
#include "core/json_reader.h"
#include "tests/fuzz/fuzz_target.h"
#include "tests/fuzz/reader_checks.h"
#include "traces/kineto_import.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace parasol;
  return fuzz::run_reader(data, size, [](const std::string& text) {
    fuzz::check_kineto_import(traces::import_kineto(parse_json(text, "kineto"), "kineto", 0));
  });
}
