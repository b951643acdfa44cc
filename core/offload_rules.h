// Where an offloaded optimizer's gradients live, the one rule that the lowering
// (core/lower_buckets.cc, core/lower_optimizer.cc) and the closed-form memory model
// (cost_models/memory.cc) both read.
#pragma once

#include "core/plan.h"

namespace parasol {

// Whether a plan's gradients are streamed to pinned host memory as the backward produces them,
// so that the device never holds a whole gradient (shard): DeepSpeed's ZeRO-Offload and
// ZeRO-Infinity (Ren et al. 2021, arXiv 2101.06840, §4.1: "gradients ... are offloaded to CPU
// memory as they are produced"; deepspeedai/DeepSpeed@edaa722
// deepspeed/runtime/zero/stage_1_and_2.py, the reduced bucket copied into the pinned fp32
// gradient partition; stage3.py the same per reduce bucket). ZeRO 1 with optimizer offload is
// Megatron-Core's --optimizer-cpu-offload, which keeps its whole DDP gradient buffer on the device
// and copies it at step() (megatron/core/optimizer/cpu_offloading/hybrid_optimizer.py); ZeRO-3
// resharded after the step accumulates the unsharded gradients on the device. parasol streams
// only steps of one micro-batch: with gradient accumulation the device keeps the shard it
// accumulates into (DeepSpeed round-trips it through the GPU each micro-step instead).
inline bool gradients_streamed_to_host(const Plan& p) {
  return p.offload.optimizer && p.zero >= 2 && !(p.zero >= 3 && p.reshard == Reshard::kAfterStep) &&
         p.micro_batches() == 1;
}

}  // namespace parasol
