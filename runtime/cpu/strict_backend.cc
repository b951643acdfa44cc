// StrictCpuBackend: an arena of PROT_NONE pages opened around the kernels, copies and the
// communicator's transfers (runtime/device_access.h), and CpuBackend's kernels.
#include "runtime/cpu/strict_backend.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iterator>

#include "core/error.h"
#include "runtime/device_access.h"

namespace parasol::runtime {

namespace {
StrictCpuBackend* g_instance = nullptr;  // the one strict backend of the process
constexpr size_t kAlign = 64;
// The arena grows by 2 MiB huge pages: toggling the protection then rewrites one page-table
// entry per 2 MiB instead of 512, which is what makes a toggle per kernel affordable.
constexpr size_t kHugePage = size_t{2} << 20;
size_t page_round(size_t n) { return (n + kHugePage - 1) / kHugePage * kHugePage; }
}  // namespace

StrictCpuBackend::StrictCpuBackend(int gemm_threads, size_t arena_bytes)
    : inner_(gemm_threads), arena_bytes_(page_round(arena_bytes)) {
  if (g_instance != nullptr) throw Error("runtime.backend", "one strict CPU backend per process");
  // Reserve one huge page more, so that the arena can start on a huge-page boundary.
  void* p = ::mmap(nullptr, arena_bytes_ + kHugePage, PROT_NONE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED)
    throw Error("runtime.backend", "cannot reserve " + std::to_string(arena_bytes_) +
                                       " bytes for the strict device arena");
  reserved_ = static_cast<char*>(p);
  const auto start = reinterpret_cast<uintptr_t>(p);
  arena_ = reserved_ + (page_round(start) - start);
  ::madvise(arena_, arena_bytes_, MADV_HUGEPAGE);  // a hint: the arena works without it
  g_instance = this;
  DeviceAccess::install(&StrictCpuBackend::open_arena, &StrictCpuBackend::close_arena);
}

StrictCpuBackend::~StrictCpuBackend() {
  release_all();
  DeviceAccess::install(nullptr, nullptr);
  g_instance = nullptr;
  ::munmap(reserved_, arena_bytes_ + kHugePage);
}

void StrictCpuBackend::open_arena() {
  StrictCpuBackend* b = g_instance;
  if (b->high_water_ > 0) ::mprotect(b->arena_, b->high_water_, PROT_READ | PROT_WRITE);
}

void StrictCpuBackend::close_arena() {
  StrictCpuBackend* b = g_instance;
  if (b->high_water_ > 0) ::mprotect(b->arena_, b->high_water_, PROT_NONE);
}

// First fit over the free ranges, else above the high-water mark (which grows page by page).
void* StrictCpuBackend::raw_alloc(size_t bytes) {
  const size_t n = (bytes + kAlign - 1) / kAlign * kAlign;
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < n) continue;
    const size_t offset = it->first, left = it->second - n;
    free_.erase(it);
    if (left > 0) free_[offset + n] = left;
    allocated_[offset] = n;
    return arena_ + offset;
  }
  const size_t offset = high_water_;
  const size_t grown = page_round(offset + n);
  if (grown > arena_bytes_) return nullptr;  // Backend::alloc reports it
  if (grown > offset + n) free_[offset + n] = grown - offset - n;
  high_water_ = grown;
  // Inside a scope the new pages must be accessible at once (closing protects them all again).
  if (DeviceAccess::inside()) ::mprotect(arena_, high_water_, PROT_READ | PROT_WRITE);
  allocated_[offset] = n;
  return arena_ + offset;
}

void StrictCpuBackend::raw_free(void* p) {
  const size_t offset = static_cast<size_t>(static_cast<char*>(p) - arena_);
  auto it = allocated_.find(offset);
  if (it == allocated_.end()) return;  // Backend::free checked the pointer
  size_t start = offset, size = it->second;
  allocated_.erase(it);
  // Coalesce with the free neighbours.
  auto next = free_.lower_bound(start);
  if (next != free_.end() && next->first == start + size) {
    size += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == start) {
      start = prev->first;
      size += prev->second;
      free_.erase(prev);
    }
  }
  free_[start] = size;
}

void* StrictCpuBackend::raw_alloc_host(size_t bytes) {
  return std::aligned_alloc(kAlign, (bytes + kAlign - 1) / kAlign * kAlign);
}
void StrictCpuBackend::raw_free_host(void* p) { std::free(p); }

bool StrictCpuBackend::in_arena(const void* p) const {
  const auto* c = static_cast<const char*>(p);
  return c >= arena_ && c < arena_ + arena_bytes_;
}

void StrictCpuBackend::copy(void* dst, const void* src, size_t bytes) {
  const bool d = in_arena(dst), s = in_arena(src);
  if (d && !s) ++traffic_.writes;
  if (s && !d) ++traffic_.reads;
  DeviceAccess access;
  inner_.copy(dst, src, bytes);
}

void StrictCpuBackend::zero(void* dst, size_t bytes) {
  DeviceAccess access;
  inner_.zero(dst, bytes);
}

void StrictCpuBackend::embedding_forward(float* out, const int32_t* tokens, const float* table,
                                         int64_t vocab_start, int64_t vocab_rows, const float* pos,
                                         int64_t pos_offset, int64_t rows, int64_t seq,
                                         int64_t cols) {
  DeviceAccess access;
  inner_.embedding_forward(out, tokens, table, vocab_start, vocab_rows, pos, pos_offset, rows, seq,
                           cols);
}

void StrictCpuBackend::embedding_backward(float* dtable, float* dpos, const float* dout,
                                          const int32_t* tokens, int64_t vocab_start,
                                          int64_t vocab_rows, int64_t pos_offset, int64_t rows,
                                          int64_t seq, int64_t cols) {
  DeviceAccess access;
  inner_.embedding_backward(dtable, dpos, dout, tokens, vocab_start, vocab_rows, pos_offset, rows,
                            seq, cols);
}

void StrictCpuBackend::norm_forward(Norm kind, float* out, const float* x, const float* weight,
                                    const float* bias, int64_t rows, int64_t cols, float eps) {
  DeviceAccess access;
  inner_.norm_forward(kind, out, x, weight, bias, rows, cols, eps);
}

void StrictCpuBackend::norm_backward(Norm kind, float* dx, float* dweight, float* dbias,
                                     const float* dout, const float* x, const float* weight,
                                     const float* dresidual, int64_t rows, int64_t cols,
                                     float eps) {
  DeviceAccess access;
  inner_.norm_backward(kind, dx, dweight, dbias, dout, x, weight, dresidual, rows, cols, eps);
}

void StrictCpuBackend::linear_forward(float* out, const float* in, const float* w,
                                      WeightLayout layout, const float* bias, int64_t m, int64_t n,
                                      int64_t k) {
  DeviceAccess access;
  inner_.linear_forward(out, in, w, layout, bias, m, n, k);
}

void StrictCpuBackend::linear_backward_data(float* din, const float* dout, const float* w,
                                            WeightLayout layout, int64_t m, int64_t n, int64_t k,
                                            bool accumulate) {
  DeviceAccess access;
  inner_.linear_backward_data(din, dout, w, layout, m, n, k, accumulate);
}

void StrictCpuBackend::linear_backward_weight(float* dw, float* dbias, const float* in,
                                              const float* dout, WeightLayout layout, int64_t m,
                                              int64_t n, int64_t k) {
  DeviceAccess access;
  inner_.linear_backward_weight(dw, dbias, in, dout, layout, m, n, k);
}

void StrictCpuBackend::bias_forward(float* out, const float* bias, int64_t rows, int64_t cols) {
  DeviceAccess access;
  inner_.bias_forward(out, bias, rows, cols);
}

void StrictCpuBackend::bias_backward(float* dbias, const float* dout, int64_t rows, int64_t cols) {
  DeviceAccess access;
  inner_.bias_backward(dbias, dout, rows, cols);
}

void StrictCpuBackend::activation_forward(Activation kind, float* out, const float* in,
                                          int64_t rows, int64_t cols) {
  DeviceAccess access;
  inner_.activation_forward(kind, out, in, rows, cols);
}

void StrictCpuBackend::activation_backward(Activation kind, float* din, const float* dout,
                                           const float* in, int64_t rows, int64_t cols) {
  DeviceAccess access;
  inner_.activation_backward(kind, din, dout, in, rows, cols);
}

void StrictCpuBackend::attention_forward(const AttentionDims& d, float* out, float* lse,
                                         float* probs, const float* q, const float* k,
                                         const float* v, bool accumulate) {
  DeviceAccess access;
  inner_.attention_forward(d, out, lse, probs, q, k, v, accumulate);
}

void StrictCpuBackend::attention_backward(const AttentionDims& d, float* dq, float* dk, float* dv,
                                          const float* dout, const float* q, const float* k,
                                          const float* v, const float* out, const float* lse,
                                          const float* probs, bool accumulate_dq,
                                          bool accumulate_dkv) {
  DeviceAccess access;
  inner_.attention_backward(d, dq, dk, dv, dout, q, k, v, out, lse, probs, accumulate_dq,
                            accumulate_dkv);
}

void StrictCpuBackend::rope(float* x, int64_t ld, int64_t rows, int64_t seq, int64_t pos_offset,
                            int64_t heads, int64_t head_dim, double theta, bool inverse) {
  DeviceAccess access;
  inner_.rope(x, ld, rows, seq, pos_offset, heads, head_dim, theta, inverse);
}

void StrictCpuBackend::residual_forward(float* out, uint8_t* mask, const float* x, const float* y,
                                        const float* bias, int64_t rows, int64_t cols,
                                        float dropout_p, uint64_t seed) {
  DeviceAccess access;
  inner_.residual_forward(out, mask, x, y, bias, rows, cols, dropout_p, seed);
}

void StrictCpuBackend::residual_backward(float* dy, float* dbias, const float* dout,
                                         const uint8_t* mask, int64_t rows, int64_t cols,
                                         float dropout_p) {
  DeviceAccess access;
  inner_.residual_backward(dy, dbias, dout, mask, rows, cols, dropout_p);
}

void StrictCpuBackend::xent_row_max(float* row_max, const float* logits, int64_t rows,
                                    int64_t vocab) {
  DeviceAccess access;
  inner_.xent_row_max(row_max, logits, rows, vocab);
}

void StrictCpuBackend::xent_sum_exp(float* sum_exp, const float* logits, const float* row_max,
                                    int64_t rows, int64_t vocab) {
  DeviceAccess access;
  inner_.xent_sum_exp(sum_exp, logits, row_max, rows, vocab);
}

void StrictCpuBackend::xent_target(float* target, const float* logits, const int32_t* labels,
                                   int64_t rows, int64_t vocab, int64_t vocab_start) {
  DeviceAccess access;
  inner_.xent_target(target, logits, labels, rows, vocab, vocab_start);
}

void StrictCpuBackend::xent_loss(float* loss, const float* row_max, const float* sum_exp,
                                 const float* target, const int32_t* labels, int64_t rows) {
  DeviceAccess access;
  inner_.xent_loss(loss, row_max, sum_exp, target, labels, rows);
}

void StrictCpuBackend::xent_softmax(float* probs, const float* logits, const float* row_max,
                                    const float* sum_exp, int64_t rows, int64_t vocab) {
  DeviceAccess access;
  inner_.xent_softmax(probs, logits, row_max, sum_exp, rows, vocab);
}

void StrictCpuBackend::loss_accumulate(double* acc, const float* loss, const int32_t* labels,
                                       int64_t rows) {
  DeviceAccess access;
  inner_.loss_accumulate(acc, loss, labels, rows);
}

void StrictCpuBackend::xent_backward(float* dlogits, const float* probs, const int32_t* labels,
                                     int64_t rows, int64_t vocab, int64_t vocab_start,
                                     float dloss) {
  DeviceAccess access;
  inner_.xent_backward(dlogits, probs, labels, rows, vocab, vocab_start, dloss);
}

void StrictCpuBackend::xent_max_typed(float* row_max, const void* logits, Dtype dtype, int64_t rows,
                                      int64_t vocab) {
  DeviceAccess access;
  inner_.xent_max_typed(row_max, logits, dtype, rows, vocab);
}

void StrictCpuBackend::xent_sums_typed(float* sum_exp, float* target, const void* logits,
                                       Dtype dtype, const float* row_max, const int32_t* labels,
                                       int64_t rows, int64_t vocab, int64_t vocab_start) {
  DeviceAccess access;
  inner_.xent_sums_typed(sum_exp, target, logits, dtype, row_max, labels, rows, vocab, vocab_start);
}

void StrictCpuBackend::xent_backward_typed(void* dlogits, const void* logits, Dtype dtype,
                                           const float* row_max, const float* sum_exp,
                                           const int32_t* labels, int64_t rows, int64_t vocab,
                                           int64_t vocab_start, float dloss) {
  DeviceAccess access;
  inner_.xent_backward_typed(dlogits, logits, dtype, row_max, sum_exp, labels, rows, vocab,
                             vocab_start, dloss);
}

void StrictCpuBackend::router_forward(float* probs, int32_t* topk_idx, float* topk_w,
                                      const float* logits, int64_t tokens, int64_t experts,
                                      int64_t top_k, bool renormalize) {
  DeviceAccess access;
  inner_.router_forward(probs, topk_idx, topk_w, logits, tokens, experts, top_k, renormalize);
}

void StrictCpuBackend::router_topk(int32_t* topk_idx, float* topk_w, const float* probs,
                                   int64_t tokens, int64_t experts, int64_t top_k,
                                   bool renormalize) {
  DeviceAccess access;
  inner_.router_topk(topk_idx, topk_w, probs, tokens, experts, top_k, renormalize);
}

void StrictCpuBackend::router_backward(float* dlogits, const float* dtopk_w, const float* probs,
                                       const int32_t* topk_idx, int64_t tokens, int64_t experts,
                                       int64_t top_k, bool renormalize) {
  DeviceAccess access;
  inner_.router_backward(dlogits, dtopk_w, probs, topk_idx, tokens, experts, top_k, renormalize);
}

void StrictCpuBackend::moe_permutation(int32_t* row_of, int64_t* counts_host,
                                       const int32_t* topk_idx, int64_t tokens, int64_t experts,
                                       int64_t top_k) {
  DeviceAccess access;
  inner_.moe_permutation(row_of, counts_host, topk_idx, tokens, experts, top_k);
}

void StrictCpuBackend::dispatch_forward(float* out, const float* x, const int32_t* row_of,
                                        int64_t tokens, int64_t top_k, int64_t cols) {
  DeviceAccess access;
  inner_.dispatch_forward(out, x, row_of, tokens, top_k, cols);
}

void StrictCpuBackend::dispatch_backward(float* dx, const float* dout, const int32_t* row_of,
                                         int64_t tokens, int64_t top_k, int64_t cols) {
  DeviceAccess access;
  inner_.dispatch_backward(dx, dout, row_of, tokens, top_k, cols);
}

void StrictCpuBackend::combine_forward(float* out, const float* expert_out, const float* w,
                                       const int32_t* row_of, int64_t tokens, int64_t top_k,
                                       int64_t cols) {
  DeviceAccess access;
  inner_.combine_forward(out, expert_out, w, row_of, tokens, top_k, cols);
}

void StrictCpuBackend::combine_backward(float* dexpert_out, float* dw, const float* dout,
                                        const float* expert_out, const float* w,
                                        const int32_t* row_of, int64_t tokens, int64_t top_k,
                                        int64_t cols) {
  DeviceAccess access;
  inner_.combine_backward(dexpert_out, dw, dout, expert_out, w, row_of, tokens, top_k, cols);
}

void StrictCpuBackend::expert_linear_forward(float* out, const float* in, const float* w,
                                             const float* bias, const int64_t* counts_host,
                                             int64_t experts, int64_t n, int64_t k) {
  DeviceAccess access;
  inner_.expert_linear_forward(out, in, w, bias, counts_host, experts, n, k);
}

void StrictCpuBackend::expert_linear_backward_data(float* din, const float* dout, const float* w,
                                                   const int64_t* counts_host, int64_t experts,
                                                   int64_t n, int64_t k, bool accumulate) {
  DeviceAccess access;
  inner_.expert_linear_backward_data(din, dout, w, counts_host, experts, n, k, accumulate);
}

void StrictCpuBackend::expert_linear_backward_weight(float* dw, float* dbias, const float* in,
                                                     const float* dout, const int64_t* counts_host,
                                                     int64_t experts, int64_t n, int64_t k) {
  DeviceAccess access;
  inner_.expert_linear_backward_weight(dw, dbias, in, dout, counts_host, experts, n, k);
}

void StrictCpuBackend::adamw(const AdamWConfig& c, float* param, float* m, float* v,
                             const float* grad, int64_t n, const float* grad_scale) {
  DeviceAccess access;
  inner_.adamw(c, param, m, v, grad, n, grad_scale);
}

void StrictCpuBackend::grad_sumsq(float* sumsq, const float* grad, int64_t n) {
  DeviceAccess access;
  inner_.grad_sumsq(sumsq, grad, n);
}

void StrictCpuBackend::clip_scale(float* scale, const float* sumsq, float max_norm,
                                  float loss_scale) {
  DeviceAccess access;
  inner_.clip_scale(scale, sumsq, max_norm, loss_scale);
}

void StrictCpuBackend::cast(void* dst, Dtype dst_type, const void* src, Dtype src_type, int64_t n) {
  DeviceAccess access;
  inner_.cast(dst, dst_type, src, src_type, n);
}

}  // namespace parasol::runtime
