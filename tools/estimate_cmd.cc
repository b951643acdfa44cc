// `parasol estimate`: the closed-form prediction of one plan with its breakdowns.
#include <iostream>

#include "cost_models/estimate.h"
#include "tools/commands.h"
#include "tools/format.h"
#include "tools/spec.h"

namespace parasol::tools {

void print_estimate(const cost::Estimate& e) {
  const cost::TimeBreakdown& t = e.time;
  std::cout << "step time " << secs(e.step_time_s) << ", " << count(e.tokens_per_s) << " tokens/s, "
            << fmt("%.2f", e.samples_per_s) << " samples/s, MFU " << pct(e.mfu) << ", HFU "
            << pct(e.hfu) << "\n";
  std::cout << "time breakdown:\n";
  for (auto [name, v] : {std::pair{"forward", t.forward},
                         {"backward", t.backward},
                         {"recompute", t.recompute},
                         {"tp/sp comm", t.tp_comm},
                         {"cp comm", t.cp_comm},
                         {"ep all-to-all", t.ep_comm},
                         {"pp send/recv", t.pp_comm},
                         {"pipeline bubble", t.bubble},
                         {"dp/zero comm", t.dp_comm},
                         {"optimizer", t.optimizer},
                         {"offload", t.offload}})
    if (v > 0)
      std::cout << "  " << name << ": " << secs(v) << " (" << pct(v / e.step_time_s) << ")\n";
  const cost::MemoryBreakdown& m = e.memory;
  std::cout << "memory per GPU " << gib(e.memory_per_gpu_bytes) << " of "
            << gib(e.device_memory_bytes) << (e.fits ? " (fits)" : " (DOES NOT FIT)") << ":\n";
  for (auto [name, v] : {std::pair{"weights", m.weights},
                         {"gradients", m.gradients},
                         {"optimizer", m.optimizer},
                         {"activations", m.activations},
                         {"transient", m.transient},
                         {"buffers", m.buffers}})
    std::cout << "  " << name << ": " << gib(v) << "\n";
  if (m.host > 0) std::cout << "  offloaded to host: " << gib(m.host) << "\n";
}

Runner add_estimate(CLI::App& app) {
  auto* cmd = app.add_subcommand("estimate", "predict step time, throughput and memory of a plan");
  auto o = std::make_shared<SpecOptions>();
  auto json = std::make_shared<bool>(false);
  add_target_flags(cmd, *o);
  add_plan_flags(cmd, *o);
  add_profile_flag(cmd, *o);
  cmd->add_flag("--json", *json, "print JSON");
  return [=]() {
    Spec s = load_spec(*o, cmd, true);
    validate(s.plan, s.model, *s.cluster);
    cost::Estimate e = cost::estimate(s.model, *s.cluster, s.plan, s.profile);
    if (*json) {
      Json j = cost::estimate_to_json(e);
      j["plan"] = plan_to_json(s.plan);
      std::cout << j.dump(1) << "\n";
    } else {
      print_estimate(e);
    }
    return 0;
  };
}

}  // namespace parasol::tools
