// The HTML report: the data the page draws (report_data) and the page around it (report_html).
// See report.h.
#include "report/report.h"

#include <algorithm>
#include <map>
#include <numeric>
#include <utility>

#include "core/error.h"
#include "report/html.h"
#include "report/page.h"
#include "tools/format.h"

namespace parasol::report {

namespace {

using tools::count;
using tools::gib;
using tools::pct;
using tools::secs;

// The colour class of a timeline event: communication by group ("tp comm"), copies, then the
// phase of a compute op ("fwd", "bwd", ...), else its kind.
std::string category(const traces::TraceEvent& e, const std::string& stream_name) {
  if (!e.group.empty()) return e.group + " comm";
  if (stream_name == "copy") return "copy";
  if (!e.phase.empty()) return e.phase;
  if (!e.kind.empty()) return e.kind;
  return "other";
}

Json timeline_data(const sim::SimResult& r, int max_events) {
  const traces::Trace& tr = r.trace;
  std::map<int, int> stage_of_rank;
  for (size_t s = 0; s < r.stage_rank.size(); ++s)
    stage_of_rank[r.stage_rank[s]] = static_cast<int>(s);
  std::map<std::pair<int, int>, std::string> stream_names;
  for (const auto& s : tr.streams) stream_names[{s.rank, s.stream}] = s.name;
  auto stream_name = [&](int rank, int stream) {
    auto it = stream_names.find({rank, stream});
    return it != stream_names.end() ? it->second : "stream " + std::to_string(stream);
  };
  auto stage = [&](int rank) {
    auto it = stage_of_rank.find(rank);
    return it != stage_of_rank.end() ? it->second : -1;
  };

  // Rows: the (rank, stream) pairs that have events, by stage, then rank, then stream.
  std::vector<std::pair<int, int>> keys;
  for (const auto& e : tr.events) keys.emplace_back(e.rank, e.stream);
  std::sort(keys.begin(), keys.end(), [&](const auto& a, const auto& b) {
    return std::tuple(stage(a.first), a.first, a.second) <
           std::tuple(stage(b.first), b.first, b.second);
  });
  keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
  std::map<std::pair<int, int>, int> row_of;
  Json rows = Json::array();
  for (const auto& k : keys) {
    row_of[k] = static_cast<int>(rows.size());
    const int st = stage(k.first);
    const std::string sname = stream_name(k.first, k.second);
    rows.push_back(
        {{"rank", k.first},
         {"stage", st},
         {"stream", sname},
         {"label", (st >= 0 ? "stage " + std::to_string(st) : "rank " + std::to_string(k.first)) +
                       " " + sname}});
  }

  // The kept events: all, or the longest max_events, in trace order.
  std::vector<size_t> kept(tr.events.size());
  std::iota(kept.begin(), kept.end(), 0);
  if (max_events >= 0 && kept.size() > static_cast<size_t>(max_events)) {
    std::stable_sort(kept.begin(), kept.end(),
                     [&](size_t a, size_t b) { return tr.events[a].dur_s > tr.events[b].dur_s; });
    kept.resize(static_cast<size_t>(max_events));
    std::sort(kept.begin(), kept.end());
  }
  std::map<std::string, int> category_index;
  Json categories = Json::array(), events = Json::array();
  for (size_t i : kept) {
    const traces::TraceEvent& e = tr.events[i];
    const std::string c = category(e, stream_name(e.rank, e.stream));
    auto [it, added] = category_index.emplace(c, static_cast<int>(categories.size()));
    if (added) categories.push_back(c);
    events.push_back(
        Json::array({row_of[{e.rank, e.stream}], e.start_s, e.dur_s, it->second, e.name}));
  }
  return {{"rows", rows},
          {"categories", categories},
          {"events", events},
          {"total_events", tr.events.size()},
          {"step_time_s", r.step_time_s}};
}

Json memory_data(const PlanResults& p) {
  Json classes = Json::array(), stages = Json::array();
  for (int c = 0; c < 5; ++c) classes.push_back(buffer_class_name(static_cast<BufferClass>(c)));
  for (size_t s = 0; s < p.stage_memory.size(); ++s) {
    const Liveness& l = p.stage_memory[s];
    stages.push_back({{"stage", s},
                      {"peak_by_class_bytes", l.peak_by_class},
                      {"peak_bytes", l.peak_bytes},
                      {"host_bytes", l.host_bytes}});
  }
  const cost::Estimate& e = p.estimate;
  return {{"classes", classes},
          {"stages", stages},
          {"device_capacity_bytes", e.device_memory_bytes},
          {"estimate_per_gpu_bytes", e.memory_per_gpu_bytes},
          {"host_per_server_bytes", e.host_memory_per_server_bytes},
          {"host_capacity_bytes", e.host_memory_capacity_bytes}};
}

Json search_data(const SearchResults& s) {
  const sim::SearchResult& r = s.result;
  if (s.top_bands.size() != r.top.size())
    throw Error("report.search.top_bands", "has " + std::to_string(s.top_bands.size()) +
                                               " bands for " + std::to_string(r.top.size()) +
                                               " plans");
  if (!s.top_jobs.empty() && s.top_jobs.size() != r.top.size())
    throw Error("report.search.top_jobs", "has " + std::to_string(s.top_jobs.size()) +
                                              " jobs for " + std::to_string(r.top.size()) +
                                              " plans");
  Json top = Json::array(), pareto = Json::array();
  for (size_t i = 0; i < r.top.size(); ++i) {
    const sim::Candidate& c = r.top[i];
    Json row = {{"plan", plan_to_json(c.plan)},
                {"estimate", cost::estimate_to_json(c.estimate)},
                {"band", cost::band_to_json(s.top_bands[i], c.estimate.step_time_s)}};
    if (!s.top_jobs.empty()) row["job"] = cost::time_to_train_to_json(s.top_jobs[i]);
    if (c.simulated_step_s > 0) row["simulated_step_time_s"] = c.simulated_step_s;
    top.push_back(row);
  }
  for (const auto& c : r.pareto)
    pareto.push_back({{"plan", plan_to_json(c.plan)},
                      {"tokens_per_s", c.estimate.tokens_per_s},
                      {"memory_per_gpu_bytes", c.estimate.memory_per_gpu_bytes},
                      {"step_time_s", c.estimate.step_time_s}});
  return {{"top", top},           {"pareto", pareto},     {"enumerated", r.enumerated},
          {"fitting", r.fitting}, {"seconds", r.seconds}, {"global_batch", s.global_batch}};
}

std::string title(const PlanResults& p) {
  return p.model_name + " on " + std::to_string(p.gpus) + " x " + p.device_name + " (" +
         p.cluster_name + ")";
}

// "tp 2 · pp 2 · dp 2 · ..." : the plan's degrees and switches.
std::string degrees(const Plan& p) {
  std::string s = "tp " + std::to_string(p.tp) + " · pp " + std::to_string(p.pp) + " · dp " +
                  std::to_string(p.dp) + " · cp " + std::to_string(p.cp) + " · ep " +
                  std::to_string(p.ep) + " · sp " + (p.sequence_parallel ? "on" : "off") + " · " +
                  schedule_name(p.schedule);
  if (p.vpp > 1) s += " (vpp " + std::to_string(p.vpp) + ")";
  s += " · mbs " + std::to_string(p.micro_batch) + " · gbs " + std::to_string(p.global_batch) +
       " · ZeRO " + std::to_string(p.zero) + " · recompute " + recompute_label(p) + " · offload " +
       offload_name(p.offload) + " · " + dtype_name(p.precision);
  return s;
}

std::string figure(const std::string& name, const std::string& value, const std::string& note) {
  return "<div class=\"fig\"><div class=\"fig-name\">" + html_escape(name) +
         "</div><div class=\"fig-value\">" + html_escape(value) + "</div><div class=\"fig-note\">" +
         html_escape(note) + "</div></div>";
}

std::string header_html(const ReportInput& in) {
  const PlanResults& p = in.plan;
  const cost::Estimate& e = p.estimate;
  const sim::SimResult& r = p.simulation;
  std::string h = "<header><h1>parasol report: " + html_escape(title(p)) + "</h1>";
  if (in.search)
    h += "<p class=\"sub\">search: the best of " + count(in.search->result.enumerated) +
         " plans enumerated (" + count(in.search->result.fitting) + " fit), global batch " +
         std::to_string(in.search->global_batch) +
         (in.search->top_jobs.empty() ? ""
                                      : ", ranked by the time to train " +
                                            count(in.search->top_jobs.front().tokens) + " tokens") +
         "; the sections below show the best plan</p>";
  h += "<p class=\"degrees\" id=\"degrees\">" + html_escape(degrees(p.plan)) + "</p>";
  h += "<div class=\"figs\">";
  h += figure("step time (closed form)", secs(e.step_time_s) + " " + cost::band_label(p.band),
              "band " + secs(std::max(0.0, e.step_time_s * (1 - p.band.fraction))) + " - " +
                  secs(e.step_time_s * (1 + p.band.fraction)));
  h += figure("step time (simulated)", secs(r.step_time_s),
              "critical stage " + std::to_string(r.critical_stage));
  h += figure("throughput", count(e.tokens_per_s) + " tokens/s",
              tools::fmt("%.2f samples/s", e.samples_per_s));
  h += figure("MFU", pct(e.mfu), "HFU " + pct(e.hfu));
  h += figure("memory per GPU", gib(e.memory_per_gpu_bytes),
              "of " + gib(e.device_memory_bytes) + (e.fits ? " (fits)" : " (DOES NOT FIT)"));
  h += figure("host memory per server", gib(e.host_memory_per_server_bytes),
              "of " + gib(e.host_memory_capacity_bytes) + " pinnable");
  h += "</div></header>\n";
  return h;
}

}  // namespace

Json report_data(const ReportInput& in) {
  const PlanResults& p = in.plan;
  Json simulation = sim::sim_result_to_json(p.simulation);
  simulation["band"] = cost::band_to_json(p.band, p.simulation.step_time_s);
  Json j = {{"title", title(p)},
            {"model", p.model_name},
            {"cluster", p.cluster_name},
            {"device", p.device_name},
            {"gpus", p.gpus},
            {"plan", plan_to_json(p.plan)},
            {"estimate", cost::estimate_to_json(p.estimate)},
            {"band", cost::band_to_json(p.band, p.estimate.step_time_s)},
            {"simulation", simulation},
            {"timeline", timeline_data(p.simulation, in.max_timeline_events)},
            {"memory", memory_data(p)}};
  if (p.job) j["job"] = cost::time_to_train_to_json(*p.job);
  if (in.search) j["search"] = search_data(*in.search);
  return j;
}

std::string report_html(const ReportInput& in) {
  const Json data = report_data(in);
  std::string h;
  h += "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n";
  h += "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n";
  h += "<title>parasol report: " + html_escape(title(in.plan)) + "</title>\n";
  h += "<style>\n" + std::string(kPageStyle) + "</style>\n</head>\n";
  h += "<body data-rendered=\"no\" data-errors=\"0\">\n";
  h += "<script>\n" + std::string(kErrorCounter) + "</script>\n";
  h += header_html(in);
  h += kPageBody;
  if (in.plan.job) h += kJobBody;
  if (in.search) h += kSearchBody;
  h += "<footer>Generated by parasol. Self-contained: no network access; the data of the charts "
       "is inlined below.</footer>\n";
  h += "<script type=\"application/json\" id=\"parasol-data\">" + json_for_script(data) +
       "</script>\n";
  h += "<script>\n" + std::string(kPageScript) + "</script>\n</body>\n</html>\n";
  return h;
}

}  // namespace parasol::report
