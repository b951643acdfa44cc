// Tests cost_models/host_cost.h: the launches of a multi-tensor apply against its limits worked
// by hand, the launches of the optimizer implementations, and what the host pays to issue an op
// eagerly, from a CUDA graph and from a compiled region, against the sum of the profile's figures.
#include "cost_models/host_cost.h"

#include <gtest/gtest.h>

#include "core/cluster.h"
#include "core/error.h"
#include "core/lower.h"
#include "core/model.h"
#include "cost_models/estimate.h"
#include "cost_models/profile.h"

namespace parasol::cost {
namespace {

TEST(MultiTensorLaunches, BlocksAndTensorLimitsOfApexMultiTensorApply) {
  // 12 tensors of 7M elements in all: 107 chunks of 65,536 fit one launch (<= 320 blocks, <= 36
  // tensors at depth 4).
  EXPECT_EQ(multi_tensor_launches(12, 7.0e6, 4), 1);
  // 321 chunks: two launches.
  EXPECT_EQ(multi_tensor_launches(1, 321.0 * 65536, 4), 2);
  // 37 tensors at depth 4 (36 per launch), 31 at depth 5 (30), 111 at depth 1 (110).
  EXPECT_EQ(multi_tensor_launches(37, 1000, 4), 2);
  EXPECT_EQ(multi_tensor_launches(31, 1000, 5), 2);
  EXPECT_EQ(multi_tensor_launches(111, 1000, 1), 2);
  EXPECT_EQ(multi_tensor_launches(110, 1000, 1), 1);
}

Op adam(int tensors, double elements) {
  Op op;
  op.kind = OpKind::kAdamW;
  op.tags.phase = Phase::kOptimizer;
  op.tensors = tensors;
  op.elements = elements;
  return op;
}

TEST(KernelLaunches, OptimizerImplementations) {
  Plan p;
  const Op op = adam(12, 7.0e6);
  p.optimizer_impl = OptimizerImpl::kFused;
  EXPECT_EQ(kernel_launches(op, p), 1);
  p.optimizer_impl = OptimizerImpl::kForLoop;
  EXPECT_EQ(kernel_launches(op, p), 9 * 12);  // _single_tensor_adamw: ~9 ops per parameter
  p.optimizer_impl = OptimizerImpl::kForeach;
  EXPECT_EQ(kernel_launches(op, p), 9);  // 9 foreach ops, each one multi-tensor launch here
}

TEST(KernelLaunches, FlashAttentionBackwardIsThreeKernels) {
  Plan p;
  Op op;
  op.kind = OpKind::kAttention;
  op.tags.phase = Phase::kForward;
  EXPECT_EQ(kernel_launches(op, p), 1);
  op.tags.phase = Phase::kBackward;
  EXPECT_EQ(kernel_launches(op, p), 3);
  p.attention_kernel = AttentionKernel::kCudnn;
  EXPECT_EQ(kernel_launches(op, p), 1);
}

TEST(HostIssueSeconds, EagerPytorchForwardBackwardAndNative) {
  const Profile f = default_profile(device_spec("H100-SXM", "device"));
  Plan p;
  Op op;
  op.kind = OpKind::kLinear;
  op.tags.phase = Phase::kForward;
  // From Python, recorded for autograd, inside an nn.Module call.
  EXPECT_DOUBLE_EQ(
      host_issue_seconds(op, p, f),
      f.host_launch_s + f.host_dispatch_s + f.host_python_s + f.host_autograd_s + f.host_module_s);
  // The autograd engine's C++ thread issues the backward.
  op.tags.phase = Phase::kBackward;
  EXPECT_DOUBLE_EQ(host_issue_seconds(op, p, f), f.host_launch_s + f.host_dispatch_s);
  // A native program launches only.
  p.host_framework = HostFramework::kNative;
  op.tags.phase = Phase::kForward;
  EXPECT_DOUBLE_EQ(host_issue_seconds(op, p, f), f.host_launch_s);
}

TEST(HostIssueSeconds, GraphsAndCompiledRegions) {
  const Profile f = default_profile(device_spec("H100-SXM", "device"));
  Plan p;
  Op op;
  op.kind = OpKind::kNorm;
  op.host_issue = HostIssue::kGraphReplay;
  EXPECT_DOUBLE_EQ(host_issue_seconds(op, p, f), f.host_graph_launch_s + f.host_python_s);
  op.host_issue = HostIssue::kInGraph;
  EXPECT_DOUBLE_EQ(host_issue_seconds(op, p, f), 0);
  op.host_issue = HostIssue::kCompiledEntry;
  EXPECT_DOUBLE_EQ(host_issue_seconds(op, p, f), f.host_compile_guard_s + f.host_launch_s);
  op.host_issue = HostIssue::kCompiled;
  EXPECT_DOUBLE_EQ(host_issue_seconds(op, p, f), f.host_launch_s);
}

TEST(HostIssueSeconds, ForLoopAdamPaysPythonPerKernel) {
  const Profile f = default_profile(device_spec("H100-SXM", "device"));
  Plan p;
  p.optimizer_impl = OptimizerImpl::kForLoop;
  const double per = f.host_launch_s + f.host_dispatch_s + f.host_python_s;
  EXPECT_NEAR(host_issue_seconds(adam(12, 7e6), p, f), 9 * 12 * per, 1e-15);
  p.optimizer_impl = OptimizerImpl::kFused;
  EXPECT_NEAR(host_issue_seconds(adam(12, 7e6), p, f),
              f.host_launch_s + f.host_dispatch_s + f.host_python_s, 1e-15);
}

// Megatron's --log-num-zeros-in-grad and --log-params-norm. count_zeros_fp32 per gradient
// tensor: count_nonzero (on CUDA `!= 0` and `.sum()`), `numel - count`, `+ total`, three Python
// calls; calc_params_l2_norm: one multi-tensor L2 norm of the tensors, multi_tensor_l2norm's
// cleanup kernel and the square, then 7 torch.zeros and 7 adds.
TEST(KernelLaunches, MegatronLoggedStatistics) {
  const Profile f = default_profile(device_spec("H100-SXM", "device"));
  Plan p;
  Op op;
  op.tags.phase = Phase::kOptimizer;
  op.tensors = 148;
  op.elements = 63e6;
  op.kind = OpKind::kCountZeros;
  EXPECT_EQ(kernel_launches(op, p), 4 * 148);
  EXPECT_NEAR(host_issue_seconds(op, p, f),
              592 * (f.host_launch_s + f.host_dispatch_s) + 3 * 148 * f.host_python_s, 1e-15);
  // 63e6 elements are 962 chunks of 65,536: 4 launches of at most 320 (148 tensors need 2 of
  // at most 110).
  op.kind = OpKind::kParamNorm;
  EXPECT_EQ(kernel_launches(op, p), 4 + 2 + 14);
  EXPECT_NEAR(host_issue_seconds(op, p, f),
              20 * (f.host_launch_s + f.host_dispatch_s) + (148 + 20) * f.host_python_s, 1e-15);
}

// GPT-2 124M on 8 H100 at a small micro-batch: the step is host-bound, and CUDA graphs remove
// most of that part.
TEST(HostEstimate, SmallModelIsHostBoundAndGraphsRemoveMostOfIt) {
  const Model m = model_preset("gpt2-124m");
  const Cluster c = cluster_preset("dgx-h100", 8);
  Plan p;
  p.dp = 8;
  p.micro_batch = 1;
  p.global_batch = 64;
  p.seq_len = 256;
  const Profile f = default_profile(c.gpu_device(0));
  const Estimate eager = estimate(m, c, p, f);
  EXPECT_GT(eager.time.host, 0.02 * eager.step_time_s);
  p.cuda_graphs = CudaGraphs::kLayers;
  const Estimate graphed = estimate(m, c, p, f);
  EXPECT_LT(graphed.time.host, 0.5 * eager.time.host);
  EXPECT_LT(graphed.step_time_s, eager.step_time_s);
  // A native program (no Python, no dispatcher) has less host time than eager PyTorch.
  p.cuda_graphs = CudaGraphs::kNone;
  p.host_framework = HostFramework::kNative;
  EXPECT_LT(estimate(m, c, p, f).time.host, eager.time.host);
}

}  // namespace
}  // namespace parasol::cost
