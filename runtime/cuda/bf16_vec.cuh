// Vectorised bf16 access for the kernels on bf16 storage: 8 consecutive bf16 (16 bytes) in one
// load or store where the row allows it (bf16_rows_aligned), else element by element; the values
// widened to fp32 in registers (exactly: a bf16 is the high half of an fp32) and rounded back to
// nearest even on the store (cuda_common.cuh's fp32_to_bf16, the CPU's bit operations).
#pragma once

#include <cstdint>

#include "runtime/cuda/cuda_common.cuh"

namespace parasol::runtime::cuda {

inline constexpr int kBf16Vec = 8;

// Whether rows of `cols` bf16 with row stride `ld` starting at p are all 16-byte aligned.
inline bool bf16_rows_aligned(const void* p, int64_t ld, int64_t cols) {
  return p == nullptr ||
         (reinterpret_cast<uintptr_t>(p) % 16 == 0 && ld % kBf16Vec == 0 && cols % kBf16Vec == 0);
}

// x[i] = p[c0 + i] widened, for c0 + i < n; `fill` past n.
__device__ inline void load_bf16x8(float (&x)[kBf16Vec], const uint16_t* p, int64_t c0, int64_t n,
                                   bool aligned, float fill = 0.0f) {
  if (aligned && c0 + kBf16Vec <= n) {
    const uint4 w = *reinterpret_cast<const uint4*>(p + c0);
    const uint32_t u[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      x[2 * i] = __uint_as_float(u[i] << 16);
      x[2 * i + 1] = __uint_as_float(u[i] & 0xFFFF0000u);
    }
    return;
  }
#pragma unroll
  for (int i = 0; i < kBf16Vec; ++i) x[i] = c0 + i < n ? bf16_to_fp32(p[c0 + i]) : fill;
}

// p[c0 + i] = x[i] rounded to bf16, for c0 + i < n.
__device__ inline void store_bf16x8(uint16_t* p, const float (&x)[kBf16Vec], int64_t c0, int64_t n,
                                    bool aligned) {
  if (aligned && c0 + kBf16Vec <= n) {
    uint4 w;
    w.x = fp32_to_bf16(x[0]) | (uint32_t{fp32_to_bf16(x[1])} << 16);
    w.y = fp32_to_bf16(x[2]) | (uint32_t{fp32_to_bf16(x[3])} << 16);
    w.z = fp32_to_bf16(x[4]) | (uint32_t{fp32_to_bf16(x[5])} << 16);
    w.w = fp32_to_bf16(x[6]) | (uint32_t{fp32_to_bf16(x[7])} << 16);
    *reinterpret_cast<uint4*>(p + c0) = w;
    return;
  }
  for (int i = 0; i < kBf16Vec && c0 + i < n; ++i) p[c0 + i] = fp32_to_bf16(x[i]);
}

// The GELU (tanh approximation, GPT-2's, written x sigmoid(2u) as the CPU) and its derivative,
// shared by activation.cu and the bf16 kernels.
inline constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)
inline constexpr float kGeluCube = 0.044715f;
__device__ inline float sigmoidf_acc(float x) { return 1.0f / (1.0f + expf(-x)); }
__device__ inline float gelu_of(float x) {
  return x * sigmoidf_acc(2.0f * kGeluScale * (x + kGeluCube * x * x * x));
}
__device__ inline float gelu_grad_of(float x) {
  const float s = sigmoidf_acc(2.0f * kGeluScale * (x + kGeluCube * x * x * x));
  const float du = kGeluScale * (1.0f + 3.0f * kGeluCube * x * x);
  return s + 2.0f * x * s * (1.0f - s) * du;
}

}  // namespace parasol::runtime::cuda
