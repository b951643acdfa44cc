// runtime/comm/idle_wait.h: whether a host counts as oversubscribed, and that a waiting rank on an
// oversubscribed host gives its core away (sleeps) once it has polled in vain.
#include "runtime/comm/idle_wait.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

namespace parasol::runtime {
namespace {

TEST(IdleWait, UsableCoresAreThoseOfTheHost) {
  EXPECT_GE(usable_cores(), 1);
  const unsigned hw = std::thread::hardware_concurrency();
  if (hw > 0) {
    EXPECT_LE(usable_cores(), static_cast<int>(hw));
  }
}

TEST(IdleWait, OversubscribedUntilToldAndWhenRanksOutnumberCores) {
  // Before MPI says how many ranks share the host, the safe choice: sleep.
  EXPECT_TRUE(host_oversubscribed());
  set_ranks_on_host(usable_cores());
  EXPECT_FALSE(host_oversubscribed());
  set_ranks_on_host(1);
  EXPECT_FALSE(host_oversubscribed());
  set_ranks_on_host(usable_cores() + 1);
  EXPECT_TRUE(host_oversubscribed());
  set_ranks_on_host(0);  // not a count of ranks: the safe choice
  EXPECT_TRUE(host_oversubscribed());
}

// On an oversubscribed host, polls beyond the 64th sleep at least 20 us each (a lower bound: a
// slow host only waits longer).
TEST(IdleWait, AnOversubscribedHostSleepsAfterIdlePolls) {
  set_ranks_on_host(usable_cores() + 1);
  IdleWait idle;
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < 64 + 50; ++i) idle.pause();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_GE(s, 50 * 20e-6);
}

// On a host with a core per rank, a wait spins for up to 1 ms, then sleeps as above.
TEST(IdleWait, AHostWithACorePerRankSleepsOnlyAfterSpinning) {
  set_ranks_on_host(1);
  IdleWait idle;
  const auto start = std::chrono::steady_clock::now();
  while (std::chrono::steady_clock::now() - start < std::chrono::milliseconds(2)) idle.pause();
  // Past 1 ms of spinning: the next 64 polls are free, then each sleeps.
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 64 + 50; ++i) idle.pause();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_GE(s, 50 * 20e-6);
}

}  // namespace
}  // namespace parasol::runtime
