// Where an offloaded optimizer's gradients live, the one rule that the lowering
// (core/lower_buckets.cc, core/lower_optimizer.cc) and the closed-form memory model
// (cost_models/memory.cc) both read.
#pragma once

#include "core/device.h"
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

// Whether the streamed gradient copies (above) run in the backward's own stream, one after each
// reduced bucket, instead of on a side stream beside the backward. DeepSpeed's ZeRO-1/2 issues
// the bucket's reduction and its fp32 copy into the pinned host gradient on a side stream only
// with `overlap_comm`, and on the current (compute) stream otherwise (deepspeedai/DeepSpeed
// v0.3.0 deepspeed/runtime/zero/stage2.py reduce_ipg_grads: `stream = self.reduction_stream if
// self.overlap_comm else torch.cuda.current_stream()`, the copies issued under
// `torch.cuda.stream(stream)`; async_inplace_copy_grad_to_fp32_buffer_from_gpu). overlap_comm
// defaults to false for ZeRO 1/2 (v0.3.0 zero/constants.py ZERO_OPTIMIZATION_OVERLAP_COMM_DEFAULT;
// @edaa722 zero/config.py: true only for stage 3): Plan::overlap_grad_reduce false. The closed
// form (cost_models/estimate.cc) and the lowering (core/lower_buckets.cc) both read this.
inline bool gradient_copies_serialized(const Plan& p) {
  return gradients_streamed_to_host(p) && !p.overlap_grad_reduce;
}

// Whether the host blocks on each reduced gradient bucket's copy into the pinned host gradient
// until the device has finished the bucket's reduce-scatter and the copy: DeepSpeed's ZeRO-3
// with optimizer offload copies the fp16 partition into the fp32 host gradient with a blocking
// copy_ (deepspeed/runtime/zero/stage3.py __partition_grads `fp32_grad_tensor.copy_(grad_buffer)`,
// no non_blocking, from v0.6.2 @32d9797 #L1706 to v0.14.0 #L1467), called from the gradient hook
// on the host thread that issues the backward, so the backward issues nothing more until the
// bucket is reduced (its reduce-scatter waits for the backward issued so far:
// __add_grad_to_ipg_bucket's wait_stream). The lowering (core/lower_buckets.cc) emits an
// OpKind::kSync after each such copy; the closed form (cost_models/estimate.cc) exposes the same.
inline bool gradient_copies_block_host(const Plan& p) {
  return gradients_streamed_to_host(p) && p.zero >= 3 && p.zero3_unit == GatherUnit::kModule;
}

// Bytes per element of the gradient shard that an offloaded optimizer's gradients are copied to
// host memory in. PyTorch FSDP copies each reduced shard in the sharded parameter's own dtype
// (the dtype of the master weights the CPU optimizer steps: Plan::optimizer_dtype): FSDP2's
// foreach_reduce casts the reduce-scatter output to orig_dtype and copies it with
// .to("cpu", non_blocking=True) into pinned memory (pytorch/pytorch
// torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py), FSDP1's _offload_grad copies the
// shard cast to the parameter dtype into its pinned _cpu_grad. DeepSpeed casts the reduced bucket
// to fp32 on the device and copies 4 bytes an element (stage_1_and_2.py, stage3.py); Megatron-
// Core's hybrid optimizer copies its fp32 main gradients.
inline double offloaded_gradient_bytes(const Plan& p) {
  return p.fsdp_impl != FsdpImpl::kNone && p.zero >= 3 ? dtype_bytes(p.optimizer_dtype) : 4.0;
}

// Whether each reduced gradient shard's copy to host memory follows its reduce-scatter on the
// data-parallel stream instead of a copy stream that the parameters' host-to-device copies share:
// FSDP2 issues it in the reduce-scatter stream (post_reduce_stream, after the reduce-scatter; the
// next reduce-scatter queues behind it), FSDP1 in its post-backward stream, while the shards'
// copies to the device run in the all-gather copy-in stream (FSDPParam.all_gather_inputs:
// .to(device, non_blocking=True) under all_gather_copy_in_stream), so a gradient's copy never
// delays the next unit's parameters.
inline bool gradient_copies_on_reduce_stream(const Plan& p) {
  return p.fsdp_impl != FsdpImpl::kNone && p.zero >= 3 && p.offload.optimizer;
}

}  // namespace parasol
