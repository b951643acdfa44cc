// RankLayout: mixed-radix rank numbering over the plan's rank order.
#include "core/rank_layout.h"

#include <algorithm>

namespace parasol {

const char* group_name(Group g) {
  switch (g) {
    case Group::kTp:
      return "tp";
    case Group::kCp:
      return "cp";
    case Group::kEp:
      return "ep";
    case Group::kDp:
      return "dp";
    case Group::kPp:
      return "pp";
    case Group::kDpCp:
      return "dp-cp";
    case Group::kExpertDp:
      return "expert-dp";
    case Group::kDpShard:
      return "dp-shard";
    case Group::kDpReplicate:
      return "dp-replicate";
    case Group::kExpertShard:
      return "expert-shard";
    case Group::kExpertReplicate:
      return "expert-replicate";
    case Group::kExpertTp:
      return "expert-tp";
    case Group::kCpA2a:
      return "cp-a2a";
    case Group::kCpRing:
      return "cp-ring";
  }
  return "?";
}

RankLayout::RankLayout(const Plan& plan)
    : order_(plan.rank_order), plan_(plan), grid_(expert_grid(plan)) {
  int stride = 1;
  for (Dim d : order_) {
    stride_[static_cast<int>(d)] = stride;
    stride *= size_of(d);
  }
  world_ = stride;
}

int RankLayout::size_of(Dim d) const {
  switch (d) {
    case Dim::kTp:
      return plan_.tp;
    case Dim::kCp:
      return plan_.cp;
    case Dim::kEp:
      return grid_ ? 1 : plan_.ep;
    case Dim::kDp:
      return grid_ ? plan_.dp : plan_.dp / plan_.ep;
    case Dim::kPp:
      return plan_.pp;
  }
  return 1;
}

RankCoord RankLayout::coord(int rank) const {
  auto at = [&](Dim d) { return (rank / stride_[static_cast<int>(d)]) % size_of(d); };
  RankCoord c{at(Dim::kTp), at(Dim::kCp), at(Dim::kEp), at(Dim::kDp), at(Dim::kPp)};
  if (!grid_) {
    c.etp = c.tp;
    c.eep = c.ep;
    c.edp = c.cp + plan_.cp * c.dpx;
    return c;
  }
  const int etp = plan_.expert_tp(), pos = stage_position(c);
  c.etp = pos % etp;
  c.eep = pos / etp % plan_.ep;
  c.edp = pos / (etp * plan_.ep);
  return c;
}

// The mixed-radix number of c over the rank order without pp: the rank's index among the ranks
// of its stage in increasing rank order.
int RankLayout::stage_position(const RankCoord& c) const {
  int pos = 0, stride = 1;
  for (Dim d : order_) {
    if (d == Dim::kPp) continue;
    const int v = d == Dim::kTp ? c.tp : d == Dim::kCp ? c.cp : d == Dim::kEp ? c.ep : c.dpx;
    pos += v * stride;
    stride *= size_of(d);
  }
  return pos;
}

// The rank of stage `pp` at position `pos` (the inverse of stage_position).
int RankLayout::rank_at_position(int pp, int pos) const {
  RankCoord c;
  c.pp = pp;
  for (Dim d : order_) {
    if (d == Dim::kPp) continue;
    const int v = pos % size_of(d);
    pos /= size_of(d);
    (d == Dim::kTp ? c.tp : d == Dim::kCp ? c.cp : d == Dim::kEp ? c.ep : c.dpx) = v;
  }
  return rank(c);
}

// A group of the expert grid: the stage's ranks with the rank's other two grid coordinates.
std::vector<int> RankLayout::expert_grid_group(Group g, int r) const {
  const RankCoord me = coord(r);
  const int etp = plan_.expert_tp(), ep = plan_.ep, edp = plan_.expert_dp();
  auto at = [&](int t, int e, int d) { return rank_at_position(me.pp, (d * ep + e) * etp + t); };
  std::vector<int> out;
  if (g == Group::kExpertTp)
    for (int t = 0; t < etp; ++t) out.push_back(at(t, me.eep, me.edp));
  else if (g == Group::kEp)
    for (int e = 0; e < ep; ++e) out.push_back(at(me.etp, e, me.edp));
  else
    for (int d = 0; d < edp; ++d) out.push_back(at(me.etp, me.eep, d));
  return out;
}

int RankLayout::rank(const RankCoord& c) const {
  return c.tp * stride_[static_cast<int>(Dim::kTp)] + c.cp * stride_[static_cast<int>(Dim::kCp)] +
         c.ep * stride_[static_cast<int>(Dim::kEp)] + c.dpx * stride_[static_cast<int>(Dim::kDp)] +
         c.pp * stride_[static_cast<int>(Dim::kPp)];
}

int RankLayout::stage_representative(int stage) const {
  RankCoord c{};
  c.pp = stage;
  return rank(c);
}

std::vector<int> RankLayout::stage_representatives() const {
  std::vector<int> reps(plan_.pp);
  for (int s = 0; s < plan_.pp; ++s) reps[s] = stage_representative(s);
  return reps;
}

// A shard or replicate group: cut out of the data-parallel group of `r` (rank_layout.h).
std::vector<int> RankLayout::hsdp_group(Group g, int r) const {
  const bool expert = g == Group::kExpertShard || g == Group::kExpertReplicate;
  const std::vector<int> all = group(expert ? Group::kExpertDp : Group::kDpCp, r);
  const int n = static_cast<int>(all.size());
  int k = plan_.shard_degree <= 0 ? n
          : expert                ? plan_.expert_shard_ranks()
                                  : plan_.dense_shard_ranks();
  if (k < 1 || n % k != 0) k = n;  // (a plan validate() rejects)
  const int at = static_cast<int>(std::find(all.begin(), all.end(), r) - all.begin());
  std::vector<int> out;
  if (g == Group::kDpShard || g == Group::kExpertShard) {
    for (int i = at / k * k; i < at / k * k + k; ++i) out.push_back(all[i]);
  } else {
    for (int i = at % k; i < n; i += k) out.push_back(all[i]);
  }
  return out;
}

std::vector<int> RankLayout::cp_level_group(Group g, int r) const {
  const std::vector<int> all = group(Group::kCp, r);
  const int n = static_cast<int>(all.size());
  int k = cp_a2a_ranks(plan_);
  if (k < 1 || n % k != 0) k = 1;  // (a plan validate() rejects)
  const int at = static_cast<int>(std::find(all.begin(), all.end(), r) - all.begin());
  std::vector<int> out;
  if (g == Group::kCpA2a) {
    for (int i = at / k * k; i < at / k * k + k; ++i) out.push_back(all[i]);
  } else {
    for (int i = at % k; i < n; i += k) out.push_back(all[i]);
  }
  return out;
}

std::vector<int> RankLayout::group(Group g, int r) const {
  RankCoord base = coord(r);
  std::vector<Dim> dims;
  if (grid_ && (g == Group::kExpertTp || g == Group::kEp || g == Group::kExpertDp))
    return expert_grid_group(g, r);
  switch (g) {
    case Group::kDpShard:
    case Group::kDpReplicate:
    case Group::kExpertShard:
    case Group::kExpertReplicate:
      return hsdp_group(g, r);
    case Group::kCpA2a:
    case Group::kCpRing:
      return cp_level_group(g, r);
    case Group::kTp:
    case Group::kExpertTp:
      dims = {Dim::kTp};
      break;
    case Group::kCp:
      dims = {Dim::kCp};
      break;
    case Group::kEp:
      dims = {Dim::kEp};
      break;
    case Group::kDp:
      dims = {Dim::kEp, Dim::kDp};
      break;
    case Group::kPp:
      dims = {Dim::kPp};
      break;
    case Group::kDpCp:
      dims = {Dim::kCp, Dim::kEp, Dim::kDp};
      break;
    case Group::kExpertDp:
      dims = {Dim::kCp, Dim::kDp};
      break;
  }
  // Expand the slowest dimension first so that each later one varies faster: the first listed
  // dimension varies fastest (for kDp the index is RankCoord::dp()).
  std::vector<int> ranks{rank(base)};
  for (auto it = dims.rbegin(); it != dims.rend(); ++it) {
    const Dim d = *it;
    auto field = [&](RankCoord& c) -> int& {
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
      return c.tp;
    };
    std::vector<int> next;
    for (int r0 : ranks) {
      RankCoord c = coord(r0);
      for (int i = 0; i < size_of(d); ++i) {
        field(c) = i;
        next.push_back(rank(c));
      }
    }
    ranks = std::move(next);
  }
  return ranks;
}

std::vector<std::vector<int>> RankLayout::groups(Group g) const {
  std::vector<char> done(world_, 0);
  std::vector<std::vector<int>> out;
  for (int r = 0; r < world_; ++r) {
    if (done[r]) continue;
    out.push_back(group(g, r));
    for (int m : out.back()) done[m] = 1;
  }
  return out;
}

}  // namespace parasol
