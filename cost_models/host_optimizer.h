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
//    host_memory_efficiency), which the server's GPUs' processes share.
#pragma once

#include "core/cluster.h"
#include "core/plan.h"
#include "cost_models/profile.h"

namespace parasol::cost {

// Memory accesses per parameter of torch's fused CPU AdamW step (above).
inline constexpr double kTorchFusedAdamAccesses = 7;

// Host memory bandwidth of the server of GPU `gpu` (bytes/s: its CPU sockets' together); 0 when
// the cluster gives none.
double server_host_memory_bandwidth(const Cluster& cluster, int gpu);

// Seconds of one GPU's CPU optimizer step over `params` parameters (its shard), every GPU of its
// server stepping at once. A torch optimizer on a server whose host memory bandwidth is not
// given falls back to the per-core rate (the only host figure there is).
double host_optimizer_seconds(const Cluster& cluster, const Profile& profile, const Plan& plan,
                              double params, int gpu = 0);

}  // namespace parasol::cost
