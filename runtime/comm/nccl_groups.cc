// The bootstrap of the NCCL communicators, read off rank_groups (see nccl_groups.h).
#include "runtime/comm/nccl_groups.h"

#include <string>

#include "core/error.h"

namespace parasol::runtime {

std::vector<NcclGroupSpec> nccl_group_specs(const Plan& plan, int world_rank) {
  const RankGroups groups = rank_groups(plan, world_rank);
  std::vector<NcclGroupSpec> out;
  out.reserve(1 + kNumGroupKinds);

  NcclGroupSpec world;
  world.name = "world";
  world.world = true;
  world.members.resize(groups.world_size);
  for (int r = 0; r < groups.world_size; ++r) world.members[r] = r;
  world.index = world_rank;
  world.color = 0;
  out.push_back(std::move(world));

  for (Group kind : kGroupKinds) {
    const GroupMembership& m = groups[kind];
    NcclGroupSpec s;
    s.name = group_name(kind);
    s.kind = kind;
    s.members = m.members;
    s.index = m.index;
    s.color = m.color;
    out.push_back(std::move(s));
  }
  for (NcclGroupSpec& s : out) {
    s.key = s.index;
    s.id_root = s.members.front();
    s.creates_id = s.id_root == world_rank;
  }
  return out;
}

int nccl_local_device(int local_rank, int local_size, int device_count) {
  if (local_size < 1 || local_rank < 0 || local_rank >= local_size)
    throw Error("nccl.device", "local rank " + std::to_string(local_rank) + " of " +
                                   std::to_string(local_size) + " is not a rank of its node");
  if (device_count < 1) throw Error("nccl.device", "this node has no CUDA device");
  if (local_size > device_count)
    throw Error("nccl.device", std::to_string(local_size) + " ranks on this node but only " +
                                   std::to_string(device_count) +
                                   " CUDA devices (one GPU per rank)");
  return local_rank;
}

}  // namespace parasol::runtime
