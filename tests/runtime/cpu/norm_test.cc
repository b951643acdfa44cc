// Layernorm and rmsnorm kernels against a double reference (forward), and their backward (dx with
// the residual gradient added, dweight and dbias accumulated) against a double reference backward
// on random sizes and central finite differences of the reference forward on small ones.
// Tolerance: 1e-5 of the largest reference magnitude of each tensor (fp32 reductions over a row).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kernel_test_util.h"

namespace parasol::runtime {
namespace {

using test::cpu;
using test::near_normwise;
using test::to_double;

constexpr float kEps = 1e-5f;

std::vector<double> ref_norm(Norm kind, const std::vector<double>& x, const std::vector<double>& w,
                             const std::vector<double>* b, int64_t rows, int64_t cols) {
  std::vector<double> out(rows * cols);
  for (int64_t r = 0; r < rows; ++r) {
    const double* xr = &x[r * cols];
    double mean = 0, var = 0;
    if (kind == Norm::kLayerNorm) {
      for (int64_t c = 0; c < cols; ++c) mean += xr[c];
      mean /= cols;
      for (int64_t c = 0; c < cols; ++c) var += (xr[c] - mean) * (xr[c] - mean);
      var /= cols;
    } else {
      for (int64_t c = 0; c < cols; ++c) var += xr[c] * xr[c];
      var /= cols;
    }
    const double rstd = 1.0 / std::sqrt(var + kEps);
    for (int64_t c = 0; c < cols; ++c)
      out[r * cols + c] = (xr[c] - mean) * rstd * w[c] + (b ? (*b)[c] : 0.0);
  }
  return out;
}

// Reference backward, derived per row: with xhat = (x - mean) rstd, g = dout * w,
//   layernorm dx = rstd (g - mean(g) - xhat mean(g xhat)); rmsnorm dx = rstd (g - xhat mean(g
//   xhat)).
void ref_norm_backward(Norm kind, const std::vector<double>& x, const std::vector<double>& w,
                       const std::vector<double>& dout, int64_t rows, int64_t cols,
                       std::vector<double>& dx, std::vector<double>& dw, std::vector<double>& db) {
  dx.assign(rows * cols, 0);
  dw.assign(cols, 0);
  db.assign(cols, 0);
  for (int64_t r = 0; r < rows; ++r) {
    const double* xr = &x[r * cols];
    double mean = 0, var = 0;
    for (int64_t c = 0; c < cols; ++c) mean += xr[c];
    mean /= cols;
    if (kind == Norm::kRmsNorm) mean = 0;
    for (int64_t c = 0; c < cols; ++c) var += (xr[c] - mean) * (xr[c] - mean);
    var /= cols;
    const double rstd = 1.0 / std::sqrt(var + kEps);
    double mg = 0, mgx = 0;
    for (int64_t c = 0; c < cols; ++c) {
      const double xh = (xr[c] - mean) * rstd, g = dout[r * cols + c] * w[c];
      mg += g;
      mgx += g * xh;
      dw[c] += dout[r * cols + c] * xh;
      db[c] += dout[r * cols + c];
    }
    mg /= cols;
    mgx /= cols;
    if (kind == Norm::kRmsNorm) mg = 0;
    for (int64_t c = 0; c < cols; ++c) {
      const double xh = (xr[c] - mean) * rstd, g = dout[r * cols + c] * w[c];
      dx[r * cols + c] = rstd * (g - mg - xh * mgx);
    }
  }
}

class NormTest : public ::testing::TestWithParam<Norm> {};

TEST_P(NormTest, ForwardMatchesReference) {
  const Norm kind = GetParam();
  const int64_t rows = 37, cols = 768;
  // Inputs with a non-zero mean and spread, as residual streams have.
  std::vector<float> x = test::random_floats(rows * cols, 1, -3.0f, 5.0f);
  std::vector<float> w = test::random_floats(cols, 2, 0.5f, 1.5f), b = test::random_floats(cols, 3);
  std::vector<float> out(rows * cols);
  const bool ln = kind == Norm::kLayerNorm;
  cpu().norm_forward(kind, out.data(), x.data(), w.data(), ln ? b.data() : nullptr, rows, cols,
                     kEps);
  std::vector<double> db = to_double(b);
  EXPECT_TRUE(
      near_normwise(out, ref_norm(kind, to_double(x), to_double(w), ln ? &db : nullptr, rows, cols),
                    1e-5, "out"));
}

TEST_P(NormTest, BackwardMatchesReference) {
  const Norm kind = GetParam();
  const bool ln = kind == Norm::kLayerNorm;
  const int64_t rows = 19, cols = 256;
  std::vector<float> x = test::random_floats(rows * cols, 4, -2.0f, 3.0f);
  std::vector<float> w = test::random_floats(cols, 5, 0.5f, 1.5f);
  std::vector<float> dout = test::random_floats(rows * cols, 6);
  std::vector<float> dres = test::random_floats(rows * cols, 7);
  std::vector<float> dw0 = test::random_floats(cols, 8), db0 = test::random_floats(cols, 9);
  std::vector<float> dx(rows * cols), dw = dw0, db = db0;
  cpu().norm_backward(kind, dx.data(), dw.data(), ln ? db.data() : nullptr, dout.data(), x.data(),
                      w.data(), dres.data(), rows, cols, kEps);
  std::vector<double> rdx, rdw, rdb;
  ref_norm_backward(kind, to_double(x), to_double(w), to_double(dout), rows, cols, rdx, rdw, rdb);
  for (size_t i = 0; i < rdx.size(); ++i) rdx[i] += dres[i];
  for (int64_t c = 0; c < cols; ++c) {
    rdw[c] += dw0[c];
    rdb[c] += db0[c];
  }
  EXPECT_TRUE(near_normwise(dx, rdx, 1e-5, "dx"));
  EXPECT_TRUE(near_normwise(dw, rdw, 1e-5, "dweight"));
  if (ln) {
    EXPECT_TRUE(near_normwise(db, rdb, 1e-5, "dbias"));
  }

  // In place: dx written over dresidual.
  std::vector<float> inplace = dres, dw2(cols, 0.0f), db2(cols, 0.0f);
  cpu().norm_backward(kind, inplace.data(), dw2.data(), db2.data(), dout.data(), x.data(), w.data(),
                      inplace.data(), rows, cols, kEps);
  EXPECT_TRUE(near_normwise(inplace, rdx, 1e-5, "dx in place"));
}

TEST_P(NormTest, BackwardMatchesFiniteDifferences) {
  const Norm kind = GetParam();
  const bool ln = kind == Norm::kLayerNorm;
  const int64_t rows = 3, cols = 10;
  std::vector<float> x = test::random_floats(rows * cols, 10, -2.0f, 2.0f);
  std::vector<float> w = test::random_floats(cols, 11, 0.5f, 1.5f),
                     b = test::random_floats(cols, 12);
  std::vector<float> dout = test::random_floats(rows * cols, 13);
  std::vector<float> dx(rows * cols), dw(cols, 0.0f), db(cols, 0.0f);
  cpu().norm_backward(kind, dx.data(), dw.data(), ln ? db.data() : nullptr, dout.data(), x.data(),
                      w.data(), nullptr, rows, cols, kEps);
  std::vector<double> X = to_double(x), W = to_double(w), Bv = to_double(b), G = to_double(dout);
  auto loss = [&] {
    return test::weighted_sum(ref_norm(kind, X, W, ln ? &Bv : nullptr, rows, cols), G);
  };
  EXPECT_TRUE(near_normwise(dx, test::finite_diff(X, loss), 1e-5, "dx vs fd"));
  EXPECT_TRUE(near_normwise(dw, test::finite_diff(W, loss), 1e-5, "dweight vs fd"));
  if (ln) {
    EXPECT_TRUE(near_normwise(db, test::finite_diff(Bv, loss), 1e-5, "dbias vs fd"));
  }
}

INSTANTIATE_TEST_SUITE_P(Kinds, NormTest, ::testing::Values(Norm::kLayerNorm, Norm::kRmsNorm),
                         [](const auto& info) {
                           return info.param == Norm::kLayerNorm ? "layernorm" : "rmsnorm";
                         });

}  // namespace
}  // namespace parasol::runtime
