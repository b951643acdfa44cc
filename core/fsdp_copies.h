// PyTorch FSDP's own kernels around its collectives (Plan::fsdp_impl): what each moves, the one
// description the lowering (core/lower_buckets.cc) emits and the closed-form estimate
// (cost_models/estimate.cc, data_parallel) prices, so that they cannot drift apart.
//
// FSDP1 (FlatParameter; torch/distributed/fsdp/_runtime_utils.py and flat_param.py, the 2.x
// releases Composer and fms-fsdp run):
//  - each gather of a unit first casts its fp32 shard to the parameter dtype
//    (FlatParamHandle._use_low_precision_shard: _mp_shard.copy_(_local_shard)): read 4, write
//    the parameter dtype, per shard element;
//  - in the backward the unit's gradient is autograd's concatenation of its parameters' views'
//    gradients (the views are split() of the FlatParameter: split_with_sizes_backward is a cat):
//    read and write the parameter dtype per unit element;
//  - _post_backward_hook casts it to the reduce dtype when they differ (flat_param.grad.to(
//    _reduce_dtype)): read the parameter dtype, write the reduce dtype;
//  - the default reduce_scatter_hook (torch/distributed/algorithms/_comm_hooks/default_hooks.py)
//    divides the unsharded gradient in place by the pre-divide factor before the reduce-scatter
//    and the shard by the post-divide factor after it (DefaultState._get_gradient_predivide_factor:
//    the factor doubles from 1 while it divides the world size and the quotient exceeds it; the
//    post-divide factor is the quotient; a factor of 1 skips its division).
// FSDP2 (fully_shard; torch/distributed/_composable/fsdp/_fsdp_collectives.py):
//  - each gather's output is copied out into the unsharded parameters
//    (foreach_all_gather_copy_out: split_with_sizes_copy): read and write the parameter dtype
//    per unit element;
//  - the gradients are copied into the reduce-scatter input, cast to the reduce dtype
//    (foreach_reduce_scatter_copy_in: chunk_cat): read the parameter dtype, write the reduce
//    dtype per unit element.
// The copies of an FSDP2 gather's input (the shard, cast) and the dtype casts of the reduced shard
// are per shard element; FSDP2's are left out (a 1/ways part of the unit's).
#pragma once

#include <vector>

#include "core/device.h"
#include "core/plan.h"

namespace parasol {

// One kernel: `per_unit` bytes per element of the unit's (gathered) parameters plus `per_shard`
// per element of this rank's shard.
struct FsdpCopy {
  const char* what;
  double per_unit = 0;
  double per_shard = 0;
  double bytes(double unit_elements, double shard_elements) const {
    return per_unit * unit_elements + per_shard * shard_elements;
  }
};

// FSDP1's gradient pre-divide factor over `ways` ranks (default_hooks.py DefaultState).
inline int fsdp1_predivide_factor(int ways) {
  int f = 1;
  while (ways % f == 0 && ways / f > f) f *= 2;
  return f;
}

// The kernels of one gather of a unit: before the all-gather (FSDP1's shard cast) and after it
// (FSDP2's copy-out).
inline std::vector<FsdpCopy> fsdp_gather_copies(const Plan& p, bool after) {
  const double wb = dtype_bytes(p.precision == Dtype::kFp32 ? Dtype::kFp32 : Dtype::kBf16);
  if (p.fsdp_impl == FsdpImpl::kFsdp1 && !after && wb < 4) return {{"w.mp_shard", 0, 4 + wb}};
  if (p.fsdp_impl == FsdpImpl::kFsdp2 && after) return {{"w.copy_out", 2 * wb, 0}};
  return {};
}

// The kernels of one reduction of a unit's gradients over `ways` ranks: before the
// reduce-scatter (FSDP1's concatenation, cast and pre-divide; FSDP2's copy-in) and after it
// (FSDP1's post-divide of the shard).
inline std::vector<FsdpCopy> fsdp_reduce_copies(const Plan& p, int ways, bool after) {
  const double wb = dtype_bytes(p.precision == Dtype::kFp32 ? Dtype::kFp32 : Dtype::kBf16);
  const double gb = dtype_bytes(p.grad_reduce_dtype);
  std::vector<FsdpCopy> out;
  if (p.fsdp_impl == FsdpImpl::kFsdp1) {
    const int pre = fsdp1_predivide_factor(ways);
    if (after) {
      if (ways / pre > 1) out.push_back({"g.postdiv", 0, 2 * gb});
      return out;
    }
    out.push_back({"g.flat", 2 * wb, 0});
    if (gb != wb) out.push_back({"g.cast", wb + gb, 0});
    if (pre > 1) out.push_back({"g.prediv", 2 * gb, 0});
  } else if (p.fsdp_impl == FsdpImpl::kFsdp2 && !after) {
    out.push_back({"g.copy_in", wb + gb, 0});
  }
  return out;
}

}  // namespace parasol
