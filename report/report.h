// The self-contained HTML report of a plan (and of a search): the simulated pipeline timeline,
// memory per stage against capacity, the time breakdown with its error band, with a token count
// the time to train them and its goodput breakdown, and for a search the Pareto front and the
// top plans. Built only from results the lower floors return (the
// closed-form estimate, the simulation, liveness, the search); nothing is recomputed here. The
// page needs no network: CSS, script and data are inline, the charts are drawn into inline SVG.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "core/json_reader.h"
#include "core/liveness.h"
#include "core/plan.h"
#include "cost_models/error_bands.h"
#include "cost_models/estimate.h"
#include "cost_models/time_to_train.h"
#include "sim/engine.h"
#include "sim/search.h"

namespace parasol::report {

// What the lower floors said about one plan.
struct PlanResults {
  std::string model_name;    // shown escaped; may come from a user's file
  std::string cluster_name;  // likewise
  std::string device_name;   // the GPU's name
  int gpus = 0;
  Plan plan;
  cost::Estimate estimate;  // cost::estimate of `plan`
  cost::ErrorBand band;     // cost::error_band of `plan`
  // The simulator's result for the lowered plan, played with record_trace = true (an empty
  // trace draws an empty timeline).
  sim::SimResult simulation;
  // liveness() of each pipeline stage's Program, stage by stage (may be empty: no memory bars).
  std::vector<Liveness> stage_memory;
  // With a token count: cost::time_to_train of `plan` from its estimate, as `parasol estimate
  // --tokens` reports it (tools/api.h run_estimate); unset: the page has no time-to-train section.
  std::optional<cost::TimeToTrain> job;
};

// What a search returned, and the error band of each of its top plans.
struct SearchResults {
  sim::SearchResult result;
  std::vector<cost::ErrorBand> top_bands;  // top_bands[i] is the band of result.top[i]
  // With a token count: top_jobs[i] is the time to train of result.top[i] (what the search
  // ranked them by); empty without.
  std::vector<cost::TimeToTrain> top_jobs;
  int global_batch = 0;
};

struct ReportInput {
  PlanResults plan;  // for a search: its best plan
  std::optional<SearchResults> search;
  // The timeline keeps at most this many events (the longest ones; the page says how many it
  // dropped), so that a large plan's page stays light.
  int max_timeline_events = 20000;
};

// The data the page draws, as inlined in it:
//  {"title", "model", "cluster", "device", "gpus", "plan": plan_to_json,
//   "estimate": estimate_to_json, "band": band_to_json(band, estimate step),
//   "simulation": sim_result_to_json + {"band": band_to_json(band, simulated step)},
//   "timeline": {"rows": [{"rank", "stage", "stream", "label"}], "categories": [name],
//                "events": [[row, start_s, dur_s, category, name]], "total_events",
//                "step_time_s"},
//   "memory": {"classes": [buffer class name], "stages": [{"stage", "peak_by_class_bytes",
//              "peak_bytes", "host_bytes"}], "device_capacity_bytes",
//              "estimate_per_gpu_bytes", "host_per_server_bytes", "host_capacity_bytes"},
//   "search" (with a search): {"top": [{"plan", "estimate", "band", "simulated_step_time_s"?}],
//              "pareto": [{"plan", "tokens_per_s", "memory_per_gpu_bytes", "step_time_s"}],
//              "enumerated", "fitting", "seconds", "global_batch"}}.
// REQUIRES: search->top_bands.size() == search->result.top.size(), and search->top_jobs is empty
// or as long (else throws parasol::Error).
Json report_data(const ReportInput& input);

// The whole page: one HTML document with no external resource. Every string from the input
// (model and cluster names) is escaped in the markup and in the inlined JSON. When the page's
// script has drawn everything, <body> carries data-rendered="ok"; data-errors counts script
// errors (0 when none).
std::string report_html(const ReportInput& input);

}  // namespace parasol::report
