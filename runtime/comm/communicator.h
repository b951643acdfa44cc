// Communicator: the collectives and point-to-point transfers of one group of a Plan (tp, cp, ep,
// dp, pp, dp-cp, expert-dp), blocking and non-blocking, on host buffers of fp32 (or bf16)
// elements; CommSet: one communicator per group kind that this rank belongs to, built from
// runtime/comm/groups.h so that its groups are RankLayout's. Implementations: MPI
// (runtime/comm/mpi_communicator.h) and NCCL (runtime/comm/nccl_communicator.h). The executor
// starts a transfer, computes, and waits on the returned Request, which is how it overlaps
// communication with compute.
//
// Rules every implementation keeps (and every caller must keep):
//   - Counts are elements, not bytes. Peers and roots are indices in the group (0..size()-1),
//     not world ranks; members() maps one to the other.
//   - All members of a group call its collectives in the same order with the same counts.
//   - A buffer handed to a non-blocking call stays alive and untouched (a send buffer unwritten,
//     a receive buffer unread) until its Request has completed.
//   - One thread at a time calls into the communicators of a CommSet.
//   - A transfer may progress only while this rank is inside a communicator call (MPI's
//     non-blocking collectives do): to overlap a long computation, call test() on the pending
//     Requests between compute ops rather than only wait() at the end.
//   - Argument errors (a bad dtype, count, peer, root, tag or buffer overlap) throw
//     parasol::Error before anything is sent, on the calling rank only.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/program.h"
#include "core/rank_layout.h"
#include "runtime/comm/groups.h"

namespace parasol::runtime {

// The dtypes a communicator moves and reduces: kFp32 (and kTf32, stored as fp32) and kBf16
// (the upper 16 bits of an fp32; sums are formed in fp32 and rounded to nearest even).
bool comm_supports(Dtype d);
// Bytes per element of a supported dtype. Throws parasol::Error ("dtype") otherwise.
int comm_elem_bytes(Dtype d);

// The `count` argument of the Communicator call that executes a communication op of the
// Program, from its payload `bytes` in the nccl-tests convention (core/program.h):
//   kAllReduce, kBroadcast, kSend, kRecv: bytes / elem         (the whole buffer)
//   kAllGather:     bytes / elem / group_size                  (bytes is the gathered output)
//   kReduceScatter: bytes / elem / group_size                  (bytes is the scattered input)
//   kAllToAll:      bytes / elem / group_size                  (bytes is the send buffer)
// Throws parasol::Error ("op.bytes") when that is not a whole, non-negative number, and
// ("op.kind") for a kind that is not communication.
int64_t comm_count(OpKind kind, double bytes, Dtype dtype, int group_size);

// The completion handle of a non-blocking call. Move-only. A default-constructed Request is
// complete. Destroying (or assigning over) a pending Request waits for it first, so buffers are
// never released under a transfer; errors found that late are dropped, so call wait() to see
// them.
class Request {
 public:
  // What an implementation supplies: progress and completion of one transfer.
  class Impl {
   public:
    virtual ~Impl() = default;
    // True once the transfer has completed (and its completion work has run). Never blocks.
    virtual bool test() = 0;
    // Blocks until the transfer has completed.
    virtual void wait() = 0;
    // The device event the transfer completes at (issuing it if held back), for a stream to wait
    // on instead of the host (a captured step: Backend::wait_fence); nullptr where the
    // communicator moves host memory or completes on the host (MPI). Never blocks; throws
    // parasol::Error where the transfer cannot be issued yet (an unmatched transfer to itself).
    virtual void* fence() { return nullptr; }
  };

  Request() = default;
  explicit Request(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
  Request(Request&&) noexcept = default;
  Request& operator=(Request&& other) noexcept;
  Request(const Request&) = delete;
  Request& operator=(const Request&) = delete;
  ~Request();

  // Blocks until complete; afterwards the buffers may be reused. Throws parasol::Error when the
  // transfer failed (e.g. a receive got a message of another size). Idempotent.
  void wait();
  // Non-blocking: true when complete (then as after wait()), false while still in flight; it
  // also drives progress. Throws like wait().
  bool test();
  // True when known complete (after a successful wait()/test(), or default-constructed).
  bool done() const { return impl_ == nullptr; }
  // The transfer's completion fence (Impl::fence); nullptr when done() or on the host.
  void* fence() { return impl_ ? impl_->fence() : nullptr; }
  // Forgets the transfer without waiting: the caller has ordered every later use of its buffers
  // after fence() on the device (a step being captured into a graph, where neither the host nor
  // an event query may wait). REQUIRES: fence() returned a fence.
  void detach() { impl_.reset(); }

 private:
  std::unique_ptr<Impl> impl_;
};

// Waits for every request (in order).
void wait_all(std::span<Request> requests);

class Communicator {
 public:
  virtual ~Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  const std::string& name() const { return name_; }             // "tp", "dp-cp", "world", ...
  const std::vector<int>& members() const { return members_; }  // world ranks, by index
  int size() const { return static_cast<int>(members_.size()); }
  int index() const { return index_; }  // this rank's index in members()
  // The largest tag send/recv accept (at least 32767).
  virtual int64_t max_tag() const = 0;
  // Makes the transfers issued from now on wait for `fence` (Backend::record_fence(): the
  // kernels that produced their data). nullptr, and communicators of host memory: nothing to do.
  virtual void wait_fence(void* fence) { (void)fence; }
  // Whether its transfers can be recorded into a device graph with the kernels (their streams
  // joined through fences, their completion a fence: Request::fence): NCCL's can, MPI's cannot.
  virtual bool capturable() const { return false; }

  // ---- Non-blocking, any supported dtype. `count` is in elements. ---------------------------

  // Sum over the group, in place: buf[i] = sum over members of their buf[i], i < count.
  Request iall_reduce(void* buf, int64_t count, Dtype dtype);
  // Element-wise maximum over the group, in place (fp32 only: Error "comm.<name>.dtype" else).
  Request iall_reduce_max(void* buf, int64_t count, Dtype dtype);
  // recv[j*count .. (j+1)*count) = member j's send[0 .. count). recv holds size()*count. In
  // place when send == recv + index()*count; otherwise send and recv must not overlap.
  Request iall_gather(const void* send, void* recv, int64_t count, Dtype dtype);
  // recv[0 .. count) = sum over members of their send[index()*count .. (index()+1)*count). send
  // holds size()*count. In place when recv == send + index()*count (then only that block of
  // send is overwritten); otherwise send and recv must not overlap.
  Request ireduce_scatter(const void* send, void* recv, int64_t count, Dtype dtype);
  // Block j of send (count elements) goes to member j; block j of recv comes from member j. Both
  // hold size()*count; they must not overlap.
  Request iall_to_all(const void* send, void* recv, int64_t count, Dtype dtype);
  // Uneven all-to-all: send_counts[j] elements go to member j and recv_counts[j] come from it,
  // blocks packed in member order in both buffers. Both vectors have size() entries, and
  // recv_counts[j] equals member j's send_counts[index()]. Buffers must not overlap.
  Request iall_to_all_v(const void* send, std::span<const int64_t> send_counts, void* recv,
                        std::span<const int64_t> recv_counts, Dtype dtype);
  // buf[0 .. count) of member `root` is copied into every member's buf.
  Request ibroadcast(void* buf, int64_t count, int root, Dtype dtype);
  // Point-to-point with member `peer` (may be this rank). A send and a recv match when they
  // name each other, on the same communicator, with the same tag (0 <= tag <= max_tag());
  // messages of one (peer, tag) arrive in order. The recv fails (on wait/test) when fewer than
  // `count` elements arrive, or more (where the implementation detects truncation: Open MPI
  // 4.1 does not on a message a rank sends to itself).
  Request isend(const void* buf, int64_t count, int peer, int64_t tag, Dtype dtype);
  Request irecv(void* buf, int64_t count, int peer, int64_t tag, Dtype dtype);

  // Calls until the matching end_group() are issued together, as one NCCL group
  // (ncclGroupStart/End): an exchange (isend to a peer and irecv from it, on both sides) issued
  // in one group cannot deadlock where sends wait for their receives (NCCL, and the MPI
  // communicator's strict mode). Nests: the outermost end_group() issues. The Requests of a group
  // may not be waited on before its end_group(). Throws parasol::Error ("comm.<name>.group") on
  // an end_group() without begin_group(). Implementations whose calls are independent anyway
  // may ignore it (the default).
  virtual void begin_group() {}
  virtual void end_group() {}

  // ---- Blocking versions: the non-blocking call followed by wait(). ------------------------
  void all_reduce(void* buf, int64_t count, Dtype dtype) { iall_reduce(buf, count, dtype).wait(); }
  void all_gather(const void* send, void* recv, int64_t count, Dtype dtype) {
    iall_gather(send, recv, count, dtype).wait();
  }
  void reduce_scatter(const void* send, void* recv, int64_t count, Dtype dtype) {
    ireduce_scatter(send, recv, count, dtype).wait();
  }
  void all_to_all(const void* send, void* recv, int64_t count, Dtype dtype) {
    iall_to_all(send, recv, count, dtype).wait();
  }
  void all_to_all_v(const void* send, std::span<const int64_t> send_counts, void* recv,
                    std::span<const int64_t> recv_counts, Dtype dtype) {
    iall_to_all_v(send, send_counts, recv, recv_counts, dtype).wait();
  }
  void broadcast(void* buf, int64_t count, int root, Dtype dtype) {
    ibroadcast(buf, count, root, dtype).wait();
  }
  // A blocking send may wait for the matching recv to be posted: exchange with irecv/isend.
  void send(const void* buf, int64_t count, int peer, int64_t tag, Dtype dtype) {
    isend(buf, count, peer, tag, dtype).wait();
  }
  void recv(void* buf, int64_t count, int peer, int64_t tag, Dtype dtype) {
    irecv(buf, count, peer, tag, dtype).wait();
  }
  // Returns once every member has called barrier().
  void barrier() { ibarrier().wait(); }
  Request ibarrier() { return start_barrier(); }

  // ---- fp32 spans: the same calls, with sizes checked (parasol::Error on a mismatch). -------
  Request iall_reduce(std::span<float> buf);
  // REQUIRES: recv.size() == size() * send.size().
  Request iall_gather(std::span<const float> send, std::span<float> recv);
  // REQUIRES: send.size() == size() * recv.size().
  Request ireduce_scatter(std::span<const float> send, std::span<float> recv);
  // REQUIRES: send.size() == recv.size(), a multiple of size().
  Request iall_to_all(std::span<const float> send, std::span<float> recv);
  // REQUIRES: the counts sum to send.size() and recv.size().
  Request iall_to_all_v(std::span<const float> send, std::span<const int64_t> send_counts,
                        std::span<float> recv, std::span<const int64_t> recv_counts);
  Request ibroadcast(std::span<float> buf, int root);
  Request isend(std::span<const float> buf, int peer, int64_t tag);
  Request irecv(std::span<float> buf, int peer, int64_t tag);
  void all_reduce(std::span<float> buf) { iall_reduce(buf).wait(); }
  void all_gather(std::span<const float> send, std::span<float> recv) {
    iall_gather(send, recv).wait();
  }
  void reduce_scatter(std::span<const float> send, std::span<float> recv) {
    ireduce_scatter(send, recv).wait();
  }
  void all_to_all(std::span<const float> send, std::span<float> recv) {
    iall_to_all(send, recv).wait();
  }
  void all_to_all_v(std::span<const float> send, std::span<const int64_t> send_counts,
                    std::span<float> recv, std::span<const int64_t> recv_counts) {
    iall_to_all_v(send, send_counts, recv, recv_counts).wait();
  }
  void broadcast(std::span<float> buf, int root) { ibroadcast(buf, root).wait(); }
  void send(std::span<const float> buf, int peer, int64_t tag) { isend(buf, peer, tag).wait(); }
  void recv(std::span<float> buf, int peer, int64_t tag) { irecv(buf, peer, tag).wait(); }

 protected:
  // REQUIRES: 0 <= index < members.size().
  Communicator(std::string name, std::vector<int> members, int index);

  // The transfers themselves. The public calls have already checked the dtype, counts,
  // peer/root/tag ranges and buffer overlaps (in_place tells which case applies).
  // max: the element-wise maximum instead of the sum (fp32 only, checked by the caller).
  virtual Request start_all_reduce(void* buf, int64_t count, Dtype dtype, bool max) = 0;
  virtual Request start_all_gather(const void* send, void* recv, int64_t count, Dtype dtype,
                                   bool in_place) = 0;
  virtual Request start_reduce_scatter(const void* send, void* recv, int64_t count, Dtype dtype,
                                       bool in_place) = 0;
  virtual Request start_all_to_all(const void* send, void* recv, int64_t count, Dtype dtype) = 0;
  virtual Request start_all_to_all_v(const void* send, std::span<const int64_t> send_counts,
                                     void* recv, std::span<const int64_t> recv_counts,
                                     Dtype dtype) = 0;
  virtual Request start_broadcast(void* buf, int64_t count, int root, Dtype dtype) = 0;
  virtual Request start_send(const void* buf, int64_t count, int peer, int64_t tag,
                             Dtype dtype) = 0;
  virtual Request start_recv(void* buf, int64_t count, int peer, int64_t tag, Dtype dtype) = 0;
  virtual Request start_barrier() = 0;

 private:
  // Throws parasol::Error ("comm.<name>.<what>") with the reason.
  [[noreturn]] void fail(const std::string& what, const std::string& reason) const;
  void check_dtype(Dtype dtype) const;
  void check_count(int64_t count, const char* what) const;
  void check_member(int m, const char* what) const;
  void check_tag(int64_t tag) const;

  std::string name_;
  std::vector<int> members_;
  int index_ = 0;
};

// One communicator per group kind of this rank (and one over the whole world), with the
// RankGroups they were built from. Destroy it before MPI_Finalize (for the MPI implementation).
class CommSet {
 public:
  // REQUIRES: comms[i] is the communicator of kGroupKinds[i], with groups[kGroupKinds[i]]'s
  // members and index; world spans all groups.world_size ranks.
  CommSet(RankGroups groups, std::vector<std::unique_ptr<Communicator>> comms,
          std::unique_ptr<Communicator> world);

  const RankGroups& groups() const { return groups_; }
  int world_rank() const { return groups_.world_rank; }
  int world_size() const { return groups_.world_size; }

  Communicator& get(Group g) { return *comms_[static_cast<int>(g)]; }
  Communicator& tp() { return get(Group::kTp); }
  Communicator& cp() { return get(Group::kCp); }
  Communicator& ep() { return get(Group::kEp); }
  Communicator& dp() { return get(Group::kDp); }
  Communicator& pp() { return get(Group::kPp); }
  Communicator& dp_cp() { return get(Group::kDpCp); }
  Communicator& expert_dp() { return get(Group::kExpertDp); }
  Communicator& world() { return *world_; }

  // Pipeline neighbours as peers of pp() (see RankGroups: they wrap around).
  int stage() const { return groups_.stage(); }
  int pp_next() const { return groups_.pp_next(); }
  int pp_prev() const { return groups_.pp_prev(); }
  // The pp() peer that runs pipeline stage `stage` (an op's peer_stage).
  int pp_peer(int stage) const;
  // Ring-attention neighbours as peers of cp().
  int cp_next() const { return groups_.cp_next(); }
  int cp_prev() const { return groups_.cp_prev(); }

 private:
  RankGroups groups_;
  std::vector<std::unique_ptr<Communicator>> comms_;
  std::unique_ptr<Communicator> world_;
};

}  // namespace parasol::runtime
