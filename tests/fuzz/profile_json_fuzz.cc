// Fuzz target: profile JSON (cost::profile_from_json), as `--profile FILE` reads it.
#include "core/json_reader.h"
#include "cost_models/profile.h"
#include "tests/fuzz/fuzz_target.h"
#include "tests/fuzz/reader_checks.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace parasol;
  return fuzz::run_reader(data, size, [](const std::string& text) {
    fuzz::check_profile(cost::profile_from_json(parse_json(text, "profile")));
  });
}
