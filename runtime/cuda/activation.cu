// defines: cuda::activation_forward, activation_backward (runtime/cpu/activation.cc's kernels on
// the GPU): gelu (tanh approximation, written as x sigmoid(2u) like the CPU) and swiglu, one
// thread per element, accurate expf (no fast math).
#include "runtime/cuda/bf16_vec.cuh"

namespace parasol::runtime::cuda {

namespace {

__device__ inline float sigmoid(float x) { return sigmoidf_acc(x); }

__global__ void gelu_forward_kernel(float* out, const float* in, int64_t n) {
  PARASOL_GRID_STRIDE(i, n) { out[i] = gelu_of(in[i]); }
}

__global__ void gelu_backward_kernel(float* din, const float* dout, const float* in, int64_t n) {
  PARASOL_GRID_STRIDE(i, n) { din[i] = gelu_grad_of(in[i]) * dout[i]; }
}

__global__ void swiglu_forward_kernel(float* out, const float* in, int64_t rows, int64_t cols) {
  PARASOL_GRID_STRIDE(i, rows * cols) {
    const int64_t r = i / cols, c = i % cols;
    const float g = in[r * 2 * cols + c], u = in[r * 2 * cols + cols + c];
    out[i] = g * sigmoid(g) * u;
  }
}

__global__ void swiglu_backward_kernel(float* din, const float* dout, const float* in, int64_t rows,
                                       int64_t cols) {
  PARASOL_GRID_STRIDE(i, rows * cols) {
    const int64_t r = i / cols, c = i % cols;
    const float g = in[r * 2 * cols + c], u = in[r * 2 * cols + cols + c];
    const float d = dout[i];
    const float s = sigmoid(g);
    din[r * 2 * cols + c] = d * u * s * (1.0f + g * (1.0f - s));
    din[r * 2 * cols + cols + c] = d * g * s;
  }
}

}  // namespace

void activation_forward(bool gelu, float* out, const float* in, int64_t rows, int64_t cols,
                        cudaStream_t s) {
  const int64_t n = rows * cols;
  if (n <= 0) return;
  if (gelu)
    gelu_forward_kernel<<<grid_for(n), kThreads, 0, s>>>(out, in, n);
  else
    swiglu_forward_kernel<<<grid_for(n), kThreads, 0, s>>>(out, in, rows, cols);
  PARASOL_CUDA_LAUNCHED();
}

void activation_backward(bool gelu, float* din, const float* dout, const float* in, int64_t rows,
                         int64_t cols, cudaStream_t s) {
  const int64_t n = rows * cols;
  if (n <= 0) return;
  if (gelu)
    gelu_backward_kernel<<<grid_for(n), kThreads, 0, s>>>(din, dout, in, n);
  else
    swiglu_backward_kernel<<<grid_for(n), kThreads, 0, s>>>(din, dout, in, rows, cols);
  PARASOL_CUDA_LAUNCHED();
}

}  // namespace parasol::runtime::cuda
