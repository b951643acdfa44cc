// defines: cuda::residual_forward, residual_backward (runtime/cpu/residual.cc's kernels on the
// GPU): out = x + dropout(y + bias) with the seed's mask (dropout_keep, equal to the CPU's) stored
// one byte per element, and the masked, scaled gradient. One thread per element; in place is
// safe (each element is read before it is written by the same thread).
#include "runtime/cuda/cuda_common.cuh"

namespace parasol::runtime::cuda {

namespace {

__global__ void residual_forward_kernel(float* out, uint8_t* mask, const float* x, const float* y,
                                        const float* bias, int64_t rows, int64_t cols, bool drop,
                                        uint32_t threshold, float keep_scale, uint64_t seed) {
  PARASOL_GRID_STRIDE(i, rows * cols) {
    const int64_t c = i % cols;
    const float xv = x != nullptr ? x[i] : 0.0f;
    if (drop) {
      const bool keep = dropout_keep(seed, static_cast<uint64_t>(i), threshold);
      mask[i] = keep ? 1 : 0;
      const float val = (y[i] + (bias ? bias[c] : 0.0f)) * (keep ? keep_scale : 0.0f);
      out[i] = xv + val;
    } else {
      const float yb = bias != nullptr ? y[i] + bias[c] : y[i];
      out[i] = x != nullptr ? xv + yb : yb;
    }
  }
}

__global__ void residual_backward_kernel(float* dy, const float* dout, const uint8_t* mask,
                                         int64_t n, float keep_scale) {
  PARASOL_GRID_STRIDE(i, n) { dy[i] = mask[i] ? dout[i] * keep_scale : 0.0f; }
}

__global__ void copy_kernel(float* dst, const float* src, int64_t n) {
  PARASOL_GRID_STRIDE(i, n) { dst[i] = src[i]; }
}

}  // namespace

void residual_forward(float* out, uint8_t* mask, const float* x, const float* y, const float* bias,
                      int64_t rows, int64_t cols, float dropout_p, uint64_t seed, cudaStream_t s) {
  if (rows <= 0 || cols <= 0) return;
  // runtime/tensor.h's dropout_threshold.
  uint32_t threshold = 0;
  if (dropout_p > 0.0f) {
    const double t = static_cast<double>(dropout_p) * 4294967296.0;
    threshold = t >= 4294967295.0 ? 0xFFFFFFFFu : static_cast<uint32_t>(t);
  }
  residual_forward_kernel<<<grid_for(rows * cols), kThreads, 0, s>>>(
      out, mask, x, y, bias, rows, cols, dropout_p > 0.0f, threshold, 1.0f / (1.0f - dropout_p),
      seed);
  PARASOL_CUDA_LAUNCHED();
}

void residual_backward(float* dy, const float* dout, const uint8_t* mask, int64_t n,
                       float dropout_p, cudaStream_t s) {
  if (n <= 0) return;
  if (mask != nullptr)
    residual_backward_kernel<<<grid_for(n), kThreads, 0, s>>>(dy, dout, mask, n,
                                                              1.0f / (1.0f - dropout_p));
  else if (dy != dout)
    copy_kernel<<<grid_for(n), kThreads, 0, s>>>(dy, dout, n);
  else
    return;
  PARASOL_CUDA_LAUNCHED();
}

}  // namespace parasol::runtime::cuda
