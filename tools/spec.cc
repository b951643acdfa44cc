// Loading of the command line's model, cluster, plan and profile.
#include "tools/spec.h"

#include "core/error.h"

namespace parasol::tools {

void add_target_flags(CLI::App* cmd, SpecOptions& o) {
  cmd->add_option("--model", o.model, "model: preset name, parasol JSON or HF config.json")
      ->capture_default_str();
  cmd->add_option("--cluster", o.cluster, "cluster: preset name or cluster JSON")
      ->capture_default_str();
  cmd->add_option("--gpus", o.gpus, "GPU count (with a cluster preset)");
}

void add_plan_flags(CLI::App* cmd, SpecOptions& o) {
  cmd->add_option("--plan", o.plan_file, "plan JSON file (flags below override its fields)");
  cmd->add_option("--tp", o.tp, "tensor-parallel degree");
  cmd->add_option("--pp", o.pp, "pipeline-parallel degree");
  cmd->add_option("--dp", o.dp, "data-parallel degree (default: GPUs / (tp x pp x cp))");
  cmd->add_option("--cp", o.cp, "context-parallel degree");
  cmd->add_option("--ep", o.ep, "expert-parallel degree (divides dp)");
  cmd->add_option("--sp", o.sp, "sequence parallelism (true|false)");
  cmd->add_option("--vpp", o.vpp, "virtual pipeline stages per rank (interleaved)");
  cmd->add_option("--zero", o.zero, "ZeRO stage 0-3");
  cmd->add_option("--mbs", o.mbs, "micro-batch size (sequences)");
  cmd->add_option("--gbs", o.gbs, "global batch size (sequences)");
  cmd->add_option("--seq", o.seq, "sequence length (default: the model's)");
  cmd->add_option("--schedule", o.schedule, "gpipe|1f1b|interleaved");
  cmd->add_option("--recompute", o.recompute, "none|selective|full");
  cmd->add_option("--recompute-layers", o.recompute_layers,
                  "full recompute of the first k layers per stage");
  cmd->add_option("--offload", o.offload, "none or a comma list of optimizer,params,activations");
  cmd->add_option("--precision", o.precision, "fp32|bf16|fp16|fp8");
  cmd->add_option("--flash-attention", o.flash, "fused attention (true|false)");
  cmd->add_option("--rank-order", o.rank_order, "e.g. tp-cp-ep-dp-pp (first varies fastest)");
}

void add_profile_flag(CLI::App* cmd, SpecOptions& o) {
  cmd->add_option("--profile", o.profile_file, "calibrated profile JSON (default: the device's)");
}

Spec load_spec(const SpecOptions& o, CLI::App* cmd, bool need_plan) {
  Spec s;
  Plan plan;
  std::string model_ref = o.model, cluster_ref = o.cluster;
  int gpus = o.gpus;
  if (!o.plan_file.empty()) {
    plan = plan_from_json(read_json_file(o.plan_file), "plan");
    if (cmd->count("--model") == 0 && !plan.model_ref.empty()) model_ref = plan.model_ref;
    if (cmd->count("--cluster") == 0 && !plan.cluster_ref.empty()) cluster_ref = plan.cluster_ref;
    if (cmd->count("--gpus") == 0 && plan.gpus_ref > 0) gpus = plan.gpus_ref;
  }
  s.model = load_model(model_ref);
  if (gpus == 0 && need_plan && o.plan_file.empty()) {
    // No GPU count: the plan's degrees decide it.
    int64_t n = int64_t{o.tp.value_or(1)} * o.pp.value_or(1) * o.cp.value_or(1) * o.dp.value_or(1);
    gpus = static_cast<int>(n);
  }
  if (gpus == 0 && !o.plan_file.empty()) gpus = plan.gpus();
  s.cluster = std::make_unique<Cluster>(load_cluster(cluster_ref, gpus));
  if (o.tp) plan.tp = *o.tp;
  if (o.pp) plan.pp = *o.pp;
  if (o.cp) plan.cp = *o.cp;
  if (o.ep) plan.ep = *o.ep;
  if (o.sp) plan.sequence_parallel = *o.sp;
  if (o.vpp) {
    plan.vpp = *o.vpp;
    if (plan.vpp > 1 && !o.schedule) plan.schedule = Schedule::kInterleaved;
  }
  if (o.zero) plan.zero = *o.zero;
  if (o.mbs) plan.micro_batch = *o.mbs;
  if (o.seq) plan.seq_len = *o.seq;
  if (o.schedule) plan.schedule = parse_schedule(*o.schedule, "plan.schedule");
  if (o.recompute) plan.recompute = parse_recompute(*o.recompute, "plan.recompute");
  if (o.recompute_layers) plan.recompute_layers = *o.recompute_layers;
  if (o.offload) plan.offload = parse_offload(*o.offload, "plan.offload");
  if (o.precision) plan.precision = parse_dtype(*o.precision, "plan.precision");
  if (o.flash) plan.flash_attention = *o.flash;
  if (o.rank_order) plan.rank_order = parse_rank_order(*o.rank_order, "plan.rank_order");
  for (auto [v, name] : {std::pair{o.tp, "plan.tp"},
                         {o.pp, "plan.pp"},
                         {o.cp, "plan.cp"},
                         {o.ep, "plan.ep"},
                         {o.vpp, "plan.vpp"},
                         {o.mbs, "plan.mbs"},
                         {o.gbs, "plan.gbs"},
                         {o.dp, "plan.dp"}})
    if (v && *v < 1) throw Error(name, std::to_string(*v) + " must be >= 1");
  if (o.zero && (*o.zero < 0 || *o.zero > 3)) throw Error("plan.zero", "must be 0, 1, 2 or 3");
  if (o.dp) {
    plan.dp = *o.dp;
  } else if (o.plan_file.empty() || o.tp || o.pp || o.cp) {
    int64_t rest = int64_t{plan.tp} * plan.pp * plan.cp;
    int n = s.cluster->num_gpus();
    if (n % rest != 0) {
      const char* field = n % plan.tp ? "plan.tp" : n % (plan.tp * plan.pp) ? "plan.pp" : "plan.cp";
      throw Error(field, "tp x pp x cp = " + std::to_string(rest) + " does not divide the " +
                             std::to_string(n) + " GPUs");
    }
    plan.dp = static_cast<int>(n / rest);
  }
  if (o.gbs)
    plan.global_batch = *o.gbs;
  else if (o.plan_file.empty())
    plan.global_batch = plan.dp * plan.micro_batch;
  plan.model_ref = model_ref;
  plan.cluster_ref = cluster_ref;
  plan.gpus_ref = s.cluster->num_gpus();
  s.plan = plan;
  const DeviceSpec& dev = s.cluster->gpu_device(0);
  s.profile =
      o.profile_file.empty() ? cost::default_profile(dev) : cost::load_profile(o.profile_file, dev);
  // A profile of measured figures (the host CPU's, `parasol calibrate --probe`) replaces the
  // device's datasheet for this cluster.
  if (s.profile.measured_device) s.cluster->set_device_spec(*s.profile.measured_device);
  return s;
}

}  // namespace parasol::tools
