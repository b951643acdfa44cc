// Fuzz target: plan JSON (plan_from_json), then validate() against a small MoE model.
#include "core/json_reader.h"
#include "core/plan.h"
#include "tests/fuzz/fuzz_target.h"
#include "tests/fuzz/reader_checks.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace parasol;
  return fuzz::run_reader(data, size, [](const std::string& text) {
    fuzz::check_plan(plan_from_json(parse_json(text, "plan")));
  });
}
