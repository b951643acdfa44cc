// Plan::fp8_param_gather's fp8 parameters (Megatron-Core --fp8-param-gather, Transformer Engine
// fp8 weights): which weights are stored in fp8, how many elements of them a rank holds, and
// whether the device keeps a transposed copy of each: the one rule the lowering's buckets and the
// closed-form estimate share.
#pragma once

#include <cstdint>

#include "core/device.h"
#include "core/layer_shapes.h"
#include "core/model.h"

namespace parasol {

// Whether linear `s`'s weight is an fp8 parameter under Plan::fp8_param_gather: every linear
// Transformer Engine runs in fp8 (attention, MLP, shared-expert and expert linears, MLA's
// projections) but the MoE router, which Megatron-Core keeps outside fp8. Biases, norms, the
// embedding and the output layer stay in the parameter dtype.
bool fp8_param_linear(const LinearShape& s);

// Whether Transformer Engine keeps a 1-byte transposed copy of each fp8 weight on device `d`
// (Float8Tensor's _transpose, the column-wise data of its quantizer): where the device's fp8 GEMMs
// take TN operands only. TE's is_non_tn_fp8_gemm_supported (transformer_engine/pytorch/utils.py,
// and nvte_is_non_tn_fp8_gemm_supported in common/transformer_engine.cpp, @d0067d0d) is true for
// compute capability 10.x-11.x and from 13.0 (the datacenter Blackwell GPUs: GB200, B200); there
// the quantizer keeps the row-wise data only (pytorch/csrc/quantizer.cpp: with_transpose =
// columnwise_usage && !is_non_tn_fp8_gemm_supported) and the GEMMs read it in either layout.
// Devices without a CUDA compute capability (AMD) keep the transpose as Hopper does.
bool fp8_weight_transpose_kept(const DeviceSpec& d);

// Elements of linear `s`'s weight (no bias) on one rank of its `parts`-way split.
double linear_weight_elements(const LinearShape& s, int64_t parts);

// Elements of fp8 parameters on one tensor-parallel rank (`tp` ways) in layer `layer`'s dense
// bucket (its attention and MLP linears), and in an MoE layer's expert bucket (`local_experts`
// experts' linears split `expert_tp` ways).
double fp8_dense_layer_elements(const Model& m, int64_t tp, int layer);
double fp8_expert_layer_elements(const Model& m, int64_t expert_tp, int64_t local_experts);

}  // namespace parasol
