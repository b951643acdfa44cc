// Transformer Engine's cached fp8 copies of bf16 weights: under fp8 without
// Plan::fp8_param_gather, TE quantizes each fp8 linear's weight on a micro-batch's first forward
// and keeps the copy for the step's other micro-batches (and, updated in place, for the next
// steps): persistent device memory beside the weights. The one rule the lowering's buffers
// (core/lower_buckets.cc) and the closed-form memory (cost_models/memory.cc) share.
#pragma once

#include "core/plan.h"

namespace parasol {

// Bytes TE keeps per element of each fp8 linear's weight (core/fp8_params.h fp8_param_linear),
// 0 where it keeps none, on a device that keeps a transpose of an fp8 weight or not
// (`transpose_kept`: core/fp8_params.h fp8_weight_transpose_kept). Megatron-Core's TE linears
// pass is_first_microbatch unless disable_parameter_transpose_cache (megatron/core/extensions/
// transformer_engine.py @d98e8a6: TELinear.forward, TELayerNormColumnParallelLinear,
// TEGroupedLinear), and TE then caches the quantized weight in the module's _fp8_workspaces
// (transformer_engine/pytorch/module/linear.py @d0067d0d: cache_name "weight" unless
// is_first_microbatch is None or is_fsdp2; layernorm_linear.py, layernorm_mlp.py,
// grouped_linear.py alike). In training the weight's quantizer has column-wise usage too
// (linear.py: columnwise_usage = is_grad_enabled and inp.requires_grad), so a Float8Tensor keeps
// its 1-byte data and, where the device keeps one, its 1-byte transpose. Counted for the
// per-tensor recipes (delayed, tensorwise) under transformer_impl te, fp8 precision, no
// fp8_param_gather (the weights are TE's fp8 parameters already), ZeRO < 3 and parameters on the
// device; the MXFP8 and blockwise recipes' copies (their scale layouts) are not counted.
double te_cached_fp8_weight_bytes(const Plan& p, bool transpose_kept);

}  // namespace parasol
