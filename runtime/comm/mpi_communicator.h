// The MPI implementation of Communicator (runtime/comm/communicator.h): one MPI communicator per
// group of the Plan, split from the world in the plan's rank order, with MPI's non-blocking
// collectives (MPI_Iallreduce, MPI_Iallgather, MPI_Ireduce_scatter_block, MPI_Ialltoall(v),
// MPI_Ibcast) and MPI_Isend/MPI_Irecv. Host buffers only. MPI must be initialised by the caller
// (MPI_Init; MPI_Init_thread with at least MPI_THREAD_SERIALIZED when the communicators are
// called from a thread other than the one that initialised MPI) and finalised after the
// CommSet is destroyed.
//
// Strict mode (MpiCommOptions::nccl_semantics; PARASOL_NCCL_SEMANTICS=1 switches it on for every
// communicator of the process): the MPI communicator behaves like NcclCommunicator where a
// schedule can deadlock, so that the CPU suites catch what would hang on GPUs:
//   - A send to another member completes only once its receive has been posted (MPI_Issend),
//     whatever its size.
//   - The calls of one communicator run in order, as NCCL kernels on one CUDA stream: a call's
//     MPI operation is not even posted before every earlier call of the communicator has
//     completed, except calls issued together in one group, which are posted together and
//     complete together. A group is what NcclCommunicator makes one ncclGroupStart/End (its rule,
//     copied exactly): the calls between begin_group() and end_group(); and consecutive
//     isend/irecv calls, held back and issued together when the next non-p2p call, begin_group(),
//     end_group(), test() or wait() on any Request of the CommSet, or any call on another
//     communicator of the same CommSet comes (the communicators of one make_mpi_comm_set share
//     an MpiContext, as NcclCommunicators share an NcclContext). A transfer to this rank itself
//     is matched by tag outside that order, as NCCL's device copies are.
//   - Progress: every test()/wait() (and every call) posts the next group of every communicator
//     of the context once the one before it has completed, as a GPU runs its streams unattended.
//   - Watchdog: a group posted for longer than MpiCommOptions::watchdog_s (PARASOL_NCCL_WATCHDOG_S,
//     default 60 s) without completing throws parasol::Error ("comm.<name>.<call>") naming the
//     communicator, the call, its peer and tag: a deadlock that NCCL would hang in. The
//     communicator is then broken: its pending Requests and later calls throw; its stuck sends
//     are left to MPI (a peer may still receive them), its stuck receives cancelled.
#pragma once

#include <mpi.h>

#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/plan.h"
#include "runtime/comm/communicator.h"

namespace parasol::runtime {

struct MpiCommOptions {
  // NCCL's semantics (see above): synchronous sends, calls in stream order, NCCL's groups.
  bool nccl_semantics = false;
  // Strict mode: seconds a posted group may stay incomplete before it counts as a deadlock.
  double watchdog_s = 60;
  // PARASOL_NCCL_SEMANTICS (1: strict) and PARASOL_NCCL_WATCHDOG_S (seconds), read once per
  // process. Throws parasol::Error ("PARASOL_NCCL_WATCHDOG_S") on a value that is not positive.
  static const MpiCommOptions& from_env();
};

class MpiRequest;  // one MPI request and its completion work (mpi_communicator.cc)
class MpiContext;  // what the strict communicators of one CommSet share (held-back p2p batches)

class MpiCommunicator final : public Communicator {
 public:
  // Takes ownership of `comm` (freed by the destructor) and sets its error handler to
  // MPI_ERRORS_RETURN, so that MPI failures become parasol::Error. `context` is shared by the
  // communicators of one CommSet (null: its own); it matters in strict mode only.
  // REQUIRES: MPI is initialised; comm has members.size() ranks and this process is rank `index`.
  MpiCommunicator(std::string name, std::vector<int> members, int index, MPI_Comm comm,
                  const MpiCommOptions& options = MpiCommOptions::from_env(),
                  std::shared_ptr<MpiContext> context = nullptr);
  // Strict mode: issues held-back calls and waits for them first (or until the watchdog fires).
  // REQUIRES: no Request of this communicator is pending, and MPI is not yet finalised.
  ~MpiCommunicator() override;

  MPI_Comm comm() const { return comm_; }
  int64_t max_tag() const override { return max_tag_; }
  bool nccl_semantics() const { return options_.nccl_semantics; }

  // Calls until the matching end_group() form one group (strict mode: posted together at
  // end_group(), complete together; their Requests may not be waited on before it). Nests.
  // Throws parasol::Error ("comm.<name>.group") on an end_group() without begin_group().
  void begin_group() override;
  void end_group() override;

  // Strict mode, called through the context (a caller rarely needs them): issues the held-back
  // point-to-point batch; posts the next groups whose predecessors have completed (throws the
  // watchdog's parasol::Error).
  void flush();
  void drive();

  // A strict-mode operation, and a group of them (implementation details).
  struct StrictOp;
  struct Batch;

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
  // Posts `r`'s MPI call (`post`) now (default mode, or a strict transfer to this rank itself),
  // or queues it by NCCL's rule (strict). `p2p`: an isend/irecv to another member. `what`
  // describes the call for the watchdog ("send of 6 elements to member 1, tag 3").
  using Post = std::function<int(MPI_Request*)>;
  Request launch(std::unique_ptr<MpiRequest> r, Post post, bool p2p, std::string what);
  void before_call(bool p2p);
  std::shared_ptr<Batch> batch_for(bool p2p);
  void issue(std::shared_ptr<Batch> b);
  [[noreturn]] void watchdog(Batch& b);

  MPI_Comm comm_ = MPI_COMM_NULL;
  int64_t max_tag_ = 32767;
  MpiCommOptions options_;
  int group_depth_ = 0;
  std::shared_ptr<Batch> group_;              // the batch of the open group (strict)
  std::shared_ptr<Batch> p2p_;                // held-back point-to-point calls (strict)
  std::deque<std::shared_ptr<Batch>> queue_;  // issued groups in order; the head may be posted
  std::string broken_;                        // why the watchdog broke it (strict)
  std::shared_ptr<MpiContext> context_;
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
// `options` apply to every communicator of the set (which share one MpiContext).
std::unique_ptr<CommSet> make_mpi_comm_set(
    const Plan& plan, MPI_Comm world = MPI_COMM_WORLD,
    const MpiCommOptions& options = MpiCommOptions::from_env());

}  // namespace parasol::runtime
