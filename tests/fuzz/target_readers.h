// The reader each fuzz target drives, as `parasol` reads the file it stands for, in one place:
// the libFuzzer targets (<target>_fuzz.cc, one reader each) and the deterministic structure
// sweep (structure_sweep_test.cc, every JSON reader) call the same functions. A reader given any
// bytes returns (what it read passed its invariants, reader_checks.h), throws parasol::Error (a
// clean rejection naming the field), or fails: any other exception, a crash or a hang is a bug.
#pragma once

#include <string>
#include <vector>

namespace parasol::fuzz {

struct TargetReader {
  const char* target;  // the fuzz target's name: tests/fuzz/{corpus,regressions}/<target>/
  bool json;           // whether it has JSON seeds to sweep (token_file reads binary)
  void (*read)(const std::string& bytes);
};

// Every target, in the order tests/fuzz/CMakeLists.txt lists them.
const std::vector<TargetReader>& target_readers();
// The reader of `target`. REQUIRES: target is one of target_readers().
const TargetReader& target_reader(const std::string& target);

}  // namespace parasol::fuzz
