// The public range behind every figure of the default profiles (cost_models/profile.cc states
// the point each default takes inside it), and setting one figure of a profile by its JSON key.
#include "cost_models/profile_ranges.h"

#include <cmath>
#include <set>

#include "core/device_family.h"
#include "core/error.h"

namespace parasol::cost {

const char* range_kind_name(RangeKind k) {
  return k == RangeKind::kCited ? "cited" : "uncertainty";
}

namespace {

using Ranges = std::vector<ProfileRange>;

void cited(Ranges& r, const std::string& key, double low, double high, const std::string& src) {
  r.push_back({key, low, high, RangeKind::kCited, src});
}
void uncertain(Ranges& r, const std::string& key, double low, double high, const std::string& why) {
  r.push_back({key, low, high, RangeKind::kUncertainty, why});
}

// The mamf-finder ratios of sustained (power-saturated) to burst matmul throughput, measured on
// whole busy nodes (stas00/ml-engineering, compute/accelerator/benchmarks/README.md): B200
// 0.815, H200 0.848, an H100-class part 743/781 = 0.951. `scale` is a power limit's clock factor.
void sustained_clock(Ranges& r, double scale) {
  cited(r, "sustained_clock", 0.815 * scale, 0.951 * scale,
        "mamf-finder sustained/burst matmul ratios: B200 0.815, H200 0.848, H100-class 0.951"
        " (stas00/ml-engineering); x the power limit's clock factor (P ~ f^3) where below TDP");
}

// The host thread that issues the kernels (profile.cc states the points).
void host(Ranges& r) {
  cited(r, "host_launch_us", 2, 4,
        "null-kernel launch ~3 us (NVIDIA forum 233645/3); 3.8 us per eager launch on B200"
        " (arXiv 2512.22219); 2 us at the fast end of recent drivers");
  cited(r, "host_dispatch_us", 0.5, 1.5,
        "an aten op through the C++ API ~1 us (pytorch/pytorch#41383, ngimel)");
  cited(r, "host_python_us", 1, 3.5,
        "Python's share of an eager op: ~1 us (#41383) to 3.5 us (x+1 4.5 us eager,"
        " dev-discuss micro-optimizations thread)");
  cited(r, "host_autograd_us", 1, 2,
        "recording a forward op for autograd: 6.8 - 5.0 = 1.8 us (#41383); 1.0 us (#122029:"
        " 4.6 vs 5.6 us)");
  cited(r, "host_module_us", 2, 5,
        "an nn.Module call: empty module +2 us, nn.Linear 9.7 vs F.linear 4.7 us (#50431)");
  cited(r, "host_graph_launch_us", 2, 4,
        "CUDA graph repeat launch, straight-line: 2.5 us + 1 ns/node on CUDA 12.6, 2 us +"
        " 0.2 us/node on 11.8 (NVIDIA blog, 2024-09-11)");
  cited(r, "host_compile_guard_us", 10, 40,
        "torch.compile'd call: 10-24 us (dev-discuss), 14 us, 39 us with grad"
        " (pytorch/pytorch#122029)");
  cited(r, "host_sync_us", 0.8, 5.8,
        "NVIDIA blog 'Getting Started with CUDA Graphs': a 2.9 us kernel takes 9.6 us with a sync"
        " after each, 3.8 us back to back: the sync adds 9.6 - 3.8 = 5.8 us at most; 3.3 us beyond"
        " the kernel and a 3.4 us graph-paced issue; 0.8 us when a 2.5 us host launch is counted"
        " apart");
}

// Transformer Engine's modules on the server's host (profile.cc states the points): on Grace
// (GB200) from PR #3523's GB200 figures after that PR to before it; on x86 from the after-figures
// over Grace's 2.75x slowdown for a bare torch.nn.Linear (TE issue #2053), as if the x86 host ran
// TE's Python as much faster, to the before-figures times PR #1191's x86 TEColumnParallelLinear
// before that PR (140 us) over te.Linear on GB200 before TE 2.10 (TE #2053: 99.66 us).
void te_modules(Ranges& r, bool grace) {
  const double lo = grace ? 1.0 : 1.0 / kGraceOverX86Host;
  const double hi =
      grace ? 1.0 : kTeColumnParallelLinearFwdX86BeforeS / kTeGraceLinearFwdBefore210S;
  const std::string src =
      grace
          ? "TE PR #3523 GB200 table (CPU time per call, after -> before it)"
          : "TE PR #3523 GB200 table (CPU time per call) on an x86 host: from its after-figure over"
            " 2.75, Grace's slowdown for a torch.nn.Linear forward (TE #2053: 37.08 vs 13.48 us),"
            " to its before-figure x 140/99.66, Megatron's TEColumnParallelLinear forward on x86"
            " before TE PR #1191 (140 us; 115 us after it, the point) over te.Linear's on GB200"
            " before TE 2.10 (TE #2053)";
  cited(r, "host_te_linear_fwd_us", kTeGraceLinearFwdAfterS * lo * 1e6,
        kTeGraceLinearFwdS * hi * 1e6, "te.Linear forward: " + src);
  cited(r, "host_te_linear_bwd_us", kTeGraceLinearBwdAfterS * lo * 1e6,
        kTeGraceLinearBwdS * hi * 1e6,
        "te.Linear backward (forward + backward less forward): " + src);
  cited(r, "host_te_norm_fwd_us", kTeGraceNormFwdAfterS * lo * 1e6, kTeGraceNormFwdS * hi * 1e6,
        "te.LayerNormLinear less te.Linear, forward: " + src);
  cited(r, "host_te_norm_bwd_us", kTeGraceNormBwdAfterS * lo * 1e6, kTeGraceNormBwdS * hi * 1e6,
        "te.LayerNormLinear less te.Linear, backward: " + src);
  // Megatron-Core's own ColumnParallelLinear (profile.cc states the point).
  const double host = grace ? kGraceOverX86Host : 1.0;
  cited(r, "host_local_linear_fwd_us", kTorchLinearFwdX86S * host * 1e6,
        kMegatronLocalLinearFwdS * host * 1e6,
        "Megatron-Core ColumnParallelLinear forward, BF16, TP 1: 74 us of CPU (TE PR #1191); a"
        " bare torch.nn.Linear forward 13.48 us on an H100 DGX host (TE #2053), the floor;"
        " on Grace both x 2.75 (TE #2053), the point 74 us over 1.15, a TE module call's x86/Grace"
        " ratio (TE PR #1191 over TE #2053)");
  // Transformer Engine before 2.10 (profile.cc states the point).
  cited(r, "host_te_before_2_10_factor", 1.0, kTeGraceLinearFwdBefore210S / kTeGraceLinearFwdAfterS,
        "te.Linear forward on GB200 before TE 2.10's CPU-overhead PRs #2377/#2400: 99.66 us (TE"
        " #2053, 2025-08) over 59.19 us (PR #3523's before-figure, 2026) = 1.68; from no change"
        " (the two benchmarks' shapes differ) to 99.66 over PR #3523's after-figure 51.19 = 1.95");
}

// What GPU servers share: kernel launch, overlap, host copies and host memory, CPU Adam on the
// host's `cores` cores (`avx2`: a host without AVX-512, where DeepSpeed's CPU-Adam runs 8 floats a
// vector instruction instead of 16). `grace`: a Grace host (Transformer Engine's host costs).
// `persistent_gemms`: Hopper, whose cuBLAS GEMMs launch one block per SM (data-parallel
// collectives beside them cost a second wave).
void gpu_server(Ranges& r, int cores = 48, bool avx2 = false, bool grace = false,
                bool persistent_gemms = false) {
  cited(r, "triton_forward_slowdown", 1.3, 1.5,
        "FlashAttention-2 paper (arXiv 2307.08691) Sec. 4.1, A100: FlashAttention-2 'around"
        " 1.3-1.5x faster than FlashAttention in Triton in the forward pass'");
  uncertain(r, "triton_backward_slowdown", 1.5, 2.5,
            "FlashAttention-2 paper Sec. 4.1, A100: 'around 2x faster in the backward pass'"
            " than FlashAttention in Triton; +-0.5, the top of its 1.3-2.5x forward + backward"
            " range");
  uncertain(r, "kernel_overhead_us", 2, 5,
            "a kernel's GPU-side gap and tail in a busy stream: 2.1 us between dependent kernels"
            " on an H100 stream (Hazy Research 'no bubbles', 2025); 2-5 us is the span usually"
            " reported");
  host(r);
  te_modules(r, grace);
  uncertain(r, "overlap_compute_slowdown", 0.10, 0.30,
            "Hassan et al. 2025 (arXiv 2507.03114): mean 18.9% over GPT/LLaMA on A100 and H100;"
            " NCCL's SM share on H100 (24 of 132 SMs) 18%; per-workload values spread around the"
            " mean, taken as +-0.1");
  if (persistent_gemms)
    uncertain(r, "dp_overlap_compute_slowdown", 0.25, 0.6,
              "Hopper's persistent cuBLAS GEMMs beside NCCL: 'the matmuls take 2x as long' under"
              " FSDP on H100 (pytorch/pytorch#143988), 2x with wave quantization"
              " (NVIDIA/cutlass#2471): 0.5 while every GEMM overlaps; less where attention and"
              " element-wise kernels (not persistent) fill part of the overlap, more with NCCL's"
              " own SM and HBM share beside it; the same for Megatron's overlapped expert"
              " all-to-alls (DeepEP/HybridEP on 20-32 SMs; Transformer Engine's GEMMs keep every"
              " SM without NVTE_EXT_MARGIN_SM, TransformerEngine@d0067d0"
              " pytorch/csrc/extensions/gemm.cpp L281-285)");
  else
    uncertain(r, "dp_overlap_compute_slowdown", 0.10, 0.30,
              "as overlap_compute_slowdown: Hassan et al. 2025 (arXiv 2507.03114), mean 18.9%;"
              " +-0.1");
  uncertain(r, "host_copy_efficiency", 0.75, 0.85,
            "pinned host<->device copies reach ~0.8 of a PCIe Gen4/Gen5 x16 link (CUDA samples"
            " bandwidthTest); +-0.05 for the host and the PCIe switch");
  cited(r, "host_memory_efficiency", 0.70, 0.75,
        "STREAM triad on two-socket servers: EPYC 7742 ~300 of 409.6 GB/s, Xeon 8480 ~450 of"
        " 614 GB/s (vendors' STREAM reports)");
  if (avx2)
    uncertain(r, "host_adam_params_per_s", cores * 1.4e7, cores * 2.2e7,
              "DeepSpeed CPU-Adam 3.4e7 parameters/s an AVX-512 core (ZeRO-Offload tutorial log)"
              " x 8/16 floats a vector with AVX2 (csrc/includes/simd.h) x the host's cores; the"
              " clocks' ratio to the tutorial's Xeon 8168 under vector load is not published: 0.83"
              " (base clocks, 2.25 vs 2.7 GHz) to about 1.3 (the Xeon lowers its clock under"
              " AVX-512, the EPYC boosts to 3.4 GHz)");
  else
    uncertain(r, "host_adam_params_per_s", cores * 2.4e7, cores * 4.4e7,
              "DeepSpeed CPU-Adam 3.4e7 parameters/s a core (ZeRO-Offload tutorial log: 10.3B in"
              " 6.2-6.5 s on a DGX-2's 48 Xeon 8168 cores) x the host's cores; +-30% for another"
              " AVX-512 CPU generation (faster Sapphire Rapids cores)");
  uncertain(r, "gpu_speed_cv", 0.01, 0.03,
            "Sinha et al. SC22 (arXiv 2208.11035): 8% (max 22%) performance variation between"
            " GPUs of one SKU across five clusters; read as a +-3 sigma span, sigma ~0.015; the"
            " reading of 'variation' as a span is the uncertainty (0.01-0.03)");
  // What the training process holds besides its tensors (profile.cc cites each default).
  uncertain(r, "cuda_context_MiB", 300, 900,
            "CUDA context with lazily loaded kernels: ~300-600 MiB on A100/H100 as PyTorch's CUDA"
            " notes and NVIDIA's lazy-loading documentation describe; eager module loading or"
            " extra libraries (TE, cuDNN) raise it");
  cited(r, "nccl_connection_MiB", 4.0, 9.2,
        "NCCL defaults (src/include/device.h): Simple 4 MiB (NCCL_BUFFSIZE) alone with"
        " NCCL_PROTO=Simple, up to Simple + LL128 4.69 MiB + LL 0.5 MiB = 9.19 MiB");
  cited(r, "nccl_channels", 8, 32,
        "NCCL_MIN_NCHANNELS/NCCL_MAX_NCHANNELS: NVSwitch systems open 8-32 channels (NCCL"
        " environment-variable documentation)");
  cited(r, "library_workspace_MiB", 8, 64,
        "cuBLAS(Lt) workspaces: 4 MiB each before Hopper, 32 MiB from Hopper on (cuBLAS"
        " cublasSetWorkspace; PyTorch and Transformer Engine each hold one)");
  uncertain(r, "allocator_fragmentation", 0.0, 0.25,
            "blocks the caching allocator strands with fixed segments depend on the order of a"
            " step's allocations (c10/cuda/CUDACachingAllocator.cpp: best fit per stream, split"
            " blocks, segments released only when cudaMalloc fails); no fraction of the"
            " transient bytes is published: from none (the default) to a quarter of them");
}

// Links GPU collectives seldom or never take: RoCE Ethernet NICs and shared memory (the CPU
// runtime's transport).
void other_links(Ranges& r) {
  uncertain(r, "link_efficiency/ethernet", 0.75, 0.90,
            "RoCE NICs: no nccl-tests figure is cited; taken a little below InfiniBand's 0.92");
  uncertain(r, "link_efficiency/shm", 0.3, 0.7,
            "shared memory is the CPU runtime's transport; GPU collectives do not use it");
}

void nvidia_links(Ranges& r, double nvlink_low, double nvlink_high, const std::string& src) {
  cited(r, "link_efficiency/nvlink", nvlink_low, nvlink_high, src);
  cited(r, "link_efficiency/nvswitch", nvlink_low, nvlink_high, src);
  uncertain(r, "link_efficiency/infiniband", 0.88, 0.96,
            "nccl-tests across servers: HDR ~23 of 25 GB/s, NDR ~46 of 50 GB/s per NIC (0.92);"
            " +-0.04");
  uncertain(r, "link_efficiency/pcie", 0.75, 0.85, "PCIe Gen4 x16 ~25 of 32 GB/s (0.78); +-0.05");
  other_links(r);
}

// FlashAttention-2 on A100 (cost_models/profile.cc states the fits): FlashAttention-2 paper Fig. 4
// (forward + backward), split by the paper's "up to 230 TFLOPs/s" forward. A plateau or
// half-way keys spans the least-squares fits to the series and to its subsets (from 512, 1k, 2k).
void a100_attention(Ranges& r) {
  const std::string fig4 =
      "FlashAttention-2 paper (arXiv 2307.08691) Fig. 4, A100 80GB SXM4 forward + backward";
  const std::string split =
      "; split by the paper's 'up to 230 TFLOPs/s' forward (Sec. 4): backward / forward 0.843";
  cited(r, "flash_forward_efficiency", 0.737, 0.75,
        fig4 + " hd 128 unmasked 173-203 TFLOP/s: plateau fits 205.4-205.8" + split +
            "; from the 230 bar itself (0.737) to the plateau (232.7-233.2 of 312)");
  cited(r, "flash_backward_efficiency", 0.62, 0.632,
        fig4 + " hd 128 unmasked: plateau fits 205.4-205.8" + split +
            "; from 193.9 at 16k to the plateau (196.2-196.6 of 312)");
  // Per pass, the half-way keys are the forward + backward curve's: FlashAttention-2 on H100
  // splits them forward 0.54 / backward 1.43 of it unmasked, 0.76 / 1.09 causal (FlashAttention-3
  // paper Fig. 5-6 fits 104 / 274 and 404 / 582 against Fig. 4's H100 forward + backward 191 and
  // 532): such a split bounds each range on its side.
  const std::string h100_split =
      "; Fig. 5-6 per pass not read: the forward + backward curve's, to H100's FlashAttention-2"
      " split of it (FlashAttention-3 paper Fig. 5-6 against FlashAttention-2 paper Fig. 4 H100)";
  const std::string ff = "attention_shape/flash_forward/", fb = "attention_shape/flash_backward/";
  uncertain(r, ff + "s_half", 100, 210, fig4 + " unmasked: fits 173-210" + h100_split + ", 0.54");
  uncertain(r, fb + "s_half", 173, 280, fig4 + " unmasked: fits 173-210" + h100_split + ", 1.43");
  uncertain(r, ff + "causal_s_half", 365, 530,
            fig4 + " causal: fits 472-530" + h100_split + ", 0.76");
  uncertain(r, fb + "causal_s_half", 472, 535,
            fig4 + " causal: fits 472-530" + h100_split + ", 1.09");
  for (const std::string& k : {ff, fb}) {
    cited(r, k + "causal_plateau", 0.94, 0.986,
          fig4 + ", causal / unmasked plateau fits: hd 128 0.940-0.945, hd 64 0.986");
    cited(r, k + "head_dim_64", 0.867, 0.907,
          fig4 + ", hd 64 / hd 128 plateau fits: unmasked 0.867, causal 0.907");
    uncertain(r, k + "head_dim_256", 0.85, 1.0,
              "no hd 256 on A100 is published; H100's FlashAttention-2 forward 0.881"
              " (FlashAttention-3 paper Fig. 5) to flat");
  }
}

Ranges a100() {
  Ranges r;
  cited(r, "gemm_efficiency", 0.801, 0.869,
        "NVIDIA DL Performance guide: 250-270 TFLOP/s on large GEMMs (0.80-0.87); mamf-finder"
        " maximum achievable 271.2 of 312 TFLOP/s (0.869)");
  sustained_clock(r, 1.0);
  uncertain(r, "memory_efficiency", 0.75, 0.85,
            "STREAM-like copies ~1.7 of 2.0 TB/s on A100-80G (0.85, upper end); fused element-"
            "wise kernels reach less, 0.75 taken as the lower end (no per-kernel measurement)");
  a100_attention(r);
  nvidia_links(r, 0.73, 0.81,
               "nccl-tests all_reduce_perf on DGX A100: ~230 GB/s bus bandwidth of 300 GB/s "
               "NVLink3 (0.77), +-0.04 across message sizes above 256 MB");
  gpu_server(r, 128, true);  // DGX A100: 2 x AMD EPYC 7742 (AVX2)
  return r;
}

// Fused attention on Hopper (cost_models/profile.cc states the fits): the plateau and half-way
// keys of a curve span its least-squares fits to the published table and to its subsets (512-16k,
// 1k-16k, 2k-16k, 512-8k); a head-dim factor spans its 4k, 8k and 16k columns.
void hopper_attention(Ranges& r) {
  const std::string fig5 = "FlashAttention-3 paper (arXiv 2407.08608) Fig. 5, H100 bf16 forward";
  const std::string fig6 = "FlashAttention-3 paper Fig. 6, H100 bf16 backward";
  const std::string fa2 =
      "FlashAttention-2 paper (arXiv 2307.08691) Fig. 4 H100 forward + backward, less the "
      "FlashAttention-3 paper's forward";
  cited(r, "cudnn_forward_efficiency", 0.612, 0.638,
        fig5 + ", cuDNN hd 128 unmasked 497-617 TFLOP/s: plateau fits 605-631 of 989");
  cited(r, "cudnn_backward_efficiency", 0.536, 0.556,
        fig6 + ", cuDNN hd 128 unmasked 305-518 TFLOP/s: plateau fits 530-550 of 989");
  cited(r, "flash_forward_efficiency", 0.376, 0.383,
        fig5 + ", FlashAttention-2 hd 128 unmasked 309-370 TFLOP/s: plateau fits 372-379");
  cited(r, "flash_backward_efficiency", 0.331, 0.337,
        fig6 + ", FlashAttention-2 hd 128 unmasked 214-322 TFLOP/s: plateau fits 328-330; " + fa2 +
            ": 328-333");
  const std::string cf = "attention_shape/cudnn_forward/", cb = "attention_shape/cudnn_backward/";
  const std::string ff = "attention_shape/flash_forward/", fb = "attention_shape/flash_backward/";
  cited(r, cf + "s_half", 0, 125, fig5 + ", cuDNN unmasked: half-way keys of the fits");
  cited(r, cf + "causal_s_half", 266, 399, fig5 + ", cuDNN causal 315-539 TFLOP/s: fits");
  cited(r, cf + "causal_plateau", 0.87, 0.935, fig5 + ", cuDNN causal / unmasked plateau fits");
  cited(r, cf + "head_dim_64", 0.67, 0.70, fig5 + ", cuDNN hd 64 / hd 128 at 4k-16k");
  cited(r, cf + "head_dim_256", 0.954, 0.976, fig5 + ", cuDNN hd 256 / hd 128 at 4k-16k");
  cited(r, cb + "s_half", 280, 395, fig6 + ", cuDNN unmasked: half-way keys of the fits");
  uncertain(r, cb + "causal_s_half", 387, 632,
            "no causal backward of cuDNN is published; between cuDNN's causal forward (387) and "
            "FlashAttention-2's causal backward (" +
                fa2 + ": 556-632)");
  uncertain(r, cb + "causal_plateau", 0.90, 1.0,
            "no causal backward of cuDNN is published; between cuDNN's forward ratio (0.904) and "
            "FlashAttention-2's backward one (0.985)");
  cited(r, cb + "head_dim_64", 0.834, 0.839, fig6 + ", cuDNN hd 64 / hd 128 at 4k-16k");
  uncertain(r, cb + "head_dim_256", 0.90, 1.0,
            "no backward at hd 256 is published; the forward's 0.976, widened");
  cited(r, ff + "s_half", 54, 109, fig5 + ", FlashAttention-2 unmasked: half-way keys of the fits");
  cited(r, ff + "causal_s_half", 308, 419, fig5 + ", FlashAttention-2 causal 191-335: fits");
  cited(r, ff + "causal_plateau", 0.905, 0.953, fig5 + ", FlashAttention-2 causal / unmasked fits");
  cited(r, ff + "head_dim_64", 0.87, 0.876, fig5 + ", FlashAttention-2 hd 64 / hd 128 at 4k-16k");
  cited(r, ff + "head_dim_256", 0.876, 0.881, fig5 + ", FlashAttention-2 hd 256 / hd 128, 4k-16k");
  cited(r, fb + "s_half", 255, 277,
        fig6 + ", FlashAttention-2 unmasked: half-way keys of the fits");
  cited(r, fb + "causal_s_half", 556, 632, fa2 + ", causal: half-way keys of the fits");
  cited(r, fb + "causal_plateau", 0.965, 1.006, fa2 + ": causal / unmasked plateau fits");
  cited(r, fb + "head_dim_64", 0.90, 0.904, fig6 + ", FlashAttention-2 hd 64 / hd 128 at 4k-16k");
  uncertain(r, fb + "head_dim_256", 0.85, 1.0,
            "no backward at hd 256 is published; the forward's 0.881, widened");
  // FlashAttention-3's own curves in the same figures.
  cited(r, "fa3_forward_efficiency", 0.659, 0.681,
        fig5 + ", FlashAttention-3 hd 128 unmasked 467-648 TFLOP/s: plateau fits 652-674 of 989");
  cited(r, "fa3_backward_efficiency", 0.582, 0.603,
        fig6 + ", FlashAttention-3 hd 128 unmasked 316-561 TFLOP/s: plateau fits 576-597 of 989");
  const std::string f3f = "attention_shape/fa3_forward/", f3b = "attention_shape/fa3_backward/";
  cited(r, f3f + "s_half", 89, 212,
        fig5 + ", FlashAttention-3 unmasked: half-way keys of the fits");
  cited(r, f3f + "causal_s_half", 434, 592,
        fig5 + ", FlashAttention-3 causal 292-616 TFLOP/s: half-way keys of the fits");
  cited(r, f3f + "causal_plateau", 0.971, 0.976,
        fig5 + ", FlashAttention-3 causal / unmasked plateau fits");
  cited(r, f3f + "head_dim_64", 0.746, 0.768, fig5 + ", FlashAttention-3 hd 64 / hd 128 at 4k-16k");
  cited(r, f3f + "head_dim_256", 1.154, 1.167,
        fig5 + ", FlashAttention-3 hd 256 / hd 128 at 4k-16k");
  cited(r, f3b + "s_half", 294, 432,
        fig6 + ", FlashAttention-3 unmasked: half-way keys of the fits");
  uncertain(r, f3b + "causal_s_half", 409, 632,
            "no causal backward of FlashAttention-3 is published; between its unmasked backward "
            "(409) and FlashAttention-2's causal backward (" +
                fa2 + ": 556-632)");
  uncertain(r, f3b + "causal_plateau", 0.95, 1.0,
            "no causal backward of FlashAttention-3 is published; FlashAttention-2's backward "
            "ratio (0.965-1.006) and its own forward's (0.972), widened");
  cited(r, f3b + "head_dim_64", 0.836, 0.845, fig6 + ", FlashAttention-3 hd 64 / hd 128 at 4k-16k");
  uncertain(r, f3b + "head_dim_256", 1.0, 1.2,
            "no backward at hd 256 is published; the forward's 1.167, widened down to flat");
}

Ranges hopper(const DeviceSpec& d) {
  Ranges r;
  cited(r, "gemm_efficiency", 0.790, 0.803,
        "mamf-finder maximum achievable bf16 matmul: H100 SXM 794.5 of 989 TFLOP/s (0.803, "
        "'H200 is the same'); an H100-class node 781 at 4096^3 (0.790)");
  uncertain(r, "gemm_efficiency_by_dtype/fp8", 0.66, 0.75,
            "mamf-finder fp8: H100 SXM 1402.6 of 1979 TFLOP/s (0.709), one measurement; +-0.05");
  sustained_clock(r, d.tdp_watts < 700 ? std::cbrt(d.tdp_watts / 700.0) : 1.0);
  uncertain(r, "memory_efficiency", 0.75, 0.87,
            "HBM3 STREAM ~2.9 of 3.35 TB/s (0.87, upper end); fused element-wise kernels reach"
            " less, 0.75 taken as the lower end");
  hopper_attention(r);
  nvidia_links(r, 0.76, 0.84,
               "nccl-tests all_reduce_perf on DGX H100 without NVLS: ~360 GB/s bus bandwidth of "
               "450 GB/s NVLink4 (0.8), +-0.04");
  cited(r, "expert_exchange_nvlink_efficiency", 0.765, 0.79,
        "DeepEP normal kernels, H800 EP8 intranode: 153 GB/s FP8 dispatch, 158 GB/s BF16 combine"
        " of 200 GB/s NVLink per direction (deepseek-ai/DeepEP docs/legacy.md)");
  cited(r, "expert_exchange_network_efficiency", 0.71, 0.89,
        "NIC bytes of DeepEP-class internode kernels over 50 GB/s, (N-1)/N of the published RDMA"
        " figures, over 4-8 servers: HybridEP H100 EP32-64 0.71-0.81 (DeepEP hybrid-ep"
        " docs/README_Hybrid-EP.md); DeepEP H800 EP32 58, EP64 51 GB/s: 0.87, 0.89"
        " (docs/legacy.md)");
  cited(r, "expert_exchange_network_efficiency_two_servers", 0.43, 0.54,
        "the same over 2 servers: HybridEP H100 EP16 dispatch 54.47, combine 53.35 GB/s: 0.544,"
        " 0.534 (README_Hybrid-EP.md); DeepEP H800 EP16 43 GB/s: 0.43 (docs/legacy.md)");
  gpu_server(r, 112, false, false, true);  // DGX H100/H200: 2 x Xeon 8480C; persistent GEMMs
  return r;
}

// cuDNN fused attention on B200 (cost_models/profile.cc states the fits): the causal curves of
// cuDNN 9.10.2 on B200 and the unmasked/causal shape of cuDNN 9.19 on GB200.
void b200_cudnn_attention(Ranges& r) {
  const std::string b200 =
      "NVIDIA/cudnn-frontend benchmark/sdpa_benchmark_training B200 csv (cuDNN 9.10.2, causal,"
      " hd 128)";
  const std::string gb200 = "cudnn-frontend results/gb200_919_only_cudnn llama3.1 csv (cuDNN 9.19)";
  // Plateau: the 4k-128k fit over the causal/unmasked ratio, and the 2k-128k fit (1542.3 /
  // 1213.4) over it; the unmasked plateau measured on GB200 (1870, 1540 TFLOP/s) bounds above.
  cited(r, "cudnn_forward_efficiency", 0.655, 0.70,
        b200 + ": causal plateau fits 1474-1542 TFLOP/s / causal ratio 0.981, of 2250");
  cited(r, "cudnn_backward_efficiency", 0.495, 0.54,
        b200 + ": causal backward plateau fits 1144-1213 TFLOP/s / causal ratio 1.010, of 2250");
  const std::string cf = "attention_shape/cudnn_forward/", cb = "attention_shape/cudnn_backward/";
  cited(r, cf + "s_half", 911, 1599,
        gb200 +
            " unmasked fit (911); B200's causal half-way keys over GB200's causal/unmasked"
            " ratio (1599)");
  cited(r, cf + "causal_s_half", 2635, 3899,
        b200 + ": half-way keys of the 4k-128k / 2k-128k fits");
  cited(r, cf + "causal_plateau", 0.966, 0.981,
        gb200 + ": causal / unmasked, at 32k (0.966) and of the plateau fits (0.981)");
  cited(r, cb + "s_half", 830, 1129,
        gb200 + " unmasked fit (830); B200's causal half-way keys over GB200's ratio (1129)");
  cited(r, cb + "causal_s_half", 2253, 3849,
        b200 + ": half-way keys of the 4k-128k / 2k-128k fits");
  cited(r, cb + "causal_plateau", 0.981, 1.010,
        gb200 + ": causal / unmasked, at 32k (0.981) and of the plateau fits (1.010)");
  for (const std::string& k : {cf, cb}) {
    uncertain(r, k + "head_dim_64", 0.7, 1.0, "no head-dim table on Blackwell is cited");
    uncertain(r, k + "head_dim_256", 0.9, 1.1, "no head-dim table on Blackwell is cited");
  }
}

Ranges b200(bool grace) {
  Ranges r;
  uncertain(r, "gemm_efficiency", 0.74, 0.81,
            "mamf-finder: B200 bf16 1745.0 of 2250 TFLOP/s (0.776), one measurement; +-0.035");
  uncertain(r, "gemm_efficiency_by_dtype/fp8", 0.72, 0.80,
            "mamf-finder: B200 fp8 3432.5 of 4500 TFLOP/s (0.763), one measurement; +-0.04");
  uncertain(r, "sustained_clock", 0.78, 0.85,
            "mamf-finder sustained/burst ratio measured on B200: 0.815; +-0.035");
  uncertain(r, "memory_efficiency", 0.70, 0.85,
            "no STREAM figure for HBM3e on B200 is cited; the Hopper range, widened");
  const std::string fa2 =
      "cudnn-frontend B200 csv, FlashAttention-2 2.7.4 causal rows (hd 128), over H100's"
      " FlashAttention-2 causal/unmasked ratios";
  cited(r, "flash_forward_efficiency", 0.20, 0.23,
        fa2 + ": causal plateau fits 452-459 TFLOP/s / 0.905-0.953, of 2250");
  cited(r, "flash_backward_efficiency", 0.155, 0.168,
        fa2 + ": causal backward plateau fits 357-364 TFLOP/s / 0.965-1.006, of 2250");
  const std::string ff = "attention_shape/flash_forward/", fb = "attention_shape/flash_backward/";
  cited(r, ff + "causal_s_half", 1241, 1541, fa2 + ": half-way keys of the 4k-128k / 2k-128k fits");
  cited(r, fb + "causal_s_half", 1178, 1561, fa2 + ": half-way keys of the 4k-128k / 2k-128k fits");
  uncertain(r, ff + "s_half", 200, 600,
            "no unmasked FlashAttention-2 row on B200; H100's unmasked/causal half-way keys ratio"
            " (0.26) gives 397, widened");
  uncertain(r, fb + "s_half", 400, 1000,
            "no unmasked FlashAttention-2 row on B200; H100's ratio (0.47) gives 735, widened");
  uncertain(r, ff + "causal_plateau", 0.905, 0.953, "H100's FlashAttention-2 causal/unmasked fits");
  uncertain(r, fb + "causal_plateau", 0.965, 1.006, "H100's FlashAttention-2 causal/unmasked fits");
  for (const std::string& k : {ff, fb}) {
    uncertain(r, k + "head_dim_64", 0.85, 1.0, "no head-dim table on Blackwell is cited");
    uncertain(r, k + "head_dim_256", 0.85, 1.0, "no head-dim table on Blackwell is cited");
  }
  b200_cudnn_attention(r);
  nvidia_links(r, 0.76, 0.84,
               "nccl-tests on NVLink5 are not cited; the Hopper figure (0.8) +-0.04");
  cited(r, "expert_exchange_nvlink_efficiency", 0.46, 0.63,
        "HybridEP Torch-API BF16 dispatch/combine on GB200 MNNVL EP8-36, 16-32 SMs: 418-569 GB/s"
        " of 900 (DeepEP hybrid-ep docs/README_Hybrid-EP.md); B200 EP8 16 SMs 531-536 GB/s");
  gpu_server(r, 112, false, grace);  // DGX B200: 2 x Xeon 8570; GB200: Grace
  return r;
}

Ranges mi300x() {
  Ranges r;
  uncertain(r, "gemm_efficiency", 0.48, 0.55,
            "mamf-finder: MI300X bf16 668.4 of 1300 TFLOP/s (0.514, ROCm 6.3, TunableOp), one "
            "measurement; +-0.035");
  sustained_clock(r, 1.0);
  uncertain(r, "memory_efficiency", 0.60, 0.80,
            "no STREAM figure for MI300X is cited: a wide range around 0.7");
  uncertain(r, "flash_forward_efficiency", 0.20, 0.40,
            "no public FlashAttention figure on MI300X is cited: a wide range around 0.3");
  uncertain(r, "flash_backward_efficiency", 0.15, 0.30,
            "no public FlashAttention figure on MI300X is cited: a wide range around 0.22");
  uncertain(r, "link_efficiency/nvlink", 0.65, 0.75,
            "RCCL all-reduce ~300 of 448 GB/s Infinity Fabric (~0.7); +-0.05");
  uncertain(r, "link_efficiency/nvswitch", 0.65, 0.75,
            "RCCL all-reduce ~300 of 448 GB/s Infinity Fabric (~0.7); +-0.05");
  uncertain(r, "link_efficiency/infiniband", 0.88, 0.96, "as on NVIDIA servers (0.92) +-0.04");
  uncertain(r, "link_efficiency/pcie", 0.75, 0.85, "PCIe Gen5 x16 copies ~0.8 of the link");
  other_links(r);
  gpu_server(r);
  return r;
}

// Volta (the DGX-2's V100): the GEMM figure is Markidis et al.'s; no public figure of the V100
// is cited for the other efficiencies: the defaults (0.8 memory, 0.6 / 0.45 attention, the
// Ampere link figure) with wide ranges.
Ranges volta() {
  Ranges r;
  cited(r, "gemm_efficiency", 0.60, 0.75,
        "cuBLAS mixed-precision GEMM up to 83 of 125 TFLOP/s on a Tesla V100 (0.664; Markidis et"
        " al. 2018, arXiv 1803.04014); shapes below the best and later cuBLAS releases, +-0.07");
  sustained_clock(r, 1.0);
  uncertain(r, "memory_efficiency", 0.70, 0.90,
            "no STREAM figure of V100's HBM2 is cited: a wide range around 0.8");
  uncertain(r, "flash_forward_efficiency", 0.40, 0.75,
            "no fused-attention figure of V100 is cited (FlashAttention-2 needs Ampere): a wide "
            "range around 0.6");
  uncertain(r, "flash_backward_efficiency", 0.30, 0.60,
            "no fused-attention figure of V100 is cited: a wide range around 0.45");
  nvidia_links(r, 0.70, 0.85,
               "nccl-tests on DGX-2 are not cited; the DGX A100 figure (0.77) widened");
  gpu_server(r);
  return r;
}

// The CPU runtime's host: the probe measures the peaks (device.cc); these efficiencies are the
// stated estimates that `parasol calibrate` replaces from this host's own traces.
Ranges host_cpu() {
  Ranges r;
  const std::string why =
      "an estimate for this host, replaced by `parasol calibrate` from the "
      "host's own traces (tools/loop-check.sh)";
  uncertain(r, "gemm_efficiency", 0.8, 1.0, why);
  uncertain(r, "gemm_k_half", 8, 32, why);
  uncertain(r, "memory_efficiency", 0.4, 0.7, why);
  uncertain(r, "flash_forward_efficiency", 0.2, 0.4, why);
  uncertain(r, "flash_backward_efficiency", 0.1, 0.3, why);
  uncertain(r, "kernel_overhead_us", 0.5, 2, why);
  uncertain(r, "collective_step_latency_us", 1, 4, "Open MPI shared-memory (vader) latency ~2 us");
  uncertain(r, "link_efficiency/shm", 0.3, 0.7, why);
  for (const char* k : {"nvlink", "nvswitch", "pcie", "infiniband", "ethernet"})
    uncertain(r, std::string("link_efficiency/") + k, 0.7, 0.95,
              "no such link between the CPU runtime's ranks on one host");
  uncertain(r, "host_copy_efficiency", 0.8, 1.0, "offload copies are memcpys");
  uncertain(r, "host_memory_efficiency", 0.6, 0.8, why);
  uncertain(r, "host_adam_params_per_s", 0.3e9, 0.8e9, why);
  uncertain(r, "sustained_clock", 1.0, 1.0, "the probe measures the sustained sgemm rate");
  for (const char* k : {"triton_forward_slowdown", "triton_backward_slowdown"})
    uncertain(r, k, 1, 1, "the CPU runtime runs its own attention whatever kernel a plan names");
  for (const char* k : {"cuda_context_MiB", "nccl_connection_MiB", "nccl_channels",
                        "library_workspace_MiB", "allocator_fragmentation"})
    uncertain(r, k, 0, 0, "the CPU runtime has no CUDA context, NCCL or caching allocator");
  for (const char* k : {"host_launch_us", "host_dispatch_us", "host_python_us", "host_autograd_us",
                        "host_module_us", "host_graph_launch_us", "host_compile_guard_us",
                        "host_sync_us", "host_te_linear_fwd_us", "host_te_linear_bwd_us",
                        "host_te_norm_fwd_us", "host_te_norm_bwd_us", "host_local_linear_fwd_us"})
    uncertain(r, k, 0, 0,
              "the CPU runtime's executor runs each op inline: issuing it is in its own time");
  uncertain(r, "host_te_before_2_10_factor", 1, 1,
            "the CPU runtime's executor issues no Transformer Engine module calls");
  return r;
}

}  // namespace

std::vector<ProfileRange> profile_ranges(const DeviceSpec& d) {
  switch (device_family(d)) {
    case DeviceFamily::kAmpere:
      return a100();
    case DeviceFamily::kHopper:
      return hopper(d);
    case DeviceFamily::kBlackwell:
      return b200(d.name == "GB200");
    case DeviceFamily::kCdna3:
      return mi300x();
    case DeviceFamily::kVolta:
      return volta();
    case DeviceFamily::kHostCpu:
      return host_cpu();
    case DeviceFamily::kOther:
      break;
  }
  return {};
}

bool profile_key_needs_no_range(const std::string& key) {
  static const std::set<std::string> kKeys = {"device",      "source", "traces",
                                              "error_bands", "nccl",   "device_spec"};
  return kKeys.count(key) > 0;
}

namespace {
Json::json_pointer pointer(const std::string& key) { return Json::json_pointer("/" + key); }
}  // namespace

double profile_figure(const Profile& p, const std::string& key) {
  const Json j = profile_to_json(p);
  if (!j.contains(pointer(key)) || !j.at(pointer(key)).is_number())
    throw Error("profile." + key, "the profile has no such figure");
  return j.at(pointer(key)).get<double>();
}

Profile with_profile_figure(const Profile& p, const std::string& key, double value) {
  Json j = profile_to_json(p);
  const bool by_dtype = key.rfind("gemm_efficiency_by_dtype/", 0) == 0;
  if (!by_dtype && (!j.contains(pointer(key)) || !j.at(pointer(key)).is_number()))
    throw Error("profile." + key, "the profile has no such figure");
  j[pointer(key)] = value;
  return profile_from_json(j, "profile");
}

}  // namespace parasol::cost
