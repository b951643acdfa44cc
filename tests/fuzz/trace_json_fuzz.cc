// Fuzz target: Chrome trace JSON (traces::trace_from_json), as `compare` and `calibrate` read it.
#include "core/json_reader.h"
#include "tests/fuzz/fuzz_target.h"
#include "tests/fuzz/reader_checks.h"
#include "traces/trace.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace parasol;
  return fuzz::run_reader(data, size, [](const std::string& text) {
    fuzz::check_trace(traces::trace_from_json(parse_json(text, "trace"), "trace"));
  });
}
