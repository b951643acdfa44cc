// Plays checkpointed jobs under exponential interruptions.
#include "sim/job_monte_carlo.h"

#include <cmath>
#include <random>

#include "core/error.h"

namespace parasol::sim {

cost::Goodput job_monte_carlo(const JobMonteCarloOptions& o) {
  PARASOL_CHECK(o.work_s > 0 && o.interval_s > 0 && o.mtbi_s > 0 && o.jobs >= 1,
                "work, interval and MTBI > 0, jobs >= 1");
  std::mt19937_64 rng(o.seed);
  // Exponential from a uniform in (0, 1], independent of the standard library's distributions.
  auto next_failure = [&] {
    const double u = (static_cast<double>(rng() >> 11) + 1) * 0x1.0p-53;
    return -o.mtbi_s * std::log(u);
  };
  cost::Goodput sum;
  for (int job = 0; job < o.jobs; ++job) {
    double done = 0;
    while (done < o.work_s - 1e-9 * o.interval_s) {
      const double work = std::min(o.interval_s, o.work_s - done);
      const double length = work + o.delta_s;
      for (;;) {
        const double f = next_failure();
        if (f >= length) {
          sum.productive += work;
          sum.checkpoint += o.delta_s;
          break;
        }
        // Interrupted: the segment's progress is lost; restart until a restart completes.
        sum.lost_work += f;
        sum.interruptions += 1;
        for (;;) {
          const double g = next_failure();
          if (g >= o.restart_s) {
            sum.restart += o.restart_s;
            break;
          }
          sum.restart += g;
          sum.interruptions += 1;
        }
      }
      done += work;
    }
  }
  for (double* v :
       {&sum.productive, &sum.checkpoint, &sum.lost_work, &sum.restart, &sum.interruptions})
    *v /= o.jobs;
  return sum;
}

}  // namespace parasol::sim
