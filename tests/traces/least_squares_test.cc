// Tests of the bounded least-squares solver (traces/least_squares.h): an exact nonlinear fit,
// a fit that stops on a bound, a parameter that no residual depends on, and noisy data.
#include "traces/least_squares.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

namespace parasol::traces {
namespace {

// y = a exp(-b t) at t = 0, 0.1, ..., 3.
LsqProblem decay(double a, double b, double noise = 0) {
  std::vector<double> t, y;
  std::mt19937 rng(7);
  std::normal_distribution<double> n(0, noise);
  for (int i = 0; i <= 30; ++i) {
    t.push_back(0.1 * i);
    y.push_back(a * std::exp(-b * t.back()) * (1 + (noise > 0 ? n(rng) : 0)));
  }
  LsqProblem p;
  p.residuals = [t, y](const std::vector<double>& x, std::vector<double>& r) {
    r.resize(t.size());
    for (size_t i = 0; i < t.size(); ++i) r[i] = x[0] * std::exp(-x[1] * t[i]) - y[i];
  };
  p.lower = {0, 0};
  p.upper = {10, 10};
  p.step = {1e-7, 1e-7};
  return p;
}

TEST(LeastSquares, RecoversAnExactNonlinearFit) {
  LsqResult r = solve_bounded_least_squares(decay(2.5, 1.3), {1, 0.2});
  EXPECT_TRUE(r.converged);
  EXPECT_NEAR(r.x[0], 2.5, 1e-6);
  EXPECT_NEAR(r.x[1], 1.3, 1e-6);
  EXPECT_LT(r.cost, 1e-12);
  EXPECT_GT(r.initial_cost, r.cost);
  EXPECT_TRUE(r.determined[0] && r.determined[1]);
}

TEST(LeastSquares, StopsOnABound) {
  // The data want b = 1.3, the box allows at most 0.5: b ends on the bound, a fits the rest.
  LsqProblem p = decay(2.5, 1.3);
  p.upper[1] = 0.5;
  LsqResult r = solve_bounded_least_squares(p, {1, 0.2});
  EXPECT_NEAR(r.x[1], 0.5, 1e-12);
  EXPECT_GT(r.x[0], 0);
  EXPECT_LE(r.x[0], 2.5);
  // A start outside the box is clipped into it.
  LsqResult s = solve_bounded_least_squares(p, {50, -3});
  EXPECT_LE(s.x[0], 10);
  EXPECT_NEAR(s.x[1], 0.5, 1e-12);
}

TEST(LeastSquares, AParameterNoResidualDependsOnStaysPut) {
  LsqProblem p = decay(2.5, 1.3);
  auto inner = p.residuals;
  p.residuals = [inner](const std::vector<double>& x, std::vector<double>& r) {
    inner({x[0], x[1]}, r);  // x[2] is ignored
  };
  p.lower.push_back(0);
  p.upper.push_back(1);
  p.step.push_back(1e-7);
  LsqResult r = solve_bounded_least_squares(p, {1, 0.2, 0.37});
  EXPECT_NEAR(r.x[0], 2.5, 1e-6);
  EXPECT_DOUBLE_EQ(r.x[2], 0.37);
  EXPECT_FALSE(r.determined[2]);
}

TEST(LeastSquares, NoisyDataFitNearTheTruth) {
  LsqResult r = solve_bounded_least_squares(decay(2.5, 1.3, 0.02), {1, 0.2});
  EXPECT_NEAR(r.x[0], 2.5, 0.1);
  EXPECT_NEAR(r.x[1], 1.3, 0.1);
}

}  // namespace
}  // namespace parasol::traces
