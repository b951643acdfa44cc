// Calibration (`parasol calibrate`): fits a Profile's parameters to measured traces, so that
// the cost models price the ops of the traced Programs as they measured.
//
// Samples. Each measured run is lowered (core/lower.h) into the Programs it executed; an event
// of rank r and op id i is op i of the Program of r's pipeline stage (its name and kind must
// agree, else the trace is of another program: an Error). Per op: the median over steps of
// each rank's duration, then over the ranks of the stage the median for compute ops and the
// minimum for communication (a collective's members finish together, so the rank that arrived
// last waited least: its time is the transfer's). Not fitted: receives (their time is waiting
// for the sender, whose send carries the transfer), Group::kPp collectives (rendezvous),
// communication or copies that overlapped another communication or copy on the same rank (the
// simulator shares the link between them; the price is of an op alone), communication that ran
// beside a compute op of its rank (the runtime sees a transfer complete only when it polls it,
// between ops, so its measured end is the end of the compute it overlapped: on the CPU runtime
// a 256 KB all-reduce hidden under a 1.1 ms weight-gradient GEMM measured 1.1 ms), and ops the
// model prices at 0 (a group of one).
//
// Fit. The predicted time of a sample is cost::OpPricer's price (cost_models/op_cost.h, the
// simulator's) under the candidate Profile. The fit minimises
//   sum_i w_i^2 log^2(predicted_i / measured_i),   w_i^2 = c_i measured_i / mean(c measured)
// (relative errors, weighted by time: the ops that make the step count most; c_i is 1, or for an
// imported sample the occurrences per step it stands for, see calibrate_imported) with the
// bounded solver of least_squares.h over the parameters below (bounds in brackets):
//   gemm_efficiency.<dtype> [0.01, 1] for each precision of the runs (Profile's per-dtype
//     efficiency), gemm_k_half [0, 8192],
//   memory_efficiency [0.01, 1], flash_forward_efficiency and flash_backward_efficiency
//     [0.01, 1], kernel_overhead_s [0, 1 ms],
//   link_efficiency.<kind> [0.01, 1] for each link kind of the runs' clusters,
//     collective_step_latency_s [0, 1 ms], host_copy_efficiency [0.01, 1],
//     host_adam_params_per_s [1e6, 1e13].
// A parameter that no sample's price depends on keeps the base Profile's value.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "core/cluster.h"
#include "core/model.h"
#include "core/plan.h"
#include "cost_models/profile.h"
#include "traces/imported_trace.h"
#include "traces/trace.h"

namespace parasol::traces {

// One measured run: its (merged) trace and what it ran.
struct MeasuredRun {
  std::string name;  // the trace file(s), for errors and Profile::traces
  Model model;
  Cluster cluster;
  Plan plan;
  Trace trace;
};

struct FittedParam {
  std::string name;  // "gemm_efficiency.fp32", "link_efficiency.shm", "kernel_overhead_s", ...
  double base = 0;   // the base Profile's value
  double fitted = 0;
  double lower = 0, upper = 0;
  int samples = 0;  // samples whose price depends on it; 0: kept at the base value
  // Fitted (samples > 0) to within 1e-6 of a bound: the data asked for more than the bound
  // allows, so the figure is the bound's, not the trace's.
  bool at_bound = false;
};

struct Calibration {
  cost::Profile profile;            // the base Profile with the fitted parameters
  std::vector<FittedParam> params;  // every parameter considered, in the order above
  int samples = 0;                  // ops fitted
  int skipped = 0;                  // matched (rank, op id) pairs not fitted (see above)
  // sqrt(mean of w_i^2 log^2(predicted/measured)): the time-weighted RMS relative error of the
  // op prices before (base Profile) and after the fit.
  double rms_log_error_before = 0;
  double rms_log_error_after = 0;
  int iterations = 0;
  // The fitted ops replayed, each as often as it ran: their measured seconds, and their prices
  // under the base and the fitted Profile (summed; a step's op time, without overlap).
  double replay_measured_s = 0;
  double replay_base_s = 0;
  double replay_fitted_s = 0;
  // Whether the fitted profile replays the fitted ops further from their measured time than the
  // base profile did (|replay_fitted_s - replay_measured_s| > |replay_base_s - ...|): the fit
  // lowered the weighted log error but moved the sum away.
  bool replay_worse() const;
};

// Fits `base` to `runs`. Throws parasol::Error: no runs or no samples ("traces"), a run whose
// cluster's device differs from base.device ("profile.device"), a plan that does not validate,
// or a trace of another program (naming the run, rank and op).
Calibration calibrate(const std::vector<MeasuredRun>& runs, const cost::Profile& base);

// An imported trace of a job that parasol did not run (traces/kineto_import.h,
// traces/nsys_import.h): kernels with kinds and shapes, no op ids. The plan says what prices them:
// the device, the precision and the communication groups.
struct ImportedRun {
  std::string name;  // the trace file(s)
  Model model;
  Cluster cluster;
  Plan plan;
  ImportedTrace imported;
};

// Fits `base` to imported runs, matching kernels by kind and shape instead of op ids, each priced
// on the device of the plan's first rank. Each run's kernels are grouped by (kind, math dtype,
// shape or bytes, group); a group is one sample: an op of that kind and shape (GEMMs as forward
// GEMMs of a layer in the plan's precision, or in tf32 for an fp32 plan's tensor-core GEMMs, which
// fits gemm_efficiency.tf32: a trace does not say a GEMM's pass; attention forward or backward and
// causal or not as the import read them (an unstated mask is causal, as parasol lowers attention),
// its FLOPs by core's attention_flops; norms, activations, elementwise kernels, AdamW as
// memory-bound ops of their bytes; a collective on the plan's group that holds the ranks its
// communicator states (tp, dp x cp, dp, cp, ep, pp: the first that does), or without stated ranks
// the group with as many ranks, when no other group of that size has other ranks), measured as the
// median of the group's durations, counted as often as it ran per step. Left out (skipped): kernels
// without a shape or size, GEMMs and attention whose dtype is not the plan's (memory-bound kernels
// are priced by their bytes, whatever their dtype), collectives whose communicator no group of the
// plan is (or that a size alone cannot place), sends and receives, copies, memsets and unclassified
// kernels. Then the fit of calibrate(). Throws parasol::Error as calibrate() does.
Calibration calibrate_imported(const std::vector<ImportedRun>& runs, const cost::Profile& base);

// {"samples", "skipped", "iterations", "rms_log_error_before", "rms_log_error_after",
//  "replay_measured_s", "replay_base_s", "replay_fitted_s",
//  "replay_worse", "params": [{"name", "base", "fitted", "lower", "upper", "samples",
//  "at_bound"}]}.
Json calibration_to_json(const Calibration& c);

}  // namespace parasol::traces
