// The accuracy bars of tests/data/accuracy_bars.json, held in CI for both predictors: the
// closed-form estimate and the event simulator (sim/predict.h), on every suite in
// tests/data/published/. Per family: mean |error| and |bias| (the signed mean error); overall:
// mean |error|; per suite: the bars a published competitor reached. A figure above its target
// has a ceiling (it may not get worse), and the ceiling must go once the target is met.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "core/json_reader.h"
#include "cost_models/accuracy.h"
#include "sim/predict.h"

namespace parasol {
namespace {

const std::string kDataDir = PARASOL_TEST_DATA_DIR;

std::vector<std::string> suite_files() {
  std::vector<std::string> files;
  for (const auto& e : std::filesystem::directory_iterator(kDataDir + "/published"))
    if (e.path().extension() == ".json") files.push_back(e.path().string());
  std::sort(files.begin(), files.end());
  return files;
}

const Json& bars() {
  static const Json j = read_json_file(kDataDir + "/accuracy_bars.json");
  return j;
}

cost::Predictor predictor(const std::string& name) {
  if (name == "estimate") return {};
  return [](const Model& m, const Cluster& c, const Plan& p, cost::Reserved reserved) {
    return sim::simulate_prediction(m, c, p, cost::default_profile(c.gpu_device(0)), reserved);
  };
}

// Checks `value` against `target`, or against the ceiling the entry sets for `predictor`.
void check(const std::string& what, const Json& entry, const std::string& pred,
           const std::string& field, double value, double target) {
  const Json::json_pointer ceiling("/ceiling/" + pred + "/" + field);
  if (entry.contains(ceiling)) {
    const double c = entry.at(ceiling).get<double>();
    EXPECT_LE(value, c) << pred << ": " << what << " " << field << " got worse than its ceiling";
    EXPECT_GT(value, target) << pred << ": " << what << " " << field << " = " << value
                             << " meets its target " << target
                             << ": remove the ceiling from accuracy_bars.json";
  } else {
    EXPECT_LE(value, target) << pred << ": " << what << " " << field;
  }
}

class AccuracyBars : public ::testing::TestWithParam<std::string> {};

TEST_P(AccuracyBars, EveryFamilyMeetsItsBars) {
  const std::string pred = GetParam();
  std::vector<cost::PublishedRun> runs;
  for (const std::string& f : suite_files()) {
    auto more = cost::read_accuracy_suite(read_json_file(f), f);
    runs.insert(runs.end(), more.begin(), more.end());
  }
  const cost::AccuracyReport r = cost::run_accuracy(runs, predictor(pred));
  const Json& b = bars();
  const double mean_bar = b["target"]["mean_abs_error"].get<double>();
  const double bias_bar = b["target"]["abs_bias"].get<double>();
  ASSERT_FALSE(r.families.empty());
  for (const cost::FamilyStats& f : r.families) {
    ASSERT_TRUE(b["families"].contains(f.family)) << "no bars for family " << f.family;
    const Json& entry = b["families"][f.family];
    check(f.family, entry, pred, "mean_abs_error", f.stats.mean_abs_error, mean_bar);
    check(f.family, entry, pred, "abs_bias", std::fabs(f.stats.mean_error), bias_bar);
    EXPECT_EQ(f.stats.not_fitting, 0) << pred << ": " << f.family << " runs that ran do not fit";
  }
  check("overall", b["overall"], pred, "mean_abs_error", r.overall.mean_abs_error,
        b["overall"]["mean_abs_error"].get<double>());
}

TEST_P(AccuracyBars, SuitesMeetTheirCompetitorsBars) {
  const std::string pred = GetParam();
  for (auto it = bars()["suites"].begin(); it != bars()["suites"].end(); ++it) {
    const std::string path = kDataDir + "/published/" + it.key();
    const cost::AccuracyReport r =
        cost::run_accuracy(cost::read_accuracy_suite(read_json_file(path), path), predictor(pred));
    EXPECT_LT(r.overall.mean_abs_error, it.value()["mean_abs_error"].get<double>())
        << pred << ": " << it.key();
    EXPECT_LT(r.overall.max_abs_error, it.value()["max_abs_error"].get<double>())
        << pred << ": " << it.key();
  }
}

INSTANTIATE_TEST_SUITE_P(Predictors, AccuracyBars, ::testing::Values("estimate", "simulate"));

}  // namespace
}  // namespace parasol
