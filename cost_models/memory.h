// Memory cost model: bytes per rank of weights, gradients, optimizer state (per ZeRO stage and
// precision), saved activations (Korthikanti et al. 2022, generalised to GQA, SwiGLU, MoE,
// flash attention and context parallelism), in-flight micro-batches per pipeline schedule,
// offloaded state, and communication/workspace buffers. A breakdown, not just a total.
#pragma once

#include <string>
#include <vector>

#include "core/cluster.h"
#include "core/model.h"
#include "core/plan.h"

namespace parasol::cost {

// Saved-activation bytes of one layer for one micro-batch on one rank.
// `recompute` is the policy applied to this layer (full keeps only the layer input).
double layer_activation_bytes(const Model& m, const Plan& p, Recompute recompute, bool moe_layer);

// LoRA (Plan::lora_rank): the adapter parameters of one layer on one rank, r (in + out) for each
// target linear [in x out] of core/layer_shapes.h (whole: LoRA is lowered at tp 1); 0 without
// LoRA. REQUIRES: a dense model.
double lora_layer_params(const Model& m, const Plan& p);

// Parameters held by one rank of pipeline stage `stage` before any ZeRO sharding (tensor- and
// expert-parallel shards, MLA's replicated down-projections whole; the stage's own layers,
// uneven stages included; embedding on the first stage, head on the last). Under LoRA the trained
// ones only: the adapters (the frozen base weights are stage_params of the plan without LoRA).
struct StageParams {
  double dense = 0;   // replicated over dp (sharded by ZeRO over dp x cp)
  double expert = 0;  // replicated over dp / ep (sharded by ZeRO over (dp / ep) x cp)
  double total() const { return dense + expert; }
  // The same parameters in the lowering's buckets (core/lower_buckets.cc build_buckets): one
  // dense bucket per layer (a dense layer's, or an MoE layer's attention, norms, router and
  // shared experts), one expert bucket per MoE layer, the embedding's on the first stage and the
  // head's (final norm, and the output layer unless tied on one stage) on the last; 0 elsewhere.
  int dense_layers = 0, moe_layers = 0;
  double dense_layer = 0, moe_layer = 0, expert_layer = 0;
  double embedding = 0, head = 0;
  bool first_layer_moe = false;  // the stage's first layer is an MoE layer
};
StageParams stage_params(const Model& m, const Plan& p, int stage);
// The same with the model's parameter counts (param_counts(m)) computed once by the caller.
StageParams stage_params(const Model& m, const ParamCounts& counts, const Plan& p, int stage);

// Micro-batches whose activations stage `stage` holds at its peak, in units of the whole
// stage's activations (interleaved stages hold fractions of chunks).
double in_flight_micro_batches(const Plan& p, int stage);

struct MemoryBreakdown {
  double weights = 0;      // low-precision (or fp32) weights on the device
  double gradients = 0;    // gradient buffers on the device
  double optimizer = 0;    // master weights and Adam moments on the device
  double activations = 0;  // saved activations of in-flight micro-batches
  double transient = 0;    // the working set of the op in flight (recompute, logits, gathers)
  double buffers = 0;      // communication buckets, workspaces, CUDA context
  double host = 0;         // bytes moved to host memory by offload
  double total() const {
    return weights + gradients + optimizer + activations + transient + buffers;
  }
};

// Device memory the training process holds besides its tensors: CUDA context, library
// workspaces, communication buffers and the caching allocator's reserve (see memory.cc).
double runtime_overhead_bytes(const Cluster& c, const Plan& p);
// Host memory of one server that offload may fill (bytes).
double host_memory_pinnable_bytes(const Cluster& c);

// Peak device memory of one rank of `stage` (-1: the stage with the largest total).
MemoryBreakdown memory_per_rank(const Model& m, const Cluster& c, const Plan& p, int stage = -1);

// Peak device memory of one rank of each pipeline stage, stage 0 first (frameworks measure one
// given rank: Megatron's CI the last stage).
std::vector<MemoryBreakdown> memory_per_stage(const Model& m, const Cluster& c, const Plan& p);

}  // namespace parasol::cost
