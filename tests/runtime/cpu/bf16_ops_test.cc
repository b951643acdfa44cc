// The CPU backend's typed bf16 entries (runtime/cpu/bf16_ops.cc) on shapes that leave partial tiles
// (rows and columns not multiples of the 64 x 256 tiles), both weight layouts.
//  * GEMMs (forward, data and weight gradients) against a double reference. The operands are bf16,
//  so each product a_i b_i (8 x 8
//    significant bits) is exact in fp32 and the only fp32 error is the summation of the t terms
//    (k products, plus the bias or the accumulated din): |s - r| <= gamma_t S, gamma_t =
//    t u32 / (1 - t u32), u32 = 2^-24, S = the sum of the terms' magnitudes (Higham, "Accuracy
//    and Stability of Numerical Algorithms", 2002, eq. 3.5). The stored value rounds s once to
//    bf16 (u = 2^-8): |bf16(s) - r| <= u (|r| + gamma_t S) + gamma_t S. An element of a wrong
//    tile, a wrong layout stride or a lost accumulation is off by O(|r|), far beyond.
//  * GELU epilogues against the backend's fp32 kernels applied to the fp32 GEMM on the widened
//    operands and rounded once (the widening path): the two pre-activations differ by at most
//    2 gamma_t S (two summation orders), the GELU's slope is at most 1.13 (max of the tanh form's
//    derivative, 1.1289 at x = 1.5), and each side's rounding to bf16 adds at most one ulp of
//    bf16 at the larger magnitude.
//  * Norms against the fp32 norm_forward on the widened operands, rounded once: equal bit for bit
//    (the typed entry runs the same fp32 row kernel on each row's widened values).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "kernel_test_util.h"
#include "runtime/tensor.h"

namespace parasol::runtime {
namespace {

using test::cpu;
using test::random_floats;

constexpr double kU = 1.0 / 256;           // bf16 unit roundoff (8 significant bits)
constexpr double kU32 = 1.0 / 16777216.0;  // fp32's, 2^-24

double gamma(int64_t t) { return t * kU32 / (1 - t * kU32); }

std::vector<uint16_t> random_bf16(int64_t n, uint32_t seed) {
  std::vector<uint16_t> v(static_cast<size_t>(n));
  const std::vector<float> f = random_floats(n, seed);
  for (size_t i = 0; i < v.size(); ++i) v[i] = fp32_to_bf16(f[i]);
  return v;
}
std::vector<float> widen(const std::vector<uint16_t>& v) {
  std::vector<float> f(v.size());
  for (size_t i = 0; i < v.size(); ++i) f[i] = bf16_to_fp32(v[i]);
  return f;
}
double b(uint16_t x) { return bf16_to_fp32(x); }
// One bf16 ulp at |x| (8 significant bits).
double ulp(double x) {
  if (x == 0) return std::ldexp(1.0, -133);
  return std::ldexp(1.0, std::ilogb(x) - 7);
}

// Element (p, j) of the logical W[k x n] stored in `layout`.
double w_at(const std::vector<uint16_t>& w, WeightLayout layout, int64_t p, int64_t j, int64_t n,
            int64_t k) {
  return b(layout == WeightLayout::kInOut ? w[p * n + j] : w[j * k + p]);
}

struct Shape {
  int64_t m, n, k;
};
const Shape kShapes[] = {{150, 300, 70}, {64, 256, 33}, {7, 513, 260}};

TEST(Bf16Ops, LinearForwardAgainstDouble) {
  for (const Shape s : kShapes)
    for (WeightLayout layout : {WeightLayout::kInOut, WeightLayout::kOutIn})
      for (bool with_bias : {false, true}) {
        SCOPED_TRACE(::testing::Message() << s.m << "x" << s.n << "x" << s.k << " layout "
                                          << static_cast<int>(layout) << " bias " << with_bias);
        const auto in = random_bf16(s.m * s.k, 1), w = random_bf16(s.k * s.n, 2),
                   bias = random_bf16(s.n, 3);
        std::vector<uint16_t> out(s.m * s.n);
        cpu().linear_forward_bf16(out.data(), in.data(), w.data(), layout,
                                  with_bias ? bias.data() : nullptr, nullptr, s.m, s.n, s.k);
        const double g = gamma(s.k + 1);
        int bad = 0;
        for (int64_t i = 0; i < s.m; ++i)
          for (int64_t j = 0; j < s.n; ++j) {
            double r = with_bias ? b(bias[j]) : 0, S = std::fabs(r);
            for (int64_t p = 0; p < s.k; ++p) {
              const double t = b(in[i * s.k + p]) * w_at(w, layout, p, j, s.n, s.k);
              r += t;
              S += std::fabs(t);
            }
            const double bound = kU * (std::fabs(r) + g * S) + g * S;
            if (!(std::fabs(b(out[i * s.n + j]) - r) <= bound) && ++bad <= 3)
              ADD_FAILURE() << "out[" << i << "][" << j << "] = " << b(out[i * s.n + j])
                            << ", reference " << r << ", bound " << bound;
          }
        EXPECT_EQ(bad, 0);
      }
}

TEST(Bf16Ops, LinearBackwardDataAgainstDouble) {
  for (const Shape s : kShapes)
    for (WeightLayout layout : {WeightLayout::kInOut, WeightLayout::kOutIn})
      for (bool acc : {false, true}) {
        SCOPED_TRACE(::testing::Message() << s.m << "x" << s.n << "x" << s.k << " layout "
                                          << static_cast<int>(layout) << " accumulate " << acc);
        const auto dout = random_bf16(s.m * s.n, 4), w = random_bf16(s.k * s.n, 5);
        const auto din0 = random_bf16(s.m * s.k, 6);
        std::vector<uint16_t> din = din0;
        cpu().linear_backward_data_bf16(din.data(), dout.data(), w.data(), layout, nullptr, nullptr,
                                        s.m, s.n, s.k, acc);
        const double g = gamma(s.n + 1);
        int bad = 0;
        for (int64_t i = 0; i < s.m; ++i)
          for (int64_t p = 0; p < s.k; ++p) {
            double r = acc ? b(din0[i * s.k + p]) : 0, S = std::fabs(r);
            for (int64_t j = 0; j < s.n; ++j) {
              const double t = b(dout[i * s.n + j]) * w_at(w, layout, p, j, s.n, s.k);
              r += t;
              S += std::fabs(t);
            }
            const double bound = kU * (std::fabs(r) + g * S) + g * S;
            if (!(std::fabs(b(din[i * s.k + p]) - r) <= bound) && ++bad <= 3)
              ADD_FAILURE() << "din[" << i << "][" << p << "] = " << b(din[i * s.k + p])
                            << ", reference " << r << ", bound " << bound;
          }
        EXPECT_EQ(bad, 0);
      }
}

// dW (+)= in^T dout into fp32 or bf16, dbias += column sums of dout (fp32), against double:
// the m products and the accumulated value summed in fp32 (gamma_(m+1)), rounded once for bf16.
TEST(Bf16Ops, LinearBackwardWeightAgainstDouble) {
  for (const Shape s : kShapes)
    for (WeightLayout layout : {WeightLayout::kInOut, WeightLayout::kOutIn})
      for (Dtype dt : {Dtype::kFp32, Dtype::kBf16}) {
        SCOPED_TRACE(::testing::Message() << s.m << "x" << s.n << "x" << s.k << " layout "
                                          << static_cast<int>(layout) << " " << dtype_name(dt));
        const auto in = random_bf16(s.m * s.k, 15), dout = random_bf16(s.m * s.n, 16),
                   dw0 = random_bf16(s.k * s.n, 17);
        const std::vector<float> fdw0 = widen(dw0);
        std::vector<uint16_t> dwb = dw0;
        std::vector<float> dwf = fdw0, dbias(s.n, 0.25f);
        void* dw = dt == Dtype::kBf16 ? static_cast<void*>(dwb.data()) : dwf.data();
        cpu().linear_backward_weight_bf16(dw, dt, dbias.data(), in.data(), dout.data(), layout, s.m,
                                          s.n, s.k);
        const double g = gamma(s.m + 1);
        const double u = dt == Dtype::kBf16 ? kU : 0;
        int bad = 0;
        for (int64_t p = 0; p < s.k; ++p)
          for (int64_t j = 0; j < s.n; ++j) {
            const int64_t at = layout == WeightLayout::kInOut ? p * s.n + j : j * s.k + p;
            double r = fdw0[at], S = std::fabs(r);
            for (int64_t i = 0; i < s.m; ++i) {
              const double t = b(in[i * s.k + p]) * b(dout[i * s.n + j]);
              r += t;
              S += std::fabs(t);
            }
            const double got = dt == Dtype::kBf16 ? b(dwb[at]) : dwf[at];
            const double bound = u * (std::fabs(r) + g * S) + g * S;
            if (!(std::fabs(got - r) <= bound) && ++bad <= 3)
              ADD_FAILURE() << "dw(" << p << ", " << j << ") = " << got << ", reference " << r
                            << ", bound " << bound;
          }
        EXPECT_EQ(bad, 0);
        for (int64_t j = 0; j < s.n; ++j) {
          double r = 0.25, S = 0.25;
          for (int64_t i = 0; i < s.m; ++i) {
            r += b(dout[i * s.n + j]);
            S += std::fabs(b(dout[i * s.n + j]));
          }
          EXPECT_NEAR(dbias[j], r, g * S) << "dbias[" << j << "]";
        }
      }
}

// The GELU epilogues (forward: gelu_pre and out; backward: din through gelu' and the bias
// gradient of din) against the widening path.
TEST(Bf16Ops, GeluEpiloguesAgainstTheWideningPath) {
  const Shape s{150, 300, 70};
  for (WeightLayout layout : {WeightLayout::kInOut, WeightLayout::kOutIn}) {
    SCOPED_TRACE(static_cast<int>(layout));
    const auto in = random_bf16(s.m * s.k, 7), w = random_bf16(s.k * s.n, 8),
               bias = random_bf16(s.n, 9);
    std::vector<uint16_t> out(s.m * s.n), pre(s.m * s.n);
    cpu().linear_forward_bf16(out.data(), in.data(), w.data(), layout, bias.data(), pre.data(), s.m,
                              s.n, s.k);
    const std::vector<float> fin = widen(in), fw = widen(w), fb = widen(bias);
    std::vector<float> fpre(s.m * s.n), fout(s.m * s.n);
    cpu().linear_forward(fpre.data(), fin.data(), fw.data(), layout, fb.data(), s.m, s.n, s.k);
    cpu().activation_forward(Activation::kGelu, fout.data(), fpre.data(), s.m, s.n);
    // S per element: |bias| + sum |a_i b_i| <= 1 + k (operands in [-1, 1]).
    const double delta = 2 * gamma(s.k + 1) * (1.0 + s.k);
    int bad = 0;
    for (int64_t e = 0; e < s.m * s.n; ++e) {
      const double p0 = fp32_to_bf16(fpre[e]) == pre[e] ? 0 : 1;
      const double dp = std::fabs(b(pre[e]) - b(fp32_to_bf16(fpre[e])));
      const double dg = std::fabs(b(out[e]) - b(fp32_to_bf16(fout[e])));
      const double big_p = std::max(std::fabs(b(pre[e])), std::fabs(double(fpre[e])));
      const double big_g = std::max(std::fabs(b(out[e])), std::fabs(double(fout[e])));
      if ((p0 != 0 && !(dp <= delta + ulp(big_p))) || !(dg <= 1.13 * delta + ulp(big_g)))
        if (++bad <= 3) ADD_FAILURE() << "element " << e << ": pre " << dp << ", gelu " << dg;
    }
    EXPECT_EQ(bad, 0);

    // Backward: din = gelu'(pre) * (dout W^T) into a [m x k] buffer (pre of that shape).
    const auto dout = random_bf16(s.m * s.n, 10), pre_k = random_bf16(s.m * s.k, 11);
    std::vector<uint16_t> din(s.m * s.k, fp32_to_bf16(5.0f));  // overwritten
    std::vector<float> dbias(s.k, 0.5f), fdbias(s.k, 0.5f);
    cpu().linear_backward_data_bf16(din.data(), dout.data(), w.data(), layout, pre_k.data(),
                                    dbias.data(), s.m, s.n, s.k, true);
    const std::vector<float> fdout = widen(dout), fprek = widen(pre_k);
    std::vector<float> fdin(s.m * s.k);
    cpu().linear_backward_data(fdin.data(), fdout.data(), fw.data(), layout, s.m, s.n, s.k, false);
    cpu().activation_backward(Activation::kGelu, fdin.data(), fdin.data(), fprek.data(), s.m, s.k);
    for (int64_t i = 0; i < s.m; ++i)
      for (int64_t p = 0; p < s.k; ++p) fdbias[p] += fdin[i * s.k + p];
    // gelu' of the tanh form lies in [-0.13, 1.13]: the GEMMs' difference scaled by 1.13.
    const double delta_b = 1.13 * 2 * gamma(s.n) * s.n;
    bad = 0;
    for (int64_t e = 0; e < s.m * s.k; ++e) {
      const double d = std::fabs(b(din[e]) - b(fp32_to_bf16(fdin[e])));
      const double big = std::max(std::fabs(b(din[e])), std::fabs(double(fdin[e])));
      if (!(d <= delta_b + ulp(big)) && ++bad <= 3)
        ADD_FAILURE() << "din element " << e << ": " << b(din[e]) << " vs " << fdin[e];
    }
    EXPECT_EQ(bad, 0);
    // dbias: m values of din (each within delta_b of the other side's) summed in fp32 by two
    // orders: within m delta_b + 2 gamma_m (sum of |din|).
    for (int64_t p = 0; p < s.k; ++p) {
      double mag = 0;
      for (int64_t i = 0; i < s.m; ++i) mag += std::fabs(fdin[i * s.k + p]);
      EXPECT_NEAR(dbias[p], fdbias[p], s.m * delta_b + 2 * gamma(s.m + 1) * (mag + 0.5))
          << "dbias[" << p << "]";
    }
  }
}

TEST(Bf16Ops, NormForwardEqualsTheWideningPathBitForBit) {
  for (Norm kind : {Norm::kLayerNorm, Norm::kRmsNorm})
    for (int64_t rows : {1, 64, 130}) {
      const int64_t cols = 96;
      SCOPED_TRACE(::testing::Message() << static_cast<int>(kind) << " rows " << rows);
      const auto x = random_bf16(rows * cols, 12), wt = random_bf16(cols, 13),
                 bias = random_bf16(cols, 14);
      const bool ln = kind == Norm::kLayerNorm;
      std::vector<uint16_t> out(rows * cols);
      cpu().norm_forward_bf16(kind, out.data(), x.data(), wt.data(), ln ? bias.data() : nullptr,
                              rows, cols, 1e-5f);
      const std::vector<float> fx = widen(x), fw = widen(wt), fb = widen(bias);
      std::vector<float> fo(rows * cols);
      cpu().norm_forward(kind, fo.data(), fx.data(), fw.data(), ln ? fb.data() : nullptr, rows,
                         cols, 1e-5f);
      int bad = 0;
      for (int64_t e = 0; e < rows * cols; ++e)
        if (out[e] != fp32_to_bf16(fo[e]) && ++bad <= 3)
          ADD_FAILURE() << "element " << e << ": " << b(out[e]) << " vs " << fo[e];
      EXPECT_EQ(bad, 0);
    }
}

TEST(Bf16Ops, TheCpuBackendOffersThemAndCanHideThem) {
  CpuBackend be;
  EXPECT_TRUE(be.bf16_kernels());
  be.set_bf16_kernels(false);
  EXPECT_FALSE(be.bf16_kernels());
}

}  // namespace
}  // namespace parasol::runtime
