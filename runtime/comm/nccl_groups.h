// How the NCCL communicator (runtime/comm/nccl_communicator.h) bootstraps its communicators, as
// pure logic that needs neither CUDA nor MPI, so that it is tested on machines without a GPU:
// which world ranks form each NCCL communicator (RankLayout's groups, via rank_groups), how each
// is split out of the MPI world (color, key), which member creates the ncclUniqueId and
// broadcasts it, and which local GPU a rank drives.
#pragma once

#include <string>
#include <vector>

#include "core/plan.h"
#include "runtime/comm/groups.h"

namespace parasol::runtime {

// The bootstrap of one NCCL communicator that contains this rank.
struct NcclGroupSpec {
  std::string name;          // "world" or group_name(kind): "tp", "dp-cp", ...
  bool world = false;        // true for the communicator over all ranks (kind is then unused)
  Group kind = Group::kTp;   // the Plan group, when !world
  std::vector<int> members;  // world ranks; members[i] is NCCL rank i
  int index = 0;             // this rank's NCCL rank (its position in members)
  int color = 0;             // MPI_Comm_split color: equal within the group, distinct across
                             // groups of the same kind
  int key = 0;               // MPI_Comm_split key: == index, so MPI rank == NCCL rank
  int id_root = 0;           // world rank that calls ncclGetUniqueId: members[0]
  bool creates_id = false;   // this rank is id_root (it is then MPI rank 0 of the split, the
                             // MPI_Bcast root)
  int size() const { return static_cast<int>(members.size()); }
};

// The NCCL communicators of `world_rank` under `plan`, in the order every rank initialises them
// (the same on all ranks, so that the blocking ncclCommInitRank calls cannot deadlock): the world
// first, then one per kGroupKinds entry.
// REQUIRES: as rank_groups(plan, world_rank) (throws parasol::Error "plan.<field>" or
// "world_rank" otherwise).
std::vector<NcclGroupSpec> nccl_group_specs(const Plan& plan, int world_rank);

// The CUDA device a rank drives: its node-local rank (its rank among the processes of its node,
// from MPI_Comm_split_type SHARED). Throws parasol::Error ("nccl.device") when the node has no
// device, or more local ranks than devices (NCCL cannot put two ranks of one communicator on the
// same GPU).
// REQUIRES: 0 <= local_rank < local_size.
int nccl_local_device(int local_rank, int local_size, int device_count);

}  // namespace parasol::runtime
