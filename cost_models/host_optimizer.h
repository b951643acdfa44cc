// The CPU optimizer step of an offloaded optimizer (Offload::optimizer): the seconds one GPU's
// share of it takes on its server's host while every GPU of the server steps at once. The one
// price that the closed form (cost_models/estimate.cc) and the simulator's host AdamW op
// (cost_models/op_cost.cc) both read.
//
// Plan::cpu_optimizer picks the implementation:
//  - deepspeed: DeepSpeedCPUAdam at its measured rate per host core (Profile::
//    host_adam_params_per_s, cost_models/profile.cc), shared by the server's GPUs;
//  - torch: torch.optim's AdamW(fused=True) on CPU tensors, ATen's fused CPU kernel
//    (pytorch/pytorch aten/src/ATen/native/cpu/FusedAdamKernel.cpp, added by PR #123074, 2024-04:
//    adam_fused_step_impl): one at::parallel_for pass of at::vec loads and stores per element,
//    reading the parameter, gradient, exp_avg and exp_avg_sq and writing exp_avg, exp_avg_sq and
//    the parameter (AdamW's decay folded into the same pass): 7 accesses of the state's dtype an
//    element, bound by the host's memory bandwidth (its sockets' DRAM at the profile's
//    host_memory_efficiency), which the server's GPUs' processes share;
//  - torch with Plan::optimizer_impl foreach or for_loop: torch.optim's _multi_tensor_adamw /
//    _single_tensor_adamw (torch/optim/adamw.py @002d2f0bb4; _single_tensor_adamw is torch's
//    default on CPU tensors: _default_to_fused_or_foreach turns foreach on only where every tensor
//    is on a foreach device, CUDA and its kin), eight elementwise ops, each its own pass over
//    memory: mul_ (the decay: parameter read and written, 2), lerp_ (exp_avg, grad: 3), mul_ (2)
//    and addcmul_ (exp_avg_sq, grad: 3), sqrt (exp_avg_sq into a temporary: 2), the division and
//    add_ (2 each), addcdiv_ (parameter, exp_avg, denominator: 4): 20 accesses an element, bound
//    by the same host memory. PR #123074 measured the fused kernel 5.1x faster than the
//    for-loop on a 56-core Sapphire Rapids socket (10 tensors of 1M elements), more than the
//    20/7 of the accesses, which is then a floor on the for-loop's time.
#pragma once

#include "core/cluster.h"
#include "core/plan.h"
#include "cost_models/profile.h"

namespace parasol::cost {

// Memory accesses per parameter of torch's fused CPU AdamW step, and of its foreach and
// for-loop implementations (above).
inline constexpr double kTorchFusedAdamAccesses = 7;
inline constexpr double kTorchUnfusedAdamAccesses = 20;

// Accesses per parameter of torch's CPU AdamW as Plan::optimizer_impl runs it.
double torch_cpu_adam_accesses(OptimizerImpl impl);

// Host memory bandwidth of the server of GPU `gpu` (bytes/s: its CPU sockets' together); 0 when
// the cluster gives none.
double server_host_memory_bandwidth(const Cluster& cluster, int gpu);

// Seconds of one GPU's CPU optimizer step over `params` parameters (its shard), every GPU of its
// server stepping at once. A torch optimizer on a server whose host memory bandwidth is not
// given falls back to the per-core rate (the only host figure there is).
double host_optimizer_seconds(const Cluster& cluster, const Profile& profile, const Plan& plan,
                              double params, int gpu = 0);

}  // namespace parasol::cost
