// defines: CpuBackend::router_forward, router_topk, router_backward (softmax over experts, top-k
// with optional renormalisation, and its gradient), moe_permutation (routed rows grouped by
// expert), dispatch_forward/backward (tokens to expert rows and back) and combine_forward/backward
// (the weighted sum of a token's expert outputs). The grouped expert GEMMs are in linear.cc.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/error.h"
#include "runtime/cpu/cpu_backend.h"
#include "runtime/cpu/vec.h"

namespace parasol::runtime {

namespace {

void check_topk(int64_t experts, int64_t top_k) {
  if (top_k < 1 || top_k > experts)
    throw Error("runtime.router", "top_k (" + std::to_string(top_k) +
                                      ") must be in [1, experts = " + std::to_string(experts) +
                                      "]");
}

}  // namespace

void CpuBackend::router_forward(float* probs, int32_t* topk_idx, float* topk_w, const float* logits,
                                int64_t tokens, int64_t experts, int64_t top_k, bool renormalize) {
  check_topk(experts, top_k);
  for (int64_t t = 0; t < tokens; ++t) {
    const float* l = logits + t * experts;
    float* p = probs + t * experts;
    const float mx = cpu::max(l, experts);
    for (int64_t e = 0; e < experts; ++e) p[e] = cpu::exp_fast(l[e] - mx);
    const float inv = static_cast<float>(1.0 / cpu::sum_f64(p, experts));
    for (int64_t e = 0; e < experts; ++e) p[e] *= inv;
  }
  router_topk(topk_idx, topk_w, probs, tokens, experts, top_k, renormalize);
}

void CpuBackend::router_topk(int32_t* topk_idx, float* topk_w, const float* probs, int64_t tokens,
                             int64_t experts, int64_t top_k, bool renormalize) {
  check_topk(experts, top_k);
  for (int64_t t = 0; t < tokens; ++t) {
    const float* p = probs + t * experts;
    // Repeated selection (k is small): the largest not yet taken, the lower index on ties.
    int32_t* idx = topk_idx + t * top_k;
    float* w = topk_w + t * top_k;
    float total = 0.0f;
    for (int64_t s = 0; s < top_k; ++s) {
      int64_t best = -1;
      for (int64_t e = 0; e < experts; ++e) {
        if (std::find(idx, idx + s, static_cast<int32_t>(e)) != idx + s) continue;
        if (best < 0 || p[e] > p[best]) best = e;
      }
      idx[s] = static_cast<int32_t>(best);
      w[s] = p[best];
      total += p[best];
    }
    if (renormalize)
      for (int64_t s = 0; s < top_k; ++s) w[s] /= total;
  }
}

void CpuBackend::router_backward(float* dlogits, const float* dtopk_w, const float* probs,
                                 const int32_t* topk_idx, int64_t tokens, int64_t experts,
                                 int64_t top_k, bool renormalize) {
  check_topk(experts, top_k);
  std::vector<float> dp(experts);
  for (int64_t t = 0; t < tokens; ++t) {
    const float* p = probs + t * experts;
    const int32_t* idx = topk_idx + t * top_k;
    const float* dw = dtopk_w + t * top_k;
    std::fill(dp.begin(), dp.end(), 0.0f);
    if (renormalize) {
      // w_s = p[idx_s] / Z, Z = sum_s p[idx_s]: dp[idx_j] = (dw_j - sum_s dw_s w_s) / Z.
      float z = 0.0f;
      for (int64_t s = 0; s < top_k; ++s) z += p[idx[s]];
      float dot = 0.0f;
      for (int64_t s = 0; s < top_k; ++s) dot += dw[s] * p[idx[s]] / z;
      for (int64_t s = 0; s < top_k; ++s) dp[idx[s]] += (dw[s] - dot) / z;
    } else {
      for (int64_t s = 0; s < top_k; ++s) dp[idx[s]] += dw[s];
    }
    // Softmax: dlogits = p * (dp - sum_e dp_e p_e).
    const float dpp = cpu::dot(dp.data(), p, experts);
    float* dl = dlogits + t * experts;
    for (int64_t e = 0; e < experts; ++e) dl[e] = p[e] * (dp[e] - dpp);
  }
}

void CpuBackend::moe_permutation(int32_t* row_of, int64_t* counts_host, const int32_t* topk_idx,
                                 int64_t tokens, int64_t experts, int64_t top_k) {
  const int64_t n = tokens * top_k;
  std::fill(counts_host, counts_host + experts, int64_t{0});
  for (int64_t i = 0; i < n; ++i) {
    if (topk_idx[i] < 0 || topk_idx[i] >= experts)
      throw Error("runtime.moe_permutation", "expert index " + std::to_string(topk_idx[i]) +
                                                 " out of [0, " + std::to_string(experts) + ")");
    ++counts_host[topk_idx[i]];
  }
  std::vector<int64_t> next(experts);
  int64_t offset = 0;
  for (int64_t e = 0; e < experts; ++e) {
    next[e] = offset;
    offset += counts_host[e];
  }
  for (int64_t i = 0; i < n; ++i) row_of[i] = static_cast<int32_t>(next[topk_idx[i]]++);
}

void CpuBackend::dispatch_forward(float* out, const float* x, const int32_t* row_of, int64_t tokens,
                                  int64_t top_k, int64_t cols) {
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t s = 0; s < top_k; ++s)
      std::copy_n(x + t * cols, cols, out + static_cast<int64_t>(row_of[t * top_k + s]) * cols);
}

void CpuBackend::dispatch_backward(float* dx, const float* dout, const int32_t* row_of,
                                   int64_t tokens, int64_t top_k, int64_t cols) {
  for (int64_t t = 0; t < tokens; ++t) {
    float* d = dx + t * cols;
    std::copy_n(dout + static_cast<int64_t>(row_of[t * top_k]) * cols, cols, d);
    for (int64_t s = 1; s < top_k; ++s) {
      const float* g = dout + static_cast<int64_t>(row_of[t * top_k + s]) * cols;
      for (int64_t c = 0; c < cols; ++c) d[c] += g[c];
    }
  }
}

void CpuBackend::combine_forward(float* out, const float* expert_out, const float* w,
                                 const int32_t* row_of, int64_t tokens, int64_t top_k,
                                 int64_t cols) {
  for (int64_t t = 0; t < tokens; ++t) {
    float* o = out + t * cols;
    std::fill(o, o + cols, 0.0f);
    for (int64_t s = 0; s < top_k; ++s) {
      const float ws = w[t * top_k + s];
      const float* e = expert_out + static_cast<int64_t>(row_of[t * top_k + s]) * cols;
      for (int64_t c = 0; c < cols; ++c) o[c] += ws * e[c];
    }
  }
}

void CpuBackend::combine_backward(float* dexpert_out, float* dw, const float* dout,
                                  const float* expert_out, const float* w, const int32_t* row_of,
                                  int64_t tokens, int64_t top_k, int64_t cols) {
  for (int64_t t = 0; t < tokens; ++t) {
    const float* g = dout + t * cols;
    for (int64_t s = 0; s < top_k; ++s) {
      const int64_t row = row_of[t * top_k + s];
      const float ws = w[t * top_k + s];
      float* de = dexpert_out + row * cols;
      for (int64_t c = 0; c < cols; ++c) de[c] = ws * g[c];
      dw[t * top_k + s] = cpu::dot(g, expert_out + row * cols, cols);
    }
  }
}

}  // namespace parasol::runtime
