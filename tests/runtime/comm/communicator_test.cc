// runtime/comm/communicator: Request semantics, the argument checks every implementation
// inherits (on a recording fake communicator), CommSet's consistency checks and the Program
// payload convention (comm_count). Plain gtest, no MPI.
#include "runtime/comm/communicator.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "core/error.h"

namespace parasol::runtime {
namespace {

// ---- Request -----------------------------------------------------------------------------------

// Completes after `polls` calls to test(); counts the calls.
struct Counters {
  int tests = 0;
  int waits = 0;
  int destroyed = 0;
};

class FakeImpl : public Request::Impl {
 public:
  FakeImpl(Counters* c, int polls, bool fail = false) : c_(c), polls_(polls), fail_(fail) {}
  ~FakeImpl() override { ++c_->destroyed; }
  bool test() override {
    ++c_->tests;
    if (polls_ > 0) --polls_;
    if (polls_ == 0 && fail_) throw Error("fake", "failed");
    return polls_ == 0;
  }
  void wait() override {
    ++c_->waits;
    polls_ = 0;
    if (fail_) throw Error("fake", "failed");
  }

 private:
  Counters* c_;
  int polls_;
  bool fail_;
};

TEST(RequestTest, DefaultIsComplete) {
  Request r;
  EXPECT_TRUE(r.done());
  EXPECT_TRUE(r.test());
  r.wait();
  EXPECT_TRUE(r.done());
}

TEST(RequestTest, TestPollsUntilCompleteThenIsDone) {
  Counters c;
  Request r(std::make_unique<FakeImpl>(&c, 3));
  EXPECT_FALSE(r.done());
  EXPECT_FALSE(r.test());
  EXPECT_FALSE(r.test());
  EXPECT_TRUE(r.test());
  EXPECT_TRUE(r.done());
  EXPECT_EQ(c.destroyed, 1);
  EXPECT_TRUE(r.test());  // no further calls into the finished transfer
  EXPECT_EQ(c.tests, 3);
  EXPECT_EQ(c.waits, 0);
}

TEST(RequestTest, WaitIsIdempotent) {
  Counters c;
  Request r(std::make_unique<FakeImpl>(&c, 5));
  r.wait();
  r.wait();
  EXPECT_TRUE(r.done());
  EXPECT_EQ(c.waits, 1);
}

TEST(RequestTest, DestroyingOrOverwritingAPendingRequestWaits) {
  Counters c;
  { Request r(std::make_unique<FakeImpl>(&c, 5)); }
  EXPECT_EQ(c.waits, 1);
  EXPECT_EQ(c.destroyed, 1);
  Request a(std::make_unique<FakeImpl>(&c, 5));
  a = Request(std::make_unique<FakeImpl>(&c, 5));
  EXPECT_EQ(c.waits, 2);  // the first transfer of `a`
  Request b = std::move(a);
  EXPECT_TRUE(a.done());  // NOLINT(bugprone-use-after-move): moved-from is empty
  b.wait();
  EXPECT_EQ(c.waits, 3);
}

TEST(RequestTest, FailuresSurfaceInWaitAndNotInTheDestructor) {
  Counters c;
  {
    Request r(std::make_unique<FakeImpl>(&c, 1, /*fail=*/true));
    EXPECT_THROW(r.wait(), Error);
    EXPECT_FALSE(r.done());
  }  // the destructor waits again and drops the error
  EXPECT_EQ(c.destroyed, 1);
}

TEST(RequestTest, WaitAll) {
  Counters c;
  std::vector<Request> rs;
  for (int i = 0; i < 3; ++i) rs.emplace_back(std::make_unique<FakeImpl>(&c, 4));
  wait_all(rs);
  for (const Request& r : rs) EXPECT_TRUE(r.done());
  EXPECT_EQ(c.waits, 3);
}

// ---- Communicator argument checks ---------------------------------------------------------------

// Records the last start_* call; never moves data.
class FakeComm : public Communicator {
 public:
  FakeComm(std::string name, std::vector<int> members, int index)
      : Communicator(std::move(name), std::move(members), index) {}
  int64_t max_tag() const override { return 1000; }

  std::string last;
  int64_t last_count = -1;
  bool last_in_place = false;

 protected:
  Request note(const char* what, int64_t count, bool in_place = false) {
    last = what;
    last_count = count;
    last_in_place = in_place;
    return Request();
  }
  Request start_all_reduce(void*, int64_t n, Dtype, bool max) override {
    return note(max ? "all_reduce_max" : "all_reduce", n);
  }
  Request start_all_gather(const void*, void*, int64_t n, Dtype, bool ip) override {
    return note("all_gather", n, ip);
  }
  Request start_reduce_scatter(const void*, void*, int64_t n, Dtype, bool ip) override {
    return note("reduce_scatter", n, ip);
  }
  Request start_all_to_all(const void*, void*, int64_t n, Dtype) override {
    return note("all_to_all", n);
  }
  Request start_all_to_all_v(const void*, std::span<const int64_t> sc, void*,
                             std::span<const int64_t>, Dtype) override {
    return note("all_to_all_v", static_cast<int64_t>(sc.size()));
  }
  Request start_broadcast(void*, int64_t n, int, Dtype) override { return note("broadcast", n); }
  Request start_send(const void*, int64_t n, int, int64_t, Dtype) override {
    return note("send", n);
  }
  Request start_recv(void*, int64_t n, int, int64_t, Dtype) override { return note("recv", n); }
  Request start_barrier() override { return note("barrier", 0); }
};

// The field of the parasol::Error `f` throws ("(no error)" when it returns).
template <typename F>
std::string field_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.field();
  }
  return "(no error)";
}

TEST(CommunicatorTest, AccessorsAndConstruction) {
  FakeComm c("tp", {4, 5, 6, 7}, 2);
  EXPECT_EQ(c.name(), "tp");
  EXPECT_EQ(c.size(), 4);
  EXPECT_EQ(c.index(), 2);
  EXPECT_EQ(c.members(), (std::vector<int>{4, 5, 6, 7}));
  EXPECT_THROW(FakeComm("tp", {4, 5}, 2), Error);
}

TEST(CommunicatorTest, DtypesCountsPeersRootsAndTags) {
  FakeComm c("dp", {0, 2, 4, 6}, 1);
  std::vector<float> buf(64);
  EXPECT_EQ(field_of([&] { c.all_reduce(buf.data(), 8, Dtype::kFp8); }), "comm.dp.dtype");
  EXPECT_EQ(field_of([&] { c.all_reduce(buf.data(), 8, Dtype::kFp16); }), "(no error)");
  EXPECT_EQ(field_of([&] { c.all_reduce(buf.data(), -1, Dtype::kFp32); }), "comm.dp.count");
  EXPECT_EQ(field_of([&] { c.all_reduce(buf.data(), 8, Dtype::kBf16); }), "(no error)");
  EXPECT_EQ(field_of([&] { c.all_reduce(buf.data(), 8, Dtype::kTf32); }), "(no error)");
  EXPECT_EQ(field_of([&] { c.broadcast(buf.data(), 8, 4, Dtype::kFp32); }), "comm.dp.root");
  EXPECT_EQ(field_of([&] { c.broadcast(buf.data(), 8, -1, Dtype::kFp32); }), "comm.dp.root");
  EXPECT_EQ(field_of([&] { c.broadcast(buf.data(), 8, 3, Dtype::kFp32); }), "(no error)");
  EXPECT_EQ(field_of([&] { c.send(buf.data(), 8, 4, 0, Dtype::kFp32); }), "comm.dp.peer");
  EXPECT_EQ(field_of([&] { c.recv(buf.data(), 8, -1, 0, Dtype::kFp32); }), "comm.dp.peer");
  EXPECT_EQ(field_of([&] { c.send(buf.data(), 8, 1, 1001, Dtype::kFp32); }), "comm.dp.tag");
  EXPECT_EQ(field_of([&] { c.recv(buf.data(), 8, 1, -3, Dtype::kFp32); }), "comm.dp.tag");
  EXPECT_EQ(field_of([&] { c.send(buf.data(), 8, 1, 1000, Dtype::kFp32); }), "(no error)");
  EXPECT_EQ(c.last, "send");
}

TEST(CommunicatorTest, InPlaceLayoutsAreRecognisedAndOtherOverlapsRejected) {
  FakeComm c("tp", {0, 1, 2, 3}, 2);
  std::vector<float> big(4 * 8), small(8);
  // all-gather: send == recv + index*count is in place.
  c.all_gather(big.data() + 2 * 8, big.data(), 8, Dtype::kFp32);
  EXPECT_TRUE(c.last_in_place);
  c.all_gather(small.data(), big.data(), 8, Dtype::kFp32);
  EXPECT_FALSE(c.last_in_place);
  EXPECT_EQ(field_of([&] { c.all_gather(big.data() + 8, big.data(), 8, Dtype::kFp32); }),
            "comm.tp.recv");
  // bf16: the in-place offset is in bf16 elements.
  std::vector<uint16_t> h(4 * 8);
  c.all_gather(h.data() + 2 * 8, h.data(), 8, Dtype::kBf16);
  EXPECT_TRUE(c.last_in_place);
  // reduce-scatter: recv == send + index*count is in place.
  c.reduce_scatter(big.data(), big.data() + 2 * 8, 8, Dtype::kFp32);
  EXPECT_TRUE(c.last_in_place);
  c.reduce_scatter(big.data(), small.data(), 8, Dtype::kFp32);
  EXPECT_FALSE(c.last_in_place);
  EXPECT_EQ(field_of([&] { c.reduce_scatter(big.data(), big.data() + 1, 8, Dtype::kFp32); }),
            "comm.tp.recv");
  // all-to-all(v) is never in place.
  EXPECT_EQ(field_of([&] { c.all_to_all(big.data(), big.data() + 4, 8, Dtype::kFp32); }),
            "comm.tp.recv");
  std::vector<float> other(4 * 8);
  c.all_to_all(big.data(), other.data(), 8, Dtype::kFp32);
  EXPECT_EQ(c.last, "all_to_all");
  const std::vector<int64_t> counts = {1, 0, 3, 2};
  EXPECT_EQ(
      field_of([&] { c.all_to_all_v(big.data(), counts, big.data() + 3, counts, Dtype::kFp32); }),
      "comm.tp.recv");
  c.all_to_all_v(big.data(), counts, other.data(), counts, Dtype::kFp32);
  EXPECT_EQ(c.last, "all_to_all_v");
  const std::vector<int64_t> three = {1, 2, 3};
  EXPECT_EQ(
      field_of([&] { c.all_to_all_v(big.data(), three, other.data(), counts, Dtype::kFp32); }),
      "comm.tp.counts");
  const std::vector<int64_t> negative = {1, -1, 0, 0};
  EXPECT_EQ(
      field_of([&] { c.all_to_all_v(big.data(), negative, other.data(), counts, Dtype::kFp32); }),
      "comm.tp.send_counts");
}

TEST(CommunicatorTest, SpanSizesAreChecked) {
  FakeComm c("ep", {0, 1}, 0);
  std::vector<float> a(6), b(12), d(5);
  c.all_gather(std::span<const float>(a), std::span<float>(b));
  EXPECT_EQ(c.last_count, 6);
  EXPECT_EQ(field_of([&] { c.all_gather(std::span<const float>(a), std::span<float>(a)); }),
            "comm.ep.recv");
  c.reduce_scatter(std::span<const float>(b), std::span<float>(a));
  EXPECT_EQ(c.last_count, 6);
  EXPECT_EQ(field_of([&] { c.reduce_scatter(std::span<const float>(b), std::span<float>(d)); }),
            "comm.ep.send");
  std::vector<float> b2(12);
  c.all_to_all(std::span<const float>(b), std::span<float>(b2));
  EXPECT_EQ(c.last_count, 6);  // per member
  EXPECT_EQ(field_of([&] { c.all_to_all(std::span<const float>(d), std::span<float>(d)); }),
            "comm.ep.recv");
  const std::vector<int64_t> sc = {2, 4}, rc = {5, 7};
  c.all_to_all_v(std::span<const float>(a), sc, std::span<float>(b), rc);
  EXPECT_EQ(c.last, "all_to_all_v");
  EXPECT_EQ(
      field_of([&] { c.all_to_all_v(std::span<const float>(a), rc, std::span<float>(b), rc); }),
      "comm.ep.counts");
  c.all_reduce(std::span<float>(d));
  EXPECT_EQ(c.last_count, 5);
  c.broadcast(std::span<float>(d), 1);
  EXPECT_EQ(c.last, "broadcast");
  c.send(std::span<const float>(d), 1, 7);
  c.recv(std::span<float>(d), 1, 7);
  EXPECT_EQ(c.last, "recv");
  c.barrier();
  EXPECT_EQ(c.last, "barrier");
}

// ---- CommSet
// -------------------------------------------------------------------------------------

std::vector<std::unique_ptr<Communicator>> fake_comms(const RankGroups& rg) {
  std::vector<std::unique_ptr<Communicator>> comms;
  for (Group g : kGroupKinds)
    comms.push_back(std::make_unique<FakeComm>(group_name(g), rg[g].members, rg[g].index));
  return comms;
}

std::unique_ptr<Communicator> fake_world(const RankGroups& rg) {
  std::vector<int> all(rg.world_size);
  for (int i = 0; i < rg.world_size; ++i) all[i] = i;
  return std::make_unique<FakeComm>("world", all, rg.world_rank);
}

TEST(CommSetTest, HoldsOneCommunicatorPerKindAndTheNeighbours) {
  Plan p;
  p.tp = 2;
  p.pp = 4;
  p.cp = 2;
  const RankGroups rg = rank_groups(p, 13);  // tp 1, cp 0, pp 3
  CommSet set(rg, fake_comms(rg), fake_world(rg));
  EXPECT_EQ(set.world_rank(), 13);
  EXPECT_EQ(set.world_size(), 16);
  EXPECT_EQ(set.tp().name(), "tp");
  EXPECT_EQ(set.dp_cp().name(), "dp-cp");
  EXPECT_EQ(set.expert_dp().name(), "expert-dp");
  EXPECT_EQ(set.pp().members(), (std::vector<int>{1, 5, 9, 13}));
  EXPECT_EQ(set.stage(), 3);
  EXPECT_EQ(set.pp_next(), 0);  // wraps to the first stage
  EXPECT_EQ(set.pp_prev(), 2);
  EXPECT_EQ(set.pp_peer(1), 1);
  EXPECT_EQ(set.cp_next(), 1);
  EXPECT_EQ(set.world().size(), 16);
  EXPECT_THROW(set.pp_peer(4), Error);
  for (Group g : kGroupKinds) EXPECT_EQ(set.get(g).members(), rg[g].members);
}

TEST(CommSetTest, RejectsCommunicatorsThatDoNotMatchThePlan) {
  Plan p;
  p.tp = 2;
  p.dp = 2;
  const RankGroups rg = rank_groups(p, 1);
  auto comms = fake_comms(rg);
  comms[static_cast<int>(Group::kDp)] = std::make_unique<FakeComm>("dp", std::vector<int>{0, 1}, 1);
  EXPECT_THROW(CommSet(rg, std::move(comms), fake_world(rg)), Error);
  auto too_few = fake_comms(rg);
  too_few.pop_back();
  EXPECT_THROW(CommSet(rg, std::move(too_few), fake_world(rg)), Error);
  EXPECT_THROW(
      CommSet(rg, fake_comms(rg), std::make_unique<FakeComm>("world", std::vector<int>{0, 1}, 1)),
      Error);
}

// ---- comm_count
// ----------------------------------------------------------------------------------

TEST(CommCountTest, FollowsTheNcclTestsConvention) {
  EXPECT_EQ(comm_count(OpKind::kAllReduce, 4096, Dtype::kFp32, 8), 1024);
  EXPECT_EQ(comm_count(OpKind::kAllReduce, 4096, Dtype::kBf16, 8), 2048);
  EXPECT_EQ(comm_count(OpKind::kAllGather, 4096, Dtype::kFp32, 8), 128);      // output / size
  EXPECT_EQ(comm_count(OpKind::kReduceScatter, 4096, Dtype::kBf16, 4), 512);  // input / size
  EXPECT_EQ(comm_count(OpKind::kAllToAll, 4096, Dtype::kFp32, 2), 512);
  EXPECT_EQ(comm_count(OpKind::kBroadcast, 400, Dtype::kFp32, 8), 100);
  EXPECT_EQ(comm_count(OpKind::kSend, 400, Dtype::kBf16, 2), 200);
  EXPECT_EQ(comm_count(OpKind::kRecv, 0, Dtype::kFp32, 2), 0);
  EXPECT_EQ(comm_count(OpKind::kAllReduce, 4, Dtype::kTf32, 1), 1);
}

TEST(CommCountTest, RejectsFractionsOtherKindsAndDtypes) {
  EXPECT_EQ(field_of([] { comm_count(OpKind::kAllReduce, 6, Dtype::kFp32, 2); }), "op.bytes");
  EXPECT_EQ(field_of([] { comm_count(OpKind::kAllGather, 4 * 6, Dtype::kFp32, 4); }), "op.bytes");
  EXPECT_EQ(field_of([] { comm_count(OpKind::kAllReduce, -8, Dtype::kFp32, 2); }), "op.bytes");
  EXPECT_EQ(field_of([] { comm_count(OpKind::kLinear, 8, Dtype::kFp32, 2); }), "op.kind");
  EXPECT_EQ(field_of([] { comm_count(OpKind::kAllReduce, 8, Dtype::kFp8, 2); }), "dtype");
  EXPECT_EQ(field_of([] { comm_count(OpKind::kAllReduce, 8, Dtype::kFp32, 0); }), "group_size");
}

}  // namespace
}  // namespace parasol::runtime
