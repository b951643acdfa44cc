// defines: cuda::moe_permutation_device (and its scratch size): backend.h's moe_permutation
// without the host: the routed rows' expert order (by expert, then token, then slot) and the
// per-expert counts and offsets built on the device, so that a step needs no device-to-host
// copy per MoE layer for the permutation. Deterministic (integer counts; a stable order): the
// tokens * top_k positions in chunks of kChunk; (1) each chunk counts its rows per expert, (2) one
// block scans the chunks per expert (each chunk's first rank of every expert) and the experts
// (the offsets), (3) each position's rank among the earlier positions of its chunk with the same
// expert completes its row. An index outside [0, experts) gets row -1 and is counted in `bad`
// (the caller checks it at its next synchronisation instead of throwing mid-stream).
#include "runtime/cuda/cuda_common.cuh"

namespace parasol::runtime::cuda {

namespace {

constexpr int kChunk = 256;

__global__ void chunk_counts_kernel(int32_t* chunk_counts, const int32_t* idx, int64_t n,
                                    int64_t experts) {
  extern __shared__ int32_t cnt[];
  for (int64_t e = threadIdx.x; e < experts; e += blockDim.x) cnt[e] = 0;
  __syncthreads();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kChunk + threadIdx.x;
  if (i < n) {
    const int32_t e = idx[i];
    if (e >= 0 && e < experts) atomicAdd(&cnt[e], 1);
  }
  __syncthreads();
  for (int64_t e = threadIdx.x; e < experts; e += blockDim.x)
    chunk_counts[static_cast<int64_t>(blockIdx.x) * experts + e] = cnt[e];
}

__global__ void scan_kernel(int32_t* counts, int32_t* offsets, int32_t* chunk_counts,
                            int64_t chunks, int64_t experts) {
  for (int64_t e = threadIdx.x; e < experts; e += blockDim.x) {
    int32_t run = 0;
    for (int64_t c = 0; c < chunks; ++c) {
      const int32_t v = chunk_counts[c * experts + e];
      chunk_counts[c * experts + e] = run;  // the chunk's first rank within expert e
      run += v;
    }
    counts[e] = run;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int32_t off = 0;
    for (int64_t e = 0; e < experts; ++e) {
      offsets[e] = off;
      off += counts[e];
    }
    offsets[experts] = off;
  }
}

__global__ void place_kernel(int32_t* row_of, int32_t* bad, const int32_t* idx,
                             const int32_t* chunk_first, const int32_t* offsets, int64_t n,
                             int64_t experts) {
  __shared__ int32_t ex[kChunk];
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kChunk + threadIdx.x;
  const int32_t e = i < n ? idx[i] : -1;
  ex[threadIdx.x] = e;
  __syncthreads();
  if (i >= n) return;
  if (e < 0 || e >= experts) {
    row_of[i] = -1;
    atomicAdd(bad, 1);
    return;
  }
  int32_t rank = 0;
  for (int j = 0; j < static_cast<int>(threadIdx.x); ++j) rank += ex[j] == e ? 1 : 0;
  row_of[i] = offsets[e] + chunk_first[static_cast<int64_t>(blockIdx.x) * experts + e] + rank;
}

}  // namespace

int64_t moe_permutation_device_scratch(int64_t n, int64_t experts) {
  return (n + kChunk - 1) / kChunk * experts;
}

void moe_permutation_device(int32_t* row_of, int32_t* counts, int32_t* offsets, int32_t* bad,
                            const int32_t* topk_idx, int64_t n, int64_t experts, int32_t* scratch,
                            cudaStream_t s) {
  if (experts <= 0) return;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  const size_t shared = sizeof(int32_t) * static_cast<size_t>(experts);
  if (shared > 48 * 1024)
    throw Error("runtime.moe_permutation", "more than 12288 experts on the device path");
  if (chunks > 0) {
    chunk_counts_kernel<<<static_cast<unsigned>(chunks), kChunk, shared, s>>>(scratch, topk_idx, n,
                                                                              experts);
    PARASOL_CUDA_LAUNCHED();
  }
  scan_kernel<<<1, 1024, 0, s>>>(counts, offsets, scratch, chunks, experts);
  PARASOL_CUDA_LAUNCHED();
  if (chunks > 0) {
    place_kernel<<<static_cast<unsigned>(chunks), kChunk, 0, s>>>(row_of, bad, topk_idx, scratch,
                                                                  offsets, n, experts);
    PARASOL_CUDA_LAUNCHED();
  }
}

}  // namespace parasol::runtime::cuda
