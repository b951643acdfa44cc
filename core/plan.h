// Plan: how to train. Parallel degrees, sharding, pipeline schedule, recompute, offload,
// precision and rank order, with JSON I/O and validation against a model and a cluster.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "core/cluster.h"
#include "core/device.h"
#include "core/json_reader.h"
#include "core/model.h"

namespace parasol {

enum class Schedule { kGpipe, k1F1B, kInterleaved };
// What a layer recomputes in the backward instead of keeping:
//  kNone:        nothing;
//  kSelective:   Megatron-Core's --recompute-granularity selective: the modules of
//                Plan::recompute_modules;
//  kFull:        the whole layer from its input (the first recompute_layers of a stage);
//  kSelectiveOp: torchtitan's op-level selective activation checkpointing
//                ([activation_checkpoint] mode "selective", selective_ac_option "op", the default
//                of its Llama 3 8B config; torchtitan/parallelisms/parallelize_llama.py @9dec370
//                _apply_ac_to_transformer_block): each block MUST_SAVEs the outputs of the ops
//                in _save_list (aten.mm, the SDPA flash/efficient kernels, c10d reduce_scatter,
//                abs/max) except every second mm of the block's forward, and recomputes
//                everything else. In a Llama block (wq, wk, wv, wo, w1, w3, w2 in execution
//                order) it keeps the block's input, Q, V, the attention output and its
//                log-sum-exp, the w1 and w2 outputs; the backward re-runs the norms, RoPE, wk, wo,
//                the residual adds, w3 and the SwiGLU (core/lower_recompute.cc).
enum class Recompute { kNone, kSelective, kFull, kSelectiveOp };
// ZeRO-3 / FSDP: when gathered parameters are freed again.
//  kAfterForward:  after each layer's forward; gathered again for its backward (FSDP
//                  reshard_after_forward=True, DeepSpeed ZeRO-3). Gradients reduce-scattered
//                  every micro-batch.
//  kAfterBackward: kept from a layer's forward to its backward (FSDP2 reshard_after_forward=False,
//                  FSDP SHARD_GRAD_OP); one gather per micro-batch. Gradients reduce-scattered
//                  every micro-batch.
//  kAfterStep:     gathered at the first use of the step and kept to its end, gradients
//                  accumulated unsharded and reduce-scattered once per step (torch.distributed
//                  pipelining with FSDP2: torchtitan's and Llama 3's pipelines).
enum class Reshard { kAfterForward, kAfterBackward, kAfterStep };
// ZeRO-3: the collectives a framework issues for one layer's parameters (core/gather_units.h).
//  kLayer:  one all-gather of the layer's weights per use and one reduce-scatter of its
//           gradients (FSDP1's FlatParameter per wrapped block, FSDP2's fully_shard group per
//           block, Megatron-FSDP's layer units);
//  kModule: DeepSpeed ZeRO-3: a gather per module, consecutive modules' weights coalesced up to
//           stage3_prefetch_bucket_size elements, gradients reduced in reduce_bucket_size
//           buckets.
enum class GatherUnit { kLayer, kModule };
// ZeRO-3: PyTorch FSDP's own copies of the weights and gradients around its collectives
// (core/lower_buckets.cc emits them, the closed form prices the same bytes):
//  kNone: not PyTorch FSDP (Megatron's distributed optimizer, DeepSpeed), or none priced;
//  kFsdp1: FSDP1's FlatParameter (torch/distributed/fsdp, Composer, fms-fsdp): the unit's
//          gradient is autograd's concatenation of its views' gradients (the backward of the
//          FlatParameter's split), cast to the reduce dtype and pre-divided in place before the
//          reduce-scatter (_runtime_utils.py _post_backward_hook; default_hooks.py
//          reduce_scatter_hook), the shard post-divided after it; each gather first casts the
//          fp32 shard to the parameter dtype (_mp_shard);
//  kFsdp2: FSDP2's fully_shard: each gather's output copied out into the parameters
//          (split_with_sizes_copy), the gradients copied and cast into the reduce-scatter input
//          (chunk_cat) (torch/distributed/_composable/fsdp/_fsdp_collectives.py).
enum class FsdpImpl { kNone, kFsdp1, kFsdp2 };
// Megatron-Core's --recompute-modules under selective recompute (its names): what each layer
// recomputes in the backward instead of keeping.
//  core_attn:      the core attention (softmax(QK^T)V); with a fused kernel nothing is kept
//                  anyway, so it only costs the recompute (Megatron's default);
//  moe_act:        the routed experts' activation function (their FC2 input is not kept);
//  layernorm:      the norms that are modules of their own (the pre-MLP norm of MoE layers;
//                  Transformer Engine fuses the others into the linear after them);
//  mla_up_proj:    MLA's up-projections and RoPE (the per-head Q, K, V are not kept);
//  mlp:            the dense MLP (dense layers only);
//  moe:            the whole MoE block: router, dispatch, experts, combine, shared experts;
//  shared_experts: the shared experts of MoE layers.
enum class RecomputeModule {
  kCoreAttn,
  kMoeAct,
  kLayernorm,
  kMlaUpProj,
  kMlp,
  kMoe,
  kSharedExperts,
};
constexpr int kRecomputeModuleCount = 7;
const char* recompute_module_name(RecomputeModule m);
// The fused attention kernel family: FlashAttention-2 (PyTorch SDPA's flash backend, the
// flash-attn package), NVIDIA's cuDNN fused attention (Transformer Engine's default on
// Hopper, FlashAttention-3-class warp-specialised kernels), or FlashAttention written in Triton
// (flash-attn 1.x's flash_attn_triton, llm-foundry's MPT `attn_impl: triton`), or
// FlashAttention-3 (flash-attn's hopper/ build, flash_attn_interface: Hopper only). The same
// math; different speed.
enum class AttentionKernel { kFlash2, kCudnn, kTriton, kFa3 };
// Which implementation runs the context-parallel ring under cp > 1 (both split the sequence into
// 2 x cp chunks and run one causal step and cp - 1 unmasked steps per rank; they differ in the
// memory passes around the kernels and in the dtype of the K/V gradients they pass on):
//  kTransformerEngine: Megatron-Core / NeMo through Transformer Engine's AttnFuncWithCPAndKVP2P
//                      (transformer_engine/pytorch/attention/dot_product_attention/
//                      context_parallel.py): one fused output correction per step, dK/dV in the
//                      attention's dtype;
//  kPytorch:           PyTorch's context_parallel (torch/distributed/tensor/experimental/
//                      _attention.py, torchtitan and NeMo AutoModel): each step's output upcast
//                      to fp32 and merged by _SDPAMerger in separate element-wise ops, the
//                      gradients accumulated in fp32 (convert_to_f32) and the dK/dV exchanged in
//                      fp32, the load-balanced halves put back with torch.cat.
enum class CpImpl { kTransformerEngine, kPytorch };
// Whose tensor parallelism runs the layers' sharded GEMMs (plan key tp_impl), which decides where
// the backward's data-gradient reductions (the conjugates of the column-parallel inputs' gathers:
// QKV's and FC1's) run:
//  kMegatron: Megatron-Core's linear layers (LinearWithGradAccumulationAndAsyncCommunication, and
//             Transformer Engine's): the data gradient's all-reduce or reduce-scatter is issued
//             asynchronously and runs beside the weight-gradient GEMM;
//  kPytorch:  PyTorch's DTensor tensor parallelism (torchtitan; torch.distributed.tensor.parallel
//             ColwiseParallel behind PrepareModuleInput): the Partial gradient of the replicated
//             input is the sum of the column-parallel GEMMs' data gradients (Q, K, V; FC1 and
//             FC3), reduce-scattered by the redistribute's backward after autograd has run those
//             GEMMs' weight gradients, and waited for by the norm's backward. Inductor keeps that
//             order (torch/_inductor/config.py reorder_for_compute_comm_overlap = False, which
//             torchtitan leaves), and async TP's micro-pipelining does not take it: its
//             fuse_matmul_reduce_scatter (torch/_inductor/fx_passes/micro_pipeline_tp.py) fuses
//             only a reduce-scatter whose input is one single-user matmul (pytorch/pytorch#149946,
//             2025-03-28: "only valid scaled_mm-reduce-scatter patterns in the forward graph ...
//             in the backward graph, the reduce-scatters are receiving as input the addition of
//             various scaled_mms"). So the reduction runs on the compute path, after the weight
//             gradients.
enum class TpImpl { kMegatron, kPytorch };
// How PyTorch's context_parallel (cp_impl torch) moves the K/V shards to the ranks that attend to
// them (torch/distributed/tensor/experimental/_attention.py, _cp_options.rotate_method):
//  kRing:      _AllToAllRotater: each step passes the K/V in hand on to the next rank
//              (ft_c.permute_tensor), beside the step's attention (torchtitan
//              context_parallel_rotate_method "alltoall");
//  kAllGather: _AllGatherRotater, PyTorch's default (and torchtitan's up to v0.2.2): one all-gather
//              of every rank's K/V, issued before the first (local) step and waited for by the
//              second, each later step slicing its chunk out of the gathered buffer. The backward
//              gathers again; its K/V gradients travel the ring in both cases.
enum class CpRotate { kRing, kAllGather };
// Megatron-Core's --cp-comm-type (megatron/core/transformer/transformer_config.py cp_comm_type,
// handed to Transformer Engine's DotProductAttention): how Transformer Engine's context
// parallelism (cp_impl te) moves the sequence shards (transformer_engine/pytorch/attention/
// dot_product_attention/context_parallel.py):
//  kP2p:       AttnFuncWithCPAndKVP2P, the default: the K/V ring above, each step's exchange
//              beside that step's attention;
//  kAllGather: AttnFuncWithCPAndKVAllGather: one all-gather of every rank's K/V, then two
//              attention kernels (the rank's two chunks against their causal K/V prefix); the
//              backward gathers again and reduce-scatters dK/dV; nothing overlaps the exchanges;
//  kA2a:       AttnFuncWithCPAndQKVOA2A (DeepSpeed-Ulysses): all-to-alls trade the sequence shards
//              of Q, K and V for heads, one attention kernel runs on the whole sequence with
//              heads / cp heads, an all-to-all trades the output back; the backward mirrors it;
//  kA2aP2p:    hierarchical: the all-to-alls inside groups of cp_a2a_size consecutive CP ranks, the
//              P2P ring across the groups (--hierarchical-context-parallel-sizes
//              [cp_a2a_size, cp / cp_a2a_size]).
enum class CpCommType { kP2p, kAllGather, kA2a, kA2aP2p };
// How MoE tokens reach their experts: one all-to-all with a copy per (token, expert) (Megatron's
// "alltoall" dispatcher, torch all_to_all), or DeepEP's hierarchical dispatch (Megatron's
// "flex" dispatcher with DeepEP/HybridEP): one copy per (token, remote node) over the network,
// forwarded inside the node over NVLink, in fp8 when the plan trains in fp8; or Megatron's
// "allgather" dispatcher (token_dispatcher.py MoEAllGatherTokenDispatcher): every rank's hidden
// states, router probabilities and routing map all-gathered over the expert-parallel group, each
// rank's experts picking their rows, the combine a reduce-scatter in the probabilities' dtype,
// and two device-to-host syncs a layer forward (tokens_per_expert .cpu(), masked_select).
enum class MoeDispatcher { kAllToAll, kDeepEp, kAllGather };
// How a benchmark overrides the trained router to force balanced experts (core/moe_load.h,
// cost_models/moe_dispatch.h): none (the router's own choice), random (Megatron-Core's
// --moe-router-force-load-balancing: random normal logits, so each token's top_k experts are a
// uniform random draw), or round_robin (NeMo AutoModel's FakeBalancedGate and torchtitan's
// _debug_force_load_balance: token t of a rank takes the top_k consecutive experts from
// t * top_k mod experts, so every expert gets the same rows and a token's experts sit on one or
// two neighbouring ranks).
enum class MoeForceBalance { kNone, kRandom, kRoundRobin };
// Transformer Engine's fp8 recipe (Megatron-Core --fp8-recipe; TransformerConfig.fp8_recipe,
// default "delayed"), read only when the plan trains in fp8:
//  kDelayed:    delayed scaling: the scale comes from the amax history, so each GEMM operand is
//               quantised by one cast-transpose that reads it once (compute.h fp8_quantize_time);
//  kTensorwise: per-tensor current scaling: the amax of the operand itself is computed first, a
//               second read of the bf16 tensor, then the scale (nvte_compute_amax_with_config,
//               nvte_compute_scale_from_amax, then nvte_quantize_v2: TransformerEngine@d0067d0
//               transformer_engine/pytorch/csrc/quantizer.cpp Float8CurrentScalingQuantizer::
//               quantize_impl; docs/features/low_precision_training/fp8_current_scaling: "requires
//               reading the tensor twice"). The grouped experts quantise expert by expert
//               (csrc/extensions/cast.cpp multi_tensor_quantize_impl: "Currently only have fused
//               kernel for FP8 delayed scaling"; TE 2.12-2.15 the same). The lowering emits the
//               amax and scale kernels as ops (OpRole::kFp8Amax);
//  kMxfp8, kBlockwise: block scales computed inside the one quantising kernel (one read):
//               priced as kDelayed.
enum class Fp8Recipe { kDelayed, kTensorwise, kMxfp8, kBlockwise };
// CUDA graphs captured and replayed in place of launching each kernel (Megatron-Core's
// --cuda-graph-impl local|transformer_engine with --cuda-graph-modules empty: each transformer
// layer's forward and backward a graph, or full_iteration: the forward and backward of the whole
// step, without the optimizer; torchtitan's fwd+bwd graphs). A graph replays its kernels with one
// host launch; it keeps the GPU's gap between kernels and removes no device-to-host sync (a sync
// inside a graph cannot be captured: validate() refuses it).
enum class CudaGraphs { kNone, kLayers, kFullIteration };
// How the optimizer step launches its kernels: one fused multi-tensor kernel per group of
// tensors (apex/TE FusedAdam, torch fused=True: Megatron's default), torch.optim's foreach
// (about 8 multi-tensor ops), or the per-parameter for-loop (about 8 kernels per tensor).
enum class OptimizerImpl { kFused, kForeach, kForLoop };
// Which CPU optimizer runs the step of an offloaded optimizer (Offload::optimizer):
// DeepSpeed's DeepSpeedCPUAdam (ZeRO-Offload / ZeRO-Infinity: csrc/adam/cpu_adam.cpp, priced at
// its measured rate per host core, Profile::host_adam_params_per_s), or torch.optim's AdamW on
// CPU tensors (PyTorch FSDP's CPUOffloadPolicy / CPUOffload, torchtune's fsdp_cpu_offload,
// Megatron-Core's --optimizer-cpu-offload HybridDeviceOptimizer), its fused CPU kernel a single
// vectorized pass over the parameter, gradient and moments, bound by the host's memory
// bandwidth (cost_models/host_optimizer.h).
enum class CpuOptimizer { kDeepSpeed, kTorch };
// What issues the kernels: PyTorch (Python forward, the autograd engine's C++ thread for the
// backward, the ATen dispatcher for every op) or a native program that launches its kernels
// directly (llm.c): the launches alone.
enum class HostFramework { kPytorch, kNative };
// The modules a transformer layer's GEMMs and norms are called through, which sets what their
// calls cost the host (cost_models/host_cost.h): PyTorch's own (torch.nn, F.linear: the per-op
// dispatch and an nn.Module call), or Transformer Engine's (Megatron-Core's
// --transformer-impl transformer_engine, NeMo: te.Linear / te.LayerNormLinear, whose forward is
// Python module code and whose backward is a Python autograd.Function), or Megatron-Core's own
// tensor-parallel modules (--transformer-impl local: ColumnParallelLinear / RowParallelLinear,
// whose forward is Python module code around LinearWithGradAccumulationAndAsyncCommunication, a
// Python autograd.Function whose backward issues each op from Python).
enum class TransformerImpl { kTorch, kTransformerEngine, kLocal };

const char* schedule_name(Schedule s);
const char* recompute_name(Recompute r);
const char* reshard_name(Reshard r);
const char* attention_kernel_name(AttentionKernel k);
const char* cp_impl_name(CpImpl c);
CpImpl parse_cp_impl(const std::string& s, const std::string& field);
const char* tp_impl_name(TpImpl t);
// "megatron", "torch".
TpImpl parse_tp_impl(const std::string& s, const std::string& field);
const char* cp_rotate_name(CpRotate r);
CpRotate parse_cp_rotate(const std::string& s, const std::string& field);
const char* cp_comm_type_name(CpCommType c);
// "p2p", "all_gather" (or Megatron's help text's "allgather"), "a2a", "a2a+p2p".
CpCommType parse_cp_comm_type(const std::string& s, const std::string& field);
const char* moe_dispatcher_name(MoeDispatcher d);
const char* cuda_graphs_name(CudaGraphs g);
const char* optimizer_impl_name(OptimizerImpl o);
const char* host_framework_name(HostFramework f);
const char* transformer_impl_name(TransformerImpl t);
TransformerImpl parse_transformer_impl(const std::string& s, const std::string& field);
CudaGraphs parse_cuda_graphs(const std::string& s, const std::string& field);
// A Transformer Engine version "major.minor[.patch][+local]" as major * 100 + minor (Plan::
// te_version), and back ("2.8").
int parse_te_version(const std::string& s, const std::string& field);
std::string te_version_name(int v);
OptimizerImpl parse_optimizer_impl(const std::string& s, const std::string& field);
const char* cpu_optimizer_name(CpuOptimizer c);
CpuOptimizer parse_cpu_optimizer(const std::string& s, const std::string& field);
HostFramework parse_host_framework(const std::string& s, const std::string& field);
MoeDispatcher parse_moe_dispatcher(const std::string& s, const std::string& field);
const char* moe_force_balance_name(MoeForceBalance b);
MoeForceBalance parse_moe_force_balance(const std::string& s, const std::string& field);
const char* fp8_recipe_name(Fp8Recipe r);  // "delayed", "tensorwise", "mxfp8", "blockwise"
Fp8Recipe parse_fp8_recipe(const std::string& s, const std::string& field);
AttentionKernel parse_attention_kernel(const std::string& s, const std::string& field);
Schedule parse_schedule(const std::string& s, const std::string& field);
Recompute parse_recompute(const std::string& s, const std::string& field);
Reshard parse_reshard(const std::string& s, const std::string& field);
const char* gather_unit_name(GatherUnit u);
GatherUnit parse_gather_unit(const std::string& s, const std::string& field);
const char* fsdp_impl_name(FsdpImpl f);
FsdpImpl parse_fsdp_impl(const std::string& s, const std::string& field);

// The linears of a transformer layer that LoRA adapters wrap (Plan::lora_targets), by NeMo's
// names (nemo/collections/llm/peft/lora.py LoRA.target_modules: linear_qkv, linear_proj,
// linear_fc1, linear_fc2).
enum class LoraTarget { kQkv, kProj, kFc1, kFc2 };
constexpr int kLoraTargetCount = 4;
const char* lora_target_name(LoraTarget t);  // "linear_qkv", "linear_proj", ...
// "linear_qkv,linear_proj": the names of a target mask's linears, comma-separated.
std::string lora_targets_name(unsigned targets);

struct Offload {
  bool optimizer = false;    // optimizer state (and its update) in host memory
  bool params = false;       // master parameters in host memory, streamed per layer
  bool activations = false;  // saved activations copied to host between forward and backward
  bool any() const { return optimizer || params || activations; }
  bool operator==(const Offload&) const = default;
};
// "none" or a comma list of optimizer,params,activations.
Offload parse_offload(const std::string& s, const std::string& field);
std::string offload_name(const Offload& o);

// The parallel dimensions in Megatron's order; rank_order lists them first-fastest.
enum class Dim { kTp, kCp, kEp, kDp, kPp };
const char* dim_name(Dim d);

struct Plan {
  int tp = 1;  // tensor parallel
  int pp = 1;  // pipeline parallel
  int dp = 1;  // data parallel (includes ep: expert parallel groups live inside dp x cp)
  int cp = 1;  // context parallel
  int ep = 1;  // expert parallel (divides dp: expert groups are carved out of data parallelism)
  bool sequence_parallel = false;
  int vpp = 1;  // virtual pipeline stages per rank (interleaved schedule when > 1)
  // Sharding of parameters, gradients and optimizer state over the data-parallel group
  // (dp x cp; experts (dp / ep) x cp), as the frameworks name it:
  //  0: DDP, gradients all-reduced once per step;
  //  1: Megatron's distributed optimizer = DeepSpeed ZeRO-1: optimizer state sharded,
  //     gradients reduce-scattered once per step and parameters all-gathered after the step;
  //  2: DeepSpeed ZeRO-2: gradients sharded too, so reduce-scattered every micro-batch;
  //  3: ZeRO-3 / FSDP: parameters sharded too, gathered per use (see `reshard`).
  int zero = 0;
  Reshard reshard = Reshard::kAfterForward;    // ZeRO-3 only
  GatherUnit zero3_unit = GatherUnit::kLayer;  // ZeRO-3 only
  // DeepSpeed ZeRO-3's parameter coordinator and gradient buckets under zero3_unit module, its
  // ds_config keys in elements (core/gather_units.h reads them; defaults of
  // deepspeed/runtime/zero/constants.py, unchanged from v0.6.2 @32d9797 to config.py @edaa722):
  //  zero3_prefetch_bucket:     stage3_prefetch_bucket_size (5e7): parameters of the modules
  //                             that follow gathered ahead of their use, up to this many;
  //  zero3_max_live_parameters: stage3_max_live_parameters (1e9): no prefetch while this many
  //                             gathered parameters are live (the module in use is fetched
  //                             regardless);
  //  zero3_max_reuse_distance:  stage3_max_reuse_distance (1e9): a module's parameters are kept
  //                             after its use when they are used again within this many
  //                             parameters of the trace;
  //  zero3_reduce_bucket:       reduce_bucket_size (5e8): gradients reduce-scattered together;
  //  zero3_param_persistence_threshold: stage3_param_persistence_threshold (1e5): a parameter
  //                             of fewer elements (norms, biases) is never partitioned: kept
  //                             whole on every rank, never fetched or released, gathered after
  //                             each optimizer step (stage3.py @v0.6.2 persistent_parameters,
  //                             _post_step; core/gather_units.h persistent_elements).
  int64_t zero3_prefetch_bucket = 50000000;
  int64_t zero3_max_live_parameters = 1000000000;
  int64_t zero3_max_reuse_distance = 1000000000;
  int64_t zero3_reduce_bucket = 500000000;
  int64_t zero3_param_persistence_threshold = 100000;
  // HSDP / ZeRO++ hpZ: shard over groups of `shard_degree` consecutive ranks of the
  // data-parallel group and replicate across the groups (gradients reduce-scattered inside a
  // group, then all-reduced across groups). 0 = the whole group.
  int shard_degree = 0;
  Dtype grad_reduce_dtype = Dtype::kFp32;  // dtype gradients are reduced in (Megatron: fp32)
  // Megatron-Core --fp8-param-gather (fp8 plans, ZeRO 1 or 2: the distributed optimizer): the
  // transformer layers' linear weights are Transformer Engine fp8 parameters (TransformerConfig
  // fp8_param), held in a uint8 parameter buffer (1 byte an element; param_and_grad_buffer.py
  // @d98e8a6 group_params_for_buffers) beside the transpose TE keeps of each fp8 weight for the
  // backward's TN GEMMs (1 byte an element), with no bf16 copy; the optimizer writes its updated
  // fp32 shard into the fp8 shard and the parameter all-gather moves 1 byte an element. Norms,
  // biases, the embedding, the output layer and the router stay bf16. Off: the weights are the
  // bf16 parameters (2 bytes an element), gathered in bf16.
  bool fp8_param_gather = false;
  // Optimizer state: fp32 master weights and AdamW moments (Megatron, DeepSpeed, FSDP mixed
  // precision), or bf16: the bf16 weights are the master and the moments and gradients are bf16
  // (torch.optim.Adam on a bf16 model, as NeMo AutoModel's MoE benchmarks run).
  Dtype optimizer_dtype = Dtype::kFp32;
  int micro_batch = 1;
  int global_batch = 1;  // sequences per optimizer step
  // Pipeline schedules a step runs one after another, each a flush (its own fill and drain) of
  // micro_batches() / pipeline_flushes micro-batches; the gradients are reduced after the last.
  // 1: one schedule over all the step's micro-batches (Megatron, whose gradient accumulation is
  // the schedule's micro-batches). NeMo AutoModel under pipeline parallelism runs a
  // schedule.step() of torch.distributed.pipelining per gradient-accumulation step, GA =
  // gbs / (local_batch_size x dp), and syncs the gradients in the last one's backward
  // (Automodel@8d9bfb90e nemo_automodel/recipes/llm/benchmark.py L178-196,
  // components/moe/fsdp_mixin.py patched_backward_maybe_with_nosync).
  int pipeline_flushes = 1;
  int64_t seq_len = 0;  // 0 = model.seq_len
  Schedule schedule = Schedule::k1F1B;
  Recompute recompute = Recompute::kNone;
  int recompute_layers = -1;  // -1 = all layers of a stage; k = the first k layers per stage
  // Under selective recompute, the modules recomputed: a bit per RecomputeModule (Megatron's
  // default: core_attn).
  unsigned recompute_modules = 1u << static_cast<int>(RecomputeModule::kCoreAttn);
  Offload offload;
  Dtype precision = Dtype::kBf16;  // math and activation dtype (fp32 master weights otherwise)
  bool flash_attention = true;     // fused attention (no s x s score matrix in memory)
  AttentionKernel attention_kernel = AttentionKernel::kFlash2;  // which fused kernel
  CpImpl cp_impl = CpImpl::kTransformerEngine;  // which context-parallel ring (cp > 1)
  CpRotate cp_rotate = CpRotate::kRing;         // how cp_impl torch moves K/V (cp > 1)
  CpCommType cp_comm_type = CpCommType::kP2p;   // how cp_impl te moves the shards (cp > 1)
  int cp_a2a_size = 0;  // cp_comm_type a2a+p2p: ranks of each all-to-all group (0 otherwise)
  // The model code repeats the K/V heads to the query heads before attention (GQA expanded to
  // MHA: torchtitan's Llama before it passed enable_gqa, e.g. @9dec370 models/llama/model.py
  // repeat_kv): the kernel, the context-parallel K/V exchange and the K/V gradients carry `heads`
  // heads, not kv_heads.
  bool repeat_kv = false;
  // Element-wise work (norms, activation, rotary embedding) in fused kernels (Megatron,
  // Transformer Engine, torch.compile) or op by op as PyTorch eager runs a model's Python code
  // (RMSNorm as upcast, pow, mean, rsqrt, mul, downcast, mul; SwiGLU as silu then mul; RoPE in
  // complex fp32): each op one more pass through HBM.
  bool fused_kernels = true;
  bool overlap_grad_reduce = true;   // data-parallel gradient reduction overlapped with backward
  bool overlap_param_gather = true;  // ZeRO parameter gathers overlapped with compute
  // Megatron-Core --tp-comm-overlap (Transformer Engine userbuffers): TP/SP all-gathers and
  // reduce-scatters split into chunks pipelined with the GEMMs that consume or produce them.
  bool tp_comm_overlap = false;
  TpImpl tp_impl = TpImpl::kMegatron;  // whose TP layers (tp > 1): where the dgrad reductions run
  // Megatron-Core --overlap-moe-expert-parallel-comm (1F1B all-to-all overlap, DeepSeek's
  // DualPipe idea): a micro-batch's expert all-to-all runs beside another micro-batch's compute.
  bool ep_comm_overlap = false;
  MoeDispatcher moe_dispatcher = MoeDispatcher::kAllToAll;
  MoeForceBalance moe_force_balance = MoeForceBalance::kNone;  // MoE models only
  // Megatron-Core's TEGroupedMLP with expert biases (--add-bias-linear, Megatron's default, with
  // --moe-grouped-gemm): the experts' fc2 bias is not added in the grouped GEMM (skip_bias_add)
  // but by TEGroupedMLP._apply_bias, a Python loop over the local experts of `t + b * p` (the
  // router's probability p of each row), concatenated and cast back, autograd recording each
  // kernel (megatron/core/transformer/moe/experts.py @4415119). The lowering emits it as one op
  // per pass (OpRole::kExpertBias) of its kernels and bytes; without expert biases it is nothing.
  bool expert_bias_loop = false;
  // Megatron-Core's TEGroupedMLP under fp8 pads each local expert's rows to the quantization
  // alignment inside the experts: Transformer Engine's Fp8Padding copies the dispatched rows into
  // a padded buffer before fc1 and Fp8Unpadding copies fc2's output back (tex.
  // fused_multi_row_padding / _unpadding), and their backward copies the gradients the other way
  // (transformer_engine/pytorch/module/fp8_padding.py, fp8_unpadding.py @d0067d0). It runs
  // unless the router pads (moe_router_padding_for_quantization) or HybridEP's dispatch does
  // (moe_utils.py skip_routed_expert_padding @4415119), and only when a count is not already
  // aligned, which dropless routing makes the rule. The lowering emits the four copies (fp8 only).
  bool expert_fp8_padding = false;
  // The DeepEP dispatch moves fp8 rows (with their scales) when the plan trains in fp8, as
  // DeepSeek's own framework runs it (DeepSeek-V3 report, arXiv 2412.19437 sec. 3.3: activations
  // quantised to fp8 before the dispatch, the combine in bf16). Megatron-Core's flex dispatchers
  // move bf16 rows (megatron/core/transformer/moe/fused_a2a.py @4415119: DeepEP's dispatch gets
  // the bf16 hidden states; "HybridEP dispatcher does not support fp8 dispatch now").
  bool fp8_dispatch = false;
  Fp8Recipe fp8_recipe = Fp8Recipe::kDelayed;  // fp8 plans only (above)
  // Megatron-Core's --moe-router-fusion: the router's score function and top-k, the aux-loss
  // scores and the aux loss run as Transformer Engine's fused kernels (fused_topk_with_score_
  // function, fused_compute_score_for_moe_aux_loss, fused_moe_aux_loss) instead of the eager
  // PyTorch ops (megatron/core/transformer/moe/moe_utils.py @cd4afffa). The router's kernels by
  // path: core/moe_load.h router_kernels.
  bool moe_router_fusion = false;
  // Megatron's --moe-router-dtype fp32: the router's logits and the probabilities it routes with
  // are fp32 (router.py: router_gating_linear in router_dtype, the top-k softmax type_as the
  // logits), so the probabilities the routed rows carry are fp32 (moe_probs_dtype()).
  bool moe_router_fp32 = false;
  // Where the router's probabilities scale the routed rows. false: at the combine (the
  // unpermutation multiplies them and keeps the experts' outputs for their gradient: Megatron-
  // Core before !2668, torchtitan's score-after-experts). true: in the experts' activation
  // (Megatron-Core since !2668 "Memory efficient token permutation", NVIDIA/Megatron-LM
  // 2659630721, in the 25.09 and 26.04 containers: fused_bias_swiglu's weighted SwiGLU; the
  // combine unpermutes without them and keeps nothing).
  bool moe_probs_in_experts = false;
  // The routed experts as NeMo AutoModel's GroupedExpertsDeepEP runs them (Automodel@8d9bfb90e
  // nemo_automodel/components/moe/layers.py, unchanged at 01926a5c and 037e04a6a): grouped_gemm's
  // gmm takes no bias, so with expert biases (Model::linear_bias) both are added per local
  // expert after their GEMMs by _apply_bias, fc1's as `t + b` and fc2's as `t + b * p`
  // (OpRole::kExpertFc1Bias and kExpertBias, whatever expert_bias_loop says), and a clamped
  // GLU's clamps run inside its torch.compile'd activation (quick_geglu_deepep) instead of as
  // eager kernels. false: Megatron-Core's TEGroupedMLP (fc1's bias in the GEMM's epilogue).
  bool moe_gmm_experts = false;
  // PyTorch's caching allocator with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True: segments
  // grow in place in 2 MiB pages instead of being carved from fixed segments, so freed blocks
  // are not stranded between live ones (cost_models/framework_memory.h).
  bool expandable_segments = false;
  // The host (core/host_issue.h): what issues the kernels, CUDA graphs, torch.compile (each
  // transformer layer a compiled region: its small element-wise kernels fused, one guarded call
  // in place of its ops' Python), the optimizer's kernels, and Megatron's NaN/Inf check of the
  // loss (--check-for-nan-in-loss-and-grad, on by default: two device-to-host syncs per
  // micro-batch on the last pipeline stage).
  HostFramework host_framework = HostFramework::kPytorch;
  TransformerImpl transformer_impl = TransformerImpl::kTorch;
  CudaGraphs cuda_graphs = CudaGraphs::kNone;
  bool torch_compile = false;
  // The loss as PyTorch eager's F.cross_entropy of an fp32 upcast of the logits (torchtitan's
  // loss_fn, Hugging Face models) instead of a fused vocab-parallel kernel (Megatron's
  // VocabParallelCrossEntropy): the upcast copy, the log-softmax output and, in the backward, the
  // NLL gradient and the log-softmax gradient are each a logits-sized fp32 tensor.
  bool eager_loss = false;
  // The loss as a vocab-tiled fused kernel on the logits in their own dtype (llm.c's
  // fused_classifier, Liger's and Transformer Engine's cross-entropy kernels; parasol's runtime:
  // runtime/cpu/tiled_xent.h, runtime/cuda/xent_tiled.cu): the row maximum and the sums read the
  // logits, the backward reads them again and writes their gradient in their dtype; no
  // logits-sized fp32 tensor (Megatron's fused loss keeps its fp32 softmax for the backward).
  // Ignored under eager_loss.
  bool tiled_loss = false;
  // FC1's GELU run in its GEMM's epilogue (cuBLASLt's CUBLASLT_EPILOGUE_GELU_AUX(_BIAS): the
  // GEMM writes the pre-activation, kept for the backward, and its GELU; the backward's FC2
  // data-gradient GEMM applies GELU's derivative in its epilogue, CUBLASLT_EPILOGUE_DGELU(_BGRAD),
  // and writes FC1's output gradient, with FC1's bias gradient): llm.c's gelu_fusion
  // (llmc/matmul.cuh matmul_forward_cublaslt / matmul_backward), Transformer Engine's LayerNormMLP
  // with NVTE_BIAS_GELU_NVFUSION=0 (tex.gemm gelu=True, and gelu_input in FC2's dgrad). The
  // activation and its backward are no ops of their own (core/lower_layer.cc: OpRole::kGeluFc1,
  // kGeluFc2Dx). Dense and shared-expert MLPs of GELU models; ignored under SwiGLU.
  bool gemm_gelu_epilogue = false;
  // Megatron-Core's fused vocab-parallel loss (--cross-entropy-loss-fusion;
  // ModelParallelConfig.cross_entropy_loss_fusion, off by default in Megatron-LM, and
  // --deterministic-mode requires it off): true, the lowering's fused loss (the row maximum, one
  // kernel for the sums and the softmax, one for the gradient). false: Megatron's unfused
  // tensor_parallel.vocab_parallel_cross_entropy, an autograd.Function issued from Python, whose
  // kernels (an fp32 copy of the logits and in-place passes over it, small per-token kernels
  // for the targets) are listed in core/unfused_xent.h. Ignored under eager_loss and tiled_loss.
  bool cross_entropy_loss_fusion = true;
  OptimizerImpl optimizer_impl = OptimizerImpl::kFused;
  CpuOptimizer cpu_optimizer = CpuOptimizer::kDeepSpeed;  // under optimizer offload
  bool nan_check = true;
  // Megatron's per-step statistics, off by default: --log-params-norm (calc_params_l2_norm: a
  // multi-tensor L2 norm of the fp32 parameters, its all-reduces and an .item()) and
  // --log-num-zeros-in-grad (count_zeros_fp32: count_nonzero, a subtraction and an add per
  // gradient tensor issued from Python, an all-reduce and an .item()). Both are ops of the step
  // (core/lower_optimizer.cc), priced by cost_models/host_cost.h and op_cost.h.
  bool log_params_norm = false;
  bool log_num_zeros_in_grad = false;
  // Megatron-Core's pipeline exchanges as batched send/receive followed by
  // torch.cuda.synchronize() (ModelParallelConfig batch_p2p_comm and batch_p2p_sync, both on
  // unless the interleaved schedule overlaps its p2p: megatron/training/argument_utils.py L307
  // batch_p2p_comm = not overlap_p2p_comm, which arguments.py L1010-1012 forces off without
  // virtual stages; megatron/core/pipeline_parallel/p2p_communication.py L421-424 @d98e8a6): the
  // host blocks after every exchange until the device has finished it (core/lower_schedule.cc).
  bool p2p_sync = false;
  // Megatron-Core's gradient-accumulation fusion (on by default; --no-gradient-accumulation-
  // fusion turns it off): a layer GEMM's weight gradient is written into the parameter's fp32
  // main_grad by the GEMM itself. Off, the GEMM writes a new gradient tensor and the DDP
  // backward hook adds it into main_grad (megatron/core/distributed/distributed_data_parallel.py
  // L575-579 @d98e8a6: param.main_grad.add_(param.grad.data)): one element-wise kernel per
  // weight, issued from Python (core/lower_layer.cc, cost_models/host_cost.h).
  bool gradient_accumulation_fusion = true;
  // ZeRO-3 under PyTorch FSDP: its copies around the collectives (FsdpImpl).
  FsdpImpl fsdp_impl = FsdpImpl::kNone;
  // The attention's Q, K and V unpadded into packed rows and its output padded back around a
  // variable-length kernel, as llm-foundry's MPT runs flash-attn (attn_impl flash,
  // llmfoundry/models/layers/attention.py flash_attn_fn: flash_attn.bert_padding.unpad_input for
  // each of Q, K, V, flash_attn_varlen_func, pad_input): per call a gather of the rows and two
  // device-to-host syncs (torch.nonzero of the mask, .item() of its longest row); in the backward
  // the gathers' scatters into zeroed gradients, the pad's gather, and the Q, K, V gradients
  // concatenated back into the fused QKV gradient (the backward of qkv.chunk(3)).
  bool attention_unpad = false;
  // Cross-entropies of the logits recomputed without gradient after each micro-batch's backward
  // for logged training metrics (Composer's train metrics: llm-foundry's ComposerMPTCausalLM
  // updates LanguageCrossEntropy and LanguagePerplexity every micro-batch, each a
  // torch.nn.CrossEntropyLoss of the logits, upcast to fp32 under autocast): 0 = none.
  int loss_metric_passes = 0;
  // PyTorch's deterministic algorithms (Megatron's --deterministic-mode: megatron/training/
  // determinism.py @d98e8a6 calls torch.use_deterministic_algorithms(True)). With them PyTorch
  // fills every tensor that empty / empty_like / empty_strided allocate through its dispatcher
  // with NaN (torch.utils.deterministic.fill_uninitialized_memory, default True; the CUDA
  // empty_cuda / empty_strided_cuda of aten/src/ATen/native/cuda/TensorFactories.cu): a fill
  // kernel per output that Transformer Engine's C++ allocates with at::empty (its GEMMs' and
  // norms' outputs, the attention's outputs and score buffers), priced by cost_models/host_cost.h
  // (deterministic_fills).
  bool deterministic = false;
  // The Transformer Engine release the run uses, as major * 100 + minor (208 for 2.8; 0: not
  // given, the newest figures). It sets which of TE's module-call host costs apply
  // (cost_models/host_cost.h): those before TE's CPU-overhead work of TE 2.10 (PRs #2377, #2400)
  // or after it.
  int te_version = 0;
  // LoRA fine-tuning (NeMo 2's nemo.collections.llm.peft.LoRA on Megatron-Core, as the MLPerf
  // Training llama2_70b_lora reference runs it: rank 16, alpha 32, dropout 0.1 "pre",
  // target_modules linear_qkv and linear_proj). 0: every weight trains. r > 0: every base weight
  // (the layers', the embedding's and the head's) is frozen: kept in the parameter dtype (fp8
  // under fp8_param_gather), with no gradient, optimizer state or gradient reduction, and its
  // weight-gradient GEMM is not run (Transformer Engine keeps a frozen linear's input only when
  // its weight needs a gradient: backward_needs_input); each target linear [in x out] gets an
  // adapter y += dropout(x) A B, A [in x r] and B [r x out] in the parameter dtype, trained with
  // their own gradients, Adam state and data-parallel reduction (core/lower_lora.cc). The
  // adapters' GEMMs run in bf16 (Megatron's plain linears, outside fp8 autocast).
  int lora_rank = 0;
  unsigned lora_targets = 0xFu;  // bit per LoraTarget (NeMo's default: all four)
  double lora_dropout = 0;  // the adapters' input dropout ("pre"); > 0 keeps its output and mask
  // Megatron-Core's activation_func_fp8_input_store (TransformerConfig, SwiGLU only:
  // transformer_config.py @d98e8a6 L227, L2467; fusions/fused_bias_swiglu.py SwiGLUFunction): the
  // SwiGLU keeps its input (FC1's output) for the backward as an fp8 copy it writes in the
  // forward, and casts it back before its backward (the MLPerf llama2_70b_lora reference's
  // FP8_ACT=1).
  bool activation_fp8_input_store = false;
  bool lora() const { return lora_rank > 0; }
  bool lora_targets_linear(LoraTarget t) const {
    return lora() && ((lora_targets >> static_cast<int>(t)) & 1u) != 0;
  }
  // Uneven pipelines: layers of each pipeline stage (size pp, each split evenly over the
  // stage's chunks) or of each virtual stage (size pp x vpp, in Megatron's order: virtual stage
  // chunk x pp + stage; Megatron's --pipeline-model-parallel-layout, torch pipelining's stage
  // modules); or Megatron's --decoder-first/last-pipeline-num-layers (0 = unset) with the rest
  // spread evenly. All empty/0: the layers split evenly. Resolved by layers_in_chunk().
  std::vector<int> stage_layers;
  int first_stage_layers = 0;
  int last_stage_layers = 0;
  // Megatron's --account-for-embedding-in-pipeline-split / --account-for-loss-in-pipeline-split:
  // the embedding counts as one layer of the first virtual stage and the loss (output layer and
  // loss) as one layer of the last, the model's layers plus these split evenly over the pp x vpp
  // virtual stages, so the first (last) virtual stage holds one transformer layer fewer.
  // Neither goes with stage_layers or first/last_stage_layers (Megatron refuses both).
  bool account_for_embedding = false;
  bool account_for_loss = false;
  // Megatron's --expert-tensor-parallel-size: tensor-parallel degree of the expert MLPs
  // (0 = tp). With etp != tp the experts form their own grid over each stage's tp x cp x dp
  // ranks, Megatron's expert order etp-ep-edp (etp fastest), so ep may exceed dp.
  int etp = 0;
  std::array<Dim, 5> rank_order = {Dim::kTp, Dim::kCp, Dim::kEp, Dim::kDp, Dim::kPp};
  // Optional names of the model and cluster the plan was made for (preset or path).
  std::string model_ref;
  std::string cluster_ref;
  int gpus_ref = 0;

  int gpus() const { return tp * pp * dp * cp; }
  int micro_batches() const { return global_batch / (dp * micro_batch); }
  // Micro-batches of one pipeline flush (pipeline_flushes above).
  int flush_micro_batches() const { return micro_batches() / pipeline_flushes; }
  int64_t seq(const Model& m) const { return seq_len > 0 ? seq_len : m.seq_len; }
  // Whether selective recompute recomputes module `m`.
  bool recomputes(RecomputeModule m) const {
    return recompute == Recompute::kSelective &&
           ((recompute_modules >> static_cast<int>(m)) & 1u) != 0;
  }
  // Layers recomputed fully per stage under kFull (all when recompute_layers < 0).
  int full_recompute_layers(int layers_per_stage) const;
  // Virtual stages per pipeline rank (vpp under the interleaved schedule, else 1).
  int chunks() const { return schedule == Schedule::kInterleaved ? vpp : 1; }
  // Megatron's unfused loss runs (cross_entropy_loss_fusion off, neither eager_loss nor
  // tiled_loss): core/unfused_xent.h.
  bool unfused_loss() const { return !cross_entropy_loss_fusion && !eager_loss && !tiled_loss; }
  bool uneven_stages() const {
    return !stage_layers.empty() || first_stage_layers > 0 || last_stage_layers > 0 ||
           accounts_edges();
  }
  // Whether the embedding or the loss counts as a layer of the pipeline split.
  bool accounts_edges() const { return account_for_embedding || account_for_loss; }
  // The field that sets an uneven split, for errors about it: "plan.stage_layers",
  // "plan.first_stage_layers" / "plan.last_stage_layers" or the accounting switch set
  // ("plan.account_for_embedding_in_pipeline_split" first); "plan.pp" for an even split.
  std::string split_field() const;
  // Layers held by pipeline stage `stage` (all its chunks). REQUIRES: 0 <= stage < pp and, for
  // uneven stages, a plan that validate() accepts for `model_layers`.
  int layers_in_stage(int model_layers, int stage) const;
  // The largest layers_in_stage() over the stages.
  int max_layers_in_stage(int model_layers) const;
  // Layers of chunk `chunk` of stage `stage`, and the global index of its first layer. Megatron's
  // order: virtual stage (chunk, stage) follows all stages' chunk - 1.
  int layers_in_chunk(int model_layers, int stage, int chunk) const;
  int first_layer(int model_layers, int stage, int chunk) const;
  // Expert tensor-parallel degree (etp, or tp when unset) and the expert data-parallel degree:
  // the ranks of a stage holding the same expert shard ((tp x cp x dp) / (etp x ep)).
  int expert_tp() const { return etp > 0 ? etp : tp; }
  int expert_dp() const { return tp * cp * dp / (expert_tp() * ep); }
  // The dtype of the router probabilities the routed rows carry to the experts: fp32 under the
  // DeepEP/HybridEP dispatchers (Megatron's flex dispatcher casts them: token_dispatcher.py
  // "DeepEP only supports float32 probs", "HybridEP only supports float32 probs") and under
  // moe_router_fp32, else the
  // router's output dtype, the activations' (Megatron's moe_router_dtype unset: router.py
  // computes the logits in the input's dtype and the probs are cast back to it).
  Dtype moe_probs_dtype() const {
    if (moe_dispatcher == MoeDispatcher::kDeepEp || moe_router_fp32) return Dtype::kFp32;
    return precision == Dtype::kFp8 ? Dtype::kBf16 : precision;
  }
  // Ranks the ZeRO shards of dense parameters span (shard_degree, or dp x cp).
  int dense_shard_ranks() const { return shard_degree > 0 ? shard_degree : dp * cp; }
  // Ranks the ZeRO shards of expert parameters span: the expert data-parallel group
  // ((dp / ep) x cp), or its part inside a shard_degree group.
  int expert_shard_ranks() const;
  // Chunks each overlapped TP collective is split into under tp_comm_overlap (Transformer
  // Engine's userbuffers pipeline one chunk per TP rank through the ring beside the GEMM); 1 when
  // the plan does not overlap. What the lowering emits and the closed form prices.
  int tp_overlap_chunks() const { return tp_comm_overlap && tp > 1 ? tp : 1; }
};

// The plan the CPU runtime executes: `p` without the GPU-side overlaps it does not run
// (tp_comm_overlap: Transformer Engine's userbuffers; tp_impl: where the data-gradient reductions
// run; ep_comm_overlap: Megatron-Core's combined 1F1B on a stream of its own), without
// expert_bias_loop or moe_gmm_experts (the runtime adds the expert biases in its GEMMs and clamps
// in its activation), expert_fp8_padding or fp8_recipe (it trains in bf16 or fp32), with its own
// context-parallel ring (cp_impl te, cp_rotate ring, cp_comm_type p2p) on the model's own K/V heads
// (repeat_kv false), which the predictors price, and without torchtitan's op-level recompute
// (selective_op runs as none), PyTorch FSDP's own copies (fsdp_impl), the unpadded attention
// (attention_unpad), the metric passes over the logits (loss_metric_passes) or Megatron's fp8
// copy of the SwiGLU input (activation_fp8_input_store). None changes the numerics beyond
// rounding.
Plan runtime_plan(Plan p);

// Rank order string such as "tp-cp-ep-dp-pp".
std::string rank_order_name(const std::array<Dim, 5>& order);
std::array<Dim, 5> parse_rank_order(const std::string& s, const std::string& field);

// Rejects every plan that cannot run on `cluster` for `model`, naming the field:
// "plan.tp: 3 does not divide attention heads (32)". Returns normally when it can run.
void validate(const Plan& plan, const Model& model, const Cluster& cluster);
// Why torchtitan's op-level recompute (Recompute::kSelectiveOp) is not modelled for `plan`'s
// degrees and switches on `model` (validate's plan.recompute error), or "" where it is; reads
// no other field than those it names.
std::string selective_op_refusal(const Plan& plan, const Model& model);

// "none", "full", "selective" (Megatron's default modules) or "selective:mlp,moe_act" (others).
std::string recompute_label(const Plan& p);
Plan plan_from_json(const Json& j, const std::string& path = "plan");
Json plan_to_json(const Plan& p);
// One line of the degrees and switches that tell plans apart, degrees of 1 and switches off
// left out: "tp8 pp8 dp16 sp tpo i12 mbs1 zero3:step rc:sel:mlp off:optimizer".
std::string plan_compact(const Plan& p);

}  // namespace parasol
