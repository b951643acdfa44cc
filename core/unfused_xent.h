// Megatron-Core's unfused vocab-parallel cross entropy (Plan::cross_entropy_loss_fusion off),
// kernel by kernel: one list that the lowering (core/lower_edges.cc) emits as ops and the
// closed-form estimate (cost_models/estimate.cc) prices, so both predictors read the same kernels.
//
// Source: NVIDIA/Megatron-LM @d98e8a64dd megatron/core/tensor_parallel/cross_entropy.py
// (_VocabParallelCrossEntropy, called by language_module.py compute_language_model_loss when
// cross_entropy_loss_fusion is off, its default: model_parallel_config.py L320). Its forward and
// backward are a Python autograd.Function, each tensor operation a kernel issued from Python:
//   forward  calculate_logits_max: `.float()` of the logits (a copy unless they are fp32), the
//            row max; [all-reduce max]; calculate_predicted_logits: `-= logits_max` in place,
//            the target mask (`<`, `>=`, `|`), `target.clone() - start`, `masked_target[mask] =
//            0`, `arange`, the gather `logits_2d[arange, masked_target]`, its `.clone()`,
//            `predicted_logits[mask] = 0`, `torch.exp(out=)` in place, `.sum(-1)`; [all-reduce
//            predicted, all-reduce sums]; calculate_cross_entropy_loss: `torch.log(sum)`, the
//            `- predicted`, `exp_logits.div_(sum)` in place (the softmax it saves).
//   backward prepare_gradient_calculation_operands: `target_mask.float()`, `1.0 - ...`,
//            `arange`; calculate_gradients: `grad_2d[arange, masked_target] -= update` (a gather,
//            the subtraction and an index_put_), `grad_input.mul_(grad_output)` in place; then
//            the autograd engine casts the fp32 gradient it returns to the logits' dtype
//            (torch/csrc/autograd/engine.cpp validate_outputs: a gradient whose dtype differs from
//            its input's is converted), a kernel issued from C++; none for fp32 logits, whose
//            gradient the mul_ writes.
// Bytes are HBM bytes read plus written: fp32 logits 4, the logits' own element `eb` (2 in bf16
// and fp16), targets and indices int64 (8), the mask bool (1), per-token floats fp32 (4). The
// TP all-reduces are the lowering's collectives, not listed here.
#pragma once

#include <vector>

#include "core/program.h"

namespace parasol {

// Which op of the fused loss's lowering a kernel of the unfused one takes the place of: the
// executor runs those ops' arithmetic (the row maximum, the sums and the softmax, the gradient);
// a kernel that stands for none is an op of its own (OpRole::kXentUnfused).
enum class XentStandsFor { kNone, kMax, kSums, kGradient };

struct XentKernel {
  const char* name;    // the op's name after "xent."
  double logit_bytes;  // bytes per logit of this rank's vocab slice (0: a per-token kernel)
  double token_bytes;  // bytes per token (a per-token kernel's whole traffic)
  bool python = true;  // issued from Python (false: the autograd engine's C++ thread)
  XentStandsFor stands_for = XentStandsFor::kNone;
};

// The unfused loss's kernels in issue order for `phase` (kForward or kBackward) on logits of
// `eb` bytes an element (the `.float()` copy is no kernel when eb is 4).
std::vector<XentKernel> unfused_xent_kernels(Phase phase, double eb);

}  // namespace parasol
