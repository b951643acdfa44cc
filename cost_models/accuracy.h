// Accuracy suites: published training runs (model, cluster, plan, measured iteration time)
// and parasol's estimate of each. Suite files live in tests/data/published/.
#pragma once

#include <string>
#include <vector>

#include "core/json_reader.h"

namespace parasol::cost {

struct AccuracyRow {
  std::string id;
  std::string source;
  double published_s = 0;
  double predicted_s = 0;
  double error = 0;  // (predicted - published) / published
  double mfu = 0;
};

struct AccuracyReport {
  std::vector<AccuracyRow> rows;
  double mean_abs_error = 0;
  double max_abs_error = 0;
};

// Runs every run of a suite: {"defaults": {"model": {...}, "plan": {...}} (optional),
// "runs": [{"id", "src", "cluster", "gpus", "model": {...} | "preset", "plan": {...},
// "time_s"}]}. Throws parasol::Error naming the run and field on bad input.
AccuracyReport run_accuracy_suite(const Json& suite, const std::string& path = "suite");
Json accuracy_to_json(const AccuracyReport& r);

}  // namespace parasol::cost
