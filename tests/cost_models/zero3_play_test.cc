// Tests of cost_models/zero3_play.h: DeepSpeed ZeRO-3's lazy gathers played against the compute,
// on timelines small enough to draw by hand.
#include "cost_models/zero3_play.h"

#include <gtest/gtest.h>

namespace parasol::cost {
namespace {

// Three uses of one second each. Before use 0 the stream gathers use 0's module (1 s) and
// prefetches use 1's (2 s); after use 0 a reduce-scatter (1 s) waits for its gradients; before
// use 1 use 2's module is gathered (2 s), behind the reduce-scatter.
Zero3Uses three_uses() {
  Zero3Uses u;
  u.compute = {1, 1, 1};
  u.gathers = {{1, 2}, {2}, {}};
  u.gather_use = {0, 0, 1};
  u.gather_index = {0, 1, 0};
  u.reduces = {{1}, {}, {}};
  return u;
}

TEST(Zero3Play, AGatherQueuedBehindAReductionWaitsForTheBackward) {
  // Stream: A [0,1], B [1,3], the reduce-scatter once use 0 ends (compute [1,2]) and the stream
  // is free: [3,4], C [4,6]. Compute: use 1 [3,4], use 2 [6,7]. 7 s for 3 s of compute.
  const Zero3Play play = play_zero3_uses(three_uses(), 0);
  EXPECT_DOUBLE_EQ(play.comm, 6);
  EXPECT_DOUBLE_EQ(play.exposed, 4);
  EXPECT_DOUBLE_EQ(play.slowed, 0);
  // A queue that hides any collective behind any compute would expose 6 - 3 = 3 s: C waits
  // behind the reduction, which waits for use 0. Without the reduction C runs [3,5] and use 2
  // [5,6]: 3 s exposed of 5.
  Zero3Uses u = three_uses();
  u.reduces = {{}, {}, {}};
  EXPECT_DOUBLE_EQ(play_zero3_uses(u, 0).exposed, 3);
}

TEST(Zero3Play, ComputeBesideTheStreamRunsSlower) {
  // Uses of 2 s and 1 s; gathers of 1 s (use 0) and 2 s (use 1) issued before use 0. At half
  // speed beside B ([1,3]) use 0 does 1 s of work by 3, the rest by 4; use 1 runs [4,5].
  Zero3Uses u;
  u.compute = {2, 1};
  u.gathers = {{1, 2}, {}};
  u.gather_use = {0, 0};
  u.gather_index = {0, 1};
  u.reduces = {{}, {}};
  const Zero3Play play = play_zero3_uses(u, 0.5);
  EXPECT_DOUBLE_EQ(play.slowed, 1);   // half of the 2 s it ran beside B
  EXPECT_DOUBLE_EQ(play.exposed, 1);  // A
  EXPECT_DOUBLE_EQ(play.comm, 3);
}

TEST(Zero3Play, ABlockingReductionHoldsTheHost) {
  // B short (0.5 s) and C tiny (0.1 s): the reduce-scatter runs [2,3], C [3,3.1]. Without
  // blocking use 1 runs [2,3] and use 2 [3.1,4.1]; when the host waits for the reduction
  // (DeepSpeed's gradient copies to the CPU), use 1 starts at 3 and use 2 ends at 5.
  Zero3Uses u = three_uses();
  u.gathers = {{1, 0.5}, {0.1}, {}};
  EXPECT_NEAR(play_zero3_uses(u, 0).exposed, 4.1 - 3, 1e-12);
  u.blocking = true;
  EXPECT_NEAR(play_zero3_uses(u, 0).exposed, 5 - 3, 1e-12);
}

TEST(Zero3Play, EdgeComputeRunsWhereItIsIssued) {
  // Use 1's module gathered on demand (2 s, from 0.5 s on) while use 0 runs [0.5,1.5]: use 1
  // waits until 2.5. Prefetched before use 0 with the head and loss (2 s) issued between the
  // uses, the gather hides behind them.
  Zero3Uses u;
  u.compute = {1, 1};
  u.gathers = {{0.5}, {2}};
  u.gather_use = {0, 1};
  u.gather_index = {0, 0};
  u.reduces = {{}, {}};
  EXPECT_DOUBLE_EQ(play_zero3_uses(u, 0).exposed, 0.5 + 2 - 1);
  u.gathers = {{0.5, 2}, {}};
  u.gather_use = {0, 0};
  u.gather_index = {0, 1};
  u.middle = 2;
  u.middle_at = 1;
  EXPECT_DOUBLE_EQ(play_zero3_uses(u, 0).exposed, 0.5);
}

}  // namespace
}  // namespace parasol::cost
