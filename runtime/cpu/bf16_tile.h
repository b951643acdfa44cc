// The fp32 scratch of CpuBackend's typed bf16 kernels (bf16_ops.cc, bf16_elementwise.cc): a block
// of bf16 rows widened into dense fp32, and dense fp32 rounded back (to nearest even, as
// runtime/tensor.h) into bf16 rows. Rows may be strided (ld elements apart); a dense run of n
// elements is one row of n.
#pragma once

#include <cstdint>

#include "runtime/tensor.h"

namespace parasol::runtime::bf16_tile {

// dst[r][c] = src[r * ld + c] widened, for r < rows, c < cols (dst dense).
inline void widen(float* dst, const uint16_t* src, int64_t ld, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) dst[r * cols + c] = bf16_to_fp32(src[r * ld + c]);
}

// dst[r * ld + c] = src[r][c] rounded to nearest even.
inline void narrow(uint16_t* dst, int64_t ld, const float* src, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) dst[r * ld + c] = fp32_to_bf16(src[r * cols + c]);
}

}  // namespace parasol::runtime::bf16_tile
