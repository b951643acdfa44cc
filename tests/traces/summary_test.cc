// Tests of trace summaries (traces/summary.h): a hand-made timeline whose split into compute,
// exposed communication, exposed copies and bubble is known exactly; receives counted as
// waiting; totals per kind, phase, group and stream; several steps in one trace; and a
// simulated trace whose summary agrees with the simulator's own breakdown.
#include "traces/summary.h"

#include <gtest/gtest.h>

#include "core/lower.h"
#include "core/model.h"
#include "core/plan.h"
#include "cost_models/profile.h"
#include "sim/engine.h"

namespace parasol::traces {
namespace {

constexpr double kEps = 1e-12;

TraceEvent ev(int rank, int stream, int op_id, const std::string& kind, double start, double dur,
              const std::string& phase = "fwd", const std::string& group = "") {
  TraceEvent e;
  e.rank = rank;
  e.stream = stream;
  e.op_id = op_id;
  e.name = kind + std::to_string(op_id);
  e.kind = kind;
  e.start_s = start;
  e.dur_s = dur;
  e.phase = phase;
  e.group = group;
  return e;
}

// Rank 0: compute [0,1], all-reduce [0.5,1.5] (half hidden), offload [1.5,2], idle [2,3],
// compute [3,4]. Rank 1: compute [0,1], recv [1,3] (waiting), compute [3,3.5].
Trace timeline() {
  Trace t;
  t.streams = {{0, 0, "compute"}, {0, 1, "comm"}, {0, 2, "copy"}};
  t.events = {ev(0, 0, 0, "linear", 0, 1),
              ev(0, 1, 1, "all-reduce", 0.5, 1, "bwd", "dp"),
              ev(0, 2, 2, "offload", 1.5, 0.5, "bwd"),
              ev(0, 0, 3, "norm", 3, 1, "optimizer"),
              ev(1, 0, 0, "linear", 0, 1),
              ev(1, 1, 1, "recv", 1, 2, "fwd", "pp"),
              ev(1, 0, 2, "linear", 3, 0.5)};
  return t;
}

TEST(Summary, SplitsEachRanksStep) {
  TraceSummary s = summarize(timeline());
  EXPECT_EQ(s.steps, 1);
  EXPECT_EQ(s.ranks, 2);
  EXPECT_NEAR(s.step_time_s, 4.0, kEps);
  ASSERT_EQ(s.rank_time.size(), 2u);
  const RankTime& r0 = s.rank_time[0];
  EXPECT_NEAR(r0.compute_s, 2.0, kEps);
  EXPECT_NEAR(r0.exposed_comm_s, 0.5, kEps);  // [1, 1.5]: comm not overlapped by compute
  EXPECT_NEAR(r0.exposed_copy_s, 0.5, kEps);
  EXPECT_NEAR(r0.bubble_s, 1.0, kEps);
  EXPECT_NEAR(r0.comm_s, 1.0, kEps);
  EXPECT_NEAR(r0.total_s(), s.step_time_s, kEps);
  EXPECT_NEAR(r0.compute_idle_s(), 2.0, kEps);
  // Rank 1's receive is a wait: bubble, not communication. Its step ends at 3.5 but the step
  // window is all ranks' (4 s).
  const RankTime& r1 = s.rank_time[1];
  EXPECT_NEAR(r1.compute_s, 1.5, kEps);
  EXPECT_NEAR(r1.exposed_comm_s, 0, kEps);
  EXPECT_NEAR(r1.comm_s, 0, kEps);
  EXPECT_NEAR(r1.bubble_s, 2.5, kEps);
  // Mean over ranks, and the rank with the most compute.
  EXPECT_NEAR(s.mean.compute_s, 1.75, kEps);
  EXPECT_NEAR(s.mean.bubble_s, 1.75, kEps);
  EXPECT_EQ(s.worst.rank, 0);
}

TEST(Summary, TotalsPerKindPhaseGroupAndStream) {
  TraceSummary s = summarize(timeline());
  EXPECT_NEAR(s.by_kind.seconds.at("linear"), 2.5, kEps);
  EXPECT_EQ(s.by_kind.events.at("linear"), 3);
  EXPECT_NEAR(s.by_kind.seconds.at("recv"), 2.0, kEps);
  EXPECT_NEAR(s.by_phase.seconds.at("fwd"), 4.5, kEps);
  EXPECT_NEAR(s.by_phase.seconds.at("bwd"), 1.5, kEps);
  EXPECT_NEAR(s.by_phase.seconds.at("optimizer"), 1.0, kEps);
  // Groups: communication only.
  EXPECT_EQ(s.by_group.seconds.size(), 2u);
  EXPECT_NEAR(s.by_group.seconds.at("dp"), 1.0, kEps);
  EXPECT_NEAR(s.by_group.seconds.at("pp"), 2.0, kEps);
  // Streams by name; rank 1 names none.
  EXPECT_NEAR(s.by_stream.seconds.at("compute"), 2.0, kEps);
  EXPECT_NEAR(s.by_stream.seconds.at("stream 0"), 1.5, kEps);
  EXPECT_NEAR(s.by_stream.seconds.at("stream 1"), 2.0, kEps);
  Json j = summary_to_json(s);
  EXPECT_NEAR(j["step_time_s"].get<double>(), 4.0, kEps);
  EXPECT_NEAR(j["rank_time"][0]["exposed_comm_s"].get<double>(), 0.5, kEps);
  EXPECT_EQ(j["by_kind"]["linear"]["events"].get<int>(), 3);
}

TEST(Summary, SeveralStepsInOneTrace) {
  // The same ops three times: steps of 4, 5 and 10 s (the median is 5); an event without an op
  // id belongs to the step it falls in.
  Trace t;
  const double starts[] = {0, 10, 20};
  const double lens[] = {4, 5, 10};
  for (int k = 0; k < 3; ++k) {
    t.events.push_back(ev(0, 0, 0, "linear", starts[k], 1));
    t.events.push_back(ev(0, 0, 1, "linear", starts[k] + lens[k] - 1, 1));
  }
  t.events.push_back(ev(0, 1, -1, "marker", 21, 1));
  TraceSummary s = summarize(t);
  EXPECT_EQ(s.steps, 3);
  ASSERT_EQ(s.step_times_s.size(), 3u);
  EXPECT_NEAR(s.step_times_s[0], 4, kEps);
  EXPECT_NEAR(s.step_times_s[2], 10, kEps);
  EXPECT_NEAR(s.step_time_s, 5, kEps);
  // Per step: (6 x 1 s of linear) / 3 steps.
  EXPECT_NEAR(s.by_kind.seconds.at("linear"), 2, kEps);
  // Compute per step is 2 s; the marker (unknown kind: compute) adds 1 s to step 3.
  EXPECT_NEAR(s.rank_time[0].compute_s, (2 + 2 + 3) / 3.0, kEps);
  EXPECT_NEAR(s.rank_time[0].total_s(), (4 + 5 + 10) / 3.0, kEps);
}

TEST(Summary, EmptyTrace) {
  TraceSummary s = summarize(Trace{});
  EXPECT_EQ(s.steps, 0);
  EXPECT_EQ(s.step_time_s, 0);
  EXPECT_TRUE(s.rank_time.empty());
}

TEST(Summary, AgreesWithTheSimulatorsBreakdown) {
  const Model model = model_preset("gpt2-124m");
  const Cluster cluster = cluster_preset("dgx-h100", 8);
  Plan plan;
  plan.tp = 2;
  plan.pp = 2;
  plan.dp = 2;
  plan.micro_batch = 2;
  plan.global_batch = 16;
  validate(plan, model, cluster);
  const cost::Profile profile = cost::default_profile(cluster.gpu_device(0));
  sim::SimResult r =
      sim::simulate(model, cluster, lower(model, cluster, plan), profile, /*record_trace=*/true);
  TraceSummary s = summarize(r.trace);
  EXPECT_EQ(s.steps, 1);
  EXPECT_EQ(s.ranks, plan.pp);
  EXPECT_NEAR(s.step_time_s, r.step_time_s, 1e-12);
  for (int st = 0; st < plan.pp; ++st) {
    SCOPED_TRACE(st);
    const RankTime& rt = s.rank_time[st];
    const sim::SimBreakdown& b = r.stage_breakdown[st];
    EXPECT_EQ(rt.rank, r.stage_rank[st]);
    EXPECT_NEAR(rt.compute_s, b.compute, 1e-9);
    // Both split the whole step, idle time differently: the simulator knows when a receive's
    // data or a pipeline rendezvous's transfer starts, the summary (which a trace does not
    // tell) counts a receive as waiting and a collective from its start.
    EXPECT_NEAR(rt.total_s(), b.total(), 1e-9);
    // The host's part: the compute stream waiting for the host to issue ops or wake from syncs.
    EXPECT_NEAR(rt.compute_idle_s(), b.exposed_comm_total() + b.exposed_offload + b.host + b.bubble,
                1e-9);
    EXPECT_GT(rt.exposed_comm_s, 0);
  }
}

}  // namespace
}  // namespace parasol::traces
