// Compute beside communication (cost_models/compute_overlap.h): the rule, and its integral over a
// window against the instant-by-instant rule played on a fine grid.
#include "cost_models/compute_overlap.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/device.h"

namespace parasol::cost {
namespace {

Profile slowdowns(double s, double s_dp) {
  Profile f;
  f.overlap_compute_slowdown = s;
  f.dp_overlap_compute_slowdown = s_dp;
  return f;
}

TEST(ComputeSlowdown, EachKindAloneIsItsProfileFigureAndTogetherTheRatesMultiply) {
  const Profile f = slowdowns(0.19, 0.5);
  EXPECT_DOUBLE_EQ(compute_slowdown(f, false, false), 0);
  EXPECT_DOUBLE_EQ(compute_slowdown(f, true, false), 0.19);
  EXPECT_DOUBLE_EQ(compute_slowdown(f, false, true), 0.5);
  // A GEMM at 0.81 of its rate (the SMs the tensor-parallel overlap leaves) run in two waves.
  EXPECT_DOUBLE_EQ(1 - compute_slowdown(f, true, true), 0.81 * 0.5);
  // Compute always progresses.
  EXPECT_DOUBLE_EQ(compute_slowdown(slowdowns(1.0, 0), true, false), 0.99);
  EXPECT_DOUBLE_EQ(compute_slowdown(slowdowns(0, -0.2), false, true), 0);
}

TEST(ComputeSlowdown, OnlyDataParallelGroupsAreOfTheDataParallelKind) {
  for (Group g : {Group::kDp, Group::kDpCp, Group::kExpertDp, Group::kDpShard, Group::kDpReplicate,
                  Group::kExpertShard, Group::kExpertReplicate})
    EXPECT_TRUE(is_data_parallel(g)) << group_name(g);
  for (Group g : {Group::kTp, Group::kCp, Group::kEp, Group::kPp, Group::kExpertTp})
    EXPECT_FALSE(is_data_parallel(g)) << group_name(g);
}

// The expert all-to-alls beside compute (Megatron's overlapped exchange) hold SMs that the GEMMs
// were sized to use, as the data-parallel collectives do; the tensor-, context-parallel and
// pipeline traffic does not (userbuffers size their GEMMs; the others run in compute order).
TEST(ComputeSlowdown, ExpertExchangesHoldGemmSmsAsDataParallelTrafficDoes) {
  EXPECT_TRUE(holds_gemm_sms(Group::kEp));
  for (Group g : {Group::kDp, Group::kDpCp, Group::kExpertDp, Group::kDpShard})
    EXPECT_TRUE(holds_gemm_sms(g)) << group_name(g);
  for (Group g : {Group::kTp, Group::kCp, Group::kPp, Group::kExpertTp})
    EXPECT_FALSE(holds_gemm_sms(g)) << group_name(g);
}

// The rule played instant by instant over a window of compute beside `n_other` evenly spaced
// pieces of the other kind (`other` seconds in all) and `n_dp` pieces of the data-parallel kind,
// at spacings that share no period: the seconds compute loses (x per second at slowdown x).
double played(const Profile& f, double window, double other, int n_other, double dp, int n_dp) {
  const int steps = 200000;
  const double dt = window / steps;
  auto running = [&](double t, double total, int n) {
    const double period = window / n, length = total / n;
    return std::fmod(t, period) < length;
  };
  double lost = 0;
  for (int k = 0; k < steps; ++k) {
    const double t = (k + 0.5) * dt;
    lost += compute_slowdown(f, running(t, other, n_other), running(t, dp, n_dp)) * dt;
  }
  return lost;
}

TEST(OverlapSeconds, IsTheRuleOverAWindowWhereTheKindsRunIndependently) {
  const Profile f = slowdowns(0.19, 0.5);
  const double window = 1.0;
  for (auto [other, dp] : {std::pair{0.3, 0.4}, std::pair{0.6, 0.2}, std::pair{0.1, 0.9}}) {
    SCOPED_TRACE(std::to_string(other) + " s other, " + std::to_string(dp) + " s dp");
    const double expected = played(f, window, other, 7, dp, 11);
    EXPECT_NEAR(overlap_seconds(f, other, dp, window), expected, 0.01 * expected);
  }
}

TEST(OverlapSeconds, OneKindAloneCostsItsSlowdownTimesItsSeconds) {
  const Profile f = slowdowns(0.19, 0.5);
  EXPECT_DOUBLE_EQ(overlap_seconds(f, 0.3, 0, 1.0), 0.19 * 0.3);
  EXPECT_DOUBLE_EQ(overlap_seconds(f, 0, 0.3, 1.0), 0.5 * 0.3);
  EXPECT_DOUBLE_EQ(overlap_seconds(f, 0, 0, 0), 0);
}

// Only Hopper's default profile slows compute beside data-parallel collectives more than beside
// the others (its persistent GEMMs); elsewhere the two kinds cost alike.
TEST(OverlapSeconds, OnlyHopperChargesDataParallelOverlapApart) {
  for (const char* name : {"A100-80G", "B200", "V100-32G"}) {
    const Profile f = default_profile(device_spec(name));
    EXPECT_DOUBLE_EQ(overlap_seconds(f, 0, 0.2, 1.0), overlap_seconds(f, 0.2, 0, 1.0)) << name;
  }
  const Profile h100 = default_profile(device_spec("H100-SXM"));
  EXPECT_GT(overlap_seconds(h100, 0, 0.2, 1.0), 2 * overlap_seconds(h100, 0.2, 0, 1.0));
}

// One stream's collectives played first in, first out beside `window` seconds of compute: piece
// i of `pieces` takes `seconds[i]` and is issued at `issued[i]`; returns when the last ends,
// counted from the window's end (the seconds exposed).
double fifo_exposed(const std::vector<double>& seconds, const std::vector<double>& issued,
                    double window) {
  double end = 0;
  for (size_t i = 0; i < seconds.size(); ++i) end = std::max(end, issued[i]) + seconds[i];
  return std::max(0.0, end - window);
}

TEST(QueuedComm, ExposesWhatAFifoStreamPlaysWhenTheQueueNeverRunsDry) {
  // Two classes (dense and expert buckets) reduced layer by layer, in one queue: each layer's
  // pieces issued as its backward ends (the window's end for the first layer's: the edge);
  // where the queue is never empty before the edge is issued, the stream ends at
  // max(window + edge, all of it) from the window's start.
  const double window = 1.0;
  for (double piece : {0.02, 0.05, 0.15}) {
    SCOPED_TRACE(std::to_string(piece) + " s a piece");
    const int layers = 10;
    std::vector<double> seconds, issued;
    QueuedComm q;
    for (int l = 0; l < layers; ++l) {
      for (double share : {0.7, 0.3}) {  // the dense and the expert bucket of layer l
        seconds.push_back(share * piece * 2);
        issued.push_back(window * (l + 1) / layers);
        q.add(share * piece * 2, l == layers - 1 ? share * piece * 2 : 0);
      }
    }
    // Issued as early as the queue drains (no idle stream): the closed form's assumption.
    double t = 0;
    for (size_t i = 0; i < seconds.size(); ++i) {
      if (issued[i] < window) issued[i] = std::min(issued[i], t);
      t += seconds[i];
    }
    EXPECT_NEAR(q.exposed(window), fifo_exposed(seconds, issued, window), 1e-12);
    // What outlasts the window before the edge is the excess.
    EXPECT_NEAR(q.excess(window), std::max(0.0, q.comm - q.edge - window), 1e-12);
  }
  // Evenly issued pieces that leave the stream idle: the closed form is a lower bound, within
  // the largest piece.
  std::vector<double> seconds(10, 0.05), issued;
  QueuedComm q;
  for (int l = 0; l < 10; ++l) {
    issued.push_back(0.1 * (l + 1));
    q.add(0.05, l == 9 ? 0.05 : 0);
  }
  EXPECT_LE(q.exposed(1.0), fifo_exposed(seconds, issued, 1.0) + 1e-12);
  EXPECT_NEAR(q.exposed(1.0), fifo_exposed(seconds, issued, 1.0), 0.05);
}

TEST(QueuedComm, NothingBesideNoComputeHasNoExcess) {
  QueuedComm q;
  q.add(0.4, 0.1);
  EXPECT_DOUBLE_EQ(q.exposed(0), 0.4);
  EXPECT_DOUBLE_EQ(q.excess(0), 0);
  EXPECT_DOUBLE_EQ(q.exposed(0.2), 0.2);
  EXPECT_DOUBLE_EQ(q.excess(0.2), 0.1);
  EXPECT_DOUBLE_EQ(q.exposed(1.0), 0.1);
  EXPECT_DOUBLE_EQ(q.excess(1.0), 0);
  EXPECT_DOUBLE_EQ(QueuedComm{}.exposed(1.0), 0);
}

}  // namespace
}  // namespace parasol::cost
