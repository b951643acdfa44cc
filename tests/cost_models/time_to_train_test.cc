// Tests cost_models/time_to_train.h and cost_models/energy.h: the steps, the wall time as the
// goodput closed form of the job's own figures, GPU-hours, cost, energy by hand, the interval in
// whole steps, a given interval, and the errors that name the option.
#include "cost_models/time_to_train.h"

#include <gtest/gtest.h>

#include <cmath>

#include "core/error.h"
#include "cost_models/variability.h"

namespace parasol::cost {
namespace {

struct Job {
  Model model = model_preset("llama3-8b");
  Cluster cluster = cluster_preset("dgx-h100", 64);
  Plan plan;
  Profile profile = default_profile(cluster.gpu_device(0));
  Job() {
    plan.tp = 8;
    plan.dp = 8;
    plan.micro_batch = 1;
    plan.global_batch = 128;
  }
};

TEST(Energy, ServerPowerIsTheDatasheet) {
  // One DGX H100: 8 x 700 W GPUs + 4.6 kW for the rest = 10.2 kW, the datasheet maximum.
  const Cluster c = cluster_preset("dgx-h100", 8);
  const PowerFigures p = default_power(c);
  EXPECT_NEAR(cluster_it_power_w(c, p, 1), 10200, 1e-9);
  EXPECT_NEAR(cluster_it_power_w(c, p, 0), 8 * 70 + 4600, 1e-9);
  // DGX A100: 8 x 400 W + 3.3 kW = 6.5 kW.
  const Cluster a = cluster_preset("dgx-a100-80g", 8);
  EXPECT_NEAR(cluster_it_power_w(a, default_power(a), 1), 6500, 1e-9);
  // The fabric's switches count too.
  const Cluster f = cluster_preset("dgx-h100", 64);
  EXPECT_NEAR(cluster_it_power_w(f, p, 1), 8 * 10200 + 9 * p.switch_w, 1e-9);
  EXPECT_DOUBLE_EQ(p.pue, 1.1);
}

TEST(TimeToTrain, StepsTimeAndBreakdown) {
  Job j;
  JobOptions o;
  o.tokens = 1e11;
  o.price_per_gpu_hour = 2.5;
  const StepFigures step{4.0, 3.0};
  const TimeToTrain t = time_to_train(j.model, j.cluster, j.plan, step, j.profile, o);
  // 128 sequences of 8,192 tokens a step: ceil(1e11 / 1,048,576) = 95,368 steps.
  EXPECT_DOUBLE_EQ(t.steps, 95368);
  EXPECT_NEAR(t.expected_step_s, 4 + 3 * j.profile.gpu_speed_cv * expected_max_standard_normal(64),
              1e-12);
  // The interval: Daly's optimum in whole steps.
  EXPECT_NEAR(t.daly_interval_s, daly_interval_s(t.checkpoint_write_s, t.reliability.mtbi_s), 1e-9);
  EXPECT_DOUBLE_EQ(t.interval_steps, std::round(t.daly_interval_s / t.expected_step_s));
  // The wall time is the goodput closed form of these figures.
  const Goodput g = job_goodput(t.steps * t.expected_step_s, t.interval_s, t.checkpoint_write_s,
                                t.restart_s, t.reliability.mtbi_s);
  EXPECT_NEAR(t.time_s, g.total(), 1e-9 * g.total());
  EXPECT_NEAR(t.goodput.productive, t.steps * t.expected_step_s, 1e-6);
  EXPECT_NEAR(t.restart_s, 600 + t.checkpoint_read_s, 1e-12);
  EXPECT_NEAR(t.gpu_hours, 64 * t.time_s / 3600, 1e-9 * t.gpu_hours);
  EXPECT_NEAR(t.cost, 2.5 * t.gpu_hours, 1e-9 * t.cost);
  // Energy by hand: busy steps at 3/4 of the expected step's compute share, the rest idle.
  const double busy = 3.0 / t.expected_step_s;
  const double it =
      cluster_it_power_w(j.cluster, t.power, busy) * (t.goodput.productive + t.goodput.lost_work) +
      cluster_it_power_w(j.cluster, t.power, 0) * (t.goodput.checkpoint + t.goodput.restart);
  EXPECT_NEAR(t.energy_j, 1.1 * it, 1e-9 * t.energy_j);
  const Json js = time_to_train_to_json(t);
  EXPECT_DOUBLE_EQ(js["time_to_train_s"].get<double>(), t.time_s);
  EXPECT_DOUBLE_EQ(js["goodput"].get<double>(), t.goodput.fraction());
  EXPECT_TRUE(js.contains("cost"));
}

TEST(TimeToTrain, GivenIntervalAndClusterFigures) {
  Job j;
  j.cluster.storage_bw = 10e9;
  j.cluster.restart_s = 120;
  JobOptions o;
  o.tokens = 1e10;
  o.checkpoint_interval_s = 1000;
  const TimeToTrain t = time_to_train(j.model, j.cluster, j.plan, {4.0, 3.0}, j.profile, o);
  EXPECT_TRUE(t.interval_given);
  EXPECT_DOUBLE_EQ(t.interval_steps, std::round(1000 / t.expected_step_s));
  EXPECT_NEAR(t.checkpoint_write_s, t.checkpoint.total_bytes / 10e9, 1e-12);
  EXPECT_NEAR(t.restart_s, 120 + t.checkpoint_write_s, 1e-12);
  // Stragglers already in the step: not added again.
  o.stragglers_included = true;
  EXPECT_DOUBLE_EQ(
      time_to_train(j.model, j.cluster, j.plan, {4.0, 3.0}, j.profile, o).expected_step_s, 4.0);
}

TEST(TimeToTrain, ErrorsNameTheOption) {
  Job j;
  auto field = [&](JobOptions o) {
    try {
      time_to_train(j.model, j.cluster, j.plan, {4.0, 3.0}, j.profile, o);
    } catch (const Error& e) {
      return e.field();
    }
    return std::string("no error");
  };
  JobOptions o;
  EXPECT_EQ(field(o), "job.tokens");
  o.tokens = 1e9;
  o.checkpoint_interval_s = -1;
  EXPECT_EQ(field(o), "job.checkpoint_interval");
  o.checkpoint_interval_s = 0;
  o.price_per_gpu_hour = -2;
  EXPECT_EQ(field(o), "job.price_per_gpu_hour");
  o.price_per_gpu_hour = 0;
  o.planned_per_day = 1000;  // 1,000 restarts of 10 min a day
  EXPECT_EQ(field(o), "job.planned_per_day");
}

}  // namespace
}  // namespace parasol::cost
