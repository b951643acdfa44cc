// The whole-job flags of estimate, simulate and search through the parasol executable: --tokens
// reports the time to train with its goodput breakdown (--json carries it under "job"),
// --checkpoint-interval and --price-per-gpu-hour change it, search --tokens ranks by it,
// simulate's straggler flags report a step-time distribution, and bad values exit 2 naming the
// field.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <utility>

#include "tests/tools/run_parasol.h"

namespace {

using parasol::testing_cli::Result;
using parasol::testing_cli::run;
using Json = nlohmann::json;

const std::string kPlan = "--model llama3-8b --cluster dgx-h100 --gpus 64 --tp 8 --gbs 128";

Json json_of(const Result& r) {
  EXPECT_EQ(r.code, 0) << r.out;
  return Json::parse(r.out);
}

TEST(TimeToTrainCli, EstimateReportsTimeToTrain) {
  Result r = run("estimate " + kPlan + " --tokens 1e11 --price-per-gpu-hour 2");
  ASSERT_EQ(r.code, 0) << r.out;
  for (const char* s : {"time to train", "GPU-hours", "MWh", "cost", "goodput", "productive steps",
                        "checkpoint writes", "work lost to failures",
                        "restart and re-initialisation", "Daly's optimum", "MTBI"})
    EXPECT_NE(r.out.find(s), std::string::npos) << s << "\n" << r.out;
  const Json j = json_of(run("estimate " + kPlan + " --tokens 1e11 --price-per-gpu-hour 2 --json"));
  const Json& job = j["job"];
  EXPECT_GT(job["time_to_train_s"].get<double>(), 0);
  EXPECT_GT(job["goodput"].get<double>(), 0.5);
  EXPECT_LT(job["goodput"].get<double>(), 1);
  EXPECT_NEAR(job["cost"].get<double>(), 2 * job["gpu_hours"].get<double>(), 1e-6);
  EXPECT_EQ(job["checkpoint"]["interval_source"], "daly");
  for (const char* k : {"productive", "checkpoint", "lost_work", "restart"})
    EXPECT_TRUE(job["breakdown_s"].contains(k)) << k;
  // Without --tokens: no job.
  EXPECT_FALSE(json_of(run("estimate " + kPlan + " --json")).contains("job"));
}

TEST(TimeToTrainCli, CheckpointIntervalOverridesDaly) {
  const Json daly = json_of(run("estimate " + kPlan + " --tokens 1e11 --json"))["job"];
  const Json given =
      json_of(run("estimate " + kPlan + " --tokens 1e11 --checkpoint-interval 60 --json"))["job"];
  EXPECT_EQ(given["checkpoint"]["interval_source"], "given");
  EXPECT_LT(given["checkpoint"]["interval_s"].get<double>(), 70);
  // Daly's interval maximises goodput: a shorter one does worse.
  EXPECT_LT(given["goodput"].get<double>(), daly["goodput"].get<double>());
  // A slower storage makes checkpoints longer.
  const Json slow =
      json_of(run("estimate " + kPlan + " --tokens 1e11 --storage-GBps 1 --json"))["job"];
  EXPECT_GT(slow["checkpoint"]["write_s"].get<double>(),
            daly["checkpoint"]["write_s"].get<double>());
}

TEST(TimeToTrainCli, SimulateWithStragglers) {
  const Json j =
      json_of(run("simulate " + kPlan + " --tokens 1e11 --slow-rank 3 --slow-factor 1.3 --json"));
  EXPECT_GT(j["stragglers"]["mean_s"].get<double>(), j["step_time_s"].get<double>());
  EXPECT_NEAR(j["job"]["step_time_s"].get<double>(), j["stragglers"]["mean_s"].get<double>(),
              1e-12);
  Result r = run("simulate " + kPlan + " --rank-cv 0.05 --samples 20");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("20 sampled steps"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("p99"), std::string::npos) << r.out;
}

TEST(TimeToTrainCli, SearchRanksByTimeToTrain) {
  Result r =
      run("search --model llama3-8b --cluster dgx-h100 --gpus 16 --gbs 64 --top 3 "
          "--tokens 1e11");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("ranked by the time to train"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("train (days, goodput)"), std::string::npos) << r.out;
  const Json j =
      json_of(run("search --model llama3-8b --cluster dgx-h100 --gpus 16 --gbs 64 "
                  "--top 5 --tokens 1e11 --json"));
  double last = 0;
  for (const Json& row : j["top"]) {
    const double t = row["job"]["time_to_train_s"].get<double>();
    EXPECT_GE(t, last);
    last = t;
  }
}

// --simulate-top re-ranks its plans by the time to train from their simulated step (each
// row's simulated_job, whose step is the simulation's), and the Pareto front carries its key.
TEST(TimeToTrainCli, SimulatedPlansRankByTheirSimulatedTimeToTrain) {
  const Json j =
      json_of(run("search --model llama3-8b --cluster dgx-h100 --gpus 16 --gbs 64 "
                  "--top 5 --simulate-top 4 --tokens 1e11 --json"));
  double last = 0;
  int simulated = 0;
  for (const Json& row : j["top"]) {
    if (!row.contains("simulated_step_time_s")) break;
    ++simulated;
    const Json& job = row["simulated_job"];
    EXPECT_DOUBLE_EQ(job["step_time_s"].get<double>(), row["simulated_step_time_s"].get<double>());
    const double t = job["time_to_train_s"].get<double>();
    EXPECT_GE(t, last);
    last = t;
  }
  EXPECT_EQ(simulated, 4);
  ASSERT_FALSE(j["pareto"].empty());
  for (const Json& row : j["pareto"]) EXPECT_GT(row["job"]["time_to_train_s"].get<double>(), 0);
  Result r =
      run("search --model llama3-8b --cluster dgx-h100 --gpus 16 --gbs 64 --top 3 --simulate-top 2 "
          "--tokens 1e11");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find(", time to train "), std::string::npos) << r.out;
}

TEST(TimeToTrainCli, BadValuesNameTheField) {
  const std::pair<std::string, std::string> cases[] = {
      {"estimate " + kPlan + " --tokens -5", "--tokens"},  // the flag's own range check
      {"estimate " + kPlan + " --checkpoint-interval 100", "job.tokens"},
      {"estimate " + kPlan + " --tokens 1e9 --storage-GBps 0", "--storage-GBps"},
      {"simulate " + kPlan + " --slow-rank 64 --slow-factor 2", "stragglers.slow_rank"},
      {"estimate " + kPlan + " --tokens lots", "--tokens"},
  };
  for (const auto& [command, field] : cases) {
    Result r = run(command);
    EXPECT_EQ(r.code, 2) << command << "\n" << r.out;
    EXPECT_NE(r.out.find(field), std::string::npos) << command << "\n" << r.out;
  }
}

}  // namespace
