// Tests of the typed roles of ops and buffers (core/program.h) that the lowering sets and the
// runtime dispatches on: every op a role names is the op it says (its kind, phase and buffers),
// the attention ops find each of their buffers by role exactly once, the micro-batch inputs and
// the expert regions are marked, host and device copies keep their role; and program_to_json
// carries the roles.
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "core/lower.h"
#include "core/program.h"
#include "tests/core/test_models.h"

namespace parasol {
namespace {

Plan make_plan(int tp, int dp, int cp, int ep) {
  Plan p;
  p.tp = tp;
  p.dp = dp;
  p.cp = cp;
  p.ep = ep;
  p.global_batch = 2 * dp;
  p.micro_batch = 1;
  return p;
}

int with_role(const Program& p, const std::vector<int>& ids, BufferRole r) {
  int n = 0;
  for (int id : ids) n += p.buffers[id].role == r ? 1 : 0;
  return n;
}

int ops_with(const Program& p, OpRole r) {
  int n = 0;
  for (const Op& op : p.ops) n += op.role == r ? 1 : 0;
  return n;
}

// The invariants the runtime relies on, over every op of `p`.
void expect_roles_consistent(const Program& p) {
  for (const Op& op : p.ops) {
    SCOPED_TRACE(op.name);
    const bool bwd = op.tags.phase == Phase::kBackward;
    switch (op.role) {
      case OpRole::kWeightGrad:
      case OpRole::kRouterDw:
        EXPECT_TRUE(op.kind == OpKind::kLinear || op.kind == OpKind::kExpertLinear);
        EXPECT_TRUE(bwd);
        EXPECT_FALSE(op.backward_data);
        break;
      case OpRole::kQkv:
      case OpRole::kRouter:
      case OpRole::kHead:
        EXPECT_EQ(op.kind, OpKind::kLinear);
        EXPECT_FALSE(bwd);
        break;
      case OpRole::kQkvDx:
        EXPECT_EQ(op.kind, OpKind::kLinear);
        EXPECT_TRUE(op.backward_data);
        EXPECT_EQ(with_role(p, op.reads, BufferRole::kQkvGrad), 1);
        break;
      case OpRole::kDispatchA2a:
      case OpRole::kCombineA2a:
        EXPECT_EQ(op.kind, OpKind::kAllToAll);
        break;
      case OpRole::kDispatchGather:
        EXPECT_EQ(op.kind, OpKind::kAllGather);
        break;
      case OpRole::kXentMax:
        EXPECT_EQ(op.kind, OpKind::kCrossEntropy);
        break;
      case OpRole::kExpertAct:
        EXPECT_EQ(op.kind, OpKind::kActivation);
        break;
      case OpRole::kFp8Amax:
      case OpRole::kExpertFp8Amax:
        EXPECT_EQ(op.kind, OpKind::kCast);
        EXPECT_TRUE(op.writes.empty());
        break;
      case OpRole::kNone:
        break;
      default:  // the residual-add roles
        EXPECT_EQ(op.kind, OpKind::kResidualAdd);
    }
    // Every all-to-all is an exchange of the dispatch or the combine.
    if (op.kind == OpKind::kAllToAll) {
      EXPECT_TRUE(op.role == OpRole::kDispatchA2a || op.role == OpRole::kCombineA2a);
    }
    if (op.kind == OpKind::kAttention) {
      EXPECT_EQ(with_role(p, op.reads, BufferRole::kQkv), 1);
      EXPECT_LE(with_role(p, op.reads, BufferRole::kKvChunk), 1);
      if (!bwd) {
        const int out = with_role(p, op.writes, BufferRole::kAttnOut);
        const int stats = with_role(p, op.writes, BufferRole::kAttnLse) +
                          with_role(p, op.writes, BufferRole::kAttnProbs);
        EXPECT_LE(out, 1);
        EXPECT_LE(stats, 1);
        EXPECT_GE(out + stats, 1);
      } else {
        EXPECT_EQ(with_role(p, op.reads, BufferRole::kAttnOut), 1);
        EXPECT_EQ(with_role(p, op.reads, BufferRole::kAttnOutGrad), 1);
        EXPECT_EQ(with_role(p, op.writes, BufferRole::kQkvGrad), 1);
        EXPECT_LE(with_role(p, op.writes, BufferRole::kKvGrad), 1);
      }
    }
    if (op.kind == OpKind::kEmbedding) {
      EXPECT_EQ(with_role(p, op.reads, BufferRole::kTokens), 1);
    }
    if (op.kind == OpKind::kCrossEntropy && op.role != OpRole::kXentMax &&
        op.role != OpRole::kXentUnfused) {
      EXPECT_EQ(with_role(p, op.reads, BufferRole::kLabels), 1);
    }
    // Host and device copies of saved activations keep the role of what they copy.
    const bool copy = op.kind == OpKind::kOffload || op.kind == OpKind::kPrefetch;
    for (size_t i = 0; copy && op.reads.size() == op.writes.size() && i < op.reads.size(); ++i) {
      if (p.buffers[op.reads[i]].cls == BufferClass::kActivation) {
        EXPECT_EQ(p.buffers[op.reads[i]].role, p.buffers[op.writes[i]].role);
      }
    }
  }
}

TEST(LowerRoles, DenseModels) {
  Model gpt = test_models::tiny_gpt();
  gpt.tied_embeddings = true;
  for (const Model& m : {gpt, test_models::tiny_mla(), test_models::tiny_windowed()}) {
    SCOPED_TRACE(m.name);
    for (Plan p : {make_plan(1, 1, 1, 1), make_plan(2, 1, 2, 1)}) {
      const Program prog = lower_stage(m, p, 0);
      expect_roles_consistent(prog);
      const int layers = m.layers;
      // Per layer and micro-batch (2): one weight gradient per weight GEMM.
      EXPECT_EQ(ops_with(prog, OpRole::kAttnResidual), 2 * 2 * layers);
      EXPECT_EQ(ops_with(prog, OpRole::kMlpResidual), 2 * 2 * layers);
      EXPECT_EQ(ops_with(prog, OpRole::kXentMax), 2);
      EXPECT_EQ(ops_with(prog, OpRole::kHead), 2);
      if (m.mla.enabled()) {
        EXPECT_EQ(ops_with(prog, OpRole::kQkvPack), 2 * layers);
        EXPECT_EQ(ops_with(prog, OpRole::kQkvUnpack), 2 * layers);
        EXPECT_EQ(ops_with(prog, OpRole::kQkv), 0);
      } else {
        EXPECT_EQ(ops_with(prog, OpRole::kQkv), 2 * layers);
        EXPECT_EQ(ops_with(prog, OpRole::kQkvDx), 2 * layers);
      }
      if (p.cp > 1) {
        EXPECT_GT(ops_with(prog, OpRole::kDkvFold), 0);
      }
      int tables = 0;
      for (const Buffer& b : prog.buffers) tables += b.role == BufferRole::kEmbeddingTable;
      EXPECT_GE(tables, 2);  // its weights and gradients
    }
  }
}

TEST(LowerRoles, MixtureOfExperts) {
  const Model m = test_models::tiny_shared();
  Plan p = make_plan(1, 2, 1, 2);
  Program prog = lower_stage(m, p, 0);
  expect_roles_consistent(prog);
  EXPECT_GT(ops_with(prog, OpRole::kRouter), 0);
  EXPECT_EQ(ops_with(prog, OpRole::kRouter), ops_with(prog, OpRole::kRouterDw));
  EXPECT_GT(ops_with(prog, OpRole::kDispatchA2a), 0);
  EXPECT_EQ(ops_with(prog, OpRole::kDispatchA2a), ops_with(prog, OpRole::kCombineA2a));
  EXPECT_GT(ops_with(prog, OpRole::kSum), 0);  // routed + shared experts
  EXPECT_GT(ops_with(prog, OpRole::kExpertAct), 0);
  // The expert GEMMs read and write the expert region.
  for (const Op& op : prog.ops)
    if (op.kind == OpKind::kExpertLinear) {
      SCOPED_TRACE(op.name);
      EXPECT_EQ(prog.buffers[op.writes[0]].role == BufferRole::kExpertRows,
                op.role != OpRole::kWeightGrad);
    }
  // The routed rows gathered over tp under SP: their counts are traded first.
  p = make_plan(2, 1, 1, 1);
  p.sequence_parallel = true;
  prog = lower_stage(m, p, 0);
  expect_roles_consistent(prog);
  EXPECT_GT(ops_with(prog, OpRole::kDispatchGather), 0);
}

TEST(LowerRoles, RecomputeAndOffloadKeepRoles) {
  const Model m = test_models::tiny_gpt();
  Plan p = make_plan(1, 2, 1, 1);
  p.flash_attention = false;
  p.recompute = Recompute::kSelective;
  expect_roles_consistent(lower_stage(m, p, 0));
  p.recompute = Recompute::kFull;
  expect_roles_consistent(lower_stage(m, p, 0));
  p.recompute = Recompute::kNone;
  p.offload.activations = true;
  const Program prog = lower_stage(m, p, 0);
  expect_roles_consistent(prog);
  int host_qkv = 0;
  for (const Buffer& b : prog.buffers) host_qkv += b.host && b.role == BufferRole::kQkv;
  EXPECT_GT(host_qkv, 0);
}

TEST(ProgramJson, CarriesRoles) {
  const Program prog = lower_stage(test_models::tiny_gpt(), make_plan(1, 1, 1, 1), 0);
  const Json j = program_to_json(prog);
  std::set<std::string> op_roles, buffer_roles;
  for (size_t i = 0; i < prog.ops.size(); ++i) {
    const Json& o = j.at("ops").at(i);
    EXPECT_EQ(o.contains("role"), prog.ops[i].role != OpRole::kNone);
    if (o.contains("role")) {
      EXPECT_EQ(o.at("role").get<std::string>(), op_role_name(prog.ops[i].role));
      op_roles.insert(o.at("role").get<std::string>());
    }
  }
  for (size_t i = 0; i < prog.buffers.size(); ++i) {
    const Json& b = j.at("buffers").at(i);
    EXPECT_EQ(b.contains("role"), prog.buffers[i].role != BufferRole::kNone);
    if (b.contains("role")) buffer_roles.insert(b.at("role").get<std::string>());
  }
  for (const char* r : {"qkv", "weight-grad", "head", "xent-max", "attn-residual"})
    EXPECT_TRUE(op_roles.count(r)) << r;
  for (const char* r : {"tokens", "labels", "qkv", "attn-out", "embedding-table"})
    EXPECT_TRUE(buffer_roles.count(r)) << r;
}

TEST(ProgramJson, RoleNamesAreDistinct) {
  std::set<std::string> ops, buffers;
  for (int r = 0; r <= static_cast<int>(OpRole::kLoraDropout); ++r)
    ops.insert(op_role_name(static_cast<OpRole>(r)));
  for (int r = 0; r <= static_cast<int>(BufferRole::kExpertRows); ++r)
    buffers.insert(buffer_role_name(static_cast<BufferRole>(r)));
  EXPECT_EQ(ops.size(), static_cast<size_t>(OpRole::kLoraDropout) + 1);
  EXPECT_EQ(buffers.size(), static_cast<size_t>(BufferRole::kExpertRows) + 1);
  EXPECT_FALSE(ops.count("?"));
  EXPECT_FALSE(buffers.count("?"));
}

}  // namespace
}  // namespace parasol
