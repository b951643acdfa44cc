// What an export to another framework writes and what an import from one reads back: the types
// shared by the per-framework writers and readers (interop/megatron.h, deepspeed.h,
// torchtitan.h). interop/ is floor 2: it needs only core/.
#pragma once

#include <optional>
#include <string>
#include <utility>
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
  // A plan JSON object, as plan_from_json reads it. It may name the job's model preset ("model")
  // and cluster preset ("cluster") when the input says them (parasol's export tag, torchtitan's
  // model flavor): `--model` and `--cluster` still override them.
  Json plan;
  int gpus = 0;  // the job's GPU count when the input gives it; 0 = not known
};

// The reasons a framework refuses a plan, collected so that an export (and the search's
// framework filter) names all of them at once instead of the first.
class Refusals {
 public:
  void add(std::string field, std::string reason);
  bool empty() const { return items_.empty(); }
  const std::vector<std::pair<std::string, std::string>>& items() const { return items_; }
  // Throws parasol::Error (a user error: exit 2) when there is any refusal. One refusal: its
  // field and reason. Several: the fields joined by ", " (each once, in order) and the reason
  // "N reasons: <field>: <reason>; <field>: <reason>; ...".
  void raise() const;

 private:
  std::vector<std::pair<std::string, std::string>> items_;
};

// The tag line each export writes into its launch files, "# parasol-export: model=<name>
// cluster=<name> gpus=<n>", so that an import of those files knows the job's target (a name
// with a space or '=' is left out), and its reader: the tag of `text`, or nullopt.
struct ExportTag {
  std::string model;    // "" = not given
  std::string cluster;  // "" = not given
  int gpus = 0;         // 0 = not given
};
std::string export_tag_line(const Model& model, const Cluster& cluster, int gpus);
std::optional<ExportTag> read_export_tag(const std::string& text);

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

// Whether `framework` can run `plan` (its export succeeds). This is the framework filter of
// `parasol search --framework` and `report --framework` (tools/api.cc passes it to the search
// as SearchOptions::accept): called on the plans that would enter its lists. REQUIRES: a name
// of framework_names().
bool can_export(const std::string& framework, const Model& model, const Cluster& cluster,
                const Plan& plan);

// Whether `framework` runs torchtitan's op-level selective recompute (Recompute::kSelectiveOp):
// torchtitan does (selective_ac_option "op"); Megatron's and DeepSpeed's exports refuse it. The
// search enumerates it only for a framework that runs it (sim::SearchOptions::selective_op).
// REQUIRES: a name of framework_names().
bool runs_selective_op(const std::string& framework);

// Whose tensor-parallel layers `framework` runs (Plan::tp_impl, read at tp > 1): PyTorch's DTensor
// TP for torchtitan (models/llama3/infra/parallelize.py apply_tp), Megatron's for Megatron-LM and
// for Megatron-DeepSpeed. Each export refuses a tp > 1 plan with the other; the search enumerates
// its tp > 1 plans with this one for `search --framework F` (sim::SearchOptions::tp_impl).
// REQUIRES: a name of framework_names().
TpImpl framework_tp_impl(const std::string& framework);

// Whose context parallelism `framework` runs (Plan::cp_impl, read at cp > 1): PyTorch's
// context_parallel for torchtitan, Transformer Engine's for Megatron-LM (DeepSpeed's Ulysses is
// cp_comm_type a2a of the same). The torchtitan export refuses cp_impl te and Megatron-LM's cp_impl
// torch; the search enumerates its cp > 1 plans with this one for `search --framework F`
// (sim::SearchOptions::cp_impl). REQUIRES: a name of framework_names().
CpImpl framework_cp_impl(const std::string& framework);

// Every reason `framework` refuses `plan` (field, reason), empty when it runs it; a plan parasol
// itself rejects gives that one error. REQUIRES: a name of framework_names().
std::vector<std::pair<std::string, std::string>> export_refusals(const std::string& framework,
                                                                 const Model& model,
                                                                 const Cluster& cluster,
                                                                 const Plan& plan);

// What an import knows besides the file (the command line's flags).
struct ImportOptions {
  int gpus = 0;                // --gpus; 0 = not given
  std::string model;           // --model (a preset name or a path); "" = not given
  bool cluster_given = false;  // --cluster was given
  // --tp, --pp and --sp: the Megatron-DeepSpeed arguments of a bare ds_config.json.
  int tp = 1;
  int pp = 1;
  bool sequence_parallel = false;
};

// Reads `text`, the content of the file at `path` given as `--plan`, when it is another
// framework's job: Megatron-LM arguments or launch script (import_megatron), a DeepSpeed
// launch_deepspeed.sh (Megatron-DeepSpeed's arguments or a plain DeepSpeed launcher, with the
// ds_config.json it names, read from the script's folder), a ds_config.json (import_deepspeed;
// tp, pp, sp and the GPU count from the launch_deepspeed.sh beside it when that names it, else
// from `options`), or a torchtitan job TOML (import_torchtitan). Returns nullopt for anything
// else (a parasol plan JSON: the caller parses it). The cluster comes from the file's export
// tag (read_export_tag) when it names a cluster preset.
// Throws parasol::Error naming what is missing or unreadable: "--model" for a DeepSpeed config
// or torchtitan flavor that does not give the model when options.model is empty,
// "--cluster" when neither the file nor the options give the cluster, "--gpus" when the GPU
// count is needed and not known, "--plan" for a TOML file that is not a torchtitan job config,
// and the importers' own fields.
std::optional<ImportedJob> import_file(const std::string& path, const std::string& text,
                                       const ImportOptions& options);

}  // namespace parasol::interop
