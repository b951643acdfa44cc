// Tests cost_models/goodput.h against hand-computed values: Young's and Daly's intervals, the
// expected lost work of an interruption, the expected time of a segment, and the breakdown of a
// job (its parts sum to the total; Daly's interval maximises the exact goodput).
#include "cost_models/goodput.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace parasol::cost {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

TEST(Goodput, YoungInterval) {
  // sqrt(2 x 60 s x 4 h) = sqrt(1,728,000) = 1314.534 s.
  EXPECT_NEAR(young_interval_s(60, 14400), 1314.534, 1e-3);
  EXPECT_NEAR(young_interval_s(2, 100), 20, 1e-12);
}

TEST(Goodput, DalyInterval) {
  // delta = 60 s, M = 4 h: x = delta / 2M = 1/480; sqrt(2 delta M) (1 + sqrt(x)/3 + x/9) - delta
  // = 1314.534 x 1.0154458 - 60 = 1274.838 s.
  EXPECT_NEAR(daly_interval_s(60, 14400), 1274.838, 1e-3);
  // A checkpoint longer than 2M: checkpoint every M.
  EXPECT_DOUBLE_EQ(daly_interval_s(500, 200), 200);
}

TEST(Goodput, ExpectedLostWork) {
  // L = 1 h, M = 10 h: M - L / (e^0.1 - 1) = 36000 - 3600 / 0.1051709 = 1770.005 s, about
  // L/2 - L^2/12M = 1800 - 30 = 1770 s.
  EXPECT_NEAR(expected_lost_work_s(3600, 36000), 1770.005, 1e-3);
  // Far shorter than M: half the segment.
  EXPECT_NEAR(expected_lost_work_s(1, 1e9), 0.5, 1e-9);
  EXPECT_DOUBLE_EQ(expected_lost_work_s(100, kInf), 50);
}

TEST(Goodput, ExpectedSegment) {
  // No restart: M (e^(L/M) - 1) = 36000 x 0.1051709 = 3786.153 s; a restart R multiplies by
  // e^(R/M).
  EXPECT_NEAR(expected_segment_s(3600, 0, 36000), 3786.153, 1e-3);
  EXPECT_NEAR(expected_segment_s(3600, 600, 36000), 3786.153 * std::exp(600.0 / 36000), 1e-3);
  EXPECT_DOUBLE_EQ(expected_segment_s(3600, 600, kInf), 3600);
}

TEST(Goodput, WithoutFailuresOnlyCheckpointsCost) {
  // 10 h of work checkpointed every hour for 30 s: ten checkpoints, nothing lost.
  const Goodput g = job_goodput(36000, 3600, 30, 600, kInf);
  EXPECT_DOUBLE_EQ(g.productive, 36000);
  EXPECT_DOUBLE_EQ(g.checkpoint, 300);
  EXPECT_DOUBLE_EQ(g.lost_work, 0);
  EXPECT_DOUBLE_EQ(g.restart, 0);
  EXPECT_NEAR(g.fraction(), 36000.0 / 36300, 1e-12);
  // A last, shorter segment still ends with a checkpoint.
  EXPECT_DOUBLE_EQ(job_goodput(4000, 3600, 30, 0, kInf).checkpoint, 60);
}

TEST(Goodput, PartsSumToTheExpectedTime) {
  // W = 100 segments of tau: the total is 100 segments' expected time (Daly's formula).
  const double tau = 1000, delta = 20, restart = 300, mtbi = 20000;
  const Goodput g = job_goodput(100 * tau, tau, delta, restart, mtbi);
  EXPECT_NEAR(g.total(), 100 * expected_segment_s(tau + delta, restart, mtbi), 1e-6 * g.total());
  // Interruptions: failed attempts (e^(L/M) - 1 per segment) times e^(R/M) for those that strike
  // a restart; lost work: each failed attempt loses the expected lost work.
  const double failed = 100 * std::expm1((tau + delta) / mtbi);
  EXPECT_NEAR(g.interruptions, failed * std::exp(restart / mtbi), 1e-9);
  EXPECT_NEAR(g.lost_work, failed * expected_lost_work_s(tau + delta, mtbi), 1e-6);
  EXPECT_NEAR(g.restart, failed * mtbi * std::expm1(restart / mtbi), 1e-6);
}

TEST(Goodput, DalyIntervalMaximisesGoodput) {
  const double work = 1e7, delta = 30, restart = 600, mtbi = 11000;
  const double daly = daly_interval_s(delta, mtbi);
  const double at_daly = job_goodput(work, daly, delta, restart, mtbi).fraction();
  double best = 0;
  for (double tau = 50; tau < 5000; tau *= 1.01)
    best = std::max(best, job_goodput(work, tau, delta, restart, mtbi).fraction());
  EXPECT_NEAR(at_daly, best, 1e-4);
  // Checkpointing ten times more or less often costs goodput.
  EXPECT_LT(job_goodput(work, daly * 10, delta, restart, mtbi).fraction(), at_daly - 0.01);
  EXPECT_LT(job_goodput(work, daly / 10, delta, restart, mtbi).fraction(), at_daly - 0.01);
}

TEST(Goodput, PlannedStopsCostARestartEach) {
  // No failures; one planned stop a day costing 600 + 30 s: T = T0 / (1 - p (R + delta)).
  const double p = 1.0 / 86400;
  const Goodput g = job_goodput(864000, 3600, 30, 600, kInf, p);
  const double t0 = 864000 + 240 * 30;
  EXPECT_NEAR(g.total(), t0 / (1 - p * 630), 1e-6);
  EXPECT_NEAR(g.planned, p * g.total(), 1e-9);
  EXPECT_NEAR(g.planned_restart, g.planned * 630, 1e-6);
}

}  // namespace
}  // namespace parasol::cost
