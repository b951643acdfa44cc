// Tests the pipeline's play (cost_models/pipeline_play.h) against the schedules' textbook
// figures (Narayanan et al. 2021, section 2.2: GPipe's and 1F1B's bubble of (p - 1) micro-batch
// slots; the interleaved schedule's of (p - 1) / v), the step's data-parallel traffic beside the
// chunks' first forward and last backward against hand-played timelines, and its steady-state
// extension against the whole play; and the schedule's warm-up (core/pipeline_schedule.h)
// against its unit order.
#include "cost_models/pipeline_play.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

#include "core/pipeline_schedule.h"
#include "core/plan.h"

namespace parasol::cost {
namespace {

Plan pipeline(Schedule schedule, int pp, int vpp, int micro_batches) {
  Plan p;
  p.pp = pp;
  p.vpp = vpp;
  p.schedule = schedule;
  p.dp = 1;
  p.micro_batch = 1;
  p.global_batch = micro_batches;
  return p;
}

// Every stage's chunk alike: forward f and backward b seconds per chunk.
PipelineUnitTimes uniform(const Plan& p, double f, double b, double transfer = 0) {
  PipelineUnitTimes t;
  t.forward.assign(static_cast<size_t>(p.pp) * p.chunks(), f);
  t.backward.assign(t.forward.size(), b);
  t.transfer = transfer;
  return t;
}

double step(const std::vector<double>& ends) { return *std::max_element(ends.begin(), ends.end()); }

TEST(PipelinePlay, GpipeAndOneFOneBAddPMinusOneSlots) {
  for (Schedule s : {Schedule::kGpipe, Schedule::k1F1B})
    for (int pp : {1, 2, 4, 8})
      for (int m : {1, 3, 8, 64}) {
        const Plan p = pipeline(s, pp, 1, m);
        PipelinePlayer player;
        std::vector<double> ends;
        player.play(p, uniform(p, 1.0, 2.0), ends);
        EXPECT_NEAR(step(ends), (m + pp - 1) * 3.0, 1e-9)
            << schedule_name(s) << " pp " << pp << " m " << m;
      }
}

TEST(PipelinePlay, InterleavingDividesTheBubbleByTheVirtualStages) {
  for (int pp : {2, 4, 8})
    for (int vpp : {2, 4})
      for (int groups : {1, 2, 16}) {
        const int m = groups * pp;
        const Plan p = pipeline(Schedule::kInterleaved, pp, vpp, m);
        PipelinePlayer player;
        std::vector<double> ends;
        // A micro-batch's forward 1 s and backward 2 s per stage, split over its chunks.
        player.play(p, uniform(p, 1.0 / vpp, 2.0 / vpp), ends);
        EXPECT_NEAR(step(ends), m * 3.0 + (pp - 1) * 3.0 / vpp, 1e-9)
            << "pp " << pp << " vpp " << vpp << " m " << m;
      }
}

// The play beyond a few pipeline depths extends the steady state's period: on uneven stages and
// chunks with transfers, it is the whole play.
TEST(PipelinePlay, SteadyStateExtensionIsTheWholePlay) {
  std::mt19937 rng(46), traffic_rng(47);
  std::uniform_real_distribution<double> u(0.5, 2.0);
  for (Schedule s : {Schedule::kGpipe, Schedule::k1F1B, Schedule::kInterleaved})
    for (int pp : {2, 4, 8})
      for (int m : {13 * pp, 32 * pp}) {
        const Plan p = pipeline(s, pp, s == Schedule::kInterleaved ? 2 : 1, m);
        PipelineUnitTimes t;
        for (int i = 0; i < pp * p.chunks(); ++i) {
          t.forward.push_back(u(rng));
          t.backward.push_back(2 * u(rng));
        }
        t.transfer = 0.05 * u(rng);
        // The step's data-parallel traffic beside each chunk's first forward and last backward,
        // slowing the compute beside it.
        for (int i = 0; i < pp * p.chunks(); ++i) {
          t.gather.push_back({0.5 * u(traffic_rng), 0.1 * u(traffic_rng)});
          t.reduce.push_back({2 * u(traffic_rng), 0.2 * u(traffic_rng)});
          t.forward_compute.push_back(0.8 * t.forward[i]);
          t.backward_compute.push_back(0.8 * t.backward[i]);
        }
        t.dp_slowdown = 0.5;
        PipelinePlayer player;
        std::vector<double> extended, whole;
        player.play(p, t, extended);
        // GPipe is played whole; the others measure the period in one play.
        EXPECT_EQ(player.measured_plays(), s == Schedule::kGpipe ? 0 : 1)
            << schedule_name(s) << " pp " << pp << " m " << m;
        player.play_all(p, m, t, whole);
        ASSERT_EQ(extended.size(), whole.size());
        for (int st = 0; st < pp; ++st)
          EXPECT_NEAR(extended[st], whole[st], 1e-9 * whole[st])
              << schedule_name(s) << " pp " << pp << " m " << m << " stage " << st;
      }
}

// One stage, one micro-batch: a forward of 1 s, then a backward of 2 s beside whose compute 3 s
// of gradient reductions queue (0.5 s of them, the last bucket's, issued as it ends).
TEST(PipelinePlay, StepReductionsRunBesideTheLastBackwardAndSlowIt) {
  const Plan p = pipeline(Schedule::k1F1B, 1, 1, 1);
  PipelineUnitTimes t = uniform(p, 1.0, 2.0);
  t.reduce = {{3.0, 0.5}};
  PipelinePlayer player;
  std::vector<PipelineStageEnd> ends;
  // Unslowed: the reductions run from the backward's start (1 s) for 2.5 s, past its end (3 s),
  // then the last bucket's 0.5 s.
  player.play(p, t, ends);
  ASSERT_EQ(ends.size(), 1u);
  EXPECT_NEAR(ends[0].end, 4.0, 1e-12);
  EXPECT_NEAR(ends[0].dp_exposed, 1.0, 1e-12);
  EXPECT_NEAR(ends[0].dp_slowed, 0.0, 1e-12);
  // Compute at half its rate while they run: 1.25 s of the backward's work by 3.5 s, the other
  // 0.75 s at full rate (4.25 s), then the last bucket's reduction (4.75 s).
  t.dp_slowdown = 0.5;
  player.play(p, t, ends);
  EXPECT_NEAR(ends[0].end, 4.75, 1e-12);
  EXPECT_NEAR(ends[0].dp_slowed, 1.25, 1e-12);
  EXPECT_NEAR(ends[0].dp_exposed, 0.5, 1e-12);
  // Traffic longer than the compute slowed throughout: the backward at half rate, 4 s.
  t.reduce = {{10.0, 0.5}};
  player.play(p, t, ends);
  EXPECT_NEAR(ends[0].dp_slowed, 2.0, 1e-12);
  EXPECT_NEAR(ends[0].end, 1.0 + 9.5 + 0.5, 1e-12);
}

// The step's gathers beside a chunk's first forward: its compute waits for the first bucket and
// its last layer for the last.
TEST(PipelinePlay, StepGathersHoldTheFirstForward) {
  const Plan p = pipeline(Schedule::k1F1B, 1, 1, 2);
  PipelineUnitTimes t = uniform(p, 1.0, 2.0);
  t.gather = {{2.0, 0.5}};
  PipelinePlayer player;
  std::vector<PipelineStageEnd> ends;
  // The first forward from 0.5 s; the gathers end at 2 s, after its compute (1.5 s); then the
  // backward, the second micro-batch's forward and backward: 2 + 2 + 1 + 2. The stage waited
  // 0.5 s for the first gather and 0.5 s for the last.
  player.play(p, t, ends);
  EXPECT_NEAR(ends[0].end, 7.0, 1e-12);
  EXPECT_NEAR(ends[0].dp_exposed, 1.0, 1e-12);
  // Issued ahead of the unit, from the step's start, the first gather holds it as long.
  t.gather[0].ahead = 0.5;
  player.play(p, t, ends);
  EXPECT_NEAR(ends[0].end, 7.0, 1e-12);
  // A gather's wait for traffic queued before it: none here, the stream is free.
  t.gather[0].ahead = 2.0;
  player.play(p, t, ends);
  EXPECT_NEAR(ends[0].end, 7.0, 1e-12);
  EXPECT_NEAR(ends[0].dp_exposed, 1.0, 1e-12);
}

// In the interleaved schedule a chunk's reductions follow its last backward and run beside the
// other chunks' backwards that follow it: with compute slowed beside them, the step is longer by
// the slowdown of that overlap, at most s_dp of the reductions.
TEST(PipelinePlay, AChunksReductionsSlowTheBackwardsAfterIt) {
  const Plan p = pipeline(Schedule::kInterleaved, 2, 2, 4);
  PipelineUnitTimes t = uniform(p, 0.5, 1.0);
  PipelinePlayer player;
  std::vector<PipelineStageEnd> quiet, busy;
  player.play(p, t, quiet);
  t.reduce.assign(4, {0.4, 0.0});
  t.dp_slowdown = 0.5;
  player.play(p, t, busy);
  const double before = std::max(quiet[0].end, quiet[1].end);
  const double after = std::max(busy[0].end, busy[1].end);
  EXPECT_GT(after, before + 1e-6);
  EXPECT_LE(after, before + 0.5 * 0.4 * 4 + 1e-12);
  for (int s = 0; s < 2; ++s) EXPECT_GT(busy[s].dp_slowed, 0.0) << "stage " << s;
}

// Megatron's combined 1F1B pairs a forward with the backward next to it (core/lower_schedule.cc's
// run_steps); the units it leaves alone take their own seconds. Without a pipeline: the first
// forward and the last backward.
TEST(PipelinePlay, UnitsLeftAlonePlayTheirOwnSeconds) {
  const Plan p = pipeline(Schedule::k1F1B, 1, 1, 4);
  PipelineUnitTimes t = uniform(p, 1.0, 2.0);
  t.forward_alone = {1.25};
  t.backward_alone = {2.5};
  PipelinePlayer player;
  std::vector<double> ends;
  player.play(p, t, ends);
  EXPECT_NEAR(ends[0], 4 * 3.0 + 0.25 + 0.5, 1e-12);
  // Interleaved: the warm-up's and the cool-down's units alone, the steady state's paired.
  const Plan q = pipeline(Schedule::kInterleaved, 2, 2, 4);
  PipelineUnitTimes paired = uniform(q, 0.5, 1.0), alone = paired;
  alone.forward_alone.assign(4, 0.5);
  alone.backward_alone.assign(4, 1.0);
  std::vector<double> a, b;
  player.play(q, paired, a);
  player.play(q, alone, b);
  EXPECT_EQ(a, b);
  // Stage 0 runs 4 forwards alone, 4 pairs, then 4 backwards alone; stage 1 2 forwards alone,
  // then 6 steps whose forward and backward are one micro-batch's last chunk (the backward needs
  // the forward: not paired), then 2 backwards alone. Each stage ends later, by less than every
  // unit's excess.
  alone.forward_alone.assign(4, 0.75);
  alone.backward_alone.assign(4, 1.5);
  player.play(q, alone, b);
  for (int s = 0; s < 2; ++s) {
    EXPECT_GT(b[s], a[s] + 1e-9) << "stage " << s;
    EXPECT_LT(b[s], a[s] + 2 * 8 * (0.25 + 0.5)) << "stage " << s;
  }
}

// The warm-up and the units in flight are those of the schedule's unit order.
TEST(PipelineSchedule, WarmupAndUnitsInFlightFollowTheUnitOrder) {
  for (Schedule sc : {Schedule::kGpipe, Schedule::k1F1B, Schedule::kInterleaved})
    for (int pp : {1, 2, 4})
      for (int m : {1, 4, 8, 12}) {
        const Plan p = pipeline(sc, pp, sc == Schedule::kInterleaved ? 2 : 1, m);
        if (sc == Schedule::kInterleaved && m % pp != 0) continue;
        for (int s = 0; s < pp; ++s) {
          int forwards = 0, backwards = 0, warm = -1, peak = 0;
          for (const auto& step : pipeline_steps(p, s))
            for (const PipelineUnit& u : step) {
              if (!u.forward && warm < 0) warm = forwards;
              (u.forward ? forwards : backwards) += 1;
              peak = std::max(peak, forwards - backwards);
            }
          // The steady state begins with a forward (after the warm-up's, one more before the
          // first backward) unless the warm-up holds them all.
          EXPECT_EQ(std::min(pipeline_warmup_units(p, s, m) + 1, forwards), warm)
              << schedule_name(sc) << " pp " << pp << " m " << m << " stage " << s;
          EXPECT_EQ(pipeline_units_in_flight(p, s, m), peak)
              << schedule_name(sc) << " pp " << pp << " m " << m << " stage " << s;
        }
      }
}

// Flushes (Plan::pipeline_flushes): the schedules run one after another, each filled and
// drained: F flushes of m micro-batches are F plays of m, and each flush's units are the one-flush
// order of its own micro-batches, numbered on from the flush before.
TEST(PipelinePlay, EachFlushFillsAndDrainsThePipeline) {
  for (Schedule sc : {Schedule::k1F1B, Schedule::kInterleaved})
    for (int pp : {2, 4})
      for (int flushes : {2, 4}) {
        const int vpp = sc == Schedule::kInterleaved ? 2 : 1;
        const int m = 2 * pp;  // per flush
        Plan p = pipeline(sc, pp, vpp, m * flushes);
        p.pipeline_flushes = flushes;
        PipelinePlayer player;
        std::vector<double> ends;
        player.play(p, uniform(p, 1.0 / vpp, 2.0 / vpp), ends);
        EXPECT_NEAR(step(ends), flushes * (m * 3.0 + (pp - 1) * 3.0 / vpp), 1e-9)
            << schedule_name(sc) << " pp " << pp << " flushes " << flushes;
        const Plan one = pipeline(sc, pp, vpp, m);
        for (int s = 0; s < pp; ++s) {
          const auto steps = pipeline_steps(p, s), flush = pipeline_steps(one, s);
          ASSERT_EQ(steps.size(), flushes * flush.size());
          for (size_t i = 0; i < steps.size(); ++i) {
            const auto& want = flush[i % flush.size()];
            ASSERT_EQ(steps[i].size(), want.size());
            for (size_t j = 0; j < want.size(); ++j) {
              EXPECT_EQ(steps[i][j].forward, want[j].forward);
              EXPECT_EQ(steps[i][j].chunk, want[j].chunk);
              EXPECT_EQ(steps[i][j].mb, want[j].mb + static_cast<int>(i / flush.size()) * m);
            }
          }
          // A flush drains before the next: the peak is one flush's.
          EXPECT_EQ(pipeline_units_in_flight(p, s, m * flushes),
                    pipeline_units_in_flight(one, s, m));
        }
      }
}

}  // namespace
}  // namespace parasol::cost
