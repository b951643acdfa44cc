// defines: cuda::pack_bf16, unpack_bf16, attention_merge_bf16: the operands and results of the
// fused (cuDNN) attention, which reads and writes bf16: strided fp32 token rows rounded into
// packed bf16 rows (runtime/tensor.h's rounding: nearest even), packed bf16 rows widened into
// strided fp32 rows (written or added), and a ring step's bf16 partial output merged into the
// fp32 output of the earlier steps by log-sum-exp (the CPU backend's `accumulate` arithmetic,
// runtime/cpu/attention.cc). One thread per element (merge: per output element, the row's
// weights recomputed from the two lse; cheap next to the attention itself).
// Also the typed bf16 attention's (backend.h's attention_*_bf16): strided bf16 rows widened into
// and narrowed from fp32 rows (parasol's own kernel, the fallback), bf16 rows added to bf16 rows
// in fp32 and rounded once (accumulate_dq / accumulate_dkv after cuDNN), and the ring merge into
// a bf16 output (attention_merge_into_bf16).
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
// OutT: float (the fp32 interface) or uint16_t (bf16 storage: the merge in fp32, rounded once).
__device__ inline float load_out(const float* p) { return *p; }
__device__ inline float load_out(const uint16_t* p) { return bf16_to_fp32(*p); }
__device__ inline void store_out(float* p, float v) { *p = v; }
__device__ inline void store_out(uint16_t* p, float v) { *p = fp32_to_bf16(v); }

template <typename OutT>
__global__ void merge_kernel(OutT* out, int64_t ld_o, float* lse, const uint16_t* part,
                             const float* part_lse, int64_t batch, int64_t seq_q, int64_t heads,
                             int64_t dv) {
  const int64_t cols = heads * dv;
  PARASOL_GRID_STRIDE(i, batch * seq_q * cols) {
    const int64_t t = i / cols, col = i % cols, h = col / dv;
    const int64_t b = t / seq_q, s = t % seq_q;
    const int64_t li = (b * heads + h) * seq_q + s;
    const float lc = part_lse[li], lo = lse[li];
    if (lc == -INFINITY) continue;
    OutT* o = out + t * ld_o + col;
    const float pc = bf16_to_fp32(part[i]);
    if (lo == -INFINITY) {
      store_out(o, pc);
    } else {
      const float mx = fmaxf(lo, lc);
      const float wo = expf(lo - mx), wc = expf(lc - mx);
      store_out(o, (load_out(o) * wo + pc * wc) / (wo + wc));
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

// dst[r * ld_dst + c] = src[r * ld_src + c] widened.
__global__ void widen_rows_kernel(float* dst, int64_t ld_dst, const uint16_t* src, int64_t ld_src,
                                  int64_t rows, int64_t cols) {
  PARASOL_GRID_STRIDE(i, rows * cols) {
    const int64_t r = i / cols, c = i % cols;
    dst[r * ld_dst + c] = bf16_to_fp32(src[r * ld_src + c]);
  }
}

// dst[r * ld_dst + c] = src[r * ld_src + c] rounded (nearest even).
__global__ void narrow_rows_kernel(uint16_t* dst, int64_t ld_dst, const float* src, int64_t ld_src,
                                   int64_t rows, int64_t cols) {
  PARASOL_GRID_STRIDE(i, rows * cols) {
    const int64_t r = i / cols, c = i % cols;
    dst[r * ld_dst + c] = fp32_to_bf16(src[r * ld_src + c]);
  }
}

// dst[r * ld + c] = round(dst[r * ld + c] + src[r * cols + c]), the sum in fp32.
__global__ void add_rows_kernel(uint16_t* dst, int64_t ld, const uint16_t* src, int64_t rows,
                                int64_t cols) {
  PARASOL_GRID_STRIDE(i, rows * cols) {
    const int64_t r = i / cols, c = i % cols;
    uint16_t* d = dst + r * ld + c;
    *d = fp32_to_bf16(bf16_to_fp32(*d) + bf16_to_fp32(src[i]));
  }
}

template <typename OutT>
void merge(OutT* out, int64_t ld_o, float* lse, const uint16_t* part, const float* part_lse,
           int64_t batch, int64_t seq_q, int64_t heads, int64_t dv, cudaStream_t s) {
  const int64_t n = batch * seq_q * heads * dv;
  if (n <= 0) return;
  merge_kernel<OutT>
      <<<grid_for(n), kThreads, 0, s>>>(out, ld_o, lse, part, part_lse, batch, seq_q, heads, dv);
  PARASOL_CUDA_LAUNCHED();
  const int64_t rows = batch * heads * seq_q;
  merge_lse_kernel<<<grid_for(rows), kThreads, 0, s>>>(lse, part_lse, rows);
  PARASOL_CUDA_LAUNCHED();
}

}  // namespace

void widen_rows(float* dst, int64_t ld_dst, const uint16_t* src, int64_t ld_src, int64_t rows,
                int64_t cols, cudaStream_t s) {
  if (rows <= 0 || cols <= 0) return;
  widen_rows_kernel<<<grid_for(rows * cols), kThreads, 0, s>>>(dst, ld_dst, src, ld_src, rows,
                                                               cols);
  PARASOL_CUDA_LAUNCHED();
}

void narrow_rows(uint16_t* dst, int64_t ld_dst, const float* src, int64_t ld_src, int64_t rows,
                 int64_t cols, cudaStream_t s) {
  if (rows <= 0 || cols <= 0) return;
  narrow_rows_kernel<<<grid_for(rows * cols), kThreads, 0, s>>>(dst, ld_dst, src, ld_src, rows,
                                                                cols);
  PARASOL_CUDA_LAUNCHED();
}

void add_rows_bf16(uint16_t* dst, int64_t ld, const uint16_t* src, int64_t rows, int64_t cols,
                   cudaStream_t s) {
  if (rows <= 0 || cols <= 0) return;
  add_rows_kernel<<<grid_for(rows * cols), kThreads, 0, s>>>(dst, ld, src, rows, cols);
  PARASOL_CUDA_LAUNCHED();
}

void attention_merge_into_bf16(uint16_t* out, int64_t ld_o, float* lse, const uint16_t* part,
                               const float* part_lse, int64_t batch, int64_t seq_q, int64_t heads,
                               int64_t dv, cudaStream_t s) {
  merge(out, ld_o, lse, part, part_lse, batch, seq_q, heads, dv, s);
}

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
  merge(out, ld_o, lse, part, part_lse, batch, seq_q, heads, dv, s);
}

}  // namespace parasol::runtime::cuda
