// Tests of liveness(): lifetimes on a hand-built Program, the saved activations of lowered
// Programs against cost::layer_activation_bytes category by category, the peak against the
// closed form cost::memory_per_rank where the closed form is exact, and the known differences
// where it is not (each asserted with its sign and size).
#include "core/liveness.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "core/lower.h"
#include "cost_models/memory.h"
#include "tests/core/test_models.h"

namespace parasol {
namespace {

using test_models::tiny_gpt;
using test_models::tiny_mla;
using test_models::tiny_shared;
using test_models::tiny_windowed;

constexpr int kParam = static_cast<int>(BufferClass::kParam);
constexpr int kAct = static_cast<int>(BufferClass::kActivation);

TEST(Liveness, BuffersLiveFromFirstWriteToLastRead) {
  Program p;
  Buffer w{0, "w", {100}, Dtype::kFp32, BufferClass::kParam, false, true};
  Buffer a{0, "a", {10}, Dtype::kBf16, BufferClass::kActivation};
  Buffer b{0, "b", {20}, Dtype::kBf16, BufferClass::kActivation};
  Buffer h{0, "h", {50}, Dtype::kFp32, BufferClass::kActivation, true};
  Buffer unused{0, "unused", {1000}, Dtype::kFp32, BufferClass::kWorkspace};
  int iw = p.add_buffer(w), ia = p.add_buffer(a), ib = p.add_buffer(b), ih = p.add_buffer(h);
  p.add_buffer(unused);
  Op o0, o1, o2;
  o0.writes = {ia};
  o1.reads = {ia, iw};
  o1.writes = {ib};
  o2.reads = {ib};
  o2.writes = {ih};
  o2.stream = 2;
  p.add_op(o0);
  p.add_op(o1);
  p.add_op(o2);
  Liveness lv = liveness(p);
  EXPECT_EQ(lv.persistent_bytes, 400);
  EXPECT_EQ(lv.live_after_op, (std::vector<double>{420, 440, 400}));
  EXPECT_EQ(lv.live_during_op, (std::vector<double>{420, 460, 440}));  // h is host memory
  EXPECT_EQ(lv.peak_bytes, 460);  // op 1 runs with a, b and w allocated
  EXPECT_EQ(lv.peak_op, 1);
  EXPECT_EQ(lv.peak_by_class[kParam], 400);
  EXPECT_EQ(lv.peak_by_class[kAct], 60);
  EXPECT_EQ(lv.host_bytes, 200);
}

TEST(Liveness, ABlockIsOneAllocationOfItsPaddedSizeOverAllItsMembersUses) {
  Program p;
  Buffer g1{0, "g1", {10}, Dtype::kFp32, BufferClass::kGrad};
  Buffer g2{0, "g2", {5}, Dtype::kFp32, BufferClass::kGrad};
  Buffer x{0, "x", {1}, Dtype::kFp32, BufferClass::kActivation};
  int i1 = p.add_buffer(g1), i2 = p.add_buffer(g2), ix = p.add_buffer(x);
  EXPECT_EQ(p.add_block({i1, i2}, 16), 0);  // 15 elements padded to 16 (e.g. 2 ways x 8)
  EXPECT_EQ(p.buffers[i2].block, 0);
  Op o0, o1, o2;
  o0.writes = {i1};  // the block is allocated here, though g2 is first written by o2
  o1.writes = {ix};
  o2.reads = {ix};
  o2.writes = {i2};
  p.add_op(o0);
  p.add_op(o1);
  p.add_op(o2);
  Liveness lv = liveness(p);
  EXPECT_EQ(lv.live_after_op, (std::vector<double>{64, 68, 0}));
  EXPECT_EQ(lv.live_during_op, (std::vector<double>{64, 68, 68}));
  EXPECT_EQ(lv.peak_bytes, 68);
}

Plan make_plan(int tp, int pp, int dp, int gbs, int mbs = 1) {
  Plan p;
  p.tp = tp;
  p.pp = pp;
  p.dp = dp;
  p.global_batch = gbs;
  p.micro_batch = mbs;
  return p;
}

// A GPT small enough to lower in milliseconds and large enough that one op's transient
// buffers are a small part of the peak.
Model small_gpt() {
  Model m = model_preset("tiny-gpt");
  m.name = "small-gpt";
  m.layers = 16;
  m.hidden = 256;
  m.heads = 8;
  m.kv_heads = 8;
  m.head_dim = 32;
  m.ffn = 1024;
  m.vocab = 2048;
  m.seq_len = 256;
  return m;
}

void check_valid(const Model& m, const Plan& p) {
  validate(p, m, cluster_preset("dgx-h100", p.gpus()));
}

// Device bytes, beyond the persistent ones, live on stage 0 of a GPipe pipeline once it has run
// every forward: the saved activations of all micro-batches.
double saved_after_forwards(const Model& m, const Plan& p) {
  check_valid(m, p);
  Program prog = lower_stage(m, p, 0);
  Liveness lv = liveness(prog);
  int last = -1;
  for (const Op& o : prog.ops) {
    if (o.tags.phase != Phase::kForward) break;
    last = o.id;
  }
  return lv.live_after_op.at(last) - lv.persistent_bytes;
}

// The closed form of the same: micro-batches x (layers' activations + the embedding's mask),
// plus the token ids the embedding backward reads (4 bytes each).
double closed_saved(const Model& m, const Plan& p) {
  const int per_stage = m.layers / p.pp;
  const int full = p.full_recompute_layers(per_stage);
  const Recompute rest = p.recompute == Recompute::kFull ? Recompute::kNone : p.recompute;
  double stage = 0;
  for (int i = 0; i < per_stage; ++i)
    stage +=
        cost::layer_activation_bytes(m, p, i < full ? Recompute::kFull : rest, m.is_moe_layer(i));
  const double tokens = static_cast<double>(p.micro_batch) * p.seq(m) / p.cp;
  const double sp = p.sequence_parallel ? p.tp : 1;
  if (m.dropout) stage += tokens * m.hidden / sp;
  stage += 4 * tokens;
  return p.micro_batches() * stage;
}

// The eager loss (torchtitan's F.cross_entropy of fp32-upcast logits) holds, while its
// backward's log-softmax gradient is computed, three logits-sized fp32 tensors (the saved
// log-softmax output, the NLL gradient, the log-softmax gradient; four under TP) where the fused
// kernel holds the fp32 softmax and the gradient in the activation dtype; its forward holds the
// fp32 copy beside the bf16 logits and the fp32 output. Everything else live at those ops is the
// same.
TEST(Liveness, EagerLossHoldsThreeFp32LogitsInTheBackward) {
  const Model m = tiny_gpt();
  Plan p;
  p.precision = Dtype::kBf16;
  p.micro_batch = 2;
  p.global_batch = 2;
  check_valid(m, p);
  Plan eager = p;
  eager.eager_loss = true;
  const Program fused_prog = lower_stage(m, p, 0), eager_prog = lower_stage(m, eager, 0);
  const Liveness fused = liveness(fused_prog), lv = liveness(eager_prog);
  auto during = [](const Program& prog, const Liveness& l, Phase phase) {
    for (const Op& o : prog.ops)
      if (o.kind == OpKind::kCrossEntropy && o.tags.phase == phase && o.name.size() >= 4 &&
          o.name.compare(o.name.size() - 4, 4, "xent") == 0)
        return l.live_during_op.at(o.id);
    return -1.0;
  };
  const double logits = static_cast<double>(p.micro_batch) * p.seq(m) * m.vocab;
  // Backward: 12 bytes a logit against 4 + 2.
  EXPECT_DOUBLE_EQ(
      during(eager_prog, lv, Phase::kBackward) - during(fused_prog, fused, Phase::kBackward),
      (12.0 - 6.0) * logits);
  // Forward: bf16 logits + fp32 copy + fp32 output (10 bytes) against logits + softmax (6).
  EXPECT_DOUBLE_EQ(
      during(eager_prog, lv, Phase::kForward) - during(fused_prog, fused, Phase::kForward),
      (10.0 - 6.0) * logits);
  // The closed form takes the backward's figure on the last stage.
  EXPECT_DOUBLE_EQ(cost::memory_per_rank(m, cluster_preset("dgx-h100", 1), eager, 0).transient -
                       cost::memory_per_rank(m, cluster_preset("dgx-h100", 1), p, 0).transient,
                   (12.0 - 6.0) * logits);

  // Under TP (PyTorch's loss_parallel): (NLL gradient + exp(log-softmax)) * grad_output holds a
  // fourth fp32 tensor of the rank's vocabulary shard, 16 bytes a logit.
  Plan tp = p;
  tp.tp = 2;
  check_valid(m, tp);
  Plan tp_eager = tp;
  tp_eager.eager_loss = true;
  const Program tp_fused_prog = lower_stage(m, tp, 0), tp_eager_prog = lower_stage(m, tp_eager, 0);
  const Liveness tp_fused = liveness(tp_fused_prog), tp_lv = liveness(tp_eager_prog);
  double peak_eager = 0, peak_fused = 0;  // the largest live bytes at any loss op
  for (const Op& o : tp_eager_prog.ops)
    if (o.kind == OpKind::kCrossEntropy && o.tags.phase == Phase::kBackward)
      peak_eager = std::max(peak_eager, tp_lv.live_during_op.at(o.id));
  for (const Op& o : tp_fused_prog.ops)
    if (o.kind == OpKind::kCrossEntropy && o.tags.phase == Phase::kBackward)
      peak_fused = std::max(peak_fused, tp_fused.live_during_op.at(o.id));
  EXPECT_DOUBLE_EQ(peak_eager - peak_fused, (16.0 - 6.0) * logits / 2);
  EXPECT_DOUBLE_EQ(cost::memory_per_rank(m, cluster_preset("dgx-h100", 2), tp_eager, 0).transient -
                       cost::memory_per_rank(m, cluster_preset("dgx-h100", 2), tp, 0).transient,
                   (16.0 - 6.0) * logits / 2);
}

// The vocab-tiled loss (plan.tiled_loss) keeps the logits in their dtype for its backward instead
// of Megatron's fp32 softmax: at its forward the logits alone (2 bytes a logit against 2 + 4), at
// its backward the logits and their gradient (2 + 2 against 4 + 2); the closed form's loss term
// takes the backward's figure.
TEST(Liveness, TiledLossHoldsNoFp32Logits) {
  const Model m = tiny_gpt();
  Plan p;
  p.precision = Dtype::kBf16;
  p.micro_batch = 2;
  p.global_batch = 2;
  check_valid(m, p);
  Plan tiled = p;
  tiled.tiled_loss = true;
  const Program fused_prog = lower_stage(m, p, 0), tiled_prog = lower_stage(m, tiled, 0);
  const Liveness fused = liveness(fused_prog), lv = liveness(tiled_prog);
  const double logits = static_cast<double>(p.micro_batch) * p.seq(m) * m.vocab;
  for (const Buffer& b : tiled_prog.buffers)  // no logits-sized fp32 activation or workspace
    if (b.cls == BufferClass::kActivation || b.cls == BufferClass::kWorkspace)
      EXPECT_FALSE(b.dtype == Dtype::kFp32 && b.elements() >= logits) << b.name;
  bool fused_has_one = false;  // (the fused loss's softmax is one)
  for (const Buffer& b : fused_prog.buffers)
    fused_has_one |=
        b.cls == BufferClass::kActivation && b.dtype == Dtype::kFp32 && b.elements() >= logits;
  EXPECT_TRUE(fused_has_one);
  auto during = [](const Program& prog, const Liveness& l, Phase phase) {
    for (const Op& o : prog.ops)
      if (o.kind == OpKind::kCrossEntropy && o.tags.phase == phase && o.name.size() >= 4 &&
          o.name.compare(o.name.size() - 4, 4, "xent") == 0)
        return l.live_during_op.at(o.id);
    return -1.0;
  };
  EXPECT_DOUBLE_EQ(
      during(tiled_prog, lv, Phase::kBackward) - during(fused_prog, fused, Phase::kBackward),
      (4.0 - 6.0) * logits);
  EXPECT_DOUBLE_EQ(
      during(tiled_prog, lv, Phase::kForward) - during(fused_prog, fused, Phase::kForward),
      (2.0 - 6.0) * logits);
  EXPECT_DOUBLE_EQ(cost::memory_per_rank(m, cluster_preset("dgx-h100", 1), tiled, 0).transient -
                       cost::memory_per_rank(m, cluster_preset("dgx-h100", 1), p, 0).transient,
                   (4.0 - 6.0) * logits);
  EXPECT_LT(lv.peak_bytes, fused.peak_bytes);
}

TEST(Liveness, SavedActivationsMatchTheClosedFormCategoryByCategory) {
  struct Case {
    const char* what;
    Model m;
    Plan p;
  };
  std::vector<Case> cases;
  auto gpipe = [](Plan p) {
    p.schedule = Schedule::kGpipe;
    return p;
  };
  cases.push_back({"gpt: dropout, flash, gelu, tp", tiny_gpt(4), gpipe(make_plan(2, 2, 1, 4))});
  {
    Plan p = gpipe(make_plan(2, 2, 1, 4, 2));
    p.flash_attention = false;
    cases.push_back({"gpt: materialised attention with dropout", tiny_gpt(4), p});
    p.recompute = Recompute::kSelective;
    cases.push_back({"gpt: selective recompute", tiny_gpt(4), p});
  }
  {
    Plan p = gpipe(make_plan(2, 2, 1, 4));
    p.sequence_parallel = true;
    cases.push_back({"llama: swiglu, GQA, rmsnorm, sp", model_preset("tiny"), p});
    p.cp = 2;
    cases.push_back({"llama: sp and cp", model_preset("tiny"), p});
    // torchtitan's op-level selective AC: the block's input and the saved ops' outputs.
    p.cp = 1;
    p.recompute = Recompute::kSelectiveOp;
    cases.push_back({"llama: torchtitan's op-level AC with sp", model_preset("tiny"), p});
    Plan q = gpipe(make_plan(1, 2, 1, 4, 2));
    q.recompute = Recompute::kSelectiveOp;
    cases.push_back({"llama: torchtitan's op-level AC", model_preset("tiny"), q});
    q.precision = Dtype::kFp8;
    cases.push_back({"llama: op-level AC in fp8 (the outputs stay bf16)", model_preset("tiny"), q});
  }
  {
    Plan p = gpipe(make_plan(1, 2, 1, 4));
    p.recompute = Recompute::kFull;
    cases.push_back({"gpt: full recompute", tiny_gpt(4), p});
    p.recompute_layers = 1;
    cases.push_back({"gpt: full recompute of 1 layer", tiny_gpt(4), p});
  }
  {
    Plan p = gpipe(make_plan(2, 2, 1, 4));
    p.precision = Dtype::kFp32;
    cases.push_back({"gpt: fp32", tiny_gpt(4), p});
    // fp8: the linears' saved inputs in fp8 (Transformer Engine), the rest bf16.
    p.precision = Dtype::kFp8;
    cases.push_back({"gpt: fp8", tiny_gpt(4), p});
    p.sequence_parallel = true;
    cases.push_back({"llama: fp8 with sp", model_preset("tiny"), p});
    Plan q = gpipe(make_plan(1, 2, 1, 4));
    q.precision = Dtype::kFp8;
    cases.push_back({"moe: fp8 (the router's input stays bf16)", model_preset("tiny-moe"), q});
  }
  for (const Case& c : cases) {
    const double got = saved_after_forwards(c.m, c.p);
    const double want = closed_saved(c.m, c.p);
    EXPECT_NEAR(got, want, 1e-9 * want) << c.what;
  }
}

TEST(Liveness, MoELayersAlsoKeepTheExpertOutputsForTheRouterGradient) {
  // The combine's backward reads the expert outputs to get the router probabilities' gradient:
  // eb x tokens x top_k x hidden per MoE layer and micro-batch, which the closed form counts
  // (cost_models/memory.cc) as the Program keeps them.
  const Model m = model_preset("tiny-moe");
  Plan p = make_plan(1, 2, 1, 4);
  p.schedule = Schedule::kGpipe;
  const double got = saved_after_forwards(m, p);
  const double want = closed_saved(m, p);
  EXPECT_NEAR(got, want, 1e-9 * want);
  // Without them the two would differ by exactly that tensor.
  const double eret = 2.0 * m.seq_len * m.moe.top_k * m.hidden;
  EXPECT_GT(eret * 4, 1e-3 * want);
}

// Multi-head latent attention (the pre-norm latents, Q | K | V with their own value heads) and
// sliding windows (which change what the kernel computes, not what it keeps) match the closed
// form category by category; MLA in both query forms, with and without SP, flash and
// materialised, and under selective and full recompute.
TEST(Liveness, LatentAttentionAndWindowsSaveWhatTheClosedFormCounts) {
  auto gpipe = [](Plan p) {
    p.schedule = Schedule::kGpipe;
    return p;
  };
  for (const Model& m : {tiny_mla(true), tiny_mla(false), tiny_windowed()}) {
    for (int variant = 0; variant < 5; ++variant) {
      Plan p = gpipe(make_plan(2, 2, 1, 4));
      p.sequence_parallel = variant == 1;
      p.flash_attention = variant != 2 && variant != 3;
      p.recompute = variant == 3   ? Recompute::kSelective
                    : variant == 4 ? Recompute::kFull
                                   : Recompute::kNone;
      const double got = saved_after_forwards(m, p);
      const double want = closed_saved(m, p);
      EXPECT_NEAR(got, want, 1e-9 * want) << m.name << " variant " << variant;
    }
  }
}

TEST(Liveness, SharedExpertsKeepTheirMlpIntermediatesLikeADenseMlp) {
  // Dense first layer, then MoE with shared experts: the shared MLP's FC1 outputs and
  // activation are the closed form's.
  Model m = model_preset("tiny-moe");
  m.layers = 4;
  m.moe.first_dense = 1;
  m.moe.shared_experts = 2;
  m.moe.shared_expert_ffn = 32;
  Plan p = make_plan(2, 2, 1, 4);
  p.schedule = Schedule::kGpipe;
  const double got = saved_after_forwards(m, p);
  const double want = closed_saved(m, p);
  EXPECT_NEAR(got, want, 1e-9 * want);
}

TEST(Liveness, AnExpertGridRoutesATpShareOfTheTokens) {
  // With an expert grid of its own (etp 1 != tp 2) each TP rank routes 1/tp of the TP group's
  // tokens (and keeps 1/tp of the routed rows' expert outputs), as the closed form counts them.
  const Model m = model_preset("tiny-moe");
  for (bool sp : {true, false}) {
    Plan p = make_plan(2, 2, 2, 8);
    p.schedule = Schedule::kGpipe;
    p.ep = 2;
    p.etp = 1;
    p.sequence_parallel = sp;
    const double got = saved_after_forwards(m, p);
    const double want = closed_saved(m, p);
    EXPECT_NEAR(got, want, 1e-9 * want) << sp;
  }
}

// The closed form without the runtime reserve: what the Program's buffers account for.
double closed_total(const Model& m, const Plan& p, int stage) {
  cost::MemoryBreakdown mb =
      cost::memory_per_rank(m, cluster_preset("dgx-h100", p.gpus()), p, stage);
  return mb.weights + mb.gradients + mb.optimizer + mb.activations + mb.transient;
}

TEST(Liveness, PeakMatchesTheClosedFormWithinTwoPercentOn1F1B) {
  const Model m = small_gpt();
  for (bool sp : {false, true}) {
    Plan p = make_plan(2, 2, 1, 16, 2);  // 1F1B, 8 micro-batches
    p.sequence_parallel = sp;
    check_valid(m, p);
    for (int s = 0; s < 2; ++s) {
      Liveness lv = liveness(lower_stage(m, p, s));
      const double closed = closed_total(m, p, s);
      EXPECT_NEAR(lv.peak_bytes / closed, 1.0, 0.02) << "stage " << s << " sp " << sp;
      // The persistent part is the closed form's weights, gradients and optimizer state.
      cost::MemoryBreakdown mb = cost::memory_per_rank(m, cluster_preset("dgx-h100", 4), p, s);
      EXPECT_NEAR(lv.persistent_bytes / (mb.weights + mb.gradients + mb.optimizer), 1.0, 0.01);
    }
  }
  // ZeRO-1 over dp = 2: sharded optimizer state.
  Plan p = make_plan(2, 2, 2, 32, 2);
  p.zero = 1;
  check_valid(m, p);
  for (int s = 0; s < 2; ++s) {
    Liveness lv = liveness(lower_stage(m, p, s));
    EXPECT_NEAR(lv.peak_bytes / closed_total(m, p, s), 1.0, 0.02) << "zero-1 stage " << s;
  }
}

TEST(Liveness, FullRecomputeTransientsDoNotCoincideWithTheLogits) {
  // The Program recomputes a layer only after the loss's backward has freed the logits: the last
  // stage peaks at the loss without the recomputed layer, and the closed form takes its working
  // set at that op (cost_models/memory.cc), to the byte.
  const Model m = small_gpt();
  Plan p = make_plan(2, 2, 2, 32, 2);
  p.zero = 1;
  p.recompute = Recompute::kFull;
  check_valid(m, p);
  Program prog = lower_stage(m, p, 1);
  Liveness lv = liveness(prog);
  EXPECT_EQ(prog.ops[lv.peak_op].kind, OpKind::kCrossEntropy);
  EXPECT_NEAR(lv.peak_bytes / closed_total(m, p, 1), 1.0, 1e-9);
  // Stage 0 has no logits: there the recomputed layer is the transient, as in the closed form.
  EXPECT_NEAR(liveness(lower_stage(m, p, 0)).peak_bytes / closed_total(m, p, 0), 1.0, 1e-9);
}

TEST(Liveness, GPipeLastStageKeepsEveryMicroBatchsFp32Softmax) {
  // The vocab-parallel cross-entropy saves its fp32 softmax for the backward, and under GPipe the
  // last stage holds it and the head's saved tensors for every micro-batch until the backwards
  // begin; 1F1B runs each micro-batch's head backward right after its forward.
  const Model m = small_gpt();
  Plan p = make_plan(2, 2, 1, 16, 2);
  p.schedule = Schedule::kGpipe;
  check_valid(m, p);
  Liveness lv = liveness(lower_stage(m, p, 1));
  const int M = p.micro_batches();
  const double T = 2.0 * m.seq_len;
  const double softmax = 4 * T * m.vocab / 2;
  // The final norm's input and output (bf16), the labels, the loss's row maxima and sums (fp32).
  const double head = 2 * (2 * T * m.hidden) + 16 * T;
  Plan one = p;
  one.schedule = Schedule::k1F1B;
  Liveness lv1 = liveness(lower_stage(m, one, 1));
  // What GPipe holds beyond 1F1B on the last stage, from the two Programs: the other M - 1
  // micro-batches' layer activations (8 layers here, no recompute), head tensors and softmax.
  const double layers = 8 * cost::layer_activation_bytes(m, p, Recompute::kNone, false);
  EXPECT_NEAR((lv.peak_bytes - lv1.peak_bytes) / ((M - 1) * (layers + head + softmax)), 1.0, 0.01);
  // The closed form counts them: it equals the Program's peak on both schedules.
  EXPECT_NEAR(closed_total(m, p, 1) / lv.peak_bytes, 1.0, 0.002)
      << "closed " << closed_total(m, p, 1) << " B, liveness " << lv.peak_bytes << " B";
  EXPECT_NEAR(closed_total(m, one, 1) / lv1.peak_bytes, 1.0, 0.02);
}

TEST(Liveness, ZeroOffloadKeepsNoGradientShardOnTheDevice) {
  // DeepSpeed ZeRO-Offload (ZeRO-2, optimizer in host memory, one micro-batch a step): each
  // layer's gradients are reduce-scattered into a transient shard and copied to the pinned host
  // gradient as soon as its backward ends, so no gradient is persistent on the device; the host
  // holds the fp32 gradient shard and the fp32 master, m and v (16 bytes a parameter of the
  // shard). One rank reduces nothing and copies the gradients themselves.
  const Model m = small_gpt();
  for (int dp : {1, 4}) {
    Plan p = make_plan(1, 1, dp, dp, 1);
    p.zero = 2;
    p.offload.optimizer = true;
    check_valid(m, p);
    Program prog = lower_stage(m, p, 0);
    double device_grads = 0, host_state = 0;
    for (const Buffer& b : prog.buffers) {
      if (b.persistent && !b.host && b.cls == BufferClass::kGrad) device_grads += b.bytes();
      if (b.persistent && b.host) host_state += b.bytes();
    }
    EXPECT_EQ(device_grads, 0) << "dp " << dp;
    double shard = 0;
    for (const ParamBucket& b : prog.buckets) shard += static_cast<double>(b.shard);
    EXPECT_NEAR(host_state / (16 * shard), 1.0, 1e-9) << "dp " << dp;
    int offloads = 0, scatters = 0, gathers = 0;
    for (const Op& o : prog.ops) {
      offloads += o.kind == OpKind::kOffload && o.name.find("g.offload") != std::string::npos;
      scatters += o.kind == OpKind::kReduceScatter;
      gathers += o.kind == OpKind::kAllGather;
    }
    EXPECT_EQ(offloads, static_cast<int>(prog.buckets.size())) << "dp " << dp;
    EXPECT_EQ(scatters, dp > 1 ? offloads : 0) << "dp " << dp;
    EXPECT_EQ(gathers, dp > 1 ? offloads : 0) << "dp " << dp;  // the updated weights
    Liveness lv = liveness(prog);
    EXPECT_NEAR(lv.peak_bytes / closed_total(m, p, 0), 1.0, 0.05) << "dp " << dp;
  }
}

TEST(Liveness, Zero3GathersAreTransientParameters) {
  // ZeRO-3 keeps 1/(dp x cp) of the weights; the gathered copies of at most two layers (the one
  // in use and the one prefetched) are live at a time, which the closed form counts as its
  // transient.
  const Model m = small_gpt();
  Plan p = make_plan(1, 1, 4, 8, 2);
  p.zero = 3;
  check_valid(m, p);
  Program prog = lower_stage(m, p, 0);
  Liveness lv = liveness(prog);
  cost::MemoryBreakdown mb = cost::memory_per_rank(m, cluster_preset("dgx-h100", 4), p, 0);
  double persistent_params = 0;
  for (const Buffer& b : prog.buffers)
    if (b.persistent && b.cls == BufferClass::kParam) persistent_params += b.bytes();
  EXPECT_NEAR(persistent_params / mb.weights, 1.0, 0.01);
  const double gathered = lv.peak_by_class[kParam] - persistent_params;
  const double layer = 2.0 * param_counts(m).dense_layer;
  EXPECT_GT(gathered, 0);
  EXPECT_LE(gathered, 2 * layer + 2.0 * m.vocab * m.hidden);  // + the embedding at the edges
  EXPECT_NEAR(lv.peak_bytes / closed_total(m, p, 0), 1.0, 0.05);
}

// Pure bf16 optimizer state (Plan::optimizer_dtype, NeMo AutoModel's MoE runs): the bf16
// weights are their own master, the moments and gradients bf16: 2 + 2 + 4 bytes a parameter
// against 2 + 4 + 12 with fp32 state, as the closed form counts (cost_models/memory.cc).
TEST(Liveness, PureBf16OptimizerStateHalvesGradientsAndDropsTheMaster) {
  Model m = model_preset("tiny");
  m.layers = 4;
  Plan p = make_plan(1, 1, 2, 4);
  p.zero = 3;
  const double h = m.hidden, q = m.q_dim(), kv = m.kv_dim();
  auto padded = [](double e) { return 2 * std::ceil(e / 2); };
  const double layer = padded(2 * h + h * (q + 2 * kv) + q * h + 3 * h * m.ffn);
  const double all = m.layers * layer + padded(m.vocab * h) + padded(h + h * m.vocab);
  check_valid(m, p);
  const Program fp32_state = lower_stage(m, p, 0);
  EXPECT_EQ(liveness(fp32_state).persistent_bytes, (2 + 4 + 12) * all / 2);
  EXPECT_TRUE(std::any_of(fp32_state.ops.begin(), fp32_state.ops.end(),
                          [](const Op& o) { return o.kind == OpKind::kCast; }));
  p.optimizer_dtype = Dtype::kBf16;
  check_valid(m, p);
  const Program prog = lower_stage(m, p, 0);
  EXPECT_EQ(liveness(prog).persistent_bytes, (2 + 2 + 4) * all / 2);
  // The optimizer updates the weights in place (no cast from a master copy).
  for (const Op& o : prog.ops) EXPECT_NE(o.kind, OpKind::kCast) << o.name;
}

TEST(Liveness, Zero3ReshardModesHoldTheGatheredWeightsAndGradientsLonger) {
  // ZeRO-3 over dp 2, one stage, two micro-batches (1F1B: F0 B0 F1 B1). Bucket sizes from the
  // model's dimensions (tiny: rmsnorm, swiglu, no biases, untied), padded to 2 x shard.
  Model m = model_preset("tiny");
  m.layers = 4;
  Plan p = make_plan(1, 1, 2, 4);
  p.zero = 3;
  const double h = m.hidden, q = m.q_dim(), kv = m.kv_dim();
  auto padded = [](double e) { return 2 * std::ceil(e / 2); };
  const double layer = padded(2 * h + h * (q + 2 * kv) + q * h + 3 * h * m.ffn);
  const double emb = padded(m.vocab * h), head = padded(h + h * m.vocab);
  const double all = m.layers * layer + emb + head;
  const Reshard modes[3] = {Reshard::kAfterForward, Reshard::kAfterBackward, Reshard::kAfterStep};
  Liveness lv[3];
  double at[3];
  for (int i = 0; i < 3; ++i) {
    p.reshard = modes[i];
    check_valid(m, p);
    const Program prog = lower_stage(m, p, 0);
    lv[i] = liveness(prog);
    int op = -1;  // the first op of the last micro-batch's backward: its loss gradient
    for (const Op& o : prog.ops)
      if (op < 0 && o.tags.phase == Phase::kBackward && o.tags.micro_batch == 1) op = o.id;
    ASSERT_GE(op, 0);
    ASSERT_EQ(prog.ops[op].name, "xent");
    at[i] = lv[i].live_after_op[op];
    // Persistent: bf16 weight shards, fp32 gradient shards, fp32 master, m and v shards.
    EXPECT_EQ(lv[i].persistent_bytes, (2 + 4 + 12) * all / 2);
  }
  // There, resharded after the forward no gathered weights are live; after the backward, those
  // every layer and the head gathered for micro-batch 1 (the embedding's backward reads no
  // weights, so its gathered table went after its forward); after the step the same weights and
  // the whole stage's unsharded fp32 gradients, accumulating since B0.
  EXPECT_EQ(at[1] - at[0], 2 * (m.layers * layer + head));
  EXPECT_EQ(at[2] - at[1], 4 * all);
  EXPECT_GT(lv[2].peak_bytes, lv[1].peak_bytes);
  EXPECT_GE(lv[1].peak_bytes, lv[0].peak_bytes);
  // After the step the peak holds every gradient twice: the persistent shards and the
  // accumulators; the other modes hold per-micro-batch gradients of at most a few buckets.
  constexpr int kGrad = static_cast<int>(BufferClass::kGrad);
  EXPECT_EQ(lv[2].peak_by_class[kGrad], 4 * all / 2 + 4 * all);
  for (int i : {0, 1}) EXPECT_LT(lv[i].peak_by_class[kGrad], 4 * all / 2 + 4 * (layer + head));
  EXPECT_GE(lv[2].peak_by_class[kParam], 2 * all / 2 + 2 * (m.layers * layer + head));
}

TEST(Liveness, OffloadMovesStateToHostMemory) {
  const Model m = small_gpt();
  Plan p = make_plan(1, 1, 1, 4, 2);
  check_valid(m, p);
  Liveness base = liveness(lower_stage(m, p, 0));
  EXPECT_EQ(base.host_bytes, 0);
  p.offload = {true, true, true};
  Liveness off = liveness(lower_stage(m, p, 0));
  cost::MemoryBreakdown mb = cost::memory_per_rank(m, cluster_preset("dgx-h100", 1), p, 0);
  EXPECT_LT(off.peak_bytes, 0.5 * base.peak_bytes);
  // Host memory holds the optimizer state, the weights and the offloaded activations.
  EXPECT_GT(off.host_bytes, 0.9 * mb.host);
}

}  // namespace
}  // namespace parasol
