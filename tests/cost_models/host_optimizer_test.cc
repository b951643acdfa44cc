// Tests cost_models/host_optimizer.h: the CPU optimizer step of an offloaded optimizer, worked by
// hand from the DGX A100's host (two EPYC 7742 sockets of 8 DDR4-3200 channels, 204.8 GB/s each)
// for torch's fused CPU AdamW and from the per-core rate for DeepSpeedCPUAdam; the closed form
// and the simulator's host AdamW op both read it; the plan switch parses, round-trips and
// refuses what it cannot price.
#include "cost_models/host_optimizer.h"

#include <gtest/gtest.h>

#include <vector>

#include "core/cluster.h"
#include "core/error.h"
#include "core/model.h"
#include "core/plan.h"
#include "core/rank_layout.h"
#include "cost_models/collective.h"
#include "cost_models/estimate.h"
#include "cost_models/op_cost.h"
#include "cost_models/profile.h"

namespace parasol::cost {
namespace {

constexpr double kGB = 1e9;

TEST(HostOptimizer, ServerHostMemoryBandwidthIsItsSocketsTogether) {
  const Cluster a100 = cluster_preset("dgx-a100-80g", 16);
  EXPECT_DOUBLE_EQ(server_host_memory_bandwidth(a100, 0), 2 * 204.8 * kGB);
  EXPECT_DOUBLE_EQ(server_host_memory_bandwidth(a100, 15), 2 * 204.8 * kGB);
  // The one-GPU box gives no host memory bandwidth.
  EXPECT_DOUBLE_EQ(server_host_memory_bandwidth(cluster_preset("h200-1", 1), 0), 0);
}

TEST(HostOptimizer, TorchFusedAdamIsOnePassBoundByTheHostsMemory) {
  const Cluster c = cluster_preset("dgx-a100-80g", 8);
  Profile f = default_profile(c.gpu_device(0));
  f.host_memory_efficiency = 0.73;
  Plan p;
  p.offload.optimizer = true;
  p.cpu_optimizer = CpuOptimizer::kTorch;
  p.optimizer_dtype = Dtype::kBf16;
  // Llama 3.1 70B's 70.55e9 parameters over 8 GPUs: each process steps 8.82e9 of them, 7
  // accesses of 2 bytes each, while the 8 processes share 409.6 GB/s x 0.73.
  const double params = 70.55e9 / 8;
  const double per_gpu_bw = 409.6 * kGB * 0.73 / 8;
  EXPECT_NEAR(host_optimizer_seconds(c, f, p, params), params * 14 / per_gpu_bw, 1e-9);
  EXPECT_NEAR(host_optimizer_seconds(c, f, p, params), 3.30, 0.01);
  // fp32 state (Megatron's master weights, FSDP with an fp32 parameter): twice the bytes.
  p.optimizer_dtype = Dtype::kFp32;
  EXPECT_NEAR(host_optimizer_seconds(c, f, p, params), 2 * 3.30, 0.02);
  // Memory-bound: half the memory efficiency, twice the time.
  Profile slow = f;
  slow.host_memory_efficiency = f.host_memory_efficiency / 2;
  EXPECT_NEAR(host_optimizer_seconds(c, slow, p, params),
              2 * host_optimizer_seconds(c, f, p, params), 1e-9);
  // The per-core rate is DeepSpeed's, not torch's.
  slow = f;
  slow.host_adam_params_per_s *= 10;
  EXPECT_DOUBLE_EQ(host_optimizer_seconds(c, slow, p, params),
                   host_optimizer_seconds(c, f, p, params));
}

// torch.optim's foreach and for-loop AdamW on CPU tensors: eight elementwise ops, 20 accesses an
// element by hand (mul_ 2, lerp_ 3, mul_ 2, addcmul_ 3, sqrt 2, division 2, add_ 2, addcdiv_ 4;
// torch/optim/adamw.py), against the fused kernel's 7, over the same host memory.
TEST(HostOptimizer, TorchUnfusedAdamIsEightPassesBoundByTheHostsMemory) {
  const Cluster c = cluster_preset("dgx-a100-80g", 8);
  Profile f = default_profile(c.gpu_device(0));
  f.host_memory_efficiency = 0.73;
  Plan p;
  p.offload.optimizer = true;
  p.cpu_optimizer = CpuOptimizer::kTorch;
  p.optimizer_dtype = Dtype::kBf16;
  const double params = 70.55e9 / 8;
  const double per_gpu_bw = 409.6 * kGB * 0.73 / 8;
  const double fused = host_optimizer_seconds(c, f, p, params);
  for (OptimizerImpl impl : {OptimizerImpl::kForeach, OptimizerImpl::kForLoop}) {
    p.optimizer_impl = impl;
    EXPECT_DOUBLE_EQ(torch_cpu_adam_accesses(impl), 2 + 3 + 2 + 3 + 2 + 2 + 2 + 4);
    EXPECT_NEAR(host_optimizer_seconds(c, f, p, params), params * 20 * 2 / per_gpu_bw, 1e-9);
    EXPECT_NEAR(host_optimizer_seconds(c, f, p, params) / fused, 20.0 / 7, 1e-9);
  }
  // The fused kernel's single pass.
  EXPECT_DOUBLE_EQ(torch_cpu_adam_accesses(OptimizerImpl::kFused), 7);
  // DeepSpeedCPUAdam is one implementation: optimizer_impl does not change it.
  p.cpu_optimizer = CpuOptimizer::kDeepSpeed;
  const double ds = host_optimizer_seconds(c, f, p, params);
  p.optimizer_impl = OptimizerImpl::kFused;
  EXPECT_DOUBLE_EQ(host_optimizer_seconds(c, f, p, params), ds);
}

TEST(HostOptimizer, DeepSpeedCpuAdamRunsAtItsRatePerCoreSharedByTheServersGpus) {
  const Cluster c = cluster_preset("dgx-a100-80g", 8);
  const Profile f = default_profile(c.gpu_device(0));
  Plan p;
  p.offload.optimizer = true;
  const double params = 1e9;
  EXPECT_DOUBLE_EQ(host_optimizer_seconds(c, f, p, params),
                   params / (f.host_adam_params_per_s / 8));
  // Independent of the host's memory.
  Profile g = f;
  g.host_memory_efficiency /= 2;
  EXPECT_DOUBLE_EQ(host_optimizer_seconds(c, g, p, params),
                   host_optimizer_seconds(c, f, p, params));
}

TEST(HostOptimizer, TorchOnAHostWithoutMemoryBandwidthTakesThePerCoreRate) {
  const Cluster c = cluster_preset("h200-1", 1);
  const Profile f = default_profile(c.gpu_device(0));
  Plan p;
  p.offload.optimizer = true;
  p.cpu_optimizer = CpuOptimizer::kTorch;
  EXPECT_DOUBLE_EQ(host_optimizer_seconds(c, f, p, 1e9), 1e9 / f.host_adam_params_per_s);
}

// The closed form's offload term moves by exactly the two optimizers' difference on this
// rank's shard; the simulator's host AdamW op is priced by the same function.
TEST(HostOptimizer, TheClosedFormAndTheSimulatorsHostAdamReadIt) {
  const Model m = model_preset("llama3-8b");
  const Cluster c = cluster_preset("dgx-a100-80g", 8);
  const Profile f = default_profile(c.gpu_device(0));
  Plan p;
  p.dp = 8;
  p.zero = 3;
  p.micro_batch = 1;
  p.global_batch = 8;
  p.recompute = Recompute::kFull;
  p.offload.optimizer = true;
  p.offload.params = true;
  p.optimizer_dtype = Dtype::kBf16;
  Plan torch = p;
  torch.cpu_optimizer = CpuOptimizer::kTorch;
  validate(p, m, c);
  validate(torch, m, c);
  const Estimate ds = estimate(m, c, p, f);
  const Estimate tt = estimate(m, c, torch, f);
  const double shard = static_cast<double>(param_counts(m).total) / 8;
  const double want =
      host_optimizer_seconds(c, f, p, shard) - host_optimizer_seconds(c, f, torch, shard);
  EXPECT_GT(want, 0);
  EXPECT_NEAR(ds.time.offload - tt.time.offload, want, 1e-3 * want);

  const RankLayout layout(torch);
  const std::vector<int> reps{0};
  PlacementCache places(c);
  OpPricer pricer(m, c, torch, f, layout, reps, places);
  Op op;
  op.kind = OpKind::kAdamW;
  op.tags.phase = Phase::kOptimizer;
  op.elements = 1e9;
  EXPECT_DOUBLE_EQ(pricer.time(op, 0, true), host_optimizer_seconds(c, f, torch, 1e9));
}

TEST(HostOptimizer, PlanSwitchParsesRoundTripsAndRefusesWhatItCannotPrice) {
  const Plan p = plan_from_json(
      Json{{"dp", 8}, {"zero", 3}, {"offload", "optimizer,params"}, {"cpu_optimizer", "torch"}});
  EXPECT_EQ(p.cpu_optimizer, CpuOptimizer::kTorch);
  EXPECT_EQ(plan_from_json(plan_to_json(p)).cpu_optimizer, CpuOptimizer::kTorch);
  EXPECT_EQ(plan_from_json(Json{{"dp", 8}}).cpu_optimizer, CpuOptimizer::kDeepSpeed);
  try {
    plan_from_json(Json{{"dp", 8}, {"cpu_optimizer", "adam"}});
    FAIL() << "an unknown cpu_optimizer parsed";
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "plan.cpu_optimizer");
  }
  // torch's CPU optimizer without fused=True (its for-loop, torch's default on CPU tensors, or
  // foreach) validates: it is priced by its passes (HostOptimizer.TorchUnfusedAdamIs...).
  Plan loop = p;
  loop.optimizer_impl = OptimizerImpl::kForLoop;
  const Model m = model_preset("llama3-8b");
  const Cluster c = cluster_preset("dgx-a100-80g", 8);
  validate(loop, m, c);
  EXPECT_EQ(plan_from_json(plan_to_json(loop)).optimizer_impl, OptimizerImpl::kForLoop);
}

}  // namespace
}  // namespace parasol::cost
