// The CPU backend's typed bf16 element-wise entries (runtime/cpu/bf16_elementwise.cc: norm
// backward, GELU and SwiGLU, residual add and its bias gradient, RoPE, embedding) against double
// references written here from the bf16 inputs, on row counts that leave a partial block (the
// kernels widen 64 rows, or whole sequences, at a time).
// Tolerance: each entry runs the fp32 kernel of its family on the widened block and rounds each
// bf16 output once, so its error is the fp32 kernel's, bounded by that family's own test (rtol32
// element-wise or norm-wise of the largest reference magnitude: 1e-5 for reductions over a row
// and transcendental functions, 1e-6 for adds; tests/runtime/cpu/<family>_test.cc), plus one
// rounding to bf16: |got - ref| <= u |ref| + (1 + u) rtol32 scale, u = 2^-8. The fp32 outputs
// (the parameters' gradients) carry the fp32 bound alone. A wrong block offset, a position not
// taken modulo the sequence, a lost accumulation or a dropped operand is off by O(|ref|).
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

constexpr double kU = 1.0 / 256;  // bf16 unit roundoff
constexpr float kEps = 1e-5f;

std::vector<uint16_t> random_bf16(int64_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::vector<uint16_t> v(static_cast<size_t>(n));
  const std::vector<float> f = random_floats(n, seed, lo, hi);
  for (size_t i = 0; i < v.size(); ++i) v[i] = fp32_to_bf16(f[i]);
  return v;
}
double b(uint16_t x) { return bf16_to_fp32(x); }
std::vector<double> wide(const std::vector<uint16_t>& v) {
  std::vector<double> d(v.size());
  for (size_t i = 0; i < v.size(); ++i) d[i] = b(v[i]);
  return d;
}

// bf16 outputs against ref: |got - ref| <= u |ref| + (1 + u) rtol32 max|ref|.
::testing::AssertionResult near_bf16(const std::vector<uint16_t>& got,
                                     const std::vector<double>& ref, double rtol32,
                                     const char* what) {
  const double atol = (1 + kU) * rtol32 * test::max_abs(ref);
  int bad = 0;
  std::string first;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double err = std::abs(b(got[i]) - ref[i]);
    if (!(err <= kU * std::abs(ref[i]) + atol)) {
      if (bad++ == 0)
        first = std::to_string(i) + ": got " + std::to_string(b(got[i])) + ", reference " +
                std::to_string(ref[i]);
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << ": " << bad << " of " << ref.size()
                                       << " elements outside the bound; first [" << first << "]";
}

double gelu(double x) {
  const double k = std::sqrt(2.0 / M_PI);
  return 0.5 * x * (1 + std::tanh(k * (x + 0.044715 * x * x * x)));
}
double dgelu(double x) {
  const double k = std::sqrt(2.0 / M_PI), t = std::tanh(k * (x + 0.044715 * x * x * x));
  return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * k * (1 + 3 * 0.044715 * x * x);
}
double sigmoid(double x) { return 1 / (1 + std::exp(-x)); }

constexpr int64_t kRows = 150, kCols = 72;  // 150 = 2 blocks of 64 and a partial one

TEST(Bf16Elementwise, GeluForwardAndBackwardAgainstDouble) {
  const auto x = random_bf16(kRows * kCols, 1, -4, 4), d = random_bf16(kRows * kCols, 2);
  std::vector<uint16_t> out(x.size()), din(x.size());
  cpu().activation_forward_bf16(Activation::kGelu, out.data(), x.data(), kRows, kCols);
  cpu().activation_backward_bf16(Activation::kGelu, din.data(), d.data(), x.data(), kRows, kCols);
  std::vector<double> ro(x.size()), rd(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    ro[i] = gelu(b(x[i]));
    rd[i] = b(d[i]) * dgelu(b(x[i]));
  }
  EXPECT_TRUE(near_bf16(out, ro, 1e-5, "gelu"));
  EXPECT_TRUE(near_bf16(din, rd, 1e-5, "dgelu"));
  // In place (din == dout), as the executor may call it.
  std::vector<uint16_t> io = d;
  cpu().activation_backward_bf16(Activation::kGelu, io.data(), io.data(), x.data(), kRows, kCols);
  EXPECT_EQ(io, din);
}

TEST(Bf16Elementwise, SwigluForwardAndBackwardAgainstDouble) {
  const auto x = random_bf16(kRows * 2 * kCols, 3, -4, 4), d = random_bf16(kRows * kCols, 4);
  std::vector<uint16_t> out(kRows * kCols), din(x.size());
  cpu().activation_forward_bf16(Activation::kSwiglu, out.data(), x.data(), kRows, kCols);
  cpu().activation_backward_bf16(Activation::kSwiglu, din.data(), d.data(), x.data(), kRows, kCols);
  std::vector<double> ro(out.size()), rd(din.size());
  for (int64_t r = 0; r < kRows; ++r)
    for (int64_t c = 0; c < kCols; ++c) {
      const double g = b(x[r * 2 * kCols + c]), u = b(x[r * 2 * kCols + kCols + c]);
      const double s = sigmoid(g), dy = b(d[r * kCols + c]);
      ro[r * kCols + c] = g * s * u;
      rd[r * 2 * kCols + c] = dy * u * s * (1 + g * (1 - s));
      rd[r * 2 * kCols + kCols + c] = dy * g * s;
    }
  EXPECT_TRUE(near_bf16(out, ro, 1e-5, "swiglu"));
  EXPECT_TRUE(near_bf16(din, rd, 1e-5, "dswiglu"));
}

TEST(Bf16Elementwise, ResidualAddAndBiasGradientAgainstDouble) {
  const auto x = random_bf16(kRows * kCols, 5), y = random_bf16(kRows * kCols, 6),
             bias = random_bf16(kCols, 7);
  std::vector<uint16_t> out(x.size());
  cpu().residual_forward_bf16(out.data(), x.data(), y.data(), bias.data(), kRows, kCols);
  std::vector<double> ro(x.size());
  for (size_t i = 0; i < x.size(); ++i) ro[i] = b(x[i]) + (b(y[i]) + b(bias[i % kCols]));
  EXPECT_TRUE(near_bf16(out, ro, 1e-6, "x + y + bias"));
  // No residual, in place over y.
  std::vector<uint16_t> io = y;
  cpu().residual_forward_bf16(io.data(), nullptr, io.data(), nullptr, kRows, kCols);
  EXPECT_EQ(io, y);
  // Backward: dy = dout bit for bit; dbias (fp32) += column sums.
  std::vector<uint16_t> dy(x.size());
  std::vector<float> dbias(kCols, 0.5f);
  cpu().residual_backward_bf16(dy.data(), dbias.data(), x.data(), kRows, kCols);
  EXPECT_EQ(dy, x);
  std::vector<double> rb(kCols, 0.5);
  for (int64_t r = 0; r < kRows; ++r)
    for (int64_t c = 0; c < kCols; ++c) rb[c] += b(x[r * kCols + c]);
  EXPECT_TRUE(test::near_normwise(dbias.data(), rb, 1e-5, "dbias"));
}

TEST(Bf16Elementwise, RopeOnStridedHeadsAgainstDouble) {
  // Two heads of 16 inside rows of 40 columns (the rest untouched), seq 24 (blocks of 48 rows),
  // rows 100: a partial last block and a partial sequence.
  const int64_t ld = 40, rows = 100, seq = 24, heads = 2, d = 16, off = 4, pos0 = 7;
  const double theta = 1e4;
  const auto x0 = random_bf16(rows * ld, 8);
  for (bool inverse : {false, true}) {
    SCOPED_TRACE(inverse ? "inverse" : "forward");
    std::vector<uint16_t> x = x0;
    cpu().rope_bf16(x.data() + off, ld, rows, seq, pos0, heads, d, theta, inverse);
    std::vector<double> ref = wide(x0);
    for (int64_t t = 0; t < rows; ++t)
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t j = 0; j < d / 2; ++j) {
          const double ang = (inverse ? -1.0 : 1.0) * double(t % seq + pos0) *
                             std::pow(theta, -2.0 * double(j) / double(d));
          const int64_t i0 = t * ld + off + h * d + j, i1 = i0 + d / 2;
          const double a = b(x0[i0]), c = b(x0[i1]);
          ref[i0] = a * std::cos(ang) - c * std::sin(ang);
          ref[i1] = c * std::cos(ang) + a * std::sin(ang);
        }
    EXPECT_TRUE(near_bf16(x, ref, 1e-6, "rope"));
  }
}

TEST(Bf16Elementwise, EmbeddingForwardAndBackwardAgainstDouble) {
  // A vocab shard [10, 50) of 40 rows; tokens outside it give zeros; positions from offset 3.
  const int64_t seq = 30, rows = 90, cols = 24, vstart = 10, vrows = 40, positions = 40, p0 = 3;
  const auto table = random_bf16(vrows * cols, 9), pos = random_bf16(positions * cols, 10);
  const auto dout = random_bf16(rows * cols, 11);
  std::vector<int32_t> tokens(rows);
  for (int64_t t = 0; t < rows; ++t) tokens[t] = static_cast<int32_t>((t * 37) % 64);
  std::vector<uint16_t> out(rows * cols);
  cpu().embedding_forward_bf16(out.data(), tokens.data(), table.data(), vstart, vrows, pos.data(),
                               p0, rows, seq, cols);
  std::vector<double> ro(out.size());
  for (int64_t t = 0; t < rows; ++t) {
    const int64_t id = tokens[t] - vstart;
    for (int64_t c = 0; c < cols; ++c)
      ro[t * cols + c] = (id >= 0 && id < vrows ? b(table[id * cols + c]) : 0.0) +
                         b(pos[(t % seq + p0) * cols + c]);
  }
  EXPECT_TRUE(near_bf16(out, ro, 1e-6, "embedding"));
  std::vector<float> dtable(vrows * cols, 0.25f), dpos(positions * cols, -0.25f);
  cpu().embedding_backward_bf16(dtable.data(), dpos.data(), dout.data(), tokens.data(), vstart,
                                vrows, p0, rows, seq, cols);
  std::vector<double> rt(dtable.size(), 0.25), rp(dpos.size(), -0.25);
  for (int64_t t = 0; t < rows; ++t) {
    const int64_t id = tokens[t] - vstart;
    for (int64_t c = 0; c < cols; ++c) {
      if (id >= 0 && id < vrows) rt[id * cols + c] += b(dout[t * cols + c]);
      rp[(t % seq + p0) * cols + c] += b(dout[t * cols + c]);
    }
  }
  EXPECT_TRUE(test::near_normwise(dtable.data(), rt, 1e-6, "dtable"));
  EXPECT_TRUE(test::near_normwise(dpos.data(), rp, 1e-6, "dpos"));
}

// dx (with the residual gradient added), dweight and dbias (fp32, accumulated) of both norms.
TEST(Bf16Elementwise, NormBackwardAgainstDouble) {
  for (Norm kind : {Norm::kRmsNorm, Norm::kLayerNorm}) {
    SCOPED_TRACE(kind == Norm::kLayerNorm ? "layernorm" : "rmsnorm");
    const bool ln = kind == Norm::kLayerNorm;
    const auto x = random_bf16(kRows * kCols, 12, -2, 2), d = random_bf16(kRows * kCols, 13),
               w = random_bf16(kCols, 14, 0.5f, 1.5f), res = random_bf16(kRows * kCols, 15);
    std::vector<uint16_t> dx(x.size());
    std::vector<float> dw(kCols, 1.0f), db(kCols, -1.0f);
    cpu().norm_backward_bf16(kind, dx.data(), dw.data(), ln ? db.data() : nullptr, d.data(),
                             x.data(), w.data(), res.data(), kRows, kCols, kEps);
    std::vector<double> rx(x.size()), rw(kCols, 1.0), rb(kCols, -1.0);
    for (int64_t r = 0; r < kRows; ++r) {
      double mean = 0, var = 0;
      for (int64_t c = 0; c < kCols; ++c) mean += ln ? b(x[r * kCols + c]) : 0.0;
      mean /= kCols;
      for (int64_t c = 0; c < kCols; ++c) var += std::pow(b(x[r * kCols + c]) - mean, 2);
      var /= kCols;
      const double rstd = 1 / std::sqrt(var + kEps);
      double mg = 0, mgx = 0;  // means of g = w dy and of g xhat
      for (int64_t c = 0; c < kCols; ++c) {
        const double xh = (b(x[r * kCols + c]) - mean) * rstd, g = b(w[c]) * b(d[r * kCols + c]);
        mg += g / kCols;
        mgx += g * xh / kCols;
        rw[c] += b(d[r * kCols + c]) * xh;
        rb[c] += b(d[r * kCols + c]);
      }
      for (int64_t c = 0; c < kCols; ++c) {
        const double xh = (b(x[r * kCols + c]) - mean) * rstd, g = b(w[c]) * b(d[r * kCols + c]);
        rx[r * kCols + c] = rstd * (g - (ln ? mg : 0.0) - xh * mgx) + b(res[r * kCols + c]);
      }
    }
    EXPECT_TRUE(near_bf16(dx, rx, 1e-5, "dx"));
    EXPECT_TRUE(test::near_normwise(dw.data(), rw, 1e-5, "dweight"));
    if (ln) EXPECT_TRUE(test::near_normwise(db.data(), rb, 1e-5, "dbias"));
  }
}

}  // namespace
}  // namespace parasol::runtime
