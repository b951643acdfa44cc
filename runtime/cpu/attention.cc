// defines: CpuBackend::attention_forward, attention_backward, and the per-head body they share with
// the typed bf16 entries (runtime/cpu/attention_head.h): causal GQA attention (with an
// optional sliding window and value heads of their own width), computed per (sequence, query head)
// in blocks of query rows with the score block materialised in a scratch buffer (GEMMs through
// cpu::sgemm; under the causal mask a block only touches the keys its rows see: from the first
// row's first key to the last row's last). The forward writes the log-sum-exp per query, so the
// backward (and a later ring step, `accumulate`) need neither the probabilities nor the scores;
// dropout masks are re-drawn from the seed (runtime/tensor.h). Memory: the scratch is one block's
// scores, kBlock x seq_kv (three such in the backward), so O(sequence) per call, never the
// seq_q x seq_kv probabilities (attention_scratch_peak() reports it; the tests bound it at 8k).
#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <vector>

#include "core/error.h"
#include "runtime/cpu/attention_head.h"
#include "runtime/cpu/cpu_backend.h"
#include "runtime/cpu/vec.h"
#include "runtime/tensor.h"

namespace parasol::runtime {

namespace cpu_attention {

namespace {

constexpr int64_t kBlock = 128;  // query rows per block

// The largest scratch (bytes) one attention call has held, over the process (atomic: ranks are
// processes, but tests may call from threads).
std::atomic<int64_t> g_scratch_peak{0};
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

float scale_of(const AttentionDims& d) {
  return d.scale > 0.0f ? d.scale : 1.0f / std::sqrt(static_cast<float>(d.head_dim));
}

// The keys a block of query rows [i0, i0 + nb) touches: [k0, k0 + nk), from the first row's
// first visible key to the last row's last (both grow with the row).
struct KeyRange {
  int64_t k0 = 0, nk = 0;
};
inline KeyRange block_keys(const AttentionDims& d, int64_t i0, int64_t nb) {
  const int64_t k0 = d.first_key(i0), k1 = d.last_key(i0 + nb - 1);
  return {k0, std::max<int64_t>(0, k1 - k0)};
}

// Softmax over entries [a, b) of nk scores in place (the others zeroed); returns the log-sum-exp,
// -inf when the range is empty.
PARASOL_CPU_CLONES float softmax_range(float* __restrict p, int64_t a, int64_t b, int64_t nk) {
  std::fill(p, p + a, 0.0f);
  std::fill(p + std::max(a, b), p + nk, 0.0f);
  if (b <= a) return kNegInf;
  const int64_t nv = b - a;
  float* x = p + a;
  const float mx = cpu::max(x, nv);
  cpu::exp_shifted(x, mx, nv);
  const double sum = cpu::sum_f64(x, nv);
  const auto inv = static_cast<float>(1.0 / sum);
  for (int64_t j = 0; j < nv; ++j) x[j] *= inv;
  return mx + static_cast<float>(std::log(sum));
}

// p[j] = e^(p[j] - lse) for a <= j < b (0 when lse = -inf), 0 for the other j < nk.
PARASOL_CPU_CLONES void probs_from_lse(float* __restrict p, float lse, int64_t a, int64_t b,
                                       int64_t nk) {
  std::fill(p, p + a, 0.0f);
  std::fill(p + std::max(a, b), p + nk, 0.0f);
  if (b <= a) return;
  if (lse == kNegInf)
    std::fill(p + a, p + b, 0.0f);
  else
    cpu::exp_shifted(p + a, lse, b - a);
}

}  // namespace

void note_scratch(int64_t bytes) {
  int64_t seen = g_scratch_peak.load();
  while (bytes > seen && !g_scratch_peak.compare_exchange_weak(seen, bytes)) {
  }
}

void check(const AttentionDims& d) {
  if (d.heads <= 0 || d.kv_heads <= 0 || d.heads % d.kv_heads != 0)
    throw Error("runtime.attention", "heads (" + std::to_string(d.heads) +
                                         ") must be a positive multiple of kv_heads (" +
                                         std::to_string(d.kv_heads) + ")");
  if (d.dropout_p < 0.0f || d.dropout_p >= 1.0f)
    throw Error("runtime.attention", "dropout_p must be in [0, 1)");
}

Head head_at(const AttentionDims& d, const float* q, const float* k, const float* v, int64_t b,
             int64_t h) {
  const int64_t g = h / (d.heads / d.kv_heads);
  return {q + b * d.seq_q * d.ld_q + h * d.head_dim, k + b * d.seq_kv * d.ld_kv + g * d.head_dim,
          v + b * d.seq_kv * d.ld_kv + g * d.vd(), (b * d.heads + h) * d.seq_q * d.seq_kv};
}

Scratch forward_scratch(const AttentionDims& d) {
  Scratch sc;
  sc.s.resize(kBlock * std::max<int64_t>(d.seq_kv, 1));
  sc.o.resize(kBlock * d.vd());
  sc.row_lse.resize(kBlock);
  note_scratch(static_cast<int64_t>((sc.s.size() + sc.o.size() + sc.row_lse.size()) * 4));
  return sc;
}

Scratch backward_scratch(const AttentionDims& d) {
  Scratch sc;
  const int64_t width = std::max<int64_t>(d.seq_kv, 1);
  sc.p.resize(kBlock * width);
  sc.pd.resize(kBlock * width);
  sc.dp.resize(kBlock * width);
  sc.delta.resize(kBlock);
  note_scratch(static_cast<int64_t>((sc.p.size() + sc.pd.size() + sc.dp.size() + sc.delta.size()) *
                                    sizeof(float)));
  return sc;
}

void forward_head(const AttentionDims& d, const Head& hd, float* out_h, float* lse_h,
                  float* probs_h, bool accumulate, Scratch& sc) {
  const int64_t D = d.head_dim, Dv = d.vd(), Skv = d.seq_kv;
  const float scale = scale_of(d);
  const bool drop = d.dropout_p > 0.0f;
  const uint32_t threshold = dropout_threshold(d.dropout_p);
  const float keep_scale = 1.0f / (1.0f - d.dropout_p);
  std::vector<float>&s = sc.s, &o = sc.o, &row_lse = sc.row_lse;
  for (int64_t i0 = 0; i0 < d.seq_q; i0 += kBlock) {
    const int64_t nb = std::min(kBlock, d.seq_q - i0);
    const auto [k0, nk] = block_keys(d, i0, nb);
    // Scores of keys [k0, k0 + nk), then per row: mask, max, exp, sum; P normalised in place.
    cpu::sgemm(false, true, nb, nk, D, scale, hd.q + i0 * d.ld_q, d.ld_q, hd.k + k0 * d.ld_kv,
               d.ld_kv, 0.0f, s.data(), nk);
    for (int64_t r = 0; r < nb; ++r) {
      const int64_t i = i0 + r;
      float* p = s.data() + r * nk;
      const int64_t a = d.first_key(i) - k0, e = d.last_key(i) - k0;
      row_lse[r] = softmax_range(p, a, e, nk);
      if (probs_h != nullptr) {
        float* pr = probs_h + i * Skv;
        std::fill(pr, pr + k0, 0.0f);
        std::copy(p, p + nk, pr + k0);
        std::fill(pr + k0 + nk, pr + Skv, 0.0f);
      }
      if (drop) {
        const uint64_t base = hd.mask_base + i * Skv + k0;
        for (int64_t j = a; j < e; ++j)
          p[j] = dropout_keep(d.dropout_seed, base + j, threshold) ? p[j] * keep_scale : 0.0f;
      }
    }
    const float* vb = hd.v + k0 * d.ld_kv;
    float* ob = out_h + i0 * d.ld_o;
    float* lb = lse_h != nullptr ? lse_h + i0 : nullptr;
    if (!accumulate) {
      cpu::sgemm(false, false, nb, Dv, nk, 1.0f, s.data(), nk, vb, d.ld_kv, 0.0f, ob, d.ld_o);
      if (lb != nullptr) std::copy(row_lse.begin(), row_lse.begin() + nb, lb);
      continue;
    }
    // Merge with the earlier steps: out = out e^(lse_old - lse_new) + o e^(lse_c - lse_new).
    cpu::sgemm(false, false, nb, Dv, nk, 1.0f, s.data(), nk, vb, d.ld_kv, 0.0f, o.data(), Dv);
    for (int64_t r = 0; r < nb; ++r) {
      const float lc = row_lse[r], lo = lb[r];
      if (lc == kNegInf) continue;
      float* orow = ob + r * d.ld_o;
      const float* crow = o.data() + r * Dv;
      if (lo == kNegInf) {
        std::copy(crow, crow + Dv, orow);
        lb[r] = lc;
        continue;
      }
      const float mx = std::max(lo, lc);
      const float wo = std::exp(lo - mx), wc = std::exp(lc - mx);
      const float inv = 1.0f / (wo + wc);
      for (int64_t c = 0; c < Dv; ++c) orow[c] = (orow[c] * wo + crow[c] * wc) * inv;
      lb[r] = mx + std::log(wo + wc);
    }
  }
}

void backward_head(const AttentionDims& d, const Head& hd, float* dq_h, float* dk_g, float* dv_g,
                   const float* dout_h, const float* out_h, const float* lse_h,
                   const float* probs_h, bool accumulate_dq, Scratch& sc) {
  const int64_t D = d.head_dim, Dv = d.vd(), Skv = d.seq_kv;
  const float scale = scale_of(d);
  const bool drop = d.dropout_p > 0.0f;
  const uint32_t threshold = dropout_threshold(d.dropout_p);
  const float keep_scale = 1.0f / (1.0f - d.dropout_p);
  std::vector<float>&p = sc.p, &pd = sc.pd, &dp = sc.dp, &delta = sc.delta;
  for (int64_t i0 = 0; i0 < d.seq_q; i0 += kBlock) {
    const int64_t nb = std::min(kBlock, d.seq_q - i0);
    const auto [k0, nk] = block_keys(d, i0, nb);
    const float* qb = hd.q + i0 * d.ld_q;
    const float* kb = hd.k + k0 * d.ld_kv;
    const float* vb = hd.v + k0 * d.ld_kv;
    const float* dob = dout_h + i0 * d.ld_o;
    const float* ob = out_h + i0 * d.ld_o;
    float* dqb = dq_h + i0 * d.ld_q;
    // P over keys [k0, k0 + nk): from probs, or recomputed from the scores and lse.
    if (probs_h == nullptr)
      cpu::sgemm(false, true, nb, nk, D, scale, qb, d.ld_q, kb, d.ld_kv, 0.0f, p.data(), nk);
    for (int64_t r = 0; r < nb; ++r) {
      const int64_t i = i0 + r;
      float* pr = p.data() + r * nk;
      const int64_t a = d.first_key(i) - k0, e = d.last_key(i) - k0;
      if (probs_h != nullptr) {
        std::copy_n(probs_h + i * Skv + k0, nk, pr);
        std::fill(pr, pr + a, 0.0f);
        std::fill(pr + std::max(a, e), pr + nk, 0.0f);
      } else {
        probs_from_lse(pr, lse_h[i], a, e, nk);
      }
      delta[r] = cpu::dot(dob + r * d.ld_o, ob + r * d.ld_o, Dv);
    }
    // dP' = dO V^T (the gradient of the dropped probabilities).
    cpu::sgemm(false, true, nb, nk, Dv, 1.0f, dob, d.ld_o, vb, d.ld_kv, 0.0f, dp.data(), nk);
    const float* pv = p.data();  // the probabilities that multiplied V
    if (drop) {
      for (int64_t r = 0; r < nb; ++r) {
        const uint64_t base = hd.mask_base + (i0 + r) * Skv + k0;
        for (int64_t j = 0; j < nk; ++j) {
          const bool keep = dropout_keep(d.dropout_seed, base + j, threshold);
          pd[r * nk + j] = keep ? p[r * nk + j] * keep_scale : 0.0f;
          dp[r * nk + j] = keep ? dp[r * nk + j] * keep_scale : 0.0f;
        }
      }
      pv = pd.data();
    }
    // dV += P'^T dO.
    cpu::sgemm(true, false, nk, Dv, nb, 1.0f, pv, nk, dob, d.ld_o, 1.0f, dv_g + k0 * d.ld_kv,
               d.ld_kv);
    // dS = P (dP - delta), in place in dp.
    for (int64_t r = 0; r < nb; ++r) {
      const float* pr = p.data() + r * nk;
      float* ds = dp.data() + r * nk;
      for (int64_t j = 0; j < nk; ++j) ds[j] = pr[j] * (ds[j] - delta[r]);
    }
    // dQ (+)= scale dS K; dK += scale dS^T Q.
    cpu::sgemm(false, false, nb, D, nk, scale, dp.data(), nk, kb, d.ld_kv,
               accumulate_dq ? 1.0f : 0.0f, dqb, d.ld_q);
    cpu::sgemm(true, false, nk, D, nb, scale, dp.data(), nk, qb, d.ld_q, 1.0f, dk_g + k0 * d.ld_kv,
               d.ld_kv);
  }
}

}  // namespace cpu_attention

using namespace cpu_attention;

void CpuBackend::attention_forward(const AttentionDims& d, float* out, float* lse, float* probs,
                                   const float* q, const float* k, const float* v,
                                   bool accumulate) {
  check(d);
  if (accumulate && lse == nullptr)
    throw Error("runtime.attention", "accumulate needs the lse of the earlier steps");
  Scratch sc = forward_scratch(d);
  for (int64_t b = 0; b < d.batch; ++b)
    for (int64_t h = 0; h < d.heads; ++h) {
      const int64_t bh = b * d.heads + h;
      forward_head(d, head_at(d, q, k, v, b, h), out + b * d.seq_q * d.ld_o + h * d.vd(),
                   lse != nullptr ? lse + bh * d.seq_q : nullptr,
                   probs != nullptr ? probs + bh * d.seq_q * d.seq_kv : nullptr, accumulate, sc);
    }
}

void CpuBackend::attention_backward(const AttentionDims& d, float* dq, float* dk, float* dv,
                                    const float* dout, const float* q, const float* k,
                                    const float* v, const float* out, const float* lse,
                                    const float* probs, bool accumulate_dq, bool accumulate_dkv) {
  check(d);
  if (lse == nullptr && probs == nullptr)
    throw Error("runtime.attention", "the backward needs lse or probs");
  const int64_t D = d.head_dim, Dv = d.vd(), Skv = d.seq_kv;
  if (!accumulate_dkv) {  // several query heads and blocks add into each kv head
    for (int64_t row = 0; row < d.batch * Skv; ++row) {
      std::fill(dk + row * d.ld_kv, dk + row * d.ld_kv + d.kv_heads * D, 0.0f);
      std::fill(dv + row * d.ld_kv, dv + row * d.ld_kv + d.kv_heads * Dv, 0.0f);
    }
  }
  Scratch sc = backward_scratch(d);
  for (int64_t b = 0; b < d.batch; ++b) {
    for (int64_t h = 0; h < d.heads; ++h) {
      const int64_t g = h / (d.heads / d.kv_heads), bh = b * d.heads + h;
      const int64_t orow = b * d.seq_q * d.ld_o + h * Dv;
      backward_head(d, head_at(d, q, k, v, b, h), dq + b * d.seq_q * d.ld_q + h * D,
                    dk + b * Skv * d.ld_kv + g * D, dv + b * Skv * d.ld_kv + g * Dv, dout + orow,
                    out + orow, lse != nullptr ? lse + bh * d.seq_q : nullptr,
                    probs != nullptr ? probs + bh * d.seq_q * Skv : nullptr, accumulate_dq, sc);
    }
  }
}

int64_t CpuBackend::attention_scratch_peak() { return g_scratch_peak.load(); }
void CpuBackend::reset_attention_scratch_peak() { g_scratch_peak.store(0); }

}  // namespace parasol::runtime
