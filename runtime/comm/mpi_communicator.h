// The MPI implementation of Communicator (runtime/comm/communicator.h): one MPI communicator per
// group of the Plan, split from the world in the plan's rank order, with MPI's non-blocking
// collectives (MPI_Iallreduce, MPI_Iallgather, MPI_Ireduce_scatter_block, MPI_Ialltoall(v),
// MPI_Ibcast) and MPI_Isend/MPI_Irecv. Host buffers only. MPI must be initialised by the caller
// (MPI_Init; MPI_Init_thread with at least MPI_THREAD_SERIALIZED when the communicators are
// called from a thread other than the one that initialised MPI) and finalised after the
// CommSet is destroyed.
#pragma once

#include <mpi.h>

#include <memory>
#include <string>
#include <vector>

#include "core/plan.h"
#include "runtime/comm/communicator.h"

namespace parasol::runtime {

class MpiCommunicator final : public Communicator {
 public:
  // Takes ownership of `comm` (freed by the destructor) and sets its error handler to
  // MPI_ERRORS_RETURN, so that MPI failures become parasol::Error.
  // REQUIRES: MPI is initialised; comm has members.size() ranks and this process is rank `index`.
  MpiCommunicator(std::string name, std::vector<int> members, int index, MPI_Comm comm);
  // REQUIRES: no Request of this communicator is pending, and MPI is not yet finalised.
  ~MpiCommunicator() override;

  MPI_Comm comm() const { return comm_; }
  int64_t max_tag() const override { return max_tag_; }

 protected:
  Request start_all_reduce(void* buf, int64_t count, Dtype dtype, bool max) override;
  Request start_all_gather(const void* send, void* recv, int64_t count, Dtype dtype,
                           bool in_place) override;
  Request start_reduce_scatter(const void* send, void* recv, int64_t count, Dtype dtype,
                               bool in_place) override;
  Request start_all_to_all(const void* send, void* recv, int64_t count, Dtype dtype) override;
  Request start_all_to_all_v(const void* send, std::span<const int64_t> send_counts, void* recv,
                             std::span<const int64_t> recv_counts, Dtype dtype) override;
  Request start_broadcast(void* buf, int64_t count, int root, Dtype dtype) override;
  Request start_send(const void* buf, int64_t count, int peer, int64_t tag, Dtype dtype) override;
  Request start_recv(void* buf, int64_t count, int peer, int64_t tag, Dtype dtype) override;
  Request start_barrier() override;

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
  int64_t max_tag_ = 32767;
};

// Builds this process's CommSet for `plan` over `world`: a duplicate of `world` and one
// MPI_Comm_split of it per group kind, whose members and order are RankLayout's (rank r of
// `world` is plan rank r).
// Collective over `world`: every rank calls it, with the same plan.
// REQUIRES: MPI is initialised. Throws parasol::Error on every rank, without hanging, when
//   - the plan's grid is malformed (check_rank_grid: "plan.<field>");
//   - world's size differs from plan.gpus() ("plan": "... needs 8 ranks (tp*pp*dp*cp =
//     2*2*2*1) but the MPI world has 4");
//   - ranks were given different grids (tp, pp, dp, cp, ep, rank_order) ("plan").
std::unique_ptr<CommSet> make_mpi_comm_set(const Plan& plan, MPI_Comm world = MPI_COMM_WORLD);

}  // namespace parasol::runtime
