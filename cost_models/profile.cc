// Default profiles per device, with the public figure behind each number, and profile JSON I/O.
#include "cost_models/profile.h"

#include <cmath>

#include "core/device_family.h"
#include "core/error.h"
#include "core/units.h"

namespace parasol::cost {

namespace {
using units::MiB;
}  // namespace

NcclTuning nccl_defaults(const std::string& architecture, const std::string& host_cpu) {
  // NVIDIA/nccl src/graph/tuning.cc @5067397c, ncclTunerConstantsDefaults (microseconds).
  NcclTuning t;
  constexpr double us = 1e-6;
  t.base_latency_s = {{{6.8 * us, 14.0 * us, 8.4 * us},   // tree
                       {6.6 * us, 14.0 * us, 8.4 * us},   // ring
                       {8.0 * us, 8.0 * us, 8.0 * us}}};  // PAT
  t.hw_latency_s = {
      {// NVLink: tree, ring, PAT
       {{{0.6 * us, 1.25 * us, 4.0 * us}, {0.6 * us, 1.9 * us, 3.4 * us}, {0, 0, 4.0 * us}}},
       // PCIe
       {{{1.0 * us, 1.9 * us, 4.0 * us}, {1.0 * us, 2.5 * us, 5.7 * us}, {0, 0, 4.0 * us}}},
       // network
       {{{5.0 * us, 8.5 * us, 14.0 * us}, {2.7 * us, 4.0 * us, 14.0 * us}, {0, 0, 14.0 * us}}}}};
  t.net_overhead_s = (host_cpu == "amd" ? 2.0 : 1.0) * us;
  // llMaxBws (GB/s) by nodes 1 / 2 / more.
  constexpr double GB = 1e9;
  if (architecture == "volta")
    t.ll_max_bw = {39.0 * GB, 39.0 * GB, 20.4 * GB};
  else if (architecture == "hopper")
    t.ll_max_bw = {141.0 * GB, 45.0 * GB, 35.0 * GB};
  else if (architecture == "blackwell")
    t.ll_max_bw = {282.0 * GB, 90.0 * GB, 70.0 * GB};
  else
    t.ll_max_bw = {87.7 * GB, 22.5 * GB, 19.0 * GB};  // Ampere
  // "Plateau effect of ring": x1.4 from compute capability 8.0, x1.9 before.
  t.ring_allreduce_plateau = architecture == "volta" ? 1.9 : 1.4;
  return t;
}

// DeepSpeed CPU-Adam's rate per host core (parameters/s): the ZeRO-Offload tutorial's training log
// (deepspeedai/DeepSpeed docs/_tutorials/zero-offload.md, zero_offload_dp1_10B_log.png) shows
// optimizer_step 6217-6479 ms for the 10.3B parameters of its GPT-2 on one DGX-2 host, whose two
// Xeon Platinum 8168 have 48 cores (the tutorial's htop screenshot): 10.3e9 / 6.35 s / 48 =
// 3.4e7 a core. A server's host runs its GPUs' CPU optimizers on all its cores.
constexpr double kCpuAdamParamsPerCoreS = 3.4e7;
// The same on a host without AVX-512. DeepSpeed builds CPU-Adam for the vector width the host's
// flags offer (op_builder/builder.py simd_width: -D__AVX512__ when the CPU has avx512, else
// -D__AVX256__ with avx2) and its Step_AVX loop takes SIMD_WIDTH floats per vector instruction:
// 16 with AVX-512, 8 with AVX2 (csrc/includes/simd.h; deepspeedai/DeepSpeed@edaa722). The
// tutorial's rate is bound by the cores' execution, not by host memory: its 10.3e9 parameters x
// ~30 bytes of DRAM traffic each (fp32 weight, gradient and moments read, three written, an fp16
// copy) would take 1.65 s at 0.73 of the DGX-2's 256 GB/s, against 6.35 s measured. So a core
// of a host with AVX2 only (AMD EPYC 7742 / 7V12, Zen 2: AMD's product pages list AVX2, no
// AVX-512; the hosts of DGX A100 and Azure NDm A100 v4) runs it at 8/16 of the rate, at equal
// clocks (derived; the clocks' ratio is the range, profile_ranges.cc).
constexpr double kCpuAdamParamsPerCoreAvx2S = kCpuAdamParamsPerCoreS * 8.0 / 16.0;

Profile default_profile(const DeviceSpec& d) {
  Profile p;
  // Host cores of the server a GPU usually sits in (below, per device); DGX-2's 48 otherwise.
  p.host_adam_params_per_s = 48 * kCpuAdamParamsPerCoreS;
  p.device = d.name;
  p.source = "parasol defaults (datasheets and public micro-benchmarks)";
  // Collectives on GPUs: NCCL's latency model (tuning.cc), the per-step software latency is in
  // it. Overlapped communication slows the compute it hides behind: Hassan et al. 2025
  // ("Characterizing Compute-Communication Overlap in GPU-Accelerated Distributed Deep
  // Learning", arXiv 2507.03114) measure an average 18.9% compute slowdown over GPT and LLaMA
  // workloads on A100 and H100 (NCCL's kernels hold one thread block per channel: 24 of the
  // H100's 132 SMs for an all-gather, NVIDIA developer forum measurement, about 18%).
  p.collective_step_latency_s = 0;
  p.overlap_compute_slowdown = 0.19;
  p.dp_overlap_compute_slowdown = p.overlap_compute_slowdown;
  // STREAM triad on two-socket servers reaches ~0.7-0.75 of the DRAM peak (AMD EPYC 7742:
  // ~300 of 409.6 GB/s; Intel Xeon 8480: ~450 of 614 GB/s; vendors' STREAM reports).
  p.host_memory_efficiency = 0.73;
  // Error bands: the residuals of the accuracy suites (tools/update-error-bands.sh).
  p.error_bands = embedded_error_bands();
  // Sustained tensor-core work runs at the power-saturated clock: the Maximum Sustainable
  // Matmul FLOPS over the Maximum Achievable (boost burst) one, measured on a whole busy node
  // with mamf-finder (stas00/ml-engineering, compute/accelerator/benchmarks/README.md): H200
  // 698.6 / 823.9 = 0.848, B200 1426.4 / 1751.2 = 0.815, and an H100-class 743 / 781 at
  // 4096^3. Not measured on A100 and MI300X; the same physics (a TDP-limited clock) and the
  // Hopper ratio are used there.
  p.sustained_clock = 0.85;
  p.nccl = nccl_defaults("ampere", "intel");
  // Per-GPU variability: Sinha et al. 2022 ("Not All GPUs Are Created Equal", SC22, arXiv
  // 2208.11035) measure 8% (up to 22%) performance variation between GPUs of one SKU across
  // whole clusters (Summit, Vortex, Frontera, Longhorn, Corona), outliers aside. Read as the span
  // between the fastest and slowest of thousands of GPUs (about +-3 standard deviations), 8% is
  // a standard deviation of ~1.5% (derived).
  p.gpu_speed_cv = 0.015;
  // FlashAttention written in Triton (AttentionKernel::kTriton: flash-attn 1.x's
  // flash_attn_triton.py, which llm-foundry's MPT runs under attn_impl triton): the
  // FlashAttention-2 paper (Dao 2023, arXiv 2307.08691, Sec. 4.1, A100 80GB SXM4, head dims 64
  // and 128, with and without a causal mask) finds FlashAttention-2 "around 1.3-1.5x faster
  // than FlashAttention in Triton in the forward pass and around 2x faster in the backward
  // pass" (1.3-2.5x forward + backward, Sec. 4): 1.4 and 2.0. No other GPU's comparison is
  // published; these ratios are used on every GPU (profile_ranges.cc: 1.3-1.5, 1.5-2.5).
  p.triton_forward_slowdown = 1.4;
  p.triton_backward_slowdown = 2.0;
  if (d.vendor != "cpu") {
    // What a PyTorch training process holds on a GPU besides its tensors
    // (cost_models/framework_memory.h):
    //  - the CUDA context with PyTorch's kernels loaded lazily (CUDA_MODULE_LOADING=LAZY, the
    //    default since CUDA 11.7 / PyTorch 2): ~500 MiB per process on A100/H100 (PyTorch "CUDA
    //    semantics" notes; NVIDIA "CUDA lazy loading" documentation);
    //  - one NCCL connection's buffers, NCCL's defaults (src/include/device.h): Simple
    //    NCCL_BUFFSIZE 4 MiB, LL128 120 elements x 640 threads x 8 steps x 8 B = 4,915,200 B, LL
    //    8 lines x 512 threads x 8 steps x 16 B = 524,288 B: 9,633,792 B;
    //  - channels per collective communicator: NCCL opens up to 32 on NVSwitch systems
    //    (NCCL_MAX_NCHANNELS) and connects a channel's buffers when a collective uses it; 16, the
    //    middle of that range (NCCL environment-variable documentation);
    //  - cuBLAS(Lt) workspaces, allocated through PyTorch's caching allocator (so counted as
    //    allocated): PyTorch's and Transformer Engine's, 32 MiB each from Hopper on, 4 MiB before
    //    (cuBLAS documentation, cublasSetWorkspace; TE get_cublas_workspace_size_bytes);
    //  - blocks the caching allocator strands between live ones with fixed segments: none by
    //    default. The allocator (c10/cuda/CUDACachingAllocator.cpp) reuses a cached block of the
    //    same stream by best fit and splits it, and returns segments to CUDA only when a
    //    cudaMalloc fails or on empty_cache(), so what it strands depends on the order of one
    //    step's allocations, not on a fraction of their bytes; published measurements show it
    //    from little to a large share of a step's memory (torchtune#1185, Llama 3 8B QLoRA on
    //    an A100: 16.39 GiB with fixed segments, 10.83 GiB with expandable ones; pytorch#137151,
    //    a small FSDP step: max_reserved 2.62-2.88 GiB against max_active 1.38-1.75 GiB), so no
    //    default figure is sourced: the band of profile_ranges.cc carries it.
    const bool hopper_on = hopper_or_later(d);
    p.cuda_context_bytes = 500 * MiB;
    p.nccl_connection_bytes = 9633792;
    p.nccl_channels = 16;
    p.library_workspace_bytes = 2 * (hopper_on ? 32 : 4) * MiB;
    p.allocator_fragmentation = 0;
  }
  // The host (cost_models/host_cost.h). A kernel launch: ~3 us for a null kernel on recent
  // hardware and software (NVIDIA developer forum, "too much time for kernel launch latency",
  // 233645/3); 3.8 us per launch on B200 eager (Mirage MPK, arXiv 2512.22219): 2.5 us, the low
  // end, since the GPU-side gap (kernel_overhead_s) is counted apart. PyTorch eager per op
  // (pytorch/pytorch#41383, ngimel): ~2 us for an aten op from Python without grad, about half
  // of it Python parsing, the C++ API ~1 us: 1 us dispatch + 1 us Python; `2*x` 5.0 us without
  // and 6.8 us with requires_grad: autograd recording +1.8 us. An nn.Module call adds ~2 us
  // (pytorch/pytorch#50431: an empty module +2 us; F.linear 4.7 us vs nn.Linear 9.7 us). A
  // CUDA graph's repeat launch: 2.5 us + ~1 ns per node for straight-line graphs on CUDA 12.6
  // (NVIDIA blog "Constant Time Launch for Straight-Line CUDA Graphs", 2024-09-11). A
  // torch.compile'd call's guards and wrappers: 10-39 us (pytorch/pytorch#122029: 14 us, 39 us
  // with grad; dev-discuss "micro-optimizations for the most micro of benchmarks": 24 -> 10 us):
  // 14 us. A device-to-host sync's round trip and wake-up once the device is done: NVIDIA's
  // "Getting Started with CUDA Graphs" blog (V100, CUDA 10.1) times a 2.9 us kernel at 9.6 us
  // per kernel with a cudaStreamSynchronize after each, 3.8 us launched back to back and 3.4 us
  // per kernel through a graph: 9.6 - 2.9 - 3.4 = 3.3 us that the sync adds beyond the kernel and
  // its issue (profile_ranges.cc: 0.8-5.8 us).
  p.host_launch_s = 2.5e-6;
  p.host_dispatch_s = 1e-6;
  p.host_python_s = 1e-6;
  p.host_autograd_s = 1.8e-6;
  p.host_module_s = 2e-6;
  p.host_graph_launch_s = 2.5e-6;
  p.host_compile_guard_s = 14e-6;
  p.host_sync_s = 3.3e-6;
  // Transformer Engine's modules, BF16, CPU time per call measured on GB200 (Grace) with TE main
  // before NVIDIA/TransformerEngine PR #3523 (2026-09-15, its table): te.Linear 59.19 us forward,
  // 311.30 us forward + backward; te.LayerNormLinear 83.48 and 397.73 us. So a Linear's backward
  // 252.11 us, and the LayerNorm of LayerNormLinear 24.29 us forward and 62.14 us backward.
  // On an x86 DGX host these are times what a Transformer Engine module call costs there against
  // Grace, 1.15 (profile.h kX86OverGraceTeHost: Megatron's TEColumnParallelLinear forward took
  // 115 us of an x86 host's CPU in TE PR #1191, TE 1.11; te.Linear's forward took 99.66 us on
  // GB200 in TE issue #2053, TE 2.5-2.6, both before TE 2.10's CPU-overhead PRs): 68.3, 290.9,
  // 28.0, 71.7 us. Grace's slowdown for a bare torch.nn.Linear forward (TE #2053: 2.75x) would
  // put te.Linear's forward at 21.5 us, a third of the 74 us PR #1191 measured for Megatron's own
  // ColumnParallelLinear on its host, where TE's module took 1.6-1.9x that. profile_ranges.cc:
  // from PR #3523's after-figures over 2.75 to PR #1191's 140 us before-figure, scaled alike.
  p.host_te_linear_fwd_s = kTeGraceLinearFwdS * kX86OverGraceTeHost;
  p.host_te_linear_bwd_s = kTeGraceLinearBwdS * kX86OverGraceTeHost;
  p.host_te_norm_fwd_s = kTeGraceNormFwdS * kX86OverGraceTeHost;
  p.host_te_norm_bwd_s = kTeGraceNormBwdS * kX86OverGraceTeHost;
  // Megatron-Core's ColumnParallelLinear forward: 74 us of CPU per call, BF16, TP 1
  // (NVIDIA/TransformerEngine PR #1191, 2024-09-18, measuring Megatron-LM @6b35ca80's modules;
  // TEColumnParallelLinear 140 us there, 115 us after the PR). The PR names no CPU: taken as the
  // x86 DGX host it was then developed on; on Grace over kX86OverGraceTeHost, as for TE's modules
  // (module Python, not a bare op). profile_ranges.cc: from a bare torch.nn.Linear forward on
  // the same host (TE #2053: 13.48 us) to the measured figure (on Grace, to it times 2.75).
  p.host_local_linear_fwd_s = kMegatronLocalLinearFwdS;
  // Under a Transformer Engine older than 2.10 (Plan::te_version), before its CPU-overhead PRs
  // #2377 and #2400 (2025-11): te.Linear's forward cost 99.66 us of CPU on GB200 (TE issue #2053,
  // 2025-08-11) against 59.19 us before PR #3523 (2026-09), so each TE module call costs 1.68x
  // the figures above (the struct's default; profile_ranges.cc: 1 to 1.95, against PR #3523's
  // after-figure).
  p.host_te_before_2_10_factor = kTeGraceLinearFwdBefore210S / kTeGraceLinearFwdS;
  if (d.name == "GB200") {
    p.host_local_linear_fwd_s = kMegatronLocalLinearFwdS / kX86OverGraceTeHost;
    // A Grace host: PR #3523's GB200 figures as measured.
    p.host_te_linear_fwd_s = kTeGraceLinearFwdS;
    p.host_te_linear_bwd_s = kTeGraceLinearBwdS;
    p.host_te_norm_fwd_s = kTeGraceNormFwdS;
    p.host_te_norm_bwd_s = kTeGraceNormBwdS;
  }
  const DeviceFamily family = device_family(d);
  if (family == DeviceFamily::kAmpere) {
    // Burst GEMM efficiency: the Maximum Achievable Matmul FLOPS of an A100 SXM, 271.2 of 312
    // TFLOP/s bf16 (stas00/ml-engineering, compute/accelerator/README.md, MAMF table, torch
    // 2.6/CUDA 12.6): 0.869. The DL Performance guide's 250-270 TFLOP/s for large GEMMs agrees.
    p.gemm_efficiency = 0.869;
    // STREAM-like copies reach ~1.7 of 2.0 TB/s on A100-80G (~0.85); fused element-wise
    // kernels of Megatron (bias-gelu, bias-dropout-add, layernorm) reach about 0.75-0.8.
    p.memory_efficiency = 0.78;
    // FlashAttention-2 by shape: FlashAttention-2 paper (Dao 2023, arXiv 2307.08691) Fig. 4
    // (flash-attention@0251105 assets/flash2_a100_fwd_bwd_benchmark.png), A100 80GB SXM4, forward
    // + backward, b x s = 16k, hidden 2048, the FlashAttention FLOP convention, 512-16k: head dim
    // 128 unmasked (1k-16k; 512's label is hidden) 173..203 TFLOP/s -> 205.4 x s / (s + 194),
    // max error 0.3 %; causal 99..189 -> 193.5 x s / (s + 485) (0.942 of the unmasked plateau),
    // 1.2 %. Head dim 64 (unmasked 132..176 -> 178.1 x s / (s + 178); causal 88..171 -> 175.6 x
    // s / (s + 505)): 0.867 and 0.907 of head dim 128's plateaus, their mean 0.887 taken (every
    // bar of the four series within 2.7 %). No head dim 256 is published on A100: flat beyond 128.
    // The forward / backward split: the paper's text (Sec. 4) puts FlashAttention-2's best at
    // "up to 230 TFLOPs/s, 73%" (a forward bar of Fig. 5: no forward + backward bar passes 203),
    // taken at hd 128 unmasked 16k, where the backward then runs 2.5 / (3.5 / 203 - 1 / 230) =
    // 193.9 TFLOP/s, 0.843 of the forward. The plateau 205.4 split so: forward 232.7 (0.746 of
    // 312), backward 196.2 (0.629). Fig. 5-6's per-pass curves could not be read here: both passes
    // take the forward + backward curve's half-way keys (which reproduces Fig. 4 exactly). cuDNN's
    // fused attention on Ampere is FlashAttention-2-class (no separate figures).
    p.flash_forward_efficiency = 0.746;
    p.flash_backward_efficiency = 0.629;
    {
      const Profile::AttentionShape fa2_a100{194, 485, 0.942, 0.887, 1};
      p.attention_shape[static_cast<int>(AttentionKernel::kFlash2)] = {{fa2_a100, fa2_a100}};
    }
    // nccl-tests all_reduce_perf on DGX A100: ~230 GB/s bus bandwidth over 300 GB/s NVLink3 per
    // direction (0.77); HDR inter-node ~ 23 of 25 GB/s per NIC (0.92); PCIe Gen4 ~ 25 of 32 GB/s.
    p.link_efficiency = {0.77, 0.77, 0.78, 0.92, 0.8, 0.5};
    // DGX A100: AMD EPYC 7742 hosts (NCCL's 2 us network overhead per ring step), 2 x 64 cores
    // (DGX A100 User Guide) for the CPU optimizer, AVX2 only (CPU-Adam at 8 floats a vector).
    p.nccl = nccl_defaults("ampere", "amd");
    p.host_adam_params_per_s = 128 * kCpuAdamParamsPerCoreAvx2S;
  } else if (family == DeviceFamily::kHopper) {
    // (H800: the H100 SXM5 silicon and clocks; only its NVLink is narrower, in its preset.)
    // Burst GEMM efficiency (MAMF table, stas00/ml-engineering): H100 SXM bf16 794.5 of 989
    // (0.803; "H200 is the same"), fp8 1402.6 of 1979 (0.709).
    p.gemm_efficiency = 0.803;
    p.gemm_efficiency_by_dtype[static_cast<int>(Dtype::kFp8)] = 0.709;
    // Reduction depth (gemm_k_half): DeepGEMM's published FP8 GEMMs on H800 (deepseek-ai/
    // DeepGEMM@55ab91f README, "Normal GEMMs for dense models", M = 4096: K 16384, 7168, 2048,
    // 1536, 512 at 1426, 1265, 1168, 1125, 751 TFLOPS) fall with K as P x K / (K + 444) (least
    // squares, P = 1417, 3.1% rms), 222 for a 16-bit GEMM. That is DeepGEMM's kernel (per-128
    // block scales promoted on the CUDA cores), not the cuBLAS FP8 GEMMs Transformer Engine calls:
    // priced with it, the NeMo FP8 runs on H100 (tests/data/published/h100-dense.json, cuBLAS
    // through TE, K 1536-16384) come out 2-5% slower than their MAMF plateau predicts, against
    // their measured times. No cuBLAS table against K is published, so the default keeps no
    // reduction-depth term (0), left to `parasol calibrate`.
    // HBM3 STREAM ~ 2.9-3.0 of 3.35 TB/s; fused kernels reach ~0.75-0.8.
    p.memory_efficiency = 0.78;
    // Fused attention's plateau (long unmasked rows, head dim 128): FlashAttention-3 paper (Shah
    // et al. 2024, arXiv 2407.08608), H100 SXM5 bf16, Fig. 5 (forward, bar labels) and Fig. 6
    // (backward): the fits below reach cuDNN 620.6 / 541.9 and FlashAttention-2 377.0 / 329.1
    // TFLOP/s forward / backward, of 989.
    p.flash_forward_efficiency = 0.381;
    p.flash_backward_efficiency = 0.333;
    p.cudnn_forward_efficiency = 0.627;
    p.cudnn_backward_efficiency = 0.548;
    // Their shape (the curves' least-squares fits to those tables, 512-16k, b x s = 16k, 2048
    // hidden, the FlashAttention convention: causal forward counts half the pairs, backward 2.5x):
    // cuDNN forward unmasked 497..617..595 TFLOP/s -> 620.6 x s / (s + 111), max error 4.6 %;
    // causal 315..539 -> 560.9 x s / (s + 387) (0.904 of the unmasked plateau), 2.5 %; backward
    // unmasked (Fig. 6) 305..516 -> 541.9 x s / (s + 377), 2.9 %. FlashAttention-2 forward
    // 309..370 -> 377 x s / (s + 104); causal 191..335 -> 350.5 x s / (s + 404) (0.930); backward
    // 214..322 -> 329.1 x s / (s + 274). No causal backward is published per kernel on H100; the
    // FlashAttention-2 paper's (Dao 2023, Fig. 4) H100 forward + backward, causal 163..328 TFLOP/s,
    // less the FlashAttention-3 paper's forward gives its causal backward 154..325 -> 327.5 x s /
    // (s + 582), 0.985 of the unmasked backward's plateau (332.6): taken for both kernels.
    // Head dim at 16k, unmasked (Fig. 5): cuDNN 413 / 595 / 581 at 64 / 128 / 256 (0.694, 0.976),
    // FlashAttention-2 324 / 370 / 326 (0.876, 0.881); backward (Fig. 6) at 64: cuDNN 433 / 516
    // (0.839), FlashAttention-2 291 / 322 (0.904); no backward at 256 is published: the forward's.
    using K = AttentionKernel;
    p.attention_shape[static_cast<int>(K::kCudnn)] = {
        {{111, 387, 0.904, 0.694, 0.976}, {377, 582, 0.985, 0.839, 0.976}}};
    p.attention_shape[static_cast<int>(K::kFlash2)] = {
        {{104, 404, 0.930, 0.876, 0.881}, {274, 582, 0.985, 0.904, 0.881}}};
    // FlashAttention-3 (AttentionKernel::kFa3), the same paper's own curves (Fig. 5 bar labels;
    // Fig. 6 backward), fitted the same way: forward unmasked hd 128 467..648 TFLOP/s -> 667.3 x
    // s / (s + 202), max error 2.8 %; causal 292..616 -> 648.6 x s / (s + 568) (0.972 of the
    // unmasked plateau), 5.3 % (at 512); backward unmasked 316..561 -> 587.8 x s / (s + 409),
    // 3.4 %. Head dim at 16k, unmasked: forward 497 / 648 / 756 at 64 / 128 / 256 (0.767, 1.167),
    // backward at 64 474 / 561 (0.845). Neither a causal nor an hd-256 backward is published:
    // FlashAttention-2's causal backward shape (above) and the forward's hd-256 factor.
    p.fa3_forward_efficiency = 0.674;   // 667.3 of 989.4
    p.fa3_backward_efficiency = 0.594;  // 587.8 of 989.4
    p.attention_shape[Profile::attention_slot(K::kFa3)] = {
        {{202, 568, 0.972, 0.767, 1.167}, {409, 582, 0.985, 0.845, 1.167}}};
    // nccl-tests on DGX H100 without NVLS: ~360 GB/s of 450 (0.8); NDR ~ 46 of 50 GB/s (0.92).
    p.link_efficiency = {0.8, 0.8, 0.8, 0.92, 0.8, 0.5};
    // DGX H100/H200: Intel Xeon Platinum 8480C hosts, 2 x 56 cores (DGX H100 User Guide).
    p.nccl = nccl_defaults("hopper", "intel");
    // Data-parallel collectives beside Hopper's persistent GEMMs: cuBLAS's sm90 GEMMs launch as
    // many blocks as the GPU has SMs (132), each working through several output tiles; with NCCL
    // holding some SMs, the blocks that cannot be resident run as a second wave and the GEMM
    // takes twice as long: 'the matmuls take 2x as long to complete when they are overlapped with
    // a NCCL kernel' under FSDP on H100 (pytorch/pytorch#143988, 2024-12-30; the SM carve-out it
    // asked for, PR #147966, came in 2025); 'statically-scheduled persistent kernels will run 2x
    // slower when wave quantization occurs' (NVIDIA/cutlass#2471). Compute at half speed while a
    // data-parallel collective runs: 0.5. Blackwell's GEMMs schedule tiles dynamically (cluster
    // launch control), Ampere's launch one block per tile: the general figure there.
    p.dp_overlap_compute_slowdown = 0.5;
    // MoE token exchange inside the NVLink domain: DeepEP's normal kernels on H800 reach 153
    // GB/s (FP8 dispatch) and 158 GB/s (BF16 combine) at EP8 (deepseek-ai/DeepEP@dd758ca
    // docs/legacy.md, "Intranode"; 4096 tokens, hidden 7168, top-8), of the 200 GB/s per
    // direction of H800's NVLink: 0.765-0.79. It replaces the link efficiency of the kind the
    // group's exchange is bound by (GroupModel::all_to_all_link()).
    p.expert_exchange_nvlink_efficiency = 0.78;
    // MoE token exchange across servers (DeepEP-class internode kernels): HybridEP on H100
    // (deepseek-ai/DeepEP branch hybrid-ep @94a9f8f docs/README_Hybrid-EP.md, "H100 Platform",
    // 4096 tokens, hidden 7168, top-8, 8 experts a rank, Torch API, 16 SMs): BF16 dispatch 54.47 /
    // 47.36 / 41.24 and combine 53.35 / 52.53 / 46.57 GB/s at 16 / 32 / 64 ranks. Those are
    // "algorithm bandwidth" over every node a token reaches, its own included
    // (tests/utils.py count_rdma_send_from_routing_map: "we do not set the local node map to
    // zeros", as DeepEP's test_internode.py, deepseek-ai/DeepEP#51), so the bytes that cross the
    // NIC move at (N - 1) / N of them over 2, 4, 8 servers: 27.2 / 35.5 / 36.1 and 26.7 / 39.4 /
    // 40.7 GB/s of the 50 GB/s CX7 NIC: 0.544 / 0.71 / 0.722 and 0.534 / 0.788 / 0.814. Over two
    // servers both exchanges reach about 0.54 (mean 0.539); over four and eight 0.71-0.81 (mean
    // 0.759): the two figures below.
    p.expert_exchange_network_efficiency = 0.76;
    p.expert_exchange_network_efficiency_two_servers = 0.54;
    p.host_adam_params_per_s = 112 * kCpuAdamParamsPerCoreS;
    if (d.tdp_watts < 700) {
      // A power-limited H100 sustains a lower clock. Dynamic power scales about as the cube of
      // the clock (P ~ f V^2 with V ~ f along the DVFS curve), so a 500 W limit sustains
      // (500/700)^(1/3) = 0.894 of the 700 W part's saturated clock: 0.85 x 0.894 = 0.76.
      p.sustained_clock = 0.85 * std::cbrt(d.tdp_watts / 700.0);
    }
  } else if (family == DeviceFamily::kBlackwell) {
    // MAMF table: B200 SXM bf16 1745.0 of 2250 (0.776), fp8 3432.5 of 4500 (0.763); the
    // sustained clock ratio measured on B200 is 0.815. GB200's GPU is the same Blackwell die
    // pair (at a higher power limit); no MAMF figure of GB200 is cited, so B200's are used.
    p.gemm_efficiency = 0.776;
    p.gemm_efficiency_by_dtype[static_cast<int>(Dtype::kFp8)] = 0.763;
    p.sustained_clock = 0.815;
    p.memory_efficiency = 0.78;
    // FlashAttention-2 (2.7.4, no Blackwell-specific kernel) on B200, the same table's
    // flash_attention rows (causal, 2k-128k): forward 254..444 TFLOP/s -> 459.0 x s / (s + 1541),
    // max error 3.4 %; backward 199..348 -> 363.5 x s / (s + 1561), 4.0 %. No unmasked row: the
    // causal/unmasked plateau ratio (0.930 forward, 0.985 backward) and half-way-keys ratio
    // (104 / 404, 274 / 582) of FlashAttention-2 on H100 (FlashAttention-3 paper, above) give the
    // unmasked curve: plateaus 493.5 (0.219 of 2250) and 369.0 (0.164), half-way keys 397, 735.
    p.flash_forward_efficiency = 0.219;
    p.flash_backward_efficiency = 0.164;
    p.attention_shape[static_cast<int>(AttentionKernel::kFlash2)] = {
        {{397, 1541, 0.930, 1, 1}, {735, 1561, 0.985, 1, 1}}};
    // cuDNN fused attention on B200: NVIDIA/cudnn-frontend@bb37575
    // benchmark/sdpa_benchmark_training/artifacts/sdpa_bf16_benchmark_results_NVIDIA_B200.csv
    // (cuDNN 9.10.2, NGC PyTorch 25.06, free clock; batch 1, 128 query / 8 KV heads, head dim 128,
    // causal; the FlashAttention FLOP convention: causal halves the square, backward 2.5x),
    // 4k-128k: forward 856, 1171, 1332, 1419, 1382, 1355 TFLOP/s -> 1474.2 x s / (s + 2635), max
    // error 6.6 %; backward 701, 943, 1075, 1109, 1073, 1048 -> 1144.2 x s / (s + 2253), 7.4 % (2k
    // is 25-31 % below either curve). That table is causal only; the unmasked curve's shape is
    // cuDNN 9.19's on GB200 (same repository @df73764, results/gb200_919_only_cudnn/
    // llama3.1_20260226_174648.csv, 64 / 8 heads, 2k-32k): unmasked forward 1245..1781 ->
    // 1870.4 x s / (s + 911), causal 1834.0 x s / (s + 1501) (causal / unmasked plateau 0.981);
    // backward unmasked 1089..1501 -> 1539.8 x s / (s + 830), causal 1555.9 x s / (s + 1656)
    // (1.010). Plateaus: 1474.2 / 0.981 = 1502.8 (0.668 of 2250) forward and 1144.2 / 1.010 =
    // 1132.9 (0.503) backward. No head-dim table on Blackwell is cited: flat in head dim.
    p.cudnn_forward_efficiency = 0.668;
    p.cudnn_backward_efficiency = 0.503;
    p.attention_shape[static_cast<int>(AttentionKernel::kCudnn)] = {
        {{911, 2635, 0.981, 1, 1}, {830, 2253, 1.010, 1, 1}}};
    p.link_efficiency = {0.8, 0.8, 0.8, 0.92, 0.8, 0.5};
    // DGX B200: Intel Xeon 8570 hosts; GB200: Arm Grace (NCCL's 1 us non-AMD network overhead).
    // DGX B200: 2 x 56 cores (DGX B200 User Guide) for the CPU optimizer.
    p.nccl = nccl_defaults("blackwell", "intel");
    // MoE token exchange inside the NVLink domain (NVLink5, 900 GB/s per direction): HybridEP's
    // Torch-API algorithm bandwidth on GB200 MNNVL, BF16 dispatch and combine, 4096 tokens,
    // hidden 7168, top-8, EP8-36: 418-550 GB/s on 16 SMs, 448-569 GB/s on 32 SMs; on B200 EP8,
    // 16 SMs, 531-536 GB/s (deepseek-ai/DeepEP@94a9f8f, branch hybrid-ep,
    // docs/README_Hybrid-EP.md, "B200 Platform", "GB200 Platform"): 0.46-0.63 of the link. The
    // kernels run on 16-32 SMs; the link is not the bound.
    p.expert_exchange_nvlink_efficiency = 0.55;
    p.host_adam_params_per_s = 112 * kCpuAdamParamsPerCoreS;
  } else if (family == DeviceFamily::kCdna3) {
    // MAMF table (stas00/ml-engineering): MI300X bf16 668.4 of 1300 TFLOP/s (0.514, ROCm 6.3,
    // TunableOp); RCCL all-reduce ~ 300 of 448 GB/s (~0.7). MI325X: the same CDNA 3 compute
    // dies and Infinity Fabric (its HBM3E is in its datasheet); MI300X's figures are used.
    p.gemm_efficiency = 0.514;
    p.memory_efficiency = 0.7;
    p.flash_forward_efficiency = 0.3;
    p.flash_backward_efficiency = 0.22;
    p.link_efficiency = {0.7, 0.7, 0.8, 0.92, 0.8, 0.5};
    // RCCL keeps NCCL's tuning model; its constants are NCCL's Ampere-era ones.
    p.nccl = nccl_defaults("ampere", "amd");
  } else if (family == DeviceFamily::kVolta) {
    // Burst GEMM efficiency: Markidis et al. 2018 ("NVIDIA Tensor Core Programmability,
    // Performance & Precision", IPDPSW 2018, arXiv 1803.04014, abstract): cuBLAS mixed-precision
    // GEMM reaches "up to 83 Tflops/s" on a Tesla V100 of its 125 TFLOP/s tensor-core peak:
    // 0.664. Volta: no public attention or nccl-tests figure of the V100 is cited; the other
    // defaults above stand, each with a wide range (profile_ranges.cc). NCCL's Volta constants;
    // DGX-2: Intel Xeon Platinum 8168 hosts.
    p.gemm_efficiency = 0.664;
    p.nccl = nccl_defaults("volta", "intel");
  } else if (family == DeviceFamily::kHostCpu) {
    // One rank of the CPU runtime (device.cc: the peak is the one-core cblas_sgemm rate and the
    // bandwidth a one-thread STREAM triad). OpenBLAS reaches ~0.9 of its large-sgemm rate on
    // the transposed shapes of a backward pass; the plainly written element-wise kernels and
    // the unfused attention reach ~0.5-0.6 of triad bandwidth; a kernel is a function call
    // (~1 us with its loop set-up). MPI over shared memory: ~2 us per message step (Open MPI
    // vader latency), shm efficiency 0.5 (double copies for small and medium messages);
    // offload copies are memcpys (0.9 of the link's figure); the host's Adam is the
    // optimizer kernel itself (~25 GB/s over ~28 bytes per parameter).
    p.gemm_efficiency = 0.9;
    p.gemm_k_half = 16;
    p.memory_efficiency = 0.55;
    p.flash_forward_efficiency = 0.3;
    p.flash_backward_efficiency = 0.2;
    p.kernel_overhead_s = 1e-6;
    p.link_efficiency = {0.8, 0.8, 0.8, 0.9, 0.8, 0.5};
    p.collective_step_latency_s = 2e-6;
    p.nccl.reset();           // MPI, not NCCL
    p.sustained_clock = 1.0;  // the probe measures the sustained sgemm rate
    // MPI progresses only while the executor polls between ops (no overlap to slow compute).
    p.overlap_compute_slowdown = 0;
    p.dp_overlap_compute_slowdown = 0;
    p.host_copy_efficiency = 0.9;
    p.host_adam_params_per_s = 0.5e9;
    p.gpu_speed_cv = 0;  // the CPU runtime's ranks share one host
    // The CPU runtime runs its own attention whatever kernel the plan names.
    p.triton_forward_slowdown = p.triton_backward_slowdown = 1;
    // The CPU runtime's executor runs each op inline on the host: what issuing it costs is in
    // the op's own time, no launch, dispatch or sync apart.
    p.host_launch_s = p.host_dispatch_s = p.host_python_s = p.host_autograd_s = 0;
    p.host_module_s = p.host_graph_launch_s = p.host_compile_guard_s = p.host_sync_s = 0;
    p.host_te_linear_fwd_s = p.host_te_linear_bwd_s = 0;
    p.host_te_norm_fwd_s = p.host_te_norm_bwd_s = 0;
    p.host_local_linear_fwd_s = 0;
    p.host_te_before_2_10_factor = 1;
  }
  return p;
}

namespace {
// The JSON key of kernel k's (AttentionKernel) pass b (0 forward, 1 backward) shape figures.
// k is a Profile::attention_slot.
std::string attention_shape_key(int k, int b) {
  return std::string(k == 1 ? "cudnn" : k == 2 ? "fa3" : "flash") + (b ? "_backward" : "_forward");
}

// Fills `out` (rows x cols) from a JSON array of arrays of microseconds.
template <size_t R, size_t C>
void read_us_table(const JsonReader& r, const std::string& key,
                   std::array<std::array<double, C>, R>& out) {
  const auto rows = r.array(key);
  if (rows.size() != R) throw Error(r.field(key), "must have " + std::to_string(R) + " rows");
  for (size_t i = 0; i < R; ++i) {
    const Json& row = *rows[i].second;
    if (!row.is_array() || row.size() != C)
      throw Error(rows[i].first, "must be an array of " + std::to_string(C) + " numbers");
    for (size_t k = 0; k < C; ++k) {
      if (!row[k].is_number() || row[k].get<double>() < 0 || row[k].get<double>() > 1e6)
        throw Error(rows[i].first + "[" + std::to_string(k) + "]",
                    "must be a number of microseconds in [0, 1e6]");
      out[i][k] = row[k].get<double>() * 1e-6;
    }
  }
}

Json us_table(const std::array<std::array<double, 3>, 3>& t) {
  Json j = Json::array();
  for (const auto& row : t) {
    Json r = Json::array();
    for (double v : row) r.push_back(in_json_unit(v, 1e-6));
    j.push_back(r);
  }
  return j;
}
}  // namespace

NcclTuning nccl_tuning_from_json(const JsonReader& r, NcclTuning t) {
  r.allow_only({"base_latency_us", "hw_latency_us", "net_overhead_us", "ll_max_GBps"});
  if (r.has("base_latency_us")) read_us_table(r, "base_latency_us", t.base_latency_s);
  if (r.has("hw_latency_us")) {
    const auto transports = r.array("hw_latency_us");
    if (transports.size() != 3)
      throw Error(r.field("hw_latency_us"), "must have 3 transports (nvlink, pci, net)");
    for (size_t i = 0; i < 3; ++i) {
      Json wrapper = {{"t", *transports[i].second}};
      JsonReader w(wrapper, transports[i].first);
      read_us_table(w, "t", t.hw_latency_s[i]);
    }
  }
  t.net_overhead_s = r.number_or("net_overhead_us", t.net_overhead_s * 1e6, 0, 1e6) * 1e-6;
  if (r.has("ll_max_GBps")) {
    const auto v = r.array("ll_max_GBps");
    if (v.size() != 3)
      throw Error(r.field("ll_max_GBps"), "must have 3 numbers (1, 2, more nodes)");
    for (size_t i = 0; i < 3; ++i) {
      if (!v[i].second->is_number() || v[i].second->get<double>() <= 0)
        throw Error(v[i].first, "must be a positive number");
      t.ll_max_bw[i] = v[i].second->get<double>() * 1e9;
    }
  }
  return t;
}

Json nccl_tuning_to_json(const NcclTuning& t) {
  Json hw = Json::array();
  for (const auto& transport : t.hw_latency_s) hw.push_back(us_table(transport));
  return {{"base_latency_us", us_table(t.base_latency_s)},
          {"hw_latency_us", hw},
          {"net_overhead_us", in_json_unit(t.net_overhead_s, 1e-6)},
          {"ll_max_GBps",
           {in_json_unit(t.ll_max_bw[0], 1e9), in_json_unit(t.ll_max_bw[1], 1e9),
            in_json_unit(t.ll_max_bw[2], 1e9)}}};
}

Profile profile_from_json(const Json& j, const std::string& path) {
  JsonReader r(j, path);
  r.allow_only({"device",
                "source",
                "gemm_efficiency",
                "gemm_efficiency_by_dtype",
                "gemm_k_half",
                "memory_efficiency",
                "flash_forward_efficiency",
                "flash_backward_efficiency",
                "kernel_overhead_us",
                "link_efficiency",
                "collective_step_latency_us",
                "host_copy_efficiency",
                "host_adam_params_per_s",
                "traces",
                "device_spec",
                "nccl",
                "overlap_compute_slowdown",
                "dp_overlap_compute_slowdown",
                "expert_exchange_nvlink_efficiency",
                "expert_exchange_network_efficiency",
                "expert_exchange_network_efficiency_two_servers",
                "sustained_clock",
                "cudnn_forward_efficiency",
                "cudnn_backward_efficiency",
                "fa3_forward_efficiency",
                "fa3_backward_efficiency",
                "triton_forward_slowdown",
                "triton_backward_slowdown",
                "attention_shape",
                "host_memory_efficiency",
                "gpu_speed_cv",
                "cuda_context_MiB",
                "nccl_connection_MiB",
                "nccl_channels",
                "library_workspace_MiB",
                "allocator_fragmentation",
                "host_launch_us",
                "host_dispatch_us",
                "host_python_us",
                "host_autograd_us",
                "host_module_us",
                "host_graph_launch_us",
                "host_compile_guard_us",
                "host_sync_us",
                "host_te_linear_fwd_us",
                "host_te_linear_bwd_us",
                "host_te_norm_fwd_us",
                "host_te_norm_bwd_us",
                "host_local_linear_fwd_us",
                "host_te_before_2_10_factor",
                "error_bands"});
  Profile p = default_profile(device_spec(r.string("device"), r.field("device")));
  p.source = r.string_or("source", "file");
  p.gemm_efficiency = r.number_or("gemm_efficiency", p.gemm_efficiency, 1e-3, 1);
  if (r.has("gemm_efficiency_by_dtype")) {
    JsonReader g = r.object("gemm_efficiency_by_dtype");
    g.allow_only({"fp32", "tf32", "bf16", "fp16", "fp8"});
    for (Dtype d : {Dtype::kFp32, Dtype::kTf32, Dtype::kBf16, Dtype::kFp16, Dtype::kFp8})
      p.gemm_efficiency_by_dtype[static_cast<int>(d)] =
          g.number_or(dtype_name(d), p.gemm_efficiency_by_dtype[static_cast<int>(d)], 1e-3, 1);
  }
  p.gemm_k_half = r.number_or("gemm_k_half", p.gemm_k_half, 0, 1e6);
  p.memory_efficiency = r.number_or("memory_efficiency", p.memory_efficiency, 1e-3, 1);
  p.flash_forward_efficiency =
      r.number_or("flash_forward_efficiency", p.flash_forward_efficiency, 1e-3, 1);
  p.flash_backward_efficiency =
      r.number_or("flash_backward_efficiency", p.flash_backward_efficiency, 1e-3, 1);
  p.kernel_overhead_s = r.number_or("kernel_overhead_us", p.kernel_overhead_s * 1e6, 0, 1e6) * 1e-6;
  if (r.has("link_efficiency")) {
    JsonReader l = r.object("link_efficiency");
    for (LinkKind k : kAllLinkKinds)
      p.link_efficiency[static_cast<int>(k)] =
          l.number_or(link_kind_name(k), p.link_eff(k), 1e-3, 1);
    l.allow_only({"nvlink", "nvswitch", "pcie", "infiniband", "ethernet", "shm"});
  }
  p.collective_step_latency_s =
      r.number_or("collective_step_latency_us", p.collective_step_latency_s * 1e6, 0, 1e6) * 1e-6;
  p.overlap_compute_slowdown =
      r.number_or("overlap_compute_slowdown", p.overlap_compute_slowdown, 0, 1);
  p.dp_overlap_compute_slowdown =
      r.number_or("dp_overlap_compute_slowdown", p.dp_overlap_compute_slowdown, 0, 1);
  p.expert_exchange_nvlink_efficiency =
      r.number_or("expert_exchange_nvlink_efficiency", p.expert_exchange_nvlink_efficiency, 0, 1);
  p.expert_exchange_network_efficiency =
      r.number_or("expert_exchange_network_efficiency", p.expert_exchange_network_efficiency, 0, 1);
  p.expert_exchange_network_efficiency_two_servers =
      r.number_or("expert_exchange_network_efficiency_two_servers",
                  p.expert_exchange_network_efficiency_two_servers, 0, 1);
  p.sustained_clock = r.number_or("sustained_clock", p.sustained_clock, 1e-3, 1);
  p.host_memory_efficiency =
      r.number_or("host_memory_efficiency", p.host_memory_efficiency, 1e-3, 1);
  p.gpu_speed_cv = r.number_or("gpu_speed_cv", p.gpu_speed_cv, 0, 1);
  p.cuda_context_bytes = r.number_or("cuda_context_MiB", p.cuda_context_bytes / MiB, 0, 1e6) * MiB;
  p.nccl_connection_bytes =
      r.number_or("nccl_connection_MiB", p.nccl_connection_bytes / MiB, 0, 1e6) * MiB;
  p.nccl_channels = r.number_or("nccl_channels", p.nccl_channels, 0, 1024);
  p.library_workspace_bytes =
      r.number_or("library_workspace_MiB", p.library_workspace_bytes / MiB, 0, 1e6) * MiB;
  p.allocator_fragmentation =
      r.number_or("allocator_fragmentation", p.allocator_fragmentation, 0, 10);
  p.cudnn_forward_efficiency =
      r.number_or("cudnn_forward_efficiency", p.cudnn_forward_efficiency, 0, 1);
  p.cudnn_backward_efficiency =
      r.number_or("cudnn_backward_efficiency", p.cudnn_backward_efficiency, 0, 1);
  p.fa3_forward_efficiency = r.number_or("fa3_forward_efficiency", p.fa3_forward_efficiency, 0, 1);
  p.fa3_backward_efficiency =
      r.number_or("fa3_backward_efficiency", p.fa3_backward_efficiency, 0, 1);
  p.triton_forward_slowdown =
      r.number_or("triton_forward_slowdown", p.triton_forward_slowdown, 0.1, 100);
  p.triton_backward_slowdown =
      r.number_or("triton_backward_slowdown", p.triton_backward_slowdown, 0.1, 100);
  if (r.has("attention_shape")) {
    JsonReader a = r.object("attention_shape");
    a.allow_only({"flash_forward", "flash_backward", "cudnn_forward", "cudnn_backward",
                  "fa3_forward", "fa3_backward"});
    for (int k = 0; k < 3; ++k)
      for (int b = 0; b < 2; ++b) {
        const std::string key = attention_shape_key(k, b);
        if (!a.has(key)) continue;
        JsonReader c = a.object(key);
        c.allow_only({"s_half", "causal_s_half", "causal_plateau", "head_dim_64", "head_dim_256"});
        Profile::AttentionShape& sh = p.attention_shape[k][b];
        sh.s_half = c.number_or("s_half", sh.s_half, 0, 1e9);
        sh.causal_s_half = c.number_or("causal_s_half", sh.causal_s_half, 0, 1e9);
        sh.causal_plateau = c.number_or("causal_plateau", sh.causal_plateau, 1e-3, 2);
        sh.head_dim_64 = c.number_or("head_dim_64", sh.head_dim_64, 1e-3, 4);
        sh.head_dim_256 = c.number_or("head_dim_256", sh.head_dim_256, 1e-3, 4);
      }
  }
  if (r.has("nccl")) {
    if (r.raw("nccl").is_boolean()) {
      if (!r.boolean("nccl")) {
        p.nccl.reset();
      } else if (!p.nccl) {
        throw Error(r.field("nccl"), "true needs a GPU device (give the tuning object)");
      }
    } else {
      p.nccl = nccl_tuning_from_json(r.object("nccl"),
                                     p.nccl ? *p.nccl : nccl_defaults("ampere", "intel"));
    }
  }
  auto us = [&](const char* key, double& field) {
    field = r.number_or(key, field * 1e6, 0, 1e6) * 1e-6;
  };
  us("host_launch_us", p.host_launch_s);
  us("host_dispatch_us", p.host_dispatch_s);
  us("host_python_us", p.host_python_s);
  us("host_autograd_us", p.host_autograd_s);
  us("host_module_us", p.host_module_s);
  us("host_graph_launch_us", p.host_graph_launch_s);
  us("host_compile_guard_us", p.host_compile_guard_s);
  us("host_sync_us", p.host_sync_s);
  us("host_te_linear_fwd_us", p.host_te_linear_fwd_s);
  us("host_te_linear_bwd_us", p.host_te_linear_bwd_s);
  us("host_te_norm_fwd_us", p.host_te_norm_fwd_s);
  us("host_te_norm_bwd_us", p.host_te_norm_bwd_s);
  us("host_local_linear_fwd_us", p.host_local_linear_fwd_s);
  p.host_te_before_2_10_factor =
      r.number_or("host_te_before_2_10_factor", p.host_te_before_2_10_factor, 1, 10);
  p.host_copy_efficiency = r.number_or("host_copy_efficiency", p.host_copy_efficiency, 1e-3, 1);
  p.host_adam_params_per_s =
      r.number_or("host_adam_params_per_s", p.host_adam_params_per_s, 1, 1e15);
  if (r.has("traces"))
    for (const auto& [ipath, t] : r.array("traces")) {
      if (!t->is_string()) throw Error(ipath, "must be a string");
      p.traces.push_back(t->get<std::string>());
    }
  if (r.has("error_bands"))
    p.error_bands = error_bands_from_json(r.raw("error_bands"), r.field("error_bands"));
  if (r.has("device_spec")) {
    p.measured_device = device_spec_from_json(r.raw("device_spec"), r.field("device_spec"));
    if (device_spec(p.measured_device->name, r.field("device_spec.name")).name != p.device)
      throw Error(
          r.field("device_spec.name"),
          "'" + p.measured_device->name + "' differs from the profile's device " + p.device);
    p.measured_device->name = p.device;
  }
  return p;
}

Json profile_to_json(const Profile& p) {
  Json links;
  for (LinkKind k : kAllLinkKinds) links[link_kind_name(k)] = p.link_eff(k);
  Json j = {{"device", p.device},
            {"source", p.source},
            {"gemm_efficiency", p.gemm_efficiency},
            {"gemm_k_half", p.gemm_k_half},
            {"memory_efficiency", p.memory_efficiency},
            {"flash_forward_efficiency", p.flash_forward_efficiency},
            {"flash_backward_efficiency", p.flash_backward_efficiency},
            {"kernel_overhead_us", in_json_unit(p.kernel_overhead_s, 1e-6)},
            {"link_efficiency", links},
            {"collective_step_latency_us", in_json_unit(p.collective_step_latency_s, 1e-6)},
            {"host_copy_efficiency", p.host_copy_efficiency},
            {"overlap_compute_slowdown", p.overlap_compute_slowdown},
            {"dp_overlap_compute_slowdown", p.dp_overlap_compute_slowdown},
            {"sustained_clock", p.sustained_clock},
            {"host_memory_efficiency", p.host_memory_efficiency},
            {"cudnn_forward_efficiency", p.cudnn_forward_efficiency},
            {"cudnn_backward_efficiency", p.cudnn_backward_efficiency},
            {"fa3_forward_efficiency", p.fa3_forward_efficiency},
            {"fa3_backward_efficiency", p.fa3_backward_efficiency},
            {"triton_forward_slowdown", p.triton_forward_slowdown},
            {"triton_backward_slowdown", p.triton_backward_slowdown},
            {"host_adam_params_per_s", p.host_adam_params_per_s},
            {"gpu_speed_cv", p.gpu_speed_cv},
            {"cuda_context_MiB", in_json_unit(p.cuda_context_bytes, MiB)},
            {"nccl_connection_MiB", in_json_unit(p.nccl_connection_bytes, MiB)},
            {"nccl_channels", p.nccl_channels},
            {"library_workspace_MiB", in_json_unit(p.library_workspace_bytes, MiB)},
            {"allocator_fragmentation", p.allocator_fragmentation},
            {"host_launch_us", in_json_unit(p.host_launch_s, 1e-6)},
            {"host_dispatch_us", in_json_unit(p.host_dispatch_s, 1e-6)},
            {"host_python_us", in_json_unit(p.host_python_s, 1e-6)},
            {"host_autograd_us", in_json_unit(p.host_autograd_s, 1e-6)},
            {"host_module_us", in_json_unit(p.host_module_s, 1e-6)},
            {"host_graph_launch_us", in_json_unit(p.host_graph_launch_s, 1e-6)},
            {"host_compile_guard_us", in_json_unit(p.host_compile_guard_s, 1e-6)},
            {"host_sync_us", in_json_unit(p.host_sync_s, 1e-6)},
            {"host_te_linear_fwd_us", in_json_unit(p.host_te_linear_fwd_s, 1e-6)},
            {"host_te_linear_bwd_us", in_json_unit(p.host_te_linear_bwd_s, 1e-6)},
            {"host_te_norm_fwd_us", in_json_unit(p.host_te_norm_fwd_s, 1e-6)},
            {"host_te_norm_bwd_us", in_json_unit(p.host_te_norm_bwd_s, 1e-6)},
            {"host_local_linear_fwd_us", in_json_unit(p.host_local_linear_fwd_s, 1e-6)},
            {"host_te_before_2_10_factor", p.host_te_before_2_10_factor},
            {"traces", p.traces},
            {"error_bands", error_bands_to_json(p.error_bands)}};
  if (p.expert_exchange_nvlink_efficiency > 0)
    j["expert_exchange_nvlink_efficiency"] = p.expert_exchange_nvlink_efficiency;
  if (p.expert_exchange_network_efficiency > 0)
    j["expert_exchange_network_efficiency"] = p.expert_exchange_network_efficiency;
  if (p.expert_exchange_network_efficiency_two_servers > 0)
    j["expert_exchange_network_efficiency_two_servers"] =
        p.expert_exchange_network_efficiency_two_servers;
  Json by_dtype = Json::object();
  for (Dtype d : {Dtype::kFp32, Dtype::kTf32, Dtype::kBf16, Dtype::kFp16, Dtype::kFp8})
    if (p.gemm_efficiency_by_dtype[static_cast<int>(d)] > 0)
      by_dtype[dtype_name(d)] = p.gemm_efficiency_by_dtype[static_cast<int>(d)];
  if (!by_dtype.empty()) j["gemm_efficiency_by_dtype"] = by_dtype;
  Json shapes = Json::object();
  for (int k = 0; k < 3; ++k)
    for (int b = 0; b < 2; ++b) {
      const Profile::AttentionShape& sh = p.attention_shape[k][b];
      if (sh.is_flat()) continue;
      shapes[attention_shape_key(k, b)] = {{"s_half", sh.s_half},
                                           {"causal_s_half", sh.causal_s_half},
                                           {"causal_plateau", sh.causal_plateau},
                                           {"head_dim_64", sh.head_dim_64},
                                           {"head_dim_256", sh.head_dim_256}};
    }
  if (!shapes.empty()) j["attention_shape"] = shapes;
  if (p.measured_device) j["device_spec"] = device_spec_to_json(*p.measured_device);
  j["nccl"] = p.nccl ? nccl_tuning_to_json(*p.nccl) : Json(false);
  return j;
}

Profile load_profile(const std::string& path, const DeviceSpec& device) {
  Profile p = profile_from_json(read_json_file(path));
  if (p.device != device.name)
    throw Error("profile.device",
                "'" + p.device + "' describes another device than the cluster's " + device.name);
  return p;
}

}  // namespace parasol::cost
