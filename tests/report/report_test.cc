// The HTML report library: the page carries the lower floors' figures unchanged (the numbers of
// `estimate --json` and `simulate --json`, with a token count the "job" of `estimate --tokens
// --json`), escapes user strings, references nothing on the network, and its timeline, memory and
// search data match the results it was given.
#include "report/report.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "core/cluster.h"
#include "core/error.h"
#include "core/lower.h"
#include "core/model.h"
#include "report/html.h"
#include "tools/api.h"
#include "tools/format.h"
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
  EXPECT_NE(
      html.find(tools::secs(in.plan.estimate.step_time_s) + " " + cost::band_label(in.plan.band)),
      std::string::npos);
  EXPECT_NE(html.find(tools::secs(in.plan.simulation.step_time_s)), std::string::npos);
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

TEST(Report, TimelineHasEveryOpOnARowOfItsStage) {
  Fixture f;
  ReportInput in;
  in.plan = f.results();
  const traces::Trace& tr = in.plan.simulation.trace;
  ASSERT_FALSE(tr.events.empty());
  const Json t = report_data(in)["timeline"];
  ASSERT_EQ(t["events"].size(), tr.events.size());
  EXPECT_EQ(t["total_events"].get<size_t>(), tr.events.size());
  bool stage0 = false, stage1 = false;
  for (const Json& r : t["rows"]) {
    stage0 |= r["stage"] == 0;
    stage1 |= r["stage"] == 1;
    EXPECT_EQ(
        r["label"].get<std::string>().rfind("stage " + std::to_string(r["stage"].get<int>()), 0),
        0u);
  }
  EXPECT_TRUE(stage0 && stage1);
  for (size_t i = 0; i < tr.events.size(); ++i) {
    const Json& e = t["events"][i];
    const Json& row = t["rows"][e[0].get<size_t>()];
    EXPECT_EQ(row["rank"].get<int>(), tr.events[i].rank);
    EXPECT_EQ(e[1].get<double>(), tr.events[i].start_s);
    EXPECT_EQ(e[2].get<double>(), tr.events[i].dur_s);
    EXPECT_EQ(e[4].get<std::string>(), tr.events[i].name);
    if (!tr.events[i].group.empty()) {
      EXPECT_EQ(t["categories"][e[3].get<size_t>()], tr.events[i].group + " comm");
    }
  }
}

TEST(Report, TimelineKeepsTheLongestOpsWhenCapped) {
  Fixture f;
  ReportInput in;
  in.plan = f.results();
  in.max_timeline_events = 10;
  const traces::Trace& tr = in.plan.simulation.trace;
  const Json t = report_data(in)["timeline"];
  ASSERT_EQ(t["events"].size(), 10u);
  EXPECT_EQ(t["total_events"].get<size_t>(), tr.events.size());
  std::vector<double> durs;
  for (const auto& e : tr.events) durs.push_back(e.dur_s);
  std::sort(durs.rbegin(), durs.rend());
  double kept_min = 1e300;
  for (const Json& e : t["events"]) kept_min = std::min(kept_min, e[2].get<double>());
  EXPECT_EQ(kept_min, durs[9]);
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
  // Only the page's own three scripts open, and each closes.
  EXPECT_EQ(occurrences(html, "<script"), 3u);
  EXPECT_EQ(occurrences(html, "</script>"), 3u);
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
  EXPECT_EQ(occurrences(html, "<script"), 3u);
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
  EXPECT_NE(html.find("the best of " + tools::count(s.result.enumerated) + " plans"),
            std::string::npos);

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
  EXPECT_NE(report_html(in).find("ranked by the time to train " + tools::count(1e11) + " tokens"),
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
