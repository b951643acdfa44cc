// defines: CudaBackend::moe_permutation_device, expert_linear_{forward,backward_data,
// backward_weight}_bf16_dev (cuda_backend.h, "MoE"): the routing kept on the device, the
// grouped expert GEMMs sized from device offsets (kernels.h's moe_permutation_device,
// grouped_gemm_bf16, grouped_gemm_bf16_wgrad); CPU reference: runtime/cpu/moe_device.cc.
#include <algorithm>
#include <string>
#include <vector>

#include "core/error.h"
#include "runtime/cuda/cuda_backend.h"
#include "runtime/cuda/kernels.h"

namespace parasol::runtime {

void CudaBackend::moe_permutation_device(int32_t* row_of, int32_t* counts, int32_t* offsets,
                                         int32_t* bad, const int32_t* topk_idx, int64_t tokens,
                                         int64_t experts, int64_t top_k) {
  const int64_t n = tokens * top_k;
  auto* scratch_ints = static_cast<int32_t*>(scratch(
      sizeof(int32_t) *
      static_cast<size_t>(std::max<int64_t>(1, cuda::moe_permutation_device_scratch(n, experts)))));
  cuda::moe_permutation_device(row_of, counts, offsets, bad, topk_idx, n, experts, scratch_ints,
                               stream_);
}

void CudaBackend::expert_linear_forward_bf16_dev(uint16_t* out, const uint16_t* in,
                                                 const uint16_t* w, const uint16_t* bias,
                                                 const int32_t* offsets, int64_t experts,
                                                 int64_t max_rows, int64_t n, int64_t k) {
  cuda::grouped_gemm_bf16(out, in, w, bias, offsets, experts, max_rows, n, k, false, stream_);
}

// din [rows x k] = dout [rows x n] W_e^T with W_e stored [k x n]: the grouped GEMM's B_e read
// transposed.
void CudaBackend::expert_linear_backward_data_bf16_dev(uint16_t* din, const uint16_t* dout,
                                                       const uint16_t* w, const int32_t* offsets,
                                                       int64_t experts, int64_t max_rows, int64_t n,
                                                       int64_t k) {
  cuda::grouped_gemm_bf16(din, dout, w, nullptr, offsets, experts, max_rows, k, n, true, stream_);
}

void CudaBackend::expert_linear_backward_weight_bf16_dev(void* dw, Dtype dw_type, float* dbias,
                                                         const uint16_t* in, const uint16_t* dout,
                                                         const int32_t* offsets, int64_t experts,
                                                         int64_t max_rows, int64_t n, int64_t k) {
  if (dw_type == Dtype::kFp32 && dbias == nullptr) {
    cuda::grouped_gemm_bf16_wgrad(static_cast<float*>(dw), in, dout, offsets, experts, n, k,
                                  stream_);
    return;
  }
  // grouped_gemm_bf16_wgrad writes fp32 dW only, without the bias gradient: the per-expert
  // cuBLASLt GEMMs on the counts read back (a synchronisation, counted).
  note_fallback(
      "moe", "wgrad " + std::to_string(experts) + "x" + std::to_string(k) + "x" + std::to_string(n),
      dbias != nullptr ? "the bias gradient" : "a bf16 weight gradient");
  std::vector<int32_t> off(static_cast<size_t>(experts + 1));
  copy(off.data(), offsets, sizeof(int32_t) * off.size());  // synchronises (host destination)
  if (off[experts] > max_rows)
    throw Error("runtime.moe", "expert offsets beyond the " + std::to_string(max_rows) + " rows");
  std::vector<int64_t> counts(static_cast<size_t>(experts));
  for (int64_t e = 0; e < experts; ++e) counts[e] = int64_t{off[e + 1]} - off[e];
  expert_linear_backward_weight_bf16(dw, dw_type, dbias, in, dout, counts.data(), experts, n, k);
}

}  // namespace parasol::runtime
