// Attention kernels against a double reference: causal and full masks, sliding windows (flash,
// materialised, dropout, ring steps), value heads wider or narrower than the query/key heads
// (MLA), GQA (kv_heads < heads) and MHA, a fused QKV buffer (strided rows) and separate Q/K/V with
// seq_kv != seq_q, probabilities and log-sum-exp outputs, two query blocks; the backward against a
// double reference backward, against central finite differences of the reference forward, and from
// saved probabilities; ring steps (keys in two chunks, merged with `accumulate`) equal to the
// whole; dropout with the mask of runtime/tensor.h. Tolerance: 1e-5 of the largest reference
// magnitude of each tensor.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "core/error.h"
#include "kernel_test_util.h"
#include "runtime/tensor.h"

namespace parasol::runtime {
namespace {

using test::cpu;
using test::near_normwise;
using test::to_double;

struct Ref {
  std::vector<double> out, lse, probs;  // forward
  std::vector<double> dq, dk, dv;       // backward (same layouts as q, k, v)
};

// Straight from the definition, one query at a time. q, k, v, out use the strides of d; probs is
// [B, H, Sq, Skv]; with dout given, also the gradients.
Ref reference(const AttentionDims& d, const std::vector<double>& q, const std::vector<double>& k,
              const std::vector<double>& v, const std::vector<double>* dout, size_t q_size,
              size_t kv_size) {
  const int64_t B = d.batch, Sq = d.seq_q, Skv = d.seq_kv, H = d.heads, D = d.head_dim;
  const int64_t Dv = d.v_head_dim > 0 ? d.v_head_dim : D;
  const int64_t group = d.heads / d.kv_heads;
  const double scale = d.scale > 0 ? d.scale : 1.0 / std::sqrt(static_cast<double>(D));
  const uint32_t thr = dropout_threshold(d.dropout_p);
  const double keep_scale = 1.0 / (1.0 - d.dropout_p);
  Ref r;
  r.out.assign(B * Sq * d.ld_o, 0.0);
  r.lse.assign(B * H * Sq, -std::numeric_limits<double>::infinity());
  r.probs.assign(B * H * Sq * Skv, 0.0);
  if (dout) {
    r.dq.assign(q_size, 0.0);
    r.dk.assign(kv_size, 0.0);
    r.dv.assign(kv_size, 0.0);
  }
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t g = h / group;
      for (int64_t i = 0; i < Sq; ++i) {
        const double* qi = &q[(b * Sq + i) * d.ld_q + h * D];
        std::vector<double> s(Skv), p(Skv, 0.0), pd(Skv, 0.0), keep(Skv, 1.0);
        std::vector<int64_t> vis;
        for (int64_t j = 0; j < Skv; ++j) {
          if (d.causal && j > i + d.causal_offset) continue;
          if (d.causal && d.window > 0 && j <= i + d.causal_offset - d.window) continue;
          vis.push_back(j);
          double dot = 0;
          for (int64_t c = 0; c < D; ++c) dot += qi[c] * k[(b * Skv + j) * d.ld_kv + g * D + c];
          s[j] = scale * dot;
        }
        if (vis.empty()) continue;
        double mx = -INFINITY, sum = 0;
        for (int64_t j : vis) mx = std::max(mx, s[j]);
        for (int64_t j : vis) sum += std::exp(s[j] - mx);
        const double lse = mx + std::log(sum);
        r.lse[(b * H + h) * Sq + i] = lse;
        const int64_t mbase = ((b * H + h) * Sq + i) * Skv;
        for (int64_t j : vis) {
          p[j] = std::exp(s[j] - lse);
          r.probs[mbase + j] = p[j];
          if (d.dropout_p > 0)
            keep[j] = dropout_keep(d.dropout_seed, mbase + j, thr) ? keep_scale : 0.0;
          pd[j] = p[j] * keep[j];
          for (int64_t c = 0; c < Dv; ++c)
            r.out[(b * Sq + i) * d.ld_o + h * Dv + c] +=
                pd[j] * v[(b * Skv + j) * d.ld_kv + g * Dv + c];
        }
        if (!dout) continue;
        const double* gi = &(*dout)[(b * Sq + i) * d.ld_o + h * Dv];
        // dpd_j = dO . v_j;  dp_j = keep_j dpd_j;  ds_j = p_j (dp_j - sum_l p_l dp_l).
        std::vector<double> dp(Skv, 0.0);
        double pdp = 0;
        for (int64_t j : vis) {
          double dot = 0;
          for (int64_t c = 0; c < Dv; ++c) dot += gi[c] * v[(b * Skv + j) * d.ld_kv + g * Dv + c];
          dp[j] = keep[j] * dot;
          pdp += p[j] * dp[j];
        }
        for (int64_t j : vis) {
          const double ds = p[j] * (dp[j] - pdp);
          for (int64_t c = 0; c < D; ++c) {
            r.dq[(b * Sq + i) * d.ld_q + h * D + c] +=
                scale * ds * k[(b * Skv + j) * d.ld_kv + g * D + c];
            r.dk[(b * Skv + j) * d.ld_kv + g * D + c] += scale * ds * qi[c];
          }
          for (int64_t c = 0; c < Dv; ++c)
            r.dv[(b * Skv + j) * d.ld_kv + g * Dv + c] += pd[j] * gi[c];
        }
      }
    }
  return r;
}

// Entries of a strided [rows x ld] buffer that belong to columns [c0, c1).
std::vector<float> cols_of(const std::vector<float>& x, int64_t ld, int64_t c0, int64_t c1) {
  std::vector<float> out;
  for (size_t r = 0; r < x.size() / ld; ++r)
    for (int64_t c = c0; c < c1; ++c) out.push_back(x[r * ld + c]);
  return out;
}
std::vector<double> cols_of(const std::vector<double>& x, int64_t ld, int64_t c0, int64_t c1) {
  std::vector<double> out;
  for (size_t r = 0; r < x.size() / ld; ++r)
    for (int64_t c = c0; c < c1; ++c) out.push_back(x[r * ld + c]);
  return out;
}

// A fused QKV problem: qkv [B*S x (H D + KVH (D + Dv))], columns Q | K | V (Dv = D unless given).
struct Fused {
  AttentionDims d;
  int64_t width;
  std::vector<float> qkv, dout;
  Fused(int64_t B, int64_t S, int64_t H, int64_t KVH, int64_t D, bool causal, uint32_t seed,
        int64_t Dv = 0, int64_t window = 0) {
    d.batch = B;
    d.seq_q = d.seq_kv = S;
    d.heads = H;
    d.kv_heads = KVH;
    d.head_dim = D;
    d.v_head_dim = Dv;
    d.window = window;
    if (Dv == 0) Dv = D;
    width = H * D + KVH * (D + Dv);
    d.ld_q = d.ld_kv = width;
    d.ld_o = H * Dv;
    d.causal = causal;
    qkv = test::random_floats(B * S * width, seed, -1.5f, 1.5f);
    dout = test::random_floats(B * S * H * Dv, seed + 1);
  }
  int64_t vd() const { return d.vd(); }
  // dQ | dK | dV of one call into a fused buffer like qkv.
  std::vector<float> backward(const std::vector<float>& out, const float* lse,
                              const float* probs) const {
    std::vector<float> dqkv = test::random_floats(qkv.size(), 99);  // garbage: nothing accumulates
    float* dq = dqkv.data();
    float* dk = dq + d.heads * d.head_dim;
    float* dv = dk + d.kv_heads * d.head_dim;
    cpu().attention_backward(d, dq, dk, dv, dout.data(), q(), k(), v(), out.data(), lse, probs,
                             false, false);
    return dqkv;
  }
  // The reference gradients in the fused layout.
  std::vector<double> fused_grad(const Ref& r) const {
    const int64_t hq = d.heads * d.head_dim, hk = d.kv_heads * d.head_dim;
    std::vector<double> out(qkv.size());
    for (size_t i = 0; i < out.size(); ++i) {
      const int64_t c = static_cast<int64_t>(i % width);
      out[i] = c < hq ? r.dq[i] : c < hq + hk ? r.dk[i - hq] : r.dv[i - hq - hk];
    }
    return out;
  }
  const float* q() const { return qkv.data(); }
  const float* k() const { return qkv.data() + d.heads * d.head_dim; }
  const float* v() const { return k() + d.kv_heads * d.head_dim; }
  Ref ref(bool with_grad) const {
    std::vector<double> x = to_double(qkv), g = to_double(dout);
    return reference_fused(x, with_grad ? &g : nullptr);
  }
  Ref reference_fused(const std::vector<double>& x, const std::vector<double>* g) const {
    // The reference indexes q, k, v from their own base pointers: pass shifted copies.
    const int64_t hq = d.heads * d.head_dim, hk = d.kv_heads * d.head_dim;
    std::vector<double> kk(x.begin() + hq, x.end()), vv(x.begin() + hq + hk, x.end());
    kk.resize(x.size(), 0.0);
    vv.resize(x.size(), 0.0);
    return reference(d, x, kk, vv, g, x.size(), x.size());
  }
};

class AttentionShapes : public ::testing::TestWithParam<std::tuple<int, int, bool>> {};

TEST_P(AttentionShapes, ForwardMatchesReference) {
  const auto [H, KVH, causal] = GetParam();
  Fused f(2, 200, H, KVH, 16, causal, 1);  // 200 queries: two blocks of 128 (one partial)
  std::vector<float> out(f.d.batch * f.d.seq_q * f.d.ld_o), lse(f.d.batch * H * f.d.seq_q),
      probs(f.d.batch * H * f.d.seq_q * f.d.seq_kv, -1.0f);
  cpu().attention_forward(f.d, out.data(), lse.data(), probs.data(), f.q(), f.k(), f.v(), false);
  const Ref r = f.ref(false);
  EXPECT_TRUE(near_normwise(out, r.out, 1e-5, "out"));
  EXPECT_TRUE(near_normwise(lse, r.lse, 1e-5, "lse"));
  EXPECT_TRUE(near_normwise(probs, r.probs, 1e-5, "probs"));
}

TEST_P(AttentionShapes, BackwardMatchesReference) {
  const auto [H, KVH, causal] = GetParam();
  Fused f(2, 200, H, KVH, 16, causal, 3);
  std::vector<float> out(f.d.batch * f.d.seq_q * f.d.ld_o), lse(f.d.batch * H * f.d.seq_q);
  cpu().attention_forward(f.d, out.data(), lse.data(), nullptr, f.q(), f.k(), f.v(), false);
  // Gradients into a fused dQKV buffer (garbage first: nothing accumulates).
  std::vector<float> dqkv = test::random_floats(f.qkv.size(), 5);
  float* dq = dqkv.data();
  float* dk = dq + H * f.d.head_dim;
  float* dv = dk + KVH * f.d.head_dim;
  cpu().attention_backward(f.d, dq, dk, dv, f.dout.data(), f.q(), f.k(), f.v(), out.data(),
                           lse.data(), nullptr, false, false);
  const Ref r = f.ref(true);
  const int64_t hq = H * f.d.head_dim, hk = KVH * f.d.head_dim, w = f.width;
  EXPECT_TRUE(near_normwise(cols_of(dqkv, w, 0, hq), cols_of(r.dq, w, 0, hq), 1e-5, "dq"));
  EXPECT_TRUE(near_normwise(cols_of(dqkv, w, hq, hq + hk), cols_of(r.dk, w, 0, hk), 1e-5, "dk"));
  EXPECT_TRUE(near_normwise(cols_of(dqkv, w, hq + hk, w), cols_of(r.dv, w, 0, hk), 1e-5, "dv"));
}

INSTANTIATE_TEST_SUITE_P(Shapes, AttentionShapes,
                         ::testing::Values(std::make_tuple(6, 2, true),    // GQA, causal
                                           std::make_tuple(4, 1, true),    // MQA, causal
                                           std::make_tuple(4, 4, true),    // MHA, causal
                                           std::make_tuple(6, 3, false)),  // GQA, full mask
                         [](const auto& info) {
                           return "h" + std::to_string(std::get<0>(info.param)) + "kv" +
                                  std::to_string(std::get<1>(info.param)) +
                                  (std::get<2>(info.param) ? "causal" : "full");
                         });

TEST(Attention, BackwardMatchesFiniteDifferences) {
  for (bool causal : {true, false}) {
    Fused f(2, 5, 4, 2, 3, causal, 7);
    std::vector<float> out(f.d.batch * f.d.seq_q * f.d.ld_o), lse(f.d.batch * 4 * f.d.seq_q);
    cpu().attention_forward(f.d, out.data(), lse.data(), nullptr, f.q(), f.k(), f.v(), false);
    std::vector<float> dqkv(f.qkv.size(), 0.0f);
    float* dq = dqkv.data();
    cpu().attention_backward(f.d, dq, dq + 4 * 3, dq + 6 * 3, f.dout.data(), f.q(), f.k(), f.v(),
                             out.data(), lse.data(), nullptr, false, false);
    std::vector<double> x = to_double(f.qkv), g = to_double(f.dout);
    auto loss = [&] { return test::weighted_sum(f.reference_fused(x, nullptr).out, g); };
    EXPECT_TRUE(near_normwise(dqkv, test::finite_diff(x, loss), 1e-5, "dqkv vs fd")) << causal;
  }
}

TEST(Attention, SeparateBuffersCrossLengthsAndScale) {
  // seq_kv > seq_q with a causal offset (queries are the last 40 of 70 positions), MHA, explicit
  // scale, and separate Q, K, V, out buffers.
  AttentionDims d;
  d.batch = 3;
  d.seq_q = 40;
  d.seq_kv = 70;
  d.heads = d.kv_heads = 2;
  d.head_dim = 8;
  d.ld_q = d.ld_kv = d.ld_o = 16;
  d.causal_offset = 30;
  d.scale = 0.2f;
  std::vector<float> q = test::random_floats(3 * 40 * 16, 9),
                     k = test::random_floats(3 * 70 * 16, 10),
                     v = test::random_floats(3 * 70 * 16, 11),
                     dout = test::random_floats(3 * 40 * 16, 12);
  std::vector<float> out(q.size()), lse(3 * 2 * 40);
  cpu().attention_forward(d, out.data(), lse.data(), nullptr, q.data(), k.data(), v.data(), false);
  std::vector<double> G = to_double(dout);
  const Ref r = reference(d, to_double(q), to_double(k), to_double(v), &G, q.size(), k.size());
  EXPECT_TRUE(near_normwise(out, r.out, 1e-5, "out"));
  EXPECT_TRUE(near_normwise(lse, r.lse, 1e-5, "lse"));
  std::vector<float> dq(q.size()), dk(k.size()), dv(v.size());
  cpu().attention_backward(d, dq.data(), dk.data(), dv.data(), dout.data(), q.data(), k.data(),
                           v.data(), out.data(), lse.data(), nullptr, false, false);
  EXPECT_TRUE(near_normwise(dq, r.dq, 1e-5, "dq"));
  EXPECT_TRUE(near_normwise(dk, r.dk, 1e-5, "dk"));
  EXPECT_TRUE(near_normwise(dv, r.dv, 1e-5, "dv"));
}

TEST(Attention, BackwardFromSavedProbabilities) {
  // The materialised path: the backward reads probs instead of lse.
  Fused f(2, 70, 4, 2, 8, true, 13);
  const int64_t H = 4;
  std::vector<float> out(f.d.batch * f.d.seq_q * f.d.ld_o),
      probs(f.d.batch * H * f.d.seq_q * f.d.seq_kv);
  cpu().attention_forward(f.d, out.data(), nullptr, probs.data(), f.q(), f.k(), f.v(), false);
  std::vector<float> dqkv(f.qkv.size(), 0.0f);
  float* dq = dqkv.data();
  cpu().attention_backward(f.d, dq, dq + H * 8, dq + (H + 2) * 8, f.dout.data(), f.q(), f.k(),
                           f.v(), out.data(), nullptr, probs.data(), false, false);
  const Ref r = f.ref(true);
  std::vector<double> ref(f.qkv.size());
  for (size_t i = 0; i < ref.size(); ++i) {
    const int64_t c = static_cast<int64_t>(i % f.width);
    ref[i] = c < H * 8 ? r.dq[i] : c < (H + 2) * 8 ? r.dk[i - H * 8] : r.dv[i - (H + 2) * 8];
  }
  EXPECT_TRUE(near_normwise(dqkv, ref, 1e-5, "dqkv from probs"));
}

// Ring attention: the keys of one sequence in two chunks (a later chunk first, as a ring
// delivers them), merged with accumulate; the backward per chunk with the merged out and lse.
TEST(Attention, RingStepsMergeToTheWhole) {
  const int64_t B = 2, S = 90, H = 4, KVH = 2, D = 8, c = 37;
  AttentionDims full;
  full.batch = B;
  full.seq_q = full.seq_kv = S;
  full.heads = H;
  full.kv_heads = KVH;
  full.head_dim = D;
  full.ld_q = full.ld_o = H * D;
  full.ld_kv = KVH * D;
  std::vector<float> q = test::random_floats(B * S * H * D, 14, -2.0f, 2.0f),
                     k = test::random_floats(B * S * KVH * D, 15, -2.0f, 2.0f),
                     v = test::random_floats(B * S * KVH * D, 16),
                     dout = test::random_floats(B * S * H * D, 17);
  // Chunks as their own buffers [B * len x KVH D].
  auto chunk = [&](const std::vector<float>& x, int64_t j0, int64_t len) {
    std::vector<float> out;
    for (int64_t b = 0; b < B; ++b)
      out.insert(out.end(), x.begin() + (b * S + j0) * KVH * D,
                 x.begin() + (b * S + j0 + len) * KVH * D);
    return out;
  };
  std::vector<float> ka = chunk(k, 0, c), va = chunk(v, 0, c), kb = chunk(k, c, S - c),
                     vb = chunk(v, c, S - c);
  AttentionDims da = full, db = full;
  da.seq_kv = c;
  db.seq_kv = S - c;
  db.causal_offset = -c;  // key j' of chunk b is position c + j'
  std::vector<float> out(q.size()), lse(B * H * S);
  cpu().attention_forward(db, out.data(), lse.data(), nullptr, q.data(), kb.data(), vb.data(),
                          false);
  cpu().attention_forward(da, out.data(), lse.data(), nullptr, q.data(), ka.data(), va.data(),
                          true);
  std::vector<double> G = to_double(dout);
  const Ref r = reference(full, to_double(q), to_double(k), to_double(v), &G, q.size(), k.size());
  EXPECT_TRUE(near_normwise(out, r.out, 1e-5, "merged out"));
  EXPECT_TRUE(near_normwise(lse, r.lse, 1e-5, "merged lse"));

  std::vector<float> dq(q.size()), dka(ka.size()), dva(va.size()), dkb(kb.size()), dvb(vb.size());
  cpu().attention_backward(da, dq.data(), dka.data(), dva.data(), dout.data(), q.data(), ka.data(),
                           va.data(), out.data(), lse.data(), nullptr, false, false);
  cpu().attention_backward(db, dq.data(), dkb.data(), dvb.data(), dout.data(), q.data(), kb.data(),
                           vb.data(), out.data(), lse.data(), nullptr, true, false);
  // Reassemble dk, dv in sequence order.
  std::vector<float> dk, dv;
  for (int64_t b = 0; b < B; ++b) {
    dk.insert(dk.end(), dka.begin() + b * c * KVH * D, dka.begin() + (b + 1) * c * KVH * D);
    dk.insert(dk.end(), dkb.begin() + b * (S - c) * KVH * D,
              dkb.begin() + (b + 1) * (S - c) * KVH * D);
    dv.insert(dv.end(), dva.begin() + b * c * KVH * D, dva.begin() + (b + 1) * c * KVH * D);
    dv.insert(dv.end(), dvb.begin() + b * (S - c) * KVH * D,
              dvb.begin() + (b + 1) * (S - c) * KVH * D);
  }
  EXPECT_TRUE(near_normwise(dq, r.dq, 1e-5, "ring dq"));
  EXPECT_TRUE(near_normwise(dk, r.dk, 1e-5, "ring dk"));
  EXPECT_TRUE(near_normwise(dv, r.dv, 1e-5, "ring dv"));

  // accumulate_dkv adds to what the K/V gradient buffers held (the ring's travelling accumulator).
  std::vector<float> acc = dka, accv = dva;
  std::vector<float> dq2(q.size());
  cpu().attention_backward(da, dq2.data(), acc.data(), accv.data(), dout.data(), q.data(),
                           ka.data(), va.data(), out.data(), lse.data(), nullptr, false, true);
  std::vector<double> twice(dka.size());
  for (size_t i = 0; i < twice.size(); ++i) twice[i] = 2.0 * dka[i];
  EXPECT_TRUE(near_normwise(acc, twice, 1e-6, "accumulated dk"));
}

TEST(Attention, DropoutForwardAndBackward) {
  Fused f(2, 20, 4, 2, 4, true, 18);
  f.d.dropout_p = 0.3f;
  f.d.dropout_seed = 1234;
  std::vector<float> out(f.d.batch * f.d.seq_q * f.d.ld_o), lse(f.d.batch * 4 * f.d.seq_q);
  cpu().attention_forward(f.d, out.data(), lse.data(), nullptr, f.q(), f.k(), f.v(), false);
  const Ref r = f.ref(true);
  EXPECT_TRUE(near_normwise(out, r.out, 1e-5, "out with dropout"));
  EXPECT_TRUE(near_normwise(lse, r.lse, 1e-5, "lse (before dropout)"));
  std::vector<float> dqkv(f.qkv.size(), 0.0f);
  float* dq = dqkv.data();
  cpu().attention_backward(f.d, dq, dq + 16, dq + 24, f.dout.data(), f.q(), f.k(), f.v(),
                           out.data(), lse.data(), nullptr, false, false);
  // The mask is a fixed function of the seed, so finite differences see the same mask.
  std::vector<double> x = to_double(f.qkv), g = to_double(f.dout);
  auto loss = [&] { return test::weighted_sum(f.reference_fused(x, nullptr).out, g); };
  EXPECT_TRUE(near_normwise(dqkv, test::finite_diff(x, loss), 1e-5, "dqkv vs fd (dropout)"));
  // A different seed gives a different output.
  f.d.dropout_seed = 4321;
  std::vector<float> out2(out.size());
  cpu().attention_forward(f.d, out2.data(), nullptr, nullptr, f.q(), f.k(), f.v(), false);
  EXPECT_NE(out, out2);
}

TEST(Attention, FullyMaskedQueriesAndErrors) {
  // causal_offset -3: the first three queries see no key: lse -inf, output 0, no gradient.
  Fused f(1, 6, 2, 1, 4, true, 19);
  f.d.causal_offset = -3;
  std::vector<float> out(6 * 8, 5.0f), lse(2 * 6);
  cpu().attention_forward(f.d, out.data(), lse.data(), nullptr, f.q(), f.k(), f.v(), false);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(lse[i], -std::numeric_limits<float>::infinity());
    for (int c = 0; c < 8; ++c) EXPECT_EQ(out[i * 8 + c], 0.0f);
  }
  const Ref r = f.ref(true);
  EXPECT_TRUE(near_normwise(out, r.out, 1e-5, "out"));
  std::vector<float> dqkv(f.qkv.size(), 0.0f);
  cpu().attention_backward(f.d, dqkv.data(), dqkv.data() + 8, dqkv.data() + 12, f.dout.data(),
                           f.q(), f.k(), f.v(), out.data(), lse.data(), nullptr, false, false);
  for (float x : dqkv) EXPECT_TRUE(std::isfinite(x));
  EXPECT_TRUE(near_normwise(cols_of(dqkv, 16, 0, 8), cols_of(r.dq, 16, 0, 8), 1e-5, "dq"));

  // A whole query block (rows 0-127 of 200) without visible keys: its dq rows are written (zero)
  // when not accumulating and left alone when accumulating.
  Fused g(1, 200, 2, 1, 4, true, 20);
  g.d.causal_offset = -150;
  std::vector<float> gout(200 * 8), glse(2 * 200);
  cpu().attention_forward(g.d, gout.data(), glse.data(), nullptr, g.q(), g.k(), g.v(), false);
  const Ref gr = g.ref(true);
  EXPECT_TRUE(near_normwise(gout, gr.out, 1e-5, "out, empty block"));
  EXPECT_TRUE(near_normwise(glse, gr.lse, 1e-5, "lse, empty block"));
  std::vector<float> gq = test::random_floats(g.qkv.size(), 21), gq2 = gq;
  cpu().attention_backward(g.d, gq.data(), gq.data() + 8, gq.data() + 12, g.dout.data(), g.q(),
                           g.k(), g.v(), gout.data(), glse.data(), nullptr, false, false);
  EXPECT_TRUE(near_normwise(cols_of(gq, 16, 0, 8), cols_of(gr.dq, 16, 0, 8), 1e-5, "dq, empty"));
  EXPECT_TRUE(near_normwise(cols_of(gq, 16, 8, 12), cols_of(gr.dk, 16, 0, 4), 1e-5, "dk, empty"));
  cpu().attention_backward(g.d, gq2.data(), gq2.data() + 8, gq2.data() + 12, g.dout.data(), g.q(),
                           g.k(), g.v(), gout.data(), glse.data(), nullptr, true, false);
  const std::vector<float> before = test::random_floats(g.qkv.size(), 21);
  for (int64_t row = 0; row < 128; ++row)  // rows without keys keep their accumulated values
    for (int64_t c = 0; c < 8; ++c) EXPECT_EQ(gq2[row * 16 + c], before[row * 16 + c]);

  AttentionDims bad = f.d;
  bad.kv_heads = 3;
  EXPECT_THROW(
      cpu().attention_forward(bad, out.data(), lse.data(), nullptr, f.q(), f.k(), f.v(), false),
      Error);
  EXPECT_THROW(
      cpu().attention_forward(f.d, out.data(), nullptr, nullptr, f.q(), f.k(), f.v(), true), Error);
}

// Sliding windows: a query at i sees keys i - W + 1 .. i. Windows of 1, inside one block, across
// the 128-row blocks and wider than the sequence; flash (lse) and materialised (probs), with and
// without dropout, GQA.
TEST(Attention, SlidingWindowsMaskTheKeysOutsideTheWindow) {
  for (int64_t window : {1, 17, 130, 300})
    for (float drop : {0.0f, 0.25f}) {
      SCOPED_TRACE("window " + std::to_string(window) + " dropout " + std::to_string(drop));
      Fused f(2, 200, 6, 2, 8, true, 30, 0, window);
      f.d.dropout_p = drop;
      f.d.dropout_seed = 77;
      std::vector<float> out(f.d.batch * f.d.seq_q * f.d.ld_o), lse(f.d.batch * 6 * f.d.seq_q),
          probs(f.d.batch * 6 * f.d.seq_q * f.d.seq_kv, -1.0f);
      cpu().attention_forward(f.d, out.data(), lse.data(), probs.data(), f.q(), f.k(), f.v(),
                              false);
      const Ref r = f.ref(true);
      EXPECT_TRUE(near_normwise(out, r.out, 1e-5, "out"));
      EXPECT_TRUE(near_normwise(lse, r.lse, 1e-5, "lse"));
      EXPECT_TRUE(near_normwise(probs, r.probs, 1e-5, "probs"));
      const std::vector<double> want = f.fused_grad(r);
      EXPECT_TRUE(near_normwise(f.backward(out, lse.data(), nullptr), want, 1e-5, "d from lse"));
      EXPECT_TRUE(
          near_normwise(f.backward(out, nullptr, probs.data()), want, 1e-5, "d from probs"));
    }
  // The window is a causal mask: ignored without causality.
  Fused full(1, 30, 2, 2, 4, false, 31, 0, 5);
  std::vector<float> out(30 * full.d.ld_o);
  cpu().attention_forward(full.d, out.data(), nullptr, nullptr, full.q(), full.k(), full.v(),
                          false);
  full.d.window = 0;
  EXPECT_TRUE(near_normwise(out, full.ref(false).out, 1e-5, "non-causal ignores the window"));
}

TEST(Attention, SlidingWindowBackwardMatchesFiniteDifferences) {
  Fused f(2, 9, 4, 2, 3, true, 32, 0, 3);
  std::vector<float> out(f.d.batch * f.d.seq_q * f.d.ld_o), lse(f.d.batch * 4 * f.d.seq_q);
  cpu().attention_forward(f.d, out.data(), lse.data(), nullptr, f.q(), f.k(), f.v(), false);
  std::vector<double> x = to_double(f.qkv), g = to_double(f.dout);
  auto loss = [&] { return test::weighted_sum(f.reference_fused(x, nullptr).out, g); };
  EXPECT_TRUE(near_normwise(f.backward(out, lse.data(), nullptr), test::finite_diff(x, loss), 1e-5,
                            "dqkv vs fd (window)"));
}

// Ring steps with a window: the queries of the second chunk of a sequence attend to the first
// chunk's keys (causal_offset = the chunk length) and to their own, merged; a window shorter than
// a chunk reaches only the last keys of the earlier chunk.
TEST(Attention, SlidingWindowRingStepsMergeToTheWhole) {
  const int64_t S = 40, c = 20, H = 2, D = 4, W = 7;
  Fused whole(1, S, H, H, D, true, 33, 0, W);
  // Queries of the second chunk against all keys (the reference), and the two ring steps.
  AttentionDims ref = whole.d;
  ref.seq_q = S - c;
  ref.causal_offset = c;
  const float* q2 = whole.q() + c * whole.width;
  AttentionDims own = ref, earlier = ref;
  own.seq_kv = S - c;
  own.causal_offset = 0;
  earlier.seq_kv = c;
  earlier.causal_offset = c;
  std::vector<float> out((S - c) * ref.ld_o), lse(H * (S - c));
  cpu().attention_forward(own, out.data(), lse.data(), nullptr, q2, whole.k() + c * whole.width,
                          whole.v() + c * whole.width, false);
  cpu().attention_forward(earlier, out.data(), lse.data(), nullptr, q2, whole.k(), whole.v(), true);
  std::vector<float> want((S - c) * ref.ld_o), want_lse(H * (S - c));
  cpu().attention_forward(ref, want.data(), want_lse.data(), nullptr, q2, whole.k(), whole.v(),
                          false);
  EXPECT_TRUE(near_normwise(out, to_double(want), 1e-5, "merged out"));
  EXPECT_TRUE(near_normwise(lse, to_double(want_lse), 1e-5, "merged lse"));
  // And the reference itself against the double definition (the whole sequence's last rows).
  const Ref r = whole.ref(false);
  std::vector<double> last(r.out.begin() + c * ref.ld_o, r.out.end());
  EXPECT_TRUE(near_normwise(want, last, 1e-5, "second chunk vs the whole"));
}

// Value heads of their own width (MLA: q/k heads of nope + rope dims, v heads of v_head_dim),
// narrower and wider than the query/key heads, with GQA, flash and materialised, and a window.
TEST(Attention, ValueHeadsOfTheirOwnWidth) {
  for (int64_t Dv : {5, 24})
    for (int64_t window : {0, 33}) {
      SCOPED_TRACE("v_head_dim " + std::to_string(Dv) + " window " + std::to_string(window));
      Fused f(2, 150, 4, 2, 12, true, 34, Dv, window);
      std::vector<float> out(f.d.batch * f.d.seq_q * f.d.ld_o), lse(f.d.batch * 4 * f.d.seq_q),
          probs(f.d.batch * 4 * f.d.seq_q * f.d.seq_kv);
      cpu().attention_forward(f.d, out.data(), lse.data(), probs.data(), f.q(), f.k(), f.v(),
                              false);
      const Ref r = f.ref(true);
      EXPECT_TRUE(near_normwise(out, r.out, 1e-5, "out"));
      EXPECT_TRUE(near_normwise(lse, r.lse, 1e-5, "lse"));
      const std::vector<double> want = f.fused_grad(r);
      EXPECT_TRUE(near_normwise(f.backward(out, lse.data(), nullptr), want, 1e-5, "d from lse"));
      EXPECT_TRUE(
          near_normwise(f.backward(out, nullptr, probs.data()), want, 1e-5, "d from probs"));
    }
  Fused f(1, 6, 2, 1, 4, true, 35, 3);
  std::vector<float> out(6 * f.d.ld_o), lse(2 * 6);
  cpu().attention_forward(f.d, out.data(), lse.data(), nullptr, f.q(), f.k(), f.v(), false);
  std::vector<double> x = to_double(f.qkv), g = to_double(f.dout);
  auto loss = [&] { return test::weighted_sum(f.reference_fused(x, nullptr).out, g); };
  EXPECT_TRUE(near_normwise(f.backward(out, lse.data(), nullptr), test::finite_diff(x, loss), 1e-5,
                            "dqkv vs fd (v_head_dim 3)"));
}

}  // namespace
}  // namespace parasol::runtime

namespace parasol::runtime {
namespace {

using test::cpu;

// At 8k tokens (one causal head of 64 dims) the kernels' scratch is O(sequence): one block of
// 128 query rows against the keys (the forward's scores; the backward's P, its dropped copy and
// dP), never the 8k x 8k probabilities (268 MB per head in fp32). Bound: 3 x 128 x 8192 fp32
// scores plus 128 row scalars = 12.58 MB, and doubling the sequence from 4k doubles the scratch
// (linear, not quadratic). The output rows checked against the double reference of their own
// (first, middle and last queries); the backward runs at 8k with the same bound.
TEST(Attention, ScratchIsLinearInTheSequenceAt8k) {
  auto scratch_at = [](int64_t S, bool check_rows) {
    AttentionDims d;
    d.batch = 1;
    d.seq_q = d.seq_kv = S;
    d.heads = d.kv_heads = 1;
    d.head_dim = 64;
    d.ld_q = d.ld_kv = d.ld_o = 64;
    d.causal = true;
    std::vector<float> q(S * 64), k(S * 64), v(S * 64), out(S * 64), lse(S), dout(S * 64);
    uint64_t state = 7;
    auto next = [&] {
      state = mix64(state);
      return static_cast<float>(static_cast<double>(state >> 11) * 0x1.0p-53 * 2 - 1);
    };
    for (auto* t : {&q, &k, &v, &dout})
      for (float& x : *t) x = next();
    CpuBackend::reset_attention_scratch_peak();
    cpu().attention_forward(d, out.data(), lse.data(), nullptr, q.data(), k.data(), v.data(),
                            false);
    if (check_rows) {
      for (int64_t i : {int64_t{0}, S / 2 - 1, S - 1}) {
        std::vector<double> s(i + 1);
        double mx = -INFINITY;
        for (int64_t j = 0; j <= i; ++j) {
          double dot = 0;
          for (int c = 0; c < 64; ++c) dot += double(q[i * 64 + c]) * k[j * 64 + c];
          s[j] = dot / 8.0;
          mx = std::max(mx, s[j]);
        }
        double sum = 0;
        for (int64_t j = 0; j <= i; ++j) sum += std::exp(s[j] - mx);
        double worst = 0, scale = 0;
        for (int c = 0; c < 64; ++c) {
          double o = 0;
          for (int64_t j = 0; j <= i; ++j) o += std::exp(s[j] - mx) / sum * v[j * 64 + c];
          worst = std::max(worst, std::fabs(o - out[i * 64 + c]));
          scale = std::max(scale, std::fabs(o));
        }
        EXPECT_LE(worst, 1e-5 * std::max(scale, 1e-3)) << "row " << i;
        EXPECT_NEAR(lse[i], mx + std::log(sum), 1e-5 * std::fabs(mx + std::log(sum))) << i;
      }
    }
    std::vector<float> dq(S * 64), dk(S * 64), dv(S * 64);
    cpu().attention_backward(d, dq.data(), dk.data(), dv.data(), dout.data(), q.data(), k.data(),
                             v.data(), out.data(), lse.data(), nullptr, false, false);
    for (float x : dq) EXPECT_TRUE(std::isfinite(x));
    return CpuBackend::attention_scratch_peak();
  };
  const int64_t at4k = scratch_at(4096, false), at8k = scratch_at(8192, true);
  const int64_t bound = (3 * 128 * 8192 + 128) * int64_t{sizeof(float)};
  EXPECT_LE(at8k, bound);
  EXPECT_GT(at8k, 0);
  EXPECT_LE(at8k, 2 * at4k) << "scratch grew faster than the sequence";
  EXPECT_GE(at8k, 2 * at4k - 2 * 128 * 4) << "scratch did not grow with the sequence";
}

}  // namespace
}  // namespace parasol::runtime
