// The pipeline schedule: the order in which a stage runs its forward and backward units
// (GPipe, 1F1B, interleaved 1F1B in Megatron's per-stage order; uneven stages only change what a
// unit holds), grouped in steps between two exchanges of activations with the neighbouring
// stages, and which units receive their input from and send their output to a neighbour. The
// lowering (core/lower_schedule.cc) emits a stage's Program in this order, and
// cost_models/pipeline_play.h plays a step from it: one statement of the schedule.
#pragma once

#include <vector>

#include "core/plan.h"

namespace parasol {

// One forward or backward pass of a micro-batch through a chunk (virtual stage) of a stage.
struct PipelineUnit {
  bool forward;
  int chunk, mb;
};

// The forward and backward units of stage `s` in order, in steps: the units run between two
// exchanges of activations with the neighbouring stages. A step is one unit under GPipe and 1F1B
// (Megatron's send_forward_recv_backward and send_backward_recv_forward after each unit of 1F1B's
// steady state); interleaved, one of Megatron's iterations: a forward in the warm-up, a forward
// and a backward in the steady state, a backward in the cool-down. `micro_batches` micro-batches
// (the plan's own in the first form), in p.pipeline_flushes flushes run one after another, each
// the order above over its own micro-batches (numbered on from the flush before).
// REQUIRES: 0 <= s < p.pp, micro_batches >= 1, a multiple of p.pipeline_flushes.
std::vector<std::vector<PipelineUnit>> pipeline_steps(const Plan& p, int s, int micro_batches);
std::vector<std::vector<PipelineUnit>> pipeline_steps(const Plan& p, int s);

// The k-th forward (or backward) unit a stage runs, k from 0: micro-batch k of its one chunk, or
// interleaved, Megatron's order (groups of pp micro-batches through each chunk in turn; the
// backward's chunks last first).
inline PipelineUnit pipeline_unit(const Plan& p, int k, bool forward) {
  if (p.schedule != Schedule::kInterleaved) return {forward, 0, k};
  const int pp = p.pp, vpp = p.vpp;
  const int c = (k / pp) % vpp;
  return {forward, forward ? c : vpp - 1 - c, (k / (pp * vpp)) * pp + k % pp};
}

// The forward units stage `s` runs before its first backward in pipeline_steps' order (the
// warm-up: GPipe all of them; 1F1B pp - s - 1; interleaved Megatron's (pp - s - 1) * 2 +
// (vpp - 1) * pp, one more under combined 1F1B, Plan::ep_comm_overlap, so that no steady step
// pairs a chunk's forward with its own backward: schedules.py get_pp_rank_microbatches at
// d98e8a6), at most the units there are; of the first flush (p.pipeline_flushes).
// REQUIRES: 0 <= s < p.pp, micro_batches >= 1, a multiple of p.pipeline_flushes.
int pipeline_warmup_units(const Plan& p, int s, int micro_batches);

// The most forward units of stage `s` whose backward has not yet run, at any point of
// pipeline_steps' order (the warm-up and the steady state's first forward): the units whose
// saved activations the stage holds at its peak (a flush's: each flush drains the one before).
int pipeline_units_in_flight(const Plan& p, int s, int micro_batches);

// The virtual stage unit `u` of stage `s` runs: chunk * pp + s.
inline int virtual_stage(const Plan& p, int s, const PipelineUnit& u) { return u.chunk * p.pp + s; }

// Whether unit `u` of stage `s` receives its input from a neighbour (every forward but the first
// virtual stage's, every backward but the last's) and sends its output to one (every forward but
// the last virtual stage's, every backward but the first's).
inline bool receives_input(const Plan& p, int s, const PipelineUnit& u) {
  const int v = virtual_stage(p, s, u);
  return u.forward ? v != 0 : v != p.pp * p.chunks() - 1;
}
inline bool sends_output(const Plan& p, int s, const PipelineUnit& u) {
  const int v = virtual_stage(p, s, u);
  return u.forward ? v != p.pp * p.chunks() - 1 : v != 0;
}

}  // namespace parasol
