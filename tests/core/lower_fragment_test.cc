// lower_layer_fragment (core/lower.h): a layer's fragment holds exactly the ops lower_stage()
// emits for that layer in a stage's Program (its forward, recomputed modules and backward: kind,
// role, phase, shapes, bytes, FLOPs and stream), without the data-parallel ones; under
// ep_comm_overlap the priced pass interleaves a backward with the next micro-batch's forward.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <tuple>
#include <vector>

#include "core/lower.h"
#include "core/model.h"
#include "core/plan.h"

namespace parasol {
namespace {

using Signature =
    std::tuple<int, int, int, int, int64_t, int64_t, int64_t, int64_t, double, double, double, int>;

Signature signature(const Op& op) {
  return {static_cast<int>(op.kind),
          static_cast<int>(op.role),
          static_cast<int>(op.tags.phase),
          op.stream,
          op.m,
          op.n,
          op.k,
          op.batch,
          op.bytes,
          op.flops,
          op.epilogue_bytes,
          static_cast<int>(op.group)};
}

// The layer's ops of micro-batch `mb` in a whole stage's Program, data-parallel ones left out.
std::vector<Signature> stage_layer_ops(const Program& prog, int layer, int mb) {
  std::vector<Signature> out;
  for (const Op& op : prog.ops)
    if (op.tags.layer == layer && op.tags.micro_batch == mb && op.stream != 3)
      out.push_back(signature(op));
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<Signature> fragment_ops(const LayerFragment& f) {
  std::vector<Signature> out;
  for (const LayerFragment::Pass& pass : f.passes)
    for (int i = pass.begin; i < pass.end; ++i) out.push_back(signature(f.program.ops[i]));
  std::sort(out.begin(), out.end());
  return out;
}

struct Case {
  std::string name, model;
  int layer;
  int tp, cp, ep;
  bool sp;
  Recompute recompute = Recompute::kNone;
  bool tp_overlap = false;
};

TEST(LowerFragment, HoldsTheOpsTheStageEmitsForTheLayer) {
  const std::vector<Case> cases = {
      {"dense tp2 sp", "llama3-8b", 3, 2, 1, 1, true},
      {"dense tp2 without sp", "llama3-8b", 0, 2, 1, 1, false},
      {"dense cp2", "llama3-8b", 1, 1, 2, 1, false},
      {"dense tp2 cp2 selective", "llama3-8b", 2, 2, 2, 1, true, Recompute::kSelective},
      {"dense tp overlap", "llama3-8b", 1, 4, 1, 1, true, Recompute::kNone, true},
      {"moe ep4", "mixtral-8x7b", 1, 2, 1, 4, true},
      {"mla shared experts", "deepseek-v3", 5, 2, 1, 4, true},
      {"windowed moe cp2", "gpt-oss-20b", 0, 1, 2, 2, false},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.name);
    Model m = model_preset(k.model);
    m.layers = std::max(k.layer + 1, 2);
    Plan p;
    p.tp = k.tp, p.cp = k.cp, p.ep = k.ep;
    p.dp = std::max(2, k.ep);
    p.sequence_parallel = k.sp;
    p.recompute = k.recompute;
    p.tp_comm_overlap = k.tp_overlap;
    p.micro_batch = 1;
    p.global_batch = p.dp;
    const Program stage = lower_stage(m, p, 0);
    const LayerFragment f = lower_layer_fragment(m, p, k.layer);
    ASSERT_EQ(f.passes.size(), 2u);
    EXPECT_EQ(f.passes[0].begin, 0);
    EXPECT_EQ(f.passes[0].end, f.passes[1].begin);
    EXPECT_EQ(f.passes[1].end, static_cast<int>(f.program.ops.size()));
    const std::vector<Signature> want = stage_layer_ops(stage, k.layer, 0);
    ASSERT_FALSE(want.empty());
    EXPECT_EQ(fragment_ops(f), want);
    // The forward pass holds the forward, the second the recompute and the backward.
    for (int i = f.passes[0].begin; i < f.passes[0].end; ++i)
      EXPECT_EQ(f.program.ops[i].tags.phase, Phase::kForward) << f.program.ops[i].name;
    for (int i = f.passes[1].begin; i < f.passes[1].end; ++i)
      EXPECT_NE(f.program.ops[i].tags.phase, Phase::kForward) << f.program.ops[i].name;
    // Every dependency points into the fragment, to an earlier op.
    for (const Op& op : f.program.ops)
      for (int d : op.deps) EXPECT_TRUE(0 <= d && d < op.id) << op.name;
  }
}

// Full recompute is the closed form's arithmetic (the forward again): the fragment has none.
TEST(LowerFragment, LeavesFullRecomputeOut) {
  Model m = model_preset("llama3-8b");
  m.layers = 2;
  Plan p;
  p.tp = 2;
  p.dp = 2;
  p.global_batch = 2;
  p.recompute = Recompute::kFull;
  const LayerFragment f = lower_layer_fragment(m, p, 1);
  for (const Op& op : f.program.ops) EXPECT_NE(op.tags.phase, Phase::kRecompute) << op.name;
}

// Megatron's combined 1F1B: one pass of micro-batch 0's backward interleaved with micro-batch
// 1's forward at their expert all-to-alls, after micro-batch 0's forward.
TEST(LowerFragment, InterleavesABackwardWithTheNextForwardUnderEpOverlap) {
  Model m = model_preset("mixtral-8x7b");
  m.layers = 2;
  Plan p;
  p.tp = 1;
  p.ep = 4;
  p.dp = 4;
  p.global_batch = 8;
  p.ep_comm_overlap = true;
  const LayerFragment f = lower_layer_fragment(m, p, 1);
  ASSERT_EQ(f.passes.size(), 1u);
  const LayerFragment::Pass pass = f.passes[0];
  EXPECT_GT(pass.begin, 0);
  for (int i = 0; i < pass.begin; ++i) {
    EXPECT_EQ(f.program.ops[i].tags.micro_batch, 0);
    EXPECT_EQ(f.program.ops[i].tags.phase, Phase::kForward);
  }
  // In the pass: backward of 0 and forward of 1 alternate between expert all-to-alls.
  int switches = 0, a2a = 0;
  for (int i = pass.begin + 1; i < pass.end; ++i) {
    const Op& op = f.program.ops[i];
    if (op.kind == OpKind::kAllToAll) ++a2a;
    if (op.tags.micro_batch != f.program.ops[i - 1].tags.micro_batch) ++switches;
    EXPECT_EQ(op.tags.micro_batch == 1, op.tags.phase == Phase::kForward) << op.name;
  }
  EXPECT_EQ(a2a, 4);  // two forward, two backward
  EXPECT_GE(switches, 3);
}

}  // namespace
}  // namespace parasol
