// MoE on bf16 storage (backend.h's dispatch_*_bf16, combine_*_bf16, expert_linear_*_bf16) against
// the fp32 kernels (held to double references in moe_test.cc and linear_test.cc) run on the same
// bf16 values widened, with top-2 routing over 4 experts (one expert left without rows), biases,
// the data gradient's accumulate, and fp32 and bf16 weight gradients.
// Tolerances, derived: dispatch and combine run moe.cc's fp32 kernel on the widened rows (the same
// sums in the same order) and round once, so they equal the fp32 result rounded to nearest even
// bit for bit (the gates' gradient, fp32, equal exactly). The grouped GEMMs run bf16_ops.cc's GEMMs
// per expert: the same exact bf16 products summed in fp32 in another order (fp32 noise: 1e-5 of
// the largest magnitude), then one rounding of u = 2^-8: within u |ref| + 1e-5 max |ref|; an
// accumulating data gradient adds its fp32 product to the stored bf16 value and rounds once more:
// u (|ref| + |stored|). A bf16 weight gradient adds to the stored one and rounds once (the same).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "kernel_test_util.h"
#include "runtime/tensor.h"

namespace parasol::runtime {
namespace {

using test::cpu;

constexpr double kU = 1.0 / 256;

struct Bf16Data {
  std::vector<uint16_t> b;
  std::vector<float> f;
  Bf16Data(int64_t n, uint32_t seed) {
    for (float v : test::random_floats(n, seed)) {
      b.push_back(fp32_to_bf16(v));
      f.push_back(bf16_to_fp32(b.back()));
    }
  }
};

std::vector<uint16_t> rounded(const std::vector<float>& v) {
  std::vector<uint16_t> out;
  for (float x : v) out.push_back(fp32_to_bf16(x));
  return out;
}

void expect_within(const std::vector<uint16_t>& got, const std::vector<float>& ref,
                   const std::vector<float>& stored, const std::string& what) {
  ASSERT_EQ(got.size(), ref.size());
  double scale = 0;
  for (float x : ref) scale = std::max(scale, std::fabs(double(x)));
  int bad = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double tol =
        kU * (std::fabs(double(ref[i])) + (stored.empty() ? 0 : std::fabs(stored[i]))) +
        1e-5 * scale;
    if (std::fabs(double(bf16_to_fp32(got[i])) - ref[i]) > tol && ++bad <= 5)
      ADD_FAILURE() << what << "[" << i << "]: " << bf16_to_fp32(got[i]) << " vs " << ref[i];
  }
}

// 6 tokens, top 2 of 4 experts; expert 3 gets no rows.
constexpr int64_t kTokens = 6, kTopK = 2, kCols = 24;
const std::vector<int32_t> kTopIdx = {0, 1, 1, 2, 0, 2, 2, 1, 0, 1, 2, 0};

struct Routing {
  std::vector<int32_t> row_of = std::vector<int32_t>(kTokens * kTopK);
  std::vector<int64_t> counts = std::vector<int64_t>(4);
  std::vector<float> w = test::random_floats(kTokens * kTopK, 9, 0.1f, 0.9f);
  Routing() { cpu().moe_permutation(row_of.data(), counts.data(), kTopIdx.data(), kTokens, 4, 2); }
};

TEST(MoeBf16, DispatchAndCombineEqualTheFp32KernelsRoundedOnce) {
  const Routing r;
  ASSERT_EQ(r.counts[3], 0);
  const int64_t rows = kTokens * kTopK;
  const Bf16Data x(kTokens * kCols, 1), drows(rows * kCols, 2), erows(rows * kCols, 3),
      dy(kTokens * kCols, 4);
  {  // dispatch forward: a copy; backward: the sum of a token's rows
    std::vector<float> out_f(rows * kCols), dx_f(kTokens * kCols);
    std::vector<uint16_t> out_b(rows * kCols), dx_b(kTokens * kCols);
    cpu().dispatch_forward(out_f.data(), x.f.data(), r.row_of.data(), kTokens, kTopK, kCols);
    cpu().dispatch_forward_bf16(out_b.data(), x.b.data(), r.row_of.data(), kTokens, kTopK, kCols);
    EXPECT_EQ(out_b, rounded(out_f));
    cpu().dispatch_backward(dx_f.data(), drows.f.data(), r.row_of.data(), kTokens, kTopK, kCols);
    cpu().dispatch_backward_bf16(dx_b.data(), drows.b.data(), r.row_of.data(), kTokens, kTopK,
                                 kCols);
    EXPECT_EQ(dx_b, rounded(dx_f));
  }
  {  // combine forward: the gated sum; backward: the rows' gradients and the gates'
    std::vector<float> y_f(kTokens * kCols), de_f(rows * kCols), dw_f(rows), dw_b(rows);
    std::vector<uint16_t> y_b(kTokens * kCols), de_b(rows * kCols);
    cpu().combine_forward(y_f.data(), erows.f.data(), r.w.data(), r.row_of.data(), kTokens, kTopK,
                          kCols);
    cpu().combine_forward_bf16(y_b.data(), erows.b.data(), r.w.data(), r.row_of.data(), kTokens,
                               kTopK, kCols);
    EXPECT_EQ(y_b, rounded(y_f));
    cpu().combine_backward(de_f.data(), dw_f.data(), dy.f.data(), erows.f.data(), r.w.data(),
                           r.row_of.data(), kTokens, kTopK, kCols);
    cpu().combine_backward_bf16(de_b.data(), dw_b.data(), dy.b.data(), erows.b.data(), r.w.data(),
                                r.row_of.data(), kTokens, kTopK, kCols);
    EXPECT_EQ(de_b, rounded(de_f));
    EXPECT_EQ(dw_b, dw_f);
  }
}

TEST(MoeBf16, GroupedExpertGemmsMatchTheFp32OnesWithinOneRounding) {
  const Routing r;
  const int64_t rows = kTokens * kTopK, E = 4, n = 40, k = kCols;
  const Bf16Data in(rows * k, 5), w(E * k * n, 6), bias(E * n, 7), dout(rows * n, 8),
      din0(rows * k, 10);
  // Forward with biases.
  std::vector<float> out_f(rows * n);
  std::vector<uint16_t> out_b(rows * n);
  cpu().expert_linear_forward(out_f.data(), in.f.data(), w.f.data(), bias.f.data(), r.counts.data(),
                              E, n, k);
  cpu().expert_linear_forward_bf16(out_b.data(), in.b.data(), w.b.data(), bias.b.data(),
                                   r.counts.data(), E, n, k);
  expect_within(out_b, out_f, {}, "expert forward");
  // Data gradient, accumulated onto a stored one.
  std::vector<float> din_f = din0.f;
  std::vector<uint16_t> din_b = din0.b;
  cpu().expert_linear_backward_data(din_f.data(), dout.f.data(), w.f.data(), r.counts.data(), E, n,
                                    k, true);
  cpu().expert_linear_backward_data_bf16(din_b.data(), dout.b.data(), w.b.data(), r.counts.data(),
                                         E, n, k, true);
  expect_within(din_b, din_f, din0.f, "expert data gradient (accumulated)");
  // Weight gradients: fp32 (+=, with the bias gradient) and bf16 (+= onto stored values).
  std::vector<float> dw_f(E * k * n, 0.0f), db_f(E * n, 0.0f), dw32(E * k * n, 0.0f),
      db32(E * n, 0.0f);
  cpu().expert_linear_backward_weight(dw_f.data(), db_f.data(), in.f.data(), dout.f.data(),
                                      r.counts.data(), E, n, k);
  cpu().expert_linear_backward_weight_bf16(dw32.data(), Dtype::kFp32, db32.data(), in.b.data(),
                                           dout.b.data(), r.counts.data(), E, n, k);
  double scale = 0;
  for (float x : dw_f) scale = std::max(scale, std::fabs(double(x)));
  for (size_t i = 0; i < dw_f.size(); ++i) ASSERT_NEAR(dw32[i], dw_f[i], 1e-5 * scale) << i;
  for (size_t i = 0; i < db_f.size(); ++i) ASSERT_NEAR(db32[i], db_f[i], 1e-5 * scale) << i;
  // Expert 3 had no rows: its gradients stay 0.
  for (int64_t i = 3 * k * n; i < 4 * k * n; ++i) ASSERT_EQ(dw32[i], 0.0f);
  const Bf16Data dw0(E * k * n, 11);
  std::vector<uint16_t> dw16 = dw0.b;
  cpu().expert_linear_backward_weight_bf16(dw16.data(), Dtype::kBf16, nullptr, in.b.data(),
                                           dout.b.data(), r.counts.data(), E, n, k);
  std::vector<float> want(dw_f.size());
  for (size_t i = 0; i < want.size(); ++i) want[i] = dw0.f[i] + dw_f[i];
  expect_within(dw16, want, dw0.f, "bf16 expert weight gradient (accumulated)");
}

}  // namespace
}  // namespace parasol::runtime
