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

}  // namespace parasol::runtime
