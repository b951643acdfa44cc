// The CPU backend the runtime suites train on: CpuBackend, or with PARASOL_STRICT_DEVICE=1 in the
// environment the StrictCpuBackend, whose device memory the host cannot touch (every host access
// to it crashes, as on a GPU). tests/runtime/CMakeLists.txt runs the trainer and executor suites
// once in each mode.
#pragma once

#include <cstdlib>
#include <cstring>
#include <memory>

#include "runtime/cpu/cpu_backend.h"
#include "runtime/cpu/strict_backend.h"

namespace parasol::runtime::testing {

inline bool strict_device() {
  const char* v = std::getenv("PARASOL_STRICT_DEVICE");
  return v != nullptr && std::strcmp(v, "0") != 0 && *v != '\0';
}

inline std::unique_ptr<Backend> make_test_backend(int gemm_threads) {
  if (strict_device()) return std::make_unique<StrictCpuBackend>(gemm_threads);
  return std::make_unique<CpuBackend>(gemm_threads);
}

}  // namespace parasol::runtime::testing
