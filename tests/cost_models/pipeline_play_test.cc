// Tests the pipeline's play (cost_models/pipeline_play.h) against the schedules' textbook
// figures (Narayanan et al. 2021, section 2.2: GPipe's and 1F1B's bubble of (p - 1) micro-batch
// slots; the interleaved schedule's of (p - 1) / v) and its steady-state extension against the
// whole play.
#include "cost_models/pipeline_play.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

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
  std::mt19937 rng(46);
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
        PipelinePlayer player;
        std::vector<double> extended, whole;
        player.play(p, t, extended);
        player.play_all(p, m, t, whole);
        ASSERT_EQ(extended.size(), whole.size());
        for (int st = 0; st < pp; ++st)
          EXPECT_NEAR(extended[st], whole[st], 1e-9 * whole[st])
              << schedule_name(s) << " pp " << pp << " m " << m << " stage " << st;
      }
}

}  // namespace
}  // namespace parasol::cost
