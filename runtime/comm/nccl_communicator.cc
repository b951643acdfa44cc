// NcclCommunicator and make_nccl_comm_set: the groups of a Plan as NCCL communicators on device
// buffers, bootstrapped over MPI, with CUDA events behind Request (see nccl_communicator.h).
#include "runtime/comm/nccl_communicator.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <utility>

#include "core/error.h"
#include "runtime/comm/comm_timeout.h"
#include "runtime/comm/mpi_communicator.h"
#include "runtime/comm/nccl_groups.h"

namespace parasol::runtime {

// The communicators of one CommSet: a call on any of them first issues the held-back
// point-to-point batches of the others (MPI's rule that any communicator call drives progress).
class NcclContext {
 public:
  void add(NcclCommunicator* c) { comms_.push_back(c); }
  void remove(NcclCommunicator* c) { std::erase(comms_, c); }
  void progress(const NcclCommunicator* except = nullptr) {
    for (NcclCommunicator* c : comms_)
      if (c != except) c->flush();
  }
  // A communicator aborted by the communication timeout: ncclCommAbort frees it, so nothing may
  // use it again (neither its Requests, nor the NcclCommunicator's destructor, which would abort
  // it a second time). The CommSet creates no communicator after its first, so a freed handle's
  // address is not reused while this list lives.
  void abort(ncclComm_t c) {
    if (!c || aborted(c)) return;
    aborted_.push_back(c);
    ncclCommAbort(c);
  }
  bool aborted(ncclComm_t c) const {
    return std::find(aborted_.begin(), aborted_.end(), c) != aborted_.end();
  }

 private:
  std::vector<NcclCommunicator*> comms_;
  std::vector<ncclComm_t> aborted_;
};

// Work enqueued together: device copies, then NCCL calls in one ncclGroupStart/End, then an
// event. Its Requests complete when the event has fired.
struct NcclCommunicator::Batch {
  std::vector<std::function<void()>> copies;       // throw parasol::Error on failure
  std::vector<std::function<ncclResult_t()>> ops;  // NCCL calls, inside the group
  bool issued = false;
  std::string error;                          // why issuing failed (then no event)
  ErrorKind error_kind = ErrorKind::kSystem;  // a failed copy's own kind (a check of parasol's)
  cudaEvent_t event = nullptr;
  CommDeadline deadline;  // restarted when issued
  ~Batch() {
    if (event) cudaEventDestroy(event);  // fine while pending: released once it fires
  }
};

// One Request's state: its batch (null while a transfer to this rank itself is unmatched), and
// an error found at matching time (a self recv of another size).
struct NcclCommunicator::Pending {
  std::shared_ptr<Batch> batch;
  std::string error;
  bool cancelled = false;  // an unmatched self transfer that was waited on (and threw)
};

// An unmatched isend or irecv to this rank itself.
struct NcclCommunicator::SelfTransfer {
  const void* send = nullptr;
  void* recv = nullptr;
  int64_t bytes = 0;
  int64_t tag = 0;
  std::shared_ptr<Pending> pending;
};

namespace {

std::string cuda_error(cudaError_t e) { return cudaGetErrorString(e); }

void check_cuda(cudaError_t e, const std::string& field) {
  if (e != cudaSuccess) throw SystemError(field, cuda_error(e));
}

std::string nccl_error(ncclResult_t r, ncclComm_t comm) {
  std::string s = ncclGetErrorString(r);
  if (const char* last = ncclGetLastError(comm); last && *last) s += ": " + std::string(last);
  return s;
}

ncclDataType_t nccl_type(Dtype d) {
  if (d == Dtype::kFp16) return ncclFloat16;
  return comm_elem_bytes(d) == 2 ? ncclBfloat16 : ncclFloat32;  // checked dtypes only
}

// The communication timeout (runtime/comm/comm_timeout.h) of a transfer still in flight: the
// communicator is aborted (ncclCommAbort: its kernels stop waiting on the peer), and the error
// names the call. The communicator is unusable afterwards.
[[noreturn]] void timed_out(const CommDeadline& d, ncclComm_t comm, NcclContext& context,
                            const std::string& field) {
  context.abort(comm);
  throw SystemError(field, d.message() + "; the NCCL communicator was aborted");
}

// A call on a communicator that an earlier timeout aborted: an error, not a use of freed state.
void check_not_aborted(ncclComm_t comm, const NcclContext& context, const std::string& field) {
  if (comm && context.aborted(comm))
    throw SystemError(field,
                      "the NCCL communicator was aborted after an earlier communication timeout");
}

// Blocks until `event` has fired, throwing when CUDA or the communicator reports an error, or
// when the transfer outlives the communication timeout.
void wait_event(cudaEvent_t event, ncclComm_t comm, NcclContext& context, const std::string& field,
                const CommDeadline& deadline) {
  check_not_aborted(comm, context, field);
  for (;;) {
    const cudaError_t e = cudaEventQuery(event);
    if (e == cudaSuccess) return;
    if (e != cudaErrorNotReady) throw SystemError(field, cuda_error(e));
    ncclResult_t st = ncclSuccess;
    if (comm && ncclCommGetAsyncError(comm, &st) == ncclSuccess && st != ncclSuccess &&
        st != ncclInProgress)
      throw SystemError(field, nccl_error(st, comm));
    if (deadline.expired()) timed_out(deadline, comm, context, field);
    std::this_thread::yield();
  }
}

class NcclRequest final : public Request::Impl {
 public:
  NcclRequest(std::shared_ptr<NcclContext> context, ncclComm_t comm,
              std::shared_ptr<NcclCommunicator::Pending> pending, std::string field)
      : context_(std::move(context)),
        comm_(comm),
        pending_(std::move(pending)),
        field_(std::move(field)) {}

  bool test() override {
    context_->progress();
    const auto& b = pending_->batch;
    if (!b || !b->issued) return false;
    check_issued();
    const cudaError_t e = cudaEventQuery(b->event);
    if (e == cudaErrorNotReady) {
      check_not_aborted(comm_, *context_, field_);
      ncclResult_t st = ncclSuccess;
      if (ncclCommGetAsyncError(comm_, &st) == ncclSuccess && st != ncclSuccess &&
          st != ncclInProgress)
        throw SystemError(field_, nccl_error(st, comm_));
      if (b->deadline.expired()) timed_out(b->deadline, comm_, *context_, field_);
      return false;
    }
    if (e != cudaSuccess) throw SystemError(field_, cuda_error(e));
    finish();
    return true;
  }

  void wait() override {
    context_->progress();
    const auto& b = pending_->batch;
    if (!b) {
      pending_->cancelled = true;  // so that a later partner does not match it
      throw InternalError(field_,
                          "no matching transfer to this rank was posted: waiting would hang");
    }
    if (!b->issued)
      throw InternalError(field_,
                          "waited on inside begin_group()/end_group(): call end_group() first");
    check_issued();
    wait_event(b->event, comm_, *context_, field_, b->deadline);
    finish();
  }

  void* fence() override {
    context_->progress();
    const auto& b = pending_->batch;
    if (!b)
      throw InternalError(field_,
                          "no matching transfer to this rank was posted: nothing to wait on");
    if (!b->issued)
      throw InternalError(field_,
                          "fence() inside begin_group()/end_group(): call end_group() first");
    check_issued();
    return b->event;
  }

 private:
  void check_issued() const {
    const auto& b = *pending_->batch;
    if (!b.error.empty()) throw Error(field_, b.error, b.error_kind);
  }
  void finish() const {
    if (!pending_->error.empty()) throw SystemError(field_, pending_->error);
  }

  std::shared_ptr<NcclContext> context_;
  ncclComm_t comm_;
  std::shared_ptr<NcclCommunicator::Pending> pending_;
  std::string field_;
};

}  // namespace

// ---- NcclCommunicator --------------------------------------------------------------------------

NcclCommunicator::NcclCommunicator(std::string name, std::vector<int> members, int index,
                                   ncclComm_t comm, std::optional<cudaStream_t> stream,
                                   std::shared_ptr<NcclContext> context)
    : Communicator(std::move(name), std::move(members), index),
      comm_(comm),
      context_(context ? std::move(context) : std::make_shared<NcclContext>()) {
  const std::string field = "comm." + this->name();
  int count = 0, rank = -1;
  if (ncclCommCount(comm_, &count) != ncclSuccess ||
      ncclCommUserRank(comm_, &rank) != ncclSuccess || count != size() || rank != this->index()) {
    ncclCommAbort(comm_);  // owned: released on every failure of the constructor
    throw Error(field, "NCCL communicator has rank " + std::to_string(rank) + " of " +
                           std::to_string(count) + ", the plan says " +
                           std::to_string(this->index()) + " of " + std::to_string(size()));
  }
  if (stream) {
    stream_ = *stream;
  } else if (const cudaError_t e = cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking);
             e != cudaSuccess) {
    ncclCommAbort(comm_);
    throw SystemError(field, cuda_error(e));
  } else {
    owns_stream_ = true;
  }
  if (const cudaError_t e = cudaMalloc(&scratch_, sizeof(float)); e != cudaSuccess) {
    if (owns_stream_) cudaStreamDestroy(stream_);
    ncclCommAbort(comm_);
    throw SystemError(field, cuda_error(e));
  }
  context_->add(this);
}

NcclCommunicator::~NcclCommunicator() {
  context_->remove(this);
  if (context_->aborted(comm_)) {  // by a timeout: already released, its work abandoned
    cudaFree(scratch_);
    if (owns_stream_) cudaStreamDestroy(stream_);
    return;
  }
  bool failed = false;
  try {
    if (group_) {
      group_depth_ = 0;
      auto g = std::move(group_);
      issue(*g);
    }
    flush();
    auto done = std::make_shared<Batch>();  // an empty batch: just the event
    issue(*done);
    if (done->error.empty())
      wait_event(done->event, comm_, *context_, "comm." + name(), done->deadline);
  } catch (...) {
    failed = true;
  }
  ncclResult_t st = ncclSuccess;
  if (failed || ncclCommGetAsyncError(comm_, &st) != ncclSuccess || st != ncclSuccess)
    ncclCommAbort(comm_);
  else
    ncclCommDestroy(comm_);
  cudaFree(scratch_);
  if (owns_stream_) cudaStreamDestroy(stream_);
}

void NcclCommunicator::begin_group() {
  before_call(false);
  if (group_depth_++ == 0) group_ = std::make_shared<Batch>();
}

void NcclCommunicator::end_group() {
  if (group_depth_ == 0)
    throw InternalError("comm." + name() + ".group", "end_group() without begin_group()");
  if (--group_depth_ > 0) return;
  auto g = std::move(group_);
  issue(*g);
  if (!g->error.empty()) throw SystemError("comm." + name() + ".group", g->error);
}

void NcclCommunicator::flush() {
  if (!p2p_) return;
  auto b = std::move(p2p_);
  issue(*b);
}

void NcclCommunicator::before_call(bool p2p) {
  context_->progress(this);
  if (!p2p) flush();
}

std::shared_ptr<NcclCommunicator::Batch> NcclCommunicator::batch_for(bool p2p) {
  if (group_depth_ > 0) return group_;
  if (!p2p) return std::make_shared<Batch>();
  if (!p2p_) p2p_ = std::make_shared<Batch>();
  return p2p_;
}

void NcclCommunicator::issue(Batch& b) {
  if (b.issued) return;
  b.issued = true;
  b.deadline = CommDeadline();
  try {
    check_not_aborted(comm_, *context_, "comm." + name());
    for (auto& copy : b.copies) copy();
    if (!b.ops.empty()) {
      ncclResult_t rc = ncclGroupStart();
      if (rc != ncclSuccess) throw SystemError("nccl", nccl_error(rc, comm_));
      for (auto& op : b.ops) {
        rc = op();
        if (rc != ncclSuccess) break;
      }
      const ncclResult_t end = ncclGroupEnd();
      if (rc == ncclSuccess) rc = end;
      if (rc != ncclSuccess) throw SystemError("nccl", nccl_error(rc, comm_));
    }
    check_cuda(cudaEventCreateWithFlags(&b.event, cudaEventDisableTiming), "cuda");
    check_cuda(cudaEventRecord(b.event, stream_), "cuda");
  } catch (const Error& e) {
    b.error = e.what();
    b.error_kind = e.kind();
  }
  b.copies.clear();
  b.ops.clear();
}

Request NcclCommunicator::request(const std::shared_ptr<Batch>& b, const char* what) {
  auto p = std::make_shared<Pending>();
  p->batch = b;
  const std::string field = "comm." + name() + "." + what;
  Request r(std::make_unique<NcclRequest>(context_, comm_, std::move(p), field));
  if (b->issued && !b->error.empty()) throw Error(field, b->error, b->error_kind);
  return r;
}

Request NcclCommunicator::start_all_reduce(void* buf, int64_t count, Dtype dtype, bool max) {
  before_call(false);
  auto b = batch_for(false);
  b->ops.push_back([=, c = comm_, s = stream_] {
    return ncclAllReduce(buf, buf, count, nccl_type(dtype), max ? ncclMax : ncclSum, c, s);
  });
  maybe_issue(b, false);
  return request(b, "all_reduce");
}

Request NcclCommunicator::start_all_gather(const void* send, void* recv, int64_t count, Dtype dtype,
                                           bool /*in_place: NCCL's layout is the same*/) {
  before_call(false);
  auto b = batch_for(false);
  b->ops.push_back([=, c = comm_, s = stream_] {
    return ncclAllGather(send, recv, count, nccl_type(dtype), c, s);
  });
  maybe_issue(b, false);
  return request(b, "all_gather");
}

Request NcclCommunicator::start_reduce_scatter(const void* send, void* recv, int64_t count,
                                               Dtype dtype, bool /*in_place: as NCCL's*/) {
  before_call(false);
  auto b = batch_for(false);
  b->ops.push_back([=, c = comm_, s = stream_] {
    return ncclReduceScatter(send, recv, count, nccl_type(dtype), ncclSum, c, s);
  });
  maybe_issue(b, false);
  return request(b, "reduce_scatter");
}

Request NcclCommunicator::start_all_to_all(const void* send, void* recv, int64_t count,
                                           Dtype dtype) {
  std::vector<int64_t> counts(size(), count);
  return start_all_to_all_v(send, counts, recv, counts, dtype);
}

Request NcclCommunicator::start_all_to_all_v(const void* send, std::span<const int64_t> send_counts,
                                             void* recv, std::span<const int64_t> recv_counts,
                                             Dtype dtype) {
  if (send_counts[index()] != recv_counts[index()])
    throw Error("comm." + name() + ".recv_counts",
                "this member sends itself " + std::to_string(send_counts[index()]) +
                    " elements but expects " + std::to_string(recv_counts[index()]));
  before_call(false);
  auto b = batch_for(false);
  const int64_t eb = comm_elem_bytes(dtype);
  const ncclDataType_t t = nccl_type(dtype);
  const auto* s = static_cast<const char*>(send);
  auto* r = static_cast<char*>(recv);
  int64_t so = 0, ro = 0;
  for (int j = 0; j < size(); ++j) {
    const int64_t sn = send_counts[j], rn = recv_counts[j];
    const char* sp = s + so * eb;
    char* rp = r + ro * eb;
    if (j == index()) {
      if (sn > 0)
        b->copies.push_back([=, st = stream_, n = name()] {
          check_cuda(cudaMemcpyAsync(rp, sp, sn * eb, cudaMemcpyDeviceToDevice, st),
                     "comm." + n + ".all_to_all");
        });
    } else {
      // Zero counts are skipped on both sides (recv_counts[j] is member j's send_counts[me]).
      if (sn > 0)
        b->ops.push_back([=, c = comm_, st = stream_] { return ncclSend(sp, sn, t, j, c, st); });
      if (rn > 0)
        b->ops.push_back([=, c = comm_, st = stream_] { return ncclRecv(rp, rn, t, j, c, st); });
    }
    so += sn;
    ro += rn;
  }
  maybe_issue(b, false);
  return request(b, "all_to_all");
}

Request NcclCommunicator::start_broadcast(void* buf, int64_t count, int root, Dtype dtype) {
  before_call(false);
  auto b = batch_for(false);
  b->ops.push_back([=, c = comm_, s = stream_] {
    return ncclBroadcast(buf, buf, count, nccl_type(dtype), root, c, s);
  });
  maybe_issue(b, false);
  return request(b, "broadcast");
}

Request NcclCommunicator::start_send(const void* buf, int64_t count, int peer, int64_t tag,
                                     Dtype dtype) {
  before_call(true);
  if (peer == index())
    return self_transfer(true, buf, nullptr, count * comm_elem_bytes(dtype), tag);
  auto b = batch_for(true);
  b->ops.push_back([=, c = comm_, s = stream_, t = nccl_type(dtype)] {
    return ncclSend(buf, count, t, peer, c, s);
  });
  maybe_issue(b, true);
  return request(b, "send");
}

Request NcclCommunicator::start_recv(void* buf, int64_t count, int peer, int64_t tag, Dtype dtype) {
  before_call(true);
  if (peer == index())
    return self_transfer(false, nullptr, buf, count * comm_elem_bytes(dtype), tag);
  auto b = batch_for(true);
  b->ops.push_back([=, c = comm_, s = stream_, t = nccl_type(dtype)] {
    return ncclRecv(buf, count, t, peer, c, s);
  });
  maybe_issue(b, true);
  return request(b, "recv");
}

Request NcclCommunicator::self_transfer(bool is_send, const void* send, void* recv, int64_t bytes,
                                        int64_t tag) {
  const std::string field = "comm." + name() + (is_send ? ".send" : ".recv");
  auto mine = std::make_shared<Pending>();
  Request r(std::make_unique<NcclRequest>(context_, comm_, mine, field));
  // The first live partner of this tag, in post order.
  auto& partners = is_send ? self_recvs_ : self_sends_;
  std::erase_if(partners, [](const auto& p) { return p->pending->cancelled; });
  auto it =
      std::find_if(partners.begin(), partners.end(), [&](const auto& p) { return p->tag == tag; });
  if (it == partners.end()) {
    auto t = std::make_unique<SelfTransfer>();
    t->send = send;
    t->recv = recv;
    t->bytes = bytes;
    t->tag = tag;
    t->pending = mine;
    (is_send ? self_sends_ : self_recvs_).push_back(std::move(t));
    return r;
  }
  std::unique_ptr<SelfTransfer> other = std::move(*it);
  partners.erase(it);
  const void* src = is_send ? send : other->send;
  void* dst = is_send ? other->recv : recv;
  const int64_t send_bytes = is_send ? bytes : other->bytes;
  const int64_t recv_bytes = is_send ? other->bytes : bytes;
  Pending& recv_pending = is_send ? *other->pending : *mine;
  if (send_bytes != recv_bytes)
    recv_pending.error = "expected " + std::to_string(recv_bytes) + " bytes from member " +
                         std::to_string(index()) + " (this rank, tag " + std::to_string(tag) +
                         "), got " + std::to_string(send_bytes);
  const int64_t n = std::min(send_bytes, recv_bytes);
  auto b = batch_for(true);
  if (n > 0)
    b->copies.push_back([=, st = stream_] {
      check_cuda(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, st), field);
    });
  mine->batch = b;
  other->pending->batch = b;
  maybe_issue(b, true);
  return r;
}

void NcclCommunicator::wait_fence(void* fence) {
  if (fence == nullptr) return;
  check_cuda(cudaStreamWaitEvent(stream_, static_cast<cudaEvent_t>(fence), 0), "cuda");
}

Request NcclCommunicator::start_barrier() {
  before_call(false);
  auto b = batch_for(false);
  b->ops.push_back([c = comm_, s = stream_, x = scratch_] {
    return ncclAllReduce(x, x, 1, ncclFloat32, ncclSum, c, s);
  });
  maybe_issue(b, false);
  return request(b, "barrier");
}

void NcclCommunicator::maybe_issue(const std::shared_ptr<Batch>& b, bool p2p) {
  if (group_depth_ > 0 || p2p) return;
  issue(*b);
}

// ---- Bootstrap ---------------------------------------------------------------------------------

namespace {

void check_mpi(int rc, const std::string& field) {
  if (rc != MPI_SUCCESS) throw SystemError(field, "MPI error " + std::to_string(rc));
}

// Throws `local` on this rank, or a generic error on every other rank, when any rank of `comm`
// failed; returns on all ranks otherwise.
void agree(const std::optional<Error>& local, MPI_Comm comm, const std::string& field) {
  // 0: no failure; 1 + the ErrorKind otherwise, so that every rank throws the same kind.
  int mine = local ? 1 + static_cast<int>(local->kind()) : 0, any = 0;
  check_mpi(MPI_Allreduce(&mine, &any, 1, MPI_INT, MPI_MAX, comm), field);
  if (local) throw *local;
  if (any)
    throw Error(field, "failed on another rank (see its error)", static_cast<ErrorKind>(any - 1));
}

}  // namespace

int select_nccl_device(MPI_Comm world) {
  int rank = 0;
  check_mpi(MPI_Comm_rank(world, &rank), "nccl.device");
  MPI_Comm node = MPI_COMM_NULL;
  check_mpi(MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node),
            "nccl.device");
  int local_rank = 0, local_size = 1;
  MPI_Comm_rank(node, &local_rank);
  MPI_Comm_size(node, &local_size);
  MPI_Comm_free(&node);
  std::optional<Error> local;
  int device = -1;
  try {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) count = 0;
    device = nccl_local_device(local_rank, local_size, count);
    check_cuda(cudaSetDevice(device), "nccl.device");
  } catch (const Error& e) {
    local = e;
  }
  agree(local, world, "nccl.device");
  return device;
}

std::unique_ptr<CommSet> make_nccl_comm_set(const Plan& plan, MPI_Comm world,
                                            const NcclCommOptions& options) {
  select_nccl_device(world);
  // Same checks, errors and MPI groups as the MPI implementation; its communicators carry the
  // unique ids and are freed on return.
  std::unique_ptr<CommSet> mpi = make_mpi_comm_set(plan, world);
  const int rank = mpi->world_rank();
  const std::vector<NcclGroupSpec> specs = nccl_group_specs(plan, rank);

  // Every group's unique id first (so that a failing ncclGetUniqueId throws on every rank before
  // any rank blocks in ncclCommInitRank).
  struct IdMessage {
    int status = ncclSuccess;
    ncclUniqueId id{};
  };
  std::vector<IdMessage> ids(specs.size());
  std::optional<Error> local;
  for (size_t i = 0; i < specs.size(); ++i) {
    const NcclGroupSpec& s = specs[i];
    auto& c = dynamic_cast<MpiCommunicator&>(s.world ? mpi->world() : mpi->get(s.kind));
    if (s.creates_id) ids[i].status = ncclGetUniqueId(&ids[i].id);
    check_mpi(MPI_Bcast(&ids[i], sizeof(IdMessage), MPI_BYTE, /*root: members[0]=*/0, c.comm()),
              "nccl." + s.name);
    if (ids[i].status != ncclSuccess && !local)
      local =
          Error("nccl." + s.name, std::string("ncclGetUniqueId: ") +
                                      ncclGetErrorString(static_cast<ncclResult_t>(ids[i].status)));
  }
  agree(local, dynamic_cast<MpiCommunicator&>(mpi->world()).comm(), "nccl");

  // One ncclCommInitRank per group, in the same order on every rank; groups of one kind are
  // disjoint, so the blocking calls cannot wait on each other in a cycle.
  auto context = std::make_shared<NcclContext>();
  std::unique_ptr<NcclCommunicator> world_comm;
  std::vector<std::unique_ptr<Communicator>> comms;
  for (size_t i = 0; i < specs.size(); ++i) {
    const NcclGroupSpec& s = specs[i];
    ncclComm_t c = nullptr;
    const ncclResult_t rc = ncclCommInitRank(&c, s.size(), ids[i].id, s.index);
    if (rc != ncclSuccess)
      throw SystemError("nccl." + s.name, "ncclCommInitRank: " + nccl_error(rc, c));
    auto comm =
        std::make_unique<NcclCommunicator>(s.name, s.members, s.index, c, options.stream, context);
    if (s.world)
      world_comm = std::move(comm);
    else
      comms.push_back(std::move(comm));
  }
  RankGroups groups = mpi->groups();
  return std::make_unique<CommSet>(std::move(groups), std::move(comms), std::move(world_comm));
}

}  // namespace parasol::runtime
