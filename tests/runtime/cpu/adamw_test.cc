// AdamW, gradient norm and clipping: a two-step sequence computed by hand; random vectors over
// several steps (with a clip scale and weight decay) against a double reference; the squared
// norm (accumulated across calls) against a double sum; clip_scale's cases.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/error.h"
#include "kernel_test_util.h"

namespace parasol::runtime {
namespace {

using test::cpu;

// lr 0.1, betas (0.9, 0.999), eps 1e-8, weight decay 0.01; two parameters.
//  p = 1.0, g = 0.5 then -0.25:
//   step 1: m = 0.1 * 0.5 = 0.05; v = 0.001 * 0.25 = 0.00025; mhat = 0.05 / 0.1 = 0.5;
//           vhat = 0.00025 / 0.001 = 0.25; p = 1 - 0.1 (0.5 / (0.5 + 1e-8) + 0.01 * 1)
//           = 0.899000002
//   step 2: m = 0.045 - 0.025 = 0.02; v = 0.999 * 0.00025 + 0.001 * 0.0625 = 0.00031225;
//           mhat = 0.02 / (1 - 0.81) = 0.105263157894...; vhat = 0.00031225 / (1 - 0.998001)
//           = 0.156203101550...; p = 0.899000002 - 0.1 (0.105263.. / (0.395225.. + 1e-8)
//           + 0.01 * 0.899000002) = 0.871467298705...
//  p = -2.0, g = 0.1 then 0.3:
//   step 1: m = 0.01; v = 0.00001; mhat = 0.1; vhat = 0.01; p = -2 - 0.1 (0.1 / (0.1 + 1e-8)
//           - 0.02) = -2.097999990
//   step 2: m = 0.009 + 0.03 = 0.039; v = 0.00000999 + 0.00009 = 0.00009999;
//           mhat = 0.039 / 0.19 = 0.205263157894...; vhat = 0.00009999 / 0.001999
//           = 0.050020010005...; p = -2.09799999 - 0.1 (0.205263.. / (0.223651.. + 1e-8)
//           + 0.01 * -2.09799999) = -2.187680097804...
TEST(AdamW, HandComputedTwoSteps) {
  AdamWConfig c;
  c.lr = 0.1;
  c.beta1 = 0.9;
  c.beta2 = 0.999;
  c.eps = 1e-8;
  c.weight_decay = 0.01;
  std::vector<float> p = {1.0f, -2.0f}, m = {0, 0}, v = {0, 0};
  std::vector<float> g1 = {0.5f, 0.1f}, g2 = {-0.25f, 0.3f};
  c.step = 1;
  cpu().adamw(c, p.data(), m.data(), v.data(), g1.data(), 2, nullptr);
  EXPECT_NEAR(m[0], 0.05, 1e-6 * 0.05);
  EXPECT_NEAR(v[0], 0.00025, 1e-6 * 0.00025);
  EXPECT_NEAR(m[1], 0.01, 1e-6 * 0.01);
  EXPECT_NEAR(v[1], 0.00001, 1e-6 * 0.00001);
  EXPECT_NEAR(p[0], 0.899000002, 1e-6);
  EXPECT_NEAR(p[1], -2.097999990, 1e-6 * 2.1);
  c.step = 2;
  cpu().adamw(c, p.data(), m.data(), v.data(), g2.data(), 2, nullptr);
  EXPECT_NEAR(m[0], 0.02, 1e-6 * 0.02);
  EXPECT_NEAR(v[0], 0.00031225, 1e-6 * 0.00031225);
  EXPECT_NEAR(m[1], 0.039, 1e-6 * 0.039);
  EXPECT_NEAR(v[1], 0.00009999, 1e-6 * 0.00009999);
  EXPECT_NEAR(p[0], 0.871467298705, 1e-6);
  EXPECT_NEAR(p[1], -2.187680097804, 1e-6 * 2.2);
}

TEST(AdamW, RandomStepsWithClipScaleMatchDoubleReference) {
  const int64_t n = 1001;
  AdamWConfig c;
  c.lr = 3e-3;
  c.beta1 = 0.9;
  c.beta2 = 0.95;
  c.eps = 1e-8;
  c.weight_decay = 0.1;
  std::vector<float> p = test::random_floats(n, 1), m(n, 0.0f), v(n, 0.0f);
  std::vector<double> P = test::to_double(p), M(n, 0.0), V(n, 0.0);
  const float scale = 0.37f;
  for (int64_t step = 1; step <= 4; ++step) {
    std::vector<float> g = test::random_floats(n, 10 + step, -2.0f, 2.0f);
    c.step = step;
    cpu().adamw(c, p.data(), m.data(), v.data(), g.data(), n, &scale);
    const double b1 = c.beta1, b2 = c.beta2;
    for (int64_t i = 0; i < n; ++i) {
      const double gi = static_cast<double>(g[i]) * scale;
      M[i] = b1 * M[i] + (1 - b1) * gi;
      V[i] = b2 * V[i] + (1 - b2) * gi * gi;
      const double mh = M[i] / (1 - std::pow(b1, step)), vh = V[i] / (1 - std::pow(b2, step));
      P[i] -= c.lr * (mh / (std::sqrt(vh) + c.eps) + c.weight_decay * P[i]);
    }
  }
  // Each step changes p by about lr; 1e-6 of the largest |p| bounds the fp32 rounding of 4 steps.
  EXPECT_TRUE(test::near_normwise(p, P, 1e-6, "params"));
  EXPECT_TRUE(test::near_normwise(m, M, 1e-6, "m"));
  EXPECT_TRUE(test::near_normwise(v, V, 1e-6, "v"));
  AdamWConfig bad = c;
  bad.step = 0;
  EXPECT_THROW(cpu().adamw(bad, p.data(), m.data(), v.data(), p.data(), n, nullptr), Error);
}

TEST(GradNorm, SumOfSquaresAccumulatesAndClipScale) {
  std::vector<float> a = test::random_floats(100003, 20), b = test::random_floats(77, 21);
  double ref = 0;
  for (float x : a) ref += double(x) * x;
  for (float x : b) ref += double(x) * x;
  float s = 0.0f;
  cpu().grad_sumsq(&s, a.data(), static_cast<int64_t>(a.size()));
  cpu().grad_sumsq(&s, b.data(), static_cast<int64_t>(b.size()));
  EXPECT_NEAR(s, ref, 1e-6 * ref);

  float sumsq = 16.0f, scale = 0.0f;
  cpu().clip_scale(&scale, &sumsq, 2.0f, 1.0f);  // norm 4 > 2
  EXPECT_NEAR(scale, 2.0 / (4.0 + 1e-6), 1e-7);
  cpu().clip_scale(&scale, &sumsq, 5.0f, 1.0f);  // norm 4 <= 5: no clipping
  EXPECT_EQ(scale, 1.0f);
  cpu().clip_scale(&scale, &sumsq, 0.0f, 1.0f);  // clipping off
  EXPECT_EQ(scale, 1.0f);
  // Gradients carrying a loss scale of 8: the norm of the unscaled ones (4) is compared with the
  // threshold, and the factor also unscales: exactly the unscaled factor / 8.
  float scaled_sumsq = 16.0f * 64.0f;
  cpu().clip_scale(&scale, &scaled_sumsq, 2.0f, 8.0f);
  float plain = 0.0f;
  cpu().clip_scale(&plain, &sumsq, 2.0f, 1.0f);
  EXPECT_EQ(scale, plain / 8.0f);
  cpu().clip_scale(&scale, &scaled_sumsq, 5.0f, 8.0f);  // 4 <= 5: only the unscaling
  EXPECT_EQ(scale, 1.0f / 8.0f);
  cpu().clip_scale(&sumsq, &sumsq, 1.0f, 1.0f);  // in place
  EXPECT_NEAR(sumsq, 1.0 / (4.0 + 1e-6), 1e-7);
}

}  // namespace
}  // namespace parasol::runtime
