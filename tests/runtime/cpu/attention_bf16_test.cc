// The typed bf16 attention (CpuBackend::attention_forward_bf16 / attention_backward_bf16) against
// the fp32 entries (themselves held to a double reference in attention_test.cc) run on the same
// bf16 values widened: fused Q | K | V rows (strided), GQA, value heads narrower than the query
// heads (MLA), sliding windows, dropout, two query blocks, ring steps (keys in two chunks merged
// by `accumulate`, accumulate_dq, accumulate_dkv), and the scratch at 8k.
//
// Tolerances, derived: the typed kernel widens the bf16 operands one head at a time and runs the
// fp32 body of the fp32 entries on them (runtime/cpu/attention_head.h): the same fp32 arithmetic
// up to the GEMMs' strides (summation noise; the fp32 suite's 1e-5 of the largest magnitude,
// eps below), then rounds each output once to nearest even: within u |ref| of the fp32 result,
// u = 2^-8 (bf16's unit roundoff). A ring step's merge rounds twice: the first step's stored
// output (u of it) enters the merge with a weight below 1, so the merged output is within
// u (|ref| + max |first step's output|); an accumulate_dkv call adds its fp32 gradient c to the
// stored round(c') and rounds the sum: within u |sum| + u |c'|. The log-sum-exp is fp32 on both
// paths: eps.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/error.h"
#include "kernel_test_util.h"
#include "runtime/tensor.h"

namespace parasol::runtime {
namespace {

using test::cpu;

constexpr double kU = 1.0 / 256;
constexpr double kEps = 1e-5;

// Random values that are bf16: the bf16 words and their fp32 values.
struct Bf16Data {
  std::vector<uint16_t> b;
  std::vector<float> f;
  explicit Bf16Data(int64_t n = 0, uint32_t seed = 1, float lo = -1.0f, float hi = 1.0f) {
    const std::vector<float> x = test::random_floats(n, seed, lo, hi);
    for (float v : x) {
      b.push_back(fp32_to_bf16(v));
      f.push_back(bf16_to_fp32(b.back()));
    }
  }
  static Bf16Data of(const std::vector<uint16_t>& words) {
    Bf16Data d;
    d.b = words;
    for (uint16_t w : words) d.f.push_back(bf16_to_fp32(w));
    return d;
  }
};

double max_abs(const std::vector<float>& v) {
  double m = 0;
  for (float x : v) m = std::max(m, std::fabs(double(x)));
  return m;
}

// Every element of the bf16 `got` within slack + u |ref| (+ eps of ref's largest magnitude).
void expect_rounded(const std::vector<uint16_t>& got, const std::vector<float>& ref,
                    const std::vector<double>& slack, const std::string& what) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  const double eps = kEps * std::max(max_abs(ref), 1e-6);
  int64_t bad = 0;
  double worst = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double err = std::fabs(double(bf16_to_fp32(got[i])) - ref[i]);
    const double tol = kU * std::fabs(ref[i]) + eps + (slack.empty() ? 0.0 : slack[i]);
    worst = std::max(worst, err / tol);
    if (err > tol) ++bad;
  }
  EXPECT_EQ(bad, 0) << what << ": worst error / tolerance " << worst;
}

// One sequence layout: fused Q | K | V rows as the executor passes them.
struct Shape {
  int64_t B = 2, S = 40, H = 4, KVH = 2, D = 16, Dv = 16, window = 0;
  float dropout = 0.0f;
};

AttentionDims dims_of(const Shape& s) {
  AttentionDims d;
  d.batch = s.B;
  d.seq_q = d.seq_kv = s.S;
  d.heads = s.H;
  d.kv_heads = s.KVH;
  d.head_dim = s.D;
  d.v_head_dim = s.Dv == s.D ? 0 : s.Dv;
  d.ld_q = d.ld_kv = s.H * s.D + s.KVH * (s.D + s.Dv);
  d.ld_o = s.H * s.Dv;
  d.window = s.window;
  d.dropout_p = s.dropout;
  d.dropout_seed = 99;
  return d;
}

void check_shape(const Shape& s) {
  SCOPED_TRACE(::testing::Message()
               << "S " << s.S << " H " << s.H << "/" << s.KVH << " D " << s.D << "/" << s.Dv
               << " window " << s.window << " dropout " << s.dropout);
  const AttentionDims d = dims_of(s);
  const int64_t T = s.B * s.S, qc = s.H * s.D, kc = s.KVH * s.D;
  const Bf16Data qkv(T * d.ld_q, 3, -2.0f, 2.0f), dout(T * d.ld_o, 4);
  // Forward.
  std::vector<float> out_f(T * d.ld_o), lse_f(s.B * s.H * s.S);
  cpu().attention_forward(d, out_f.data(), lse_f.data(), nullptr, qkv.f.data(), qkv.f.data() + qc,
                          qkv.f.data() + qc + kc, false);
  std::vector<uint16_t> out_b(out_f.size());
  std::vector<float> lse_b(lse_f.size());
  cpu().attention_forward_bf16(d, out_b.data(), lse_b.data(), qkv.b.data(), qkv.b.data() + qc,
                               qkv.b.data() + qc + kc, false);
  expect_rounded(out_b, out_f, {}, "out");
  for (size_t i = 0; i < lse_f.size(); ++i)
    ASSERT_NEAR(lse_b[i], lse_f[i], kEps * std::max(1.0, std::fabs(double(lse_f[i])))) << i;
  // Backward from the stored bf16 output and the typed lse, into a fused dQ | dK | dV.
  const Bf16Data out = Bf16Data::of(out_b);
  std::vector<float> dqkv_f(qkv.f.size(), 0.0f);
  cpu().attention_backward(d, dqkv_f.data(), dqkv_f.data() + qc, dqkv_f.data() + qc + kc,
                           dout.f.data(), qkv.f.data(), qkv.f.data() + qc, qkv.f.data() + qc + kc,
                           out.f.data(), lse_b.data(), nullptr, false, false);
  std::vector<uint16_t> dqkv_b(qkv.b.size(), 0);
  cpu().attention_backward_bf16(d, dqkv_b.data(), dqkv_b.data() + qc, dqkv_b.data() + qc + kc,
                                dout.b.data(), qkv.b.data(), qkv.b.data() + qc,
                                qkv.b.data() + qc + kc, out.b.data(), lse_b.data(), false, false);
  expect_rounded(dqkv_b, dqkv_f, {}, "dQ | dK | dV");
}

TEST(AttentionBf16, MatchesTheFp32KernelOnTheSameValues) {
  check_shape(Shape{});                               // GQA, fused rows
  check_shape(Shape{1, 150, 2, 2, 8, 8, 0, 0.0f});    // MHA, two query blocks
  check_shape(Shape{2, 40, 4, 1, 16, 8, 0, 0.0f});    // MQA, narrower V heads
  check_shape(Shape{2, 40, 4, 2, 16, 16, 7, 0.0f});   // sliding window
  check_shape(Shape{2, 40, 4, 2, 16, 16, 0, 0.25f});  // dropout
  check_shape(Shape{1, 140, 4, 2, 8, 8, 9, 0.1f});    // all of them, two blocks
}

// Ring steps: the keys in two chunks (the later one first), K | V chunk rows of their own; the
// forward merges the second step into the first (accumulate), the backward adds dQ
// (accumulate_dq) and, called again, adds to the travelling dK | dV (accumulate_dkv).
TEST(AttentionBf16, RingStepsMergeAsTheFp32Kernel) {
  const Shape s{2, 60, 4, 2, 16, 16, 0, 0.0f};
  AttentionDims full = dims_of(s);
  full.ld_q = s.H * s.D;
  full.ld_o = s.H * s.Dv;
  full.ld_kv = s.KVH * (s.D + s.Dv);
  const int64_t c = 23, T = s.B * s.S, kc = s.KVH * s.D;
  const Bf16Data q(T * full.ld_q, 5, -2.0f, 2.0f), dout(T * full.ld_o, 6);
  const Bf16Data ka((s.B * c) * full.ld_kv, 7, -2.0f, 2.0f),
      kb((s.B * (s.S - c)) * full.ld_kv, 8, -2.0f, 2.0f);
  AttentionDims da = full, db = full;
  da.seq_kv = c;
  db.seq_kv = s.S - c;
  db.causal_offset = -c;
  // Forward: step 1 (chunk b) then step 2 (chunk a, merged).
  std::vector<float> out_f(T * full.ld_o), lse_f(s.B * s.H * s.S);
  cpu().attention_forward(db, out_f.data(), lse_f.data(), nullptr, q.f.data(), kb.f.data(),
                          kb.f.data() + kc, false);
  const std::vector<float> first_f = out_f;
  cpu().attention_forward(da, out_f.data(), lse_f.data(), nullptr, q.f.data(), ka.f.data(),
                          ka.f.data() + kc, true);
  std::vector<uint16_t> out_b(out_f.size());
  std::vector<float> lse_b(lse_f.size());
  cpu().attention_forward_bf16(db, out_b.data(), lse_b.data(), q.b.data(), kb.b.data(),
                               kb.b.data() + kc, false);
  cpu().attention_forward_bf16(da, out_b.data(), lse_b.data(), q.b.data(), ka.b.data(),
                               ka.b.data() + kc, true);
  std::vector<double> slack(first_f.size());
  const double first_max = max_abs(first_f);
  for (double& x : slack) x = kU * first_max;
  expect_rounded(out_b, out_f, slack, "merged out");
  for (size_t i = 0; i < lse_f.size(); ++i)
    ASSERT_NEAR(lse_b[i], lse_f[i], kEps * std::max(1.0, std::fabs(double(lse_f[i])))) << i;

  // Backward: chunk a, then chunk b adding to dQ.
  const Bf16Data out = Bf16Data::of(out_b);
  std::vector<float> dq_f(q.f.size()), dkva_f(ka.f.size()), dkvb_f(kb.f.size());
  cpu().attention_backward(da, dq_f.data(), dkva_f.data(), dkva_f.data() + kc, dout.f.data(),
                           q.f.data(), ka.f.data(), ka.f.data() + kc, out.f.data(), lse_b.data(),
                           nullptr, false, false);
  const std::vector<float> dq1_f = dq_f;
  cpu().attention_backward(db, dq_f.data(), dkvb_f.data(), dkvb_f.data() + kc, dout.f.data(),
                           q.f.data(), kb.f.data(), kb.f.data() + kc, out.f.data(), lse_b.data(),
                           nullptr, true, false);
  std::vector<uint16_t> dq_b(q.b.size()), dkva_b(ka.b.size()), dkvb_b(kb.b.size());
  cpu().attention_backward_bf16(da, dq_b.data(), dkva_b.data(), dkva_b.data() + kc, dout.b.data(),
                                q.b.data(), ka.b.data(), ka.b.data() + kc, out.b.data(),
                                lse_b.data(), false, false);
  cpu().attention_backward_bf16(db, dq_b.data(), dkvb_b.data(), dkvb_b.data() + kc, dout.b.data(),
                                q.b.data(), kb.b.data(), kb.b.data() + kc, out.b.data(),
                                lse_b.data(), true, false);
  std::vector<double> dq_slack(dq1_f.size());
  for (size_t i = 0; i < dq_slack.size(); ++i) dq_slack[i] = kU * std::fabs(double(dq1_f[i]));
  expect_rounded(dq_b, dq_f, dq_slack, "ring dQ");
  // The K | V columns of the chunk rows hold dK | dV; nothing else is written.
  expect_rounded(dkva_b, dkva_f, {}, "dK | dV of chunk a");
  expect_rounded(dkvb_b, dkvb_f, {}, "dK | dV of chunk b");

  // accumulate_dkv: chunk a's backward again, added to what the accumulator holds.
  std::vector<float> twice_f(dkva_f.size());
  for (size_t i = 0; i < twice_f.size(); ++i) twice_f[i] = 2.0f * dkva_f[i];
  std::vector<uint16_t> acc_b = dkva_b, dq2_b(q.b.size());
  cpu().attention_backward_bf16(da, dq2_b.data(), acc_b.data(), acc_b.data() + kc, dout.b.data(),
                                q.b.data(), ka.b.data(), ka.b.data() + kc, out.b.data(),
                                lse_b.data(), false, true);
  std::vector<double> acc_slack(dkva_f.size());
  for (size_t i = 0; i < acc_slack.size(); ++i) acc_slack[i] = kU * std::fabs(double(dkva_f[i]));
  expect_rounded(acc_b, twice_f, acc_slack, "accumulated dK | dV");
}

// The backward needs the log-sum-exp (the typed path never keeps probabilities).
TEST(AttentionBf16, BackwardWithoutLseIsRefused) {
  const AttentionDims d = dims_of(Shape{1, 4, 1, 1, 8, 8, 0, 0.0f});
  std::vector<uint16_t> x(4 * d.ld_q), o(4 * d.ld_o);
  EXPECT_THROW(
      cpu().attention_backward_bf16(d, x.data(), x.data() + 8, x.data() + 16, o.data(), x.data(),
                                    x.data() + 8, x.data() + 16, o.data(), nullptr, false, false),
      Error);
}

// At 8k tokens (one causal head of 64 dims) the typed kernels' scratch stays O(sequence): the
// fp32 entries' block scratch (at most 3 x 128 x 8192 scores plus 128 row scalars) plus the
// head's widened tiles: K | V and dK | dV (2 x 8192 x 128), Q, dQ, O and dO (4 x 8192 x 64), in
// fp32: 8.4 MB more, 21.0 MB in all, where the probabilities alone would be 268 MB.
TEST(AttentionBf16, ScratchIsLinearInTheSequenceAt8k) {
  const int64_t S = 8192;
  const Shape s{1, S, 1, 1, 64, 64, 0, 0.0f};
  const AttentionDims d = dims_of(s);
  const Bf16Data qkv(S * d.ld_q, 11), dout(S * d.ld_o, 12);
  std::vector<uint16_t> out(S * d.ld_o), dqkv(qkv.b.size());
  std::vector<float> lse(S);
  CpuBackend::reset_attention_scratch_peak();
  cpu().attention_forward_bf16(d, out.data(), lse.data(), qkv.b.data(), qkv.b.data() + 64,
                               qkv.b.data() + 128, false);
  cpu().attention_backward_bf16(d, dqkv.data(), dqkv.data() + 64, dqkv.data() + 128, dout.b.data(),
                                qkv.b.data(), qkv.b.data() + 64, qkv.b.data() + 128, out.data(),
                                lse.data(), false, false);
  const int64_t bound = (3 * 128 * S + 128 + 2 * S * 128 + 4 * S * 64) * int64_t{sizeof(float)};
  EXPECT_LE(CpuBackend::attention_scratch_peak(), bound);
  EXPECT_GT(CpuBackend::attention_scratch_peak(), 0);
  for (uint16_t w : dqkv) ASSERT_TRUE(std::isfinite(bf16_to_fp32(w)));
}

}  // namespace
}  // namespace parasol::runtime
