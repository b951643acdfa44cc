// Tests runtime/comm/comm_timeout.h: a transfer's deadline expires only past the timeout, and
// its message names the wait, the timeout and the variable that sets it; the default is
// Megatron-LM's 10 minutes. (The MPI and NCCL communicators apply it; tests/tools/failure_test.sh
// checks the MPI one end to end with a stalled rank.)
#include "runtime/comm/comm_timeout.h"

#include <gtest/gtest.h>

#include <cstdlib>

namespace parasol::runtime {
namespace {

using Clock = CommDeadline::Clock;

TEST(CommTimeout, ExpiresOnlyPastTheTimeout) {
  const Clock::time_point t0 = Clock::now();
  const CommDeadline d(3.0, t0);
  EXPECT_FALSE(d.expired(t0));
  EXPECT_FALSE(d.expired(t0 + std::chrono::milliseconds(2999)));
  EXPECT_TRUE(d.expired(t0 + std::chrono::milliseconds(3001)));
  EXPECT_NEAR(d.waited_s(t0 + std::chrono::seconds(5)), 5.0, 1e-9);
}

TEST(CommTimeout, MessageNamesTheWaitAndTheSetting) {
  const Clock::time_point t0 = Clock::now();
  const CommDeadline d(3.0, t0);
  const std::string m = d.message(t0 + std::chrono::milliseconds(4500));
  EXPECT_NE(m.find("no progress in 4.5 s"), std::string::npos) << m;
  EXPECT_NE(m.find("the communication timeout is 3 s"), std::string::npos) << m;
  EXPECT_NE(m.find("PARASOL_COMM_TIMEOUT_S"), std::string::npos) << m;
}

TEST(CommTimeout, DefaultIsTenMinutes) {
  if (std::getenv("PARASOL_COMM_TIMEOUT_S") != nullptr) GTEST_SKIP() << "set in the environment";
  EXPECT_EQ(comm_timeout_s(), 600.0);
  EXPECT_EQ(CommDeadline().timeout_s(), 600.0);
}

}  // namespace
}  // namespace parasol::runtime
