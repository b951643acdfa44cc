// The self-contained HTML report of a plan (and of a search): the simulated pipeline timeline,
// memory per stage against capacity, the time breakdown with its error band, with a token count
// the time to train them and its goodput breakdown, and for a search the Pareto front and the
// top plans. Built only from results the lower floors return (the
// closed-form estimate, the simulation, liveness, the search); nothing is recomputed here. The
// page needs no network: CSS, script and data are inline, the charts are drawn into inline SVG.
// The timeline inlines every op of the step (up to ReportInput::max_detail_ops) as compact
// integer arrays, about 18 bytes of HTML an op (19 MB for the 1.08 M ops of llama3-70b on 64
// H100s): below the ~40 MB past which a page would load too slowly, so the whole step keeps its
// full detail rather than only a window of it. Beside them, a coarse level computed here (each
// stream's busy time in bins of 1/4096 of the step, with the kind that fills most of each bin)
// is what the page draws first, without parsing the ops; see kTimelineTick.
#pragma once

#include <cstdint>
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
  // The most ops the page draws as separate rects at once: when more ops are in view, the ops of
  // a row closer together than one pixel are drawn merged into one span (its busy time, coloured
  // by the kind that fills most of it); every op is still inlined (see max_detail_ops).
  int max_timeline_events = 20000;
  // The most ops inlined one by one (the longest, when the trace has more; the page says how many
  // it inlined). The coarse level always covers every op. The default keeps a page under about
  // 75 MB (about 18 bytes of HTML an op).
  int64_t max_detail_ops = 4000000;
};

// The timeline's level of detail. Times are integers in ticks of kTimelineTick seconds (1 ns)
// from the start of the step. A row's items are sorted by start and delta-encoded, flattened
// into one array of numbers per row:
//  - detail ("ops"): [gap, duration, category, name] per op, where gap = start - the end of the
//    row's previous op (0 for a row's first op: the start itself), name indexes "names";
//  - coarse ("spans"): [gap, duration, category, busy, ops] per piece: the row's ops merged while
//    the gap to the next one is under "coarse_gap" ticks (the step over kCoarseBins, rounded
//    up), the merged spans cut at multiples of coarse_gap, so that each piece lies within one
//    bin; busy: the time of the ops within the piece, category: the one with the most of it,
//    ops: how many ops start in the piece.
// The page draws the coarse level first (all it needs while a pixel spans more than coarse_gap),
// and parses the ops only when zoomed in further.
constexpr double kTimelineTick = 1e-9;
constexpr int kCoarseBins = 4096;

// The data the page draws, as inlined in it:
//  {"title", "model", "cluster", "device", "gpus", "plan": plan_to_json,
//   "estimate": estimate_to_json, "band": band_to_json(band, estimate step),
//   "simulation": sim_result_to_json + {"band": band_to_json(band, simulated step)},
//   "timeline": {"rows": [{"rank", "stage", "stream", "label"}], "categories": [name],
//                "names": [op name], "tick_s": kTimelineTick, "step_time_s" (the simulated
//                step: the end marker), "end_s" (the drawn span: the step, or the last op's end
//                if later), "total_events", "draw_limit": max_timeline_events,
//                "coarse": {"gap": ticks, "rows": [[span items] per row]},
//                "detail": {"ops" (how many are inlined), "complete" (all of them),
//                           "rows": [[op items] per row]}},
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
// (model and cluster names) is escaped in the markup and in the inlined JSON. report_data is
// inlined in <script type="application/json" id="parasol-data">, less timeline.detail.rows,
// which go in a block of their own, <script type="application/json" id="parasol-ops">, parsed
// only when the timeline is zoomed in past the coarse level (a page of a million ops opens
// without parsing them). When the page's script has drawn everything, <body> carries
// data-rendered="ok"; data-errors counts script errors (0 when none).
std::string report_html(const ReportInput& input);

}  // namespace parasol::report
