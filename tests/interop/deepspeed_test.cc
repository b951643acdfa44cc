// Tests of interop/deepspeed: golden files of representative plans, the batch rule checked
// independently, every refusal (by its field), the ds_config.json import and the export ->
// import round trip.
//
// Golden files live in tests/data/export/deepspeed/<case>/. After an intended change of the
// writer, regenerate them with
//   PARASOL_UPDATE_GOLDEN=1 ./build/tests/interop/deepspeed_test
// and review the diff (git diff tests/data/export/deepspeed).
#include "interop/deepspeed.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <string>

#include "core/error.h"
#include "interop/megatron.h"
#include "tests/interop/framework_rules.h"
#include "tests/interop/golden.h"

namespace parasol::interop {
namespace {

namespace fs = std::filesystem;

struct Case {
  const char* name;
  const char* model;
  int gpus;
  const char* plan;
};

const Case kCases[] = {
    // ZeRO-3 with optimizer and parameter offload on one DGX: plain DeepSpeed (an HF model).
    {"llama3_8b_zero3_offload", "llama3-8b", 8,
     R"({"dp": 8, "zero": 3, "zero3_unit": "module", "mbs": 1, "gbs": 64, "recompute": "full",
         "offload": "optimizer,params"})"},
    // The brief's example: TP 8 inside the node, ZeRO-3 across 8 nodes (Megatron-DeepSpeed).
    {"llama3_70b_tp8_zero3", "llama3-70b", 64,
     R"({"tp": 8, "dp": 8, "sp": true, "zero": 3, "zero3_unit": "module", "mbs": 1, "gbs": 128,
         "recompute": "full"})"},
    // Pipeline (DeepSpeed's 1F1B) with ZeRO-1, bf16 gradients.
    {"llama3_70b_tp8_pp4_zero1", "llama3-70b", 64,
     R"({"tp": 8, "pp": 4, "dp": 2, "sp": true, "zero": 1, "mbs": 1, "gbs": 64,
         "recompute": "full", "grad_reduce_dtype": "bf16"})"},
    // Ulysses sequence parallelism over 4 ranks (Megatron-DeepSpeed --ds-sequence-parallel-size):
    // the plan's cp with all-to-all over heads, ZeRO-1 over dp x cp.
    {"llama3_8b_ulysses4_zero1", "llama3-8b", 16,
     R"({"cp": 4, "cp_comm_type": "a2a", "dp": 4, "zero": 1, "mbs": 1, "gbs": 16})"},
};

Export export_case(const Case& c) {
  return export_deepspeed(model_preset(c.model), cluster_preset("dgx-h100", c.gpus),
                          plan_of(c.plan));
}

TEST(DeepSpeedExport, GoldenFiles) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.name);
    const Export e = export_case(c);
    EXPECT_EQ(e.framework, "deepspeed");
    EXPECT_NE(e.version.find("edaa722"), std::string::npos);
    // With sequence parallelism the .deepspeed_env file too.
    ASSERT_EQ(e.files.size(), plan_of(c.plan).sequence_parallel ? 4u : 3u);
    EXPECT_TRUE(file_named(e, "launch_deepspeed.sh").executable);
    expect_golden(e, "deepspeed", c.name);
    EXPECT_EQ(rules::deepspeed_violations(rules::files_of(e)), std::vector<std::string>{});
  }
}

// FlashAttention in Triton (attention_kernel triton) is Megatron-DeepSpeed's
// --use-flash-attn-triton: an option its parser defines (arguments.py L933; the rules check every
// exported option against arguments.py's parser, which exits on any other), written in place of
// --use-flash-attn-v2 (the Triton kernel wins: transformer.py L607-608), read back as the same
// kernel, and refused where flash_attn_triton.py's forward would assert (head dim > 128).
TEST(DeepSpeedExport, TritonFlashAttentionIsAnOptionOfMegatronDeepSpeedsParser) {
  const char* plan =
      R"({"tp": 2, "dp": 4, "zero": 1, "mbs": 1, "gbs": 32, "attention_kernel": "triton"})";
  const Export e =
      export_deepspeed(model_preset("llama3-8b"), cluster_preset("dgx-h100", 8), plan_of(plan));
  const std::string sh = file_named(e, "launch_deepspeed.sh").text;
  const auto flags = rules::flags_of(sh);
  EXPECT_EQ(flags.count("use-flash-attn-triton"), 1u);
  EXPECT_EQ(flags.count("use-flash-attn-v2"), 0u);
  EXPECT_EQ(rules::megatron_deepspeed_options().count("use-flash-attn-triton"), 1u);
  EXPECT_EQ(rules::deepspeed_violations(rules::files_of(e)), std::vector<std::string>{});
  // The oracle refuses an option the parser does not define, and the Triton kernel over
  // 128-wide heads.
  std::map<std::string, std::string> files = rules::files_of(e);
  files["launch_deepspeed.sh"] = std::regex_replace(
      sh, std::regex("--use-flash-attn-triton"), "--use-flash-attn-triton\n  --use-flash-attn-v3");
  EXPECT_EQ(rules::deepspeed_violations(files),
            std::vector<std::string>{
                "Megatron-DeepSpeed arguments.py L60: unrecognized argument --use-flash-attn-v3"});
  files["launch_deepspeed.sh"] =
      std::regex_replace(sh, std::regex("--hidden-size 4096"), "--hidden-size 8192");
  EXPECT_EQ(rules::deepspeed_violations(files),
            std::vector<std::string>{"flash_attn_triton.py _flash_attn_forward: head dim <= 128"});
  // Imported back: the same kernel.
  const auto dir = write_export(e, "ds_triton");
  const std::string path = (dir / "launch_deepspeed.sh").string();
  const std::optional<ImportedJob> job = import_file(path, read_file_text(path), {});
  ASSERT_TRUE(job.has_value());
  EXPECT_EQ(job->plan.value("attention_kernel", ""), "triton");
  EXPECT_EQ(job->plan.value("flash_attention", false), true);
  EXPECT_EQ(plan_to_json(plan_from_json(job->plan)), [&] {
    Json want = plan_to_json(plan_of(plan));
    want["cluster"] = "dgx-h100";
    return want;
  }());
  // flash-attn's Triton forward asserts head dim <= 128: TNLG-530B's heads are 160 wide.
  expect_refusals(export_deepspeed, {{"tnlg-530b", 64,
                                      R"({"tp": 8, "dp": 8, "zero": 1, "mbs": 1, "gbs": 64,
                        "attention_kernel": "triton"})",
                                      "plan.attention_kernel"}});
}

// DeepSpeed's _batch_assertion, computed here from the plan: train_batch_size =
// micro x accumulation x dp (the mpu's data-parallel size).
TEST(DeepSpeedExport, BatchKeysSatisfyDeepSpeedsRule) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.name);
    const Plan p = plan_of(c.plan);
    const Json cfg = parse_json(file_named(export_case(c), "ds_config.json").text, "ds_config");
    const int train = cfg["train_batch_size"], micro = cfg["train_micro_batch_size_per_gpu"],
              accum = cfg["gradient_accumulation_steps"];
    EXPECT_EQ(train, micro * accum * p.dp);
    EXPECT_EQ(train, p.global_batch);
    EXPECT_EQ(micro, p.micro_batch);
    EXPECT_EQ(cfg["zero_optimization"]["stage"], p.zero);
  }
}

TEST(DeepSpeedExport, LauncherAndHostfileCoverTheGpus) {
  const Export e = export_case(kCases[1]);  // 64 GPUs on 8-GPU servers
  const std::string sh = file_named(e, "launch_deepspeed.sh").text;
  EXPECT_NE(sh.find("deepspeed --hostfile=\"$HERE/hostfile\" --num_nodes 8 --num_gpus 8"),
            std::string::npos);
  EXPECT_NE(sh.find("--tensor-model-parallel-size 8"), std::string::npos);
  EXPECT_NE(sh.find("--zero-stage 3"), std::string::npos);
  EXPECT_NE(sh.find("--no-pipeline-parallel"), std::string::npos);
  EXPECT_NE(sh.find("--deepspeed_config \"$HERE/ds_config.json\""), std::string::npos);
  // The folder of the script, wherever it runs from (the Megatron-DeepSpeed checkout).
  EXPECT_NE(sh.find("HERE=$(cd \"$(dirname \"${BASH_SOURCE[0]}\")\" && pwd)\n"), std::string::npos);
  // The model's shape in Megatron-DeepSpeed's flags (arguments.py L602-680, L1269).
  EXPECT_NE(sh.find("--rotary-position-embeddings-theta 500000"), std::string::npos);
  EXPECT_NE(sh.find("--vocab-size 128256"), std::string::npos);
  const std::string hosts = file_named(e, "hostfile").text;
  int slots = 0;
  std::istringstream in(hosts);
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    const auto at = line.find(" slots=");
    ASSERT_NE(at, std::string::npos) << line;
    slots += std::stoi(line.substr(at + 7));
  }
  EXPECT_EQ(slots, 64);
  // With pp > 1 the pipeline engine is used: no --no-pipeline-parallel.
  const std::string pipe = file_named(export_case(kCases[2]), "launch_deepspeed.sh").text;
  EXPECT_EQ(pipe.find("--no-pipeline-parallel"), std::string::npos);
  EXPECT_NE(pipe.find("--pipeline-model-parallel-size 4"), std::string::npos);
  EXPECT_NE(pipe.find("--recompute-method uniform"), std::string::npos);
}

TEST(DeepSpeedExport, OffloadAndPrecisionBlocks) {
  const Json cfg = parse_json(file_named(export_case(kCases[0]), "ds_config.json").text, "c");
  EXPECT_EQ(cfg["zero_optimization"]["offload_optimizer"]["device"], "cpu");
  EXPECT_EQ(cfg["zero_optimization"]["offload_param"]["pin_memory"], true);
  EXPECT_EQ(cfg["bf16"]["enabled"], true);
  EXPECT_FALSE(cfg.contains("fp16"));
  EXPECT_EQ(cfg["data_types"]["grad_accum_dtype"], "fp32");
  EXPECT_EQ(cfg["communication_data_type"], "fp32");
  EXPECT_TRUE(cfg.contains("activation_checkpointing"));
}

// Megatron-DeepSpeed raises "Using sequence parallelism requires setting the environment
// variable CUDA_DEVICE_MAX_CONNECTIONS to 1" (megatron/arguments.py L401-407) on any rank
// without it; DeepSpeed's runner gives other nodes only its prefixes (MLFLOW, PYTHON, MV2, UCX,
// NCCL: launcher/runner.py L37, L609-614) and the lines of the DS_ENV_FILE file (L39-40,
// L616-623). With sequence parallelism the export writes .deepspeed_env and the launcher exports
// the variable and points DS_ENV_FILE at the file; without it, neither.
TEST(DeepSpeedExport, SequenceParallelCarriesCudaDeviceMaxConnections) {
  const Export sp = export_case(kCases[1]);  // tp 8 with sp
  const std::string& env = file_named(sp, ".deepspeed_env").text;
  EXPECT_EQ(env, "CUDA_DEVICE_MAX_CONNECTIONS=1\n");  // KEY=VALUE lines only (runner.py L621)
  EXPECT_FALSE(file_named(sp, ".deepspeed_env").executable);
  const std::string sh = file_named(sp, "launch_deepspeed.sh").text;
  const size_t exported = sh.find("\nexport CUDA_DEVICE_MAX_CONNECTIONS=1\n");
  const size_t env_file = sh.find("\nexport DS_ENV_FILE=\"$HERE/.deepspeed_env\"\n");
  const size_t launch = sh.find("\ndeepspeed ");
  ASSERT_NE(exported, std::string::npos) << sh;
  ASSERT_NE(env_file, std::string::npos) << sh;
  ASSERT_NE(launch, std::string::npos) << sh;
  EXPECT_LT(exported, launch);
  EXPECT_LT(env_file, launch);
  EXPECT_GT(env_file, sh.find("\nHERE="));  // after HERE is set
  EXPECT_EQ(rules::deepspeed_violations(rules::files_of(sp)), std::vector<std::string>{});
  // The oracle sees a launcher without the variable.
  auto files = rules::files_of(sp);
  files.erase(".deepspeed_env");
  EXPECT_FALSE(rules::deepspeed_violations(files).empty());
  // Without sequence parallelism: no file, no variable.
  const Export plain = export_deepspeed(model_preset("llama3-8b"), cluster_preset("dgx-h100", 16),
                                        plan_of(R"({"tp": 2, "dp": 8, "zero": 1, "gbs": 64})"));
  EXPECT_THROW(file_named(plain, ".deepspeed_env"), std::runtime_error);
  EXPECT_EQ(file_named(plain, "launch_deepspeed.sh").text.find("CUDA_DEVICE_MAX_CONNECTIONS"),
            std::string::npos);
}

// Every reason at once: the fields joined, each reason in the message.
TEST(DeepSpeedExport, ARefusalNamesEveryReason) {
  const Model m = model_preset("llama3-8b");
  const Plan p = plan_of(R"({"cp": 2, "dp": 4, "zero": 1, "gbs": 64, "offload": "params",
                             "precision": "fp8"})");
  try {
    export_deepspeed(m, cluster_preset("dgx-h100", 8), p);
    FAIL() << "accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "plan.cp_comm_type, plan.precision, plan.offload");
    EXPECT_NE(e.reason().find("3 reasons"), std::string::npos) << e.reason();
    EXPECT_NE(e.reason().find("Ulysses"), std::string::npos) << e.reason();
    EXPECT_NE(e.reason().find("offload_param"), std::string::npos) << e.reason();
  }
}

// Each refusal names its plan field.
TEST(DeepSpeedExport, RefusesWhatDeepSpeedCannotRun) {
  expect_refusals(
      export_deepspeed,
      {
          {"llama3-8b", 16, R"({"pp": 2, "dp": 8, "zero": 2, "gbs": 64})", "plan.zero"},
          {"llama3-8b", 16, R"({"pp": 2, "dp": 8, "zero": 3, "gbs": 64})", "plan.zero"},
          {"llama3-8b", 16,
           R"({"pp": 2, "dp": 8, "zero": 0, "gbs": 64, "grad_reduce_dtype": "bf16",
           "overlap_grad_reduce": false})",
           "plan.zero"},
          {"llama3-8b", 16, R"({"pp": 2, "dp": 8, "zero": 1, "gbs": 64, "schedule": "gpipe"})",
           "plan.schedule"},
          {"llama3-8b", 16,
           R"({"pp": 2, "dp": 8, "zero": 1, "gbs": 64, "schedule": "interleaved", "vpp": 2})",
           "plan.vpp"},
          {"llama3-8b", 8, R"({"dp": 8, "zero": 1, "gbs": 64, "offload": "params"})",
           "plan.offload"},
          {"llama3-8b", 8, R"({"dp": 8, "zero": 1, "gbs": 64, "offload": "activations"})",
           "plan.offload"},
          {"llama3-8b", 8, R"({"dp": 4, "cp": 2, "zero": 1, "gbs": 64})", "plan.cp_comm_type"},
          // Megatron-DeepSpeed has flash-attn 2 and its Triton kernel, no FlashAttention-3.
          {"llama3-8b", 8, R"({"tp": 2, "dp": 4, "zero": 1, "gbs": 64, "attention_kernel": "fa3"})",
           "plan.attention_kernel"},
          // An uneven split is refused naming the field that sets it.
          {"llama3-8b", 16, R"({"pp": 2, "dp": 8, "zero": 1, "gbs": 64, "stage_layers": [15, 17]})",
           "plan.stage_layers"},
          {"llama3-8b", 16,
           R"({"pp": 2, "dp": 8, "zero": 1, "gbs": 64,
           "account_for_embedding_in_pipeline_split": true,
           "account_for_loss_in_pipeline_split": true})",
           "plan.account_for_embedding_in_pipeline_split"},
          {"llama3-8b", 8, R"({"dp": 8, "zero": 3, "gbs": 64, "reshard": "after_backward"})",
           "plan.reshard"},
          {"llama3-8b", 8, R"({"dp": 8, "zero": 3, "gbs": 64, "reshard": "after_step"})",
           "plan.reshard"},
          {"llama3-8b", 16, R"({"dp": 16, "zero": 1, "gbs": 64, "shard_degree": 8})",
           "plan.shard_degree"},
          {"mixtral-8x7b", 8, R"({"dp": 8, "ep": 8, "zero": 1, "gbs": 64})", "plan.ep"},
          {"llama3-8b", 8,
           R"({"dp": 8, "zero": 1, "gbs": 64, "precision": "fp16", "grad_reduce_dtype": "bf16"})",
           "plan.grad_reduce_dtype"},
          {"llama3-8b", 8, R"({"dp": 8, "zero": 0, "gbs": 64, "grad_reduce_dtype": "bf16"})",
           "plan.overlap_grad_reduce"},
          {"llama3-8b", 8, R"({"dp": 8, "zero": 1, "gbs": 64, "recompute": "selective"})",
           "plan.recompute"},
          {"llama3-8b", 8, R"({"dp": 8, "zero": 1, "gbs": 64, "recompute": "selective_op"})",
           "plan.recompute"},
          {"llama3-8b", 8,
           R"({"dp": 8, "zero": 1, "gbs": 64, "recompute": "full", "recompute_layers": 4})",
           "plan.recompute_layers"},
          {"llama3-8b", 16,
           R"({"tp": 2, "sp": true, "pp": 2, "dp": 4, "zero": 1, "gbs": 64, "recompute": "full",
           "recompute_layers": 4})",
           "plan.recompute_layers"},
          {"llama3-8b", 8, R"({"dp": 8, "zero": 1, "gbs": 64, "precision": "fp8"})",
           "plan.precision"},
          {"llama3-8b", 8, R"({"dp": 8, "zero": 1, "gbs": 64, "optimizer_dtype": "bf16"})",
           "plan.grad_reduce_dtype"},
          {"llama3-8b", 16,
           R"({"tp": 2, "sp": true, "pp": 2, "dp": 4, "zero": 1, "gbs": 64,
           "rank_order": "tp-cp-ep-pp-dp"})",
           "plan.rank_order"},
          {"llama3-8b", 8,
           R"({"tp": 8, "sp": true, "zero": 1, "gbs": 64, "tp_comm_overlap": true})",
           "plan.tp_comm_overlap"},
      });
}

// Export then import gives the plan back: every field the config and Megatron-DeepSpeed's
// parallel arguments carry.
TEST(DeepSpeedRoundTrip, ExportThenImportGivesThePlanBack) {
  struct Trip {
    const char* model;
    int gpus;
    const char* plan;
  };
  const Trip trips[] = {
      {"llama3-8b", 8, kCases[0].plan},
      {"llama3-70b", 64, kCases[1].plan},
      {"llama3-8b", 16, kCases[3].plan},  // Ulysses: cp 4, a2a
      {"llama3-70b", 64,
       R"({"tp": 8, "pp": 4, "dp": 2, "sp": true, "zero": 1, "mbs": 2, "gbs": 64,
           "grad_reduce_dtype": "bf16"})"},
      {"llama3-8b", 16,
       R"({"dp": 16, "zero": 3, "zero3_unit": "module", "mbs": 2, "gbs": 256, "shard_degree": 8,
           "overlap_param_gather": false, "zero3_max_live_parameters": 3000000000,
           "zero3_max_reuse_distance": 3000000000, "zero3_reduce_bucket": 90000000})"},
      {"llama3-8b", 8,
       R"({"dp": 8, "zero": 2, "mbs": 4, "gbs": 32, "overlap_grad_reduce": false})"},
      {"llama3-8b", 8,
       R"({"dp": 8, "zero": 1, "mbs": 1, "gbs": 16, "precision": "fp16",
           "offload": "optimizer"})"},
      {"llama3-8b", 8,
       R"({"dp": 8, "zero": 1, "mbs": 1, "gbs": 8, "optimizer_dtype": "bf16",
           "grad_reduce_dtype": "bf16"})"},
      {"llama3-8b", 8, R"({"dp": 8, "zero": 0, "mbs": 1, "gbs": 8, "overlap_grad_reduce": false})"},
      {"llama3-8b", 8,
       R"({"dp": 8, "zero": 0, "mbs": 1, "gbs": 8, "precision": "fp32",
           "overlap_grad_reduce": false, "recompute": "full", "offload": "activations"})"},
  };
  for (const Trip& t : trips) {
    SCOPED_TRACE(t.plan);
    const Plan p = plan_of(t.plan);
    const Export e = export_deepspeed(model_preset(t.model), cluster_preset("dgx-h100", t.gpus), p);
    const Json cfg = parse_json(file_named(e, "ds_config.json").text, "ds_config.json");
    const ImportedJob job =
        import_deepspeed(cfg, p.gpus(), {p.tp, p.pp, p.sequence_parallel, p.cp});
    EXPECT_EQ(job.gpus, p.gpus());
    EXPECT_FALSE(job.model.has_value());
    EXPECT_EQ(plan_from_json(job.plan).gpus(), p.gpus());
    EXPECT_EQ(job.plan.dump(), plan_to_json(p).dump());
  }
}

// DeepSpeed's ZeRO-3 is per-module gathers (zero3_unit module) bounded by its coordinator's
// sizes: Megatron-DeepSpeed's 1T recipe (examples_deepspeed/azure/run-1t.sh @4efb479d) reads
// back with its stage3_max_live_parameters, stage3_max_reuse_distance and reduce_bucket_size as
// it writes them (3e9: JSON numbers), and the exported config carries the plan's.
TEST(DeepSpeedImport, ReadsTheZero3CoordinatorSizes) {
  const Json cfg = parse_json(R"({"train_batch_size": 8192, "train_micro_batch_size_per_gpu": 8,
    "zero_optimization": {"stage": 3, "stage3_max_live_parameters": 3e9,
      "stage3_max_reuse_distance": 3e9, "stage3_param_persistence_threshold": 1e4,
      "stage3_prefetch_bucket_size": 5e7, "contiguous_gradients": true, "overlap_comm": true,
      "reduce_bucket_size": 90000000, "sub_group_size": 1e9,
      "offload_optimizer": {"device": "cpu", "pin_memory": true}},
    "fp16": {"enabled": true}, "gradient_clipping": 1.0})",
                              "c");
  const Plan p = plan_from_json(import_deepspeed(cfg, 1024).plan);
  EXPECT_EQ(p.zero3_unit, GatherUnit::kModule);
  EXPECT_EQ(p.zero3_max_live_parameters, 3000000000);
  EXPECT_EQ(p.zero3_max_reuse_distance, 3000000000);
  EXPECT_EQ(p.zero3_prefetch_bucket, 50000000);
  EXPECT_EQ(p.zero3_reduce_bucket, 90000000);
  EXPECT_EQ(p.zero3_param_persistence_threshold, 10000);
  EXPECT_TRUE(p.overlap_param_gather);
  EXPECT_TRUE(p.offload.optimizer);
  const Export e =
      export_deepspeed(model_preset("megatron-1t"), cluster_preset("dgx-a100-80g", 1024), p);
  const Json out = parse_json(file_named(e, "ds_config.json").text, "ds_config.json");
  const Json& z = out["zero_optimization"];
  EXPECT_EQ(z["stage3_max_live_parameters"], 3000000000);
  EXPECT_EQ(z["stage3_max_reuse_distance"], 3000000000);
  EXPECT_EQ(z["stage3_prefetch_bucket_size"], 50000000);
  EXPECT_EQ(z["reduce_bucket_size"], 90000000);
  EXPECT_EQ(z["stage3_param_persistence_threshold"], 10000);
  // A fractional size names its key.
  const Json bad = parse_json(R"({"train_batch_size": 8,
    "zero_optimization": {"stage": 3, "stage3_max_live_parameters": 1.5}})",
                              "c");
  try {
    import_deepspeed(bad, 8);
    ADD_FAILURE() << "a fractional stage3_max_live_parameters was accepted";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("stage3_max_live_parameters"), std::string::npos)
        << err.what();
  }
}

TEST(DeepSpeedImport, ReadsAHandWrittenConfig) {
  const Json cfg = parse_json(R"({
    "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4,
    "zero_optimization": {"stage": 2, "overlap_comm": true,
                          "offload_optimizer": {"device": "cpu"}},
    "fp16": {"enabled": true}, "optimizer": {"type": "AdamW"}})",
                              "c");
  const Plan p = plan_from_json(import_deepspeed(cfg, 16).plan);
  EXPECT_EQ(p.dp, 16);
  EXPECT_EQ(p.global_batch, 2 * 4 * 16);
  EXPECT_EQ(p.zero, 2);
  EXPECT_TRUE(p.offload.optimizer);
  EXPECT_FALSE(p.offload.params);
  EXPECT_EQ(p.precision, Dtype::kFp16);
  EXPECT_EQ(p.grad_reduce_dtype, Dtype::kFp16);  // DeepSpeed's default: the model's dtype
  // communication_data_type is the reduction dtype; grad_accum_dtype only the buffer.
  const Json comm = parse_json(R"({"train_batch_size": 8, "bf16": {"enabled": true},
      "zero_optimization": {"stage": 2}, "communication_data_type": "fp32",
      "data_types": {"grad_accum_dtype": "bf16"}})",
                               "c");
  EXPECT_EQ(plan_from_json(import_deepspeed(comm, 8).plan).grad_reduce_dtype, Dtype::kFp32);
  EXPECT_EQ(p.recompute, Recompute::kNone);
  // dp = gpus / (tp x pp): Megatron-DeepSpeed's mpu.
  EXPECT_EQ(plan_from_json(import_deepspeed(cfg, 16, {2, 2, true}).plan).global_batch, 2 * 4 * 4);
}

TEST(DeepSpeedImport, AutoIsDerivedFromTheOtherKeysOrNamed) {
  const Json derived = parse_json(
      R"({"train_batch_size": 64, "train_micro_batch_size_per_gpu": "auto",
          "gradient_accumulation_steps": 2})",
      "c");
  EXPECT_EQ(plan_from_json(import_deepspeed(derived, 8).plan).micro_batch, 64 / (2 * 8));
  const Json all_auto = parse_json(
      R"({"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto",
          "gradient_accumulation_steps": "auto"})",
      "c");
  try {
    import_deepspeed(all_auto, 8);
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "deepspeed.train_micro_batch_size_per_gpu");
  }
  const Json bf16_auto = parse_json(R"({"train_batch_size": 8, "bf16": {"enabled": "auto"}})", "c");
  try {
    import_deepspeed(bf16_auto, 8);
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "deepspeed.bf16.enabled");
  }
}

TEST(DeepSpeedImport, InconsistentKeysAreNamed) {
  auto field_of = [](const char* json, int gpus) -> std::string {
    try {
      import_deepspeed(parse_json(json, "c"), gpus);
    } catch (const Error& e) {
      return e.field();
    }
    return "accepted";
  };
  EXPECT_EQ(field_of(R"({"train_batch_size": 64, "train_micro_batch_size_per_gpu": 2,
                         "gradient_accumulation_steps": 2})",
                     8),
            "deepspeed.train_batch_size");  // 2 x 2 x 8 = 32
  EXPECT_EQ(field_of(R"({"train_batch_size": 60, "train_micro_batch_size_per_gpu": 2})", 8),
            "deepspeed.train_batch_size");  // 60 is not a multiple of 16
  EXPECT_EQ(field_of(R"({"train_batch_size": 8, "zero_optimization": {"stage": 1,
                         "offload_param": {"device": "cpu"}}})",
                     8),
            "deepspeed.zero_optimization.offload_param");
  EXPECT_EQ(field_of(R"({"train_batch_size": 8, "zero_optimization": {"stage": 3,
                         "offload_param": {"device": "nvme"}}})",
                     8),
            "deepspeed.zero_optimization.offload_param.device");
  EXPECT_EQ(field_of(R"({"train_batch_size": 8, "zero_optimization": {"stage": 3,
                         "zero_hpz_partition_size": 8}})",
                     8),
            "deepspeed.zero_optimization.zero_hpz_partition_size");
  EXPECT_EQ(field_of(R"({"train_batch_size": 8, "bf16": {"enabled": true},
                         "fp16": {"enabled": true}})",
                     8),
            "deepspeed.fp16");
  EXPECT_EQ(field_of(R"({"train_batch_size": 8, "bf16": {"enabled": true},
                         "data_types": {"grad_accum_dtype": "fp32"}})",
                     8),
            "deepspeed.data_types.grad_accum_dtype");
  try {
    import_deepspeed(parse_json(R"({"train_batch_size": 8})", "c"), 12, {8, 1, false});
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "gpus");  // 12 GPUs are no multiple of tp x pp = 8
  }
}

// The --plan hook's test of a file's kind: DeepSpeed's keys and no plan degrees.
TEST(DeepSpeedImport, RecognisesAConfigButNotAPlan) {
  EXPECT_TRUE(looks_like_deepspeed_config(parse_json(R"({"train_batch_size": 8})", "c")));
  EXPECT_TRUE(
      looks_like_deepspeed_config(parse_json(R"({"zero_optimization": {"stage": 3}})", "c")));
  EXPECT_FALSE(looks_like_deepspeed_config(parse_json(R"({"tp": 2, "train_batch_size": 8})", "c")));
  EXPECT_FALSE(looks_like_deepspeed_config(parse_json(R"({"tp": 2, "gbs": 8})", "c")));
  EXPECT_FALSE(looks_like_deepspeed_config(parse_json("[1, 2]", "c")));
}

// The exported launcher reads back (import_file, as `--plan launch_deepspeed.sh`): every flag it
// writes is read, the config it names comes from its folder, the cluster from its export tag,
// and the plan is the exported one. The ds_config.json of the folder reads back the same job
// without --model, --gpus or --tp (from the launcher beside it).
TEST(DeepSpeedRoundTrip, TheLauncherAndItsConfigReadBackAsThePlan) {
  struct Trip {
    const char* model;
    int gpus;
    const char* plan;
  };
  const Trip trips[] = {
      {"llama3-70b", 64, kCases[1].plan},  // Megatron-DeepSpeed, tp 8, sp, ZeRO-3
      {"llama3-70b", 64, kCases[2].plan},  // Megatron-DeepSpeed, tp 8, pp 4
      {"llama3-8b", 16, kCases[3].plan},   // Megatron-DeepSpeed, Ulysses 4
      {"llama3-8b", 8, kCases[0].plan},    // plain DeepSpeed: the model from the tag
      {"llama3-8b", 16,
       R"({"tp": 2, "dp": 8, "zero": 1, "mbs": 2, "gbs": 64, "flash_attention": false,
           "recompute": "selective", "precision": "fp16"})"},
  };
  int n = 0;
  for (const Trip& t : trips) {
    SCOPED_TRACE(t.plan);
    const Model m = model_preset(t.model);
    const Cluster cl = cluster_preset("dgx-h100", t.gpus);
    const Plan p = plan_of(t.plan);
    const Export e = export_deepspeed(m, cl, p);
    const auto dir = write_export(e, "ds_trip" + std::to_string(n++));
    Json want = plan_to_json(p);
    want["cluster"] = "dgx-h100";
    const bool megatron = p.tp > 1 || p.pp > 1 || p.cp > 1;
    if (!megatron) want["model"] = t.model;  // the plain launcher names the model in its tag
    for (const char* file : {"launch_deepspeed.sh", "ds_config.json"}) {
      SCOPED_TRACE(file);
      const std::string text = read_file_text(dir / file);
      const std::optional<ImportedJob> job = import_file((dir / file).string(), text, {});
      ASSERT_TRUE(job.has_value());
      EXPECT_EQ(job->gpus, t.gpus);
      EXPECT_EQ(plan_to_json(plan_from_json(job->plan)), want);
      ASSERT_EQ(job->model.has_value(), megatron);
      if (megatron) {
        Model back = *job->model;
        back.name = m.name;
        EXPECT_EQ(model_to_json(back), model_to_json(m));
      }
    }
  }
}

// A bare ds_config.json does not describe the model: without --model (or a parasol
// launch_deepspeed.sh beside it) the import names --model instead of estimating a default
// model; --gpus and --cluster likewise.
TEST(DeepSpeedImport, AConfigAloneNeedsTheModelTheGpusAndTheCluster) {
  const Export e = export_case(kCases[0]);
  const auto dir = write_export(e, "ds_alone");
  std::filesystem::remove(dir / "launch_deepspeed.sh");
  const std::string path = (dir / "ds_config.json").string(), text = read_file_text(path);
  auto field_of = [&](const ImportOptions& o) -> std::string {
    try {
      import_file(path, text, o);
    } catch (const Error& err) {
      return err.field();
    }
    return "accepted";
  };
  ImportOptions o;
  o.gpus = 8;
  EXPECT_EQ(field_of(o), "--model");
  o.model = "llama3-8b";
  EXPECT_EQ(field_of(o), "--cluster");
  o.cluster_given = true;
  EXPECT_EQ(field_of(o), "accepted");
  o.gpus = 0;
  EXPECT_EQ(field_of(o), "--gpus");
}

// A Megatron-DeepSpeed launcher needs the config it names: without it the import names
// --deepspeed_config (its ZeRO stage, precision and batches are there).
TEST(DeepSpeedImport, AMegatronDeepSpeedLauncherNeedsItsConfig) {
  const Export e = export_case(kCases[1]);
  const std::string sh = file_named(e, "launch_deepspeed.sh").text;
  try {
    import_megatron(sh, "launch");
    FAIL() << "accepted";
  } catch (const Error& err) {
    EXPECT_EQ(err.field(), "--deepspeed_config");
  }
  const auto dir = write_export(e, "ds_noconfig");
  std::filesystem::remove(dir / "ds_config.json");
  try {
    import_file((dir / "launch_deepspeed.sh").string(), sh, {});
    FAIL() << "accepted";
  } catch (const Error& err) {
    EXPECT_EQ(err.field(), "--deepspeed_config");
  }
  // A config that disagrees with the arguments is named.
  const Json config = parse_json(file_named(e, "ds_config.json").text, "c");
  Json other = config;
  other["zero_optimization"]["stage"] = 1;
  try {
    import_megatron(sh, "launch", 0, &other);
    FAIL() << "accepted";
  } catch (const Error& err) {
    EXPECT_EQ(err.field(), "--zero-stage");
  }
}

// DeepSpeed's Ulysses sequence parallelism is the plan's cp with cp_comm_type a2a; a ring
// (p2p, all_gather, a2a+p2p) is not what DeepSpeed runs, and Megatron-DeepSpeed runs Ulysses
// without tensor or pipeline parallelism (parallel_state.py L144-147).
TEST(DeepSpeedExport, UlyssesIsAllToAllContextParallelismAlone) {
  const Export e = export_case(kCases[3]);
  const std::string sh = file_named(e, "launch_deepspeed.sh").text;
  EXPECT_NE(sh.find("--ds-sequence-parallel-size 4"), std::string::npos) << sh;
  EXPECT_NE(sh.find("--use-flash-attn-v2"), std::string::npos) << sh;
  EXPECT_EQ(sh.find("--context-parallel-size"), std::string::npos) << sh;
  // The batch rule counts dp = 16 / 4 ranks.
  const Json cfg = parse_json(file_named(e, "ds_config.json").text, "c");
  EXPECT_EQ(cfg["train_batch_size"].get<int>(), cfg["train_micro_batch_size_per_gpu"].get<int>() *
                                                    cfg["gradient_accumulation_steps"].get<int>() *
                                                    4);
  expect_refusals(
      export_deepspeed,
      {
          {"llama3-8b", 16, R"({"cp": 4, "dp": 4, "zero": 1, "gbs": 16})", "plan.cp_comm_type"},
          {"llama3-8b", 16, R"({"cp": 4, "cp_comm_type": "all_gather", "dp": 4, "zero": 1,
                               "gbs": 16})",
           "plan.cp_comm_type"},
          {"llama3-8b", 16, R"({"tp": 2, "cp": 4, "cp_comm_type": "a2a", "dp": 2, "zero": 1,
                               "gbs": 16})",
           "plan.cp"},
      });
  // The oracle refuses what Megatron-DeepSpeed refuses.
  auto files = rules::files_of(e);
  std::string& text = files["launch_deepspeed.sh"];
  text.replace(text.find("--tensor-model-parallel-size 1"), 30, "--tensor-model-parallel-size 2");
  EXPECT_FALSE(rules::deepspeed_violations(files).empty());
}

// A config's sequence_parallel_size (DeepSpeed config.py L721-722) or Megatron-DeepSpeed's
// --ds-sequence-parallel-size reads as cp with a2a, dp = gpus / (tp x pp x sp); what
// Megatron-DeepSpeed refuses beside it is named.
TEST(DeepSpeedImport, ReadsUlyssesSequenceParallelism) {
  const Json cfg = parse_json(R"({"train_micro_batch_size_per_gpu": 1,
    "gradient_accumulation_steps": 2, "sequence_parallel_size": 4, "bf16": {"enabled": true},
    "zero_optimization": {"stage": 3}})",
                              "c");
  const Plan p = plan_from_json(import_deepspeed(cfg, 16).plan);
  EXPECT_EQ(p.cp, 4);
  EXPECT_EQ(p.cp_comm_type, CpCommType::kA2a);
  EXPECT_EQ(p.dp, 4);
  EXPECT_EQ(p.global_batch, 1 * 2 * 4);
  // The flag says the same: accepted; it says otherwise: the key is named.
  EXPECT_EQ(plan_from_json(import_deepspeed(cfg, 16, {1, 1, false, 4}).plan).cp, 4);
  auto field_of = [](const Json& c, int gpus, const DeepSpeedParallelism& mp) -> std::string {
    try {
      import_deepspeed(c, gpus, mp);
    } catch (const Error& err) {
      return err.field();
    }
    return "accepted";
  };
  EXPECT_EQ(field_of(cfg, 16, {1, 1, false, 2}), "deepspeed.sequence_parallel_size");
  EXPECT_EQ(field_of(cfg, 16, {2, 1, false, 1}), "deepspeed.sequence_parallel_size");
  EXPECT_EQ(field_of(cfg, 6, {}), "deepspeed.sequence_parallel_size");
  Json flag_only = cfg;
  flag_only.erase("sequence_parallel_size");
  EXPECT_EQ(field_of(flag_only, 16, {1, 2, false, 4}), "--ds-sequence-parallel-size");
  EXPECT_EQ(field_of(flag_only, 16, {2, 1, true, 4}), "--ds-sequence-parallel-size");
  EXPECT_EQ(plan_from_json(import_deepspeed(flag_only, 16, {1, 1, false, 4}).plan).dp, 4);
  // Megatron-DeepSpeed's launcher without a fused attention: parasol's a2a prices one.
  const Export e = export_case(kCases[3]);
  std::string sh = file_named(e, "launch_deepspeed.sh").text;
  const Json config = parse_json(file_named(e, "ds_config.json").text, "c");
  sh.replace(sh.find("--use-flash-attn-v2"), 19, "");
  try {
    import_megatron(sh, "launch", 16, &config);
    FAIL() << "accepted";
  } catch (const Error& err) {
    EXPECT_EQ(err.field(), "--ds-sequence-parallel-size");
  }
}

}  // namespace
}  // namespace parasol::interop
