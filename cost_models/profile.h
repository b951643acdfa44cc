// Profile: the calibratable efficiencies that turn datasheet peaks into predicted times, one
// Profile per device. default_profile() gives parasol's defaults, each figure justified in
// profile.cc by a datasheet or a public micro-benchmark; `parasol calibrate` fits new ones.
#pragma once

#include <array>
#include <optional>
#include <string>
#include <vector>

#include "core/cluster.h"
#include "core/device.h"
#include "core/json_reader.h"
#include "core/plan.h"
#include "cost_models/error_bands.h"

namespace parasol::cost {

// NCCL's own cost model of its collectives (NVIDIA/nccl src/graph/tuning.cc, the defaults of
// ncclTunerConstantsDefaults at commit 5067397c): a latency per algorithm and protocol, per
// algorithm step over NVLink, PCIe or the network, and the protocols' bandwidth factors. NCCL
// picks the (algorithm, protocol) with the least latency + bytes / bandwidth; so does
// GroupModel. Indices: algorithm 0 tree, 1 ring, 2 PAT; protocol 0 LL, 1 LL128, 2 Simple;
// transport 0 NVLink, 1 PCIe, 2 network.
struct NcclTuning {
  static constexpr int kTree = 0, kRing = 1, kPat = 2;
  static constexpr int kLL = 0, kLL128 = 1, kSimple = 2;
  static constexpr int kNvlink = 0, kPci = 1, kNet = 2;
  std::array<std::array<double, 3>, 3> base_latency_s{};               // [algo][proto]
  std::array<std::array<std::array<double, 3>, 3>, 3> hw_latency_s{};  // [transport][algo][proto]
  // Per intra-node step of a ring that spans nodes: the proxy thread's network overhead (x3 for
  // Simple): 1 us on Intel hosts, 2 us on AMD ones (getNetOverhead).
  double net_overhead_s = 1e-6;
  // LL's bus-bandwidth ceiling (bytes/s) on 1, 2 and more nodes (llMaxBws, per architecture).
  std::array<double, 3> ll_max_bw{};
  // Fraction of the link bandwidth each protocol carries (LL: 8-byte lines with a flag per 4
  // bytes, 0.5; LL128: 120 of 128 bytes, 0.92; Simple: 1), and the algorithm refinements.
  std::array<double, 3> protocol_efficiency = {0.5, 0.92, 1.0};
  double tree_efficiency = 0.92;           // tree all-reduce bus bandwidth (x .92)
  double pat_efficiency = 0.75;            // PAT all-gather/reduce-scatter (x .75)
  double ring_allreduce_plateau = 1.4;     // multi-node Simple ring all-reduce latency (Ampere+)
  double pat_per_rank_latency_s = 2.8e-6;  // PAT's linear latency term per rank
};
// NCCL's defaults (tuning.cc) for a device architecture ("ampere", "hopper", "blackwell") and a
// host CPU vendor ("intel", "amd").
NcclTuning nccl_defaults(const std::string& architecture, const std::string& host_cpu);

// Transformer Engine's modules on a Grace host, BF16, CPU seconds per call (NVIDIA/
// TransformerEngine PR #3523's GB200 table, before and after that PR: te.Linear forward 59.19 ->
// 51.19 us, forward + backward 311.30 -> 276.50 us; te.LayerNormLinear 83.48 -> 65.25 and 397.73 ->
// 349.00 us), split into a Linear's forward and backward and the LayerNorm that LayerNormLinear
// adds; and how much slower Grace issues the same module call than an x86 DGX host (TE issue
// #2053: torch.nn.Linear forward 37.08 us of CPU on GB200, 13.48 us on an H100 DGX's Xeon 8480C).
// profile.cc and profile_ranges.cc read them.
inline constexpr double kTeGraceLinearFwdS = 59.19e-6;
inline constexpr double kTeGraceLinearBwdS = (311.30 - 59.19) * 1e-6;
inline constexpr double kTeGraceNormFwdS = (83.48 - 59.19) * 1e-6;
inline constexpr double kTeGraceNormBwdS = ((397.73 - 83.48) - (311.30 - 59.19)) * 1e-6;
inline constexpr double kTeGraceLinearFwdAfterS = 51.19e-6;
inline constexpr double kTeGraceLinearBwdAfterS = (276.50 - 51.19) * 1e-6;
inline constexpr double kTeGraceNormFwdAfterS = (65.25 - 51.19) * 1e-6;
inline constexpr double kTeGraceNormBwdAfterS = ((349.00 - 65.25) - (276.50 - 51.19)) * 1e-6;
inline constexpr double kGraceOverX86Host = 37.08 / 13.48;
// Transformer Engine's te.Linear forward, BF16, on GB200 before TE's CPU-overhead work of TE 2.10
// (PRs #2377 and #2400, merged 2025-11-17/19): 99.66 us of CPU per call (TE issue #2053,
// 2025-08-11, TE 2.5-2.6 era), against 59.19 us on the same platform before PR #3523 (2026).
inline constexpr double kTeGraceLinearFwdBefore210S = 99.66e-6;
// Megatron-Core's own ColumnParallelLinear, BF16, TP 1: CPU time of one forward call
// (NVIDIA/TransformerEngine PR #1191, 2024-09-18, Megatron-LM @6b35ca80: "74 us per forward
// pass"), and a torch.nn.Linear forward's on an H100 DGX's Xeon 8480C (TE issue #2053: 13.48 us),
// the floor of a module that calls one GEMM.
inline constexpr double kMegatronLocalLinearFwdS = 74e-6;
inline constexpr double kTorchLinearFwdX86S = 13.48e-6;
// Megatron-Core's TEColumnParallelLinear (a te.Linear in Megatron's wrapper), BF16, TP 1: CPU time
// of one forward call on the x86 host of the same PR (NVIDIA/TransformerEngine PR #1191,
// 2024-09-18, TE 1.11 era: 140 us before it, 115 us after it). Over te.Linear's forward on GB200
// in the same era, before TE 2.10's CPU-overhead PRs (TE issue #2053: 99.66 us), it gives how
// much host time a Transformer Engine module call costs on an x86 DGX host against Grace: 1.15,
// where a bare torch.nn.Linear costs Grace 2.75x the x86 host's (kGraceOverX86Host). TE's
// per-call cost is Python attribute and module logic (PR #1191: "many basic PyTorch operations
// ... involve O(1 us) overhead"), which the x86 host runs no faster than Grace.
inline constexpr double kTeColumnParallelLinearFwdX86S = 115e-6;
inline constexpr double kTeColumnParallelLinearFwdX86BeforeS = 140e-6;
inline constexpr double kX86OverGraceTeHost =
    kTeColumnParallelLinearFwdX86S / kTeGraceLinearFwdBefore210S;

struct Profile {
  std::string device;  // the DeviceSpec name this profile describes
  std::string source;  // where the figures come from (defaults, or the calibration traces)

  // GEMM: time = flops / (peak x gemm_eff(dtype) x tile/wave factor x k factor) + overhead.
  double gemm_efficiency = 0.8;  // fraction of dense peak that large, well-shaped GEMMs reach
                                 // in a short burst (at the boost clock)
  // Tensor-core work sustained for seconds (a training step) runs at the power-saturated clock,
  // not the boost clock the datasheet peak and short benchmarks reach: this fraction of them
  // (applied to GEMMs and fused attention).
  double sustained_clock = 1.0;
  // Per Dtype (indexed by it): a calibrated efficiency for GEMMs in that dtype; 0 = use
  // gemm_efficiency.
  std::array<double, 5> gemm_efficiency_by_dtype{};
  // k at which the reduction-depth factor k/(k+k_half) is 1/2, for a 16-bit (bf16/fp16) GEMM; a
  // GEMM in another dtype scales it by its dense peak over bf16's (cost_models/compute.h
  // gemm_k_half_of: a tile's fixed prologue and epilogue take the same time, over which a faster
  // main loop covers more of the reduction). 0 (no factor beyond the memory roofline) in the GPU
  // defaults: no table of cuBLAS throughput against k is published (profile.cc says why
  // DeepGEMM's is not taken), so the term is left to `parasol calibrate`, which fits it from
  // traces.
  double gemm_k_half = 0;

  // Memory-bound kernels (norms, activations, dropout, residuals, softmax, optimizer).
  double memory_efficiency = 0.8;  // fraction of HBM bandwidth reached

  // Fused (flash) attention: fraction of dense peak reached in forward and backward, by
  // FlashAttention-2-class kernels and by cuDNN's fused attention (FlashAttention-3-class on
  // Hopper; 0 = the FlashAttention-2 figures).
  double flash_forward_efficiency = 0.6;
  double flash_backward_efficiency = 0.45;
  double cudnn_forward_efficiency = 0;
  double cudnn_backward_efficiency = 0;
  // FlashAttention-3 (AttentionKernel::kFa3, flash-attn's hopper/ build; Hopper only): its own
  // plateau where the device has one, else (0) the FlashAttention-2 figures.
  double fa3_forward_efficiency = 0;
  double fa3_backward_efficiency = 0;
  // FlashAttention in Triton (AttentionKernel::kTriton): how many times faster FlashAttention-2
  // runs the same pass, forward and backward; it takes FlashAttention-2's figures and shape
  // divided by these.
  double triton_forward_slowdown = 1;
  double triton_backward_slowdown = 1;
  // How a fused attention pass's throughput moves with its shape (cost_models/compute.h
  // attention_efficiency). The efficiency above is the plateau: long unmasked rows at head dim 128.
  // With s keys per query row the kernel reaches plateau x s / (s + s_half) (a tile's prologue and
  // epilogue amortised over its loop over keys); under a causal mask causal_plateau x plateau x
  // s / (s + causal_s_half) (diagonal tiles are masked, rows are shorter and unequal); head dims 64
  // and 256 reach head_dim_64 and head_dim_256 of head dim 128's (log-linear between, held
  // beyond). All defaults (s_half 0): the flat figure.
  struct AttentionShape {
    double s_half = 0;          // keys per query row at which an unmasked pass reaches half
    double causal_s_half = 0;   // the same under a causal mask
    double causal_plateau = 1;  // causal plateau / unmasked plateau
    double head_dim_64 = 1;     // throughput at head dim 64 / at head dim 128
    double head_dim_256 = 1;    // throughput at head dim 256 / at head dim 128
    bool is_flat() const {
      return s_half == 0 && causal_s_half == 0 && causal_plateau == 1 && head_dim_64 == 1 &&
             head_dim_256 == 1;
    }
  };
  // [figures: attention_slot(kernel)][pass: 0 forward, 1 backward]. A kernel with no figures of
  // its own (cudnn_* or fa3_*_efficiency 0) takes the FlashAttention-2 figures and shape together.
  std::array<std::array<AttentionShape, 2>, 3> attention_shape{};
  // The attention_shape slot of a kernel that has figures: FlashAttention-2 0, cuDNN 1,
  // FlashAttention-3 2 (Triton takes FlashAttention-2's).
  static int attention_slot(AttentionKernel k) {
    return k == AttentionKernel::kCudnn ? 1 : k == AttentionKernel::kFa3 ? 2 : 0;
  }

  // Per kernel, on the GPU: the gap between dependent kernels of a stream and the kernel's tail
  // (seconds). It stays under CUDA graphs. What the host spends launching the kernel is a separate
  // term (host_launch_s), paid on the host's timeline, not the GPU's.
  double kernel_overhead_s = 3e-6;

  // The host thread that issues the kernels (core/host_issue.h, cost_models/host_cost.h), seconds
  // of host time: a kernel launch (cudaLaunchKernel's host side), the ATen dispatcher per op,
  // an op called from Python, recording a forward op for autograd, an nn.Module call, replaying
  // a CUDA graph (cudaGraphLaunch), entering a torch.compile'd region (guards and wrappers), and
  // a device-to-host sync's round trip and wake-up once the device work it waits for is done.
  // Sources in profile.cc.
  double host_launch_s = 2.5e-6;
  double host_dispatch_s = 1e-6;
  double host_python_s = 1e-6;
  double host_autograd_s = 1.8e-6;
  double host_module_s = 2e-6;
  double host_graph_launch_s = 2.5e-6;
  double host_compile_guard_s = 14e-6;
  double host_sync_s = 3.3e-6;
  // Transformer Engine's modules (Plan::transformer_impl transformer_engine): the host's whole
  // time for one call, its kernel launches included, in seconds: a te.Linear forward and its
  // backward (the Python autograd.Function's: data and weight gradients), and what
  // te.LayerNormLinear adds to those for its LayerNorm. On the host CPU of the device's server
  // (Grace for GB200, x86 otherwise). Sources in profile.cc.
  double host_te_linear_fwd_s = 21.5e-6;
  double host_te_linear_bwd_s = 91.7e-6;
  double host_te_norm_fwd_s = 8.8e-6;
  double host_te_norm_bwd_s = 22.6e-6;
  // How much more host time each of those module calls costs under a Transformer Engine older
  // than 2.10 (Plan::te_version 1-209), before TE's CPU-overhead PRs #2377 and #2400: the ratio
  // of te.Linear's forward on GB200 then (TE issue #2053) and now (PR #3523's table). Source and
  // range in profile.cc and profile_ranges.cc.
  double host_te_before_2_10_factor = kTeGraceLinearFwdBefore210S / kTeGraceLinearFwdS;
  // Megatron-Core's own tensor-parallel modules (Plan::transformer_impl local, and the output
  // layer, a ColumnParallelLinear under either module set): the host's whole time for one
  // ColumnParallelLinear / RowParallelLinear forward call, its launches included, in seconds.
  // Its backward is a Python autograd.Function priced op by op (host_cost.h). Source in
  // profile.cc.
  double host_local_linear_fwd_s = 74e-6;

  // Communication: fraction of a link's bandwidth that collectives reach, per link kind
  // (indexed by LinkKind), and a software latency per algorithm step on top of the hardware's
  // (the whole step latency when `nccl` is absent: MPI on the CPU runtime).
  std::array<double, kLinkKinds> link_efficiency = {0.8, 0.8, 0.8, 0.9, 0.8, 0.5};
  double collective_step_latency_s = 5e-6;
  // Collectives on GPUs follow NCCL's algorithm, protocol and latency model; none for MPI.
  std::optional<NcclTuning> nccl;
  // Overlap is not free: while a communication kernel runs beside compute it holds SMs (NCCL:
  // one thread block per channel) and HBM bandwidth, and the compute it overlaps runs this much
  // slower (fraction of the overlapped time added back).
  double overlap_compute_slowdown = 0;
  // The same while a data-parallel collective runs beside the compute (gradient reduction and
  // ZeRO-3 / FSDP parameter gathers, which no framework carves SMs out for), or an expert
  // all-to-all overlapped with the other micro-batch's compute (cost_models/compute_overlap.h
  // holds_gemm_sms): on Hopper, cuBLAS's
  // persistent GEMMs launch one block per SM, so a GEMM started while NCCL holds SMs runs its
  // blocked blocks as a second wave (profile.cc). Tensor-parallel overlap (Transformer Engine's
  // userbuffers) sizes its GEMMs to the SMs it leaves free and keeps overlap_compute_slowdown.
  double dp_overlap_compute_slowdown = 0;
  // The MoE token exchange (an expert all-to-all whose group sits in one NVLink domain):
  // fraction of the NVLink bandwidth the dispatch and combine kernels reach, which run on a few
  // SMs each; 0 = the NVLink link efficiency above (cost_models/moe_dispatch.h).
  double expert_exchange_nvlink_efficiency = 0;
  // The same across servers: fraction of the network link's bandwidth (a GPU's NIC) that DeepEP's
  // and HybridEP's internode dispatch and combine kernels reach on the bytes that cross it, where
  // the expert-parallel group's exchange is bound by a network link and the plan's dispatcher is
  // DeepEP-class; 0 = the network link efficiency above (cost_models/moe_dispatch.h).
  double expert_exchange_network_efficiency = 0;
  // The same where the expert-parallel group spans two servers: the published internode kernels
  // reach less of the NIC there than across four or more (cost_models/profile.cc); 0 = the figure
  // above.
  double expert_exchange_network_efficiency_two_servers = 0;

  // Host <-> device copies (offload): fraction of the host link's bandwidth.
  double host_copy_efficiency = 0.8;
  // Fraction of a CPU socket's DRAM bandwidth that copies into host memory reach.
  double host_memory_efficiency = 0.73;
  // CPU Adam throughput of one server's host (parameters/s), shared by its GPUs: the host's
  // cores times DeepSpeed CPU-Adam's rate per core (profile.cc, kCpuAdamParamsPerCoreS).
  double host_adam_params_per_s = 1.63e9;

  // What the training process holds on a GPU besides its tensors (cost_models/framework_memory.h;
  // default_profile cites each figure). All 0 on the CPU runtime.
  double cuda_context_bytes = 0;     // CUDA context with PyTorch's kernels (outside the allocator)
  double nccl_connection_bytes = 0;  // one NCCL connection's buffers: Simple + LL128 + LL
  double nccl_channels = 0;          // channels a collective communicator connects
  double library_workspace_bytes = 0;  // cuBLAS(Lt) and Transformer Engine workspaces (allocated)
  // Reserved beyond allocated: the caching allocator's blocks stranded between live ones, as a
  // fraction of the step's transient bytes (activations, working set) with fixed segments.
  double allocator_fragmentation = 0;

  // Stragglers: the relative standard deviation of one GPU's compute speed around the median
  // GPU of a cluster of identical GPUs (manufacturing and power management). It prices the
  // expected slowest GPU of a synchronous job (cost_models/variability.h) in time to train, not
  // the step time of one plan.
  double gpu_speed_cv = 0;

  std::vector<std::string> traces;  // the measured traces a calibrated profile came from

  // Step-time error bands per accuracy-suite family (cost_models/error_bands.h); the defaults are
  // cost_models/error_bands.json as compiled in.
  ErrorBands error_bands;

  // Measured figures of the device (`parasol calibrate --probe` of the host CPU) that replace
  // its datasheet where this profile is used (Cluster::set_device_spec); none for datasheets.
  std::optional<DeviceSpec> measured_device;

  double link_eff(LinkKind k) const { return link_efficiency[static_cast<int>(k)]; }
  // Fraction of the dense peak a large GEMM sustains in `d` (burst efficiency x sustained clock).
  double gemm_eff(Dtype d) const {
    const double e = gemm_efficiency_by_dtype[static_cast<int>(d)];
    return (e > 0 ? e : gemm_efficiency) * sustained_clock;
  }
  // The kernel whose figures `k` is priced by: `k`, or FlashAttention-2 where `k` has none.
  AttentionKernel attention_figures(AttentionKernel k, bool backward) const {
    const double c = backward ? cudnn_backward_efficiency : cudnn_forward_efficiency;
    const double f3 = backward ? fa3_backward_efficiency : fa3_forward_efficiency;
    if (k == AttentionKernel::kCudnn && c > 0) return k;
    if (k == AttentionKernel::kFa3 && f3 > 0) return k;
    return AttentionKernel::kFlash2;
  }
  // Fraction of the dense peak fused attention sustains on its plateau (long unmasked rows, head
  // dim 128), forward or backward, at the sustained clock.
  double attention_eff(AttentionKernel k, bool backward) const {
    const AttentionKernel f = attention_figures(k, backward);
    const double e = f == AttentionKernel::kCudnn
                         ? (backward ? cudnn_backward_efficiency : cudnn_forward_efficiency)
                     : f == AttentionKernel::kFa3
                         ? (backward ? fa3_backward_efficiency : fa3_forward_efficiency)
                         : (backward ? flash_backward_efficiency : flash_forward_efficiency);
    const double slowdown = k != AttentionKernel::kTriton ? 1
                            : backward                    ? triton_backward_slowdown
                                                          : triton_forward_slowdown;
    return e * sustained_clock / slowdown;
  }
  // The shape figures of kernel `k`'s pass (those of the kernel attention_figures names).
  const AttentionShape& attention_shape_of(AttentionKernel k, bool backward) const {
    return attention_shape[attention_slot(attention_figures(k, backward))][backward ? 1 : 0];
  }
};

// NCCL tuning JSON: {"base_latency_us": [[LL, LL128, Simple] x tree, ring, PAT],
// "hw_latency_us": [nvlink, pci, net] of such tables, "net_overhead_us", "ll_max_GBps": [1, 2,
// more nodes]}; fields not given keep `base`'s.
NcclTuning nccl_tuning_from_json(const JsonReader& r, NcclTuning base);
Json nccl_tuning_to_json(const NcclTuning& t);

// parasol's default profile for a device (see profile.cc for the source of each figure).
Profile default_profile(const DeviceSpec& device);

// JSON: the fields above with units in the keys ("kernel_overhead_us", ...), "link_efficiency"
// and "gemm_efficiency_by_dtype" as objects keyed by link kind and dtype name, the measured
// device as "device_spec" (core/device.h's JSON form) and "error_bands" as an array of family
// bands (error_bands_to_json).
Profile profile_from_json(const Json& j, const std::string& path = "profile");
Json profile_to_json(const Profile& p);
// Reads a profile file and checks that it describes `device` (Error naming "profile.device").
Profile load_profile(const std::string& path, const DeviceSpec& device);

}  // namespace parasol::cost
