// defines: the CudaBackend entries that work on low-precision storage directly (cuda_backend.h,
// "Low-precision storage without widening"): argument checks and the translation to the
// launchers of kernels.h.
#include <string>

#include "core/error.h"
#include "runtime/cuda/cuda_backend.h"
#include "runtime/cuda/kernels.h"

namespace parasol::runtime {

namespace {

// True for bf16, false for fp32; throws naming `what` for another dtype.
bool bf16_or_fp32(Dtype d, const char* what) {
  if (d == Dtype::kBf16) return true;
  if (d == Dtype::kFp32) return false;
  throw Error("runtime.cuda",
              std::string(what) + ": dtype " + dtype_name(d) + " (this entry takes fp32 or bf16)");
}

}  // namespace

void CudaBackend::xent_tiled_forward(float* row_max, float* sum_exp, float* target,
                                     const void* logits, Dtype dtype, const int32_t* labels,
                                     int64_t rows, int64_t vocab, int64_t vocab_start) {
  const bool bf16 = bf16_or_fp32(dtype, "xent_tiled_forward");
  cuda::xent_tiled_forward(row_max, sum_exp, target, logits, bf16, labels, rows, vocab, vocab_start,
                           stream_);
}

void CudaBackend::xent_rescale(float* sum_exp, const float* local_max, const float* global_max,
                               int64_t rows) {
  cuda::xent_rescale(sum_exp, local_max, global_max, rows, stream_);
}

void CudaBackend::xent_tiled_backward(void* dlogits, const void* logits, Dtype dtype,
                                      const float* row_max, const float* sum_exp,
                                      const int32_t* labels, int64_t rows, int64_t vocab,
                                      int64_t vocab_start, float dloss) {
  const bool bf16 = bf16_or_fp32(dtype, "xent_tiled_backward");
  cuda::xent_tiled_backward(dlogits, logits, bf16, row_max, sum_exp, labels, rows, vocab,
                            vocab_start, dloss, stream_);
}

void CudaBackend::norm_forward_bf16(Norm kind, uint16_t* out, const uint16_t* x,
                                    const uint16_t* weight, const uint16_t* bias, int64_t rows,
                                    int64_t cols, float eps) {
  cuda::norm_forward_bf16(kind == Norm::kLayerNorm, out, nullptr, x, nullptr, weight, bias, rows,
                          cols, eps, stream_);
}

// ---- The element-wise typed entries (backend.h) on kernels.h's bf16 kernels.

void CudaBackend::norm_backward_bf16(Norm kind, uint16_t* dx, float* dweight, float* dbias,
                                     const uint16_t* dout, const uint16_t* x,
                                     const uint16_t* weight, const uint16_t* dresidual,
                                     int64_t rows, int64_t cols, float eps) {
  auto* s =
      static_cast<float*>(scratch(sizeof(float) * cuda::norm_backward_bf16_scratch(rows, cols)));
  cuda::norm_backward_bf16(kind == Norm::kLayerNorm, dx, dweight, dbias, dout, x, weight, dresidual,
                           rows, cols, eps, s, stream_);
}

void CudaBackend::activation_forward_bf16(Activation kind, uint16_t* out, const uint16_t* in,
                                          int64_t rows, int64_t cols) {
  if (kind == Activation::kSwiglu) {
    cuda::swiglu_forward_bf16(out, in, rows, cols, stream_);
    return;
  }
  // GELU in place on out (bias_act_bf16 without a bias).
  if (out != in) copy(out, in, static_cast<size_t>(rows * cols) * sizeof(uint16_t));
  cuda::bias_act_bf16(out, cols, nullptr, nullptr, true, rows, cols, stream_);
}

void CudaBackend::activation_backward_bf16(Activation kind, uint16_t* din, const uint16_t* dout,
                                           const uint16_t* in, int64_t rows, int64_t cols) {
  if (kind == Activation::kSwiglu)
    cuda::swiglu_backward_bf16(din, dout, in, rows, cols, stream_);
  else
    cuda::gelu_backward_bf16(din, dout, in, rows * cols, stream_);
}

void CudaBackend::residual_forward_bf16(uint16_t* out, const uint16_t* x, const uint16_t* y,
                                        const uint16_t* bias, int64_t rows, int64_t cols) {
  cuda::residual_forward_bf16(out, x, y, bias, rows, cols, stream_);
}

void CudaBackend::residual_backward_bf16(uint16_t* dy, float* dbias, const uint16_t* dout,
                                         int64_t rows, int64_t cols) {
  if (dbias != nullptr) {
    auto* s = static_cast<float*>(scratch(sizeof(float) * cuda::column_sums_scratch(rows, cols)));
    cuda::add_column_sums_bf16(dbias, dout, rows, cols, s, stream_);
  }
  if (dy != dout) copy(dy, dout, static_cast<size_t>(rows * cols) * sizeof(uint16_t));
}

void CudaBackend::rope_bf16(uint16_t* x, int64_t ld, int64_t rows, int64_t seq, int64_t pos_offset,
                            int64_t heads, int64_t head_dim, double theta, bool inverse) {
  cuda::rope_bf16(x, ld, rows, seq, pos_offset, heads, head_dim, theta, inverse, stream_);
}

void CudaBackend::embedding_forward_bf16(uint16_t* out, const int32_t* tokens,
                                         const uint16_t* table, int64_t vocab_start,
                                         int64_t vocab_rows, const uint16_t* pos,
                                         int64_t pos_offset, int64_t rows, int64_t seq,
                                         int64_t cols) {
  cuda::embedding_forward_bf16(out, tokens, table, vocab_start, vocab_rows, pos, pos_offset, rows,
                               seq, cols, stream_);
}

void CudaBackend::embedding_backward_bf16(float* dtable, float* dpos, const uint16_t* dout,
                                          const int32_t* tokens, int64_t vocab_start,
                                          int64_t vocab_rows, int64_t pos_offset, int64_t rows,
                                          int64_t seq, int64_t cols) {
  cuda::embedding_backward_bf16(dtable, dpos, dout, tokens, vocab_start, vocab_rows, pos_offset,
                                rows, seq, cols, stream_);
}

// ---- The tiled loss's typed entries (backend.h): xent_tiled.cu's one-pass forward, whose own
// maximum and shifted sum are then rescaled to the given maximum (scratch: the per-row pairs).

void CudaBackend::xent_max_typed(float* row_max, const void* logits, Dtype dtype, int64_t rows,
                                 int64_t vocab) {
  const bool bf16 = bf16_or_fp32(dtype, "xent_max_typed");
  auto* s = static_cast<float*>(scratch(sizeof(float) * 2 * static_cast<size_t>(rows)));
  cuda::xent_tiled_forward(row_max, s, s + rows, logits, bf16, nullptr, rows, vocab, 0, stream_);
}

void CudaBackend::xent_sums_typed(float* sum_exp, float* target, const void* logits, Dtype dtype,
                                  const float* row_max, const int32_t* labels, int64_t rows,
                                  int64_t vocab, int64_t vocab_start) {
  const bool bf16 = bf16_or_fp32(dtype, "xent_sums_typed");
  auto* own = static_cast<float*>(scratch(sizeof(float) * static_cast<size_t>(rows)));
  cuda::xent_tiled_forward(own, sum_exp, target, logits, bf16, labels, rows, vocab, vocab_start,
                           stream_);
  cuda::xent_rescale(sum_exp, own, row_max, rows, stream_);
}

void CudaBackend::xent_backward_typed(void* dlogits, const void* logits, Dtype dtype,
                                      const float* row_max, const float* sum_exp,
                                      const int32_t* labels, int64_t rows, int64_t vocab,
                                      int64_t vocab_start, float dloss) {
  xent_tiled_backward(dlogits, logits, dtype, row_max, sum_exp, labels, rows, vocab, vocab_start,
                      dloss);
}

}  // namespace parasol::runtime
