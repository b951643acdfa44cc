// The closed-form estimate (cost_models/estimate.h) against the lowered Programs
// (core/lower.h) on a grid of plans: where the closed form is exact, its terms equal the sums
// over the Programs' ops of every rank. Forward FLOPs (the model FLOPs are three forwards, with
// causal attention counted in full),
// recomputed FLOPs (hardware minus model FLOPs) and the optimizer step's memory traffic (with a
// profile without kernel overheads, so that time x bandwidth is bytes).
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "core/lower.h"
#include "core/optimizer_traffic.h"
#include "cost_models/compute.h"
#include "cost_models/estimate.h"
#include "cost_models/memory.h"

namespace parasol::cost {
namespace {

struct Sums {
  double forward_flops = 0, recompute_flops = 0, optimizer_bytes = 0;
};

// Sums over every rank: each rank of stage s runs programs[s].
Sums program_sums(const LoweredPlan& l) {
  Sums s;
  const int ranks_per_stage = l.layout.world() / l.plan.pp;
  for (const Program& prog : l.programs) {
    for (const Op& op : prog.ops) {
      const double f = op.flops * ranks_per_stage;
      if (op.tags.phase == Phase::kForward) s.forward_flops += f;
      if (op.tags.phase == Phase::kRecompute) s.recompute_flops += f;
      if (op.kind == OpKind::kAdamW || op.kind == OpKind::kGradNorm ||
          (op.kind == OpKind::kCast && op.tags.phase == Phase::kOptimizer))
        s.optimizer_bytes += op.bytes * ranks_per_stage;
    }
  }
  return s;
}

struct GridCase {
  std::string label;
  Plan plan;
};

std::vector<GridCase> grid() {
  std::vector<GridCase> out;
  for (int tp : {1, 2, 4})
    for (int pp : {1, 2})
      for (Recompute rc : {Recompute::kNone, Recompute::kSelective, Recompute::kFull})
        for (int zero : {0, 1, 3})
          for (Dtype state : {Dtype::kFp32, Dtype::kBf16}) {
            if (zero == 3 && pp > 1) continue;
            Plan p;
            p.tp = tp;
            p.pp = pp;
            p.dp = 2;
            p.micro_batch = 1;
            p.global_batch = 8;
            p.sequence_parallel = tp > 1;
            p.recompute = rc;
            p.zero = zero;
            p.optimizer_dtype = state;
            out.push_back({"tp" + std::to_string(tp) + " pp" + std::to_string(pp) + " " +
                               recompute_name(rc) + " zero" + std::to_string(zero) + " " +
                               dtype_name(state),
                           p});
          }
  return out;
}

TEST(EstimateAgainstProgram, FlopsAndOptimizerTrafficEqualTheLoweredOps) {
  const Model m = model_preset("llama3-8b");
  int checked = 0;
  for (const GridCase& g : grid()) {
    SCOPED_TRACE(g.label);
    const Cluster c = cluster_preset("dgx-a100-80g", g.plan.gpus());
    validate(g.plan, m, c);
    Profile prof = default_profile(c.gpu_device(0));
    prof.kernel_overhead_s = 0;
    const Estimate e = estimate(m, c, g.plan, prof);
    const LoweredPlan l = lower(m, c, g.plan);
    const Sums s = program_sums(l);
    // Model FLOPs count causal attention in full (Megatron's convention, the MFU numerator):
    // QK^T and PV, 2 (heads x head_dim) FLOPs each per query-key pair, s^2 pairs per sequence
    // and layer. The Programs execute the s (s + 1) / 2 unmasked pairs.
    const double s_len = static_cast<double>(m.seq_len);
    const double masked_pairs = s_len * s_len - s_len * (s_len + 1) / 2;
    const double masked = 4.0 * masked_pairs * m.heads * m.head_dim * m.layers *
                          static_cast<double>(g.plan.global_batch);
    EXPECT_NEAR(s.forward_flops, e.model_flops_per_step / 3 - masked, 1e-9 * s.forward_flops);
    const double recompute = e.hardware_flops_per_step - e.model_flops_per_step;
    EXPECT_NEAR(s.recompute_flops, recompute, 1e-9 * e.model_flops_per_step);
    // The optimizer: every rank takes the gradient norm of its shard (ZeRO) or the whole stage
    // and updates it; with one stage the estimate's optimizer seconds are that rank's bytes
    // over the HBM bandwidth.
    if (g.plan.pp == 1) {
      const DeviceSpec& d = c.gpu_device(0);
      const double closed_bytes = e.time.optimizer * d.hbm_bw * prof.memory_efficiency;
      const double program_bytes = s.optimizer_bytes / l.layout.world();
      EXPECT_NEAR(program_bytes, closed_bytes, 1e-6 * closed_bytes);
      const double per_param =
          adam_traffic_per_param(g.plan.precision, g.plan.optimizer_dtype).total();
      EXPECT_DOUBLE_EQ(per_param, adam_bytes_per_param(g.plan.precision, g.plan.optimizer_dtype));
    }
    ++checked;
  }
  EXPECT_GT(checked, 50);
}

// Bytes of layer `layer`'s communication in micro-batch 0 of `prog`, by group: TP collectives,
// CP ring sends, EP all-to-alls.
CommBytes program_layer_bytes(const Program& prog, int layer) {
  CommBytes b;
  for (const Op& op : prog.ops) {
    if (op.tags.layer != layer || op.tags.micro_batch != 0 || !is_communication(op.kind)) continue;
    if (op.group == Group::kTp && op.kind != OpKind::kSend && op.kind != OpKind::kRecv)
      b.tp += op.bytes;
    if (op.group == Group::kCp && op.kind == OpKind::kSend) b.cp += op.bytes;
    if (op.group == Group::kEp && op.kind == OpKind::kAllToAll) b.ep += op.bytes;
  }
  return b;
}

// The last layer of stage 0 (every layer with one stage).
int64_t lower_stage_last_layer(const Model& m, const Plan& p) { return m.layers / p.pp - 1; }

struct CommCase {
  const char* model;
  int tp, cp, ep;
  bool sp;
  Recompute recompute;
};

// The closed form's per-layer TP, CP and EP volumes are the lowered ops' (Megatron's f and g
// operators per block, the ring's K/V and gradient steps, dispatch and combine both ways).
TEST(EstimateAgainstProgram, LayerCommunicationBytesEqualTheLoweredOps) {
  std::vector<CommCase> cases;
  for (int tp : {1, 2, 4})
    for (int cp : {1, 2})
      for (bool sp : {false, true})
        for (Recompute rc : {Recompute::kNone, Recompute::kFull})
          if (tp > 1 || !sp) cases.push_back({"llama3-8b", tp, cp, 1, sp, rc});
  for (int tp : {1, 2})
    for (int ep : {2, 4})
      for (bool sp : {false, true})
        if (tp > 1 || !sp) {
          cases.push_back({"mixtral-8x7b", tp, 1, ep, sp, Recompute::kNone});
          cases.push_back({"deepseek-v3", tp, 1, ep, sp, Recompute::kNone});  // shared expert
        }
  int checked = 0;
  for (const CommCase& k : cases) {
    const Model m = model_preset(k.model);
    Plan p;
    p.tp = k.tp;
    p.cp = k.cp;
    p.ep = k.ep;
    p.dp = std::max(2, k.ep);
    p.micro_batch = 1;
    p.global_batch = 2 * p.dp;
    p.sequence_parallel = k.sp;
    p.recompute = k.recompute;
    const std::string label = std::string(k.model) + " tp" + std::to_string(k.tp) + " cp" +
                              std::to_string(k.cp) + " ep" + std::to_string(k.ep) +
                              (k.sp ? " sp " : " ") + recompute_name(k.recompute);
    SCOPED_TRACE(label);
    const Cluster c = cluster_preset("dgx-h100", p.gpus());
    validate(p, m, c);
    Estimator est(m, c, default_profile(c.gpu_device(0)));
    const Program prog = lower_stage(m, p, 0);
    for (int layer : {0, static_cast<int>(lower_stage_last_layer(m, p))}) {
      const CommBytes want = program_layer_bytes(prog, layer);
      const CommBytes got = est.layer_comm_bytes(p, layer);
      EXPECT_NEAR(got.tp, want.tp, 1e-9 * std::max(1.0, want.tp)) << "layer " << layer;
      EXPECT_NEAR(got.cp, want.cp, 1e-9 * std::max(1.0, want.cp)) << "layer " << layer;
      EXPECT_NEAR(got.ep, want.ep, 1e-9 * std::max(1.0, want.ep)) << "layer " << layer;
      if (k.tp > 1) EXPECT_GT(want.tp, 0);
      if (k.cp > 1) EXPECT_GT(want.cp, 0);
      if (k.ep > 1 && m.is_moe_layer(layer)) EXPECT_GT(want.ep, 0);
      ++checked;
    }
  }
  EXPECT_GT(checked, 30);
}

// The gradient buckets the closed form prices (cost::StageParams' layout, read by the
// data-parallel term) are the lowered Program's: on every stage, the data-parallel gradient
// all-reduces of the Program (ZeRO 0, overlapped with the backward) carry one bucket each, of
// the sizes StageParams lists, and the one issued last is the embedding's on the first stage and
// the stage's first layer's elsewhere.
TEST(EstimateAgainstProgram, GradientBucketsAreTheLoweredBuckets) {
  struct BucketCase {
    const char* model;
    int layers, tp, pp, ep;
  };
  int checked = 0;
  for (const BucketCase& k :
       {BucketCase{"gpt2-124m", 0, 1, 1, 1}, BucketCase{"gpt2-124m", 0, 1, 2, 1},
        BucketCase{"llama3-8b", 4, 2, 2, 1}, BucketCase{"mixtral-8x7b", 4, 1, 2, 2},
        BucketCase{"deepseek-v3", 4, 1, 2, 2}}) {
    Model m = model_preset(k.model);
    if (k.layers > 0) {
      m.layers = k.layers;
      m.moe.first_dense = std::min(m.moe.first_dense, 1);
    }
    Plan p;
    p.tp = k.tp;
    p.pp = k.pp;
    p.ep = k.ep;
    p.dp = 2 * k.ep;  // expert data parallelism of 2 under ep 2
    p.micro_batch = 1;
    p.global_batch = 2 * p.dp;
    p.sequence_parallel = k.tp > 1;
    const Cluster c = cluster_preset("dgx-h100", p.gpus());
    validate(p, m, c);
    const ParamCounts counts = param_counts(m);
    for (int s = 0; s < p.pp; ++s) {
      SCOPED_TRACE(std::string(k.model) + " tp" + std::to_string(k.tp) + " pp" +
                   std::to_string(k.pp) + " ep" + std::to_string(k.ep) + " stage " +
                   std::to_string(s));
      const StageParams sp = stage_params(m, counts, p, s);
      std::vector<double> want_dense(sp.dense_layers, sp.dense_layer), want_expert;
      want_dense.insert(want_dense.end(), sp.moe_layers, sp.moe_layer);
      if (sp.embedding > 0) want_dense.push_back(sp.embedding);
      if (sp.head > 0) want_dense.push_back(sp.head);
      if (m.is_moe()) {
        ASSERT_GT(p.expert_dp(), 1);
        want_expert.assign(sp.moe_layers, sp.expert_layer);
      }
      std::vector<double> dense, expert;
      const Program prog = lower_stage(m, p, s);
      for (const Op& op : prog.ops) {
        if (op.kind != OpKind::kAllReduce || op.tags.phase != Phase::kBackward) continue;
        const double elements = op.bytes / dtype_bytes(p.grad_reduce_dtype);
        if (op.group == Group::kDpCp) dense.push_back(elements);
        if (op.group == Group::kExpertDp) expert.push_back(elements);
      }
      ASSERT_FALSE(dense.empty());
      const double last = sp.embedding > 0     ? sp.embedding
                          : sp.first_layer_moe ? sp.moe_layer
                                               : sp.dense_layer;
      EXPECT_NEAR(dense.back(), last, 1e-9 * last);
      for (auto* v : {&want_dense, &dense, &want_expert, &expert}) std::sort(v->begin(), v->end());
      ASSERT_EQ(dense.size(), want_dense.size());
      for (size_t i = 0; i < dense.size(); ++i)
        EXPECT_NEAR(dense[i], want_dense[i], 1e-9 * want_dense[i]) << "bucket " << i;
      ASSERT_EQ(expert.size(), want_expert.size());
      for (size_t i = 0; i < expert.size(); ++i)
        EXPECT_NEAR(expert[i], want_expert[i], 1e-9 * want_expert[i]) << "expert bucket " << i;
      ++checked;
    }
  }
  EXPECT_EQ(checked, 9);
}

}  // namespace
}  // namespace parasol::cost
