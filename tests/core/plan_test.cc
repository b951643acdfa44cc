// Tests core/plan.h: each validate() rule (field and reason), valid plans, JSON round trip.
#include "core/plan.h"

#include <gtest/gtest.h>

#include <string>

#include "core/error.h"
#include "tests/core/expect_error.h"
#include "tests/core/megatron_split.h"

namespace parasol {
namespace {

void ExpectInvalid(const Plan& p, const Model& m, const Cluster& c, const std::string& field,
                   const std::string& substring) {
  ExpectError([&] { validate(p, m, c); }, field, substring);
}

Plan degrees(int tp, int pp = 1, int dp = 1, int cp = 1) {
  Plan p;
  p.tp = tp;
  p.pp = pp;
  p.dp = dp;
  p.cp = cp;
  p.global_batch = dp;
  return p;
}

Model custom(const std::string& json) { return model_from_json(Json::parse(json)); }

// Shared fixtures (building a cluster is cheap, but these are used by many tests).
const Model& llama8b() {
  static const Model m = model_preset("llama3-8b");
  return m;
}
const Model& mixtral() {
  static const Model m = model_preset("mixtral-8x7b");
  return m;
}
const Cluster& h100(int gpus) {
  static std::map<int, Cluster> cache;
  auto it = cache.find(gpus);
  if (it == cache.end()) it = cache.emplace(gpus, cluster_preset("dgx-h100", gpus)).first;
  return it->second;
}

// --- Valid plans -------------------------------------------------------------------------------

TEST(PlanValid, Llama8bTp8Pp2On16H100) {
  Plan p = degrees(8, 2);
  EXPECT_NO_THROW(validate(p, llama8b(), h100(16)));
  EXPECT_EQ(p.gpus(), 16);
  EXPECT_EQ(p.micro_batches(), 1);
}

TEST(PlanValid, Gpt3Tp8Pp8Vpp3InterleavedOn64A100) {
  // Narayanan et al. 2021's GPT-3 175B setting (tp 8, pp 8, interleaved schedule).
  Plan p = degrees(8, 8);
  p.vpp = 3;
  p.schedule = Schedule::kInterleaved;
  p.global_batch = 64;
  EXPECT_NO_THROW(validate(p, model_preset("gpt3-175b"), cluster_preset("dgx-a100-80g", 64)));
  EXPECT_EQ(p.micro_batches(), 64);
}

TEST(PlanValid, MixtralWithEverythingOn64H100) {
  Plan p = degrees(8, 1, 8);
  p.ep = 8;
  p.sequence_parallel = true;
  p.zero = 1;
  p.global_batch = 64;
  p.recompute = Recompute::kFull;
  p.recompute_layers = 4;
  p.offload.optimizer = true;
  p.precision = Dtype::kFp8;
  EXPECT_NO_THROW(validate(p, mixtral(), h100(64)));
}

TEST(PlanValid, ContextParallelAndLongRopeSequence) {
  Plan p = degrees(8, 1, 1, 2);
  EXPECT_NO_THROW(validate(p, llama8b(), h100(16)));
  // RoPE models may train beyond seq_len; only learned position tables limit it.
  p.seq_len = 32768;
  EXPECT_NO_THROW(validate(p, llama8b(), h100(16)));
}

TEST(PlanValid, PlanFileNamesItsModelAndCluster) {
  Plan p = plan_from_json(Json::parse(
      R"({"tp": 8, "pp": 2, "gbs": 32, "model": "llama3-8b", "cluster": "dgx-h100",
          "gpus": 16})"));
  EXPECT_NO_THROW(validate(p, load_model(p.model_ref), load_cluster(p.cluster_ref, p.gpus_ref)));
}

// --- One test per validate() rule, in the order of plan_validate.cc -----------------------------

// Megatron-Core's combined 1F1B (the expert all-to-all overlap) has no form for a pipeline
// without virtual stages: such a plan is refused; without a pipeline or interleaved it runs.
TEST(PlanValidate, ExpertOverlapNeedsNoPipelineOrTheInterleavedSchedule) {
  Plan p = degrees(1, 2);
  p.dp = 8;
  p.ep = 8;
  p.ep_comm_overlap = true;
  p.global_batch = 64;
  ExpectInvalid(p, mixtral(), h100(16), "plan.ep_comm_overlap", "interleaved");
  p.vpp = 2;
  p.schedule = Schedule::kInterleaved;
  EXPECT_NO_THROW(validate(p, mixtral(), h100(16)));
  Plan q = degrees(1, 1);
  q.dp = 16;
  q.ep = 8;
  q.ep_comm_overlap = true;
  q.global_batch = 64;
  EXPECT_NO_THROW(validate(q, mixtral(), h100(16)));
}

// Megatron's allgather dispatcher gathers over TP x EP; parasol prices it at tp 1 and etp 1 only.
TEST(PlanValidate, AllGatherDispatcherIsModelledAtTensorParallelOne) {
  Plan p = degrees(1, 1);
  p.dp = 16;
  p.ep = 8;
  p.global_batch = 64;
  p.moe_dispatcher = MoeDispatcher::kAllGather;
  EXPECT_NO_THROW(validate(p, mixtral(), h100(16)));
  Plan q = degrees(2, 1);
  q.dp = 8;
  q.ep = 8;
  q.etp = 1;
  q.global_batch = 64;
  q.moe_dispatcher = MoeDispatcher::kAllGather;
  ExpectInvalid(q, mixtral(), h100(16), "plan.moe_dispatcher", "tp 1 and etp 1");
  p.ep_comm_overlap = true;
  ExpectInvalid(p, mixtral(), h100(16), "plan.ep_comm_overlap", "alltoall and flex");
  const Plan r = plan_from_json(Json::parse(R"({"moe_dispatcher": "allgather",
                                               "moe_router_fp32": true})"));
  EXPECT_EQ(r.moe_dispatcher, MoeDispatcher::kAllGather);
  EXPECT_TRUE(r.moe_router_fp32);
  EXPECT_EQ(r.moe_probs_dtype(), Dtype::kFp32);
  EXPECT_EQ(plan_to_json(r)["moe_dispatcher"], "allgather");
  EXPECT_EQ(plan_to_json(r)["moe_router_fp32"], true);
}

// The eager loss is PyTorch's F.cross_entropy: a native program (llm.c) has none; the switch
// round-trips through the plan JSON.
TEST(PlanValidate, EagerLossNeedsPytorch) {
  Plan p = degrees(1, 1, 8);
  p.global_batch = 64;
  p.eager_loss = true;
  EXPECT_NO_THROW(validate(p, llama8b(), h100(8)));
  EXPECT_TRUE(plan_from_json(plan_to_json(p)).eager_loss);
  EXPECT_FALSE(plan_from_json(plan_to_json(degrees(1))).eager_loss);
  Plan tiled = degrees(1);
  tiled.tiled_loss = true;
  EXPECT_TRUE(plan_from_json(plan_to_json(tiled)).tiled_loss);
  EXPECT_FALSE(plan_from_json(plan_to_json(degrees(1))).tiled_loss);
  Plan unfused = degrees(1);
  unfused.cross_entropy_loss_fusion = false;
  EXPECT_FALSE(plan_from_json(plan_to_json(unfused)).cross_entropy_loss_fusion);
  EXPECT_TRUE(plan_from_json(plan_to_json(degrees(1))).cross_entropy_loss_fusion);
  EXPECT_TRUE(unfused.unfused_loss());
  unfused.eager_loss = true;  // the eager loss takes precedence
  EXPECT_FALSE(unfused.unfused_loss());
  p.host_framework = HostFramework::kNative;
  ExpectInvalid(p, llama8b(), h100(8), "plan.eager_loss", "pytorch");
}

TEST(PlanValidate, DegreesBelowOne) {
  // Plans built in code (by search) skip plan_from_json's ranges; validate must still reject
  // them rather than divide by zero.
  Plan p = degrees(8, 1, 2);
  p.ep = 0;
  ExpectInvalid(p, mixtral(), h100(16), "plan.ep", ">= 1");
  p = degrees(8, 2);
  p.vpp = 0;
  ExpectInvalid(p, llama8b(), h100(16), "plan.vpp", ">= 1");
  p = degrees(8, 2);
  p.micro_batch = 0;
  ExpectInvalid(p, llama8b(), h100(16), "plan.mbs", ">= 1");
  p = degrees(8, 2);
  p.global_batch = 0;
  ExpectInvalid(p, llama8b(), h100(16), "plan.gbs", ">= 1");
  p = degrees(-8, -2);  // the product is 16
  ExpectInvalid(p, llama8b(), h100(16), "plan.tp", ">= 1");
  p = degrees(8, 2);
  p.zero = 4;
  ExpectInvalid(p, llama8b(), h100(16), "plan.zero", "0 to 3");
  p = degrees(8, 2);
  p.recompute = Recompute::kFull;
  p.recompute_layers = -2;
  ExpectInvalid(p, llama8b(), h100(16), "plan.recompute_layers", ">= -1");
  p = degrees(8, 2);
  p.seq_len = -1;
  ExpectInvalid(p, llama8b(), h100(16), "plan.seq", ">= 0");
}

TEST(PlanValidate, ProductOfDegreesMustEqualGpus) {
  ExpectInvalid(degrees(8), llama8b(), h100(16), "plan", "= 8 differs from the 16 GPUs");
  ExpectInvalid(degrees(8, 2, 2), llama8b(), h100(16), "plan", "= 32 differs");
}

TEST(PlanValidate, TpMustDivideHeads) {
  ExpectInvalid(degrees(8), model_preset("gpt2-124m"), h100(8), "plan.tp",
                "8 does not divide attention heads (12)");
}

TEST(PlanValidate, TpMustDivideKvHeads) {
  ExpectInvalid(degrees(16), llama8b(), h100(16), "plan.tp", "16 does not divide KV heads (8)");
}

TEST(PlanValidate, TpMustDivideFfn) {
  Model m = custom(R"({"layers": 2, "hidden": 64, "heads": 4, "ffn": 6, "vocab": 512,
                       "seq_len": 64})");
  ExpectInvalid(degrees(4), m, h100(4), "plan.tp", "4 does not divide the MLP size ffn (6)");
}

TEST(PlanValidate, TpMustDivideExpertFfn) {
  Model m = custom(R"({"layers": 2, "hidden": 64, "heads": 4, "ffn": 256, "vocab": 512,
                       "seq_len": 64, "moe": {"experts": 4, "expert_ffn": 6}})");
  ExpectInvalid(degrees(4), m, h100(4), "plan.tp", "4 does not divide the expert MLP size (6)");
}

TEST(PlanValidate, SeqBeyondLearnedPositions) {
  Plan p = degrees(1);
  p.seq_len = 2048;
  ExpectInvalid(p, model_preset("gpt2-124m"), cluster_preset("h200-1", 1), "plan.seq",
                "2048 exceeds the 1024 learned positions");
  p.seq_len = 1024;
  EXPECT_NO_THROW(validate(p, model_preset("gpt2-124m"), cluster_preset("h200-1", 1)));
}

// Sizes whose byte counts overflow int64 are refused, not computed: mbs x seq x vocab is 2^72
// elements here; one sequence of the same model (2^48 elements) is fine.
TEST(PlanValidate, TensorsWhoseByteCountOverflowsInt64) {
  const Model m = custom(R"({"layers": 1, "hidden": 1024, "heads": 8, "ffn": 4096,
                             "vocab": 16777216, "seq": 16777216})");
  Plan p = degrees(1);
  p.micro_batch = 1 << 24;
  p.global_batch = 1 << 24;
  ExpectInvalid(p, m, h100(1), "plan.mbs", "overflows 64-bit");
  p.micro_batch = p.global_batch = 1;
  EXPECT_NO_THROW(validate(p, m, h100(1)));
  // Materialised attention scores: 8 heads x (2^24)^2 x 8 bytes = 2^54 bytes fit; 2^11 heads
  // x 2^48 x 8 bytes do not.
  p.flash_attention = false;
  EXPECT_NO_THROW(validate(p, m, h100(1)));
  const Model wide = custom(R"({"layers": 1, "hidden": 2048, "heads": 2048, "ffn": 4096,
                                "vocab": 512, "seq": 16777216})");
  ExpectInvalid(p, wide, h100(1), "plan.flash_attention", "overflows 64-bit");
}

TEST(PlanValidate, SequenceParallelNeedsTp) {
  Plan p = degrees(1);
  p.sequence_parallel = true;
  ExpectInvalid(p, llama8b(), cluster_preset("h200-1", 1), "plan.sp", "needs tp > 1");
}

TEST(PlanValidate, SequenceParallelTpMustDivideSequence) {
  Plan p = degrees(8);
  p.sequence_parallel = true;
  p.seq_len = 1001;
  ExpectInvalid(p, llama8b(), h100(8), "plan.tp",
                "8 does not divide the sequence per context rank with sp (1001)");
}

TEST(PlanValidate, VirtualStagesNeedInterleavedSchedule) {
  Plan p = degrees(8, 2);
  p.vpp = 2;
  p.global_batch = 4;
  p.schedule = Schedule::k1F1B;
  ExpectInvalid(p, llama8b(), h100(16), "plan.vpp",
                "2 virtual stages need schedule interleaved, not 1f1b");
  p.schedule = Schedule::kGpipe;
  ExpectInvalid(p, llama8b(), h100(16), "plan.vpp", "not gpipe");
}

TEST(PlanValidate, InterleavedNeedsPipeline) {
  Plan p = degrees(8);
  p.vpp = 2;
  p.schedule = Schedule::kInterleaved;
  ExpectInvalid(p, llama8b(), h100(8), "plan.schedule", "interleaved needs pp > 1");
}

TEST(PlanValidate, InterleavedNeedsVirtualStages) {
  Plan p = degrees(8, 2);
  p.schedule = Schedule::kInterleaved;
  p.global_batch = 4;
  ExpectInvalid(p, llama8b(), h100(16), "plan.vpp", "interleaved needs vpp >= 2");
}

TEST(PlanValidate, StagesMustDivideLayers) {
  ExpectInvalid(degrees(8, 3), llama8b(), h100(24), "plan.pp", "3 does not divide layers");
  Plan p = degrees(8, 2);
  p.vpp = 3;
  p.schedule = Schedule::kInterleaved;
  p.global_batch = 4;
  ExpectInvalid(p, llama8b(), h100(16), "plan.pp", "6 does not divide layers");
}

TEST(PlanValidate, GlobalBatchMultipleOfDpTimesMbs) {
  Plan p = degrees(8, 1, 2);
  p.micro_batch = 2;
  p.global_batch = 6;
  ExpectInvalid(p, llama8b(), h100(16), "plan.gbs", "6 is not a multiple of dp x mbs = 2 x 2");
}

TEST(PlanValidate, InterleavedMicroBatchesMultipleOfPp) {
  Plan p = degrees(8, 8);
  p.vpp = 3;
  p.schedule = Schedule::kInterleaved;
  p.global_batch = 12;
  ExpectInvalid(p, model_preset("gpt3-175b"), cluster_preset("dgx-a100-80g", 64), "plan.gbs",
                "micro-batch count (12) to be a multiple of pp (8)");
}

TEST(PlanValidate, ExpertParallelNeedsExperts) {
  Plan p = degrees(8, 1, 2);
  p.ep = 2;
  ExpectInvalid(p, llama8b(), h100(16), "plan.ep", "2 > 1 but the model has no experts");
}

TEST(PlanValidate, EpMustDivideExperts) {
  Plan p = degrees(8, 1, 3);
  p.ep = 3;
  ExpectInvalid(p, mixtral(), h100(24), "plan.ep", "3 does not divide experts (8)");
}

TEST(PlanValidate, EpMustDivideDp) {
  Plan p = degrees(8, 1, 2);
  p.ep = 4;
  ExpectInvalid(p, mixtral(), h100(16), "plan.ep", "4 does not divide dp");
}

TEST(PlanValidate, ContextParallelChunksMustDivideSequence) {
  Plan p = degrees(8, 1, 1, 2);
  p.seq_len = 1002;
  ExpectInvalid(p, llama8b(), h100(16), "plan.cp", "4 does not divide the sequence length");
}

TEST(PlanValidate, AllGatherRotaterIsPytorchs) {
  Plan p = degrees(8, 1, 1, 2);
  p.cp_rotate = CpRotate::kAllGather;
  ExpectInvalid(p, llama8b(), h100(16), "plan.cp_rotate", "allgather is PyTorch's rotater");
  p.cp_impl = CpImpl::kPytorch;
  validate(p, llama8b(), h100(16));
}

// Megatron's --cp-comm-type: Transformer Engine's exchanges, with Megatron's and Transformer
// Engine's own checks (arguments.py, context_parallel.py).
TEST(PlanValidate, CpCommType) {
  Plan p = degrees(2, 1, 1, 4);  // llama8b: 32 heads, 8 K/V heads; 4 and 16 per TP rank
  p.cp_comm_type = CpCommType::kAllGather;
  validate(p, llama8b(), h100(8));
  p.cp_comm_type = CpCommType::kA2a;
  validate(p, llama8b(), h100(8));  // 16 heads, 4 K/V heads per TP rank over 4 context ranks
  p.cp_impl = CpImpl::kPytorch;
  ExpectInvalid(p, llama8b(), h100(8), "plan.cp_comm_type", "a2a is Megatron-Core's");
  p.cp_impl = CpImpl::kTransformerEngine;
  p.flash_attention = false;
  ExpectInvalid(p, llama8b(), h100(8), "plan.cp_comm_type", "fused attention");
  p.flash_attention = true;
  p.tp = 4;  // 2 K/V heads per TP rank do not split over 4 context ranks
  ExpectInvalid(p, llama8b(), h100(16), "plan.cp", "4 does not divide the K/V heads");
  p.cp_comm_type = CpCommType::kA2aP2p;
  ExpectInvalid(p, llama8b(), h100(16), "plan.cp_a2a_size", "must be set");
  p.cp_a2a_size = 2;
  validate(p, llama8b(), h100(16));  // 2 K/V heads per TP rank over an all-to-all of 2
  p.cp_a2a_size = 4;
  ExpectInvalid(p, llama8b(), h100(16), "plan.cp_a2a_size", "from 2 to cp / 2");
  p.cp = 8;
  p.cp_a2a_size = 3;
  ExpectInvalid(p, llama8b(), h100(32), "plan.cp_a2a_size", "3 does not divide cp");
  p.cp = 4;
  p.cp_a2a_size = 2;
  p.cp_comm_type = CpCommType::kP2p;
  ExpectInvalid(p, llama8b(), h100(16), "plan.cp_a2a_size", "not a2a+p2p");
}

// Pipeline flushes (NeMo AutoModel's gradient-accumulation steps under pipeline parallelism)
// split the micro-batches evenly, each flush a whole interleaved schedule; the key round-trips.
TEST(PlanValidate, PipelineFlushes) {
  Plan p = degrees(1, 4, 2);
  p.global_batch = 32;  // 16 micro-batches
  p.pipeline_flushes = 4;
  validate(p, llama8b(), h100(8));
  EXPECT_EQ(p.flush_micro_batches(), 4);
  EXPECT_EQ(plan_from_json(plan_to_json(p)).pipeline_flushes, 4);
  EXPECT_FALSE(plan_to_json(degrees(1)).contains("pipeline_flushes"));
  p.pipeline_flushes = 3;
  ExpectInvalid(p, llama8b(), h100(8), "plan.pipeline_flushes", "does not divide");
  p.pipeline_flushes = 0;
  ExpectInvalid(p, llama8b(), h100(8), "plan.pipeline_flushes", "must be >= 1");
  p.pipeline_flushes = 8;  // 2 micro-batches a flush
  p.vpp = 2;
  p.schedule = Schedule::kInterleaved;
  ExpectInvalid(p, llama8b(), h100(8), "plan.pipeline_flushes", "of a flush (2)");
}

TEST(PlanValidate, Zero3WithPipelineIsAPlan) {
  // torchtitan and NeMo Automodel run FSDP with pipelines (parameters kept through the step).
  Plan p = degrees(8, 2);
  p.zero = 3;
  p.reshard = Reshard::kAfterStep;
  EXPECT_NO_THROW(validate(p, llama8b(), h100(16)));
}

TEST(PlanValidate, ReshardOnlyWithZero3) {
  Plan p = degrees(8, 1, 2);
  p.zero = 2;
  p.reshard = Reshard::kAfterBackward;
  ExpectInvalid(p, llama8b(), h100(16), "plan.reshard", "after_backward applies to ZeRO-3");
  p.zero = 3;
  EXPECT_NO_THROW(validate(p, llama8b(), h100(16)));
}

// PyTorch FSDP's own copies are FSDP's units: ZeRO-3 gathering per layer.
TEST(PlanValidate, FsdpImplOnlyWithZero3LayerUnits) {
  Plan p = degrees(1, 1, 16);
  p.fsdp_impl = FsdpImpl::kFsdp1;
  ExpectInvalid(p, llama8b(), h100(16), "plan.fsdp_impl", "fsdp1 needs zero 3");
  p.zero = 3;
  EXPECT_NO_THROW(validate(p, llama8b(), h100(16)));
  p.zero3_unit = GatherUnit::kModule;
  ExpectInvalid(p, llama8b(), h100(16), "plan.fsdp_impl", "zero3_unit layer");
}

// The unpadded attention is flash-attn's variable-length path.
TEST(PlanValidate, AttentionUnpadIsFlashAttnsVarlenPath) {
  Plan p = degrees(1, 1, 16);
  p.attention_unpad = true;
  EXPECT_NO_THROW(validate(p, llama8b(), h100(16)));
  p.attention_kernel = AttentionKernel::kTriton;
  ExpectInvalid(p, llama8b(), h100(16), "plan.attention_unpad", "attention_kernel flash2");
  p.attention_kernel = AttentionKernel::kFlash2;
  p.flash_attention = false;
  ExpectInvalid(p, llama8b(), h100(16), "plan.attention_unpad", "needs flash_attention");
}

TEST(PlanJson, FrameworkCopiesAndMetricPasses) {
  const Plan p =
      plan_from_json(Json::parse(R"({"zero": 3, "fsdp_impl": "fsdp2", "attention_unpad": true,
                      "loss_metric_passes": 2})"));
  EXPECT_EQ(p.fsdp_impl, FsdpImpl::kFsdp2);
  EXPECT_TRUE(p.attention_unpad);
  EXPECT_EQ(p.loss_metric_passes, 2);
  const Json j = plan_to_json(p);
  EXPECT_EQ(j["fsdp_impl"], "fsdp2");
  EXPECT_EQ(j["loss_metric_passes"], 2);
  EXPECT_FALSE(plan_to_json(Plan{}).contains("fsdp_impl"));
  ExpectError([] { plan_from_json(Json::parse(R"({"fsdp_impl": "fsdp3"})")); }, "plan.fsdp_impl",
              "none|fsdp1|fsdp2");
  ExpectError([] { plan_from_json(Json::parse(R"({"loss_metric_passes": 9})")); },
              "plan.loss_metric_passes", "");
  // The runtime runs the same numerics without them.
  const Plan r = runtime_plan(p);
  EXPECT_EQ(r.fsdp_impl, FsdpImpl::kNone);
  EXPECT_FALSE(r.attention_unpad);
  EXPECT_EQ(r.loss_metric_passes, 0);
}

// DeepSpeed ZeRO-3's ds_config sizes (stage3_prefetch_bucket_size, stage3_max_live_parameters,
// stage3_max_reuse_distance, reduce_bucket_size, stage3_param_persistence_threshold): read as
// DeepSpeed writes them (3e9, a JSON
// number), written back only where they differ from DeepSpeed's defaults, refused naming the
// field when fractional, out of range, or given to a plan that is not DeepSpeed's ZeRO-3.
TEST(PlanJson, DeepSpeedZero3Sizes) {
  const Plan p = plan_from_json(Json::parse(
      R"({"zero": 3, "zero3_unit": "module", "zero3_max_live_parameters": 3e9,
          "zero3_max_reuse_distance": 3000000000, "zero3_prefetch_bucket": 5e7,
          "zero3_reduce_bucket": 90000000, "zero3_param_persistence_threshold": 1e6})"));
  EXPECT_EQ(p.zero3_param_persistence_threshold, 1000000);
  EXPECT_EQ(p.zero3_max_live_parameters, 3000000000);
  EXPECT_EQ(p.zero3_max_reuse_distance, 3000000000);
  EXPECT_EQ(p.zero3_prefetch_bucket, 50000000);
  EXPECT_EQ(p.zero3_reduce_bucket, 90000000);
  const Json j = plan_to_json(p);
  EXPECT_EQ(j["zero3_max_live_parameters"], 3000000000);
  EXPECT_EQ(j["zero3_reduce_bucket"], 90000000);
  EXPECT_EQ(j["zero3_param_persistence_threshold"], 1000000);
  EXPECT_FALSE(j.contains("zero3_prefetch_bucket"));  // DeepSpeed's default
  EXPECT_EQ(plan_to_json(plan_from_json(parse_json(j.dump(), "plan"))), j);
  const Plan d;
  EXPECT_EQ(d.zero3_prefetch_bucket, 50000000);  // deepspeed/runtime/zero/constants.py
  EXPECT_EQ(d.zero3_max_live_parameters, 1000000000);
  EXPECT_EQ(d.zero3_max_reuse_distance, 1000000000);
  EXPECT_EQ(d.zero3_reduce_bucket, 500000000);
  EXPECT_EQ(d.zero3_param_persistence_threshold, 100000);
  ExpectError([] { plan_from_json(Json::parse(R"({"zero3_max_live_parameters": 2.5})")); },
              "plan.zero3_max_live_parameters", "whole number");
  ExpectError([] { plan_from_json(Json::parse(R"({"zero3_reduce_bucket": 0})")); },
              "plan.zero3_reduce_bucket", "");
  ExpectError([] { plan_from_json(Json::parse(R"({"zero3_prefetch_bucket": "big"})")); },
              "plan.zero3_prefetch_bucket", "");
}

TEST(PlanValidate, DeepSpeedZero3SizesNeedDeepSpeedsZero3) {
  Plan p = degrees(1, 1, 16);
  p.zero = 3;
  p.zero3_max_live_parameters = 3000000000;
  ExpectInvalid(p, llama8b(), h100(16), "plan.zero3_max_live_parameters",
                "zero 3 with zero3_unit module");
  p.zero3_unit = GatherUnit::kModule;
  EXPECT_NO_THROW(validate(p, llama8b(), h100(16)));
  p.zero3_prefetch_bucket = 0;
  ExpectInvalid(p, llama8b(), h100(16), "plan.zero3_prefetch_bucket", "overlap_param_gather");
  p.zero3_prefetch_bucket = 1;
  p.zero3_reduce_bucket = 0;
  ExpectInvalid(p, llama8b(), h100(16), "plan.zero3_reduce_bucket", ">= 1");
  p.zero3_reduce_bucket = 1;
  p.zero3_max_reuse_distance = -1;
  ExpectInvalid(p, llama8b(), h100(16), "plan.zero3_max_reuse_distance", ">= 0");
  p.zero3_max_reuse_distance = 0;
  p.zero3_param_persistence_threshold = -1;
  ExpectInvalid(p, llama8b(), h100(16), "plan.zero3_param_persistence_threshold", ">= 0");
  p.zero3_param_persistence_threshold = 0;
  EXPECT_NO_THROW(validate(p, llama8b(), h100(16)));
  // The threshold alone set away from its default, outside DeepSpeed's ZeRO-3.
  Plan q = degrees(1, 1, 16);
  q.zero = 3;
  q.zero3_param_persistence_threshold = 0;
  ExpectInvalid(q, llama8b(), h100(16), "plan.zero3_param_persistence_threshold",
                "zero 3 with zero3_unit module");
}

TEST(PlanValidate, ShardDegreeDividesTheDataParallelGroup) {
  Plan p = degrees(1, 1, 16);
  p.shard_degree = 8;
  ExpectInvalid(p, llama8b(), h100(16), "plan.shard_degree", "needs ZeRO 1-3");
  p.zero = 3;
  EXPECT_NO_THROW(validate(p, llama8b(), h100(16)));
  p.shard_degree = 6;
  ExpectInvalid(p, llama8b(), h100(16), "plan.shard_degree",
                "6 does not divide the data-parallel group dp x cp (16)");
  // Experts: a multiple of ep whose quotient divides the expert data-parallel group.
  Plan e = degrees(1, 1, 16);
  e.ep = 8;
  e.zero = 1;
  e.shard_degree = 4;
  ExpectInvalid(e, mixtral(), h100(16), "plan.shard_degree", "must be a multiple of ep (8)");
  e.shard_degree = 16;
  EXPECT_NO_THROW(validate(e, mixtral(), h100(16)));
  EXPECT_EQ(e.expert_shard_ranks(), 2);
  EXPECT_EQ(e.dense_shard_ranks(), 16);
}

TEST(PlanValidate, ExpertTensorParallelLikeMegatron) {
  // Qwen3-235B on Megatron: tp 2, etp 1, ep 32 over 16 data-parallel ranks of a stage.
  Model m = mixtral();
  m.moe.experts = 128;
  Plan p = degrees(2, 1, 16);
  p.ep = 32;
  ExpectInvalid(p, m, h100(32), "plan.ep", "32 does not divide dp");
  p.etp = 1;
  EXPECT_NO_THROW(validate(p, m, h100(32)));
  EXPECT_EQ(p.expert_tp(), 1);
  EXPECT_EQ(p.expert_dp(), 1);
  p.ep = 64;
  ExpectInvalid(p, m, h100(32), "plan.ep", "64 does not divide tp x cp x dp");
  Plan dense = degrees(2, 1, 16);
  dense.etp = 1;
  ExpectInvalid(dense, llama8b(), h100(32), "plan.etp", "the model has no experts");
  Plan balanced = degrees(2, 1, 16);
  balanced.moe_force_balance = MoeForceBalance::kRoundRobin;
  ExpectInvalid(balanced, llama8b(), h100(32), "plan.moe_force_balance",
                "round_robin is set but the model has no experts");
}

TEST(PlanValidate, OptimizerDtype) {
  Plan p = degrees(8, 1, 2);
  p.optimizer_dtype = Dtype::kBf16;
  EXPECT_NO_THROW(validate(p, llama8b(), h100(16)));
  p.precision = Dtype::kFp8;
  ExpectInvalid(p, llama8b(), h100(16), "plan.optimizer_dtype", "keeps bf16 weights");
  p.precision = Dtype::kBf16;
  p.optimizer_dtype = Dtype::kFp16;
  ExpectInvalid(p, llama8b(), h100(16), "plan.optimizer_dtype", "must be fp32 or bf16");
}

TEST(PlanValidate, GradReduceDtype) {
  Plan p = degrees(8, 1, 2);
  p.grad_reduce_dtype = Dtype::kFp8;
  ExpectInvalid(p, llama8b(), h100(16), "plan.grad_reduce_dtype", "must be fp32, bf16 or fp16");
  p.grad_reduce_dtype = Dtype::kBf16;
  EXPECT_NO_THROW(validate(p, llama8b(), h100(16)));
}

// Megatron-Core --fp8-param-gather: fp8 training and the distributed optimizer (its own checks),
// and nothing parasol does not model (ZeRO-3's gathers, host-resident weights or optimizer).
TEST(PlanValidate, Fp8ParamGather) {
  Plan p = degrees(8, 1, 2);
  p.zero = 1;
  p.fp8_param_gather = true;
  ExpectInvalid(p, llama8b(), h100(16), "plan.fp8_param_gather", "need precision fp8, not bf16");
  p.precision = Dtype::kFp8;
  EXPECT_NO_THROW(validate(p, llama8b(), h100(16)));
  p.zero = 2;
  EXPECT_NO_THROW(validate(p, llama8b(), h100(16)));
  p.zero = 0;
  ExpectInvalid(p, llama8b(), h100(16), "plan.fp8_param_gather", "zero 1 or 2, not 0");
  p.zero = 3;
  ExpectInvalid(p, llama8b(), h100(16), "plan.fp8_param_gather", "zero 1 or 2, not 3");
  p.zero = 1;
  p.offload.optimizer = true;
  ExpectInvalid(p, llama8b(), h100(16), "plan.fp8_param_gather", "host memory");
}

TEST(PlanValidate, ExplicitStageLayers) {
  // 32 layers on 3 stages cannot split evenly; a list can.
  Plan p = degrees(1, 3);
  ExpectInvalid(p, llama8b(), h100(3), "plan.pp", "3 does not divide layers");
  p.stage_layers = {10, 11, 11};
  EXPECT_NO_THROW(validate(p, llama8b(), h100(3)));
  EXPECT_EQ(p.layers_in_stage(32, 0), 10);
  EXPECT_EQ(p.layers_in_stage(32, 2), 11);
  EXPECT_EQ(p.max_layers_in_stage(32), 11);
  EXPECT_EQ(p.first_layer(32, 2, 0), 21);
  p.stage_layers = {10, 11};
  ExpectInvalid(p, llama8b(), h100(3), "plan.stage_layers", "lists 2 stages but pp is 3");
  p.stage_layers = {10, 11, 12};
  ExpectInvalid(p, llama8b(), h100(3), "plan.stage_layers", "sums to 33 layers");
  p.stage_layers = {10, 0, 22};
  ExpectInvalid(p, llama8b(), h100(3), "plan.stage_layers[1]", "must be >= 1");
}

TEST(PlanValidate, FirstAndLastStageLayersLikeMegatron) {
  // Llama 3 405B: 126 layers on 16 stages, first and last with 7, the 14 others with 8.
  Model m = llama8b();
  m.layers = 126;
  Plan p = degrees(1, 16);
  p.first_stage_layers = 7;
  p.last_stage_layers = 7;
  EXPECT_NO_THROW(validate(p, m, h100(16)));
  EXPECT_EQ(p.layers_in_stage(126, 0), 7);
  EXPECT_EQ(p.layers_in_stage(126, 1), 8);
  EXPECT_EQ(p.layers_in_stage(126, 15), 7);
  EXPECT_EQ(p.max_layers_in_stage(126), 8);
  p.last_stage_layers = 8;
  ExpectInvalid(p, m, h100(16), "plan.first_stage_layers",
                "leaves 111 layers, which do not split evenly over the 14 other stages");
}

TEST(PlanValidate, UnevenStagesWithVirtualStages) {
  // Interleaved: each stage's layers split evenly over its vpp chunks, Megatron's order.
  Model m = llama8b();
  m.layers = 28;
  Plan p = degrees(1, 4);
  p.schedule = Schedule::kInterleaved;
  p.vpp = 2;
  p.global_batch = 8;
  p.stage_layers = {6, 8, 8, 6};
  EXPECT_NO_THROW(validate(p, m, h100(4)));
  EXPECT_EQ(p.layers_in_chunk(28, 1, 0), 4);
  // Chunk 0: stages hold layers 0-2, 3-6, 7-10, 11-13; chunk 1 starts at 14.
  EXPECT_EQ(p.first_layer(28, 1, 0), 3);
  EXPECT_EQ(p.first_layer(28, 3, 0), 11);
  EXPECT_EQ(p.first_layer(28, 0, 1), 14);
  EXPECT_EQ(p.first_layer(28, 2, 1), 21);
  p.stage_layers = {5, 9, 8, 6};
  ExpectInvalid(p, m, h100(4), "plan.stage_layers[0]", "5 layers do not split into the 2");
  // Per virtual stage (pp x vpp entries, Megatron's order), as torch pipelining and Megatron's
  // layout allow: DeepSeek-V3's 61 layers as [16, 15, 15, 15] per stage over 2 chunks.
  Model ds = m;
  ds.layers = 61;
  p.stage_layers = {8, 8, 8, 8, 8, 7, 7, 7};
  EXPECT_NO_THROW(validate(p, ds, h100(4)));
  EXPECT_EQ(p.layers_in_stage(61, 0), 16);
  EXPECT_EQ(p.layers_in_stage(61, 3), 15);
  EXPECT_EQ(p.layers_in_chunk(61, 1, 1), 7);
  EXPECT_EQ(p.first_layer(61, 0, 1), 32);
  EXPECT_EQ(p.first_layer(61, 2, 1), 47);  // 32 + stage 0 (8) + stage 1 (7)
  p.stage_layers = {8, 8, 8, 8, 8, 7, 7};
  ExpectInvalid(p, ds, h100(4), "plan.stage_layers", "lists 7 stages but pp is 4 (or pp x vpp = 8");
  // Even plans give the same answers through the same functions.
  Plan even = degrees(1, 4);
  even.schedule = Schedule::kInterleaved;
  even.vpp = 2;
  EXPECT_EQ(even.first_layer(32, 1, 1), 20);
  EXPECT_EQ(even.layers_in_chunk(32, 3, 1), 4);
}

// Megatron's --account-for-embedding/loss-in-pipeline-split: the layer counts and first layers of
// every virtual stage are Megatron-Core's own (tests/core/megatron_split.h restates its
// arithmetic), for Qwen3-235B's 94 layers on pp 8 with and without virtual stages.
TEST(PlanValidate, EmbeddingAndLossAccountedLikeMegatron) {
  Model m = llama8b();
  m.layers = 94;
  for (int vpp : {1, 2, 3, 4, 6}) {
    SCOPED_TRACE("vpp " + std::to_string(vpp));
    Plan p = degrees(1, 8);
    p.account_for_embedding = true;
    p.account_for_loss = true;
    if (vpp > 1) {
      p.schedule = Schedule::kInterleaved;
      p.vpp = vpp;
      p.global_batch = 8;
    }
    EXPECT_TRUE(p.uneven_stages());
    ASSERT_NO_THROW(validate(p, m, h100(8)));
    const megatron_oracle::AccountedSplit megatron{94, 8, vpp, true, true};
    int total = 0;
    for (int s = 0; s < 8; ++s) {
      int stage = 0;
      for (int c = 0; c < vpp; ++c) {
        EXPECT_EQ(p.layers_in_chunk(94, s, c), megatron.to_build(s, c)) << s << "," << c;
        EXPECT_EQ(p.first_layer(94, s, c), megatron.offset(s, c)) << s << "," << c;
        stage += megatron.to_build(s, c);
      }
      EXPECT_EQ(p.layers_in_stage(94, s), stage) << s;
      total += stage;
    }
    EXPECT_EQ(total, 94);
    // 96 slots over 8 stages: the first and last stages hold one layer fewer than the others.
    EXPECT_EQ(p.layers_in_stage(94, 0), 11);
    EXPECT_EQ(p.layers_in_stage(94, 3), 12);
    EXPECT_EQ(p.layers_in_stage(94, 7), 11);
    EXPECT_EQ(p.max_layers_in_stage(94), 12);
  }
  // One switch alone: the embedding's slot only (95 layers + 1 on pp 8 = 12 each).
  Model m95 = m;
  m95.layers = 95;
  Plan e = degrees(1, 8);
  e.account_for_embedding = true;
  ASSERT_NO_THROW(validate(e, m95, h100(8)));
  EXPECT_EQ(e.layers_in_stage(95, 0), 11);
  EXPECT_EQ(e.layers_in_stage(95, 7), 12);
  EXPECT_EQ(e.first_layer(95, 1, 0), 11);
  Plan l = degrees(1, 8);
  l.account_for_loss = true;
  ASSERT_NO_THROW(validate(l, m95, h100(8)));
  EXPECT_EQ(l.layers_in_stage(95, 0), 12);
  EXPECT_EQ(l.layers_in_stage(95, 7), 11);
}

// Each rule of Megatron's that the accounting meets (transformer_config.py L2229-2261,
// L2370-2415; transformer_block.py get_num_layers_to_build), refused naming the switch.
TEST(PlanValidate, AccountedSplitRefusesWhatMegatronRefuses) {
  const std::string embedding = "plan.account_for_embedding_in_pipeline_split";
  const std::string loss = "plan.account_for_loss_in_pipeline_split";
  // DeepSeek-V3's 61 layers + 2 = 63 do not split over pp 8 (Megatron: "num_layers ... must be
  // divisible by pipeline_model_parallel_size").
  Model ds = llama8b();
  ds.layers = 61;
  Plan p = degrees(1, 8);
  p.account_for_embedding = p.account_for_loss = true;
  ExpectInvalid(p, ds, h100(8), embedding, "(63) do not split evenly over pp 8");
  p.account_for_embedding = false;
  ExpectInvalid(p, ds, h100(8), loss, "(62) do not split evenly over pp 8");
  // 96 slots per 8 stages = 12, which vpp 5 does not divide.
  Model qwen = llama8b();
  qwen.layers = 94;
  Plan v = degrees(1, 8);
  v.account_for_embedding = v.account_for_loss = true;
  v.schedule = Schedule::kInterleaved;
  v.vpp = 5;
  v.global_batch = 8;
  ExpectInvalid(v, qwen, h100(8), embedding, "12 layers per pipeline stage");
  // vpp 12: one slot per virtual stage leaves the first with the embedding alone (Megatron's
  // stand-alone embedding stage), which parasol does not lower.
  v.vpp = 12;
  ExpectInvalid(v, qwen, h100(8), embedding, "no transformer layer");
  // Not with Megatron's other layout arguments.
  Plan f = degrees(1, 8);
  f.account_for_loss = true;
  f.first_stage_layers = 11;
  ExpectInvalid(f, qwen, h100(8), loss, "first/last_stage_layers");
  f.first_stage_layers = 0;
  f.stage_layers = {11, 12, 12, 12, 12, 12, 12, 11};
  ExpectInvalid(f, qwen, h100(8), loss, "stage_layers");
  // Without a pipeline the switches change nothing: every layer on the one stage.
  Plan one = degrees(1, 1);
  one.account_for_embedding = one.account_for_loss = true;
  EXPECT_NO_THROW(validate(one, qwen, h100(1)));
  EXPECT_EQ(one.layers_in_stage(94, 0), 94);
}

TEST(PlanValidate, RecomputeLayersOnlyWithFullRecompute) {
  Plan p = degrees(8, 2);
  p.recompute = Recompute::kSelective;
  p.recompute_layers = 2;
  ExpectInvalid(p, llama8b(), h100(16), "plan.recompute_layers", "only applies to recompute full");
}

// recompute_layers in a file (or --recompute-layers) is a count >= 0; absent, every layer of the
// stage is recomputed (-1 in memory), and -1 is not a value a user can give.
TEST(PlanJson, RecomputeLayersIsACount) {
  EXPECT_EQ(plan_from_json(Json::parse(R"({"recompute": "full"})")).recompute_layers, -1);
  EXPECT_EQ(plan_from_json(Json::parse(R"({"recompute": "full", "recompute_layers": 0})"))
                .recompute_layers,
            0);
  ExpectError(
      [] { plan_from_json(Json::parse(R"({"recompute": "full", "recompute_layers": -1})")); },
      "plan.recompute_layers", "out of range");
}

// Megatron's --recompute-modules: its names, as a list or a comma string, only under selective
// recompute and only for modules the model has; the default is core_attn.
TEST(PlanJson, RecomputeModulesByMegatronsNames) {
  Plan d = plan_from_json(Json::parse(R"({"recompute": "selective"})"));
  EXPECT_TRUE(d.recomputes(RecomputeModule::kCoreAttn));
  EXPECT_FALSE(d.recomputes(RecomputeModule::kMlp));
  Plan p = plan_from_json(
      Json::parse(R"({"recompute": "selective", "recompute_modules": ["mla_up_proj", "mlp"]})"));
  EXPECT_TRUE(p.recomputes(RecomputeModule::kMlaUpProj));
  EXPECT_TRUE(p.recomputes(RecomputeModule::kMlp));
  EXPECT_FALSE(p.recomputes(RecomputeModule::kCoreAttn));
  Plan q = plan_from_json(
      Json::parse(R"({"recompute": "selective", "recompute_modules": "layernorm,moe_act"})"));
  EXPECT_TRUE(q.recomputes(RecomputeModule::kLayernorm));
  EXPECT_TRUE(q.recomputes(RecomputeModule::kMoeAct));
  EXPECT_EQ(plan_from_json(plan_to_json(q)).recompute_modules, q.recompute_modules);
  Plan none = plan_from_json(Json::parse(R"({"recompute": "full"})"));
  EXPECT_FALSE(none.recomputes(RecomputeModule::kCoreAttn));  // full is not selective
  EXPECT_EQ(recompute_label(d), "selective");
  EXPECT_EQ(recompute_label(q), "selective:moe_act,layernorm");
  EXPECT_EQ(recompute_label(none), "full");
  ExpectError(
      [] {
        plan_from_json(Json::parse(R"({"recompute": "selective",
                                                   "recompute_modules": ["mlp", "attn"]})"));
      },
      "plan.recompute_modules[1]", "'attn' is not one of core_attn");
  ExpectError([] { plan_from_json(Json::parse(R"({"recompute_modules": ["mlp"]})")); },
              "plan.recompute_modules", "only applies to recompute selective");
  ExpectError(
      [] {
        plan_from_json(Json::parse(R"({"recompute": "selective",
                                                   "recompute_modules": 3})"));
      },
      "plan.recompute_modules", "list of module names");
}

TEST(PlanValidate, RecomputeModulesTheModelHas) {
  Plan p = degrees(8, 2);
  p.recompute = Recompute::kSelective;
  p.recompute_modules = 1u << static_cast<int>(RecomputeModule::kMoeAct);
  ExpectInvalid(p, llama8b(), h100(16), "plan.recompute_modules", "moe_act needs a model with MoE");
  p.recompute_modules = 1u << static_cast<int>(RecomputeModule::kMlaUpProj);
  ExpectInvalid(p, llama8b(), h100(16), "plan.recompute_modules", "mla_up_proj needs a model");
  p.recompute_modules = 1u << static_cast<int>(RecomputeModule::kMlp);
  EXPECT_NO_THROW(validate(p, llama8b(), h100(16)));
}

TEST(PlanValidate, RecomputeLayersAtMostLayersPerStage) {
  Plan p = degrees(8, 2);
  p.recompute = Recompute::kFull;
  p.recompute_layers = 17;
  ExpectInvalid(p, llama8b(), h100(16), "plan.recompute_layers", "17 exceeds the 16 layers");
  p.recompute_layers = 16;
  EXPECT_NO_THROW(validate(p, llama8b(), h100(16)));
  EXPECT_EQ(p.full_recompute_layers(16), 16);
}

// Two H100s joined by NVLink; `cpu` adds a host CPU with memory, linked to the GPUs or not.
Cluster two_gpus(bool cpu, bool cpu_linked) {
  Json j = Json::parse(R"({
    "nodes": [{"id": "g0", "kind": "gpu", "server": 0, "device": "H100-SXM"},
              {"id": "g1", "kind": "gpu", "server": 0, "device": "H100-SXM"}],
    "links": [{"a": "g0", "b": "g1", "kind": "nvlink", "bw_GBps": 450}]})");
  if (cpu) {
    j["nodes"].push_back({{"id", "cpu"}, {"kind", "cpu"}, {"server", 0}, {"memory_GiB", 256}});
    if (cpu_linked)
      for (const char* g : {"g0", "g1"})
        j["links"].push_back({{"a", g}, {"b", "cpu"}, {"kind", "pcie"}, {"bw_GBps", 64}});
  }
  return cluster_from_json(j);
}

TEST(PlanValidate, OffloadNeedsHostMemory) {
  Plan p = degrees(2);
  p.offload.params = true;
  ExpectInvalid(p, model_preset("tiny"), two_gpus(false, false), "plan.offload",
                "params needs host memory");
}

TEST(PlanValidate, OffloadNeedsALinkToHostMemory) {
  Plan p = degrees(2);
  p.offload.activations = true;
  ExpectInvalid(p, model_preset("tiny"), two_gpus(true, false), "plan.offload",
                "no link joins the GPUs to host memory");
  EXPECT_NO_THROW(validate(p, model_preset("tiny"), two_gpus(true, true)));
}

TEST(PlanValidate, Fp8NeedsHardwareSupport) {
  Plan p = degrees(8);
  p.precision = Dtype::kFp8;
  ExpectInvalid(p, llama8b(), cluster_preset("dgx-a100-80g", 8), "plan.precision",
                "fp8 is not supported by A100-80G");
  EXPECT_NO_THROW(validate(p, llama8b(), h100(8)));
}

TEST(PlanValidate, FlashAttention3NeedsHopper) {
  Plan p = degrees(8);
  p.attention_kernel = AttentionKernel::kFa3;
  ExpectInvalid(p, llama8b(), cluster_preset("dgx-a100-80g", 8), "plan.attention_kernel",
                "fa3 (FlashAttention-3) runs on Hopper GPUs only, not A100-80G");
  EXPECT_NO_THROW(validate(p, llama8b(), h100(8)));
  EXPECT_STREQ(attention_kernel_name(p.attention_kernel), "fa3");
  EXPECT_EQ(parse_attention_kernel("fa3", "plan.attention_kernel"), AttentionKernel::kFa3);
}

TEST(PlanValidate, Tf32IsNotATrainingPrecision) {
  Plan p = degrees(8);
  p.precision = Dtype::kTf32;
  ExpectInvalid(p, llama8b(), h100(8), "plan.precision", "tf32 is a math mode");
  p.precision = Dtype::kFp32;
  EXPECT_NO_THROW(validate(p, llama8b(), h100(8)));
}

// --- JSON ----------------------------------------------------------------------------------------

void ExpectSamePlan(const Plan& a, const Plan& b) {
  EXPECT_EQ(a.tp, b.tp);
  EXPECT_EQ(a.pp, b.pp);
  EXPECT_EQ(a.dp, b.dp);
  EXPECT_EQ(a.cp, b.cp);
  EXPECT_EQ(a.ep, b.ep);
  EXPECT_EQ(a.sequence_parallel, b.sequence_parallel);
  EXPECT_EQ(a.vpp, b.vpp);
  EXPECT_EQ(a.zero, b.zero);
  EXPECT_EQ(a.micro_batch, b.micro_batch);
  EXPECT_EQ(a.global_batch, b.global_batch);
  EXPECT_EQ(a.seq_len, b.seq_len);
  EXPECT_EQ(a.schedule, b.schedule);
  EXPECT_EQ(a.recompute, b.recompute);
  EXPECT_EQ(a.recompute_layers, b.recompute_layers);
  EXPECT_EQ(a.recompute_modules, b.recompute_modules);
  EXPECT_EQ(a.offload, b.offload);
  EXPECT_EQ(a.precision, b.precision);
  EXPECT_EQ(a.flash_attention, b.flash_attention);
  EXPECT_EQ(a.overlap_grad_reduce, b.overlap_grad_reduce);
  EXPECT_EQ(a.overlap_param_gather, b.overlap_param_gather);
  EXPECT_EQ(a.rank_order, b.rank_order);
  EXPECT_EQ(a.tp_comm_overlap, b.tp_comm_overlap);
  EXPECT_EQ(a.reshard, b.reshard);
  EXPECT_EQ(a.shard_degree, b.shard_degree);
  EXPECT_EQ(a.grad_reduce_dtype, b.grad_reduce_dtype);
  EXPECT_EQ(a.fp8_param_gather, b.fp8_param_gather);
  EXPECT_EQ(a.stage_layers, b.stage_layers);
  EXPECT_EQ(a.first_stage_layers, b.first_stage_layers);
  EXPECT_EQ(a.last_stage_layers, b.last_stage_layers);
  EXPECT_EQ(a.account_for_embedding, b.account_for_embedding);
  EXPECT_EQ(a.account_for_loss, b.account_for_loss);
  EXPECT_EQ(a.fsdp_impl, b.fsdp_impl);
  EXPECT_EQ(a.zero3_unit, b.zero3_unit);
  EXPECT_EQ(a.zero3_prefetch_bucket, b.zero3_prefetch_bucket);
  EXPECT_EQ(a.zero3_max_live_parameters, b.zero3_max_live_parameters);
  EXPECT_EQ(a.zero3_max_reuse_distance, b.zero3_max_reuse_distance);
  EXPECT_EQ(a.zero3_reduce_bucket, b.zero3_reduce_bucket);
  EXPECT_EQ(a.attention_unpad, b.attention_unpad);
  EXPECT_EQ(a.loss_metric_passes, b.loss_metric_passes);
  EXPECT_EQ(a.etp, b.etp);
  EXPECT_EQ(a.ep_comm_overlap, b.ep_comm_overlap);
  EXPECT_EQ(a.attention_kernel, b.attention_kernel);
  EXPECT_EQ(a.cp_impl, b.cp_impl);
  EXPECT_EQ(a.tp_impl, b.tp_impl);
  EXPECT_EQ(a.cp_rotate, b.cp_rotate);
  EXPECT_EQ(a.cp_comm_type, b.cp_comm_type);
  EXPECT_EQ(a.cp_a2a_size, b.cp_a2a_size);
  EXPECT_EQ(a.repeat_kv, b.repeat_kv);
  EXPECT_EQ(a.moe_dispatcher, b.moe_dispatcher);
  EXPECT_EQ(a.moe_router_fp32, b.moe_router_fp32);
  EXPECT_EQ(a.moe_force_balance, b.moe_force_balance);
  EXPECT_EQ(a.fp8_recipe, b.fp8_recipe);
  EXPECT_EQ(a.optimizer_dtype, b.optimizer_dtype);
  EXPECT_EQ(a.fused_kernels, b.fused_kernels);
  EXPECT_EQ(a.model_ref, b.model_ref);
  EXPECT_EQ(a.cluster_ref, b.cluster_ref);
  EXPECT_EQ(a.gpus_ref, b.gpus_ref);
  EXPECT_EQ(a.lora_rank, b.lora_rank);
  EXPECT_EQ(a.lora_targets, b.lora_targets);
  EXPECT_EQ(a.lora_dropout, b.lora_dropout);
  EXPECT_EQ(a.activation_fp8_input_store, b.activation_fp8_input_store);
}

// LoRA (Plan::lora_rank) by NeMo's names, and Megatron's fp8 copy of the SwiGLU input: read,
// written back, and refused where they do not apply.
TEST(PlanJson, LoraByNemosNames) {
  Json j = {{"dp", 8},
            {"lora_rank", 16},
            {"lora_target_modules", {"linear_proj", "linear_qkv"}},
            {"lora_dropout", 0.1},
            {"activation_func_fp8_input_store", true}};
  const Plan p = plan_from_json(j);
  EXPECT_EQ(p.lora_rank, 16);
  EXPECT_TRUE(p.lora_targets_linear(LoraTarget::kQkv));
  EXPECT_TRUE(p.lora_targets_linear(LoraTarget::kProj));
  EXPECT_FALSE(p.lora_targets_linear(LoraTarget::kFc1));
  EXPECT_DOUBLE_EQ(p.lora_dropout, 0.1);
  EXPECT_TRUE(p.activation_fp8_input_store);
  EXPECT_NE(plan_compact(p).find("lora16:linear_qkv,linear_proj"), std::string::npos);
  ExpectSamePlan(p, plan_from_json(plan_to_json(p)));
  // NeMo's default targets: all four linears, not written back.
  const Plan all = plan_from_json(Json{{"lora_rank", 8}});
  EXPECT_EQ(all.lora_targets, 0xFu);
  EXPECT_FALSE(plan_to_json(all).contains("lora_target_modules"));
  ExpectError(
      [] {
        plan_from_json(Json{{"lora_target_modules", {"linear_qkv"}}});
      },
      "plan.lora_target_modules", "lora_rank > 0");
  ExpectError(
      [] {
        plan_from_json(Json{{"lora_dropout", 0.1}});
      },
      "plan.lora_dropout", "lora_rank > 0");
  ExpectError(
      [] {
        plan_from_json(Json{{"lora_rank", 8}, {"lora_target_modules", {"q_proj"}}});
      },
      "plan.lora_target_modules[0]", "linear_qkv|linear_proj");
  ExpectError([] { plan_from_json(Json{{"lora_rank", -1}}); }, "plan.lora_rank", "out of range");
}

TEST(PlanValidate, LoraWhereItIsModelled) {
  const Model m = model_preset("llama3-8b");
  const Cluster c = cluster_preset("dgx-h100", 8);
  Plan p;
  p.dp = 8;
  p.global_batch = 8;
  p.lora_rank = 16;
  validate(p, m, c);
  Plan odd = p;
  odd.lora_rank = 12;
  ExpectError([&] { validate(odd, m, c); }, "plan.lora_rank", "1, 2, 4, ..., 128");
  Plan tp = p;
  tp.tp = 2, tp.dp = 4;
  ExpectError([&] { validate(tp, m, c); }, "plan.lora_rank", "tp 1 only");
  Plan z3 = p;
  z3.zero = 3;
  ExpectError([&] { validate(z3, m, c); }, "plan.lora_rank", "ZeRO-3");
  Plan off = p;
  off.offload.optimizer = true;
  ExpectError([&] { validate(off, m, c); }, "plan.offload", "LoRA");
  ExpectError([&] { validate(p, model_preset("mixtral-8x7b"), c); }, "plan.lora_rank", "MoE");
  Plan act = p;
  act.lora_rank = 0;
  act.activation_fp8_input_store = true;
  validate(act, m, c);
  ExpectError([&] { validate(act, model_preset("gpt2-124m"), c); },
              "plan.activation_func_fp8_input_store", "SwiGLU only");
}

TEST(PlanJson, RoundTripDefault) {
  Plan p;
  ExpectSamePlan(p, plan_from_json(plan_to_json(p)));
  ExpectSamePlan(p, plan_from_json(Json::object()));
}

TEST(PlanJson, RoundTripEveryFieldChanged) {
  Plan p;
  p.tp = 4;
  p.pp = 2;
  p.dp = 4;
  p.cp = 2;
  p.ep = 2;
  p.sequence_parallel = true;
  p.vpp = 2;
  p.zero = 1;
  p.micro_batch = 2;
  p.global_batch = 64;
  p.seq_len = 4096;
  p.schedule = Schedule::kInterleaved;
  p.recompute = Recompute::kFull;
  p.recompute_layers = 3;
  p.offload.optimizer = true;
  p.offload.activations = true;
  p.precision = Dtype::kFp16;
  p.flash_attention = false;
  p.overlap_grad_reduce = false;
  p.overlap_param_gather = false;
  p.rank_order = {Dim::kTp, Dim::kDp, Dim::kCp, Dim::kEp, Dim::kPp};
  p.model_ref = "mixtral-8x7b";
  p.cluster_ref = "dgx-h100";
  p.gpus_ref = 64;
  p.loss_metric_passes = 3;
  p.fp8_recipe = Fp8Recipe::kTensorwise;
  p.tp_impl = TpImpl::kPytorch;
  Json j = plan_to_json(p);
  EXPECT_EQ(j["fp8_recipe"], "tensorwise");
  EXPECT_EQ(j["tp_impl"], "torch");
  EXPECT_EQ(j["offload"], "optimizer,activations");
  EXPECT_EQ(j["rank_order"], "tp-dp-cp-ep-pp");
  ExpectSamePlan(p, plan_from_json(j));
  ExpectSamePlan(p, plan_from_json(parse_json(j.dump(), "plan")));
  // The round-tripped plan is also a valid one for the model and cluster it names.
  EXPECT_NO_THROW(validate(plan_from_json(j), model_preset("mixtral-8x7b"), h100(64)));
}

TEST(PlanJson, RoundTripShardingAndPipelineFields) {
  Plan p;
  p.pp = 4;
  p.dp = 16;
  p.zero = 3;
  p.reshard = Reshard::kAfterStep;
  p.shard_degree = 8;
  p.grad_reduce_dtype = Dtype::kBf16;
  p.tp_comm_overlap = true;
  p.etp = 1;
  p.ep_comm_overlap = true;
  p.attention_kernel = AttentionKernel::kCudnn;
  p.cp_impl = CpImpl::kPytorch;
  p.cp_rotate = CpRotate::kAllGather;
  p.repeat_kv = true;
  p.moe_dispatcher = MoeDispatcher::kDeepEp;
  p.moe_force_balance = MoeForceBalance::kRoundRobin;
  p.optimizer_dtype = Dtype::kBf16;
  p.fused_kernels = false;
  p.stage_layers = {7, 9, 9, 7};
  p.fp8_param_gather = true;
  Json j = plan_to_json(p);
  EXPECT_EQ(j["reshard"], "after_step");
  EXPECT_EQ(j["fp8_param_gather"], true);
  EXPECT_EQ(j["cp_rotate"], "allgather");
  EXPECT_EQ(j["repeat_kv"], true);
  ExpectSamePlan(p, plan_from_json(parse_json(j.dump(), "plan")));
  Plan q;
  q.pp = 16;
  q.first_stage_layers = 7;
  q.last_stage_layers = 7;
  EXPECT_EQ(plan_from_json(plan_to_json(q)).recompute_modules, q.recompute_modules);
  Plan a;
  a.pp = 8;
  a.account_for_embedding = true;
  a.account_for_loss = true;
  j = plan_to_json(a);
  EXPECT_EQ(j["account_for_embedding_in_pipeline_split"], true);
  EXPECT_EQ(j["account_for_loss_in_pipeline_split"], true);
  ExpectSamePlan(a, plan_from_json(parse_json(j.dump(), "plan")));
  // Off: left out of the JSON.
  EXPECT_FALSE(plan_to_json(Plan{}).contains("account_for_loss_in_pipeline_split"));
  EXPECT_FALSE(plan_to_json(Plan{}).contains("cp_rotate"));
  EXPECT_FALSE(plan_to_json(Plan{}).contains("cp_comm_type"));
  EXPECT_FALSE(plan_to_json(Plan{}).contains("cp_a2a_size"));
  Plan h;
  h.cp = 8;
  h.cp_comm_type = CpCommType::kA2aP2p;
  h.cp_a2a_size = 2;
  j = plan_to_json(h);
  EXPECT_EQ(j["cp_comm_type"], "a2a+p2p");
  EXPECT_EQ(j["cp_a2a_size"], 2);
  ExpectSamePlan(h, plan_from_json(parse_json(j.dump(), "plan")));
  // Megatron's help text spells it allgather; Transformer Engine all_gather.
  EXPECT_EQ(plan_from_json(Json::parse(R"({"cp_comm_type": "allgather"})")).cp_comm_type,
            CpCommType::kAllGather);
  EXPECT_FALSE(plan_to_json(Plan{}).contains("repeat_kv"));
  EXPECT_FALSE(plan_to_json(Plan{}).contains("fp8_param_gather"));
  ExpectError([] { plan_from_json(Json::parse(R"({"fp8_param_gather": "yes"})")); },
              "plan.fp8_param_gather", "");
  ExpectError(
      [] { plan_from_json(Json::parse(R"({"account_for_loss_in_pipeline_split": "yes"})")); },
      "plan.account_for_loss_in_pipeline_split", "");
}

TEST(PlanJsonErrors, NewFields) {
  ExpectError([] { plan_from_json(Json::parse(R"({"reshard": "never"})")); }, "plan.reshard",
              "'never' is not one of after_forward|after_backward|after_step");
  ExpectError([] { plan_from_json(Json::parse(R"({"stage_layers": [4, "x"]})")); },
              "plan.stage_layers[1]", "must be an integer");
  ExpectError([] { plan_from_json(Json::parse(R"({"stage_layers": []})")); }, "plan.stage_layers",
              "must not be empty");
  ExpectError(
      [] { plan_from_json(Json::parse(R"({"stage_layers": [4, 4], "first_stage_layers": 3})")); },
      "plan.stage_layers", "not both");
  ExpectError([] { plan_from_json(Json::parse(R"({"shard_degree": -2})")); }, "plan.shard_degree",
              "out of range");
  ExpectError([] { plan_from_json(Json::parse(R"({"grad_reduce_dtype": "int8"})")); },
              "plan.grad_reduce_dtype", "int8");
  ExpectError([] { plan_from_json(Json::parse(R"({"attention_kernel": "fa4"})")); },
              "plan.attention_kernel", "'fa4' is not one of flash2|cudnn|triton|fa3");
  ExpectError([] { plan_from_json(Json::parse(R"({"moe_dispatcher": "flex"})")); },
              "plan.moe_dispatcher", "'flex' is not one of alltoall|deepep|allgather");
  ExpectError([] { plan_from_json(Json::parse(R"({"moe_force_balance": "uniform"})")); },
              "plan.moe_force_balance", "'uniform' is not one of none|random|round_robin");
  ExpectError([] { plan_from_json(Json::parse(R"({"fp8_recipe": "custom"})")); }, "plan.fp8_recipe",
              "'custom' is not one of delayed|tensorwise|mxfp8|blockwise");
  ExpectError([] { plan_from_json(Json::parse(R"({"cp_rotate": "alltoall"})")); }, "plan.cp_rotate",
              "'alltoall' is not one of ring|allgather");
  ExpectError([] { plan_from_json(Json::parse(R"({"repeat_kv": 2})")); }, "plan.repeat_kv", "");
  ExpectError([] { plan_from_json(Json::parse(R"({"tp_impl": "dtensor"})")); }, "plan.tp_impl",
              "'dtensor' is not one of megatron|torch");
  ExpectError([] { plan_from_json(Json::parse(R"({"cp_comm_type": "ring"})")); },
              "plan.cp_comm_type", "'ring' is not one of p2p|all_gather|a2a|a2a+p2p");
  ExpectError([] { plan_from_json(Json::parse(R"({"cp_a2a_size": -1})")); }, "plan.cp_a2a_size",
              "");
  for (const char* bad : {"2", "two.eight", "2.", ".8", "2.100", "0.9"})
    ExpectError(
        [&] {
          plan_from_json(
              Json::parse(std::string(R"({"transformer_engine_version": ")") + bad + "\"}"));
        },
        "plan.transformer_engine_version", "is not a Transformer Engine version");
  ExpectError([] { plan_from_json(Json::parse(R"({"transformer_engine_version": 2.8})")); },
              "plan.transformer_engine_version", "");
  ExpectError([] { plan_from_json(Json::parse(R"({"deterministic": "yes"})")); },
              "plan.deterministic", "");
}

TEST(PlanJson, Defaults) {
  Plan p = plan_from_json(Json::parse(R"({"dp": 4, "mbs": 2, "vpp": 2})"));
  EXPECT_EQ(p.global_batch, 8);                   // mbs x dp
  EXPECT_EQ(p.schedule, Schedule::kInterleaved);  // vpp > 1
  EXPECT_EQ(p.seq_len, 0);
  EXPECT_EQ(p.recompute_layers, -1);
  EXPECT_EQ(p.precision, Dtype::kBf16);
  EXPECT_EQ(plan_from_json(Json::object()).schedule, Schedule::k1F1B);
}

TEST(PlanJson, DefaultGlobalBatchOverflow) {
  // mbs x dp = 2^32 does not fit the int global batch: an error, not a wrapped-around 0.
  ExpectError([] { plan_from_json(Json::parse(R"({"mbs": 65536, "dp": 65536})")); }, "plan.gbs",
              "mbs x dp");
}

TEST(PlanJson, OffloadForms) {
  EXPECT_EQ(plan_from_json(Json::parse(R"({"offload": "none"})")).offload, Offload{});
  Offload o = plan_from_json(Json::parse(R"({"offload": ["optimizer", "params"]})")).offload;
  EXPECT_TRUE(o.optimizer);
  EXPECT_TRUE(o.params);
  EXPECT_FALSE(o.activations);
  EXPECT_EQ(offload_name(o), "optimizer,params");
  EXPECT_EQ(parse_offload("activations,optimizer", "f"),
            (Offload{.optimizer = true, .activations = true}));
}

TEST(PlanJson, RankOrder) {
  auto r = parse_rank_order("pp-dp-ep-cp-tp", "f");
  EXPECT_EQ(r, (std::array<Dim, 5>{Dim::kPp, Dim::kDp, Dim::kEp, Dim::kCp, Dim::kTp}));
  EXPECT_EQ(rank_order_name(r), "pp-dp-ep-cp-tp");
  EXPECT_EQ(rank_order_name(Plan{}.rank_order), "tp-cp-ep-dp-pp");
}

TEST(PlanJsonErrors, Schedule) {
  ExpectError([] { plan_from_json(Json::parse(R"({"schedule": "zero-bubble"})")); },
              "plan.schedule", "'zero-bubble' is not one of gpipe|1f1b|interleaved");
  ExpectError([] { plan_from_json(Json::parse(R"({"schedule": 1})")); }, "plan.schedule",
              "must be a string");
  ExpectError([] { parse_schedule("1F1B", "x.schedule"); }, "x.schedule", "is not one of");
}

TEST(PlanJsonErrors, Recompute) {
  ExpectError([] { plan_from_json(Json::parse(R"({"recompute": "partial"})")); }, "plan.recompute",
              "'partial' is not one of none|selective|full|selective_op");
  ExpectError([] { plan_from_json(Json::parse(R"({"recompute": true})")); }, "plan.recompute",
              "must be a string");
}

TEST(PlanJsonErrors, Offload) {
  ExpectError([] { plan_from_json(Json::parse(R"({"offload": "gpu"})")); }, "plan.offload",
              "'gpu' is not one of none|optimizer|params|activations");
  ExpectError([] { plan_from_json(Json::parse(R"({"offload": "optimizer,,params"})")); },
              "plan.offload", "has an empty item");
  ExpectError([] { plan_from_json(Json::parse(R"({"offload": "optimizer,"})")); }, "plan.offload",
              "has an empty item");
  ExpectError([] { plan_from_json(Json::parse(R"({"offload": ["params", 3]})")); },
              "plan.offload[1]", "must be a string");
  ExpectError([] { plan_from_json(Json::parse(R"({"offload": ["params", "disk"]})")); },
              "plan.offload", "'disk'");
  ExpectError([] { plan_from_json(Json::parse(R"({"offload": true})")); }, "plan.offload",
              "must be a string or an array of strings");
}

TEST(PlanJsonErrors, RankOrder) {
  ExpectError([] { plan_from_json(Json::parse(R"({"rank_order": "tp-cp-dp-pp"})")); },
              "plan.rank_order", "must order each of tp, cp, ep, dp, pp once");
  ExpectError([] { plan_from_json(Json::parse(R"({"rank_order": "tp-tp-cp-ep-dp"})")); },
              "plan.rank_order", "'tp' appears twice");
  ExpectError([] { plan_from_json(Json::parse(R"({"rank_order": "tp-cp-ep-dp-pp-sp"})")); },
              "plan.rank_order", "must order each");
  ExpectError([] { plan_from_json(Json::parse(R"({"rank_order": "TP-CP-EP-DP-PP"})")); },
              "plan.rank_order", "must order each");
  ExpectError([] { plan_from_json(Json::parse(R"({"rank_order": ""})")); }, "plan.rank_order",
              "must order each");
  ExpectError([] { plan_from_json(Json::parse(R"({"rank_order": "tp-cp-ep-dp-pp-"})")); },
              "plan.rank_order", "must order each");
  ExpectError([] { plan_from_json(Json::parse(R"({"rank_order": ["tp"]})")); }, "plan.rank_order",
              "must be a string");
}

TEST(PlanJsonErrors, FieldsAndRanges) {
  ExpectError([] { plan_from_json(Json::parse(R"({"tensor_parallel": 8})")); },
              "plan.tensor_parallel", "unknown field");
  ExpectError([] { plan_from_json(Json::parse(R"({"tp": 0})")); }, "plan.tp", "out of range");
  ExpectError([] { plan_from_json(Json::parse(R"({"tp": 2.5})")); }, "plan.tp", "integer");
  ExpectError([] { plan_from_json(Json::parse(R"({"tp": "8"})")); }, "plan.tp", "integer");
  ExpectError([] { plan_from_json(Json::parse(R"({"zero": 4})")); }, "plan.zero", "out of range");
  ExpectError([] { plan_from_json(Json::parse(R"({"vpp": 5000})")); }, "plan.vpp", "out of range");
  ExpectError([] { plan_from_json(Json::parse(R"({"recompute_layers": -2})")); },
              "plan.recompute_layers", "out of range");
  ExpectError([] { plan_from_json(Json::parse(R"({"precision": "int8"})")); }, "plan.precision",
              "'int8' is not one of");
  ExpectError([] { plan_from_json(Json::parse(R"({"sp": 1})")); }, "plan.sp", "true or false");
  ExpectError([] { plan_from_json(Json::parse(R"({"gpus": 0})")); }, "plan.gpus", "out of range");
  ExpectError([] { plan_from_json(Json::parse("[1]"), "p"); }, "p", "must be a JSON object");
  // Integral floats are integers.
  EXPECT_EQ(plan_from_json(Json::parse(R"({"tp": 8.0})")).tp, 8);
}

}  // namespace
}  // namespace parasol
