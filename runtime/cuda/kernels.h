// The CUDA kernel launchers, one group per .cu file, in plain C++ (no core/ headers, so that nvcc
// does not parse nlohmann/json once per GPU architecture: the CudaBackend member functions in
// backend_ops.cc translate the Backend calls into these). Every launcher enqueues on stream `s`
// and returns without synchronising; the contracts are those of the Backend entry of the same
// name (runtime/backend.h). Scratch arguments are device memory of the size the matching
// *_scratch() function returns (in elements).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace parasol::runtime::cuda {

// ---- embedding.cu
void embedding_forward(float* out, const int32_t* tokens, const float* table, int64_t vocab_start,
                       int64_t vocab_rows, const float* pos, int64_t pos_offset, int64_t rows,
                       int64_t seq, int64_t cols, cudaStream_t s);
void embedding_backward(float* dtable, float* dpos, const float* dout, const int32_t* tokens,
                        int64_t vocab_start, int64_t vocab_rows, int64_t pos_offset, int64_t rows,
                        int64_t seq, int64_t cols, cudaStream_t s);
// The same on bf16 table, positions and output (fp32 sums, one rounding) and from bf16 dout.
void embedding_forward_bf16(uint16_t* out, const int32_t* tokens, const uint16_t* table,
                            int64_t vocab_start, int64_t vocab_rows, const uint16_t* pos,
                            int64_t pos_offset, int64_t rows, int64_t seq, int64_t cols,
                            cudaStream_t s);
void embedding_backward_bf16(float* dtable, float* dpos, const uint16_t* dout,
                             const int32_t* tokens, int64_t vocab_start, int64_t vocab_rows,
                             int64_t pos_offset, int64_t rows, int64_t seq, int64_t cols,
                             cudaStream_t s);

// ---- norm.cu (layer: layernorm, else rmsnorm)
void norm_forward(bool layer, float* out, const float* x, const float* weight, const float* bias,
                  int64_t rows, int64_t cols, float eps, cudaStream_t s);
int64_t norm_backward_scratch(int64_t rows, int64_t cols);  // floats
void norm_backward(bool layer, float* dx, float* dweight, float* dbias, const float* dout,
                   const float* x, const float* weight, const float* dresidual, int64_t rows,
                   int64_t cols, float eps, float* scratch, cudaStream_t s);

// ---- linear.cu (the GEMMs themselves are CudaBackend::gemm)
// c[r][col] = beta * c[r][col] over [m x n] with row stride ldc (beta = 0: zero).
void scale_matrix(float* c, int64_t m, int64_t n, int64_t ldc, float beta, cudaStream_t s);
// out[r] = bias for every row of [rows x cols].
void broadcast_rows(float* out, const float* bias, int64_t rows, int64_t cols, cudaStream_t s);
void bias_forward(float* out, const float* bias, int64_t rows, int64_t cols, cudaStream_t s);
// out[c] += sum_r x[r][c], deterministic (fixed chunks of rows, summed in order).
int64_t column_sums_scratch(int64_t rows, int64_t cols);  // floats
void add_column_sums(float* out, const float* x, int64_t rows, int64_t cols, float* scratch,
                     cudaStream_t s);

// ---- activation.cu
void activation_forward(bool gelu, float* out, const float* in, int64_t rows, int64_t cols,
                        cudaStream_t s);
void activation_backward(bool gelu, float* din, const float* dout, const float* in, int64_t rows,
                         int64_t cols, cudaStream_t s);

// ---- rope.cu
void rope(float* x, int64_t ld, int64_t rows, int64_t seq, int64_t pos_offset, int64_t heads,
          int64_t head_dim, double theta, bool inverse, cudaStream_t s);

// ---- attention.cu: backend.h's AttentionDims with the scale resolved (> 0).
struct AttnShape {
  int64_t batch, seq_q, seq_kv, heads, kv_heads, head_dim;
  int64_t v_head_dim;  // resolved (> 0)
  int64_t ld_q, ld_kv, ld_o;
  bool causal;
  int64_t causal_offset;
  int64_t window;  // 0: none
  float scale;
  float dropout_p;
  uint64_t dropout_seed;
};
inline constexpr int64_t kMaxAttentionHeadDim = 1024;
void attention_forward(const AttnShape& d, float* out, float* lse, float* probs, const float* q,
                       const float* k, const float* v, bool accumulate, cudaStream_t s);
int64_t attention_backward_scratch(const AttnShape& d);  // floats
void attention_backward(const AttnShape& d, float* dq, float* dk, float* dv, const float* dout,
                        const float* q, const float* k, const float* v, const float* out,
                        const float* lse, const float* probs, bool accumulate_dq,
                        bool accumulate_dkv, float* scratch, cudaStream_t s);

// ---- attention_io.cu: the fused (cuDNN) attention's bf16 operands and its ring merge.
// dst [rows x cols] packed = src [rows x cols, row stride ld] rounded to bf16 (nearest even).
void pack_bf16(uint16_t* dst, const float* src, int64_t rows, int64_t cols, int64_t ld,
               cudaStream_t s);
// dst [rows x cols, row stride ld] = (or += when accumulate) src [rows x cols] packed, widened.
void unpack_bf16(float* dst, int64_t ld, const uint16_t* src, int64_t rows, int64_t cols,
                 bool accumulate, cudaStream_t s);
// A ring step's output merged into the earlier steps' (backend.h's attention_forward with
// accumulate): part [batch * seq_q x heads * dv] packed bf16 with its lse part_lse [b, h, seq_q]
// into out (row stride ld_o) and lse, by log-sum-exp.
void attention_merge_bf16(float* out, int64_t ld_o, float* lse, const uint16_t* part,
                          const float* part_lse, int64_t batch, int64_t seq_q, int64_t heads,
                          int64_t dv, cudaStream_t s);
// The same merge into a bf16 out (the merge in fp32, each element rounded once).
void attention_merge_into_bf16(uint16_t* out, int64_t ld_o, float* lse, const uint16_t* part,
                               const float* part_lse, int64_t batch, int64_t seq_q, int64_t heads,
                               int64_t dv, cudaStream_t s);
// dst [rows x cols, row stride ld_dst] = src [rows x cols, row stride ld_src] widened (bf16 ->
// fp32) or rounded (fp32 -> bf16, nearest even).
void widen_rows(float* dst, int64_t ld_dst, const uint16_t* src, int64_t ld_src, int64_t rows,
                int64_t cols, cudaStream_t s);
void narrow_rows(uint16_t* dst, int64_t ld_dst, const float* src, int64_t ld_src, int64_t rows,
                 int64_t cols, cudaStream_t s);
// dst [rows x cols, row stride ld] = round(dst + src), src [rows x cols] packed bf16, the sum in
// fp32 (a gradient added to a stored bf16 one).
void add_rows_bf16(uint16_t* dst, int64_t ld, const uint16_t* src, int64_t rows, int64_t cols,
                   cudaStream_t s);

// ---- residual.cu
void residual_forward(float* out, uint8_t* mask, const float* x, const float* y, const float* bias,
                      int64_t rows, int64_t cols, float dropout_p, uint64_t seed, cudaStream_t s);
// dy = dout * mask / (1 - p), or dout itself when mask is null (the bias gradient is the
// caller's add_column_sums of dy).
void residual_backward(float* dy, const float* dout, const uint8_t* mask, int64_t n,
                       float dropout_p, cudaStream_t s);

// ---- cross_entropy.cu
void xent_row_max(float* row_max, const float* logits, int64_t rows, int64_t vocab, cudaStream_t s);
void xent_sum_exp(float* sum_exp, const float* logits, const float* row_max, int64_t rows,
                  int64_t vocab, cudaStream_t s);
void xent_target(float* target, const float* logits, const int32_t* labels, int64_t rows,
                 int64_t vocab, int64_t vocab_start, cudaStream_t s);
void xent_loss(float* loss, const float* row_max, const float* sum_exp, const float* target,
               const int32_t* labels, int64_t rows, cudaStream_t s);
// acc[0] += loss[r], acc[1] += 1 over the labelled rows, in row order, in double (one thread:
// the CPU's order, so the step's loss equals the host sum bit for bit).
void loss_accumulate(double* acc, const float* loss, const int32_t* labels, int64_t rows,
                     cudaStream_t s);
void xent_softmax(float* probs, const float* logits, const float* row_max, const float* sum_exp,
                  int64_t rows, int64_t vocab, cudaStream_t s);
void xent_backward(float* dlogits, const float* probs, const int32_t* labels, int64_t rows,
                   int64_t vocab, int64_t vocab_start, float dloss, cudaStream_t s);

// ---- xent_tiled.cu: runtime/cpu/tiled_xent.h's vocab-tiled cross-entropy; logits (and
// dlogits) bf16 when `bf16`, else fp32; never widened into a buffer. labels nullable in the
// forward (target then 0).
void xent_tiled_forward(float* row_max, float* sum_exp, float* target, const void* logits,
                        bool bf16, const int32_t* labels, int64_t rows, int64_t vocab,
                        int64_t vocab_start, cudaStream_t s);
void xent_rescale(float* sum_exp, const float* local_max, const float* global_max, int64_t rows,
                  cudaStream_t s);
void xent_tiled_backward(void* dlogits, const void* logits, bool bf16, const float* row_max,
                         const float* sum_exp, const int32_t* labels, int64_t rows, int64_t vocab,
                         int64_t vocab_start, float dloss, cudaStream_t s);
// The forward's block shape (cpu::xent_block_chain's threads and vec: the tests' tolerance).
inline constexpr int kXentThreads = 256, kXentVec = 8;

// ---- The kernels on bf16 storage (bf16_elementwise.cu, bf16_norm.cu, bf16_rope.cu): the
// fp32 kernels' contracts above with every tensor bf16 (uint16_t) but the parameter gradients
// (fp32, accumulated) and the statistics; fp32 math in registers, 8 elements per 16-byte access
// where the rows allow it.
// x [rows x cols, row stride ld] = act(x + bias) (bias [cols], nullable; gelu or identity);
// pre (nullable, dense) = x + bias before the GELU.
void bias_act_bf16(uint16_t* x, int64_t ld, uint16_t* pre, const uint16_t* bias, bool gelu,
                   int64_t rows, int64_t cols, cudaStream_t s);
// din = dout * gelu'(in) over n elements (in place din == dout allowed).
void gelu_backward_bf16(uint16_t* din, const uint16_t* dout, const uint16_t* in, int64_t n,
                        cudaStream_t s);
void swiglu_forward_bf16(uint16_t* out, const uint16_t* in, int64_t rows, int64_t cols,
                         cudaStream_t s);
void swiglu_backward_bf16(uint16_t* din, const uint16_t* dout, const uint16_t* in, int64_t rows,
                          int64_t cols, cudaStream_t s);
// out = x + (y + bias), x and bias nullable, no dropout; in place allowed.
void residual_forward_bf16(uint16_t* out, const uint16_t* x, const uint16_t* y,
                           const uint16_t* bias, int64_t rows, int64_t cols, cudaStream_t s);
// out[c] += sum_r x[r][c] (deterministic; scratch column_sums_scratch(rows, cols) floats).
void add_column_sums_bf16(float* out, const uint16_t* x, int64_t rows, int64_t cols, float* scratch,
                          cudaStream_t s);
void add_f32(float* out, const float* in, int64_t n, cudaStream_t s);  // out[i] += in[i]
// norm_forward with the residual add fused in front when y is not null: the row is x + y rounded
// to bf16, written to sum_out (nullable) and normalised. weight, bias bf16 [cols].
void norm_forward_bf16(bool layer, uint16_t* out, uint16_t* sum_out, const uint16_t* x,
                       const uint16_t* y, const uint16_t* weight, const uint16_t* bias,
                       int64_t rows, int64_t cols, float eps, cudaStream_t s);
int64_t norm_backward_bf16_scratch(int64_t rows, int64_t cols);  // floats
void norm_backward_bf16(bool layer, uint16_t* dx, float* dweight, float* dbias,
                        const uint16_t* dout, const uint16_t* x, const uint16_t* weight,
                        const uint16_t* dresidual, int64_t rows, int64_t cols, float eps,
                        float* scratch, cudaStream_t s);
// rope on bf16 in place (head_dim up to 1024).
void rope_bf16(uint16_t* x, int64_t ld, int64_t rows, int64_t seq, int64_t pos_offset,
               int64_t heads, int64_t head_dim, double theta, bool inverse, cudaStream_t s);

// ---- moe.cu (the permutation is built on the host: backend_ops.cc)
// moe_permute.cu: moe_permutation on the device (no host copy): row_of [n = tokens * top_k],
// counts [experts], offsets [experts + 1] (exclusive scan; offsets[experts] = n) written; an index
// outside [0, experts) gets row -1 and adds 1 to *bad. scratch: the ints
// moe_permutation_device_scratch returns.
int64_t moe_permutation_device_scratch(int64_t n, int64_t experts);
void moe_permutation_device(int32_t* row_of, int32_t* counts, int32_t* offsets, int32_t* bad,
                            const int32_t* topk_idx, int64_t n, int64_t experts, int32_t* scratch,
                            cudaStream_t s);
// grouped_gemm.cu: the grouped expert GEMMs on bf16 with the experts' rows from the device
// offsets (offsets[e] <= r < offsets[e + 1]): C rows of expert e = A rows x B_e (+ bias[e]), B_e
// at b + e K N stored [K x N] or, trans_b, [N x K]; max_rows bounds offsets[experts] (the grid).
// wgrad: dW_e [K x N] (fp32) += A_e^T G_e over the expert's rows.
void grouped_gemm_bf16(uint16_t* c, const uint16_t* a, const uint16_t* b, const uint16_t* bias,
                       const int32_t* offsets, int64_t experts, int64_t max_rows, int64_t n,
                       int64_t k, bool trans_b, cudaStream_t s);
void grouped_gemm_bf16_wgrad(float* dw, const uint16_t* a, const uint16_t* g,
                             const int32_t* offsets, int64_t experts, int64_t n, int64_t k,
                             cudaStream_t s);
void router_softmax(float* probs, const float* logits, int64_t tokens, int64_t experts,
                    cudaStream_t s);
void router_topk(int32_t* topk_idx, float* topk_w, const float* probs, int64_t tokens,
                 int64_t experts, int64_t top_k, bool renormalize, cudaStream_t s);
void router_backward(float* dlogits, const float* dtopk_w, const float* probs,
                     const int32_t* topk_idx, int64_t tokens, int64_t experts, int64_t top_k,
                     bool renormalize, cudaStream_t s);
void dispatch_forward(float* out, const float* x, const int32_t* row_of, int64_t tokens,
                      int64_t top_k, int64_t cols, cudaStream_t s);
void dispatch_backward(float* dx, const float* dout, const int32_t* row_of, int64_t tokens,
                       int64_t top_k, int64_t cols, cudaStream_t s);
void combine_forward(float* out, const float* expert_out, const float* w, const int32_t* row_of,
                     int64_t tokens, int64_t top_k, int64_t cols, cudaStream_t s);
void combine_backward(float* dexpert_out, float* dw, const float* dout, const float* expert_out,
                      const float* w, const int32_t* row_of, int64_t tokens, int64_t top_k,
                      int64_t cols, cudaStream_t s);
// The same four on bf16 rows (the gates w and dw fp32): fp32 sums, each output rounded once.
void dispatch_forward_bf16(uint16_t* out, const uint16_t* x, const int32_t* row_of, int64_t tokens,
                           int64_t top_k, int64_t cols, cudaStream_t s);
void dispatch_backward_bf16(uint16_t* dx, const uint16_t* dout, const int32_t* row_of,
                            int64_t tokens, int64_t top_k, int64_t cols, cudaStream_t s);
void combine_forward_bf16(uint16_t* out, const uint16_t* expert_out, const float* w,
                          const int32_t* row_of, int64_t tokens, int64_t top_k, int64_t cols,
                          cudaStream_t s);
void combine_backward_bf16(uint16_t* dexpert_out, float* dw, const uint16_t* dout,
                           const uint16_t* expert_out, const float* w, const int32_t* row_of,
                           int64_t tokens, int64_t top_k, int64_t cols, cudaStream_t s);

// ---- adamw.cu: the AdamW constants rounded to fp32 on the host exactly as the CPU does.
struct AdamWConsts {
  float b1, b2, one_b1, one_b2, bc1, bc2, lr, eps, wd;
};
void adamw(const AdamWConsts& c, float* param, float* m, float* v, const float* grad, int64_t n,
           const float* grad_scale, cudaStream_t s);
int64_t grad_sumsq_scratch();  // doubles
void grad_sumsq(float* sumsq, const float* grad, int64_t n, double* scratch, cudaStream_t s);
void clip_scale(float* scale, const float* sumsq, float max_norm, float loss_scale, cudaStream_t s);

// ---- cast.cu
enum class CastType { kFp32, kBf16, kFp16 };
void cast(void* dst, CastType dst_type, const void* src, CastType src_type, int64_t n,
          cudaStream_t s);

}  // namespace parasol::runtime::cuda
