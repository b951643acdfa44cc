// One training step of gpt2-124m (batch 4, sequence 64, fp32) on one rank of the CPU runtime,
// the configuration of Karpathy's llm.c CPU trainer (train_gpt2.c), against the machine's own
// cblas_sgemm rate measured in the same process (BM_SgemmBaseline, a GEMM of the model's FC1
// shape). Counters: steps/s; GFLOP/s of the step (Megatron convention: 3 x forward FLOPs, with
// the attention term at sequence 64); sgemm_fraction = that rate / the sgemm baseline's.
// BM_Gpt2TrainStepPrecision: the same step (flash attention) in fp32 and in mixed precision
// (bf16 storage, fp32 math and master weights) side by side: s/step, the step's peak device
// memory (the Program's buffers at their stored dtype, MiB) and the peak of the fp32 operands
// widened for the kernels (Backend::widened_memory, MiB).
//   build/tests/bench/train_step_bench [--benchmark_filter=Precision]
#include <benchmark/benchmark.h>
#include <cblas.h>
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include "core/model.h"
#include "runtime/comm/mpi_communicator.h"
#include "runtime/cpu/cpu_backend.h"
#include "runtime/trainer.h"

namespace parasol::runtime {
namespace {

constexpr int kBatch = 4, kSeq = 64;
double g_sgemm_gflops = 0;

void BM_SgemmBaseline(benchmark::State& state) {
  const int M = kBatch * kSeq, N = 3072, K = 768;
  std::vector<float> a(size_t{M} * K, 0.5f), b(size_t{K} * N, 0.25f), c(size_t{M} * N);
  double seconds = 0;
  int64_t runs = 0;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, N, K, 1.0f, a.data(), K, b.data(), N,
                0.0f, c.data(), N);
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ++runs;
    benchmark::DoNotOptimize(c.data());
  }
  g_sgemm_gflops = 2.0 * M * N * K * runs / seconds / 1e9;
  state.counters["GFLOP/s"] = g_sgemm_gflops;
}
BENCHMARK(BM_SgemmBaseline)->Unit(benchmark::kMillisecond)->MinTime(1.0);

void BM_Gpt2TrainStep(benchmark::State& state) {
  const Model m = model_preset("gpt2-124m");
  Plan plan;
  plan.global_batch = kBatch;
  plan.micro_batch = kBatch;
  plan.seq_len = kSeq;
  plan.precision = Dtype::kFp32;
  plan.flash_attention = state.range(0) != 0;
  auto comms = make_mpi_comm_set(plan, MPI_COMM_SELF);
  CpuBackend backend(0);
  Trainer trainer(m, plan, backend, *comms, TrainerOptions{});
  trainer.step();  // warm-up: first touches of the memory
  double seconds = 0;
  int64_t steps = 0;
  for (auto _ : state) {
    StepStats s = trainer.step();
    seconds += s.seconds;
    ++steps;
  }
  const double flops = flops_per_token(m, kSeq).model * kBatch * kSeq;
  const double gflops = flops * steps / seconds / 1e9;
  state.counters["steps/s"] = steps / seconds;
  state.counters["s/step"] = seconds / steps;
  state.counters["GFLOP/s"] = gflops;
  if (g_sgemm_gflops > 0) state.counters["sgemm_fraction"] = gflops / g_sgemm_gflops;
}
BENCHMARK(BM_Gpt2TrainStep)
    ->Arg(1)
    ->Arg(0)
    ->ArgName("flash")
    ->Unit(benchmark::kMillisecond)
    ->MinTime(5.0)
    ->UseRealTime();

void BM_Gpt2TrainStepPrecision(benchmark::State& state) {
  const Model m = model_preset("gpt2-124m");
  Plan plan;
  plan.global_batch = kBatch;
  plan.micro_batch = kBatch;
  plan.seq_len = kSeq;
  plan.precision = state.range(0) != 0 ? Dtype::kBf16 : Dtype::kFp32;
  plan.flash_attention = true;
  auto comms = make_mpi_comm_set(plan, MPI_COMM_SELF);
  CpuBackend backend(0);
  Trainer trainer(m, plan, backend, *comms, TrainerOptions{});
  trainer.step();  // warm-up: first touches of the memory
  double seconds = 0;
  int64_t steps = 0, peak = 0;
  for (auto _ : state) {
    StepStats s = trainer.step();
    seconds += s.seconds;
    peak = std::max(peak, s.peak_bytes);
    ++steps;
  }
  state.SetLabel(dtype_name(plan.precision));
  state.counters["s/step"] = seconds / steps;
  state.counters["peak_MiB"] = static_cast<double>(peak) / (1 << 20);
  state.counters["widened_MiB"] =
      static_cast<double>(backend.widened_memory().peak_total) / (1 << 20);
}
BENCHMARK(BM_Gpt2TrainStepPrecision)
    ->Arg(0)
    ->Arg(1)
    ->ArgName("bf16")
    ->Unit(benchmark::kMillisecond)
    ->MinTime(5.0)
    ->UseRealTime();

}  // namespace
}  // namespace parasol::runtime

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  MPI_Finalize();
  return 0;
}
