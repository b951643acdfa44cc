// ZeRO-3 collective granularity: how many all-gathers and reduce-scatters of what size a
// framework issues for one layer's parameters (Plan::zero3_unit), the one rule that the lowering
// (core/lower_buckets.cc, the calls of its gather and reduce-scatter ops) and the closed-form
// estimate (cost_models/estimate.cc, ZeRO-3's data-parallel traffic) both read.
#pragma once

#include <cstdint>
#include <vector>

#include "core/model.h"
#include "core/plan.h"

namespace parasol {

// DeepSpeed ZeRO-3's defaults (deepspeedai/DeepSpeed@edaa722, deepspeed/runtime/zero/config.py,
// unchanged since v0.5.10): stage3_prefetch_bucket_size = 5e7 elements (#L215) and
// reduce_bucket_size = 5e8 elements (#L113).
inline constexpr double kDeepSpeedPrefetchBucketElements = 5e7;
inline constexpr double kDeepSpeedReduceBucketElements = 5e8;

// Elements of each call when weights of `weights` elements (in the order they are used) are
// gathered whole, consecutive ones added to one call until it holds at least `bucket` elements
// (DeepSpeed's fetch_sub_module, partitioned_param_coordinator.py #L452-484: the parameters of
// the module and those prefetched after it go into one all-gather until the prefetch bucket is
// reached); the last call holds the rest. bucket <= 0: one call of all.
std::vector<double> gather_calls(const std::vector<double>& weights, double bucket);

// Elements of each call when gradients of `weights` elements (in the order they are produced)
// are reduced in buckets of at most `bucket` elements: a gradient that would overflow the bucket
// first reduces what it holds (DeepSpeed stage3.py #L1570-1617; a gradient larger than the
// bucket is reduced alone). bucket <= 0: one call of all.
std::vector<double> reduce_calls(const std::vector<double>& weights, double bucket);

// The fractions of a ZeRO-3 unit's all-gather (reduce-scatter) payload that each call carries
// under the plan's zero3_unit: {1} for kLayer; DeepSpeed's buckets for kModule. `weights` in
// forward order (the reduce-scatter takes them in backward order).
std::vector<double> gather_fractions(const Plan& p, const std::vector<double>& weights);
std::vector<double> reduce_fractions(const Plan& p, const std::vector<double>& weights);

// Elements of each module of layer `layer`'s dense part on one tensor-parallel rank, in forward
// order, as the lowering's dense bucket holds them: the pre-attention norm, the attention
// linears (a weight with its bias), the attention norms, the pre-MLP norm, the MLP linears.
std::vector<double> dense_layer_weights(const Model& m, int64_t tp, int layer);

}  // namespace parasol
