// Tests of RankLayout: mixed-radix rank numbering over the rank order, and the groups.
#include "core/rank_layout.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>

namespace parasol {
namespace {

Plan grid(int tp, int cp, int ep, int dp, int pp, const char* order = "tp-cp-ep-dp-pp") {
  Plan p;
  p.tp = tp;
  p.cp = cp;
  p.ep = ep;
  p.dp = dp;
  p.pp = pp;
  p.rank_order = parse_rank_order(order, "order");
  return p;
}

TEST(RankLayout, CoordAndRankAreInverse) {
  for (const char* order : {"tp-cp-ep-dp-pp", "pp-dp-ep-cp-tp", "tp-cp-dp-ep-pp"}) {
    RankLayout l(grid(2, 2, 2, 4, 3, order));
    ASSERT_EQ(l.world(), 2 * 2 * 4 * 3);
    for (int r = 0; r < l.world(); ++r) EXPECT_EQ(l.rank(l.coord(r)), r) << order;
  }
}

TEST(RankLayout, DefaultOrderPutsTensorParallelRanksNextToEachOther) {
  // Megatron's tp-cp-ep-dp-pp: tp varies fastest, then cp, then dp (ep inside it), then pp.
  RankLayout l(grid(4, 2, 1, 2, 2));
  EXPECT_EQ(l.group(Group::kTp, 0), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(l.group(Group::kCp, 0), (std::vector<int>{0, 4}));
  EXPECT_EQ(l.group(Group::kDp, 0), (std::vector<int>{0, 8}));
  EXPECT_EQ(l.group(Group::kPp, 0), (std::vector<int>{0, 16}));
  EXPECT_EQ(l.group(Group::kDpCp, 1), (std::vector<int>{1, 5, 9, 13}));
  EXPECT_EQ(l.coord(13).tp, 1);
  EXPECT_EQ(l.coord(13).cp, 1);
  EXPECT_EQ(l.coord(13).dpx, 1);
}

TEST(RankLayout, AStagesRepresentativeIsItsRankWithEveryOtherCoordinateZero) {
  for (const char* order : {"tp-cp-ep-dp-pp", "pp-dp-ep-cp-tp"}) {
    RankLayout l(grid(2, 2, 1, 2, 3, order));
    const std::vector<int> reps = l.stage_representatives();
    ASSERT_EQ(reps.size(), 3u) << order;
    for (int s = 0; s < 3; ++s) {
      EXPECT_EQ(reps[s], l.stage_representative(s));
      const RankCoord c = l.coord(reps[s]);
      EXPECT_EQ(c.pp, s) << order;
      EXPECT_EQ(c.tp + c.cp + c.ep + c.dpx, 0) << order << " stage " << s;
    }
  }
  // Megatron's default order puts pp slowest: stage s starts at rank s * (tp * cp * dp).
  EXPECT_EQ(RankLayout(grid(2, 2, 1, 2, 3)).stage_representatives(), (std::vector<int>{0, 8, 16}));
  // pp fastest: the first ranks are the stages' representatives.
  EXPECT_EQ(RankLayout(grid(2, 2, 1, 2, 3, "pp-dp-ep-cp-tp")).stage_representatives(),
            (std::vector<int>{0, 1, 2}));
}

TEST(RankLayout, GroupsPartitionTheWorld) {
  Plan p = grid(2, 4, 2, 4, 2, "tp-cp-dp-ep-pp");
  p.shard_degree = 4;
  p.cp_comm_type = CpCommType::kA2aP2p;
  p.cp_a2a_size = 2;
  RankLayout l(p);
  for (int gi = 0; gi < kGroupKindCount; ++gi) {
    const Group g = static_cast<Group>(gi);
    std::multiset<int> seen;
    for (const auto& members : l.groups(g)) seen.insert(members.begin(), members.end());
    EXPECT_EQ(static_cast<int>(seen.size()), l.world()) << group_name(g);
    for (int r = 0; r < l.world(); ++r) EXPECT_EQ(seen.count(r), 1u) << group_name(g);
  }
}

TEST(RankLayout, HierarchicalContextGroupsAreRunsOfTheCpGroupAndRingsAcrossThem) {
  // tp 2, cp 8 (Megatron order: cp next to tp): the cp group of rank 0 is {0, 2, ..., 14}. With
  // --hierarchical-context-parallel-sizes 2 4, Transformer Engine's all-to-all group of CP index c
  // is indices 2 * (c / 2) and 2 * (c / 2) + 1, its P2P ring the indices c % 2, c % 2 + 2, ...
  // (context_parallel.py: send_dst = cp_global_ranks[(rank + 1) % cp_size * cp_size_a2a +
  // rank_a2a]).
  Plan p = grid(2, 8, 1, 1, 1);
  p.cp_comm_type = CpCommType::kA2aP2p;
  p.cp_a2a_size = 2;
  RankLayout l(p);
  EXPECT_EQ(l.group(Group::kCp, 0), (std::vector<int>{0, 2, 4, 6, 8, 10, 12, 14}));
  EXPECT_EQ(l.group(Group::kCpA2a, 6), (std::vector<int>{4, 6}));
  EXPECT_EQ(l.group(Group::kCpA2a, 9), (std::vector<int>{9, 11}));
  EXPECT_EQ(l.group(Group::kCpRing, 6), (std::vector<int>{2, 6, 10, 14}));
  EXPECT_EQ(l.group(Group::kCpRing, 9), (std::vector<int>{1, 5, 9, 13}));
  // Any other exchange: the all-to-all group is the rank, the ring the whole cp group.
  p.cp_comm_type = CpCommType::kP2p;
  RankLayout plain(p);
  EXPECT_EQ(plain.group(Group::kCpA2a, 6), (std::vector<int>{6}));
  EXPECT_EQ(plain.group(Group::kCpRing, 6), plain.group(Group::kCp, 6));
  EXPECT_EQ(std::string(group_name(Group::kCpRing)), "cp-ring");
}

TEST(RankLayout, HsdpShardGroupsAreRunsOfTheDataParallelGroupAndReplicasTheirColumns) {
  // tp 2, cp 2, dp 4 (ep 2): the dp-cp group of rank 0 is {0, 2, 4, ..., 14} (cp fastest, then
  // ep, then dp / ep); shard degree 4 cuts it into {0, 2, 4, 6} and {8, 10, 12, 14}.
  Plan p = grid(2, 2, 2, 4, 1);
  p.shard_degree = 4;
  RankLayout l(p);
  EXPECT_EQ(l.group(Group::kDpCp, 0), (std::vector<int>{0, 2, 4, 6, 8, 10, 12, 14}));
  EXPECT_EQ(l.group(Group::kDpShard, 6), (std::vector<int>{0, 2, 4, 6}));
  EXPECT_EQ(l.group(Group::kDpShard, 10), (std::vector<int>{8, 10, 12, 14}));
  EXPECT_EQ(l.group(Group::kDpReplicate, 2), (std::vector<int>{2, 10}));
  EXPECT_EQ(l.group(Group::kDpReplicate, 15), (std::vector<int>{7, 15}));
  // Experts: the expert data-parallel group of rank 0 (ep 0) is {0, 2, 8, 10}; its shard groups
  // hold 4 / ep = 2 ranks.
  EXPECT_EQ(l.group(Group::kExpertDp, 0), (std::vector<int>{0, 2, 8, 10}));
  EXPECT_EQ(l.group(Group::kExpertShard, 8), (std::vector<int>{8, 10}));
  EXPECT_EQ(l.group(Group::kExpertReplicate, 2), (std::vector<int>{2, 10}));
  // Without HSDP a shard group is the whole data-parallel group, a replicate group the rank.
  RankLayout plain(grid(2, 2, 2, 4, 1));
  EXPECT_EQ(plain.group(Group::kDpShard, 3), plain.group(Group::kDpCp, 3));
  EXPECT_EQ(plain.group(Group::kExpertShard, 3), plain.group(Group::kExpertDp, 3));
  EXPECT_EQ(plain.group(Group::kDpReplicate, 3), (std::vector<int>{3}));
  EXPECT_EQ(std::string(group_name(Group::kExpertReplicate)), "expert-replicate");
}

TEST(RankLayout, DataParallelIndexIsTheDpCoordinateInEveryOrder) {
  // In a group the ranks are ordered by coordinate (first listed dimension fastest), so a
  // rank's index in its dp group is RankCoord::dp() whatever the rank order.
  for (const char* order : {"tp-cp-ep-dp-pp", "tp-cp-dp-ep-pp", "pp-dp-ep-cp-tp"}) {
    Plan p = grid(2, 1, 2, 4, 1, order);
    RankLayout l(p);
    for (int r = 0; r < l.world(); ++r) {
      std::vector<int> g = l.group(Group::kDp, r);
      auto at = std::find(g.begin(), g.end(), r) - g.begin();
      EXPECT_EQ(at, l.coord(r).dp(p.ep)) << order << " rank " << r;
      for (int m : g) EXPECT_EQ(l.coord(m).tp, l.coord(r).tp);
    }
  }
}

// Megatron's expert grid (etp != tp): each stage's tp x cp x dp ranks in increasing rank order,
// numbered etp-ep-edp (etp fastest); the dense grid has no ep dimension.
TEST(RankLayout, ExpertGridFollowsMegatronsEtpEpEdpOrderInsideEachStage) {
  Plan p = grid(2, 1, 4, 4, 2);  // tp 2, dp 4, pp 2 (16 ranks), etp 1, ep 4: edp 2
  p.etp = 1;
  RankLayout l(p);
  ASSERT_EQ(l.world(), 16);
  EXPECT_EQ(l.group(Group::kTp, 0), (std::vector<int>{0, 1}));
  EXPECT_EQ(l.group(Group::kDp, 0), (std::vector<int>{0, 2, 4, 6}));  // dense dp: no ep inside
  EXPECT_EQ(l.group(Group::kDpCp, 1), (std::vector<int>{1, 3, 5, 7}));
  EXPECT_EQ(l.group(Group::kEp, 0), (std::vector<int>{0, 1, 2, 3}));  // spans the tp ranks
  EXPECT_EQ(l.group(Group::kEp, 13), (std::vector<int>{12, 13, 14, 15}));
  EXPECT_EQ(l.group(Group::kExpertDp, 1), (std::vector<int>{1, 5}));
  EXPECT_EQ(l.group(Group::kExpertDp, 10), (std::vector<int>{10, 14}));
  EXPECT_EQ(l.group(Group::kExpertTp, 6), (std::vector<int>{6}));
  const RankCoord c = l.coord(13);  // stage 1, position 5
  EXPECT_EQ(c.pp, 1);
  EXPECT_EQ(c.ep, 0);
  EXPECT_EQ(c.dp(grid_ep(p)), 2);
  EXPECT_EQ(c.etp, 0);
  EXPECT_EQ(c.eep, 1);
  EXPECT_EQ(c.edp, 1);
  for (int r = 0; r < l.world(); ++r) {  // a rank's grid coordinates are its group indices
    const RankCoord rc = l.coord(r);
    auto at = [&](Group g) {
      const std::vector<int> m = l.group(g, r);
      return static_cast<int>(std::find(m.begin(), m.end(), r) - m.begin());
    };
    EXPECT_EQ(at(Group::kExpertTp), rc.etp);
    EXPECT_EQ(at(Group::kEp), rc.eep);
    EXPECT_EQ(at(Group::kExpertDp), rc.edp);
  }

  // etp 2 over tp 1: the expert TP group pairs data-parallel ranks; ep may exceed dp / etp.
  Plan q = grid(1, 2, 2, 4, 1);  // cp 2, dp 4: 8 ranks; etp 2, ep 2: edp 2
  q.etp = 2;
  q.shard_degree = 4;  // expert shards over shard_degree / ep = 2 of the edp ranks
  RankLayout m(q);
  EXPECT_EQ(m.group(Group::kExpertTp, 3), (std::vector<int>{2, 3}));
  EXPECT_EQ(m.group(Group::kEp, 3), (std::vector<int>{1, 3}));
  EXPECT_EQ(m.group(Group::kExpertDp, 3), (std::vector<int>{3, 7}));
  EXPECT_EQ(m.group(Group::kExpertShard, 3), (std::vector<int>{3, 7}));
  EXPECT_EQ(m.group(Group::kExpertReplicate, 3), (std::vector<int>{3}));

  // Another rank order: the stage's ranks are every other rank, still taken in rank order.
  Plan r = grid(2, 1, 2, 2, 2, "pp-tp-cp-ep-dp");
  r.etp = 1;
  RankLayout n(r);
  EXPECT_EQ(n.group(Group::kPp, 0), (std::vector<int>{0, 1}));
  EXPECT_EQ(n.group(Group::kEp, 0), (std::vector<int>{0, 2}));
  EXPECT_EQ(n.group(Group::kExpertDp, 0), (std::vector<int>{0, 4}));
  EXPECT_EQ(n.group(Group::kEp, 5), (std::vector<int>{5, 7}));
  for (const Plan& plan : {p, q, r}) {
    RankLayout lay(plan);
    for (Group g : {Group::kEp, Group::kExpertDp, Group::kExpertTp, Group::kExpertShard,
                    Group::kExpertReplicate}) {
      std::multiset<int> seen;
      for (const auto& members : lay.groups(g)) {
        seen.insert(members.begin(), members.end());
        for (int x : members) EXPECT_EQ(lay.coord(x).pp, lay.coord(members[0]).pp);
      }
      for (int x = 0; x < lay.world(); ++x) EXPECT_EQ(seen.count(x), 1u) << group_name(g);
    }
  }
  // Without an expert grid the expert TP group is the TP group and the grid coordinates are
  // the dense ones.
  RankLayout plain(grid(2, 2, 2, 4, 1));
  EXPECT_EQ(plain.group(Group::kExpertTp, 5), plain.group(Group::kTp, 5));
  EXPECT_EQ(plain.coord(5).eep, plain.coord(5).ep);
  EXPECT_EQ(std::string(group_name(Group::kExpertTp)), "expert-tp");
}

}  // namespace
}  // namespace parasol
