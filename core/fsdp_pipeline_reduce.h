// When PyTorch FSDP2 under torch.distributed.pipelining reduces a stage's gradients: the one
// rule that the lowering (core/lower_buckets.cc, core/lower_schedule.cc) and the closed form
// (cost_models/estimate.cc, DataParallelSync::by_layers) both read.
#pragma once

#include <algorithm>

#include "core/plan.h"

namespace parasol {

// Whether a stage's gradient reductions (ZeRO-3 resharded after the step under a pipeline: FSDP2
// with reshard_after_forward=False under torch.distributed.pipelining, as torchtitan and NeMo
// AutoModel run it) are issued only after each model chunk's last backward of the step, one
// unit after another, with the compute stream waiting for every one before it goes on.
// Pipelining runs a stage's backward outside .backward(), so FSDP2's per-layer post-backward
// hooks never fire; after the chunk's last backward the stage calls post_backward() on every
// FSDP group and then the root's _root_post_backward_final_callback() (PyTorch
// torch/distributed/pipelining/stage.py _PipelineStageBase.backward_maybe_with_nosync,
// run_post_backward: "Pipeline backward bypasses .backward(), so FSDP's autograd hooks never
// fire"; NeMo AutoModel's MoE models alike, Automodel@8d9bfb90e
// nemo_automodel/components/moe/fsdp_mixin.py _run_post_backward_for_moe_module, in the last
// gradient-accumulation step only). Each group's post_backward makes the current stream wait for
// the previous group's reduce-scatter event before it issues its own
// (torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py post_backward:
// current_stream().wait_event(comm_ctx.reduce_scatter_state.event)), and the final callback
// waits for the last (_fsdp_state.py _root_post_backward_final_callback; _finalize_backward
// for the HSDP all-reduces): the reductions are not overlapped with any backward compute. The
// schedule issues the chunk's gradient send after backward_one_chunk returns (schedules.py), and
// NCCL orders it after the compute stream's wait (ProcessGroupNCCL syncs its stream with the
// current one): the stage before it in the drain waits for these reductions too.
inline bool chunk_reductions_block_compute(const Plan& p) {
  return p.zero >= 3 && p.reshard == Reshard::kAfterStep && p.pp > 1;
}

// Seconds the step waits for one stage's held-back reductions (chunk_reductions_block_compute):
// `held` seconds of them, `first_chunk` of them the reductions of its chunk 0, and the stage
// `ahead` seconds ahead of its neighbours in the cool-down. A stage's compute waits for each of
// its chunk's reductions and its gradient sends wait too, so:
// - the drain's last pass, which goes through every stage's chunk 0 after its last backward,
//   carries every stage's chunk-0 reductions;
// - a stage's other chunks' reductions come in the cool-down's rounds (pp micro-batches through
//   one chunk, core/pipeline_schedule.h), where they delay the loop of the rounds unless the
//   stage runs ahead of it: a stage that feeds the longest stage (a later one: the backward flows
//   from the last stage to the first) and whose backward (with its recompute) of a micro-batch
//   takes less runs each round faster by the difference times pp and then waits for its inputs;
//   its reductions fall in those waits first. The stages the longest one feeds are paced by it
//   and have no such lead (the sum over the stages of a 1F1B-like tight loop).
// Without virtual stages chunk 0 is the stage: every stage's reductions, as a 1F1B drain passes
// every stage's last backward. The step waits for the sum over the stages.
inline double exposed_chunk_reductions(double held, double first_chunk, double ahead) {
  return first_chunk + std::max(0.0, held - first_chunk - ahead);
}

}  // namespace parasol
