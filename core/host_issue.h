// The host issue rule: one statement of how the host thread paces a Program, read by every
// predictor (sim/engine plays it op by op; cost_models/layer_fragment and the closed-form estimate
// play it per fragment and per segment), and the marking of the ops that CUDA graphs and
// torch.compile issue differently (Op::host_issue).
//
// The rule. The host issues a Program's ops one after another in Program order, each after the
// host time it costs (cost_models/host_cost.h prices it from Op::host_issue and the plan). An op
// starts no earlier than the host has issued it (besides its dependencies and its stream). A
// device-to-host sync (OpKind::kSync, on the host stream) blocks the host until the device work
// it waits for (its deps) has finished; the host then wakes up after the sync's price and goes on
// issuing. So a step is host-bound where the host takes longer to issue a stretch of ops than
// the device takes to run them, and every sync throws away the lead the host had built.
#pragma once

#include <algorithm>

#include "core/model.h"
#include "core/plan.h"
#include "core/program.h"

namespace parasol {

// The host's place in time as it issues the ops of one rank's Program.
struct HostCursor {
  double t = 0;  // when the host is free to issue the next op (seconds)
  // Issues an op that costs the host `host_s`; returns when it is issued (its earliest start).
  double issue(double host_s) {
    t += host_s;
    return t;
  }
  // A sync issued at the cursor whose device work is done at `device_done`: the host blocks until
  // then and wakes after `wake_s`. Returns when the host goes on.
  double sync(double device_done, double wake_s) {
    t = std::max(t, device_done) + wake_s;
    return t;
  }
};

// The same rule for a stretch of ops between two syncs, as the closed form prices it: the host
// issues them in `host_s` and the device runs them in `device_s` once issued; the stretch takes
// the longer of the two (the host's lead or the device's backlog absorbs the rest).
inline double host_paced(double host_s, double device_s) { return std::max(host_s, device_s); }

// Marks how the host issues each op of `program` under `plan` (Op::host_issue):
//  cuda_graphs layers: each dense decoder layer's forward, backward or recompute for one
//    micro-batch (its compute and layer-communication ops) is one graph, replayed at its first
//    op (Megatron-Core's per-layer graphs; MoE layers, whose dropless token counts sync, stay
//    eager);
//  cuda_graphs full_iteration: every op outside the optimizer step is one graph, replayed at the
//    first;
//  torch_compile (without a graph over the op): each layer's pass is a compiled region entered at
//    its first op; an element-wise op right after another of the region is fused into it.
// Everything else stays eager.
void mark_host_issue(const Model& model, const Plan& plan, Program& program);

}  // namespace parasol
