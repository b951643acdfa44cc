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
#include "tests/interop/framework_rules.h"
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
     R"({"tp": 8, "tp_impl": "torch", "dp": 8, "sp": true, "zero": 3, "mbs": 1, "gbs": 64, "recompute": "full"})"},
    // HSDP (shard 2, replicate 2) under an interleaved pipeline (after_step: pipelining's FSDP).
    {"llama3_70b_tp8_pp4_vpp2_hsdp", "llama3-70b", 128,
     R"({"tp": 8, "tp_impl": "torch", "pp": 4, "vpp": 2, "schedule": "interleaved", "dp": 4, "sp": true,
         "zero": 3, "reshard": "after_step", "shard_degree": 2, "mbs": 1, "gbs": 128,
         "recompute": "full"})"},
    // DDP on one server, no compile (eager), context length 8192.
    {"llama3_8b_ddp8", "llama3-8b", 8,
     R"({"dp": 8, "zero": 0, "mbs": 2, "gbs": 32, "fused_kernels": false, "eager_loss": true})"},
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
    EXPECT_EQ(rules::torchtitan_violations(file_named(e, "torchtitan.toml").text),
              std::vector<std::string>{});
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
  const Export gpt =
      export_torchtitan(model_preset("gpt3-175b"), cluster_preset("dgx-h100", 64),
                        plan_of(R"({"tp": 8, "tp_impl": "torch", "dp": 8, "sp": true, "zero": 3,
                                                   "gbs": 64, "recompute": "full"})"));
  EXPECT_NE(file_named(gpt, "torchtitan.toml").text.find("matches no torchtitan v0.2.2 flavor"),
            std::string::npos);
}

TEST(TorchtitanExport, ContextAndExpertParallelism) {
  // cp 2 inside FSDP: the FSDP mesh is dp_shard x cp, so dp_shard = (dp x cp) / cp.
  const Export cp =
      export_torchtitan(model_preset("llama3-8b"), cluster_preset("dgx-h100", 16),
                        plan_of(R"({"tp": 2, "tp_impl": "torch", "sp": true, "cp": 2, "dp": 4,
                                                  "cp_impl": "torch", "zero": 3, "gbs": 32})"));
  auto par = section(file_named(cp, "torchtitan.toml").text, "parallelism");
  EXPECT_EQ(par.at("context_parallel_degree"), "2");
  EXPECT_EQ(par.at("data_parallel_shard_degree"), "4");
  EXPECT_EQ(par.at("context_parallel_rotate_method"), "\"alltoall\"");
  // MoE with ep 4 carved out of dp_shard x cp x tp / etp (etp = tp); no torchtitan flavor:
  // llama4's args (GQA MoE) are the ones to add it to.
  const Export moe =
      export_torchtitan(model_preset("mixtral-8x7b"), cluster_preset("dgx-h100", 16),
                        plan_of(R"({"tp": 2, "tp_impl": "torch", "sp": true, "dp": 8, "ep": 4,
                                                   "zero": 3, "gbs": 32})"));
  const std::string toml = file_named(moe, "torchtitan.toml").text;
  par = section(toml, "parallelism");
  EXPECT_EQ(par.at("expert_parallel_degree"), "4");
  EXPECT_EQ(par.at("expert_tensor_parallel_degree"), "2");
  EXPECT_EQ(par.at("expert_parallel_comm_backend"), "\"standard\"");
  EXPECT_NE(toml.find("matches no torchtitan v0.2.2 flavor"), std::string::npos);
  EXPECT_EQ(section(toml, "model").at("name"), "\"llama4\"");
  EXPECT_NE(toml.find("llama4_args in torchtitan/models/llama4/__init__.py"), std::string::npos);
  EXPECT_EQ(rules::torchtitan_violations(toml), std::vector<std::string>{});
}

// [model] is a registered TrainSpec and one of its flavors (torchtitan v0.2.2: models/__init__.py
// _supported_models; qwen3/__init__.py qwen3_args "30B-A3B" L145 and "235B-A22B" L168;
// deepseek_v3/__init__.py deepseekv3_args "671B" L130; llama3/__init__.py "8B" L51, "70B" L82,
// "405B" L91): get_train_spec raises "TrainSpec qwen3-30b-a3b is not registered" for parasol's
// preset name (train_spec.py L87).
TEST(TorchtitanExport, ModelsAreRegisteredNamesAndFlavors) {
  const std::map<std::string, std::pair<std::string, std::string>> want = {
      {"llama3-8b", {"llama3", "8B"}},
      {"llama3-70b", {"llama3", "70B"}},
      {"llama3-405b", {"llama3", "405B"}},
      {"qwen3-30b-a3b", {"qwen3", "30B-A3B"}},
      {"qwen3-235b-a22b", {"qwen3", "235B-A22B"}},
      {"deepseek-v3", {"deepseek_v3", "671B"}},
  };
  for (const auto& [preset, titan] : want) {
    SCOPED_TRACE(preset);
    const std::optional<TorchtitanModel> t = torchtitan_model(model_preset(preset));
    ASSERT_TRUE(t.has_value());
    EXPECT_EQ(t->name, titan.first);
    EXPECT_EQ(t->flavor, titan.second);
    EXPECT_EQ(torchtitan_family(model_preset(preset)), titan.first);
  }
  // No flavor: the TrainSpec whose args can describe the model.
  EXPECT_FALSE(torchtitan_model(model_preset("mixtral-8x7b")));
  EXPECT_EQ(torchtitan_family(model_preset("mixtral-8x7b")), "llama4");
  EXPECT_EQ(torchtitan_family(model_preset("gpt3-175b")), "llama3");
  Model wider = model_preset("qwen3-30b-a3b");  // one expert more: no flavor, still qwen3's args
  wider.moe.experts = 129;
  EXPECT_FALSE(torchtitan_model(wider));
  EXPECT_EQ(torchtitan_family(wider), "qwen3");
  Model mla = model_preset("deepseek-v3");
  mla.layers = 30;
  EXPECT_EQ(torchtitan_family(mla), "deepseek_v3");
  // The MoE export of the issue: qwen3 with flavor 30B-A3B, and torchtitan's checks pass.
  const Export q = export_torchtitan(model_preset("qwen3-30b-a3b"), cluster_preset("dgx-h100", 16),
                                     plan_of(R"({"dp": 16, "ep": 8, "zero": 3, "gbs": 64})"));
  const std::string toml = file_named(q, "torchtitan.toml").text;
  EXPECT_EQ(section(toml, "model").at("name"), "\"qwen3\"");
  EXPECT_EQ(section(toml, "model").at("flavor"), "\"30B-A3B\"");
  EXPECT_EQ(toml.find("matches no torchtitan"), std::string::npos);
  EXPECT_EQ(rules::torchtitan_violations(toml), std::vector<std::string>{});
}

// Per-TrainSpec support: qwen3 has no pipelining_fn (train.py L218-223 raises), and only
// deepseek_v3 builds DeepEP's MoE (deepseek_v3/model/args.py L116), without ETP
// (deepseek_v3/infra/parallelize.py L107-111).
TEST(TorchtitanExport, RefusesWhatTheModelsTrainSpecCannotRun) {
  expect_refusals(
      export_torchtitan,
      {
          {"qwen3-30b-a3b", 16,
           R"({"pp": 2, "dp": 8, "ep": 8, "zero": 3, "reshard": "after_step", "gbs": 64})",
           "plan.pp"},
          {"qwen3-30b-a3b", 16, R"({"dp": 16, "ep": 8, "zero": 3, "gbs": 64,
                                    "moe_dispatcher": "deepep"})",
           "plan.moe_dispatcher"},
          // Megatron-Core's allgather dispatcher has no torchtitan counterpart.
          {"qwen3-30b-a3b", 16, R"({"dp": 16, "ep": 8, "zero": 3, "gbs": 64,
                                    "moe_dispatcher": "allgather"})",
           "plan.moe_dispatcher"},
          {"mixtral-8x7b", 16,
           R"({"tp": 2, "tp_impl": "torch", "sp": true, "dp": 8, "ep": 4, "zero": 3, "gbs": 32,
                                   "moe_dispatcher": "deepep"})",
           "plan.moe_dispatcher"},
          {"deepseek-v3", 64,
           R"({"tp": 2, "tp_impl": "torch", "sp": true, "dp": 32, "ep": 8, "etp": 2, "zero": 3,
                                  "gbs": 64, "moe_dispatcher": "deepep"})",
           "plan.etp"},
          // Forced balance: round-robin only (models/moe/moe.py L234-249), and only where the
          // model's args pass [debug] moe_force_load_balance on (deepseek_v3, llama4).
          {"deepseek-v3", 64,
           R"({"tp": 2, "tp_impl": "torch", "sp": true, "dp": 32, "ep": 8, "zero": 3, "gbs": 64,
                                  "moe_force_balance": "random"})",
           "plan.moe_force_balance"},
          {"qwen3-30b-a3b", 16, R"({"dp": 16, "ep": 8, "zero": 3, "gbs": 64,
                                    "moe_force_balance": "round_robin"})",
           "plan.moe_force_balance"},
      });
  // deepseek_v3 with etp 1 runs DeepEP, and pipelines.
  const Export ds = export_torchtitan(
      model_preset("deepseek-v3"), cluster_preset("dgx-h100", 64),
      plan_of(
          R"({"tp": 2, "tp_impl": "torch", "sp": true, "pp": 2, "dp": 16, "ep": 8, "etp": 1, "zero": 3,
                  "reshard": "after_step", "gbs": 64, "moe_dispatcher": "deepep",
                  "first_stage_layers": 30})"));
  const std::string toml = file_named(ds, "torchtitan.toml").text;
  EXPECT_EQ(section(toml, "parallelism").at("expert_parallel_comm_backend"), "\"deepep\"");
  EXPECT_EQ(rules::torchtitan_violations(toml), std::vector<std::string>{});
}

// Every reason at once.
TEST(TorchtitanExport, ARefusalNamesEveryReason) {
  try {
    export_torchtitan(model_preset("llama3-8b"), cluster_preset("dgx-h100", 8),
                      plan_of(R"({"dp": 8, "zero": 1, "gbs": 64, "precision": "fp16",
                                  "flash_attention": false})"));
    FAIL() << "accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "plan.precision, plan.flash_attention, plan.zero");
    EXPECT_NE(e.reason().find("3 reasons"), std::string::npos) << e.reason();
  }
}

// ---- Import of job TOML files.

TEST(TorchtitanImport, ParsesTheTomlSubsetOfJobConfigs) {
  const Json j = parse_toml(R"(# a comment
[job]
dump_folder = "./outputs"  # trailing comment
[model]
name = 'llama3'
[parallelism]
tensor_parallel_degree = 8
data_parallel_shard_degree = -1
ratio = 1.5e-1
big = 1_000
enabled = true
[compile]
components = ["model",
              "loss"]
[quantize.linear.float8]
filter_fqns = ["output"]
)",
                            "t");
  EXPECT_EQ(j["job"]["dump_folder"], "./outputs");
  EXPECT_EQ(j["model"]["name"], "llama3");
  EXPECT_EQ(j["parallelism"]["tensor_parallel_degree"], 8);
  EXPECT_EQ(j["parallelism"]["data_parallel_shard_degree"], -1);
  EXPECT_DOUBLE_EQ(j["parallelism"]["ratio"].get<double>(), 0.15);
  EXPECT_EQ(j["parallelism"]["big"], 1000);
  EXPECT_EQ(j["parallelism"]["enabled"], true);
  EXPECT_EQ(j["compile"]["components"], Json::array({"model", "loss"}));
  EXPECT_EQ(j["quantize"]["linear"]["float8"]["filter_fqns"], Json::array({"output"}));
  for (const char* bad : {"[t]\nx = {a = 1}\n", "[t]\nx = \"open\n", "[t]\nx = 1 2\n",
                          "[t]\nx = 1\nx = 2\n", "just words\n"}) {
    SCOPED_TRACE(bad);
    try {
      parse_toml(bad, "t");
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.field().rfind("t: line ", 0), 0u) << e.field();
    }
  }
  EXPECT_TRUE(looks_like_toml("# c\n[job]\nx = 1\n"));
  EXPECT_FALSE(looks_like_toml(R"({"tp": 2})"));
  EXPECT_TRUE(looks_like_torchtitan_toml("[parallelism]\ntensor_parallel_degree = 2\n"));
  EXPECT_FALSE(looks_like_torchtitan_toml("[tool.poetry]\nname = \"x\"\n"));
}

// export -> import gives the plan back (the JSON of the plan, the model preset of the flavor and
// the cluster of the tag), and the imported plan exports to the same files.
TEST(TorchtitanImport, ExportThenImportGivesThePlanBack) {
  struct Trip {
    const char* model;
    int gpus;
    const char* plan;
  };
  std::vector<Trip> trips;
  for (const Case& c : kCases) trips.push_back({c.model, c.gpus, c.plan});
  trips.push_back(
      {"llama3-405b", 128,
       R"({"tp": 8, "tp_impl": "torch", "sp": true, "pp": 8, "dp": 2, "zero": 3, "reshard": "after_step",
                       "gbs": 64, "first_stage_layers": 14, "last_stage_layers": 16})"});
  trips.push_back(
      {"llama3-8b", 16,
       R"({"tp": 2, "tp_impl": "torch", "sp": true, "cp": 2, "dp": 4, "zero": 3, "gbs": 32,
                       "seq": 16384, "tp_comm_overlap": true, "reshard": "after_backward",
                       "cp_impl": "torch"})"});
  trips.push_back({"llama3-8b", 8,
                   R"({"cp": 4, "dp": 2, "zero": 3, "gbs": 8, "seq": 32768, "cp_impl": "torch",
                       "cp_rotate": "allgather", "recompute": "full"})"});
  trips.push_back({"qwen3-30b-a3b", 16,
                   R"({"dp": 16, "ep": 8, "zero": 3, "gbs": 64, "offload": "optimizer,params",
                       "cpu_optimizer": "torch", "recompute": "full",
                       "optimizer_dtype": "bf16"})"});
  trips.push_back(
      {"deepseek-v3", 64,
       R"({"tp": 2, "tp_impl": "torch", "sp": true, "pp": 2, "dp": 16, "ep": 8, "etp": 1, "zero": 3,
                       "reshard": "after_step", "gbs": 64, "moe_dispatcher": "deepep",
                       "first_stage_layers": 30})"});
  // torchtitan's forced balance ([debug] moe_force_load_balance) is the round-robin gate.
  trips.push_back(
      {"deepseek-v3", 64,
       R"({"tp": 2, "tp_impl": "torch", "sp": true, "pp": 2, "dp": 16, "ep": 8, "etp": 1, "zero": 3,
                       "reshard": "after_step", "gbs": 64, "moe_dispatcher": "deepep",
                       "first_stage_layers": 30, "moe_force_balance": "round_robin"})"});
  // The model compiled, the loss eager (compile.components = ["model"]).
  trips.push_back({"llama3-8b", 8, R"({"dp": 8, "zero": 3, "gbs": 32, "eager_loss": true})"});
  // torchtitan's op-level selective AC (selective_ac_option "op"), and its layer-level one
  // (every 4th of 32 blocks: the same count as parasol's full recompute of 8 layers).
  trips.push_back({"llama3-8b", 8,
                   R"({"dp": 8, "zero": 3, "gbs": 32, "eager_loss": true,
                       "recompute": "selective_op"})"});
  trips.push_back({"llama3-8b", 8,
                   R"({"dp": 8, "zero": 3, "gbs": 32, "eager_loss": true, "recompute": "full",
                       "recompute_layers": 8})"});
  int n = 0;
  for (const Trip& t : trips) {
    SCOPED_TRACE(t.plan);
    const Model m = model_preset(t.model);
    const Cluster cl = cluster_preset("dgx-h100", t.gpus);
    const Plan p = plan_of(t.plan);
    const Export e = export_torchtitan(m, cl, p);
    const std::string toml = file_named(e, "torchtitan.toml").text;
    const auto dir = write_export(e, "tt_trip" + std::to_string(n++));
    const std::optional<ImportedJob> job =
        import_file((dir / "torchtitan.toml").string(), toml, {});
    ASSERT_TRUE(job.has_value());
    EXPECT_EQ(job->gpus, t.gpus);
    EXPECT_EQ(job->plan["model"], t.model);
    EXPECT_EQ(job->plan["cluster"], "dgx-h100");
    const Plan back = plan_from_json(job->plan);
    Json want = plan_to_json(p), got = plan_to_json(back);
    // etp: torchtitan writes the expert TP degree (a plan's etp = tp says the same as none);
    // the pipeline split: first/last stage layers or a list may say the same split.
    for (Json* j : {&want, &got})
      for (const char* k : {"model", "cluster", "gpus", "etp", "first_stage_layers",
                            "last_stage_layers", "stage_layers"})
        j->erase(k);
    // torchtitan's tensor parallelism is PyTorch's DTensor TP: the import says so (tp_impl torch,
    // the data gradients reduced after the weight gradients).
    if (p.tp > 1) want["tp_impl"] = "torch";
    EXPECT_EQ(got, want);
    EXPECT_EQ(back.expert_tp(), p.expert_tp());
    for (int v = 0; v < p.pp * p.chunks(); ++v)
      EXPECT_EQ(back.layers_in_chunk(m.layers, v % p.pp, v / p.pp),
                p.layers_in_chunk(m.layers, v % p.pp, v / p.pp))
          << "virtual stage " << v;
    // The imported plan is the same job for torchtitan: it exports to the same files.
    const Export again = export_torchtitan(m, cl, back);
    for (size_t i = 0; i < e.files.size(); ++i) EXPECT_EQ(again.files[i].text, e.files[i].text);
  }
}

TEST(TorchtitanImport, NamesWhatItCannotRead) {
  auto field_of = [](const std::string& toml, int gpus = 0) -> std::string {
    try {
      import_torchtitan(toml, gpus);
    } catch (const Error& e) {
      return e.field();
    }
    return "accepted";
  };
  const std::string model = "[model]\nname = \"llama3\"\nflavor = \"8B\"\n";
  const std::string full = "[activation_checkpoint]\nmode = \"full\"\n";
  // torchtitan's default activation checkpointing is its layer-level selective AC, every 2nd
  // block (job_config.py @v0.2.2: mode "selective", selective_ac_option "2"): 16 of 32 layers.
  const std::string shard8 = "[parallelism]\ndata_parallel_shard_degree = 8\n";
  const ImportedJob by_default = import_torchtitan(model + shard8, 8);
  EXPECT_EQ(by_default.plan["recompute"], "full");
  EXPECT_EQ(by_default.plan["recompute_layers"], 16);
  const std::string ac = "[activation_checkpoint]\nmode = \"selective\"\n";
  EXPECT_EQ(import_torchtitan(model + shard8 + ac + "selective_ac_option = \"op\"\n", 8)
                .plan["recompute"],
            "selective_op");
  EXPECT_EQ(
      import_torchtitan(model + shard8 + ac + "selective_ac_option = \"1\"\n", 8).plan["recompute"],
      "full");
  EXPECT_EQ(field_of(model + shard8 + ac + "selective_ac_option = \"every\"\n", 8),
            "torchtitan.activation_checkpoint.selective_ac_option");
  EXPECT_EQ(field_of(model + ac + "[parallelism]\npipeline_parallel_degree = 2\n", 16),
            "torchtitan.activation_checkpoint.selective_ac_option");
  EXPECT_EQ(field_of(model + shard8 + "[activation_checkpoint]\nmode = \"memory_budget\"\n", 8),
            "torchtitan.activation_checkpoint.mode");
  // dp_shard -1 (the rest) needs the GPU count.
  EXPECT_EQ(field_of(model + full), "torchtitan.parallelism.data_parallel_shard_degree");
  EXPECT_EQ(field_of(model + full, 8), "accepted");
  EXPECT_EQ(field_of("[model]\nname = \"llama3\"\nflavor = \"mine\"\n" + full, 8),
            "torchtitan.model.flavor");
  EXPECT_EQ(field_of(model + full +
                         "[parallelism]\npipeline_parallel_degree = 2\n"
                         "pipeline_parallel_schedule = \"ZBVZeroBubble\"\n",
                     16),
            "torchtitan.parallelism.pipeline_parallel_schedule");
  EXPECT_EQ(field_of(model + full + "[parallelism]\ncontext_parallel_degree = 2\n", 16),
            "accepted");
  EXPECT_EQ(field_of(model + full +
                         "[parallelism]\ncontext_parallel_degree = 2\n"
                         "context_parallel_rotate_method = \"ring\"\n",
                     16),
            "torchtitan.parallelism.context_parallel_rotate_method");
  // torchtitan's default rotate method (job_config.py @v0.2.2) is PyTorch's all-gather rotater.
  const std::string cp2 = model + full + "[parallelism]\ncontext_parallel_degree = 2\n";
  EXPECT_EQ(import_torchtitan(cp2, 16).plan["cp_rotate"], "allgather");
  EXPECT_FALSE(import_torchtitan(cp2 + "context_parallel_rotate_method = \"alltoall\"\n", 16)
                   .plan.contains("cp_rotate"));
  // A model given on the command line (--model) where the flavor is no preset.
  Model mine = model_preset("llama3-8b");
  mine.name = "mine";
  const ImportedJob job =
      import_torchtitan("[model]\nname = \"llama3\"\nflavor = \"mine\"\n" + full, 8, &mine);
  EXPECT_FALSE(job.plan.contains("model"));
  EXPECT_EQ(job.plan["seq"], 2048);  // torchtitan's default seq_len
  EXPECT_EQ(job.plan["dp"], 8);
}

// A TOML file that is no torchtitan job says so, instead of "malformed JSON".
TEST(TorchtitanImport, AnotherTomlFileIsNamedAsSuch) {
  try {
    import_file("pyproject.toml", "[tool.poetry]\nname = \"x\"\n", {});
    FAIL() << "accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "--plan");
    EXPECT_NE(e.reason().find("TOML"), std::string::npos) << e.reason();
    EXPECT_NE(e.reason().find("torchtitan"), std::string::npos) << e.reason();
  }
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
  const Plan uneven =
      plan_of(R"({"tp": 8, "tp_impl": "torch", "sp": true, "pp": 8, "dp": 2, "zero": 3,
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
          {"llama3-8b", 8,
           R"({"tp": 2, "tp_impl": "torch", "sp": true, "dp": 4, "zero": 0, "gbs": 64})",
           "plan.zero"},
          {"llama3-8b", 8, R"({"cp": 2, "cp_impl": "torch", "dp": 4, "zero": 0, "gbs": 64})",
           "plan.zero"},
          // Transformer Engine's exchanges (cp_impl te, which they need): both named.
          {"llama3-8b", 8, R"({"cp": 2, "dp": 4, "zero": 3, "gbs": 64, "cp_comm_type": "a2a"})",
           "plan.cp_comm_type, plan.cp_impl"},
          {"llama3-8b", 8, R"({"dp": 8, "zero": 3, "gbs": 64, "offload": "optimizer"})",
           "plan.offload"},
          {"llama3-8b", 8, R"({"dp": 8, "zero": 3, "gbs": 64, "offload": "activations"})",
           "plan.offload"},
          {"llama3-8b", 8, R"({"dp": 8, "zero": 3, "gbs": 64, "recompute": "selective"})",
           "plan.recompute"},
          // 30 of 32 layers: no every-n-th-block option checkpoints 30 (32 / n).
          {"llama3-8b", 8,
           R"({"dp": 8, "zero": 3, "gbs": 64, "recompute": "full", "recompute_layers": 30})",
           "plan.recompute_layers"},
          {"llama3-8b", 8, R"({"tp": 2, "tp_impl": "torch", "dp": 4, "zero": 3, "gbs": 64})",
           "plan.sequence_parallel"},
          // torchtitan's context parallelism is PyTorch's context_parallel, not TE's ring.
          {"llama3-8b", 8, R"({"cp": 2, "dp": 4, "zero": 3, "gbs": 64})", "plan.cp_impl"},
          // torchtitan's tensor parallelism is PyTorch's DTensor TP, not Megatron's layers.
          {"llama3-8b", 8, R"({"tp": 2, "sp": true, "dp": 4, "zero": 3, "gbs": 64})",
           "plan.tp_impl"},
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
          {"llama3-8b", 8, R"({"dp": 8, "zero": 3, "gbs": 64, "attention_kernel": "triton"})",
           "plan.attention_kernel"},
          {"llama3-8b", 8, R"({"dp": 8, "zero": 3, "gbs": 64, "attention_kernel": "fa3"})",
           "plan.attention_kernel"},
          // Without torch.compile torchtitan's loss runs eagerly (components/loss.py).
          {"llama3-8b", 8, R"({"dp": 8, "zero": 3, "gbs": 64, "fused_kernels": false})",
           "plan.eager_loss"},
          {"llama3-8b", 16,
           R"({"pp": 4, "dp": 4, "zero": 3, "reshard": "after_step", "gbs": 64,
           "stage_layers": [8, 6, 10, 8]})",
           "plan.stage_layers"},
          {"mixtral-8x7b", 8,
           R"({"tp": 4, "tp_impl": "torch", "sp": true, "dp": 2, "ep": 2, "etp": 2, "zero": 3,
                              "gbs": 64})",
           "plan.etp"},
      });
}

}  // namespace
}  // namespace parasol::interop
