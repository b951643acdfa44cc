// DeepSpeed: a plan as ds_config.json and its launcher line (with Megatron-DeepSpeed's arguments
// where the plan uses tensor or pipeline parallelism), and an existing ds_config.json read back
// as a plan.
#pragma once

#include "core/cluster.h"
#include "core/model.h"
#include "core/plan.h"
#include "interop/interop.h"

namespace parasol::interop {

// The release the DeepSpeed writer and reader were checked against (named in Export.version).
extern const char* const kDeepSpeedVersion;

// The config and launcher of `plan` for `model` on `cluster`. Throws parasol::Error
// naming the plan fields DeepSpeed cannot express (for example plan.zero 2 or 3 with pp > 1),
// all of them at once. With tp, pp or cp > 1 the launcher runs Megatron-DeepSpeed's
// pretrain_gpt.py with its model-parallel arguments (cp as Ulysses, --ds-sequence-parallel-size:
// cp_comm_type a2a only, without tp or pp); else the user's script (TRAIN_SCRIPT, default train.py)
// with --deepspeed --deepspeed_config.
// Files: ds_config.json, hostfile, launch_deepspeed.sh (executable), and with sequence
// parallelism .deepspeed_env (CUDA_DEVICE_MAX_CONNECTIONS=1, which Megatron-DeepSpeed requires
// on every rank; the launcher exports it and points DS_ENV_FILE at the file so that DeepSpeed's
// runner forwards it to the other nodes). The launcher finds the folder's files by its own
// path ($HERE), wherever it runs from.
Export export_deepspeed(const Model& model, const Cluster& cluster, const Plan& plan);

// Every reason DeepSpeed refuses `plan` on `cluster` (what export_deepspeed throws, all at once);
// empty when it runs it. A plan parasol rejects (validate) throws that error.
Refusals deepspeed_refusals(const Model& model, const Cluster& cluster, const Plan& plan);

// What a ds_config.json does not hold: the model-parallel degrees and Megatron's sequence
// parallelism that Megatron-DeepSpeed takes as command-line arguments
// (--tensor-model-parallel-size, --pipeline-model-parallel-size, --sequence-parallel), and
// DeepSpeed's Ulysses sequence-parallel degree (--ds-sequence-parallel-size), which a parasol
// plan holds as cp with cp_comm_type a2a (all-to-all over heads).
struct DeepSpeedParallelism {
  int tp = 1;
  int pp = 1;
  bool sequence_parallel = false;
  int ulysses = 1;
};

// Reads a parsed ds_config.json of a job on `gpus` GPUs into a plan JSON (plan_from_json
// reads it): dp = gpus / (tp x pp x ulysses), the ZeRO stage, overlap_comm, MiCS shard size,
// offload, precision, gradient dtype, micro and global batch (DeepSpeed's rule train_batch_size =
// train_micro_batch_size_per_gpu x gradient_accumulation_steps x dp; any two of the three
// suffice), full recompute when an activation_checkpointing block is present, and Ulysses
// sequence parallelism (cp = ulysses, cp_comm_type a2a) from mp.ulysses or the config's
// sequence_parallel_size key (which DeepSpeed divides the world by for the batch rule when no
// mpu is given: runtime/config.py L721-722; Hugging Face's UlyssesSPAttentionHF); where both
// say it they must agree. "auto" values
// (the Hugging Face Trainer's) count as absent and are derived from the other batch keys, as
// DeepSpeed derives them. Throws parasol::Error naming the key ("deepspeed.train_batch_size:
// ...") for inconsistent or underivable batch keys, values parasol cannot represent (nvme
// offload, ZeRO++ hpZ, Ulysses with tensor, pipeline or Megatron sequence parallelism, which
// Megatron-DeepSpeed refuses) or "auto" where nothing else gives the value.
// REQUIRES: gpus >= 1. Fields the config does not carry keep the Plan defaults.
ImportedJob import_deepspeed(const Json& config, int gpus, const DeepSpeedParallelism& mp = {});

// Whether `j` reads as a DeepSpeed config: a JSON object with DeepSpeed's batch or ZeRO keys and
// none of a parasol plan's degrees (tp, pp, dp).
bool looks_like_deepspeed_config(const Json& j);

}  // namespace parasol::interop
