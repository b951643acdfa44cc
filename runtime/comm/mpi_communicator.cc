// MpiCommunicator and make_mpi_comm_set: the groups of a Plan as MPI communicators, with
// non-blocking MPI collectives behind Request (see mpi_communicator.h).
#include "runtime/comm/mpi_communicator.h"

#include <chrono>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/error.h"
#include "runtime/comm/comm_timeout.h"
#include "runtime/comm/groups.h"
#include "runtime/comm/idle_wait.h"
#include "runtime/device_access.h"
#include "runtime/tensor.h"

namespace parasol::runtime {

namespace {

// ---- bf16: the upper half of an fp32, summed in fp32 and rounded to nearest even. -------------

float bf16_to_float(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

uint16_t float_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  if ((bits & 0x7f800000u) == 0x7f800000u && (bits & 0x007fffffu) != 0)
    return static_cast<uint16_t>((bits >> 16) | 0x0040u);  // NaN stays a (quiet) NaN
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

void bf16_sum(void* in, void* inout, int* len, MPI_Datatype*) {
  const auto* a = static_cast<const uint16_t*>(in);
  auto* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = float_to_bf16(bf16_to_float(a[i]) + bf16_to_float(b[i]));
}

// ---- fp16: summed in fp32 and rounded to nearest even (runtime/tensor.h's conversions). ------
void fp16_sum(void* in, void* inout, int* len, MPI_Datatype*) {
  const auto* a = static_cast<const uint16_t*>(in);
  auto* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = fp32_to_fp16(fp16_to_fp32(a[i]) + fp16_to_fp32(b[i]));
}

MPI_Datatype mpi_type(Dtype d) {
  return comm_elem_bytes(d) == 2 ? MPI_UINT16_T : MPI_FLOAT;  // checked dtypes only
}

MPI_Op sum_op(Dtype d) {
  if (d == Dtype::kFp16) {
    static MPI_Op half = [] {
      MPI_Op o;
      MPI_Op_create(&fp16_sum, /*commute=*/1, &o);
      return o;
    }();
    return half;
  }
  if (d != Dtype::kBf16) return MPI_SUM;
  static MPI_Op op = [] {
    MPI_Op o;
    MPI_Op_create(&bf16_sum, /*commute=*/1, &o);
    return o;
  }();
  return op;
}

std::string mpi_error_string(int rc) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) return "MPI error " + std::to_string(rc);
  return std::string(text, len);
}

}  // namespace

// ---- Request ---------------------------------------------------------------------------------

// One MPI request and what must outlive it (count arrays, scratch), plus the work to do once it
// has completed (copy scratch out, check a receive's size).
class MpiRequest final : public Request::Impl {
 public:
  explicit MpiRequest(std::string field) : field_(std::move(field)) {}  // posted now

  bool test() override {
    if (finished_) return true;
    int flag = 0;
    MPI_Status status;
    DeviceAccess access;  // MPI moves the buffers' bytes while it progresses
    check(MPI_Test(&req, &flag, &status));
    if (!flag) {
      if (deadline_.expired()) throw Error(field_, deadline_.message());
      return false;
    }
    finish(status);
    return true;
  }

  // MPI_Test in a loop rather than MPI_Wait, so that the communication timeout can end it.
  void wait() override {
    for (IdleWait idle; !test();) idle.pause();
  }

  void check(int rc) const {
    if (rc != MPI_SUCCESS) throw SystemError(field_, mpi_error_string(rc));
  }
  // The completion work, once MPI reports the request complete with `status`.
  void finish(const MPI_Status& status) {
    finished_ = true;  // before on_complete: a failed completion is not retried
    if (on_complete) on_complete(status);
  }
  const std::string& field() const { return field_; }

  MPI_Request req = MPI_REQUEST_NULL;
  std::vector<int> ints;      // counts and displacements of an all-to-all-v
  std::vector<char> scratch;  // out-of-place result of an in-place reduce-scatter
  std::function<void(const MPI_Status&)> on_complete;

 private:
  std::string field_;
  bool finished_ = false;
  CommDeadline deadline_;  // from the request's creation, just before its MPI call
};

// ---- Strict mode: NCCL's groups and stream order -----------------------------------------------

const MpiCommOptions& MpiCommOptions::from_env() {
  static const MpiCommOptions options = [] {
    MpiCommOptions o;
    const char* strict = std::getenv("PARASOL_NCCL_SEMANTICS");
    o.nccl_semantics = strict != nullptr && *strict != '\0' && std::string(strict) != "0";
    if (const char* w = std::getenv("PARASOL_NCCL_WATCHDOG_S"); w != nullptr && *w != '\0') {
      char* end = nullptr;
      o.watchdog_s = std::strtod(w, &end);
      if (end == w || *end != '\0' || !(o.watchdog_s > 0))
        throw Error("PARASOL_NCCL_WATCHDOG_S", std::string("'") + w + "' is not a positive number");
    }
    return o;
  }();
  return options;
}

// The strict communicators of one CommSet: a call on any of them first issues the held-back
// point-to-point batches of the others, and test()/wait() issue every batch and post every
// communicator's next group (NcclContext's rule, plus a GPU's unattended progress).
class MpiContext {
 public:
  void add(MpiCommunicator* c) { comms_.push_back(c); }
  void remove(MpiCommunicator* c) { std::erase(comms_, c); }
  void flush(const MpiCommunicator* except = nullptr) {
    for (MpiCommunicator* c : comms_)
      if (c != except) c->flush();
  }
  void drive() {
    for (size_t i = 0; i < comms_.size(); ++i) comms_[i]->drive();
  }
  void progress() {
    flush();
    drive();
  }

 private:
  std::vector<MpiCommunicator*> comms_;
};

struct MpiCommunicator::StrictOp {
  std::unique_ptr<MpiRequest> mpi;
  Post post;
  std::string what;  // for the watchdog: "send of 6 elements to member 1 (world rank 3), tag 2"
  bool done = false;
  std::optional<Error> error;  // a failed call or completion (a receive of another size)
};

// Calls issued together (one NCCL group): posted together once every earlier batch of the
// communicator has completed; complete when all of them have.
struct MpiCommunicator::Batch {
  std::vector<std::shared_ptr<StrictOp>> ops;
  bool issued = false;    // left the open group / the held-back p2p batch, queued
  bool posted = false;    // its MPI calls made
  bool complete = false;  // every call complete (or the communicator broken: then `broken`)
  std::string broken;
  CommDeadline deadline{0};  // the watchdog's, from posting (options_.watchdog_s)
};

namespace {

// A strict-mode Request: complete when its batch is (NCCL: an event recorded after the group).
class StrictRequest final : public Request::Impl {
 public:
  StrictRequest(std::shared_ptr<MpiContext> context, std::shared_ptr<MpiCommunicator::Batch> batch,
                std::shared_ptr<MpiCommunicator::StrictOp> op)
      : context_(std::move(context)), batch_(std::move(batch)), op_(std::move(op)) {}

  bool test() override {
    context_->progress();
    return finished();
  }

  void wait() override {
    context_->progress();
    if (!batch_->issued && batch_->broken.empty())
      throw Error(op_->mpi->field(),
                  "waited on inside begin_group()/end_group(): call end_group() first");
    for (IdleWait idle; !finished();) {
      idle.pause();          // waiting on peers (runtime/comm/idle_wait.h)
      context_->progress();  // the watchdog throws from here on a deadlock
    }
  }

 private:
  bool finished() const {
    if (!batch_->broken.empty()) throw Error(op_->mpi->field(), batch_->broken);
    if (!batch_->complete) return false;
    if (op_->error) throw *op_->error;
    return true;
  }

  std::shared_ptr<MpiContext> context_;
  std::shared_ptr<MpiCommunicator::Batch> batch_;
  std::shared_ptr<MpiCommunicator::StrictOp> op_;
};

}  // namespace

Request MpiCommunicator::launch(std::unique_ptr<MpiRequest> r, Post post, bool p2p,
                                std::string what) {
  if (!options_.nccl_semantics || (p2p && what.empty())) {
    // Posted now: default mode, or a strict transfer to this rank itself (what == "").
    if (options_.nccl_semantics) before_call(true);
    DeviceAccess access;  // the call may copy the buffer (eager protocols)
    r->check(post(&r->req));
    return Request(std::move(r));
  }
  if (!broken_.empty()) throw Error(r->field(), broken_);
  before_call(p2p);
  auto op = std::make_shared<StrictOp>();
  op->mpi = std::move(r);
  op->post = std::move(post);
  op->what = std::move(what);
  std::shared_ptr<Batch> b = batch_for(p2p);
  b->ops.push_back(op);
  if (group_depth_ == 0 && !p2p) issue(b);
  return Request(std::make_unique<StrictRequest>(context_, std::move(b), std::move(op)));
}

// NcclCommunicator's rule: a call first issues the other communicators' held-back p2p batches,
// and a call that is not p2p this one's too.
void MpiCommunicator::before_call(bool p2p) {
  context_->flush(this);
  if (!p2p) flush();
}

// The batch the next call joins: the open group's, the held-back p2p batch, or a new one.
std::shared_ptr<MpiCommunicator::Batch> MpiCommunicator::batch_for(bool p2p) {
  if (group_depth_ > 0) return group_;
  if (!p2p) return std::make_shared<Batch>();
  if (!p2p_) p2p_ = std::make_shared<Batch>();
  return p2p_;
}

void MpiCommunicator::flush() {
  if (!p2p_) return;
  issue(std::move(p2p_));
  p2p_ = nullptr;
}

void MpiCommunicator::issue(std::shared_ptr<Batch> b) {
  if (b->issued) return;
  b->issued = true;
  if (!broken_.empty()) {
    b->broken = broken_;
    return;
  }
  queue_.push_back(std::move(b));
  drive();  // posted at once when the communicator is idle, as a kernel on an idle stream
}

void MpiCommunicator::begin_group() {
  if (options_.nccl_semantics) before_call(false);
  if (group_depth_++ == 0 && options_.nccl_semantics) group_ = std::make_shared<Batch>();
}

void MpiCommunicator::end_group() {
  if (group_depth_ == 0)
    throw Error("comm." + name() + ".group", "end_group() without begin_group()");
  if (--group_depth_ > 0 || !options_.nccl_semantics) return;
  std::shared_ptr<Batch> g = std::move(group_);
  group_ = nullptr;
  issue(std::move(g));
}

void MpiCommunicator::drive() {
  while (!queue_.empty()) {
    Batch& b = *queue_.front();
    DeviceAccess access;  // MPI moves the buffers' bytes while it posts and progresses
    if (!b.posted) {
      b.posted = true;
      b.deadline = CommDeadline(options_.watchdog_s);
      for (auto& op : b.ops) {
        const int rc = op->post(&op->mpi->req);
        if (rc != MPI_SUCCESS) {
          op->done = true;
          op->error = SystemError(op->mpi->field(), mpi_error_string(rc));
        }
      }
    }
    bool all = true;
    for (auto& op : b.ops) {
      if (op->done) continue;
      int flag = 0;
      MPI_Status status;
      const int rc = MPI_Test(&op->mpi->req, &flag, &status);
      if (rc != MPI_SUCCESS) {
        op->done = true;
        op->error = SystemError(op->mpi->field(), mpi_error_string(rc));
        continue;
      }
      if (!flag) {
        all = false;
        continue;
      }
      op->done = true;
      try {
        op->mpi->finish(status);
      } catch (const Error& e) {
        op->error = e;
      }
    }
    if (!all) {
      if (b.deadline.expired()) watchdog(b);
      return;
    }
    b.complete = true;
    queue_.pop_front();
  }
}

// The head group has not completed in watchdog_s: name its stuck calls, break the communicator
// (every pending Request and later call throws; stuck receives are cancelled, stuck sends left to
// MPI), and throw.
void MpiCommunicator::watchdog(Batch& head) {
  std::string stuck, field;
  int n = 0;
  for (auto& op : head.ops) {
    if (op->done) continue;
    if (n++ > 0) stuck += "; ";
    stuck += op->what;
    if (field.empty()) field = op->mpi->field();
  }
  char secs[32];
  std::snprintf(secs, sizeof secs, "%g", options_.watchdog_s);
  const size_t behind = queue_.size() - 1 + (p2p_ ? 1 : 0) + (group_ ? 1 : 0);
  const std::string reason =
      "deadlock under NCCL semantics (PARASOL_NCCL_SEMANTICS): " + stuck + " not complete after " +
      secs + " s (a group of " + std::to_string(head.ops.size()) + " call(s), " +
      std::to_string(behind) +
      " group(s) queued behind it; a send completes only once its receive is posted, and a "
      "communicator runs its groups in order)";
  broken_ = "communicator broken by an earlier deadlock: " + reason;
  for (auto& op : head.ops) {
    if (op->done || op->mpi->req == MPI_REQUEST_NULL) continue;
    if (op->what.rfind("recv", 0) == 0) {
      MPI_Cancel(&op->mpi->req);
      MPI_Wait(&op->mpi->req, MPI_STATUS_IGNORE);
    } else if (op->what.rfind("send", 0) == 0) {
      MPI_Request_free(&op->mpi->req);  // a peer may still receive it
    }
  }
  for (auto& b : queue_) b->broken = broken_;
  if (p2p_) p2p_->broken = broken_;
  if (group_) group_->broken = broken_;
  queue_.clear();
  p2p_ = nullptr;
  throw Error(field, reason);
}

// ---- MpiCommunicator
// -----------------------------------------------------------------------------

MpiCommunicator::MpiCommunicator(std::string name, std::vector<int> members, int index,
                                 MPI_Comm comm, const MpiCommOptions& options,
                                 std::shared_ptr<MpiContext> context)
    : Communicator(std::move(name), std::move(members), index),
      comm_(comm),
      options_(options),
      context_(context ? std::move(context) : std::make_shared<MpiContext>()) {
  MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  int size = 0, rank = -1;
  MPI_Comm_size(comm_, &size);
  MPI_Comm_rank(comm_, &rank);
  if (size != this->size() || rank != this->index()) {
    MPI_Comm_free(&comm_);
    throw Error("comm." + this->name(), "MPI communicator has rank " + std::to_string(rank) +
                                            " of " + std::to_string(size) + ", the plan says " +
                                            std::to_string(this->index()) + " of " +
                                            std::to_string(this->size()));
  }
  void* ub = nullptr;
  int flag = 0;
  MPI_Comm_get_attr(comm_, MPI_TAG_UB, &ub, &flag);
  if (flag && ub) max_tag_ = *static_cast<int*>(ub);
  context_->add(this);
}

MpiCommunicator::~MpiCommunicator() {
  context_->remove(this);
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (options_.nccl_semantics && !finalized) {
    // Held-back calls are issued and run to completion, as NcclCommunicator's destructor waits
    // for its stream (or until the watchdog fires).
    try {
      if (group_) {
        group_depth_ = 0;
        std::shared_ptr<Batch> g = std::move(group_);
        group_ = nullptr;
        issue(std::move(g));
      }
      flush();
      for (IdleWait idle; !queue_.empty();) {
        idle.pause();
        drive();
      }
    } catch (...) {
    }
  }
  if (!finalized && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

namespace {

// MPI counts are int.
int as_int(int64_t n, const std::string& field) {
  if (n > INT_MAX) throw Error(field, std::to_string(n) + " elements exceed MPI's int count limit");
  return static_cast<int>(n);
}

}  // namespace

Request MpiCommunicator::start_all_reduce(void* buf, int64_t count, Dtype dtype, bool max) {
  auto r = std::make_unique<MpiRequest>("comm." + name() + ".all_reduce");
  const int n = as_int(count, "comm." + name() + ".count");
  const MPI_Datatype t = mpi_type(dtype);
  const MPI_Op o = max ? MPI_MAX : sum_op(dtype);
  return launch(
      std::move(r),
      [=, c = comm_](MPI_Request* q) { return MPI_Iallreduce(MPI_IN_PLACE, buf, n, t, o, c, q); },
      false, "all_reduce of " + std::to_string(n) + " elements");
}

Request MpiCommunicator::start_all_gather(const void* send, void* recv, int64_t count, Dtype dtype,
                                          bool in_place) {
  auto r = std::make_unique<MpiRequest>("comm." + name() + ".all_gather");
  const int n = as_int(count, "comm." + name() + ".count");
  as_int(count * size(), "comm." + name() + ".recv");
  const MPI_Datatype t = mpi_type(dtype);
  const std::string what = "all_gather of " + std::to_string(n) + " elements per member";
  if (in_place)
    return launch(
        std::move(r),
        [=, c = comm_](MPI_Request* q) {
          return MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, recv, n, t, c, q);
        },
        false, what);
  return launch(
      std::move(r),
      [=, c = comm_](MPI_Request* q) { return MPI_Iallgather(send, n, t, recv, n, t, c, q); },
      false, what);
}

Request MpiCommunicator::start_reduce_scatter(const void* send, void* recv, int64_t count,
                                              Dtype dtype, bool in_place) {
  auto r = std::make_unique<MpiRequest>("comm." + name() + ".reduce_scatter");
  const int n = as_int(count, "comm." + name() + ".count");
  as_int(count * size(), "comm." + name() + ".send");
  void* out = recv;
  if (in_place) {
    // recv is a block of send: reduce into scratch (MPI forbids aliasing) and copy on completion.
    const size_t bytes = static_cast<size_t>(count) * comm_elem_bytes(dtype);
    r->scratch.resize(bytes);
    out = r->scratch.data();
    MpiRequest* self = r.get();
    r->on_complete = [self, recv, bytes](const MPI_Status&) {
      std::memcpy(recv, self->scratch.data(), bytes);
    };
  }
  const MPI_Datatype t = mpi_type(dtype);
  const MPI_Op o = sum_op(dtype);
  return launch(
      std::move(r),
      [=, c = comm_](MPI_Request* q) {
        return MPI_Ireduce_scatter_block(send, out, n, t, o, c, q);
      },
      false, "reduce_scatter of " + std::to_string(n) + " elements per member");
}

Request MpiCommunicator::start_all_to_all(const void* send, void* recv, int64_t count,
                                          Dtype dtype) {
  auto r = std::make_unique<MpiRequest>("comm." + name() + ".all_to_all");
  const int n = as_int(count, "comm." + name() + ".count");
  as_int(count * size(), "comm." + name() + ".send");
  const MPI_Datatype t = mpi_type(dtype);
  return launch(
      std::move(r),
      [=, c = comm_](MPI_Request* q) { return MPI_Ialltoall(send, n, t, recv, n, t, c, q); }, false,
      "all_to_all of " + std::to_string(n) + " elements per member");
}

Request MpiCommunicator::start_all_to_all_v(const void* send, std::span<const int64_t> send_counts,
                                            void* recv, std::span<const int64_t> recv_counts,
                                            Dtype dtype) {
  auto r = std::make_unique<MpiRequest>("comm." + name() + ".all_to_all_v");
  const int p = size();
  // ints = [send counts, send displacements, recv counts, recv displacements], alive until done.
  r->ints.resize(4 * static_cast<size_t>(p));
  int* sc = r->ints.data();
  int* sd = sc + p;
  int* rc = sd + p;
  int* rd = rc + p;
  int64_t so = 0, ro = 0;
  for (int j = 0; j < p; ++j) {
    sd[j] = as_int(so, "comm." + name() + ".send_counts");
    rd[j] = as_int(ro, "comm." + name() + ".recv_counts");
    sc[j] = as_int(send_counts[j], "comm." + name() + ".send_counts");
    rc[j] = as_int(recv_counts[j], "comm." + name() + ".recv_counts");
    so += send_counts[j];
    ro += recv_counts[j];
  }
  const MPI_Datatype t = mpi_type(dtype);
  return launch(
      std::move(r),
      [=, c = comm_](MPI_Request* q) {
        return MPI_Ialltoallv(send, sc, sd, t, recv, rc, rd, t, c, q);
      },
      false, "all_to_all_v");
}

Request MpiCommunicator::start_broadcast(void* buf, int64_t count, int root, Dtype dtype) {
  auto r = std::make_unique<MpiRequest>("comm." + name() + ".broadcast");
  const int n = as_int(count, "comm." + name() + ".count");
  const MPI_Datatype t = mpi_type(dtype);
  return launch(
      std::move(r), [=, c = comm_](MPI_Request* q) { return MPI_Ibcast(buf, n, t, root, c, q); },
      false, "broadcast of " + std::to_string(n) + " elements from member " + std::to_string(root));
}

// "send of 6 elements to member 1 (world rank 3), tag 2"; "" for this rank itself.
static std::string describe_p2p(const Communicator& c, const char* what, const char* dir, int n,
                                int peer, int64_t tag) {
  if (peer == c.index()) return "";
  return std::string(what) + " of " + std::to_string(n) + " elements " + dir + " member " +
         std::to_string(peer) + " (world rank " + std::to_string(c.members()[peer]) + "), tag " +
         std::to_string(tag);
}

Request MpiCommunicator::start_send(const void* buf, int64_t count, int peer, int64_t tag,
                                    Dtype dtype) {
  auto r = std::make_unique<MpiRequest>("comm." + name() + ".send");
  const int n = as_int(count, "comm." + name() + ".count");
  const MPI_Datatype t = mpi_type(dtype);
  const int g = static_cast<int>(tag);
  // Strict: complete only once the receive is posted (NCCL), whatever the size.
  if (options_.nccl_semantics)
    return launch(
        std::move(r),
        [=, c = comm_](MPI_Request* q) { return MPI_Issend(buf, n, t, peer, g, c, q); }, true,
        describe_p2p(*this, "send", "to", n, peer, tag));
  return launch(
      std::move(r), [=, c = comm_](MPI_Request* q) { return MPI_Isend(buf, n, t, peer, g, c, q); },
      true, "");
}

Request MpiCommunicator::start_recv(void* buf, int64_t count, int peer, int64_t tag, Dtype dtype) {
  const std::string field = "comm." + name() + ".recv";
  auto r = std::make_unique<MpiRequest>(field);
  const int n = as_int(count, "comm." + name() + ".count");
  const MPI_Datatype t = mpi_type(dtype);
  r->on_complete = [field, n, t, peer, tag](const MPI_Status& status) {
    int got = -1;
    MPI_Get_count(&status, t, &got);
    if (got != n)
      throw Error(field, "expected " + std::to_string(n) + " elements from member " +
                             std::to_string(peer) + " (tag " + std::to_string(tag) + "), got " +
                             std::to_string(got));
  };
  const int g = static_cast<int>(tag);
  return launch(
      std::move(r), [=, c = comm_](MPI_Request* q) { return MPI_Irecv(buf, n, t, peer, g, c, q); },
      true, describe_p2p(*this, "recv", "from", n, peer, tag));
}

Request MpiCommunicator::start_barrier() {
  auto r = std::make_unique<MpiRequest>("comm." + name() + ".barrier");
  return launch(
      std::move(r), [c = comm_](MPI_Request* q) { return MPI_Ibarrier(c, q); }, false, "barrier");
}

// ---- make_mpi_comm_set
// ---------------------------------------------------------------------------

namespace {

void check_mpi(int rc, const std::string& field) {
  if (rc != MPI_SUCCESS) throw SystemError(field, mpi_error_string(rc));
}

// The grid fields every rank must agree on.
constexpr int kGridInts = 12;
std::array<int, kGridInts> grid_ints(const Plan& p) {
  std::array<int, kGridInts> v{p.tp, p.pp, p.dp, p.cp, p.ep};
  for (int i = 0; i < 5; ++i) v[5 + i] = static_cast<int>(p.rank_order[i]);
  v[10] = p.shard_degree;  // the HSDP groups
  v[11] = p.expert_tp();   // the expert grid
  return v;
}

}  // namespace

std::unique_ptr<CommSet> make_mpi_comm_set(const Plan& plan, MPI_Comm world,
                                           const MpiCommOptions& options) {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized)
    throw Error("mpi", "make_mpi_comm_set needs MPI initialised (and not finalised)");
  int world_size = 0, world_rank = 0;
  check_mpi(MPI_Comm_size(world, &world_size), "mpi");
  check_mpi(MPI_Comm_rank(world, &world_rank), "mpi");

  // Local checks first; their verdict and the grid are then compared across ranks in one
  // all-reduce that every rank joins, so that a rank whose plan is rejected never leaves the
  // others waiting in a collective.
  std::optional<Error> local;
  try {
    check_rank_grid(plan);
    if (world_size != plan.gpus())
      throw Error("plan", "needs " + std::to_string(plan.gpus()) + " ranks (tp*pp*dp*cp = " +
                              std::to_string(plan.tp) + "*" + std::to_string(plan.pp) + "*" +
                              std::to_string(plan.dp) + "*" + std::to_string(plan.cp) +
                              ") but the MPI world has " + std::to_string(world_size));
  } catch (const Error& e) {
    local = e;
  }
  std::array<int, 1 + 2 * kGridInts> mine{}, all{};
  mine[0] = local ? 1 + static_cast<int>(local->kind()) : 0;  // the maximum: the gravest kind
  const auto g = grid_ints(plan);
  for (int i = 0; i < kGridInts; ++i) {
    mine[1 + i] = g[i];
    mine[1 + kGridInts + i] = -g[i];  // max of -x: minus the minimum
  }
  check_mpi(
      MPI_Allreduce(mine.data(), all.data(), static_cast<int>(all.size()), MPI_INT, MPI_MAX, world),
      "mpi");
  if (local) throw *local;
  if (all[0])
    throw Error("plan", "another rank rejected the plan (see its error)",
                static_cast<ErrorKind>(all[0] - 1));
  for (int i = 0; i < kGridInts; ++i)
    if (all[1 + i] != -all[1 + kGridInts + i])
      throw Error("plan",
                  "ranks were given different grids (tp, pp, dp, cp, ep, rank_order, "
                  "shard_degree, etp)");

  // How waiting ranks idle (runtime/comm/idle_wait.h): by the ranks sharing this host.
  MPI_Comm host = MPI_COMM_NULL;
  check_mpi(MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, world_rank, MPI_INFO_NULL, &host),
            "mpi");
  int ranks_on_host = 0;
  check_mpi(MPI_Comm_size(host, &ranks_on_host), "mpi");
  MPI_Comm_free(&host);
  set_ranks_on_host(ranks_on_host);

  RankGroups groups = rank_groups(plan, world_rank);
  MPI_Comm dup = MPI_COMM_NULL;
  check_mpi(MPI_Comm_dup(world, &dup), "mpi");
  MPI_Comm_set_errhandler(dup, MPI_ERRORS_RETURN);
  std::vector<int> world_members(world_size);
  for (int r = 0; r < world_size; ++r) world_members[r] = r;
  auto context = std::make_shared<MpiContext>();
  auto world_comm = std::make_unique<MpiCommunicator>("world", std::move(world_members), world_rank,
                                                      dup, options, context);

  std::vector<std::unique_ptr<Communicator>> comms;
  for (Group kind : kGroupKinds) {
    const GroupMembership& m = groups[kind];
    MPI_Comm c = MPI_COMM_NULL;
    check_mpi(MPI_Comm_split(world_comm->comm(), m.color, m.index, &c),
              std::string("comm.") + group_name(kind));
    comms.push_back(std::make_unique<MpiCommunicator>(group_name(kind), m.members, m.index, c,
                                                      options, context));
  }
  return std::make_unique<CommSet>(std::move(groups), std::move(comms), std::move(world_comm));
}

}  // namespace parasol::runtime
