// Tests of `compare` (traces/compare.h) on simulated traces: a trace against itself; a
// "measured" trace with every rank (each stage's events copied to all its ranks and slowed
// down) matched through the plan's rank layout and, without a plan, by op ids; several steps;
// and the rejection of traces of another program, of disjoint op ids and of traces without op
// ids.
#include "traces/compare.h"

#include <gtest/gtest.h>

#include "core/error.h"
#include "core/lower.h"
#include "core/model.h"
#include "core/plan.h"
#include "core/rank_layout.h"
#include "cost_models/profile.h"
#include "sim/engine.h"

namespace parasol::traces {
namespace {

Plan test_plan() {
  Plan plan;
  plan.tp = 2;
  plan.pp = 2;
  plan.dp = 2;
  plan.micro_batch = 2;
  plan.global_batch = 16;
  return plan;
}

Trace simulated(const std::string& model_name, const Plan& plan) {
  const Model model = model_preset(model_name);
  const Cluster cluster = cluster_preset("dgx-h100", 8);
  validate(plan, model, cluster);
  const cost::Profile profile = cost::default_profile(cluster.gpu_device(0));
  return sim::simulate(model, cluster, lower(model, cluster, plan), profile, true).trace;
}

// Every rank of the plan: the events of its stage's representative, times `slow`.
Trace every_rank(const Trace& predicted, const Plan& plan, double slow) {
  RankLayout layout(plan);
  Trace m;
  m.source = "measured";
  for (int r = 0; r < layout.world(); ++r) {
    RankCoord rep{};
    rep.pp = layout.coord(r).pp;
    const int p = layout.rank(rep);
    for (const TraceEvent& e : predicted.events)
      if (e.rank == p) {
        TraceEvent x = e;
        x.rank = r;
        x.start_s *= slow;
        x.dur_s *= slow;
        m.events.push_back(x);
      }
  }
  return m;
}

std::string error_field(const Trace& p, const Trace& m) {
  try {
    compare_traces(p, m, "pred.json", "meas.json");
  } catch (const Error& e) {
    return e.field();
  }
  return "";
}

// The trace's op events (the simulator's host row repeats each op: its issue span).
int ops_in(const Trace& t) {
  return static_cast<int>(std::count_if(t.events.begin(), t.events.end(), [](const TraceEvent& e) {
    return e.kind != kHostIssueKind;
  }));
}

TEST(Compare, ATraceAgainstItself) {
  const Trace t = simulated("gpt2-124m", test_plan());
  Comparison c = compare_traces(t, t);
  EXPECT_EQ(c.matched, ops_in(t));
  EXPECT_EQ(c.unmatched_predicted, 0);
  EXPECT_EQ(c.rank_map.size(), 2u);
  for (const auto& [m, p] : c.rank_map) EXPECT_EQ(m, p);
  EXPECT_FALSE(c.by_kind.empty());
  for (const CompareRow& r : c.by_kind) EXPECT_NEAR(r.error(), 0, 1e-12) << r.key;
  ASSERT_FALSE(c.by_phase.empty());
  EXPECT_EQ(c.by_phase[0].key, "fwd");
  EXPECT_EQ(c.by_phase[1].key, "bwd");
  EXPECT_NEAR(c.step.error(), 0, 1e-12);
  EXPECT_GT(c.step.measured_s, 0);
  // Sorted by measured time.
  for (size_t i = 1; i < c.by_kind.size(); ++i)
    EXPECT_GE(c.by_kind[i - 1].measured_s, c.by_kind[i].measured_s);
  Json j = comparison_to_json(c);
  EXPECT_EQ(j["matched"].get<int>(), c.matched);
  EXPECT_NEAR(j["step"]["error"].get<double>(), 0, 1e-12);
}

TEST(Compare, EveryMeasuredRankMatchesItsStagesRepresentative) {
  const Plan plan = test_plan();
  const Trace p = simulated("gpt2-124m", plan);
  Trace m = every_rank(p, plan, 1.25);
  RankLayout layout(plan);
  for (bool with_plan : {true, false}) {
    SCOPED_TRACE(with_plan ? "rank layout of the recorded plan" : "op-id signature");
    Trace pp = p;
    if (!with_plan) pp.plan = Json();
    Comparison c = compare_traces(pp, m);
    ASSERT_EQ(c.rank_map.size(), 8u);
    for (const auto& [mr, pr] : c.rank_map) {
      RankCoord rep{};
      rep.pp = layout.coord(mr).pp;
      EXPECT_EQ(pr, layout.rank(rep)) << "measured rank " << mr;
    }
    EXPECT_EQ(c.matched, 4 * ops_in(p));
    // 25% slower everywhere: predicted / measured - 1 = 1 / 1.25 - 1.
    for (const CompareRow& r : c.by_kind) EXPECT_NEAR(r.error(), -0.2, 1e-9) << r.key;
    EXPECT_NEAR(c.total.error(), -0.2, 1e-9);
    EXPECT_NEAR(c.step.error(), -0.2, 1e-9);
  }
}

TEST(Compare, SeveralMeasuredStepsUseTheMedian) {
  const Plan plan = test_plan();
  // Device events only, as a measured trace has them (no simulated host row): the steps' spans
  // then scale exactly with the ops.
  Trace p = simulated("gpt2-124m", plan);
  std::erase_if(p.events, [](const TraceEvent& e) { return e.kind == kHostIssueKind; });
  Trace m;
  const double slow[] = {1.0, 2.0, 1.1};  // per step; the median of each op is x1.1
  double t0 = 0;
  for (double s : slow) {
    Trace one = every_rank(p, plan, s);
    double end = 0;
    for (TraceEvent& e : one.events) {
      e.start_s += t0;
      end = std::max(end, e.end_s());
    }
    m.events.insert(m.events.end(), one.events.begin(), one.events.end());
    t0 = end + 1e-3;
  }
  Comparison c = compare_traces(p, m);
  EXPECT_EQ(c.measured.steps, 3);
  EXPECT_NEAR(c.total.error(), 1 / 1.1 - 1, 1e-9);
  EXPECT_NEAR(c.step.error(), 1 / 1.1 - 1, 1e-9);
}

TEST(Compare, RejectsTracesOfAnotherProgram) {
  const Plan plan = test_plan();
  const Trace p = simulated("gpt2-124m", plan);
  // Another model lowered with the same plan: its op ids name other ops.
  const Trace other = simulated("tiny-gpt", plan);
  EXPECT_NE(error_field(p, other).find("meas.json.ranks["), std::string::npos);
  // Another plan of the same model (no pipeline): ops of stage 1 are not stage 0's.
  Plan flat = plan;
  flat.pp = 1;
  flat.dp = 4;
  EXPECT_NE(error_field(p, simulated("gpt2-124m", flat)).find("meas.json.ranks["),
            std::string::npos);
  // Op ids that the prediction does not have.
  Trace shifted = p;
  for (TraceEvent& e : shifted.events) e.op_id += 1000000;
  EXPECT_NE(error_field(p, shifted).find("meas.json.ranks["), std::string::npos);
  // A trace without op ids (e.g. a profiler's own trace).
  Trace bare = p;
  for (TraceEvent& e : bare.events) e.op_id = -1;
  EXPECT_EQ(error_field(p, bare), "meas.json");
  EXPECT_EQ(error_field(bare, p), "pred.json");
  // A measured rank outside the recorded plan.
  Trace far = p;
  for (TraceEvent& e : far.events) e.rank += 100;
  EXPECT_EQ(error_field(p, far), "meas.json.ranks[100]");
}

}  // namespace
}  // namespace parasol::traces
