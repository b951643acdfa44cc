// The closed form of a checkpointed job under exponential interruptions (Young 1974, Daly 2006).
#include "cost_models/goodput.h"

#include <cmath>

#include "core/error.h"

namespace parasol::cost {

double young_interval_s(double delta_s, double mtbi_s) {
  PARASOL_CHECK(delta_s >= 0 && mtbi_s > 0,
                "delta " + std::to_string(delta_s) + " s, MTBI " + std::to_string(mtbi_s) + " s");
  return std::sqrt(2 * delta_s * mtbi_s);
}

double daly_interval_s(double delta_s, double mtbi_s) {
  if (delta_s >= 2 * mtbi_s) return mtbi_s;
  const double x = delta_s / (2 * mtbi_s);
  return std::sqrt(2 * delta_s * mtbi_s) * (1 + std::sqrt(x) / 3 + x / 9) - delta_s;
}

double expected_lost_work_s(double segment_s, double mtbi_s) {
  if (!std::isfinite(mtbi_s)) return segment_s / 2;
  const double x = segment_s / mtbi_s;
  if (x < 1e-6) return segment_s / 2 - segment_s * x / 12;  // the series, where expm1 cancels
  return mtbi_s - segment_s / std::expm1(x);
}

double expected_segment_s(double segment_s, double restart_s, double mtbi_s) {
  if (!std::isfinite(mtbi_s)) return segment_s;
  return mtbi_s * std::exp(restart_s / mtbi_s) * std::expm1(segment_s / mtbi_s);
}

namespace {
// Adds `count` segments of `work_s` work each (and a checkpoint) to `g`.
void add_segments(Goodput& g, double count, double work_s, double delta_s, double restart_s,
                  double mtbi_s) {
  if (count <= 0) return;
  const double length = work_s + delta_s;
  g.productive += count * work_s;
  g.checkpoint += count * delta_s;
  if (!std::isfinite(mtbi_s)) return;
  // Failed attempts per segment: geometric, e^(L/M) - 1; each loses the expected lost work and
  // costs a restart, which completes in M (e^(R/M) - 1) on average (a restart interrupted starts
  // again), with e^(R/M) - 1 interruptions during it.
  const double failed = std::expm1(length / mtbi_s);
  g.lost_work += count * failed * expected_lost_work_s(length, mtbi_s);
  g.restart += count * failed * mtbi_s * std::expm1(restart_s / mtbi_s);
  g.interruptions += count * failed * std::exp(restart_s / mtbi_s);
}
}  // namespace

Goodput job_goodput(double work_s, double interval_s, double delta_s, double restart_s,
                    double mtbi_s, double planned_per_s) {
  PARASOL_CHECK(work_s >= 0 && interval_s > 0 && delta_s >= 0 && restart_s >= 0 && mtbi_s > 0 &&
                    planned_per_s * (restart_s + delta_s) < 1,
                "work " + std::to_string(work_s) + " s, interval " + std::to_string(interval_s) +
                    " s, MTBI " + std::to_string(mtbi_s) + " s");
  Goodput g;
  const double full = std::floor(work_s / interval_s);
  const double last = work_s - full * interval_s;
  add_segments(g, full, interval_s, delta_s, restart_s, mtbi_s);
  if (last > 1e-9 * interval_s) add_segments(g, 1, last, delta_s, restart_s, mtbi_s);
  // Planned stops come at a rate per wall-clock second and each costs a checkpoint and a
  // restart: the unplanned total T grows to T / (1 - p (R + delta)).
  const double unplanned = g.total();
  const double stop = restart_s + delta_s;
  const double all = unplanned / (1 - planned_per_s * stop);
  g.planned_restart = all - unplanned;
  g.planned = planned_per_s * all;
  return g;
}

}  // namespace parasol::cost
