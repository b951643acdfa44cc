// Residual add (bias-dropout-add) against a double reference: without dropout, with bias, with
// dropout (the mask equals runtime/tensor.h's dropout_keep for the seed; the kept fraction is
// close to 1 - p; another seed gives another mask), embedding dropout (no residual), in place;
// the backward (mask scaling, accumulated bias gradient) against the reference and against
// central finite differences. Tolerance: 1e-6 relative element-wise (one or two fp32 roundings).
#include <gtest/gtest.h>

#include <vector>

#include "core/error.h"
#include "kernel_test_util.h"
#include "runtime/tensor.h"

namespace parasol::runtime {
namespace {

using test::cpu;
using test::near_elementwise;
using test::to_double;

// out = x + keep * (y + bias) / (1 - p), keep from the seed (all kept when p = 0).
std::vector<double> ref_residual(const std::vector<double>* x, const std::vector<double>& y,
                                 const std::vector<double>* bias, int64_t rows, int64_t cols,
                                 float p, uint64_t seed) {
  std::vector<double> out(rows * cols);
  const uint32_t thr = dropout_threshold(p);
  for (int64_t i = 0; i < rows * cols; ++i) {
    const bool keep = p == 0.0f || dropout_keep(seed, i, thr);
    const double val = y[i] + (bias ? (*bias)[i % cols] : 0.0);
    out[i] = (x ? (*x)[i] : 0.0) + (keep ? val / (1.0 - p) : 0.0);
  }
  return out;
}

TEST(Residual, ForwardVariants) {
  const int64_t rows = 40, cols = 96;
  std::vector<float> x = test::random_floats(rows * cols, 1),
                     y = test::random_floats(rows * cols, 2), b = test::random_floats(cols, 3);
  const std::vector<double> X = to_double(x), Y = to_double(y), Bv = to_double(b);
  std::vector<float> out(rows * cols);
  std::vector<uint8_t> mask(rows * cols, 7);
  cpu().residual_forward(out.data(), nullptr, x.data(), y.data(), nullptr, rows, cols, 0.0f, 0);
  EXPECT_TRUE(near_elementwise(out.data(), ref_residual(&X, Y, nullptr, rows, cols, 0, 0), 1e-6,
                               1e-7, "x + y"));
  cpu().residual_forward(out.data(), nullptr, x.data(), y.data(), b.data(), rows, cols, 0.0f, 0);
  EXPECT_TRUE(near_elementwise(out.data(), ref_residual(&X, Y, &Bv, rows, cols, 0, 0), 1e-6, 1e-7,
                               "x + y + b"));
  cpu().residual_forward(out.data(), mask.data(), x.data(), y.data(), b.data(), rows, cols, 0.1f,
                         99);
  EXPECT_TRUE(near_elementwise(out.data(), ref_residual(&X, Y, &Bv, rows, cols, 0.1f, 99), 1e-6,
                               1e-7, "x + dropout(y + b)"));
  int64_t kept = 0;
  const uint32_t thr = dropout_threshold(0.1f);
  for (int64_t i = 0; i < rows * cols; ++i) {
    ASSERT_EQ(mask[i], dropout_keep(99, i, thr) ? 1 : 0) << i;
    kept += mask[i];
  }
  // 3840 Bernoulli(0.9) draws: mean 3456, sd 18.6; 6 sd either way.
  EXPECT_NEAR(static_cast<double>(kept), 0.9 * rows * cols, 6 * 18.6);
  std::vector<uint8_t> mask2(rows * cols);
  cpu().residual_forward(out.data(), mask2.data(), x.data(), y.data(), b.data(), rows, cols, 0.1f,
                         100);
  EXPECT_NE(mask, mask2);
  // Embedding dropout: no residual, in place.
  std::vector<float> io = y;
  cpu().residual_forward(io.data(), mask.data(), nullptr, io.data(), nullptr, rows, cols, 0.5f, 5);
  EXPECT_TRUE(near_elementwise(io.data(), ref_residual(nullptr, Y, nullptr, rows, cols, 0.5f, 5),
                               1e-6, 1e-7, "dropout(y) in place"));
  EXPECT_THROW(
      cpu().residual_forward(out.data(), nullptr, x.data(), y.data(), nullptr, rows, cols, 0.1f, 1),
      Error);
  EXPECT_THROW(cpu().residual_forward(out.data(), mask.data(), x.data(), y.data(), nullptr, rows,
                                      cols, 1.0f, 1),
               Error);
}

TEST(Residual, BackwardMatchesReferenceAndFiniteDifferences) {
  const int64_t rows = 6, cols = 10;
  const float p = 0.25f;
  const uint64_t seed = 42;
  std::vector<float> x = test::random_floats(rows * cols, 4),
                     y = test::random_floats(rows * cols, 5), b = test::random_floats(cols, 6),
                     dout = test::random_floats(rows * cols, 7);
  std::vector<float> out(rows * cols);
  std::vector<uint8_t> mask(rows * cols);
  cpu().residual_forward(out.data(), mask.data(), x.data(), y.data(), b.data(), rows, cols, p,
                         seed);
  std::vector<float> db0 = test::random_floats(cols, 8), db = db0, dy(rows * cols);
  cpu().residual_backward(dy.data(), db.data(), dout.data(), mask.data(), rows, cols, p);
  // Reference: dy = dout * keep / (1 - p); dbias = previous + column sums of dy.
  std::vector<double> rdy(rows * cols), rdb = to_double(db0);
  for (int64_t i = 0; i < rows * cols; ++i) {
    rdy[i] = mask[i] ? dout[i] / (1.0 - p) : 0.0;
    rdb[i % cols] += rdy[i];
  }
  EXPECT_TRUE(near_elementwise(dy.data(), rdy, 1e-6, 0, "dy"));
  EXPECT_TRUE(test::near_normwise(db, rdb, 1e-6, "dbias"));
  // Finite differences of sum dout . out with respect to y and bias (the mask is fixed by the
  // seed). The residual's own gradient is dout.
  std::vector<double> X = to_double(x), Y = to_double(y), Bv = to_double(b), G = to_double(dout);
  auto loss = [&] { return test::weighted_sum(ref_residual(&X, Y, &Bv, rows, cols, p, seed), G); };
  std::vector<float> dyz(rows * cols), dbz(cols, 0.0f);
  cpu().residual_backward(dyz.data(), dbz.data(), dout.data(), mask.data(), rows, cols, p);
  EXPECT_TRUE(test::near_normwise(dyz, test::finite_diff(Y, loss), 1e-6, "dy vs fd"));
  EXPECT_TRUE(test::near_normwise(dbz, test::finite_diff(Bv, loss), 1e-6, "dbias vs fd"));
  EXPECT_TRUE(test::near_normwise(dout, test::finite_diff(X, loss), 1e-6, "dx = dout vs fd"));
  // Without a mask the gradient passes through; in place.
  std::vector<float> io = dout;
  cpu().residual_backward(io.data(), nullptr, io.data(), nullptr, rows, cols, 0.0f);
  EXPECT_EQ(io, dout);
}

}  // namespace
}  // namespace parasol::runtime
