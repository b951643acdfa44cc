// `parasol simulate`: lowers a plan into per-stage Programs and plays them with the
// discrete-event engine; prints the predicted step time and where it went, and optionally
// writes the predicted timeline as a Chrome trace (Perfetto).
#include <chrono>
#include <iostream>

#include "core/lower.h"
#include "cost_models/estimate.h"
#include "sim/engine.h"
#include "tools/commands.h"
#include "tools/format.h"
#include "tools/spec.h"
#include "traces/trace.h"

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
  line("pipeline bubble / idle", b.bubble);
}

}  // namespace

Runner add_simulate(CLI::App& app) {
  auto* cmd = app.add_subcommand("simulate", "play the lowered plan with the event simulator");
  auto o = std::make_shared<SpecOptions>();
  auto json = std::make_shared<bool>(false);
  auto trace = std::make_shared<std::string>();
  add_target_flags(cmd, *o);
  add_plan_flags(cmd, *o);
  add_profile_flag(cmd, *o);
  cmd->add_option("--trace", *trace,
                  "write the predicted timeline as Chrome trace JSON (Perfetto)");
  cmd->add_flag("--json", *json, "print JSON");
  return [=]() {
    Spec s = load_spec(*o, cmd, true);
    validate(s.plan, s.model, *s.cluster);
    using clock = std::chrono::steady_clock;
    auto t0 = clock::now();
    LoweredPlan lowered = lower(s.model, *s.cluster, s.plan);
    auto t1 = clock::now();
    sim::SimResult r = sim::simulate(s.model, *s.cluster, lowered, s.profile, !trace->empty());
    auto t2 = clock::now();
    const double lower_s = std::chrono::duration<double>(t1 - t0).count();
    const double sim_s = std::chrono::duration<double>(t2 - t1).count();
    if (!trace->empty()) traces::write_trace_file(r.trace, *trace);
    const double est = cost::estimate(s.model, *s.cluster, s.plan, s.profile).step_time_s;
    if (*json) {
      Json j = sim::sim_result_to_json(r);
      j["estimate_step_time_s"] = est;
      j["lower_wall_s"] = lower_s;
      j["simulate_wall_s"] = sim_s;
      j["plan"] = plan_to_json(s.plan);
      if (!trace->empty()) j["trace"] = *trace;
      std::cout << j.dump(1) << "\n";
      return 0;
    }
    std::cout << "simulated step time " << secs(r.step_time_s) << " (closed-form estimate "
              << secs(est) << ", " << fmt("%+.1f%%", 100 * (r.step_time_s / est - 1)) << ")\n";
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
    if (r.peak_memory_per_stage.empty()) {
      std::cout << "peak memory per stage: not available (buffer liveness pass pending)\n";
    } else {
      std::cout << "peak memory per stage:";
      for (double m : r.peak_memory_per_stage) std::cout << " " << gib(m);
      std::cout << "\n";
    }
    if (!trace->empty()) std::cout << "trace written to " << *trace << "\n";
    return 0;
  };
}

}  // namespace parasol::tools
