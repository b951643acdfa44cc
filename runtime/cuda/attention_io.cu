// defines: cuda::pack_bf16, unpack_bf16, attention_merge_bf16: the operands and results of the
// fused (cuDNN) attention, which reads and writes bf16: strided fp32 token rows rounded into
// packed bf16 rows (runtime/tensor.h's rounding: nearest even), packed bf16 rows widened into
// strided fp32 rows (written or added), and a ring step's bf16 partial output merged into the
// fp32 output of the earlier steps by log-sum-exp (the CPU backend's `accumulate` arithmetic,
// runtime/cpu/attention.cc). One thread per element (merge: per output element, the row's
// weights recomputed from the two lse; cheap next to the attention itself).
#include <cmath>

#include "runtime/cuda/cuda_common.cuh"
#include "runtime/cuda/kernels.h"

namespace parasol::runtime::cuda {

namespace {

__global__ void pack_bf16_kernel(uint16_t* dst, const float* src, int64_t rows, int64_t cols,
                                 int64_t ld) {
  PARASOL_GRID_STRIDE(i, rows * cols) {
    const int64_t r = i / cols, c = i % cols;
    dst[i] = fp32_to_bf16(src[r * ld + c]);
  }
}

__global__ void unpack_bf16_kernel(float* dst, int64_t ld, const uint16_t* src, int64_t rows,
                                   int64_t cols, bool accumulate) {
  PARASOL_GRID_STRIDE(i, rows * cols) {
    const int64_t r = i / cols, c = i % cols;
    const float v = bf16_to_fp32(src[i]);
    float* d = dst + r * ld + c;
    *d = accumulate ? *d + v : v;
  }
}

// Element (t, h, c) of out [batch * seq_q rows of ld_o, heads x dv columns]; lse [b, h, seq_q].
__global__ void merge_kernel(float* out, int64_t ld_o, float* lse, const uint16_t* part,
                             const float* part_lse, int64_t batch, int64_t seq_q, int64_t heads,
                             int64_t dv) {
  const int64_t cols = heads * dv;
  PARASOL_GRID_STRIDE(i, batch * seq_q * cols) {
    const int64_t t = i / cols, col = i % cols, h = col / dv;
    const int64_t b = t / seq_q, s = t % seq_q;
    const int64_t li = (b * heads + h) * seq_q + s;
    const float lc = part_lse[li], lo = lse[li];
    if (lc == -INFINITY) continue;
    float* o = out + t * ld_o + col;
    const float pc = bf16_to_fp32(part[i]);
    if (lo == -INFINITY) {
      *o = pc;
    } else {
      const float mx = fmaxf(lo, lc);
      const float wo = expf(lo - mx), wc = expf(lc - mx);
      *o = (*o * wo + pc * wc) / (wo + wc);
    }
  }
}

// The merged lse, after every element of the row used the old one (a second launch).
__global__ void merge_lse_kernel(float* lse, const float* part_lse, int64_t n) {
  PARASOL_GRID_STRIDE(i, n) {
    const float lc = part_lse[i], lo = lse[i];
    if (lc == -INFINITY) continue;
    if (lo == -INFINITY) {
      lse[i] = lc;
      continue;
    }
    const float mx = fmaxf(lo, lc);
    lse[i] = mx + logf(expf(lo - mx) + expf(lc - mx));
  }
}

}  // namespace

void pack_bf16(uint16_t* dst, const float* src, int64_t rows, int64_t cols, int64_t ld,
               cudaStream_t s) {
  if (rows <= 0 || cols <= 0) return;
  pack_bf16_kernel<<<grid_for(rows * cols), kThreads, 0, s>>>(dst, src, rows, cols, ld);
  PARASOL_CUDA_LAUNCHED();
}

void unpack_bf16(float* dst, int64_t ld, const uint16_t* src, int64_t rows, int64_t cols,
                 bool accumulate, cudaStream_t s) {
  if (rows <= 0 || cols <= 0) return;
  unpack_bf16_kernel<<<grid_for(rows * cols), kThreads, 0, s>>>(dst, ld, src, rows, cols,
                                                                accumulate);
  PARASOL_CUDA_LAUNCHED();
}

void attention_merge_bf16(float* out, int64_t ld_o, float* lse, const uint16_t* part,
                          const float* part_lse, int64_t batch, int64_t seq_q, int64_t heads,
                          int64_t dv, cudaStream_t s) {
  const int64_t n = batch * seq_q * heads * dv;
  if (n <= 0) return;
  merge_kernel<<<grid_for(n), kThreads, 0, s>>>(out, ld_o, lse, part, part_lse, batch, seq_q, heads,
                                                dv);
  PARASOL_CUDA_LAUNCHED();
  const int64_t rows = batch * heads * seq_q;
  merge_lse_kernel<<<grid_for(rows), kThreads, 0, s>>>(lse, part_lse, rows);
  PARASOL_CUDA_LAUNCHED();
}

}  // namespace parasol::runtime::cuda
