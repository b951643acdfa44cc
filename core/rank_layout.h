// RankLayout: where each rank sits in the parallel grid of a Plan, and the groups of ranks that
// communicate (tp, cp, ep, dp, pp, and the gradient-reduction groups). Ranks are GPU indices:
// rank r runs on cluster GPU r. The plan's rank_order lists dimensions first-fastest
// (Megatron's "tp-cp-ep-dp-pp"); ep is carved out of dp, so the "dp" entry of the order has
// size dp / ep.
//
// Expert tensor parallelism other than tp (Plan::expert_tp() != tp) gives the experts a grid of
// their own, Megatron's: the rank grid has no ep dimension (its "ep" entry has size 1 and the
// "dp" entry size dp), and the tp x cp x dp ranks of each pipeline stage, taken in increasing
// rank order, are numbered etp-ep-edp with etp fastest (edp = Plan::expert_dp()). The expert
// groups (kExpertTp, kEp, kExpertDp and its HSDP shard and replicate groups) are then groups of
// that grid, so ep may exceed dp and an ep group may span tensor-parallel ranks.
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
  // The tensor-parallel group of the experts: kTp when Plan::expert_tp() == tp, else the etp
  // consecutive ranks of the expert grid.
  kExpertTp,
  // Hierarchical context parallelism (Plan::cp_comm_type a2a+p2p; Megatron-Core's
  // --hierarchical-context-parallel-sizes [a, cp / a], Transformer Engine's cp_group list): the
  // all-to-all group, runs of cp_a2a_ranks(plan) consecutive members of kCp, and the P2P ring
  // across them, the members of kCp at the same position of every run (TE's
  // AttnFuncWithCPAndKVP2P sends to cp_global_ranks[(rank + 1) % cp_size * cp_size_a2a +
  // rank_a2a]). Under any other cp_comm_type an all-to-all group is the rank alone and a ring
  // the whole kCp.
  kCpA2a,
  kCpRing,
};
inline constexpr int kGroupKindCount = 14;  // values of Group
const char* group_name(Group g);

// Whether a collective of group `g` is of the data-parallel kind: gradient reduction, ZeRO-3
// gathers, HSDP's shard and replica groups, dense or expert. The lowering issues these on one
// stream (core/lower_emit.cc comm_stream); compute beside them is slowed by their kind's rule
// (cost_models/compute_overlap.h).
inline bool is_data_parallel(Group g) {
  switch (g) {
    case Group::kDp:
    case Group::kDpCp:
    case Group::kExpertDp:
    case Group::kDpShard:
    case Group::kDpReplicate:
    case Group::kExpertShard:
    case Group::kExpertReplicate:
      return true;
    default:
      return false;
  }
}

struct RankCoord {
  int tp = 0, cp = 0, ep = 0, dpx = 0, pp = 0;  // dpx: index along dp / ep
  // The data-parallel index; ep_size: grid_ep(plan), the size of the grid's ep dimension.
  int dp(int ep_size) const { return dpx * ep_size + ep; }
  // Coordinates in the expert grid (filled by RankLayout::coord, ignored by RankLayout::rank):
  // the indices of the rank in its kExpertTp, kEp and kExpertDp groups.
  int etp = 0, eep = 0, edp = 0;
};

// Ranks of each all-to-all group of hierarchical context parallelism (kCpA2a): plan.cp_a2a_size
// under cp_comm_type a2a+p2p, else 1.
inline int cp_a2a_ranks(const Plan& p) {
  return p.cp_comm_type == CpCommType::kA2aP2p && p.cp_a2a_size > 0 ? p.cp_a2a_size : 1;
}

// Whether the experts form a grid of their own (Plan::expert_tp() != tp; rank_layout.h's top).
inline bool expert_grid(const Plan& p) { return p.expert_tp() != p.tp; }
// The size of the rank grid's ep dimension: plan.ep, or 1 with an expert grid of its own.
inline int grid_ep(const Plan& p) { return expert_grid(p) ? 1 : p.ep; }

class RankLayout {
 public:
  explicit RankLayout(const Plan& plan);

  int world() const { return world_; }
  RankCoord coord(int rank) const;
  int rank(const RankCoord& c) const;
  // Ranks of the `g` group that contains `rank`, ordered by their coordinates along the group's
  // dimensions, the first varying fastest: kDp is ordered by RankCoord::dp() (ep fastest),
  // kDpCp by cp then dp, kExpertDp by cp then dp / ep. Under the default rank order this is
  // increasing rank order. The HSDP groups keep the order of kDpCp (kExpertDp), kCpA2a and
  // kCpRing that of kCp. With an expert
  // grid of its own, the expert groups are ordered by their grid coordinate (increasing rank
  // order within the stage).
  std::vector<int> group(Group g, int rank) const;
  // Every distinct `g` group.
  std::vector<std::vector<int>> groups(Group g) const;
  // The representative rank of pipeline stage `stage`: the rank at grid coordinate pp = stage
  // with every other dimension 0. The predictors (sim/engine.cc, cost_models/estimate.cc), the
  // calibration (traces/calibrate.cc), the comparison (traces/compare.cc), the framework's
  // per-rank memory log (cost_models/framework_memory.cc) and the Chakra export price or name
  // stage s's Program on it (cost_models/op_cost.h's OpPricer takes these as its reps).
  int stage_representative(int stage) const;
  // Every stage's representative, indexed by stage.
  std::vector<int> stage_representatives() const;

 private:
  int size_of(Dim d) const;
  std::vector<int> hsdp_group(Group g, int rank) const;
  std::vector<int> cp_level_group(Group g, int rank) const;  // kCpA2a, kCpRing
  // The expert grid: a rank's position among its stage's ranks in increasing rank order, and
  // the ranks of its stage in that order.
  int stage_position(const RankCoord& c) const;
  int rank_at_position(int pp, int pos) const;
  std::vector<int> expert_grid_group(Group g, int rank) const;
  std::array<Dim, 5> order_;
  std::array<int, 5> stride_{};  // indexed by Dim
  Plan plan_;
  bool grid_ = false;  // expert_grid(plan)
  int world_ = 1;
};

}  // namespace parasol
