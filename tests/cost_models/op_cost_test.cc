// Tests of the op pricer (cost_models/op_cost.h) on the rules the closed form shares with it:
// a GEMM's epilogue (RoPE) priced as a memory-bound kernel of its own, fp8 quantisation of the
// forward and data-gradient operands but not of the router or the output layer, and the bytes
// an expert all-to-all puts on the wire by its role and phase (DeepEP's fp8 dispatch).
#include "cost_models/op_cost.h"

#include <gtest/gtest.h>

#include <vector>

#include "core/cluster.h"
#include "core/model.h"
#include "core/plan.h"
#include "core/rank_layout.h"
#include "cost_models/collective.h"
#include "cost_models/compute.h"
#include "cost_models/moe_dispatch.h"
#include "cost_models/profile.h"

namespace parasol::cost {
namespace {

struct Priced {
  Model model = model_preset("mixtral-8x7b");
  Plan plan;
  Cluster cluster;
  Profile profile;
  RankLayout layout;
  std::vector<int> reps{0};
  PlacementCache places;
  OpPricer pricer;
  explicit Priced(Plan p)
      : plan(p),
        cluster(cluster_preset("dgx-h100", p.gpus())),
        profile(default_profile(cluster.gpu_device(0))),
        layout(p),
        places(cluster),
        pricer(model, cluster, plan, profile, layout, reps, places) {}
  const DeviceSpec& dev() const { return cluster.gpu_device(0); }
};

Op linear(int layer, Phase phase, bool data, OpRole role = OpRole::kNone) {
  Op op;
  op.kind = OpKind::kLinear;
  op.role = role;
  op.m = 4096, op.n = 6144, op.k = 4096;
  op.tags.layer = layer;
  op.tags.phase = phase;
  op.backward_data = data;
  return op;
}

TEST(OpPricer, LinearsByPassWithTheirEpilogue) {
  Plan p;
  p.dp = 8, p.ep = 8, p.precision = Dtype::kFp8, p.global_batch = 8;
  Priced x(p);
  const DeviceSpec& d = x.dev();
  auto want = [&](Dtype dt, GemmPass pass, bool router) {
    return linear_gemm_time(d, x.profile, dt, 4096, 6144, 4096, 1, pass, router);
  };
  EXPECT_DOUBLE_EQ(x.pricer.time(linear(0, Phase::kForward, false), 0, false),
                   want(Dtype::kFp8, GemmPass::kForward, false));
  EXPECT_DOUBLE_EQ(x.pricer.time(linear(0, Phase::kRecompute, false), 0, false),
                   want(Dtype::kFp8, GemmPass::kForward, false));
  EXPECT_DOUBLE_EQ(x.pricer.time(linear(0, Phase::kBackward, true), 0, false),
                   want(Dtype::kFp8, GemmPass::kDataGrad, false));
  EXPECT_DOUBLE_EQ(x.pricer.time(linear(0, Phase::kBackward, false), 0, false),
                   want(Dtype::kFp8, GemmPass::kWeightGrad, false));
  // The router (a linear by role) and the output layer (outside the layers) skip fp8.
  EXPECT_DOUBLE_EQ(x.pricer.time(linear(0, Phase::kForward, false, OpRole::kRouter), 0, false),
                   want(Dtype::kFp8, GemmPass::kForward, true));
  EXPECT_DOUBLE_EQ(x.pricer.time(linear(-1, Phase::kForward, false, OpRole::kHead), 0, false),
                   want(Dtype::kBf16, GemmPass::kForward, false));
  // RoPE as the QKV projection's epilogue.
  Op qkv = linear(1, Phase::kForward, false, OpRole::kQkv);
  qkv.epilogue_bytes = 3e8;
  EXPECT_DOUBLE_EQ(x.pricer.time(qkv, 0, false),
                   want(Dtype::kFp8, GemmPass::kForward, false) + memory_time(d, x.profile, 3e8));
}

// The router's kernels after its GEMM (core/moe_load.h router_kernels): the route op's bytes at
// the device's memory efficiency, and each of its kernels after the first one more gap.
TEST(OpPricer, TheRouteOpPaysEachOfItsKernels) {
  Plan p;
  p.dp = 8, p.ep = 8, p.global_batch = 8;
  Priced x(p);
  Op op;
  op.kind = OpKind::kRouter;
  op.tags.layer = 0;
  op.elements = 4096.0 * 8;
  op.bytes = 48.0 * op.elements;
  op.tensors = 6;
  EXPECT_DOUBLE_EQ(x.pricer.time(op, 0, false),
                   memory_time(x.dev(), x.profile, op.bytes) + 5 * x.profile.kernel_overhead_s);
  op.tensors = 1;
  EXPECT_DOUBLE_EQ(x.pricer.time(op, 0, false), memory_time(x.dev(), x.profile, op.bytes));
}

// Transformer Engine's fp8 current-scaling amax op (OpRole::kFp8Amax, kExpertFp8Amax): a read of
// the bf16 operand and two kernels (amax, scale) per quantised tensor on the device, those
// launches on the host (TE's C++ quantizer, inside the module's call); its tensors are in the
// price key, and the busiest rank's load scales it.
TEST(OpPricer, Fp8AmaxReadsTheOperandWithTwoKernelsATensor) {
  Plan p;
  p.dp = 8, p.ep = 8, p.global_batch = 8, p.precision = Dtype::kFp8;
  p.fp8_recipe = Fp8Recipe::kTensorwise;
  p.transformer_impl = TransformerImpl::kTransformerEngine;
  Priced x(p);
  Op op;
  op.kind = OpKind::kCast;
  op.role = OpRole::kExpertFp8Amax;
  op.tags.layer = 0;
  op.elements = 4096.0 * 2048;
  op.bytes = 2 * op.elements;
  op.tensors = 16;
  EXPECT_DOUBLE_EQ(x.pricer.time(op, 0, false),
                   small_kernels_time(x.dev(), x.profile, op.bytes, 32));
  EXPECT_DOUBLE_EQ(x.pricer.host_time(op), 32 * x.profile.host_launch_s);
  op.tensors = 1;
  op.role = OpRole::kFp8Amax;
  EXPECT_DOUBLE_EQ(x.pricer.time(op, 0, false),
                   small_kernels_time(x.dev(), x.profile, op.bytes, 2));
  EXPECT_DOUBLE_EQ(x.pricer.host_time(op), 2 * x.profile.host_launch_s);
  op.load = 1.5;
  EXPECT_DOUBLE_EQ(x.pricer.time(op, 0, false),
                   1.5 * small_kernels_time(x.dev(), x.profile, op.bytes, 2));
}

// An expert GEMM (grouped over the local experts, Op::batch): one grouped kernel by default; under
// Transformer Engine's layer spec, TE's per-expert GEMMs in rounds of its 4 streams.
TEST(OpPricer, ExpertGemmsAsTransformerEngineRunsThem) {
  Plan p;
  p.dp = 8, p.ep = 8, p.global_batch = 8;
  Op op = linear(0, Phase::kForward, false);
  op.kind = OpKind::kExpertLinear;
  op.m = 1024, op.n = 28672, op.k = 4096, op.batch = 6;
  {
    Priced x(p);
    EXPECT_DOUBLE_EQ(x.pricer.time(op, 0, false),
                     linear_gemm_time(x.dev(), x.profile, Dtype::kBf16, 1024, 28672, 4096, 6,
                                      GemmPass::kForward, false));
  }
  p.transformer_impl = TransformerImpl::kTransformerEngine;
  Priced x(p);
  EXPECT_DOUBLE_EQ(x.pricer.time(op, 0, false),
                   multi_stream_expert_gemm_time(x.dev(), x.profile, Dtype::kBf16, 1024, 28672,
                                                 4096, 6, GemmPass::kForward));
}

TEST(OpPricer, ExpertAllToAllsMoveTheirWireBytes) {
  Plan p;
  p.dp = 16, p.ep = 16, p.precision = Dtype::kFp8, p.global_batch = 16;
  p.moe_dispatcher = MoeDispatcher::kDeepEp;
  p.fp8_dispatch = true;  // DeepSeek's fp8 dispatch: the forward dispatch moves fp8 rows
  Priced x(p);
  // The one expert group spans all 16 GPUs of two servers: nothing runs concurrently with it.
  ASSERT_EQ(x.layout.groups(Group::kEp).size(), 1u);
  const GroupModel ep(x.cluster, x.profile, x.layout.group(Group::kEp, 0), {}, true);
  ASSERT_EQ(ep.nodes(), 2);
  auto a2a = [](OpRole role, Phase phase) {
    Op op;
    op.kind = OpKind::kAllToAll;
    op.group = Group::kEp;
    op.role = role;
    op.bytes = 64e6;
    op.tags.layer = 0;
    op.tags.phase = phase;
    return op;
  };
  auto want = [&](bool dispatch) {
    return expert_exchange_time(ep, x.profile,
                                expert_all_to_all_wire_bytes(x.model, p, 2, 64e6, dispatch),
                                p.moe_dispatcher);
  };
  const double fwd_dispatch = x.pricer.time(a2a(OpRole::kDispatchA2a, Phase::kForward), 0, false);
  EXPECT_DOUBLE_EQ(fwd_dispatch, want(true));
  EXPECT_DOUBLE_EQ(x.pricer.time(a2a(OpRole::kDispatchA2a, Phase::kRecompute), 0, false),
                   want(true));
  for (auto [role, phase] : {std::pair{OpRole::kCombineA2a, Phase::kForward},
                             {OpRole::kDispatchA2a, Phase::kBackward},
                             {OpRole::kCombineA2a, Phase::kBackward}})
    EXPECT_DOUBLE_EQ(x.pricer.time(a2a(role, phase), 0, false), want(false));
  EXPECT_LT(fwd_dispatch, want(false));
}

}  // namespace
}  // namespace parasol::cost
