// runtime/comm/groups: the groups each rank communicates on equal RankLayout's, partition the
// world, vary exactly the right coordinates, and give the right pipeline and ring neighbours.
// Plain gtest, no MPI.
#include "runtime/comm/groups.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/rank_layout.h"

namespace parasol::runtime {
namespace {

Plan make_plan(int tp, int cp, int ep, int dp, int pp, const std::string& order = "") {
  Plan p;
  p.tp = tp;
  p.cp = cp;
  p.ep = ep;
  p.dp = dp;
  p.pp = pp;
  if (!order.empty()) p.rank_order = parse_rank_order(order, "plan.rank_order");
  return p;
}

std::string describe(const Plan& p) {
  return "tp" + std::to_string(p.tp) + " cp" + std::to_string(p.cp) + " ep" + std::to_string(p.ep) +
         " dp" + std::to_string(p.dp) + " pp" + std::to_string(p.pp) + " etp" +
         std::to_string(p.expert_tp()) + " shard" + std::to_string(p.shard_degree) + " " +
         rank_order_name(p.rank_order);
}

// Grids with every dimension > 1 somewhere, and rank orders other than Megatron's.
std::vector<Plan> test_plans() {
  std::vector<Plan> plans = {
      make_plan(1, 1, 1, 1, 1),
      make_plan(2, 1, 1, 1, 1),
      make_plan(1, 1, 1, 1, 4),
      make_plan(2, 1, 1, 2, 2),
      make_plan(2, 2, 1, 2, 1),
      make_plan(2, 1, 2, 4, 1),
      make_plan(1, 2, 2, 2, 2),
      make_plan(2, 2, 2, 4, 2),
      make_plan(3, 2, 3, 6, 2),
      make_plan(2, 3, 1, 1, 5),
      make_plan(2, 2, 2, 4, 2, "pp-dp-ep-cp-tp"),
      make_plan(2, 2, 2, 4, 2, "dp-tp-pp-cp-ep"),
      make_plan(4, 1, 2, 2, 2, "tp-pp-dp-cp-ep"),
      make_plan(2, 3, 3, 3, 2, "ep-cp-pp-tp-dp"),
      make_plan(1, 2, 4, 8, 1, "dp-ep-cp-tp-pp"),
  };
  // HSDP: shard groups of shard_degree consecutive data-parallel ranks.
  for (Plan p : {make_plan(2, 2, 2, 4, 1), make_plan(1, 1, 1, 8, 2, "pp-dp-ep-cp-tp")}) {
    p.shard_degree = 4;
    plans.push_back(p);
  }
  // Expert grids of their own (etp != tp): ep beyond dp, etp over data-parallel ranks, HSDP.
  Plan g = make_plan(2, 1, 4, 4, 2);
  g.etp = 1;
  plans.push_back(g);
  g = make_plan(2, 1, 2, 2, 2, "pp-tp-cp-ep-dp");
  g.etp = 1;
  plans.push_back(g);
  g = make_plan(1, 2, 2, 4, 1);
  g.etp = 2;
  plans.push_back(g);
  g = make_plan(4, 1, 2, 2, 1);
  g.etp = 2;
  g.shard_degree = 2;
  plans.push_back(g);
  // Hierarchical context parallelism (a2a+p2p): all-to-all groups of 2, a ring of 3 across them.
  for (Plan h : {make_plan(2, 6, 1, 2, 1), make_plan(1, 6, 1, 2, 2, "dp-cp-tp-ep-pp")}) {
    h.cp_comm_type = CpCommType::kA2aP2p;
    h.cp_a2a_size = 2;
    plans.push_back(h);
  }
  return plans;
}

bool expert_group(Group g) {
  return g == Group::kEp || g == Group::kExpertDp || g == Group::kExpertTp ||
         g == Group::kExpertShard || g == Group::kExpertReplicate;
}

// The coordinates a group of kind g lets vary; all others are shared by its members. The
// groups of an expert grid of its own share only the stage.
bool varies(const Plan& p, Group g, Dim d) {
  if (p.expert_tp() != p.tp && expert_group(g)) return d != Dim::kPp;
  switch (g) {
    case Group::kTp:
    case Group::kExpertTp:
      return d == Dim::kTp;
    case Group::kCp:
    case Group::kCpA2a:
    case Group::kCpRing:
      return d == Dim::kCp;
    case Group::kEp:
      return d == Dim::kEp;
    case Group::kDp:
      return d == Dim::kEp || d == Dim::kDp;
    case Group::kPp:
      return d == Dim::kPp;
    case Group::kDpCp:
      return d == Dim::kCp || d == Dim::kEp || d == Dim::kDp;
    case Group::kExpertDp:
    case Group::kExpertShard:
    case Group::kExpertReplicate:
      return d == Dim::kCp || d == Dim::kDp;
    case Group::kDpShard:
    case Group::kDpReplicate:
      return d == Dim::kCp || d == Dim::kEp || d == Dim::kDp;
  }
  return false;
}

int coord_of(const RankCoord& c, Dim d) {
  switch (d) {
    case Dim::kTp:
      return c.tp;
    case Dim::kCp:
      return c.cp;
    case Dim::kEp:
      return c.ep;
    case Dim::kDp:
      return c.dpx;
    case Dim::kPp:
      return c.pp;
  }
  return -1;
}

int expected_size(const Plan& p, Group g) {
  switch (g) {
    case Group::kTp:
      return p.tp;
    case Group::kCp:
      return p.cp;
    case Group::kEp:
      return p.ep;
    case Group::kDp:
      return p.dp;
    case Group::kPp:
      return p.pp;
    case Group::kDpCp:
      return p.dp * p.cp;
    case Group::kExpertDp:
      return p.expert_dp();
    case Group::kExpertTp:
      return p.expert_tp();
    case Group::kDpShard:
      return p.shard_degree > 0 ? p.dense_shard_ranks() : p.dp * p.cp;
    case Group::kDpReplicate:
      return p.shard_degree > 0 ? p.dp * p.cp / p.dense_shard_ranks() : 1;
    case Group::kExpertShard:
      return p.shard_degree > 0 ? p.expert_shard_ranks() : p.expert_dp();
    case Group::kExpertReplicate:
      return p.shard_degree > 0 ? p.expert_dp() / p.expert_shard_ranks() : 1;
    case Group::kCpA2a:
      return cp_a2a_ranks(p);
    case Group::kCpRing:
      return p.cp / cp_a2a_ranks(p);
  }
  return -1;
}

TEST(GroupsTest, MembersAndIndicesAreRankLayouts) {
  for (const Plan& plan : test_plans()) {
    SCOPED_TRACE(describe(plan));
    const RankLayout layout(plan);
    for (int r = 0; r < plan.gpus(); ++r) {
      const RankGroups rg = rank_groups(plan, r);
      EXPECT_EQ(rg.world_rank, r);
      EXPECT_EQ(rg.world_size, plan.gpus());
      EXPECT_EQ(rg.coord.tp, layout.coord(r).tp);
      EXPECT_EQ(rg.coord.pp, layout.coord(r).pp);
      for (Group g : kGroupKinds) {
        SCOPED_TRACE(std::string(group_name(g)) + " of rank " + std::to_string(r));
        const GroupMembership& m = rg[g];
        EXPECT_EQ(m.kind, g);
        EXPECT_EQ(m.members, layout.group(g, r));
        ASSERT_GE(m.index, 0);
        ASSERT_LT(m.index, m.size());
        EXPECT_EQ(m.members[m.index], r);
        EXPECT_EQ(m.color, *std::min_element(m.members.begin(), m.members.end()));
        EXPECT_EQ(m.size(), expected_size(plan, g));
      }
    }
  }
}

TEST(GroupsTest, EachKindPartitionsTheWorld) {
  for (const Plan& plan : test_plans()) {
    SCOPED_TRACE(describe(plan));
    const RankLayout layout(plan);
    std::vector<RankGroups> all;
    for (int r = 0; r < plan.gpus(); ++r) all.push_back(rank_groups(plan, r));
    for (Group g : kGroupKinds) {
      SCOPED_TRACE(group_name(g));
      // The ranks naming a color agree on the members, and each is one of them exactly once.
      std::map<int, std::vector<int>> by_color;
      std::vector<int> times_seen(plan.gpus(), 0);
      for (const RankGroups& rg : all) {
        const GroupMembership& m = rg[g];
        auto [it, fresh] = by_color.emplace(m.color, m.members);
        if (fresh)
          for (int member : m.members) ++times_seen[member];
        else
          EXPECT_EQ(it->second, m.members) << "rank " << rg.world_rank;
        EXPECT_EQ(std::count(m.members.begin(), m.members.end(), rg.world_rank), 1);
        EXPECT_EQ(std::set<int>(m.members.begin(), m.members.end()).size(), m.members.size());
      }
      for (int r = 0; r < plan.gpus(); ++r) EXPECT_EQ(times_seen[r], 1) << "rank " << r;
      EXPECT_EQ(static_cast<int>(by_color.size()), plan.gpus() / expected_size(plan, g));
      EXPECT_EQ(by_color.size(), layout.groups(g).size());
      // The members' indices are consistent: member i of the group says it has index i.
      for (const auto& [color, members] : by_color)
        for (int i = 0; i < static_cast<int>(members.size()); ++i)
          EXPECT_EQ(all[members[i]][g].index, i);
    }
  }
}

TEST(GroupsTest, MembersShareEveryCoordinateTheGroupDoesNotSpan) {
  const Dim dims[] = {Dim::kTp, Dim::kCp, Dim::kEp, Dim::kDp, Dim::kPp};
  for (const Plan& plan : test_plans()) {
    SCOPED_TRACE(describe(plan));
    for (int r = 0; r < plan.gpus(); ++r) {
      const RankGroups rg = rank_groups(plan, r);
      for (Group g : kGroupKinds) {
        for (int member : rg[g].members) {
          const RankCoord c = rank_groups(plan, member).coord;
          for (Dim d : dims)
            if (!varies(plan, g, d)) {
              EXPECT_EQ(coord_of(c, d), coord_of(rg.coord, d))
                  << group_name(g) << " of rank " << r << " holds " << member << ", other "
                  << dim_name(d);
            }
        }
      }
    }
  }
}

TEST(GroupsTest, PipelineNeighboursAreTheAdjacentStagesOfTheSameReplica) {
  for (const Plan& plan : test_plans()) {
    SCOPED_TRACE(describe(plan));
    for (int r = 0; r < plan.gpus(); ++r) {
      const RankGroups rg = rank_groups(plan, r);
      const GroupMembership& pp = rg[Group::kPp];
      EXPECT_EQ(rg.stage(), pp.index);
      EXPECT_EQ(rg.first_stage(), rg.stage() == 0);
      EXPECT_EQ(rg.last_stage(), rg.stage() == plan.pp - 1);
      const RankGroups next = rank_groups(plan, pp.members[rg.pp_next()]);
      const RankGroups prev = rank_groups(plan, pp.members[rg.pp_prev()]);
      EXPECT_EQ(next.stage(), (rg.stage() + 1) % plan.pp);
      EXPECT_EQ(prev.stage(), (rg.stage() + plan.pp - 1) % plan.pp);
      for (const RankGroups* n : {&next, &prev}) {
        EXPECT_EQ(n->coord.tp, rg.coord.tp);
        EXPECT_EQ(n->coord.cp, rg.coord.cp);
        EXPECT_EQ(n->coord.ep, rg.coord.ep);
        EXPECT_EQ(n->coord.dpx, rg.coord.dpx);
      }
      // Each rank is its next's prev.
      EXPECT_EQ(next[Group::kPp].members[next.pp_prev()], r);
      // Ring attention: the cp ring is the cp group in order.
      const GroupMembership& cp = rg[Group::kCp];
      EXPECT_EQ(rg.cp_next(), (cp.index + 1) % plan.cp);
      EXPECT_EQ(rg.cp_prev(), (cp.index + plan.cp - 1) % plan.cp);
    }
  }
}

TEST(GroupsTest, HandComputedGroups) {
  // Megatron's order tp-cp-ep-dp-pp, tp2 dp2 pp2: rank = tp + 2*dp + 4*pp.
  {
    const Plan p = make_plan(2, 1, 1, 2, 2);
    const RankGroups rg = rank_groups(p, 3);  // tp 1, dp 1, pp 0
    EXPECT_EQ(rg[Group::kTp].members, (std::vector<int>{2, 3}));
    EXPECT_EQ(rg[Group::kTp].index, 1);
    EXPECT_EQ(rg[Group::kDp].members, (std::vector<int>{1, 3}));
    EXPECT_EQ(rg[Group::kPp].members, (std::vector<int>{3, 7}));
    EXPECT_EQ(rg[Group::kDpCp].members, (std::vector<int>{1, 3}));
    EXPECT_EQ(rg[Group::kCp].members, (std::vector<int>{3}));
    EXPECT_EQ(rg.pp_next(), 1);
    EXPECT_EQ(rg.pp_prev(), 1);
  }
  // pp-dp-ep-cp-tp (pp fastest), tp2 dp2 pp2: rank = pp + 2*dp + 4*tp.
  {
    const Plan p = make_plan(2, 1, 1, 2, 2, "pp-dp-ep-cp-tp");
    const RankGroups rg = rank_groups(p, 6);  // pp 0, dp 1, tp 1
    EXPECT_EQ(rg[Group::kTp].members, (std::vector<int>{2, 6}));
    EXPECT_EQ(rg[Group::kDp].members, (std::vector<int>{4, 6}));
    EXPECT_EQ(rg[Group::kPp].members, (std::vector<int>{6, 7}));
    EXPECT_EQ(rg[Group::kPp].index, 0);
    EXPECT_TRUE(rg.first_stage());
  }
  // MoE: tp1 dp4 ep2 (dp/ep = 2), cp2: rank = cp + 2*ep + 4*dpx.
  {
    const Plan p = make_plan(1, 2, 2, 4, 1);
    const RankGroups rg = rank_groups(p, 5);  // cp 1, ep 0, dpx 1
    EXPECT_EQ(rg[Group::kCp].members, (std::vector<int>{4, 5}));
    EXPECT_EQ(rg[Group::kEp].members, (std::vector<int>{5, 7}));
    EXPECT_EQ(rg[Group::kDp].members, (std::vector<int>{1, 3, 5, 7}));
    EXPECT_EQ(rg[Group::kDpCp].members, (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7}));
    EXPECT_EQ(rg[Group::kExpertDp].members, (std::vector<int>{0, 1, 4, 5}));
    EXPECT_EQ(rg[Group::kExpertDp].index, 3);
  }
}

TEST(GroupsTest, SingleStageNeighboursAreSelf) {
  const RankGroups rg = rank_groups(make_plan(2, 1, 1, 2, 1), 3);
  EXPECT_EQ(rg.pp_next(), 0);
  EXPECT_EQ(rg.pp_prev(), 0);
  EXPECT_TRUE(rg.first_stage());
  EXPECT_TRUE(rg.last_stage());
  EXPECT_EQ(rg.cp_next(), 0);
}

TEST(GroupsTest, RingStepsWrapBothWays) {
  GroupMembership m;
  m.members = {10, 11, 12, 13};
  m.index = 1;
  EXPECT_EQ(m.ring(1), 2);
  EXPECT_EQ(m.ring(-1), 0);
  EXPECT_EQ(m.ring(-2), 3);
  EXPECT_EQ(m.ring(7), 0);
}

// The error names the field; returns the field for matching.
std::string error_field(const Plan& p, int rank) {
  try {
    rank_groups(p, rank);
  } catch (const Error& e) {
    return e.field();
  }
  return "(no error)";
}

TEST(GroupsTest, MalformedGridsAndRanksAreErrors) {
  EXPECT_EQ(error_field(make_plan(0, 1, 1, 1, 1), 0), "plan.tp");
  EXPECT_EQ(error_field(make_plan(1, 1, 1, 1, -2), 0), "plan.pp");
  EXPECT_EQ(error_field(make_plan(1, 1, 3, 4, 1), 0), "plan.ep");
  Plan dup = make_plan(2, 1, 1, 1, 1);
  dup.rank_order = {Dim::kTp, Dim::kTp, Dim::kEp, Dim::kDp, Dim::kPp};
  EXPECT_EQ(error_field(dup, 0), "plan.rank_order");
  EXPECT_EQ(error_field(make_plan(2, 1, 1, 2, 1), 4), "world_rank");
  EXPECT_EQ(error_field(make_plan(2, 1, 1, 2, 1), -1), "world_rank");
  EXPECT_NO_THROW(check_rank_grid(make_plan(2, 2, 2, 4, 2)));
  // An expert grid of its own: ep need not divide dp, but etp x ep must divide tp x cp x dp.
  Plan grid = make_plan(2, 1, 4, 2, 1);
  grid.etp = 1;
  EXPECT_NO_THROW(check_rank_grid(grid));
  grid.ep = 3;
  EXPECT_EQ(error_field(grid, 0), "plan.ep");
}

}  // namespace
}  // namespace parasol::runtime
