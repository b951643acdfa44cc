// Projected Levenberg-Marquardt with forward-difference Jacobians (see least_squares.h).
#include "traces/least_squares.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace parasol::traces {

namespace {

double sum_squares(const std::vector<double>& r) {
  double s = 0;
  for (double v : r) s += v * v;
  return s;
}

// Solves A x = b for a symmetric positive definite A (n x n, row-major) by Cholesky; returns
// false when A is not positive definite.
bool cholesky_solve(std::vector<double> a, std::vector<double> b, int n, std::vector<double>& x) {
  for (int j = 0; j < n; ++j) {
    double d = a[j * n + j];
    for (int k = 0; k < j; ++k) d -= a[j * n + k] * a[j * n + k];
    if (!(d > 0)) return false;
    d = std::sqrt(d);
    a[j * n + j] = d;
    for (int i = j + 1; i < n; ++i) {
      double v = a[i * n + j];
      for (int k = 0; k < j; ++k) v -= a[i * n + k] * a[j * n + k];
      a[i * n + j] = v / d;
    }
  }
  for (int i = 0; i < n; ++i) {  // L y = b
    for (int k = 0; k < i; ++k) b[i] -= a[i * n + k] * b[k];
    b[i] /= a[i * n + i];
  }
  for (int i = n - 1; i >= 0; --i) {  // L^T x = y
    for (int k = i + 1; k < n; ++k) b[i] -= a[k * n + i] * b[k];
    b[i] /= a[i * n + i];
  }
  x = b;
  return true;
}

}  // namespace

LsqResult solve_bounded_least_squares(const LsqProblem& pb, std::vector<double> x,
                                      const LsqOptions& opt) {
  const int n = static_cast<int>(x.size());
  PARASOL_CHECK(
      pb.lower.size() == x.size() && pb.upper.size() == x.size() && pb.step.size() == x.size(),
      "bounds and steps for " + std::to_string(n) + " parameters");
  for (int j = 0; j < n; ++j) x[j] = std::clamp(x[j], pb.lower[j], pb.upper[j]);
  std::vector<double> r, rj;
  pb.residuals(x, r);
  const size_t m = r.size();
  LsqResult out;
  out.initial_cost = sum_squares(r);
  double cost = out.initial_cost;
  double lambda = 1e-3;
  std::vector<double> jac(m * n);  // column-major: jac[j * m + i] = d r_i / d x_j
  std::vector<bool> nonzero(n, false);

  auto jacobian = [&]() {
    for (int j = 0; j < n; ++j) {
      std::vector<double> xp = x;
      // Step inside the box (backwards at the upper bound).
      double h = pb.step[j];
      if (xp[j] + h > pb.upper[j]) h = -h;
      xp[j] += h;
      pb.residuals(xp, rj);
      nonzero[j] = false;
      for (size_t i = 0; i < m; ++i) {
        const double d = (rj[i] - r[i]) / h;
        jac[j * m + i] = std::isfinite(d) ? d : 0;
        nonzero[j] = nonzero[j] || jac[j * m + i] != 0;
      }
    }
  };

  int it = 0;
  bool converged = cost <= opt.tolerance * opt.tolerance;
  for (; it < opt.max_iterations && !converged; ++it) {
    jacobian();
    // g = J^T r, H = J^T J.
    std::vector<double> g(n, 0), h(static_cast<size_t>(n) * n, 0);
    for (int a = 0; a < n; ++a) {
      for (size_t i = 0; i < m; ++i) g[a] += jac[a * m + i] * r[i];
      for (int b = 0; b <= a; ++b) {
        double s = 0;
        for (size_t i = 0; i < m; ++i) s += jac[a * m + i] * jac[b * m + i];
        h[a * n + b] = h[b * n + a] = s;
      }
    }
    bool accepted = false;
    for (int tries = 0; tries < 30 && !accepted; ++tries) {
      // Free parameters: those with a nonzero column, unless on a bound and pushed outside.
      std::vector<int> free;
      for (int j = 0; j < n; ++j) {
        if (!nonzero[j]) continue;
        const bool at_low = x[j] <= pb.lower[j] && g[j] > 0;   // the step -g points below
        const bool at_high = x[j] >= pb.upper[j] && g[j] < 0;  // the step -g points above
        if (!at_low && !at_high) free.push_back(j);
      }
      if (free.empty()) break;
      const int k = static_cast<int>(free.size());
      std::vector<double> a(static_cast<size_t>(k) * k), b(k), d;
      for (int p = 0; p < k; ++p) {
        for (int q = 0; q < k; ++q) a[p * k + q] = h[free[p] * n + free[q]];
        a[p * k + p] += lambda * h[free[p] * n + free[p]] + 1e-300;
        b[p] = -g[free[p]];
      }
      if (!cholesky_solve(a, b, k, d)) {
        lambda *= 10;
        continue;
      }
      std::vector<double> xn = x;
      for (int p = 0; p < k; ++p)
        xn[free[p]] = std::clamp(x[free[p]] + d[p], pb.lower[free[p]], pb.upper[free[p]]);
      std::vector<double> rn;
      pb.residuals(xn, rn);
      const double cn = sum_squares(rn);
      if (std::isfinite(cn) && cn < cost) {
        const double gain = (cost - cn) / std::max(cost, 1e-300);
        x = xn;
        r = rn;
        cost = cn;
        lambda = std::max(lambda / 10, 1e-12);
        accepted = true;
        converged = gain < opt.tolerance || cost <= opt.tolerance * opt.tolerance;
      } else {
        lambda *= 10;
      }
    }
    if (!accepted) {
      converged = true;  // no step lowers the cost: a (local) minimum within the box
      ++it;
      break;
    }
  }
  jacobian();
  out.x = x;
  out.cost = cost;
  out.iterations = it;
  out.converged = converged;
  out.determined = nonzero;
  return out;
}

}  // namespace parasol::traces
