// The busiest expert-parallel rank's load (core/moe_load.h).
#include "core/moe_load.h"

#include <algorithm>
#include <cmath>

namespace parasol {

namespace {
// Phi^-1(p) for p in (0, 1), by bisection on the normal CDF 0.5 erfc(-x / sqrt 2).
double inverse_normal_cdf(double p) {
  double lo = -10, hi = 10;
  for (int i = 0; i < 100; ++i) {
    const double mid = 0.5 * (lo + hi);
    (0.5 * std::erfc(-mid / std::sqrt(2.0)) < p ? lo : hi) = mid;
  }
  return 0.5 * (lo + hi);
}
}  // namespace

double expected_max_standard_normal(int n) {
  if (n <= 1) return 0;
  return inverse_normal_cdf((n - 0.375) / (n + 0.25));
}

double moe_hot_rank_factor(const Model& m, int ep, double rows_per_rank) {
  if (!m.is_moe() || ep <= 1 || rows_per_rank <= 0) return 1.0;
  const double e = m.moe.experts, k = m.moe.top_k;
  if (e <= 1 || k >= e) return 1.0;
  const double var = rows_per_rank * (1 - 1.0 / ep) * (e - k) / (e - 1);
  return 1 + expected_max_standard_normal(ep) * std::sqrt(var) / rows_per_rank;
}

double moe_hot_rank_factor(const Model& m, const Plan& p, double rows_per_rank) {
  if (p.moe_force_balance != MoeForceBalance::kRoundRobin)
    return moe_hot_rank_factor(m, p.ep, rows_per_rank);
  if (!m.is_moe() || p.ep <= 1 || rows_per_rank <= 0) return 1.0;
  const int64_t e = m.moe.experts, local = std::max<int64_t>(1, e / p.ep);
  const int64_t rows = std::max<int64_t>(1, std::llround(rows_per_rank));
  const int64_t q = rows / e, r = rows % e;
  const double hot =
      static_cast<double>(p.ep) * static_cast<double>(local * q + std::min(local, r));
  return std::max(1.0, hot / static_cast<double>(rows));
}

int64_t moe_hot_rank_rows(const Model& m, int ep, int64_t rows_per_rank) {
  const double f = moe_hot_rank_factor(m, ep, static_cast<double>(rows_per_rank));
  return std::max<int64_t>(rows_per_rank,
                           static_cast<int64_t>(std::ceil(f * static_cast<double>(rows_per_rank))));
}

ExpertBiasLoop expert_bias_loop(const Plan& plan, bool backward, int64_t local_experts,
                                bool probs) {
  const Dtype act = plan.precision == Dtype::kFp8 ? Dtype::kBf16 : plan.precision;
  const double a = dtype_bytes(act);
  const int64_t le = std::max<int64_t>(1, local_experts);
  ExpertBiasLoop r;
  if (!probs) {
    r.bytes_per_element = backward ? 3 * a : 4 * a;
    r.kernels = backward ? 2 * le + 1 : le + 1;
    return r;
  }
  const double w = std::max(a, dtype_bytes(plan.moe_probs_dtype()));
  const bool cast = w != a;
  if (!backward) {
    r.bytes_per_element = w + (a + 2 * w) + 2 * w + (cast ? w + a : 0);
    r.kernels = 2 * le + 1 + (cast ? 1 : 0);
  } else {
    r.bytes_per_element = (cast ? 2 * (a + w) : 0) + 2 * 3 * w + 2 * a;
    r.kernels = 4 * le + (cast ? le + 1 : 0) + le + 2;
  }
  return r;
}

RouterKernels router_kernels(const Plan& plan, bool backward) {
  RouterKernels r;
  if (plan.moe_force_balance == MoeForceBalance::kRoundRobin) {
    // Backward: the one gradient kernel the lowering's router GEMMs read (the lowering keeps the
    // router's GEMMs under every gate).
    r.kernels = backward ? 1 : 5;
  } else if (!backward) {
    r.kernels = plan.moe_router_fusion ? 6 : 22;
    if (plan.moe_force_balance == MoeForceBalance::kRandom) r.kernels += 2;
  } else {
    r.kernels = plan.moe_router_fusion ? 6 : 11;
  }
  r.bytes_per_element = 8.0 * static_cast<double>(r.kernels);
  return r;
}

}  // namespace parasol
