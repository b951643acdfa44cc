// Goodput of a job that checkpoints and restarts: the closed form of a job of W seconds of work
// cut into segments of tau seconds, each followed by a checkpoint write of delta seconds, on a
// cluster interrupted at random (a Poisson process of mean time between interruptions M); after
// each interruption the job restarts (R seconds, itself exposed to interruptions) from the last
// checkpoint, losing the work since. Expected values are exact for that process (Daly 2006, "A
// higher order estimate of the optimum checkpoint interval for restart dumps", FGCS 22(3), the
// exponential-failure model); sim/job_monte_carlo.h plays the same process at random.
#pragma once

namespace parasol::cost {

// Young (1974): the interval between checkpoints that minimises lost time to first order,
// sqrt(2 delta M). REQUIRES: delta >= 0, M > 0.
double young_interval_s(double delta_s, double mtbi_s);
// Daly (2006): the higher-order optimum of the work between checkpoints,
// sqrt(2 delta M) [1 + sqrt(delta / 2M) / 3 + (delta / 2M) / 9] - delta when delta < 2M, else M.
double daly_interval_s(double delta_s, double mtbi_s);

// The expected work lost by one interruption that strikes a segment of `segment_s` seconds
// (work and checkpoint): the mean time from the segment's start to an interruption that falls
// inside it, M - L / (e^(L/M) - 1) (about L/2 when L << M).
double expected_lost_work_s(double segment_s, double mtbi_s);

// The expected wall time to complete one segment of `segment_s` seconds (work and its
// checkpoint) with restarts of `restart_s`: M e^(R/M) (e^(L/M) - 1) (Daly 2006).
double expected_segment_s(double segment_s, double restart_s, double mtbi_s);

// Where a job's expected wall time goes, in seconds.
struct Goodput {
  double productive = 0;       // the work itself (W)
  double checkpoint = 0;       // completed checkpoint writes
  double lost_work = 0;        // work and checkpoint writes undone by interruptions
  double restart = 0;          // restarts after unplanned interruptions (and their re-runs)
  double planned_restart = 0;  // planned stops: a checkpoint and a restart each, no work lost
  double interruptions = 0;    // expected unplanned interruptions
  double planned = 0;          // expected planned stops
  double total() const { return productive + checkpoint + lost_work + restart + planned_restart; }
  double fraction() const { return total() > 0 ? productive / total() : 0; }
};

// The expected breakdown of a job of `work_s` seconds of work checkpointed every `interval_s`
// seconds of work (the last segment may be shorter), each checkpoint `delta_s`, restarts of
// `restart_s`, unplanned interruptions with mean time between them `mtbi_s` (infinity: none) and
// planned stops at `planned_per_s` per second of wall time.
// REQUIRES: work_s >= 0, interval_s > 0, delta_s >= 0, restart_s >= 0, mtbi_s > 0,
// planned_per_s * (restart_s + delta_s) < 1.
Goodput job_goodput(double work_s, double interval_s, double delta_s, double restart_s,
                    double mtbi_s, double planned_per_s = 0);

}  // namespace parasol::cost
