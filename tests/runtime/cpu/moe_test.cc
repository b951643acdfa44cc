// MoE kernels against double references: the router (softmax, top-1 and top-2, renormalised or
// not, ties to the lower index; top-k recovered from the probabilities) and its backward against
// central finite differences; the permutation into expert order; dispatch and combine, forward
// against the definition and backward against finite differences; and a whole MoE MLP (router,
// permutation, dispatch, grouped GEMMs, gelu, combine) against a per-token double reference.
// Tolerances: 1e-6 relative for softmax weights, 1e-5 of the largest reference magnitude for
// results of reductions.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "core/error.h"
#include "kernel_test_util.h"

namespace parasol::runtime {
namespace {

using test::cpu;
using test::near_normwise;
using test::to_double;

struct RefRoute {
  std::vector<double> probs, w;
  std::vector<int32_t> idx;
};

RefRoute ref_route(const std::vector<double>& logits, int64_t T, int64_t E, int64_t K,
                   bool renorm) {
  RefRoute r;
  r.probs.resize(T * E);
  for (int64_t t = 0; t < T; ++t) {
    const double* l = &logits[t * E];
    const double mx = *std::max_element(l, l + E);
    double s = 0;
    for (int64_t e = 0; e < E; ++e) s += std::exp(l[e] - mx);
    for (int64_t e = 0; e < E; ++e) r.probs[t * E + e] = std::exp(l[e] - mx) / s;
    std::vector<int32_t> order(E);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int32_t a, int32_t b) { return r.probs[t * E + a] > r.probs[t * E + b]; });
    double z = 0;
    for (int64_t k = 0; k < K; ++k) z += r.probs[t * E + order[k]];
    for (int64_t k = 0; k < K; ++k) {
      r.idx.push_back(order[k]);
      r.w.push_back(r.probs[t * E + order[k]] / (renorm ? z : 1.0));
    }
  }
  return r;
}

class Router : public ::testing::TestWithParam<std::tuple<int, bool>> {};

TEST_P(Router, ForwardMatchesReference) {
  const auto [K, renorm] = GetParam();
  const int64_t T = 50, E = 8;
  std::vector<float> logits = test::random_floats(T * E, 1, -3.0f, 3.0f);
  // Ties: token 0 has equal logits on experts 2, 5 and 6 (the largest): the lower index wins.
  for (int64_t e = 0; e < E; ++e) logits[e] = -1.0f;
  logits[2] = logits[5] = logits[6] = 2.0f;
  std::vector<float> probs(T * E), w(T * K);
  std::vector<int32_t> idx(T * K);
  cpu().router_forward(probs.data(), idx.data(), w.data(), logits.data(), T, E, K, renorm);
  const RefRoute r = ref_route(to_double(logits), T, E, K, renorm);
  EXPECT_EQ(idx, r.idx);
  EXPECT_EQ(idx[0], 2);
  if (K == 2) {
    EXPECT_EQ(idx[1], 5);
  }
  EXPECT_TRUE(test::near_elementwise(probs.data(), r.probs, 1e-6, 0, "probs"));
  EXPECT_TRUE(test::near_elementwise(w.data(), r.w, 1e-6, 0, "weights"));
  // router_topk recovers the same routing from the probabilities alone.
  std::vector<int32_t> idx2(T * K);
  std::vector<float> w2(T * K);
  cpu().router_topk(idx2.data(), w2.data(), probs.data(), T, E, K, renorm);
  EXPECT_EQ(idx2, idx);
  EXPECT_EQ(w2, w);
  if (renorm && K == 1) {
    for (float x : w) EXPECT_FLOAT_EQ(x, 1.0f);
  }
}

TEST_P(Router, BackwardMatchesFiniteDifferences) {
  // Not a structured binding: lambdas below capture K and renorm (clang 14 cannot capture those).
  const auto K = std::get<0>(GetParam());
  const auto renorm = std::get<1>(GetParam());
  const int64_t T = 6, E = 5;
  std::vector<float> logits = test::random_floats(T * E, 2, -2.0f, 2.0f);
  std::vector<float> probs(T * E), w(T * K), dw = test::random_floats(T * K, 3), dl(T * E);
  std::vector<int32_t> idx(T * K);
  cpu().router_forward(probs.data(), idx.data(), w.data(), logits.data(), T, E, K, renorm);
  cpu().router_backward(dl.data(), dw.data(), probs.data(), idx.data(), T, E, K, renorm);
  std::vector<double> L = to_double(logits), G = to_double(dw);
  auto loss = [&] { return test::weighted_sum(ref_route(L, T, E, K, renorm).w, G); };
  const std::vector<double> fd = test::finite_diff(L, loss);
  if (K == 1 && renorm) {
    // The single renormalised weight is 1 whatever the logits: no gradient.
    for (float x : dl) EXPECT_NEAR(x, 0.0f, 1e-7);
    for (double x : fd) EXPECT_NEAR(x, 0.0, 1e-8);
  } else {
    EXPECT_TRUE(near_normwise(dl, fd, 1e-5, "dlogits vs fd"));
  }
}

INSTANTIATE_TEST_SUITE_P(TopK, Router,
                         ::testing::Values(std::make_tuple(1, true), std::make_tuple(1, false),
                                           std::make_tuple(2, true), std::make_tuple(2, false)),
                         [](const auto& info) {
                           return "top" + std::to_string(std::get<0>(info.param)) +
                                  (std::get<1>(info.param) ? "_renorm" : "_raw");
                         });

TEST(Router, Errors) {
  std::vector<float> l(8), p(8), w(8);
  std::vector<int32_t> idx(8);
  EXPECT_THROW(cpu().router_forward(p.data(), idx.data(), w.data(), l.data(), 2, 4, 5, true),
               Error);
  EXPECT_THROW(cpu().router_forward(p.data(), idx.data(), w.data(), l.data(), 2, 4, 0, true),
               Error);
  std::vector<int32_t> bad = {0, 7};
  std::vector<int64_t> counts(4);
  EXPECT_THROW(cpu().moe_permutation(idx.data(), counts.data(), bad.data(), 1, 4, 2), Error);
}

TEST(MoePermutation, GroupsRowsByExpertThenToken) {
  const int64_t T = 7, E = 4, K = 2;
  // Token t routes to experts idx[t*K], idx[t*K+1] (expert 3 receives nothing).
  const std::vector<int32_t> idx = {1, 0, 2, 1, 0, 2, 1, 2, 0, 1, 2, 0, 1, 0};
  std::vector<int32_t> row_of(T * K);
  std::vector<int64_t> counts(E);
  cpu().moe_permutation(row_of.data(), counts.data(), idx.data(), T, E, K);
  EXPECT_EQ(counts, (std::vector<int64_t>{5, 5, 4, 0}));
  // Expected rows from the definition: expert by expert, (token, slot) pairs in order.
  std::vector<int32_t> expect(T * K);
  int32_t row = 0;
  for (int32_t e = 0; e < E; ++e)
    for (int64_t i = 0; i < T * K; ++i)
      if (idx[i] == e) expect[i] = row++;
  EXPECT_EQ(row_of, expect);
}

// The device-side permutation (Backend::moe_permutation_device, runtime/cpu/moe_device.cc): the
// same rows as the host one, counts per expert and their exclusive scan as offsets; an index out
// of range gets row -1 and is counted in *bad, not thrown (the executor reads *bad once a step).
TEST(MoePermutation, OnTheDeviceEqualsTheHostOneWithOffsets) {
  const int64_t T = 7, E = 4, K = 2;
  std::vector<int32_t> idx = {1, 0, 2, 1, 0, 2, 1, 2, 0, 1, 2, 0, 1, 0};
  std::vector<int32_t> host_rows(T * K), rows(T * K), counts(E), offsets(E + 1);
  std::vector<int64_t> host_counts(E);
  cpu().moe_permutation(host_rows.data(), host_counts.data(), idx.data(), T, E, K);
  int32_t bad = 0;
  cpu().moe_permutation_device(rows.data(), counts.data(), offsets.data(), &bad, idx.data(), T, E,
                               K);
  EXPECT_EQ(rows, host_rows);
  EXPECT_EQ(bad, 0);
  EXPECT_EQ(offsets, (std::vector<int32_t>{0, 5, 10, 14, 14}));
  for (int64_t e = 0; e < E; ++e) EXPECT_EQ(counts[e], host_counts[e]);
  idx[3] = static_cast<int32_t>(E);
  cpu().moe_permutation_device(rows.data(), counts.data(), offsets.data(), &bad, idx.data(), T, E,
                               K);
  EXPECT_EQ(bad, 1);
  EXPECT_EQ(rows[3], -1);
  EXPECT_EQ(offsets[E], T * K - 1);
}

// out[row_of[t,s]] = x[t];  y[t] = sum_s w[t,s] eo[row_of[t,s]].
std::vector<double> ref_dispatch(const std::vector<double>& x, const std::vector<int32_t>& row_of,
                                 int64_t T, int64_t K, int64_t C) {
  std::vector<double> out(T * K * C);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t s = 0; s < K; ++s)
      for (int64_t c = 0; c < C; ++c) out[row_of[t * K + s] * C + c] = x[t * C + c];
  return out;
}
std::vector<double> ref_combine(const std::vector<double>& eo, const std::vector<double>& w,
                                const std::vector<int32_t>& row_of, int64_t T, int64_t K,
                                int64_t C) {
  std::vector<double> y(T * C, 0.0);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t s = 0; s < K; ++s)
      for (int64_t c = 0; c < C; ++c) y[t * C + c] += w[t * K + s] * eo[row_of[t * K + s] * C + c];
  return y;
}

TEST(DispatchCombine, ForwardAndBackward) {
  const int64_t T = 5, E = 3, K = 2, C = 4;
  const std::vector<int32_t> idx = {2, 0, 1, 2, 0, 1, 2, 1, 0, 2};
  std::vector<int32_t> row_of(T * K);
  std::vector<int64_t> counts(E);
  cpu().moe_permutation(row_of.data(), counts.data(), idx.data(), T, E, K);
  std::vector<float> x = test::random_floats(T * C, 4), eo = test::random_floats(T * K * C, 5),
                     w = test::random_floats(T * K, 6, 0.1f, 1.0f);
  std::vector<double> X = to_double(x), EO = to_double(eo), W = to_double(w);
  std::vector<float> d(T * K * C), y(T * C);
  cpu().dispatch_forward(d.data(), x.data(), row_of.data(), T, K, C);
  EXPECT_TRUE(near_normwise(d, ref_dispatch(X, row_of, T, K, C), 0, "dispatch"));  // a copy
  cpu().combine_forward(y.data(), eo.data(), w.data(), row_of.data(), T, K, C);
  EXPECT_TRUE(near_normwise(y, ref_combine(EO, W, row_of, T, K, C), 1e-6, "combine"));

  // Backward against finite differences of the references.
  std::vector<float> gd = test::random_floats(T * K * C, 7), gy = test::random_floats(T * C, 8);
  std::vector<double> GD = to_double(gd), GY = to_double(gy);
  std::vector<float> dx(T * C), deo(T * K * C), dw(T * K);
  cpu().dispatch_backward(dx.data(), gd.data(), row_of.data(), T, K, C);
  cpu().combine_backward(deo.data(), dw.data(), gy.data(), eo.data(), w.data(), row_of.data(), T, K,
                         C);
  auto ld = [&] { return test::weighted_sum(ref_dispatch(X, row_of, T, K, C), GD); };
  auto lc = [&] { return test::weighted_sum(ref_combine(EO, W, row_of, T, K, C), GY); };
  EXPECT_TRUE(near_normwise(dx, test::finite_diff(X, ld), 1e-6, "dispatch dx vs fd"));
  EXPECT_TRUE(near_normwise(deo, test::finite_diff(EO, lc), 1e-6, "combine dexpert vs fd"));
  EXPECT_TRUE(near_normwise(dw, test::finite_diff(W, lc), 1e-6, "combine dw vs fd"));
}

TEST(MoeLayer, RouterDispatchExpertsCombineMatchPerTokenReference) {
  const int64_t T = 40, E = 4, K = 2, C = 32, F = 48;
  std::vector<float> x = test::random_floats(T * C, 9), rw = test::random_floats(C * E, 10),
                     w1 = test::random_floats(E * C * F, 11, -0.3f, 0.3f),
                     w2 = test::random_floats(E * F * C, 12, -0.3f, 0.3f);
  // Kernels: logits, route, permute, dispatch, fc1, gelu, fc2, combine.
  std::vector<float> logits(T * E), probs(T * E), tw(T * K);
  std::vector<int32_t> idx(T * K), row_of(T * K);
  std::vector<int64_t> counts(E);
  cpu().linear_forward(logits.data(), x.data(), rw.data(), WeightLayout::kInOut, nullptr, T, E, C);
  cpu().router_forward(probs.data(), idx.data(), tw.data(), logits.data(), T, E, K, true);
  cpu().moe_permutation(row_of.data(), counts.data(), idx.data(), T, E, K);
  std::vector<float> d(T * K * C), h(T * K * F), a(T * K * F), o(T * K * C), y(T * C);
  cpu().dispatch_forward(d.data(), x.data(), row_of.data(), T, K, C);
  cpu().expert_linear_forward(h.data(), d.data(), w1.data(), nullptr, counts.data(), E, F, C);
  cpu().activation_forward(Activation::kGelu, a.data(), h.data(), T * K, F);
  cpu().expert_linear_forward(o.data(), a.data(), w2.data(), nullptr, counts.data(), E, C, F);
  cpu().combine_forward(y.data(), o.data(), tw.data(), row_of.data(), T, K, C);
  // Reference, token by token: y_t = sum_k w_k W2_e(gelu(W1_e x_t)) with the reference routing.
  std::vector<double> X = to_double(x), RW = to_double(rw), L(T * E, 0.0);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t e = 0; e < E; ++e)
      for (int64_t c = 0; c < C; ++c) L[t * E + e] += X[t * C + c] * RW[c * E + e];
  const RefRoute r = ref_route(L, T, E, K, true);
  ASSERT_EQ(idx, r.idx);
  std::vector<double> ref(T * C, 0.0);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t k = 0; k < K; ++k) {
      const int64_t e = r.idx[t * K + k];
      std::vector<double> hid(F, 0.0);
      for (int64_t f = 0; f < F; ++f) {
        for (int64_t c = 0; c < C; ++c) hid[f] += X[t * C + c] * w1[(e * C + c) * F + f];
        const double u = std::sqrt(2.0 / M_PI) * (hid[f] + 0.044715 * std::pow(hid[f], 3));
        hid[f] = 0.5 * hid[f] * (1 + std::tanh(u));
      }
      for (int64_t c = 0; c < C; ++c) {
        double s = 0;
        for (int64_t f = 0; f < F; ++f) s += hid[f] * w2[(e * F + f) * C + c];
        ref[t * C + c] += r.w[t * K + k] * s;
      }
    }
  EXPECT_TRUE(near_normwise(y, ref, 1e-5, "moe output"));
}

}  // namespace
}  // namespace parasol::runtime
