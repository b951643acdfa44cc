// defines: CpuBackend::dispatch_forward_bf16, dispatch_backward_bf16, combine_forward_bf16,
// combine_backward_bf16 (backend.h's MoE entries on bf16 storage): one token at a time, its top_k
// expert rows widened into fp32 scratch of the kernel (runtime/cpu/bf16_tile.h), moe.cc's fp32
// kernel on them (the same sums in the same order), each output rounded once. The dispatch's
// forward copies bf16 rows as they are. The grouped expert GEMMs are Backend's defaults (one
// linear_*_bf16 call of bf16_ops.cc per expert).
#include <cstring>
#include <numeric>
#include <vector>

#include "runtime/cpu/bf16_tile.h"
#include "runtime/cpu/cpu_backend.h"

namespace parasol::runtime {

namespace {

using bf16_tile::narrow;
using bf16_tile::widen;

// The rows of (token t, slot s), s < top_k, widened into rows s of tile [top_k x cols].
void widen_slots(std::vector<float>& tile, const uint16_t* rows, const int32_t* row_of, int64_t t,
                 int64_t top_k, int64_t cols) {
  for (int64_t s = 0; s < top_k; ++s)
    widen(tile.data() + s * cols, rows + static_cast<int64_t>(row_of[t * top_k + s]) * cols, cols,
          1, cols);
}

}  // namespace

void CpuBackend::dispatch_forward_bf16(uint16_t* out, const uint16_t* x, const int32_t* row_of,
                                       int64_t tokens, int64_t top_k, int64_t cols) {
  for (int64_t ts = 0; ts < tokens * top_k; ++ts)
    std::memcpy(out + static_cast<int64_t>(row_of[ts]) * cols, x + (ts / top_k) * cols,
                static_cast<size_t>(cols) * sizeof(uint16_t));
}

void CpuBackend::dispatch_backward_bf16(uint16_t* dx, const uint16_t* dout, const int32_t* row_of,
                                        int64_t tokens, int64_t top_k, int64_t cols) {
  std::vector<float> tile(static_cast<size_t>(top_k * cols)), d(static_cast<size_t>(cols));
  std::vector<int32_t> slots(static_cast<size_t>(top_k));
  std::iota(slots.begin(), slots.end(), 0);
  for (int64_t t = 0; t < tokens; ++t) {
    widen_slots(tile, dout, row_of, t, top_k, cols);
    dispatch_backward(d.data(), tile.data(), slots.data(), 1, top_k, cols);
    narrow(dx + t * cols, cols, d.data(), 1, cols);
  }
}

void CpuBackend::combine_forward_bf16(uint16_t* out, const uint16_t* expert_out, const float* w,
                                      const int32_t* row_of, int64_t tokens, int64_t top_k,
                                      int64_t cols) {
  std::vector<float> tile(static_cast<size_t>(top_k * cols)), o(static_cast<size_t>(cols));
  std::vector<int32_t> slots(static_cast<size_t>(top_k));
  std::iota(slots.begin(), slots.end(), 0);
  for (int64_t t = 0; t < tokens; ++t) {
    widen_slots(tile, expert_out, row_of, t, top_k, cols);
    combine_forward(o.data(), tile.data(), w + t * top_k, slots.data(), 1, top_k, cols);
    narrow(out + t * cols, cols, o.data(), 1, cols);
  }
}

void CpuBackend::combine_backward_bf16(uint16_t* dexpert_out, float* dw, const uint16_t* dout,
                                       const uint16_t* expert_out, const float* w,
                                       const int32_t* row_of, int64_t tokens, int64_t top_k,
                                       int64_t cols) {
  std::vector<float> tile(static_cast<size_t>(top_k * cols)), de(tile.size()),
      g(static_cast<size_t>(cols));
  std::vector<int32_t> slots(static_cast<size_t>(top_k));
  std::iota(slots.begin(), slots.end(), 0);
  for (int64_t t = 0; t < tokens; ++t) {
    widen(g.data(), dout + t * cols, cols, 1, cols);
    widen_slots(tile, expert_out, row_of, t, top_k, cols);
    combine_backward(de.data(), dw + t * top_k, g.data(), tile.data(), w + t * top_k, slots.data(),
                     1, top_k, cols);
    for (int64_t s = 0; s < top_k; ++s)
      narrow(dexpert_out + static_cast<int64_t>(row_of[t * top_k + s]) * cols, cols,
             de.data() + s * cols, 1, cols);
  }
}

}  // namespace parasol::runtime
