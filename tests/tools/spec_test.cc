// Tests of the plan flags (tools/spec.h): the JSON overlay they make of a plan file, every new
// plan flag reaching the plan through the parasol binary, booleans bare and with a value, flags
// overriding a plan file, bad values exiting 2 naming the field; and the error bands, overlap
// and host-memory lines of estimate, simulate and search.
#include "tools/spec.h"

#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "core/error.h"
#include "tests/tools/run_parasol.h"

namespace parasol::tools {
namespace {

using testing_cli::Result;
using testing_cli::run;

std::string temp_path(const std::string& name) {
  return (testing::TempDir().empty() ? std::string("/tmp/") : testing::TempDir()) + name;
}

// `estimate --json` of a plan on 16 H100s: the plan as the estimate saw it.
const std::string kTarget = "--model llama3-8b --cluster dgx-h100 --gpus 16 --tp 2 --pp 2 --gbs 64";
// Without a pipeline, where either accounting switch alone is a valid plan.
const std::string kNoPipelineTarget =
    "--model llama3-8b --cluster dgx-h100 --gpus 2 --tp 2 --gbs 64";
const std::string kMoeTarget =
    "--model mixtral-8x7b --cluster dgx-h100 --gpus 16 --tp 2 --pp 2 --gbs 64";

Json estimate_json(const std::string& args) {
  Result r = run("estimate --json " + args);
  EXPECT_EQ(r.code, 0) << args << "\n" << r.out;
  if (r.code != 0) return Json::object();
  return Json::parse(r.out);
}

// --- the overlay, without the binary ---------------------------------------------------------

TEST(SpecOverlay, FlagsSetTheirPlanKeysOverTheFile) {
  SpecOptions o;
  o.tp = 4;
  o.sp = true;
  o.reshard = "after_step";
  o.shard_degree = 8;
  o.grad_reduce_dtype = "bf16";
  o.tp_comm_overlap = true;
  o.ep_comm_overlap = false;
  o.stage_layers = "4,6,6,4";
  o.etp = 1;
  o.attention_kernel = "cudnn";
  o.mbs = 2;
  o.flash = false;
  const Json file = {{"tp", 8}, {"pp", 4}, {"zero", 3}, {"reshard", "after_forward"}, {"gbs", 512}};
  const Json j = plan_overlay(o, file);
  EXPECT_EQ(j["tp"], 4);
  EXPECT_EQ(j["pp"], 4);  // the file's
  EXPECT_EQ(j["zero"], 3);
  EXPECT_EQ(j["gbs"], 512);
  EXPECT_EQ(j["sp"], true);
  EXPECT_EQ(j["reshard"], "after_step");
  EXPECT_EQ(j["shard_degree"], 8);
  EXPECT_EQ(j["grad_reduce_dtype"], "bf16");
  EXPECT_EQ(j["tp_comm_overlap"], true);
  EXPECT_EQ(j["ep_comm_overlap"], false);
  EXPECT_EQ(j["stage_layers"], Json({4, 6, 6, 4}));
  EXPECT_EQ(j["etp"], 1);
  EXPECT_EQ(j["attention_kernel"], "cudnn");
  EXPECT_EQ(j["mbs"], 2);
  EXPECT_EQ(j["flash_attention"], false);
  EXPECT_FALSE(j.contains("dp"));  // left to load_spec
  const Plan p = plan_from_json(j);
  EXPECT_EQ(p.tp, 4);
  EXPECT_EQ(p.reshard, Reshard::kAfterStep);
  EXPECT_EQ(p.shard_degree, 8);
  EXPECT_EQ(p.grad_reduce_dtype, Dtype::kBf16);
  EXPECT_TRUE(p.tp_comm_overlap);
  EXPECT_EQ(p.stage_layers, (std::vector<int>{4, 6, 6, 4}));
  EXPECT_EQ(p.etp, 1);
  EXPECT_EQ(p.attention_kernel, AttentionKernel::kCudnn);
}

TEST(SpecOverlay, VppImpliesInterleavedUnlessAScheduleIsGiven) {
  SpecOptions o;
  o.vpp = 2;
  const Json file = {{"pp", 4}, {"schedule", "1f1b"}};
  EXPECT_EQ(plan_overlay(o, file)["schedule"], "interleaved");
  EXPECT_EQ(plan_overlay(o, Json::object())["schedule"], "interleaved");
  o.schedule = "gpipe";
  EXPECT_EQ(plan_overlay(o, file)["schedule"], "gpipe");
  SpecOptions one;
  one.vpp = 1;
  EXPECT_EQ(plan_overlay(one, file)["schedule"], "1f1b");
}

TEST(SpecOverlay, ALayoutFlagReplacesTheFilesOtherLayout) {
  const Json first_last = {{"pp", 4}, {"first_stage_layers", 6}, {"last_stage_layers", 6}};
  SpecOptions o;
  o.stage_layers = "8,8,8,8";
  Json j = plan_overlay(o, first_last);
  EXPECT_FALSE(j.contains("first_stage_layers"));
  EXPECT_FALSE(j.contains("last_stage_layers"));
  EXPECT_NO_THROW(plan_from_json(j));
  const Json stages = {{"pp", 4}, {"stage_layers", {8, 8, 8, 8}}};
  SpecOptions f;
  f.first_stage_layers = 6;
  j = plan_overlay(f, stages);
  EXPECT_FALSE(j.contains("stage_layers"));
  EXPECT_EQ(plan_from_json(j).first_stage_layers, 6);
  // Both forms on the command line: plan_from_json refuses.
  f.stage_layers = "8,8,8,8";
  EXPECT_THROW(plan_from_json(plan_overlay(f, Json::object())), Error);
  // Megatron's embedding/loss accounting replaces the file's counts or list, and either of
  // those replaces the file's accounting.
  SpecOptions a;
  a.account_for_loss = true;
  j = plan_overlay(a, first_last);
  EXPECT_FALSE(j.contains("first_stage_layers"));
  EXPECT_EQ(j["account_for_loss_in_pipeline_split"], true);
  EXPECT_FALSE(plan_overlay(a, stages).contains("stage_layers"));
  const Json accounted = {{"pp", 4}, {"account_for_embedding_in_pipeline_split", true}};
  j = plan_overlay(o, accounted);
  EXPECT_FALSE(j.contains("account_for_embedding_in_pipeline_split"));
  EXPECT_EQ(j["stage_layers"], Json({8, 8, 8, 8}));
  // A switch set false keeps the file's layout.
  SpecOptions off;
  off.account_for_loss = false;
  EXPECT_EQ(plan_overlay(off, first_last)["first_stage_layers"], 6);
}

TEST(SpecOverlay, UntypedValuesReachPlanFromJsonWhichNamesTheField) {
  SpecOptions o;
  o.raw["tp"] = "eight";
  try {
    plan_from_json(plan_overlay(o, Json::object()));
    ADD_FAILURE() << "accepted tp 'eight'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("plan.tp"), std::string::npos) << e.what();
  }
  SpecOptions s;
  s.stage_layers = "4,x";
  EXPECT_EQ(plan_overlay(s, Json::object())["stage_layers"], Json({4, "x"}));
  // Not an object: left for plan_from_json to reject.
  EXPECT_THROW(plan_from_json(plan_overlay(o, Json::array())), Error);
}

// --- the binary -------------------------------------------------------------------------------

TEST(CliSpec, EachNewPlanFlagReachesThePlan) {
  struct Case {
    std::string target, flags, key;
    Json value;
  };
  const std::vector<Case> cases = {
      {kTarget, "--zero 3 --reshard after_backward", "reshard", "after_backward"},
      {kTarget, "--zero 3 --reshard after_step", "reshard", "after_step"},
      {kTarget, "--zero 3 --shard-degree 2", "shard_degree", 2},
      {kTarget, "--grad-reduce-dtype bf16", "grad_reduce_dtype", "bf16"},
      {kTarget, "--zero 1 --precision fp8 --fp8-param-gather", "fp8_param_gather", true},
      {kTarget, "--sp --tp-comm-overlap true", "tp_comm_overlap", true},
      {kTarget, "--stage-layers 15,17", "stage_layers", Json({15, 17})},
      {kTarget, "--first-stage-layers 15", "first_stage_layers", 15},
      {kTarget, "--last-stage-layers 14", "last_stage_layers", 14},
      {kTarget, "--account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split",
       "account_for_loss_in_pipeline_split", true},
      {kTarget, "--attention-kernel cudnn", "attention_kernel", "cudnn"},
      {kMoeTarget, "--ep 4 --etp 1", "etp", 1},
      {kMoeTarget, "--ep 4 --vpp 2 --ep-comm-overlap", "ep_comm_overlap", true},
      {kMoeTarget, "--ep 4 --moe-dispatcher deepep", "moe_dispatcher", "deepep"},
      {kMoeTarget, "--ep 4 --moe-force-balance round_robin", "moe_force_balance", "round_robin"},
      {kTarget, "--optimizer-dtype bf16", "optimizer_dtype", "bf16"},
      {kTarget, "--fused-kernels false", "fused_kernels", false},
      {kTarget, "--overlap-grad-reduce false", "overlap_grad_reduce", false},
      {kTarget, "--overlap-param-gather false", "overlap_param_gather", false},
  };
  for (const Case& c : cases) {
    const Json j = estimate_json(c.target + " " + c.flags);
    ASSERT_TRUE(j.contains("plan")) << c.flags;
    EXPECT_EQ(j["plan"][c.key], c.value) << c.flags << "\n" << j["plan"].dump();
  }
}

TEST(CliSpec, BooleanFlagsWorkBareAndWithAValue) {
  struct Case {
    std::string flags, key;
    bool value;
  };
  const std::vector<Case> cases = {{"--sp", "sp", true},
                                   {"--sp true", "sp", true},
                                   {"--sp false", "sp", false},
                                   {"--sp=false", "sp", false},
                                   {"--sp 0", "sp", false},
                                   {"--flash-attention false", "flash_attention", false},
                                   {"--flash-attention", "flash_attention", true},
                                   {"--sp --tp-comm-overlap", "tp_comm_overlap", true},
                                   {"--tp-comm-overlap --sp", "sp", true},
                                   {"--tp-comm-overlap no", "tp_comm_overlap", false}};
  for (const Case& c : cases) {
    const Json j = estimate_json(kTarget + " " + c.flags);
    ASSERT_TRUE(j.contains("plan")) << c.flags;
    // plan_to_json leaves out the overlap flags when false (their default).
    EXPECT_EQ(j["plan"].value(c.key, false), c.value) << c.flags;
  }
  // A bare boolean before the end of the line.
  const Json j = estimate_json(kTarget + " --sp");
  EXPECT_EQ(j["plan"]["sp"], true);
}

// Every boolean plan flag, bare and with a value, over a plan file that sets the opposite (so
// that a flag left unread shows): bare means true, "false"/"0" false, "true"/"=1" true.
TEST(CliSpec, EveryBooleanPlanFlagWorksBareAndWithAValue) {
  struct Flag {
    std::string flag, key, target;
  };
  const std::vector<Flag> flags = {
      {"--sp", "sp", kTarget},
      {"--flash-attention", "flash_attention", kTarget},
      {"--tp-comm-overlap", "tp_comm_overlap", kTarget + " --sp"},
      {"--ep-comm-overlap", "ep_comm_overlap", kMoeTarget + " --ep 4 --vpp 2"},
      {"--overlap-grad-reduce", "overlap_grad_reduce", kTarget},
      {"--overlap-param-gather", "overlap_param_gather", kTarget},
      {"--fused-kernels", "fused_kernels", kTarget},
      {"--account-for-embedding-in-pipeline-split", "account_for_embedding_in_pipeline_split",
       kNoPipelineTarget},
      {"--account-for-loss-in-pipeline-split", "account_for_loss_in_pipeline_split",
       kNoPipelineTarget},
  };
  // A plan file setting `key` to `v`.
  auto file = [](const std::string& key, bool v) {
    const std::string path = temp_path("spec_test_bool_" + key + (v ? "_true" : "_false"));
    std::ofstream(path) << Json{{key, v}}.dump();
    return path;
  };
  // plan_to_json may leave a flag out at its default: read it with the plan's default.
  auto value = [](const Json& plan, const std::string& key) {
    const bool default_true = key == "flash_attention" || key == "overlap_grad_reduce" ||
                              key == "overlap_param_gather" || key == "fused_kernels";
    return plan.value(key, default_true);
  };
  for (const Flag& x : flags) {
    SCOPED_TRACE(x.flag);
    // Bare at the end of the line and before another flag; with a value, spaced and with "=".
    const std::vector<std::pair<std::string, bool>> cases = {
        {"", true},        {" --zero 1", true}, {" true", true},  {"=1", true},
        {" false", false}, {" 0", false},       {"=false", false}};
    for (const auto& [suffix, expected] : cases) {
      const std::string args =
          x.target + " --plan " + file(x.key, !expected) + " " + x.flag + suffix;
      const Json j = estimate_json(args);
      ASSERT_TRUE(j.contains("plan")) << args;
      EXPECT_EQ(value(j["plan"], x.key), expected) << args << "\n" << j["plan"].dump();
    }
  }
}

TEST(CliSpec, FlagsOverrideAPlanFileAndItsTargetFillsTheRest) {
  const std::string path = temp_path("spec_test_plan.json");
  std::ofstream(path) << R"({"model": "llama3-8b", "cluster": "dgx-h100", "gpus": 16,
    "tp": 8, "pp": 2, "zero": 3, "reshard": "after_forward", "gbs": 128,
    "first_stage_layers": 15, "attention_kernel": "flash2"})";
  Json j = estimate_json("--plan " + path);
  ASSERT_TRUE(j.contains("plan"));
  EXPECT_EQ(j["plan"]["dp"], 1);
  EXPECT_EQ(j["plan"]["first_stage_layers"], 15);
  j = estimate_json("--plan " + path +
                    " --tp 4 --reshard after_step --attention-kernel cudnn --stage-layers 16,16");
  ASSERT_TRUE(j.contains("plan"));
  EXPECT_EQ(j["plan"]["tp"], 4);
  EXPECT_EQ(j["plan"]["dp"], 2);  // re-derived: 16 GPUs / (4 x 2)
  EXPECT_EQ(j["plan"]["gbs"], 128);
  EXPECT_EQ(j["plan"]["zero"], 3);
  EXPECT_EQ(j["plan"]["reshard"], "after_step");
  EXPECT_EQ(j["plan"]["attention_kernel"], "cudnn");
  EXPECT_EQ(j["plan"]["stage_layers"], Json({16, 16}));
  EXPECT_FALSE(j["plan"].contains("first_stage_layers"));
  EXPECT_EQ(j["plan"]["model"], "llama3-8b");
  EXPECT_EQ(j["plan"]["gpus"], 16);
}

TEST(CliSpec, DefaultsDeriveDpAndTheGlobalBatch) {
  // dp from the GPU count; gbs = dp x mbs without a plan file.
  Json j = estimate_json("--model llama3-8b --cluster dgx-h100 --gpus 16 --tp 2 --pp 2 --mbs 2");
  ASSERT_TRUE(j.contains("plan"));
  EXPECT_EQ(j["plan"]["dp"], 4);
  EXPECT_EQ(j["plan"]["gbs"], 8);
  // No GPU count: the degrees decide it.
  j = estimate_json("--model llama3-8b --cluster dgx-h100 --tp 8 --dp 2 --gbs 16");
  ASSERT_TRUE(j.contains("plan"));
  EXPECT_EQ(j["plan"]["gpus"], 16);
  // --vpp > 1 means interleaved.
  j = estimate_json(kTarget + " --vpp 2");
  ASSERT_TRUE(j.contains("plan"));
  EXPECT_EQ(j["plan"]["schedule"], "interleaved");
}

TEST(CliSpec, BadValuesExitTwoNamingTheField) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--reshard bogus", "plan.reshard"},
      {"--grad-reduce-dtype int8", "plan.grad_reduce_dtype"},
      {"--fp8-param-gather maybe", "plan.fp8_param_gather"},
      {"--zero 1 --fp8-param-gather", "plan.fp8_param_gather"},  // bf16: no fp8 weights
      {"--attention-kernel xla", "plan.attention_kernel"},
      {"--shard-degree -1", "plan.shard_degree"},
      {"--etp x", "plan.etp"},
      {"--etp 0", "plan.etp"},
      {"--stage-layers 16,x", "plan.stage_layers[1]"},
      {"--stage-layers 16,0", "plan.stage_layers[1]"},
      {"--first-stage-layers 0", "plan.first_stage_layers"},
      {"--last-stage-layers 2.5", "plan.last_stage_layers"},
      {"--sp maybe", "plan.sp"},
      {"--tp-comm-overlap maybe", "plan.tp_comm_overlap"},
      {"--ep-comm-overlap 2", "plan.ep_comm_overlap"},
      {"--moe-dispatcher nccl", "plan.moe_dispatcher"},
      {"--moe-force-balance uniform", "plan.moe_force_balance"},
      {"--optimizer-dtype int8", "plan.optimizer_dtype"},
      {"--fused-kernels sometimes", "plan.fused_kernels"},
      {"--overlap-grad-reduce 3", "plan.overlap_grad_reduce"},
      {"--flash-attention perhaps", "plan.flash_attention"},
      {"--pp 0", "plan.pp"},
      {"--pp 99999999999", "plan.pp"},
      {"--cp x", "plan.cp"},
      {"--zero 5", "plan.zero"},
      {"--mbs x", "plan.mbs"},
      {"--stage-layers 16,16 --first-stage-layers 15", "plan.stage_layers"}};
  for (const auto& [flags, field] : cases) {
    Result r =
        run("estimate --model llama3-8b --cluster dgx-h100 --gpus 16 --tp 2 --gbs 64 " + flags);
    EXPECT_EQ(r.code, 2) << flags << "\n" << r.out;
    EXPECT_NE(r.out.find("error: " + field), std::string::npos) << flags << "\n" << r.out;
  }
}

// --- bands and the new output lines ------------------------------------------------------------

TEST(CliBand, EstimatePrintsTheBandOverlapAndHostMemory) {
  Result r = run("estimate " + kTarget);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find(" ± "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("error band "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("h100-dense"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("overlap slowdown: "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("host memory per server "), std::string::npos) << r.out;
  r = run("estimate --model llama3-8b --cluster dgx-b200 --gpus 16 --tp 8 --gbs 64");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("unvalidated"), std::string::npos) << r.out;
}

TEST(CliBand, EstimateJsonCarriesTheBand) {
  Json j = estimate_json(kTarget);
  ASSERT_TRUE(j.contains("band"));
  const Json& b = j["band"];
  const double step = j["step_time_s"], f = b["fraction"];
  EXPECT_TRUE(b["validated"].get<bool>());
  EXPECT_EQ(b["families"], Json({"h100-dense"}));
  EXPECT_GT(f, 0);
  EXPECT_LT(f, 1);
  EXPECT_NEAR(b["low_s"].get<double>(), step * (1 - f), 1e-9 * step);
  EXPECT_NEAR(b["high_s"].get<double>(), step * (1 + f), 1e-9 * step);
  // Offload: no suite covers it.
  j = estimate_json(kTarget + " --offload optimizer");
  EXPECT_FALSE(j["band"]["validated"].get<bool>());
  EXPECT_GE(j["band"]["fraction"].get<double>(), f);
  // A MoE model with context parallelism draws on both families.
  j = estimate_json(kMoeTarget + " --ep 2 --cp 2");
  EXPECT_EQ(j["band"]["families"], Json({"moe", "long-seq-cp"}));
}

TEST(CliBand, SimulateAndSearchCarryTheBand) {
  Result r = run("simulate --json " + kTarget);
  ASSERT_EQ(r.code, 0) << r.out;
  Json j = Json::parse(r.out);
  ASSERT_TRUE(j.contains("band"));
  EXPECT_NEAR(j["band"]["high_s"].get<double>(),
              j["step_time_s"].get<double>() * (1 + j["band"]["fraction"].get<double>()), 1e-9);
  EXPECT_TRUE(j.contains("host_memory_per_server_bytes"));
  r = run("simulate " + kTarget);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("error band "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("host memory per server"), std::string::npos) << r.out;
  r = run("search --model llama3-8b --cluster dgx-h100 --gpus 16 --gbs 64 --top 3 --json");
  ASSERT_EQ(r.code, 0) << r.out;
  j = Json::parse(r.out);
  for (const Json& row : j["top"]) {
    ASSERT_TRUE(row.contains("band")) << row.dump();
    EXPECT_TRUE(row["band"].contains("validated"));
    EXPECT_GT(row["band"]["high_s"].get<double>(), row["estimate"]["step_time_s"].get<double>());
  }
  r = run("search --model llama3-8b --cluster dgx-h100 --gpus 16 --gbs 64 --top 3");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find(" band "), std::string::npos) << r.out;
}

// The search table names each plan's sharding as the frameworks do (ZeRO stage, ZeRO-3's reshard
// point, HSDP's shard group) and whether TP communication overlaps, row for row as --json says.
TEST(CliSearch, TableShowsReshardAndTpOverlapAsTheJsonDoes) {
  const std::string target =
      "search --model llama3-70b --cluster dgx-h100 --gpus 64 --gbs 512 --seq 8192 --top 10";
  Result text = run(target);
  Result json = run(target + " --json");
  ASSERT_EQ(text.code, 0) << text.out;
  ASSERT_EQ(json.code, 0) << json.out;
  EXPECT_NE(text.out.find(" tpo "), std::string::npos) << text.out;
  EXPECT_NE(text.out.find(" zero "), std::string::npos) << text.out;
  const Json top = Json::parse(json.out)["top"];
  ASSERT_EQ(top.size(), 10u);
  std::vector<std::string> rows;
  std::istringstream lines(text.out);
  for (std::string line; std::getline(lines, line) && rows.size() < top.size();)
    if (line.size() > 4 && line.find(" GiB") != std::string::npos &&
        line.find_first_not_of(' ') < 4 && std::isdigit(static_cast<unsigned char>(line[3])))
      rows.push_back(line);
  ASSERT_EQ(rows.size(), top.size()) << text.out;
  for (size_t i = 0; i < rows.size(); ++i) {
    const Json& plan = top[i]["plan"];
    // Columns: # tp pp dp cp ep sp tpo schedule mbs mb recompute offload zero [reshard] ...
    std::vector<std::string> cells;
    std::istringstream words(rows[i]);
    for (std::string w; words >> w;) cells.push_back(w);
    ASSERT_GT(cells.size(), 15u) << rows[i];
    EXPECT_EQ(cells[7], plan.value("tp_comm_overlap", false) ? "on" : "off") << rows[i];
    EXPECT_EQ(cells[13], std::to_string(plan["zero"].get<int>())) << rows[i];
    if (plan["zero"].get<int>() == 3) {
      const std::string r = plan["reshard"].get<std::string>();
      EXPECT_EQ(cells[14], r == "after_forward"    ? "fwd"
                           : r == "after_backward" ? "bwd"
                                                   : "step")
          << rows[i];
    }
  }
}

}  // namespace
}  // namespace parasol::tools
