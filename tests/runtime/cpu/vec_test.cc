// The CPU kernels' vector building blocks (runtime/cpu/vec.h) against double references:
// exp_fast over sampled fp32 bit patterns of its whole range (2e-7 relative where e^x is a normal
// float) and its special values; sigmoid; the lane-wise sums and dot products.
#include "runtime/cpu/vec.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>
#include <vector>

#include "kernel_test_util.h"

namespace parasol::runtime {
namespace {

TEST(ExpFast, RelativeErrorOverTheRange) {
  double worst = 0;
  float at = 0;
  int64_t checked = 0;
  // Every 4099th bit pattern of the floats whose e^x is a normal float (x in [-87.33, 88.72]).
  for (uint64_t b = 0; b <= 0xFFFFFFFFull; b += 4099) {
    const float x = std::bit_cast<float>(static_cast<uint32_t>(b));
    if (std::isnan(x) || x < -87.33f || x > 88.72f) continue;
    const double ref = std::exp(static_cast<double>(x));
    const double rel = std::abs(cpu::exp_fast(x) - ref) / ref;
    if (rel > worst) {
      worst = rel;
      at = x;
    }
    ++checked;
  }
  EXPECT_GT(checked, 500000);
  EXPECT_LT(worst, 2e-7) << "at x = " << at;
}

TEST(ExpFast, SpecialValues) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(cpu::exp_fast(0.0f), 1.0f);
  EXPECT_EQ(cpu::exp_fast(-inf), 0.0f);
  EXPECT_EQ(cpu::exp_fast(-100.0f), 0.0f);
  EXPECT_EQ(cpu::exp_fast(inf), inf);
  EXPECT_EQ(cpu::exp_fast(89.0f), inf);
  EXPECT_TRUE(std::isnan(cpu::exp_fast(std::numeric_limits<float>::quiet_NaN())));
  // Just below the overflow threshold, where 2^n needs n = 128.
  EXPECT_NEAR(cpu::exp_fast(88.5f), std::exp(88.5), 2e-7 * std::exp(88.5));
  EXPECT_NEAR(cpu::sigmoid(-30.0f), 1.0 / (1.0 + std::exp(30.0)), 1e-6 / (1.0 + std::exp(30.0)));
  EXPECT_EQ(cpu::sigmoid(100.0f), 1.0f);
  EXPECT_EQ(cpu::sigmoid(-100.0f), 0.0f);
}

TEST(Reductions, SumsAndDots) {
  for (int64_t n : {0, 1, 15, 16, 17, 1000, 4099}) {
    std::vector<float> x = test::random_floats(n, 1), y = test::random_floats(n, 2),
                       z = test::random_floats(n, 3);
    double s = 0, d = 0, d3 = 0, sq = 0;
    for (int64_t i = 0; i < n; ++i) {
      s += x[i];
      d += double(x[i]) * y[i];
      d3 += double(x[i]) * y[i] * z[i];
      sq += (double(x[i]) - 0.25) * (double(x[i]) - 0.25);
    }
    // Bounds: 1e-6 of the sum of magnitudes (fp32 partial sums over up to 4099 terms).
    double abs_s = 0;
    for (float v : x) abs_s += std::abs(v);
    const double tol = 1e-6 * std::max(1.0, abs_s);
    EXPECT_NEAR(cpu::sum(x.data(), n), s, tol) << n;
    EXPECT_NEAR(cpu::sum_f64(x.data(), n), s, 1e-12 * std::max(1.0, abs_s)) << n;
    EXPECT_NEAR(cpu::dot(x.data(), y.data(), n), d, tol) << n;
    EXPECT_NEAR(cpu::dot3(x.data(), y.data(), z.data(), n), d3, tol) << n;
    EXPECT_NEAR(cpu::sum_sq_dev(x.data(), 0.25f, n), sq, 2 * tol) << n;
  }
}

}  // namespace
}  // namespace parasol::runtime
