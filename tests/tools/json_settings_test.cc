// Tests of the command-line settings of JSON documents (tools/json_settings.h) and of
// `parasol accuracy --profile-set/--plan-set`, which measure what one term of the model does.
#include "tools/json_settings.h"

#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "core/error.h"
#include "tests/tools/run_parasol.h"

namespace parasol::tools {
namespace {

Json doc() {
  return Json::parse(R"({"clock": 0.9, "name": "a100",
                         "nccl": {"latency_us": {"ring": 5, "tree": 8}, "proto": "simple"},
                         "list": [1, 2, {"x": 3}]})");
}

TEST(JsonSettings, SetsNumbersStringsAndNestedKeys) {
  Json j = with_settings(
      doc(), {"clock=1", "name=h100", "nccl/proto=LL128", "list/2/x=7", "new/key=[1,2]"}, "flag");
  EXPECT_DOUBLE_EQ(j["clock"].get<double>(), 1.0);
  EXPECT_EQ(j["name"], "h100");
  EXPECT_EQ(j["nccl"]["proto"], "LL128");
  EXPECT_EQ(j["list"][2]["x"], 7);
  EXPECT_EQ(j["new"]["key"], Json::parse("[1,2]"));
  EXPECT_EQ(j["nccl"]["latency_us"]["ring"], 5);  // untouched
}

TEST(JsonSettings, ScalesEveryNumberOfASubtreeAndNothingElse) {
  Json j = with_settings(doc(), {"nccl*=0.5", "list*=10"}, "flag");
  EXPECT_DOUBLE_EQ(j["nccl"]["latency_us"]["ring"].get<double>(), 2.5);
  EXPECT_DOUBLE_EQ(j["nccl"]["latency_us"]["tree"].get<double>(), 4.0);
  EXPECT_EQ(j["nccl"]["proto"], "simple");
  EXPECT_DOUBLE_EQ(j["list"][0].get<double>(), 10);
  EXPECT_DOUBLE_EQ(j["list"][2]["x"].get<double>(), 30);
  EXPECT_DOUBLE_EQ(j["clock"].get<double>(), 0.9);
}

TEST(JsonSettings, LaterSettingsSeeEarlierOnes) {
  Json j = with_settings(doc(), {"clock=2", "clock*=3"}, "flag");
  EXPECT_DOUBLE_EQ(j["clock"].get<double>(), 6.0);
}

void expect_error(const std::string& setting, const std::string& words) {
  try {
    with_settings(doc(), {setting}, "accuracy.profile_set");
    ADD_FAILURE() << setting << " was accepted";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("accuracy.profile_set"), std::string::npos) << what;
    EXPECT_NE(what.find(words), std::string::npos) << what;
  }
}

TEST(JsonSettings, RejectsMalformedSettingsNamingTheFlag) {
  expect_error("clock", "KEY=VALUE");
  expect_error("=1", "empty key");
  expect_error("nccl//proto=1", "empty key");
  expect_error("missing*=2", "no key 'missing'");
  expect_error("clock*=fast", "not a number");
  expect_error("clock/x=1", "below a number");
  expect_error("list/9=1", "not an index");
}

using testing_cli::Result;
using testing_cli::run;

double step_time_of(const std::string& extra) {
  Result r = run(std::string("accuracy --json ") + PARASOL_TEST_DATA_DIR +
                 "/published/korthikanti2022.json " + extra);
  EXPECT_EQ(r.code, 0) << r.out;
  if (r.code != 0) return 0;
  return nlohmann::json::parse(r.out)["runs"][0]["predicted_s"].get<double>();
}

TEST(AccuracySettings, AProfileTermMovesThePredictionTheWayItShould) {
  const double base = step_time_of("");
  // A slower clock makes every kernel slower; halving the GEMM efficiency more so.
  EXPECT_GT(step_time_of("--profile-set sustained_clock*=0.5"), base * 1.3);
  EXPECT_GT(step_time_of("--profile-set gemm_efficiency*=0.5"), base * 1.3);
  // Setting the clock to what it is changes nothing.
  Result shown = run(std::string("accuracy --json ") + PARASOL_TEST_DATA_DIR +
                     "/published/korthikanti2022.json --profile-set sustained_clock*=1");
  ASSERT_EQ(shown.code, 0);
  EXPECT_DOUBLE_EQ(nlohmann::json::parse(shown.out)["runs"][0]["predicted_s"].get<double>(), base);
}

TEST(AccuracySettings, APlanSwitchChangesThePlansItIsValidFor) {
  // Korthikanti's first run recomputes every layer in full; without recompute it is faster.
  const double base = step_time_of("");
  EXPECT_LT(step_time_of("--plan-set recompute=none"), base * 0.9);
  // A switch that makes the plan invalid (tp 3 does not divide 64 heads) leaves it as published.
  EXPECT_DOUBLE_EQ(step_time_of("--plan-set tp=3"), base);
}

TEST(AccuracySettings, BadSettingsExitWithCode2NamingTheFlag) {
  const std::string suite =
      std::string("accuracy ") + PARASOL_TEST_DATA_DIR + "/published/korthikanti2022.json ";
  Result a = run(suite + "--profile-set sustained_clock");
  EXPECT_EQ(a.code, 2) << a.out;
  EXPECT_NE(a.out.find("accuracy.profile_set"), std::string::npos) << a.out;
  Result b = run(suite + "--profile-set no_such_term*=2");
  EXPECT_EQ(b.code, 2) << b.out;
  EXPECT_NE(b.out.find("no_such_term"), std::string::npos) << b.out;
  Result c = run(suite + "--profile-set sustained_clock=fast");
  EXPECT_EQ(c.code, 2) << c.out;
  EXPECT_NE(c.out.find("sustained_clock"), std::string::npos) << c.out;
}

}  // namespace
}  // namespace parasol::tools
