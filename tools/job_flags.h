// The whole-job flags of estimate, simulate and search (--tokens, --price-per-gpu-hour,
// --checkpoint-interval, --storage-GBps, --restart-s, --planned-per-day) and the time-to-train
// report they print (cost_models/time_to_train.h).
#pragma once

#include <CLI/CLI.hpp>
#include <optional>

#include "core/cluster.h"
#include "cost_models/estimate.h"
#include "cost_models/time_to_train.h"

namespace parasol::tools {

struct JobFlags {
  std::optional<double> tokens;        // --tokens: time to train is reported when given
  double price_per_gpu_hour = 0;       // --price-per-gpu-hour
  double checkpoint_interval_s = 0;    // --checkpoint-interval (0: Young/Daly)
  std::optional<double> storage_GBps;  // --storage-GBps: overrides the cluster's
  std::optional<double> restart_s;     // --restart-s: overrides the cluster's
  double planned_per_day = 0;          // --planned-per-day
};

void add_job_flags(CLI::App* cmd, JobFlags& f);

// The job options of the flags; --storage-GBps and --restart-s are set on `cluster`. Throws
// parasol::Error naming the flag ("job.storage_GBps: must be > 0") for a value out of range, and
// ("job.tokens") when a job flag is given without --tokens.
cost::JobOptions job_options(const JobFlags& f, Cluster& cluster);

// The step figures of a closed-form estimate: its step time and its compute (forward, backward,
// recompute, optimizer and the overlap slowdown).
cost::StepFigures estimate_step(const cost::Estimate& e);

// The readable report: time to train, GPU-hours, energy, cost, the goodput breakdown, the
// checkpoint interval and what sets it, and the interruptions by component.
void print_time_to_train(const cost::TimeToTrain& t);

}  // namespace parasol::tools
