// Benchmarks of the CPU backend: the machine's cblas_sgemm rate at transformer GEMM sizes (the
// baseline the runtime's GEMM-bound kernels are judged against), and the achieved rate of the
// linear and attention kernels at gpt2-124m sizes (hidden 768, 12 heads of 64, ffn 3072, batch 4,
// sequence 64, so T = 256 token rows), plus the bandwidth of the memory-bound norm and gelu.
// Run: build/tests/bench/cpu_kernels_bench   (OPENBLAS_NUM_THREADS sets the GEMM threads;
// figures are counters: GFLOP/s = 1e9 FLOP/s, GB/s = 1e9 bytes/s, over wall-clock time, since
// OpenBLAS computes on threads of its own).
#include <benchmark/benchmark.h>
#include <cblas.h>

#include <random>
#include <vector>

#include "runtime/cpu/cpu_backend.h"

using namespace parasol;
using namespace parasol::runtime;

namespace {

CpuBackend& backend() {
  static CpuBackend b;
  return b;
}

std::vector<float> randn(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

void set_flops(benchmark::State& state, double flops_per_iter) {
  state.counters["GFLOP/s"] =
      benchmark::Counter(flops_per_iter * state.iterations() / 1e9, benchmark::Counter::kIsRate);
  state.counters["threads"] = openblas_get_num_threads();
}

// cblas_sgemm itself, row-major C[M x N] = A[M x K] B[K x N].
void BM_Sgemm(benchmark::State& state) {
  const int M = static_cast<int>(state.range(0)), N = static_cast<int>(state.range(1)),
            K = static_cast<int>(state.range(2));
  std::vector<float> a = randn(int64_t{M} * K, 1), b = randn(int64_t{K} * N, 2), c(int64_t{M} * N);
  for (auto _ : state) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, N, K, 1.0f, a.data(), K, b.data(), N,
                0.0f, c.data(), N);
    benchmark::DoNotOptimize(c.data());
  }
  set_flops(state, 2.0 * M * N * K);
}
BENCHMARK(BM_Sgemm)
    ->Args({768, 3072, 256})  // a gpt2 weight gradient: [768 x 3072] over 256 tokens
    ->Args({256, 3072, 768})  // fc1 forward
    ->Args({256, 768, 3072})  // fc2 forward
    ->Args({1024, 1024, 1024})
    ->ArgNames({"M", "N", "K"})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

constexpr int64_t kT = 4 * 64, kC = 768;

// The linear kernels at the gpt2 layer's GEMMs: out = in[T x k] W[k x n] (+ bias);
// mode 0 forward, 1 data gradient, 2 weight (and bias) gradient.
void BM_Linear(benchmark::State& state) {
  const int64_t n = state.range(0), k = state.range(1), mode = state.range(2);
  std::vector<float> in = randn(kT * k, 3), w = randn(k * n, 4), b = randn(n, 5),
                     out = randn(kT * n, 6), din(kT * k), dw(k * n, 0.0f), db(n, 0.0f);
  for (auto _ : state) {
    if (mode == 0)
      backend().linear_forward(out.data(), in.data(), w.data(), WeightLayout::kInOut, b.data(), kT,
                               n, k);
    else if (mode == 1)
      backend().linear_backward_data(din.data(), out.data(), w.data(), WeightLayout::kInOut, kT, n,
                                     k, false);
    else
      backend().linear_backward_weight(dw.data(), db.data(), in.data(), out.data(),
                                       WeightLayout::kInOut, kT, n, k);
    benchmark::ClobberMemory();
  }
  set_flops(state, 2.0 * kT * n * k);
}
BENCHMARK(BM_Linear)
    ->ArgsProduct({{3 * kC}, {kC}, {0, 1, 2}})  // qkv
    ->ArgsProduct({{kC}, {kC}, {0, 1, 2}})      // attention out-projection
    ->ArgsProduct({{4 * kC}, {kC}, {0, 1, 2}})  // fc1
    ->ArgsProduct({{kC}, {4 * kC}, {0, 1, 2}})  // fc2
    ->ArgNames({"n", "k", "fwd0_data1_weight2"})
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

// Causal attention, 12 heads of 64, batch 4, from a fused QKV buffer. FLOPs counted as core/lower
// counts a causal flash op: forward 4 B H S^2 D (1 + 1/S) / 2, backward 2.5 times that.
void BM_Attention(benchmark::State& state) {
  const int64_t S = state.range(0), backward = state.range(1);
  const int64_t B = 4, H = 12, D = 64, W = 3 * H * D;
  AttentionDims d;
  d.batch = B;
  d.seq_q = d.seq_kv = S;
  d.heads = d.kv_heads = H;
  d.head_dim = D;
  d.ld_q = d.ld_kv = W;
  d.ld_o = H * D;
  std::vector<float> qkv = randn(B * S * W, 7), out(B * S * H * D), lse(B * H * S),
                     dout = randn(B * S * H * D, 8), dqkv(B * S * W);
  const float* q = qkv.data();
  const float* k = q + H * D;
  const float* v = k + H * D;
  backend().attention_forward(d, out.data(), lse.data(), nullptr, q, k, v, false);
  for (auto _ : state) {
    if (backward)
      backend().attention_backward(d, dqkv.data(), dqkv.data() + H * D, dqkv.data() + 2 * H * D,
                                   dout.data(), q, k, v, out.data(), lse.data(), nullptr, false,
                                   false);
    else
      backend().attention_forward(d, out.data(), lse.data(), nullptr, q, k, v, false);
    benchmark::ClobberMemory();
  }
  const double fwd = 4.0 * B * H * double(S) * S * D * 0.5 * (1.0 + 1.0 / S);
  set_flops(state, backward ? 2.5 * fwd : fwd);
}
BENCHMARK(BM_Attention)
    ->ArgsProduct({{64, 1024}, {0, 1}})
    ->ArgNames({"seq", "backward"})
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

// Memory-bound kernels over [T x 768] (norm) and [T x 3072] (gelu): bytes read plus written.
void BM_LayerNorm(benchmark::State& state) {
  const bool backward = state.range(0) != 0;
  std::vector<float> x = randn(kT * kC, 9), w = randn(2 * kC, 10), out(kT * kC),
                     dout = randn(kT * kC, 11), dx(kT * kC), dw(2 * kC, 0.0f);
  for (auto _ : state) {
    if (backward)
      backend().norm_backward(Norm::kLayerNorm, dx.data(), dw.data(), dw.data() + kC, dout.data(),
                              x.data(), w.data(), nullptr, kT, kC, 1e-5f);
    else
      backend().norm_forward(Norm::kLayerNorm, out.data(), x.data(), w.data(), w.data() + kC, kT,
                             kC, 1e-5f);
    benchmark::ClobberMemory();
  }
  const double bytes = (backward ? 3.0 : 2.0) * kT * kC * sizeof(float);
  state.counters["GB/s"] =
      benchmark::Counter(bytes * state.iterations() / 1e9, benchmark::Counter::kIsRate);
}
BENCHMARK(BM_LayerNorm)->Arg(0)->Arg(1)->ArgName("backward")->Unit(benchmark::kMicrosecond);

void BM_Gelu(benchmark::State& state) {
  const bool backward = state.range(0) != 0;
  const int64_t n = kT * 4 * kC;
  std::vector<float> x = randn(n, 12), out(n), dout = randn(n, 13);
  for (auto _ : state) {
    if (backward)
      backend().activation_backward(Activation::kGelu, out.data(), dout.data(), x.data(), kT,
                                    4 * kC);
    else
      backend().activation_forward(Activation::kGelu, out.data(), x.data(), kT, 4 * kC);
    benchmark::ClobberMemory();
  }
  const double bytes = (backward ? 3.0 : 2.0) * n * sizeof(float);
  state.counters["GB/s"] =
      benchmark::Counter(bytes * state.iterations() / 1e9, benchmark::Counter::kIsRate);
}
BENCHMARK(BM_Gelu)->Arg(0)->Arg(1)->ArgName("backward")->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
