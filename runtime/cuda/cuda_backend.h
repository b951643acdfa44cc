// CudaBackend: the Backend of one NVIDIA GPU. Tensors are fp32 in device memory behind the same
// float* interface as the CPU backend (runtime/cpu/cpu_backend.h), which is the reference every
// kernel here is tested against (tests/runtime/cuda/cuda_kernels_test.cc). Files:
//   cuda_backend.cc   construction, the caching allocator, copies, streams/events, gemm()
//   backend_ops.cc    the Backend entries: checks, linear/expert GEMMs, moe_permutation (host)
//   kernels.h         the launchers of the .cu files, plain C++ (no core/ headers for nvcc)
//   embedding.cu norm.cu linear.cu activation.cu attention.cu residual.cu cross_entropy.cu
//   moe.cu adamw.cu cast.cu: one kernel family each, named like the CPU file of that family
//   cuda_graph.cc     stream capture and replay (CUDA graphs)
//   gemm_bf16.cc bf16_ops.cc  the bf16-storage entries (cuBLASLt epilogues, tiled cross-entropy)
//   xent_tiled.cu bf16_elementwise.cu bf16_norm.cu bf16_rope.cu moe_permute.cu grouped_gemm.cu
//   (bf16_vec.cuh: 8-wide bf16 access): the kernels on bf16 storage, the device-side MoE
//   permutation and grouped expert GEMMs
//
// Design decisions (the contract of backend.h holds unchanged; these are the CUDA specifics):
//  * Streams. Every kernel, copy and memset is issued on one compute stream (stream(), a
//    non-blocking stream created by the backend), so kernels are ordered by call order exactly as
//    backend.h requires; synchronize() waits for that stream. Communication and copy streams
//    (owned by others, e.g. runtime/comm/) are ordered against it with CUDA events:
//    record(event) marks the point reached by the compute stream, wait(event) makes later compute
//    work wait for an event recorded on another stream.
//  * Device memory: a caching allocator under raw_alloc/raw_free (the base class does the
//    live/peak accounting in requested bytes). A request is rounded up to a size class (512-byte
//    granularity below 8 KiB, then four classes per power of two) and served from that class's
//    free list; cudaMalloc runs only when the list is empty, so a training step after warm-up does
//    not call it. Freed blocks go back to their list without a synchronisation: they are reused by
//    later work of the same (compute) stream, which is ordered after earlier users. A block used by
//    another stream must be fenced by the caller (record/wait) before it is freed. When cudaMalloc
//    fails, the cache is emptied and the allocation retried once. empty_cache() returns the cached
//    blocks to the driver.
//  * Host memory (raw_alloc_host, for offload): pinned (cudaMallocHost), cached by size class
//    like device memory, since cudaMallocHost and cudaFreeHost synchronise the device.
//  * No device-wide synchronisation inside a step after warm-up: the scratch grows stream-ordered
//    (cudaMallocAsync/cudaFreeAsync), device and pinned blocks come from the caches;
//    synchronizing_calls() counts the calls that do synchronise (cudaMalloc, cudaMallocHost,
//    the out-of-memory retry, empty_cache) so that a GPU test can check a step makes none.
//  * copy(): cudaMemcpyAsync(cudaMemcpyDefault) on the compute stream; when the destination is
//    host memory (pageable or pinned) the call then synchronises the stream, so the executor can
//    read a small result into host memory through copy() and use it at once. A copy from host
//    memory does not wait: pageable sources are staged by the driver before the call returns, and
//    pinned blocks are only touched by copies on this stream. zero(): cudaMemsetAsync.
//  * GEMMs: cuBLASLt with fp32 storage and CUBLAS_COMPUTE_32F_FAST_16BF (inputs rounded to bf16
//    inside the tensor-core GEMM, fp32 accumulation, fp32 output): bf16 math behind the fp32
//    interface. Row-major operands use the transpose trick (C^T = B^T A^T in column-major). One
//    32 MiB workspace is allocated at construction; descriptors and the heuristic's algorithm are
//    cached per (shape, transposes, leading dimensions, pointer alignment). When the heuristic
//    returns no algorithm for the bf16 compute type, the GEMM falls back to CUBLAS_COMPUTE_32F:
//    logged once per shape (stderr) and counted per call (library_counts().gemm_fp32_fallbacks).
//    Expect bf16 relative error (~1e-2 norm-wise) against the CPU's fp32 GEMMs.
//  * Non-GEMM kernels are fp32 and compiled WITHOUT --use_fast_math: expf/logf/sqrtf are the
//    accurate CUDA versions and division is IEEE, so they agree with the CPU within ~1e-5; FMA
//    contraction (nvcc's default --fmad=true) stays on. Reductions are deterministic (fixed grid
//    and block shapes, fixed summation order; the sums the CPU does in double are done in double)
//    except embedding_backward's table gradient, which scatter-adds with atomicAdd (bit-level
//    run-to-run variation; the position gradient is deterministic).
//  * Attention: the calls runtime/fused_attention.h routes to a fused kernel (no probabilities
//    wanted, no dropout, head dims multiples of 8 up to 256, every query seeing a key) run through
//    cuDNN's fused SDPA (runtime/cuda/cudnn_attention.h: bf16 operands, fp32 softmax statistics).
//    The others (a shape the routing or cuDNN's support check refuses, or a build without cuDNN)
//    run parasol's own kernel below, logged once per reason and shape (stderr) and counted per
//    call (library_counts().attention_fallbacks); set_fused_attention(false) sends every call to
//    parasol's kernel.
//  * parasol's own attention is a straightforward correctness-first kernel: forward, one
//    block per (sequence, head, query row) with an online softmax over key tiles (any seq_kv);
//    backward, one pass per query row (dq) and one per key row (dk, dv: every query head of the
//    GQA group and every query that sees the key, so no atomics). Dropout masks are re-drawn with
//    runtime/tensor.h's dropout_keep (a device copy of the same hash), so they equal the CPU's.
//  * MoE: the routing stays on the device (moe_device.cc; Backend::device_moe_routing): the
//    executor keeps the top-k indices, gates, permutation and per-expert offsets in routing
//    memory, moe_permutation_device builds them with kernels.h's moe_permutation_device, and the
//    typed grouped expert GEMMs run from the device offsets (grouped_gemm_bf16, WMMA tensor
//    cores, correctness-first): no host synchronisation sizes them. A weight gradient into bf16
//    or with a bias gradient, which grouped_gemm_bf16_wgrad does not write, reads the offsets on
//    the host (a synchronisation), logged once and counted (library_counts().moe_host_fallbacks).
//    moe_permutation (the host path, for expert parallelism's exchange sizes) copies the top-k
//    indices to the host, builds the permutation there exactly as the CPU does and uploads row_of.
//  * bf16 storage without widening (entries below the Backend ones): the linear layers as
//    cuBLASLt bf16 GEMMs with fused epilogues (gemm_bf16.cc), the vocab-tiled cross-entropy
//    (runtime/cpu/tiled_xent.h), and kernels.h's bf16 norm (with the residual add fused), RoPE,
//    SwiGLU/GELU, residual and bias kernels (8 bf16 per 16-byte access). The executor
//    calls them through the Backend's typed entries on bf16 buffers (runtime/executor_ops.cc,
//    run_typed), flash attention included (cuDNN's SDPA on the bf16 buffers in place, fp32
//    log-sum-exp), and MoE's dispatch, combine and grouped expert GEMMs (the router computes in
//    fp32: its GEMMs widen their bf16 operands).
//  * CUDA graphs: begin_capture / end_capture / replay record and replay the compute stream, and
//    the communicators' streams that join the capture through fences (record_fence /
//    wait_fence: NCCL's transfers of a captured step; runtime/executor.cc run_body).
//  * Scratch: kernels needing temporary space (row statistics, partial column sums, the grad
//    norm's partials) use one backend-owned scratch buffer outside the accounting; it grows
//    (with a synchronisation) only when a larger request comes, i.e. during warm-up.
// Thread safety: as the CPU backend, one thread drives a backend; the allocator and the GEMM
// cache are locked, so memory calls from other threads are safe.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "runtime/backend.h"
#include "runtime/cuda/cudnn_attention.h"

namespace parasol::runtime {

// Whether this process sees at least one CUDA device (false, not an error, without a driver).
bool cuda_device_available();

class CudaBackend final : public Backend {
 public:
  // Uses GPU `device` (cudaSetDevice on the calling thread). Throws parasol::Error when there is
  // no such device or a CUDA/cuBLASLt call fails.
  explicit CudaBackend(int device = 0);
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  std::string name() const override { return "cuda"; }
  int device() const { return device_; }

  // ---- Streams and events.
  cudaStream_t stream() const { return stream_; }
  // Records `event` on the compute stream (after all work issued so far).
  void record(cudaEvent_t event);
  // Makes compute work issued from now on wait until `event` (recorded on any stream) completes.
  void wait(cudaEvent_t event);

  // ---- Allocator introspection.
  int64_t cuda_malloc_calls() const;  // cudaMalloc calls made by the caching allocator so far
  int64_t cached_bytes() const;       // bytes held in the free lists
  // Calls so far that synchronise the whole device: cudaMalloc, cudaMallocHost, the
  // out-of-memory retry and empty_cache().
  int64_t synchronizing_calls() const;
  void empty_cache();  // returns the free lists' blocks to the driver

  void copy(void* dst, const void* src, size_t bytes) override;
  void zero(void* dst, size_t bytes) override;
  void synchronize() override;

  void embedding_forward(float* out, const int32_t* tokens, const float* table, int64_t vocab_start,
                         int64_t vocab_rows, const float* pos, int64_t pos_offset, int64_t rows,
                         int64_t seq, int64_t cols) override;
  void embedding_backward(float* dtable, float* dpos, const float* dout, const int32_t* tokens,
                          int64_t vocab_start, int64_t vocab_rows, int64_t pos_offset, int64_t rows,
                          int64_t seq, int64_t cols) override;

  void norm_forward(Norm kind, float* out, const float* x, const float* weight, const float* bias,
                    int64_t rows, int64_t cols, float eps) override;
  void norm_backward(Norm kind, float* dx, float* dweight, float* dbias, const float* dout,
                     const float* x, const float* weight, const float* dresidual, int64_t rows,
                     int64_t cols, float eps) override;

  void linear_forward(float* out, const float* in, const float* w, WeightLayout layout,
                      const float* bias, int64_t m, int64_t n, int64_t k) override;
  void linear_backward_data(float* din, const float* dout, const float* w, WeightLayout layout,
                            int64_t m, int64_t n, int64_t k, bool accumulate) override;
  void linear_backward_weight(float* dw, float* dbias, const float* in, const float* dout,
                              WeightLayout layout, int64_t m, int64_t n, int64_t k) override;
  void bias_forward(float* out, const float* bias, int64_t rows, int64_t cols) override;
  void bias_backward(float* dbias, const float* dout, int64_t rows, int64_t cols) override;

  // Trace timing: CUDA events recorded on the compute stream (backend.h's marks).
  int mark() override;
  double mark_seconds(int i) override;
  void clear_marks() override { marks_used_ = 0; }
  bool marks_on_host_clock() const override { return false; }
  // A cudaEvent_t recorded on the compute stream (communication streams wait on it).
  void* record_fence() override;
  void release_fence(void* fence) override;
  // cudaStreamWaitEvent of the compute stream on a communicator's event (cuda_backend.cc).
  void wait_fence(void* fence) override;
  // Copies between host and device memory so far (copy(): is_host of either pointer).
  HostTraffic host_traffic() const override { return traffic_; }

  void rope(float* x, int64_t ld, int64_t rows, int64_t seq, int64_t pos_offset, int64_t heads,
            int64_t head_dim, double theta, bool inverse) override;

  void activation_forward(Activation kind, float* out, const float* in, int64_t rows,
                          int64_t cols) override;
  void activation_backward(Activation kind, float* din, const float* dout, const float* in,
                           int64_t rows, int64_t cols) override;

  void attention_forward(const AttentionDims& d, float* out, float* lse, float* probs,
                         const float* q, const float* k, const float* v, bool accumulate) override;
  void attention_backward(const AttentionDims& d, float* dq, float* dk, float* dv,
                          const float* dout, const float* q, const float* k, const float* v,
                          const float* out, const float* lse, const float* probs,
                          bool accumulate_dq, bool accumulate_dkv) override;

  void residual_forward(float* out, uint8_t* mask, const float* x, const float* y,
                        const float* bias, int64_t rows, int64_t cols, float dropout_p,
                        uint64_t seed) override;
  void residual_backward(float* dy, float* dbias, const float* dout, const uint8_t* mask,
                         int64_t rows, int64_t cols, float dropout_p) override;

  void xent_row_max(float* row_max, const float* logits, int64_t rows, int64_t vocab) override;
  void xent_sum_exp(float* sum_exp, const float* logits, const float* row_max, int64_t rows,
                    int64_t vocab) override;
  void xent_target(float* target, const float* logits, const int32_t* labels, int64_t rows,
                   int64_t vocab, int64_t vocab_start) override;
  void xent_loss(float* loss, const float* row_max, const float* sum_exp, const float* target,
                 const int32_t* labels, int64_t rows) override;
  void loss_accumulate(double* acc, const float* loss, const int32_t* labels,
                       int64_t rows) override;
  void xent_softmax(float* probs, const float* logits, const float* row_max, const float* sum_exp,
                    int64_t rows, int64_t vocab) override;
  void xent_backward(float* dlogits, const float* probs, const int32_t* labels, int64_t rows,
                     int64_t vocab, int64_t vocab_start, float dloss) override;

  void router_forward(float* probs, int32_t* topk_idx, float* topk_w, const float* logits,
                      int64_t tokens, int64_t experts, int64_t top_k, bool renormalize) override;
  void router_topk(int32_t* topk_idx, float* topk_w, const float* probs, int64_t tokens,
                   int64_t experts, int64_t top_k, bool renormalize) override;
  void router_backward(float* dlogits, const float* dtopk_w, const float* probs,
                       const int32_t* topk_idx, int64_t tokens, int64_t experts, int64_t top_k,
                       bool renormalize) override;
  void moe_permutation(int32_t* row_of, int64_t* counts_host, const int32_t* topk_idx,
                       int64_t tokens, int64_t experts, int64_t top_k) override;
  void dispatch_forward(float* out, const float* x, const int32_t* row_of, int64_t tokens,
                        int64_t top_k, int64_t cols) override;
  void dispatch_backward(float* dx, const float* dout, const int32_t* row_of, int64_t tokens,
                         int64_t top_k, int64_t cols) override;
  void combine_forward(float* out, const float* expert_out, const float* w, const int32_t* row_of,
                       int64_t tokens, int64_t top_k, int64_t cols) override;
  void combine_backward(float* dexpert_out, float* dw, const float* dout, const float* expert_out,
                        const float* w, const int32_t* row_of, int64_t tokens, int64_t top_k,
                        int64_t cols) override;
  void expert_linear_forward(float* out, const float* in, const float* w, const float* bias,
                             const int64_t* counts_host, int64_t experts, int64_t n,
                             int64_t k) override;
  void expert_linear_backward_data(float* din, const float* dout, const float* w,
                                   const int64_t* counts_host, int64_t experts, int64_t n,
                                   int64_t k, bool accumulate) override;
  void expert_linear_backward_weight(float* dw, float* dbias, const float* in, const float* dout,
                                     const int64_t* counts_host, int64_t experts, int64_t n,
                                     int64_t k) override;

  void adamw(const AdamWConfig& c, float* param, float* m, float* v, const float* grad, int64_t n,
             const float* grad_scale) override;
  void grad_sumsq(float* sumsq, const float* grad, int64_t n) override;
  void clip_scale(float* scale, const float* sumsq, float max_norm, float loss_scale) override;
  void cast(void* dst, Dtype dst_type, const void* src, Dtype src_type, int64_t n) override;

  // ---- CUDA graphs (cuda_graph.cc; Plan::cuda_graphs). begin_capture() starts recording the
  // work issued on the compute stream (cudaStreamBeginCapture, thread-local mode): kernels,
  // cuBLASLt GEMMs, memsets and device-to-device copies are recorded, not run. end_capture()
  // instantiates the recording and returns its id; replay(id) launches it on the compute stream,
  // ordered like any kernel. A call that would synchronise or touch host memory (a copy from or to
  // host memory, synchronize(), a cache miss of the allocator, a growing scratch) cannot be
  // recorded: while capturing it abandons the recording and throws parasol::Error naming the
  // call. The buffers the recorded work uses must stay allocated at the same addresses for every
  // replay (a warmed-up step: the allocator's cache filled, the scratch grown).
  bool records_graphs() const override { return true; }
  void begin_capture() override;
  int end_capture() override;
  void replay(int graph) override;
  bool capturing() const { return capturing_; }
  int64_t graph_replays() const { return graph_replays_; }

  // ---- Low-precision storage without widening (bf16_ops.cc). The vocab-tiled cross-entropy of
  // runtime/cpu/tiled_xent.h on logits of dtype kFp32 or kBf16 (throws parasol::Error for
  // another), the same contracts.
  void xent_tiled_forward(float* row_max, float* sum_exp, float* target, const void* logits,
                          Dtype dtype, const int32_t* labels, int64_t rows, int64_t vocab,
                          int64_t vocab_start);
  void xent_rescale(float* sum_exp, const float* local_max, const float* global_max, int64_t rows);
  void xent_tiled_backward(void* dlogits, const void* logits, Dtype dtype, const float* row_max,
                           const float* sum_exp, const int32_t* labels, int64_t rows, int64_t vocab,
                           int64_t vocab_start, float dloss);

  // The linear layers on bf16 storage (gemm_bf16.cc): cuBLASLt GEMMs with bf16 operands, fp32
  // accumulation (CUBLAS_COMPUTE_32F: the tensor cores' bf16 MMA) and cuBLASLt's fused epilogues;
  // the contracts of backend.h's linear entries, with these additions. `in`, `w`, `dout`, the
  // bias and `pre` are bf16 [rows x cols] dense; `out`, `din` bf16; `dw` of dw_type fp32 or bf16
  // (the plan's gradient dtype), accumulated (+=, beta 1 inside the GEMM); `dbias` fp32 (+=).
  //  * forward: out = in W + bias (epilogue BIAS); with gelu_pre not null, out = gelu(in W + bias)
  //    and gelu_pre = in W + bias, the GELU's input kept for the backward (GELU_AUX[_BIAS]).
  //  * backward_data: din (+)= dout W^T; with gelu_pre not null (accumulate false), din =
  //    gelu'(gelu_pre) * (dout W^T), the gradient through the GELU that followed this layer's
  //    input, and dbias_of_din (nullable) += its column sums (DGELU[_BGRAD]): the previous layer's
  //    bias gradient in the same GEMM.
  //  * backward_weight: dw += in^T dout (kInOut) or dout^T in (kOutIn); dbias += column sums of
  //    dout (BGRADA/BGRADB into scratch, then added).
  // When cuBLASLt has no algorithm for a fused epilogue the GEMM runs without it and the epilogue
  // runs as separate bf16 kernels: logged once per shape and counted (epilogue_fallbacks). With no
  // bf16 algorithm at all the call throws parasol::Error: there is no fp32 path to fall back to.
  // The Backend's typed bf16 entries (backend.h; the executor calls them on bf16 buffers).
  bool bf16_kernels() const override { return true; }
  void linear_forward_bf16(uint16_t* out, const uint16_t* in, const uint16_t* w,
                           WeightLayout layout, const uint16_t* bias, uint16_t* gelu_pre, int64_t m,
                           int64_t n, int64_t k) override;
  void linear_backward_data_bf16(uint16_t* din, const uint16_t* dout, const uint16_t* w,
                                 WeightLayout layout, const uint16_t* gelu_pre, float* dbias_of_din,
                                 int64_t m, int64_t n, int64_t k, bool accumulate) override;
  // kernels.h's norm_forward_bf16 (no residual fused) on the compute stream (bf16_ops.cc).
  void norm_forward_bf16(Norm kind, uint16_t* out, const uint16_t* x, const uint16_t* weight,
                         const uint16_t* bias, int64_t rows, int64_t cols, float eps) override;
  // The element-wise entries on kernels.h's bf16 kernels (bf16_ops.cc).
  void norm_backward_bf16(Norm kind, uint16_t* dx, float* dweight, float* dbias,
                          const uint16_t* dout, const uint16_t* x, const uint16_t* weight,
                          const uint16_t* dresidual, int64_t rows, int64_t cols,
                          float eps) override;
  void activation_forward_bf16(Activation kind, uint16_t* out, const uint16_t* in, int64_t rows,
                               int64_t cols) override;
  void activation_backward_bf16(Activation kind, uint16_t* din, const uint16_t* dout,
                                const uint16_t* in, int64_t rows, int64_t cols) override;
  void residual_forward_bf16(uint16_t* out, const uint16_t* x, const uint16_t* y,
                             const uint16_t* bias, int64_t rows, int64_t cols) override;
  void residual_backward_bf16(uint16_t* dy, float* dbias, const uint16_t* dout, int64_t rows,
                              int64_t cols) override;
  void rope_bf16(uint16_t* x, int64_t ld, int64_t rows, int64_t seq, int64_t pos_offset,
                 int64_t heads, int64_t head_dim, double theta, bool inverse) override;
  void embedding_forward_bf16(uint16_t* out, const int32_t* tokens, const uint16_t* table,
                              int64_t vocab_start, int64_t vocab_rows, const uint16_t* pos,
                              int64_t pos_offset, int64_t rows, int64_t seq, int64_t cols) override;
  void embedding_backward_bf16(float* dtable, float* dpos, const uint16_t* dout,
                               const int32_t* tokens, int64_t vocab_start, int64_t vocab_rows,
                               int64_t pos_offset, int64_t rows, int64_t seq,
                               int64_t cols) override;
  // Attention on bf16 storage (backend_ops.cc): the calls fused_attention_route() accepts run
  // through cuDNN's SDPA on the bf16 buffers in place (CudnnAttention::forward_bf16 /
  // backward_bf16); the others, counted and logged as the fp32 entries' fallbacks, widen their
  // operands into scratch, run parasol's own fp32 kernel and round its outputs once.
  void attention_forward_bf16(const AttentionDims& d, uint16_t* out, float* lse, const uint16_t* q,
                              const uint16_t* k, const uint16_t* v, bool accumulate) override;
  void attention_backward_bf16(const AttentionDims& d, uint16_t* dq, uint16_t* dk, uint16_t* dv,
                               const uint16_t* dout, const uint16_t* q, const uint16_t* k,
                               const uint16_t* v, const uint16_t* out, const float* lse,
                               bool accumulate_dq, bool accumulate_dkv) override;
  // MoE's dispatch and combine on bf16 rows (moe.cu's kernels templated on the storage type).
  // The grouped expert GEMMs are Backend's defaults: one cuBLASLt bf16 GEMM (gemm_bf16.cc) per
  // expert with rows, the counts on the host (kernels.h's grouped_gemm_bf16 on device offsets is
  // not yet called by the executor).
  void dispatch_forward_bf16(uint16_t* out, const uint16_t* x, const int32_t* row_of,
                             int64_t tokens, int64_t top_k, int64_t cols) override;
  void dispatch_backward_bf16(uint16_t* dx, const uint16_t* dout, const int32_t* row_of,
                              int64_t tokens, int64_t top_k, int64_t cols) override;
  void combine_forward_bf16(uint16_t* out, const uint16_t* expert_out, const float* w,
                            const int32_t* row_of, int64_t tokens, int64_t top_k,
                            int64_t cols) override;
  void combine_backward_bf16(uint16_t* dexpert_out, float* dw, const uint16_t* dout,
                             const uint16_t* expert_out, const float* w, const int32_t* row_of,
                             int64_t tokens, int64_t top_k, int64_t cols) override;
  // MoE routing on the device (moe_device.cc).
  bool device_moe_routing() const override { return true; }
  void moe_permutation_device(int32_t* row_of, int32_t* counts, int32_t* offsets, int32_t* bad,
                              const int32_t* topk_idx, int64_t tokens, int64_t experts,
                              int64_t top_k) override;
  void expert_linear_forward_bf16_dev(uint16_t* out, const uint16_t* in, const uint16_t* w,
                                      const uint16_t* bias, const int32_t* offsets, int64_t experts,
                                      int64_t max_rows, int64_t n, int64_t k) override;
  void expert_linear_backward_data_bf16_dev(uint16_t* din, const uint16_t* dout, const uint16_t* w,
                                            const int32_t* offsets, int64_t experts,
                                            int64_t max_rows, int64_t n, int64_t k) override;
  void expert_linear_backward_weight_bf16_dev(void* dw, Dtype dw_type, float* dbias,
                                              const uint16_t* in, const uint16_t* dout,
                                              const int32_t* offsets, int64_t experts,
                                              int64_t max_rows, int64_t n, int64_t k) override;
  // The vocab-tiled loss's pieces on the logits' dtype (xent_tiled.cu, through bf16_ops.cc).
  void xent_max_typed(float* row_max, const void* logits, Dtype dtype, int64_t rows,
                      int64_t vocab) override;
  void xent_sums_typed(float* sum_exp, float* target, const void* logits, Dtype dtype,
                       const float* row_max, const int32_t* labels, int64_t rows, int64_t vocab,
                       int64_t vocab_start) override;
  void xent_backward_typed(void* dlogits, const void* logits, Dtype dtype, const float* row_max,
                           const float* sum_exp, const int32_t* labels, int64_t rows, int64_t vocab,
                           int64_t vocab_start, float dloss) override;
  void linear_backward_weight_bf16(void* dw, Dtype dw_type, float* dbias, const uint16_t* in,
                                   const uint16_t* dout, WeightLayout layout, int64_t m, int64_t n,
                                   int64_t k) override;

  // C[m x n] = alpha op(A) op(B) + beta C, row-major with row strides lda, ldb, ldc (as
  // cpu::sgemm), on the compute stream through cuBLASLt (bf16 math, fp32 accumulate). The one
  // GEMM entry of the CUDA kernels.
  void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
            const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
            int64_t ldc);

  // ---- The libraries' paths and their fallbacks (see the header comment).
  struct LibraryCounts {
    int64_t attention_fused = 0;      // attention calls (forward or backward) run by cuDNN
    int64_t attention_fallbacks = 0;  // attention calls run by parasol's own kernels
    int64_t gemm_bf16 = 0;            // GEMM calls with CUBLAS_COMPUTE_32F_FAST_16BF
    int64_t gemm_fp32_fallbacks = 0;  // GEMM calls cuBLASLt had no bf16 algorithm for
    int64_t gemm_bf16_storage = 0;    // GEMM calls on bf16 storage (gemm_bf16.cc)
    int64_t epilogue_fused = 0;       // of those, with their epilogue fused by cuBLASLt
    int64_t epilogue_fallbacks = 0;   // of those, whose epilogue ran as separate kernels
    int64_t moe_host_fallbacks = 0;   // device-routed expert GEMMs that read the counts on the host
  };
  LibraryCounts library_counts() const;
  // Whether this build has cuDNN's fused attention (PARASOL_HAVE_CUDNN).
  static bool cudnn_built();
  // On (the default): the calls fused_attention_route() accepts run through cuDNN; off: every call
  // runs parasol's own kernels (not counted as fallbacks then).
  void set_fused_attention(bool on) { fused_attention_ = on; }
  bool fused_attention() const { return fused_attention_; }

  // Device scratch of at least `bytes` bytes, valid until the next scratch() call (stream-ordered
  // reuse on the compute stream). Not counted in device_memory().
  void* scratch(size_t bytes);

 protected:
  void* raw_alloc(size_t bytes) override;
  void raw_free(void* p) override;
  void* raw_alloc_host(size_t bytes) override;
  void raw_free_host(void* p) override;

 private:
  struct GemmPlan;  // cached cuBLASLt descriptors and algorithm (cuda_backend.cu)

  int device_ = 0;
  cudaStream_t stream_ = nullptr;
  void* lt_ = nullptr;  // cublasLtHandle_t
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  void* scratch_ = nullptr;
  size_t scratch_bytes_ = 0;

  mutable std::mutex alloc_mu_;
  std::unordered_map<size_t, std::vector<void*>> free_lists_;       // size class -> free blocks
  std::unordered_map<void*, size_t> block_class_;                   // every live or cached block
  std::unordered_map<size_t, std::vector<void*>> host_free_lists_;  // pinned blocks by class
  std::unordered_map<void*, size_t> host_block_class_;
  int64_t malloc_calls_ = 0;
  int64_t synchronizing_calls_ = 0;
  int64_t cached_bytes_ = 0;

  std::mutex gemm_mu_;
  std::unordered_map<std::string, std::unique_ptr<GemmPlan>> gemm_plans_;
  // gemm_bf16.cc's cached descriptors (an incomplete type here: shared_ptr<void> keeps its
  // deleter), under gemm_mu_.
  std::unordered_map<std::string, std::shared_ptr<void>> bf16_plans_;
  struct LtCall;  // gemm_bf16.cc
  void run_lt(const LtCall& call);

  void count_gemm_bf16();
  void count_bf16_storage_gemm(bool epilogue_fused);
  void count_fused_attention();
  // Counts a fallback of `what` ("gemm", "epilogue", "moe" or "attention") and logs it to stderr
  // the first time `why` is given for `shape`.
  void note_fallback(const std::string& what, const std::string& shape, const std::string& why);

  std::unique_ptr<CudnnAttention> cudnn_;  // null until the first fused call
  bool fused_attention_ = true;
  mutable std::mutex counts_mu_;
  LibraryCounts counts_;
  std::unordered_set<std::string> logged_;  // "what|shape|why" already logged

  std::vector<cudaEvent_t> mark_events_;  // trace timing: reused across series

  bool capturing_ = false;
  HostTraffic traffic_{0, 0};
  std::vector<void*> graph_execs_;  // cudaGraphExec_t, by id
  int64_t graph_replays_ = 0;
  // Abandons the recording (capturing_) and throws parasol::Error: `call` cannot be recorded.
  [[noreturn]] void refuse_in_capture(const std::string& call);
  void destroy_graphs();
  int marks_used_ = 0;
};

}  // namespace parasol::runtime
