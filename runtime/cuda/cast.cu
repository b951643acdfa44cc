// defines: cuda::cast (runtime/cpu/cast.cc's kernel on the GPU): fp32 <-> bf16 / fp16 with the
// same bit operations as runtime/tensor.h (round to nearest even, the same NaN and overflow
// results), one thread per element; fp32 -> fp32 is a device copy.
#include "runtime/cuda/cuda_common.cuh"

namespace parasol::runtime::cuda {

namespace {

__global__ void cast_kernel(void* dst, CastType dst_type, const void* src, CastType src_type,
                            int64_t n) {
  PARASOL_GRID_STRIDE(i, n) {
    float f;
    if (src_type == CastType::kFp32)
      f = static_cast<const float*>(src)[i];
    else if (src_type == CastType::kBf16)
      f = bf16_to_fp32(static_cast<const uint16_t*>(src)[i]);
    else
      f = fp16_to_fp32(static_cast<const uint16_t*>(src)[i]);
    if (dst_type == CastType::kFp32)
      static_cast<float*>(dst)[i] = f;
    else if (dst_type == CastType::kBf16)
      static_cast<uint16_t*>(dst)[i] = fp32_to_bf16(f);
    else
      static_cast<uint16_t*>(dst)[i] = fp32_to_fp16(f);
  }
}

}  // namespace

void cast(void* dst, CastType dst_type, const void* src, CastType src_type, int64_t n,
          cudaStream_t s) {
  if (n <= 0) return;
  if (dst_type == CastType::kFp32 && src_type == CastType::kFp32) {
    if (dst != src)
      PARASOL_CUDA_CHECK(cudaMemcpyAsync(dst, src, sizeof(float) * n, cudaMemcpyDeviceToDevice, s));
    return;
  }
  cast_kernel<<<grid_for(n), kThreads, 0, s>>>(dst, dst_type, src, src_type, n);
  PARASOL_CUDA_LAUNCHED();
}

}  // namespace parasol::runtime::cuda
