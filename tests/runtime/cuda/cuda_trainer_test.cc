// The Trainer and Executor on a GPU (label "gpu"): what the kernel tests cannot see. Training
// `tiny` on the CUDA backend gives the CPU backend's losses within bf16 GEMM error; the
// parameters are filled and checkpointed through host copies (no host access to device memory);
// after the first step no call synchronises the whole device (cudaMalloc, cudaMallocHost, the
// allocator's out-of-memory retry), with and without offloaded activations; a checkpoint saved
// on the GPU resumes there with the same next loss. Without a CUDA device every test is skipped
// and main returns 77 (ctest's SKIP_RETURN_CODE). Nothing here has run on a GPU yet.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <cstdio>
#include <vector>

#include "core/model.h"
#include "core/plan.h"
#include "runtime/comm/mpi_communicator.h"
#include "runtime/cpu/cpu_backend.h"
#include "runtime/cuda/cuda_backend.h"
#include "runtime/trainer.h"
#include "tests/runtime/temp_dir.h"

namespace parasol::runtime {
namespace {

Plan serial_plan() {
  Plan p;
  p.global_batch = 4;
  p.micro_batch = 2;
  p.precision = Dtype::kFp32;
  p.flash_attention = true;
  return p;
}

std::vector<double> losses(const Model& m, const Plan& p, Backend& be, int steps) {
  auto comms = make_mpi_comm_set(p, MPI_COMM_SELF);
  Trainer t(m, p, be, *comms, TrainerOptions{});
  std::vector<double> out;
  for (int i = 0; i < steps; ++i) out.push_back(t.step().loss);
  return out;
}

class CudaTrainer : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda_device_available()) GTEST_SKIP() << "no CUDA device";
  }
};

TEST_F(CudaTrainer, LossesAreTheCpuLossesWithinBf16Error) {
  const Model m = model_preset("tiny");
  const Plan p = serial_plan();
  CpuBackend cpu(1);
  CudaBackend gpu(0);
  const std::vector<double> want = losses(m, p, cpu, 3);
  const std::vector<double> got = losses(m, p, gpu, 3);
  ASSERT_EQ(got.size(), want.size());
  // bf16 tensor-core GEMMs against fp32 ones (cuda_backend.h): ~1e-2 relative per GEMM; the
  // loss averages many of them.
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 2e-2 * want[i]) << i;
  // A flash-attention plan without dropout, head dim 16: every attention call is cuDNN's fused
  // SDPA (runtime/fused_attention.h routes them all there), none falls back.
  const CudaBackend::LibraryCounts lib = gpu.library_counts();
  EXPECT_TRUE(CudaBackend::cudnn_built());
  EXPECT_GT(lib.attention_fused, 0);
  EXPECT_EQ(lib.attention_fallbacks, 0);
}

// Mixed precision on the GPU as the benchmarks run it: a bf16 plan with the vocab-tiled loss
// runs every op of the typed kinds on the CUDA backend's bf16 entries (none widened) and gives
// the CPU backend's losses of the same plan within the rounding bound of tests/runtime/
// typed_bf16_test.cc: each stored bf16 value may round to the other neighbour on the two
// backends (other fp32 summation orders and libm), one rounding of u = 2^-8 per stored output
// along a token's path: n = 2 (5 L + 1) GEMM outputs and data gradients (RoPE's store included)
// plus 6 L + 2 element-wise outputs (norms, activation, residual adds, embedding) plus 5 L of
// cuDNN's attention, which reads and writes the bf16 buffers in place (its own bf16 P and O in
// the forward, P, dS and the gradients' store in the backward: cuda_kernels_test's CudnnSdpa);
// the loss, a mean over N tokens, within lambda u sqrt(n / N) relative, lambda = 6 (Higham &
// Mary 2019). No attention operand is widened (widened_attention_bytes 0).
TEST_F(CudaTrainer, Bf16TiledLossPlanRunsTypedAndMatchesTheCpu) {
  const Model m = model_preset("tiny");
  Plan p = serial_plan();
  p.precision = Dtype::kBf16;
  p.tiled_loss = true;
  CpuBackend cpu(1);
  CudaBackend gpu(0);
  const std::vector<double> want = losses(m, p, cpu, 3);
  auto comms = make_mpi_comm_set(p, MPI_COMM_SELF);
  Trainer t(m, p, gpu, *comms, TrainerOptions{});
  std::vector<double> got;
  StepStats last;
  for (int i = 0; i < 3; ++i) got.push_back((last = t.step()).loss);
  const double n = 2.0 * (5 * m.layers + 1) + 6.0 * m.layers + 2 + 5.0 * m.layers;
  const double tokens = double(p.global_batch) * p.seq(m);
  const double tol = 6.0 / 256 * std::sqrt(n / tokens);
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], tol * want[i]) << i;
  EXPECT_GT(last.typed_bf16_ops, 0);
  EXPECT_EQ(last.widened_typed_kind_bytes, 0);
  EXPECT_EQ(last.widened_attention_bytes, 0);
  EXPECT_EQ(gpu.library_counts().attention_fallbacks, 0);
}

// The bf16 plans of the fused MLP GEMMs and of the device-routed MoE on the GPU against the CPU
// backend's (the bound of Bf16TiledLossPlanRunsTypedAndMatchesTheCpu, whose n counts every
// stored output along a token's path; the fused GEMMs store fewer): tiny-gpt with FC1's GELU in
// its cuBLASLt epilogue and GELU's derivative in FC2's data gradient (Plan::gemm_gelu_epilogue;
// epilogues fused by cuBLASLt, counted), and tiny-moe with the routing on the device and the
// grouped expert GEMMs from device offsets: no host read of the counts in a step
// (moe_count_syncs 0) and no expert GEMM falling back to the host counts.
TEST_F(CudaTrainer, Bf16GeluEpilogueAndDeviceRoutedMoeMatchTheCpu) {
  for (const char* name : {"tiny-gpt", "tiny-moe"}) {
    SCOPED_TRACE(name);
    const Model m = model_preset(name);
    Plan p = serial_plan();
    p.precision = Dtype::kBf16;
    p.tiled_loss = true;
    p.gemm_gelu_epilogue = m.activation == Activation::kGelu;
    CpuBackend cpu(1);
    CudaBackend gpu(0);
    const std::vector<double> want = losses(m, p, cpu, 3);
    auto comms = make_mpi_comm_set(p, MPI_COMM_SELF);
    Trainer t(m, p, gpu, *comms, TrainerOptions{});
    std::vector<double> got;
    StepStats last;
    for (int i = 0; i < 3; ++i) got.push_back((last = t.step()).loss);
    const double n = 2.0 * (5 * m.layers + 1) + 6.0 * m.layers + 2 + 5.0 * m.layers;
    const double tokens = double(p.global_batch) * p.seq(m);
    const double tol = 6.0 / 256 * std::sqrt(n / tokens);
    for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], tol * want[i]) << i;
    const CudaBackend::LibraryCounts lib = gpu.library_counts();
    if (p.gemm_gelu_epilogue) EXPECT_GT(lib.epilogue_fused, 0);
    EXPECT_EQ(last.moe_count_syncs, 0);
    EXPECT_EQ(lib.moe_host_fallbacks, 0);
    EXPECT_EQ(last.widened_typed_kind_bytes, 0);
  }
}

TEST_F(CudaTrainer, AStepAfterWarmUpDoesNotSynchroniseTheDevice) {
  const Model m = model_preset("tiny");
  for (bool offload : {false, true}) {
    SCOPED_TRACE(offload ? "activations offloaded" : "no offload");
    Plan p = serial_plan();
    p.offload.activations = offload;
    CudaBackend gpu(0);
    auto comms = make_mpi_comm_set(p, MPI_COMM_SELF);
    Trainer t(m, p, gpu, *comms, TrainerOptions{});
    t.step();  // warm-up: the caches fill
    const int64_t before = gpu.synchronizing_calls();
    t.step();
    t.step();
    EXPECT_EQ(gpu.synchronizing_calls(), before);
  }
}

TEST_F(CudaTrainer, ACheckpointSavedOnTheGpuResumesThere) {
  const Model m = model_preset("tiny");
  const Plan p = serial_plan();
  testing::TempDir dir;
  const std::string ckpt = dir.sub("ckpt");
  double continued = 0;
  {
    CudaBackend gpu(0);
    auto comms = make_mpi_comm_set(p, MPI_COMM_SELF);
    Trainer t(m, p, gpu, *comms, TrainerOptions{});
    t.step();
    t.save(ckpt);
    continued = t.step().loss;
  }
  CudaBackend gpu(0);
  auto comms = make_mpi_comm_set(p, MPI_COMM_SELF);
  Trainer t(m, p, gpu, *comms, TrainerOptions{});
  t.load(ckpt);
  // The kernels' reductions are deterministic (cuda_backend.h): the same step gives the same loss.
  EXPECT_DOUBLE_EQ(t.step().loss, continued);
}

}  // namespace
}  // namespace parasol::runtime

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  const bool device = parasol::runtime::cuda_device_available();
  if (!device) std::printf("cuda_trainer_test: no CUDA device; every test is skipped\n");
  const int rc = RUN_ALL_TESTS();
  MPI_Finalize();
  if (rc != 0) return rc;
  return device ? 0 : 77;
}
