// runtime/comm/nccl_groups: the bootstrap of the NCCL communicators, checked on the CPU for
// several plans and rank orders: every rank's communicators are RankLayout's groups (and the
// world), in the same order on every rank; the split color and key put exactly the group's
// members in one MPI communicator with MPI rank == NCCL rank; each group has exactly one
// unique-id creator, its first member, which is MPI rank 0 of the split (the broadcast root);
// and the local-rank device choice. Plain gtest, no MPI, no CUDA.
#include "runtime/comm/nccl_groups.h"

#include <gtest/gtest.h>

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

std::vector<Plan> test_plans() {
  return {
      make_plan(1, 1, 1, 1, 1),
      make_plan(8, 1, 1, 1, 1),
      make_plan(2, 1, 1, 2, 2),
      make_plan(2, 2, 2, 4, 2),
      make_plan(3, 2, 3, 6, 2),
      make_plan(2, 2, 2, 4, 2, "pp-dp-ep-cp-tp"),
      make_plan(4, 1, 2, 2, 2, "tp-pp-dp-cp-ep"),
      make_plan(2, 3, 3, 3, 2, "ep-cp-pp-tp-dp"),
      make_plan(1, 2, 4, 8, 1, "dp-ep-cp-tp-pp"),
  };
}

TEST(NcclGroupSpecs, MatchRankLayoutAndBootstrapConsistently) {
  for (const Plan& plan : test_plans()) {
    SCOPED_TRACE("tp" + std::to_string(plan.tp) + " cp" + std::to_string(plan.cp) + " ep" +
                 std::to_string(plan.ep) + " dp" + std::to_string(plan.dp) + " pp" +
                 std::to_string(plan.pp) + " " + rank_order_name(plan.rank_order));
    const RankLayout layout(plan);
    const int world = layout.world();
    // (spec position, color) -> the ranks that put themselves in that split, by key.
    std::map<std::pair<size_t, int>, std::map<int, int>> splits;
    std::map<std::pair<size_t, int>, int> creators;
    std::vector<std::string> names;
    for (int r = 0; r < world; ++r) {
      const std::vector<NcclGroupSpec> specs = nccl_group_specs(plan, r);
      ASSERT_EQ(specs.size(), 1u + kGroupKinds.size());
      // Same order on every rank: the world, then kGroupKinds.
      std::vector<std::string> mine;
      for (const auto& s : specs) mine.push_back(s.name);
      if (names.empty()) names = mine;
      EXPECT_EQ(mine, names) << "rank " << r;
      EXPECT_TRUE(specs[0].world);
      EXPECT_EQ(specs[0].name, "world");
      EXPECT_EQ(specs[0].size(), world);
      EXPECT_EQ(specs[0].index, r);
      for (size_t i = 0; i < specs.size(); ++i) {
        const NcclGroupSpec& s = specs[i];
        if (i > 0) {
          EXPECT_FALSE(s.world);
          EXPECT_EQ(s.kind, kGroupKinds[i - 1]);
          EXPECT_EQ(s.name, group_name(s.kind));
          EXPECT_EQ(s.members, layout.group(s.kind, r)) << s.name << " of rank " << r;
        }
        ASSERT_GE(s.index, 0);
        ASSERT_LT(s.index, s.size());
        EXPECT_EQ(s.members[s.index], r) << s.name;
        EXPECT_EQ(s.key, s.index) << s.name;  // MPI rank of the split == NCCL rank
        EXPECT_EQ(s.id_root, s.members.front()) << s.name;
        EXPECT_EQ(s.creates_id, s.index == 0) << s.name << " of rank " << r;
        auto& split = splits[{i, s.color}];
        EXPECT_TRUE(split.emplace(s.key, r).second) << s.name << ": two ranks with one key";
        if (s.creates_id) {
          EXPECT_TRUE(creators.emplace(std::make_pair(i, s.color), r).second);
        }
      }
    }
    // Each split holds exactly its group's members, ordered by key as the group orders them
    // (so the broadcast root, MPI rank 0, is the creator), and has exactly one creator.
    std::map<size_t, int> covered;
    for (const auto& [at, by_key] : splits) {
      std::vector<int> ranks;
      for (const auto& [key, rank] : by_key) ranks.push_back(rank);
      const NcclGroupSpec s = nccl_group_specs(plan, ranks.front())[at.first];
      EXPECT_EQ(ranks, s.members) << s.name << " color " << at.second;
      ASSERT_EQ(creators.count(at), 1u) << s.name << " color " << at.second;
      EXPECT_EQ(creators.at(at), s.members.front());
      EXPECT_EQ(by_key.begin()->first, 0);
      covered[at.first] += static_cast<int>(ranks.size());
    }
    // The groups of each kind partition the world.
    for (const auto& [i, n] : covered) EXPECT_EQ(n, world) << names[i];
    // As many splits per kind as RankLayout has groups.
    for (size_t i = 1; i < names.size(); ++i) {
      int count = 0;
      for (const auto& [at, by_key] : splits) count += at.first == i;
      EXPECT_EQ(count, static_cast<int>(layout.groups(kGroupKinds[i - 1]).size())) << names[i];
    }
  }
}

TEST(NcclGroupSpecs, RejectsBadPlansAndRanks) {
  EXPECT_THROW(nccl_group_specs(make_plan(2, 1, 1, 1, 1), 2), Error);
  EXPECT_THROW(nccl_group_specs(make_plan(2, 1, 1, 1, 1), -1), Error);
  EXPECT_THROW(nccl_group_specs(make_plan(1, 1, 3, 4, 1), 0), Error);  // ep does not divide dp
  Plan bad = make_plan(0, 1, 1, 1, 1);
  EXPECT_THROW(nccl_group_specs(bad, 0), Error);
}

TEST(NcclLocalDevice, OneGpuPerLocalRank) {
  EXPECT_EQ(nccl_local_device(0, 1, 1), 0);
  for (int r = 0; r < 8; ++r) EXPECT_EQ(nccl_local_device(r, 8, 8), r);
  EXPECT_EQ(nccl_local_device(3, 4, 8), 3);
  EXPECT_THROW(nccl_local_device(0, 1, 0), Error);  // no device
  EXPECT_THROW(nccl_local_device(0, 2, 1), Error);  // two ranks, one GPU
  EXPECT_THROW(nccl_local_device(2, 2, 8), Error);  // not a local rank
  try {
    nccl_local_device(1, 9, 8);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("nccl.device"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace parasol::runtime
