// `parasol simulate`: lowers a plan into per-stage Programs and plays them with the
// discrete-event engine; prints the predicted step time and where it went, and optionally
// writes the predicted timeline as a Chrome trace (Perfetto). The step time carries its error
// band (cost_models/error_bands.h). With straggler flags it plays sampled steps with slow ranks
// and prints the step-time distribution (sim/stragglers.h); with --tokens, the time to train.
#include <algorithm>
#include <iostream>
#include <optional>

#include "core/format.h"
#include "cost_models/error_bands.h"
#include "cost_models/estimate.h"
#include "cost_models/time_to_train.h"
#include "sim/engine.h"
#include "sim/stragglers.h"
#include "tools/api.h"
#include "tools/commands.h"
#include "tools/flag_checks.h"
#include "tools/job_flags.h"
#include "tools/spec.h"

namespace parasol::tools {

namespace {

void print_breakdown(const sim::SimBreakdown& b, double step) {
  auto line = [&](const std::string& name, double v) {
    if (v > 0) std::cout << "  " << name << ": " << secs(v) << " (" << pct(v / step) << ")\n";
  };
  for (int p = 0; p < 4; ++p)
    line(std::string("compute ") + phase_name(static_cast<Phase>(p)), b.compute_by_phase[p]);
  for (int g = 0; g < sim::kGroupCount; ++g)
    line(std::string("exposed ") + group_name(static_cast<Group>(g)) + " comm", b.exposed_comm[g]);
  line("exposed offload", b.exposed_offload);
  line("host-bound", b.host);
  line("pipeline bubble / idle", b.bubble);
}

// "error band 5.30 s - 6.35 s (± 9%: the largest rms error of the accuracy suites it draws on:
// h100-dense)".
}  // namespace

Runner add_simulate(CLI::App& app) {
  auto* cmd = app.add_subcommand("simulate", "play the lowered plan with the event simulator");
  auto o = std::make_shared<SpecOptions>();
  auto json = std::make_shared<bool>(false);
  auto trace = std::make_shared<std::string>();
  auto job = std::make_shared<JobFlags>();
  auto strag = std::make_shared<sim::StragglerOptions>();
  auto samples = std::make_shared<int>(0);
  add_target_flags(cmd, *o);
  add_plan_flags(cmd, *o);
  add_profile_flag(cmd, *o);
  add_job_flags(cmd, *job);
  cmd->add_option("--trace", *trace,
                  "write the predicted timeline as Chrome trace JSON (Perfetto)");
  cmd->add_option("--slow-rank", strag->slow_rank, "a straggler: this rank's compute is slower")
      ->check(count_in(0));
  cmd->add_option("--slow-factor", strag->slow_factor,
                  "with --slow-rank: its compute takes this many times longer (default 1)")
      ->check(finite_number(true));
  cmd->add_option("--rank-cv", strag->cv,
                  "stragglers drawn per rank and step: compute x (1 + CV z), z standard normal")
      ->check(finite_number(false) & CLI::Range(0.0, 1.0));
  cmd->add_option("--samples", *samples,
                  "steps sampled with stragglers (default: 100 with --rank-cv, else 1)")
      ->check(count_in(1, 1 << 20));
  cmd->add_option("--seed", strag->seed, "seed of the straggler draws (default 1)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_flag("--json", *json, "print JSON");
  return [=]() {
    Spec s = load_spec(*o, cmd, true);
    const SimulateSettings settings{*trace, *strag, *samples, *job};
    const SimulateRun run = run_simulate(s, settings);
    if (*json) {
      std::cout << simulate_document(s, settings, run).dump(1) << "\n";
      return 0;
    }
    const sim::SimResult& r = run.result;
    const cost::Estimate& e = run.estimate;
    const double est = e.step_time_s;
    const cost::ErrorBand& band = run.band;
    const double lower_s = run.lower_wall_s, sim_s = run.simulate_wall_s;
    const std::optional<sim::StepDistribution>& dist = run.stragglers;
    const std::optional<cost::TimeToTrain>& ttt = run.job;
    std::cout << "simulated step time " << secs(r.step_time_s) << " " << cost::band_label(band)
              << " (closed-form estimate " << secs(est) << ", "
              << fmt("%+.1f%%", 100 * (r.step_time_s / est - 1)) << ")\n";
    std::cout << cost::band_line(band, r.step_time_s) << "\n";
    std::cout << count(static_cast<double>(r.ops_simulated)) << " ops on " << s.plan.pp
              << " representative ranks; lowered in " << secs(lower_s) << ", simulated in "
              << secs(sim_s) << "\n";
    std::cout << "time breakdown of stage " << r.critical_stage << " (rank "
              << r.stage_rank[r.critical_stage] << ", the busiest):\n";
    print_breakdown(r.breakdown, r.step_time_s);
    if (s.plan.pp > 1) {
      std::cout << "per stage (compute / exposed comm / bubble):\n";
      for (size_t st = 0; st < r.stage_breakdown.size(); ++st) {
        const sim::SimBreakdown& b = r.stage_breakdown[st];
        std::cout << "  stage " << st << ": " << secs(b.compute) << " / "
                  << secs(b.exposed_comm_total()) << " / " << secs(b.bubble) << "\n";
      }
    }
    if (r.memory_per_stage.empty()) {
      std::cout << "peak memory per stage: not available (buffer liveness pass pending)\n";
    } else {
      const cost::FrameworkMemory& peak = r.memory_per_stage[r.peak_stage];
      std::cout << "memory per GPU " << gib(peak.device_used()) << " of "
                << gib(s.cluster->gpu_device(0).hbm_bytes) << " ("
                << memory_fit_verdict(peak,
                                      cost::memory_fit(peak, s.cluster->gpu_device(0).hbm_bytes),
                                      s.cluster->gpu_device(0).hbm_bytes)
                << "), the liveness of each stage's Program:\n";
      print_framework_memory(peak, r.peak_stage, r.peak_rank);
      print_stage_memory(r.memory_per_stage, r.peak_stage);
    }
    std::cout << "host memory per server (closed form) " << gib(e.host_memory_per_server_bytes)
              << " of " << gib(e.host_memory_capacity_bytes) << " pinnable"
              << (e.host_memory_per_server_bytes <= e.host_memory_capacity_bytes
                      ? " (fits)"
                      : " (DOES NOT FIT)")
              << "\n";
    if (!trace->empty()) std::cout << "trace written to " << *trace << "\n";
    if (dist) {
      std::cout << "stragglers";
      if (strag->slow_rank >= 0)
        std::cout << " (rank " << strag->slow_rank << " x" << fmt("%.2f", strag->slow_factor)
                  << ", stage " << dist->slow_stage << ")";
      if (strag->cv > 0) std::cout << " (per-rank cv " << pct(strag->cv) << ")";
      std::cout << ": " << dist->step_s.size() << " sampled steps, mean " << secs(dist->mean_s)
                << " (" << fmt("%+.1f%%", 100 * (dist->mean_s / dist->base_step_s - 1)) << "), p50 "
                << secs(dist->p50_s) << ", p90 " << secs(dist->p90_s) << ", p99 "
                << secs(dist->p99_s) << ", min " << secs(dist->min_s) << ", max "
                << secs(dist->max_s) << "\n";
    }
    if (ttt) print_time_to_train(*ttt);
    return 0;
  };
}

}  // namespace parasol::tools
