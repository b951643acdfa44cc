// DeepSpeed ZeRO-3's parameter coordinator as a schedule over a stage's module uses: which module
// is gathered when, which gathered copy each use reads, and the most elements live at once. One
// rule that the closed-form memory (cost_models/memory.cc) and the lowering (core/lower_buckets.cc,
// one buffer per gathered module, each gathered lazily at the use the coordinator fetches it)
// both read, under the plans ds_lazy_gathers() names.
#pragma once

#include <cstdint>
#include <vector>

#include "core/model.h"
#include "core/plan.h"

namespace parasol {

// A walk of DeepSpeed's PartitionedParameterCoordinator (partitioned_param_coordinator.py
// @v0.6.2 32d9797, fetch_sub_module #L210-297, __params_to_release #L357-378) over a trace of
// module uses (core/gather_units.h deepspeed_live_peak states the rule).
struct DsSchedule {
  // fetch_step[i]: the use at which the gathered copy that use i reads was fetched (on demand
  // or prefetched); source[i]: the first use that reads that copy (the copy's name).
  std::vector<int> fetch_step, source;
  // live[i]: the elements live at use i, after its fetch and prefetch, before its release.
  std::vector<double> live;
  double peak = 0;  // the most elements live at once: the largest of live
  // From ds_stage_schedule: the use at which each micro-batch's backward starts (its last
  // layer's last module, read by the first backward op).
  std::vector<int> first_backward;
};
DsSchedule deepspeed_schedule(const std::vector<double>& trace, const std::vector<int>& module,
                              double prefetch_bucket, double max_live, double max_reuse);

// Whether the plan's ZeRO-3 runs DeepSpeed's coordinator with lazily gathered modules in both
// predictors: zero3_unit module, resharded after the forward, parameters not offloaded, one
// stage of dense layers (DeepSpeed's pipeline engine does not run ZeRO-3), no tensor
// parallelism (its norm-gradient all-reduce is not split per module), no PyTorch FSDP copies
// (fsdp_impl none), each micro-batch's forward followed by its backward (not GPipe's order, which
// the trace does not follow). Their gradients are DeepSpeed's too: each module's in the parameters'
// dtype, reduce-scattered once its reduce bucket (zero3_reduce_bucket, core/gather_units.h
// reduce_calls) is complete, then freed. Other plans gather each layer's bucket whole, one
// layer ahead.
bool ds_lazy_gathers(const Model& m, const Plan& p);

// The module-use trace of one micro-batch on the stage's layers (layer `first` on, `count` of
// them): each layer's modules (core/gather_units.h dense_layer_weights) in forward order, then
// per layer from the last: under full recompute its modules in forward order (the recompute)
// then in reverse (the backward), else in reverse. Module ids: layer index x modules + module.
struct DsTrace {
  enum Use : uint8_t { kForward, kRecompute, kBackward };
  std::vector<double> elements;
  std::vector<int> module;
  std::vector<Use> use;    // which pass each use belongs to
  int per_layer = 0;       // modules of a layer
  int first_backward = 0;  // the first backward use: the last layer's last module
};
DsTrace ds_stage_trace(const Model& m, const Plan& p, int first, int count);

// The trace repeated for `micro_batches` micro-batches (pp = 1: forward then backward of each).
DsSchedule ds_stage_schedule(const Model& m, const Plan& p, int first, int count,
                             int micro_batches);

}  // namespace parasol
