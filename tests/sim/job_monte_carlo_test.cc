// The Monte Carlo of failures over simulated jobs (sim/job_monte_carlo.h) against the goodput
// closed form (cost_models/goodput.h): the expected wall time within 2%, and each part of it.
#include "sim/job_monte_carlo.h"

#include <gtest/gtest.h>

#include <cmath>

namespace parasol::sim {
namespace {

void expect_agreement(const JobMonteCarloOptions& o) {
  const cost::Goodput closed =
      cost::job_goodput(o.work_s, o.interval_s, o.delta_s, o.restart_s, o.mtbi_s);
  const cost::Goodput mc = job_monte_carlo(o);
  EXPECT_NEAR(mc.total() / closed.total(), 1, 0.02) << "wall time";
  EXPECT_NEAR(mc.fraction() / closed.fraction(), 1, 0.02) << "goodput";
  EXPECT_NEAR(mc.productive, closed.productive, 1e-9 * closed.productive);
  EXPECT_NEAR(mc.checkpoint, closed.checkpoint, 1e-6 * closed.checkpoint);
  EXPECT_NEAR(mc.lost_work / closed.lost_work, 1, 0.05) << "lost work";
  EXPECT_NEAR(mc.restart / closed.restart, 1, 0.05) << "restart";
  EXPECT_NEAR(mc.interruptions / closed.interruptions, 1, 0.05) << "interruptions";
}

TEST(JobMonteCarlo, AgreesWithTheClosedFormAtLlamaScale) {
  // A Llama 3-like job: MTBI 3.1 h, a 3 s checkpoint every Daly interval, 10 min restarts, 30
  // days of work (~230 interruptions a job).
  JobMonteCarloOptions o;
  o.work_s = 30 * 86400;
  o.mtbi_s = 11135;
  o.delta_s = 3;
  o.restart_s = 600;
  o.interval_s = cost::daly_interval_s(o.delta_s, o.mtbi_s);
  o.jobs = 200;
  o.seed = 7;
  expect_agreement(o);
}

TEST(JobMonteCarlo, AgreesWhenCheckpointsAndRestartsAreLong) {
  // Far from the first-order regime: checkpoints of 20 min every 2 h, restarts of 1 h, MTBI 5 h
  // (restarts are interrupted too).
  JobMonteCarloOptions o;
  o.work_s = 100 * 3600;
  o.interval_s = 7200;
  o.delta_s = 1200;
  o.restart_s = 3600;
  o.mtbi_s = 18000;
  o.jobs = 2000;
  o.seed = 11;
  expect_agreement(o);
}

TEST(JobMonteCarlo, SeededAndDeterministic) {
  JobMonteCarloOptions o;
  o.work_s = 86400;
  o.interval_s = 1000;
  o.delta_s = 10;
  o.restart_s = 100;
  o.mtbi_s = 5000;
  o.jobs = 10;
  EXPECT_DOUBLE_EQ(job_monte_carlo(o).total(), job_monte_carlo(o).total());
  JobMonteCarloOptions other = o;
  other.seed = 2;
  EXPECT_NE(job_monte_carlo(o).total(), job_monte_carlo(other).total());
}

}  // namespace
}  // namespace parasol::sim
