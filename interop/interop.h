// What an export to another framework writes and what an import from one reads back: the types
// shared by the per-framework writers and readers (interop/megatron.h, deepspeed.h,
// torchtitan.h). interop/ is floor 2: it needs only core/.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "core/cluster.h"
#include "core/json_reader.h"
#include "core/model.h"
#include "core/plan.h"

namespace parasol::interop {

// One file of an export: its name (relative to the output folder), its text, and whether it is
// a script to run (written with the executable bit).
struct ExportedFile {
  std::string name;
  std::string text;
  bool executable = false;
};

// An export: the framework, the release its flags and keys were checked against, its files.
struct Export {
  std::string framework;  // "megatron", "deepspeed", "torchtitan"
  std::string version;    // e.g. "Megatron-Core 0.14 (NVIDIA/Megatron-LM d98e8a6)"
  std::vector<ExportedFile> files;
};

// A job read from another framework's launch arguments or config.
struct ImportedJob {
  std::optional<Model> model;  // when the input gives the model's shape (Megatron's arguments)
  Json plan;                   // a plan JSON object, as plan_from_json reads it
  int gpus = 0;                // the job's GPU count when the input gives it; 0 = not known
};

// How a job of `gpus` GPUs is launched on `cluster`'s servers: `nodes` launches of `per_node`
// processes (torchrun's --nnodes and --nproc_per_node, DeepSpeed's --num_nodes and --num_gpus).
struct ServerLayout {
  int nodes = 1;
  int per_node = 1;
};
// Throws parasol::Error (field "plan") when the GPUs do not fill whole servers: a launcher starts
// the same number of processes on every node.
ServerLayout server_layout(const Cluster& cluster, int gpus);

// The frameworks parasol exports to, by name: "megatron", "deepspeed", "torchtitan".
const std::vector<std::string>& framework_names();

// export_megatron, export_deepspeed or export_torchtitan by name (interop/megatron.h,
// deepspeed.h, torchtitan.h). Throws parasol::Error naming `field` when `framework` is not one of
// framework_names(), and the export's own errors (a plan the framework cannot run).
Export export_plan(const std::string& framework, const Model& model, const Cluster& cluster,
                   const Plan& plan, const std::string& field = "export.framework");

// Whether `framework` can run `plan` (its export succeeds). For the search (search --framework):
// called on the plans that would enter its lists. REQUIRES: a name of framework_names().
bool can_export(const std::string& framework, const Model& model, const Cluster& cluster,
                const Plan& plan);

}  // namespace parasol::interop
