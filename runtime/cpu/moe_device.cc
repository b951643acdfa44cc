// defines: CpuBackend::moe_permutation_device, expert_linear_{forward,backward_data,
// backward_weight}_bf16_dev (cpu_backend.h): MoE routing kept where the kernels run. The CPU's
// device memory is host memory, so the offsets are read in place (the CUDA backend reads them in
// its grouped GEMM kernel, runtime/cuda/grouped_gemm.cu): the same permutation as
// moe_permutation and the same per-expert GEMMs as the counts entries, bit for bit.
#include <algorithm>
#include <vector>

#include "core/error.h"
#include "runtime/cpu/cpu_backend.h"

namespace parasol::runtime {

namespace {

// Rows per expert from offsets [experts + 1], checked against the rows the buffers hold.
std::vector<int64_t> counts_of(const int32_t* offsets, int64_t experts, int64_t max_rows) {
  std::vector<int64_t> counts(static_cast<size_t>(experts));
  for (int64_t e = 0; e < experts; ++e) {
    counts[e] = int64_t{offsets[e + 1]} - offsets[e];
    if (counts[e] < 0) throw Error("runtime.moe", "expert offsets decrease");
  }
  if (offsets[0] != 0 || offsets[experts] > max_rows)
    throw Error("runtime.moe", "expert offsets [" + std::to_string(offsets[0]) + ", " +
                                   std::to_string(offsets[experts]) + ") outside the " +
                                   std::to_string(max_rows) + " rows");
  return counts;
}

}  // namespace

void CpuBackend::moe_permutation_device(int32_t* row_of, int32_t* counts, int32_t* offsets,
                                        int32_t* bad, const int32_t* topk_idx, int64_t tokens,
                                        int64_t experts, int64_t top_k) {
  const int64_t n = tokens * top_k;
  std::fill(counts, counts + experts, 0);
  for (int64_t i = 0; i < n; ++i) {
    if (topk_idx[i] < 0 || topk_idx[i] >= experts)
      ++*bad;
    else
      ++counts[topk_idx[i]];
  }
  offsets[0] = 0;
  for (int64_t e = 0; e < experts; ++e) offsets[e + 1] = offsets[e] + counts[e];
  std::vector<int32_t> next(offsets, offsets + experts);
  for (int64_t i = 0; i < n; ++i)
    row_of[i] = topk_idx[i] < 0 || topk_idx[i] >= experts ? -1 : next[topk_idx[i]]++;
}

void CpuBackend::expert_linear_forward_bf16_dev(uint16_t* out, const uint16_t* in,
                                                const uint16_t* w, const uint16_t* bias,
                                                const int32_t* offsets, int64_t experts,
                                                int64_t max_rows, int64_t n, int64_t k) {
  const std::vector<int64_t> c = counts_of(offsets, experts, max_rows);
  expert_linear_forward_bf16(out, in, w, bias, c.data(), experts, n, k);
}

void CpuBackend::expert_linear_backward_data_bf16_dev(uint16_t* din, const uint16_t* dout,
                                                      const uint16_t* w, const int32_t* offsets,
                                                      int64_t experts, int64_t max_rows, int64_t n,
                                                      int64_t k) {
  const std::vector<int64_t> c = counts_of(offsets, experts, max_rows);
  expert_linear_backward_data_bf16(din, dout, w, c.data(), experts, n, k, false);
}

void CpuBackend::expert_linear_backward_weight_bf16_dev(void* dw, Dtype dw_type, float* dbias,
                                                        const uint16_t* in, const uint16_t* dout,
                                                        const int32_t* offsets, int64_t experts,
                                                        int64_t max_rows, int64_t n, int64_t k) {
  const std::vector<int64_t> c = counts_of(offsets, experts, max_rows);
  expert_linear_backward_weight_bf16(dw, dw_type, dbias, in, dout, c.data(), experts, n, k);
}

}  // namespace parasol::runtime
