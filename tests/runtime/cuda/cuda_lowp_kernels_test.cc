// The CUDA backend's low-precision entries (cuda_backend.h, "Low-precision storage without
// widening"), part of cuda_kernels_test (whose main skips every test without a CUDA device), each
// against a CPU reference with a tolerance derived in the test:
//   vocab-tiled cross-entropy: the untiled formula in double on the same widened logits, within
//     runtime/cpu/tiled_xent.h's bound for the kernel's block shape (CUDA's expf: 2 ulps, CUDA C
//     Programming Guide, "Mathematical Functions", single precision).
//   bf16 GEMMs with fused epilogues: the product in double of the same bf16 operands; the fp32
//     accumulation of k products errs by at most 2 k u sum |a b| (u = 2^-24; the factor 2 allows
//     for truncating tensor-core adds), then the bf16 store by its unit roundoff (2^-8 relative).
//     GELU: cuBLASLt does not document which GELU form its epilogue computes; the tanh and erf
//     forms differ by less than kGeluForms (max over x of |gelu_tanh - gelu_erf| = 4.7e-4; of
//     their slopes 8.7e-4 < 2 kGeluForms). An epilogue that falls back to separate kernels rounds
//     the GEMM's output to bf16 once more before it: one more 2^-8 of the intermediate.
//   the device-side MoE permutation: bit-equal to the CPU backend's moe_permutation.
//   grouped expert GEMMs on device offsets: the per-expert products in double, the bf16 GEMM
//     bound above (2 k u sum |a b| and the store).
//   CUDA graphs: a recorded sequence replayed on new inputs equals the same calls run eagerly,
//     bit for bit (the same kernels on the same data).
//   element-wise, norm and rope kernels on bf16: double references on the widened inputs; the
//     store's unit roundoff (2^-8 relative) plus the fp32 arithmetic's roundings as stated per
//     test.
//   attention on bf16 storage (cuDNN in place, and parasol's kernel on widened copies): the CPU
//     backend's typed attention, within the bf16 roundings each route adds (stated at the test).
//   MoE's dispatch and combine on bf16 rows: the CPU backend's, within one bf16 neighbour.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "runtime/cpu/cpu_backend.h"
#include "runtime/cpu/tiled_xent.h"
#include "runtime/cuda/cuda_backend.h"
#include "runtime/cuda/kernels.h"
#include "runtime/tensor.h"

namespace parasol::runtime::test {
namespace {

constexpr double kCudaExpUlps = 2.0;
constexpr double kHalfUlpBf16 = 1.0 / 256;  // 2^-8: bf16's unit roundoff (8 significant bits)
constexpr double kGeluForms = 5e-4;
const double kU = std::ldexp(1.0, -24);

CudaBackend& dev() {
  static CudaBackend b(0);
  return b;
}

class CudaLowp : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda_device_available()) GTEST_SKIP() << "no CUDA device";
  }
  void TearDown() override {
    for (void* p : blocks_) dev().free(p);
    blocks_.clear();
  }
  // A device copy of v.
  template <typename T>
  T* up(const std::vector<T>& v) {
    void* p = dev().alloc(std::max<size_t>(1, v.size()) * sizeof(T), BufferClass::kActivation);
    blocks_.push_back(p);
    if (!v.empty()) dev().copy(p, v.data(), v.size() * sizeof(T));
    return static_cast<T*>(p);
  }
  template <typename T>
  std::vector<T> down(const T* p, size_t n) {
    std::vector<T> v(n);
    dev().synchronize();
    if (n > 0) dev().copy(v.data(), p, n * sizeof(T));
    return v;
  }
  std::vector<void*> blocks_;
};

// Logits uniform in [-spread, spread], bf16-representable, every other row sorted ascending (the
// running maximum rises in every sweep: the most rescales).
std::vector<float> xent_logits(int64_t rows, int64_t vocab, float spread, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-spread, spread);
  std::vector<float> v(static_cast<size_t>(rows * vocab));
  for (float& x : v) x = bf16_to_fp32(fp32_to_bf16(u(rng)));
  for (int64_t r = 0; r < rows; r += 2)
    std::sort(v.begin() + r * vocab, v.begin() + (r + 1) * vocab);
  return v;
}

TEST_F(CudaLowp, TiledCrossEntropyMatchesTheUntiledFormula) {
  // 50257: rows not 16-byte aligned (the scalar loads); 50304: aligned (the 16-byte loads).
  for (int64_t vocab : {int64_t{50257}, int64_t{50304}})
    for (Dtype d : {Dtype::kFp32, Dtype::kBf16}) {
      SCOPED_TRACE(std::string(dtype_name(d)) + " vocab " + std::to_string(vocab));
      const int64_t rows = 6, start = 100;
      const auto x = xent_logits(rows, vocab, 20.0f, 31);
      std::mt19937 rng(37);
      std::vector<int32_t> labels(rows);
      for (auto& l : labels) l = static_cast<int32_t>(start + rng() % vocab);
      labels[1] = -1;
      labels[3] = 5;  // another shard's
      std::vector<uint16_t> xb(x.size());
      for (size_t i = 0; i < x.size(); ++i) xb[i] = fp32_to_bf16(x[i]);
      void* logits = d == Dtype::kBf16 ? static_cast<void*>(up(xb)) : static_cast<void*>(up(x));
      int32_t* lab = up(labels);
      float* mx = up(std::vector<float>(rows));
      float* se = up(std::vector<float>(rows));
      float* tg = up(std::vector<float>(rows));
      dev().xent_tiled_forward(mx, se, tg, logits, d, lab, rows, vocab, start);
      const auto gmx = down(mx, rows), gse = down(se, rows), gtg = down(tg, rows);
      const double rel = cpu::xent_sum_rel_bound(
          cpu::xent_block_chain(vocab, cuda::kXentThreads, cuda::kXentVec), kCudaExpUlps);
      std::vector<double> ref_m(rows), ref_s(rows);
      for (int64_t r = 0; r < rows; ++r) {
        const float* row = x.data() + r * vocab;
        double m = -std::numeric_limits<double>::infinity(), s = 0;
        for (int64_t v = 0; v < vocab; ++v) m = std::max(m, double{row[v]});
        for (int64_t v = 0; v < vocab; ++v) s += std::exp(double{row[v]} - m);
        ref_m[r] = m;
        ref_s[r] = s;
        EXPECT_EQ(double{gmx[r]}, m) << "row " << r;
        EXPECT_LE(std::abs(gse[r] - s), rel * s) << "row " << r << " (bound " << rel << ")";
        const int64_t id = labels[r] - start;
        EXPECT_EQ(gtg[r], labels[r] >= 0 && id >= 0 && id < vocab ? row[id] : 0.0f) << r;
      }
      // Backward in place over the logits, in their dtype.
      const float dloss = 0.25f;
      dev().xent_tiled_backward(logits, logits, d, mx, se, lab, rows, vocab, start, dloss);
      const double store = d == Dtype::kBf16 ? kHalfUlpBf16 : kU;
      std::vector<float> got(x.size());
      if (d == Dtype::kBf16) {
        const auto b = down(static_cast<uint16_t*>(logits), x.size());
        for (size_t i = 0; i < b.size(); ++i) got[i] = bf16_to_fp32(b[i]);
      } else {
        got = down(static_cast<float*>(logits), x.size());
      }
      int bad = 0;
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t v = 0; v < vocab && bad < 5; ++v) {
          const double p = std::exp(double{x[r * vocab + v]} - ref_m[r]) / ref_s[r];
          const bool hit = labels[r] >= 0 && labels[r] - start == v;
          const double ref = labels[r] < 0 ? 0.0 : dloss * (p - (hit ? 1.0 : 0.0));
          // p carries sum_exp's error (rel), its expf's (2 ulps) and 1/S's and the products'
          // roundings (6u in all, with the subtraction and dloss), then the store.
          const double e = dloss * p * (rel + (4 + 6) * kU) + (hit ? dloss * 2 * kU : 0.0);
          if (!(std::abs(got[r * vocab + v] - ref) <= e + store * (std::abs(ref) + e))) {
            ADD_FAILURE() << "dlogits row " << r << " col " << v << ": " << got[r * vocab + v]
                          << " vs " << ref;
            ++bad;
          }
        }
    }
}

TEST_F(CudaLowp, TiledCrossEntropyRescaleAndRefusedDtype) {
  const std::vector<float> lmax = {1.0f, 3.0f, -2.0f}, gmax = {3.0f, 3.0f, 0.5f},
                           sums = {2.0f, 5.0f, 0.0f};
  float* s = up(sums);
  dev().xent_rescale(s, up(lmax), up(gmax), 3);
  const auto got = down(s, 3);
  for (int r = 0; r < 3; ++r) {
    const double ref = sums[r] * std::exp(double{lmax[r]} - gmax[r]);
    EXPECT_NEAR(got[r], ref, (2 * 2 + 1) * kU * ref) << r;  // expf's 2 ulps and the product
  }
  EXPECT_THROW(dev().xent_tiled_forward(s, s, s, s, Dtype::kFp16, nullptr, 1, 1, 0),
               ::parasol::Error);
}

// ---- bf16 storage helpers.

std::vector<uint16_t> bf16_random(int64_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<uint16_t> v(static_cast<size_t>(n));
  for (auto& x : v) x = fp32_to_bf16(u(rng));
  return v;
}
double w16(uint16_t h) { return bf16_to_fp32(h); }
std::vector<double> widen(const std::vector<uint16_t>& v) {
  std::vector<double> d(v.size());
  for (size_t i = 0; i < v.size(); ++i) d[i] = w16(v[i]);
  return d;
}
double gelu_tanh(double x) {
  return 0.5 * x * (1.0 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
}
double gelu_tanh_grad(double x) {
  const double c = 0.7978845608028654, t = std::tanh(c * (x + 0.044715 * x * x * x));
  return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * c * (1.0 + 3 * 0.044715 * x * x);
}

// ::testing failure after 5 bad elements: |got - ref| <= tol[i].
::testing::AssertionResult within(const std::vector<double>& got, const std::vector<double>& ref,
                                  const std::vector<double>& tol, const std::string& what) {
  int bad = 0;
  std::string msg;
  for (size_t i = 0; i < ref.size(); ++i)
    if (!(std::abs(got[i] - ref[i]) <= tol[i])) {
      if (bad++ < 5)
        msg += what + "[" + std::to_string(i) + "]: " + std::to_string(got[i]) + " vs " +
               std::to_string(ref[i]) + " (tol " + std::to_string(tol[i]) + ")\n";
    }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad << " elements off\n" << msg;
}

// C[m x n] = A[m x k] B[k x n] in double, with |A||B| for the accumulation bound.
void matmul(const std::vector<double>& a, const std::vector<double>& b, int64_t m, int64_t n,
            int64_t k, std::vector<double>& c, std::vector<double>& cabs) {
  c.assign(static_cast<size_t>(m * n), 0.0);
  cabs.assign(c.size(), 0.0);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t p = 0; p < k; ++p)
      for (int64_t j = 0; j < n; ++j) {
        c[i * n + j] += a[i * k + p] * b[p * n + j];
        cabs[i * n + j] += std::abs(a[i * k + p] * b[p * n + j]);
      }
}
std::vector<double> transpose(const std::vector<double>& a, int64_t rows, int64_t cols) {
  std::vector<double> t(a.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) t[c * rows + r] = a[r * cols + c];
  return t;
}

class CudaBf16Gemm : public CudaLowp, public ::testing::WithParamInterface<WeightLayout> {};

TEST_P(CudaBf16Gemm, ForwardWithBiasAndGeluEpilogues) {
  const WeightLayout layout = GetParam();
  const bool out_in = layout == WeightLayout::kOutIn;
  const int64_t m = 50, n = 72, k = 96;
  const auto in = bf16_random(m * k, 1), w = bf16_random(k * n, 2), bias = bf16_random(n, 3);
  // W as [k x n] in double whatever the storage.
  const auto wd = out_in ? transpose(widen(w), n, k) : widen(w);
  std::vector<double> prod, pabs;
  matmul(widen(in), wd, m, n, k, prod, pabs);
  const double acc = 2 * k * kU;
  for (bool gelu : {false, true}) {
    SCOPED_TRACE(std::string(out_in ? "kOutIn" : "kInOut") + (gelu ? " gelu" : " bias"));
    const auto before = dev().library_counts();
    uint16_t* out = up(std::vector<uint16_t>(m * n));
    uint16_t* pre = gelu ? up(std::vector<uint16_t>(m * n)) : nullptr;
    dev().linear_forward_bf16(out, up(in), up(w), layout, up(bias), pre, m, n, k);
    const auto got = widen(down(out, m * n));
    std::vector<double> ref(got.size()), tol(got.size()), pref(got.size()), ptol(got.size());
    for (int64_t i = 0; i < m * n; ++i) {
      const double x = prod[i] + w16(bias[i % n]);
      const double ex = acc * (pabs[i] + std::abs(w16(bias[i % n])));
      pref[i] = x;
      ptol[i] = kHalfUlpBf16 * (std::abs(x) + ex) + ex;
      ref[i] = gelu ? gelu_tanh(x) : x;
      // GELU's slope is below 1.13: the input's error passes through scaled by it; a fallback
      // rounds the product (bias) or the pre-activation (GELU) to bf16 first.
      const double e = gelu ? 1.13 * (ex + kHalfUlpBf16 * (std::abs(x) + ex)) + kGeluForms
                            : ex + kHalfUlpBf16 * (std::abs(prod[i]) + ex);
      tol[i] = kHalfUlpBf16 * (std::abs(ref[i]) + e) + e;
    }
    EXPECT_TRUE(within(got, ref, tol, "out"));
    if (gelu) {
      EXPECT_TRUE(within(widen(down(pre, m * n)), pref, ptol, "gelu_pre"));
    }
    const auto after = dev().library_counts();
    EXPECT_EQ(after.gemm_bf16_storage - before.gemm_bf16_storage, 1);
    EXPECT_EQ((after.epilogue_fused - before.epilogue_fused) +
                  (after.epilogue_fallbacks - before.epilogue_fallbacks),
              1);
    EXPECT_EQ(after.gemm_fp32_fallbacks, before.gemm_fp32_fallbacks);
  }
}

TEST_P(CudaBf16Gemm, BackwardDataThroughTheGeluWithItsBiasGradient) {
  const WeightLayout layout = GetParam();
  const bool out_in = layout == WeightLayout::kOutIn;
  const int64_t m = 40, n = 64, k = 88;  // din [m x k] = dout [m x n] W^T
  const auto dout = bf16_random(m * n, 4), w = bf16_random(k * n, 5),
             pre = bf16_random(m * k, 6, -3.0f, 3.0f);
  const auto wd = out_in ? transpose(widen(w), n, k) : widen(w);  // [k x n]
  std::vector<double> prod, pabs;
  matmul(widen(dout), transpose(wd, k, n), m, k, n, prod, pabs);
  const std::vector<float> db0(k, 0.5f);
  float* dbias = up(db0);
  uint16_t* din = up(std::vector<uint16_t>(m * k));
  dev().linear_backward_data_bf16(din, up(dout), up(w), layout, up(pre), dbias, m, n, k, false);
  const auto got = widen(down(din, m * k));
  const auto gdb = down(dbias, k);
  std::vector<double> ref(got.size()), tol(got.size()), dbref(k, 0.5), dbtol(k, 0.0);
  const double acc = 2 * n * kU;
  for (int64_t i = 0; i < m * k; ++i) {
    const double g = gelu_tanh_grad(w16(pre[i]));
    ref[i] = g * prod[i];
    // The GELU gradient's form (tanh or erf) differs by < 2 kGeluForms in slope over |x| <= 3.
    // A fallback rounds the product to bf16 before the GELU gradient multiplies it.
    const double e = std::abs(g) * (acc * pabs[i] + kHalfUlpBf16 * std::abs(prod[i])) +
                     2 * kGeluForms * std::abs(prod[i]) + 4 * kU;
    tol[i] = kHalfUlpBf16 * (std::abs(ref[i]) + e) + e;
    dbref[i % k] += ref[i];
    // Summed before (fused) or after (separate kernel) the bf16 store: each term's tolerance.
    dbtol[i % k] += tol[i] + m * kU * std::abs(ref[i]);
  }
  EXPECT_TRUE(within(got, ref, tol, "din"));
  std::vector<double> gdbd(gdb.begin(), gdb.end());
  EXPECT_TRUE(within(gdbd, dbref, dbtol, "dbias"));
  EXPECT_THROW(dev().linear_backward_data_bf16(din, din, din, layout, din, nullptr, m, n, k, true),
               ::parasol::Error);
}

TEST_P(CudaBf16Gemm, BackwardWeightAccumulatesFp32AndBf16WithTheBiasGradient) {
  const WeightLayout layout = GetParam();
  const bool out_in = layout == WeightLayout::kOutIn;
  const int64_t m = 120, n = 48, k = 56;
  const auto in = bf16_random(m * k, 7), dout = bf16_random(m * n, 8);
  std::vector<double> prod, pabs;  // in^T dout: [k x n]
  matmul(transpose(widen(in), m, k), widen(dout), k, n, m, prod, pabs);
  if (out_in) {
    prod = transpose(prod, k, n);
    pabs = transpose(pabs, k, n);
  }
  const double acc = 2 * m * kU;
  for (Dtype dt : {Dtype::kFp32, Dtype::kBf16}) {
    SCOPED_TRACE(dtype_name(dt));
    const std::vector<float> dw0f(k * n, 0.25f);
    const std::vector<uint16_t> dw0b(k * n, fp32_to_bf16(0.25f));
    void* dw = dt == Dtype::kFp32 ? static_cast<void*>(up(dw0f)) : static_cast<void*>(up(dw0b));
    float* dbias = up(std::vector<float>(n, -1.0f));
    dev().linear_backward_weight_bf16(dw, dt, dbias, up(in), up(dout), layout, m, n, k);
    std::vector<double> got(k * n);
    if (dt == Dtype::kFp32) {
      const auto g = down(static_cast<float*>(dw), k * n);
      got.assign(g.begin(), g.end());
    } else {
      got = widen(down(static_cast<uint16_t*>(dw), k * n));
    }
    const double store = dt == Dtype::kFp32 ? kU : kHalfUlpBf16;
    std::vector<double> ref(got.size()), tol(got.size());
    for (size_t i = 0; i < ref.size(); ++i) {
      ref[i] = 0.25 + prod[i];
      const double e = acc * (pabs[i] + 0.25);
      tol[i] = store * (std::abs(ref[i]) + e) + e;
    }
    EXPECT_TRUE(within(got, ref, tol, "dw"));
    const auto gdb = down(dbias, n);
    std::vector<double> gdbd(gdb.begin(), gdb.end()), dbref(n, -1.0), dbtol(n, 0.0);
    for (int64_t r = 0; r < m; ++r)
      for (int64_t c = 0; c < n; ++c) {
        dbref[c] += w16(dout[r * n + c]);
        dbtol[c] += 2 * m * kU * std::abs(w16(dout[r * n + c]));
      }
    EXPECT_TRUE(within(gdbd, dbref, dbtol, "dbias"));
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, CudaBf16Gemm,
                         ::testing::Values(WeightLayout::kInOut, WeightLayout::kOutIn));

// ---- Element-wise kernels on bf16. Each output is one fp32 expression of a few bf16 inputs:
// its roundings (<= 8u relative to the terms' magnitude, expf's 2 ulps included) and the store.

TEST_F(CudaLowp, SwigluGeluResidualAndBiasOnBf16) {
  // cols 40: 16-byte groups; cols 37: the element-wise path.
  for (int64_t cols : {int64_t{40}, int64_t{37}}) {
    SCOPED_TRACE("cols " + std::to_string(cols));
    const int64_t rows = 9;
    cudaStream_t s = dev().stream();
    const auto in = bf16_random(rows * 2 * cols, 10, -4.0f, 4.0f);
    const auto dout = bf16_random(rows * cols, 11);
    uint16_t* out = up(std::vector<uint16_t>(rows * cols));
    uint16_t* din = up(std::vector<uint16_t>(rows * 2 * cols));
    const uint16_t* din_in = up(in);
    cuda::swiglu_forward_bf16(out, din_in, rows, cols, s);
    cuda::swiglu_backward_bf16(din, up(dout), din_in, rows, cols, s);
    const auto o = widen(down(out, rows * cols)), d = widen(down(din, rows * 2 * cols));
    std::vector<double> ro(o.size()), to(o.size()), rd(d.size()), td(d.size());
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) {
        const double g = w16(in[r * 2 * cols + c]), u = w16(in[r * 2 * cols + cols + c]);
        const double sg = 1 / (1 + std::exp(-g)), dd = w16(dout[r * cols + c]);
        const int64_t i = r * cols + c;
        ro[i] = g * sg * u;
        to[i] = kHalfUlpBf16 * std::abs(ro[i]) + 8 * kU * std::abs(ro[i]) + 1e-30;
        rd[r * 2 * cols + c] = dd * u * sg * (1 + g * (1 - sg));
        rd[r * 2 * cols + cols + c] = dd * g * sg;
        for (int64_t j : {r * 2 * cols + c, r * 2 * cols + cols + c})
          td[j] = kHalfUlpBf16 * std::abs(rd[j]) +
                  8 * kU * std::abs(dd * u * sg) * (1 + std::abs(g)) + 8 * kU * std::abs(dd * g);
      }
    EXPECT_TRUE(within(o, ro, to, "swiglu"));
    EXPECT_TRUE(within(d, rd, td, "swiglu backward"));

    // gelu backward in place, bias + gelu with the pre-activation kept, the residual add.
    const auto x = bf16_random(rows * cols, 12, -3.0f, 3.0f), y = bf16_random(rows * cols, 13),
               b = bf16_random(cols, 14);
    uint16_t* g = up(dout);
    cuda::gelu_backward_bf16(g, g, up(x), rows * cols, s);
    uint16_t* act = up(x);
    uint16_t* pre = up(std::vector<uint16_t>(rows * cols));
    cuda::bias_act_bf16(act, cols, pre, up(b), true, rows, cols, s);
    uint16_t* res = up(y);
    cuda::residual_forward_bf16(res, up(x), res, up(b), rows, cols, s);  // in place on y
    const auto gg = widen(down(g, rows * cols)), ga = widen(down(act, rows * cols)),
               gp = widen(down(pre, rows * cols)), gr = widen(down(res, rows * cols));
    std::vector<double> r1(gg.size()), t1(gg.size()), r2 = r1, t2 = r1, r3 = r1, t3 = r1, r4 = r1,
                                                      t4 = r1;
    for (int64_t i = 0; i < rows * cols; ++i) {
      const double xi = w16(x[i]), bi = w16(b[i % cols]), yi = w16(y[i]);
      r1[i] = w16(dout[i]) * gelu_tanh_grad(xi);
      t1[i] = kHalfUlpBf16 * std::abs(r1[i]) + 16 * kU * std::abs(w16(dout[i])) * (1 + xi * xi);
      // bias + x rounded to bf16 (pre), then gelu of the fp32 sum.
      r2[i] = xi + bi;
      t2[i] = kHalfUlpBf16 * std::abs(r2[i]) + kU * (std::abs(xi) + std::abs(bi));
      r3[i] = gelu_tanh(xi + bi);
      t3[i] = kHalfUlpBf16 * std::abs(r3[i]) + 16 * kU * (std::abs(xi) + std::abs(bi));
      r4[i] = xi + (yi + bi);
      t4[i] =
          kHalfUlpBf16 * std::abs(r4[i]) + 2 * kU * (std::abs(xi) + std::abs(yi) + std::abs(bi));
    }
    EXPECT_TRUE(within(gg, r1, t1, "gelu backward"));
    EXPECT_TRUE(within(gp, r2, t2, "bias pre-activation"));
    EXPECT_TRUE(within(ga, r3, t3, "bias gelu"));
    EXPECT_TRUE(within(gr, r4, t4, "residual"));
  }
}

// ---- Norms on bf16 (the fused residual add in front, the backward with dresidual).

TEST_F(CudaLowp, NormsOnBf16WithTheFusedResidualAdd) {
  for (bool layer : {false, true})
    for (int64_t cols : {int64_t{256}, int64_t{100}}) {
      SCOPED_TRACE(std::string(layer ? "layernorm" : "rmsnorm") + " cols " + std::to_string(cols));
      const int64_t rows = 7;
      const float eps = 1e-5f;
      cudaStream_t s = dev().stream();
      const auto x = bf16_random(rows * cols, 20, -2.0f, 3.0f), y = bf16_random(rows * cols, 21),
                 w = bf16_random(cols, 22, 0.5f, 1.5f), b = bf16_random(cols, 23),
                 g = bf16_random(rows * cols, 24), dres = bf16_random(rows * cols, 25);
      uint16_t* out = up(std::vector<uint16_t>(rows * cols));
      uint16_t* sum = up(std::vector<uint16_t>(rows * cols));
      const uint16_t* wd = up(w);
      const uint16_t* bd = up(b);
      cuda::norm_forward_bf16(layer, out, sum, up(x), up(y), wd, bd, rows, cols, eps, s);
      // The backward on the residual stream (sum), dx in place over dresidual.
      uint16_t* dx = up(dres);
      float* dw = up(std::vector<float>(cols, 1.0f));
      float* db = up(std::vector<float>(cols, 2.0f));
      float* scratch = up(std::vector<float>(cuda::norm_backward_bf16_scratch(rows, cols)));
      cuda::norm_backward_bf16(layer, dx, dw, layer ? db : nullptr, up(g), sum, wd, dx, rows, cols,
                               eps, scratch, s);
      const auto gsum = down(sum, rows * cols);
      const auto gout = widen(down(out, rows * cols)), gdx = widen(down(dx, rows * cols));
      const auto gdw = down(dw, cols), gdb = down(db, cols);
      std::vector<double> rsum(rows * cols), rout = rsum, tout = rsum, rdx = rsum, tdx = rsum;
      std::vector<double> rdw(cols, 1.0), tdw(cols, 0.0), rdb(cols, 2.0), tdb(cols, 0.0);
      for (int64_t r = 0; r < rows; ++r) {
        std::vector<double> v(cols);
        for (int64_t c = 0; c < cols; ++c) {
          v[c] = bf16_to_fp32(fp32_to_bf16(static_cast<float>(w16(x[r * cols + c])) +
                                           static_cast<float>(w16(y[r * cols + c]))));
          EXPECT_EQ(w16(gsum[r * cols + c]), v[c]) << "sum_out " << r << "," << c;
        }
        double mean = 0, var = 0;
        if (layer) {
          for (double t : v) mean += t;
          mean /= cols;
        }
        for (double t : v) var += (t - mean) * (t - mean);
        const double rstd = 1 / std::sqrt(var / cols + eps);
        double mdn = 0, mdnx = 0, mabs = 0, mxabs = 0;
        for (int64_t c = 0; c < cols; ++c) {
          const double dn = w16(g[r * cols + c]) * w16(w[c]), xh = (v[c] - mean) * rstd;
          mdn += dn / cols;
          mdnx += dn * xh / cols;
          mabs += std::abs(dn) / cols;
          mxabs += std::abs(dn * xh) / cols;
        }
        if (!layer) mdn = 0;
        // fp32 row sums over cols terms: relative cols * u of the sum of magnitudes, carried
        // through rstd; then the store.
        const double rel = 4 * cols * kU;
        for (int64_t c = 0; c < cols; ++c) {
          const int64_t i = r * cols + c;
          const double xh = (v[c] - mean) * rstd;
          rout[i] = xh * w16(w[c]) + (layer ? w16(b[c]) : 0.0);
          tout[i] = kHalfUlpBf16 * std::abs(rout[i]) +
                    rel * (std::abs(xh) + 1) * std::abs(w16(w[c])) + 4 * kU;
          const double dn = w16(g[i]) * w16(w[c]);
          rdx[i] = rstd * (dn - mdn - xh * mdnx) + w16(dres[i]);
          const double e =
              rel * rstd * (std::abs(dn) + mabs + std::abs(xh) * mxabs + std::abs(xh) * mabs);
          tdx[i] = kHalfUlpBf16 * (std::abs(rdx[i]) + e) + e + 2 * kU * std::abs(w16(dres[i]));
          rdw[c] += w16(g[i]) * xh;
          tdw[c] += rel * std::abs(w16(g[i])) * (std::abs(xh) + 1);
          rdb[c] += w16(g[i]);
          tdb[c] += 2 * rows * kU * std::abs(w16(g[i]));
        }
      }
      EXPECT_TRUE(within(gout, rout, tout, "out"));
      EXPECT_TRUE(within(gdx, rdx, tdx, "dx"));
      EXPECT_TRUE(within(std::vector<double>(gdw.begin(), gdw.end()), rdw, tdw, "dweight"));
      if (layer) {
        EXPECT_TRUE(within(std::vector<double>(gdb.begin(), gdb.end()), rdb, tdb, "dbias"));
      }
    }
}

// ---- RoPE on bf16: the rotation of the widened pair by the exact angle; the angle's reduction
// and sincosf's 2 ulps (relative ~4u of |u| + |v|) and the two products' roundings, then the
// store. Inverse after forward returns the input within two stores.

TEST_F(CudaLowp, RopeOnBf16ForwardAndInverse) {
  for (int64_t head_dim : {int64_t{64}, int64_t{12}}) {  // halves of 32 (16-byte groups) and 6
    SCOPED_TRACE("head_dim " + std::to_string(head_dim));
    const int64_t seq = 33, rows = 2 * seq, heads = 3, ld = heads * head_dim + 8, pos = 1000;
    const double theta = 500000.0;
    const auto x = bf16_random(rows * ld, 30, -2.0f, 2.0f);
    uint16_t* d = up(x);
    cuda::rope_bf16(d, ld, rows, seq, pos, heads, head_dim, theta, false, dev().stream());
    const auto got = widen(down(d, rows * ld));
    std::vector<double> ref = widen(x), tol(ref.size(), 0.0);
    const int64_t half = head_dim / 2;
    for (int64_t t = 0; t < rows; ++t)
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t j = 0; j < half; ++j) {
          const double ang = static_cast<double>(t % seq + pos) *
                             std::pow(theta, -2.0 * static_cast<double>(j) / head_dim);
          const int64_t ia = t * ld + h * head_dim + j, ib = ia + half;
          const double u = w16(x[ia]), v = w16(x[ib]);
          ref[ia] = u * std::cos(ang) - v * std::sin(ang);
          ref[ib] = u * std::sin(ang) + v * std::cos(ang);
          const double e = 16 * kU * (std::abs(u) + std::abs(v));
          tol[ia] = kHalfUlpBf16 * (std::abs(ref[ia]) + e) + e;
          tol[ib] = kHalfUlpBf16 * (std::abs(ref[ib]) + e) + e;
        }
    EXPECT_TRUE(within(got, ref, tol, "rope"));  // columns past the heads: tol 0, untouched
    cuda::rope_bf16(d, ld, rows, seq, pos, heads, head_dim, theta, true, dev().stream());
    const auto back = widen(down(d, rows * ld));
    // The inverse rotates the forward's errors of both members of a pair into each, then stores.
    std::vector<double> orig = widen(x), tb(orig.size(), 0.0);
    for (int64_t t = 0; t < rows; ++t)
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t j = 0; j < half; ++j) {
          const int64_t ia = t * ld + h * head_dim + j, ib = ia + half;
          const double e = tol[ia] + tol[ib] + 16 * kU * (std::abs(orig[ia]) + std::abs(orig[ib]));
          tb[ia] = kHalfUlpBf16 * (std::abs(orig[ia]) + e) + e;
          tb[ib] = kHalfUlpBf16 * (std::abs(orig[ib]) + e) + e;
        }
    EXPECT_TRUE(within(back, orig, tb, "rope inverse"));
  }
}

// ---- MoE permutation on the device: row_of and the counts equal the CPU backend's (host)
// permutation exactly, over several chunks and with skewed routing; a bad index is counted.

// The Backend's typed bf16 entries (backend.h) on the CUDA backend against the CPU backend's on
// the same inputs (those are tested against double references in
// tests/runtime/cpu/bf16_elementwise_test.cc and tiled_xent_test.cc): each output is one bf16
// rounding of an fp32 value that the two backends compute with different fp32 roundings (CUDA's
// expf/tanhf within 2 ulps, other summation orders), so the two stored values are within one bf16
// ulp of the larger (2 u |x|, u = 2^-8) plus the fp32 difference, bounded by 64 u32 of the
// row's magnitude (generous: the norm's row sums of 72 terms); the row maximum is exact; the sums
// relative to a given maximum within the block chain's bound plus the rescale's exp and product.
TEST_F(CudaLowp, TypedEntriesEqualTheCpuBackends) {
  CpuBackend cpu_be(1);
  const int64_t rows = 70, cols = 72, seq = 35;
  auto near_all = [&](const std::vector<uint16_t>& got, const std::vector<uint16_t>& want,
                      const char* what) {
    int bad = 0;
    double scale = 0;
    for (uint16_t w : want) scale = std::max(scale, std::abs(double{bf16_to_fp32(w)}));
    for (size_t i = 0; i < want.size() && bad < 5; ++i) {
      const double a = bf16_to_fp32(got[i]), b = bf16_to_fp32(want[i]);
      if (!(std::abs(a - b) <=
            2 * kHalfUlpBf16 * std::max(std::abs(a), std::abs(b)) + 64 * kU * scale)) {
        ADD_FAILURE() << what << "[" << i << "]: cuda " << a << ", cpu " << b;
        ++bad;
      }
    }
  };
  const auto x = bf16_random(rows * 2 * cols, 51, -3.0f, 3.0f), d = bf16_random(rows * cols, 52);
  const auto w = bf16_random(cols, 53, 0.5f, 1.5f), y = bf16_random(rows * cols, 54);
  for (Activation a : {Activation::kGelu, Activation::kSwiglu}) {
    const int64_t in_cols = a == Activation::kSwiglu ? 2 * cols : cols;
    std::vector<uint16_t> want(rows * cols), wd(rows * in_cols);
    cpu_be.activation_forward_bf16(a, want.data(), x.data(), rows, cols);
    cpu_be.activation_backward_bf16(a, wd.data(), d.data(), x.data(), rows, cols);
    uint16_t* out = up(std::vector<uint16_t>(rows * cols));
    uint16_t* din = up(std::vector<uint16_t>(rows * in_cols));
    const uint16_t* xin = up(x);
    dev().activation_forward_bf16(a, out, xin, rows, cols);
    dev().activation_backward_bf16(a, din, up(d), xin, rows, cols);
    near_all(down(out, want.size()), want, "activation");
    near_all(down(din, wd.size()), wd, "activation backward");
  }
  {  // residual add with a bias; its backward's bias gradient
    std::vector<uint16_t> want(rows * cols);
    cpu_be.residual_forward_bf16(want.data(), y.data(), d.data(), w.data(), rows, cols);
    uint16_t* out = up(std::vector<uint16_t>(rows * cols));
    dev().residual_forward_bf16(out, up(y), up(d), up(w), rows, cols);
    near_all(down(out, want.size()), want, "residual");
    std::vector<float> db_cpu(cols, 0.0f);
    std::vector<uint16_t> dy_cpu(rows * cols);
    cpu_be.residual_backward_bf16(dy_cpu.data(), db_cpu.data(), d.data(), rows, cols);
    float* db = up(std::vector<float>(cols, 0.0f));
    uint16_t* dy = up(std::vector<uint16_t>(rows * cols));
    dev().residual_backward_bf16(dy, db, up(d), rows, cols);
    EXPECT_EQ(down(dy, dy_cpu.size()), dy_cpu);
    const auto g = down(db, cols);
    for (int64_t c = 0; c < cols; ++c) EXPECT_NEAR(g[c], db_cpu[c], 2 * rows * kU * rows) << c;
  }
  {  // RoPE on two heads of 16 in rows of 72 columns, both directions
    for (bool inverse : {false, true}) {
      std::vector<uint16_t> want = y;
      cpu_be.rope_bf16(want.data(), cols, rows, seq, 3, 2, 16, 1e4, inverse);
      uint16_t* io = up(y);
      dev().rope_bf16(io, cols, rows, seq, 3, 2, 16, 1e4, inverse);
      near_all(down(io, want.size()), want, "rope");
    }
  }
  {  // norm backward (fp32 dweight, dbias) with the residual gradient
    for (Norm k : {Norm::kRmsNorm, Norm::kLayerNorm}) {
      std::vector<uint16_t> want(rows * cols);
      std::vector<float> dw_cpu(cols, 0.0f), db_cpu(cols, 0.0f);
      const bool ln = k == Norm::kLayerNorm;
      cpu_be.norm_backward_bf16(k, want.data(), dw_cpu.data(), ln ? db_cpu.data() : nullptr,
                                d.data(), y.data(), w.data(), y.data(), rows, cols, 1e-5f);
      uint16_t* dx = up(std::vector<uint16_t>(rows * cols));
      float* dw = up(std::vector<float>(cols, 0.0f));
      float* db = up(std::vector<float>(cols, 0.0f));
      dev().norm_backward_bf16(k, dx, dw, ln ? db : nullptr, up(d), up(y), up(w), up(y), rows, cols,
                               1e-5f);
      near_all(down(dx, want.size()), want, "norm backward");
      const auto g = down(dw, cols);
      double scale = 0;
      for (float v : dw_cpu) scale = std::max(scale, double{std::abs(v)});
      for (int64_t c = 0; c < cols; ++c) EXPECT_NEAR(g[c], dw_cpu[c], 1e-5 * scale) << c;
    }
  }
  {  // embedding: a shard [8, 40) of the vocabulary, learned positions from offset 2
    const int64_t vstart = 8, vrows = 32, positions = seq + 2;
    const auto table = bf16_random(vrows * cols, 55), pos = bf16_random(positions * cols, 56);
    std::vector<int32_t> tokens(rows);
    for (int64_t t = 0; t < rows; ++t) tokens[t] = static_cast<int32_t>((t * 13) % 48);
    std::vector<uint16_t> want(rows * cols);
    cpu_be.embedding_forward_bf16(want.data(), tokens.data(), table.data(), vstart, vrows,
                                  pos.data(), 2, rows, seq, cols);
    uint16_t* out = up(std::vector<uint16_t>(rows * cols));
    const int32_t* tok = up(tokens);
    dev().embedding_forward_bf16(out, tok, up(table), vstart, vrows, up(pos), 2, rows, seq, cols);
    EXPECT_EQ(down(out, want.size()), want);  // one fp32 add, one rounding: the same on both
    std::vector<float> dt_cpu(vrows * cols, 0.0f), dp_cpu(positions * cols, 0.0f);
    cpu_be.embedding_backward_bf16(dt_cpu.data(), dp_cpu.data(), d.data(), tokens.data(), vstart,
                                   vrows, 2, rows, seq, cols);
    float* dt = up(std::vector<float>(vrows * cols, 0.0f));
    float* dp = up(std::vector<float>(positions * cols, 0.0f));
    dev().embedding_backward_bf16(dt, dp, up(d), tok, vstart, vrows, 2, rows, seq, cols);
    const auto gt = down(dt, dt_cpu.size()), gp = down(dp, dp_cpu.size());
    // Sums of at most rows / seq + 1 (positions) or rows (tokens) terms of |x| <= 1 in another
    // order: within gamma(rows) rows.
    for (size_t i = 0; i < gt.size(); ++i) EXPECT_NEAR(gt[i], dt_cpu[i], rows * kU * rows) << i;
    for (size_t i = 0; i < gp.size(); ++i) EXPECT_NEAR(gp[i], dp_cpu[i], rows * kU * rows) << i;
  }
  {  // the tiled loss's typed pieces: the maximum, then the sums relative to a larger one
    const int64_t r = 4, vocab = 50304;
    const auto xl = xent_logits(r, vocab, 20.0f, 57);
    std::vector<uint16_t> xb(xl.size());
    for (size_t i = 0; i < xl.size(); ++i) xb[i] = fp32_to_bf16(xl[i]);
    const std::vector<int32_t> labels = {3, -1, 50000, 7};
    std::vector<float> m_cpu(r), s_cpu(r), t_cpu(r);
    cpu_be.xent_max_typed(m_cpu.data(), xb.data(), Dtype::kBf16, r, vocab);
    std::vector<float> given(m_cpu);
    for (float& g : given) g += 2.0f;
    cpu_be.xent_sums_typed(s_cpu.data(), t_cpu.data(), xb.data(), Dtype::kBf16, given.data(),
                           labels.data(), r, vocab, 0);
    const uint16_t* lg = up(xb);
    float* mx = up(std::vector<float>(r));
    float* se = up(std::vector<float>(r));
    float* tg = up(std::vector<float>(r));
    dev().xent_max_typed(mx, lg, Dtype::kBf16, r, vocab);
    EXPECT_EQ(down(mx, r), m_cpu);
    dev().xent_sums_typed(se, tg, lg, Dtype::kBf16, up(given), up(labels), r, vocab, 0);
    cpu::XentChain c = cpu::xent_block_chain(vocab, cuda::kXentThreads, cuda::kXentVec);
    c.roundings += 1;
    c.exps += 1;
    cpu::XentChain cc = cpu::xent_tiled_chain(vocab, cpu::kXentTile);
    cc.roundings += 1;
    cc.exps += 1;
    const double rel = cpu::xent_sum_rel_bound(c, kCudaExpUlps) + cpu::xent_sum_rel_bound(cc, 1);
    const auto gs = down(se, r);
    for (int64_t i = 0; i < r; ++i) EXPECT_LE(std::abs(gs[i] - s_cpu[i]), rel * s_cpu[i]) << i;
    EXPECT_EQ(down(tg, r), t_cpu);
  }
}

TEST_F(CudaLowp, MoePermutationOnTheDeviceEqualsTheCpus) {
  const int64_t tokens = 700, top_k = 2, experts = 6, n = tokens * top_k;
  std::mt19937 rng(40);
  std::vector<int32_t> idx(n);
  for (int64_t t = 0; t < tokens; ++t) {
    const int32_t a = static_cast<int32_t>(rng() % 3 == 0 ? rng() % experts : 1);  // skewed
    int32_t b = static_cast<int32_t>(rng() % experts);
    if (b == a) b = (a + 1) % experts;
    idx[t * top_k] = a;
    idx[t * top_k + 1] = b;
  }
  CpuBackend cpu;
  std::vector<int32_t> ref_rows(n);
  std::vector<int64_t> ref_counts(experts);
  cpu.moe_permutation(ref_rows.data(), ref_counts.data(), idx.data(), tokens, experts, top_k);
  int32_t* rows = up(std::vector<int32_t>(n, -7));
  int32_t* counts = up(std::vector<int32_t>(experts));
  int32_t* offsets = up(std::vector<int32_t>(experts + 1));
  int32_t* bad = up(std::vector<int32_t>(1, 0));
  int32_t* scratch = up(std::vector<int32_t>(cuda::moe_permutation_device_scratch(n, experts) + 1));
  cuda::moe_permutation_device(rows, counts, offsets, bad, up(idx), n, experts, scratch,
                               dev().stream());
  EXPECT_EQ(down(rows, n), ref_rows);
  const auto gc = down(counts, experts), go = down(offsets, experts + 1);
  int64_t off = 0;
  for (int64_t e = 0; e < experts; ++e) {
    EXPECT_EQ(gc[e], ref_counts[e]) << e;
    EXPECT_EQ(go[e], off) << e;
    off += ref_counts[e];
  }
  EXPECT_EQ(go[experts], n);
  EXPECT_EQ(down(bad, 1)[0], 0);
  idx[5] = static_cast<int32_t>(experts);  // out of range
  cuda::moe_permutation_device(rows, counts, offsets, bad, up(idx), n, experts, scratch,
                               dev().stream());
  EXPECT_EQ(down(bad, 1)[0], 1);
  EXPECT_EQ(down(rows, n)[5], -1);
}

// The device-routed MoE entries of the Backend (Backend::device_moe_routing: what the executor
// calls) against the CPU backend's (runtime/cpu/moe_device.cc, the reference): the permutation
// equal, and the grouped expert GEMMs from device offsets (forward with bias, data gradient,
// fp32 weight gradient; a bf16 one falls back to the host counts, counted) within one bf16
// rounding of each stored output per backend, norm-wise: ||gpu - cpu|| <= 2 u ||cpu|| (u =
// 2^-8; the fp32 sums of the same exact products in other orders are far below).
TEST_F(CudaLowp, DeviceRoutedExpertEntriesEqualTheCpus) {
  const int64_t tokens = 150, top_k = 2, experts = 3, rows = tokens * top_k, n = 48, k = 32;
  std::mt19937 rng(71);
  std::vector<int32_t> idx(rows);
  for (int64_t t = 0; t < tokens; ++t) {
    idx[t * top_k] = static_cast<int32_t>(rng() % experts);
    idx[t * top_k + 1] =
        static_cast<int32_t>((idx[t * top_k] + 1 + rng() % (experts - 1)) % experts);
  }
  CpuBackend cpu;
  std::vector<int32_t> c_rows(rows), c_counts(experts), c_off(experts + 1);
  int32_t c_bad = 0;
  cpu.moe_permutation_device(c_rows.data(), c_counts.data(), c_off.data(), &c_bad, idx.data(),
                             tokens, experts, top_k);
  int32_t* g_rows = up(std::vector<int32_t>(rows));
  int32_t* g_counts = up(std::vector<int32_t>(experts));
  int32_t* g_off = up(std::vector<int32_t>(experts + 1));
  int32_t* g_bad = up(std::vector<int32_t>(1, 0));
  dev().moe_permutation_device(g_rows, g_counts, g_off, g_bad, up(idx), tokens, experts, top_k);
  EXPECT_EQ(down(g_rows, rows), c_rows);
  EXPECT_EQ(down(g_off, experts + 1), c_off);
  EXPECT_EQ(down(g_bad, 1)[0], 0);
  EXPECT_EQ(c_bad, 0);
  const auto a = bf16_random(rows * k, 72), w = bf16_random(experts * k * n, 73),
             bias = bf16_random(experts * n, 74), g = bf16_random(rows * n, 75);
  auto rel = [](const std::vector<double>& x, const std::vector<double>& y) {
    double d = 0, r = 0;
    for (size_t i = 0; i < x.size(); ++i) d += (x[i] - y[i]) * (x[i] - y[i]), r += y[i] * y[i];
    return std::sqrt(d / r);
  };
  // Forward.
  std::vector<uint16_t> c_out(rows * n);
  cpu.expert_linear_forward_bf16_dev(c_out.data(), a.data(), w.data(), bias.data(), c_off.data(),
                                     experts, rows, n, k);
  uint16_t* g_out = up(std::vector<uint16_t>(rows * n));
  dev().expert_linear_forward_bf16_dev(g_out, up(a), up(w), up(bias), g_off, experts, rows, n, k);
  EXPECT_LE(rel(widen(down(g_out, rows * n)), widen(c_out)), 2 * kHalfUlpBf16);
  // Data gradient.
  std::vector<uint16_t> c_din(rows * k);
  cpu.expert_linear_backward_data_bf16_dev(c_din.data(), g.data(), w.data(), c_off.data(), experts,
                                           rows, n, k);
  uint16_t* g_din = up(std::vector<uint16_t>(rows * k));
  dev().expert_linear_backward_data_bf16_dev(g_din, up(g), up(w), g_off, experts, rows, n, k);
  EXPECT_LE(rel(widen(down(g_din, rows * k)), widen(c_din)), 2 * kHalfUlpBf16);
  // Weight gradient, fp32 (grouped kernel) and bf16 (the counted host fallback).
  std::vector<float> c_dw(experts * k * n, 0.0f);
  cpu.expert_linear_backward_weight_bf16_dev(c_dw.data(), Dtype::kFp32, nullptr, a.data(), g.data(),
                                             c_off.data(), experts, rows, n, k);
  float* g_dw = up(std::vector<float>(experts * k * n, 0.0f));
  const int64_t before = dev().library_counts().moe_host_fallbacks;
  dev().expert_linear_backward_weight_bf16_dev(g_dw, Dtype::kFp32, nullptr, up(a), up(g), g_off,
                                               experts, rows, n, k);
  EXPECT_EQ(dev().library_counts().moe_host_fallbacks, before);
  const auto gdw = down(g_dw, experts * k * n);
  EXPECT_LE(rel(std::vector<double>(gdw.begin(), gdw.end()),
                std::vector<double>(c_dw.begin(), c_dw.end())),
            kU * rows * std::sqrt(double(rows)));  // fp32 sums of <= rows exact products of
                                                   // unit-scale terms in other orders
  uint16_t* g_dw16 = up(std::vector<uint16_t>(experts * k * n, 0));
  dev().expert_linear_backward_weight_bf16_dev(g_dw16, Dtype::kBf16, nullptr, up(a), up(g), g_off,
                                               experts, rows, n, k);
  EXPECT_EQ(dev().library_counts().moe_host_fallbacks, before + 1);
  EXPECT_LE(
      rel(widen(down(g_dw16, experts * k * n)), std::vector<double>(c_dw.begin(), c_dw.end())),
      2 * kHalfUlpBf16);
}

// ---- CUDA graphs: record a bf16 linear + GELU + residual sequence once, replay it on new inputs
// (copied into the same buffers outside the recording) and compare with the eager calls.

TEST_F(CudaLowp, GraphReplayEqualsTheEagerCallsAndRefusesHostCopies) {
  const int64_t m = 32, n = 64, k = 48;
  const auto w = bf16_random(k * n, 50), b = bf16_random(n, 51);
  uint16_t* in = up(bf16_random(m * k, 52));
  uint16_t* out = up(std::vector<uint16_t>(m * n));
  uint16_t* pre = up(std::vector<uint16_t>(m * n));
  uint16_t* res = up(std::vector<uint16_t>(m * n));
  const uint16_t* wd = up(w);
  const uint16_t* bd = up(b);
  auto step = [&] {
    dev().linear_forward_bf16(out, in, wd, WeightLayout::kInOut, bd, pre, m, n, k);
    cuda::residual_forward_bf16(res, pre, out, nullptr, m, n, dev().stream());
  };
  step();  // warm-up: plans cached, nothing allocated inside the recording
  dev().begin_capture();
  step();
  const int g = dev().end_capture();
  for (uint32_t seed : {53u, 54u}) {
    const auto x = bf16_random(m * k, seed);
    dev().copy(in, x.data(), x.size() * 2);
    dev().replay(g);
    const auto graphed = down(res, m * n);
    step();
    EXPECT_EQ(graphed, down(res, m * n)) << "seed " << seed;
  }
  EXPECT_EQ(dev().graph_replays(), 2);
  std::vector<uint16_t> host(4);
  dev().begin_capture();
  EXPECT_THROW(dev().copy(host.data(), out, 8), ::parasol::Error);
  EXPECT_FALSE(dev().capturing());
  step();  // the backend still runs eagerly
  dev().synchronize();
}

// ---- Grouped expert GEMMs with the row ranges on the device: an empty expert, counts that are
// not multiples of the 64-row tile, K not a multiple of the 32-wide step.

TEST_F(CudaLowp, GroupedExpertGemmsOnDeviceOffsets) {
  const std::vector<int32_t> offsets = {0, 70, 70, 200};  // experts of 70, 0 and 130 rows
  const int64_t experts = 3, rows = 200, n = 72, k = 40;
  const auto a = bf16_random(rows * k, 60), w = bf16_random(experts * k * n, 61),
             bias = bf16_random(experts * n, 62), g = bf16_random(rows * n, 63);
  const int32_t* off = up(offsets);
  auto expert_of = [&](int64_t r) {
    int64_t e = 0;
    while (r >= offsets[e + 1]) ++e;
    return e;
  };
  for (bool trans : {false, true}) {
    SCOPED_TRACE(trans ? "B stored [N x K]" : "B stored [K x N]");
    uint16_t* out = up(std::vector<uint16_t>(rows * n));
    cuda::grouped_gemm_bf16(out, up(a), up(w), up(bias), off, experts, rows + 16, n, k, trans,
                            dev().stream());
    const auto got = widen(down(out, rows * n));
    std::vector<double> ref(got.size()), tol(got.size());
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t e = expert_of(r);
      for (int64_t c2 = 0; c2 < n; ++c2) {
        double s = w16(bias[e * n + c2]), sa = std::abs(s);
        for (int64_t p = 0; p < k; ++p) {
          const double bw = trans ? w16(w[e * k * n + c2 * k + p]) : w16(w[e * k * n + p * n + c2]);
          s += w16(a[r * k + p]) * bw;
          sa += std::abs(w16(a[r * k + p]) * bw);
        }
        const double e2 = 2 * (k + 1) * kU * sa;
        ref[r * n + c2] = s;
        tol[r * n + c2] = kHalfUlpBf16 * (std::abs(s) + e2) + e2;
      }
    }
    EXPECT_TRUE(within(got, ref, tol, "grouped out"));
  }
  // dW_e += A_e^T G_e, fp32, onto 0.5.
  float* dw = up(std::vector<float>(experts * k * n, 0.5f));
  cuda::grouped_gemm_bf16_wgrad(dw, up(a), up(g), off, experts, n, k, dev().stream());
  const auto gdw = down(dw, experts * k * n);
  std::vector<double> got(gdw.begin(), gdw.end()), ref(got.size()), tol(got.size());
  for (int64_t e = 0; e < experts; ++e)
    for (int64_t p = 0; p < k; ++p)
      for (int64_t c2 = 0; c2 < n; ++c2) {
        double s = 0.5, sa = 0.5;
        for (int64_t r = offsets[e]; r < offsets[e + 1]; ++r) {
          s += w16(a[r * k + p]) * w16(g[r * n + c2]);
          sa += std::abs(w16(a[r * k + p]) * w16(g[r * n + c2]));
        }
        const int64_t i = e * k * n + p * n + c2;
        ref[i] = s;
        tol[i] = 2 * (offsets[e + 1] - offsets[e] + 2) * kU * sa;
      }
  EXPECT_TRUE(within(got, ref, tol, "grouped dW"));
}

// ---- Attention on bf16 storage (CudaBackend::attention_*_bf16) against the CPU backend's typed
// attention (itself held to the fp32 kernel in tests/runtime/cpu/attention_bf16_test.cc) on the
// same bf16 Q | K | V rows (fused, strided, GQA), with a ring step (accumulate, accumulate_dq,
// accumulate_dkv). Two routes:
//  * cuDNN's SDPA on the buffers in place: cuDNN's own bf16 roundings (P for P V and the output:
//    2 in the forward; P, dS and the gradient's output and O read back: 3 along a gradient's
//    path; see cuda_kernels_test's CudnnSdpa) plus the CPU's one rounding of each output, as
//    independent zero-mean errors (Higham & Mary): norm-wise within lambda sqrt(r) u, r = 3
//    forward and 4 backward, one more for each merge or add of a ring step.
//  * parasol's fp32 kernel on widened copies (set_fused_attention(false), and every fallback):
//    the same fp32 attention as the CPU's up to summation order (the fp32 kernels agree within
//    1e-5), then one rounding each: element-wise within 2 u of the larger magnitude plus 1e-5 of
//    the tensor's scale.
// The counts: fused calls counted as such with cuDNN; no call counted as a fallback.
double rel_norm(const std::vector<uint16_t>& got, const std::vector<uint16_t>& want) {
  double d2 = 0, r2 = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double a = bf16_to_fp32(got[i]), b = bf16_to_fp32(want[i]);
    d2 += (a - b) * (a - b);
    r2 += b * b;
  }
  return r2 > 0 ? std::sqrt(d2 / r2) : std::sqrt(d2);
}

class CudaLowpAttention : public CudaLowp {
 protected:
  void typed_attention_case(bool fused);
};

void CudaLowpAttention::typed_attention_case(bool fused) {
  CudaLowpAttention& t = *this;
  SCOPED_TRACE(fused ? "cuDNN" : "parasol's kernel");
  if (fused && !CudaBackend::cudnn_built()) GTEST_FAIL() << "this CUDA build has no cuDNN frontend";
  CpuBackend cpu_be(1);
  dev().set_fused_attention(fused);
  const int64_t B = 2, S = 96, H = 8, KVH = 2, D = 64;
  AttentionDims d;
  d.batch = B;
  d.seq_q = S;
  d.seq_kv = S;
  d.heads = H;
  d.kv_heads = KVH;
  d.head_dim = D;
  d.ld_q = d.ld_kv = (H + 2 * KVH) * D;
  d.ld_o = H * D;
  const int64_t T = B * S, koff = H * D, voff = koff + KVH * D;
  const auto qkv = bf16_random(T * d.ld_q, 61, -2.0f, 2.0f), kv0 = bf16_random(T * d.ld_q, 62);
  const auto dout = bf16_random(T * d.ld_o, 63);
  // An earlier ring step's chunk (every key visible), then this chunk merged (accumulate).
  AttentionDims d0 = d;
  d0.causal_offset = S;
  std::vector<uint16_t> out(T * d.ld_o), dqkv(T * d.ld_q), dkv0(T * d.ld_q, 0);
  std::vector<float> lse(B * H * S);
  cpu_be.attention_forward_bf16(d0, out.data(), lse.data(), qkv.data(), kv0.data() + koff,
                                kv0.data() + voff, false);
  cpu_be.attention_forward_bf16(d, out.data(), lse.data(), qkv.data(), qkv.data() + koff,
                                qkv.data() + voff, true);
  cpu_be.attention_backward_bf16(d, dqkv.data(), dqkv.data() + koff, dqkv.data() + voff,
                                 dout.data(), qkv.data(), qkv.data() + koff, qkv.data() + voff,
                                 out.data(), lse.data(), false, false);
  cpu_be.attention_backward_bf16(d0, dqkv.data(), dkv0.data() + koff, dkv0.data() + voff,
                                 dout.data(), qkv.data(), kv0.data() + koff, kv0.data() + voff,
                                 out.data(), lse.data(), true, true);
  const CudaBackend::LibraryCounts before = dev().library_counts();
  const uint16_t* gq = t.up(qkv);
  const uint16_t* g0 = t.up(kv0);
  uint16_t* gout = t.up(std::vector<uint16_t>(out.size()));
  uint16_t* gd = t.up(std::vector<uint16_t>(dqkv.size()));
  uint16_t* gd0 = t.up(std::vector<uint16_t>(dkv0.size(), 0));
  float* glse = t.up(std::vector<float>(lse.size()));
  dev().attention_forward_bf16(d0, gout, glse, gq, g0 + koff, g0 + voff, false);
  dev().attention_forward_bf16(d, gout, glse, gq, gq + koff, gq + voff, true);
  dev().attention_backward_bf16(d, gd, gd + koff, gd + voff, t.up(dout), gq, gq + koff, gq + voff,
                                gout, glse, false, false);
  dev().attention_backward_bf16(d0, gd, gd0 + koff, gd0 + voff, t.up(dout), gq, g0 + koff,
                                g0 + voff, gout, glse, true, true);
  const auto o = t.down(gout, out.size()), g = t.down(gd, dqkv.size()),
             g0k = t.down(gd0, dkv0.size());
  const auto l = t.down(glse, lse.size());
  dev().set_fused_attention(true);
  for (size_t i = 0; i < lse.size(); ++i)
    ASSERT_NEAR(l[i], lse[i], 1e-5 * (1 + std::abs(lse[i]))) << "lse[" << i << "]";
  if (fused) {
    const double u = kHalfUlpBf16, lambda = 6;
    EXPECT_LT(rel_norm(o, out), lambda * std::sqrt(3.0 + 1) * u) << "out";
    EXPECT_LT(rel_norm(g, dqkv), lambda * std::sqrt(4.0 + 1) * u) << "dQ | dK | dV";
    EXPECT_LT(rel_norm(g0k, dkv0), lambda * std::sqrt(4.0 + 1) * u) << "the chunk's dK | dV";
    EXPECT_EQ(dev().library_counts().attention_fused - before.attention_fused, 4);
  } else {
    auto near_all = [](const std::vector<uint16_t>& got, const std::vector<uint16_t>& want,
                       const char* what) {
      double scale = 0;
      for (uint16_t w : want) scale = std::max(scale, std::abs(double{bf16_to_fp32(w)}));
      int bad = 0;
      for (size_t i = 0; i < want.size() && bad < 5; ++i) {
        const double a = bf16_to_fp32(got[i]), b = bf16_to_fp32(want[i]);
        if (!(std::abs(a - b) <=
              2 * kHalfUlpBf16 * std::max(std::abs(a), std::abs(b)) + 1e-5 * scale)) {
          ADD_FAILURE() << what << "[" << i << "]: cuda " << a << ", cpu " << b;
          ++bad;
        }
      }
    };
    near_all(o, out, "out");
    near_all(g, dqkv, "dQ | dK | dV");
    near_all(g0k, dkv0, "the chunk's dK | dV");
    EXPECT_EQ(dev().library_counts().attention_fused, before.attention_fused);
  }
  EXPECT_EQ(dev().library_counts().attention_fallbacks, before.attention_fallbacks);
}

TEST_F(CudaLowpAttention, TypedAttentionThroughCudnnEqualsTheCpus) { typed_attention_case(true); }

TEST_F(CudaLowpAttention, TypedAttentionThroughParasolsKernelEqualsTheCpus) {
  typed_attention_case(false);
}

// MoE's dispatch and combine on bf16 rows against the CPU backend's (moe_bf16.cc): the same fp32
// sums (the device may contract them into FMAs: another fp32 rounding), then one rounding each,
// so a stored value may land on the other bf16 neighbour: within 2 u of the larger magnitude
// plus 1e-5 of the tensor's scale; the dispatch's forward copies (bit equal); the gates'
// gradient, an fp32 dot product summed in another order, within 1e-5 of its scale.
TEST_F(CudaLowp, MoeDispatchAndCombineOnBf16EqualTheCpus) {
  CpuBackend cpu_be(1);
  const int64_t tokens = 33, top_k = 2, E = 4, cols = 72, rows = tokens * top_k;
  std::vector<int32_t> idx(rows);
  for (int64_t i = 0; i < rows; ++i) idx[i] = static_cast<int32_t>((i * 7 + i / 2) % E);
  for (int64_t t = 0; t < tokens; ++t)
    if (idx[t * 2] == idx[t * 2 + 1]) idx[t * 2 + 1] = (idx[t * 2] + 1) % E;
  std::vector<int32_t> row_of(rows);
  std::vector<int64_t> counts(E);
  cpu_be.moe_permutation(row_of.data(), counts.data(), idx.data(), tokens, E, top_k);
  std::vector<float> w;
  for (uint16_t h : bf16_random(rows, 71, 0.1f, 0.9f)) w.push_back(bf16_to_fp32(h));
  const auto x = bf16_random(tokens * cols, 72), dr = bf16_random(rows * cols, 73),
             er = bf16_random(rows * cols, 74), dy = bf16_random(tokens * cols, 75);
  auto near_all = [](const std::vector<uint16_t>& got, const std::vector<uint16_t>& want,
                     const char* what) {
    double scale = 0;
    for (uint16_t v : want) scale = std::max(scale, std::abs(double{bf16_to_fp32(v)}));
    int bad = 0;
    for (size_t i = 0; i < want.size() && bad < 5; ++i) {
      const double a = bf16_to_fp32(got[i]), b = bf16_to_fp32(want[i]);
      if (!(std::abs(a - b) <=
            2 * kHalfUlpBf16 * std::max(std::abs(a), std::abs(b)) + 1e-5 * scale)) {
        ADD_FAILURE() << what << "[" << i << "]: cuda " << a << ", cpu " << b;
        ++bad;
      }
    }
  };
  const int32_t* g_row = up(row_of);
  const float* g_w = up(w);
  std::vector<uint16_t> out(rows * cols), dx(tokens * cols), y(tokens * cols), de(rows * cols);
  std::vector<float> dw(rows);
  cpu_be.dispatch_forward_bf16(out.data(), x.data(), row_of.data(), tokens, top_k, cols);
  cpu_be.dispatch_backward_bf16(dx.data(), dr.data(), row_of.data(), tokens, top_k, cols);
  cpu_be.combine_forward_bf16(y.data(), er.data(), w.data(), row_of.data(), tokens, top_k, cols);
  cpu_be.combine_backward_bf16(de.data(), dw.data(), dy.data(), er.data(), w.data(), row_of.data(),
                               tokens, top_k, cols);
  uint16_t* g_out = up(std::vector<uint16_t>(out.size()));
  uint16_t* g_dx = up(std::vector<uint16_t>(dx.size()));
  uint16_t* g_y = up(std::vector<uint16_t>(y.size()));
  uint16_t* g_de = up(std::vector<uint16_t>(de.size()));
  float* g_dw = up(std::vector<float>(dw.size()));
  const uint16_t* g_er = up(er);
  dev().dispatch_forward_bf16(g_out, up(x), g_row, tokens, top_k, cols);
  dev().dispatch_backward_bf16(g_dx, up(dr), g_row, tokens, top_k, cols);
  dev().combine_forward_bf16(g_y, g_er, g_w, g_row, tokens, top_k, cols);
  dev().combine_backward_bf16(g_de, g_dw, up(dy), g_er, g_w, g_row, tokens, top_k, cols);
  EXPECT_EQ(down(g_out, out.size()), out);
  near_all(down(g_dx, dx.size()), dx, "dispatch backward");
  near_all(down(g_y, y.size()), y, "combine forward");
  near_all(down(g_de, de.size()), de, "combine backward rows");
  const auto gdw = down(g_dw, dw.size());
  double scale = 0;
  for (float v : dw) scale = std::max(scale, std::abs(double{v}));
  for (size_t i = 0; i < dw.size(); ++i) EXPECT_NEAR(gdw[i], dw[i], 1e-5 * scale) << i;
}

}  // namespace
}  // namespace parasol::runtime::test
