// defines: the CudaBackend kernel entries of backend.h: argument checks (the CPU backend's), the
// translation to the launchers of kernels.h (one .cu file per family), the linear layers and the
// grouped expert GEMMs composed from CudaBackend::gemm (one cuBLASLt call per expert, counts on
// the host), and moe_permutation, built on the host after copying the top-k indices back.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/error.h"
#include "runtime/cuda/cuda_backend.h"
#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/kernels.h"
#include "runtime/fused_attention.h"

namespace parasol::runtime {

namespace {

void check_attention(const AttentionDims& d) {
  if (d.heads <= 0 || d.kv_heads <= 0 || d.heads % d.kv_heads != 0)
    throw Error("runtime.attention", "heads (" + std::to_string(d.heads) +
                                         ") must be a positive multiple of kv_heads (" +
                                         std::to_string(d.kv_heads) + ")");
  if (d.dropout_p < 0.0f || d.dropout_p >= 1.0f)
    throw Error("runtime.attention", "dropout_p must be in [0, 1)");
  for (int64_t dim : {d.head_dim, d.vd()})
    if (dim <= 0 || dim > cuda::kMaxAttentionHeadDim)
      throw Error("runtime.attention", "head dims " + std::to_string(d.head_dim) + ", " +
                                           std::to_string(d.vd()) +
                                           " outside the CUDA kernel's [1, " +
                                           std::to_string(cuda::kMaxAttentionHeadDim) + "]");
  if (d.window < 0) throw Error("runtime.attention", "window must be >= 0");
}

// The shape of an attention call as its fallback log names it.
std::string attention_shape(const AttentionDims& d, const char* pass) {
  return std::string(pass) + " b" + std::to_string(d.batch) + " s" + std::to_string(d.seq_q) + "x" +
         std::to_string(d.seq_kv) + " h" + std::to_string(d.heads) + "/" +
         std::to_string(d.kv_heads) + " d" + std::to_string(d.head_dim) + "/" +
         std::to_string(d.vd()) + (d.causal ? " causal" : "") + " offset " +
         std::to_string(d.causal_offset) + " window " + std::to_string(d.window);
}

cuda::AttnShape shape_of(const AttentionDims& d) {
  cuda::AttnShape s;
  s.batch = d.batch;
  s.seq_q = d.seq_q;
  s.seq_kv = d.seq_kv;
  s.heads = d.heads;
  s.kv_heads = d.kv_heads;
  s.head_dim = d.head_dim;
  s.v_head_dim = d.vd();
  s.ld_q = d.ld_q;
  s.ld_kv = d.ld_kv;
  s.ld_o = d.ld_o;
  s.causal = d.causal;
  s.causal_offset = d.causal_offset;
  s.window = d.window;
  s.scale = d.scale > 0.0f ? d.scale : 1.0f / std::sqrt(static_cast<float>(d.head_dim));
  s.dropout_p = d.dropout_p;
  s.dropout_seed = d.dropout_seed;
  return s;
}

void check_topk(int64_t experts, int64_t top_k) {
  if (top_k < 1 || top_k > experts)
    throw Error("runtime.router", "top_k (" + std::to_string(top_k) +
                                      ") must be in [1, experts = " + std::to_string(experts) +
                                      "]");
}

}  // namespace

// ---- Embedding, norm, activation.

void CudaBackend::embedding_forward(float* out, const int32_t* tokens, const float* table,
                                    int64_t vocab_start, int64_t vocab_rows, const float* pos,
                                    int64_t pos_offset, int64_t rows, int64_t seq, int64_t cols) {
  cuda::embedding_forward(out, tokens, table, vocab_start, vocab_rows, pos, pos_offset, rows, seq,
                          cols, stream_);
}

void CudaBackend::embedding_backward(float* dtable, float* dpos, const float* dout,
                                     const int32_t* tokens, int64_t vocab_start, int64_t vocab_rows,
                                     int64_t pos_offset, int64_t rows, int64_t seq, int64_t cols) {
  cuda::embedding_backward(dtable, dpos, dout, tokens, vocab_start, vocab_rows, pos_offset, rows,
                           seq, cols, stream_);
}

void CudaBackend::norm_forward(Norm kind, float* out, const float* x, const float* weight,
                               const float* bias, int64_t rows, int64_t cols, float eps) {
  cuda::norm_forward(kind == Norm::kLayerNorm, out, x, weight, bias, rows, cols, eps, stream_);
}

void CudaBackend::norm_backward(Norm kind, float* dx, float* dweight, float* dbias,
                                const float* dout, const float* x, const float* weight,
                                const float* dresidual, int64_t rows, int64_t cols, float eps) {
  auto* s = static_cast<float*>(scratch(sizeof(float) * cuda::norm_backward_scratch(rows, cols)));
  cuda::norm_backward(kind == Norm::kLayerNorm, dx, dweight, dbias, dout, x, weight, dresidual,
                      rows, cols, eps, s, stream_);
}

void CudaBackend::rope(float* x, int64_t ld, int64_t rows, int64_t seq, int64_t pos_offset,
                       int64_t heads, int64_t head_dim, double theta, bool inverse) {
  if (head_dim % 2 != 0 || seq <= 0 || theta <= 0)
    throw Error("runtime.rope", "head_dim must be even, seq and theta positive");
  cuda::rope(x, ld, rows, seq, pos_offset, heads, head_dim, theta, inverse, stream_);
}

void CudaBackend::activation_forward(Activation kind, float* out, const float* in, int64_t rows,
                                     int64_t cols) {
  cuda::activation_forward(kind == Activation::kGelu, out, in, rows, cols, stream_);
}

void CudaBackend::activation_backward(Activation kind, float* din, const float* dout,
                                      const float* in, int64_t rows, int64_t cols) {
  cuda::activation_backward(kind == Activation::kGelu, din, dout, in, rows, cols, stream_);
}

// ---- Linear: the CPU's composition (runtime/cpu/linear.cc) with gemm() for cpu::sgemm.

void CudaBackend::linear_forward(float* out, const float* in, const float* w, WeightLayout layout,
                                 const float* bias, int64_t m, int64_t n, int64_t k) {
  const bool out_in = layout == WeightLayout::kOutIn;
  if (bias != nullptr) cuda::broadcast_rows(out, bias, m, n, stream_);
  gemm(false, out_in, m, n, k, 1.0f, in, k, w, out_in ? k : n, bias != nullptr ? 1.0f : 0.0f, out,
       n);
}

void CudaBackend::linear_backward_data(float* din, const float* dout, const float* w,
                                       WeightLayout layout, int64_t m, int64_t n, int64_t k,
                                       bool accumulate) {
  const bool out_in = layout == WeightLayout::kOutIn;
  gemm(false, !out_in, m, k, n, 1.0f, dout, n, w, out_in ? k : n, accumulate ? 1.0f : 0.0f, din, k);
}

void CudaBackend::linear_backward_weight(float* dw, float* dbias, const float* in,
                                         const float* dout, WeightLayout layout, int64_t m,
                                         int64_t n, int64_t k) {
  if (dw != nullptr) {
    if (layout == WeightLayout::kOutIn)
      gemm(true, false, n, k, m, 1.0f, dout, n, in, k, 1.0f, dw, k);
    else
      gemm(true, false, k, n, m, 1.0f, in, k, dout, n, 1.0f, dw, n);
  }
  if (dbias != nullptr) bias_backward(dbias, dout, m, n);
}

void CudaBackend::bias_forward(float* out, const float* bias, int64_t rows, int64_t cols) {
  cuda::bias_forward(out, bias, rows, cols, stream_);
}

void CudaBackend::bias_backward(float* dbias, const float* dout, int64_t rows, int64_t cols) {
  auto* s = static_cast<float*>(scratch(sizeof(float) * cuda::column_sums_scratch(rows, cols)));
  cuda::add_column_sums(dbias, dout, rows, cols, s, stream_);
}

void CudaBackend::expert_linear_forward(float* out, const float* in, const float* w,
                                        const float* bias, const int64_t* counts_host,
                                        int64_t experts, int64_t n, int64_t k) {
  int64_t row = 0;
  for (int64_t e = 0; e < experts; ++e) {
    const int64_t rows = counts_host[e];
    if (rows > 0)
      linear_forward(out + row * n, in + row * k, w + e * k * n, WeightLayout::kInOut,
                     bias ? bias + e * n : nullptr, rows, n, k);
    row += rows;
  }
}

void CudaBackend::expert_linear_backward_data(float* din, const float* dout, const float* w,
                                              const int64_t* counts_host, int64_t experts,
                                              int64_t n, int64_t k, bool accumulate) {
  int64_t row = 0;
  for (int64_t e = 0; e < experts; ++e) {
    const int64_t rows = counts_host[e];
    if (rows > 0)
      linear_backward_data(din + row * k, dout + row * n, w + e * k * n, WeightLayout::kInOut, rows,
                           n, k, accumulate);
    row += rows;
  }
}

void CudaBackend::expert_linear_backward_weight(float* dw, float* dbias, const float* in,
                                                const float* dout, const int64_t* counts_host,
                                                int64_t experts, int64_t n, int64_t k) {
  int64_t row = 0;
  for (int64_t e = 0; e < experts; ++e) {
    const int64_t rows = counts_host[e];
    if (rows > 0)
      linear_backward_weight(dw ? dw + e * k * n : nullptr, dbias ? dbias + e * n : nullptr,
                             in + row * k, dout + row * n, WeightLayout::kInOut, rows, n, k);
    row += rows;
  }
}

// ---- Attention.

void CudaBackend::attention_forward(const AttentionDims& d, float* out, float* lse, float* probs,
                                    const float* q, const float* k, const float* v,
                                    bool accumulate) {
  check_attention(d);
  if (accumulate && lse == nullptr)
    throw Error("runtime.attention", "accumulate needs the lse of the earlier steps");
  if (fused_attention_) {
    const SdpaRoute r = fused_attention_route(d, probs != nullptr);
    std::string why = r.refusal;
    if (why.empty()) {
      if (!cudnn_) cudnn_ = std::make_unique<CudnnAttention>(*this);
      why = cudnn_->forward(d, r.mask, out, lse, q, k, v, accumulate);
    }
    if (why.empty()) {
      count_fused_attention();
      return;
    }
    note_fallback("attention", attention_shape(d, "forward"), why);
  }
  cuda::attention_forward(shape_of(d), out, lse, probs, q, k, v, accumulate, stream_);
}

void CudaBackend::attention_backward(const AttentionDims& d, float* dq, float* dk, float* dv,
                                     const float* dout, const float* q, const float* k,
                                     const float* v, const float* out, const float* lse,
                                     const float* probs, bool accumulate_dq, bool accumulate_dkv) {
  check_attention(d);
  if (lse == nullptr && probs == nullptr)
    throw Error("runtime.attention", "the backward needs lse or probs");
  if (fused_attention_) {
    // From lse only: a call given the probabilities was a forward that wrote them (not fused).
    const SdpaRoute r = fused_attention_route(d, probs != nullptr || lse == nullptr);
    std::string why = r.refusal;
    if (why.empty()) {
      if (!cudnn_) cudnn_ = std::make_unique<CudnnAttention>(*this);
      why = cudnn_->backward(d, r.mask, dq, dk, dv, dout, q, k, v, out, lse, accumulate_dq,
                             accumulate_dkv);
    }
    if (why.empty()) {
      count_fused_attention();
      return;
    }
    note_fallback("attention", attention_shape(d, "backward"), why);
  }
  const cuda::AttnShape s = shape_of(d);
  auto* delta = static_cast<float*>(
      scratch(sizeof(float) * std::max<int64_t>(1, cuda::attention_backward_scratch(s))));
  cuda::attention_backward(s, dq, dk, dv, dout, q, k, v, out, lse, probs, accumulate_dq,
                           accumulate_dkv, delta, stream_);
}

// ---- Attention on bf16 storage: cuDNN on the buffers in place, else parasol's fp32 kernel on
// widened copies in scratch (one block: Q, K | V, out, and in the backward dO, dQ, dK | dV and the
// kernel's own scratch), its outputs rounded once.

namespace {

// The fp32 copies of one call's operands: Q [Tq x H D], K | V [Tk x KH (D + Dv)], O [Tq x H Dv].
struct Widened {
  AttentionDims d;  // the call's dims with the copies' strides
  float *q = nullptr, *kv = nullptr, *o = nullptr;
  float *dout = nullptr, *dq = nullptr, *dkv = nullptr, *rest = nullptr;  // backward
};

Widened widened_dims(const AttentionDims& d) {
  Widened w;
  w.d = d;
  w.d.ld_q = d.heads * d.head_dim;
  w.d.ld_kv = d.kv_heads * (d.head_dim + d.vd());
  w.d.ld_o = d.heads * d.vd();
  return w;
}

}  // namespace

void CudaBackend::attention_forward_bf16(const AttentionDims& d, uint16_t* out, float* lse,
                                         const uint16_t* q, const uint16_t* k, const uint16_t* v,
                                         bool accumulate) {
  check_attention(d);
  if (accumulate && lse == nullptr)
    throw Error("runtime.attention", "accumulate needs the lse of the earlier steps");
  if (fused_attention_) {
    const SdpaRoute r = fused_attention_route(d, false);
    std::string why = r.refusal;
    if (why.empty()) {
      if (!cudnn_) cudnn_ = std::make_unique<CudnnAttention>(*this);
      why = cudnn_->forward_bf16(d, r.mask, out, lse, q, k, v, accumulate);
    }
    if (why.empty()) {
      count_fused_attention();
      return;
    }
    note_fallback("attention", attention_shape(d, "forward (bf16)"), why);
  }
  Widened w = widened_dims(d);
  const int64_t Tq = d.batch * d.seq_q, Tk = d.batch * d.seq_kv, kc = d.kv_heads * d.head_dim;
  const int64_t nq = Tq * w.d.ld_q, nkv = Tk * w.d.ld_kv, no = Tq * w.d.ld_o;
  w.q = static_cast<float*>(scratch(sizeof(float) * std::max<int64_t>(1, nq + nkv + no)));
  w.kv = w.q + nq;
  w.o = w.kv + nkv;
  cuda::widen_rows(w.q, w.d.ld_q, q, d.ld_q, Tq, w.d.ld_q, stream_);
  cuda::widen_rows(w.kv, w.d.ld_kv, k, d.ld_kv, Tk, kc, stream_);
  cuda::widen_rows(w.kv + kc, w.d.ld_kv, v, d.ld_kv, Tk, w.d.ld_kv - kc, stream_);
  if (accumulate) cuda::widen_rows(w.o, w.d.ld_o, out, d.ld_o, Tq, w.d.ld_o, stream_);
  cuda::attention_forward(shape_of(w.d), w.o, lse, nullptr, w.q, w.kv, w.kv + kc, accumulate,
                          stream_);
  cuda::narrow_rows(out, d.ld_o, w.o, w.d.ld_o, Tq, w.d.ld_o, stream_);
}

void CudaBackend::attention_backward_bf16(const AttentionDims& d, uint16_t* dq, uint16_t* dk,
                                          uint16_t* dv, const uint16_t* dout, const uint16_t* q,
                                          const uint16_t* k, const uint16_t* v, const uint16_t* out,
                                          const float* lse, bool accumulate_dq,
                                          bool accumulate_dkv) {
  check_attention(d);
  if (lse == nullptr) throw Error("runtime.attention", "the bf16 backward needs lse");
  if (fused_attention_) {
    const SdpaRoute r = fused_attention_route(d, false);
    std::string why = r.refusal;
    if (why.empty()) {
      if (!cudnn_) cudnn_ = std::make_unique<CudnnAttention>(*this);
      why = cudnn_->backward_bf16(d, r.mask, dq, dk, dv, dout, q, k, v, out, lse, accumulate_dq,
                                  accumulate_dkv);
    }
    if (why.empty()) {
      count_fused_attention();
      return;
    }
    note_fallback("attention", attention_shape(d, "backward (bf16)"), why);
  }
  Widened w = widened_dims(d);
  const cuda::AttnShape s = shape_of(w.d);
  const int64_t Tq = d.batch * d.seq_q, Tk = d.batch * d.seq_kv, kc = d.kv_heads * d.head_dim;
  const int64_t nq = Tq * w.d.ld_q, nkv = Tk * w.d.ld_kv, no = Tq * w.d.ld_o;
  const int64_t nrest = std::max<int64_t>(1, cuda::attention_backward_scratch(s));
  w.q = static_cast<float*>(scratch(sizeof(float) * (2 * nq + 2 * nkv + 2 * no + nrest)));
  w.kv = w.q + nq;
  w.o = w.kv + nkv;
  w.dout = w.o + no;
  w.dq = w.dout + no;
  w.dkv = w.dq + nq;
  w.rest = w.dkv + nkv;
  const int64_t vc = w.d.ld_kv - kc;
  cuda::widen_rows(w.q, w.d.ld_q, q, d.ld_q, Tq, w.d.ld_q, stream_);
  cuda::widen_rows(w.kv, w.d.ld_kv, k, d.ld_kv, Tk, kc, stream_);
  cuda::widen_rows(w.kv + kc, w.d.ld_kv, v, d.ld_kv, Tk, vc, stream_);
  cuda::widen_rows(w.o, w.d.ld_o, out, d.ld_o, Tq, w.d.ld_o, stream_);
  cuda::widen_rows(w.dout, w.d.ld_o, dout, d.ld_o, Tq, w.d.ld_o, stream_);
  if (accumulate_dq) cuda::widen_rows(w.dq, w.d.ld_q, dq, d.ld_q, Tq, w.d.ld_q, stream_);
  if (accumulate_dkv) {
    cuda::widen_rows(w.dkv, w.d.ld_kv, dk, d.ld_kv, Tk, kc, stream_);
    cuda::widen_rows(w.dkv + kc, w.d.ld_kv, dv, d.ld_kv, Tk, vc, stream_);
  }
  cuda::attention_backward(s, w.dq, w.dkv, w.dkv + kc, w.dout, w.q, w.kv, w.kv + kc, w.o, lse,
                           nullptr, accumulate_dq, accumulate_dkv, w.rest, stream_);
  cuda::narrow_rows(dq, d.ld_q, w.dq, w.d.ld_q, Tq, w.d.ld_q, stream_);
  cuda::narrow_rows(dk, d.ld_kv, w.dkv, w.d.ld_kv, Tk, kc, stream_);
  cuda::narrow_rows(dv, d.ld_kv, w.dkv + kc, w.d.ld_kv, Tk, vc, stream_);
}

// ---- Residual.

void CudaBackend::residual_forward(float* out, uint8_t* mask, const float* x, const float* y,
                                   const float* bias, int64_t rows, int64_t cols, float dropout_p,
                                   uint64_t seed) {
  if (dropout_p < 0.0f || dropout_p >= 1.0f)
    throw Error("runtime.residual", "dropout_p must be in [0, 1)");
  if (dropout_p > 0.0f && mask == nullptr)
    throw Error("runtime.residual", "dropout needs a mask buffer");
  cuda::residual_forward(out, mask, x, y, bias, rows, cols, dropout_p, seed, stream_);
}

void CudaBackend::residual_backward(float* dy, float* dbias, const float* dout, const uint8_t* mask,
                                    int64_t rows, int64_t cols, float dropout_p) {
  cuda::residual_backward(dy, dout, mask, rows * cols, dropout_p, stream_);
  if (dbias != nullptr) bias_backward(dbias, dy, rows, cols);
}

// ---- Cross-entropy.

void CudaBackend::xent_row_max(float* row_max, const float* logits, int64_t rows, int64_t vocab) {
  cuda::xent_row_max(row_max, logits, rows, vocab, stream_);
}
void CudaBackend::xent_sum_exp(float* sum_exp, const float* logits, const float* row_max,
                               int64_t rows, int64_t vocab) {
  cuda::xent_sum_exp(sum_exp, logits, row_max, rows, vocab, stream_);
}
void CudaBackend::xent_target(float* target, const float* logits, const int32_t* labels,
                              int64_t rows, int64_t vocab, int64_t vocab_start) {
  cuda::xent_target(target, logits, labels, rows, vocab, vocab_start, stream_);
}
void CudaBackend::xent_loss(float* loss, const float* row_max, const float* sum_exp,
                            const float* target, const int32_t* labels, int64_t rows) {
  cuda::xent_loss(loss, row_max, sum_exp, target, labels, rows, stream_);
}
void CudaBackend::loss_accumulate(double* acc, const float* loss, const int32_t* labels,
                                  int64_t rows) {
  cuda::loss_accumulate(acc, loss, labels, rows, stream_);
}
void CudaBackend::xent_softmax(float* probs, const float* logits, const float* row_max,
                               const float* sum_exp, int64_t rows, int64_t vocab) {
  cuda::xent_softmax(probs, logits, row_max, sum_exp, rows, vocab, stream_);
}
void CudaBackend::xent_backward(float* dlogits, const float* probs, const int32_t* labels,
                                int64_t rows, int64_t vocab, int64_t vocab_start, float dloss) {
  cuda::xent_backward(dlogits, probs, labels, rows, vocab, vocab_start, dloss, stream_);
}

// ---- MoE.

void CudaBackend::router_forward(float* probs, int32_t* topk_idx, float* topk_w,
                                 const float* logits, int64_t tokens, int64_t experts,
                                 int64_t top_k, bool renormalize) {
  check_topk(experts, top_k);
  cuda::router_softmax(probs, logits, tokens, experts, stream_);
  cuda::router_topk(topk_idx, topk_w, probs, tokens, experts, top_k, renormalize, stream_);
}

void CudaBackend::router_topk(int32_t* topk_idx, float* topk_w, const float* probs, int64_t tokens,
                              int64_t experts, int64_t top_k, bool renormalize) {
  check_topk(experts, top_k);
  cuda::router_topk(topk_idx, topk_w, probs, tokens, experts, top_k, renormalize, stream_);
}

void CudaBackend::router_backward(float* dlogits, const float* dtopk_w, const float* probs,
                                  const int32_t* topk_idx, int64_t tokens, int64_t experts,
                                  int64_t top_k, bool renormalize) {
  check_topk(experts, top_k);
  cuda::router_backward(dlogits, dtopk_w, probs, topk_idx, tokens, experts, top_k, renormalize,
                        stream_);
}

void CudaBackend::moe_permutation(int32_t* row_of, int64_t* counts_host, const int32_t* topk_idx,
                                  int64_t tokens, int64_t experts, int64_t top_k) {
  const int64_t n = tokens * top_k;
  std::vector<int32_t> idx(static_cast<size_t>(std::max<int64_t>(n, 0)));
  copy(idx.data(), topk_idx, sizeof(int32_t) * idx.size());  // synchronises (host destination)
  std::fill(counts_host, counts_host + experts, int64_t{0});
  for (int64_t i = 0; i < n; ++i) {
    if (idx[i] < 0 || idx[i] >= experts)
      throw Error("runtime.moe_permutation", "expert index " + std::to_string(idx[i]) +
                                                 " out of [0, " + std::to_string(experts) + ")");
    ++counts_host[idx[i]];
  }
  std::vector<int64_t> next(static_cast<size_t>(experts));
  int64_t offset = 0;
  for (int64_t e = 0; e < experts; ++e) {
    next[e] = offset;
    offset += counts_host[e];
  }
  std::vector<int32_t> rows(idx.size());
  for (int64_t i = 0; i < n; ++i) rows[i] = static_cast<int32_t>(next[idx[i]]++);
  copy(row_of, rows.data(), sizeof(int32_t) * rows.size());  // synchronises (host source)
}

void CudaBackend::dispatch_forward(float* out, const float* x, const int32_t* row_of,
                                   int64_t tokens, int64_t top_k, int64_t cols) {
  cuda::dispatch_forward(out, x, row_of, tokens, top_k, cols, stream_);
}
void CudaBackend::dispatch_backward(float* dx, const float* dout, const int32_t* row_of,
                                    int64_t tokens, int64_t top_k, int64_t cols) {
  cuda::dispatch_backward(dx, dout, row_of, tokens, top_k, cols, stream_);
}
void CudaBackend::combine_forward(float* out, const float* expert_out, const float* w,
                                  const int32_t* row_of, int64_t tokens, int64_t top_k,
                                  int64_t cols) {
  cuda::combine_forward(out, expert_out, w, row_of, tokens, top_k, cols, stream_);
}
void CudaBackend::combine_backward(float* dexpert_out, float* dw, const float* dout,
                                   const float* expert_out, const float* w, const int32_t* row_of,
                                   int64_t tokens, int64_t top_k, int64_t cols) {
  cuda::combine_backward(dexpert_out, dw, dout, expert_out, w, row_of, tokens, top_k, cols,
                         stream_);
}

void CudaBackend::dispatch_forward_bf16(uint16_t* out, const uint16_t* x, const int32_t* row_of,
                                        int64_t tokens, int64_t top_k, int64_t cols) {
  cuda::dispatch_forward_bf16(out, x, row_of, tokens, top_k, cols, stream_);
}
void CudaBackend::dispatch_backward_bf16(uint16_t* dx, const uint16_t* dout, const int32_t* row_of,
                                         int64_t tokens, int64_t top_k, int64_t cols) {
  cuda::dispatch_backward_bf16(dx, dout, row_of, tokens, top_k, cols, stream_);
}
void CudaBackend::combine_forward_bf16(uint16_t* out, const uint16_t* expert_out, const float* w,
                                       const int32_t* row_of, int64_t tokens, int64_t top_k,
                                       int64_t cols) {
  cuda::combine_forward_bf16(out, expert_out, w, row_of, tokens, top_k, cols, stream_);
}
void CudaBackend::combine_backward_bf16(uint16_t* dexpert_out, float* dw, const uint16_t* dout,
                                        const uint16_t* expert_out, const float* w,
                                        const int32_t* row_of, int64_t tokens, int64_t top_k,
                                        int64_t cols) {
  cuda::combine_backward_bf16(dexpert_out, dw, dout, expert_out, w, row_of, tokens, top_k, cols,
                              stream_);
}

// ---- Optimizer and casts.

void CudaBackend::adamw(const AdamWConfig& c, float* param, float* m, float* v, const float* grad,
                        int64_t n, const float* grad_scale) {
  if (c.step < 1) throw Error("runtime.adamw", "step must be >= 1 (bias correction)");
  // The CPU's rounding of the constants (runtime/cpu/adamw.cc).
  cuda::AdamWConsts k;
  k.bc1 = static_cast<float>(1.0 - std::pow(c.beta1, static_cast<double>(c.step)));
  k.bc2 = static_cast<float>(1.0 - std::pow(c.beta2, static_cast<double>(c.step)));
  k.b1 = static_cast<float>(c.beta1);
  k.b2 = static_cast<float>(c.beta2);
  k.one_b1 = static_cast<float>(1.0 - c.beta1);
  k.one_b2 = static_cast<float>(1.0 - c.beta2);
  k.lr = static_cast<float>(c.lr);
  k.eps = static_cast<float>(c.eps);
  k.wd = static_cast<float>(c.weight_decay);
  cuda::adamw(k, param, m, v, grad, n, grad_scale, stream_);
}

void CudaBackend::grad_sumsq(float* sumsq, const float* grad, int64_t n) {
  auto* s = static_cast<double*>(scratch(sizeof(double) * cuda::grad_sumsq_scratch()));
  cuda::grad_sumsq(sumsq, grad, n, s, stream_);
}

void CudaBackend::clip_scale(float* scale, const float* sumsq, float max_norm, float loss_scale) {
  cuda::clip_scale(scale, sumsq, max_norm, loss_scale, stream_);
}

void CudaBackend::cast(void* dst, Dtype dst_type, const void* src, Dtype src_type, int64_t n) {
  const auto code = [&](Dtype t) {
    switch (t) {
      case Dtype::kFp32:
        return cuda::CastType::kFp32;
      case Dtype::kBf16:
        return cuda::CastType::kBf16;
      case Dtype::kFp16:
        return cuda::CastType::kFp16;
      default:
        throw Error("runtime.cast", std::string("unsupported conversion ") + dtype_name(src_type) +
                                        " -> " + dtype_name(dst_type));
    }
  };
  const cuda::CastType d = code(dst_type), s = code(src_type);
  if (d != cuda::CastType::kFp32 && s != cuda::CastType::kFp32)
    throw Error("runtime.cast", std::string("unsupported conversion ") + dtype_name(src_type) +
                                    " -> " + dtype_name(dst_type));
  cuda::cast(dst, d, src, s, n, stream_);
}

}  // namespace parasol::runtime
