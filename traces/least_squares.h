// A small bounded nonlinear least-squares solver for calibration: minimises
//   cost(x) = sum_i r_i(x)^2   subject to  lower <= x <= upper
// by projected Levenberg-Marquardt (Marquardt's scaling: the damping is lambda x diag(J^T J)).
// Jacobians are forward differences. Each iteration solves the damped normal equations by
// Cholesky; parameters sitting on a bound whose step points outside the box are frozen for
// that iteration (a simple active set), the rest of the step is clipped to the box. A step is
// taken only when it lowers the cost (lambda shrinks), else lambda grows. A parameter whose
// Jacobian column is zero never moves. Meant for a handful of parameters and thousands of
// residuals; deterministic.
#pragma once

#include <functional>
#include <vector>

namespace parasol::traces {

struct LsqProblem {
  // Fills r (resized by the callee) with the residuals at x.
  std::function<void(const std::vector<double>& x, std::vector<double>& r)> residuals;
  std::vector<double> lower, upper;  // bounds, one per parameter (lower <= upper)
  std::vector<double> step;          // forward-difference step per parameter (> 0)
};

struct LsqOptions {
  int max_iterations = 200;
  double tolerance = 1e-12;  // stop when an accepted step lowers the cost by less than this
                             // fraction, or the cost is below tolerance^2
};

struct LsqResult {
  std::vector<double> x;
  double initial_cost = 0;
  double cost = 0;
  int iterations = 0;
  bool converged = false;  // stopped by the tolerance rather than max_iterations
  // Per parameter: whether any residual depends on it at the solution (a nonzero Jacobian
  // column).
  std::vector<bool> determined;
};

// REQUIRES: x0, lower, upper and step have one entry per parameter. x0 is clipped to the box.
LsqResult solve_bounded_least_squares(const LsqProblem& problem, std::vector<double> x0,
                                      const LsqOptions& options = {});

}  // namespace parasol::traces
