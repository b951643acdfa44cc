// Tests cost_models/variability.h: the expected maximum of n standard normals against its exact
// values for n = 2, 3 (1/sqrt(pi), 3/(2 sqrt(pi))) and tabulated ones, and the expected step.
#include "cost_models/variability.h"

#include <gtest/gtest.h>

#include <cmath>

namespace parasol::cost {
namespace {

TEST(Variability, ExpectedMaxOfNormals) {
  EXPECT_DOUBLE_EQ(expected_max_standard_normal(1), 0);
  EXPECT_NEAR(expected_max_standard_normal(2), 1 / std::sqrt(M_PI), 1e-9);
  EXPECT_NEAR(expected_max_standard_normal(3), 1.5 / std::sqrt(M_PI), 1e-9);
  EXPECT_NEAR(expected_max_standard_normal(1000), 3.2414, 1e-4);  // tables of normal order stats
  const double big = expected_max_standard_normal(16384);
  EXPECT_GT(big, 3.9);
  EXPECT_LT(big, std::sqrt(2 * std::log(16384.0)));  // the classical upper bound, 4.41
}

TEST(Variability, ExpectedStepStretchesOnlyCompute) {
  // 10 s step, 6 s compute, cv 2% on 2 GPUs: 10 + 6 x 0.02 x 0.5642.
  EXPECT_NEAR(expected_step_time_s(10, 6, 0.02, 2), 10 + 6 * 0.02 / std::sqrt(M_PI), 1e-9);
  EXPECT_DOUBLE_EQ(expected_step_time_s(10, 6, 0, 4096), 10);
  EXPECT_DOUBLE_EQ(expected_step_time_s(10, 6, 0.05, 1), 10);
}

}  // namespace
}  // namespace parasol::cost
