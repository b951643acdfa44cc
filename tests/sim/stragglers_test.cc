// Tests sim/stragglers.h: a named slow rank slows its stage's compute and the step; the slowdown
// of a stage is its slowest rank's; sampled per-rank variability agrees with the closed form's
// expected slowest GPU (cost_models/variability.h) on a one-stage plan; draws are seeded.
#include "sim/stragglers.h"

#include <gtest/gtest.h>

#include "core/error.h"
#include "cost_models/variability.h"

namespace parasol::sim {
namespace {

Plan make_plan(int tp, int pp, int dp) {
  Plan plan;
  plan.tp = tp;
  plan.pp = pp;
  plan.dp = dp;
  plan.micro_batch = 1;
  plan.global_batch = dp * 4;
  plan.seq_len = 2048;
  plan.sequence_parallel = tp > 1;
  return plan;
}

LoweredPlan validated_lowering(const Model& m, const Cluster& c, const Plan& p) {
  validate(p, m, c);
  return lower(m, c, p);
}

struct Played {
  Model model = model_preset("llama3-8b");
  Cluster cluster;
  Plan plan;
  LoweredPlan lowered;
  std::unique_ptr<Simulator> sim;
  Played(int tp, int pp, int dp)
      : cluster(cluster_preset("dgx-h100", tp * pp * dp)),
        plan(make_plan(tp, pp, dp)),
        lowered(validated_lowering(model, cluster, plan)),
        sim(std::make_unique<Simulator>(model, cluster,
                                        cost::default_profile(cluster.gpu_device(0)))) {}
};

TEST(Stragglers, StageSlowdownIsItsSlowestRank) {
  Plan p;
  p.tp = 2;
  p.pp = 2;
  p.dp = 2;  // rank order tp-cp-ep-dp-pp: ranks 0-3 in stage 0, 4-7 in stage 1
  std::vector<double> rank(8, 1.0);
  rank[1] = 1.2;
  rank[6] = 1.5;
  rank[7] = 1.1;
  EXPECT_EQ(stage_slowdowns(p, rank), (std::vector<double>{1.2, 1.5}));
}

TEST(Stragglers, ANamedSlowRankSlowsTheStep) {
  Played j(8, 2, 1);
  StragglerOptions o;
  o.slow_rank = 12;  // stage 1
  o.slow_factor = 1.5;
  const StepDistribution d = simulate_stragglers(*j.sim, j.lowered, o);
  EXPECT_EQ(d.slow_stage, 1);
  ASSERT_EQ(d.step_s.size(), 1u);
  EXPECT_GT(d.mean_s, d.base_step_s * 1.1);
  EXPECT_LT(d.mean_s, d.base_step_s * 1.5 + 1e-9);  // only compute slows down
  // Factor 1: the base step.
  o.slow_factor = 1;
  EXPECT_DOUBLE_EQ(simulate_stragglers(*j.sim, j.lowered, o).mean_s, d.base_step_s);
}

TEST(Stragglers, SampledVariabilityAgreesWithTheClosedForm) {
  // One stage of 16 ranks (tp 8, dp 2): the step is its communication plus the compute of the
  // slowest of 16 ranks, compute x (1 + cv E[max of 16 normals]) on average.
  Played j(8, 1, 2);
  const SimResult base = j.sim->simulate(j.lowered, false);
  StragglerOptions o;
  o.cv = 0.05;
  o.samples = 400;
  o.seed = 3;
  const StepDistribution d = simulate_stragglers(*j.sim, j.lowered, o);
  const double closed =
      cost::expected_step_time_s(base.step_time_s, base.breakdown.compute, o.cv, 16);
  EXPECT_GT(d.mean_s, base.step_time_s);
  EXPECT_NEAR(d.mean_s / closed, 1, 0.02);
  EXPECT_LE(d.min_s, d.p50_s);
  EXPECT_LE(d.p50_s, d.p90_s);
  EXPECT_LE(d.p90_s, d.p99_s);
  EXPECT_LE(d.p99_s, d.max_s);
  // Seeded: the same draws again.
  o.samples = 5;
  EXPECT_EQ(simulate_stragglers(*j.sim, j.lowered, o).step_s,
            simulate_stragglers(*j.sim, j.lowered, o).step_s);
}

TEST(Stragglers, BadOptionsNameTheField) {
  Played j(8, 1, 1);
  auto field = [&](StragglerOptions o) {
    try {
      simulate_stragglers(*j.sim, j.lowered, o);
    } catch (const Error& e) {
      return e.field();
    }
    return std::string("no error");
  };
  StragglerOptions o;
  o.slow_rank = 8;
  EXPECT_EQ(field(o), "stragglers.slow_rank");
  o.slow_rank = 0;
  o.slow_factor = 0.5;
  EXPECT_EQ(field(o), "stragglers.slow_factor");
  o.slow_factor = 1;
  o.cv = -1;
  EXPECT_EQ(field(o), "stragglers.cv");
  o.cv = 0;
  o.samples = 0;
  EXPECT_EQ(field(o), "stragglers.samples");
}

}  // namespace
}  // namespace parasol::sim
