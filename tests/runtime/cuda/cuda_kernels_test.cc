// The CUDA backend against the CPU backend: every kernel entry of runtime/cuda/cuda_backend.h run
// on both backends with the same random inputs, the results compared with a stated tolerance:
//   kGemmTol  = 1e-2 norm-wise relative (bf16 tensor-core GEMMs vs OpenBLAS fp32);
//   kEltTol   = 1e-5 relative + 1e-6 absolute per element (fp32 element-wise kernels);
//   kRedTol   = 1e-5 norm-wise relative (fp32 kernels with reductions in another order);
//   exact     = bit-equal (dropout masks, top-k indices, permutations, casts).
// Without a CUDA device every test is skipped (GTEST_SKIP) and main returns kNoDeviceExit, which
// the ctest registration (SKIP_RETURN_CODE) counts as skipped.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <vector>

#include "core/error.h"
#include "runtime/cpu/cpu_backend.h"
#include "runtime/cuda/cuda_backend.h"
#include "runtime/fused_attention.h"
#include "runtime/tensor.h"
#include "tests/runtime/cpu/kernel_test_util.h"

namespace parasol::runtime::test {
namespace {

constexpr int kNoDeviceExit = 77;
constexpr double kGemmTol = 1e-2;
constexpr double kEltTol = 1e-5, kEltAtol = 1e-6;
constexpr double kRedTol = 1e-5;

CudaBackend& gpu() {
  static CudaBackend b(0);
  return b;
}

enum class Side { kCpu, kGpu };

// The same buffer on both backends (same initial contents).
template <typename T>
struct Twin {
  T* c = nullptr;
  T* g = nullptr;
  size_t n = 0;
  T* operator()(Side s) const { return s == Side::kCpu ? c : g; }
};

class CudaKernels : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda_device_available()) GTEST_SKIP() << "no CUDA device";
  }
  void TearDown() override {
    for (auto& f : frees_) f();
    frees_.clear();
  }

  template <typename T>
  Twin<T> twin(const std::vector<T>& init) {
    Twin<T> t;
    t.n = init.size();
    const size_t bytes = sizeof(T) * std::max<size_t>(init.size(), 1);
    t.c = static_cast<T*>(cpu().alloc(bytes, BufferClass::kActivation));
    t.g = static_cast<T*>(gpu().alloc(bytes, BufferClass::kActivation));
    if (!init.empty()) {
      cpu().copy(t.c, init.data(), sizeof(T) * init.size());
      gpu().copy(t.g, init.data(), sizeof(T) * init.size());
    }
    frees_.push_back([t] {
      cpu().free(t.c);
      gpu().free(t.g);
    });
    return t;
  }
  template <typename T = float>
  Twin<T> twin(size_t n, T fill = T{}) {
    return twin(std::vector<T>(n, fill));
  }

  template <typename F>
  void both(F f) {
    f(static_cast<Backend&>(cpu()), Side::kCpu);
    f(static_cast<Backend&>(gpu()), Side::kGpu);
    gpu().synchronize();
  }

  template <typename T>
  std::vector<T> host(const Twin<T>& t, Side s) {
    std::vector<T> v(t.n);
    if (t.n == 0) return v;
    if (s == Side::kCpu)
      std::memcpy(v.data(), t.c, sizeof(T) * t.n);
    else
      gpu().copy(v.data(), t.g, sizeof(T) * t.n);
    return v;
  }

  // GPU result against the CPU result.
  ::testing::AssertionResult norm_close(const Twin<float>& t, double rtol,
                                        const std::string& what) {
    return near_normwise(host(t, Side::kGpu), to_double(host(t, Side::kCpu)), rtol, what);
  }
  ::testing::AssertionResult elt_close(const Twin<float>& t, const std::string& what) {
    const auto g = host(t, Side::kGpu);
    return near_elementwise(g.data(), to_double(host(t, Side::kCpu)), kEltTol, kEltAtol, what);
  }
  template <typename T>
  ::testing::AssertionResult exact(const Twin<T>& t, const std::string& what) {
    const auto c = host(t, Side::kCpu), g = host(t, Side::kGpu);
    for (size_t i = 0; i < c.size(); ++i)
      if (std::memcmp(&c[i], &g[i], sizeof(T)) != 0)
        return ::testing::AssertionFailure() << what << "[" << i << "] differs";
    return ::testing::AssertionSuccess();
  }

  std::vector<std::function<void()>> frees_;
};

std::vector<int32_t> random_ints(int64_t n, int32_t lo, int32_t hi, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> u(lo, hi);
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (auto& x : v) x = u(rng);
  return v;
}

// ---- Memory, copies, streams.

TEST_F(CudaKernels, CachingAllocatorReusesBlocksAndCounts) {
  CudaBackend& b = gpu();
  b.synchronize();
  const int64_t live0 = b.device_memory().live_total;
  void* p = b.alloc(1000, BufferClass::kWorkspace);
  EXPECT_EQ(b.device_memory().live_total, live0 + 1000);
  b.free(p);
  EXPECT_EQ(b.device_memory().live_total, live0);
  const int64_t mallocs = b.cuda_malloc_calls();
  void* q = b.alloc(900, BufferClass::kActivation);  // same size class
  EXPECT_EQ(q, p);
  EXPECT_EQ(b.cuda_malloc_calls(), mallocs);
  b.free(q);
  EXPECT_GT(b.cached_bytes(), 0);
  EXPECT_THROW(b.free(reinterpret_cast<void*>(0x1234)), ::parasol::Error);
}

TEST_F(CudaKernels, CopyZeroAndPinnedHost) {
  const auto x = random_floats(1000, 1);
  CudaBackend& b = gpu();
  auto* d1 = static_cast<float*>(b.alloc(4000, BufferClass::kActivation));
  auto* d2 = static_cast<float*>(b.alloc(4000, BufferClass::kActivation));
  auto* h = static_cast<float*>(b.alloc_host(4000, BufferClass::kOptimizer));
  EXPECT_EQ(b.host_memory().live_total, 4000);
  b.copy(d1, x.data(), 4000);
  b.copy(d2, d1, 4000);
  b.copy(h, d2, 4000);
  EXPECT_EQ(std::memcmp(h, x.data(), 4000), 0);
  b.zero(d2, 4000);
  std::vector<float> back(1000, 1.0f);
  b.copy(back.data(), d2, 4000);
  for (float v : back) ASSERT_EQ(v, 0.0f);
  cudaEvent_t e;
  ASSERT_EQ(cudaEventCreate(&e), cudaSuccess);
  b.record(e);
  b.wait(e);
  b.synchronize();
  cudaEventDestroy(e);
  b.free(d1);
  b.free(d2);
  b.free_host(h);
}

TEST_F(CudaKernels, GemmAllTransposesAndStrides) {
  const int64_t m = 37, n = 53, k = 71;
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      const int64_t lda = (ta ? m : k) + 3, ldb = (tb ? k : n) + 1, ldc = n + 5;
      auto a = twin(random_floats((ta ? k : m) * lda, 2));
      auto bb = twin(random_floats((tb ? n : k) * ldb, 3));
      auto c = twin(random_floats(m * ldc, 4));
      ::parasol::runtime::cpu::sgemm(ta, tb, m, n, k, 0.5f, a.c, lda, bb.c, ldb, 0.75f, c.c, ldc);
      gpu().gemm(ta, tb, m, n, k, 0.5f, a.g, lda, bb.g, ldb, 0.75f, c.g, ldc);
      EXPECT_TRUE(norm_close(c, kGemmTol, "gemm"));
    }
}

// Every GEMM call is counted: on bf16 tensor cores, or as an fp32 fallback (also logged).
TEST_F(CudaKernels, GemmCallsAreCountedByPath) {
  const CudaBackend::LibraryCounts before = gpu().library_counts();
  const int64_t m = 64, n = 96, k = 128;
  auto a = twin(random_floats(m * k, 5));
  auto bb = twin(random_floats(k * n, 6));
  auto c = twin<float>(m * n);
  for (int i = 0; i < 3; ++i)
    gpu().gemm(false, false, m, n, k, 1.0f, a.g, k, bb.g, n, 0.0f, c.g, n);
  const CudaBackend::LibraryCounts after = gpu().library_counts();
  EXPECT_EQ((after.gemm_bf16 - before.gemm_bf16) +
                (after.gemm_fp32_fallbacks - before.gemm_fp32_fallbacks),
            3);
  // Aligned, tensor-core-sized operands: cuBLASLt has bf16 algorithms for them on sm_80 / sm_90.
  EXPECT_EQ(after.gemm_fp32_fallbacks, before.gemm_fp32_fallbacks);
}

// ---- Embedding.

TEST_F(CudaKernels, Embedding) {
  const int64_t batch = 3, seq = 7, rows = batch * seq, cols = 33, vocab_rows = 20;
  auto tokens = twin(random_ints(rows, 0, 45, 5));
  auto table = twin(random_floats(vocab_rows * cols, 6));
  auto pos = twin(random_floats((seq + 2) * cols, 7));
  auto out = twin<float>(rows * cols);
  both([&](Backend& b, Side s) {
    b.embedding_forward(out(s), tokens(s), table(s), 10, vocab_rows, pos(s), 2, rows, seq, cols);
  });
  EXPECT_TRUE(elt_close(out, "embedding out"));
  auto dout = twin(random_floats(rows * cols, 8));
  auto dtable = twin(random_floats(vocab_rows * cols, 9));
  auto dpos = twin(random_floats((seq + 2) * cols, 10));
  both([&](Backend& b, Side s) {
    b.embedding_backward(dtable(s), dpos(s), dout(s), tokens(s), 10, vocab_rows, 2, rows, seq,
                         cols);
  });
  EXPECT_TRUE(norm_close(dtable, kRedTol, "dtable"));
  EXPECT_TRUE(norm_close(dpos, kRedTol, "dpos"));
}

// ---- Norm.

TEST_F(CudaKernels, Norms) {
  const int64_t rows = 19;
  for (int64_t cols : {48, 700})
    for (Norm kind : {Norm::kLayerNorm, Norm::kRmsNorm}) {
      auto x = twin(random_floats(rows * cols, 11, -2.0f, 3.0f));
      auto w = twin(random_floats(cols, 12));
      auto bias = twin(random_floats(cols, 13));
      auto out = twin<float>(rows * cols);
      both([&](Backend& b, Side s) {
        b.norm_forward(kind, out(s), x(s), w(s), bias(s), rows, cols, 1e-5f);
      });
      EXPECT_TRUE(norm_close(out, kRedTol, "norm out"));
      auto dout = twin(random_floats(rows * cols, 14));
      auto dx = twin(random_floats(rows * cols, 15));  // also the residual gradient (aliased)
      auto dw = twin(random_floats(cols, 16));
      auto db = twin(random_floats(cols, 17));
      both([&](Backend& b, Side s) {
        b.norm_backward(kind, dx(s), dw(s), db(s), dout(s), x(s), w(s), dx(s), rows, cols, 1e-5f);
      });
      EXPECT_TRUE(norm_close(dx, kRedTol, "norm dx"));
      EXPECT_TRUE(norm_close(dw, kRedTol, "norm dweight"));
      EXPECT_TRUE(norm_close(db, kRedTol, "norm dbias"));
    }
}

// ---- Linear, bias, experts.

TEST_F(CudaKernels, Linear) {
  const int64_t m = 45, n = 40, k = 72;
  for (WeightLayout layout : {WeightLayout::kInOut, WeightLayout::kOutIn}) {
    auto in = twin(random_floats(m * k, 20));
    auto w = twin(random_floats(k * n, 21));
    auto bias = twin(random_floats(n, 22));
    auto out = twin<float>(m * n);
    both([&](Backend& b, Side s) {
      b.linear_forward(out(s), in(s), w(s), layout, bias(s), m, n, k);
    });
    EXPECT_TRUE(norm_close(out, kGemmTol, "linear out"));
    auto dout = twin(random_floats(m * n, 23));
    auto din = twin(random_floats(m * k, 24));
    both([&](Backend& b, Side s) {
      b.linear_backward_data(din(s), dout(s), w(s), layout, m, n, k, true);
    });
    EXPECT_TRUE(norm_close(din, kGemmTol, "linear din"));
    auto dw = twin(random_floats(k * n, 25));
    auto db = twin(random_floats(n, 26));
    both([&](Backend& b, Side s) {
      b.linear_backward_weight(dw(s), db(s), in(s), dout(s), layout, m, n, k);
    });
    EXPECT_TRUE(norm_close(dw, kGemmTol, "linear dw"));
    EXPECT_TRUE(norm_close(db, kRedTol, "linear dbias"));
  }
  auto x = twin(random_floats(m * n, 27));
  auto bias = twin(random_floats(n, 28));
  auto db = twin(random_floats(n, 29));
  both([&](Backend& b, Side s) {
    b.bias_forward(x(s), bias(s), m, n);
    b.bias_backward(db(s), x(s), m, n);
  });
  EXPECT_TRUE(elt_close(x, "bias out"));
  EXPECT_TRUE(norm_close(db, kRedTol, "bias dbias"));
}

TEST_F(CudaKernels, ExpertLinear) {
  const int64_t experts = 4, n = 24, k = 40;
  const std::vector<int64_t> counts = {5, 0, 17, 9};
  const int64_t rows = 31;
  auto in = twin(random_floats(rows * k, 30));
  auto w = twin(random_floats(experts * k * n, 31));
  auto bias = twin(random_floats(experts * n, 32));
  auto out = twin<float>(rows * n);
  both([&](Backend& b, Side s) {
    b.expert_linear_forward(out(s), in(s), w(s), bias(s), counts.data(), experts, n, k);
  });
  EXPECT_TRUE(norm_close(out, kGemmTol, "expert out"));
  auto dout = twin(random_floats(rows * n, 33));
  auto din = twin<float>(rows * k);
  auto dw = twin(random_floats(experts * k * n, 34));
  auto db = twin(random_floats(experts * n, 35));
  both([&](Backend& b, Side s) {
    b.expert_linear_backward_data(din(s), dout(s), w(s), counts.data(), experts, n, k, false);
    b.expert_linear_backward_weight(dw(s), db(s), in(s), dout(s), counts.data(), experts, n, k);
  });
  EXPECT_TRUE(norm_close(din, kGemmTol, "expert din"));
  EXPECT_TRUE(norm_close(dw, kGemmTol, "expert dw"));
  EXPECT_TRUE(norm_close(db, kRedTol, "expert dbias"));
}

// ---- Activation.

TEST_F(CudaKernels, Activations) {
  const int64_t rows = 13, cols = 77;
  for (Activation kind : {Activation::kGelu, Activation::kSwiglu}) {
    const int64_t in_cols = kind == Activation::kSwiglu ? 2 * cols : cols;
    auto in = twin(random_floats(rows * in_cols, 40, -4.0f, 4.0f));
    auto out = twin<float>(rows * cols);
    both([&](Backend& b, Side s) { b.activation_forward(kind, out(s), in(s), rows, cols); });
    EXPECT_TRUE(elt_close(out, "activation out"));
    auto dout = twin(random_floats(rows * cols, 41));
    auto din = twin<float>(rows * in_cols);
    both([&](Backend& b, Side s) {
      b.activation_backward(kind, din(s), dout(s), in(s), rows, cols);
    });
    EXPECT_TRUE(elt_close(din, "activation din"));
  }
}

TEST_F(CudaKernels, RopeForwardAndInverse) {
  // A fused QKV row of 3 query heads and 1 key head of 16 columns; K is rotated in place.
  const int64_t d = 16, ld = 5 * d, seq = 24, rows = 2 * seq;
  auto x = twin(random_floats(rows * ld, 45));
  both([&](Backend& b, Side s) { b.rope(x(s) + 3 * d, ld, rows, seq, 48, 1, d, 5e5, false); });
  EXPECT_TRUE(elt_close(x, "rope"));
  both([&](Backend& b, Side s) { b.rope(x(s), ld, rows, seq, 48, 3, d, 1e4, true); });
  EXPECT_TRUE(elt_close(x, "rope inverse"));
}

// ---- Attention.

struct AttnCase {
  const char* name;
  int64_t batch, seq_q, seq_kv, heads, kv_heads, head_dim;
  bool causal;
  int64_t offset;
  float dropout;
  bool use_probs;
  int64_t v_head_dim = 0;  // 0: head_dim
  int64_t window = 0;
};

class CudaAttention : public CudaKernels, public ::testing::WithParamInterface<AttnCase> {};

// Sends every attention call of a scope to parasol's own kernels (fp32, compared at kRedTol).
struct OwnAttentionKernels {
  OwnAttentionKernels() { gpu().set_fused_attention(false); }
  ~OwnAttentionKernels() { gpu().set_fused_attention(true); }
};

TEST_P(CudaAttention, ForwardBackwardMatchCpu) {
  const OwnAttentionKernels own;
  const AttnCase c = GetParam();
  AttentionDims d;
  d.batch = c.batch;
  d.seq_q = c.seq_q;
  d.seq_kv = c.seq_kv;
  d.heads = c.heads;
  d.kv_heads = c.kv_heads;
  d.head_dim = c.head_dim;
  d.v_head_dim = c.v_head_dim;
  d.window = c.window;
  d.ld_q = c.heads * c.head_dim + 3;  // padded rows: strides are honoured
  d.ld_kv = c.kv_heads * std::max(c.head_dim, d.vd()) + 1;
  d.ld_o = c.heads * d.vd();
  d.causal = c.causal;
  d.causal_offset = c.offset;
  d.dropout_p = c.dropout;
  d.dropout_seed = 1234;
  const int64_t Tq = c.batch * c.seq_q, Tk = c.batch * c.seq_kv;
  auto q = twin(random_floats(Tq * d.ld_q, 50));
  auto k = twin(random_floats(Tk * d.ld_kv, 51));
  auto v = twin(random_floats(Tk * d.ld_kv, 52));
  auto out = twin<float>(Tq * d.ld_o);
  auto lse = twin<float>(c.batch * c.heads * c.seq_q);
  auto probs = twin<float>(c.batch * c.heads * c.seq_q * c.seq_kv);
  both([&](Backend& b, Side s) {
    b.attention_forward(d, out(s), lse(s), probs(s), q(s), k(s), v(s), false);
  });
  EXPECT_TRUE(norm_close(out, kRedTol, "attention out"));
  EXPECT_TRUE(norm_close(probs, kRedTol, "attention probs"));
  {  // lse: -inf where no key is visible, equal otherwise
    const auto lc = host(lse, Side::kCpu), lg = host(lse, Side::kGpu);
    for (size_t i = 0; i < lc.size(); ++i) {
      if (std::isinf(lc[i])) {
        EXPECT_EQ(lc[i], lg[i]) << "lse[" << i << "]";
      } else {
        EXPECT_NEAR(lg[i], lc[i], 1e-5 * (1 + std::abs(lc[i]))) << "lse[" << i << "]";
      }
    }
  }
  auto dout = twin(random_floats(Tq * d.ld_o, 53));
  auto dq = twin(random_floats(Tq * d.ld_q, 54));
  auto dk = twin(random_floats(Tk * d.ld_kv, 55));
  auto dv = twin(random_floats(Tk * d.ld_kv, 56));
  both([&](Backend& b, Side s) {
    b.attention_backward(d, dq(s), dk(s), dv(s), dout(s), q(s), k(s), v(s), out(s), lse(s),
                         c.use_probs ? probs(s) : nullptr, true, false);
  });
  EXPECT_TRUE(norm_close(dq, kRedTol, "attention dq"));
  EXPECT_TRUE(norm_close(dk, kRedTol, "attention dk"));
  EXPECT_TRUE(norm_close(dv, kRedTol, "attention dv"));
}

INSTANTIATE_TEST_SUITE_P(
    Cases, CudaAttention,
    ::testing::Values(AttnCase{"causal_gqa", 2, 17, 17, 4, 2, 16, true, 0, 0.0f, false},
                      AttnCase{"full", 1, 9, 13, 2, 2, 32, false, 0, 0.0f, false},
                      AttnCase{"offset", 2, 8, 12, 4, 1, 8, true, -3, 0.0f, false},
                      AttnCase{"dropout", 1, 20, 20, 2, 1, 16, true, 0, 0.25f, false},
                      AttnCase{"probs", 1, 11, 11, 3, 3, 24, true, 0, 0.1f, true},
                      AttnCase{"long", 1, 300, 300, 2, 1, 64, true, 0, 0.0f, false},
                      AttnCase{"window", 2, 40, 40, 4, 2, 16, true, 0, 0.0f, false, 0, 7},
                      AttnCase{"window_offset", 1, 12, 20, 2, 1, 8, true, 8, 0.2f, true, 0, 5},
                      AttnCase{"mla_value_dims", 2, 19, 19, 4, 4, 24, true, 0, 0.0f, false, 16},
                      AttnCase{"mla_window", 1, 150, 150, 2, 2, 12, true, 0, 0.0f, true, 20, 33}),
    [](const ::testing::TestParamInfo<AttnCase>& i) { return std::string(i.param.name); });

TEST_F(CudaKernels, AttentionRingMerge) {
  // Two ring steps (keys 0..7 then 8..15 of a 16-key causal sequence, queries 8..15) merged with
  // accumulate, against the CPU doing the same.
  const OwnAttentionKernels own;
  AttentionDims d;
  d.batch = 2;
  d.seq_q = 8;
  d.seq_kv = 8;
  d.heads = 2;
  d.kv_heads = 1;
  d.head_dim = 16;
  d.ld_q = d.ld_o = 32;
  d.ld_kv = 16;
  const int64_t Tq = 16;
  auto q = twin(random_floats(Tq * 32, 60));
  auto k0 = twin(random_floats(Tq * 16, 61)), v0 = twin(random_floats(Tq * 16, 62));
  auto k1 = twin(random_floats(Tq * 16, 63)), v1 = twin(random_floats(Tq * 16, 64));
  auto out = twin<float>(Tq * 32);
  auto lse = twin<float>(2 * 2 * 8);
  both([&](Backend& b, Side s) {
    AttentionDims d0 = d;
    d0.causal_offset = 8;  // an earlier chunk: every key visible
    b.attention_forward(d0, out(s), lse(s), nullptr, q(s), k0(s), v0(s), false);
    b.attention_forward(d, out(s), lse(s), nullptr, q(s), k1(s), v1(s), true);
  });
  EXPECT_TRUE(norm_close(out, kRedTol, "merged out"));
  EXPECT_TRUE(norm_close(lse, kRedTol, "merged lse"));
}

// ---- Attention through cuDNN's fused SDPA (runtime/cuda/cudnn_attention.h).
//
// Both backends get the same bf16-representable Q, K, V (and dO): rounded on the host, so the
// input rounding cuDNN does is no difference. What differs is cuDNN's own bf16 roundings: the
// probabilities P rounded for the P V product and the output O (forward, 2 roundings); in the
// backward P for dV, dS for dQ and dK, each gradient's output, and O itself (rounded by the
// forward, read back for delta = rowsum(dO O)): 3 along any gradient's path. Each rounding
// perturbs its operand by at most u = 2^-8 relative; treated as independent zero-mean errors
// (Higham & Mary, SIAM J. Sci. Comput. 41(5), 2019, as the trainer suite's bf16 tolerance), r of
// them move a result norm-wise by less than lambda sqrt(r) u with probability at least
// 1 - 2 exp(-lambda^2 / 2), lambda = 6. The lse is cuDNN's fp32 statistic of fp32 scores of the
// same inputs: kRedTol relative to 1 + |lse| (fp32 summation order only).
constexpr double kBf16U = 1.0 / 256, kLambda = 6;
const double kFusedForwardTol = kLambda * std::sqrt(2.0) * kBf16U;
const double kFusedBackwardTol = kLambda * std::sqrt(3.0) * kBf16U;

std::vector<float> bf16_floats(int64_t n, uint32_t seed) {
  std::vector<float> v = random_floats(n, seed);
  for (float& x : v) x = bf16_to_fp32(fp32_to_bf16(x));
  return v;
}

struct FusedCase {
  const char* name;
  int64_t batch, seq_q, seq_kv, heads, kv_heads, head_dim;
  bool causal;
  int64_t offset, window;
  bool accumulate;  // a second ring step (after an earlier chunk's keys, every key visible)
};

class CudnnSdpa : public CudaKernels, public ::testing::WithParamInterface<FusedCase> {};

TEST_P(CudnnSdpa, MatchesCpuWithinBf16AndCountsTheFusedCalls) {
  if (!CudaBackend::cudnn_built()) GTEST_FAIL() << "this CUDA build has no cuDNN frontend";
  const FusedCase c = GetParam();
  AttentionDims d;
  d.batch = c.batch;
  d.seq_q = c.seq_q;
  d.seq_kv = c.seq_kv;
  d.heads = c.heads;
  d.kv_heads = c.kv_heads;
  d.head_dim = c.head_dim;
  d.ld_q = (c.heads + 2 * c.kv_heads) * c.head_dim;  // Q, K, V in one QKV row, as the executor's
  d.ld_kv = d.ld_q;
  d.ld_o = c.heads * c.head_dim;
  d.causal = c.causal;
  d.causal_offset = c.offset;
  d.window = c.window;
  ASSERT_EQ(fused_attention_route(d, false).refusal, "");
  const int64_t Tq = c.batch * c.seq_q, Tk = c.batch * c.seq_kv, rows = std::max(Tq, Tk);
  auto qkv = twin(bf16_floats(rows * d.ld_q, 80));
  auto qkv0 = twin(bf16_floats(Tk * d.ld_q, 81));  // the earlier ring step's keys and values
  const int64_t koff = c.heads * c.head_dim, voff = koff + c.kv_heads * c.head_dim;
  auto out = twin<float>(Tq * d.ld_o);
  auto lse = twin<float>(c.batch * c.heads * c.seq_q);
  const CudaBackend::LibraryCounts before = gpu().library_counts();
  both([&](Backend& b, Side s) {
    if (c.accumulate) {
      AttentionDims d0 = d;
      d0.causal_offset = c.seq_kv;  // an earlier chunk: every key visible
      d0.window = 0;
      b.attention_forward(d0, out(s), lse(s), nullptr, qkv(s), qkv0(s) + koff, qkv0(s) + voff,
                          false);
    }
    b.attention_forward(d, out(s), lse(s), nullptr, qkv(s), qkv(s) + koff, qkv(s) + voff,
                        c.accumulate);
  });
  EXPECT_TRUE(norm_close(out, kFusedForwardTol, "fused attention out"));
  {
    const auto lc = host(lse, Side::kCpu), lg = host(lse, Side::kGpu);
    for (size_t i = 0; i < lc.size(); ++i)
      EXPECT_NEAR(lg[i], lc[i], kRedTol * (1 + std::abs(lc[i]))) << "lse[" << i << "]";
  }
  // The backward of the last step, from each backend's own forward results.
  auto dout = twin(bf16_floats(Tq * d.ld_o, 82));
  auto dqkv = twin(random_floats(rows * d.ld_q, 83));
  both([&](Backend& b, Side s) {
    b.attention_backward(d, dqkv(s), dqkv(s) + koff, dqkv(s) + voff, dout(s), qkv(s), qkv(s) + koff,
                         qkv(s) + voff, out(s), lse(s), nullptr, true, false);
  });
  EXPECT_TRUE(norm_close(dqkv, kFusedBackwardTol, "fused attention dq, dk, dv"));
  const CudaBackend::LibraryCounts after = gpu().library_counts();
  EXPECT_EQ(after.attention_fused - before.attention_fused, c.accumulate ? 3 : 2);
  EXPECT_EQ(after.attention_fallbacks, before.attention_fallbacks);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, CudnnSdpa,
    ::testing::Values(FusedCase{"causal_gqa", 2, 128, 128, 8, 2, 64, true, 0, 0, false},
                      FusedCase{"full", 1, 96, 160, 4, 4, 64, false, 0, 0, false},
                      FusedCase{"head128", 1, 256, 256, 4, 1, 128, true, 0, 0, false},
                      FusedCase{"window", 2, 200, 200, 4, 2, 64, true, 0, 48, false},
                      FusedCase{"odd_lengths", 1, 77, 77, 2, 2, 64, true, 0, 0, false},
                      FusedCase{"ring", 2, 64, 64, 4, 2, 64, true, 0, 0, true}),
    [](const ::testing::TestParamInfo<FusedCase>& i) { return std::string(i.param.name); });

// A call the routing refuses (dropout: the runtime's masks are its own hash) runs parasol's
// kernel: the CPU's fp32 result, the call counted as a fallback.
TEST_F(CudaKernels, RefusedAttentionFallsBackAndIsCounted) {
  AttentionDims d;
  d.batch = 1;
  d.seq_q = d.seq_kv = 32;
  d.heads = d.kv_heads = 2;
  d.head_dim = 64;
  d.ld_q = d.ld_kv = d.ld_o = 128;
  d.dropout_p = 0.1f;
  d.dropout_seed = 7;
  auto q = twin(random_floats(32 * 128, 90));
  auto k = twin(random_floats(32 * 128, 91));
  auto v = twin(random_floats(32 * 128, 92));
  auto out = twin<float>(32 * 128);
  auto lse = twin<float>(2 * 32);
  const CudaBackend::LibraryCounts before = gpu().library_counts();
  both([&](Backend& b, Side s) {
    b.attention_forward(d, out(s), lse(s), nullptr, q(s), k(s), v(s), false);
  });
  EXPECT_TRUE(norm_close(out, kRedTol, "fallback out"));
  const CudaBackend::LibraryCounts after = gpu().library_counts();
  EXPECT_EQ(after.attention_fallbacks - before.attention_fallbacks, 1);
  EXPECT_EQ(after.attention_fused, before.attention_fused);
}

// ---- Residual.

TEST_F(CudaKernels, ResidualWithDropout) {
  const int64_t rows = 21, cols = 50;
  auto x = twin(random_floats(rows * cols, 70));
  auto y = twin(random_floats(rows * cols, 71));
  auto bias = twin(random_floats(cols, 72));
  auto out = twin<float>(rows * cols);
  auto mask = twin<uint8_t>(rows * cols);
  both([&](Backend& b, Side s) {
    b.residual_forward(out(s), mask(s), x(s), y(s), bias(s), rows, cols, 0.3f, 99);
  });
  EXPECT_TRUE(exact(mask, "mask"));
  EXPECT_TRUE(elt_close(out, "residual out"));
  auto dout = twin(random_floats(rows * cols, 73));
  auto dy = twin<float>(rows * cols);
  auto db = twin(random_floats(cols, 74));
  both([&](Backend& b, Side s) {
    b.residual_backward(dy(s), db(s), dout(s), mask(s), rows, cols, 0.3f);
  });
  EXPECT_TRUE(elt_close(dy, "residual dy"));
  EXPECT_TRUE(norm_close(db, kRedTol, "residual dbias"));
  both([&](Backend& b, Side s) {  // no dropout, in place on y
    b.residual_forward(y(s), nullptr, x(s), y(s), nullptr, rows, cols, 0.0f, 0);
  });
  EXPECT_TRUE(elt_close(y, "residual in place"));
}

// ---- Cross-entropy.

TEST_F(CudaKernels, CrossEntropy) {
  const int64_t rows = 9, vocab = 1000, vocab_start = 500;
  auto logits = twin(random_floats(rows * vocab, 80, -5.0f, 5.0f));
  std::vector<int32_t> lab = random_ints(rows, 0, 1999, 81);
  lab[2] = -1;
  auto labels = twin(lab);
  auto mx = twin<float>(rows), se = twin<float>(rows), tg = twin<float>(rows),
       loss = twin<float>(rows), probs = twin<float>(rows * vocab);
  both([&](Backend& b, Side s) {
    b.xent_row_max(mx(s), logits(s), rows, vocab);
    b.xent_sum_exp(se(s), logits(s), mx(s), rows, vocab);
    b.xent_target(tg(s), logits(s), labels(s), rows, vocab, vocab_start);
    b.xent_loss(loss(s), mx(s), se(s), tg(s), labels(s), rows);
    b.xent_softmax(probs(s), logits(s), mx(s), se(s), rows, vocab);
  });
  EXPECT_TRUE(exact(mx, "row max"));
  EXPECT_TRUE(elt_close(se, "sum exp"));
  EXPECT_TRUE(exact(tg, "target"));
  EXPECT_TRUE(elt_close(loss, "loss"));
  EXPECT_TRUE(elt_close(probs, "softmax"));
  both([&](Backend& b, Side s) {
    b.xent_backward(probs(s), probs(s), labels(s), rows, vocab, vocab_start, 0.5f);
  });
  EXPECT_TRUE(elt_close(probs, "dlogits"));
}

// ---- MoE.

TEST_F(CudaKernels, RouterPermutationDispatchCombine) {
  const int64_t tokens = 37, experts = 8, top_k = 2, cols = 24;
  for (bool renorm : {false, true}) {
    auto logits = twin(random_floats(tokens * experts, 90, -2.0f, 2.0f));
    auto probs = twin<float>(tokens * experts);
    auto idx = twin<int32_t>(tokens * top_k);
    auto w = twin<float>(tokens * top_k);
    both([&](Backend& b, Side s) {
      b.router_forward(probs(s), idx(s), w(s), logits(s), tokens, experts, top_k, renorm);
    });
    EXPECT_TRUE(elt_close(probs, "router probs"));
    EXPECT_TRUE(exact(idx, "topk idx"));
    EXPECT_TRUE(elt_close(w, "topk w"));
    auto dw = twin(random_floats(tokens * top_k, 91));
    auto dlogits = twin<float>(tokens * experts);
    both([&](Backend& b, Side s) {
      b.router_backward(dlogits(s), dw(s), probs(s), idx(s), tokens, experts, top_k, renorm);
    });
    EXPECT_TRUE(norm_close(dlogits, kRedTol, "router dlogits"));
  }
  // Permutation from the CPU's top-k (same input on both sides).
  auto logits = twin(random_floats(tokens * experts, 92));
  auto probs = twin<float>(tokens * experts);
  auto idx = twin<int32_t>(tokens * top_k);
  auto w = twin<float>(tokens * top_k);
  cpu().router_forward(probs.c, idx.c, w.c, logits.c, tokens, experts, top_k, true);
  gpu().copy(idx.g, idx.c, sizeof(int32_t) * idx.n);
  gpu().copy(w.g, w.c, sizeof(float) * w.n);
  auto row_of = twin<int32_t>(tokens * top_k);
  std::vector<int64_t> counts_c(experts), counts_g(experts);
  cpu().moe_permutation(row_of.c, counts_c.data(), idx.c, tokens, experts, top_k);
  gpu().moe_permutation(row_of.g, counts_g.data(), idx.g, tokens, experts, top_k);
  EXPECT_EQ(counts_c, counts_g);
  EXPECT_TRUE(exact(row_of, "row_of"));
  auto x = twin(random_floats(tokens * cols, 93));
  auto routed = twin<float>(tokens * top_k * cols);
  auto dx = twin<float>(tokens * cols);
  auto out = twin<float>(tokens * cols);
  auto dexp = twin<float>(tokens * top_k * cols);
  auto dwc = twin<float>(tokens * top_k);
  both([&](Backend& b, Side s) {
    b.dispatch_forward(routed(s), x(s), row_of(s), tokens, top_k, cols);
    b.dispatch_backward(dx(s), routed(s), row_of(s), tokens, top_k, cols);
    b.combine_forward(out(s), routed(s), w(s), row_of(s), tokens, top_k, cols);
    b.combine_backward(dexp(s), dwc(s), x(s), routed(s), w(s), row_of(s), tokens, top_k, cols);
  });
  EXPECT_TRUE(exact(routed, "dispatch"));
  EXPECT_TRUE(elt_close(dx, "dispatch backward"));
  EXPECT_TRUE(elt_close(out, "combine"));
  EXPECT_TRUE(elt_close(dexp, "combine dexpert"));
  EXPECT_TRUE(norm_close(dwc, kRedTol, "combine dw"));
}

// ---- Optimizer and casts.

TEST_F(CudaKernels, AdamWSumsqClip) {
  const int64_t n = 100003;
  auto p = twin(random_floats(n, 100));
  auto m = twin(random_floats(n, 101, -0.1f, 0.1f));
  auto v = twin(random_floats(n, 102, 0.0f, 0.01f));
  auto g = twin(random_floats(n, 103));
  auto scale = twin(std::vector<float>{0.5f});
  AdamWConfig c;
  c.step = 3;
  both([&](Backend& b, Side s) { b.adamw(c, p(s), m(s), v(s), g(s), n, scale(s)); });
  EXPECT_TRUE(elt_close(p, "adamw param"));
  EXPECT_TRUE(elt_close(m, "adamw m"));
  EXPECT_TRUE(elt_close(v, "adamw v"));
  auto sumsq = twin(std::vector<float>{1.5f});
  auto clip = twin<float>(1);
  auto clip_scaled = twin<float>(1);  // gradients carrying a loss scale of 2^10
  both([&](Backend& b, Side s) {
    b.grad_sumsq(sumsq(s), g(s), n);
    b.clip_scale(clip(s), sumsq(s), 10.0f, 1.0f);
    b.clip_scale(clip_scaled(s), sumsq(s), 10.0f, 1024.0f);
  });
  EXPECT_TRUE(elt_close(sumsq, "grad sumsq"));
  EXPECT_TRUE(elt_close(clip, "clip scale"));
  EXPECT_TRUE(elt_close(clip_scaled, "clip scale under a loss scale"));
  // Deterministic: the same sum again, bit for bit.
  const float first = host(sumsq, Side::kGpu)[0];
  gpu().zero(sumsq.g, sizeof(float));
  gpu().grad_sumsq(sumsq.g, g.g, n);
  gpu().grad_sumsq(sumsq.g, g.g, 0);
  std::vector<float> again(1);
  gpu().copy(again.data(), sumsq.g, sizeof(float));
  const float expect_again = first - 1.5f;
  EXPECT_NEAR(again[0], expect_again, 1e-6 * std::abs(expect_again));
  gpu().zero(sumsq.g, sizeof(float));
  gpu().grad_sumsq(sumsq.g, g.g, n);
  std::vector<float> third(1);
  gpu().copy(third.data(), sumsq.g, sizeof(float));
  EXPECT_EQ(std::memcmp(again.data(), third.data(), sizeof(float)), 0);
}

TEST_F(CudaKernels, CastsBitExact) {
  std::vector<float> x = random_floats(4096, 110, -70000.0f, 70000.0f);
  const std::vector<float> special = {0.0f,
                                      -0.0f,
                                      1e-8f,
                                      -3e-6f,
                                      6.1e-5f,
                                      65504.0f,
                                      65520.0f,
                                      1e30f,
                                      std::numeric_limits<float>::infinity(),
                                      -std::numeric_limits<float>::infinity(),
                                      std::numeric_limits<float>::quiet_NaN(),
                                      1.0f + 1.0f / 256,
                                      3.0f * 1.0f / 512};
  x.insert(x.end(), special.begin(), special.end());
  for (float s : {1e-3f, 1e-6f}) {
    auto r = random_floats(512, 111, -1.0f, 1.0f);
    for (float& f : r) x.push_back(f * s);
  }
  const int64_t n = static_cast<int64_t>(x.size());
  auto src = twin(x);
  for (Dtype t : {Dtype::kBf16, Dtype::kFp16}) {
    auto half = twin<uint16_t>(n);
    auto back = twin<float>(n);
    both([&](Backend& b, Side s) {
      b.cast(half(s), t, src(s), Dtype::kFp32, n);
      b.cast(back(s), Dtype::kFp32, half(s), t, n);
    });
    EXPECT_TRUE(exact(half, dtype_name(t)));
    EXPECT_TRUE(exact(back, std::string(dtype_name(t)) + " -> fp32"));
  }
  EXPECT_THROW(gpu().cast(src.g, Dtype::kBf16, src.g, Dtype::kFp16, 1), ::parasol::Error);
}

}  // namespace
}  // namespace parasol::runtime::test

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  const bool device = parasol::runtime::cuda_device_available();
  if (!device) std::printf("cuda_kernels_test: no CUDA device; every test is skipped\n");
  const int rc = RUN_ALL_TESTS();
  if (rc != 0) return rc;
  return device ? 0 : 77;  // kNoDeviceExit: ctest's SKIP_RETURN_CODE
}
