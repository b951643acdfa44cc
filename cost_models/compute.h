// Compute cost model: the time of one op on one device, as a roofline (FLOPs over peak, bytes
// over HBM bandwidth) scaled by the Profile's efficiency for the op's class and shape.
// Pure functions: thread-safe, no globals.
#pragma once

#include <cstdint>

#include "core/device.h"
#include "core/plan.h"
#include "core/program.h"
#include "cost_models/profile.h"

namespace parasol::cost {

// The reduction depth at which a GEMM in `dtype` reaches half its plateau: profile.gemm_k_half
// (a 16-bit GEMM's) times the device's dense peak in `dtype` over its bf16 peak. A tile's fixed
// work (filling the operand pipeline, writing the output tile) takes the same time whatever the
// operands' dtype, and a main loop twice as fast covers twice the reduction depth meanwhile.
// profile.gemm_k_half itself where either peak is unknown (0) and on a CPU (vendor "cpu").
double gemm_k_half_of(const DeviceSpec& dev, const Profile& prof, Dtype dtype);

// Shape factor of a GEMM in (0, 1]: the best over cuBLAS-like tile shapes of tile efficiency x
// wave quantization on the device's compute units, a GEMM of less than half a wave of tiles
// splitting its reduction across more units as cuBLAS and CUTLASS do (split-K; compute.cc says
// when and how far) (1 for a CPU, vendor "cpu"), times the
// reduction-depth factor k / (k + gemm_k_half_of(dtype)). Multiplied by profile.gemm_eff(dtype) it
// gives the fraction of dense peak a GEMM of this shape reaches.
double gemm_shape_factor(const DeviceSpec& dev, const Profile& prof, int64_t m, int64_t n,
                         int64_t k, int64_t batch = 1, Dtype dtype = Dtype::kBf16);

// Seconds for `batch` independent (m x k) * (k x n) products in `dtype`, including the kernel
// overhead; memory-bound shapes are priced by their bytes.
double gemm_time(const DeviceSpec& dev, const Profile& prof, Dtype dtype, int64_t m, int64_t n,
                 int64_t k, int64_t batch = 1);

// Seconds to quantise `elements` of a GEMM operand to fp8 the way Transformer Engine's fp8
// recipe does before each fp8 GEMM (the forward input, the backward output gradient): one fused
// cast-transpose that reads bf16 and writes fp8 and its transpose, 4 bytes an element (TE's
// FP8 primer).
double fp8_quantize_time(const DeviceSpec& dev, const Profile& prof, double elements);

// Which GEMM of a linear layer: the forward product, the backward data gradient or the
// backward weight gradient.
enum class GemmPass { kForward, kDataGrad, kWeightGrad };

// Seconds of one GEMM of a linear layer (`batch` grouped products of m x k by k x n) in `dtype`:
// gemm_time, plus under fp8 the quantisation of its m x k operand (the forward input, the
// backward output gradient) for the forward and data-gradient GEMMs of every linear but the
// MoE router (`router`), which stays in higher precision; weight-gradient GEMMs reuse the
// transposed copies. The one rule both predictors price a linear by.
double linear_gemm_time(const DeviceSpec& dev, const Profile& prof, Dtype dtype, int64_t m,
                        int64_t n, int64_t k, int64_t batch, GemmPass pass, bool router);

// The grouped expert GEMMs of the Transformer Engine stacks run one cuBLAS GEMM per local
// expert, GEMM i on stream i mod 4 after the streams wait for the caller's:
//  - Transformer Engine's grouped GEMM (te.GroupedLinear, Megatron-Core's TEGroupedMLP):
//    NVIDIA/TransformerEngine@d0067d0 transformer_engine/common/gemm/cublaslt_gemm.cu
//    multi_stream_cublas_gemm L970-1022, the path nvte_multi_tensor_gemm takes unless
//    NVTE_USE_CUTLASS_GROUPED_GEMM is set on Hopper (L1052-1075); util/multi_stream.cpp
//    get_num_compute_streams: 4;
//  - grouped_gemm's gmm (NeMo AutoModel's DeepEP experts, Automodel@8d9bfb90e
//    components/moe/layers.py L478-492, grouped_gemm fanshiqing/grouped_gemm v1.1.4):
//    csrc/grouped_gemm.cu CublasGroupedGemm, cublasGemmEx per expert on cublas_stream[i %
//    NUM_STREAM], NUM_STREAM 4; CUTLASS's grouped kernel only in an sm80 build.
inline constexpr int kExpertGemmStreams = 4;

// Seconds of `experts` equal GEMMs of m x k by k x n run as those libraries run them: in rounds
// of kExpertGemmStreams concurrent GEMMs (the streams' kernels share the GPU's waves), each round
// a linear_gemm_time of that many grouped products, one after the other. REQUIRES: experts >= 1.
double multi_stream_expert_gemm_time(const DeviceSpec& dev, const Profile& prof, Dtype dtype,
                                     int64_t m, int64_t n, int64_t k, int64_t experts,
                                     GemmPass pass);

// The dtype of the output layer's GEMMs (the head and its gradients) under `precision`: fp8
// plans keep it in bf16 (Megatron-Core's output layer is a plain ColumnParallelLinear outside
// Transformer Engine's fp8 autocast; torchtitan's float8 conversion skips "output").
Dtype output_layer_dtype(Dtype precision);

// Seconds for a memory-bound kernel that moves `bytes` (reads + writes) through HBM.
double memory_time(const DeviceSpec& dev, const Profile& prof, double bytes);
// The same traffic spread over `kernels` >= 1 small kernels of one stream, each paying the GPU's
// gap between kernels (a logged statistic: OpKind::kCountZeros, kParamNorm, whose kernels are
// cost_models/host_cost.h's kernel_launches).
double small_kernels_time(const DeviceSpec& dev, const Profile& prof, double bytes,
                          int64_t kernels);

// Forward / backward seconds of an attention core (core/program.h's AttnShape and its
// attention_flops). a.flash: one fused kernel (FlashAttention-2 style, backward does 2.5x the
// forward FLOPs); otherwise batched GEMMs plus materialised softmax (and dropout) passes over
// the heads x seq_q x seq_kv score matrix (Megatron-LM 2022 style).
//
// `ring` > 1: the op is one step of a context-parallel ring of that many steps over a causal
// sequence, laid out as the frameworks balance it (Megatron-Core / Transformer Engine and PyTorch
// split the sequence into 2 x cp chunks, rank r holding chunks r and 2cp - 1 - r): one step of
// `ring` attends to its own chunk pair under the causal mask, the others are unmasked rectangles
// of its seq_q queries against half as many keys (Transformer Engine's "lower" steps; the "upper"
// ones, half the queries against all keys, are no slower). The op is priced at the mean rate of
// the ring's steps, so that `ring` of them take the ring's time.
// `impl`: which framework runs the ring (core/plan.h CpImpl), whose memory passes
// context_ring_merge_bytes counts.
double attention_forward_time(const DeviceSpec& dev, const Profile& prof, Dtype dtype,
                              const AttnShape& a, int ring = 1,
                              CpImpl impl = CpImpl::kTransformerEngine);
double attention_backward_time(const DeviceSpec& dev, const Profile& prof, Dtype dtype,
                               const AttnShape& a, int ring = 1,
                               CpImpl impl = CpImpl::kTransformerEngine);

// The memory-bound work Transformer Engine's load-balanced ring (AttnFuncWithCPAndKVP2P) adds to
// a causal step of a ring of `ring` > 1 steps of `a` (one rank's chunk pair: a.seq_q queries),
// in bytes read and written, averaged over the ring's steps and over its ranks (rank r runs r
// "lower" and ring - 1 - r "upper" steps); `eb` is the attention's bytes per element. Forward:
// the half of K and V a lower step reads, or the half of Q an upper step reads, is made
// contiguous (one read and one write of half the tensor); after the loop, each step's output is
// merged into an fp32 output (the first written, the others read and rescaled, half of it on an
// upper step), which is cast back at the end. Backward: the lower steps' K, V halves and the
// upper steps' Q, O, dO halves made contiguous, and each step's dQ written (first step) or
// added into the dQ buffer (half of it on an upper step). The dK/dV accumulation and the
// exchanges are ops of their own (core/lower_layer.cc). Priced by attention_*_time.
//
// CpImpl::kPytorch: PyTorch's ring (torch/distributed/tensor/experimental/_attention.py,
// _templated_ring_attention and its backward), op by op. Forward: K and V concatenated into one
// buffer to pass on (every step but the last); each step's output upcast to fp32 and merged by
// _SDPAMerger as out - sigmoid(lse_i - lse) * (out - out_i), three fp32 element-wise passes
// (an upper step's on half the output, put back by torch.cat); the fp32 output cast back at the
// end. Backward: fp32 zero accumulators for dQ, dK, dV; K, V concatenated to pass on; dQ
// accumulated in fp32 (an upper step's half put back by torch.cat), dK/dV of a lower step put
// back by torch.cat, the dK/dV accumulator concatenated into one fp32 buffer to pass on (every
// step), dQ cast back at the end. The fp32 dK/dV additions proper and the final dK/dV cast are
// the lowering's dkv.acc and dkv.fold ops (core/lower_layer.cc, in fp32 under this ring).
double context_ring_merge_bytes(const AttnShape& a, int ring, bool backward, double eb,
                                CpImpl impl = CpImpl::kTransformerEngine);

// Fraction of the dense peak a fused attention pass sustains on `a` (the Profile's plateau at the
// sustained clock, moved by its AttentionShape figures: keys per query row, causal mask, head
// dim; `ring` as above). A sliding window shortens a causal row to the window.
double attention_efficiency(const Profile& prof, const AttnShape& a, bool backward, int ring = 1);

// Bytes an AdamW step moves per parameter under the plan's precision `dtype` and optimizer
// `state` dtype: the fused Adam kernel and the copy of the fp32 master into the low-precision
// weights, exactly as the lowering emits them (core/optimizer_traffic.h).
double adam_bytes_per_param(Dtype dtype, Dtype state = Dtype::kFp32);
// Seconds for an AdamW step over `params` parameters held on the device.
double optimizer_time(const DeviceSpec& dev, const Profile& prof, Dtype dtype, double params,
                      Dtype state = Dtype::kFp32);

}  // namespace parasol::cost
