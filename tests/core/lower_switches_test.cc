// Tests of the plan switches the lowering says in the Program (core/lower.h): TP communication
// overlap as chunked collectives beside their GEMMs, the combined 1F1B of the expert all-to-all
// overlap, collectives issued in compute order, the context-parallel ring's dK/dV accumulation,
// RoPE as the QKV projection's epilogue, unfused kernels' bytes, runtime_plan, MPT's unpadded
// attention, PyTorch FSDP's own copies and Composer's metric passes.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "core/fsdp_copies.h"
#include "core/layer_shapes.h"
#include "core/liveness.h"
#include "core/lower.h"
#include "core/moe_load.h"
#include "core/program.h"

namespace parasol {
namespace {

Plan plan_of(int tp, int pp, int dp) {
  Plan p;
  p.tp = tp, p.pp = pp, p.dp = dp;
  p.micro_batch = 1;
  p.global_batch = 4 * dp;
  p.sequence_parallel = tp > 1;
  return p;
}

Model cut(const char* preset, int layers) {
  Model m = model_preset(preset);
  m.layers = layers;
  m.moe.first_dense = 0;
  return m;
}

// The op of `p` named `name` (the first, -1 when none).
int op_named(const Program& p, const std::string& name) {
  for (const Op& op : p.ops)
    if (op.name == name) return op.id;
  return -1;
}

bool depends(const Op& op, int id) {
  return std::find(op.deps.begin(), op.deps.end(), id) != op.deps.end();
}

// The first compute op after `id`.
int next_compute(const Program& p, int id) {
  for (size_t i = static_cast<size_t>(id) + 1; i < p.ops.size(); ++i)
    if (p.streams[p.ops[i].stream] == StreamKind::kCompute) return static_cast<int>(i);
  return -1;
}

// Every dependency is an earlier op (what the engine and the executor require).
void expect_deps_earlier(const Program& p) {
  for (const Op& op : p.ops) {
    EXPECT_EQ(op.id, &op - p.ops.data());
    for (int d : op.deps) EXPECT_LT(d, op.id) << op.name;
  }
}

// tp_comm_overlap: the all-gather before QKV is one chunk of tp that QKV waits for and the rest
// beside it, which the attention (QKV's consumer) waits for; the reduce-scatter after the
// out-projection has its first tp - 1 chunks beside that GEMM (waiting for what it waits for)
// and its last after it. The bytes add up to the unchunked collective's.
TEST(LowerSwitches, TpCommOverlapChunksTheCollectivesBesideTheirGemms) {
  const Model m = cut("llama3-8b", 2);
  Plan p = plan_of(4, 1, 1);
  const Program plain = lower_stage(m, p, 0);
  p.tp_comm_overlap = true;
  ASSERT_EQ(p.tp_overlap_chunks(), 4);
  const Program ub = lower_stage(m, p, 0);
  expect_deps_earlier(ub);
  const Op& ag_plain = plain.ops[op_named(plain, "L0.ag")];
  const int head = op_named(ub, "L0.ag"), rest = op_named(ub, "L0.ag.rest");
  ASSERT_GE(head, 0);
  ASSERT_GE(rest, 0);
  EXPECT_DOUBLE_EQ(ub.ops[head].bytes, ag_plain.bytes / 4);
  EXPECT_DOUBLE_EQ(ub.ops[rest].bytes, ag_plain.bytes * 3 / 4);
  EXPECT_TRUE(ub.ops[rest].writes.empty());
  const int qkv = next_compute(ub, rest);
  ASSERT_EQ(ub.ops[qkv].name, "L0.qkv");
  EXPECT_TRUE(depends(ub.ops[qkv], head));
  EXPECT_FALSE(depends(ub.ops[qkv], rest));
  const int attn = next_compute(ub, qkv);
  EXPECT_EQ(ub.ops[attn].kind, OpKind::kAttention);
  EXPECT_TRUE(depends(ub.ops[attn], rest));
  // The reduce-scatter after the out-projection.
  const int out = op_named(ub, "L0.out");
  const int rs_rest = op_named(ub, "L0.out.tp.rest"), rs = op_named(ub, "L0.out.tp");
  ASSERT_GE(rs_rest, 0);
  ASSERT_GE(rs, 0);
  EXPECT_EQ(ub.ops[rs_rest].kind, OpKind::kReduceScatter);
  EXPECT_EQ(ub.ops[rs_rest].deps, ub.ops[out].deps);
  EXPECT_FALSE(depends(ub.ops[rs_rest], out));
  EXPECT_TRUE(depends(ub.ops[rs], out));
  const Op& rs_plain = plain.ops[op_named(plain, "L0.out.tp")];
  EXPECT_DOUBLE_EQ(ub.ops[rs].bytes + ub.ops[rs_rest].bytes, rs_plain.bytes);
  EXPECT_DOUBLE_EQ(ub.ops[rs].bytes, rs_plain.bytes / 4);
  // The backward's bulk overlaps (the input gathered again, the data gradient's reduction) stay
  // whole: the Programs differ by the chunks' ops only.
  int extra = 0;
  for (const Op& op : ub.ops) extra += op.name.ends_with(".rest") ? 1 : 0;
  EXPECT_EQ(ub.ops.size(), plain.ops.size() + extra);
  // Per layer and micro-batch: f and g of both blocks forward, g's conjugate of both backward.
  EXPECT_EQ(extra, 2 * 4 * 6);
}

// PyTorch's async TP (tp_impl torch with tp_comm_overlap) fuses each forward reduce-scatter with
// its GEMM (torch.ops.symm_mem.fused_matmul_reduce_scatter): the partial chunks are exchanged,
// then summed by one more kernel that reads every partial (the GEMM's whole output) and writes
// the shard. Megatron's (Transformer Engine's userbuffers) reduce in the exchange: no such op.
TEST(LowerSwitches, AsyncTpSumsTheExchangedPartialsAfterEachFusedReduceScatter) {
  const Model m = cut("llama3-8b", 2);
  Plan p = plan_of(4, 1, 1);
  p.tp_comm_overlap = true;
  const Program te = lower_stage(m, p, 0);
  p.tp_impl = TpImpl::kPytorch;
  const Program torch = lower_stage(m, p, 0);
  expect_deps_earlier(torch);
  auto sums = [](const Program& prog) {
    std::vector<int> ids;
    for (const Op& op : prog.ops)
      if (op.role == OpRole::kTpPartialsSum) ids.push_back(op.id);
    return ids;
  };
  EXPECT_TRUE(sums(te).empty());
  const std::vector<int> ids = sums(torch);
  // The out-projection's and FC2's, per layer and micro-batch (4), forward only.
  ASSERT_EQ(ids.size(), 2u * 2 * 4);
  for (int id : ids) {
    const Op& sum = torch.ops[id];
    EXPECT_EQ(sum.kind, OpKind::kResidualAdd);
    EXPECT_EQ(sum.tags.phase, Phase::kForward);
    EXPECT_EQ(torch.streams[sum.stream], StreamKind::kCompute);
    // After the last chunk of its reduce-scatter, whose shard it writes.
    const std::string rs_name = sum.name.substr(0, sum.name.size() - 4);  // less ".sum"
    // This micro-batch's: the last of each name before the sum.
    int rs = -1, rest = -1;
    for (int i = id - 1; i >= 0 && (rs < 0 || rest < 0); --i) {
      if (rs < 0 && torch.ops[i].name == rs_name) rs = i;
      if (rest < 0 && torch.ops[i].name == rs_name + ".rest") rest = i;
    }
    ASSERT_GE(rs, 0) << rs_name;
    ASSERT_GE(rest, 0) << rs_name;
    EXPECT_TRUE(depends(sum, rs)) << sum.name;
    EXPECT_EQ(sum.writes, torch.ops[rs].writes);
    // Every partial read (the reduce-scatter's whole input), the shard (a tp-th) written.
    const double whole = torch.ops[rs].bytes + torch.ops[rest].bytes;
    EXPECT_DOUBLE_EQ(sum.bytes, whole * (1 + 1.0 / 4)) << sum.name;
  }
  // Nothing else differs: the Programs' other ops are the same.
  EXPECT_EQ(torch.ops.size() - ids.size(), te.ops.size());
}

// Without overlap the on-path TP collectives and the expert exchanges are issued in compute
// order: each waits for the compute op before it and the next compute op waits for it.
TEST(LowerSwitches, CollectivesOnThePathAreIssuedInComputeOrder) {
  const Model m = cut("mixtral-8x7b", 2);
  Plan p = plan_of(2, 1, 4);
  p.ep = 4;
  const Program prog = lower_stage(m, p, 0);
  expect_deps_earlier(prog);
  int checked = 0;
  for (const Op& op : prog.ops) {
    const bool a2a = op.kind == OpKind::kAllToAll && op.group == Group::kEp;
    const bool f = op.name == "L0.ag" && op.tags.phase == Phase::kForward;
    if (!a2a && !f) continue;
    int before = -1;
    for (int i = op.id - 1; i >= 0; --i)
      if (prog.streams[prog.ops[i].stream] == StreamKind::kCompute) {
        before = i;
        break;
      }
    ASSERT_GE(before, 0) << op.name;
    EXPECT_TRUE(depends(op, before)) << op.name;
    EXPECT_TRUE(depends(prog.ops[next_compute(prog, op.id)], op.id)) << op.name;
    ++checked;
  }
  EXPECT_GT(checked, 8);
}

// ep_comm_overlap: Megatron's combined 1F1B. Without a pipeline each backward runs interleaved
// with the next micro-batch's forward, cut at their expert all-to-alls, which run on a stream of
// their own; the Program is the same ops (dependencies renumbered, all earlier).
TEST(LowerSwitches, EpCommOverlapInterleavesAForwardAndABackward) {
  const Model m = cut("mixtral-8x7b", 2);
  Plan p = plan_of(1, 1, 8);
  p.ep = 8;
  const Program plain = lower_stage(m, p, 0);
  p.ep_comm_overlap = true;
  const Program ovl = lower_stage(m, p, 0);
  expect_deps_earlier(ovl);
  ASSERT_EQ(ovl.ops.size(), plain.ops.size());
  ASSERT_EQ(ovl.streams.size(), plain.streams.size() + 1);
  std::vector<std::string> a, b;
  for (const Op& op : plain.ops) a.push_back(op.name);
  for (const Op& op : ovl.ops) b.push_back(op.name);
  EXPECT_NE(a, b);
  std::sort(a.begin(), a.end());
  std::sort(b.begin(), b.end());
  EXPECT_EQ(a, b);
  int a2a = 0;
  for (const Op& op : ovl.ops)
    if (op.kind == OpKind::kAllToAll) {
      EXPECT_EQ(op.stream, static_cast<int>(ovl.streams.size()) - 1) << op.name;
      ++a2a;
    }
  EXPECT_EQ(a2a, 2 * 4 * 4);  // 2 layers x 4 micro-batches x dispatch and combine, both ways
  // Micro-batch 1's forward starts before micro-batch 0's backward ends: their ops alternate.
  int switches = 0, last_mb = -1;
  for (const Op& op : ovl.ops) {
    if (op.tags.layer < 0 || op.tags.phase == Phase::kOptimizer) continue;
    const int key = op.tags.micro_batch * 2 + (op.tags.phase == Phase::kForward ? 0 : 1);
    if (key != last_mb && last_mb >= 0) ++switches;
    last_mb = key;
  }
  EXPECT_GT(switches, 2 * 4 * 2);
}

// The context-parallel ring's backward: each later step writes its own dK/dV and then adds the
// accumulator that came with its chunk, so the attention does not wait for the exchange.
TEST(LowerSwitches, RingAddsTheReceivedKvGradientAfterTheStep) {
  const Model m = cut("llama3-8b", 1);
  Plan p = plan_of(1, 1, 1);
  p.cp = 4;
  p.global_batch = 1;
  const Program prog = lower_stage(m, p, 0);
  expect_deps_earlier(prog);
  int acc = 0;
  for (const Op& op : prog.ops) {
    if (op.kind == OpKind::kAttention && op.tags.phase == Phase::kBackward) {
      for (int r : op.reads)
        EXPECT_NE(prog.buffers[r].role, BufferRole::kKvGrad) << "attention reads an accumulator";
    }
    if (op.name.find("dkv.acc") != std::string::npos) {
      ++acc;
      EXPECT_EQ(op.role, OpRole::kSum);
      ASSERT_EQ(op.reads.size(), 2u);
      EXPECT_EQ(op.writes.front(), op.reads.front());
    }
  }
  EXPECT_EQ(acc, 3);  // cp - 1 steps receive an accumulator
}

// RoPE is the QKV projection's epilogue: once forward, twice the bytes on the data gradient;
// unfused kernels move more bytes per norm and activation element.
TEST(LowerSwitches, RopeEpilogueAndUnfusedKernelBytes) {
  const Model m = cut("llama3-8b", 1);
  Plan p = plan_of(2, 1, 1);
  p.global_batch = 1;
  const Program fused = lower_stage(m, p, 0);
  const KernelBytes kb = kernel_bytes(m, p);
  const double T = static_cast<double>(m.seq_len);
  const double rope = kb.rotary * T * rotary_columns(m) / 2;
  EXPECT_DOUBLE_EQ(fused.ops[op_named(fused, "L0.qkv")].epilogue_bytes, rope);
  EXPECT_DOUBLE_EQ(fused.ops[op_named(fused, "L0.qkv.dx")].epilogue_bytes,
                   kb.rotary_backward * T * rotary_columns(m) / 2);
  EXPECT_DOUBLE_EQ(kb.rotary_backward, 2 * kb.rotary);
  p.fused_kernels = false;
  const Program eager = lower_stage(m, p, 0);
  const KernelBytes ke = kernel_bytes(m, p);
  for (const char* name : {"L0.ln1", "L0.act"}) {
    const int f = op_named(fused, name), e = op_named(eager, name);
    ASSERT_GE(f, 0) << name;
    ASSERT_GE(e, 0) << name;
    const double ratio = std::string(name).find("ln1") != std::string::npos
                             ? ke.norm / kb.norm
                             : ke.activation / kb.activation;
    EXPECT_DOUBLE_EQ(eager.ops[e].bytes, fused.ops[f].bytes * ratio) << name;
  }
  EXPECT_GT(eager.ops[op_named(eager, "L0.qkv")].epilogue_bytes, rope);
}

// A YaRN model with a concentration factor other than 1 (GPT-OSS) runs Megatron-Core's unfused
// RoPE: the QKV projection's epilogue moves 12 eb per element forward and 14 eb backward in
// place of the fused kernel's 2 and 4; the same model with a concentration of 1 lowers as before.
TEST(LowerSwitches, YarnConcentrationUnfusesTheRopeEpilogue) {
  Model m = cut("gpt-oss-20b", 2);
  Plan p = plan_of(1, 1, 1);
  p.global_batch = 1;
  const Program yarn = lower_stage(m, p, 0);
  m.yarn.mscale = m.yarn.mscale_all_dim = 1.0;
  ASSERT_EQ(m.rope_concentration(), 1.0);
  const Program fused = lower_stage(m, p, 0);
  for (const char* name : {"L0.qkv", "L0.qkv.dx"}) {
    const int y = op_named(yarn, name), f = op_named(fused, name);
    ASSERT_GE(y, 0) << name;
    ASSERT_GE(f, 0) << name;
    const double ratio = std::string(name) == "L0.qkv" ? 12.0 / 2 : 14.0 / 4;
    EXPECT_DOUBLE_EQ(yarn.ops[y].epilogue_bytes, ratio * fused.ops[f].epilogue_bytes) << name;
  }
}

TEST(LowerSwitches, TheRuntimePlanDropsTheGpuSideOverlapsOnly) {
  Plan p = plan_of(2, 1, 4);
  p.tp_comm_overlap = true;
  p.ep_comm_overlap = true;
  p.fused_kernels = false;
  const Plan r = runtime_plan(p);
  EXPECT_FALSE(r.tp_comm_overlap);
  EXPECT_FALSE(r.ep_comm_overlap);
  EXPECT_FALSE(r.fused_kernels);
  EXPECT_EQ(plan_to_json(runtime_plan(r)), plan_to_json(r));
  EXPECT_EQ(p.tp_overlap_chunks(), 2);
  EXPECT_EQ(r.tp_overlap_chunks(), 1);
}

// Megatron's alltoall dispatcher sorts the received rows by local expert and back (two more
// passes of read and write over the expert-side rows in each direction) when a rank holds more
// than one expert; DeepEP's flex dispatcher permutes once. The expert-side ops carry the
// busiest rank's load (core/moe_load.h), the token-side ones none.
TEST(LowerSwitches, MoeDispatcherSortsAndTheExpertSideCarriesTheHotRanksLoad) {
  const Model m = cut("mixtral-8x7b", 1);
  Plan p = plan_of(1, 1, 4);
  p.ep = 4;  // 2 local experts
  const Program a2a = lower_stage(m, p, 0);
  p.moe_dispatcher = MoeDispatcher::kDeepEp;
  const Program deepep = lower_stage(m, p, 0);
  const int64_t T = p.seq(m), rows = T * m.moe.top_k;
  const double sort = 2.0 * 2 * rows * m.hidden;  // bf16 read + write of the routed rows
  for (const char* name : {"L0.dispatch", "L0.combine"}) {
    const int a = op_named(a2a, name), d = op_named(deepep, name);
    ASSERT_GE(a, 0) << name;
    ASSERT_GE(d, 0) << name;
    EXPECT_DOUBLE_EQ(a2a.ops[a].bytes - deepep.ops[d].bytes, sort) << name;
  }
  const double hot = moe_hot_rank_factor(m, p.ep, static_cast<double>(rows));
  EXPECT_GT(hot, 1.0);
  int expert_side = 0;
  for (const Op& op : a2a.ops) {
    const bool expert = op.kind == OpKind::kExpertLinear || op.role == OpRole::kExpertAct ||
                        (op.kind == OpKind::kAllToAll && op.group == Group::kEp);
    EXPECT_EQ(op.load, expert ? hot : 1.0) << op.name;
    expert_side += expert;
  }
  // Per micro-batch: fc1, fc2 and 4 backward GEMMs, 2 activations, 4 all-to-alls.
  EXPECT_EQ(expert_side, p.micro_batches() * (2 + 4 + 2 + 4));
  // One local expert: no sort; no expert parallelism: no imbalance.
  p.moe_dispatcher = MoeDispatcher::kAllToAll;
  p.ep = 1;
  const Program one = lower_stage(m, p, 0);
  EXPECT_DOUBLE_EQ(one.ops[op_named(one, "L0.dispatch")].bytes,
                   deepep.ops[op_named(deepep, "L0.dispatch")].bytes);
  for (const Op& op : one.ops) EXPECT_EQ(op.load, 1.0) << op.name;
}

// Megatron's allgather dispatcher (token_dispatcher.py MoEAllGatherTokenDispatcher @d98e8a64dd):
// the host reads the local token counts (.cpu()) and the masked_select's size once the routing
// map is gathered, two syncs a MoE layer forward that wait for the gather (the alltoall dispatcher
// syncs once, after the router); unpermute's zeroed buffer of every rank's tokens forward (and
// the casts to fp32 probabilities and back under an fp32 router), the permute's backward into a
// zeroed buffer. The runtime runs the all-to-all in its place.
TEST(LowerSwitches, AllGatherDispatcherSyncsTwiceAfterItsGather) {
  const Model m = cut("mixtral-8x7b", 1);
  Plan p = plan_of(1, 1, 8);
  p.ep = 8;
  const Program a2a = lower_stage(m, p, 0);
  p.moe_dispatcher = MoeDispatcher::kAllGather;
  const Program ag = lower_stage(m, p, 0);
  p.moe_router_fp32 = true;
  const Program ag32 = lower_stage(m, p, 0);
  auto syncs = [](const Program& prog, const std::string& name, OpRole after) {
    int n = 0;
    for (const Op& op : prog.ops) {
      if (op.kind != OpKind::kSync || op.name != name) continue;
      ++n;
      EXPECT_EQ(op.deps.size(), 1u) << name;
      if (!op.deps.empty()) EXPECT_EQ(prog.ops[op.deps[0]].role, after) << name;
    }
    return n;
  };
  const int mb = p.micro_batches();
  EXPECT_EQ(syncs(a2a, "moe.tokens", OpRole::kNone), mb);
  EXPECT_EQ(syncs(a2a, "moe.select", OpRole::kNone), 0);
  EXPECT_EQ(syncs(ag, "moe.tokens", OpRole::kDispatchA2a), mb);
  EXPECT_EQ(syncs(ag, "moe.select", OpRole::kDispatchA2a), mb);
  auto bytes = [](const Program& prog, const char* name, Phase ph) {
    for (const Op& op : prog.ops)
      if (op.name == name && op.tags.phase == ph) return op.bytes;
    return -1.0;
  };
  const double T = static_cast<double>(p.seq(m)) * p.micro_batch, h = m.hidden;
  const double all = 8 * T * h;  // every rank's tokens
  EXPECT_DOUBLE_EQ(
      bytes(ag, "L0.combine", Phase::kForward) - bytes(a2a, "L0.combine", Phase::kForward),
      2 * all);
  EXPECT_DOUBLE_EQ(bytes(ag, "L0.combine", Phase::kBackward),
                   bytes(a2a, "L0.combine", Phase::kBackward));
  EXPECT_DOUBLE_EQ(
      bytes(ag, "L0.dispatch", Phase::kBackward) - bytes(a2a, "L0.dispatch", Phase::kBackward),
      2 * all);
  EXPECT_DOUBLE_EQ(
      bytes(ag32, "L0.combine", Phase::kForward) - bytes(ag, "L0.combine", Phase::kForward),
      (2 + 4) * (all + T * h));
  EXPECT_DOUBLE_EQ(
      bytes(ag32, "L0.combine", Phase::kBackward) - bytes(ag, "L0.combine", Phase::kBackward),
      (2 + 4) * (all + T * h));
  EXPECT_EQ(runtime_plan(p).moe_dispatcher, MoeDispatcher::kAllToAll);
}

// Qwen3's per-head query and key norms (Model::qk_norm): one norm op each over this rank's query
// and key columns after the QKV projection, and each backward before its data gradient, with
// the layer norms' bytes per element; none without the switch.
TEST(LowerSwitches, QkNormNormalisesTheQueryAndKeyColumnsEachWay) {
  Model m = cut("qwen3-30b-a3b", 1);
  ASSERT_TRUE(m.qk_norm);
  Plan p = plan_of(2, 1, 1);
  p.global_batch = 1;
  const Program normed = lower_stage(m, p, 0);
  const KernelBytes kb = kernel_bytes(m, p);
  const double T = static_cast<double>(p.seq(m));
  const double q = double(m.heads) * m.head_dim / p.tp, k = double(m.kv_heads) * m.head_dim / p.tp;
  int forward = 0, backward = 0;
  for (const Op& op : normed.ops) {
    if (op.name != "L0.q.norm" && op.name != "L0.k.norm") continue;
    const double cols = op.name == "L0.q.norm" ? q : k;
    EXPECT_EQ(op.kind, OpKind::kNorm);
    const bool bwd = op.tags.phase == Phase::kBackward;
    EXPECT_DOUBLE_EQ(op.bytes, (bwd ? 2 : 1) * kb.norm * T * cols) << op.name;
    (bwd ? backward : forward) += 1;
  }
  EXPECT_EQ(forward, 2);
  EXPECT_EQ(backward, 2);
  // After the QKV projection; the backward before its data gradient.
  EXPECT_LT(op_named(normed, "L0.qkv"), op_named(normed, "L0.q.norm"));
  m.qk_norm = false;
  const Program plain = lower_stage(m, p, 0);
  EXPECT_EQ(op_named(plain, "L0.q.norm"), -1);
  EXPECT_EQ(normed.ops.size(), plain.ops.size() + 4);
}

// The router's kernels after its GEMM (core/moe_load.h router_kernels) are the route op's:
// its launches and its bytes over the [tokens, experts] scores, forward and backward.
TEST(LowerSwitches, TheRouteOpCarriesTheRoutersKernels) {
  const Model m = cut("qwen3-30b-a3b", 1);
  Plan p = plan_of(1, 1, 1);
  p.global_batch = 1;
  p.moe_router_fusion = true;
  const Program prog = lower_stage(m, p, 0);
  const double TE = double(p.seq(m)) * m.moe.experts;
  int seen = 0;
  for (const Op& op : prog.ops) {
    if (op.name != "L0.route") continue;
    const RouterKernels r = router_kernels(p, op.tags.phase == Phase::kBackward);
    EXPECT_EQ(op.kind, OpKind::kRouter);
    EXPECT_EQ(op.tensors, r.kernels);
    EXPECT_DOUBLE_EQ(op.bytes, r.bytes_per_element * TE);
    ++seen;
  }
  EXPECT_EQ(seen, 2);
}

}  // namespace
}  // namespace parasol

namespace parasol {
namespace {

int count_named(const Program& p, const std::string& suffix) {
  int n = 0;
  for (const Op& op : p.ops)
    if (op.name.size() >= suffix.size() &&
        op.name.compare(op.name.size() - suffix.size(), suffix.size(), suffix) == 0)
      ++n;
  return n;
}

int count_kind(const Program& p, OpKind k) {
  int n = 0;
  for (const Op& op : p.ops) n += op.kind == k;
  return n;
}

// MPT's unpadded attention (Plan::attention_unpad): per layer's forward Q, K and V gathered into
// packed copies the kernel reads, after two host syncs each (torch.nonzero, .item()), and the
// output padded back; in the backward dO gathered, dQ, dK, dV scattered into zeroed gradients
// and concatenated: 2 x hidden bytes a row for each copy of a hidden-wide tensor.
TEST(LowerSwitches, UnpaddedAttentionCopiesAndSyncsTheHost) {
  const Model m = cut("llama2-7b", 2);
  Plan p = plan_of(1, 1, 1);
  p.micro_batch = 2;
  p.global_batch = 2;
  const Program plain = lower_stage(m, p, 0);
  p.attention_unpad = true;
  const Program unpad = lower_stage(m, p, 0);
  expect_deps_earlier(unpad);
  EXPECT_EQ(count_kind(unpad, OpKind::kSync) - count_kind(plain, OpKind::kSync), 2 * 6);
  const int attn = op_named(unpad, "L0.attn");
  const int q = op_named(unpad, "L0.unpad.q");
  ASSERT_GE(attn, 0);
  ASSERT_GE(q, 0);
  EXPECT_TRUE(depends(unpad.ops[attn], q));
  const double rows = 2.0 * m.seq_len, h = m.hidden;
  EXPECT_DOUBLE_EQ(unpad.ops[q].bytes, 2 * 2 * rows * h);
  EXPECT_DOUBLE_EQ(unpad.ops[op_named(unpad, "L0.pad")].bytes, 2 * 2 * rows * h);
  EXPECT_DOUBLE_EQ(unpad.ops[op_named(unpad, "L0.qkv.cat")].bytes, 2 * 2 * rows * 3 * h);
  EXPECT_EQ(count_named(unpad, ".pad.bwd"), 2);
  // The .item() sync (a host op, named without its layer) waits for the longest row's kernel.
  const int item = op_named(unpad, "unpad.v.item");
  ASSERT_GE(item, 0);
  EXPECT_TRUE(depends(unpad.ops[item], op_named(unpad, "L0.unpad.v.max")));
  EXPECT_EQ(plain.ops.size() + 2 * (3 * 8 + 2) + 2 * (1 + 3 * 2 + 1), unpad.ops.size());
}

// PyTorch FSDP's own kernels (Plan::fsdp_impl, core/fsdp_copies.h): FSDP1 casts the shard before
// each gather and concatenates, casts and pre-divides the gradient before each reduce-scatter;
// FSDP2 copies each gather out at the use and the gradients into the reduce-scatter input.
TEST(LowerSwitches, FsdpCopiesAroundTheCollectives) {
  const Model m = cut("llama2-7b", 2);
  Plan p = plan_of(1, 1, 8);
  p.global_batch = 8;  // one micro-batch
  p.zero = 3;
  const Program plain = lower_stage(m, p, 0);
  p.fsdp_impl = FsdpImpl::kFsdp1;
  const Program one = lower_stage(m, p, 0);
  expect_deps_earlier(one);
  const int rs = op_named(one, "L1.g.rs");
  const int pre = op_named(one, "L1.g.prediv");
  ASSERT_GE(rs, 0);
  ASSERT_GE(pre, 0);
  EXPECT_TRUE(depends(one.ops[rs], pre));
  const int cat = op_named(one, "L1.g.flat");
  const double layer = one.ops[rs].bytes / 4;  // fp32 reduce: the layer's padded elements
  EXPECT_DOUBLE_EQ(one.ops[cat].bytes, 2 * 2 * layer);
  EXPECT_DOUBLE_EQ(one.ops[op_named(one, "L1.g.cast")].bytes, (2 + 4) * layer);
  EXPECT_DOUBLE_EQ(one.ops[pre].bytes, 2 * 4 * layer);
  // 8 ranks: pre-divide by 4, post-divide by 2 (default_hooks.py).
  EXPECT_EQ(fsdp1_predivide_factor(8), 4);
  EXPECT_EQ(fsdp1_predivide_factor(2), 2);
  EXPECT_EQ(fsdp1_predivide_factor(128), 16);
  EXPECT_DOUBLE_EQ(one.ops[op_named(one, "L1.g.postdiv")].bytes, 2 * 4 * layer / 8);
  const int cast = op_named(one, "L1.w.mp_shard");
  ASSERT_GE(cast, 0);
  EXPECT_NE(one.streams[one.ops[cast].stream], StreamKind::kCompute);
  EXPECT_EQ(count_named(one, ".w.mp_shard"), count_kind(plain, OpKind::kAllGather));
  // FSDP2: the copy-out after the gather, before the layer's first GEMM, on the compute stream.
  p.fsdp_impl = FsdpImpl::kFsdp2;
  const Program two = lower_stage(m, p, 0);
  expect_deps_earlier(two);
  const int out = op_named(two, "L1.w.copy_out");
  const int ag = op_named(two, "L1.w.ag");
  ASSERT_GE(out, 0);
  EXPECT_TRUE(depends(two.ops[out], ag));
  EXPECT_EQ(two.streams[two.ops[out].stream], StreamKind::kCompute);
  EXPECT_TRUE(depends(two.ops[op_named(two, "L1.qkv")], out));
  // Every layer gather is copied out once (the embedding's and head's are not).
  EXPECT_EQ(count_named(two, ".w.copy_out"), 2 * 2);
  EXPECT_DOUBLE_EQ(two.ops[op_named(two, "L1.g.copy_in")].bytes, (2 + 4) * layer);
  EXPECT_EQ(count_named(two, ".g.prediv"), 0);
}

// FSDP2's unsharded gradients are autograd's, in the parameters' dtype (MixedPrecisionPolicy's
// param_dtype), and its copy-in writes them, cast, into a reduce-scatter input of its own in the
// reduce dtype (foreach_reduce), which the reduce-scatter reads. FSDP1 reduces its gradients, kept
// in the optimizer's dtype, in place.
TEST(LowerSwitches, Fsdp2ReducesItsParamDtypeGradientsThroughAReduceDtypeInput) {
  const Model m = cut("llama2-7b", 2);
  Plan p = plan_of(1, 1, 8);
  p.global_batch = 8;  // one micro-batch
  p.zero = 3;
  p.fsdp_impl = FsdpImpl::kFsdp1;
  const Program one = lower_stage(m, p, 0);
  p.fsdp_impl = FsdpImpl::kFsdp2;
  const Program two = lower_stage(m, p, 0);
  expect_deps_earlier(two);
  for (const Program* prog : {&one, &two}) {
    const bool fsdp2 = prog == &two;
    SCOPED_TRACE(fsdp2 ? "fsdp2" : "fsdp1");
    const Op& rs = prog->ops[op_named(*prog, "L1.g.rs")];
    const double padded = rs.bytes / 4;  // fp32 reduce: the layer's padded elements
    const Op& copy = prog->ops[op_named(*prog, fsdp2 ? "L1.g.copy_in" : "L1.g.flat")];
    // The unsharded gradients the backward wrote: the copy's inputs.
    double elements = 0;
    for (int id : copy.reads) {
      const Buffer& g = prog->buffers[id];
      EXPECT_EQ(g.dtype, fsdp2 ? Dtype::kBf16 : Dtype::kFp32) << g.name;
      elements += static_cast<double>(g.elements());
    }
    EXPECT_GT(elements, 0);
    EXPECT_LE(elements, padded);
    if (fsdp2) {
      ASSERT_EQ(rs.reads.size(), 1u);
      const Buffer& in = prog->buffers[rs.reads[0]];
      EXPECT_TRUE(in.name.ends_with(".g.rs_in.m0")) << in.name;
      EXPECT_EQ(in.dtype, Dtype::kFp32);
      EXPECT_DOUBLE_EQ(static_cast<double>(in.elements()), padded);
      EXPECT_EQ(copy.writes, rs.reads);
    } else {
      EXPECT_EQ(rs.reads, copy.reads);
    }
  }
}

// FSDP's CPU offload (core/offload_rules.h): each reduced gradient shard goes to host memory in
// the sharded parameter's dtype, after its reduce-scatter on the data-parallel stream, not on the
// copy stream the shards' host-to-device copies take (FSDP2 foreach_reduce's .to("cpu") in the
// reduce-scatter stream; all_gather_inputs' .to(device) in the all-gather copy-in stream), and
// the copy-in into the reduce-scatter input precedes it; DeepSpeed's copies 4 bytes an element.
TEST(LowerSwitches, FsdpOffloadCopiesEachGradientShardAfterItsReduceScatter) {
  const Model m = cut("llama2-7b", 2);
  Plan p = plan_of(1, 1, 8);
  p.global_batch = 8;  // one micro-batch: the gradients stream to the host
  p.zero = 3;
  p.offload.optimizer = true;
  p.offload.params = true;
  p.optimizer_dtype = Dtype::kBf16;
  p.grad_reduce_dtype = Dtype::kBf16;
  p.cpu_optimizer = CpuOptimizer::kTorch;
  const Program ds = lower_stage(m, p, 0);
  p.fsdp_impl = FsdpImpl::kFsdp2;
  const Program two = lower_stage(m, p, 0);
  expect_deps_earlier(two);
  for (const Program* prog : {&ds, &two}) {
    const bool fsdp = prog == &two;
    const int rs = op_named(*prog, "L1.g.rs");
    const int down = op_named(*prog, "L1.g.offload");
    const int up = op_named(*prog, "L1.shard.prefetch");
    ASSERT_GE(rs, 0);
    ASSERT_GE(down, 0);
    ASSERT_GE(up, 0);
    const double shard = prog->ops[rs].bytes / 2 / 8;  // bf16 reduce over 8 ranks
    EXPECT_DOUBLE_EQ(prog->ops[down].bytes, (fsdp ? 2 : 4) * shard) << fsdp;
    EXPECT_EQ(prog->ops[down].stream == prog->ops[rs].stream, fsdp);
    EXPECT_EQ(prog->ops[down].stream == prog->ops[up].stream, !fsdp);
    EXPECT_EQ(op_named(*prog, "L1.g.copy_in") >= 0, fsdp);
  }
  EXPECT_LT(op_named(two, "L1.g.copy_in"), op_named(two, "L1.g.rs"));
}

// Composer's train metrics (Plan::loss_metric_passes): after each micro-batch's backward, per
// pass an fp32 upcast of the logits and a log-softmax over them, reading the logits the trainer
// kept.
TEST(LowerSwitches, MetricPassesReadTheLogitsAfterTheBackward) {
  const Model m = cut("llama2-7b", 1);
  Plan p = plan_of(1, 1, 1);
  p.global_batch = 2;
  p.loss_metric_passes = 2;
  const Program prog = lower_stage(m, p, 0);
  expect_deps_earlier(prog);
  EXPECT_EQ(count_named(prog, "metric.upcast"), 2 * 2);
  const int up = op_named(prog, "metric.upcast");
  const int head = op_named(prog, "head");
  ASSERT_GE(up, 0);
  int emb_grad = -1;  // the last op named emb: the embedding's gradient, the backward's end
  for (const Op& op : prog.ops)
    if (op.name == "emb" && op.id < up) emb_grad = op.id;
  EXPECT_GT(emb_grad, op_named(prog, "emb"));
  EXPECT_TRUE(depends(prog.ops[up], head));
  const double logits = double(m.seq_len) * m.vocab;
  EXPECT_DOUBLE_EQ(prog.ops[up].bytes, (2 + 4) * logits);
}

}  // namespace
}  // namespace parasol

namespace parasol {
namespace {

// Transformer Engine's fp8 current scaling (Fp8Recipe::kTensorwise): before every fp8 GEMM that
// quantises its operand (a layer linear's forward and data gradient, the grouped experts' too)
// an amax op reads the bf16 operand once more (its m x k x batch elements, 2 bytes each) with two
// kernels per quantised tensor (the local experts of a grouped GEMM one by one), and the GEMM
// waits for it; not the router (outside fp8 autocast), the output layer (bf16) or a weight
// gradient. Nothing under delayed scaling or in bf16.
TEST(LowerSwitches, Fp8CurrentScalingReadsEachQuantisedOperandForItsAmax) {
  const Model m = cut("qwen3-30b-a3b", 1);
  Plan p = plan_of(1, 1, 1);
  p.global_batch = 1;
  p.precision = Dtype::kFp8;
  p.fp8_recipe = Fp8Recipe::kTensorwise;
  const Program prog = lower_stage(m, p, 0);
  expect_deps_earlier(prog);
  int gemms = 0, amaxes = 0;
  for (const Op& op : prog.ops) {
    if (is_fp8_amax(op.role)) {
      ++amaxes;
      EXPECT_EQ(op.kind, OpKind::kCast) << op.name;
      continue;
    }
    if (op.kind != OpKind::kLinear && op.kind != OpKind::kExpertLinear) continue;
    int amax = -1;
    for (int d : op.deps)
      if (is_fp8_amax(prog.ops[d].role)) amax = d;
    const bool router = op.name.rfind("L0.router", 0) == 0;
    const bool quantises =
        op.tags.layer >= 0 && !router && (op.tags.phase != Phase::kBackward || op.backward_data);
    if (!quantises) {
      EXPECT_EQ(amax, -1) << op.name;
      continue;
    }
    ASSERT_GE(amax, 0) << op.name;
    ++gemms;
    const Op& a = prog.ops[amax];
    const double elements = double(op.m) * double(op.k) * double(op.batch);
    EXPECT_EQ(a.role, op.kind == OpKind::kExpertLinear ? OpRole::kExpertFp8Amax : OpRole::kFp8Amax)
        << op.name;
    EXPECT_DOUBLE_EQ(a.elements, elements) << op.name;
    EXPECT_DOUBLE_EQ(a.bytes, 2 * elements) << op.name;
    EXPECT_EQ(a.tensors, op.batch) << op.name;
    EXPECT_DOUBLE_EQ(a.load, op.load) << op.name;
    EXPECT_EQ(a.name, op.name + ".amax");
  }
  // qkv, out, efc1, efc2 forward and their four data gradients.
  EXPECT_EQ(gemms, 8);
  EXPECT_EQ(amaxes, gemms);
  auto amax_ops = [&](const Plan& q) {
    int n = 0;
    for (const Op& op : lower_stage(m, q, 0).ops) n += is_fp8_amax(op.role);
    return n;
  };
  Plan delayed = p;
  delayed.fp8_recipe = Fp8Recipe::kDelayed;
  EXPECT_EQ(amax_ops(delayed), 0);
  Plan mx = p;
  mx.fp8_recipe = Fp8Recipe::kMxfp8;
  EXPECT_EQ(amax_ops(mx), 0);
  Plan bf16 = p;
  bf16.precision = Dtype::kBf16;
  EXPECT_EQ(amax_ops(bf16), 0);
}

}  // namespace
}  // namespace parasol

namespace parasol {
namespace {

// Plan::gemm_gelu_epilogue: a GELU model's FC1 writes its pre-activation and GELU in one GEMM
// (OpRole::kGeluFc1) and FC2's data gradient writes FC1's output gradient through GELU's
// derivative (kGeluFc2Dx, reading the saved pre-activation): no activation op either way, the
// pre-activation's bytes as the epilogue's, the backward's activation-gradient buffer gone (the
// peak no higher); the same GEMMs' FLOPs. A SwiGLU model lowers as before.
TEST(LowerSwitches, GeluEpilogueFusesTheActivationIntoTheMlpGemms) {
  const Model m = cut("gpt2-124m", 2);
  ASSERT_EQ(m.activation, Activation::kGelu);
  Plan p = plan_of(2, 1, 1);
  p.global_batch = 2;
  const Program plain = lower_stage(m, p, 0);
  p.gemm_gelu_epilogue = true;
  const Program fused = lower_stage(m, p, 0);
  expect_deps_earlier(fused);
  auto count = [](const Program& prog, OpKind kind, OpRole role) {
    return std::count_if(prog.ops.begin(), prog.ops.end(),
                         [&](const Op& o) { return o.kind == kind && o.role == role; });
  };
  const long acts = count(plain, OpKind::kActivation, OpRole::kNone);
  ASSERT_EQ(acts, 2 * 2 * 2);  // forward and backward, 2 layers, 2 micro-batches
  EXPECT_EQ(count(fused, OpKind::kActivation, OpRole::kNone), 0);
  EXPECT_EQ(count(fused, OpKind::kLinear, OpRole::kGeluFc1), 2 * 2);
  EXPECT_EQ(count(fused, OpKind::kLinear, OpRole::kGeluFc2Dx), 2 * 2);
  EXPECT_EQ(fused.ops.size() + acts, plain.ops.size());
  const int fc1 = op_named(fused, "L0.fc1"), dx = op_named(fused, "L0.fc2.dx");
  ASSERT_GE(fc1, 0);
  ASSERT_GE(dx, 0);
  const Op &f = fused.ops[fc1], &d = fused.ops[dx];
  const Op &pf = plain.ops[op_named(plain, "L0.fc1")],
           &pd = plain.ops[op_named(plain, "L0.fc2.dx")];
  EXPECT_EQ(f.role, OpRole::kGeluFc1);
  EXPECT_DOUBLE_EQ(f.flops, pf.flops);
  EXPECT_DOUBLE_EQ(d.flops, pd.flops);
  ASSERT_EQ(f.writes.size(), 2u);
  const Buffer& pre = fused.buffers[f.writes[0]];
  EXPECT_EQ(pre.cls, BufferClass::kActivation);
  EXPECT_DOUBLE_EQ(f.epilogue_bytes, pre.bytes());
  // The backward GEMM reads the pre-activation FC1 wrote and writes FC1's output gradient, which
  // FC1's weight gradient and data gradient read.
  EXPECT_EQ(d.reads.back(), f.writes[0]);
  EXPECT_DOUBLE_EQ(d.epilogue_bytes, pre.bytes());
  const int dw = op_named(fused, "L0.fc1.dw");
  ASSERT_GE(dw, 0);
  EXPECT_EQ(fused.ops[dw].reads.at(1), d.writes[0]);
  EXPECT_LE(liveness(fused).peak_bytes, liveness(plain).peak_bytes);
  // SwiGLU: nothing to fuse.
  const Model llama = cut("llama3-8b", 1);
  Plan q = plan_of(2, 1, 1);
  q.global_batch = 1;
  const Program a = lower_stage(llama, q, 0);
  q.gemm_gelu_epilogue = true;
  EXPECT_EQ(program_to_json(lower_stage(llama, q, 0)), program_to_json(a));
}

}  // namespace
}  // namespace parasol
