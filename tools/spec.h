// The command line's shared inputs: --model/--cluster/--gpus, the plan flags (or --plan FILE)
// and --profile, turned into a Model, a Cluster, a Plan and a Profile.
#pragma once

#include <CLI/CLI.hpp>
#include <memory>
#include <optional>
#include <string>

#include "core/cluster.h"
#include "core/model.h"
#include "core/plan.h"
#include "cost_models/profile.h"

namespace parasol::tools {

struct SpecOptions {
  std::string model = "gpt3-175b";
  std::string cluster = "dgx-a100-80g";
  int gpus = 0;
  std::string plan_file;
  std::string profile_file;
  // Plan flags (unset = plan default or plan file value).
  std::optional<int> tp, pp, dp, cp, ep, vpp, zero, mbs, gbs, recompute_layers;
  std::optional<int64_t> seq;
  std::optional<bool> sp, flash;
  std::optional<std::string> schedule, recompute, offload, precision, rank_order;
};

// Adds --model --cluster --gpus to `cmd`.
void add_target_flags(CLI::App* cmd, SpecOptions& o);
// Adds the plan flags (--tp --pp --dp --cp --ep --sp --vpp --zero --mbs --gbs --seq --schedule
// --recompute --recompute-layers --offload --precision --flash-attention --rank-order --plan).
void add_plan_flags(CLI::App* cmd, SpecOptions& o);
void add_profile_flag(CLI::App* cmd, SpecOptions& o);

struct Spec {
  Model model;
  std::unique_ptr<Cluster> cluster;
  Plan plan;
  cost::Profile profile;
};

// Loads everything; a plan file's "model"/"cluster"/"gpus" fill in flags that were not given.
// When dp is not given it is derived from the GPU count. A profile with a measured device
// (Profile::measured_device) sets it on the cluster. Throws parasol::Error.
Spec load_spec(const SpecOptions& o, CLI::App* cmd, bool need_plan);

}  // namespace parasol::tools
