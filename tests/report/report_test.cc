// The HTML report library: the page carries the lower floors' figures unchanged (the numbers of
// `estimate --json` and `simulate --json`, with a token count the "job" of `estimate --tokens
// --json`), escapes user strings, references nothing on the network, and its timeline, memory and
// search data match the results it was given (the timeline: every op, one by one and in the
// coarse spans of its level of detail).
#include "report/report.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <set>
#include <tuple>

#include "core/cluster.h"
#include "core/error.h"
#include "core/format.h"
#include "core/lower.h"
#include "core/model.h"
#include "report/html.h"
#include "tools/api.h"
#include "tools/job_flags.h"

namespace parasol::report {
namespace {

struct Fixture {
  Model model = model_preset("gpt2-124m");
  Cluster cluster = cluster_preset("dgx-a100-80g", 8);
  cost::Profile profile = cost::default_profile(cluster.gpu_device(0));
  Plan plan = [] {
    Plan p;
    p.tp = 2;
    p.pp = 2;
    p.dp = 2;
    p.micro_batch = 1;
    p.global_batch = 8;
    return p;
  }();
  // What tools/report_cmd.cc gathers: the estimate, the band, the simulation and liveness.
  PlanResults results() {
    validate(plan, model, cluster);
    PlanResults r;
    r.model_name = model.name;
    r.cluster_name = cluster.name;
    r.device_name = cluster.gpu_device(0).name;
    r.gpus = cluster.num_gpus();
    r.plan = plan;
    r.estimate = cost::estimate(model, cluster, plan, profile);
    r.band = cost::error_band(profile, model, cluster, plan);
    const LoweredPlan lowered = lower(model, cluster, plan);
    r.simulation = sim::simulate(model, cluster, lowered, profile, true);
    for (const Program& p : lowered.programs) r.stage_memory.push_back(liveness(p));
    return r;
  }
};

// The events the page draws: every op; the simulator's host row (traces::kHostIssueKind) is
// left out of the report.
std::vector<traces::TraceEvent> drawn_events(const traces::Trace& tr) {
  std::vector<traces::TraceEvent> ev;
  for (const traces::TraceEvent& e : tr.events)
    if (e.kind != traces::kHostIssueKind) ev.push_back(e);
  return ev;
}

// The text of the page's <script type="application/json" id="parasol-data"> block, parsed.
Json inlined_data(const std::string& html) {
  const std::string open = "<script type=\"application/json\" id=\"parasol-data\">";
  const size_t a = html.find(open);
  EXPECT_NE(a, std::string::npos);
  const size_t b = html.find("</script>", a);
  EXPECT_NE(b, std::string::npos);
  return Json::parse(html.substr(a + open.size(), b - a - open.size()));
}

size_t occurrences(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t i = s.find(what); i != std::string::npos; i = s.find(what, i + 1)) ++n;
  return n;
}

TEST(Report, CarriesTheLowerFloorsFiguresUnchanged) {
  Fixture f;
  ReportInput in;
  in.plan = f.results();
  const std::string html = report_html(in);
  const Json d = inlined_data(html);
  // The same objects as `estimate --json` and `simulate --json` print.
  EXPECT_EQ(d["estimate"], cost::estimate_to_json(in.plan.estimate));
  EXPECT_EQ(d["band"], cost::band_to_json(in.plan.band, in.plan.estimate.step_time_s));
  Json sim = sim::sim_result_to_json(in.plan.simulation);
  sim["band"] = cost::band_to_json(in.plan.band, in.plan.simulation.step_time_s);
  EXPECT_EQ(d["simulation"], sim);
  EXPECT_EQ(d["plan"], plan_to_json(f.plan));
  EXPECT_DOUBLE_EQ(d["estimate"]["step_time_s"].get<double>(), in.plan.estimate.step_time_s);
  // The header shows them formatted as the command line does, and the plan's degrees.
  EXPECT_NE(html.find(secs(in.plan.estimate.step_time_s) + " " + cost::band_label(in.plan.band)),
            std::string::npos);
  EXPECT_NE(html.find(secs(in.plan.simulation.step_time_s)), std::string::npos);
  EXPECT_NE(html.find("tp 2 · pp 2 · dp 2 · cp 1"), std::string::npos);
  EXPECT_NE(html.find("gpt2-124m on 8 x "), std::string::npos);
  EXPECT_FALSE(d.contains("search"));
  EXPECT_EQ(html.find("id=\"search\""), std::string::npos);
}

TEST(Report, MemoryIsTheLivenessOfEachStage) {
  Fixture f;
  ReportInput in;
  in.plan = f.results();
  const Json m = report_data(in)["memory"];
  ASSERT_EQ(m["stages"].size(), 2u);
  for (size_t s = 0; s < 2; ++s) {
    const Liveness& l = in.plan.stage_memory[s];
    EXPECT_EQ(m["stages"][s]["peak_bytes"].get<double>(), l.peak_bytes);
    EXPECT_EQ(m["stages"][s]["host_bytes"].get<double>(), l.host_bytes);
    for (int c = 0; c < 5; ++c)
      EXPECT_EQ(m["stages"][s]["peak_by_class_bytes"][c].get<double>(), l.peak_by_class[c]);
    // The simulator's own figure for the stage is the same liveness.
    EXPECT_EQ(l.peak_bytes, in.plan.simulation.peak_memory_per_stage[s]);
  }
  EXPECT_EQ(m["classes"][3], "activation");
  EXPECT_EQ(m["device_capacity_bytes"].get<double>(), in.plan.estimate.device_memory_bytes);
  EXPECT_EQ(m["host_capacity_bytes"].get<double>(), in.plan.estimate.host_memory_capacity_bytes);
}

// One decoded item of a timeline row (report.h: delta-encoded integer ticks).
struct Item {
  int64_t start, end, category, x, n;  // x: the name (ops) or the busy ticks (spans)
};
std::vector<std::vector<Item>> decode(const Json& rows, size_t stride) {
  std::vector<std::vector<Item>> out;
  for (const Json& flat : rows) {
    EXPECT_EQ(flat.size() % stride, 0u);
    std::vector<Item> items;
    int64_t t = 0;
    for (size_t j = 0; j + stride <= flat.size(); j += stride) {
      Item it;
      it.start = t + flat[j].get<int64_t>();
      it.end = it.start + flat[j + 1].get<int64_t>();
      it.category = flat[j + 2].get<int64_t>();
      it.x = flat[j + 3].get<int64_t>();
      it.n = stride > 4 ? flat[j + 4].get<int64_t>() : 1;
      t = it.end;
      items.push_back(it);
    }
    out.push_back(items);
  }
  return out;
}
int64_t ticks(double s) { return std::llround(s / kTimelineTick); }

TEST(Report, TimelineHasEveryOpOnARowOfItsStage) {
  Fixture f;
  ReportInput in;
  in.plan = f.results();
  const traces::Trace& tr = in.plan.simulation.trace;
  const std::vector<traces::TraceEvent> events = drawn_events(tr);
  ASSERT_FALSE(events.empty());
  ASSERT_LT(events.size(), tr.events.size());  // the host row is there, and left out
  const Json t = report_data(in)["timeline"];
  EXPECT_EQ(t["total_events"].get<size_t>(), events.size());
  EXPECT_EQ(t["detail"]["ops"].get<size_t>(), events.size());
  EXPECT_TRUE(t["detail"]["complete"].get<bool>());
  EXPECT_EQ(t["step_time_s"].get<double>(), in.plan.simulation.step_time_s);
  EXPECT_GE(t["end_s"].get<double>(), in.plan.simulation.step_time_s);
  EXPECT_EQ(t["draw_limit"].get<int>(), in.max_timeline_events);
  bool stage0 = false, stage1 = false;
  for (const Json& r : t["rows"]) {
    stage0 |= r["stage"] == 0;
    stage1 |= r["stage"] == 1;
    EXPECT_EQ(
        r["label"].get<std::string>().rfind("stage " + std::to_string(r["stage"].get<int>()), 0),
        0u);
  }
  EXPECT_TRUE(stage0 && stage1);
  // Every op of the trace is one op of its row, at its start and end in ticks, with its name
  // and (for communication) its group's category; each row sorted by start.
  const auto rows = decode(t["detail"]["rows"], 4);
  ASSERT_EQ(rows.size(), t["rows"].size());
  using Key = std::tuple<int, std::string, int64_t, int64_t, std::string>;
  std::multiset<std::pair<Key, std::string>> drawn;  // (rank, stream, start, end, name), category
  for (size_t r = 0; r < rows.size(); ++r) {
    for (size_t i = 0; i < rows[r].size(); ++i) {
      const Item& it = rows[r][i];
      if (i > 0) {
        EXPECT_LE(rows[r][i - 1].start, it.start);
      }
      drawn.emplace(Key(t["rows"][r]["rank"].get<int>(), t["rows"][r]["stream"], it.start, it.end,
                        t["names"][it.x].get<std::string>()),
                    t["categories"][it.category].get<std::string>());
    }
  }
  std::map<std::pair<int, int>, std::string> stream_name;
  for (const auto& s : tr.streams) stream_name[{s.rank, s.stream}] = s.name;
  for (const auto& e : events) {
    const std::string stream = stream_name.at({e.rank, e.stream});
    const Key key(e.rank, stream, ticks(e.start_s), ticks(e.end_s()), e.name);
    auto it = drawn.lower_bound({key, ""});
    ASSERT_TRUE(it != drawn.end() && it->first == key) << e.name;
    // The category: the group of a communication, else the phase of a compute op.
    if (!e.group.empty()) {
      EXPECT_EQ(it->second, e.group + " comm") << e.name;
    } else if (stream != "copy" && !e.phase.empty()) {
      EXPECT_EQ(it->second, e.phase) << e.name;
    }
    drawn.erase(it);
  }
  EXPECT_TRUE(drawn.empty());
}

TEST(Report, TimelineCoarseSpansCoverEveryOp) {
  Fixture f;
  ReportInput in;
  in.plan = f.results();
  const Json t = report_data(in)["timeline"];
  const int64_t gap = t["coarse"]["gap"].get<int64_t>();
  EXPECT_EQ(gap, (ticks(t["end_s"].get<double>()) + kCoarseBins - 1) / kCoarseBins);
  const auto spans = decode(t["coarse"]["rows"], 5);
  const auto ops = decode(t["detail"]["rows"], 4);
  ASSERT_EQ(spans.size(), ops.size());
  const size_t n_categories = t["categories"].size();
  for (size_t r = 0; r < ops.size(); ++r) {
    const std::vector<Item>& sp = spans[r];
    // Pieces in order, each within one bin, apart by nothing (a bin boundary inside a merged
    // span) or by at least the coarse gap.
    for (size_t i = 0; i < sp.size(); ++i) {
      EXPECT_LE(sp[i].start, sp[i].end);
      if (sp[i].end > sp[i].start) {
        EXPECT_EQ(sp[i].start / gap, (sp[i].end - 1) / gap);
      }
      if (i > 0) {
        const int64_t apart = sp[i].start - sp[i - 1].end;
        EXPECT_TRUE(apart >= gap || (apart == 0 && sp[i].start % gap == 0)) << apart;
      }
    }
    // Each piece holds the time of the ops within it, by category, and every op's time is in
    // the pieces.
    std::vector<std::vector<int64_t>> busy(sp.size(), std::vector<int64_t>(n_categories, 0));
    int64_t started = 0, n = 0;
    for (const Item& o : ops[r]) {
      // The first piece that ends after the op's start (or at it, for an op of no time).
      size_t i = std::lower_bound(sp.begin(), sp.end(), o.start,
                                  [](const Item& p, int64_t v) { return p.end < v; }) -
                 sp.begin();
      ASSERT_LT(i, sp.size());
      EXPECT_LE(sp[i].start, o.start);
      int64_t covered = 0;
      for (; i < sp.size() && sp[i].start < o.end; ++i) {
        const int64_t ov = std::min(o.end, sp[i].end) - std::max(o.start, sp[i].start);
        busy[i][o.category] += std::max<int64_t>(0, ov);
        covered += std::max<int64_t>(0, ov);
      }
      EXPECT_EQ(covered, o.end - o.start);
      ++started;
    }
    for (size_t i = 0; i < sp.size(); ++i) {
      EXPECT_EQ(sp[i].x, std::accumulate(busy[i].begin(), busy[i].end(), int64_t{0}));
      EXPECT_LE(sp[i].x, sp[i].end - sp[i].start);
      EXPECT_EQ(busy[i][sp[i].category], *std::max_element(busy[i].begin(), busy[i].end()));
      n += sp[i].n;
    }
    EXPECT_EQ(n, started);  // every op counted in one piece
  }
}

TEST(Report, TimelineInlinesTheLongestOpsWhenCapped) {
  Fixture f;
  ReportInput in;
  in.plan = f.results();
  in.max_detail_ops = 10;
  const std::vector<traces::TraceEvent> events = drawn_events(in.plan.simulation.trace);
  const Json t = report_data(in)["timeline"];
  EXPECT_EQ(t["detail"]["ops"].get<int64_t>(), 10);
  EXPECT_FALSE(t["detail"]["complete"].get<bool>());
  EXPECT_EQ(t["total_events"].get<size_t>(), events.size());
  std::vector<int64_t> durs;
  for (const auto& e : events) durs.push_back(ticks(e.end_s()) - ticks(e.start_s));
  std::sort(durs.rbegin(), durs.rend());
  std::vector<int64_t> kept;
  for (const auto& row : decode(t["detail"]["rows"], 4))
    for (const Item& o : row) kept.push_back(o.end - o.start);
  std::sort(kept.rbegin(), kept.rend());
  EXPECT_EQ(kept, std::vector<int64_t>(durs.begin(), durs.begin() + 10));
  // The coarse level still holds every op.
  int64_t n = 0;
  for (const auto& row : decode(t["coarse"]["rows"], 5))
    for (const Item& s : row) n += s.n;
  EXPECT_EQ(n, static_cast<int64_t>(events.size()));
}

TEST(Report, OpsGoInABlockOfTheirOwn) {
  Fixture f;
  ReportInput in;
  in.plan = f.results();
  const std::string html = report_html(in);
  const Json d = inlined_data(html);
  EXPECT_FALSE(d["timeline"]["detail"].contains("rows"));
  const std::string open = "<script type=\"application/json\" id=\"parasol-ops\">";
  const size_t a = html.find(open);
  ASSERT_NE(a, std::string::npos);
  const size_t b = html.find("</script>", a);
  EXPECT_EQ(Json::parse(html.substr(a + open.size(), b - a - open.size())),
            report_data(in)["timeline"]["detail"]["rows"]);
}

TEST(Report, EscapesUserStrings) {
  Fixture f;
  f.model.name = "<script>alert('x')</script>&co";
  ReportInput in;
  in.plan = f.results();
  in.plan.cluster_name = "\"><img onerror=alert(1)>";
  const std::string html = report_html(in);
  EXPECT_EQ(html.find("<script>alert"), std::string::npos);
  EXPECT_EQ(html.find("<img"), std::string::npos);
  EXPECT_NE(html.find("&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;&amp;co"), std::string::npos);
  // Only the page's own five scripts open (error counter, data, ops, chart helpers, page), and
  // each closes.
  EXPECT_EQ(occurrences(html, "<script"), 5u);
  EXPECT_EQ(occurrences(html, "</script>"), 5u);
  // The inlined JSON gives the names back as they were.
  const Json d = inlined_data(html);
  EXPECT_EQ(d["model"], f.model.name);
  EXPECT_EQ(d["cluster"], in.plan.cluster_name);
}

TEST(Report, ReferencesNothingOnTheNetwork) {
  Fixture f;
  ReportInput in;
  in.plan = f.results();
  const std::string html = report_html(in);
  EXPECT_EQ(html.find("https://"), std::string::npos);
  // The one "http://" is the SVG namespace name that createElementNS takes (never fetched).
  EXPECT_EQ(occurrences(html, "http://"), occurrences(html, "'http://www.w3.org/2000/svg'"));
  for (const char* s : {" src=", "<link", "@import", "url(", "<iframe", "fetch(", "XMLHttpRequest"})
    EXPECT_EQ(html.find(s), std::string::npos) << s;
  EXPECT_NE(html.find("<body data-rendered=\"no\" data-errors=\"0\">"), std::string::npos);
}

TEST(Report, TimeToTrainIsTheJobOfEstimateTokens) {
  Fixture f;
  ReportInput in;
  in.plan = f.results();
  cost::JobOptions opt;
  opt.tokens = 1e12;
  opt.price_per_gpu_hour = 2.5;
  opt.planned_per_day = 1;
  in.plan.job = cost::time_to_train(f.model, f.cluster, f.plan,
                                    tools::estimate_step(in.plan.estimate), f.profile, opt);
  const std::string html = report_html(in);
  const Json d = inlined_data(html);
  ASSERT_TRUE(d.contains("job"));
  EXPECT_EQ(d["job"], cost::time_to_train_to_json(*in.plan.job));
  // The same figures as `parasol estimate --tokens 1e12 --price-per-gpu-hour 2.5
  // --planned-per-day 1 --json` prints under "job" for this plan.
  const Json est = tools::estimate_request({{"model", "gpt2-124m"},
                                            {"cluster", "dgx-a100-80g"},
                                            {"gpus", 8},
                                            {"tp", 2},
                                            {"pp", 2},
                                            {"dp", 2},
                                            {"mbs", 1},
                                            {"gbs", 8},
                                            {"tokens", 1e12},
                                            {"price_per_gpu_hour", 2.5},
                                            {"planned_per_day", 1}});
  EXPECT_EQ(d["job"], est["job"]);
  EXPECT_EQ(d["estimate"]["step_time_s"], est["step_time_s"]);
  // Every part of the goodput bar is there (the page draws one segment per non-zero part).
  for (const char* k : {"productive", "checkpoint", "lost_work", "restart", "planned_restart"})
    EXPECT_GT(d["job"]["breakdown_s"][k].get<double>(), 0) << k;
  EXPECT_EQ(d["job"]["cost"].get<double>(), in.plan.job->cost);
  EXPECT_EQ(occurrences(html, "<section id=\"job\">"), 1u);
  EXPECT_EQ(occurrences(html, "<script"), 5u);
}

TEST(Report, NoTimeToTrainWithoutTokens) {
  Fixture f;
  ReportInput in;
  in.plan = f.results();
  const std::string html = report_html(in);
  EXPECT_FALSE(inlined_data(html).contains("job"));
  EXPECT_EQ(html.find("id=\"job\""), std::string::npos);
  EXPECT_EQ(html.find("<h2>Time to train"), std::string::npos);
}

TEST(Report, SearchSectionCarriesTheSearchResult) {
  Fixture f;
  sim::SearchOptions opt;
  opt.global_batch = 16;
  opt.top_k = 5;
  opt.threads = 1;
  SearchResults s;
  s.result = sim::search(f.model, f.cluster, f.profile, opt);
  s.global_batch = 16;
  ASSERT_FALSE(s.result.top.empty());
  for (const auto& c : s.result.top)
    s.top_bands.push_back(cost::error_band(f.profile, f.model, f.cluster, c.plan));
  ReportInput in;
  f.plan = s.result.top.front().plan;
  in.plan = f.results();
  in.search = s;
  const std::string html = report_html(in);
  const Json d = inlined_data(html)["search"];
  ASSERT_EQ(d["top"].size(), s.result.top.size());
  ASSERT_EQ(d["pareto"].size(), s.result.pareto.size());
  for (size_t i = 0; i < s.result.top.size(); ++i) {
    EXPECT_EQ(d["top"][i]["estimate"], cost::estimate_to_json(s.result.top[i].estimate));
    EXPECT_EQ(d["top"][i]["plan"], plan_to_json(s.result.top[i].plan));
  }
  for (size_t i = 0; i < s.result.pareto.size(); ++i)
    EXPECT_EQ(d["pareto"][i]["tokens_per_s"].get<double>(),
              s.result.pareto[i].estimate.tokens_per_s);
  EXPECT_EQ(d["enumerated"].get<int64_t>(), s.result.enumerated);
  EXPECT_NE(html.find("id=\"search\""), std::string::npos);
  EXPECT_NE(html.find("the best of " + count(s.result.enumerated) + " plans"), std::string::npos);

  EXPECT_FALSE(d["top"][0].contains("job"));

  // With the time to train of each top plan: each row carries its own.
  cost::JobOptions job;
  job.tokens = 1e11;
  for (const auto& c : s.result.top)
    in.search->top_jobs.push_back(cost::time_to_train(
        f.model, f.cluster, c.plan, tools::estimate_step(c.estimate), f.profile, job));
  const Json dj = report_data(in)["search"];
  for (size_t i = 0; i < s.result.top.size(); ++i)
    EXPECT_EQ(dj["top"][i]["job"], cost::time_to_train_to_json(in.search->top_jobs[i]));
  EXPECT_NE(report_html(in).find("ranked by the time to train " + count(1e11) + " tokens"),
            std::string::npos);
  in.search->top_jobs.pop_back();
  try {
    report_data(in);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "report.search.top_jobs");
  }
  in.search->top_jobs.clear();

  in.search->top_bands.pop_back();
  try {
    report_data(in);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "report.search.top_bands");
  }
}

TEST(Html, EscapeAndScriptJson) {
  EXPECT_EQ(html_escape("a<b>&\"c'"), "a&lt;b&gt;&amp;&quot;c&#39;");
  const Json j = {{"name", "</script><!-- & -->"}, {"n", 3}};
  const std::string s = json_for_script(j);
  EXPECT_EQ(s.find_first_of("<>&"), std::string::npos);
  EXPECT_EQ(Json::parse(s), j);
}

}  // namespace
}  // namespace parasol::report
