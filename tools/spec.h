// The command line's shared inputs: --model/--cluster/--gpus, the plan flags (or --plan FILE)
// and --profile, turned into a Model, a Cluster, a Plan and a Profile.
//
// The plan flags are a JSON overlay: each flag sets its key of the plan JSON (the plan file's
// object, or an empty one) and plan_from_json reads the result, so a flag and a file field go
// through the same checks and errors ("plan.tp: ...") and cannot disagree.
#pragma once

#include <CLI/CLI.hpp>
#include <map>
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
  std::optional<int> shard_degree, first_stage_layers, last_stage_layers, etp, pipeline_flushes;
  std::optional<int64_t> seq;
  // DeepSpeed ZeRO-3's stage3_prefetch_bucket_size, stage3_max_live_parameters,
  // stage3_max_reuse_distance, reduce_bucket_size, stage3_param_persistence_threshold
  // (Plan::zero3_*).
  std::optional<int64_t> zero3_prefetch_bucket, zero3_max_live_parameters;
  std::optional<int64_t> zero3_max_reuse_distance, zero3_reduce_bucket;
  std::optional<int64_t> zero3_param_persistence_threshold;
  std::optional<bool> sp, flash, tp_comm_overlap, ep_comm_overlap, fused_kernels;
  std::optional<bool> overlap_grad_reduce, overlap_param_gather;
  std::optional<bool> account_for_embedding, account_for_loss;
  std::optional<bool> torch_compile, nan_check, eager_loss, log_params_norm, log_num_zeros_in_grad;
  std::optional<bool> tiled_loss, gemm_gelu_epilogue;
  std::optional<bool> p2p_sync, gradient_accumulation_fusion, moe_probs_in_experts;
  std::optional<bool> cross_entropy_loss_fusion;
  std::optional<bool> repeat_kv, deterministic, fp8_param_gather;
  std::optional<std::string> transformer_engine_version;
  std::optional<std::string> cuda_graphs, optimizer_impl, cpu_optimizer, host_framework;
  std::optional<std::string> transformer_impl;
  std::optional<std::string> schedule, recompute, offload, precision, rank_order;
  std::optional<std::string> reshard, zero3_unit, grad_reduce_dtype, attention_kernel, cp_impl;
  std::optional<std::string> moe_dispatcher, moe_force_balance, optimizer_dtype, recompute_modules;
  std::optional<std::string> cp_rotate, tp_impl;
  std::optional<std::string> cp_comm_type;
  std::optional<int> cp_a2a_size;
  // LoRA (Plan::lora_rank, lora_targets, lora_dropout) and Megatron's fp8 copy of the SwiGLU input.
  std::optional<int> lora_rank;
  std::optional<std::string> lora_target_modules;  // comma list of NeMo's linear names
  std::optional<double> lora_dropout;
  std::optional<bool> activation_fp8_input_store;
  std::optional<std::string> stage_layers;  // comma list of layers per (virtual) stage
  // Flag values that the fields above cannot hold ("--tp x", "--tp 1e12", "--sp maybe"), by plan
  // JSON key, as JSON values: the overlay passes them on and plan_from_json rejects them naming
  // the field.
  std::map<std::string, Json> raw;
};

// Adds --model --cluster --gpus to `cmd`.
void add_target_flags(CLI::App* cmd, SpecOptions& o);
// Adds the plan flags: --plan and --tp --pp --dp --cp --ep --sp --vpp --zero --mbs --gbs --seq
// --schedule --recompute --recompute-layers --offload --precision --flash-attention
// --attention-kernel --cp-impl --cp-rotate --repeat-kv --rank-order --reshard --zero3-unit
// --zero3-prefetch-bucket --zero3-max-live-parameters --zero3-max-reuse-distance
// --zero3-reduce-bucket --shard-degree --grad-reduce-dtype --fp8-param-gather
// --tp-comm-overlap
// --ep-comm-overlap --stage-layers --first-stage-layers --last-stage-layers
// --account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split --etp
// --moe-dispatcher --moe-force-balance --optimizer-dtype --fused-kernels --overlap-grad-reduce
// --recompute-modules
// --overlap-param-gather --cuda-graphs --torch-compile --optimizer-impl --host-framework
// --nan-check --lora-rank --lora-target-modules --lora-dropout
// --activation-func-fp8-input-store. A boolean
// flag alone means true (`--sp`, as Megatron's flags) and takes a value too (`--sp false`).
void add_plan_flags(CLI::App* cmd, SpecOptions& o);
void add_profile_flag(CLI::App* cmd, SpecOptions& o);

struct Spec {
  Model model;
  std::unique_ptr<Cluster> cluster;
  Plan plan;
  cost::Profile profile;
};

// The plan JSON that the flags of `o` make of `base` (a plan file's object, or an empty one):
// each given flag sets its key (--mbs sets "mbs", --stage-layers 4,6 sets [4, 6]); --vpp > 1
// without --schedule sets "schedule": "interleaved"; each form of the pipeline split given
// (--stage-layers; --first/--last-stage-layers; the --account-for-* switches set true) drops the
// base's other forms. A dp that is not given is
// left to load_spec.
Json plan_overlay(const SpecOptions& o, Json base);

// Loads everything; a plan file's "model"/"cluster"/"gpus" fill in flags that were not given.
// The plan file is read by its content: a Megatron-LM argument list or launch script
// (interop/megatron.h: it gives the model unless --model is given, and the GPU count when its
// torchrun line says it), a DeepSpeed config (interop/deepspeed.h; needs --gpus), else a plan
// JSON. An imported plan without dp takes it from the GPU count, as without a file.
// When dp is not given it is derived from the GPU count (always without a plan file; with one
// when --tp, --pp or --cp re-split it); without a plan file or --gbs the global batch is dp x
// mbs. The plan is plan_from_json of the overlay completed with dp, model, cluster and gpus. A
// profile with a measured device (Profile::measured_device) sets it on the cluster. Throws
// parasol::Error.
Spec load_spec(const SpecOptions& o, CLI::App* cmd, bool need_plan);

// Loads everything from a request object (tools/api.h, the Python module's dict): the keys of a
// plan JSON, where "model" is a preset name, a path or a model object (parasol's or an HF
// config.json's; default gpt3-175b), "cluster" a preset name, a path or a cluster object (default
// dgx-a100-80g), "gpus" the GPU count and "profile" null, a path or a profile object. As
// load_spec with every key given as a flag: without "gpus" the degrees decide the GPU count
// (when `need_plan`), without "dp" it is derived from the GPU count. A model or cluster given as
// an object is left out of the plan's references. Other keys are left to plan_from_json (which
// ignores the ones it does not read). Throws parasol::Error.
Spec load_request(const Json& request, bool need_plan);

}  // namespace parasol::tools
