// Tests of the Megatron-LM writer and reader (interop/megatron.h) and the training log reader
// (interop/megatron_log.h): golden files of representative exports, refusals naming the field,
// export -> import round trips of model and plan, argument-list parsing edge cases, log parsing.
//
// Golden files: tests/data/export/megatron/<case>/<file>. After an intended change of the
// export, regenerate them with
//   PARASOL_UPDATE_GOLDEN=1 build/tests/interop/megatron_test --gtest_filter='MegatronGolden.*'
// and review the diff.
#include "interop/megatron.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "core/error.h"
#include "interop/megatron_log.h"
#include "tests/interop/framework_rules.h"
#include "tests/interop/golden.h"

namespace parasol::interop {
namespace {

struct Case {
  std::string name;
  std::string model;
  std::string cluster;
  int gpus;
  Json plan;
};

Plan make_plan(const Case& c, const Model& m, const Cluster& cl) {
  Plan p = plan_from_json(c.plan);
  validate(p, m, cl);  // every case is a plan parasol accepts
  return p;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Golden cases: dense 3D with sp (GPT-3 175B as in Megatron's example), MoE with interleaving,
// etp != tp, the distributed optimizer and selective recompute, and FSDP with cp, fp8, a
// pipeline layout and full recompute.
std::vector<Case> golden_cases() {
  return {
      {"gpt3_175b_3d", "gpt3-175b", "dgx-a100-80g", 1024,
       Json{{"tp", 8}, {"pp", 8}, {"dp", 16}, {"sp", true}, {"gbs", 1536}}},
      {"mixtral_moe_interleaved", "mixtral-8x7b", "dgx-h100", 64,
       Json{{"tp", 2},
            {"pp", 4},
            {"dp", 8},
            {"ep", 8},
            {"etp", 1},
            {"vpp", 2},
            {"sp", true},
            {"zero", 1},
            {"gbs", 256},
            {"recompute", "selective"},
            {"recompute_modules", {"core_attn", "moe_act"}},
            {"moe_dispatcher", "deepep"}}},
      {"llama3_70b_fsdp_cp", "llama3-70b", "dgx-h100", 64,
       Json{{"tp", 4},
            {"pp", 2},
            {"cp", 2},
            {"dp", 4},
            {"zero", 3},
            {"seq", 16384},
            {"precision", "fp8"},
            {"gbs", 64},
            {"stage_layers", {38, 42}},
            {"recompute", "full"},
            {"recompute_layers", 10},
            {"attention_kernel", "cudnn"}}},
  };
}

TEST(MegatronGolden, ExportsMatchTheGoldenFiles) {
  for (const Case& c : golden_cases()) {
    SCOPED_TRACE(c.name);
    const Model m = model_preset(c.model);
    const Cluster cl = load_cluster(c.cluster, c.gpus);
    const Export e = export_megatron(m, cl, make_plan(c, m, cl));
    EXPECT_EQ(e.framework, "megatron");
    EXPECT_NE(e.version.find("Megatron-Core"), std::string::npos);
    ASSERT_EQ(e.files.size(), 2u);
    expect_golden(e, "megatron", c.name);
    EXPECT_FALSE(e.files[0].executable);
    EXPECT_TRUE(e.files[1].executable);
    // Megatron's own checks (tests/interop/framework_rules.h) accept the arguments.
    EXPECT_EQ(rules::megatron_violations(e.files[0].text), std::vector<std::string>{});
  }
}

// validate_args asserts max_position_embeddings >= seq_length (arguments.py L1353-1356): a RoPE
// model trained past its positions (Llama 3 70B, 8,192 positions, at 16,384 with cp 2) gets the
// sequence length; a shorter sequence keeps the model's count.
TEST(MegatronExport, MaxPositionEmbeddingsCoversTheSequence) {
  const Model m = model_preset("llama3-70b");
  const Cluster cl = load_cluster("dgx-h100", 64);
  for (const int64_t seq : {int64_t{4096}, m.seq_len, 2 * m.seq_len, 4 * m.seq_len}) {
    SCOPED_TRACE(seq);
    Plan p;
    p.tp = 8;
    p.cp = 2;
    p.dp = 4;
    p.sequence_parallel = true;
    p.global_batch = 64;
    p.seq_len = seq;
    ASSERT_NO_THROW(validate(p, m, cl));
    const auto f = rules::flags_of(export_megatron(m, cl, p).files[0].text);
    EXPECT_EQ(std::stoll(f.at("seq-length").at(0)), seq);
    EXPECT_EQ(std::stoll(f.at("max-position-embeddings").at(0)), std::max(seq, m.seq_len));
  }
}

// Megatron-Core's checks of --overlap-moe-expert-parallel-comm (transformer_config.py
// L3002-3046 at d98e8a6; combined_1f1b.py L205-214): each breaks the export naming its field,
// and a plan meeting them all exports with arguments those checks accept.
TEST(MegatronExport, EpOverlapFollowsMegatronCoresChecks) {
  const Model m = model_preset("mixtral-8x7b");
  const Cluster cl = load_cluster("dgx-h100", 64);
  Plan ok;  // interleaved, ep 8, bf16, no recompute: accepted
  ok.tp = 2;
  ok.pp = 2;
  ok.vpp = 2;
  ok.schedule = Schedule::kInterleaved;
  ok.dp = 16;
  ok.ep = 8;
  ok.sequence_parallel = true;
  ok.global_batch = 256;
  ok.ep_comm_overlap = true;
  ASSERT_NO_THROW(validate(ok, m, cl));
  const Export e = export_megatron(m, cl, ok);
  EXPECT_NE(e.files[0].text.find("--overlap-moe-expert-parallel-comm"), std::string::npos);
  EXPECT_EQ(rules::megatron_violations(e.files[0].text), std::vector<std::string>{});
  auto refused_field = [&](const Plan& p) -> std::string {
    try {
      export_megatron(m, cl, p);
    } catch (const Error& err) {
      return err.field();
    }
    return "accepted";
  };
  Plan p = ok;  // L3020-3029: full recompute
  p.recompute = Recompute::kFull;
  EXPECT_EQ(refused_field(p), "plan.recompute");
  p = ok;  // L3030-3032: 'moe' in recompute_modules
  p.recompute = Recompute::kSelective;
  p.recompute_modules = 1u << static_cast<int>(RecomputeModule::kMoe);
  EXPECT_EQ(refused_field(p), "plan.recompute_modules");
  p.recompute_modules = 1u << static_cast<int>(RecomputeModule::kMoeAct);  // other modules: fine
  EXPECT_EQ(refused_field(p), "accepted");
  p = ok;  // L3007-3011: pp > 1 without virtual stages
  p.vpp = 1;
  p.schedule = Schedule::k1F1B;
  EXPECT_EQ(refused_field(p), "plan.vpp");
  p = ok;  // L3034-3037: an fp32 model
  p.precision = Dtype::kFp32;
  EXPECT_EQ(refused_field(p), "plan.precision");
  p.precision = Dtype::kFp8;  // fp8 trains a bf16 model (--bf16 --fp8-format)
  EXPECT_EQ(refused_field(p), "accepted");
  p = ok;  // L3012-3015: no expert parallelism
  p.ep = 1;
  EXPECT_EQ(refused_field(p), "plan.ep");
  p = ok;  // combined_1f1b.py L205-214: Megatron FSDP under the interleaved combined 1F1B
  p.zero = 3;
  EXPECT_EQ(refused_field(p), "plan.zero");
  p = ok;  // without a pipeline there is no virtual-stage rule
  p.pp = 1;
  p.vpp = 1;
  p.schedule = Schedule::k1F1B;
  p.dp = 32;
  EXPECT_EQ(refused_field(p), "accepted");
}

// A refusal names every field that fails, not only the first (exit 2 as any user error).
TEST(MegatronExport, ARefusalNamesEveryReason) {
  const Model m = model_preset("llama3-8b");
  Plan p;
  p.pp = 2;
  p.dp = 4;
  p.global_batch = 32;
  p.schedule = Schedule::kGpipe;
  p.offload.params = true;
  p.optimizer_dtype = Dtype::kBf16;
  const Cluster cl = load_cluster("dgx-h100", p.gpus());
  try {
    export_megatron(m, cl, p);
    FAIL() << "accepted";
  } catch (const Error& e) {
    EXPECT_TRUE(e.is_user_error());
    EXPECT_EQ(exit_code(e.kind()), 2);
    std::set<std::string> fields;
    std::istringstream in(e.field());
    for (std::string f; std::getline(in, f, ',');)
      fields.insert(f.substr(f.find_first_not_of(' ')));
    EXPECT_EQ(fields,
              (std::set<std::string>{"plan.schedule", "plan.offload", "plan.optimizer_dtype"}))
        << e.field();
    EXPECT_NE(e.reason().find("3 reasons"), std::string::npos) << e.reason();
    for (const char* why : {"GPipe", "offload parameters", "master weights"})
      EXPECT_NE(e.reason().find(why), std::string::npos) << why;
  }
  // The same list, one entry per reason.
  const auto all = megatron_refusals(m, cl, p).items();
  EXPECT_EQ(all.size(), 3u);
}

// Flags the issue names, found in the export (independent of the golden files).
TEST(MegatronExport, WritesTheFlagsThePlanNeeds) {
  const Case c = golden_cases()[1];
  const Model m = model_preset(c.model);
  const Cluster cl = load_cluster(c.cluster, c.gpus);
  const Export e = export_megatron(m, cl, make_plan(c, m, cl));
  const std::string& args = e.files[0].text;
  for (const char* flag :
       {"--num-virtual-stages-per-pipeline-rank 2", "--expert-tensor-parallel-size 1",
        "--expert-model-parallel-size 8", "--use-distributed-optimizer", "--overlap-param-gather",
        "--recompute-granularity selective", "--recompute-modules core_attn moe_act",
        "--moe-token-dispatcher-type flex", "--num-experts 8", "--moe-router-topk 2",
        "--group-query-attention", "--num-query-groups 8", "--swiglu", "--normalization RMSNorm",
        "--position-embedding-type rope", "--disable-bias-linear",
        "--untie-embeddings-and-output-weights", "--mock-data", "--tokenizer-type NullTokenizer"})
    EXPECT_NE(args.find(flag), std::string::npos) << flag;
  EXPECT_EQ(args.find("--virtual-pipeline-model-parallel-size"), std::string::npos);
  const std::string& sh = e.files[1].text;
  EXPECT_NE(sh.find("export CUDA_DEVICE_MAX_CONNECTIONS=1"), std::string::npos);
  EXPECT_NE(sh.find("GPUS_PER_NODE=8\nNNODES=8\n"), std::string::npos);
  EXPECT_NE(sh.find("torchrun"), std::string::npos);
}

// Forced balance: Megatron's --moe-router-force-load-balancing draws random router logits (the
// plan's random), which the import reads back; it has no round-robin gate.
TEST(MegatronExport, ForcedBalanceIsRandomLogits) {
  const Case c = golden_cases()[1];
  const Model m = model_preset(c.model);
  const Cluster cl = load_cluster(c.cluster, c.gpus);
  Plan p = make_plan(c, m, cl);
  EXPECT_EQ(export_megatron(m, cl, p).files[0].text.find("--moe-router-force-load-balancing"),
            std::string::npos);
  p.moe_force_balance = MoeForceBalance::kRandom;
  const std::string args = export_megatron(m, cl, p).files[0].text;
  EXPECT_NE(args.find("--moe-router-force-load-balancing"), std::string::npos);
  EXPECT_EQ(import_megatron(args, "args").plan["moe_force_balance"], "random");
  p.moe_force_balance = MoeForceBalance::kRoundRobin;
  try {
    export_megatron(m, cl, p);
    ADD_FAILURE() << "no error for a round-robin gate";
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "plan.moe_force_balance") << e.what();
  }
}

TEST(MegatronExport, CudaDeviceMaxConnectionsFollowsMegatronsChecks) {
  const Model m = model_preset("llama3-8b");
  const Cluster cl = load_cluster("dgx-h100", 8);
  Plan p;
  p.dp = 8;
  p.global_batch = 8;
  EXPECT_EQ(export_megatron(m, cl, p).files[1].text.find("CUDA_DEVICE_MAX_CONNECTIONS"),
            std::string::npos);  // tp = cp = 1: not needed
  p.dp = 4;
  p.cp = 2;
  EXPECT_NE(export_megatron(m, cl, p).files[1].text.find("export CUDA_DEVICE_MAX_CONNECTIONS=1"),
            std::string::npos);
  p.zero = 3;  // Megatron FSDP asserts it is not 1
  const std::string sh = export_megatron(m, cl, p).files[1].text;
  EXPECT_EQ(sh.find("export CUDA_DEVICE_MAX_CONNECTIONS=1"), std::string::npos);
  EXPECT_NE(sh.find("unset CUDA_DEVICE_MAX_CONNECTIONS"), std::string::npos);
}

// Expects export_megatron to throw naming `field`.
void expect_refused(const Model& m, const Plan& p, const std::string& field) {
  const Cluster cl = load_cluster("dgx-h100", p.gpus());
  try {
    export_megatron(m, cl, p);
    ADD_FAILURE() << "no error for " << field;
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), field) << e.what();
  }
}

TEST(MegatronExport, RefusesWhatMegatronCannotRun) {
  const Model m = model_preset("llama3-8b");
  Plan base;
  base.pp = 2;
  base.dp = 4;
  base.global_batch = 32;
  Plan p = base;
  p.schedule = Schedule::kGpipe;
  expect_refused(m, p, "plan.schedule");
  p = base;
  p.offload.params = true;
  expect_refused(m, p, "plan.offload");
  p = base;
  p.offload.activations = true;
  expect_refused(m, p, "plan.offload");
  p = base;
  p.rank_order = parse_rank_order("dp-tp-cp-ep-pp", "plan.rank_order");
  p.tp = 2;
  p.dp = 2;
  expect_refused(m, p, "plan.rank_order");
  p = base;
  p.optimizer_dtype = Dtype::kBf16;
  expect_refused(m, p, "plan.optimizer_dtype");
  p = base;
  p.fused_kernels = false;
  expect_refused(m, p, "plan.fused_kernels");
  p = base;  // torchtitan's op-level selective AC has no Megatron flag
  p.recompute = Recompute::kSelectiveOp;
  expect_refused(m, p, "plan.recompute");
  p = base;
  p.eager_loss = true;
  expect_refused(m, p, "plan.eager_loss");
  p = base;
  p.zero = 3;
  p.reshard = Reshard::kAfterStep;
  expect_refused(m, p, "plan.reshard");
  p = base;
  p.tp = 2;
  p.dp = 2;
  p.tp_comm_overlap = true;  // without sp
  expect_refused(m, p, "plan.tp_comm_overlap");
  p = base;
  p.zero = 2;
  p.shard_degree = 2;
  expect_refused(m, p, "plan.shard_degree");
  p = base;
  p.schedule = Schedule::kInterleaved;
  p.vpp = 2;
  p.recompute = Recompute::kFull;
  p.recompute_layers = 2;
  expect_refused(m, p, "plan.recompute_layers");
  p = base;
  p.attention_kernel = AttentionKernel::kTriton;  // no Triton attention backend in Megatron
  expect_refused(m, p, "plan.attention_kernel");
  p = base;
  p.tp = 2;
  p.dp = 2;
  p.sequence_parallel = true;
  p.tp_comm_overlap = true;
  p.deterministic = true;  // determinism.py: --deterministic-mode asserts tp_comm_overlap off
  p.cross_entropy_loss_fusion = false;  // and the unfused loss (MegatronImport's loss test)
  expect_refused(m, p, "plan.deterministic");
  expect_refused(model_preset("mistral-7b"), base, "model.sliding_window");
  p = base;  // LoRA is NeMo's PEFT, not a Megatron-LM argument
  p.lora_rank = 16;
  expect_refused(m, p, "plan.lora_rank");
  p = base;  // a TransformerConfig field without an argument (arguments.py @d98e8a6)
  p.activation_fp8_input_store = true;
  expect_refused(m, p, "plan.activation_func_fp8_input_store");
}

TEST(MegatronExport, AcceptsTheTpPpDpRankOrder) {
  const Model m = model_preset("llama3-8b");
  Plan p;
  p.tp = 2;
  p.pp = 2;
  p.dp = 2;
  p.global_batch = 8;
  p.rank_order = parse_rank_order("tp-cp-ep-pp-dp", "plan.rank_order");
  const std::string args = export_megatron(m, load_cluster("dgx-h100", 8), p).files[0].text;
  EXPECT_NE(args.find("--use-tp-pp-dp-mapping"), std::string::npos);
  // pp and dp swapped but dp of 1: the order is Megatron's default and needs no flag.
  p.dp = 1;
  p.tp = 4;
  const std::string plain = export_megatron(m, load_cluster("dgx-h100", 8), p).files[0].text;
  EXPECT_EQ(plain.find("--use-tp-pp-dp-mapping"), std::string::npos);
}

// FlashAttention-3 is Megatron's flash backend: Transformer Engine's FlashAttention runs it on
// sm90 wherever flash-attn's hopper build is installed (TE@d0067d0 dot_product_attention/utils.py
// L540-579); the arguments cannot tell it from FlashAttention-2.
TEST(MegatronExport, FlashAttention3IsTheFlashBackend) {
  const Model m = model_preset("llama3-8b");
  Plan p;
  p.dp = 8;
  p.global_batch = 8;
  p.attention_kernel = AttentionKernel::kFa3;
  const std::string args = export_megatron(m, load_cluster("dgx-h100", 8), p).files[0].text;
  EXPECT_NE(args.find("--attention-backend flash"), std::string::npos) << args;
}

// Round trips: export, then import of both files; the same model (but its name) and plan.
std::vector<Case> round_trip_cases() {
  auto plan = [](Json j) { return j; };
  return {
      // Without virtual stages Megatron syncs the device after every pipeline exchange.
      {"dense_3d", "llama3-70b", "dgx-h100", 64,
       plan({{"tp", 8},
             {"pp", 4},
             {"dp", 2},
             {"sp", true},
             {"gbs", 64},
             {"mbs", 2},
             {"p2p_sync", true}})},
      {"interleaved", "llama3-8b", "dgx-h100", 32,
       plan({{"tp", 2}, {"pp", 4}, {"dp", 4}, {"vpp", 4}, {"gbs", 64}, {"zero", 1}})},
      // Megatron's CI functional tests log the parameter norm and the gradients' zeros, and most
      // run --deterministic-mode, which requires the unfused loss.
      {"logged_statistics", "gpt2-124m", "dgx-h100", 8,
       plan({{"dp", 8},
             {"mbs", 4},
             {"gbs", 32},
             {"zero", 1},
             {"log_params_norm", true},
             {"log_num_zeros_in_grad", true},
             {"gradient_accumulation_fusion", false},
             {"cross_entropy_loss_fusion", false},
             {"deterministic", true}})},
      // Transformer Engine's fp8 current scaling (--fp8-recipe tensorwise).
      {"fp8_tensorwise", "llama3-8b", "dgx-h100", 8,
       plan({{"tp", 2},
             {"dp", 4},
             {"sp", true},
             {"gbs", 32},
             {"precision", "fp8"},
             {"fp8_recipe", "tensorwise"}})},
      // Megatron-Core --fp8-param-gather: fp8 weights gathered by the distributed optimizer.
      {"fp8_param_gather", "llama3-8b", "dgx-h100", 8,
       plan({{"tp", 2},
             {"dp", 4},
             {"sp", true},
             {"gbs", 32},
             {"zero", 1},
             {"precision", "fp8"},
             {"grad_reduce_dtype", "bf16"},
             {"fp8_param_gather", true}})},
      // Megatron-Core's allgather token dispatcher (--moe-token-dispatcher-type allgather).
      {"moe_allgather", "mixtral-8x7b", "dgx-h100", 64,
       plan({{"tp", 1},
             {"pp", 4},
             {"dp", 16},
             {"ep", 8},
             {"gbs", 256},
             {"zero", 1},
             {"moe_dispatcher", "allgather"},
             {"moe_router_fp32", true}})},
      {"moe_etp", "mixtral-8x7b", "dgx-h100", 64,
       plan({{"tp", 4},
             {"pp", 2},
             {"vpp", 2},
             {"dp", 8},
             {"ep", 8},
             {"etp", 1},
             {"sp", true},
             {"gbs", 128},
             {"ep_comm_overlap", true}})},
      {"moe_deepep_first_dense", "deepseek-v3", "dgx-h100", 256,
       plan({{"tp", 1},
             {"pp", 8},
             {"dp", 32},
             {"ep", 32},
             {"gbs", 1024},
             {"zero", 1},
             {"moe_dispatcher", "deepep"},
             {"first_stage_layers", 7},
             {"last_stage_layers", 6},
             {"recompute", "selective"},
             {"recompute_modules", {"mla_up_proj", "moe_act", "layernorm"}}})},
      {"cp", "llama3-8b", "dgx-h100", 16,
       plan({{"tp", 2},
             {"cp", 4},
             {"dp", 2},
             {"seq", 32768},
             {"gbs", 16},
             {"sp", true},
             {"tp_comm_overlap", true}})},
      {"zero3", "llama3-8b", "dgx-h100", 16,
       plan({{"dp", 16},
             {"zero", 3},
             {"gbs", 64},
             {"precision", "fp8"},
             {"overlap_param_gather", false}})},
      {"zero1_hsdp_offload", "llama3-8b", "dgx-h100", 16,
       plan({{"tp", 2},
             {"dp", 8},
             {"zero", 1},
             {"shard_degree", 4},
             {"gbs", 64},
             {"offload", "optimizer"},
             {"cpu_optimizer", "torch"},  // HybridDeviceOptimizer: torch.optim on the host
             {"grad_reduce_dtype", "bf16"}})},
      {"full_recompute_k", "gpt3-175b", "dgx-a100-80g", 64,
       plan({{"tp", 8},
             {"pp", 8},
             {"gbs", 64},
             {"recompute", "full"},
             {"recompute_layers", 4},
             {"flash_attention", false}})},
      {"full_recompute_all", "llama3-8b", "dgx-h100", 8,
       plan({{"tp", 8}, {"gbs", 8}, {"recompute", "full"}, {"precision", "fp16"}})},
      {"uneven_first_last", "llama3-8b", "dgx-h100", 32,
       plan({{"tp", 2},
             {"pp", 4},
             {"dp", 4},
             {"gbs", 64},
             {"first_stage_layers", 6},
             {"last_stage_layers", 6},
             {"rank_order", "tp-cp-ep-pp-dp"}})},
      {"stage_layers_interleaved", "llama3-8b", "dgx-h100", 16,
       plan({{"tp", 2},
             {"pp", 2},
             {"dp", 4},
             {"vpp", 2},
             {"gbs", 64},
             {"stage_layers", {6, 8, 9, 9}}})},
      // Qwen3-235B's 94 layers on pp 8 with Megatron's embedding/loss accounting, with and
      // without virtual stages (96 slots: 12 per stage, 3 per virtual stage at vpp 4).
      {"qwen3_235b_accounted", "qwen3-235b-a22b", "dgx-h100", 64,
       plan({{"tp", 4},
             {"pp", 8},
             {"dp", 2},
             {"ep", 8},
             {"etp", 1},
             {"sp", true},
             {"gbs", 128},
             {"zero", 1},
             {"account_for_embedding_in_pipeline_split", true},
             {"account_for_loss_in_pipeline_split", true}})},
      {"qwen3_235b_accounted_interleaved", "qwen3-235b-a22b", "dgx-h100", 64,
       plan({{"tp", 4},
             {"pp", 8},
             {"vpp", 4},
             {"dp", 2},
             {"ep", 8},
             {"etp", 1},
             {"sp", true},
             {"gbs", 128},
             {"zero", 1},
             {"account_for_embedding_in_pipeline_split", true},
             {"account_for_loss_in_pipeline_split", true}})},
      // DeepSeek-V3's 61 layers on pp 8 x vpp 2: Megatron refuses the accounting switches (63
      // slots over 8 stages; MegatronSplit.DeepSeekV3AtPp8CannotAccountForTheEmbeddingAndLoss),
      // so a layout places the embedding and the loss: 'Et*3|t*4|...|t*2L', each in a layer's
      // slot.
      {"deepseek_v3_layout_interleaved", "deepseek-v3", "dgx-h100", 256,
       plan({{"tp", 1},
             {"pp", 8},
             {"vpp", 2},
             {"dp", 32},
             {"ep", 32},
             {"gbs", 1024},
             {"zero", 1},
             {"stage_layers", {3, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 2}}})},
  };
}

// plan_to_json of the plan an import gives, with dp set (an argument file has no GPU count).
Json imported_plan(const ImportedJob& job, int dp) {
  Json j = job.plan;
  if (!j.contains("dp")) j["dp"] = dp;
  return plan_to_json(plan_from_json(j));
}

// --cp-comm-type: written when not Megatron's default p2p (with the hierarchical sizes of
// a2a+p2p) and read back; PyTorch's context_parallel has no Megatron flag.
TEST(MegatronExport, CpCommTypeRoundTrips) {
  const Model m = model_preset("llama3-8b");
  const Cluster cl = load_cluster("dgx-h100", 16);
  Plan p;
  p.tp = 2;
  p.cp = 8;
  p.global_batch = 8;
  p.seq_len = 16384;
  EXPECT_EQ(export_megatron(m, cl, p).files[0].text.find("--cp-comm-type"), std::string::npos);
  for (CpCommType t : {CpCommType::kAllGather, CpCommType::kA2a, CpCommType::kA2aP2p}) {
    SCOPED_TRACE(cp_comm_type_name(t));
    p.cp_comm_type = t;
    p.cp_a2a_size = t == CpCommType::kA2aP2p ? 4 : 0;
    if (t == CpCommType::kA2a) {
      p.tp = 1;  // 8 K/V heads over 8 context ranks
      p.cp = 8;
    }
    const Cluster c2 = load_cluster("dgx-h100", p.gpus());
    validate(p, m, c2);
    const std::string args = export_megatron(m, c2, p).files[0].text;
    EXPECT_NE(args.find(std::string("--cp-comm-type ") + cp_comm_type_name(t)), std::string::npos)
        << args;
    EXPECT_EQ(args.find("--hierarchical-context-parallel-sizes 4 2") != std::string::npos,
              t == CpCommType::kA2aP2p);
    const Plan back = plan_from_json(imported_plan(import_megatron(args, "args"), p.dp));
    EXPECT_EQ(back.cp_comm_type, t);
    EXPECT_EQ(back.cp_a2a_size, p.cp_a2a_size);
  }
  p.cp_comm_type = CpCommType::kP2p;
  p.cp_a2a_size = 0;
  p.cp_impl = CpImpl::kPytorch;
  try {
    export_megatron(m, load_cluster("dgx-h100", p.gpus()), p);
    ADD_FAILURE() << "no error for PyTorch's context_parallel";
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "plan.cp_impl") << e.what();
  }
}

TEST(MegatronRoundTrip, ExportThenImportGivesTheSamePlanAndModel) {
  for (const Case& c : round_trip_cases()) {
    SCOPED_TRACE(c.name);
    const Model m = model_preset(c.model);
    const Cluster cl = load_cluster(c.cluster, c.gpus);
    const Plan p = make_plan(c, m, cl);
    const Export e = export_megatron(m, cl, p);
    EXPECT_EQ(rules::megatron_violations(e.files[0].text), std::vector<std::string>{});
    // Megatron's arguments carry one position count: a RoPE model trained past its positions
    // comes back with the sequence length as its own (and so no separate plan seq).
    Model want_model = m;
    want_model.seq_len = std::max(m.seq_len, p.seq(m));
    Json want = plan_to_json(p);
    if (p.seq_len == want_model.seq_len) want.erase("seq");
    // Without virtual stages Megatron batches every pipeline exchange and syncs after it,
    // whatever the plan said (argument_utils.py L307, p2p_communication.py L421-424).
    if (p.pp > 1 && p.vpp == 1) want["p2p_sync"] = true;
    // Megatron-Core applies the router's probabilities in the experts, whatever the plan said.
    if (m.is_moe()) want["moe_probs_in_experts"] = true;
    // The argument file (no GPU count) and the launch script (torchrun's --nproc_per_node and
    // --nnodes give it).
    const ImportedJob launch = import_megatron(e.files[1].text, "launch");
    EXPECT_EQ(launch.gpus, p.gpus());
    EXPECT_EQ(imported_plan(launch, -1), want);
    std::vector<const ImportedJob*> jobs = {&launch};
    ImportedJob args;
    if (p.shard_degree > 0) {
      // Megatron gives the number of optimizer instances; the shard size needs the GPU count.
      try {
        import_megatron(e.files[0].text, "args");
        ADD_FAILURE() << "no error without the GPU count";
      } catch (const Error& err) {
        EXPECT_EQ(err.field(), "--num-distributed-optimizer-instances");
      }
      // With the GPU count (--gpus) it imports.
      args = import_megatron(e.files[0].text, "args", p.gpus());
      EXPECT_EQ(args.gpus, p.gpus());
      EXPECT_EQ(imported_plan(args, -1), want);
      jobs.push_back(&args);
    } else {
      args = import_megatron(e.files[0].text, "args");
      EXPECT_EQ(args.gpus, 0);
      EXPECT_FALSE(args.plan.contains("dp"));
      EXPECT_EQ(imported_plan(args, p.dp), want);
      jobs.push_back(&args);
    }
    for (const ImportedJob* job : jobs) {
      ASSERT_TRUE(job->model.has_value());
      Model back = *job->model;
      back.name = m.name;
      EXPECT_EQ(model_to_json(back), model_to_json(want_model));
    }
  }
}

// ---- Parsing of argument lists written by hand.

TEST(MegatronImport, ReadsALaunchLineWithContinuationsCommentsAndVariables) {
  const std::string text = R"(#!/bin/bash
# a comment --tensor-model-parallel-size 99
export CUDA_DEVICE_MAX_CONNECTIONS=1
TP=4
GPUS_PER_NODE=8
torchrun --nproc_per_node $GPUS_PER_NODE --nnodes=2 --node_rank ${NODE_RANK:-0} \
  pretrain_gpt.py \
  --num-layers 32 --hidden-size 4096 --num-attention-heads 32 \
  --seq-length 4096 --max-position-embeddings 4096 --vocab-size 32000 \
  --tensor-model-parallel-size ${TP} --pipeline-model-parallel-size=2 \
  --swiglu --normalization "RMSNorm" --position-embedding-type rope \
  --recompute-activations \
  --data-path /data/my_text_document --lr 3e-4 --log-interval 10 --save /ckpt # trailing
)";
  const ImportedJob job = import_megatron(text, "mine");
  EXPECT_EQ(job.gpus, 16);
  EXPECT_EQ(job.plan["tp"], 4);
  EXPECT_EQ(job.plan["pp"], 2);
  EXPECT_EQ(job.plan["dp"], 2);
  EXPECT_EQ(job.plan["recompute"], "selective");
  EXPECT_EQ(job.plan["precision"], "fp32");
  ASSERT_TRUE(job.model);
  EXPECT_EQ(job.model->name, "mine");
  EXPECT_EQ(job.model->layers, 32);
  EXPECT_EQ(job.model->norm, Norm::kRmsNorm);
  EXPECT_EQ(job.model->activation, Activation::kSwiglu);
  EXPECT_FALSE(job.model->learned_positions);
  // Megatron's defaults: swiglu without --ffn-hidden-size, tied embeddings, biases, dropout.
  EXPECT_EQ(job.model->ffn, int64_t{(4 * 4096 * 2 / 3) / 64} * 64);
  EXPECT_TRUE(job.model->tied_embeddings);
  EXPECT_TRUE(job.model->linear_bias);
  EXPECT_TRUE(job.model->dropout);
}

TEST(MegatronImport, ReadsBashArraysWithTheBracketOnAFlagLine) {
  const std::string text =
      "MODEL_ARGS=(--num-layers 4 --hidden-size 256\n  --num-attention-heads 4 --seq-length 128\n"
      "  --vocab-size 1000)\nPAR=( --tensor-model-parallel-size 2 )\n"
      "python pretrain_gpt.py ${MODEL_ARGS[@]} \"${PAR[@]}\"\n";
  const ImportedJob job = import_megatron(text);
  EXPECT_EQ(job.model->name, "megatron-import");
  EXPECT_EQ(job.model->vocab, 1000);
  EXPECT_EQ(job.plan["tp"], 2);
  EXPECT_EQ(job.gpus, 0);
}

// A command substitution is one word (the DeepSpeed launcher's HERE=$(cd "$(dirname ...)" &&
// pwd)); it neither splits into stray words nor swallows the flags after it.
TEST(MegatronImport, KeepsACommandSubstitutionAsOneWord) {
  const std::string text =
      "HERE=$(cd \"$(dirname \"${BASH_SOURCE[0]}\")\" && pwd)\n"
      "X=\"$(echo --tensor-model-parallel-size 8)\"\n"
      "torchrun --nproc_per_node 8 pretrain_gpt.py --num-layers 4 --hidden-size 256 \\\n"
      "  --num-attention-heads 4 --seq-length 128 --vocab-size 1000 \\\n"
      "  --tensor-model-parallel-size 2 --data-path \"$HERE/data\"\n";
  const ImportedJob job = import_megatron(text);
  EXPECT_EQ(job.plan["tp"], 2);
  EXPECT_EQ(job.gpus, 8);
}

// Both files carry the export tag: the model, the cluster and the GPU count.
TEST(MegatronExport, FilesCarryTheExportTag) {
  const Case c = golden_cases()[2];
  const Model m = model_preset(c.model);
  const Cluster cl = load_cluster(c.cluster, c.gpus);
  for (const ExportedFile& f : export_megatron(m, cl, make_plan(c, m, cl)).files) {
    const std::optional<ExportTag> tag = read_export_tag(f.text);
    ASSERT_TRUE(tag) << f.name;
    EXPECT_EQ(tag->model, c.model);
    EXPECT_EQ(tag->cluster, c.cluster);
    EXPECT_EQ(tag->gpus, c.gpus);
  }
}

// Expects import_megatron to throw naming `field`.
void expect_import_error(const std::string& text, const std::string& field) {
  try {
    import_megatron(text);
    ADD_FAILURE() << "no error for " << field;
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), field) << e.what();
  }
}

TEST(MegatronImport, NamesTheFlagItCannotRead) {
  const std::string base =
      "--num-layers 4 --hidden-size 256 --num-attention-heads 4 --seq-length 128 "
      "--vocab-size 1000 ";
  expect_import_error(base + "--use-torch-fsdp2", "--use-torch-fsdp2");
  expect_import_error(base + "--rampup-batch-size 16 16 1000", "--rampup-batch-size");
  expect_import_error(base + "--tensor-model-parallel-size $TP", "--tensor-model-parallel-size");
  expect_import_error(base + "--num-experts 4 --moe-token-dispatcher-type gather",
                      "--moe-token-dispatcher-type");
  expect_import_error(base + "--num-experts 4 --moe-router-dtype fp64", "--moe-router-dtype");
  expect_import_error(base + "--num-experts 4 --moe-layer-freq 2", "--moe-layer-freq");
  expect_import_error(base +
                          "--recompute-granularity full --recompute-method uniform "
                          "--recompute-num-layers 2",
                      "--recompute-num-layers");
  // Megatron's own checks: fp8 weights need fp8 and the distributed optimizer (or its FSDP).
  expect_import_error(base + "--bf16 --use-distributed-optimizer --fp8-param-gather",
                      "--fp8-param-gather");
  expect_import_error(base + "--bf16 --fp8-format hybrid --fp8-param-gather", "--fp8-param-gather");
  expect_import_error(base + "--cp-comm-type ring", "--cp-comm-type");
  expect_import_error(base + "--cp-comm-type p2p a2a", "--cp-comm-type");  // per-layer types
  // Megatron's own checks (arguments.py): a2a+p2p needs the hierarchical sizes, whose product is
  // the context-parallel size.
  expect_import_error(base + "--context-parallel-size 4 --cp-comm-type a2a+p2p",
                      "--hierarchical-context-parallel-sizes");
  expect_import_error(base +
                          "--context-parallel-size 4 --cp-comm-type a2a+p2p "
                          "--hierarchical-context-parallel-sizes 2 3",
                      "--hierarchical-context-parallel-sizes");
  expect_import_error(base +
                          "--pipeline-model-parallel-size 2 "
                          "--pipeline-model-parallel-layout 'Et*2|t*2m|L'",
                      "--pipeline-model-parallel-layout");
  expect_import_error(
      "--hidden-size 256 --num-attention-heads 4 --seq-length 128 "
      "--vocab-size 1000",
      "--num-layers");
}

TEST(MegatronImport, ReadsMoeLayerPatterns) {
  const std::string base =
      "--num-layers 4 --hidden-size 256 --num-attention-heads 4 --seq-length 128 "
      "--vocab-size 1000 --num-experts 4 --moe-ffn-hidden-size 64 ";
  const ImportedJob first = import_megatron(base + "--moe-layer-freq '([0]*1+[1]*3)'");
  EXPECT_EQ(first.model->moe.first_dense, 1);
  EXPECT_EQ(first.model->moe.every, 1);
  const ImportedJob alt = import_megatron(base + "--moe-layer-freq [0,1,0,1]");
  EXPECT_EQ(alt.model->moe.first_dense, 0);
  EXPECT_EQ(alt.model->moe.every, 2);
  expect_import_error(base + "--moe-layer-freq '([0]+[1]*2)'", "--moe-layer-freq");
}

// Expert biases under the grouped GEMM (biases are Megatron's default): TEGroupedMLP adds the
// experts' fc2 bias in a loop over the local experts (experts.py _apply_bias), which the plan
// prices; not without biases, without experts or without the grouped GEMM (SequentialMLP).
TEST(MegatronImport, ExpertBiasesUnderTheGroupedGemmLoopOverTheExperts) {
  const std::string base =
      "--num-layers 4 --hidden-size 256 --num-attention-heads 4 --seq-length 128 "
      "--vocab-size 1000 ";
  const std::string moe = "--num-experts 4 --moe-ffn-hidden-size 64 ";
  auto loop = [](const ImportedJob& j) { return plan_from_json(j.plan).expert_bias_loop; };
  EXPECT_TRUE(loop(import_megatron(base + moe + "--moe-grouped-gemm")));
  EXPECT_FALSE(loop(import_megatron(base + moe + "--moe-grouped-gemm --disable-bias-linear")));
  EXPECT_FALSE(loop(import_megatron(base + moe)));
  EXPECT_FALSE(loop(import_megatron(base + "--moe-grouped-gemm")));
}

// Megatron-LM's loss is unfused unless --cross-entropy-loss-fusion (model_parallel_config.py L320
// @d98e8a6): an import without the flag is the unfused loss, with it the fused one; the export
// writes the flag for a fused plan and refuses it under --deterministic-mode, which requires the
// unfused loss (training/determinism.py).
TEST(MegatronImport, TheLossIsUnfusedUnlessTheFlagSaysFused) {
  const std::string base =
      "--num-layers 4 --hidden-size 256 --num-attention-heads 4 --seq-length 128 "
      "--vocab-size 1000 ";
  auto fused = [](const ImportedJob& j) {
    return plan_from_json(j.plan).cross_entropy_loss_fusion;
  };
  EXPECT_FALSE(fused(import_megatron(base)));
  EXPECT_TRUE(fused(import_megatron(base + "--cross-entropy-loss-fusion")));
  EXPECT_TRUE(fused(
      import_megatron(base + "--cross-entropy-loss-fusion --cross-entropy-fusion-impl native")));
  const Model m = model_preset("gpt2-124m");
  const Cluster cl = load_cluster("dgx-h100", 8);
  Plan p;
  p.dp = 8;
  p.global_batch = 32;
  EXPECT_NE(export_megatron(m, cl, p).files[0].text.find("--cross-entropy-loss-fusion"),
            std::string::npos);
  p.cross_entropy_loss_fusion = false;
  EXPECT_EQ(export_megatron(m, cl, p).files[0].text.find("--cross-entropy-loss-fusion"),
            std::string::npos);
  p.cross_entropy_loss_fusion = true;
  p.deterministic = true;
  try {
    export_megatron(m, cl, p);
    ADD_FAILURE() << "no refusal of the fused loss under --deterministic-mode";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("plan.cross_entropy_loss_fusion"), std::string::npos)
        << e.what();
  }
}

// Megatron-Core at d98e8a6 scales the routed rows by their probabilities in the experts and
// unpermutes without them (token_dispatcher.py L346, L891, L1460): every MoE import says so; not a
// dense model, nor Megatron-DeepSpeed's MoE.
TEST(MegatronImport, MoeJobsApplyTheProbabilitiesInTheExperts) {
  const std::string base =
      "--num-layers 4 --hidden-size 256 --num-attention-heads 4 --seq-length 128 "
      "--vocab-size 1000 ";
  auto in_experts = [](const ImportedJob& j) {
    return plan_from_json(j.plan).moe_probs_in_experts;
  };
  EXPECT_TRUE(in_experts(import_megatron(base + "--num-experts 4 --moe-ffn-hidden-size 64")));
  EXPECT_TRUE(in_experts(import_megatron(base + "--num-experts 4 --moe-ffn-hidden-size 64 "
                                                "--moe-token-dispatcher-type alltoall")));
  EXPECT_FALSE(in_experts(import_megatron(base)));
}

// --transformer-impl names the modules the layers call: transformer_engine and local (Megatron's
// own ColumnParallelLinear / RowParallelLinear) as the plan's transformer_impl; without the flag
// the plan stays torch, and the export writes the flag back.
TEST(MegatronImport, TransformerImplNamesTheModules) {
  const std::string base =
      "--num-layers 4 --hidden-size 256 --num-attention-heads 4 --seq-length 128 "
      "--vocab-size 1000 ";
  auto impl = [](const ImportedJob& j) { return plan_from_json(j.plan).transformer_impl; };
  EXPECT_EQ(impl(import_megatron(base + "--transformer-impl local")), TransformerImpl::kLocal);
  EXPECT_EQ(impl(import_megatron(base + "--transformer-impl transformer_engine")),
            TransformerImpl::kTransformerEngine);
  EXPECT_EQ(impl(import_megatron(base)), TransformerImpl::kTorch);
  const Case c = golden_cases()[1];
  const Model m = model_preset(c.model);
  const Cluster cl = load_cluster(c.cluster, c.gpus);
  Plan p = make_plan(c, m, cl);
  p.transformer_impl = TransformerImpl::kLocal;
  const std::string args = export_megatron(m, cl, p).files[0].text;
  EXPECT_NE(args.find("--transformer-impl local"), std::string::npos);
  EXPECT_EQ(import_megatron(args, "args").plan["transformer_impl"], "local");
}

// Under fp8 the grouped experts pad each local expert's rows (TE Fp8Padding) unless the router
// or HybridEP's dispatch pads them (moe_utils.py skip_routed_expert_padding).
TEST(MegatronImport, Fp8GroupedExpertsPadUnlessTheRouterOrHybridEpDoes) {
  const std::string base =
      "--num-layers 4 --hidden-size 256 --num-attention-heads 4 --seq-length 128 "
      "--vocab-size 1000 --num-experts 4 --moe-ffn-hidden-size 64 --moe-grouped-gemm ";
  auto pad = [](const ImportedJob& j) { return plan_from_json(j.plan).expert_fp8_padding; };
  EXPECT_TRUE(pad(import_megatron(base + "--fp8-format hybrid")));
  EXPECT_TRUE(pad(import_megatron(base + "--fp8-format hybrid --moe-token-dispatcher-type flex")));
  EXPECT_FALSE(pad(import_megatron(base + "--bf16")));
  EXPECT_FALSE(pad(import_megatron(base + "--fp8-format hybrid --moe-router-padding-for-fp8")));
  EXPECT_FALSE(pad(import_megatron(base + "--fp8-format hybrid --moe-token-dispatcher-type flex "
                                          "--moe-flex-dispatcher-backend hybridep")));
}

// --account-for-embedding/loss-in-pipeline-split: written for the plan's switches, read back,
// refused beside a layout or first/last counts (transformer_config.py L2229-2261) and counted
// in --num-layers-per-virtual-pipeline-stage (arguments.py L953-979).
TEST(MegatronSplit, AccountingFlagsFollowMegatronsRules) {
  const Model m = model_preset("qwen3-235b-a22b");
  const Cluster cl = load_cluster("dgx-h100", 64);
  Plan p = plan_from_json(
      Json{{"tp", 4}, {"pp", 8}, {"dp", 2}, {"ep", 8}, {"etp", 1}, {"sp", true}, {"gbs", 128}});
  p.account_for_loss = true;
  // 94 + 1 slots do not split over pp 8: parasol refuses what Megatron refuses.
  EXPECT_THROW(validate(p, m, cl), Error);
  p.account_for_embedding = true;
  ASSERT_NO_THROW(validate(p, m, cl));
  const std::string args = export_megatron(m, cl, p).files[0].text;
  const auto f = rules::flags_of(args);
  EXPECT_EQ(f.count("account-for-embedding-in-pipeline-split"), 1u);
  EXPECT_EQ(f.count("account-for-loss-in-pipeline-split"), 1u);
  EXPECT_EQ(f.count("decoder-first-pipeline-num-layers"), 0u);
  EXPECT_EQ(f.count("pipeline-model-parallel-layout"), 0u);
  EXPECT_EQ(rules::megatron_violations(args), std::vector<std::string>{});
  // The oracle (Megatron's own checks) refuses each broken combination of the same arguments.
  auto violates = [](const std::string& text, const std::string& rule) {
    for (const std::string& v : rules::megatron_violations(text))
      if (v.find(rule) != std::string::npos) return true;
    return false;
  };
  std::string off_by_one = args;
  const size_t at = off_by_one.find("--num-layers 94");
  ASSERT_NE(at, std::string::npos) << args;
  off_by_one.replace(at, 15, "--num-layers 93");
  EXPECT_TRUE(violates(off_by_one, "arguments.py L998"));
  EXPECT_TRUE(violates(args + "\n  --decoder-first-pipeline-num-layers 11\n",
                       "transformer_config.py L2235"));
  EXPECT_TRUE(violates(args + "\n  --num-virtual-stages-per-pipeline-rank 5\n",
                       "transformer_config.py L2409"));
  EXPECT_TRUE(violates(args + "\n  --pipeline-model-parallel-layout 'Et*11|(t*12|)*6t*11L'\n",
                       "transformer_config.py L2254"));

  const std::string base =
      "--num-layers 94 --hidden-size 256 --num-attention-heads 4 --seq-length 128 "
      "--vocab-size 1000 --pipeline-model-parallel-size 8 ";
  const ImportedJob both = import_megatron(
      base + "--account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split");
  EXPECT_EQ(both.plan["account_for_embedding_in_pipeline_split"], true);
  EXPECT_EQ(both.plan["account_for_loss_in_pipeline_split"], true);
  const ImportedJob none = import_megatron(base);
  EXPECT_FALSE(none.plan.contains("account_for_loss_in_pipeline_split"));
  expect_import_error(base +
                          "--account-for-loss-in-pipeline-split "
                          "--decoder-first-pipeline-num-layers 12",
                      "--account-for-loss-in-pipeline-split");
  expect_import_error(base +
                          "--account-for-embedding-in-pipeline-split "
                          "--pipeline-model-parallel-layout 'E|t*12|(t*12|)*6t*11L'",
                      "--account-for-embedding-in-pipeline-split");
  // Layers per virtual stage count the embedding and the loss: (94 + 2) / (8 x 3) = vpp 4.
  const ImportedJob per_virtual = import_megatron(base +
                                                  "--account-for-embedding-in-pipeline-split "
                                                  "--account-for-loss-in-pipeline-split "
                                                  "--num-layers-per-virtual-pipeline-stage 3");
  EXPECT_EQ(per_virtual.plan["vpp"], 4);
  expect_import_error(base + "--num-layers-per-virtual-pipeline-stage 3",
                      "--num-layers-per-virtual-pipeline-stage");
  expect_import_error(base +
                          "--decoder-first-pipeline-num-layers 10 "
                          "--num-layers-per-virtual-pipeline-stage 2",
                      "--num-layers-per-virtual-pipeline-stage");
}

// DeepSeek-V3 (61 layers) at pp 8: the accounting switches leave 63 or 62 slots, which Megatron
// refuses (arguments.py L998) and parasol too, naming the switch.
TEST(MegatronSplit, DeepSeekV3AtPp8CannotAccountForTheEmbeddingAndLoss) {
  const Model m = model_preset("deepseek-v3");
  const Cluster cl = load_cluster("dgx-h100", 256);
  Plan p = plan_from_json(Json{{"pp", 8}, {"dp", 32}, {"ep", 32}, {"gbs", 1024}});
  for (int which = 0; which < 3; ++which) {
    p.account_for_embedding = which != 1;
    p.account_for_loss = which != 0;
    try {
      validate(p, m, cl);
      ADD_FAILURE() << "accepted " << which;
    } catch (const Error& e) {
      EXPECT_NE(e.field().find("in_pipeline_split"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("do not split evenly over pp 8"), std::string::npos)
          << e.what();
    }
  }
}

TEST(MegatronImport, RecognisesMegatronArguments) {
  EXPECT_TRUE(looks_like_megatron_args("torchrun pretrain_gpt.py --num-layers 2"));
  EXPECT_TRUE(looks_like_megatron_args("ARGS=(--tensor-model-parallel-size 2)"));
  EXPECT_FALSE(looks_like_megatron_args(R"({"tp": 2, "note": "--num-layers"})"));
  EXPECT_FALSE(looks_like_megatron_args("tp: 2"));
}

// ---- Training logs.

TEST(MegatronLog, ReadsTheElapsedTimeLinesAndSkipsTheFirst) {
  const std::string text =
      "[2026-08-22 10:00:00] some setup line\n"
      " [2026-08-22 10:00:10.1] iteration        1/     100 | consumed samples:          256 | "
      "elapsed time per iteration (ms): 9000.0 | throughput per GPU (TFLOP/s/GPU): 100.0 |\n"
      " [2026-08-22 10:00:12.1] iteration        2/     100 | consumed samples:          512 | "
      "elapsed time per iteration (ms): 2000.0 |\n"
      " [2026-08-22 10:00:14.1] iteration        3/     100 | consumed samples:          768 | "
      "elapsed time per iteration (ms): 2100.5 |\n"
      " [2026-08-22 10:00:16.1] iteration        4/     100 | consumed samples:         1024 | "
      "elapsed time per iteration (ms): 2600.0 |\n";
  ASSERT_TRUE(looks_like_megatron_log(text));
  const MegatronLog log = read_megatron_log(text);
  ASSERT_EQ(log.step_s.size(), 4u);
  EXPECT_EQ(log.iterations, (std::vector<int>{1, 2, 3, 4}));
  EXPECT_DOUBLE_EQ(log.step_s[0], 9.0);
  EXPECT_EQ(log.skipped, 1);
  EXPECT_DOUBLE_EQ(log.step_time_s, 2.1005);  // median of 2.0, 2.1005, 2.6
}

TEST(MegatronLog, RejectsLogsWithoutEnoughLines) {
  EXPECT_FALSE(looks_like_megatron_log("iteration 1 | loss 3.2"));
  EXPECT_THROW(read_megatron_log("elapsed time per iteration (ms): 100.0 |\n"), Error);
  EXPECT_THROW(read_megatron_log("elapsed time per iteration (ms): x |\n"
                                 "elapsed time per iteration (ms): 1.0 |\n"),
               Error);
}

}  // namespace
}  // namespace parasol::interop
