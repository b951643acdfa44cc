// CpuBackend: the reference backend. Host memory stands for device memory, math is fp32, GEMMs go
// through OpenBLAS (cblas_sgemm, its own threads) and every other kernel is a plain loop on the
// calling thread (vectorised by the compiler; the exp-heavy ones also built for AVX2, vec.h). The
// kernels of one family, forward and backward side by side, live in one file:
//   cpu_backend.cc   memory, copies, the GEMM helper, construction
//   embedding.cc     embedding_forward/backward (vocab-parallel lookup, learned positions)
//   norm.cc          norm_forward/backward (layernorm, rmsnorm)
//   linear.cc        linear_forward/backward_data/backward_weight, bias_forward/backward,
//                    expert_linear_* (grouped GEMM)
//   activation.cc    activation_forward/backward (gelu tanh, swiglu)
//   attention.cc     attention_forward/backward (causal, GQA, ring-step merge, dropout)
//   attention_bf16.cc the typed bf16 attention (per-head tiles through attention.cc's body)
//   moe_bf16.cc      the typed bf16 dispatch and combine (one token's rows at a time)
//   rope.cc          rope (rotary position embedding, forward and inverse)
//   residual.cc      residual_forward/backward (residual add, bias, dropout)
//   cross_entropy.cc xent_* (vocab-parallel pieces and backward)
//   moe.cc           router_forward/topk/backward, moe_permutation, dispatch_*, combine_*
//   adamw.cc         adamw, grad_sumsq, clip_scale
//   cast.cc          cast (fp32 <-> bf16 / fp16)
//   bf16_ops.cc      the typed bf16 entries (the three linear GEMMs, norm forward): bf16
//                    storage, tiles widened inside the kernel, fp32 accumulation
//   bf16_elementwise.cc the other typed bf16 entries (norm backward, activations, residual,
//                    RoPE, embedding): row blocks widened, the fp32 kernel, one rounding
//   tiled_xent.cc    the vocab-tiled loss (xent_*_typed) on fp32 or bf16 logits
//   moe_device.cc    MoE routing kept in "device" memory: moe_permutation_device and the grouped
//                    bf16 expert GEMMs from offsets (no copy: host memory is the device's)
#pragma once

#include <string>

#include "runtime/backend.h"

namespace parasol::runtime {

class CpuBackend final : public Backend {
 public:
  // gemm_threads: OpenBLAS threads (0: OpenBLAS's default, its OPENBLAS_NUM_THREADS or the
  // core count). The setting is process-wide (OpenBLAS has one thread pool).
  explicit CpuBackend(int gemm_threads = 0);
  ~CpuBackend() override;
  CpuBackend(const CpuBackend&) = delete;
  CpuBackend& operator=(const CpuBackend&) = delete;

  std::string name() const override { return "cpu"; }
  int gemm_threads() const;  // OpenBLAS threads in use

  void copy(void* dst, const void* src, size_t bytes) override;
  void zero(void* dst, size_t bytes) override;
  void synchronize() override {}

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
  // The largest scratch one attention call (forward or backward) has held in this process, in
  // bytes (kernel-private memory, not the Backend's): O(seq_kv) per call, see attention.cc.
  static int64_t attention_scratch_peak();
  static void reset_attention_scratch_peak();

  void rope(float* x, int64_t ld, int64_t rows, int64_t seq, int64_t pos_offset, int64_t heads,
            int64_t head_dim, double theta, bool inverse) override;

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
  void xent_softmax(float* probs, const float* logits, const float* row_max, const float* sum_exp,
                    int64_t rows, int64_t vocab) override;
  void xent_backward(float* dlogits, const float* probs, const int32_t* labels, int64_t rows,
                     int64_t vocab, int64_t vocab_start, float dloss) override;
  // The step's loss accumulated on the device (cross_entropy.cc).
  void loss_accumulate(double* acc, const float* loss, const int32_t* labels,
                       int64_t rows) override;
  // The vocab-tiled loss (tiled_xent.cc, runtime/cpu/tiled_xent.h).
  void xent_max_typed(float* row_max, const void* logits, Dtype dtype, int64_t rows,
                      int64_t vocab) override;
  void xent_sums_typed(float* sum_exp, float* target, const void* logits, Dtype dtype,
                       const float* row_max, const int32_t* labels, int64_t rows, int64_t vocab,
                       int64_t vocab_start) override;
  void xent_backward_typed(void* dlogits, const void* logits, Dtype dtype, const float* row_max,
                           const float* sum_exp, const int32_t* labels, int64_t rows, int64_t vocab,
                           int64_t vocab_start, float dloss) override;

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

  // MoE routing in device memory (moe_device.cc); set_device_moe_routing(false) hides it (the
  // executor reads the counts on the host).
  bool device_moe_routing() const override { return device_moe_routing_; }
  void set_device_moe_routing(bool on) { device_moe_routing_ = on; }
  // Whole-step graphs as a dry run, for tests of the executor's capture and replay walk
  // (runtime/executor.cc): with set_graph_dry_run(true) records_graphs() is true and
  // begin_capture / end_capture / replay only count their calls; kernels still run when called
  // (a capture records nothing) and replay() runs nothing. Off by default: the CPU backend
  // records no graphs.
  void set_graph_dry_run(bool on) { graph_dry_run_ = on; }
  bool records_graphs() const override { return graph_dry_run_; }
  void begin_capture() override;
  int end_capture() override;
  void replay(int graph) override;
  int64_t graph_captures() const { return graph_captures_; }
  int64_t graph_replays() const { return graph_replays_; }
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

  // Typed bf16 entries (bf16_ops.cc); set_bf16_kernels(false) hides them (the executor widens).
  bool bf16_kernels() const override { return bf16_kernels_; }
  void set_bf16_kernels(bool on) { bf16_kernels_ = on; }
  void linear_forward_bf16(uint16_t* out, const uint16_t* in, const uint16_t* w,
                           WeightLayout layout, const uint16_t* bias, uint16_t* gelu_pre, int64_t m,
                           int64_t n, int64_t k) override;
  void linear_backward_data_bf16(uint16_t* din, const uint16_t* dout, const uint16_t* w,
                                 WeightLayout layout, const uint16_t* gelu_pre, float* dbias_of_din,
                                 int64_t m, int64_t n, int64_t k, bool accumulate) override;
  void linear_backward_weight_bf16(void* dw, Dtype dw_type, float* dbias, const uint16_t* in,
                                   const uint16_t* dout, WeightLayout layout, int64_t m, int64_t n,
                                   int64_t k) override;
  void norm_forward_bf16(Norm kind, uint16_t* out, const uint16_t* x, const uint16_t* weight,
                         const uint16_t* bias, int64_t rows, int64_t cols, float eps) override;
  // The element-wise ones (bf16_elementwise.cc): row blocks widened inside the kernel, the fp32
  // kernel on them, each output rounded once.
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
  // Attention (attention_bf16.cc): per-head tiles widened inside the kernel, attention.cc's fp32
  // body on them, each output rounded once.
  void attention_forward_bf16(const AttentionDims& d, uint16_t* out, float* lse, const uint16_t* q,
                              const uint16_t* k, const uint16_t* v, bool accumulate) override;
  void attention_backward_bf16(const AttentionDims& d, uint16_t* dq, uint16_t* dk, uint16_t* dv,
                               const uint16_t* dout, const uint16_t* q, const uint16_t* k,
                               const uint16_t* v, const uint16_t* out, const float* lse,
                               bool accumulate_dq, bool accumulate_dkv) override;
  // MoE's dispatch and combine (moe_bf16.cc): one token's rows widened at a time, moe.cc's fp32
  // kernel on them, each output rounded once. The grouped expert GEMMs: Backend's defaults.
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

 protected:
  void* raw_alloc(size_t bytes) override;
  void raw_free(void* p) override;
  void* raw_alloc_host(size_t bytes) override;
  void raw_free_host(void* p) override;

 private:
  bool bf16_kernels_ = true;
  bool device_moe_routing_ = true;
  bool graph_dry_run_ = false, capturing_ = false;
  int64_t graph_captures_ = 0, graph_replays_ = 0;
};

namespace cpu {

// C[m x n] = alpha * op(A) op(B) + beta * C, row-major, through cblas_sgemm (lda, ldb, ldc:
// row strides of A, B, C as stored). The one GEMM entry of the CPU kernels.
void sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
           int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

}  // namespace cpu

}  // namespace parasol::runtime
