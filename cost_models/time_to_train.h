// Time to train: from a plan's step time to the wall-clock time, GPU-hours, energy and cost of
// training N tokens, with the goodput breakdown of the job around the steps (checkpoint writes at
// the interval that maximises goodput, work lost to interruptions, restarts), interruptions from
// the cluster's components (cost_models/reliability.h), checkpoint bytes from the plan
// (cost_models/checkpoint_cost.h), stragglers from the profile's per-GPU variability
// (cost_models/variability.h) and power from the datasheets (cost_models/energy.h).
#pragma once

#include <optional>

#include "core/cluster.h"
#include "core/json_reader.h"
#include "core/model.h"
#include "core/plan.h"
#include "cost_models/checkpoint_cost.h"
#include "cost_models/energy.h"
#include "cost_models/goodput.h"
#include "cost_models/profile.h"
#include "cost_models/reliability.h"

namespace parasol::cost {

struct JobOptions {
  double tokens = 0;                 // tokens to train; > 0
  double checkpoint_interval_s = 0;  // seconds of work between checkpoints; 0 = Daly's optimum
  double price_per_gpu_hour = 0;     // currency per GPU-hour; 0 = no cost reported
  double planned_per_day = 0;        // planned stops (maintenance) per day of wall time
  FailureRates failure_rates = default_failure_rates();
  std::optional<PowerFigures> power;  // unset = default_power(cluster)
  // The cluster's job_reliability(cluster, failure_rates), when the caller has it (the search
  // prices many plans on one cluster); unset = computed from the cluster graph.
  std::optional<JobReliability> reliability;
  // The step time already includes stragglers (a mean over sampled slow ranks, sim/): do not add
  // the profile's expected slowest-GPU delay again.
  bool stragglers_included = false;
};

// What a step costs, as a predictor reports it.
struct StepFigures {
  double step_s = 0;     // the step of the median GPU (or a mean over sampled stragglers)
  double compute_s = 0;  // of which device compute (what a slower GPU stretches)
};

struct TimeToTrain {
  double tokens = 0;
  double steps = 0;            // optimizer steps: ceil(tokens / tokens per step)
  double step_s = 0;           // as given
  double expected_step_s = 0;  // with the slowest GPU's delay (stragglers)
  double straggler_cv = 0;     // the per-GPU variability used
  Goodput goodput;             // where the wall time goes
  double time_s = 0;           // wall-clock time to train
  double gpu_hours = 0;
  double energy_j = 0;  // facility energy (IT x PUE)
  double cost = 0;      // gpu_hours x price; 0 without a price
  double price_per_gpu_hour = 0;
  // Checkpoints.
  CheckpointSize checkpoint;
  double storage_bw = 0;          // bytes/s
  double checkpoint_write_s = 0;  // delta
  double checkpoint_read_s = 0;   // part of each restart
  double young_interval_s = 0;
  double daly_interval_s = 0;
  double interval_s = 0;  // the interval used: whole steps of work
  double interval_steps = 0;
  bool interval_given = false;  // --checkpoint-interval
  // Interruptions.
  JobReliability reliability;
  double restart_s = 0;  // per interruption, checkpoint read included
  double planned_per_day = 0;
  PowerFigures power;
};

// Throws parasol::Error naming the option ("job.tokens", "job.checkpoint_interval",
// "job.price_per_gpu_hour", "job.planned_per_day") when one is out of range.
void validate_job_options(const JobOptions& options);

// The job that trains `options.tokens` with `plan` (global_batch x seq tokens a step) on every GPU
// of `cluster`. Throws parasol::Error naming the option ("job.tokens", "job.checkpoint_interval",
// "job.price_per_gpu_hour", "job.planned_per_day") when one is out of range.
// REQUIRES: validate(plan, model, cluster) passed; step.step_s > 0.
TimeToTrain time_to_train(const Model& model, const Cluster& cluster, const Plan& plan,
                          const StepFigures& step, const Profile& profile,
                          const JobOptions& options);

// The restart time of `cluster` without the checkpoint read: Cluster::restart_s, or parasol's
// default of 600 s (time_to_train.cc gives its reasons).
double restart_time_s(const Cluster& cluster);

// {"tokens", "steps", "step_time_s", "expected_step_time_s", "time_to_train_s",
//  "time_to_train_days", "gpu_hours", "energy_MWh", "cost", "goodput", "breakdown_s": {...},
//  "interruptions", "checkpoint": {...}, "reliability": {...}, "power": {...}}.
Json time_to_train_to_json(const TimeToTrain& t);

}  // namespace parasol::cost
