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
// The same calls by the index (into `weights`) of the last gradient each holds: the gradient
// whose write completes the call.
std::vector<size_t> reduce_call_ends(const std::vector<double>& weights, double bucket);

// The fractions of a ZeRO-3 unit's all-gather (reduce-scatter) payload that each call carries
// under the plan's zero3_unit: {1} for kLayer; DeepSpeed's buckets for kModule. `weights` in
// forward order (the reduce-scatter takes them in backward order).
std::vector<double> gather_fractions(const Plan& p, const std::vector<double>& weights);
std::vector<double> reduce_fractions(const Plan& p, const std::vector<double>& weights);

// DeepSpeed ZeRO-3's PartitionedParameterCoordinator (deepspeed/runtime/zero/
// partitioned_param_coordinator.py @v0.6.2 32d9797, fetch_sub_module #L210-297,
// release_sub_module, __params_to_release #L357-378) walked over a trace of module uses, each the
// elements of its parameters (`trace[i]` the module used at step i; modules are told apart by
// `module[i]`, equal ids naming the same parameters): at each step it gathers the module's
// parameters if they are not live, then, while fewer than `max_live` elements are live, prefetches
// the parameters of the modules that follow in the trace until at least
// min(max_live - live, prefetch_bucket) elements are in flight (prefetch_bucket <= 0: none); after
// the use it releases the module's parameters unless the module recurs within `max_reuse`
// elements of the trace that follows. Returns the most elements live at once (at a use, after its
// fetch and prefetch).
double deepspeed_live_peak(const std::vector<double>& trace, const std::vector<int>& module,
                           double prefetch_bucket, double max_live, double max_reuse);

// Under full recompute, the modules of a layer (`weights`, the elements of each in forward
// order) whose parameters DeepSpeed gathers again for the layer's backward after its recompute,
// in the order the backward uses them (last module first): a module's parameters stay gathered
// from its recompute to its backward only when the modules used in between (the rest of the
// recompute after it, the backward before it) hold at most p.zero3_max_reuse_distance elements
// (__params_to_release: the trace is walked from the next use, stopping once the elements
// walked exceed the distance). Empty for zero3_unit layer (FSDP's pre-backward unshard serves
// both).
std::vector<double> regathered_weights(const Plan& p, const std::vector<double>& weights);

// Elements of each module of layer `layer`'s dense part on one tensor-parallel rank, in forward
// order, as the lowering's dense bucket holds them: the pre-attention norm, the attention
// linears (a weight with its bias), the attention norms, the pre-MLP norm, the MLP linears.
std::vector<double> dense_layer_weights(const Model& m, int64_t tp, int layer);

// DeepSpeed ZeRO-3's persistent parameters of layer `layer`'s dense part on one tensor-parallel
// rank (Plan::zero3_param_persistence_threshold): every parameter of fewer elements than the
// threshold, a norm's weight and bias, a linear's bias (deepspeed/runtime/zero/stage3.py @v0.6.2
// 32d9797 persistent_parameters #L1048-1062, `param.ds_numel < self.persistence_threshold`). The
// coordinator never fetches or releases them (partitioned_param_coordinator.py __params_to_release
// #L365, `if not p.ds_persist`); step() releases every parameter and _post_step (#L2247-2253)
// gathers them again, one all-gather per parameter (partition_parameters.py
// _allgather_params_coalesced #L1244-1311: a dist.all_gather per parameter, then
// torch.cuda.synchronize()). Empty unless zero 3 with zero3_unit module.
struct PersistentParam {
  int module = 0;       // its module, an index into dense_layer_weights
  double elements = 0;  // on one tensor-parallel rank
};
std::vector<PersistentParam> persistent_params(const Model& m, const Plan& p, int layer);
// The persistent parameters of every layer of `stage` (each chunk's layers in order): what the
// closed form's memory and its post-step gathers both walk.
std::vector<PersistentParam> stage_persistent_params(const Model& m, const Plan& p, int stage);

// Elements of each module of dense_layer_weights(m, p.tp, layer) that the coordinator gathers:
// the module's less its persistent parameters'.
std::vector<double> gathered_layer_weights(const Model& m, const Plan& p, int layer);

}  // namespace parasol
