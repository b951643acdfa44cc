// runtime/comm/idle_wait.h: spin or sleep between polls, by whether the host is oversubscribed.
#include "runtime/comm/idle_wait.h"

#include <sched.h>

#include <atomic>
#include <chrono>
#include <thread>

namespace parasol::runtime {
namespace {
// 1: spin; 0: sleep when idle (also until set_ranks_on_host is called).
std::atomic<int> spin_when_idle{0};
constexpr int kSpinsBeforeSleep = 64;
constexpr std::chrono::microseconds kSpinAtMost{1000};
}  // namespace

int usable_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    const int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
  const unsigned h = std::thread::hardware_concurrency();
  return h > 0 ? static_cast<int>(h) : 1;
}

void set_ranks_on_host(int ranks) {
  spin_when_idle = ranks >= 1 && ranks <= usable_cores() ? 1 : 0;
}

bool host_oversubscribed() { return spin_when_idle.load() == 0; }

void IdleWait::pause() {
  if (!host_oversubscribed()) {
    const auto now = std::chrono::steady_clock::now();
    if (idle_ == 0) spin_until_ = now + kSpinAtMost;
    if (now < spin_until_) {
      idle_ = 1;
      std::this_thread::yield();
      return;
    }
  }
  if (++idle_ > kSpinsBeforeSleep) std::this_thread::sleep_for(std::chrono::microseconds(20));
}

}  // namespace parasol::runtime
