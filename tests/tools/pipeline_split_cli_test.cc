// Published uneven pipeline splits through the parasol executable: Qwen3-235B (94 layers) on pp 8
// with Megatron's --account-for-embedding/loss-in-pipeline-split, and DeepSeek-V3 (61 layers) on
// pp 8, whose 61 + 2 slots Megatron cannot split that way, with the layout that gives the
// embedding and the loss a layer's slot each. Each plan estimates, simulates, exports to
// Megatron-LM and imports back (`--plan launch_megatron.sh`) to the same plan and predictions.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "tests/tools/run_parasol.h"

namespace parasol {
namespace {

using testing_cli::Result;
using testing_cli::run;
using Json = nlohmann::json;

Json json_of(const std::string& args) {
  const Result r = run(args);
  EXPECT_EQ(r.code, 0) << args << "\n" << r.out;
  if (r.code != 0) return Json::object();
  return Json::parse(r.out);
}

// The plan JSON without the references to the model, cluster and GPU count (an imported job
// names its model after the file).
Json plan_only(Json plan) {
  for (const char* k : {"model", "cluster", "gpus"}) plan.erase(k);
  return plan;
}

struct Case {
  std::string name;
  std::string target;  // --model --cluster --gpus
  std::string plan;    // the plan flags
};

std::string out_dir(const std::string& name) {
  const std::string dir =
      (::testing::TempDir().empty() ? std::string("/tmp/") : ::testing::TempDir()) +
      "pipeline_split_" + name;
  std::filesystem::remove_all(dir);
  return dir;
}

TEST(PipelineSplitCli, EstimateSimulateExportAndImportBack) {
  const std::vector<Case> cases = {
      {"qwen3_235b_accounted", "--model qwen3-235b-a22b --cluster dgx-h100 --gpus 64",
       "--tp 4 --pp 8 --ep 8 --etp 1 --sp --zero 1 --gbs 16 --p2p-sync --moe-probs-in-experts "
       "--account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split"},
      {"qwen3_235b_accounted_vpp4", "--model qwen3-235b-a22b --cluster dgx-h100 --gpus 64",
       "--tp 4 --pp 8 --vpp 4 --ep 8 --etp 1 --sp --zero 1 --gbs 16 --moe-probs-in-experts "
       "--account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split"},
      {"deepseek_v3_layout", "--model deepseek-v3 --cluster dgx-h100 --gpus 256",
       "--pp 8 --ep 32 --zero 1 --gbs 256 --stage-layers 7,8,8,8,8,8,8,6 --p2p-sync "
       "--moe-probs-in-experts"},
  };
  // Without virtual stages Megatron syncs after every pipeline exchange (--p2p-sync), and its
  // experts apply the router's probabilities (--moe-probs-in-experts): the plans say so, as the
  // import reads them back.
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const Json est = json_of("estimate --json " + c.target + " " + c.plan);
    ASSERT_TRUE(est.contains("plan"));
    EXPECT_GT(est["step_time_s"].get<double>(), 0);
    const Json sim = json_of("simulate --json " + c.target + " " + c.plan);
    ASSERT_TRUE(sim.contains("step_time_s"));
    EXPECT_EQ(sim["stages"].size(), 8u);
    // The closed form and the simulator play the same per-stage layers: they agree within the
    // one-model band (tests/sim/one_model_test.cc).
    EXPECT_NEAR(sim["step_time_s"].get<double>() / est["step_time_s"].get<double>(), 1.0, 0.02);

    const std::string dir = out_dir(c.name);
    const Result e = run("export --to megatron " + c.target + " " + c.plan + " -o " + dir);
    ASSERT_EQ(e.code, 0) << e.out;
    const std::string launch = dir + "/launch_megatron.sh";
    ASSERT_TRUE(std::filesystem::exists(launch));
    // Imported back: the same plan, the same estimate and simulation.
    const Json est_back = json_of("estimate --json --cluster dgx-h100 --plan " + launch);
    EXPECT_EQ(plan_only(est_back["plan"]), plan_only(est["plan"]));
    EXPECT_DOUBLE_EQ(est_back["step_time_s"].get<double>(), est["step_time_s"].get<double>());
    const Json sim_back = json_of("simulate --json --cluster dgx-h100 --plan " + launch);
    EXPECT_DOUBLE_EQ(sim_back["step_time_s"].get<double>(), sim["step_time_s"].get<double>());
  }
}

TEST(PipelineSplitCli, DeepSeekV3CannotAccountForTheEmbeddingAndLossAtPp8) {
  const Result r =
      run("estimate --model deepseek-v3 --cluster dgx-h100 --gpus 256 --pp 8 --ep 32 --gbs 256 "
          "--account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("plan.account_for_embedding_in_pipeline_split"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("(63) do not split evenly over pp 8"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace parasol
