// The communication timeout: how long a transfer may go without completing before the
// communicator gives up on it, names it and throws, instead of waiting forever for a peer that
// died or stalled (the MPI communicator; the NCCL one also aborts its communicator). The trainer
// then ends the whole job (tools/run_cmd.cc). Megatron-LM's --distributed-timeout-minutes
// defaults to 10 minutes; so does this.
#pragma once

#include <chrono>
#include <string>

namespace parasol::runtime {

inline constexpr double kDefaultCommTimeoutS = 600;

// PARASOL_COMM_TIMEOUT_S from the environment (seconds > 0), read once per process, else the
// default. Throws parasol::Error naming PARASOL_COMM_TIMEOUT_S on a value that is not a positive
// number.
double comm_timeout_s();
// Sets the timeout for the rest of the process (`parasol run --comm-timeout`), over the
// environment's. REQUIRES: seconds > 0.
void set_comm_timeout_s(double seconds);

// When a transfer was posted, and whether it has waited longer than the timeout.
class CommDeadline {
 public:
  using Clock = std::chrono::steady_clock;
  explicit CommDeadline(double timeout_s = comm_timeout_s(), Clock::time_point start = Clock::now())
      : timeout_s_(timeout_s), start_(start) {}
  double waited_s(Clock::time_point now = Clock::now()) const {
    return std::chrono::duration<double>(now - start_).count();
  }
  bool expired(Clock::time_point now = Clock::now()) const { return waited_s(now) > timeout_s_; }
  double timeout_s() const { return timeout_s_; }
  // "no progress in 12.0 s (the communication timeout is 10 s: --comm-timeout or
  // PARASOL_COMM_TIMEOUT_S): a peer died, stalled or never posted its side".
  std::string message(Clock::time_point now = Clock::now()) const;

 private:
  double timeout_s_;
  Clock::time_point start_;
};

}  // namespace parasol::runtime
