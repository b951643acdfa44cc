// The fuzz target's entry point, built once per target (tests/fuzz/CMakeLists.txt defines
// PARASOL_FUZZ_TARGET, the target's name): the bytes go to that target's reader
// (target_readers.h) under the contract of fuzz_target.h. With PARASOL_FUZZ the executable is a
// libFuzzer program; otherwise replay_main.cc runs it once over each file it is given.
#include "tests/fuzz/fuzz_target.h"
#include "tests/fuzz/target_readers.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const parasol::fuzz::TargetReader& reader =
      parasol::fuzz::target_reader(PARASOL_FUZZ_TARGET);
  return parasol::fuzz::run_reader(data, size, reader.read);
}
