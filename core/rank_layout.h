// RankLayout: where each rank sits in the parallel grid of a Plan, and the groups of ranks that
// communicate (tp, cp, ep, dp, pp, and the gradient-reduction groups). Ranks are GPU indices:
// rank r runs on cluster GPU r. The plan's rank_order lists dimensions first-fastest
// (Megatron's "tp-cp-ep-dp-pp"); ep is carved out of dp, so the "dp" entry of the order has
// size dp / ep.
#pragma once

#include <array>
#include <vector>

#include "core/plan.h"

namespace parasol {

enum class Group {
  kTp,        // tensor parallel
  kCp,        // context parallel
  kEp,        // expert parallel (inside dp)
  kDp,        // data parallel: ep x dp/ep ranks holding the same dense-parameter shard
  kPp,        // pipeline stages
  kDpCp,      // dense-gradient reduction group: dp x cp
  kExpertDp,  // expert-gradient reduction group: (dp / ep) x cp
  // HSDP (plan.shard_degree > 0): the shard groups are runs of Plan::dense_shard_ranks()
  // (Plan::expert_shard_ranks()) consecutive members of kDpCp (kExpertDp); a replicate group
  // holds the members at the same position of every shard group. Without HSDP a shard group is
  // the whole kDpCp (kExpertDp) group and a replicate group the rank alone.
  kDpShard,
  kDpReplicate,
  kExpertShard,
  kExpertReplicate,
};
inline constexpr int kGroupKindCount = 11;  // values of Group
const char* group_name(Group g);

struct RankCoord {
  int tp = 0, cp = 0, ep = 0, dpx = 0, pp = 0;  // dpx: index along dp / ep
  int dp(int ep_size) const { return dpx * ep_size + ep; }
};

class RankLayout {
 public:
  explicit RankLayout(const Plan& plan);

  int world() const { return world_; }
  RankCoord coord(int rank) const;
  int rank(const RankCoord& c) const;
  // Ranks of the `g` group that contains `rank`, ordered by their coordinates along the group's
  // dimensions, the first varying fastest: kDp is ordered by RankCoord::dp() (ep fastest),
  // kDpCp by cp then dp, kExpertDp by cp then dp / ep. Under the default rank order this is
  // increasing rank order. The HSDP groups keep the order of kDpCp (kExpertDp).
  std::vector<int> group(Group g, int rank) const;
  // Every distinct `g` group.
  std::vector<std::vector<int>> groups(Group g) const;

 private:
  int size_of(Dim d) const;
  std::vector<int> hsdp_group(Group g, int rank) const;
  std::array<Dim, 5> order_;
  std::array<int, 5> stride_{};  // indexed by Dim
  Plan plan_;
  int world_ = 1;
};

}  // namespace parasol
