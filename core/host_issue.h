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
#include <cmath>
#include <limits>

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

// The same rule for a stretch of ops, reduced to what it does to the two clocks: the host cursor
// h (when the host is free to issue) and the device d (when the device has run everything issued
// so far). Under the rule each is the latest of sums of the other's and the stretch's times, so
// a stretch is the max-plus linear map
//   h' = max(hh + h, hd + d),  d' = max(dh + h, dd + d)
// (kNever where a clock does not reach the other), and stretches compose by the max-plus matrix
// product: the closed form plays a step from its stretches' maps as sim/engine plays it op by op.
// One op issued after host_s and run for device_s on the device's one stream:
// h' = h + host_s, d' = max(h + host_s, d) + device_s. A sync, issued after issue_s, blocks the
// host until the device has finished (its deps: everything issued) and wakes it after wake_s:
// h' = max(h + issue_s, d) + wake_s.
// cost_models/layer_fragment plays a layer's passes on several streams into one map each.
struct HostPace {
  static constexpr double kNever = -std::numeric_limits<double>::infinity();
  double hh = 0, hd = kNever, dh = kNever, dd = 0;  // the identity: nothing issued

  static HostPace op(double host_s, double device_s) {
    return {host_s, kNever, host_s + device_s, device_s};
  }
  // A sync the host issues after issue_s and wakes from wake_s after the device has finished.
  static HostPace sync(double issue_s, double wake_s) {
    return {issue_s + wake_s, wake_s, kNever, 0};
  }
  // This stretch, then `next`.
  HostPace then(const HostPace& next) const {
    return {std::max(next.hh + hh, next.hd + dh), std::max(next.hh + hd, next.hd + dd),
            std::max(next.dh + hh, next.dd + dh), std::max(next.dh + hd, next.dd + dd)};
  }
  // This stretch n times over (n >= 0), by squaring.
  HostPace repeat(int n) const {
    if (n <= 0) return {};
    if (hd == kNever)  // the host never waits: its lead grows by hh, the device's by the longer
      return {n * hh, kNever, dh + (n - 1) * std::max(hh, dd), n * dd};
    HostPace out, sq = *this;
    for (; n > 0; n >>= 1, sq = sq.then(sq))
      if (n & 1) out = out.then(sq);
    return out;
  }
  // The clocks after this stretch n times over (n >= 0) from h and d, without the matrix power:
  // where the host never waits for the device (hd kNever) in closed form (the host's lead grows
  // by hh a stretch, the device's by the longer of the two); else played stretch by stretch
  // until both clocks advance by the same amount, which every later stretch repeats.
  void play(int n, double& h, double& d) const {
    if (n <= 0) return;
    if (hd == kNever) {
      d = std::max(d + n * dd, h + dh + (n - 1) * std::max(hh, dd));
      h += n * hh;
      return;
    }
    for (int k = 0; k < n; ++k) {
      const double h1 = host_after(h, d), d1 = device_after(h, d);
      const double dh1 = h1 - h, dd1 = d1 - d;
      h = h1, d = d1;
      if (std::abs(dh1 - dd1) <= 1e-12 * std::abs(dd1)) {
        h += (n - 1 - k) * dh1;
        d += (n - 1 - k) * dd1;
        return;
      }
    }
  }
  double host_after(double h, double d) const { return std::max(hh + h, hd + d); }
  double device_after(double h, double d) const { return std::max(dh + h, dd + d); }
  // The stretch's length from a host that has just woken with the device idle (after a sync):
  // when the device has finished it.
  double from_sync() const { return std::max(dh, dd); }
};

// The rule's limit for a stretch whose ops each take the host and the device time in the same
// ratio (the host's lead or the device's backlog absorbs the rest): the longer of the two. The
// closed form uses it only where it does not know the stretch op by op (the optimizer's buckets).
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
