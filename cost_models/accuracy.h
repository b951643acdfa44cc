// Accuracy suites: published, measured training runs (model, cluster, plan, measured step time
// or peak memory) and parasol's prediction of each, with per-family statistics (mean |error|,
// signed bias, max). A memory point names the metric its source measured (max_allocated,
// max_reserved, nvidia-smi) and the rank (or the maximum over all ranks).
// Suite files live in tests/data/published/ (schema: tests/data/published/SCHEMA.md).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "core/cluster.h"
#include "core/json_reader.h"
#include "core/model.h"
#include "core/plan.h"
#include "cost_models/framework_memory.h"
#include "cost_models/profile.h"

namespace parasol::cost {

struct AccuracyRow {
  std::string id;
  std::string source;
  std::string family;  // the point's, else the suite's "family", else "unnamed"
  double published_s = 0;
  double predicted_s = 0;
  // A memory point: the metric ("" for a step-time point), the rank it names (-1: the maximum
  // over all ranks), and the published and predicted bytes; `error` is then the memory's.
  std::string metric;
  int rank = -1;
  double published_bytes = 0;
  double predicted_bytes = 0;
  double error = 0;  // (predicted - published) / published
  double mfu = 0;
  double memory_per_gpu_bytes = 0;  // predicted peak device memory of the busiest rank
  double device_memory_bytes = 0;
  bool fits = true;  // predicted to fit in device (and host) memory; every published run ran
  // The search's verdict on the plan (memory_fit: reserved at the top of its band): a run it
  // would drop though it ran is not kFits.
  MemoryFit memory_fit = MemoryFit::kFits;
  // False for a run the suite keeps in view but leaves out of the statistics (its "judged":
  // false names why: e.g. a schedule the source does not publish that decides the step).
  bool judged = true;
};

// Error statistics of a set of rows (the judged ones).
struct ErrorStats {
  int runs = 0;
  double mean_abs_error = 0;
  double mean_error = 0;  // signed: < 0 means the predictions are optimistic (too fast)
  double max_abs_error = 0;
  double rms_error = 0;
  int not_fitting = 0;        // runs that ran but are predicted not to fit
  int dropped_by_search = 0;  // runs that ran but whose memory_fit the search drops
};
ErrorStats error_stats(const std::vector<AccuracyRow>& rows);

struct FamilyStats {
  std::string family;
  ErrorStats stats;
  bool memory = false;  // a family of memory points (no step-time error band)
};

struct AccuracyReport {
  std::vector<AccuracyRow> rows;
  ErrorStats overall;                 // of the step-time points
  std::vector<FamilyStats> families;  // in the order families first appear
  // Convenience copies of overall.
  double mean_abs_error = 0;
  double max_abs_error = 0;
};

// What a predictor returns for one run.
struct Prediction {
  double step_time_s = 0;
  double mfu = 0;
  double memory_per_gpu_bytes = 0;
  double device_memory_bytes = 0;
  bool fits = true;
  MemoryFit memory_fit = MemoryFit::kFits;  // the search's verdict, of the worst stage
  // What the framework measures on one rank of each pipeline stage, stage 0 first.
  std::vector<FrameworkMemory> stage_memory;
};
// The predicted bytes of `metric` on `rank` (-1: the largest over all ranks) of plan `p`.
// REQUIRES: pred.stage_memory has p.pp entries; -1 <= rank < p.gpus().
double predicted_memory(const Prediction& pred, const Plan& p, MemoryMetric metric, int rank);
// Predicts a run; the default (an empty function) is the closed-form estimate with the device's
// default profile. The command line passes the event simulator for `accuracy --simulate`.
// `reserved`: Reserved::kReplay for a point that judges reserved bytes (max_reserved,
// nvidia-smi), kBand for the others (a step time, max_allocated: they read the step time, the
// allocated bytes and the fit, the same either way, and skip lowering every stage for the
// allocator's replay).
using Predictor =
    std::function<Prediction(const Model&, const Cluster&, const Plan&, Reserved reserved)>;
// The closed-form estimate of a run under `profile` (the default predictor's, with the device's
// default profile).
Prediction estimate_prediction(const Model& m, const Cluster& c, const Plan& p,
                               const Profile& profile, Reserved reserved);

// One published run, read and checked.
struct PublishedRun {
  std::string id, source, family;
  Model model;
  Json cluster;  // a preset name (string) or a cluster JSON object
  int gpus = 0;
  Plan plan;
  double time_s = 0;  // 0 for a memory point
  // A memory point's published peak (bytes), its metric and rank (-1: the maximum over ranks).
  double memory_bytes = 0;
  MemoryMetric metric = MemoryMetric::kMaxAllocated;
  int rank = -1;
  bool is_memory() const { return memory_bytes > 0; }
  bool judged = true;
};

// Reads a suite: {"family"?, "defaults"?: {"model", "plan"}, "runs" | "points": [{"id", "src",
// "family"?, "cluster": preset | {cluster JSON}, "gpus", "model": {...} | "preset": NAME,
// "plan": {...}, "time_s" | "memory": {"peak_GiB", "metric": max_allocated | max_reserved |
// nvidia-smi, "rank": N | "max"}, and descriptive fields (raw, derivation, note, ...)}]}. Throws
// parasol::Error naming the run and field on bad input (an invalid plan included).
std::vector<PublishedRun> read_accuracy_suite(const Json& suite, const std::string& path = "suite");

// The cluster a published run ran on.
Cluster cluster_of(const PublishedRun& run);

// Predicts every run of the suites and gathers the statistics.
AccuracyReport run_accuracy(const std::vector<PublishedRun>& runs, const Predictor& predict = {});
// The report (per family and overall) of rows already predicted, in their order: the statistics
// run_accuracy gathers, for a caller that holds the rows of several suites
// (tests/sim/accuracy_bars_test.cc predicts each suite once for both its bars).
AccuracyReport accuracy_report(std::vector<AccuracyRow> rows);
// The same with each run's cluster built once by the caller (clusters[i] = cluster_of(runs[i])),
// for callers that predict the same runs many times over (cost_models/profile_sensitivity.cc: a
// pass per figure and end of its range), where building every cluster again (its topology and
// paths) took about 40% of the time.
AccuracyReport run_accuracy_on(const std::vector<PublishedRun>& runs,
                               const std::vector<Cluster>& clusters, const Predictor& predict = {});
// read_accuracy_suite + run_accuracy.
AccuracyReport run_accuracy_suite(const Json& suite, const std::string& path = "suite",
                                  const Predictor& predict = {});

Json accuracy_to_json(const AccuracyReport& r);

}  // namespace parasol::cost
