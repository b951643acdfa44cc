// The sweep's page (report/sweep_page.h) on small hand-made sweep documents: the grid that the
// heatmap's cells come from (one per point, x values by y values at the other axes' values), the
// cost-time Pareto front against a brute-force non-dominated set, escaping of hostile strings, a
// point without a plan, the document's checks, and that the page references nothing on the
// network. The cells drawn after load are counted in a browser by render_sweep_test.sh.
#include "report/sweep_page.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>

#include "core/error.h"

namespace parasol::report {
namespace {

// A row with a plan at `point` (with its "index"), training in `time_s` for `gpu_hours` (cost at
// `price` per GPU-hour, null without).
Json ok_row(int64_t index, Json point, double time_s, double gpu_hours, double price = 0) {
  return {{"index", index},
          {"point", std::move(point)},
          {"model", "m"},
          {"device", "H100-SXM"},
          {"gpus", 64},
          {"servers", 8},
          {"gbs", 256},
          {"seq", 4096},
          {"cluster", {{"generator", "rail"}, {"device", "H100-SXM"}, {"gpus_per_server", 8}}},
          {"status", "ok"},
          {"plan", "tp2 pp1 dp32 mbs2 zero1"},
          {"best_plan", {{"tp", 2}, {"pp", 1}, {"dp", 32}}},
          {"step_time_s", time_s / 1000},
          {"band", {{"fraction", 0.1}, {"validated", true}, {"low_s", 0.9}, {"high_s", 1.1}}},
          {"tokens_per_s", 1e9 / time_s},
          {"mfu", 0.4},
          {"memory_per_gpu_bytes", 4e10},
          {"train",
           {{"basis", "steady"},
            {"tokens", 1e9},
            {"time_s", time_s},
            {"gpu_hours", gpu_hours},
            {"energy_MWh", gpu_hours / 1000},
            {"cost", price > 0 ? Json(gpu_hours * price) : Json(nullptr)},
            {"price_per_gpu_hour", price}}}};
}

Json no_plan_row(int64_t index, Json point, const std::string& reason) {
  return {{"index", index},
          {"point", std::move(point)},
          {"model", "m"},
          {"device", "A100-80G"},
          {"gpus", 64},
          {"servers", 8},
          {"gbs", 256},
          {"seq", 4096},
          {"cluster", {{"generator", "rail"}}},
          {"status", "no_plan"},
          {"reason", reason}};
}

// device (3) x gpus_per_server (2) x nic_GBps (2): 12 points, index = (d * 2 + g) * 2 + n as
// tools/sweep.h numbers them. Point 3 has no plan; point 11 is not in the document (an unfinished
// journal). Times and GPU-hours have ties: 0 and 6 are equal on both, 4 as fast as 0 but dearer, 9
// as cheap as 1 but slower.
Json small_document(const std::string& model = "llama3-8b") {
  const Json devices = {"A100-80G", "H100-SXM", "B200"};
  const Json gps = {8, 72};
  const Json nics = {25.0, 50.0};
  const double time[12] = {100, 80, 120, 0, 100, 90, 100, 150, 60, 95, 40, 0};
  const double hours[12] = {50, 70, 40, 0, 55, 75, 50, 30, 90, 70, 200, 0};
  Json rows = Json::array();
  for (int64_t i = 0; i < 11; ++i) {
    Json point = {{"device", devices[i / 4]},
                  {"gpus_per_server", gps[(i / 2) % 2]},
                  {"nic_GBps", nics[i % 2]}};
    if (i == 3)
      rows.push_back(no_plan_row(i, point, "the cluster cannot hold <b>m</b>'s state & more"));
    else
      rows.push_back(ok_row(i, point, time[i], hours[i]));
  }
  // A row's integer 25 is the axis' 25.0 (JSON numbers compare by value).
  rows[4]["point"]["nic_GBps"] = 25;
  return {{"sweep",
           {{"model", model},
            {"cluster", "dgx-h100"},
            {"gpus", 64},
            {"gbs", 256},
            {"seq", 0},
            {"precision", "bf16"},
            {"tokens", nullptr},
            {"price_per_gpu_hour", 0.0},
            {"points", 12},
            {"axes",
             {{{"key", "device"}, {"values", devices}},
              {{"key", "gpus_per_server"}, {"values", gps}},
              {{"key", "nic_GBps"}, {"values", nics}}}}}},
          {"rows", rows}};
}

// The non-dominated rows with a plan, by brute force: no other row as fast and as cheap and
// better in one of them.
std::set<int64_t> brute_front(const Json& doc, const std::string& cost_key) {
  std::set<int64_t> front;
  for (const Json& p : doc["rows"]) {
    if (p["status"] != "ok") continue;
    const double pt = p["train"]["time_s"].get<double>(), pc = p["train"][cost_key].get<double>();
    bool dominated = false;
    for (const Json& q : doc["rows"]) {
      if (q["status"] != "ok") continue;
      const double qt = q["train"]["time_s"].get<double>(), qc = q["train"][cost_key].get<double>();
      if (qt <= pt && qc <= pc && (qt < pt || qc < pc)) dominated = true;
    }
    if (!dominated) front.insert(p["index"].get<int64_t>());
  }
  return front;
}

Json inlined(const std::string& html) {
  const std::string open = "<script type=\"application/json\" id=\"sweep-data\">";
  const size_t a = html.find(open);
  EXPECT_NE(a, std::string::npos);
  const size_t b = html.find("</script>", a);
  return Json::parse(html.substr(a + open.size(), b - a - open.size()));
}

size_t occurrences(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t i = s.find(what); i != std::string::npos; i = s.find(what, i + 1)) ++n;
  return n;
}

TEST(SweepPage, GridHasARowForEachPointOfTheDocument) {
  const Json doc = small_document();
  const std::vector<int64_t> grid = sweep_grid(doc);
  ASSERT_EQ(grid.size(), 12u);
  for (int64_t flat = 0; flat < 12; ++flat) {
    if (flat == 11) {
      EXPECT_EQ(grid[flat], -1) << "point 11 is not in the document";
      continue;
    }
    ASSERT_GE(grid[flat], 0) << flat;
    EXPECT_EQ(doc["rows"][grid[flat]]["index"], flat);
  }
}

TEST(SweepPage, DefaultHeatmapHasACellPerXAndYValue) {
  // The default heatmap: x = device (3 values), y = gpus_per_server (2), nic_GBps at its first
  // value: the grid's points (d, g, 0), six cells, each the row of that point.
  const Json doc = small_document();
  const std::vector<int64_t> grid = sweep_grid(doc);
  int cells = 0, no_plan = 0;
  for (int d = 0; d < 3; ++d)
    for (int g = 0; g < 2; ++g) {
      const int64_t k = grid[(d * 2 + g) * 2];
      ASSERT_GE(k, 0);
      const Json& row = doc["rows"][k];
      EXPECT_EQ(row["point"]["device"], doc["sweep"]["axes"][0]["values"][d]);
      EXPECT_EQ(row["point"]["gpus_per_server"], doc["sweep"]["axes"][1]["values"][g]);
      EXPECT_EQ(row["point"]["nic_GBps"].get<double>(), 25.0);
      ++cells;
      no_plan += row["status"] != "ok";
    }
  EXPECT_EQ(cells, 6);
  EXPECT_EQ(no_plan, 0);  // point 3 has nic_GBps 50
  // At nic_GBps 50 the cell of (A100-80G, 72) is the no-plan row, with its reason.
  const Json& row = doc["rows"][grid[(0 * 2 + 1) * 2 + 1]];
  EXPECT_EQ(row["status"], "no_plan");
  EXPECT_NE(row["reason"].get<std::string>().find("cannot hold"), std::string::npos);
  // The page inlines the same grid and the whole document.
  const Json d = inlined(sweep_html(doc));
  EXPECT_EQ(d["grid"].get<std::vector<int64_t>>(), grid);
  EXPECT_EQ(d["doc"], doc);
}

TEST(SweepPage, FrontIsTheNonDominatedSet) {
  const Json doc = small_document();
  EXPECT_EQ(sweep_cost_key(doc), "gpu_hours");
  const std::vector<int64_t> front = sweep_pareto_front(doc);
  const std::set<int64_t> expected = brute_front(doc, "gpu_hours");
  EXPECT_EQ(std::set<int64_t>(front.begin(), front.end()), expected);
  EXPECT_EQ(front.size(), expected.size());
  // By hand: 10 (fastest), 8, 1, 0 and 6 (tied), 2, 7 (cheapest); 4, 9, 5 are dominated.
  EXPECT_EQ(expected, (std::set<int64_t>{0, 1, 2, 6, 7, 8, 10}));
  // By time.
  EXPECT_EQ(front, (std::vector<int64_t>{10, 8, 1, 0, 6, 2, 7}));
  EXPECT_EQ(inlined(sweep_html(doc))["front"].get<std::vector<int64_t>>(), front);
}

TEST(SweepPage, FrontOfRandomDocumentsPricedAndNot) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 50; ++trial) {
    const bool priced = trial % 2 == 0;
    const int n = 1 + static_cast<int>(rng() % 60);
    // Few distinct values, so that ties are common.
    std::uniform_int_distribution<int> v(1, 8);
    Json values = Json::array();
    for (int i = 0; i < n; ++i) values.push_back(i);
    Json rows = Json::array();
    for (int i = 0; i < n; ++i) {
      if (rng() % 7 == 0) {
        rows.push_back(no_plan_row(i, {{"gpus", i}}, "no"));
        continue;
      }
      rows.push_back(ok_row(i, {{"gpus", i}}, v(rng) * 10.0, v(rng) * 3.0, priced ? 2.5 : 0));
    }
    const Json doc = {{"sweep", {{"axes", {{{"key", "gpus"}, {"values", values}}}}}},
                      {"rows", rows}};
    check_sweep_document(doc);
    const std::string key = sweep_cost_key(doc);
    bool any_ok = false;
    for (const Json& r : rows) any_ok = any_ok || r["status"] == "ok";
    EXPECT_EQ(key, priced && any_ok ? "cost" : "gpu_hours");
    const std::vector<int64_t> front = sweep_pareto_front(doc);
    EXPECT_EQ(std::set<int64_t>(front.begin(), front.end()), brute_front(doc, key)) << trial;
    EXPECT_TRUE(std::is_sorted(front.begin(), front.end(), [&](int64_t a, int64_t b) {
      return rows[a]["train"]["time_s"].get<double>() < rows[b]["train"]["time_s"].get<double>();
    }));
  }
}

TEST(SweepPage, OneUnpricedPointMakesGpuHoursTheCost) {
  Json doc = small_document();
  for (Json& r : doc["rows"])
    if (r["status"] == "ok") r["train"]["cost"] = r["train"]["gpu_hours"].get<double>() * 3;
  EXPECT_EQ(sweep_cost_key(doc), "cost");
  doc["rows"][5]["train"]["cost"] = nullptr;
  EXPECT_EQ(sweep_cost_key(doc), "gpu_hours");
}

TEST(SweepPage, EscapesHostileStrings) {
  Json doc = small_document("<script>alert('x')</script>\"&co");
  doc["sweep"]["cluster"] = "\"><img onerror=alert(1)>";
  const std::string html = sweep_html(doc);
  EXPECT_EQ(html.find("<script>alert"), std::string::npos);
  EXPECT_EQ(html.find("<img"), std::string::npos);
  EXPECT_EQ(html.find("<b>m</b>"), std::string::npos);  // the no-plan row's reason
  EXPECT_NE(html.find("&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;&quot;&amp;co"),
            std::string::npos);
  EXPECT_NE(html.find("&quot;&gt;&lt;img onerror=alert(1)&gt;"), std::string::npos);
  // Only the page's own scripts open, and each closes.
  EXPECT_EQ(occurrences(html, "<script"), 4u);  // error counter, data, chart helpers, page
  EXPECT_EQ(occurrences(html, "</script>"), 4u);
  // The inlined document gives the strings back as they were.
  const Json d = inlined(html);
  EXPECT_EQ(d["doc"]["sweep"]["model"], doc["sweep"]["model"]);
  EXPECT_EQ(d["doc"]["rows"][3]["reason"], doc["rows"][3]["reason"]);
}

TEST(SweepPage, HeaderSaysPointsPlansAndBasis) {
  Json doc = small_document();
  std::string html = sweep_html(doc);
  EXPECT_NE(html.find("data-points=\"12\" data-ok=\"10\""), std::string::npos);
  EXPECT_NE(html.find("1 not in the document"), std::string::npos);
  EXPECT_NE(html.find("of 1B tokens at the steady step"), std::string::npos);
  EXPECT_NE(html.find("GPU-hours stand for cost"), std::string::npos);
  doc["sweep"]["tokens"] = 15e12;
  html = sweep_html(doc);
  EXPECT_NE(html.find("the --tokens count, 15T tokens"), std::string::npos);
}

TEST(SweepPage, ReferencesNothingOnTheNetwork) {
  const std::string html = sweep_html(small_document());
  EXPECT_EQ(html.find("https://"), std::string::npos);
  EXPECT_EQ(occurrences(html, "http://"), occurrences(html, "'http://www.w3.org/2000/svg'"));
  for (const char* s : {" src=", "<link", "@import", "<iframe", "fetch(", "XMLHttpRequest"})
    EXPECT_EQ(html.find(s), std::string::npos) << s;
  // url() only of the page's own SVG definitions (the hatching, the scale's gradient).
  EXPECT_EQ(occurrences(html, "url("), occurrences(html, "url(#"));
  EXPECT_NE(html.find("<body data-rendered=\"no\" data-errors=\"0\">"), std::string::npos);
}

TEST(SweepPage, ChecksTheDocument) {
  auto throws_naming = [](const Json& doc, const std::string& field) {
    try {
      sweep_html(doc);
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
      return;
    }
    ADD_FAILURE() << "no error naming " << field;
  };
  throws_naming(Json::object(), "report.sweep");
  throws_naming(Json{{"sweep", Json::object()}, {"rows", Json::array()}},
                "report.sweep.sweep.axes");
  Json doc = small_document();
  doc["rows"][0]["train"].erase("time_s");
  throws_naming(doc, "report.sweep.rows[0].train.time_s");
  doc = small_document();
  doc["rows"][1].erase("index");
  throws_naming(doc, "report.sweep.rows[1].index");
  doc = small_document();
  doc["sweep"]["axes"][1]["values"] = Json::array();
  throws_naming(doc, "report.sweep.sweep.axes[1].values");
  // A no-plan row needs none of the figures; a sweep without axes is one point.
  doc = small_document();
  doc["sweep"]["axes"] = Json::array();
  doc["rows"] = Json::array({no_plan_row(0, Json::object(), "none fits")});
  EXPECT_EQ(sweep_grid(doc), std::vector<int64_t>{0});
  EXPECT_TRUE(sweep_pareto_front(doc).empty());
  EXPECT_NO_THROW(sweep_html(doc));
}

}  // namespace
}  // namespace parasol::report
