// The commands as functions: what estimate, simulate, search and validate compute and the --json
// document they print, for the command line (tools/*_cmd.cc) and the Python module (python/) alike,
// so that `parasol estimate --json` and `parasol.estimate({...})` are the same code.
//
// A request is a JSON object: the keys of a plan JSON plus "model", "cluster", "gpus" and
// "profile" (tools/spec.h load_request), and the command's own options named as its flags with
// '_' for '-' ("tokens", "price_per_gpu_hour", "slow_rank", "simulate_top", ...).
#pragma once

#include <functional>
#include <optional>
#include <string>

#include "cost_models/error_bands.h"
#include "cost_models/estimate.h"
#include "cost_models/time_to_train.h"
#include "interop/interop.h"
#include "sim/engine.h"
#include "sim/search.h"
#include "sim/stragglers.h"
#include "tools/job_flags.h"
#include "tools/spec.h"

namespace parasol::tools {

// --- estimate ---------------------------------------------------------------------------------

struct EstimateRun {
  cost::Estimate estimate;
  cost::ErrorBand band;
  std::optional<cost::TimeToTrain> job;  // with job.tokens
};

// Validates s.plan and estimates it; job flags as job_options (they may set the cluster's storage
// bandwidth and restart time). Throws parasol::Error.
EstimateRun run_estimate(Spec& s, const JobFlags& job);
// `parasol estimate --json`: the estimate, "band", "plan" and with tokens "job".
Json estimate_document(const Spec& s, const EstimateRun& r);

// --- simulate ---------------------------------------------------------------------------------

struct SimulateSettings {
  std::string trace;                 // write the predicted timeline here (Chrome trace); "" = none
  sim::StragglerOptions stragglers;  // samples: see `samples`
  int samples = 0;                   // 0: 100 with a cv, else 1
  JobFlags job;
};

struct SimulateRun {
  sim::SimResult result;
  std::optional<sim::StepDistribution> stragglers;  // when a straggler option is given
  std::optional<cost::TimeToTrain> job;             // with job.tokens
  cost::Estimate estimate;                          // the closed form, for comparison
  cost::ErrorBand band;
  double lower_wall_s = 0, simulate_wall_s = 0;
};

// Validates s.plan, lowers it and plays it (with stragglers when asked); writes the trace file
// when f.trace is set. Throws parasol::Error.
SimulateRun run_simulate(Spec& s, const SimulateSettings& f);
// `parasol simulate --json`.
Json simulate_document(const Spec& s, const SimulateSettings& f, const SimulateRun& r);

// --- search -----------------------------------------------------------------------------------

struct SearchSettings {
  int top = 10;
  int gbs = 1536;
  int64_t seq = 0;  // 0: the model's
  int threads = 0;  // 0: all cores
  std::string precision = "bf16";
  bool no_offload = false;
  int simulate_top = 0;
  bool robust = false;
  JobFlags job;
  // Only plans this framework can run (interop::framework_names(); `parasol export` succeeds);
  // "" = any plan.
  std::string framework;
  // Device memory (GiB) every listed plan leaves free beyond its reserved figure at the top of
  // its band (sim::SearchOptions::memory_margin_bytes).
  double memory_margin_gib = 0;
};

struct SearchRun {
  sim::SearchResult result;
  Plan best;  // the first of result.top, with the model, cluster and GPU count references
  // With job.tokens: a plan's time to train from its estimate, and from a step (its simulated
  // one: Candidate::simulated_step_s and simulated_compute_s); empty otherwise.
  std::function<cost::TimeToTrain(const Plan&, const cost::Estimate&)> train_of;
  std::function<cost::TimeToTrain(const Plan&, const cost::StepFigures&)> train_of_step;
};

// Searches the plans of s.model on s.cluster (ranked by step time, the pessimistic end of the
// band with f.robust, the time to train with f.job.tokens) and re-simulates the top
// f.simulate_top, re-ranked by the same key on their simulated step. `progress` (may be empty)
// receives the fraction done. Job flags as job_options (they may set the cluster's storage
// bandwidth and restart time). Throws parasol::Error naming the setting ("search.gbs") and when no
// plan fits. REQUIRES: s outlives the result's train_of.
SearchRun run_search(Spec& s, const SearchSettings& f, const std::string& model_ref,
                     const std::string& cluster_ref, std::function<void(double)> progress);
// `parasol search --json`: "top", "pareto", "enumerated", "fitting", "seconds", "best_plan".
Json search_document(const Spec& s, const SearchRun& r);

// --- validate ---------------------------------------------------------------------------------

// Validates s.plan (throws parasol::Error) and returns `parasol validate --json`.
Json validate_document(const Spec& s);

// --- requests (the Python module) ---------------------------------------------------------------

// Each: the request as above in, the command's --json document out. Throws parasol::Error naming
// the field.
Json estimate_request(const Json& request);
Json simulate_request(const Json& request);
// No plan keys: "model", "cluster", "gpus" (default 1024), "profile", the search flags ("gbs",
// "seq", "top", "threads", "precision", "no_offload", "simulate_top", "robust", "framework") and
// the job flags; another key is an Error.
Json search_request(const Json& request);
Json validate_request(const Json& request);
// The plan of the request (validated) in another framework's terms (interop/): framework is
// "megatron", "deepspeed" or "torchtitan"; returns {"framework", "version", "files": {name:
// text}, "executable": [names of the scripts]}: the files `parasol export` writes. Defined in
// tools/api_export.cc.
Json export_request(const Json& request, const std::string& framework);
// That document of an export (also `parasol export --json`).
Json export_document(const interop::Export& e);

}  // namespace parasol::tools
