// defines: cuda::rope_bf16: rope.cu's rotation on bf16 storage, one block per token row. The
// row's angles p theta^(-2j / head_dim) are formed once per row (not once per head) in double, as
// the CPU's, reduced modulo 2 pi in double and their cosine and sine taken in fp32 (the reduced
// angle rounded to fp32 is within 2^-24 pi of the double one, far below the bf16 store's 2^-8),
// kept in shared memory; then every head's pairs (x[j], x[j + head_dim / 2]) are rotated
// 8 at a time (bf16_vec.cuh) where the halves allow it.
#include "runtime/cuda/bf16_vec.cuh"

namespace parasol::runtime::cuda {

namespace {

constexpr int kV = kBf16Vec;
constexpr int64_t kMaxHalf = 512;  // head_dim up to 1024 (kMaxAttentionHeadDim)

__global__ void rope_kernel(uint16_t* x, int64_t ld, int64_t seq, int64_t pos_offset, int64_t heads,
                            int64_t head_dim, double theta, float sign, bool al) {
  __shared__ float cs[kMaxHalf], sn[kMaxHalf];
  const int64_t t = blockIdx.x, half = head_dim / 2;
  const double p = static_cast<double>(t % seq + pos_offset);
  const double two_pi = 6.283185307179586476925286766559;
  for (int64_t j = threadIdx.x; j < half; j += blockDim.x) {
    const double angle =
        p * pow(theta, -2.0 * static_cast<double>(j) / static_cast<double>(head_dim));
    const double reduced = angle - two_pi * rint(angle / two_pi);
    float s, c;
    sincosf(static_cast<float>(reduced), &s, &c);
    cs[j] = c;
    sn[j] = sign * s;
  }
  __syncthreads();
  const int64_t groups = (half + kV - 1) / kV;
  uint16_t* row = x + t * ld;
  for (int64_t i = threadIdx.x; i < heads * groups; i += blockDim.x) {
    const int64_t h = i / groups, j0 = (i % groups) * kV;
    uint16_t* a = row + h * head_dim;
    float u[kV], v[kV];
    load_bf16x8(u, a, j0, half, al);
    load_bf16x8(v, a + half, j0, half, al);
#pragma unroll
    for (int k = 0; k < kV; ++k) {
      const int64_t j = j0 + k < half ? j0 + k : 0;
      const float c = cs[j], s = sn[j];
      const float uu = u[k], vv = v[k];
      u[k] = uu * c - vv * s;
      v[k] = uu * s + vv * c;
    }
    store_bf16x8(a, u, j0, half, al);
    store_bf16x8(a + half, v, j0, half, al);
  }
}

}  // namespace

void rope_bf16(uint16_t* x, int64_t ld, int64_t rows, int64_t seq, int64_t pos_offset,
               int64_t heads, int64_t head_dim, double theta, bool inverse, cudaStream_t s) {
  if (rows <= 0 || heads <= 0 || head_dim < 2) return;
  if (head_dim / 2 > kMaxHalf)
    throw Error("runtime.cuda", "rope_bf16: head_dim " + std::to_string(head_dim) + " above " +
                                    std::to_string(2 * kMaxHalf));
  // Every head's halves start 16-byte aligned when x, ld and half are multiples of 8 elements.
  const bool al =
      reinterpret_cast<uintptr_t>(x) % 16 == 0 && ld % kV == 0 && (head_dim / 2) % kV == 0;
  rope_kernel<<<static_cast<unsigned>(rows), 128, 0, s>>>(x, ld, seq, pos_offset, heads, head_dim,
                                                          theta, inverse ? -1.0f : 1.0f, al);
  PARASOL_CUDA_LAUNCHED();
}

}  // namespace parasol::runtime::cuda
