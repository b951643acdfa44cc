// DeepSpeed ZeRO-3's lazily gathered modules played against a micro-batch's compute: the closed
// form's price of the schedule that core/zero3_live.h computes and core/lower_buckets.cc lowers
// (one all-gather per fetch step and layer, issued before the use that reaches the step, with no
// dependency; one reduce-scatter per reduce bucket, issued once its last gradient is written), on
// one data-parallel stream played first in, first out, beside the compute stream whose use waits
// for the all-gather carrying its module. A reduce-scatter waits for the backward that produced
// its gradients, and the gathers queued behind it wait with it: the one-module-ahead prefetch
// cannot run further ahead of the compute than that, which a queue that lets any gather hide
// behind any compute (cost_models/compute_overlap.h QueuedComm) does not see.
#pragma once

#include <vector>

namespace parasol::cost {

// One micro-batch of a stage, use by use (core/zero3_live.h's DsSchedule indices).
struct Zero3Uses {
  // Compute seconds of each use: from the op that first reads the module's weights to the op
  // that first reads the next use's (cost_models/layer_fragment.h module_use_seconds).
  std::vector<double> compute;
  // Seconds of the all-gathers issued just before each use (those fetched at that step), in issue
  // order.
  std::vector<std::vector<double>> gathers;
  // Which gather carries the copy each use reads: (use at which it was issued, index into that
  // use's gathers).
  std::vector<int> gather_use, gather_index;
  // Seconds of the reduce-scatters issued after each use (the buckets whose last gradient it
  // writes), in issue order.
  std::vector<std::vector<double>> reduces;
  // Compute seconds outside the layers' uses, issued before the first use (none gathered: the
  // embedding's and head's buckets queue as before), between the forward and the backward (the
  // head and loss), and after the last use.
  double before = 0, middle = 0, after = 0;
  int middle_at = 0;  // the use before which `middle` runs
  // The host waits for each reduce-scatter before it issues more (DeepSpeed ZeRO-3 with the
  // optimizer offloaded: core/offload_rules.h gradient_copies_block_host).
  bool blocking = false;
};

// What the play of one micro-batch gives, in seconds: `comm` of communication of which `exposed`
// leave the compute stream idle (the rest is hidden), and `slowed` added to the compute while the
// communication runs beside it (compute_overlap.h's rate rule, `slowdown` the fraction lost).
// exposed + slowed + the uses' compute is the micro-batch's length on the stage.
struct Zero3Play {
  double comm = 0, exposed = 0, slowed = 0;
};

// REQUIRES: every vector of `u` holds one entry per use; gather_use[i] <= i and
// gather_index[i] indexes gathers[gather_use[i]]; 0 <= slowdown < 1.
Zero3Play play_zero3_uses(const Zero3Uses& u, double slowdown);

}  // namespace parasol::cost
