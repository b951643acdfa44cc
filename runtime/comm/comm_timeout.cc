// The communication timeout (PARASOL_COMM_TIMEOUT_S) and the deadline of one transfer.
#include "runtime/comm/comm_timeout.h"

#include <cstdio>
#include <cstdlib>

#include "core/error.h"

namespace parasol::runtime {

namespace {
double g_set_timeout_s = 0;  // set_comm_timeout_s; 0: not set
}  // namespace

void set_comm_timeout_s(double seconds) {
  if (!(seconds > 0)) throw Error("comm-timeout", "must be a positive number of seconds");
  g_set_timeout_s = seconds;
}

double comm_timeout_s() {
  if (g_set_timeout_s > 0) return g_set_timeout_s;
  static const double t = [] {
    const char* v = std::getenv("PARASOL_COMM_TIMEOUT_S");
    if (v == nullptr || *v == '\0') return kDefaultCommTimeoutS;
    char* end = nullptr;
    const double s = std::strtod(v, &end);
    if (end == v || *end != '\0' || !(s > 0))
      throw Error("PARASOL_COMM_TIMEOUT_S", std::string("'") + v + "' is not a positive number");
    return s;
  }();
  return t;
}

std::string CommDeadline::message(Clock::time_point now) const {
  char buf[200];
  std::snprintf(buf, sizeof buf,
                "no progress in %.1f s (the communication timeout is %g s: --comm-timeout or "
                "PARASOL_COMM_TIMEOUT_S): a peer died, stalled or never posted its side",
                waited_s(now), timeout_s_);
  return buf;
}

}  // namespace parasol::runtime
