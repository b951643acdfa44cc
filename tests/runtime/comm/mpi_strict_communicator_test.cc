// The MPI communicator's strict mode (MpiCommOptions::nccl_semantics, PARASOL_NCCL_SEMANTICS=1):
// NCCL's semantics where a schedule can deadlock. Run under mpirun with an even number of ranks
// (pairs 0-1, 2-3, ...). Two members that each send to the other and then receive deadlock when
// the sends and receives are separate groups (the watchdog throws, naming the communicator, the
// call and the peer), and complete when each pair is one group: begin_group()/end_group(), or
// consecutive isend/irecv calls that the communicator batches as NcclCommunicator does; a call
// on another communicator of the set issues the held-back batch first. The default (non-strict)
// communicator completes the same ungrouped exchange: MPI hides the deadlock.
#include <gtest/gtest.h>
#include <mpi.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/error.h"
#include "runtime/comm/mpi_communicator.h"
#include "tests/runtime/mpi_test_util.h"

namespace parasol::runtime {
namespace {

using testing::world_rank;
using testing::world_size;

constexpr int64_t kCount = 4;  // tiny messages: a synchronous send still waits for its receive

Plan world_plan() {
  Plan p;
  p.dp = world_size();
  return p;
}

MpiCommOptions strict(double watchdog_s = 1.0) {
  MpiCommOptions o;
  o.nccl_semantics = true;
  o.watchdog_s = watchdog_s;
  return o;
}

int partner() { return world_rank() ^ 1; }

std::vector<float> payload(int rank) {
  std::vector<float> v(kCount);
  for (int64_t i = 0; i < kCount; ++i) v[i] = static_cast<float>(100 * rank + i);
  return v;
}

// Fails the test on rank 0 when it failed on any rank (every rank joins, test by test).
class StrictTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (world_size() % 2 != 0) GTEST_SKIP() << "needs an even number of ranks";
  }
  void TearDown() override {
    const int mine = HasFailure() ? 1 : 0;
    std::vector<int> all(world_size());
    MPI_Allgather(&mine, 1, MPI_INT, all.data(), 1, MPI_INT, MPI_COMM_WORLD);
    for (int r = 1; r < world_size(); ++r)
      if (all[r] && world_rank() == 0) ADD_FAILURE() << "failed on rank " << r;
  }
};

// Each member sends, lets the send go alone (test() issues the held-back batch), then receives:
// under NCCL's semantics both sends wait for receives queued behind them.
TEST_F(StrictTest, UngroupedSendThenReceiveDeadlocksIntoTheWatchdog) {
  auto set = make_mpi_comm_set(world_plan(), MPI_COMM_WORLD, strict(1.0));
  auto& w = dynamic_cast<MpiCommunicator&>(set->world());
  ASSERT_TRUE(w.nccl_semantics());
  const std::vector<float> out = payload(world_rank());
  std::vector<float> in(kCount, -1.0f);
  // The watchdog's clock starts when the send is posted (by test() below), so measure from
  // before it: measured from the receive, the wait is short of the timeout by the time between.
  const auto t0 = std::chrono::steady_clock::now();
  Request s = w.isend(out, partner(), 1);
  EXPECT_FALSE(s.test());  // posted alone; the partner's receive is not
  Request r = w.irecv(in, partner(), 1);
  try {
    r.wait();
    ADD_FAILURE() << "no deadlock";
  } catch (const Error& e) {
    const double waited =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_GE(waited, 1.0);
    EXPECT_EQ(e.field(), "comm.world.send");
    const std::string what = e.what();
    EXPECT_NE(what.find("deadlock"), std::string::npos) << what;
    EXPECT_NE(what.find("send of 4 elements to member " + std::to_string(partner())),
              std::string::npos)
        << what;
    EXPECT_NE(what.find("1 group(s) queued behind it"), std::string::npos) << what;
  }
  // The communicator is broken: its pending Requests and later calls throw at once.
  EXPECT_THROW(s.wait(), Error);
  EXPECT_THROW(w.barrier(), Error);
  // The stuck sends were left to MPI: receive the partner's, so that both complete (once both
  // members have given up: a drained send would otherwise let the partner's exchange go on).
  MPI_Barrier(MPI_COMM_WORLD);
  std::vector<float> drained(kCount);
  MPI_Recv(drained.data(), kCount, MPI_FLOAT, partner(), 1, w.comm(), MPI_STATUS_IGNORE);
  EXPECT_EQ(drained, payload(partner()));
  MPI_Barrier(MPI_COMM_WORLD);
}

// The same exchange in one group completes.
TEST_F(StrictTest, SendAndReceiveInOneGroupComplete) {
  auto set = make_mpi_comm_set(world_plan(), MPI_COMM_WORLD, strict(30.0));
  Communicator& w = set->world();
  const std::vector<float> out = payload(world_rank());
  std::vector<float> in(kCount, -1.0f);
  w.begin_group();
  Request s = w.isend(out, partner(), 1);
  Request r = w.irecv(in, partner(), 1);
  // Not issued before end_group(): waiting would hang, so it throws.
  EXPECT_THROW(r.wait(), Error);
  w.end_group();
  r.wait();
  s.wait();
  EXPECT_EQ(in, payload(partner()));
  EXPECT_THROW(w.end_group(), Error);  // without begin_group()
}

// Consecutive isend/irecv calls, with no test() or other call between them, are one batch
// (NcclCommunicator's rule).
TEST_F(StrictTest, ConsecutiveSendAndReceiveAreBatched) {
  auto set = make_mpi_comm_set(world_plan(), MPI_COMM_WORLD, strict(30.0));
  Communicator& w = set->world();
  const std::vector<float> out = payload(world_rank());
  std::vector<float> in(kCount, -1.0f);
  Request s = w.isend(out, partner(), 2);
  Request r = w.irecv(in, partner(), 2);
  r.wait();
  s.wait();
  EXPECT_EQ(in, payload(partner()));
}

// A call on another communicator of the set issues the held-back send alone: the receive after it
// is another group, and the exchange deadlocks.
TEST_F(StrictTest, CallOnAnotherCommunicatorIssuesTheHeldBatch) {
  auto set = make_mpi_comm_set(world_plan(), MPI_COMM_WORLD, strict(1.0));
  auto& w = dynamic_cast<MpiCommunicator&>(set->world());
  const std::vector<float> out = payload(world_rank());
  std::vector<float> in(kCount, -1.0f);
  Request s = w.isend(out, partner(), 3);
  std::vector<float> one = {1.0f};
  set->tp().all_reduce(one);  // a group of one member: completes at once
  Request r = w.irecv(in, partner(), 3);
  try {
    r.wait();
    ADD_FAILURE() << "no deadlock";
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "comm.world.send");
  }
  MPI_Barrier(MPI_COMM_WORLD);  // both members have given up before a send is drained
  std::vector<float> drained(kCount);
  MPI_Recv(drained.data(), kCount, MPI_FLOAT, partner(), 3, w.comm(), MPI_STATUS_IGNORE);
  MPI_Barrier(MPI_COMM_WORLD);
}

// Calls of one communicator run in order: a collective issued after a stuck send is not posted
// (the watchdog names the send, with the all-reduce queued behind it).
TEST_F(StrictTest, CallsRunInOrder) {
  auto set = make_mpi_comm_set(world_plan(), MPI_COMM_WORLD, strict(1.0));
  auto& w = dynamic_cast<MpiCommunicator&>(set->world());
  const std::vector<float> out = payload(world_rank());
  std::vector<float> sum = {1.0f};
  // Only the even members send: their partners never receive, so the sends stay stuck.
  Request s;
  if (world_rank() % 2 == 0) s = w.isend(out, partner(), 4);
  Request a = w.iall_reduce(sum);
  if (world_rank() % 2 == 0) {
    try {
      a.wait();
      ADD_FAILURE() << "the all-reduce ran before the send completed";
    } catch (const Error& e) {
      EXPECT_EQ(e.field(), "comm.world.send") << e.what();
    }
    EXPECT_EQ(sum[0], 1.0f);  // never posted
    MPI_Barrier(MPI_COMM_WORLD);
  } else {
    // The odd members' all-reduce cannot complete without the even ones': it times out too.
    EXPECT_THROW(a.wait(), Error);
    MPI_Barrier(MPI_COMM_WORLD);  // both members have given up before the send is drained
    std::vector<float> drained(kCount);
    MPI_Recv(drained.data(), kCount, MPI_FLOAT, partner(), 4, w.comm(), MPI_STATUS_IGNORE);
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

// The default communicator (no strict mode) completes the ungrouped exchange: the deadlock above
// is invisible to plain MPI.
TEST_F(StrictTest, DefaultModeHidesTheDeadlock) {
  auto set = make_mpi_comm_set(world_plan(), MPI_COMM_WORLD, MpiCommOptions{});
  Communicator& w = set->world();
  const std::vector<float> out = payload(world_rank());
  std::vector<float> in(kCount, -1.0f);
  Request s = w.isend(out, partner(), 5);
  s.test();
  Request r = w.irecv(in, partner(), 5);
  r.wait();
  s.wait();
  EXPECT_EQ(in, payload(partner()));
}

// make_mpi_comm_set's default options follow PARASOL_NCCL_SEMANTICS.
TEST_F(StrictTest, DefaultOptionsFollowTheEnvironment) {
  const char* env = std::getenv("PARASOL_NCCL_SEMANTICS");
  const bool expect = env != nullptr && std::string(env) == "1";
  EXPECT_EQ(MpiCommOptions::from_env().nccl_semantics, expect);
  auto set = make_mpi_comm_set(world_plan());
  EXPECT_EQ(dynamic_cast<MpiCommunicator&>(set->pp()).nccl_semantics(), expect);
}

}  // namespace
}  // namespace parasol::runtime

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  const int any = parasol::runtime::testing::run_all_ranks();
  MPI_Finalize();
  return any;
}
