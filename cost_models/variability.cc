// The expected maximum of n standard normals, and the expected step time it implies.
#include "cost_models/variability.h"

#include <cmath>
#include <map>

#include "core/error.h"

namespace parasol::cost {

namespace {
double integrate_max(int n) {
  PARASOL_CHECK(n >= 1, "n " + std::to_string(n));
  // E[max] = integral of x n phi(x) Phi(x)^(n-1) dx, by Simpson's rule on [-10, 10] (the
  // integrand is below 1e-20 outside for n <= 2^24).
  constexpr int kSteps = 4000;
  constexpr double lo = -10, hi = 10, h = (hi - lo) / kSteps;
  const double inv_sqrt_2pi = 1 / std::sqrt(2 * M_PI);
  auto f = [&](double x) {
    const double cdf = 0.5 * std::erfc(-x / std::sqrt(2.0));
    if (cdf <= 0) return 0.0;
    return x * n * inv_sqrt_2pi * std::exp(-0.5 * x * x + (n - 1) * std::log(cdf));
  };
  double sum = f(lo) + f(hi);
  for (int i = 1; i < kSteps; ++i) sum += (i % 2 ? 4 : 2) * f(lo + i * h);
  return sum * h / 3;
}
}  // namespace

double expected_max_standard_normal(int n) {
  if (n <= 1) return 0;
  // The search asks for the same few GPU counts millions of times: remember them per thread.
  thread_local std::map<int, double> cache;
  auto it = cache.find(n);
  if (it != cache.end()) return it->second;
  const double v = integrate_max(n);
  cache.emplace(n, v);
  return v;
}

double expected_step_time_s(double step_s, double compute_s, double cv, int gpus) {
  PARASOL_CHECK(compute_s >= 0 && cv >= 0 && gpus >= 1, "compute " + std::to_string(compute_s) +
                                                            " s, cv " + std::to_string(cv) + ", " +
                                                            std::to_string(gpus) + " GPUs");
  return step_s + compute_s * cv * expected_max_standard_normal(gpus);
}

}  // namespace parasol::cost
