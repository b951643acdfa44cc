// Tests of interop/torchtitan: golden TOML files of representative plans, the degrees and batch
// keys checked independently against the plan, torchtitan's stage split, and every refusal (by
// its field). The ctest torchtitan_toml_parses (tests/interop/CMakeLists.txt) loads the golden
// TOML files with Python's tomllib.
//
// Golden files live in tests/data/export/torchtitan/<case>/. After an intended change of the
// writer, regenerate them with
//   PARASOL_UPDATE_GOLDEN=1 ./build/tests/interop/torchtitan_test
// and review the diff (git diff tests/data/export/torchtitan).
#include "interop/torchtitan.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include "core/error.h"
#include "tests/interop/golden.h"

namespace parasol::interop {
namespace {

namespace fs = std::filesystem;

// The "key = value" lines of one [section] of the TOML this writer emits (flat tables, one key
// per line, # comments); enough to read back the numbers for the checks below.
std::map<std::string, std::string> section(const std::string& toml, const std::string& name) {
  std::map<std::string, std::string> out;
  std::istringstream in(toml);
  bool inside = false;
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    if (line[0] == '[') {
      inside = line == "[" + name + "]";
      continue;
    }
    const auto eq = line.find(" = ");
    if (inside && eq != std::string::npos) out[line.substr(0, eq)] = line.substr(eq + 3);
  }
  return out;
}

struct Case {
  const char* name;
  const char* model;
  int gpus;
  const char* plan;
};

const Case kCases[] = {
    // The brief's example: TP 8 in the node, FSDP over 8 nodes, full AC.
    {"llama3_70b_tp8_fsdp8", "llama3-70b", 64,
     R"({"tp": 8, "dp": 8, "sp": true, "zero": 3, "mbs": 1, "gbs": 64, "recompute": "full"})"},
    // HSDP (shard 2, replicate 2) under an interleaved pipeline (after_step: pipelining's FSDP).
    {"llama3_70b_tp8_pp4_vpp2_hsdp", "llama3-70b", 128,
     R"({"tp": 8, "pp": 4, "vpp": 2, "schedule": "interleaved", "dp": 4, "sp": true,
         "zero": 3, "reshard": "after_step", "shard_degree": 2, "mbs": 1, "gbs": 128,
         "recompute": "full"})"},
    // DDP on one server, no compile (eager), context length 8192.
    {"llama3_8b_ddp8", "llama3-8b", 8,
     R"({"dp": 8, "zero": 0, "mbs": 2, "gbs": 32, "fused_kernels": false})"},
};

Export export_case(const Case& c) {
  return export_torchtitan(model_preset(c.model), cluster_preset("dgx-h100", c.gpus),
                           plan_of(c.plan));
}

TEST(TorchtitanExport, GoldenFiles) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.name);
    const Export e = export_case(c);
    EXPECT_EQ(e.framework, "torchtitan");
    EXPECT_NE(e.version.find("v0.2.2"), std::string::npos);
    ASSERT_EQ(e.files.size(), 2u);
    EXPECT_NE(file_named(e, "torchtitan.toml").text.find("torchtitan v0.2.2"), std::string::npos);
    EXPECT_TRUE(file_named(e, "launch_torchtitan.sh").executable);
    expect_golden(e, "torchtitan", c.name);
  }
}

// torchtitan's ParallelDims rule (dp_replicate x dp_shard x cp x tp x pp = world) and its batch
// rule (global = local x dp x accumulation; pipeline microbatches = local / microbatch size),
// computed here from the written keys and the plan.
TEST(TorchtitanExport, DegreesMultiplyToTheGpusAndBatchesMatch) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.name);
    const Plan p = plan_of(c.plan);
    const std::string toml = file_named(export_case(c), "torchtitan.toml").text;
    auto par = section(toml, "parallelism");
    auto tr = section(toml, "training");
    const int replicate = std::stoi(par.at("data_parallel_replicate_degree"));
    const int shard = std::stoi(par.at("data_parallel_shard_degree"));
    const int tp = std::stoi(par.at("tensor_parallel_degree"));
    const int pp = std::stoi(par.at("pipeline_parallel_degree"));
    const int cp = std::stoi(par.at("context_parallel_degree"));
    EXPECT_EQ(replicate * shard * cp * tp * pp, c.gpus);
    EXPECT_EQ(replicate * shard, p.dp);
    const int local = std::stoi(tr.at("local_batch_size"));
    const int global = std::stoi(tr.at("global_batch_size"));
    EXPECT_EQ(global, p.global_batch);
    ASSERT_EQ(global % (local * replicate * shard), 0);
    const int accumulation = global / (local * replicate * shard);
    int microbatches = 1;
    if (pp > 1) {
      const int mbs = std::stoi(par.at("pipeline_parallel_microbatch_size"));
      EXPECT_EQ(mbs, p.micro_batch);
      ASSERT_EQ(local % mbs, 0);
      microbatches = local / mbs;
    } else {
      EXPECT_EQ(local, p.micro_batch);
    }
    EXPECT_EQ(accumulation * microbatches, p.micro_batches());
    EXPECT_EQ(std::stoll(tr.at("seq_len")), p.seq(model_preset(c.model)));
  }
}

TEST(TorchtitanExport, FlavorsAndModes) {
  const std::string fsdp = file_named(export_case(kCases[0]), "torchtitan.toml").text;
  EXPECT_EQ(section(fsdp, "model").at("flavor"), "\"70B\"");
  EXPECT_EQ(section(fsdp, "parallelism").at("fsdp_reshard_after_forward"), "\"always\"");
  EXPECT_EQ(section(fsdp, "activation_checkpoint").at("mode"), "\"full\"");
  const std::string pipe = file_named(export_case(kCases[1]), "torchtitan.toml").text;
  EXPECT_EQ(section(pipe, "parallelism").at("pipeline_parallel_schedule"), "\"Interleaved1F1B\"");
  EXPECT_EQ(section(pipe, "parallelism").at("fsdp_reshard_after_forward"), "\"default\"");
  const std::string ddp = file_named(export_case(kCases[2]), "torchtitan.toml").text;
  EXPECT_EQ(section(ddp, "activation_checkpoint").at("mode"), "\"none\"");
  EXPECT_EQ(section(ddp, "compile").at("enable"), "false");
  EXPECT_NE(file_named(export_case(kCases[2]), "launch_torchtitan.sh").text.find("NGPU=8 "),
            std::string::npos);
  // A model with no torchtitan flavor says so.
  const Export gpt = export_torchtitan(model_preset("gpt3-175b"), cluster_preset("dgx-h100", 64),
                                       plan_of(R"({"tp": 8, "dp": 8, "sp": true, "zero": 3,
                                                   "gbs": 64, "recompute": "full"})"));
  EXPECT_NE(file_named(gpt, "torchtitan.toml").text.find("matches no torchtitan v0.2.2 flavor"),
            std::string::npos);
}

TEST(TorchtitanExport, ContextAndExpertParallelism) {
  // cp 2 inside FSDP: the FSDP mesh is dp_shard x cp, so dp_shard = (dp x cp) / cp.
  const Export cp = export_torchtitan(model_preset("llama3-8b"), cluster_preset("dgx-h100", 16),
                                      plan_of(R"({"tp": 2, "sp": true, "cp": 2, "dp": 4,
                                                  "zero": 3, "gbs": 32})"));
  auto par = section(file_named(cp, "torchtitan.toml").text, "parallelism");
  EXPECT_EQ(par.at("context_parallel_degree"), "2");
  EXPECT_EQ(par.at("data_parallel_shard_degree"), "4");
  EXPECT_EQ(par.at("context_parallel_rotate_method"), "\"alltoall\"");
  // MoE with ep 4 carved out of dp_shard x cp x tp / etp (etp = tp); no torchtitan flavor.
  const Export moe =
      export_torchtitan(model_preset("mixtral-8x7b"), cluster_preset("dgx-h100", 16),
                        plan_of(R"({"tp": 2, "sp": true, "dp": 8, "ep": 4, "zero": 3, "gbs": 32,
                  "moe_dispatcher": "deepep"})"));
  const std::string toml = file_named(moe, "torchtitan.toml").text;
  par = section(toml, "parallelism");
  EXPECT_EQ(par.at("expert_parallel_degree"), "4");
  EXPECT_EQ(par.at("expert_tensor_parallel_degree"), "2");
  EXPECT_EQ(par.at("expert_parallel_comm_backend"), "\"deepep\"");
  EXPECT_NE(toml.find("matches no torchtitan v0.2.2 flavor"), std::string::npos);
}

// The pipeline keys reproduce the plan's layers per virtual stage, by torchtitan's own rule.
TEST(TorchtitanExport, StageSplitMatchesThePlan) {
  // torchtitan's docstring example: 2 stages, 3 layers, weights 2 and 2 -> effective 7.
  EXPECT_EQ(torchtitan_stage_split(3, 2, 2, 2), (std::vector<int>{2, 1}));
  EXPECT_EQ(torchtitan_stage_split(80, 8, 0, 0), (std::vector<int>(8, 10)));
  EXPECT_TRUE(torchtitan_stage_split(4, 8, 0, 0).empty());  // more stages than layers
  const Case& c = kCases[1];
  const Plan p = plan_of(c.plan);
  const Model m = model_preset(c.model);
  auto par = section(file_named(export_case(c), "torchtitan.toml").text, "parallelism");
  const int first = std::stoi(par.at("pipeline_parallel_first_stage_less_layers"));
  const int last = std::stoi(par.at("pipeline_parallel_last_stage_less_layers"));
  const int lps = std::stoi(par.at("pipeline_parallel_layers_per_stage"));
  const int stages = p.pp * p.vpp;
  EXPECT_EQ((m.layers + first + last + lps - 1) / lps, stages);  // torchtitan's stage count
  const std::vector<int> split = torchtitan_stage_split(m.layers, stages, first, last);
  ASSERT_EQ(split.size(), static_cast<size_t>(stages));
  for (int v = 0; v < stages; ++v)
    EXPECT_EQ(split[v], p.layers_in_chunk(m.layers, v % p.pp, v / p.pp)) << "virtual stage " << v;
  // An uneven plan (14 layers on the first stage, 16 on the others): first_stage_less_layers 2.
  const Model big = model_preset("llama3-405b");
  const Plan uneven = plan_of(R"({"tp": 8, "sp": true, "pp": 8, "dp": 2, "zero": 3,
      "reshard": "after_step", "gbs": 64, "first_stage_layers": 14, "last_stage_layers": 16})");
  par = section(
      file_named(export_torchtitan(big, cluster_preset("dgx-h100", 128), uneven), "torchtitan.toml")
          .text,
      "parallelism");
  EXPECT_EQ(par.at("pipeline_parallel_first_stage_less_layers"), "2");
  EXPECT_EQ(par.at("pipeline_parallel_last_stage_less_layers"), "0");
  const std::vector<int> got = torchtitan_stage_split(
      big.layers, 8, std::stoi(par.at("pipeline_parallel_first_stage_less_layers")),
      std::stoi(par.at("pipeline_parallel_last_stage_less_layers")));
  ASSERT_EQ(got.size(), 8u);
  for (int s = 0; s < 8; ++s) EXPECT_EQ(got[s], uneven.layers_in_stage(big.layers, s));
}

TEST(TorchtitanExport, RefusesWhatTorchtitanCannotExpress) {
  expect_refusals(
      export_torchtitan,
      {
          {"llama3-8b", 8, R"({"dp": 8, "zero": 1, "gbs": 64})", "plan.zero"},
          {"llama3-8b", 8, R"({"dp": 8, "zero": 2, "gbs": 64})", "plan.zero"},
          {"llama3-8b", 8, R"({"tp": 2, "sp": true, "dp": 4, "zero": 0, "gbs": 64})", "plan.zero"},
          {"llama3-8b", 8, R"({"cp": 2, "dp": 4, "zero": 0, "gbs": 64})", "plan.zero"},
          {"llama3-8b", 8, R"({"dp": 8, "zero": 3, "gbs": 64, "offload": "optimizer"})",
           "plan.offload"},
          {"llama3-8b", 8, R"({"dp": 8, "zero": 3, "gbs": 64, "offload": "activations"})",
           "plan.offload"},
          {"llama3-8b", 8, R"({"dp": 8, "zero": 3, "gbs": 64, "recompute": "selective"})",
           "plan.recompute"},
          {"llama3-8b", 8,
           R"({"dp": 8, "zero": 3, "gbs": 64, "recompute": "full", "recompute_layers": 4})",
           "plan.recompute_layers"},
          {"llama3-8b", 8, R"({"tp": 2, "dp": 4, "zero": 3, "gbs": 64})", "plan.sequence_parallel"},
          {"llama3-8b", 8, R"({"dp": 8, "zero": 3, "gbs": 64, "precision": "fp16"})",
           "plan.precision"},
          {"llama3-8b", 8, R"({"dp": 8, "zero": 3, "gbs": 64, "grad_reduce_dtype": "bf16"})",
           "plan.grad_reduce_dtype"},
          {"llama3-8b", 8, R"({"dp": 8, "zero": 3, "gbs": 64, "reshard": "after_step"})",
           "plan.reshard"},
          {"llama3-8b", 16, R"({"pp": 2, "dp": 8, "zero": 3, "gbs": 64})", "plan.reshard"},
          {"llama3-8b", 8, R"({"dp": 8, "zero": 3, "gbs": 64, "rank_order": "tp-cp-ep-pp-dp"})",
           "plan.rank_order"},
          {"llama3-8b", 8, R"({"dp": 8, "zero": 3, "gbs": 64, "flash_attention": false})",
           "plan.flash_attention"},
          {"llama3-8b", 16,
           R"({"pp": 4, "dp": 4, "zero": 3, "reshard": "after_step", "gbs": 64,
           "stage_layers": [8, 6, 10, 8]})",
           "plan.stage_layers"},
          {"mixtral-8x7b", 8, R"({"tp": 4, "sp": true, "dp": 2, "ep": 2, "etp": 2, "zero": 3,
                              "gbs": 64})",
           "plan.etp"},
      });
}

}  // namespace
}  // namespace parasol::interop
