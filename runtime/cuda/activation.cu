// defines: cuda::activation_forward, activation_backward (runtime/cpu/activation.cc's kernels on
// the GPU): gelu (tanh approximation, written as x sigmoid(2u) like the CPU) and swiglu, one
// thread per element, accurate expf (no fast math).
#include "runtime/cuda/cuda_common.cuh"

namespace parasol::runtime::cuda {

namespace {

constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluCube = 0.044715f;

__device__ inline float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

__global__ void gelu_forward_kernel(float* out, const float* in, int64_t n) {
  PARASOL_GRID_STRIDE(i, n) {
    const float x = in[i];
    out[i] = x * sigmoid(2.0f * kGeluScale * (x + kGeluCube * x * x * x));
  }
}

__global__ void gelu_backward_kernel(float* din, const float* dout, const float* in, int64_t n) {
  PARASOL_GRID_STRIDE(i, n) {
    const float x = in[i];
    const float s = sigmoid(2.0f * kGeluScale * (x + kGeluCube * x * x * x));
    const float du = kGeluScale * (1.0f + 3.0f * kGeluCube * x * x);
    din[i] = (s + 2.0f * x * s * (1.0f - s) * du) * dout[i];
  }
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
