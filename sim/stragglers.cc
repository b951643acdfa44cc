// Per-rank slowdowns drawn and played by the event engine; percentiles of the sampled steps.
#include "sim/stragglers.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "core/error.h"
#include "core/rank_layout.h"

namespace parasol::sim {

std::vector<double> stage_slowdowns(const Plan& plan, const std::vector<double>& rank_slowdown) {
  PARASOL_CHECK(static_cast<int>(rank_slowdown.size()) == plan.gpus(),
                std::to_string(rank_slowdown.size()) + " slowdowns for " +
                    std::to_string(plan.gpus()) + " ranks");
  const RankLayout layout(plan);
  std::vector<double> stage(plan.pp, 0);
  for (int r = 0; r < static_cast<int>(rank_slowdown.size()); ++r) {
    double& s = stage[layout.coord(r).pp];
    s = std::max(s, rank_slowdown[r]);
  }
  return stage;
}

namespace {
// A standard normal from two uniforms (Box-Muller), so that the draws do not depend on the
// standard library's distribution implementation.
double normal(std::mt19937_64& rng) {
  const double u1 = (static_cast<double>(rng() >> 11) + 0.5) * 0x1.0p-53;
  const double u2 = static_cast<double>(rng() >> 11) * 0x1.0p-53;
  return std::sqrt(-2 * std::log(u1)) * std::cos(2 * M_PI * u2);
}

double percentile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  const double pos = q * (v.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(pos));
  const size_t hi = std::min(v.size() - 1, lo + 1);
  return v[lo] + (pos - lo) * (v[hi] - v[lo]);
}
}  // namespace

StepDistribution simulate_stragglers(Simulator& simulator, const LoweredPlan& lowered,
                                     const StragglerOptions& o) {
  const Plan& plan = lowered.plan;
  const int ranks = plan.gpus();
  if (o.slow_rank < -1 || o.slow_rank >= ranks)
    throw Error("stragglers.slow_rank", std::to_string(o.slow_rank) + " is not a rank of the " +
                                            std::to_string(ranks) + " ranks of the plan");
  if (!(o.slow_factor >= 1) || o.slow_factor > 100)
    throw Error("stragglers.slow_factor", "must be in [1, 100]");
  if (!(o.cv >= 0) || o.cv > 1) throw Error("stragglers.cv", "must be in [0, 1]");
  if (o.samples < 1 || o.samples > 100000)
    throw Error("stragglers.samples", "must be in [1, 100000]");
  StepDistribution d;
  d.base_step_s = simulator.simulate(lowered, false).step_time_s;
  if (o.slow_rank >= 0) d.slow_stage = RankLayout(plan).coord(o.slow_rank).pp;
  std::mt19937_64 rng(o.seed);
  std::vector<double> rank(ranks, 1.0);
  for (int k = 0; k < o.samples; ++k) {
    for (int r = 0; r < ranks; ++r) rank[r] = o.cv > 0 ? std::max(0.1, 1 + o.cv * normal(rng)) : 1;
    if (o.slow_rank >= 0) rank[o.slow_rank] *= o.slow_factor;
    d.step_s.push_back(simulator.simulate(lowered, false, stage_slowdowns(plan, rank)).step_time_s);
  }
  d.mean_s = std::accumulate(d.step_s.begin(), d.step_s.end(), 0.0) / d.step_s.size();
  d.p50_s = percentile(d.step_s, 0.5);
  d.p90_s = percentile(d.step_s, 0.9);
  d.p99_s = percentile(d.step_s, 0.99);
  d.min_s = *std::min_element(d.step_s.begin(), d.step_s.end());
  d.max_s = *std::max_element(d.step_s.begin(), d.step_s.end());
  return d;
}

Json step_distribution_to_json(const StepDistribution& d) {
  return {{"base_step_time_s", d.base_step_s},
          {"samples", d.step_s.size()},
          {"mean_s", d.mean_s},
          {"p50_s", d.p50_s},
          {"p90_s", d.p90_s},
          {"p99_s", d.p99_s},
          {"min_s", d.min_s},
          {"max_s", d.max_s},
          {"slow_stage", d.slow_stage},
          {"step_times_s", d.step_s}};
}

}  // namespace parasol::sim
