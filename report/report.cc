// The HTML report: the data the page draws (report_data) and the page around it (report_html).
// See report.h.
#include "report/report.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <numeric>
#include <unordered_map>
#include <utility>

#include "core/error.h"
#include "core/format.h"
#include "report/html.h"
#include "report/page.h"

namespace parasol::report {

namespace {

// The colour class of a timeline event: communication by group ("tp comm"), copies, then the
// phase of a compute op ("fwd", "bwd", ...), else its kind.
std::string category(const traces::TraceEvent& e, const std::string& stream_name) {
  if (!e.group.empty()) return e.group + " comm";
  if (stream_name == "copy") return "copy";
  if (!e.phase.empty()) return e.phase;
  if (!e.kind.empty()) return e.kind;
  return "other";
}

int64_t ticks(double seconds) { return std::llround(seconds / kTimelineTick); }

// The timeline: rows, categories, names, the coarse spans of every op and the ops one by one
// (report.h documents the encoding).
Json timeline_data(const sim::SimResult& r, int draw_limit, int64_t max_detail_ops) {
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

  // The ops the simulator played: its host row's issue spans (one per op) are left out, so that
  // the page stays one event per op.
  std::vector<const traces::TraceEvent*> events;
  events.reserve(tr.events.size());
  for (const traces::TraceEvent& e : tr.events)
    if (e.kind != traces::kHostIssueKind) events.push_back(&e);

  // Rows: the (rank, stream) pairs that have events, by stage, then rank, then stream.
  std::vector<std::pair<int, int>> keys;
  for (const traces::TraceEvent* e : events) keys.emplace_back(e->rank, e->stream);
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

  // Every op in ticks, with its row, category and name as indices.
  struct Op {
    int64_t start, end;
    int category, name;
  };
  std::map<std::string, int> category_index;
  std::unordered_map<std::string, int> name_index;
  Json categories = Json::array(), names = Json::array();
  std::vector<std::vector<Op>> by_row(keys.size());
  double end_s = r.step_time_s;
  for (const traces::TraceEvent* ep : events) {
    const traces::TraceEvent& e = *ep;
    const std::string c = category(e, stream_name(e.rank, e.stream));
    auto [ci, c_added] = category_index.emplace(c, static_cast<int>(categories.size()));
    if (c_added) categories.push_back(c);
    auto [ni, n_added] = name_index.emplace(e.name, static_cast<int>(names.size()));
    if (n_added) names.push_back(e.name);
    const int64_t start = ticks(e.start_s);
    by_row[row_of[{e.rank, e.stream}]].push_back(
        {start, std::max(start, ticks(e.end_s())), ci->second, ni->second});
    end_s = std::max(end_s, e.end_s());
  }
  for (auto& ops : by_row)
    std::sort(ops.begin(), ops.end(), [](const Op& a, const Op& b) {
      return std::pair(a.start, a.end) < std::pair(b.start, b.end);
    });

  // Which ops are inlined one by one: all, or the longest max_detail_ops.
  const size_t total = events.size();
  const bool complete = max_detail_ops < 0 || total <= static_cast<size_t>(max_detail_ops);
  int64_t min_kept = 0;  // with a cap: ops shorter than this are left out,
  int64_t at_min = 0;    // and of those exactly this long, only the first at_min
  if (!complete) {
    std::vector<int64_t> durs;
    durs.reserve(total);
    for (const auto& ops : by_row)
      for (const Op& o : ops) durs.push_back(o.end - o.start);
    const auto nth = durs.begin() + (max_detail_ops - 1);
    std::nth_element(durs.begin(), nth, durs.end(), std::greater<>());
    min_kept = *nth;
    at_min = max_detail_ops -
             std::count_if(durs.begin(), durs.end(), [&](int64_t d) { return d > min_kept; });
  }
  Json detail_rows = Json::array();
  int64_t inlined = 0;
  for (const auto& ops : by_row) {
    Json flat = Json::array();
    int64_t prev_end = 0;
    for (const Op& o : ops) {
      const int64_t d = o.end - o.start;
      if (!complete && d <= min_kept) {
        if (d < min_kept || at_min == 0) continue;
        --at_min;
      }
      for (int64_t v : {o.start - prev_end, d, int64_t{o.category}, int64_t{o.name}})
        flat.push_back(v);
      prev_end = o.end;
      ++inlined;
    }
    detail_rows.push_back(std::move(flat));
  }

  // The coarse level: a row's ops merged while the gap to the next is under coarse_gap, the
  // merged spans cut at multiples of coarse_gap (so that the kind of each bin shows), each piece
  // with the busy time of its ops within it and the ops that start in it.
  const int64_t end_ticks = ticks(end_s);
  const int64_t coarse_gap = std::max<int64_t>(1, (end_ticks + kCoarseBins - 1) / kCoarseBins);
  Json coarse_rows = Json::array();
  for (const auto& ops : by_row) {
    Json flat = Json::array();
    int64_t prev_end = 0;
    size_t i = 0;
    while (i < ops.size()) {
      // One merged span [a, b) of ops [first, i).
      const size_t first = i;
      const int64_t a = ops[i].start;
      int64_t b = ops[i].end;
      for (; i < ops.size() && (i == first || ops[i].start - b < coarse_gap); ++i)
        b = std::max(b, ops[i].end);
      const int64_t bin0 = a / coarse_gap,
                    bins = std::max<int64_t>(1, (b - 1) / coarse_gap - bin0 + 1);
      std::vector<std::vector<int64_t>> busy(bins, std::vector<int64_t>(categories.size(), 0));
      std::vector<int64_t> started(bins, 0);
      for (size_t j = first; j < i; ++j) {
        const Op& o = ops[j];
        ++started[std::min(bins - 1, o.start / coarse_gap - bin0)];
        for (int64_t k = o.start / coarse_gap; k * coarse_gap < o.end; ++k)
          busy[k - bin0][o.category] +=
              std::min(o.end, (k + 1) * coarse_gap) - std::max(o.start, k * coarse_gap);
      }
      for (int64_t k = 0; k < bins; ++k) {
        const int64_t lo = std::max(a, (bin0 + k) * coarse_gap);
        const int64_t hi = std::max(lo, std::min(b, (bin0 + k + 1) * coarse_gap));
        const auto dominant = std::max_element(busy[k].begin(), busy[k].end());
        const int64_t total_busy = std::accumulate(busy[k].begin(), busy[k].end(), int64_t{0});
        for (int64_t v :
             {lo - prev_end, hi - lo, int64_t(dominant - busy[k].begin()), total_busy, started[k]})
          flat.push_back(v);
        prev_end = hi;
      }
    }
    coarse_rows.push_back(std::move(flat));
  }

  return {{"rows", rows},
          {"categories", categories},
          {"names", names},
          {"tick_s", kTimelineTick},
          {"step_time_s", r.step_time_s},
          {"end_s", end_s},
          {"total_events", total},
          {"draw_limit", draw_limit},
          {"coarse", {{"gap", coarse_gap}, {"rows", std::move(coarse_rows)}}},
          {"detail", {{"ops", inlined}, {"complete", complete}, {"rows", std::move(detail_rows)}}}};
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
              fmt("%.2f samples/s", e.samples_per_s));
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
            {"timeline", timeline_data(p.simulation, in.max_timeline_events, in.max_detail_ops)},
            {"memory", memory_data(p)}};
  if (p.job) j["job"] = cost::time_to_train_to_json(*p.job);
  if (in.search) j["search"] = search_data(*in.search);
  return j;
}

std::string report_html(const ReportInput& in) {
  Json data = report_data(in);
  // The ops one by one go in a block of their own, parsed only when the page zooms in.
  Json& detail = data["timeline"]["detail"];
  const Json ops = std::move(detail["rows"]);
  detail.erase("rows");
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
  h += "<script type=\"application/json\" id=\"parasol-ops\">" + json_for_script(ops) +
       "</script>\n";
  h += "<script>\n" + std::string(kChartHelpers) + "</script>\n";
  h += "<script>\n" + std::string(kPageScript) + "</script>\n</body>\n</html>\n";
  return h;
}

}  // namespace parasol::report
