// Test helpers shared by the gtest binaries that run under mpirun (the MPI and NCCL
// communicators, the trainer): world rank and size, the small-integer inputs of the collective
// tests, and a gtest runner that prints only rank 0's report (other ranks print their failed
// assertions, prefixed by the rank) and returns a failure when any rank failed.
#pragma once

#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdint>
#include <cstdio>

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

// RUN_ALL_TESTS on every rank (gtest initialised by the caller), with rank 0's report only;
// returns non-zero on every rank when a test failed on any.
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
  return any;
}

}  // namespace parasol::runtime::testing
