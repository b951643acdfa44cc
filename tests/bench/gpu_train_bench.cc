// One training step on one GPU with the cuda backend, mixed precision as Megatron runs it (bf16
// storage, the typed bf16 entries: cuBLASLt bf16 GEMMs with fp32 accumulation and the bf16
// element-wise kernels; fp32 master weights) and the vocab-tiled loss (plan.tiled_loss: no fp32
// logits; GPT-2's GELU in FC1's cuBLASLt epilogue, plan.gemm_gelu_epilogue): gpt2-124m (batch
// 16, sequence 1024) and a ~1B-parameter Llama-style model (16 layers,
// hidden 2048, GQA 32/8, SwiGLU 5632, vocab 32000; batch 8, sequence 2048); and gpt2-124m with
// fp32 storage, the configuration of the first H200 figures (9,240 tokens/s), for comparison;
// and gpt2-124m bf16 as one CUDA graph per step (BM_Gpt2_124m_graphs: captured once, replayed;
// "graph" lines say whether the capture happened and how many steps replayed).
// Counters (read by tools/gpu-check.sh): tokens_per_s; TFLOPs (Megatron convention: 3 x forward
// FLOPs of the model); MFU against the device's dense bf16 datasheet peak (core/device.h, by the
// device name CUDA reports). After the timed steps, one traced step is broken down by op kind
// ("op-time" lines: device time per kind from the backend's marks, its share of the step's wall
// time and its TFLOP/s, and the wall time no op covers: launches, syncs, the host), which
// tools/gpu-check.sh prints under its table.
// Run by tools/gpu-check.sh; without a GPU it prints a note and exits 0.
#include <benchmark/benchmark.h>
#include <cuda_runtime.h>
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/model.h"
#include "runtime/comm/mpi_communicator.h"
#include "runtime/cuda/cuda_backend.h"
#include "runtime/trainer.h"

namespace parasol::runtime {
namespace {

// One traced step by op kind: "op-time NAME KIND ms share% TFLOP/s" per kind, largest first, and
// "op-time NAME (no op) ms share%" for the step's wall time that no op's interval covers.
void print_op_times(const std::string& name, Trainer& trainer) {
  const StepStats st = trainer.step(/*trace=*/true);
  struct Sum {
    double s = 0, flops = 0;
  };
  std::map<std::string, Sum> by_kind;
  std::vector<std::pair<double, double>> spans;
  for (const traces::TraceEvent& e : trainer.last_events()) {
    by_kind[e.kind].s += e.dur_s;
    by_kind[e.kind].flops += e.flops;
    spans.emplace_back(e.start_s, e.end_s());
  }
  std::sort(spans.begin(), spans.end());
  double covered = 0, reach = 0;
  for (const auto& [a, b] : spans) {
    if (b <= reach) continue;
    covered += b - std::max(a, reach);
    reach = b;
  }
  std::vector<std::pair<std::string, Sum>> kinds(by_kind.begin(), by_kind.end());
  std::sort(kinds.begin(), kinds.end(),
            [](const auto& a, const auto& b) { return a.second.s > b.second.s; });
  const double wall = st.seconds > 0 ? st.seconds : 1;
  for (const auto& [kind, sum] : kinds)
    std::printf("op-time %s %s %.2f %.1f%% %.1f\n", name.c_str(), kind.c_str(), 1e3 * sum.s,
                100 * sum.s / wall, sum.s > 0 ? sum.flops / sum.s / 1e12 : 0.0);
  std::printf("op-time %s (no-op) %.2f %.1f%% -\n", name.c_str(),
              1e3 * std::max(0.0, wall - covered), 100 * std::max(0.0, wall - covered) / wall);
}

// The datasheet peak of the GPU in use: H200, H100 or A100 by CUDA's device name.
double peak_flops() {
  cudaDeviceProp p{};
  cudaGetDeviceProperties(&p, 0);
  const std::string n = p.name;
  const char* dev = n.find("H200") != std::string::npos   ? "H200"
                    : n.find("H100") != std::string::npos ? "H100-SXM"
                    : n.find("A100") != std::string::npos ? "A100-80G"
                                                          : nullptr;
  return dev ? device_spec(dev).peak_bf16_flops : 0.0;
}

// graphs: the step's forward and backward captured into one CUDA graph and replayed
// (Plan::cuda_graphs full_iteration, runtime/step_graph.h), without dropout (its per-step seeds
// keep a step out of a graph) and without the loss's NaN check (a host sync inside the step).
void train_step(benchmark::State& state, const Model& m, int batch, int64_t seq,
                Dtype precision = Dtype::kBf16, bool graphs = false) {
  Plan plan;
  plan.global_batch = batch;
  plan.micro_batch = batch;
  plan.seq_len = seq;
  plan.precision = precision;
  plan.flash_attention = true;
  plan.tiled_loss = precision == Dtype::kBf16;
  // GPT-2's GELU in FC1's cuBLASLt epilogue, as llm.c runs it (Plan::gemm_gelu_epilogue).
  plan.gemm_gelu_epilogue = precision == Dtype::kBf16 && m.activation == Activation::kGelu;
  TrainerOptions options;
  if (graphs) {
    plan.cuda_graphs = CudaGraphs::kFullIteration;
    plan.nan_check = false;
    options.dropout_p = 0;
  }
  auto comms = make_mpi_comm_set(plan, MPI_COMM_SELF);
  CudaBackend backend(0);
  Trainer trainer(m, plan, backend, *comms, options);
  StepStats first = trainer.step();  // warm-up: the caching allocator fills
  // Graphs: the warm-up, then the capture (recorded, then launched), before the timed replays.
  for (int i = 0; graphs && i < 2 && first.graph_action != "capture"; ++i) first = trainer.step();
  double seconds = 0;
  int64_t steps = 0, replays = 0, host_reads = 0;
  std::string reason;
  for (auto _ : state) {
    StepStats s = trainer.step();
    seconds += s.seconds;
    ++steps;
    replays += s.graph_action == "replay" ? 1 : 0;
    host_reads += std::max<int64_t>(0, s.step_host_reads);
    if (reason.empty()) reason = s.graph_reason;
  }
  // Steps replayed from the captured graph, and device-to-host copies while the steps' ops ran.
  state.counters["graph_replays"] = static_cast<double>(replays);
  state.counters["step_host_reads"] = static_cast<double>(host_reads);
  if (graphs)
    std::printf("graph %s capture %s, %lld of %lld timed steps replayed%s%s\n", m.name.c_str(),
                first.graph_action == "capture" ? "done" : "NOT done",
                static_cast<long long>(replays), static_cast<long long>(steps),
                reason.empty() ? "" : "; eager because: ", reason.c_str());
  const double tokens = double(batch) * seq * steps;
  const double flops = flops_per_token(m, seq).model * tokens;
  state.counters["tokens_per_s"] = tokens / seconds;
  state.counters["TFLOPs"] = flops / seconds / 1e12;
  const double peak = peak_flops();
  if (peak > 0) state.counters["MFU"] = flops / seconds / peak;
  state.counters["peak_GiB"] = static_cast<double>(backend.device_memory().peak_total) / (1 << 30);
  // The libraries' paths over warm-up and the steps (cuda_backend.h): attention calls run by
  // cuDNN's fused SDPA and by parasol's own kernel (a fallback, logged), GEMM calls cuBLASLt had
  // no bf16 algorithm for.
  const CudaBackend::LibraryCounts lib = backend.library_counts();
  state.counters["attention_fused"] = static_cast<double>(lib.attention_fused);
  state.counters["attention_fallbacks"] = static_cast<double>(lib.attention_fallbacks);
  state.counters["gemm_fp32_fallbacks"] = static_cast<double>(lib.gemm_fp32_fallbacks);
  state.counters["epilogue_fused"] = static_cast<double>(lib.epilogue_fused);
  state.counters["epilogue_fallbacks"] = static_cast<double>(lib.epilogue_fallbacks);
  // Ops of a step on the typed bf16 entries, and the bytes the others widened into fp32 (of
  // which attention's: 0 on a bf16 plan, whose flash attention runs on the bf16 buffers).
  const StepStats last = trainer.step();
  state.counters["typed_ops"] = static_cast<double>(last.typed_bf16_ops);
  state.counters["widened_MiB"] = static_cast<double>(last.widened_bytes) / (1 << 20);
  state.counters["widened_attention_MiB"] =
      static_cast<double>(last.widened_attention_bytes) / (1 << 20);
  if (!graphs) print_op_times(m.name, trainer);  // (a traced step runs eagerly)
}

void BM_Gpt2_124m(benchmark::State& state) {
  train_step(state, model_preset("gpt2-124m"), 16, 1024);
}
// A fixed number of steps: Google Benchmark then calls the function once, so the model is built
// and initialised once (with a minimum time it calls it again per trial, rebuilding the Trainer
// each time, which on a 1B model costs more than the steps measured).
BENCHMARK(BM_Gpt2_124m)->Unit(benchmark::kMillisecond)->Iterations(10)->UseRealTime();

// The same step captured once and replayed (no dropout): the launches and host work of ~200
// kernels a step leave the step's critical path.
void BM_Gpt2_124m_graphs(benchmark::State& state) {
  train_step(state, model_preset("gpt2-124m"), 16, 1024, Dtype::kBf16, /*graphs=*/true);
}
BENCHMARK(BM_Gpt2_124m_graphs)->Unit(benchmark::kMillisecond)->Iterations(10)->UseRealTime();

void BM_Gpt2_124m_fp32(benchmark::State& state) {
  train_step(state, model_preset("gpt2-124m"), 16, 1024, Dtype::kFp32);
}
BENCHMARK(BM_Gpt2_124m_fp32)->Unit(benchmark::kMillisecond)->Iterations(5)->UseRealTime();

void BM_Llama_1b(benchmark::State& state) {
  train_step(state, llama_model("llama-1b", 16, 2048, 32, 8, 5632, 32000, 2048), 8, 2048);
}
BENCHMARK(BM_Llama_1b)->Unit(benchmark::kMillisecond)->Iterations(4)->UseRealTime();

}  // namespace
}  // namespace parasol::runtime

int main(int argc, char** argv) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("gpu_train_bench: no CUDA device; nothing to measure\n");
    return 0;
  }
  MPI_Init(&argc, &argv);
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  MPI_Finalize();
  return 0;
}
