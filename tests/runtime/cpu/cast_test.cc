// cast (fp32 <-> bf16 / fp16) against an independent reference: every 16-bit pattern decoded from
// its sign, exponent and mantissa fields in double; fp32 -> 16 bit as the nearest representable
// value (ties to the even mantissa, overflow to infinity) found by search over all decoded values,
// for random bit patterns across the whole range and hand-picked ties, subnormals and specials.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "core/error.h"
#include "kernel_test_util.h"

namespace parasol::runtime {
namespace {

using test::cpu;

struct Format {
  int exp_bits, mant_bits;
};
constexpr Format kBf16{8, 7}, kFp16{5, 10};

// Value of a 16-bit pattern of format f (NaN for NaN patterns).
double decode(uint16_t h, Format f) {
  const int bias = (1 << (f.exp_bits - 1)) - 1;
  const int sign = h >> 15;
  const int e = (h >> f.mant_bits) & ((1 << f.exp_bits) - 1);
  const int m = h & ((1 << f.mant_bits) - 1);
  double v;
  if (e == (1 << f.exp_bits) - 1)
    v = m == 0 ? std::numeric_limits<double>::infinity() : std::numeric_limits<double>::quiet_NaN();
  else if (e == 0)
    v = std::ldexp(static_cast<double>(m), 1 - bias - f.mant_bits);
  else
    v = std::ldexp(1.0 + std::ldexp(static_cast<double>(m), -f.mant_bits), e - bias);
  return sign ? -v : v;
}

// Round-to-nearest-even by search: the non-negative finite values in order, then "infinity" one
// ulp past the largest (IEEE rounds to it from halfway, and its mantissa field is even).
struct Rounder {
  Format f;
  std::vector<std::pair<double, uint16_t>> grid;
  explicit Rounder(Format fmt) : f(fmt) {
    const uint16_t inf = static_cast<uint16_t>(((1 << f.exp_bits) - 1) << f.mant_bits);
    for (uint32_t h = 0; h < inf; ++h) grid.emplace_back(decode(h, f), static_cast<uint16_t>(h));
    const double max = grid.back().first;
    grid.emplace_back(max + (max - grid[grid.size() - 2].first), inf);
  }
  uint16_t operator()(float x) const {
    if (std::isnan(x)) return 0;  // not used: NaNs are checked by class
    const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
    const double a = std::abs(static_cast<double>(x));
    if (std::isinf(a) || a >= grid.back().first) return sign | grid.back().second;
    auto hi = std::lower_bound(grid.begin(), grid.end(), std::make_pair(a, uint16_t{0}),
                               [](const auto& p, const auto& q) { return p.first < q.first; });
    if (hi->first == a) return sign | hi->second;
    auto lo = hi - 1;
    const double dl = a - lo->first, dh = hi->first - a;
    if (dl < dh) return sign | lo->second;
    if (dh < dl) return sign | hi->second;
    return sign | ((lo->second & 1) == 0 ? lo->second : hi->second);  // tie: even mantissa
  }
};

std::vector<float> test_values(Format f) {
  std::mt19937 rng(1);
  std::vector<float> xs;
  for (int i = 0; i < 200000; ++i) {
    const float x = std::bit_cast<float>(static_cast<uint32_t>(rng()));
    if (!std::isnan(x)) xs.push_back(x);
  }
  // Dense around the format's range (random patterns mostly miss fp16's narrow range).
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (int e = -30; e <= 20; ++e)
    for (int i = 0; i < 200; ++i) xs.push_back(std::ldexp(u(rng), e));
  // Exact ties and edges.
  const double ulp1 = std::ldexp(1.0, -f.mant_bits);
  for (double v : {1.0 + ulp1 / 2, 1.0 + 3 * ulp1 / 2, 2.0 - ulp1 / 4, -1.0 - ulp1 / 2})
    xs.push_back(static_cast<float>(v));
  xs.insert(xs.end(), {0.0f, -0.0f, INFINITY, -INFINITY, std::numeric_limits<float>::max(),
                       std::numeric_limits<float>::denorm_min(), 65504.0f, 65519.99f, 65520.0f,
                       -65520.0f, 5.9604645e-8f, 2.9802322e-8f, 2.9802326e-8f, 8.940697e-8f});
  return xs;
}

class Cast : public ::testing::TestWithParam<Dtype> {};

TEST_P(Cast, ToSixteenBitsRoundsToNearestEven) {
  const Dtype dt = GetParam();
  const Format f = dt == Dtype::kBf16 ? kBf16 : kFp16;
  const Rounder round(f);
  const std::vector<float> xs = test_values(f);
  std::vector<uint16_t> out(xs.size());
  cpu().cast(out.data(), dt, xs.data(), Dtype::kFp32, static_cast<int64_t>(xs.size()));
  int bad = 0;
  for (size_t i = 0; i < xs.size() && bad < 10; ++i)
    if (out[i] != round(xs[i])) {
      ++bad;
      ADD_FAILURE() << dtype_name(dt) << "(" << xs[i] << ") = 0x" << std::hex << out[i]
                    << ", expected 0x" << round(xs[i]);
    }
  // NaN stays NaN.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  uint16_t h;
  cpu().cast(&h, dt, &nan, Dtype::kFp32, 1);
  EXPECT_TRUE(std::isnan(decode(h, f)));
}

TEST_P(Cast, FromSixteenBitsIsExact) {
  const Dtype dt = GetParam();
  const Format f = dt == Dtype::kBf16 ? kBf16 : kFp16;
  std::vector<uint16_t> all(65536);
  for (uint32_t h = 0; h < 65536; ++h) all[h] = static_cast<uint16_t>(h);
  std::vector<float> out(all.size());
  cpu().cast(out.data(), Dtype::kFp32, all.data(), dt, 65536);
  for (uint32_t h = 0; h < 65536; ++h) {
    const double ref = decode(static_cast<uint16_t>(h), f);
    if (std::isnan(ref)) {
      EXPECT_TRUE(std::isnan(out[h])) << h;
    } else {
      ASSERT_EQ(static_cast<double>(out[h]), ref) << h;
      ASSERT_EQ(std::signbit(out[h]), (h & 0x8000) != 0) << h;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, Cast, ::testing::Values(Dtype::kBf16, Dtype::kFp16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

TEST(CastMisc, Fp32CopyAndUnsupported) {
  std::vector<float> a = test::random_floats(33, 2), b(33);
  cpu().cast(b.data(), Dtype::kFp32, a.data(), Dtype::kFp32, 33);
  EXPECT_EQ(a, b);
  uint16_t h[2];
  EXPECT_THROW(cpu().cast(h, Dtype::kFp8, a.data(), Dtype::kFp32, 2), Error);
  EXPECT_THROW(cpu().cast(h, Dtype::kBf16, h, Dtype::kFp16, 1), Error);
}

}  // namespace
}  // namespace parasol::runtime
