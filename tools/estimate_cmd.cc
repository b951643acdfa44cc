// `parasol estimate`: the closed-form prediction of one plan with its breakdowns and its error
// band (cost_models/error_bands.h), and with --tokens the time to train them
// (cost_models/time_to_train.h).
#include <algorithm>
#include <iostream>
#include <optional>

#include "core/format.h"
#include "cost_models/error_bands.h"
#include "cost_models/estimate.h"
#include "cost_models/time_to_train.h"
#include "tools/api.h"
#include "tools/commands.h"
#include "tools/job_flags.h"
#include "tools/spec.h"

namespace parasol::tools {

// "as the framework measures it (stage 1, rank 8): allocated 61.2 GiB, reserved 66.0 GiB
// (61.4 - 70.6), outside the allocator 1.3 GiB (CUDA context 0.5, NCCL 0.8)".
void print_framework_memory(const cost::FrameworkMemory& f, int stage, int rank) {
  std::cout << "as the framework measures it";
  if (stage >= 0) std::cout << " (stage " << stage << ", rank " << rank << ")";
  std::cout << ": allocated " << gib(f.allocated) << ", reserved " << gib(f.reserved) << " ("
            << fmt("%.1f", f.reserved_low / (1024.0 * 1024 * 1024)) << " - " << gib(f.reserved_high)
            << "), outside the allocator " << gib(f.outside) << " (CUDA context "
            << gib(f.cuda_context) << ", NCCL " << gib(f.nccl) << ")\n";
}

std::string memory_fit_verdict(const cost::FrameworkMemory& f, cost::MemoryFit fit,
                               double device_bytes) {
  if (fit == cost::MemoryFit::kNotByAllocated) return "DOES NOT FIT";
  if (f.device_used() > device_bytes)
    return "DOES NOT FIT by the reserved figure: allocated " + gib(f.allocated) +
           " with what is outside the allocator fits, reserved " + gib(f.reserved) + " does not";
  if (fit == cost::MemoryFit::kNotByReserved)
    return "fits; not with reserved at the top of its band, " + gib(f.reserved_high) +
           ": the search drops it";
  return "fits";
}

// "peak per stage (one rank each, as nvidia-smi shows it): 70.1 71.2* 69.0 GiB (* the largest)".
void print_stage_memory(const std::vector<cost::FrameworkMemory>& stages, int peak) {
  if (stages.size() <= 1) return;
  std::cout << "peak per stage (one rank each; allocated / reserved / as nvidia-smi shows it):\n";
  for (size_t s = 0; s < stages.size(); ++s)
    std::cout << "  stage " << s << ": " << gib(stages[s].allocated) << " / "
              << gib(stages[s].reserved) << " / " << gib(stages[s].device_used())
              << (static_cast<int>(s) == peak ? "  (the largest)" : "") << "\n";
}

namespace {
// "error band 5.30 s - 6.35 s (± 9%: the largest rms error of the accuracy suites it draws on:
// h100-dense)".
}  // namespace

void print_estimate(const cost::Estimate& e, const cost::ErrorBand& band) {
  const cost::TimeBreakdown& t = e.time;
  std::cout << "step time " << secs(e.step_time_s) << " " << cost::band_label(band) << ", "
            << count(e.tokens_per_s) << " tokens/s, " << fmt("%.2f", e.samples_per_s)
            << " samples/s, MFU " << pct(e.mfu) << ", HFU " << pct(e.hfu) << "\n";
  std::cout << cost::band_line(band, e.step_time_s) << "\n";
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
                         {"offload", t.offload},
                         {"overlap slowdown", t.overlap},
                         {"host-bound", t.host}})
    if (v > 0)
      std::cout << "  " << name << ": " << secs(v) << " (" << pct(v / e.step_time_s) << ")\n";
  const cost::MoeParts& moe = e.moe;
  if (moe.expert_gemm > 0) {
    std::cout << "MoE compute (within forward, backward and recompute):\n";
    for (auto [name, v] : {std::pair{"expert GEMMs", moe.expert_gemm},
                           {"permutation", moe.permutation},
                           {"routing", moe.routing},
                           {"expert activation", moe.activation},
                           {"expert bias loop", moe.expert_bias},
                           {"of which imbalance", moe.imbalance}})
      std::cout << "  " << name << ": " << secs(v) << " (" << pct(v / e.step_time_s) << ")\n";
  }
  const cost::MemoryBreakdown& m = e.memory;
  std::cout << "memory per GPU " << gib(e.memory_per_gpu_bytes) << " of "
            << gib(e.device_memory_bytes) << " ("
            << memory_fit_verdict(e.framework, e.memory_fit, e.device_memory_bytes) << "):\n";
  for (auto [name, v] : {std::pair{"weights", m.weights},
                         {"gradients", m.gradients},
                         {"optimizer", m.optimizer},
                         {"activations", m.activations},
                         {"transient", m.transient},
                         {"buffers", m.buffers}})
    std::cout << "  " << name << ": " << gib(v) << "\n";
  if (m.host > 0) std::cout << "  offloaded to host: " << gib(m.host) << "\n";
  print_framework_memory(e.framework, e.peak_stage, e.peak_rank);
  print_stage_memory(e.stage_memory, e.peak_stage);
  std::cout << "host memory per server " << gib(e.host_memory_per_server_bytes) << " of "
            << gib(e.host_memory_capacity_bytes) << " pinnable"
            << (e.host_memory_per_server_bytes <= e.host_memory_capacity_bytes ? " (fits)"
                                                                               : " (DOES NOT FIT)")
            << "\n";
}

Runner add_estimate(CLI::App& app) {
  auto* cmd = app.add_subcommand("estimate", "predict step time, throughput and memory of a plan");
  auto o = std::make_shared<SpecOptions>();
  auto json = std::make_shared<bool>(false);
  auto job = std::make_shared<JobFlags>();
  add_target_flags(cmd, *o);
  add_plan_flags(cmd, *o);
  add_profile_flag(cmd, *o);
  add_job_flags(cmd, *job);
  cmd->add_flag("--json", *json, "print JSON");
  return [=]() {
    Spec s = load_spec(*o, cmd, true);
    const EstimateRun r = run_estimate(s, *job);
    if (*json) {
      std::cout << estimate_document(s, r).dump(1) << "\n";
    } else {
      print_estimate(r.estimate, r.band);
      if (r.job) print_time_to_train(*r.job);
    }
    return 0;
  };
}

}  // namespace parasol::tools
