// runtime/comm/nccl_communicator: needs a GPU per rank (ctest label "gpu"). Run under mpirun
// with 1 rank (one GPU: every group has one member) or with as many ranks as GPUs on one node.
// With no CUDA device (or fewer devices than local ranks) main returns 77, which ctest counts as
// skipped. Every collective on the world communicator (plan dp = world size) is compared with a
// serial computation of its result from every member's known inputs, fp32 and bf16; plus
// send/recv to this rank and around the ring, tag matching of self transfers, grouped calls,
// test() polling, a caller-given stream, argument errors, and the world-size check.
#include "runtime/comm/nccl_communicator.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <mpi.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "runtime/comm/comm_timeout.h"
#include "runtime/tensor.h"
#include "tests/runtime/mpi_test_util.h"

namespace parasol::runtime {
namespace {

using testing::value;
using testing::world_rank;
using testing::world_size;

// A device buffer of n elements of `dtype` (fp32 or bf16) with host copies in fp32.
class DeviceBuf {
 public:
  DeviceBuf(int64_t n, Dtype dtype) : n_(n), dtype_(dtype) {
    EXPECT_EQ(cudaMalloc(&ptr_, std::max<int64_t>(bytes(), 1)), cudaSuccess);
    cudaMemset(ptr_, 0, std::max<int64_t>(bytes(), 1));
    cudaDeviceSynchronize();
  }
  ~DeviceBuf() { cudaFree(ptr_); }
  DeviceBuf(const DeviceBuf&) = delete;
  DeviceBuf& operator=(const DeviceBuf&) = delete;

  int64_t bytes() const { return n_ * (dtype_ == Dtype::kBf16 ? 2 : 4); }
  void* data() { return ptr_; }
  // Element offset `i` as a pointer.
  void* at(int64_t i) { return static_cast<char*>(ptr_) + i * (dtype_ == Dtype::kBf16 ? 2 : 4); }

  void set(const std::vector<float>& v, int64_t offset = 0) {
    cudaDeviceSynchronize();
    if (dtype_ == Dtype::kBf16) {
      std::vector<uint16_t> h(v.size());
      for (size_t i = 0; i < v.size(); ++i) h[i] = fp32_to_bf16(v[i]);
      EXPECT_EQ(cudaMemcpy(at(offset), h.data(), h.size() * 2, cudaMemcpyHostToDevice),
                cudaSuccess);
    } else {
      EXPECT_EQ(cudaMemcpy(at(offset), v.data(), v.size() * 4, cudaMemcpyHostToDevice),
                cudaSuccess);
    }
    cudaDeviceSynchronize();  // the communicators' streams do not wait on the legacy stream
  }
  std::vector<float> get() {
    cudaDeviceSynchronize();
    std::vector<float> out(n_);
    if (dtype_ == Dtype::kBf16) {
      std::vector<uint16_t> h(n_);
      EXPECT_EQ(cudaMemcpy(h.data(), ptr_, n_ * 2, cudaMemcpyDeviceToHost), cudaSuccess);
      for (int64_t i = 0; i < n_; ++i) out[i] = bf16_to_fp32(h[i]);
    } else {
      EXPECT_EQ(cudaMemcpy(out.data(), ptr_, n_ * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    }
    return out;
  }

 private:
  void* ptr_ = nullptr;
  int64_t n_;
  Dtype dtype_;
};

std::vector<float> input(int r, int salt, int64_t n, int64_t offset = 0) {
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = value(r, salt, offset + i);
  return v;
}

Plan dp_plan(int n) {
  Plan p;
  p.dp = n;
  return p;
}

// One CommSet for the whole run (NCCL initialisation is slow).
class Env : public ::testing::Environment {
 public:
  void SetUp() override { set = make_nccl_comm_set(dp_plan(world_size())); }
  void TearDown() override { set.reset(); }
  static inline std::unique_ptr<CommSet> set;
};

NcclCommunicator& world() { return dynamic_cast<NcclCommunicator&>(Env::set->world()); }

const Dtype kDtypes[] = {Dtype::kFp32, Dtype::kBf16};

TEST(NcclCommSet, GroupsAndDevice) {
  CommSet& s = *Env::set;
  const int n = world_size(), r = world_rank();
  EXPECT_EQ(s.world_size(), n);
  EXPECT_EQ(s.world().size(), n);
  EXPECT_EQ(s.world().index(), r);
  EXPECT_EQ(s.dp().size(), n);
  EXPECT_EQ(s.tp().size(), 1);
  EXPECT_EQ(s.pp().size(), 1);
  int device = -1;
  cudaGetDevice(&device);
  EXPECT_EQ(device, select_nccl_device(MPI_COMM_WORLD));
  for (Group g : kGroupKinds) {
    auto& c = dynamic_cast<NcclCommunicator&>(s.get(g));
    EXPECT_NE(c.comm(), nullptr);
    EXPECT_NE(c.stream(), nullptr);
  }
}

TEST(NcclCollectives, AllReduceSumAndMax) {
  const int n = world_size(), r = world_rank();
  const int64_t count = 1000;
  for (Dtype d : kDtypes) {
    DeviceBuf buf(count, d);
    buf.set(input(r, 1, count));
    world().all_reduce(buf.data(), count, d);
    std::vector<float> got = buf.get();
    for (int64_t i = 0; i < count; ++i) {
      float want = 0;
      for (int m = 0; m < n; ++m) want += value(m, 1, i);
      ASSERT_EQ(got[i], want) << dtype_name(d) << " i=" << i;
    }
  }
  DeviceBuf buf(count, Dtype::kFp32);
  buf.set(input(r, 2, count));
  world().iall_reduce_max(buf.data(), count, Dtype::kFp32).wait();
  std::vector<float> got = buf.get();
  for (int64_t i = 0; i < count; ++i) {
    float want = value(0, 2, i);
    for (int m = 1; m < n; ++m) want = std::max(want, value(m, 2, i));
    ASSERT_EQ(got[i], want) << i;
  }
}

TEST(NcclCollectives, AllGatherAndReduceScatterInAndOutOfPlace) {
  const int n = world_size(), r = world_rank();
  const int64_t count = 257;
  for (Dtype d : kDtypes) {
    for (bool in_place : {false, true}) {
      SCOPED_TRACE(std::string(dtype_name(d)) + (in_place ? " in place" : " out of place"));
      DeviceBuf recv(n * count, d), send(count, d);
      if (in_place) {
        recv.set(input(r, 3, count), r * count);
        world().all_gather(recv.at(r * count), recv.data(), count, d);
      } else {
        send.set(input(r, 3, count));
        world().all_gather(send.data(), recv.data(), count, d);
      }
      std::vector<float> got = recv.get();
      for (int m = 0; m < n; ++m)
        for (int64_t i = 0; i < count; ++i) ASSERT_EQ(got[m * count + i], value(m, 3, i));

      DeviceBuf full(n * count, d), out(count, d);
      full.set(input(r, 4, n * count));
      if (in_place)
        world().reduce_scatter(full.data(), full.at(r * count), count, d);
      else
        world().reduce_scatter(full.data(), out.data(), count, d);
      std::vector<float> all = in_place ? full.get() : out.get();
      const int64_t base = in_place ? r * count : 0;
      for (int64_t i = 0; i < count; ++i) {
        float want = 0;
        for (int m = 0; m < n; ++m) want += value(m, 4, r * count + i);
        ASSERT_EQ(all[base + i], want) << i;
      }
    }
  }
}

TEST(NcclCollectives, AllToAllAndUneven) {
  const int n = world_size(), r = world_rank();
  const int64_t count = 33;
  for (Dtype d : kDtypes) {
    DeviceBuf send(n * count, d), recv(n * count, d);
    send.set(input(r, 5, n * count));
    world().all_to_all(send.data(), recv.data(), count, d);
    std::vector<float> got = recv.get();
    for (int m = 0; m < n; ++m)
      for (int64_t i = 0; i < count; ++i)
        ASSERT_EQ(got[m * count + i], value(m, 5, r * count + i)) << m << " " << i;
  }
  // send_counts[j] = (r + j) % 3 (zeros included): member j sends (j + r) % 3 to r.
  std::vector<int64_t> sc(n), rc(n);
  int64_t sn = 0, rn = 0;
  for (int j = 0; j < n; ++j) {
    sc[j] = rc[j] = (r + j) % 3 + (j == r ? 2 : 0);
    sn += sc[j];
    rn += rc[j];
  }
  DeviceBuf send(sn, Dtype::kFp32), recv(rn, Dtype::kFp32);
  send.set(input(r, 6, sn));
  world().all_to_all_v(send.data(), sc, recv.data(), rc, Dtype::kFp32);
  std::vector<float> got = recv.get();
  int64_t ro = 0;
  for (int j = 0; j < n; ++j) {
    // Member j's block for r starts after its blocks for members 0..r-1.
    int64_t off = 0;
    for (int k = 0; k < r; ++k) off += (j + k) % 3 + (k == j ? 2 : 0);
    for (int64_t i = 0; i < rc[j]; ++i) ASSERT_EQ(got[ro + i], value(j, 6, off + i)) << j;
    ro += rc[j];
  }
}

TEST(NcclCollectives, BroadcastBarrierAndZeroCounts) {
  const int n = world_size(), r = world_rank();
  const int64_t count = 100;
  for (Dtype d : kDtypes) {
    DeviceBuf buf(count, d);
    buf.set(input(r, 7, count));
    world().broadcast(buf.data(), count, n - 1, d);
    std::vector<float> got = buf.get();
    for (int64_t i = 0; i < count; ++i) ASSERT_EQ(got[i], value(n - 1, 7, i));
  }
  world().barrier();
  Env::set->dp().barrier();
  Env::set->tp().barrier();
  DeviceBuf buf(1, Dtype::kFp32);
  world().all_reduce(buf.data(), 0, Dtype::kFp32);
  world().all_gather(buf.data(), buf.data(), 0, Dtype::kFp32);
  world().broadcast(buf.data(), 0, 0, Dtype::kFp32);
}

TEST(NcclPointToPoint, SelfInEitherOrderAndByTag) {
  NcclCommunicator& tp = dynamic_cast<NcclCommunicator&>(Env::set->tp());  // one member: itself
  const int64_t count = 64;
  DeviceBuf a(count, Dtype::kFp32), b(count, Dtype::kFp32), x(count, Dtype::kFp32),
      y(count, Dtype::kFp32);
  a.set(input(0, 8, count));
  b.set(input(0, 9, count));
  // Send first, then the recv, then wait on both.
  Request s1 = tp.isend(a.data(), count, 0, 1, Dtype::kFp32);
  Request r1 = tp.irecv(x.data(), count, 0, 1, Dtype::kFp32);
  s1.wait();
  r1.wait();
  EXPECT_EQ(x.get(), a.get());
  // Recv first; two tags, matched by tag rather than by order.
  Request r2 = tp.irecv(x.data(), count, 0, 2, Dtype::kFp32);
  Request r3 = tp.irecv(y.data(), count, 0, 3, Dtype::kFp32);
  Request s3 = tp.isend(b.data(), count, 0, 3, Dtype::kFp32);
  Request s2 = tp.isend(a.data(), count, 0, 2, Dtype::kFp32);
  std::vector<Request> all;
  all.push_back(std::move(r2));
  all.push_back(std::move(r3));
  all.push_back(std::move(s3));
  all.push_back(std::move(s2));
  wait_all(all);
  EXPECT_EQ(x.get(), a.get());
  EXPECT_EQ(y.get(), b.get());
  // bf16 through the span-less API.
  DeviceBuf h(count, Dtype::kBf16), g(count, Dtype::kBf16);
  h.set(input(0, 10, count));
  Request rh = tp.irecv(g.data(), count, 0, 0, Dtype::kBf16);
  tp.send(h.data(), count, 0, 0, Dtype::kBf16);
  rh.wait();
  EXPECT_EQ(g.get(), h.get());
}

TEST(NcclPointToPoint, SelfErrors) {
  NcclCommunicator& tp = dynamic_cast<NcclCommunicator&>(Env::set->tp());
  DeviceBuf a(16, Dtype::kFp32), x(16, Dtype::kFp32);
  // An unmatched send: wait throws instead of hanging, and the send is withdrawn.
  Request s = tp.isend(a.data(), 16, 0, 5, Dtype::kFp32);
  EXPECT_FALSE(s.test());
  EXPECT_THROW(s.wait(), Error);
  // A recv of another size than its send fails; the send completes.
  Request r = tp.irecv(x.data(), 16, 0, 6, Dtype::kFp32);
  tp.send(a.data(), 8, 0, 6, Dtype::kFp32);
  EXPECT_THROW(r.wait(), Error);
  // The withdrawn tag-5 send does not match a later recv.
  Request r5 = tp.irecv(x.data(), 16, 0, 5, Dtype::kFp32);
  EXPECT_THROW(r5.wait(), Error);
}

TEST(NcclPointToPoint, RingExchangeDoesNotDeadlock) {
  CommSet& s = *Env::set;
  const int n = world_size(), r = world_rank();
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  const int64_t count = 4096;
  for (Dtype d : kDtypes) {
    DeviceBuf out(count, d), in(count, d);
    out.set(input(r, 11, count));
    // isend before irecv on every rank: held back and issued in one NCCL group.
    Request send = s.world().isend(out.data(), count, next, 0, d);
    Request recv = s.world().irecv(in.data(), count, prev, 0, d);
    recv.wait();
    send.wait();
    std::vector<float> got = in.get();
    for (int64_t i = 0; i < count; ++i) ASSERT_EQ(got[i], value(prev, 11, i));
  }
}

TEST(NcclGroup, SeveralCollectivesInOneGroup) {
  const int n = world_size(), r = world_rank();
  const int64_t count = 300;
  DeviceBuf a(count, Dtype::kFp32), b(count, Dtype::kBf16), g(n * count, Dtype::kFp32),
      c(count, Dtype::kFp32);
  a.set(input(r, 12, count));
  b.set(input(r, 13, count));
  c.set(input(r, 14, count));
  NcclCommunicator& w = world();
  w.begin_group();
  EXPECT_TRUE(w.in_group());
  Request ra = w.iall_reduce(a.data(), count, Dtype::kFp32);
  Request rb = w.iall_reduce(b.data(), count, Dtype::kBf16);
  Request rg = w.iall_gather(c.data(), g.data(), count, Dtype::kFp32);
  EXPECT_FALSE(ra.test());
  EXPECT_THROW(rb.wait(), Error);  // not issued yet
  w.end_group();
  EXPECT_FALSE(w.in_group());
  ra.wait();
  rb.wait();
  rg.wait();
  std::vector<float> ga = a.get(), gb = b.get(), gg = g.get();
  for (int64_t i = 0; i < count; ++i) {
    float sa = 0, sb = 0;
    for (int m = 0; m < n; ++m) {
      sa += value(m, 12, i);
      sb += value(m, 13, i);
    }
    ASSERT_EQ(ga[i], sa);
    ASSERT_EQ(gb[i], sb);
    for (int m = 0; m < n; ++m) ASSERT_EQ(gg[m * count + i], value(m, 14, i));
  }
  EXPECT_THROW(w.end_group(), Error);
}

TEST(NcclRequests, TestPollsToCompletion) {
  const int64_t count = 1 << 20;
  DeviceBuf buf(count, Dtype::kFp32);
  Request req = world().iall_reduce(buf.data(), count, Dtype::kFp32);
  int polls = 0;
  while (!req.test()) ++polls;
  EXPECT_GE(polls, 0);
  EXPECT_TRUE(req.done());
  EXPECT_TRUE(req.test());
}

TEST(NcclRequests, ArgumentErrorsThrowBeforeSending) {
  DeviceBuf buf(16, Dtype::kFp32);
  EXPECT_THROW(world().iall_reduce(buf.data(), 16, Dtype::kFp8), Error);
  EXPECT_THROW(world().iall_reduce_max(buf.data(), 8, Dtype::kBf16), Error);
  EXPECT_THROW(world().isend(buf.data(), 16, world_size(), 0, Dtype::kFp32), Error);
  EXPECT_THROW(world().ibroadcast(buf.data(), 16, -1, Dtype::kFp32), Error);
  EXPECT_THROW(world().iall_reduce(buf.data(), -1, Dtype::kFp32), Error);
  world().barrier();  // still usable
}

TEST(NcclCommSet, CallerGivenStreamAndWorldSizeCheck) {
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  {
    NcclCommOptions options;
    options.stream = stream;
    std::unique_ptr<CommSet> s = make_nccl_comm_set(dp_plan(world_size()), MPI_COMM_WORLD, options);
    auto& w = dynamic_cast<NcclCommunicator&>(s->world());
    EXPECT_EQ(w.stream(), stream);
    const int64_t count = 128;
    DeviceBuf buf(count, Dtype::kFp32);
    buf.set(input(world_rank(), 15, count));
    w.all_reduce(buf.data(), count, Dtype::kFp32);
    std::vector<float> got = buf.get();
    for (int64_t i = 0; i < count; ++i) {
      float want = 0;
      for (int m = 0; m < world_size(); ++m) want += value(m, 15, i);
      ASSERT_EQ(got[i], want);
    }
  }
  cudaStreamDestroy(stream);
  Plan too_big;
  too_big.tp = world_size() + 1;
  try {
    make_nccl_comm_set(too_big);
    ADD_FAILURE() << "world-size mismatch accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "plan") << e.what();
  }
}

// The communication timeout on a GPU (issue: a rank that stalls must not leave the others
// waiting forever). A host function that blocks the communicator's stream until released stands
// for a peer that never posts its side: the wait ends after the timeout with an error naming the
// call, the communicator is aborted (ncclCommAbort), and the CommSet is then torn down without
// touching the freed communicator again (a second abort or a wait on it would crash).
TEST(NcclWatchdog, AStalledTransferIsAbortedNamedAndTornDown) {
  constexpr double kTimeoutS = 2;
  set_comm_timeout_s(kTimeoutS);
  static std::atomic<bool> released{false};
  released = false;
  {
    std::unique_ptr<CommSet> own = make_nccl_comm_set(dp_plan(world_size()));
    auto& w = dynamic_cast<NcclCommunicator&>(own->world());
    auto block = [](void*) {
      while (!released.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    };
    ASSERT_EQ(cudaLaunchHostFunc(w.stream(), block, nullptr), cudaSuccess);
    // The stall is released by another thread well after the timeout has fired: ncclCommAbort
    // frees device memory, and cudaFree waits for the device's work, this host function included,
    // so releasing it only after the abort returned deadlocks (seen on an H200: the test hung).
    // A real stall is a kernel waiting on a peer, which NCCL's abort flag stops. Were the timeout
    // never to fire, the all-reduce would complete after the release and the test fail below.
    std::thread releaser([] {
      std::this_thread::sleep_for(std::chrono::duration<double>(kTimeoutS + 2));
      released = true;
    });
    const int64_t count = 256;
    DeviceBuf buf(count, Dtype::kFp32);
    const auto t0 = std::chrono::steady_clock::now();
    try {
      w.all_reduce(buf.data(), count, Dtype::kFp32);
      ADD_FAILURE() << "a stalled all-reduce completed";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("comm."), std::string::npos) << what;
      EXPECT_NE(what.find("aborted"), std::string::npos) << what;
    }
    const double waited =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_GE(waited, kTimeoutS);
    EXPECT_LT(waited, kTimeoutS + 30);
    // A later call on the aborted communicator is an error, not a use of freed state.
    EXPECT_THROW(w.all_reduce(buf.data(), count, Dtype::kFp32), Error);
    releaser.join();  // the stream runs again; the CommSet's teardown follows
    EXPECT_EQ(cudaStreamSynchronize(w.stream()), cudaSuccess);
  }
  set_comm_timeout_s(kDefaultCommTimeoutS);
}

}  // namespace
}  // namespace parasol::runtime

// Exit code 77: no GPU for some rank (ctest's SKIP_RETURN_CODE).
int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  const int rank = parasol::runtime::testing::world_rank();
  MPI_Comm node = MPI_COMM_NULL;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
  int local_size = 1;
  MPI_Comm_size(node, &local_size);
  MPI_Comm_free(&node);
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess) devices = 0;
  int ok = devices >= local_size ? 1 : 0, all_ok = 0;
  MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (!all_ok) {
    if (rank == 0)
      std::printf("SKIPPED: %d CUDA device(s) for %d local rank(s): no GPU per rank\n", devices,
                  local_size);
    MPI_Finalize();
    return 77;
  }
  ::testing::InitGoogleTest(&argc, argv);
  ::testing::AddGlobalTestEnvironment(new parasol::runtime::Env);
  const int any = parasol::runtime::testing::run_all_ranks();
  MPI_Finalize();
  return any;
}
