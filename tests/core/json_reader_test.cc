// The strict JSON reader's helpers (core/json_reader.h): figures written in a key's unit.
#include "core/json_reader.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

namespace parasol {
namespace {

// A figure written in its unit, read back (times the unit) and written again is the same number:
// the round trip of a document that writes figures so is stable. The bare quotient is not (the
// NCCL latency table's 6.8 us came back as 6.799999999999998 after one round trip).
TEST(InJsonUnit, WritingWhatWasReadGivesTheSameNumber) {
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> mantissa(1, 10);
  std::uniform_int_distribution<int> exponent(-12, 12);
  for (double unit : {1e-6, 1e9, 1e12, 1073741824.0, 1e-3}) {
    for (int i = 0; i < 2000; ++i) {
      const double si = mantissa(rng) * std::pow(10.0, exponent(rng)) * unit;
      const double written = in_json_unit(si, unit);
      EXPECT_EQ(in_json_unit(written * unit, unit), written) << si << " in " << unit;
      EXPECT_NEAR(written, si / unit, 1e-11 * std::fabs(si / unit));
    }
  }
  // The quotient alone drifts for some of these figures: the test would catch a plain division.
  const double us = 6.8e-6;
  EXPECT_NE((us * 1e6) * 1e-6 * 1e6, 6.8);
  EXPECT_EQ(in_json_unit(in_json_unit(us, 1e-6) * 1e-6, 1e-6), 6.8);
}

TEST(InJsonUnit, KeepsZeroAndNonFiniteValues) {
  EXPECT_EQ(in_json_unit(0, 1e-6), 0);
  EXPECT_TRUE(std::isinf(in_json_unit(std::numeric_limits<double>::infinity(), 1e9)));
  EXPECT_LT(in_json_unit(-2.5e-6, 1e-6), 0);
  EXPECT_EQ(in_json_unit(-2.5e-6, 1e-6), -2.5);
}

}  // namespace
}  // namespace parasol
