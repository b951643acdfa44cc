// Test helpers shared by the gtest binaries that run under mpirun (the MPI and NCCL
// communicators, the trainer): world rank and size, a barrier that sleeps instead of spinning,
// the small-integer inputs of the collective
// tests, and a gtest runner that prints only rank 0's report (other ranks print their failed
// assertions, prefixed by the rank) and returns a failure when any rank failed.
#pragma once

#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <thread>

namespace parasol::runtime::testing {

inline int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

inline int world_size() {
  int n = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

// Waits for every rank of `comm` without spinning (ranks share 2 cores in CI). The sleep between
// polls doubles from 100 us to 5 ms: a barrier the ranks reach together still ends within a
// fraction of a millisecond, while the ranks that wait out a serial run or a smaller plan (often
// seconds, 7 of 8 ranks) wake some 200 times a second instead of thousands, each wake-up a
// context switch and an MPI progress call taken from the ranks that work.
inline void quiet_barrier(MPI_Comm comm = MPI_COMM_WORLD) {
  MPI_Request r;
  MPI_Ibarrier(comm, &r);
  int done = 0;
  std::chrono::microseconds nap(100);
  while (!done) {
    MPI_Test(&r, &done, MPI_STATUS_IGNORE);
    if (done) break;
    std::this_thread::sleep_for(nap);
    nap = std::min(2 * nap, std::chrono::microseconds(5000));
  }
}

// The input element i of world rank r in the call numbered `salt`: a small integer, so that
// sums over 8 ranks are exact in fp32 and bf16 whatever the reduction order.
inline float value(int r, int salt, int64_t i) {
  return static_cast<float>(((r + 1) * 37 + salt * 11 + i * 5) % 29) - 14.0f;
}

// Prints failed assertions of a rank other than 0, prefixed by the rank.
class FailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit FailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (r.failed())
      std::fprintf(stderr, "[rank %d] %s:%d: %s\n", rank_, r.file_name() ? r.file_name() : "?",
                   r.line_number(), r.summary());
  }

 private:
  int rank_;
};

// The exit code ctest counts as "skipped" (SKIP_RETURN_CODE in the CMakeLists that run these).
inline constexpr int kSkipExitCode = 77;

// RUN_ALL_TESTS on every rank (gtest initialised by the caller), with rank 0's report only;
// returns 1 on every rank when a test failed on any, kSkipExitCode when none failed and one was
// skipped on some rank, 0 otherwise.
inline int run_all_ranks() {
  const int rank = world_rank();
  if (rank != 0) {
    ::testing::TestEventListeners& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new FailurePrinter(rank));
  }
  const int rc = RUN_ALL_TESTS();
  int any = 0;
  MPI_Allreduce(&rc, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (any != 0) return 1;
  // A test skipped on any rank makes the whole run "skipped" for ctest (SKIP_RETURN_CODE
  // kSkipExitCode), so that a partial run never shows as a pass; rank 0 names the skipped tests.
  const ::testing::UnitTest& unit = *::testing::UnitTest::GetInstance();
  int skipped = unit.skipped_test_count(), most = 0;
  MPI_Allreduce(&skipped, &most, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (most == 0) return 0;
  if (rank == 0) {
    std::fprintf(stderr, "%d test(s) skipped:", most);
    for (int i = 0; i < unit.total_test_suite_count(); ++i) {
      const ::testing::TestSuite& suite = *unit.GetTestSuite(i);
      for (int j = 0; j < suite.total_test_count(); ++j)
        if (suite.GetTestInfo(j)->result()->Skipped())
          std::fprintf(stderr, " %s.%s", suite.name(), suite.GetTestInfo(j)->name());
    }
    std::fprintf(stderr, "\n");
  }
  return kSkipExitCode;
}

}  // namespace parasol::runtime::testing
