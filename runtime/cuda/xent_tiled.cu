// defines: cuda::xent_tiled_forward, xent_rescale, xent_tiled_backward: the vocab-tiled
// cross-entropy of runtime/cpu/tiled_xent.h on the GPU, reading the logits in their storage dtype
// (bf16: 8 per 16-byte load where the row allows it) and holding no fp32 logits or probabilities.
// Forward: one block per row; each thread keeps a running (max, shifted sum) over its sweeps of
// `kVec` consecutive columns (one rescale per sweep), then the threads' pairs are merged by a
// warp tree and the warps in order (fixed shape: deterministic). Backward: the same sweeps,
// dloss (exp(l - max) / sum - onehot) written in the logits' dtype, in place allowed.
#include <cuda_runtime.h>

#include <cmath>

#include "runtime/cuda/bf16_vec.cuh"

namespace parasol::runtime::cuda {

namespace {

constexpr int kVec = kXentVec;  // columns per sweep of one thread: one 16-byte load of bf16
static_assert(kVec == kBf16Vec, "a sweep is one 16-byte load of bf16");

// Merges the pair (m2, s2) into (m, s): the larger maximum kept, the other sum rescaled.
__device__ inline void merge_pair(float& m, float& s, float m2, float s2) {
  if (m2 == -INFINITY) return;
  if (m == -INFINITY) {
    m = m2;
    s = s2;
    return;
  }
  if (m2 <= m) {
    s += s2 * expf(m2 - m);
  } else {
    s = s * expf(m - m2) + s2;
    m = m2;
  }
}

template <bool kBf16>
__device__ inline void load_vec(float (&x)[kVec], const void* row, int64_t c0, int64_t vocab,
                                bool aligned) {
  if constexpr (kBf16) {
    load_bf16x8(x, static_cast<const uint16_t*>(row), c0, vocab, aligned, -INFINITY);
  } else {
    const float* p = static_cast<const float*>(row) + c0;
#pragma unroll
    for (int i = 0; i < kVec; ++i) x[i] = c0 + i < vocab ? p[i] : -INFINITY;
  }
}

template <bool kBf16>
__global__ void forward_kernel(float* row_max, float* sum_exp, float* target, const void* logits,
                               const int32_t* labels, int64_t vocab, int64_t vocab_start,
                               bool aligned) {
  __shared__ float sm[32], ss[32];
  const int64_t r = blockIdx.x;
  const void* row = kBf16
                        ? static_cast<const void*>(static_cast<const uint16_t*>(logits) + r * vocab)
                        : static_cast<const void*>(static_cast<const float*>(logits) + r * vocab);
  float m = -INFINITY, s = 0.0f;
  for (int64_t c0 = int64_t{threadIdx.x} * kVec; c0 < vocab; c0 += int64_t{blockDim.x} * kVec) {
    float x[kVec];
    load_vec<kBf16>(x, row, c0, vocab, aligned);
    float vm = x[0];
#pragma unroll
    for (int i = 1; i < kVec; ++i) vm = fmaxf(vm, x[i]);
    if (vm > m) {
      s = m == -INFINITY ? 0.0f : s * expf(m - vm);
      m = vm;
    }
    if (m != -INFINITY) {
#pragma unroll
      for (int i = 0; i < kVec; ++i) s += expf(x[i] - m);  // padding: exp(-inf) = 0
    }
  }
  // The warp tree, then the warps in order.
  for (int o = 16; o > 0; o >>= 1) {
    const float m2 = __shfl_xor_sync(0xFFFFFFFFu, m, o);
    const float s2 = __shfl_xor_sync(0xFFFFFFFFu, s, o);
    merge_pair(m, s, m2, s2);
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) {
    sm[warp] = m;
    ss[warp] = s;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    float M = sm[0], S = ss[0];
    for (int w = 1; w < static_cast<int>(blockDim.x >> 5); ++w) merge_pair(M, S, sm[w], ss[w]);
    row_max[r] = M;
    sum_exp[r] = S;
    const int32_t label = labels != nullptr ? labels[r] : -1;
    const int64_t id = static_cast<int64_t>(label) - vocab_start;
    float t = 0.0f;
    if (label >= 0 && id >= 0 && id < vocab)
      t = kBf16 ? bf16_to_fp32(static_cast<const uint16_t*>(row)[id])
                : static_cast<const float*>(row)[id];
    target[r] = t;
  }
}

__global__ void rescale_kernel(float* sum_exp, const float* local_max, const float* global_max,
                               int64_t rows) {
  PARASOL_GRID_STRIDE(r, rows) {
    if (sum_exp[r] != 0.0f) sum_exp[r] *= expf(local_max[r] - global_max[r]);
  }
}

template <bool kBf16>
__global__ void backward_kernel(void* dlogits, const void* logits, const float* row_max,
                                const float* sum_exp, const int32_t* labels, int64_t vocab,
                                int64_t vocab_start, float dloss, bool aligned) {
  const int64_t r = blockIdx.x;
  const int64_t id = static_cast<int64_t>(labels[r]) - vocab_start;
  const bool ignored = labels[r] < 0;
  const float mx = row_max[r], inv = 1.0f / sum_exp[r];
  const void* in = kBf16
                       ? static_cast<const void*>(static_cast<const uint16_t*>(logits) + r * vocab)
                       : static_cast<const void*>(static_cast<const float*>(logits) + r * vocab);
  for (int64_t c0 = int64_t{threadIdx.x} * kVec; c0 < vocab; c0 += int64_t{blockDim.x} * kVec) {
    float x[kVec];
    load_vec<kBf16>(x, in, c0, vocab, aligned);
    float d[kVec];
#pragma unroll
    for (int i = 0; i < kVec; ++i)
      d[i] = ignored ? 0.0f : dloss * (expf(x[i] - mx) * inv - (c0 + i == id ? 1.0f : 0.0f));
    if constexpr (kBf16) {
      store_bf16x8(static_cast<uint16_t*>(dlogits) + r * vocab, d, c0, vocab, aligned);
    } else {
      float* out = static_cast<float*>(dlogits) + r * vocab + c0;
      for (int i = 0; i < kVec && c0 + i < vocab; ++i) out[i] = d[i];
    }
  }
}

bool rows_aligned(const void* p, int64_t vocab) { return bf16_rows_aligned(p, vocab, vocab); }

}  // namespace

void xent_tiled_forward(float* row_max, float* sum_exp, float* target, const void* logits,
                        bool bf16, const int32_t* labels, int64_t rows, int64_t vocab,
                        int64_t vocab_start, cudaStream_t s) {
  if (rows <= 0) return;
  const bool aligned = rows_aligned(logits, vocab);
  if (bf16)
    forward_kernel<true><<<static_cast<unsigned>(rows), kXentThreads, 0, s>>>(
        row_max, sum_exp, target, logits, labels, vocab, vocab_start, aligned);
  else
    forward_kernel<false><<<static_cast<unsigned>(rows), kXentThreads, 0, s>>>(
        row_max, sum_exp, target, logits, labels, vocab, vocab_start, aligned);
  PARASOL_CUDA_LAUNCHED();
}

void xent_rescale(float* sum_exp, const float* local_max, const float* global_max, int64_t rows,
                  cudaStream_t s) {
  if (rows <= 0) return;
  rescale_kernel<<<grid_for(rows), kThreads, 0, s>>>(sum_exp, local_max, global_max, rows);
  PARASOL_CUDA_LAUNCHED();
}

void xent_tiled_backward(void* dlogits, const void* logits, bool bf16, const float* row_max,
                         const float* sum_exp, const int32_t* labels, int64_t rows, int64_t vocab,
                         int64_t vocab_start, float dloss, cudaStream_t s) {
  if (rows <= 0 || vocab <= 0) return;
  const bool aligned = rows_aligned(logits, vocab) && rows_aligned(dlogits, vocab);
  if (bf16)
    backward_kernel<true><<<static_cast<unsigned>(rows), kXentThreads, 0, s>>>(
        dlogits, logits, row_max, sum_exp, labels, vocab, vocab_start, dloss, aligned);
  else
    backward_kernel<false><<<static_cast<unsigned>(rows), kXentThreads, 0, s>>>(
        dlogits, logits, row_max, sum_exp, labels, vocab, vocab_start, dloss, aligned);
  PARASOL_CUDA_LAUNCHED();
}

}  // namespace parasol::runtime::cuda
