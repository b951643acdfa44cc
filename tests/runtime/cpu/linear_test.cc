// Linear (GEMM) kernels against a double reference, for both weight layouts (W[in x out] and the
// tied head's W[out x in]): forward with and without bias, the data gradient (overwritten and
// accumulated), the weight and bias gradients (accumulated), bias add and its gradient, and the
// grouped expert GEMMs (uneven and empty groups); each backward also against central finite
// differences of the reference forward. Tolerance: 1e-5 of the largest reference magnitude (fp32
// GEMM accumulation over k).
#include <gtest/gtest.h>

#include <vector>

#include "kernel_test_util.h"

namespace parasol::runtime {
namespace {

using test::cpu;
using test::near_normwise;
using test::to_double;

// Element (p, j) of the logical W[k x n] stored in `layout`.
double w_at(const std::vector<double>& w, WeightLayout layout, int64_t p, int64_t j, int64_t n,
            int64_t k) {
  return layout == WeightLayout::kInOut ? w[p * n + j] : w[j * k + p];
}
int64_t w_index(WeightLayout layout, int64_t p, int64_t j, int64_t n, int64_t k) {
  return layout == WeightLayout::kInOut ? p * n + j : j * k + p;
}

// out[m x n] = in[m x k] W[k x n] + bias.
std::vector<double> ref_linear(const std::vector<double>& in, const std::vector<double>& w,
                               WeightLayout layout, const std::vector<double>* bias, int64_t m,
                               int64_t n, int64_t k) {
  std::vector<double> out(m * n);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = bias ? (*bias)[j] : 0.0;
      for (int64_t p = 0; p < k; ++p) s += in[i * k + p] * w_at(w, layout, p, j, n, k);
      out[i * n + j] = s;
    }
  return out;
}

// kInOut: every weight of core/lower.h; kOutIn: the tied embedding table as the output layer.
class Linear : public ::testing::TestWithParam<WeightLayout> {};

TEST_P(Linear, ForwardWithAndWithoutBias) {
  const WeightLayout layout = GetParam();
  const int64_t m = 64, n = 96, k = 200;
  std::vector<float> in = test::random_floats(m * k, 1), w = test::random_floats(k * n, 2),
                     b = test::random_floats(n, 3);
  std::vector<double> db = to_double(b);
  std::vector<float> out(m * n, -7.0f);
  cpu().linear_forward(out.data(), in.data(), w.data(), layout, b.data(), m, n, k);
  EXPECT_TRUE(near_normwise(out, ref_linear(to_double(in), to_double(w), layout, &db, m, n, k),
                            1e-5, "with bias"));
  cpu().linear_forward(out.data(), in.data(), w.data(), layout, nullptr, m, n, k);
  EXPECT_TRUE(near_normwise(out, ref_linear(to_double(in), to_double(w), layout, nullptr, m, n, k),
                            1e-5, "without bias"));
}

TEST_P(Linear, BackwardMatchesReference) {
  const WeightLayout layout = GetParam();
  const int64_t m = 48, n = 80, k = 112;
  std::vector<float> in = test::random_floats(m * k, 4), w = test::random_floats(k * n, 5),
                     dout = test::random_floats(m * n, 6);
  const std::vector<double> W = to_double(w);
  // din = dout W^T.
  std::vector<double> rdin(m * k, 0.0);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t p = 0; p < k; ++p) {
      double s = 0;
      for (int64_t j = 0; j < n; ++j) s += dout[i * n + j] * w_at(W, layout, p, j, n, k);
      rdin[i * k + p] = s;
    }
  std::vector<float> din(m * k, 3.0f);
  cpu().linear_backward_data(din.data(), dout.data(), w.data(), layout, m, n, k, false);
  EXPECT_TRUE(near_normwise(din, rdin, 1e-5, "din"));
  // Accumulate onto an earlier gradient (the router's data gradient adds to the dispatch's).
  std::vector<float> prev = test::random_floats(m * k, 7), acc = prev;
  cpu().linear_backward_data(acc.data(), dout.data(), w.data(), layout, m, n, k, true);
  std::vector<double> racc = rdin;
  for (size_t i = 0; i < racc.size(); ++i) racc[i] += prev[i];
  EXPECT_TRUE(near_normwise(acc, racc, 1e-5, "din accumulated"));

  // dW += in^T dout (in W's layout), dbias += column sums: onto existing gradients.
  std::vector<float> dw0 = test::random_floats(k * n, 8), db0 = test::random_floats(n, 9);
  std::vector<double> rdw = to_double(dw0), rdb = to_double(db0);
  for (int64_t p = 0; p < k; ++p)
    for (int64_t j = 0; j < n; ++j)
      for (int64_t i = 0; i < m; ++i)
        rdw[w_index(layout, p, j, n, k)] += static_cast<double>(in[i * k + p]) * dout[i * n + j];
  for (int64_t j = 0; j < n; ++j)
    for (int64_t i = 0; i < m; ++i) rdb[j] += dout[i * n + j];
  std::vector<float> dw = dw0, db = db0;
  cpu().linear_backward_weight(dw.data(), db.data(), in.data(), dout.data(), layout, m, n, k);
  EXPECT_TRUE(near_normwise(dw, rdw, 1e-5, "dweight"));
  EXPECT_TRUE(near_normwise(db, rdb, 1e-5, "dbias"));
}

TEST_P(Linear, BackwardMatchesFiniteDifferences) {
  const WeightLayout layout = GetParam();
  const int64_t m = 5, n = 4, k = 6;
  std::vector<float> in = test::random_floats(m * k, 10), w = test::random_floats(k * n, 11),
                     b = test::random_floats(n, 12), dout = test::random_floats(m * n, 13);
  std::vector<double> X = to_double(in), W = to_double(w), Bv = to_double(b), G = to_double(dout);
  auto loss = [&] { return test::weighted_sum(ref_linear(X, W, layout, &Bv, m, n, k), G); };
  std::vector<float> din(m * k), dw(k * n, 0.0f), db(n, 0.0f);
  cpu().linear_backward_data(din.data(), dout.data(), w.data(), layout, m, n, k, false);
  cpu().linear_backward_weight(dw.data(), db.data(), in.data(), dout.data(), layout, m, n, k);
  EXPECT_TRUE(near_normwise(din, test::finite_diff(X, loss), 1e-5, "din vs fd"));
  EXPECT_TRUE(near_normwise(dw, test::finite_diff(W, loss), 1e-5, "dweight vs fd"));
  EXPECT_TRUE(near_normwise(db, test::finite_diff(Bv, loss), 1e-5, "dbias vs fd"));
}

INSTANTIATE_TEST_SUITE_P(Layouts, Linear,
                         ::testing::Values(WeightLayout::kInOut, WeightLayout::kOutIn),
                         [](const auto& info) {
                           return info.param == WeightLayout::kInOut ? "in_out" : "out_in";
                         });

TEST(Bias, ForwardAndBackward) {
  const int64_t rows = 9, cols = 33;
  std::vector<float> x = test::random_floats(rows * cols, 14), b = test::random_floats(cols, 15);
  std::vector<double> ref(rows * cols);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) ref[r * cols + c] = double(x[r * cols + c]) + b[c];
  std::vector<float> out = x;
  cpu().bias_forward(out.data(), b.data(), rows, cols);
  EXPECT_TRUE(test::near_elementwise(out.data(), ref, 1e-7, 0, "bias add"));
  // Gradient: column sums, accumulated; checked against finite differences of the reference.
  std::vector<float> dout = test::random_floats(rows * cols, 16), db(cols, 0.0f);
  cpu().bias_backward(db.data(), dout.data(), rows, cols);
  std::vector<double> Bv = to_double(b), G = to_double(dout), X = to_double(x);
  auto loss = [&] {
    double s = 0;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) s += G[r * cols + c] * (X[r * cols + c] + Bv[c]);
    return s;
  };
  EXPECT_TRUE(near_normwise(db, test::finite_diff(Bv, loss), 1e-5, "dbias vs fd"));
}

// Grouped GEMM: expert e multiplies its counts[e] rows by W[e] (+ b[e]).
std::vector<double> ref_grouped(const std::vector<double>& in, const std::vector<double>& w,
                                const std::vector<double>* b, const std::vector<int64_t>& counts,
                                int64_t n, int64_t k) {
  int64_t rows = 0;
  for (int64_t c : counts) rows += c;
  std::vector<double> out(rows * n);
  int64_t row = 0;
  for (size_t e = 0; e < counts.size(); ++e)
    for (int64_t r = 0; r < counts[e]; ++r, ++row)
      for (int64_t j = 0; j < n; ++j) {
        double s = b ? (*b)[e * n + j] : 0.0;
        for (int64_t p = 0; p < k; ++p) s += in[row * k + p] * w[(e * k + p) * n + j];
        out[row * n + j] = s;
      }
  return out;
}

TEST(ExpertLinear, ForwardAndBackwardMatchReferenceAndFiniteDifferences) {
  const std::vector<int64_t> counts = {3, 0, 5, 1};  // one expert receives no token
  const int64_t E = 4, n = 6, k = 7, rows = 9;
  std::vector<float> in = test::random_floats(rows * k, 17), w = test::random_floats(E * k * n, 18),
                     b = test::random_floats(E * n, 19), dout = test::random_floats(rows * n, 20);
  std::vector<double> X = to_double(in), W = to_double(w), Bv = to_double(b), G = to_double(dout);
  std::vector<float> out(rows * n);
  cpu().expert_linear_forward(out.data(), in.data(), w.data(), b.data(), counts.data(), E, n, k);
  EXPECT_TRUE(near_normwise(out, ref_grouped(X, W, &Bv, counts, n, k), 1e-5, "forward"));

  std::vector<float> din(rows * k), dw(E * k * n, 0.0f), db(E * n, 0.0f);
  cpu().expert_linear_backward_data(din.data(), dout.data(), w.data(), counts.data(), E, n, k,
                                    false);
  cpu().expert_linear_backward_weight(dw.data(), db.data(), in.data(), dout.data(), counts.data(),
                                      E, n, k);
  auto loss = [&] { return test::weighted_sum(ref_grouped(X, W, &Bv, counts, n, k), G); };
  EXPECT_TRUE(near_normwise(din, test::finite_diff(X, loss), 1e-5, "din vs fd"));
  std::vector<double> fdw = test::finite_diff(W, loss), fdb = test::finite_diff(Bv, loss);
  EXPECT_TRUE(near_normwise(dw, fdw, 1e-5, "dweight vs fd"));
  EXPECT_TRUE(near_normwise(db, fdb, 1e-5, "dbias vs fd"));
  // The empty expert's gradients stay zero.
  for (int64_t i = 0; i < k * n; ++i) EXPECT_EQ(dw[1 * k * n + i], 0.0f);
  // Accumulating data gradient.
  std::vector<float> acc = din;
  cpu().expert_linear_backward_data(acc.data(), dout.data(), w.data(), counts.data(), E, n, k,
                                    true);
  std::vector<double> twice(rows * k);
  for (size_t i = 0; i < twice.size(); ++i) twice[i] = 2.0 * din[i];
  EXPECT_TRUE(near_normwise(acc, twice, 1e-6, "din accumulated"));
}

}  // namespace
}  // namespace parasol::runtime
