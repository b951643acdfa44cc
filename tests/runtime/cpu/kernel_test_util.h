// Helpers of the CPU kernel tests: random inputs, fp32 <-> double copies, the two comparisons the
// tests state their tolerances in, and central finite differences of a double-precision
// reference. The references themselves are written in each test, independently of the kernels.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "runtime/cpu/cpu_backend.h"

namespace parasol::runtime::test {

// One backend per test binary (OpenBLAS's thread pool is process-wide anyway).
inline CpuBackend& cpu() {
  static CpuBackend b;
  return b;
}

inline std::vector<float> random_floats(int64_t n, uint32_t seed, float lo = -1.0f,
                                        float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = u(rng);
  return v;
}

inline std::vector<double> to_double(const std::vector<float>& v) {
  return std::vector<double>(v.begin(), v.end());
}

inline double max_abs(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::abs(x));
  return m;
}

// Element-wise: |got - ref| <= rtol * |ref| + atol for every element.
inline ::testing::AssertionResult near_elementwise(const float* got, const std::vector<double>& ref,
                                                   double rtol, double atol,
                                                   const std::string& what = "") {
  int bad = 0;
  std::ostringstream msg;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double err = std::abs(static_cast<double>(got[i]) - ref[i]);
    if (!(err <= rtol * std::abs(ref[i]) + atol)) {
      if (bad < 5)
        msg << what << "[" << i << "]: got " << got[i] << ", reference " << ref[i] << " (error "
            << err << ")\n";
      ++bad;
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad << " of " << ref.size() << " elements outside rtol "
                                       << rtol << ", atol " << atol << ":\n"
                                       << msg.str();
}

// Norm-wise (for results of reductions, where cancellation makes element-wise relative error
// meaningless near zero): max |got - ref| <= rtol * max |ref|.
inline ::testing::AssertionResult near_normwise(const float* got, const std::vector<double>& ref,
                                                double rtol, const std::string& what = "") {
  const double scale = max_abs(ref);
  double worst = 0;
  size_t at = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double err = std::abs(static_cast<double>(got[i]) - ref[i]);
    if (!(err <= worst)) {  // also catches NaN
      worst = std::isnan(err) ? INFINITY : err;
      at = i;
    }
  }
  if (std::getenv("PARASOL_TEST_MARGINS") != nullptr)  // how close each check comes to its bound
    std::printf("  margin %-28s error / max|ref| = %.2e (bound %.0e)\n", what.c_str(),
                scale > 0 ? worst / scale : worst, rtol);
  if (worst <= rtol * scale) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << what << ": max error " << worst << " at [" << at << "] (got " << got[at]
         << ", reference " << ref[at] << ") exceeds " << rtol
         << " x max|reference| = " << rtol * scale;
}

inline ::testing::AssertionResult near_normwise(const std::vector<float>& got,
                                                const std::vector<double>& ref, double rtol,
                                                const std::string& what = "") {
  if (got.size() != ref.size())
    return ::testing::AssertionFailure() << what << ": size " << got.size() << " vs " << ref.size();
  return near_normwise(got.data(), ref, rtol, what);
}

// Central finite differences of loss() with respect to every element of x (perturbed in place
// and restored): (L(x + h e_i) - L(x - h e_i)) / 2h, h relative to |x_i| (at least `h`).
inline std::vector<double> finite_diff(std::vector<double>& x, const std::function<double()>& loss,
                                       double h = 1e-5) {
  std::vector<double> g(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double x0 = x[i];
    const double step = h * std::max(1.0, std::abs(x0));
    x[i] = x0 + step;
    const double up = loss();
    x[i] = x0 - step;
    const double down = loss();
    x[i] = x0;
    g[i] = (up - down) / (2 * step);
  }
  return g;
}

// sum_i w[i] * y[i]: the scalar whose gradient with respect to y is w (the upstream gradient).
inline double weighted_sum(const std::vector<double>& y, const std::vector<double>& w) {
  double s = 0;
  for (size_t i = 0; i < y.size(); ++i) s += y[i] * w[i];
  return s;
}

}  // namespace parasol::runtime::test
