// What issuing an op costs the host thread (core/host_issue.h's rule reads it): the kernels the
// op launches and the framework's dispatch around them, by how the host issues it
// (Op::host_issue: eager, a CUDA graph's replay, inside a graph, a torch.compile'd region).
// The GPU-side gap between kernels is not here: it is Profile::kernel_overhead_s, in the op's
// device time (cost_models/compute.h), and stays under CUDA graphs.
#pragma once

#include <cstdint>

#include "core/plan.h"
#include "core/program.h"
#include "cost_models/profile.h"

namespace parasol::cost {

// Kernel launches of one multi-tensor apply over `tensors` tensors of `elements` elements in all
// with `depth` tensor lists (apex/Transformer Engine multi_tensor_apply, Megatron's FusedAdam):
// chunks of 65,536 elements, at most 320 blocks (chunks) and {110, 64, 48, 36, 30} tensors per
// launch for depth 1-5 (apex csrc/multi_tensor_apply.cuh; TE common/multi_tensor/
// multi_tensor_apply.cuh). REQUIRES: 1 <= depth <= 5.
int64_t multi_tensor_launches(int64_t tensors, double elements, int depth);

// Whether `op` is an expert GEMM that `plan` runs as one cuBLAS GEMM per local expert (Op::batch)
// over 4 streams (cost_models/compute.h multi_stream_expert_gemm_time): the grouped experts of
// the Transformer Engine stacks (Plan::transformer_impl transformer_engine): Megatron-Core's
// TEGroupedMLP (te.GroupedLinear) and NeMo AutoModel's TE + DeepEP backend (grouped_gemm's gmm).
// Otherwise one grouped kernel (torch._grouped_mm, torchtitan's experts).
bool multi_stream_expert_gemm(const Op& op, const Plan& plan);

// Kernels `op` launches on the device when issued eagerly under `plan`: one per op of the
// Program, except: FlashAttention-2's backward (3: dot(dO, O), the dQ/dK/dV kernel, the dQ
// conversion: flash-attn flash_bwd_launch_template.h) and FlashAttention in Triton's (the same
// three: flash_attn_triton.py _bwd_preprocess_do_o_dot, _bwd_kernel, dq.copy_); materialised
// attention (forward: QK^T, softmax, AV; backward twice that); the optimizer step (AdamW: one
// multi-tensor apply of depth 4, or 5 with an fp32 master, per bucket when fused; about 8 per
// parameter tensor in torch.optim's foreach (8 multi-tensor ops) or for-loop (9 with decoupled
// weight decay: torch/optim/adamw.py _single_tensor_adamw); the cast a multi-tensor apply of
// depth 2; the gradient norm an L2-norm and a scale apply (Megatron clip_grads.py); Megatron's
// logged statistics: count_zeros_fp32 4 per gradient tensor, calc_params_l2_norm its
// multi-tensor L2 norm and 16 small kernels); an expert GEMM run per expert one per local expert
// (multi_stream_expert_gemm); Megatron-Core DDP's main_grad add (OpRole::kMainGradAdd) one per
// parameter it adds. A sync launches its device-to-host copy.
int64_t kernel_launches(const Op& op, const Plan& plan);

// Kernels a framework setting adds around an op, beyond the op's own.
struct AddedKernels {
  int64_t launches = 0;  // kernels (each issued from C++: a launch and the dispatcher)
  double bytes = 0;      // bytes they write to device memory
};
// Under PyTorch's deterministic algorithms (Plan::deterministic) every tensor allocated through
// the dispatcher's empty / empty_like / empty_strided is filled with NaN (PyTorch
// aten/src/ATen/native/cuda/TensorFactories.cu empty_cuda: fill_empty_deterministic_ when
// deterministicAlgorithms() and deterministicFillUninitializedMemory(), the latter on by
// default). The outputs `op` allocates so, under Transformer Engine's modules (transformer_impl
// transformer_engine), @v2.14: a layer GEMM's output, forward and data gradient (extensions/
// gemm.cpp L488-504 at::empty; the weight gradient too where it does not accumulate into
// Megatron's main_grad: Plan::gradient_accumulation_fusion off); a LayerNormLinear's norm: output,
// mean and rsigma forward, dx, dgamma and dbeta backward (extensions/normalization.cpp L23-25,
// L87-88; an RMSNorm allocates one fewer, counted alike); fused attention (flash, cuDNN): the
// output and the softmax statistics forward, dQ, dK and dV backward; the unfused
// DotProductAttention (torch.empty of the score matrix before baddbmm, the fused softmax's output;
// with dropout, native_dropout's output and mask forward, its gradient backward). Under
// Megatron-Core's own modules (local) the unfused attention's softmax output and dropout only.
// Nothing otherwise.
AddedKernels deterministic_fills(const Op& op, const Plan& plan);

// Seconds of host time to issue `op` (core/host_issue.h). By Op::host_issue:
//  kEager under host_framework native: its launches (profile.host_launch_s each);
//  kEager under PyTorch: per kernel a launch and the ATen dispatcher; an op of the forward or a
//    recompute, issued from Python, adds per kernel the Python call and autograd's recording,
//    and an nn.Module call for a module-sized op (GEMM, attention, norm, embedding, loss); the
//    logged statistics a Python call per op they call (count_zeros_fp32: 3 per tensor) and,
//    for the parameter norm, one per parameter its Python filter visits; the
//    backward is issued by the autograd engine's C++ thread (no Python); the optimizer step pays
//    one Python call per fused or foreach call and per kernel for the for-loop; a collective or
//    a sync one Python call;
//  kEager under Transformer Engine modules (Plan::transformer_impl): a layer's GEMM (te.Linear)
//    and norm (what te.LayerNormLinear adds for its LayerNorm) cost the module call's measured
//    host time (profile.host_te_*: forward; backward at the data gradient, the weight
//    gradient's GEMM inside it; times profile.host_te_before_2_10_factor under a Transformer
//    Engine older than 2.10, Plan::te_version), in place of the per-kernel terms above;
//    an expert GEMM run per expert (multi_stream_expert_gemm) is one module call that launches a
//    cuBLAS GEMM per local expert from C++: the per-kernel launches, the Python, autograd and
//    module terms once;
//  kEager through Megatron-Core's own linear modules (a layer's GEMMs under transformer_impl
//    local; the output layer under local or transformer_engine: Megatron's ColumnParallelLinear):
//    the forward call's measured host time (profile.host_local_linear_fwd_s); the backward, a
//    Python autograd.Function, per kernel a launch, the dispatcher and a Python call;
//  kEager, Megatron-Core DDP's main_grad add (Plan::gradient_accumulation_fusion off) and a
//    kernel of Megatron's unfused loss beyond the fused loss's (OpRole::kXentUnfused): per
//    kernel a launch, the dispatcher and a Python call (the backward hook and the loss's
//    autograd.Function are Python);
//  kGraphReplay: one graph launch (and the Python call of the graphed callable);
//  kInGraph: nothing;
//  kCompiledEntry: the compiled region's guards and wrappers, plus its own launches;
//  kCompiled: its launches.
// An eager op adds the launch and dispatch of each kernel deterministic_fills counts.
double host_issue_seconds(const Op& op, const Plan& plan, const Profile& profile);

}  // namespace parasol::cost
