// torchtitan: a plan as the job-config TOML of a named torchtitan release and its launch line.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "core/cluster.h"
#include "core/model.h"
#include "core/plan.h"
#include "interop/interop.h"

namespace parasol::interop {

// The release whose job-config keys the writer uses (named in Export.version and in the TOML).
extern const char* const kTorchtitanVersion;

// The job config and launch line of `plan` for `model` on `cluster`. Throws parasol::Error
// naming the plan fields torchtitan cannot express (for example plan.zero 1), all of them at
// once. Files: torchtitan.toml and launch_torchtitan.sh (executable: run_train.sh on one server,
// a torchrun line to run on every server otherwise). [model] is the registered TrainSpec and
// flavor that describe `model` (torchtitan_model); for a model with none, the TrainSpec whose
// args can describe it (torchtitan_family), flavor = the model's name, and a comment naming the
// args entry to add.
Export export_torchtitan(const Model& model, const Cluster& cluster, const Plan& plan);

// Every reason torchtitan refuses `plan` on `cluster` (what export_torchtitan throws, all at
// once); empty when it runs it. A plan parasol rejects (validate) throws that error.
Refusals torchtitan_refusals(const Model& model, const Cluster& cluster, const Plan& plan);

// A model of torchtitan v0.2.2's registry: [model] name (a TrainSpec: a folder of
// torchtitan/models/), flavor (a key of its args dict) and the tokenizer folder.
struct TorchtitanModel {
  std::string name;
  std::string flavor;
  std::string hf_assets;
};
// The registered flavor with `model`'s shape (llama3 8B/70B/405B, qwen3 0.6B-32B, 30B-A3B,
// 235B-A22B, deepseek_v3 16B/236B/671B), or nullopt.
std::optional<TorchtitanModel> torchtitan_model(const Model& model);
// The TrainSpec that runs `model`: its flavor's, else the one whose args can describe it
// (deepseek_v3 for MLA, qwen3 for a head_dim other than hidden / heads, llama4 for MoE, else
// llama3).
std::string torchtitan_family(const Model& model);

// Whether `text` is TOML (a [table] or key = value line; not JSON), and whether it is a
// torchtitan job config (a [parallelism], [training] or [model] table).
bool looks_like_toml(const std::string& text);
bool looks_like_torchtitan_toml(const std::string& text);

// Parses the TOML subset job configs use (tables, dotted table names, key = string, integer,
// float, boolean or array values, comments) into a JSON object; `what` names the source in
// errors ("<what>: line N: ..."). Throws parasol::Error on anything else.
Json parse_toml(const std::string& text, const std::string& what);

// Reads a torchtitan v0.2.2 job config (export_torchtitan's, or a hand-written one) into a plan:
// the degrees ([parallelism]; data_parallel_shard_degree -1 takes the rest of `gpus`), FSDP
// (zero 3) whenever dp_shard or cp > 1 with HSDP's shard_degree and the reshard policy, the
// pipeline schedule and split (layers_per_stage, first/last_stage_less_layers), batches,
// precision, CPU offload, activation checkpointing (full or none) and compile. The model is
// the parasol preset of [model] name and flavor (the plan's "model"), else `model` (--model);
// with neither it is an Error naming torchtitan.model.flavor. Values parasol cannot express
// (selective activation checkpointing, other schedules, allgather context parallelism) are
// Errors naming the key ("torchtitan.activation_checkpoint.mode").
ImportedJob import_torchtitan(const std::string& text, int gpus = 0, const Model* model = nullptr);

// torchtitan's split of `layers` transformer layers over `stages` (virtual) pipeline stages
// with pipeline_parallel_first/last_stage_less_layers = `first_less`, `last_less`
// (generate_llm_fqn_per_model_part, torchtitan/distributed/pipeline_parallel.py at v0.2.2):
// layers per stage in stage order, or empty where torchtitan raises an error.
std::vector<int> torchtitan_stage_split(int layers, int stages, int first_less, int last_less);

}  // namespace parasol::interop
