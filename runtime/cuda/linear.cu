// defines: the non-GEMM parts of the linear layers (runtime/cpu/linear.cc's family): bias
// broadcast and add, deterministic column sums (bias gradients), and C = beta C for empty GEMMs.
// The GEMMs are CudaBackend::gemm (cuBLASLt); linear_* and the grouped expert GEMMs (one cuBLASLt
// call per expert, counts on the host) are composed in backend_ops.cc.
#include "runtime/cuda/cuda_common.cuh"

namespace parasol::runtime::cuda {

namespace {

__global__ void scale_kernel(float* c, int64_t m, int64_t n, int64_t ldc, float beta) {
  PARASOL_GRID_STRIDE(i, m * n) {
    float* x = c + (i / n) * ldc + i % n;
    *x = beta == 0.0f ? 0.0f : beta * *x;
  }
}

__global__ void broadcast_kernel(float* out, const float* bias, int64_t rows, int64_t cols) {
  PARASOL_GRID_STRIDE(i, rows * cols) { out[i] = bias[i % cols]; }
}

__global__ void bias_add_kernel(float* out, const float* bias, int64_t rows, int64_t cols) {
  PARASOL_GRID_STRIDE(i, rows * cols) { out[i] += bias[i % cols]; }
}

}  // namespace

void scale_matrix(float* c, int64_t m, int64_t n, int64_t ldc, float beta, cudaStream_t s) {
  if (m <= 0 || n <= 0 || beta == 1.0f) return;
  scale_kernel<<<grid_for(m * n), kThreads, 0, s>>>(c, m, n, ldc, beta);
  PARASOL_CUDA_LAUNCHED();
}

void broadcast_rows(float* out, const float* bias, int64_t rows, int64_t cols, cudaStream_t s) {
  if (rows <= 0 || cols <= 0) return;
  broadcast_kernel<<<grid_for(rows * cols), kThreads, 0, s>>>(out, bias, rows, cols);
  PARASOL_CUDA_LAUNCHED();
}

void bias_forward(float* out, const float* bias, int64_t rows, int64_t cols, cudaStream_t s) {
  if (rows <= 0 || cols <= 0) return;
  bias_add_kernel<<<grid_for(rows * cols), kThreads, 0, s>>>(out, bias, rows, cols);
  PARASOL_CUDA_LAUNCHED();
}

int64_t column_sums_scratch(int64_t rows, int64_t cols) { return column_chunks(rows) * cols; }

void add_column_sums(float* out, const float* x, int64_t rows, int64_t cols, float* scratch,
                     cudaStream_t s) {
  add_column_sums_of(out, scratch, PlainTerm{x, cols}, rows, cols, s);
}

}  // namespace parasol::runtime::cuda
