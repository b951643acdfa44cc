// Megatron-LM: a plan as pretrain_gpt.py's arguments and a torchrun launch script, and an
// existing job's arguments read back as a model and a plan.
#pragma once

#include <string>

#include "core/cluster.h"
#include "core/model.h"
#include "core/plan.h"
#include "interop/interop.h"

namespace parasol::interop {

// The arguments and launch script of `plan` for `model` on `cluster`: two files,
// megatron_args.txt (the bash arrays MODEL_ARGS, TRAINING_ARGS, MODEL_PARALLEL_ARGS, to source
// or to read back with import_megatron) and launch_megatron.sh (the same arrays and the torchrun
// line; executable). Throws parasol::Error naming the plan (or model) field Megatron cannot
// express (for example plan.schedule for GPipe).
Export export_megatron(const Model& model, const Cluster& cluster, const Plan& plan);

// Every reason Megatron-LM refuses `plan` on `cluster` (what export_megatron throws, all at once);
// empty when it runs it.
Refusals megatron_refusals(const Model& model, const Cluster& cluster, const Plan& plan);

// Reads a Megatron job from the text of a launch script or argument list: `torchrun ...
// pretrain_gpt.py --flag v ...` lines, backslash continuations, bash arrays (MODEL_ARGS=( ... )),
// comments, command substitutions ($(...), kept as one word), and simple variables (X=8 ...
// --tensor-model-parallel-size $X). Gives the model (named `name`), the plan JSON and, when the
// text says it (torchrun's --nproc_per_node x --nnodes, DeepSpeed's --num_nodes x --num_gpus)
// or `gpus` > 0 gives it (`--gpus`, used when the text does not), the GPU count; the plan's dp is
// set only then. Flags that do not change the plan (data, logging, learning rate, checkpoints)
// are ignored; any other flag parasol does not read, and any value parasol cannot express
// (--moe-token-dispatcher-type foo, ...), is an Error naming the flag.
// Megatron-DeepSpeed's arguments (deepspeedai/Megatron-DeepSpeed 4efb479, the launcher
// export_deepspeed writes) are read too: --num-key-value-heads, --normalization rmsnorm,
// --use-rotary-position-embeddings, --rotary-position-embeddings-theta, --use-flash-attn-v2,
// --zero-stage, --deepspeed-activation-checkpointing, --checkpoint-in-cpu; with --deepspeed the
// ZeRO, precision, overlap and offload fields come from `deepspeed_config` (the parsed
// ds_config.json that --deepspeed_config names; import_deepspeed), and without it the import is
// an Error naming --deepspeed_config.
ImportedJob import_megatron(const std::string& text, const std::string& name = "megatron-import",
                            int gpus = 0, const Json* deepspeed_config = nullptr);

// True when `text` is not JSON and has Megatron's flags (--num-layers, or
// --tensor-model-parallel-size, or pretrain_gpt.py): what `--plan FILE` reads with
// import_megatron.
bool looks_like_megatron_args(const std::string& text);

}  // namespace parasol::interop
