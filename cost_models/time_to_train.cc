// Time to train, GPU-hours, energy and cost of a job, with its goodput breakdown.
#include "cost_models/time_to_train.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "cost_models/variability.h"

namespace parasol::cost {

double restart_time_s(const Cluster& cluster) {
  // An estimate, as no public measurement of a large job's restart is cited: a hang is detected
  // by the communicators' timeout (10 min by default in Megatron-LM's
  // --distributed-timeout-minutes and in `parasol run --comm-timeout`), a crash within seconds;
  // then the job is rescheduled (spare nodes swapped in), its processes start and its NCCL
  // communicators initialise over thousands of ranks (minutes). 600 s is the order of both.
  return cluster.restart_s > 0 ? cluster.restart_s : 600;
}

void validate_job_options(const JobOptions& o) {
  if (!(o.tokens > 0) || !std::isfinite(o.tokens) || o.tokens > 1e18)
    throw Error("job.tokens", "must be a number of tokens in (0, 1e18]");
  if (!(o.checkpoint_interval_s >= 0) || !std::isfinite(o.checkpoint_interval_s))
    throw Error("job.checkpoint_interval", "must be >= 0 seconds (0: the Young/Daly optimum)");
  if (!(o.price_per_gpu_hour >= 0) || !std::isfinite(o.price_per_gpu_hour))
    throw Error("job.price_per_gpu_hour", "must be >= 0");
  if (!(o.planned_per_day >= 0) || !std::isfinite(o.planned_per_day))
    throw Error("job.planned_per_day", "must be >= 0");
}

TimeToTrain time_to_train(const Model& model, const Cluster& cluster, const Plan& plan,
                          const StepFigures& step, const Profile& profile, const JobOptions& o) {
  PARASOL_CHECK(step.step_s > 0, "step time " + std::to_string(step.step_s) + " s");
  validate_job_options(o);
  TimeToTrain t;
  t.tokens = o.tokens;
  t.price_per_gpu_hour = o.price_per_gpu_hour;
  t.planned_per_day = o.planned_per_day;
  const double tokens_per_step = static_cast<double>(plan.global_batch) * plan.seq(model);
  t.steps = std::ceil(o.tokens / tokens_per_step);
  t.step_s = step.step_s;
  t.straggler_cv = o.stragglers_included ? 0 : profile.gpu_speed_cv;
  t.expected_step_s =
      expected_step_time_s(step.step_s, step.compute_s, t.straggler_cv, cluster.num_gpus());

  // Checkpoints: bytes from the plan, through the cluster's storage.
  t.checkpoint = checkpoint_size(model, plan);
  t.storage_bw = storage_bandwidth(cluster);
  t.checkpoint_write_s = checkpoint_transfer_s(t.checkpoint, t.storage_bw);
  t.checkpoint_read_s = t.checkpoint_write_s;
  t.restart_s = restart_time_s(cluster) + t.checkpoint_read_s;

  // Interruptions from the cluster's components.
  t.reliability = o.reliability ? *o.reliability : job_reliability(cluster, o.failure_rates);
  const double mtbi = t.reliability.mtbi_s;
  t.young_interval_s = young_interval_s(t.checkpoint_write_s, mtbi);
  t.daly_interval_s = daly_interval_s(t.checkpoint_write_s, mtbi);
  t.interval_given = o.checkpoint_interval_s > 0;
  const double wanted = t.interval_given ? o.checkpoint_interval_s : t.daly_interval_s;
  // A checkpoint falls between steps: the interval is a whole number of steps (at least one).
  t.interval_steps = std::isfinite(wanted)
                         ? std::clamp(std::round(wanted / t.expected_step_s), 1.0, t.steps)
                         : t.steps;
  t.interval_s = t.interval_steps * t.expected_step_s;
  const double planned_per_s = o.planned_per_day / 86400;
  if (planned_per_s * (t.restart_s + t.checkpoint_write_s) >= 1)
    throw Error("job.planned_per_day", "planned stops leave no time to train");
  t.goodput = job_goodput(t.steps * t.expected_step_s, t.interval_s, t.checkpoint_write_s,
                          t.restart_s, mtbi, planned_per_s);
  t.time_s = t.goodput.total();
  const double gpus = cluster.num_gpus();
  t.gpu_hours = gpus * t.time_s / 3600;
  t.cost = t.gpu_hours * o.price_per_gpu_hour;

  // Energy: steps (kept or lost) at the step's compute share, checkpoints and restarts idle.
  t.power = o.power ? *o.power : default_power(cluster);
  const Goodput& g = t.goodput;
  const double switches = t.reliability.count[static_cast<int>(Component::kSwitch)];
  t.energy_j =
      facility_energy_j(gpus, switches, t.power, busy_fraction(step.compute_s, t.expected_step_s),
                        g.productive + g.lost_work, g.checkpoint + g.restart + g.planned_restart);
  return t;
}

Json time_to_train_to_json(const TimeToTrain& t) {
  const Goodput& g = t.goodput;
  Json j = {{"tokens", t.tokens},
            {"steps", t.steps},
            {"step_time_s", t.step_s},
            {"expected_step_time_s", t.expected_step_s},
            {"straggler_cv", t.straggler_cv},
            {"time_to_train_s", t.time_s},
            {"time_to_train_days", t.time_s / 86400},
            {"gpu_hours", t.gpu_hours},
            {"energy_MWh", t.energy_j / 3.6e9},
            {"goodput", g.fraction()},
            {"breakdown_s",
             {{"productive", g.productive},
              {"checkpoint", g.checkpoint},
              {"lost_work", g.lost_work},
              {"restart", g.restart},
              {"planned_restart", g.planned_restart}}},
            {"interruptions", g.interruptions},
            {"planned_stops", g.planned},
            {"restart_s", t.restart_s},
            {"planned_per_day", t.planned_per_day},
            {"checkpoint",
             {{"size", checkpoint_size_to_json(t.checkpoint)},
              {"storage_GBps", t.storage_bw / 1e9},
              {"write_s", t.checkpoint_write_s},
              {"read_s", t.checkpoint_read_s},
              {"young_interval_s", t.young_interval_s},
              {"daly_interval_s", t.daly_interval_s},
              {"interval_s", t.interval_s},
              {"interval_steps", t.interval_steps},
              {"interval_source", t.interval_given ? "given" : "daly"}}},
            {"reliability", job_reliability_to_json(t.reliability)},
            {"power", power_figures_to_json(t.power)}};
  if (t.price_per_gpu_hour > 0) {
    j["cost"] = t.cost;
    j["price_per_gpu_hour"] = t.price_per_gpu_hour;
  }
  return j;
}

}  // namespace parasol::cost
