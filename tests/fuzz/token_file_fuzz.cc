// Fuzz target: an llm.c .bin token file (runtime::TokenFile), as `parasol run --data FILE` reads
// it: the header is validated on opening, and every token filled must lie in [0, vocab).
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <vector>

#include "runtime/data.h"
#include "tests/fuzz/fuzz_target.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace parasol;
  static const std::string path = (std::filesystem::temp_directory_path() /
                                   ("parasol-fuzz-tokens-" + std::to_string(getpid()) + ".bin"))
                                      .string();
  return fuzz::run_reader(data, size, [](const std::string& bytes) {
    std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
    constexpr int64_t kSeq = 8, kVocab = 512;
    const runtime::TokenFile file(path, kSeq, kVocab);
    std::vector<int32_t> tokens(kSeq), labels(kSeq);
    for (int64_t s = 0; s < 3; ++s) {
      file.fill(s, 0, kSeq, tokens.data(), labels.data());
      for (int64_t i = 0; i < kSeq; ++i)
        if (tokens[i] < 0 || tokens[i] >= kVocab || labels[i] < 0 || labels[i] >= kVocab)
          throw std::logic_error("a token outside the vocabulary was filled");
    }
  });
}
