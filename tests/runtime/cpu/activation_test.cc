// Activation kernels against a double reference: gelu (tanh approximation) and swiglu (columns
// gate | up), forward and backward element-wise within 1e-5 relative plus a floor of 1e-6 of the
// tensor's largest magnitude (for derivatives that cross zero), and the backward against central
// finite differences of the reference forward (1e-5 norm-wise); gelu in place.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kernel_test_util.h"

namespace parasol::runtime {
namespace {

using test::cpu;
using test::near_elementwise;
using test::to_double;

double ref_gelu(double x) {
  const double s = std::sqrt(2.0 / M_PI);
  return 0.5 * x * (1.0 + std::tanh(s * (x + 0.044715 * x * x * x)));
}
double ref_silu(double x) { return x / (1.0 + std::exp(-x)); }

std::vector<double> ref_forward(Activation kind, const std::vector<double>& in, int64_t rows,
                                int64_t cols) {
  std::vector<double> out(rows * cols);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      out[r * cols + c] = kind == Activation::kGelu
                              ? ref_gelu(in[r * cols + c])
                              : ref_silu(in[r * 2 * cols + c]) * in[r * 2 * cols + cols + c];
  return out;
}

TEST(Gelu, ForwardBackwardInPlace) {
  const int64_t rows = 31, cols = 257;
  std::vector<float> in = test::random_floats(rows * cols, 1, -6.0f, 6.0f);
  std::vector<float> out(rows * cols);
  cpu().activation_forward(Activation::kGelu, out.data(), in.data(), rows, cols);
  const std::vector<double> X = to_double(in);
  const std::vector<double> ref_out = ref_forward(Activation::kGelu, X, rows, cols);
  EXPECT_TRUE(near_elementwise(out.data(), ref_out, 1e-5, 1e-6 * test::max_abs(ref_out), "gelu"));
  // Reference derivative: d/dx [0.5 x (1 + tanh(u))], u = s (x + a x^3).
  std::vector<float> dout = test::random_floats(rows * cols, 2);
  std::vector<double> ref(rows * cols);
  const double s = std::sqrt(2.0 / M_PI), a = 0.044715;
  for (int64_t i = 0; i < rows * cols; ++i) {
    const double x = X[i], t = std::tanh(s * (x + a * x * x * x));
    ref[i] = dout[i] * (0.5 * (1 + t) + 0.5 * x * (1 - t * t) * s * (1 + 3 * a * x * x));
  }
  std::vector<float> din(rows * cols);
  cpu().activation_backward(Activation::kGelu, din.data(), dout.data(), in.data(), rows, cols);
  EXPECT_TRUE(near_elementwise(din.data(), ref, 1e-5, 1e-6 * test::max_abs(ref), "dgelu"));
  // In place: out over in, din over dout.
  std::vector<float> io = in, dio = dout;
  cpu().activation_backward(Activation::kGelu, dio.data(), dio.data(), in.data(), rows, cols);
  cpu().activation_forward(Activation::kGelu, io.data(), io.data(), rows, cols);
  EXPECT_EQ(io, out);
  EXPECT_EQ(dio, din);
}

TEST(Swiglu, ForwardAndBackward) {
  const int64_t rows = 23, cols = 130;  // input [rows x 2 cols]
  std::vector<float> in = test::random_floats(rows * 2 * cols, 3, -5.0f, 5.0f);
  std::vector<float> out(rows * cols);
  cpu().activation_forward(Activation::kSwiglu, out.data(), in.data(), rows, cols);
  const std::vector<double> X = to_double(in);
  const std::vector<double> ref_out = ref_forward(Activation::kSwiglu, X, rows, cols);
  EXPECT_TRUE(near_elementwise(out.data(), ref_out, 1e-5, 1e-6 * test::max_abs(ref_out), "swiglu"));
  std::vector<float> dout = test::random_floats(rows * cols, 4);
  std::vector<double> ref(rows * 2 * cols);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const double g = X[r * 2 * cols + c], u = X[r * 2 * cols + cols + c], d = dout[r * cols + c];
      const double sg = 1.0 / (1.0 + std::exp(-g));
      ref[r * 2 * cols + c] = d * u * (sg + g * sg * (1 - sg));
      ref[r * 2 * cols + cols + c] = d * g * sg;
    }
  std::vector<float> din(rows * 2 * cols);
  cpu().activation_backward(Activation::kSwiglu, din.data(), dout.data(), in.data(), rows, cols);
  EXPECT_TRUE(near_elementwise(din.data(), ref, 1e-5, 1e-6 * test::max_abs(ref), "dswiglu"));
}

TEST(Activation, BackwardMatchesFiniteDifferences) {
  for (Activation kind : {Activation::kGelu, Activation::kSwiglu}) {
    const int64_t rows = 3, cols = 7, width = kind == Activation::kSwiglu ? 2 * cols : cols;
    std::vector<float> in = test::random_floats(rows * width, 5, -3.0f, 3.0f);
    std::vector<float> dout = test::random_floats(rows * cols, 6);
    std::vector<float> din(rows * width);
    cpu().activation_backward(kind, din.data(), dout.data(), in.data(), rows, cols);
    std::vector<double> X = to_double(in), G = to_double(dout);
    auto loss = [&] { return test::weighted_sum(ref_forward(kind, X, rows, cols), G); };
    EXPECT_TRUE(test::near_normwise(din, test::finite_diff(X, loss), 1e-5, "din vs fd"))
        << (kind == Activation::kGelu ? "gelu" : "swiglu");
  }
}

}  // namespace
}  // namespace parasol::runtime
