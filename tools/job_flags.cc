// Whole-job flags and the time-to-train report.
#include "tools/job_flags.h"

#include <cmath>
#include <iostream>

#include "core/error.h"
#include "core/format.h"
#include "tools/flag_checks.h"

namespace parasol::tools {

void add_job_flags(CLI::App* cmd, JobFlags& f) {
  cmd->add_option("--tokens", f.tokens,
                  "report the time to train this many tokens (15.6e12 is accepted): wall-clock "
                  "time, GPU-hours, energy and the goodput breakdown")
      ->check(finite_number(true));
  cmd->add_option("--price-per-gpu-hour", f.price_per_gpu_hour,
                  "with --tokens: the cost at this price per GPU-hour")
      ->check(finite_number(false));
  cmd->add_option("--checkpoint-interval", f.checkpoint_interval_s,
                  "with --tokens: seconds of training between checkpoints (default: the "
                  "Young/Daly optimum)")
      ->check(finite_number(false));
  cmd->add_option("--storage-GBps", f.storage_GBps,
                  "with --tokens: checkpoint storage bandwidth, GB/s (default: the cluster's)")
      ->check(finite_number(true));
  cmd->add_option("--restart-s", f.restart_s,
                  "with --tokens: seconds from an interruption to training again, checkpoint "
                  "read apart (default: the cluster's)")
      ->check(finite_number(true));
  cmd->add_option("--planned-per-day", f.planned_per_day,
                  "with --tokens: planned stops (maintenance) per day, each a checkpoint and a "
                  "restart")
      ->check(finite_number(false));
}

cost::JobOptions job_options(const JobFlags& f, Cluster& cluster) {
  const bool other = f.price_per_gpu_hour != 0 || f.checkpoint_interval_s != 0 || f.storage_GBps ||
                     f.restart_s || f.planned_per_day != 0;
  if (!f.tokens && other)
    throw Error("job.tokens",
                "is required with --price-per-gpu-hour, --checkpoint-interval, "
                "--storage-GBps, --restart-s and --planned-per-day");
  if (f.storage_GBps) {
    if (!(*f.storage_GBps > 0) || !std::isfinite(*f.storage_GBps))
      throw Error("job.storage_GBps", "must be > 0");
    cluster.storage_bw = *f.storage_GBps * 1e9;
  }
  if (f.restart_s) {
    if (!(*f.restart_s > 0) || !std::isfinite(*f.restart_s))
      throw Error("job.restart_s", "must be > 0");
    cluster.restart_s = *f.restart_s;
  }
  // planned_per_day also against this cluster's restart time (time_to_train re-checks only the
  // range).
  if (f.planned_per_day * cost::restart_time_s(cluster) >= 43200)
    throw Error("job.planned_per_day", "must be >= 0 and leave at least half of each day to train");
  cost::JobOptions o;
  o.tokens = f.tokens.value_or(0);
  o.price_per_gpu_hour = f.price_per_gpu_hour;
  o.checkpoint_interval_s = f.checkpoint_interval_s;
  o.planned_per_day = f.planned_per_day;
  // Checked here once, not by each search worker's time_to_train (which checks them too).
  if (f.tokens) cost::validate_job_options(o);
  return o;
}

cost::StepFigures estimate_step(const cost::Estimate& e) {
  const cost::TimeBreakdown& t = e.time;
  return {e.step_time_s, t.forward + t.backward + t.recompute + t.optimizer + t.overlap};
}

namespace {
std::string duration(double s) {
  if (!std::isfinite(s)) return "never";
  if (s >= 86400) return fmt("%.1f days", s / 86400);
  if (s >= 3600) return fmt("%.2f h", s / 3600);
  if (s >= 60) return fmt("%.1f min", s / 60);
  return secs(s);
}
}  // namespace

void print_time_to_train(const cost::TimeToTrain& t) {
  const cost::Goodput& g = t.goodput;
  const double total = t.time_s;
  std::cout << "time to train " << count(t.tokens) << " tokens (" << count(t.steps)
            << " steps): " << duration(total) << ", " << count(t.gpu_hours) << " GPU-hours, "
            << fmt("%.0f MWh", t.energy_j / 3.6e9);
  if (t.price_per_gpu_hour > 0) std::cout << ", cost " << count(t.cost);
  std::cout << "\n";
  std::cout << "  expected step " << secs(t.expected_step_s) << " (step " << secs(t.step_s);
  if (t.straggler_cv > 0)
    std::cout << ", slowest of " << count(t.reliability.count[0]) << " GPUs at "
              << pct(t.straggler_cv) << " per-GPU variability";
  std::cout << ")\n";
  std::cout << "goodput " << pct(g.fraction()) << ":\n";
  for (auto [name, v] : {std::pair{"productive steps", g.productive},
                         {"checkpoint writes", g.checkpoint},
                         {"work lost to failures", g.lost_work},
                         {"restart and re-initialisation", g.restart},
                         {"planned stops", g.planned_restart}})
    if (v > 0 || std::string(name) == "productive steps")
      std::cout << "  " << name << ": " << duration(v) << " (" << pct(v / total) << ")\n";
  std::cout << "checkpoint every " << count(t.interval_steps) << " steps ("
            << duration(t.interval_s) << ", "
            << (t.interval_given ? "--checkpoint-interval" : "Daly's optimum") << "; Young "
            << duration(t.young_interval_s) << ", Daly " << duration(t.daly_interval_s)
            << "): " << fmt("%.0f GB", t.checkpoint.total_bytes / 1e9) << " ("
            << fmt("%.2f GB", t.checkpoint.max_rank_bytes / 1e9) << " per rank at most) at "
            << fmt("%.0f GB/s", t.storage_bw / 1e9) << ": write " << secs(t.checkpoint_write_s)
            << "\n";
  std::cout << "interruptions: " << fmt("%.0f", g.interruptions) << " expected ("
            << fmt("%.1f", t.reliability.interruptions_per_hour * 24) << " a day, MTBI "
            << duration(t.reliability.mtbi_s) << "), restart " << duration(t.restart_s) << " each";
  if (g.planned > 0) std::cout << "; " << fmt("%.0f", g.planned) << " planned stops";
  std::cout << "\n  per day by component:";
  for (int i = 0; i < cost::kComponents; ++i)
    if (t.reliability.per_hour[i] > 0)
      std::cout << " " << cost::component_name(static_cast<cost::Component>(i)) << " "
                << fmt("%.2f", t.reliability.per_hour[i] * 24);
  std::cout << "\n";
}

}  // namespace parasol::tools
