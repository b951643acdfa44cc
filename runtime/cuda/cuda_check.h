// PARASOL_CUDA_CHECK: turns a failed CUDA runtime call into parasol::SystemError (plain C++; used
// by the host files and the .cu files alike).
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "core/error.h"

namespace parasol::runtime::cuda {

[[noreturn]] inline void fail(const char* what, cudaError_t e, const char* file, int line) {
  throw SystemError("runtime.cuda", std::string(what) + ": " + cudaGetErrorString(e) + " (" + file +
                                        ":" + std::to_string(line) + ")");
}

#define PARASOL_CUDA_CHECK(expr)                                               \
  do {                                                                         \
    const cudaError_t parasol_err_ = (expr);                                   \
    if (parasol_err_ != cudaSuccess)                                           \
      ::parasol::runtime::cuda::fail(#expr, parasol_err_, __FILE__, __LINE__); \
  } while (0)

// After a kernel launch: reports launch errors (bad configuration), not asynchronous faults.
#define PARASOL_CUDA_LAUNCHED() PARASOL_CUDA_CHECK(cudaGetLastError())

}  // namespace parasol::runtime::cuda
