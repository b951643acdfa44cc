// Communication groups of one rank: which world ranks form each group of a Plan (tp, cp, ep, dp,
// pp, dp-cp, expert-dp, the HSDP shard and replicate groups, and expert-tp), this rank's index in
// each, and its pipeline and ring neighbours. The members and their order are RankLayout's
// (core/rank_layout.h), so the groups the runtime communicates on are exactly those the simulator
// prices. Pure logic, no MPI: the MPI and NCCL communicators both build their communicators from
// it.
#pragma once

#include <array>
#include <vector>

#include "core/plan.h"
#include "core/rank_layout.h"

namespace parasol::runtime {

// Every Group kind, in the order of the enum (a CommSet holds one communicator of each).
inline constexpr std::array<Group, kGroupKindCount> kGroupKinds = {Group::kTp,
                                                                   Group::kCp,
                                                                   Group::kEp,
                                                                   Group::kDp,
                                                                   Group::kPp,
                                                                   Group::kDpCp,
                                                                   Group::kExpertDp,
                                                                   Group::kDpShard,
                                                                   Group::kDpReplicate,
                                                                   Group::kExpertShard,
                                                                   Group::kExpertReplicate,
                                                                   Group::kExpertTp,
                                                                   Group::kCpA2a,
                                                                   Group::kCpRing};
inline constexpr int kNumGroupKinds = static_cast<int>(kGroupKinds.size());

// One group that contains this rank.
struct GroupMembership {
  Group kind = Group::kTp;
  std::vector<int> members;  // world ranks, in RankLayout::group order; members[i] has index i
  int index = 0;             // this rank's position in `members` (its rank in the communicator)
  int color = 0;             // the group's smallest world rank: equal for all members of this
                             // group, different for every other group of the same kind
  int size() const { return static_cast<int>(members.size()); }
  // The index `steps` places further round the ring of members (negative: backwards).
  int ring(int steps) const;
};

// All groups of one rank.
struct RankGroups {
  int world_rank = 0;
  int world_size = 1;                                  // plan.gpus()
  RankCoord coord;                                     // RankLayout's coordinates of world_rank
  std::array<GroupMembership, kNumGroupKinds> groups;  // indexed by static_cast<int>(Group)

  const GroupMembership& operator[](Group g) const { return groups[static_cast<int>(g)]; }
  // Pipeline neighbours, as indices in the pp group (the index in the pp group is the stage).
  // They wrap around: the last stage's next is stage 0 (the interleaved schedule's chunk
  // hand-over), stage 0's prev is the last stage. With pp == 1 both are 0 (this rank).
  int stage() const { return coord.pp; }
  int pp_next() const { return (*this)[Group::kPp].ring(1); }
  int pp_prev() const { return (*this)[Group::kPp].ring(-1); }
  bool first_stage() const { return stage() == 0; }
  bool last_stage() const { return stage() == (*this)[Group::kPp].size() - 1; }
  // Context-parallel ring neighbours (ring attention passes K/V to cp_next, receives from
  // cp_prev), as indices in the cp group.
  int cp_next() const { return (*this)[Group::kCp].ring(1); }
  int cp_prev() const { return (*this)[Group::kCp].ring(-1); }
};

// Throws parasol::Error naming the field when the plan's parallel grid is malformed: a degree
// below 1 ("plan.tp", "plan.etp"), ep not dividing dp ("plan.ep"; with an expert grid of its
// own, etp x ep not dividing tp x cp x dp), a shard_degree that does not cut the data-parallel
// groups evenly ("plan.shard_degree"), or a rank_order that is not a permutation
// of the five dimensions ("plan.rank_order"). Model- and cluster-dependent checks
// are core's validate(); this is the part the rank grid itself needs.
void check_rank_grid(const Plan& plan);

// The groups of `world_rank` under `plan`.
// REQUIRES: check_rank_grid(plan) passes and 0 <= world_rank < plan.gpus(); otherwise throws
// parasol::Error ("plan.<field>" or "world_rank").
RankGroups rank_groups(const Plan& plan, int world_rank);

}  // namespace parasol::runtime
