// MpiCommunicator and make_mpi_comm_set: the groups of a Plan as MPI communicators, with
// non-blocking MPI collectives behind Request (see mpi_communicator.h).
#include "runtime/comm/mpi_communicator.h"

#include <climits>
#include <cstdint>
#include <cstring>
#include <functional>
#include <optional>
#include <string>
#include <utility>

#include "core/error.h"
#include "runtime/comm/groups.h"
#include "runtime/device_access.h"

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

MPI_Datatype mpi_type(Dtype d) {
  return comm_elem_bytes(d) == 2 ? MPI_UINT16_T : MPI_FLOAT;  // checked dtypes only
}

MPI_Op sum_op(Dtype d) {
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

// ---- Request ---------------------------------------------------------------------------------

// One MPI request and what must outlive it (count arrays, scratch), plus the work to do once it
// has completed (copy scratch out, check a receive's size).
class MpiRequest final : public Request::Impl {
 public:
  explicit MpiRequest(std::string field) : field_(std::move(field)) {}

  bool test() override {
    if (finished_) return true;
    int flag = 0;
    MPI_Status status;
    DeviceAccess access;  // MPI moves the buffers' bytes while it progresses
    check(MPI_Test(&req, &flag, &status));
    if (!flag) return false;
    finish(status);
    return true;
  }

  void wait() override {
    if (finished_) return;
    MPI_Status status;
    DeviceAccess access;
    check(MPI_Wait(&req, &status));
    finish(status);
  }

  void check(int rc) const {
    if (rc != MPI_SUCCESS) throw Error(field_, mpi_error_string(rc));
  }

  MPI_Request req = MPI_REQUEST_NULL;
  std::vector<int> ints;      // counts and displacements of an all-to-all-v
  std::vector<char> scratch;  // out-of-place result of an in-place reduce-scatter
  std::function<void(const MPI_Status&)> on_complete;

 private:
  void finish(const MPI_Status& status) {
    finished_ = true;  // before on_complete: a failed completion is not retried
    if (on_complete) on_complete(status);
  }

  std::string field_;
  bool finished_ = false;
};

}  // namespace

// ---- MpiCommunicator
// -----------------------------------------------------------------------------

MpiCommunicator::MpiCommunicator(std::string name, std::vector<int> members, int index,
                                 MPI_Comm comm)
    : Communicator(std::move(name), std::move(members), index), comm_(comm) {
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
}

MpiCommunicator::~MpiCommunicator() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

namespace {

// MPI counts are int.
int as_int(int64_t n, const std::string& field) {
  if (n > INT_MAX) throw Error(field, std::to_string(n) + " elements exceed MPI's int count limit");
  return static_cast<int>(n);
}

}  // namespace

// Wraps a filled MpiRequest once its MPI call has returned `rc`. `r` is taken by reference, so
// that `issued(std::move(r), MPI_Ixxx(..., &r->req))` evaluates &r->req before r is moved from.
static Request issued(std::unique_ptr<MpiRequest>&& r, int rc) {
  r->check(rc);
  return Request(std::move(r));
}

Request MpiCommunicator::start_all_reduce(void* buf, int64_t count, Dtype dtype, bool max) {
  DeviceAccess access;  // the call may copy the buffer (eager protocols)
  auto r = std::make_unique<MpiRequest>("comm." + name() + ".all_reduce");
  const int n = as_int(count, "comm." + name() + ".count");
  return issued(std::move(r), MPI_Iallreduce(MPI_IN_PLACE, buf, n, mpi_type(dtype),
                                             max ? MPI_MAX : sum_op(dtype), comm_, &r->req));
}

Request MpiCommunicator::start_all_gather(const void* send, void* recv, int64_t count, Dtype dtype,
                                          bool in_place) {
  DeviceAccess access;  // the call may copy the buffer (eager protocols)
  auto r = std::make_unique<MpiRequest>("comm." + name() + ".all_gather");
  const int n = as_int(count, "comm." + name() + ".count");
  as_int(count * size(), "comm." + name() + ".recv");
  const MPI_Datatype t = mpi_type(dtype);
  if (in_place)
    return issued(std::move(r),
                  MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, recv, n, t, comm_, &r->req));
  return issued(std::move(r), MPI_Iallgather(send, n, t, recv, n, t, comm_, &r->req));
}

Request MpiCommunicator::start_reduce_scatter(const void* send, void* recv, int64_t count,
                                              Dtype dtype, bool in_place) {
  DeviceAccess access;  // the call may copy the buffer (eager protocols)
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
  return issued(std::move(r), MPI_Ireduce_scatter_block(send, out, n, mpi_type(dtype),
                                                        sum_op(dtype), comm_, &r->req));
}

Request MpiCommunicator::start_all_to_all(const void* send, void* recv, int64_t count,
                                          Dtype dtype) {
  DeviceAccess access;  // the call may copy the buffer (eager protocols)
  auto r = std::make_unique<MpiRequest>("comm." + name() + ".all_to_all");
  const int n = as_int(count, "comm." + name() + ".count");
  as_int(count * size(), "comm." + name() + ".send");
  const MPI_Datatype t = mpi_type(dtype);
  return issued(std::move(r), MPI_Ialltoall(send, n, t, recv, n, t, comm_, &r->req));
}

Request MpiCommunicator::start_all_to_all_v(const void* send, std::span<const int64_t> send_counts,
                                            void* recv, std::span<const int64_t> recv_counts,
                                            Dtype dtype) {
  DeviceAccess access;  // the call may copy the buffer (eager protocols)
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
  return issued(std::move(r), MPI_Ialltoallv(send, sc, sd, t, recv, rc, rd, t, comm_, &r->req));
}

Request MpiCommunicator::start_broadcast(void* buf, int64_t count, int root, Dtype dtype) {
  DeviceAccess access;  // the call may copy the buffer (eager protocols)
  auto r = std::make_unique<MpiRequest>("comm." + name() + ".broadcast");
  const int n = as_int(count, "comm." + name() + ".count");
  return issued(std::move(r), MPI_Ibcast(buf, n, mpi_type(dtype), root, comm_, &r->req));
}

Request MpiCommunicator::start_send(const void* buf, int64_t count, int peer, int64_t tag,
                                    Dtype dtype) {
  DeviceAccess access;  // the call may copy the buffer (eager protocols)
  auto r = std::make_unique<MpiRequest>("comm." + name() + ".send");
  const int n = as_int(count, "comm." + name() + ".count");
  return issued(std::move(r),
                MPI_Isend(buf, n, mpi_type(dtype), peer, static_cast<int>(tag), comm_, &r->req));
}

Request MpiCommunicator::start_recv(void* buf, int64_t count, int peer, int64_t tag, Dtype dtype) {
  DeviceAccess access;  // the call may copy the buffer (eager protocols)
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
  return issued(std::move(r), MPI_Irecv(buf, n, t, peer, static_cast<int>(tag), comm_, &r->req));
}

Request MpiCommunicator::start_barrier() {
  DeviceAccess access;  // the call may copy the buffer (eager protocols)
  auto r = std::make_unique<MpiRequest>("comm." + name() + ".barrier");
  return issued(std::move(r), MPI_Ibarrier(comm_, &r->req));
}

// ---- make_mpi_comm_set
// ---------------------------------------------------------------------------

namespace {

void check_mpi(int rc, const std::string& field) {
  if (rc != MPI_SUCCESS) throw Error(field, mpi_error_string(rc));
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

std::unique_ptr<CommSet> make_mpi_comm_set(const Plan& plan, MPI_Comm world) {
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
  mine[0] = local ? 1 : 0;
  const auto g = grid_ints(plan);
  for (int i = 0; i < kGridInts; ++i) {
    mine[1 + i] = g[i];
    mine[1 + kGridInts + i] = -g[i];  // max of -x: minus the minimum
  }
  check_mpi(
      MPI_Allreduce(mine.data(), all.data(), static_cast<int>(all.size()), MPI_INT, MPI_MAX, world),
      "mpi");
  if (local) throw *local;
  if (all[0]) throw Error("plan", "another rank rejected the plan (see its error)");
  for (int i = 0; i < kGridInts; ++i)
    if (all[1 + i] != -all[1 + kGridInts + i])
      throw Error("plan",
                  "ranks were given different grids (tp, pp, dp, cp, ep, rank_order, "
                  "shard_degree, etp)");

  RankGroups groups = rank_groups(plan, world_rank);
  MPI_Comm dup = MPI_COMM_NULL;
  check_mpi(MPI_Comm_dup(world, &dup), "mpi");
  MPI_Comm_set_errhandler(dup, MPI_ERRORS_RETURN);
  std::vector<int> world_members(world_size);
  for (int r = 0; r < world_size; ++r) world_members[r] = r;
  auto world_comm =
      std::make_unique<MpiCommunicator>("world", std::move(world_members), world_rank, dup);

  std::vector<std::unique_ptr<Communicator>> comms;
  for (Group kind : kGroupKinds) {
    const GroupMembership& m = groups[kind];
    MPI_Comm c = MPI_COMM_NULL;
    check_mpi(MPI_Comm_split(world_comm->comm(), m.color, m.index, &c),
              std::string("comm.") + group_name(kind));
    comms.push_back(std::make_unique<MpiCommunicator>(group_name(kind), m.members, m.index, c));
  }
  return std::make_unique<CommSet>(std::move(groups), std::move(comms), std::move(world_comm));
}

}  // namespace parasol::runtime
