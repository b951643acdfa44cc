// torchtitan: a plan as the job-config TOML of a named torchtitan release and its launch line.
#pragma once

#include <vector>

#include "core/cluster.h"
#include "core/model.h"
#include "core/plan.h"
#include "interop/interop.h"

namespace parasol::interop {

// The release whose job-config keys the writer uses (named in Export.version and in the TOML).
extern const char* const kTorchtitanVersion;

// The job config and launch line of `plan` for `model` on `cluster`. Throws parasol::Error
// naming the plan field torchtitan cannot express (for example plan.zero 1). Files:
// torchtitan.toml and launch_torchtitan.sh (executable: run_train.sh on one server, a torchrun
// line to run on every server otherwise).
Export export_torchtitan(const Model& model, const Cluster& cluster, const Plan& plan);

// torchtitan's split of `layers` transformer layers over `stages` (virtual) pipeline stages
// with pipeline_parallel_first/last_stage_less_layers = `first_less`, `last_less`
// (generate_llm_fqn_per_model_part, torchtitan/distributed/pipeline_parallel.py at v0.2.2):
// layers per stage in stage order, or empty where torchtitan raises an error.
std::vector<int> torchtitan_stage_split(int layers, int stages, int first_less, int last_less);

}  // namespace parasol::interop
