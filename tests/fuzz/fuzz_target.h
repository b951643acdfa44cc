// The contract every fuzz target checks: a reader given any bytes either returns an object that
// passes its invariants (reader_checks.h) or throws parasol::Error. Any other exception, a
// crash, a sanitizer report or a hang is a bug; the first is turned into an abort here so that
// libFuzzer records the input.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include "core/error.h"

namespace parasol::fuzz {

// Calls read(text) where text holds the fuzzer's bytes.
template <typename Read>
int run_reader(const uint8_t* data, size_t size, Read&& read) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    read(text);
  } catch (const Error&) {
    // A clean rejection naming the field.
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fuzz: a reader threw a non-parasol exception: %s\n", e.what());
    std::abort();
  }
  return 0;
}

}  // namespace parasol::fuzz

// libFuzzer's entry point, defined by each target (replay_main.cc calls it without libFuzzer).
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
