// Helpers shared by the CUDA kernel files: error checks, launch geometry, deterministic block
// reductions, and device copies of runtime/tensor.h's dropout hash and fp32 <-> bf16 / fp16
// conversions (the same bit operations, so that masks and casts equal the CPU's bit for bit).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/kernels.h"

namespace parasol::runtime::cuda {

inline constexpr int kThreads = 256;

// Blocks for a grid-stride loop over n elements (capped; the loops cover the rest).
inline unsigned grid_for(int64_t n, int threads = kThreads) {
  int64_t b = (n + threads - 1) / threads;
  if (b < 1) b = 1;
  if (b > 65535LL * 16) b = 65535LL * 16;
  return static_cast<unsigned>(b);
}

#define PARASOL_GRID_STRIDE(i, n)                                                        \
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); \
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)

// ---- Deterministic block reductions (blockDim.x a multiple of 32, at most 1024). Every thread
// gets the result. `shared` holds 32 values of T.
template <typename T>
__device__ inline T warp_sum(T v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
  return v;
}
__device__ inline float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, o));
  return v;
}

template <typename T>
__device__ inline T block_sum(T v, T* shared) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // shared may still be read by a previous reduction
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  T total = 0;
  for (int w = 0; w < warps; ++w) total += shared[w];  // the same order in every thread
  return total;
}

__device__ inline float block_max(float v, float* shared) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  float m = shared[0];
  for (int w = 1; w < warps; ++w) m = fmaxf(m, shared[w]);
  return m;
}

// ---- runtime/tensor.h on the device.
__host__ __device__ inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
__host__ __device__ inline bool dropout_keep(uint64_t seed, uint64_t index, uint32_t threshold) {
  return static_cast<uint32_t>(mix64(seed + (index + 1) * 0x9E3779B97F4A7C15ull) >> 32) >=
         threshold;
}

__device__ inline uint16_t fp32_to_bf16(float f) {
  const uint32_t x = __float_as_uint(f);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((x >> 16) | 0x0040u);
  const uint32_t rounded = x + 0x7FFFu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(rounded >> 16);
}
__device__ inline float bf16_to_fp32(uint16_t h) {
  return __uint_as_float(static_cast<uint32_t>(h) << 16);
}
__device__ inline uint16_t fp32_to_fp16(float f) {
  const uint32_t x = __float_as_uint(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t ax = x & 0x7FFFFFFFu;
  if (ax >= 0x7F800000u)
    return static_cast<uint16_t>(sign | (ax > 0x7F800000u ? 0x7E00u : 0x7C00u));
  if (ax >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);
  const int e = static_cast<int>(ax >> 23) - 127;
  const uint32_t mant = ax & 0x7FFFFFu;
  if (e >= -14) {
    uint32_t h = (static_cast<uint32_t>(e + 15) << 10) | (mant >> 13);
    const uint32_t rem = mant & 0x1FFFu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
    return static_cast<uint16_t>(sign | h);
  }
  if (e < -25) return static_cast<uint16_t>(sign);
  const uint32_t m = mant | 0x800000u;
  const int shift = -e - 1;
  uint32_t h = m >> shift;
  const uint32_t rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1);
  if (rem > half || (rem == half && (h & 1u))) ++h;
  return static_cast<uint16_t>(sign | h);
}
__device__ inline float fp16_to_fp32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu, mant = h & 0x3FFu;
  if (exp == 0) {
    const float v = static_cast<float>(mant) * 5.9604644775390625e-8f;
    return __uint_as_float(__float_as_uint(v) | sign);
  }
  if (exp == 31) return __uint_as_float(sign | 0x7F800000u | (mant << 13));
  return __uint_as_float(sign | ((exp + 112u) << 23) | (mant << 13));
}

// Adds the column sums of a [rows x cols] matrix whose element (r, c) is term(r, c) to out[c],
// deterministically (chunks of rows summed in order, then the chunks in order).
inline constexpr int64_t kColumnChunkRows = 64;
inline int64_t column_chunks(int64_t rows) {
  return (rows + kColumnChunkRows - 1) / kColumnChunkRows;
}

template <typename Term>
__global__ void column_partial_kernel(float* partial, Term term, int64_t rows, int64_t cols) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t chunk = blockIdx.y;
  if (c >= cols) return;
  const int64_t r0 = chunk * kColumnChunkRows;
  const int64_t r1 = r0 + kColumnChunkRows < rows ? r0 + kColumnChunkRows : rows;
  float s = 0.0f;
  for (int64_t r = r0; r < r1; ++r) s += term(r, c);
  partial[chunk * cols + c] = s;
}

static __global__ void column_finish_kernel(float* out, const float* partial, int64_t chunks,
                                            int64_t cols) {
  PARASOL_GRID_STRIDE(c, cols) {
    float s = 0.0f;
    for (int64_t k = 0; k < chunks; ++k) s += partial[k * cols + c];
    out[c] += s;
  }
}

// out[c] += sum_r term(r, c); partial: at least column_chunks(rows) * cols floats of scratch.
template <typename Term>
void add_column_sums_of(float* out, float* partial, Term term, int64_t rows, int64_t cols,
                        cudaStream_t s) {
  if (rows <= 0 || cols <= 0) return;
  const int64_t chunks = column_chunks(rows);
  if (chunks > 65535) throw Error("runtime.cuda", "column sums over more than 4M rows");
  dim3 grid(static_cast<unsigned>((cols + kThreads - 1) / kThreads), static_cast<unsigned>(chunks));
  column_partial_kernel<<<grid, kThreads, 0, s>>>(partial, term, rows, cols);
  PARASOL_CUDA_LAUNCHED();
  column_finish_kernel<<<grid_for(cols), kThreads, 0, s>>>(out, partial, chunks, cols);
  PARASOL_CUDA_LAUNCHED();
}

struct PlainTerm {
  const float* x;
  int64_t cols;
  __device__ float operator()(int64_t r, int64_t c) const { return x[r * cols + c]; }
};

}  // namespace parasol::runtime::cuda
