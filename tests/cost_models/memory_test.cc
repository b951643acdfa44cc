// Tests the memory cost model (cost_models/memory.h) against Korthikanti 2022 and ZeRO counts.
#include "cost_models/memory.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/cluster.h"
#include "core/model.h"
#include "core/plan.h"

namespace parasol::cost {
namespace {

constexpr double GiB = 1024.0 * 1024.0 * 1024.0;

// A GPT-3-style layer as in Korthikanti et al. 2022: layernorm, gelu, ffn = 4h, dropout,
// multi-head attention (no GQA).
Model gpt(int layers, int64_t h, int heads, int64_t vocab, int64_t seq, bool tied = true) {
  return gpt_model("gpt-test", layers, h, heads, vocab, seq, tied);
}

// A Llama-style model without biases, so parameter counts are plain matrix sizes.
Model llama(int layers, int64_t h, int heads, int kv_heads, int64_t ffn, int64_t vocab,
            int64_t seq) {
  return llama_model("llama-test", layers, h, heads, kv_heads, ffn, vocab, seq);
}

Plan fp16_plan(int tp, bool sp, int mbs) {
  Plan p;
  p.tp = tp;
  p.sequence_parallel = sp;
  p.micro_batch = mbs;
  p.global_batch = mbs;
  p.precision = Dtype::kFp16;
  p.flash_attention = false;
  return p;
}

// Korthikanti et al. 2022, section 4: s = 2048, b = 4, h = 6144, a = 64 (their 22B model).
class Korthikanti : public ::testing::Test {
 protected:
  const double s = 2048, b = 4, h = 6144, a = 64;
  Model m = gpt(48, 6144, 64, 51200, 2048);
};

TEST_F(Korthikanti, NoParallelism) {
  Plan p = fp16_plan(1, false, 4);
  EXPECT_DOUBLE_EQ(layer_activation_bytes(m, p, Recompute::kNone, false),
                   34 * s * b * h + 5 * a * s * s * b);
}

TEST_F(Korthikanti, TensorParallelWithoutSequenceParallel) {
  for (int t : {2, 4, 8}) {
    Plan p = fp16_plan(t, false, 4);
    EXPECT_DOUBLE_EQ(layer_activation_bytes(m, p, Recompute::kNone, false),
                     s * b * h * (10 + 24.0 / t) + 5 * a * s * s * b / t)
        << "t = " << t;
  }
}

TEST_F(Korthikanti, TensorAndSequenceParallel) {
  for (int t : {2, 4, 8}) {
    Plan p = fp16_plan(t, true, 4);
    EXPECT_DOUBLE_EQ(layer_activation_bytes(m, p, Recompute::kNone, false),
                     (34 * s * b * h + 5 * a * s * s * b) / t)
        << "t = " << t;
  }
}

TEST_F(Korthikanti, SelectiveRecomputeWithSequenceParallel) {
  for (int t : {1, 2, 8}) {
    Plan p = fp16_plan(t, t > 1, 4);
    EXPECT_DOUBLE_EQ(layer_activation_bytes(m, p, Recompute::kSelective, false), 34 * s * b * h / t)
        << "t = " << t;
  }
}

TEST_F(Korthikanti, FullRecomputeKeepsTheLayerInput) {
  EXPECT_DOUBLE_EQ(layer_activation_bytes(m, fp16_plan(1, false, 4), Recompute::kFull, false),
                   2 * s * b * h);
  EXPECT_DOUBLE_EQ(layer_activation_bytes(m, fp16_plan(8, false, 4), Recompute::kFull, false),
                   2 * s * b * h);
  EXPECT_DOUBLE_EQ(layer_activation_bytes(m, fp16_plan(8, true, 4), Recompute::kFull, false),
                   2 * s * b * h / 8);
}

TEST_F(Korthikanti, FlashAttentionDropsTheScoreMatrix) {
  Plan p = fp16_plan(8, true, 4);
  p.flash_attention = true;
  const double flash = layer_activation_bytes(m, p, Recompute::kNone, false);
  // Only the per-head fp32 log-sum-exp of the softmax remains of the a s^2 b terms.
  EXPECT_DOUBLE_EQ(flash, 34 * s * b * h / 8 + 4 * s * b * a / 8);
}

TEST_F(Korthikanti, ActivationsOfAStageFollowThe1F1BInFlightCount) {
  // 4 layers on 2 stages; 1F1B with 8 micro-batches: stage 1 holds 1, stage 0 holds 2 (+ the
  // embedding dropout mask, 1 byte per element, and the fp32 token ids, per in-flight
  // micro-batch). Stage 1 also holds its micro-batch's head tensors: the last layer's and the
  // final norm's fp16 outputs, and 16 bytes a token of labels and loss row maxima and sums.
  Model small = gpt(4, 1024, 16, 51200, 1024);
  Plan p = fp16_plan(1, false, 2);
  p.pp = 2;
  p.global_batch = 16;
  Cluster c = cluster_preset("dgx-a100-80g", 2);
  const double S = 1024, B = 2, H = 1024, A = 16;
  const double layer = 34 * S * B * H + 5 * A * S * S * B;
  EXPECT_DOUBLE_EQ(memory_per_rank(small, c, p, 1).activations,
                   2 * layer * 1 + 2 * 2 * S * B * H + 16 * S * B);
  EXPECT_DOUBLE_EQ(memory_per_rank(small, c, p, 0).activations,
                   (2 * layer + S * B * H + 4 * S * B) * 2);
}

// --- Parameters per stage --------------------------------------------------------------------

TEST(StageParams, GptSingleStageCountsEveryParameter) {
  // Megatron's count: 12 L h^2 + 13 L h + V h + s h + 2h (tied embeddings, learned positions).
  const double L = 4, h = 512, V = 1000, s = 256;
  Model m = gpt(4, 512, 8, 1000, 256);
  Plan p;
  StageParams sp = stage_params(m, p, 0);
  EXPECT_DOUBLE_EQ(sp.total(), 12 * L * h * h + 13 * L * h + V * h + s * h + 2 * h);
  EXPECT_DOUBLE_EQ(sp.expert, 0);
}

TEST(StageParams, EmbeddingOnFirstStageHeadOnLast) {
  // Llama-style, no biases, untied: per layer q, k, v, o + 3 MLP matrices + 2 RMSNorm vectors.
  const double h = 256, kv = 64, ffn = 768, V = 1000;
  Model m = llama(4, 256, 8, 2, 768, 1000, 128);
  const double attn = h * h + 2 * h * kv + h * h, mlp = 3 * h * ffn, norms = 2 * h;
  Plan p;
  p.tp = 2;
  p.pp = 2;
  StageParams first = stage_params(m, p, 0), last = stage_params(m, p, 1);
  const double layers = 2 * ((attn + mlp) / 2 + norms);
  EXPECT_DOUBLE_EQ(first.dense, layers + V * h / 2);
  EXPECT_DOUBLE_EQ(last.dense, layers + V * h / 2 + h);  // head (tp-split) + final norm
  // Single stage: both ends on stage 0.
  p.pp = 1;
  EXPECT_DOUBLE_EQ(stage_params(m, p, 0).dense, 2 * layers + 2 * V * h / 2 + h);
}

TEST(StageParams, TiedEmbeddingsAreCopiedToTheLastStageOnlyWithPipelining) {
  Model m = gpt(4, 512, 8, 1000, 256, /*tied=*/true);
  Plan p;
  const double table = 1000.0 * 512;
  const double one = stage_params(m, p, 0).total();
  p.pp = 2;
  const double both = stage_params(m, p, 0).total() + stage_params(m, p, 1).total();
  EXPECT_DOUBLE_EQ(both, one + table);
}

TEST(StageParams, ExpertsAreSplitOverExpertParallelism) {
  Model m = model_preset("tiny-moe");
  Plan p;
  p.dp = 4;
  const double e1 = stage_params(m, p, 0).expert;
  p.ep = 4;
  EXPECT_DOUBLE_EQ(stage_params(m, p, 0).expert, e1 / 4);
  EXPECT_GT(e1, 0);
}

// --- Weights, gradients, optimizer state --------------------------------------------------

// Megatron's --recompute-modules: each module drops exactly what it recomputes from a layer's
// kept activations (bf16, tp 2 with SP, 4k tokens): the dense MLP's FC1 outputs and FC2 input;
// the experts' activation output; the pre-MLP norm output of MoE layers; the shared experts'
// internals; the whole MoE block but its input; MLA's per-head Q, K, V.
// Under fp8 Transformer Engine keeps the fp8 copy of each linear's input for the weight
// gradient: one byte less per element of the QKV input, the attention output, the FC1 input
// (not in MoE layers: the router reads it in bf16), the FC2 input and the experts' dispatched
// tokens and FC2 input; everything else stays bf16.
TEST(Fp8Activations, LinearInputsAreKeptInFp8) {
  const double T = 4096, t = 2;
  Plan p;
  p.tp = 2;
  p.sequence_parallel = true;
  p.seq_len = 4096;
  p.precision = Dtype::kBf16;
  Plan f = p;
  f.precision = Dtype::kFp8;
  Model d = model_preset("llama3-8b");
  const double dense = T * d.hidden / t + T * d.q_dim() / t + T * d.hidden / t + T * d.ffn / t;
  EXPECT_DOUBLE_EQ(layer_activation_bytes(d, p, Recompute::kNone, false) -
                       layer_activation_bytes(d, f, Recompute::kNone, false),
                   dense);
  Model m = model_preset("mixtral-8x7b");
  const double routed = T * m.moe.top_k;  // etp = tp: all routed rows, experts split tp ways
  const double moe =
      T * m.hidden / t + T * m.q_dim() / t + routed * m.hidden + routed * m.moe.expert_ffn / t;
  EXPECT_DOUBLE_EQ(layer_activation_bytes(m, p, Recompute::kNone, true) -
                       layer_activation_bytes(m, f, Recompute::kNone, true),
                   moe);
  // Full recompute keeps only the layer input, in bf16.
  EXPECT_DOUBLE_EQ(layer_activation_bytes(d, p, Recompute::kFull, false),
                   layer_activation_bytes(d, f, Recompute::kFull, false));
}

TEST(RecomputeModules, EachModuleDropsWhatItRecomputes) {
  const double eb = 2, T = 4096, t = 2;
  auto with = [](Plan p, std::initializer_list<RecomputeModule> modules) {
    p.recompute = Recompute::kSelective;
    p.recompute_modules = 0;
    for (RecomputeModule r : modules) p.recompute_modules |= 1u << static_cast<int>(r);
    return p;
  };
  Plan base;
  base.tp = 2;
  base.sequence_parallel = true;
  base.micro_batch = 1;
  base.seq_len = 4096;
  base.precision = Dtype::kBf16;
  auto kept = [](const Model& m, const Plan& p, bool moe) {
    return layer_activation_bytes(m, p, Recompute::kSelective, moe);
  };
  // Dense (swiglu): FC1's two outputs and FC2's input, 3 x ffn / t per token.
  Model d = model_preset("llama3-8b");
  const Plan core = with(base, {RecomputeModule::kCoreAttn});
  EXPECT_DOUBLE_EQ(kept(d, core, false) - kept(d, with(base, {RecomputeModule::kMlp}), false),
                   3 * eb * T * d.ffn / t);
  // MoE: mixtral's experts (top-2, ffn 14336), ep 1 so the experts split tp ways (etp = tp).
  Model m = model_preset("mixtral-8x7b");
  const double routed = T * m.moe.top_k;  // etp == tp: every rank holds all routed rows
  EXPECT_DOUBLE_EQ(kept(m, core, true) - kept(m, with(base, {RecomputeModule::kMoeAct}), true),
                   eb * routed * m.moe.expert_ffn / t);
  EXPECT_DOUBLE_EQ(kept(m, core, true) - kept(m, with(base, {RecomputeModule::kLayernorm}), true),
                   eb * T * m.hidden / t);
  EXPECT_DOUBLE_EQ(kept(m, core, false), kept(m, with(base, {RecomputeModule::kLayernorm}), false));
  // The router's fp32 probabilities, the dispatched rows, the experts' outputs kept by the
  // combine on this rank's own rows (after the TP reduce-scatter: routed / t), FC1's outputs and
  // FC2's input.
  const double moe_block = 4.0 * T / t * m.moe.experts + eb * routed * m.hidden +
                           eb * routed / t * m.hidden + 3 * eb * routed * m.moe.expert_ffn / t;
  EXPECT_DOUBLE_EQ(kept(m, core, true) - kept(m, with(base, {RecomputeModule::kMoe}), true),
                   moe_block);
  // Shared experts (DeepSeek-V3: one of width 2048).
  Model v3 = model_preset("deepseek-v3");
  EXPECT_DOUBLE_EQ(
      kept(v3, core, true) - kept(v3, with(base, {RecomputeModule::kSharedExperts}), true),
      3 * eb * T * v3.moe.shared_width() / t);
  // MLA: per-head Q and K (qk head dim) and V (v head dim).
  EXPECT_DOUBLE_EQ(
      kept(v3, core, true) - kept(v3, with(base, {RecomputeModule::kMlaUpProj}), true),
      eb * T * (2.0 * v3.heads * v3.mla.qk_head_dim() + v3.heads * v3.mla.v_head_dim) / t);
}

// torchtitan's op-level selective AC on Llama 3 8B (torchtitan's llama3_8b.toml: local batch 1,
// seq 8192; here 2 x 8192 as its FSDP benchmark runs): what a block keeps, in bytes per token,
// counted from the cached outputs (parallelize_llama.py @9dec370: every mm but the 2nd, 4th and
// 6th, SDPA's output and fp32 log-sum-exp, reduce_scatter under SP) plus the checkpoint's input.
TEST(RecomputeMemory, SelectiveOpKeepsTheBlockInputAndTheSavedOpsOutputs) {
  const Model m = model_preset("llama3-8b");
  ASSERT_EQ(m.hidden, 4096);
  ASSERT_EQ(m.ffn, 14336);
  Plan p;
  p.micro_batch = 2;
  p.seq_len = 8192;
  p.precision = Dtype::kBf16;
  p.recompute = Recompute::kSelectiveOp;
  const double tokens = 2 * 8192;
  // input 4096 | wq 4096 | wv 8 x 128 = 1024 | SDPA out 4096 | w1 14336 | w2 4096, bf16;
  // the log-sum-exp: 32 heads x 4 bytes.
  const double per_token = 2.0 * (4096 + 4096 + 1024 + 4096 + 14336 + 4096) + 4.0 * 32;
  EXPECT_DOUBLE_EQ(layer_activation_bytes(m, p, Recompute::kSelectiveOp, false),
                   tokens * per_token);
  // Less than half of what the layer keeps without recompute (139 KB a token there, fused
  // kernels; 63.6 KB here).
  EXPECT_LT(layer_activation_bytes(m, p, Recompute::kSelectiveOp, false),
            0.5 * layer_activation_bytes(m, p, Recompute::kNone, false));
  // tp 2 with SP: the column- and row-parallel outputs halve, the input is a sequence shard,
  // w2's mm output keeps all rows (its reduce-scatter comes after), and the two reduce-scatter
  // outputs (sequence shards) are kept too.
  p.tp = 2;
  p.sequence_parallel = true;
  const double tp_token =
      2.0 * (4096 / 2.0 + (4096 + 1024 + 4096 + 14336) / 2.0 + 4096 + 2 * 4096 / 2.0) +
      4.0 * 32 / 2;
  EXPECT_DOUBLE_EQ(layer_activation_bytes(m, p, Recompute::kSelectiveOp, false), tokens * tp_token);
}

class StateBytes : public ::testing::Test {
 protected:
  Model m = llama(8, 1024, 16, 16, 4096, 32000, 1024);
  Cluster c = cluster_preset("dgx-h100", 8);
  Plan base() const {
    Plan p;
    p.dp = 8;
    p.global_batch = 8;
    p.precision = Dtype::kBf16;
    return p;
  }
  double params(const Plan& p) const { return stage_params(m, p, 0).total(); }
};

TEST_F(StateBytes, ZeroStage0Is18BytesPerParam) {
  Plan p = base();
  MemoryBreakdown mb = memory_per_rank(m, c, p, 0);
  const double n = params(p);
  EXPECT_DOUBLE_EQ(mb.weights, 2 * n);
  EXPECT_DOUBLE_EQ(mb.gradients, 4 * n);
  EXPECT_DOUBLE_EQ(mb.optimizer, 12 * n);
  EXPECT_DOUBLE_EQ((mb.weights + mb.gradients + mb.optimizer) / n, 18);
}

TEST_F(StateBytes, Fp32TrainingIs16BytesPerParam) {
  Plan p = base();
  p.precision = Dtype::kFp32;
  MemoryBreakdown mb = memory_per_rank(m, c, p, 0);
  // fp32 weights (4), gradients (4), Adam moments (8): no separate master copy.
  EXPECT_DOUBLE_EQ((mb.weights + mb.gradients + mb.optimizer) / params(p), 16);
}

TEST_F(StateBytes, DistributedOptimizerIs6Plus12OverDBytesPerParam) {
  for (int d : {2, 4, 8}) {
    Cluster cd = cluster_preset("dgx-h100", d);
    Plan p = base();
    p.dp = d;
    p.global_batch = d;
    p.zero = 1;
    MemoryBreakdown mb = memory_per_rank(m, cd, p, 0);
    EXPECT_DOUBLE_EQ((mb.weights + mb.gradients + mb.optimizer) / params(p), 6 + 12.0 / d)
        << "dp = " << d;
  }
}

TEST_F(StateBytes, ZeroStage2ShardsGradientsToo) {
  Plan p = base();
  p.zero = 2;
  MemoryBreakdown mb = memory_per_rank(m, c, p, 0);
  EXPECT_DOUBLE_EQ((mb.weights + mb.gradients + mb.optimizer) / params(p), 2 + 16.0 / 8);
}

TEST_F(StateBytes, ZeroStage3ShardsEverythingOverDp) {
  Plan p = base();
  const MemoryBreakdown z0 = memory_per_rank(m, c, p, 0);
  p.zero = 3;
  const MemoryBreakdown z3 = memory_per_rank(m, c, p, 0);
  EXPECT_DOUBLE_EQ(z3.weights, z0.weights / 8);
  EXPECT_DOUBLE_EQ(z3.gradients, z0.gradients / 8);
  EXPECT_DOUBLE_EQ(z3.optimizer, z0.optimizer / 8);
  EXPECT_LT(z3.total(), z0.total());
}

// DeepSpeed ZeRO-3's persistent parameters (stage3_param_persistence_threshold: every parameter
// of fewer elements, here each layer's two 1,024-wide RMSNorm weights) are gathered once and never
// released: each costs its full size on every rank beside its shard. FSDP's per-layer units and a
// zero threshold keep none.
TEST_F(StateBytes, DeepSpeedsPersistentParametersStayWholeOnEveryRank) {
  Plan p = base();
  p.zero = 3;
  const double sharded = 2 * params(p) / 8;
  EXPECT_DOUBLE_EQ(memory_per_rank(m, c, p, 0).weights, sharded);  // FSDP's units
  p.zero3_unit = GatherUnit::kModule;
  p.zero3_param_persistence_threshold = 0;
  EXPECT_DOUBLE_EQ(memory_per_rank(m, c, p, 0).weights, sharded);
  p.zero3_param_persistence_threshold = 100000;
  const double persistent = 8.0 * 2 * 1024 * 2;  // layers x norms x elements x bf16 bytes
  EXPECT_DOUBLE_EQ(memory_per_rank(m, c, p, 0).weights, sharded + persistent);
}

TEST_F(StateBytes, ContextParallelismJoinsTheShardingGroup) {
  Cluster c16 = cluster_preset("dgx-h100", 16);
  Plan p = base();
  p.cp = 2;
  p.zero = 1;
  MemoryBreakdown mb = memory_per_rank(m, c16, p, 0);
  EXPECT_DOUBLE_EQ(mb.optimizer, 12 * params(p) / 16);
}

TEST_F(StateBytes, OptimizerOffloadMovesItsBytesToHost) {
  Plan p = base();
  p.zero = 1;
  const MemoryBreakdown on = memory_per_rank(m, c, p, 0);
  p.offload.optimizer = true;
  const MemoryBreakdown off = memory_per_rank(m, c, p, 0);
  EXPECT_EQ(off.optimizer, 0);
  EXPECT_DOUBLE_EQ(off.host, on.optimizer);
  EXPECT_DOUBLE_EQ(off.weights, on.weights);
  EXPECT_DOUBLE_EQ(off.gradients, on.gradients);
  EXPECT_DOUBLE_EQ(on.total() - off.total(), on.optimizer);
  EXPECT_EQ(on.host, 0);
}

// ZeRO-Offload (DeepSpeed ZeRO-2 + offload_optimizer): the reduced gradients stream to pinned
// host memory as they are produced, so the host holds the fp32 gradient shard beside the fp32
// master, m and v (16 bytes a parameter over the shard), and the device none of it.
TEST_F(StateBytes, ZeroOffloadStreamsTheGradientShardToHost) {
  Plan p = base();
  p.zero = 2;
  p.global_batch = p.micro_batch * p.dp;  // one micro-batch a step
  p.offload.optimizer = true;
  const double shard = params(p) / p.dp;
  const MemoryBreakdown mb = memory_per_rank(m, c, p, 0);
  EXPECT_EQ(mb.gradients, 0);
  EXPECT_EQ(mb.optimizer, 0);
  EXPECT_NEAR(mb.host / (16 * shard), 1.0, 1e-9);
  // Megatron's optimizer CPU offload (the distributed optimizer, ZeRO 1) keeps its gradient
  // buffer on the device.
  p.zero = 1;
  EXPECT_GT(memory_per_rank(m, c, p, 0).gradients, 0);
  // With gradient accumulation the shard being accumulated stays on the device.
  p.zero = 2;
  p.global_batch = 2 * p.micro_batch * p.dp;
  EXPECT_DOUBLE_EQ(memory_per_rank(m, c, p, 0).gradients, 4 * shard);
}

// The DeepSpeed ZeRO-Offload tutorial (deepspeedai/DeepSpeed docs/_tutorials/zero-offload.md):
// GPT-2 with 50 layers, hidden 4096, 32 heads, seq 1024, micro-batch 10, fp16, activation
// checkpoints in host memory, trains on one 32 GB V100. Its fp16 weights alone are 2 bytes x
// 10.3B = 19.2 GiB; with the fp32 gradients on the device as well (4 bytes a parameter) it
// could not fit.
TEST(ZeroOffload, Gpt2TenBillionFitsOneV100) {
  const Model g = gpt_model("gpt2-10b", 50, 4096, 32, 50304, 1024, true);
  const Cluster v100 = cluster_preset("dgx2-v100", 1);
  Plan p;
  p.micro_batch = 10;
  p.global_batch = 10;
  p.zero = 2;
  p.precision = Dtype::kFp16;
  p.flash_attention = false;
  p.recompute = Recompute::kFull;
  p.offload.optimizer = true;
  p.offload.activations = true;
  const double n = static_cast<double>(param_counts(g).total);
  const MemoryBreakdown mb = memory_per_rank(g, v100, p);
  EXPECT_DOUBLE_EQ(mb.weights, 2 * n);
  EXPECT_EQ(mb.gradients, 0);
  EXPECT_GE(mb.host, 16 * n);  // and the offloaded activation checkpoints
  EXPECT_LE(mb.total(), 32 * GiB);
  EXPECT_GT(mb.total() + 4 * n, 32 * GiB);
}

TEST_F(StateBytes, ParamAndActivationOffloadKeepLessOnDevice) {
  Plan p = base();
  const MemoryBreakdown on = memory_per_rank(m, c, p, 0);
  p.offload.params = true;
  p.offload.activations = true;
  const MemoryBreakdown off = memory_per_rank(m, c, p, 0);
  EXPECT_LT(off.weights, on.weights);
  EXPECT_LE(off.activations, on.activations);
  EXPECT_DOUBLE_EQ(off.host + off.weights + off.activations, on.weights + on.activations);
}

// ZeRO-3 with parameter offload: the host keeps the rank's shard (2 bytes a parameter over 8
// ranks); what the reshard policy gathers stays on the device: two layers at a time when
// resharded after each forward (in the backward), the whole stage when kept for the step, and
// when kept for the backward the whole stage but the embedding, whose gathered table the
// lowering frees after its forward (its backward reads no weight).
TEST_F(StateBytes, Zero3ParamOffloadMovesTheShardAndKeepsWhatIsGathered) {
  Plan p = base();
  p.zero = 3;
  p.offload.params = true;
  const double n = params(p);
  for (Reshard r : {Reshard::kAfterForward, Reshard::kAfterBackward, Reshard::kAfterStep}) {
    p.reshard = r;
    const MemoryBreakdown mb = memory_per_rank(m, c, p, 0);
    EXPECT_DOUBLE_EQ(mb.host, 2 * n / 8) << reshard_name(r);
    if (r == Reshard::kAfterForward) {
      EXPECT_EQ(mb.weights, 0);
      EXPECT_GT(mb.transient, 0);
    } else if (r == Reshard::kAfterBackward) {
      EXPECT_DOUBLE_EQ(mb.weights, 2 * (n - stage_params(m, p, 0).embedding)) << reshard_name(r);
    } else {
      EXPECT_DOUBLE_EQ(mb.weights, 2 * n) << reshard_name(r);
    }
  }
}

TEST_F(StateBytes, TotalIsTheSumOfTheDeviceParts) {
  Plan p = base();
  p.zero = 1;
  p.offload.optimizer = true;
  MemoryBreakdown mb = memory_per_rank(m, c, p);
  EXPECT_DOUBLE_EQ(mb.total(), mb.weights + mb.gradients + mb.optimizer + mb.activations +
                                   mb.transient + mb.buffers);
  EXPECT_GT(mb.buffers, 0);
  EXPECT_LT(mb.buffers, 4 * GiB);
}

TEST_F(StateBytes, DefaultStageIsTheLargest) {
  Plan p = base();
  p.pp = 2;
  p.dp = 4;
  p.global_batch = 8;
  const double whole = memory_per_rank(m, c, p).total();
  EXPECT_DOUBLE_EQ(
      whole, std::max(memory_per_rank(m, c, p, 0).total(), memory_per_rank(m, c, p, 1).total()));
}

// --- In-flight micro-batches ------------------------------------------------------------------

TEST(InFlight, OneFOneBGPipeAndInterleaved) {
  Plan p;
  p.pp = 4;
  p.dp = 1;
  p.micro_batch = 1;
  p.global_batch = 16;  // 16 micro-batches
  p.schedule = Schedule::k1F1B;
  EXPECT_DOUBLE_EQ(in_flight_micro_batches(p, 0), 4);
  EXPECT_DOUBLE_EQ(in_flight_micro_batches(p, 1), 3);
  EXPECT_DOUBLE_EQ(in_flight_micro_batches(p, 3), 1);
  p.schedule = Schedule::kGpipe;
  for (int s = 0; s < 4; ++s) EXPECT_DOUBLE_EQ(in_flight_micro_batches(p, s), 16);
  p.schedule = Schedule::kInterleaved;
  for (int v : {2, 3, 4}) {
    p.vpp = v;
    // Korthikanti et al. 2022, section 4.2.3: the first stage of the interleaved schedule holds
    // p (1 + (p - 1) / (p m)) micro-batches' worth of activations (m: interleaving stages).
    EXPECT_DOUBLE_EQ(in_flight_micro_batches(p, 0), 4 * (1 + 3.0 / (4 * v))) << "vpp = " << v;
    EXPECT_GT(in_flight_micro_batches(p, 0), 4);
  }
}

TEST(InFlight, FewMicroBatchesCapTheCount) {
  Plan p;
  p.pp = 8;
  p.micro_batch = 1;
  p.global_batch = 3;
  p.schedule = Schedule::k1F1B;
  EXPECT_DOUBLE_EQ(in_flight_micro_batches(p, 0), 3);
  EXPECT_DOUBLE_EQ(in_flight_micro_batches(p, 7), 1);
  p.schedule = Schedule::kGpipe;
  EXPECT_DOUBLE_EQ(in_flight_micro_batches(p, 0), 3);
}

TEST(InFlight, NoPipeline) {
  Plan p;
  p.micro_batch = 2;
  p.global_batch = 16;
  EXPECT_DOUBLE_EQ(in_flight_micro_batches(p, 0), 1);
}

// --- Recompute and memory -----------------------------------------------------------------

TEST(RecomputeMemory, OrderedFullBelowSelectiveBelowNone) {
  Model m = gpt(8, 2048, 16, 51200, 2048);
  Cluster c = cluster_preset("dgx-a100-80g", 8);
  Plan p = fp16_plan(8, true, 1);
  p.global_batch = 1;
  const double none = memory_per_rank(m, c, p).activations;
  p.recompute = Recompute::kSelective;
  const double sel = memory_per_rank(m, c, p).activations;
  p.recompute = Recompute::kFull;
  const double full = memory_per_rank(m, c, p).activations;
  p.recompute_layers = 4;
  const double half = memory_per_rank(m, c, p).activations;
  EXPECT_LT(full, half);
  EXPECT_LT(half, none);
  EXPECT_LT(sel, none);
  EXPECT_LT(full, sel);
}

// One rank of each stage: each equals memory_per_rank of that stage, and the largest is the
// busiest rank's figure. With 1F1B stage 0 holds the most micro-batches in flight.
TEST(MemoryPerStage, OneRankOfEachStage) {
  const Model m = model_preset("llama3-8b");
  Plan p;
  p.tp = 2, p.pp = 4, p.dp = 2, p.micro_batch = 1, p.global_batch = 16;
  const Cluster c = cluster_preset("dgx-h100", p.gpus());
  const std::vector<MemoryBreakdown> stages = memory_per_stage(m, c, p);
  ASSERT_EQ(stages.size(), 4u);
  double largest = 0;
  for (int s = 0; s < 4; ++s) {
    EXPECT_DOUBLE_EQ(stages[s].total(), memory_per_rank(m, c, p, s).total()) << s;
    largest = std::max(largest, stages[s].total());
  }
  EXPECT_DOUBLE_EQ(largest, memory_per_rank(m, c, p).total());
  EXPECT_GT(stages[0].activations, stages[2].activations);
}

// LoRA (Plan::lora_rank): a frozen linear keeps its input only for its adapter
// (core/lower_lora.cc), each adapter keeps u = x A (r columns), and with adapter dropout the
// dropped copy and its mask instead of the input; against the bytes of a bf16 Llama layer written
// out.
TEST(LoraActivations, FrozenInputsGoAndAdaptersKeepTheirOwn) {
  const Model m = llama(4, 1024, 8, 2, 3584, 32000, 2048);
  Plan p;
  p.micro_batch = 1;
  p.global_batch = 1;
  const double T = 2048, h = 1024, ffn = 3584, eb = 2, r = 16;
  const double full = layer_activation_bytes(m, p, Recompute::kNone, false);
  Plan l = p;
  l.lora_rank = 16;
  l.lora_targets =
      (1u << static_cast<int>(LoraTarget::kQkv)) | (1u << static_cast<int>(LoraTarget::kProj));
  // FC1's input (the norm2 output) and FC2's (the SwiGLU output) go; two adapters keep u.
  EXPECT_DOUBLE_EQ(layer_activation_bytes(m, l, Recompute::kNone, false),
                   full - eb * T * h - eb * T * ffn + 2 * eb * T * r);
  // With dropout the QKV input goes too (the projection's stays for the attention's backward);
  // each adapter keeps a bf16 copy of its input and a byte mask.
  l.lora_dropout = 0.1;
  EXPECT_DOUBLE_EQ(layer_activation_bytes(m, l, Recompute::kNone, false),
                   full - 2 * eb * T * h - eb * T * ffn + 2 * eb * T * r + 2 * (eb + 1) * T * h);
  // Under selective recompute of the core attention the projection's input is kept for nothing
  // but its adapter: with dropout it goes as well.
  l.recompute = Recompute::kSelective;
  Plan ps = p;
  ps.recompute = Recompute::kSelective;
  EXPECT_DOUBLE_EQ(layer_activation_bytes(m, l, Recompute::kSelective, false),
                   layer_activation_bytes(m, ps, Recompute::kSelective, false) - 3 * eb * T * h -
                       eb * T * ffn + 2 * eb * T * r + 2 * (eb + 1) * T * h);
  // Megatron's fp8 copy of the SwiGLU input: its two FC1 outputs at a byte each.
  Plan a = p;
  a.activation_fp8_input_store = true;
  EXPECT_DOUBLE_EQ(layer_activation_bytes(m, a, Recompute::kNone, false), full - 2 * T * ffn);
  // The adapters' parameters: r (in + out) for each target.
  EXPECT_DOUBLE_EQ(lora_layer_params(m, Plan{}), 0);
  Plan all;
  all.lora_rank = 8;
  const double qkv = 1024 + 2 * 2 * 128;
  EXPECT_DOUBLE_EQ(lora_layer_params(m, all),
                   8 * ((h + qkv) + (h + h) + (h + 2 * ffn) + (ffn + h)));
}

}  // namespace
}  // namespace parasol::cost
