// The NCCL implementation of Communicator (runtime/comm/communicator.h): one ncclComm_t per
// group of the Plan (and one over the world), bootstrapped over MPI, on device buffers. Built
// only with the CUDA parts (PARASOL_HAVE_CUDA): library parasol_runtime_nccl.
//
// What differs from the MPI implementation (the rules of communicator.h hold otherwise):
//   - Buffers are device memory of this rank's GPU (select_nccl_device). A call only enqueues
//     work on the communicator's stream(): data a call reads must be ready in stream order (make
//     stream() wait on the producer's event, or give the producer's stream as the
//     communicator's), and a Request completes when a CUDA event recorded after the transfer
//     has fired (test: cudaEventQuery; wait: polls that event and ncclCommGetAsyncError, so a
//     failed peer throws instead of hanging).
//   - Point-to-point: NCCL has no tags. Sends and receives between two different members match
//     in the order they were issued, whatever their tags (issue them in the same order on both
//     sides); a size mismatch is not detected. Consecutive isend/irecv calls are held back and
//     issued together in one ncclGroupStart/End when the next non-p2p call, test(), wait(),
//     end_group() or any call on another communicator of the same CommSet comes, so that an
//     exchange (isend to a peer, irecv from it, on both sides) cannot deadlock on the stream.
//     A transfer to this rank itself is a device copy matched by tag (in order per tag) as in
//     MPI; waiting on one whose partner was never posted throws instead of hanging, and a
//     recv of another size than its send fails on wait/test.
//   - begin_group()/end_group(): every call between them is issued in one NCCL group at
//     end_group() (e.g. several all-reduces, or the sends and receives of an all-to-all-v); the
//     Requests of the group complete together, and may not be waited on before end_group().
//   - The element-wise maximum: fp32 (ncclMax), as Communicator requires. Sums: fp32 or bf16
//     (ncclBfloat16; NCCL's reduction order and rounding, not MPI's).
// MPI must be initialised by the caller, CommSets destroyed before MPI_Finalize; every Request
// must have completed before its communicator is destroyed.
#pragma once

#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/plan.h"
#include "runtime/comm/communicator.h"

namespace parasol::runtime {

class NcclContext;  // what the communicators of one CommSet share (deferred p2p batches)

class NcclCommunicator final : public Communicator {
 public:
  // Takes ownership of `comm` (destroyed, or aborted after an error, by the destructor). With
  // `stream` the communicator enqueues on that stream (not owned); without, it creates its own
  // non-blocking stream. `context` is shared by the communicators of one CommSet (null: its own).
  // REQUIRES: the current CUDA device is comm's; comm has members.size() ranks, this one `index`.
  NcclCommunicator(std::string name, std::vector<int> members, int index, ncclComm_t comm,
                   std::optional<cudaStream_t> stream = std::nullopt,
                   std::shared_ptr<NcclContext> context = nullptr);
  // Issues held-back transfers and waits for the stream. REQUIRES: no Request pending.
  ~NcclCommunicator() override;

  ncclComm_t comm() const { return comm_; }
  cudaStream_t stream() const { return stream_; }
  // NCCL has no tags; tags only order this rank's transfers to itself.
  int64_t max_tag() const override { return 2147483647; }
  // The communicator's stream waits for the event (a cudaEvent_t from CudaBackend).
  void wait_fence(void* fence) override;
  // NCCL's collectives and p2p calls are captured into CUDA graphs (NCCL >= 2.9.6) with the
  // stream they are enqueued on; Request::fence() is the batch's event.
  bool capturable() const override { return true; }

  // Calls until the matching end_group() are issued in one NCCL group at end_group(). Nests:
  // the outermost end_group() issues. Throws parasol::Error ("comm.<name>.group") on an
  // end_group() without begin_group().
  void begin_group() override;
  void end_group() override;
  bool in_group() const { return group_depth_ > 0; }

  // Issues the held-back point-to-point calls of this communicator now (see above). Called by
  // every call of every communicator of the CommSet; a caller rarely needs it.
  void flush();

  // The shared state of one batch of enqueued work and of a Request (implementation detail).
  struct Batch;
  struct Pending;

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
  struct SelfTransfer;
  // Flushes the other communicators of the context, and this one's p2p batch unless `p2p`.
  void before_call(bool p2p);
  // The batch the next call joins (the open group's, the p2p batch, or a new one).
  std::shared_ptr<Batch> batch_for(bool p2p);
  // Issues `b` unless it belongs to an open group or the held-back p2p batch.
  void maybe_issue(const std::shared_ptr<Batch>& b, bool p2p);
  void issue(Batch& b);
  Request request(const std::shared_ptr<Batch>& b, const char* what);
  // A transfer to this rank itself, `bytes` long, matched by tag with the partner posted first.
  Request self_transfer(bool is_send, const void* send, void* recv, int64_t bytes, int64_t tag);

  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  bool owns_stream_ = false;
  float* scratch_ = nullptr;  // one device float for barrier()
  int group_depth_ = 0;
  std::shared_ptr<Batch> group_;  // the batch of the open group
  std::shared_ptr<Batch> p2p_;    // held-back point-to-point calls
  std::vector<std::unique_ptr<SelfTransfer>> self_sends_, self_recvs_;  // unmatched, by post order
  std::shared_ptr<NcclContext> context_;
};

// The CUDA device this rank drives (nccl_local_device of its rank among the processes of its
// node in `world`), made current with cudaSetDevice. Call it before creating any CUDA resource
// (make_nccl_comm_set calls it too, with the same answer). Collective over `world`. Throws
// parasol::Error ("nccl.device") on every rank when any rank has no device for itself.
int select_nccl_device(MPI_Comm world = MPI_COMM_WORLD);

struct NcclCommOptions {
  // The stream every communicator enqueues on; none: each creates its own. With one stream for
  // all, the communicators' calls run in the order issued, which must then be the same on every
  // rank across communicators (as NCCL requires of calls on one stream).
  std::optional<cudaStream_t> stream;
};

// Builds this process's CommSet of NcclCommunicators for `plan` over `world`: selects the device
// (select_nccl_device), validates the plan and splits `world` exactly as make_mpi_comm_set (its
// checks, errors and group construction), then bootstraps one NCCL communicator per group
// (nccl_group_specs: the group's first member calls ncclGetUniqueId and broadcasts it over the
// group's MPI communicator; ncclCommInitRank). Collective over `world`: every rank calls it, with
// the same plan. REQUIRES: MPI is initialised. Throws parasol::Error as make_mpi_comm_set, and
// ("nccl.<group>") when NCCL fails.
std::unique_ptr<CommSet> make_nccl_comm_set(const Plan& plan, MPI_Comm world = MPI_COMM_WORLD,
                                            const NcclCommOptions& options = {});

}  // namespace parasol::runtime
