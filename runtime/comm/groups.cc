// Communication groups of one rank, read off RankLayout (see groups.h).
#include "runtime/comm/groups.h"

#include <algorithm>
#include <string>

#include "core/error.h"

namespace parasol::runtime {

int GroupMembership::ring(int steps) const {
  const int n = size();
  if (n == 0) return 0;
  return ((index + steps) % n + n) % n;
}

void check_rank_grid(const Plan& plan) {
  const std::pair<int, const char*> degrees[] = {
      {plan.tp, "tp"}, {plan.pp, "pp"}, {plan.dp, "dp"}, {plan.cp, "cp"}, {plan.ep, "ep"}};
  for (auto [value, name] : degrees)
    if (value < 1)
      throw Error(std::string("plan.") + name, std::to_string(value) + " is not a degree >= 1");
  if (plan.etp < 0) throw Error("plan.etp", std::to_string(plan.etp) + " is not a degree >= 0");
  if (!expert_grid(plan) && plan.dp % plan.ep != 0)
    throw Error("plan.ep",
                std::to_string(plan.ep) + " does not divide dp (" + std::to_string(plan.dp) + ")");
  if (expert_grid(plan) && (plan.tp * plan.cp * plan.dp) % (plan.expert_tp() * plan.ep) != 0)
    throw Error("plan.ep", "etp x ep = " + std::to_string(plan.expert_tp()) + " x " +
                               std::to_string(plan.ep) + " does not divide tp x cp x dp (" +
                               std::to_string(plan.tp * plan.cp * plan.dp) + ")");
  const int dpcp = plan.dp * plan.cp;
  if (plan.shard_degree < 0 || (plan.shard_degree > 0 && dpcp % plan.shard_degree != 0))
    throw Error("plan.shard_degree", std::to_string(plan.shard_degree) +
                                         " does not divide the data-parallel group dp x cp (" +
                                         std::to_string(dpcp) + ")");
  if (plan.shard_degree > 0 && plan.ep > 1 &&
      (plan.shard_degree % plan.ep != 0 || plan.expert_dp() % (plan.shard_degree / plan.ep) != 0))
    throw Error("plan.shard_degree", std::to_string(plan.shard_degree) +
                                         " must be a multiple of ep whose quotient divides the "
                                         "expert data-parallel group (" +
                                         std::to_string(plan.expert_dp()) + " ranks)");
  std::array<int, 5> seen{};
  for (Dim d : plan.rank_order) {
    const int i = static_cast<int>(d);
    if (i < 0 || i >= 5 || seen[i]++)
      throw Error("plan.rank_order", "'" + rank_order_name(plan.rank_order) +
                                         "' is not a permutation of tp, cp, ep, dp, pp");
  }
}

RankGroups rank_groups(const Plan& plan, int world_rank) {
  check_rank_grid(plan);
  if (world_rank < 0 || world_rank >= plan.gpus())
    throw Error("world_rank", std::to_string(world_rank) + " is outside the plan's " +
                                  std::to_string(plan.gpus()) + " ranks");
  const RankLayout layout(plan);
  RankGroups out;
  out.world_rank = world_rank;
  out.world_size = layout.world();
  out.coord = layout.coord(world_rank);
  for (Group g : kGroupKinds) {
    GroupMembership& m = out.groups[static_cast<int>(g)];
    m.kind = g;
    m.members = layout.group(g, world_rank);
    auto it = std::find(m.members.begin(), m.members.end(), world_rank);
    PARASOL_CHECK(it != m.members.end(), "rank " + std::to_string(world_rank) +
                                             " missing from its own " + group_name(g) + " group");
    m.index = static_cast<int>(it - m.members.begin());
    m.color = *std::min_element(m.members.begin(), m.members.end());
  }
  // The pp group varies only the stage, so its order is the stage order.
  PARASOL_CHECK(out[Group::kPp].index == out.coord.pp,
                "the pp group's order is not the stage order");
  return out;
}

}  // namespace parasol::runtime
