// Compute beside communication: how much slower a device's compute runs while collectives run
// beside it. One rule, read by both predictors: the event simulator (sim/engine.cc) slows a
// stage's running compute by compute_slowdown() for the kinds of communication running at each
// instant; the closed-form estimate (cost_models/estimate.cc), which knows only how many seconds
// of each kind hide behind a micro-batch's compute, charges overlap_seconds(), the same rule
// integrated over that compute.
//
// Two kinds of communication slow compute differently (cost_models/profile.h):
//  - the tensor-, context- and expert-parallel collectives and the pipeline's sends:
//    Profile::overlap_compute_slowdown (NCCL's or Transformer Engine's userbuffers' SMs and HBM
//    traffic; userbuffers size their GEMMs to the SMs they leave: TE's comm_gemm_overlap.cpp,
//    `_math_sms = sm_count - num_comm_sm`);
//  - the data-parallel groups' collectives (gradient reductions, ZeRO-3 / FSDP gathers) and the
//    expert all-to-alls (holds_gemm_sms): Profile::dp_overlap_compute_slowdown (Hopper: cuBLAS's
//    persistent GEMMs, one block per SM, run a second wave on the SMs NCCL leaves,
//    pytorch/pytorch#143988 and PR #147966).
// When both run, each takes its share of what the other leaves: the rates multiply,
// 1 - (1 - s)(1 - s_dp). A GEMM sized to the SMs the tensor-parallel overlap leaves runs at
// 1 - s; a data-parallel NCCL kernel launched beside it holds SMs that grid counted on, so its
// blocks run two waves on them (x (1 - s_dp)). Where no GEMM is persistent, two NCCL kernels hold
// two sets of SMs, each a share of what the other leaves. Several collectives of one kind at once
// count once: the rule's inputs are the kinds running, not the kernels.
#pragma once

#include <algorithm>

#include "core/rank_layout.h"
#include "cost_models/profile.h"

namespace parasol::cost {

// is_data_parallel(Group): core/rank_layout.h (the lowering's data-parallel stream reads it too).
using parasol::is_data_parallel;

// Whether a collective of group `g` holds SMs that the GEMMs it overlaps were sized to use: the
// data-parallel groups' (no framework carves SMs out of the GEMMs for them) and the expert
// all-to-alls that Megatron-Core's --overlap-moe-expert-parallel-comm runs beside the other
// micro-batch's compute (NCCL's, or DeepEP's and HybridEP's kernels on their 20-32 SMs):
// Transformer Engine's GEMMs use every SM unless NVTE_EXT_MARGIN_SM is set ("Set an external
// SM Margin to all the GEMMs. This comes in handy when DP is overlapped with GEMMs":
// NVIDIA/TransformerEngine@d0067d0 transformer_engine/pytorch/csrc/extensions/gemm.cpp L281-285,
// cpp_extensions/gemm.py L520 for the grouped GEMM), which Megatron-Bridge's recipes leave unset
// (@3a9559f01: only NVTE_FWD/BWD_LAYERNORM_SM_MARGIN, for the norms). Tensor-parallel overlap
// (userbuffers) sizes its GEMMs to the SMs it leaves: not these.
inline bool holds_gemm_sms(Group g) { return is_data_parallel(g) || g == Group::kEp; }

// The fraction of its standalone rate that a device's compute loses while communication runs
// beside it: `other` (tensor-, context-, expert-parallel collectives, pipeline sends) and/or
// `data_parallel` (the data-parallel groups' collectives). 0 when neither runs; each slowdown is
// clamped to [0, 0.99] so that compute always progresses.
inline double compute_slowdown(const Profile& f, bool other, bool data_parallel) {
  const double s = other ? std::clamp(f.overlap_compute_slowdown, 0.0, 0.99) : 0.0;
  const double s_dp = data_parallel ? std::clamp(f.dp_overlap_compute_slowdown, 0.0, 0.99) : 0.0;
  return 1 - (1 - s) * (1 - s_dp);
}

// Seconds that communication hidden behind `window` seconds of compute adds to it: `other`
// seconds of the first kind and `data_parallel` seconds of the second (each at most `window`),
// each spread over the window independently of the other, so that both run for
// other x data_parallel / window seconds of it. compute_slowdown() of the kinds running, over
// the window: the seconds a simulated compute stream loses to the same overlaps (for compute at
// rate 1 - x beside c seconds of communication, x c).
// REQUIRES: other, data_parallel, window >= 0.
inline double overlap_seconds(const Profile& f, double other, double data_parallel, double window) {
  const double both =
      window > 0 ? std::min({other, data_parallel, other * data_parallel / window}) : 0.0;
  return compute_slowdown(f, true, false) * (other - both) +
         compute_slowdown(f, false, true) * (data_parallel - both) +
         compute_slowdown(f, true, true) * both;
}

// Communication queued on one stream beside a window of compute: `comm` seconds, of which
// `edge` are issued at the window's edge and hide behind none of it (a prefetch issued before the
// window's first compute, reductions of what its last compute produced); the rest is issued as
// the compute goes, from the window's start on. Played first in, first out, the queue ends at
// the later of the window's end plus the edge and its start plus all of it.
struct QueuedComm {
  double comm = 0, edge = 0;
  void add(double seconds, double at_edge) {
    comm += seconds;
    edge += at_edge;
  }
  // The seconds of it that outlast `window` seconds of compute.
  double exposed(double window) const { return comm > 0 ? std::max(edge, comm - window) : 0; }
  // Of those, the ones by which the queue outlasts the window beside it, before its edge: the
  // compute slowed by them (compute_slowdown()) ends no later until it outlasts them. None
  // where no compute runs beside the queue (`window` 0: nothing to slow).
  double excess(double window) const {
    return window > 0 ? std::max(0.0, comm - edge - window) : 0.0;
  }
};

}  // namespace parasol::cost
