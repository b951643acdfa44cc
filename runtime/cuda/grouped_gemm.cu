// defines: cuda::grouped_gemm_bf16, grouped_gemm_bf16_wgrad: the grouped expert GEMMs on bf16
// storage with the experts' row ranges read on the device (moe_permute.cu's offsets), so that
// neither the permutation nor the GEMMs need the counts on the host. Tensor cores through WMMA
// (bf16 16x16x16 fragments, fp32 accumulation); a 64 x 64 tile per block of 4 warps (32 x 32
// each), the K dimension in steps of 32 through shared memory, loads guarded element by element:
// a correctness-first kernel (no pipelining), not cuBLASLt's speed.
//   grouped_gemm_bf16: C rows of expert e (offsets[e] <= r < offsets[e + 1]) = A rows x B_e,
//     B_e stored [K x N] (trans_b false) or [N x K] (trans_b true) at b + e K N; + bias[e]
//     (nullable, [experts x N]); C bf16. The grid covers the worst case (max_rows / 64 + experts
//     row tiles); a block past the last expert's rows returns.
//   grouped_gemm_bf16_wgrad: dW_e [K x N] += A_e^T G_e over the expert's rows (A [rows x K],
//     G [rows x N]), fp32 dW.
#include <cuda_bf16.h>
#include <mma.h>

#include "runtime/cuda/cuda_common.cuh"

namespace parasol::runtime::cuda {

namespace {

using namespace nvcuda;

constexpr int kBM = 64, kBN = 64, kBK = 32, kWarps = 4;

__device__ inline __nv_bfloat16 bf(uint16_t h) { return __ushort_as_bfloat16(h); }

// The expert and first row of row tile t (of kBM rows) in expert order; false past the last.
__device__ inline bool tile_of(int64_t t, const int32_t* offsets, int64_t experts, int64_t& e,
                               int64_t& r0, int64_t& r1) {
  for (e = 0; e < experts; ++e) {
    const int64_t rows = offsets[e + 1] - offsets[e];
    const int64_t tiles = (rows + kBM - 1) / kBM;
    if (t < tiles) {
      r0 = offsets[e] + t * kBM;
      r1 = offsets[e + 1];
      return true;
    }
    t -= tiles;
  }
  return false;
}

// The block's 64 x 64 fp32 result in shared memory from its 4 warps' 2 x 2 fragments each.
struct Acc {
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> f[2][2];
  __device__ void zero() {
    for (auto& row : f)
      for (auto& x : row) wmma::fill_fragment(x, 0.0f);
  }
};

__global__ void grouped_kernel(uint16_t* c, const uint16_t* a, const uint16_t* b,
                               const uint16_t* bias, const int32_t* offsets, int64_t experts,
                               int64_t n, int64_t k, bool trans_b) {
  // WMMA loads and stores want 32-byte aligned tiles.
  __shared__ __align__(32) __nv_bfloat16 sa[kBM][kBK];
  __shared__ __align__(32) __nv_bfloat16 sb[kBK][kBN];
  __shared__ __align__(32) float sc[kBM][kBN];
  int64_t e, r0, r1;
  if (!tile_of(blockIdx.x, offsets, experts, e, r0, r1)) return;
  const int64_t c0 = static_cast<int64_t>(blockIdx.y) * kBN;
  const uint16_t* be = b + e * k * n;
  const int warp = threadIdx.x / 32, wr = warp / 2, wc = warp % 2;
  Acc acc;
  acc.zero();
  for (int64_t p0 = 0; p0 < k; p0 += kBK) {
    for (int i = threadIdx.x; i < kBM * kBK; i += blockDim.x) {
      const int rr = i / kBK, pp = i % kBK;
      const int64_t r = r0 + rr, p = p0 + pp;
      sa[rr][pp] = bf(r < r1 && p < k ? a[r * k + p] : uint16_t{0});
    }
    for (int i = threadIdx.x; i < kBK * kBN; i += blockDim.x) {
      const int pp = i / kBN, cc = i % kBN;
      const int64_t p = p0 + pp, col = c0 + cc;
      uint16_t v = 0;
      if (p < k && col < n) v = trans_b ? be[col * k + p] : be[p * n + col];
      sb[pp][cc] = bf(v);
    }
    __syncthreads();
    for (int kk = 0; kk < kBK; kk += 16) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa[2];
      wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> fb[2];
      for (int i = 0; i < 2; ++i) wmma::load_matrix_sync(fa[i], &sa[wr * 32 + i * 16][kk], kBK);
      for (int j = 0; j < 2; ++j) wmma::load_matrix_sync(fb[j], &sb[kk][wc * 32 + j * 16], kBN);
      for (int i = 0; i < 2; ++i)
        for (int j = 0; j < 2; ++j) wmma::mma_sync(acc.f[i][j], fa[i], fb[j], acc.f[i][j]);
    }
    __syncthreads();
  }
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 2; ++j)
      wmma::store_matrix_sync(&sc[wr * 32 + i * 16][wc * 32 + j * 16], acc.f[i][j], kBN,
                              wmma::mem_row_major);
  __syncthreads();
  for (int i = threadIdx.x; i < kBM * kBN; i += blockDim.x) {
    const int rr = i / kBN, cc = i % kBN;
    const int64_t r = r0 + rr, col = c0 + cc;
    if (r >= r1 || col >= n) continue;
    float v = sc[rr][cc];
    if (bias != nullptr) v += bf16_to_fp32(bias[e * n + col]);
    c[r * n + col] = fp32_to_bf16(v);
  }
}

// dW_e[K x N] += A_e^T G_e: block (tile of K, tile of N, expert), the expert's rows in steps of
// kBK as the reduction dimension.
__global__ void wgrad_kernel(float* dw, const uint16_t* a, const uint16_t* g,
                             const int32_t* offsets, int64_t n, int64_t k) {
  __shared__ __align__(32) __nv_bfloat16 sa[kBM][kBK];  // A_e^T's tile: K rows x expert rows
  __shared__ __align__(32) __nv_bfloat16 sb[kBK][kBN];
  __shared__ __align__(32) float sc[kBM][kBN];
  const int64_t e = blockIdx.z, k0 = static_cast<int64_t>(blockIdx.x) * kBM,
                c0 = static_cast<int64_t>(blockIdx.y) * kBN;
  const int64_t r0 = offsets[e], r1 = offsets[e + 1];
  const int warp = threadIdx.x / 32, wr = warp / 2, wc = warp % 2;
  Acc acc;
  acc.zero();
  for (int64_t q0 = r0; q0 < r1; q0 += kBK) {
    for (int i = threadIdx.x; i < kBM * kBK; i += blockDim.x) {
      const int kk = i / kBK, qq = i % kBK;
      const int64_t q = q0 + qq, p = k0 + kk;
      sa[kk][qq] = bf(q < r1 && p < k ? a[q * k + p] : uint16_t{0});
    }
    for (int i = threadIdx.x; i < kBK * kBN; i += blockDim.x) {
      const int qq = i / kBN, cc = i % kBN;
      const int64_t q = q0 + qq, col = c0 + cc;
      sb[qq][cc] = bf(q < r1 && col < n ? g[q * n + col] : uint16_t{0});
    }
    __syncthreads();
    for (int kk = 0; kk < kBK; kk += 16) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa[2];
      wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> fb[2];
      for (int i = 0; i < 2; ++i) wmma::load_matrix_sync(fa[i], &sa[wr * 32 + i * 16][kk], kBK);
      for (int j = 0; j < 2; ++j) wmma::load_matrix_sync(fb[j], &sb[kk][wc * 32 + j * 16], kBN);
      for (int i = 0; i < 2; ++i)
        for (int j = 0; j < 2; ++j) wmma::mma_sync(acc.f[i][j], fa[i], fb[j], acc.f[i][j]);
    }
    __syncthreads();
  }
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 2; ++j)
      wmma::store_matrix_sync(&sc[wr * 32 + i * 16][wc * 32 + j * 16], acc.f[i][j], kBN,
                              wmma::mem_row_major);
  __syncthreads();
  for (int i = threadIdx.x; i < kBM * kBN; i += blockDim.x) {
    const int kk = i / kBN, cc = i % kBN;
    const int64_t p = k0 + kk, col = c0 + cc;
    if (p < k && col < n) dw[e * k * n + p * n + col] += sc[kk][cc];
  }
}

}  // namespace

void grouped_gemm_bf16(uint16_t* c, const uint16_t* a, const uint16_t* b, const uint16_t* bias,
                       const int32_t* offsets, int64_t experts, int64_t max_rows, int64_t n,
                       int64_t k, bool trans_b, cudaStream_t s) {
  if (experts <= 0 || max_rows <= 0 || n <= 0) return;
  const int64_t row_tiles = (max_rows + kBM - 1) / kBM + experts;
  const int64_t col_tiles = (n + kBN - 1) / kBN;
  if (col_tiles > 65535) throw Error("runtime.cuda", "grouped GEMM: more than 65535 column tiles");
  dim3 grid(static_cast<unsigned>(row_tiles), static_cast<unsigned>(col_tiles));
  grouped_kernel<<<grid, kWarps * 32, 0, s>>>(c, a, b, bias, offsets, experts, n, k, trans_b);
  PARASOL_CUDA_LAUNCHED();
}

void grouped_gemm_bf16_wgrad(float* dw, const uint16_t* a, const uint16_t* g,
                             const int32_t* offsets, int64_t experts, int64_t n, int64_t k,
                             cudaStream_t s) {
  if (experts <= 0 || n <= 0 || k <= 0) return;
  if (experts > 65535) throw Error("runtime.cuda", "grouped GEMM: more than 65535 experts");
  dim3 grid(static_cast<unsigned>((k + kBM - 1) / kBM), static_cast<unsigned>((n + kBN - 1) / kBN),
            static_cast<unsigned>(experts));
  wgrad_kernel<<<grid, kWarps * 32, 0, s>>>(dw, a, g, offsets, n, k);
  PARASOL_CUDA_LAUNCHED();
}

}  // namespace parasol::runtime::cuda
