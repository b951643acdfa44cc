// Rotary position embedding against a double reference written as the complex product
// (x_j + i x_{j+d/2}) * exp(i p theta^(-2j/d)); the inverse undoes it (and is the backward:
// the rotation's transpose, checked as <R x, y> = <x, R^T y>); strided layouts leave the other
// columns untouched; positions follow the row's place in its sequence plus the offset (the
// context-parallel chunk). Tolerance: 1e-6 relative element-wise.
#include <gtest/gtest.h>

#include <cmath>
#include <complex>
#include <vector>

#include "core/error.h"
#include "kernel_test_util.h"

namespace parasol::runtime {
namespace {

using test::cpu;
using test::near_elementwise;
using test::to_double;

std::vector<double> ref_rope(const std::vector<double>& x, int64_t ld, int64_t rows, int64_t seq,
                             int64_t offset, int64_t col0, int64_t heads, int64_t d, double theta) {
  std::vector<double> out = x;
  for (int64_t t = 0; t < rows; ++t)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t j = 0; j < d / 2; ++j) {
        const int64_t a = t * ld + col0 + h * d + j, b = a + d / 2;
        const double angle = static_cast<double>(t % seq + offset) * std::pow(theta, -2.0 * j / d);
        const std::complex<double> z = std::complex<double>(x[a], x[b]) * std::polar(1.0, angle);
        out[a] = z.real();
        out[b] = z.imag();
      }
  return out;
}

TEST(Rope, MatchesTheComplexRotationInAStridedLayout) {
  // A fused QKV row: Q (3 heads), K (1 head), V (1 head) of head_dim 8; rotate K only.
  const int64_t d = 8, ld = 5 * d, seq = 6, rows = 2 * seq, offset = 12;
  std::vector<float> x = test::random_floats(rows * ld, 7);
  const std::vector<double> X = to_double(x);
  cpu().rope(x.data() + 3 * d, ld, rows, seq, offset, 1, d, 10000.0, false);
  EXPECT_TRUE(
      near_elementwise(x.data(), ref_rope(X, ld, rows, seq, offset, 3 * d, 1, d, 1e4), 1e-6, 1e-7));
}

TEST(Rope, ManyHeadsAndALargeBase) {
  const int64_t d = 16, heads = 4, ld = heads * d, seq = 33, rows = seq;
  std::vector<float> x = test::random_floats(rows * ld, 8);
  const std::vector<double> X = to_double(x);
  cpu().rope(x.data(), ld, rows, seq, 0, heads, d, 5e5, false);
  EXPECT_TRUE(
      near_elementwise(x.data(), ref_rope(X, ld, rows, seq, 0, 0, heads, d, 5e5), 1e-6, 1e-7));
}

TEST(Rope, InverseUndoesItAndIsItsTranspose) {
  const int64_t d = 8, heads = 2, ld = heads * d, seq = 10, rows = 20;
  std::vector<float> x = test::random_floats(rows * ld, 9), y = test::random_floats(rows * ld, 10);
  std::vector<float> rx = x, ry = y;
  cpu().rope(rx.data(), ld, rows, seq, 3, heads, d, 1e4, false);
  std::vector<float> back = rx;
  cpu().rope(back.data(), ld, rows, seq, 3, heads, d, 1e4, true);
  EXPECT_TRUE(near_elementwise(back.data(), to_double(x), 1e-6, 1e-7));
  cpu().rope(ry.data(), ld, rows, seq, 3, heads, d, 1e4, true);  // R^T y
  double a = 0, b = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    a += static_cast<double>(rx[i]) * y[i];  // <R x, y>
    b += static_cast<double>(x[i]) * ry[i];  // <x, R^T y>
  }
  EXPECT_NEAR(a, b, 1e-5 * std::fabs(a) + 1e-6);
}

TEST(Rope, OddHeadDimIsAnError) {
  std::vector<float> x(12);
  EXPECT_THROW(cpu().rope(x.data(), 3, 4, 4, 0, 1, 3, 1e4, false), Error);
}

}  // namespace
}  // namespace parasol::runtime
