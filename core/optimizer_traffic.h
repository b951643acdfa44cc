// The optimizer step's memory traffic per parameter, the one description that the lowering
// (core/lower_optimizer.cc, its AdamW and cast ops) and the closed-form cost model
// (cost_models/compute.cc, adam_bytes_per_param) both read, so that they cannot drift apart.
#pragma once

#include "core/device.h"

namespace parasol {

// The dtype the model's weights are stored in under a plan's precision: fp32 and fp16 as given,
// bf16 otherwise (fp8 training keeps bf16 weights; Transformer Engine casts them per GEMM).
inline Dtype weight_dtype(Dtype precision) {
  return precision == Dtype::kFp32 || precision == Dtype::kFp16 ? precision : Dtype::kBf16;
}

// HBM bytes per parameter of one AdamW step, as Megatron-LM's (distributed) optimizer runs it.
struct AdamTraffic {
  // The fused Adam kernel. fp32 state: read the master weight, gradient, m and v (16 bytes) and
  // write master, m and v (12). Pure bf16 state: the same seven accesses at 2 bytes each.
  double step = 0;
  // Copying the updated fp32 master into the low-precision weights (Megatron's
  // _copy_main_params_to_model_params): read 4 bytes, write the weight. 0 when the weights are
  // their own master (fp32 weights, or pure bf16 state).
  double cast = 0;
  double total() const { return step + cast; }
};

// `separate_master`: the fp32 master weights live in the optimizer state apart from the weights
// (low-precision weights with fp32 state, or an offloaded optimizer).
inline AdamTraffic adam_traffic_per_param(Dtype weights, Dtype state, bool separate_master) {
  const double step = state == Dtype::kBf16 ? 7.0 * 2 : 16.0 + 12.0;
  return {step, separate_master ? 4.0 + dtype_bytes(weights) : 0.0};
}

// HBM bytes per parameter of the global gradient norm before the step: each gradient of this
// rank's shard read once as fp32 (Megatron's clip_grad_norm over the main gradients).
inline constexpr double kGradNormBytesPerParam = 4.0;
// HBM bytes per parameter of Megatron's count_zeros_fp32 (--log-num-zeros-in-grad): on CUDA
// count_nonzero is `(self != 0).sum()` (aten/src/ATen/native/ReduceOps.cpp count_nonzero_cuda),
// so each fp32 gradient is read (4) into a bool tensor (written 1, read back 1 by the sum).
inline constexpr double kCountZerosBytesPerParam = 6.0;
// HBM bytes per parameter of Megatron's calc_params_l2_norm (--log-params-norm): a multi-tensor
// L2 norm reading each fp32 main parameter of this rank once.
inline constexpr double kParamNormBytesPerParam = 4.0;

// The same for a plan's precision and optimizer dtype, with the master kept apart exactly when
// the weights are not fp32 and the state is.
inline AdamTraffic adam_traffic_per_param(Dtype precision, Dtype state) {
  const Dtype w = weight_dtype(precision);
  return adam_traffic_per_param(w, state, w != Dtype::kFp32 && state != Dtype::kBf16);
}

}  // namespace parasol
