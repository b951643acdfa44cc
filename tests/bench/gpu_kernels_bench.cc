// The CUDA backend's kernels on bf16 storage, each timed alone at a 1B-Llama layer's shapes
// (tokens 8 x 2048, hidden 2048, GQA 32/8 heads of 64, SwiGLU 5632, vocab 32000): bandwidth-bound
// kernels in GB/s against the device's HBM bandwidth, GEMMs in TFLOP/s against its dense bf16
// peak (core/device.h, by the device name CUDA reports). Counters: GBps / TFLOPs, of_peak (a
// fraction). Each benchmark also prints "kernel-rate NAME VALUE UNIT PERCENT" for
// tools/gpu-check.sh's table. Bytes are those the kernel must move at least (every input read
// once, every output written once), so of_peak is a lower bound of its bandwidth efficiency.
// Without a GPU it prints a note and exits 0.
#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "core/device.h"
#include "runtime/cuda/cuda_backend.h"
#include "runtime/cuda/kernels.h"
#include "runtime/tensor.h"

namespace parasol::runtime {
namespace {

constexpr int64_t kTokens = 8 * 2048, kHidden = 2048, kHeads = 32, kKvHeads = 8, kHeadDim = 64,
                  kFfn = 5632, kVocab = 32000;

const DeviceSpec* spec() {
  static const DeviceSpec* s = []() -> const DeviceSpec* {
    cudaDeviceProp p{};
    cudaGetDeviceProperties(&p, 0);
    const std::string n = p.name;
    const char* dev = n.find("H200") != std::string::npos   ? "H200"
                      : n.find("H100") != std::string::npos ? "H100-SXM"
                      : n.find("A100") != std::string::npos ? "A100-80G"
                                                            : nullptr;
    return dev ? &device_spec(dev) : nullptr;
  }();
  return s;
}

CudaBackend& dev() {
  static CudaBackend b(0);
  return b;
}

// A device buffer of n bf16 values uniform in [-1, 1] (freed at exit).
uint16_t* bf16_buffer(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<uint16_t> h(static_cast<size_t>(n));
  for (auto& x : h) x = fp32_to_bf16(u(rng));
  auto* d = static_cast<uint16_t*>(dev().alloc(h.size() * 2, BufferClass::kActivation));
  dev().copy(d, h.data(), h.size() * 2);
  return d;
}
template <typename T>
T* zeros(int64_t n) {
  auto* d = static_cast<T*>(dev().alloc(sizeof(T) * n, BufferClass::kWorkspace));
  dev().zero(d, sizeof(T) * n);
  return d;
}

// Seconds per call of f on the compute stream (CUDA events; one warm-up call).
double time_calls(benchmark::State& state, const std::function<void()>& f) {
  f();
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  double total = 0;
  int64_t calls = 0;
  for (auto _ : state) {
    cudaEventRecord(a, dev().stream());
    for (int i = 0; i < 10; ++i) f();
    cudaEventRecord(b, dev().stream());
    cudaEventSynchronize(b);
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    state.SetIterationTime(ms / 1e3);
    total += ms / 1e3;
    calls += 10;
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return total / static_cast<double>(calls);
}

void report_bytes(benchmark::State& state, const char* name, double bytes, double s) {
  const double bw = bytes / s;
  state.counters["GBps"] = bw / 1e9;
  const double peak = spec() ? spec()->hbm_bw : 0.0;
  if (peak > 0) state.counters["of_peak"] = bw / peak;
  std::printf("kernel-rate %s %.0f GB/s %.1f%%\n", name, bw / 1e9, peak > 0 ? 100 * bw / peak : 0);
}
void report_flops(benchmark::State& state, const char* name, double flops, double s) {
  const double r = flops / s;
  state.counters["TFLOPs"] = r / 1e12;
  const double peak = spec() ? spec()->peak_bf16_flops : 0.0;
  if (peak > 0) state.counters["of_peak"] = r / peak;
  std::printf("kernel-rate %s %.1f TFLOP/s %.1f%%\n", name, r / 1e12,
              peak > 0 ? 100 * r / peak : 0);
}

void BM_XentTiled(benchmark::State& state) {
  uint16_t* logits = bf16_buffer(kTokens * kVocab, 1);
  std::vector<int32_t> lab(kTokens);
  for (int64_t t = 0; t < kTokens; ++t) lab[t] = static_cast<int32_t>((t * 7919) % kVocab);
  auto* labels = zeros<int32_t>(kTokens);
  dev().copy(labels, lab.data(), lab.size() * 4);
  float *mx = zeros<float>(kTokens), *se = zeros<float>(kTokens), *tg = zeros<float>(kTokens);
  const double s = time_calls(state, [&] {
    dev().xent_tiled_forward(mx, se, tg, logits, Dtype::kBf16, labels, kTokens, kVocab, 0);
    dev().xent_tiled_backward(logits, logits, Dtype::kBf16, mx, se, labels, kTokens, kVocab, 0,
                              1e-6f);
  });
  report_bytes(state, "xent_tiled_fwd+bwd", 3.0 * kTokens * kVocab * 2, s);
}

void BM_NormFusedAdd(benchmark::State& state) {
  uint16_t *x = bf16_buffer(kTokens * kHidden, 2), *y = bf16_buffer(kTokens * kHidden, 3),
           *w = bf16_buffer(kHidden, 4), *out = zeros<uint16_t>(kTokens * kHidden),
           *sum = zeros<uint16_t>(kTokens * kHidden);
  const double s = time_calls(state, [&] {
    cuda::norm_forward_bf16(false, out, sum, x, y, w, nullptr, kTokens, kHidden, 1e-5f,
                            dev().stream());
  });
  report_bytes(state, "rmsnorm_add_fwd", 4.0 * kTokens * kHidden * 2, s);
}

void BM_NormBackward(benchmark::State& state) {
  uint16_t *x = bf16_buffer(kTokens * kHidden, 5), *g = bf16_buffer(kTokens * kHidden, 6),
           *w = bf16_buffer(kHidden, 7), *dx = bf16_buffer(kTokens * kHidden, 8);
  float* dw = zeros<float>(kHidden);
  float* scratch = zeros<float>(cuda::norm_backward_bf16_scratch(kTokens, kHidden));
  const double s = time_calls(state, [&] {
    cuda::norm_backward_bf16(false, dx, dw, nullptr, g, x, w, dx, kTokens, kHidden, 1e-5f, scratch,
                             dev().stream());
  });
  report_bytes(state, "rmsnorm_bwd", 4.0 * kTokens * kHidden * 2, s);
}

void BM_Rope(benchmark::State& state) {
  const int64_t ld = (kHeads + 2 * kKvHeads) * kHeadDim;
  uint16_t* qkv = bf16_buffer(kTokens * ld, 9);
  const double s = time_calls(state, [&] {
    cuda::rope_bf16(qkv, ld, kTokens, 2048, 0, kHeads + kKvHeads, kHeadDim, 500000.0, false,
                    dev().stream());
  });
  report_bytes(state, "rope_qk", 2.0 * kTokens * (kHeads + kKvHeads) * kHeadDim * 2, s);
}

void BM_Swiglu(benchmark::State& state) {
  uint16_t *in = bf16_buffer(kTokens * 2 * kFfn, 10), *out = zeros<uint16_t>(kTokens * kFfn),
           *d = bf16_buffer(kTokens * kFfn, 11), *din = zeros<uint16_t>(kTokens * 2 * kFfn);
  const double s = time_calls(state, [&] {
    cuda::swiglu_forward_bf16(out, in, kTokens, kFfn, dev().stream());
    cuda::swiglu_backward_bf16(din, d, in, kTokens, kFfn, dev().stream());
  });
  report_bytes(state, "swiglu_fwd+bwd", (3.0 + 5.0) * kTokens * kFfn * 2, s);
}

void BM_GemmBf16(benchmark::State& state) {
  // The MLP's up projection (gate | up, with bias: the epilogue) and its two backward GEMMs.
  const int64_t m = kTokens, n = 2 * kFfn, k = kHidden;
  uint16_t *in = bf16_buffer(m * k, 12), *w = bf16_buffer(k * n, 13), *b = bf16_buffer(n, 14),
           *out = zeros<uint16_t>(m * n), *din = zeros<uint16_t>(m * k);
  float *dw = zeros<float>(k * n), *db = zeros<float>(n);
  const double s = time_calls(state, [&] {
    dev().linear_forward_bf16(out, in, w, WeightLayout::kInOut, b, nullptr, m, n, k);
    dev().linear_backward_data_bf16(din, out, w, WeightLayout::kInOut, nullptr, nullptr, m, n, k,
                                    false);
    dev().linear_backward_weight_bf16(dw, Dtype::kFp32, db, in, out, WeightLayout::kInOut, m, n, k);
  });
  report_flops(state, "gemm_bf16_mlp_up_fwd+bwd", 3 * 2.0 * m * n * k, s);
  const auto lib = dev().library_counts();
  state.counters["epilogue_fused"] = static_cast<double>(lib.epilogue_fused);
  state.counters["epilogue_fallbacks"] = static_cast<double>(lib.epilogue_fallbacks);
}

void BM_MoePermutationDevice(benchmark::State& state) {
  const int64_t n = kTokens * 2, experts = 64;
  std::vector<int32_t> idx(n);
  for (int64_t i = 0; i < n; ++i) idx[i] = static_cast<int32_t>((i * 2654435761u) % experts);
  auto* d_idx = zeros<int32_t>(n);
  dev().copy(d_idx, idx.data(), n * 4);
  int32_t *rows = zeros<int32_t>(n), *counts = zeros<int32_t>(experts),
          *offsets = zeros<int32_t>(experts + 1), *bad = zeros<int32_t>(1),
          *scratch = zeros<int32_t>(cuda::moe_permutation_device_scratch(n, experts));
  const double s = time_calls(state, [&] {
    cuda::moe_permutation_device(rows, counts, offsets, bad, d_idx, n, experts, scratch,
                                 dev().stream());
  });
  state.counters["us"] = s * 1e6;
  std::printf("kernel-rate moe_permutation_device %.1f us -\n", s * 1e6);
}

void BM_GroupedGemmDevice(benchmark::State& state) {
  // 8 experts of an MoE MLP's up projection (top-2 of the tokens, hidden 2048, expert ffn 1408,
  // gate | up): the rows split evenly, their offsets on the device.
  const int64_t experts = 8, rows = 2 * kTokens, n = 2 * 1408, k = kHidden;
  std::vector<int32_t> off(experts + 1);
  for (int64_t e = 0; e <= experts; ++e) off[e] = static_cast<int32_t>(rows * e / experts);
  auto* d_off = zeros<int32_t>(experts + 1);
  dev().copy(d_off, off.data(), off.size() * 4);
  uint16_t *in = bf16_buffer(rows * k, 15), *w = bf16_buffer(experts * k * n, 16),
           *out = zeros<uint16_t>(rows * n);
  const double s = time_calls(state, [&] {
    cuda::grouped_gemm_bf16(out, in, w, nullptr, d_off, experts, rows, n, k, false, dev().stream());
  });
  report_flops(state, "grouped_gemm_bf16_device_offsets", 2.0 * rows * n * k, s);
}

BENCHMARK(BM_XentTiled)->UseManualTime()->Iterations(5)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_NormFusedAdd)->UseManualTime()->Iterations(5)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_NormBackward)->UseManualTime()->Iterations(5)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Rope)->UseManualTime()->Iterations(5)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Swiglu)->UseManualTime()->Iterations(5)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_GemmBf16)->UseManualTime()->Iterations(5)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_GroupedGemmDevice)->UseManualTime()->Iterations(5)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_MoePermutationDevice)->UseManualTime()->Iterations(5)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace parasol::runtime

int main(int argc, char** argv) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("gpu_kernels_bench: no CUDA device; nothing to measure\n");
    return 0;
  }
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
