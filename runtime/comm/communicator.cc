// Communicator: the argument checks shared by every implementation, Request, CommSet and the
// Program payload convention (see communicator.h).
#include "runtime/comm/communicator.h"

#include <cmath>
#include <cstdint>
#include <functional>
#include <numeric>

#include "core/error.h"

namespace parasol::runtime {

bool comm_supports(Dtype d) {
  return d == Dtype::kFp32 || d == Dtype::kTf32 || d == Dtype::kBf16 || d == Dtype::kFp16;
}

int comm_elem_bytes(Dtype d) {
  switch (d) {
    case Dtype::kFp32:
    case Dtype::kTf32:
      return 4;
    case Dtype::kBf16:
    case Dtype::kFp16:
      return 2;
    default:
      break;
  }
  throw Error("dtype", std::string(dtype_name(d)) + " is not supported by the communicators " +
                           "(fp32, tf32, bf16, fp16)");
}

int64_t comm_count(OpKind kind, double bytes, Dtype dtype, int group_size) {
  if (!is_communication(kind))
    throw Error("op.kind", std::string(op_kind_name(kind)) + " is not a communication op");
  if (group_size < 1) throw Error("group_size", std::to_string(group_size) + " < 1");
  double per = 1;
  switch (kind) {
    case OpKind::kAllGather:
    case OpKind::kReduceScatter:
    case OpKind::kAllToAll:
      per = group_size;
      break;
    default:
      break;
  }
  const double elems = bytes / comm_elem_bytes(dtype) / per;
  if (!(elems >= 0) || elems != std::floor(elems) || elems > 9e15)
    throw Error("op.bytes", std::to_string(bytes) + " bytes is not a whole number of " +
                                dtype_name(dtype) + " elements" +
                                (per > 1 ? " per member of a group of " + std::to_string(group_size)
                                         : std::string()));
  return static_cast<int64_t>(elems);
}

// ---- Request ---------------------------------------------------------------------------------

Request& Request::operator=(Request&& other) noexcept {
  if (this != &other) {
    if (impl_) {
      try {
        impl_->wait();
      } catch (...) {
      }
    }
    impl_ = std::move(other.impl_);
  }
  return *this;
}

Request::~Request() {
  if (!impl_) return;
  try {
    impl_->wait();
  } catch (...) {
  }
}

void Request::wait() {
  if (!impl_) return;
  impl_->wait();
  impl_.reset();
}

bool Request::test() {
  if (!impl_) return true;
  if (!impl_->test()) return false;
  impl_.reset();
  return true;
}

void wait_all(std::span<Request> requests) {
  for (Request& r : requests) r.wait();
}

// ---- Communicator: checks ----------------------------------------------------------------------

namespace {

const char* as_bytes(const void* p) { return static_cast<const char*>(p); }

// Whether [a, a + an) and [b, b + bn) share a byte.
bool overlaps(const void* a, int64_t an, const void* b, int64_t bn) {
  if (an <= 0 || bn <= 0) return false;
  std::less<const char*> lt;
  return lt(as_bytes(a), as_bytes(b) + bn) && lt(as_bytes(b), as_bytes(a) + an);
}

}  // namespace

Communicator::Communicator(std::string name, std::vector<int> members, int index)
    : name_(std::move(name)), members_(std::move(members)), index_(index) {
  if (index_ < 0 || index_ >= size())
    throw Error("comm." + name_, "index " + std::to_string(index_) + " outside a group of " +
                                     std::to_string(size()));
}

void Communicator::fail(const std::string& what, const std::string& reason) const {
  throw Error("comm." + name_ + "." + what, reason);
}

void Communicator::check_dtype(Dtype dtype) const {
  if (!comm_supports(dtype))
    fail("dtype", std::string(dtype_name(dtype)) + " is not supported (fp32, tf32, bf16, fp16)");
}

void Communicator::check_count(int64_t count, const char* what) const {
  if (count < 0) fail(what, std::to_string(count) + " elements is negative");
}

void Communicator::check_member(int m, const char* what) const {
  if (m < 0 || m >= size())
    fail(what,
         std::to_string(m) + " is not a member index of a group of " + std::to_string(size()));
}

void Communicator::check_tag(int64_t tag) const {
  if (tag < 0 || tag > max_tag())
    fail("tag", std::to_string(tag) + " is outside 0.." + std::to_string(max_tag()));
}

// ---- Communicator: raw calls -------------------------------------------------------------------

Request Communicator::iall_reduce(void* buf, int64_t count, Dtype dtype) {
  check_dtype(dtype);
  check_count(count, "count");
  return start_all_reduce(buf, count, dtype, false);
}

Request Communicator::iall_reduce_max(void* buf, int64_t count, Dtype dtype) {
  check_dtype(dtype);
  if (comm_elem_bytes(dtype) != 4) fail("dtype", "the maximum is reduced in fp32 only");
  check_count(count, "count");
  return start_all_reduce(buf, count, dtype, true);
}

Request Communicator::iall_gather(const void* send, void* recv, int64_t count, Dtype dtype) {
  check_dtype(dtype);
  check_count(count, "count");
  const int64_t eb = comm_elem_bytes(dtype);
  const bool in_place = count > 0 && as_bytes(send) == as_bytes(recv) + index_ * count * eb;
  if (!in_place && overlaps(send, count * eb, recv, size() * count * eb))
    fail("recv", "overlaps send without being the in-place layout (send == recv + index*count)");
  return start_all_gather(send, recv, count, dtype, in_place);
}

Request Communicator::ireduce_scatter(const void* send, void* recv, int64_t count, Dtype dtype) {
  check_dtype(dtype);
  check_count(count, "count");
  const int64_t eb = comm_elem_bytes(dtype);
  const bool in_place = count > 0 && as_bytes(recv) == as_bytes(send) + index_ * count * eb;
  if (!in_place && overlaps(send, size() * count * eb, recv, count * eb))
    fail("recv", "overlaps send without being the in-place layout (recv == send + index*count)");
  return start_reduce_scatter(send, recv, count, dtype, in_place);
}

Request Communicator::iall_to_all(const void* send, void* recv, int64_t count, Dtype dtype) {
  check_dtype(dtype);
  check_count(count, "count");
  const int64_t bytes = size() * count * comm_elem_bytes(dtype);
  if (overlaps(send, bytes, recv, bytes))
    fail("recv", "overlaps send (all-to-all is not in place)");
  return start_all_to_all(send, recv, count, dtype);
}

Request Communicator::iall_to_all_v(const void* send, std::span<const int64_t> send_counts,
                                    void* recv, std::span<const int64_t> recv_counts, Dtype dtype) {
  check_dtype(dtype);
  if (static_cast<int>(send_counts.size()) != size() ||
      static_cast<int>(recv_counts.size()) != size())
    fail("counts", std::to_string(send_counts.size()) + " send and " +
                       std::to_string(recv_counts.size()) + " recv counts for a group of " +
                       std::to_string(size()));
  for (int64_t c : send_counts) check_count(c, "send_counts");
  for (int64_t c : recv_counts) check_count(c, "recv_counts");
  const int64_t eb = comm_elem_bytes(dtype);
  const int64_t sn = std::accumulate(send_counts.begin(), send_counts.end(), int64_t{0});
  const int64_t rn = std::accumulate(recv_counts.begin(), recv_counts.end(), int64_t{0});
  if (overlaps(send, sn * eb, recv, rn * eb))
    fail("recv", "overlaps send (all-to-all-v is not in place)");
  return start_all_to_all_v(send, send_counts, recv, recv_counts, dtype);
}

Request Communicator::ibroadcast(void* buf, int64_t count, int root, Dtype dtype) {
  check_dtype(dtype);
  check_count(count, "count");
  check_member(root, "root");
  return start_broadcast(buf, count, root, dtype);
}

Request Communicator::isend(const void* buf, int64_t count, int peer, int64_t tag, Dtype dtype) {
  check_dtype(dtype);
  check_count(count, "count");
  check_member(peer, "peer");
  check_tag(tag);
  return start_send(buf, count, peer, tag, dtype);
}

Request Communicator::irecv(void* buf, int64_t count, int peer, int64_t tag, Dtype dtype) {
  check_dtype(dtype);
  check_count(count, "count");
  check_member(peer, "peer");
  check_tag(tag);
  return start_recv(buf, count, peer, tag, dtype);
}

// ---- Communicator: fp32 spans ------------------------------------------------------------------

namespace {
int64_t elems(auto s) { return static_cast<int64_t>(s.size()); }
}  // namespace

Request Communicator::iall_reduce(std::span<float> buf) {
  return iall_reduce(buf.data(), elems(buf), Dtype::kFp32);
}

Request Communicator::iall_gather(std::span<const float> send, std::span<float> recv) {
  if (elems(recv) != size() * elems(send))
    fail("recv", std::to_string(recv.size()) + " elements, expected " +
                     std::to_string(size() * elems(send)) + " (size x send)");
  return iall_gather(send.data(), recv.data(), elems(send), Dtype::kFp32);
}

Request Communicator::ireduce_scatter(std::span<const float> send, std::span<float> recv) {
  if (elems(send) != size() * elems(recv))
    fail("send", std::to_string(send.size()) + " elements, expected " +
                     std::to_string(size() * elems(recv)) + " (size x recv)");
  return ireduce_scatter(send.data(), recv.data(), elems(recv), Dtype::kFp32);
}

Request Communicator::iall_to_all(std::span<const float> send, std::span<float> recv) {
  if (send.size() != recv.size() || elems(send) % size() != 0)
    fail("recv", std::to_string(send.size()) + " send and " + std::to_string(recv.size()) +
                     " recv elements: expected equal multiples of the group size " +
                     std::to_string(size()));
  return iall_to_all(send.data(), recv.data(), elems(send) / size(), Dtype::kFp32);
}

Request Communicator::iall_to_all_v(std::span<const float> send,
                                    std::span<const int64_t> send_counts, std::span<float> recv,
                                    std::span<const int64_t> recv_counts) {
  const int64_t sn = std::accumulate(send_counts.begin(), send_counts.end(), int64_t{0});
  const int64_t rn = std::accumulate(recv_counts.begin(), recv_counts.end(), int64_t{0});
  if (sn != elems(send) || rn != elems(recv))
    fail("counts", "send counts sum to " + std::to_string(sn) + " for " +
                       std::to_string(send.size()) + " elements, recv counts to " +
                       std::to_string(rn) + " for " + std::to_string(recv.size()));
  return iall_to_all_v(send.data(), send_counts, recv.data(), recv_counts, Dtype::kFp32);
}

Request Communicator::ibroadcast(std::span<float> buf, int root) {
  return ibroadcast(buf.data(), elems(buf), root, Dtype::kFp32);
}

Request Communicator::isend(std::span<const float> buf, int peer, int64_t tag) {
  return isend(buf.data(), elems(buf), peer, tag, Dtype::kFp32);
}

Request Communicator::irecv(std::span<float> buf, int peer, int64_t tag) {
  return irecv(buf.data(), elems(buf), peer, tag, Dtype::kFp32);
}

// ---- CommSet -----------------------------------------------------------------------------------

CommSet::CommSet(RankGroups groups, std::vector<std::unique_ptr<Communicator>> comms,
                 std::unique_ptr<Communicator> world)
    : groups_(std::move(groups)), comms_(std::move(comms)), world_(std::move(world)) {
  if (static_cast<int>(comms_.size()) != kNumGroupKinds)
    throw Error("comm", "a CommSet needs " + std::to_string(kNumGroupKinds) +
                            " communicators, got " + std::to_string(comms_.size()));
  for (int i = 0; i < kNumGroupKinds; ++i) {
    const GroupMembership& m = groups_.groups[i];
    if (!comms_[i] || comms_[i]->members() != m.members || comms_[i]->index() != m.index)
      throw Error("comm." + std::string(group_name(kGroupKinds[i])),
                  "communicator does not match the plan's group");
  }
  if (!world_ || world_->size() != groups_.world_size || world_->index() != groups_.world_rank)
    throw Error("comm.world", "communicator does not match the world");
}

int CommSet::pp_peer(int stage) const {
  const int pp = groups_[Group::kPp].size();
  if (stage < 0 || stage >= pp)
    throw Error("peer_stage", std::to_string(stage) + " is outside the " + std::to_string(pp) +
                                  " pipeline stages");
  return stage;  // the pp group is in stage order (groups.cc checks it)
}

}  // namespace parasol::runtime
