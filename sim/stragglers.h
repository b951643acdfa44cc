// Stragglers in the event simulator: a step played with per-rank slowdowns, a named slow rank or
// a distribution, and the distribution of step times over sampled steps. A rank's slowdown
// multiplies its device compute time; the ranks of a pipeline stage meet in collectives (TP, CP,
// EP, DP) every step, so a stage runs at the pace of its slowest rank (the engine's symmetric
// stage plays that rank's compute). Each sampled step draws every rank's slowdown afresh.
#pragma once

#include <cstdint>
#include <vector>

#include "core/json_reader.h"
#include "core/lower.h"
#include "core/plan.h"
#include "sim/engine.h"

namespace parasol::sim {

struct StragglerOptions {
  int slow_rank = -1;      // a rank whose compute is slow_factor times slower; -1: none
  double slow_factor = 1;  // >= 1
  double cv = 0;           // every rank's compute x (1 + cv z), z standard normal; 0: none
  int samples = 1;         // steps to sample (1 suffices without cv)
  uint64_t seed = 1;       // of the draws: the same seed gives the same steps
};

struct StepDistribution {
  double base_step_s = 0;      // the step without stragglers
  std::vector<double> step_s;  // one per sampled step, in the order drawn
  double mean_s = 0, p50_s = 0, p90_s = 0, p99_s = 0, min_s = 0, max_s = 0;
  int slow_stage = -1;  // the stage of the named slow rank
};

// The slowdown of each pipeline stage: the largest of its ranks' (rank_slowdown[r], one per rank
// of the plan). REQUIRES: rank_slowdown.size() == plan.gpus().
std::vector<double> stage_slowdowns(const Plan& plan, const std::vector<double>& rank_slowdown);

// Plays `lowered` once without stragglers and `options.samples` times with them. Throws
// parasol::Error naming the option ("stragglers.slow_rank", "stragglers.slow_factor",
// "stragglers.cv", "stragglers.samples") when one is out of range.
StepDistribution simulate_stragglers(Simulator& simulator, const LoweredPlan& lowered,
                                     const StragglerOptions& options);

// {"base_step_time_s", "samples", "mean_s", "p50_s", "p90_s", "p99_s", "min_s", "max_s",
//  "slow_stage", "step_times_s": [...]}.
Json step_distribution_to_json(const StepDistribution& d);

}  // namespace parasol::sim
