// deepspeed: see interop/deepspeed.h.
//
// Keys and flags checked against (2026-12-02):
//  - deepspeedai/DeepSpeed edaa7221267243c7be7fb49c5d5f5c4fb97b4641 (version.txt 0.19.6):
//    deepspeed/runtime/config.py (batch rule L925-979, world size = the mpu's data-parallel size
//    L711-724), deepspeed/runtime/constants.py (bf16, fp16, data_types.grad_accum_dtype,
//    communication_data_type: the dtype engine.py allreduce_bucket and ZeRO reduce in),
//    deepspeed/runtime/precision_config.py (bf16_master_weights_and_grads,
//    bf16_optimizer_states), deepspeed/runtime/zero/config.py (stage, overlap_comm default
//    = stage 3, contiguous_gradients, stage3_prefetch_bucket_size, stage3_max_live_parameters,
//    stage3_max_reuse_distance, reduce_bucket_size, stage3_param_persistence_threshold,
//    zero_hpz_partition_size,
//    mics_shard_size), deepspeed/runtime/zero/offload_config.py (device, pin_memory),
//    deepspeed/runtime/engine.py (get_data_types: grad_accum_dtype defaults to the model dtype;
//    _do_optimizer_sanity_check: a bf16/fp16 model with another grad_accum_dtype needs ZeRO),
//    deepspeed/runtime/pipe/engine.py ("ZeRO-2 and ZeRO-3 are incompatible with pipeline
//    parallelism"; only schedule.TrainSchedule, DeepSpeed's 1F1B), deepspeed/runtime/zero/mics.py
//    (MiCS: shards within mics_shard_size groups, all-reduces gradients across them),
//    deepspeed/launcher/runner.py (hostfile "host slots=N", '#' comments),
//    docs/_pages/config-json.md, deepspeed/runtime/config.py L711-724 (sequence_parallel_size
//    divides the world for the batch rule), deepspeed/sequence/layer.py (Ulysses
//    DistributedAttention: all-to-all of q, k, v and of the output; heads % P).
//  - deepspeedai/Megatron-DeepSpeed 4efb479d5317ce9b86096b9d8e3e8030b0b5263b:
//    megatron/arguments.py (--zero-stage, --no-pipeline-parallel, --deepspeed-activation-
//    checkpointing, --checkpoint-in-cpu, --recompute-granularity/-method/-num-layers,
//    --ds-sequence-parallel-size (L974-975, data-parallel size world / (tp x pp x sp) L101-108;
//    megatron/core/parallel_state.py L144-147: not with tp or pp, L183-214: consecutive
//    sequence-parallel ranks), model-shape flags, --normalization rmsnorm, --swiglu,
//    --use-rotary-position-embeddings, --disable-bias-linear, --use-flash-attn-v2 (and
//    --use-flash-attn-triton: "use FlashAttention implementation of attention using Triton"),
//    --attention-dropout/--hidden-dropout default 0.1); megatron/model/gpt_model.py (the pipeline
//    model recomputes uniformly only: "deepspeed's pipeline doesn't support the block recompute
//    method").
//    deepspeed.add_config_arguments adds --deepspeed and --deepspeed_config.
#include "interop/deepspeed.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"

namespace parasol::interop {

const char* const kDeepSpeedVersion =
    "DeepSpeed 0.19.6 (deepspeedai/DeepSpeed edaa722), Megatron-DeepSpeed "
    "(deepspeedai/Megatron-DeepSpeed 4efb479)";

namespace {

using OJson = nlohmann::ordered_json;

const char* ds_dtype(Dtype d) {
  switch (d) {
    case Dtype::kBf16:
      return "bf16";
    case Dtype::kFp16:
      return "fp16";
    default:
      return "fp32";
  }
}

// Whether the plan runs under Megatron-DeepSpeed's pretrain_gpt.py (tensor, pipeline or Ulysses
// sequence parallelism) rather than the user's own DeepSpeed script.
bool megatron_deepspeed(const Plan& p) { return p.tp > 1 || p.pp > 1 || p.cp > 1; }

// Every refusal of DeepSpeed, each naming the plan (or model) field.
void check_deepspeed_expressible(const Model& model, const Plan& p, Refusals& r) {
  const bool pipelined = p.pp > 1;
  if (p.vpp > 1 || p.schedule == Schedule::kInterleaved)
    r.add("plan.vpp",
          "DeepSpeed's pipeline engine has no interleaved (virtual-stage) "
          "schedule; it runs only its 1F1B TrainSchedule (runtime/pipe/schedule.py)");
  if (pipelined && p.pipeline_flushes > 1)
    r.add("plan.pipeline_flushes",
          "DeepSpeed's pipeline engine runs one TrainSchedule over a step's "
          "gradient_accumulation_steps micro-batches (runtime/pipe/engine.py train_batch)");
  if (pipelined && p.schedule == Schedule::kGpipe)
    r.add("plan.schedule",
          "DeepSpeed's pipeline engine has no GPipe schedule; it runs only "
          "its 1F1B TrainSchedule (runtime/pipe/schedule.py)");
  if (pipelined && p.zero >= 2)
    r.add("plan.zero",
          "ZeRO-2 and ZeRO-3 are incompatible with DeepSpeed's pipeline "
          "parallelism (runtime/pipe/engine.py); use zero <= 1 with pp > 1");
  if (pipelined && p.zero == 0 && p.precision == Dtype::kBf16)
    r.add("plan.zero",
          "DeepSpeed's pipeline engine trains a bf16 model without ZeRO "
          "through its BF16_Optimizer, which shards the optimizer state "
          "(ZeRO-1); use zero 1");
  if (p.uneven_stages())
    r.add(p.split_field(),
          "parasol does not write Megatron-DeepSpeed's pipeline "
          "partition; only even stages are exported");
  if (p.cp > 1 && p.cp_comm_type != CpCommType::kA2a)
    r.add("plan.cp_comm_type",
          std::string(cp_comm_type_name(p.cp_comm_type)) +
              " passes K/V shards between the cp group's ranks; DeepSpeed's sequence "
              "parallelism is Ulysses (--ds-sequence-parallel-size: all-to-all over heads, "
              "cp_comm_type a2a)");
  if (p.cp > 1 && (p.tp > 1 || p.pp > 1))
    r.add("plan.cp",
          "DeepSpeed's Ulysses sequence parallelism does not work with tensor or pipeline "
          "parallelism (Megatron-DeepSpeed megatron/core/parallel_state.py L144-147)");
  if (p.cp > 1 && p.sequence_parallel)
    r.add("plan.sp",
          "Megatron-DeepSpeed's --ds-sequence-parallel-size cannot be combined with "
          "--sequence-parallel (megatron/arguments.py)");
  if (p.cp > 1) {
    // Sequence-parallel groups of consecutive ranks, data-parallel groups strided by their size
    // (parallel_state.py L183-214).
    auto at = [&](Dim d) { return std::find(p.rank_order.begin(), p.rank_order.end(), d); };
    if (!(at(Dim::kCp) < at(Dim::kDp)))
      r.add("plan.rank_order",
            "Megatron-DeepSpeed's sequence-parallel groups are consecutive ranks (cp before dp)");
  }
  if (p.ep > 1 || model.is_moe())
    r.add(p.ep > 1 ? "plan.ep" : "model.moe",
          "DeepSpeed-MoE (Megatron-DeepSpeed --num-experts, --moe-expert-parallel-size) "
          "places experts in its own groups; parasol does not export MoE models to DeepSpeed");
  if (p.zero == 0 && p.overlap_grad_reduce)
    r.add("plan.overlap_grad_reduce",
          "DeepSpeed without ZeRO all-reduces gradients after the backward "
          "(engine.py allreduce_gradients at the accumulation boundary), not overlapped");
  if (p.tp > 1 && p.tp_impl != TpImpl::kMegatron)
    r.add("plan.tp_impl",
          "Megatron-DeepSpeed runs Megatron's tensor-parallel layers (tp_impl megatron), not "
          "PyTorch's DTensor tensor parallelism");
  if (p.tp > 1 || p.pp > 1) {
    // Megatron-DeepSpeed's mpu (megatron/core/parallel_state.py L183-265) orders ranks tp, dp, pp
    // (tp fastest); ep is refused above, Ulysses (cp) runs with neither tp nor pp.
    auto at = [&](Dim d) { return std::find(p.rank_order.begin(), p.rank_order.end(), d); };
    if (!(at(Dim::kTp) < at(Dim::kDp) && at(Dim::kDp) < at(Dim::kPp)))
      r.add("plan.rank_order", "Megatron-DeepSpeed orders ranks tp, dp, pp (tp fastest)");
  }
  if (p.tp_comm_overlap)
    r.add("plan.tp_comm_overlap",
          "Megatron-DeepSpeed has no Transformer Engine userbuffers overlap");
  // --use-flash-attn-triton runs flash-attn's Triton kernel (Megatron-DeepSpeed
  // megatron/model/transformer.py L47, L472-501 FlashSelfAttentionTriton), whose forward asserts
  // "FlashAttention only support head dimensions up to 128" (flash_attn/flash_attn_triton.py
  // _flash_attn_forward).
  // Megatron-DeepSpeed's flash paths are flash-attn 2 (--use-flash-attn-v2) and its Triton
  // kernel; it has no FlashAttention-3 switch.
  if ((p.tp > 1 || p.pp > 1) && p.flash_attention && p.attention_kernel == AttentionKernel::kFa3)
    r.add("plan.attention_kernel",
          "Megatron-DeepSpeed runs flash-attn 2 (--use-flash-attn-v2) or its Triton kernel, not "
          "FlashAttention-3");
  if ((p.tp > 1 || p.pp > 1) && p.flash_attention &&
      p.attention_kernel == AttentionKernel::kTriton && model.head_dim > 128)
    r.add("plan.attention_kernel",
          "flash-attn's Triton kernel (Megatron-DeepSpeed --use-flash-attn-triton) supports head "
          "dimensions up to 128; this model's is " +
              std::to_string(model.head_dim));
  if (p.precision == Dtype::kFp8 || p.precision == Dtype::kTf32)
    r.add("plan.precision", std::string("DeepSpeed's config has no ") + dtype_name(p.precision) +
                                " mode (bf16, fp16 or fp32)");
  if (p.zero == 3 && p.reshard != Reshard::kAfterForward)
    r.add("plan.reshard", std::string("DeepSpeed ZeRO-3 frees gathered parameters after "
                                      "each use (after_forward); it has no ") +
                              reshard_name(p.reshard) + " mode");
  if (p.shard_degree > 0 && p.shard_degree != p.dp * p.cp && p.zero < 3)
    r.add("plan.shard_degree",
          "DeepSpeed shards ZeRO-1/2 state over the whole "
          "data-parallel group; hierarchical sharding (MiCS, "
          "mics_shard_size) exists only with ZeRO-3");
  if (p.offload.params && p.zero < 3)
    r.add("plan.offload",
          "DeepSpeed offloads parameters (zero_optimization.offload_param) "
          "only with ZeRO-3");
  if (p.offload.optimizer && p.zero == 0)
    r.add("plan.offload",
          "DeepSpeed offloads the optimizer "
          "(zero_optimization.offload_optimizer) only with ZeRO 1-3");
  if (p.offload.activations && !(p.recompute == Recompute::kFull && p.recompute_layers < 0))
    r.add("plan.offload",
          "DeepSpeed copies to host only the inputs of checkpointed layers "
          "(activation_checkpointing.cpu_checkpointing); it needs full "
          "recompute of every layer");
  // Gradient dtype: reduced in communication_data_type (engine.py allreduce_bucket, ZeRO's
  // reduce-scatter; default the model's dtype), fp32 or the model's dtype here.
  if (p.precision == Dtype::kFp32 && p.grad_reduce_dtype != Dtype::kFp32)
    r.add("plan.grad_reduce_dtype", "an fp32 model accumulates fp32 gradients in DeepSpeed");
  if (p.grad_reduce_dtype != Dtype::kFp32 && p.grad_reduce_dtype != p.precision)
    r.add("plan.grad_reduce_dtype", "DeepSpeed's grad_accum_dtype is fp32 or the model's dtype");
  if (p.optimizer_dtype == Dtype::kBf16) {
    if (p.zero == 0 || p.precision != Dtype::kBf16)
      r.add("plan.optimizer_dtype",
            "DeepSpeed's bf16 optimizer states "
            "(bf16.bf16_optimizer_states) need bf16 and ZeRO 1-3");
    if (p.grad_reduce_dtype != Dtype::kBf16)
      r.add("plan.grad_reduce_dtype",
            "bf16.bf16_master_weights_and_grads keeps bf16 "
            "gradients; set grad_reduce_dtype bf16");
  } else if (p.optimizer_dtype != Dtype::kFp32) {
    r.add("plan.optimizer_dtype", "DeepSpeed keeps optimizer state in fp32 or bf16");
  }
  // Recompute: Megatron-DeepSpeed has full (all layers or the first k per stage) and selective
  // (core attention only); a plain DeepSpeed script recomputes the way its model code does:
  // a Hugging Face model's gradient checkpointing recomputes every decoder layer.
  const bool megatron = megatron_deepspeed(p);
  if (p.recompute == Recompute::kSelective &&
      (!megatron || p.recompute_modules != Plan{}.recompute_modules))
    r.add("plan.recompute", megatron
                                ? "Megatron-DeepSpeed's selective recompute is core attention only"
                                : "a Hugging Face model under DeepSpeed recomputes whole layers "
                                  "(gradient_checkpointing_enable); selective recompute needs "
                                  "Megatron-DeepSpeed (tp, pp or cp > 1)");
  if (p.recompute == Recompute::kSelectiveOp)
    r.add("plan.recompute",
          "selective_op is torchtitan's op-level activation checkpointing (keep every other mm "
          "output); DeepSpeed recomputes whole layers (activation_checkpointing, a Hugging Face "
          "model's gradient checkpointing) or Megatron-DeepSpeed's core attention");
  if (p.recompute == Recompute::kFull && p.recompute_layers >= 0 && p.pp > 1)
    r.add("plan.recompute_layers",
          "Megatron-DeepSpeed's pipeline model (GPTModelPipe, megatron/model/gpt_model.py) "
          "recomputes every layer or none: DeepSpeed's pipeline has no block method");
  if (p.recompute == Recompute::kFull && p.recompute_layers >= 0 && !megatron)
    r.add("plan.recompute_layers",
          "a Hugging Face model's gradient checkpointing "
          "recomputes every decoder layer");
}

OJson config_json(const Plan& p) {
  OJson c;
  c["train_batch_size"] = p.global_batch;
  c["train_micro_batch_size_per_gpu"] = p.micro_batch;
  c["gradient_accumulation_steps"] = p.micro_batches();
  OJson z;
  z["stage"] = p.zero;
  if (p.zero > 0) {
    z["overlap_comm"] = p.overlap_grad_reduce;
    z["contiguous_gradients"] = true;
  }
  if (p.zero == 3) {
    // The parameter coordinator's bounds and the reduce bucket (Plan::zero3_*); a prefetch
    // bucket of 0 turns the overlapped gathers off.
    z["stage3_prefetch_bucket_size"] = p.overlap_param_gather ? p.zero3_prefetch_bucket : 0;
    z["stage3_max_live_parameters"] = p.zero3_max_live_parameters;
    z["stage3_max_reuse_distance"] = p.zero3_max_reuse_distance;
    z["reduce_bucket_size"] = p.zero3_reduce_bucket;
    z["stage3_param_persistence_threshold"] = p.zero3_param_persistence_threshold;
    if (p.shard_degree > 0 && p.shard_degree != p.dp * p.cp) z["mics_shard_size"] = p.shard_degree;
  }
  if (p.offload.optimizer) z["offload_optimizer"] = {{"device", "cpu"}, {"pin_memory", true}};
  if (p.offload.params) z["offload_param"] = {{"device", "cpu"}, {"pin_memory", true}};
  c["zero_optimization"] = z;
  if (p.precision == Dtype::kBf16) {
    OJson b = {{"enabled", true}};
    if (p.optimizer_dtype == Dtype::kBf16) {
      b["bf16_master_weights_and_grads"] = true;
      b["bf16_optimizer_states"] = true;
    }
    c["bf16"] = b;
  } else if (p.precision == Dtype::kFp16) {
    c["fp16"] = {{"enabled", true}, {"loss_scale", 0}, {"initial_scale_power", 16}};
  }
  // The reduction dtype is communication_data_type. Gradients accumulate in the same dtype
  // (as Megatron's gradient buffer), except without ZeRO, where DeepSpeed's engine accepts only
  // the model's dtype (engine.py _do_optimizer_sanity_check: "unsupported mix").
  c["communication_data_type"] = ds_dtype(p.grad_reduce_dtype);
  c["data_types"] = {
      {"grad_accum_dtype", ds_dtype(p.zero == 0 ? p.precision : p.grad_reduce_dtype)}};
  if (p.recompute == Recompute::kFull) {
    c["activation_checkpointing"] = {{"partition_activations", false},
                                     {"cpu_checkpointing", p.offload.activations},
                                     {"contiguous_memory_optimization", false},
                                     {"synchronize_checkpoint_boundary", false}};
  }
  return c;
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += "  " + x + "\n";
  return s;
}

}  // namespace

Refusals deepspeed_refusals(const Model& model, const Cluster& cluster, const Plan& plan) {
  validate(plan, model, cluster);  // parasol's own rules: one error, thrown
  Refusals r;
  check_deepspeed_expressible(model, plan, r);
  if (plan.lora())
    r.add("plan.lora_rank", "a DeepSpeed config has no LoRA (Hugging Face PEFT wraps the model)");
  if (plan.activation_fp8_input_store)
    r.add("plan.activation_func_fp8_input_store",
          "a DeepSpeed config has no fp8 copy of the SwiGLU input (Megatron-Core's switch)");
  const bool megatron = megatron_deepspeed(plan);
  // Megatron-DeepSpeed's --rotary-position-embeddings-theta is an int (arguments.py L635).
  if (megatron && !model.learned_positions &&
      (model.rope_theta != std::floor(model.rope_theta) || model.rope_theta < 1))
    r.add("model.rope_theta",
          "Megatron-DeepSpeed's --rotary-position-embeddings-theta is an "
          "integer");
  try {
    server_layout(cluster, plan.gpus());
  } catch (const Error& e) {
    if (!e.is_user_error()) throw;  // a parasol bug is not a refusal
    r.add(e.field(), e.reason());
  }
  return r;
}

Export export_deepspeed(const Model& model, const Cluster& cluster, const Plan& plan) {
  deepspeed_refusals(model, cluster, plan).raise();
  const int gpus = plan.gpus();
  const ServerLayout servers = server_layout(cluster, gpus);
  const int per_node = servers.per_node, nodes = servers.nodes;
  const bool megatron = megatron_deepspeed(plan);
  // Megatron-DeepSpeed's validate_args raises "Using sequence parallelism requires setting the
  // environment variable CUDA_DEVICE_MAX_CONNECTIONS to 1" (megatron/arguments.py L401-407)
  // on every rank. DeepSpeed's multi-node runner forwards only variables with its prefixes
  // (EXPORT_ENVS = MLFLOW, PYTHON, MV2, UCX and the accelerator's NCCL: launcher/runner.py L37,
  // L609-614) and those of the file DS_ENV_FILE names (default .deepspeed_env in ~ or the
  // working directory, L39-40 and L616-623, read as KEY=VALUE lines): the export writes the
  // file and points DS_ENV_FILE at it, and exports the variable for the single-node launch.
  const bool one_connection = megatron && plan.sequence_parallel;

  Export e;
  e.framework = "deepspeed";
  e.version = kDeepSpeedVersion;
  e.files.push_back({"ds_config.json", config_json(plan).dump(2) + "\n", false});

  std::ostringstream host;
  host << "# DeepSpeed hostfile (launcher/runner.py): one line per server, \"<host> "
          "slots=<GPUs>\".\n"
       << "# Replace node-<i> by the host names of " << nodes << " servers of cluster "
       << cluster.name << ".\n";
  for (int i = 0; i < nodes; ++i) host << "node-" << i << " slots=" << per_node << "\n";
  e.files.push_back({"hostfile", host.str(), false});
  // runner.py splits every line at its first '=': no comments, no blank lines.
  if (one_connection)
    e.files.push_back({".deepspeed_env", "CUDA_DEVICE_MAX_CONNECTIONS=1\n", false});

  std::ostringstream sh;
  sh << "#!/usr/bin/env bash\n"
     << "# Written by parasol export --to deepspeed: " << model.name << " on " << cluster.name
     << ", " << gpus << " GPUs (" << nodes << " x " << per_node << ").\n"
     << "# Plan: tp " << plan.tp << ", pp " << plan.pp
     << (plan.cp > 1 ? ", Ulysses sequence parallel " + std::to_string(plan.cp) : std::string())
     << ", dp " << plan.dp << ", ZeRO " << plan.zero << ", micro batch " << plan.micro_batch
     << ", global batch " << plan.global_batch << ", recompute " << recompute_label(plan)
     << ", offload " << offload_name(plan.offload) << ".\n"
     << "# Checked against " << kDeepSpeedVersion << ".\n"
     << export_tag_line(model, cluster, gpus);
  if (plan.zero == 3 && plan.shard_degree > 0 && plan.shard_degree != plan.dp * plan.cp)
    sh << "# MiCS (mics_shard_size): build the model under deepspeed.zero.MiCS_Init(config_dict_or_"
          "path=\"ds_config.json\").\n";
  if (plan.zero == 1 || plan.zero == 2)
    sh << "# Note: DeepSpeed ZeRO-1/2 all-gather the updated parameters after the optimizer step "
          "without overlapping it.\n";
  sh << "set -euo pipefail\n"
     << "# This folder's files (hostfile, ds_config.json), wherever the script runs from.\n"
     << "HERE=$(cd \"$(dirname \"${BASH_SOURCE[0]}\")\" && pwd)\n";
  if (one_connection)
    sh << "# Megatron-DeepSpeed's sequence parallelism needs it on every rank: here for this "
          "node,\n# through DS_ENV_FILE for the others.\n"
       << "export CUDA_DEVICE_MAX_CONNECTIONS=1\n"
       << "export DS_ENV_FILE=\"$HERE/.deepspeed_env\"\n";
  const std::string launcher = "deepspeed --hostfile=\"$HERE/hostfile\" --num_nodes " +
                               std::to_string(nodes) + " --num_gpus " + std::to_string(per_node);
  if (!megatron) {
    sh << "# A script that calls deepspeed.initialize (for a Hugging Face model: the Trainer with "
          "--deepspeed ds_config.json)";
    if (plan.recompute == Recompute::kFull)
      sh << ";\n# recompute: the model recomputes every layer "
            "(model.gradient_checkpointing_enable())";
    sh << ".\n"
       << "TRAIN_SCRIPT=${TRAIN_SCRIPT:-train.py}\n"
       << launcher << " \\\n"
       << "  \"$TRAIN_SCRIPT\" --deepspeed --deepspeed_config \"$HERE/ds_config.json\" \"$@\"\n";
  } else {
    std::vector<std::string> mod = {
        "--num-layers " + std::to_string(model.layers),
        "--hidden-size " + std::to_string(model.hidden),
        "--ffn-hidden-size " + std::to_string(model.ffn),
        "--num-attention-heads " + std::to_string(model.heads),
        "--num-key-value-heads " + std::to_string(model.kv_heads),
    };
    if (model.head_dim * model.heads != model.hidden)
      mod.push_back("--kv-channels " + std::to_string(model.head_dim));
    // max_position_embeddings >= seq_length (megatron/arguments.py L310-311); RoPE needs no
    // table, so a longer sequence only raises the count.
    mod.push_back("--seq-length " + std::to_string(plan.seq(model)));
    mod.push_back("--max-position-embeddings " +
                  std::to_string(std::max(model.seq_len, plan.seq(model))));
    // Used by the NullTokenizer only (megatron/tokenizer/tokenizer.py L40-41); the model's
    // vocabulary for a reader of this script.
    mod.push_back("--vocab-size " + std::to_string(model.vocab));
    if (model.norm == Norm::kRmsNorm) mod.push_back("--normalization rmsnorm");
    if (model.activation == Activation::kSwiglu) mod.push_back("--swiglu");
    if (!model.learned_positions) {
      mod.push_back("--use-rotary-position-embeddings");
      mod.push_back("--rotary-position-embeddings-theta " +
                    std::to_string(static_cast<int64_t>(model.rope_theta)));
    }
    if (!model.tied_embeddings) mod.push_back("--untie-embeddings-and-output-weights");
    if (!model.linear_bias) mod.push_back("--disable-bias-linear");
    if (!model.dropout) {
      mod.push_back("--attention-dropout 0");
      mod.push_back("--hidden-dropout 0");
    }
    if (plan.flash_attention)
      mod.push_back(plan.attention_kernel == AttentionKernel::kTriton ? "--use-flash-attn-triton"
                                                                      : "--use-flash-attn-v2");
    std::vector<std::string> par = {
        "--tensor-model-parallel-size " + std::to_string(plan.tp),
        "--pipeline-model-parallel-size " + std::to_string(plan.pp),
        "--micro-batch-size " + std::to_string(plan.micro_batch),
        "--global-batch-size " + std::to_string(plan.global_batch),
    };
    if (plan.sequence_parallel) par.push_back("--sequence-parallel");
    if (plan.cp > 1) par.push_back("--ds-sequence-parallel-size " + std::to_string(plan.cp));
    if (plan.precision == Dtype::kBf16) par.push_back("--bf16");
    if (plan.precision == Dtype::kFp16) par.push_back("--fp16");
    std::vector<std::string> ds = {"--deepspeed", "--deepspeed_config \"$HERE/ds_config.json\"",
                                   "--zero-stage " + std::to_string(plan.zero)};
    // Without --no-pipeline-parallel Megatron-DeepSpeed builds a one-stage PipelineModule and
    // DeepSpeed's pipeline engine, which refuses ZeRO-2/3 (its examples add it when Z > 1).
    if (plan.pp == 1) ds.push_back("--no-pipeline-parallel");
    if (plan.recompute == Recompute::kFull) {
      ds.push_back("--deepspeed-activation-checkpointing");
      ds.push_back("--recompute-granularity full");
      if (plan.recompute_layers >= 0) {
        ds.push_back("--recompute-method block");
        ds.push_back("--recompute-num-layers " + std::to_string(plan.recompute_layers));
      } else {
        ds.push_back("--recompute-method uniform");
        ds.push_back("--recompute-num-layers 1");
      }
      if (plan.offload.activations) ds.push_back("--checkpoint-in-cpu");
    } else if (plan.recompute == Recompute::kSelective) {
      ds.push_back("--recompute-granularity selective");
    }
    sh << "# Megatron-DeepSpeed (deepspeedai/Megatron-DeepSpeed): run from its checkout; give "
          "the data and\n# tokenizer arguments after the script (\"$@\").\n"
       << "MODEL_ARGS=(\n"
       << join(mod) << ")\nPARALLEL_ARGS=(\n"
       << join(par) << ")\nDEEPSPEED_ARGS=(\n"
       << join(ds) << ")\n"
       << launcher << " \\\n"
       << "  pretrain_gpt.py \"${MODEL_ARGS[@]}\" \"${PARALLEL_ARGS[@]}\" "
          "\"${DEEPSPEED_ARGS[@]}\" \"$@\"\n";
  }
  e.files.push_back({"launch_deepspeed.sh", sh.str(), true});
  return e;
}

namespace {

// A batch key's value: absent, null and "auto" count as absent; else an integer >= 1.
std::optional<int64_t> batch_key(const JsonReader& r, const std::string& key) {
  if (!r.has(key)) return std::nullopt;
  const Json& v = r.raw(key);
  if (v.is_string() && v.get<std::string>() == "auto") return std::nullopt;
  return r.integer(key, 1, int64_t{1} << 40);
}

Dtype grad_dtype(const std::string& s, const std::string& field) {
  if (s == "fp32" || s == "float32") return Dtype::kFp32;
  if (s == "bf16" || s == "bfloat16") return Dtype::kBf16;
  if (s == "fp16" || s == "float16") return Dtype::kFp16;
  throw Error(field, "\"" + s + "\" is not fp32, bf16 or fp16");
}

bool offload_device(const JsonReader& z, const std::string& key) {
  if (!z.has(key)) return false;
  JsonReader o = z.object(key);
  const std::string dev = o.choice("device", {"none", "cpu", "nvme"}, "none");
  if (dev == "nvme")
    throw Error(o.field("device"), "parasol's plans offload to host memory (cpu), not NVMe");
  return dev == "cpu";
}

bool enabled(const JsonReader& r, const std::string& key) {
  if (!r.has(key)) return false;
  JsonReader b = r.object(key);
  if (b.has("enabled") && b.raw("enabled").is_string())
    throw Error(b.field("enabled"),
                "\"auto\" (the Hugging Face Trainer's) must be true or false "
                "here: parasol cannot tell the Trainer's precision");
  return b.boolean_or("enabled", false);
}

}  // namespace

ImportedJob import_deepspeed(const Json& config, int gpus, const DeepSpeedParallelism& mp) {
  JsonReader r(config, "deepspeed");
  if (gpus < 1) throw Error("gpus", "must be >= 1");
  if (mp.tp < 1 || mp.pp < 1 || gpus % (mp.tp * mp.pp) != 0)
    throw Error("gpus", std::to_string(gpus) + " GPUs are not a multiple of tp x pp = " +
                            std::to_string(mp.tp * mp.pp));
  // Ulysses: Megatron-DeepSpeed's --ds-sequence-parallel-size, or the config's
  // sequence_parallel_size (runtime/config.py L721-722).
  int ulysses = std::max(1, mp.ulysses);
  std::string ulysses_field = "--ds-sequence-parallel-size";
  if (r.has("sequence_parallel_size")) {
    const int64_t n = r.integer("sequence_parallel_size", 1, 1 << 20);
    if (mp.ulysses > 1 && n != mp.ulysses)
      throw Error(r.field("sequence_parallel_size"),
                  std::to_string(n) + " differs from --ds-sequence-parallel-size " +
                      std::to_string(mp.ulysses));
    ulysses = static_cast<int>(n);
    ulysses_field = r.field("sequence_parallel_size");
  }
  if (ulysses > 1) {
    // Megatron-DeepSpeed megatron/core/parallel_state.py L144-147: "DeepSpeed's sequence parallel
    // does not work with tensor parallel or pipeline parallel"; arguments.py L974-975: it
    // "cannot be combined with --sequence-parallel".
    if (mp.tp > 1 || mp.pp > 1)
      throw Error(ulysses_field,
                  "DeepSpeed's Ulysses sequence parallelism runs without tensor or pipeline "
                  "parallelism (Megatron-DeepSpeed parallel_state.py)");
    if (mp.sequence_parallel)
      throw Error(ulysses_field,
                  "DeepSpeed's Ulysses sequence parallelism cannot be combined with Megatron's "
                  "--sequence-parallel");
    if (gpus % ulysses != 0)
      throw Error(ulysses_field, std::to_string(ulysses) + " does not divide the " +
                                     std::to_string(gpus) + " GPUs");
  }
  Plan p;
  p.tp = mp.tp;
  p.pp = mp.pp;
  p.sequence_parallel = mp.sequence_parallel;
  p.dp = gpus / (mp.tp * mp.pp * ulysses);
  if (ulysses > 1) {
    // deepspeed/sequence/layer.py DistributedAttention (and ulysses_sp.py UlyssesSPAttentionHF):
    // q, k, v traded from sequence shards to head shards by all-to-all, attention over the
    // whole sequence on heads / ulysses heads, the output traded back; ranks of a group are
    // consecutive (parallel_state.py L209-214: sequence-parallel groups of consecutive ranks,
    // data-parallel groups strided by their size), the plan's cp-before-dp order.
    p.cp = ulysses;
    p.cp_comm_type = CpCommType::kA2a;
  }
  p.overlap_grad_reduce = false;  // stage 0 unless zero_optimization says otherwise
  const int64_t dp = p.dp;

  // Batch: DeepSpeed's _set_batch_related_parameters and _batch_assertion (config.py), but an
  // inexact division is an error here where DeepSpeed would round down.
  const std::string kTrain = "train_batch_size", kMicro = "train_micro_batch_size_per_gpu",
                    kAccum = "gradient_accumulation_steps";
  auto train = batch_key(r, kTrain);
  auto micro = batch_key(r, kMicro);
  auto accum = batch_key(r, kAccum);
  auto divide = [&](int64_t num, int64_t den, const std::string& key) {
    if (num % den != 0)
      throw Error(r.field(key), std::to_string(num) + " is not a multiple of " +
                                    std::to_string(den) + " (the other batch keys x dp " +
                                    std::to_string(dp) + ")");
    return num / den;
  };
  if (train && micro && accum) {
    if (*train != *micro * *accum * dp)
      throw Error(r.field(kTrain), std::to_string(*train) + " != " + kMicro + " " +
                                       std::to_string(*micro) + " x " + kAccum + " " +
                                       std::to_string(*accum) + " x dp " + std::to_string(dp));
  } else if (train && micro) {
    accum = divide(*train, *micro * dp, kTrain);
  } else if (train && accum) {
    micro = divide(*train, *accum * dp, kTrain);
  } else if (micro && accum) {
    train = *micro * *accum * dp;
  } else if (train) {
    accum = 1;
    micro = divide(*train, dp, kTrain);
  } else if (micro) {
    accum = 1;
    train = *micro * dp;
  } else {
    throw Error(r.field(kMicro), std::string("give ") + kTrain + " or " + kMicro +
                                     " as a number (\"auto\" is the Hugging Face Trainer's; "
                                     "its value is not in the config)");
  }
  p.micro_batch = static_cast<int>(*micro);
  p.global_batch = static_cast<int>(*train);

  if (r.has("zero_optimization")) {
    JsonReader z = r.object("zero_optimization");
    if (z.has("stage") && z.raw("stage").is_string())
      throw Error(z.field("stage"), "must be a number 0-3");
    p.zero = static_cast<int>(z.integer_or("stage", 0, 0, 3));
    // Stage 0 reduces after the backward; overlap_comm defaults to stage == 3 (zero/config.py).
    p.overlap_grad_reduce = p.zero > 0 && z.boolean_or("overlap_comm", p.zero == 3);
    if (p.zero == 3) {
      // DeepSpeed's ZeRO-3 gathers per module (zero3_unit module); its config writes the sizes
      // as 5e7 (JSON numbers): whole numbers of elements. A prefetch bucket of 0 turns the
      // overlapped gathers off (overlap_param_gather false).
      auto elements = [&z](const char* key, int64_t fallback, double min) {
        const double v = z.number_or(key, static_cast<double>(fallback), min, 1e15);
        if (v != std::floor(v)) throw Error(z.field(key), "must be a whole number of elements");
        return static_cast<int64_t>(v);
      };
      p.zero3_unit = GatherUnit::kModule;
      const int64_t prefetch = elements("stage3_prefetch_bucket_size", p.zero3_prefetch_bucket, 0);
      p.overlap_param_gather = prefetch > 0;
      if (prefetch > 0) p.zero3_prefetch_bucket = prefetch;
      p.zero3_max_live_parameters =
          elements("stage3_max_live_parameters", p.zero3_max_live_parameters, 0);
      p.zero3_max_reuse_distance =
          elements("stage3_max_reuse_distance", p.zero3_max_reuse_distance, 0);
      p.zero3_reduce_bucket = elements("reduce_bucket_size", p.zero3_reduce_bucket, 1);
      p.zero3_param_persistence_threshold =
          elements("stage3_param_persistence_threshold", p.zero3_param_persistence_threshold, 0);
    }
    if (z.integer_or("zero_hpz_partition_size", 1, 0, 1 << 20) > 1)
      throw Error(z.field("zero_hpz_partition_size"),
                  "ZeRO++ hpZ (a secondary parameter copy sharded inside the node) has no parasol "
                  "plan equivalent");
    const int64_t mics = z.integer_or("mics_shard_size", -1, -1, 1 << 20);
    if (mics > 0) {
      if (p.zero != 3) throw Error(z.field("mics_shard_size"), "MiCS needs stage 3");
      if (dp % mics != 0)
        throw Error(z.field("mics_shard_size"),
                    std::to_string(mics) + " does not divide dp " + std::to_string(dp));
      if (mics != dp) p.shard_degree = static_cast<int>(mics);
    }
    p.offload.optimizer = offload_device(z, "offload_optimizer");
    p.offload.params = offload_device(z, "offload_param");
    if (p.offload.params && p.zero != 3)
      throw Error(z.field("offload_param"), "parameter offload needs stage 3");
    if (p.offload.optimizer && p.zero == 0)
      throw Error(z.field("offload_optimizer"), "optimizer offload needs stage 1-3");
  }

  const bool bf16 = enabled(r, "bf16") || enabled(r, "bfloat16");
  const bool fp16 = enabled(r, "fp16");
  if (bf16 && fp16) throw Error(r.field("fp16"), "bf16 and fp16 are both enabled");
  p.precision = bf16 ? Dtype::kBf16 : fp16 ? Dtype::kFp16 : Dtype::kFp32;
  if (bf16 && r.has("bf16")) {
    JsonReader b = r.object("bf16");
    const bool master = b.boolean_or("bf16_master_weights_and_grads", false);
    const bool states = b.boolean_or("bf16_optimizer_states", false);
    if (master != states)
      throw Error(b.field("bf16_optimizer_states"),
                  "parasol's bf16 optimizer keeps both master weights and moments in bf16; "
                  "set bf16_master_weights_and_grads and bf16_optimizer_states together");
    if (states) p.optimizer_dtype = Dtype::kBf16;
  }
  // Gradients are reduced in communication_data_type (engine.py: default the model's dtype);
  // grad_accum_dtype (get_data_types: default the model's dtype) is the accumulation buffer,
  // which a parasol plan does not set apart from the reduction dtype.
  p.grad_reduce_dtype = p.precision;
  if (r.has("communication_data_type"))
    p.grad_reduce_dtype =
        grad_dtype(r.string("communication_data_type"), r.field("communication_data_type"));
  Dtype accum_dtype = p.precision;
  if (r.has("data_types")) {
    JsonReader d = r.object("data_types");
    if (d.has("grad_accum_dtype"))
      accum_dtype = grad_dtype(d.string("grad_accum_dtype"), d.field("grad_accum_dtype"));
  }
  if (p.zero == 0 && accum_dtype != p.precision)
    throw Error("deepspeed.data_types.grad_accum_dtype",
                "DeepSpeed without ZeRO needs the model's dtype here (engine.py "
                "_do_optimizer_sanity_check: unsupported mix)");
  if (r.has("activation_checkpointing")) {
    // deepspeed.checkpointing is configured only for a model that checkpoints its layers.
    JsonReader a = r.object("activation_checkpointing");
    p.recompute = Recompute::kFull;
    p.offload.activations = a.boolean_or("cpu_checkpointing", false);
  }

  ImportedJob job;
  job.plan = plan_to_json(p);
  job.gpus = gpus;
  return job;
}

bool looks_like_deepspeed_config(const Json& j) {
  if (!j.is_object() || j.contains("tp") || j.contains("pp") || j.contains("dp")) return false;
  for (const char* k : {"train_batch_size", "train_micro_batch_size_per_gpu", "zero_optimization",
                        "gradient_accumulation_steps"})
    if (j.contains(k)) return true;
  return false;
}

}  // namespace parasol::interop
