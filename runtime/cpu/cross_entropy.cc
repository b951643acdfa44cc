// defines: CpuBackend::xent_row_max, xent_sum_exp, xent_target, xent_loss, loss_accumulate,
// xent_softmax, xent_backward: the pieces of Megatron's vocab-parallel softmax cross-entropy. Each
// rank holds a slice of the vocabulary; the row max is all-reduced (max), then the sums of
// exponentials and target logits (sum), after which every rank has the loss and computes its slice
// of the gradient, dloss * (softmax - onehot).
#include <algorithm>
#include <cmath>
#include <vector>

#include "runtime/cpu/cpu_backend.h"
#include "runtime/cpu/vec.h"

namespace parasol::runtime {

namespace {

// The per-row loops, compiled for AVX2 too: a vocabulary row is tens of thousands of exps.
PARASOL_CPU_CLONES float row_max_of(const float* l, int64_t vocab) { return cpu::max(l, vocab); }

PARASOL_CPU_CLONES double row_sum_exp(float* __restrict e, const float* __restrict l, float mx,
                                      int64_t vocab) {
  for (int64_t v = 0; v < vocab; ++v) e[v] = cpu::exp_fast(l[v] - mx);
  return cpu::sum_f64(e, vocab);  // 50k+ terms: in double
}

// No __restrict: in place is allowed.
PARASOL_CPU_CLONES void row_softmax(float* p, const float* l, float mx, float inv, int64_t vocab) {
  for (int64_t v = 0; v < vocab; ++v) p[v] = cpu::exp_fast(l[v] - mx) * inv;
}

}  // namespace

void CpuBackend::xent_row_max(float* row_max, const float* logits, int64_t rows, int64_t vocab) {
  for (int64_t r = 0; r < rows; ++r) row_max[r] = row_max_of(logits + r * vocab, vocab);
}

void CpuBackend::xent_sum_exp(float* sum_exp, const float* logits, const float* row_max,
                              int64_t rows, int64_t vocab) {
  std::vector<float> e(vocab);
  for (int64_t r = 0; r < rows; ++r)
    sum_exp[r] = static_cast<float>(row_sum_exp(e.data(), logits + r * vocab, row_max[r], vocab));
}

void CpuBackend::xent_target(float* target, const float* logits, const int32_t* labels,
                             int64_t rows, int64_t vocab, int64_t vocab_start) {
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t id = static_cast<int64_t>(labels[r]) - vocab_start;
    target[r] = labels[r] >= 0 && id >= 0 && id < vocab ? logits[r * vocab + id] : 0.0f;
  }
}

void CpuBackend::xent_loss(float* loss, const float* row_max, const float* sum_exp,
                           const float* target, const int32_t* labels, int64_t rows) {
  for (int64_t r = 0; r < rows; ++r)
    loss[r] = labels[r] < 0 ? 0.0f : std::log(sum_exp[r]) + row_max[r] - target[r];
}

void CpuBackend::loss_accumulate(double* acc, const float* loss, const int32_t* labels,
                                 int64_t rows) {
  for (int64_t r = 0; r < rows; ++r)
    if (labels[r] >= 0) {
      acc[0] += loss[r];
      acc[1] += 1;
    }
}

void CpuBackend::xent_softmax(float* probs, const float* logits, const float* row_max,
                              const float* sum_exp, int64_t rows, int64_t vocab) {
  for (int64_t r = 0; r < rows; ++r)
    row_softmax(probs + r * vocab, logits + r * vocab, row_max[r], 1.0f / sum_exp[r], vocab);
}

void CpuBackend::xent_backward(float* dlogits, const float* probs, const int32_t* labels,
                               int64_t rows, int64_t vocab, int64_t vocab_start, float dloss) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* p = probs + r * vocab;
    float* d = dlogits + r * vocab;
    if (labels[r] < 0) {
      std::fill(d, d + vocab, 0.0f);
      continue;
    }
    for (int64_t v = 0; v < vocab; ++v) d[v] = dloss * p[v];
    const int64_t id = static_cast<int64_t>(labels[r]) - vocab_start;
    if (id >= 0 && id < vocab) d[id] -= dloss;
  }
}

}  // namespace parasol::runtime
