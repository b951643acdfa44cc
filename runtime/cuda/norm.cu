// defines: cuda::norm_forward, norm_backward (runtime/cpu/norm.cc's kernels on the GPU) for
// layernorm and rmsnorm: one block per row with deterministic block reductions (two passes for
// the layernorm variance, as the CPU); the backward recomputes each row's statistics, sums the
// weight and bias gradients over rows in fixed chunks (deterministic), then writes dx.
#include "runtime/cuda/cuda_common.cuh"

namespace parasol::runtime::cuda {

namespace {

// stats[2r] = mean (0 for rmsnorm), stats[2r + 1] = rstd.
__device__ inline void row_stats(bool layer, const float* xr, int64_t cols, float eps, float* red,
                                 float& mean, float& rstd) {
  const float inv = 1.0f / static_cast<float>(cols);
  float s = 0.0f;
  if (layer) {
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) s += xr[c];
    mean = block_sum(s, red) * inv;
    s = 0.0f;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
      const float dv = xr[c] - mean;
      s += dv * dv;
    }
    rstd = 1.0f / sqrtf(block_sum(s, red) * inv + eps);
  } else {
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) s += xr[c] * xr[c];
    mean = 0.0f;
    rstd = 1.0f / sqrtf(block_sum(s, red) * inv + eps);
  }
}

__global__ void norm_forward_kernel(bool layer, float* out, const float* x, const float* weight,
                                    const float* bias, int64_t cols, float eps) {
  __shared__ float red[32];
  const int64_t r = blockIdx.x;
  const float* xr = x + r * cols;
  float mean, rstd;
  row_stats(layer, xr, cols, eps, red, mean, rstd);
  float* o = out + r * cols;
  const bool with_bias = layer && bias != nullptr;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const float y = (xr[c] - mean) * rstd * weight[c];
    o[c] = with_bias ? y + bias[c] : y;
  }
}

__global__ void norm_stats_kernel(bool layer, float* stats, const float* x, int64_t cols,
                                  float eps) {
  __shared__ float red[32];
  const int64_t r = blockIdx.x;
  float mean, rstd;
  row_stats(layer, x + r * cols, cols, eps, red, mean, rstd);
  if (threadIdx.x == 0) {
    stats[2 * r] = mean;
    stats[2 * r + 1] = rstd;
  }
}

// dweight's term: dout[r][c] * xhat[r][c].
struct WeightGradTerm {
  const float* dout;
  const float* x;
  const float* stats;
  int64_t cols;
  __device__ float operator()(int64_t r, int64_t c) const {
    const float xhat = (x[r * cols + c] - stats[2 * r]) * stats[2 * r + 1];
    return dout[r * cols + c] * xhat;
  }
};

__global__ void norm_dx_kernel(bool layer, float* dx, const float* dout, const float* x,
                               const float* weight, const float* dresidual, const float* stats,
                               int64_t cols) {
  __shared__ float red[32];
  const int64_t r = blockIdx.x;
  const float mean = stats[2 * r], rstd = stats[2 * r + 1];
  const float* xr = x + r * cols;
  const float* g = dout + r * cols;
  const float inv = 1.0f / static_cast<float>(cols);
  float s_dn = 0.0f, s_dnx = 0.0f;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const float dn = g[c] * weight[c];
    s_dn += dn;
    s_dnx += dn * ((xr[c] - mean) * rstd);
  }
  const float mean_dn = layer ? block_sum(s_dn, red) * inv : 0.0f;
  const float mean_dnx = block_sum(s_dnx, red) * inv;
  float* d = dx + r * cols;
  const float* res = dresidual != nullptr ? dresidual + r * cols : nullptr;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const float xhat = (xr[c] - mean) * rstd;
    const float v = rstd * (g[c] * weight[c] - mean_dn - xhat * mean_dnx);
    d[c] = res != nullptr ? v + res[c] : v;  // dx may alias dresidual: read, then write
  }
}

int threads_for_row(int64_t cols) { return cols >= 512 ? 256 : (cols >= 128 ? 128 : 64); }

}  // namespace

void norm_forward(bool layer, float* out, const float* x, const float* weight, const float* bias,
                  int64_t rows, int64_t cols, float eps, cudaStream_t s) {
  if (rows <= 0 || cols <= 0) return;
  norm_forward_kernel<<<static_cast<unsigned>(rows), threads_for_row(cols), 0, s>>>(
      layer, out, x, weight, bias, cols, eps);
  PARASOL_CUDA_LAUNCHED();
}

int64_t norm_backward_scratch(int64_t rows, int64_t cols) {
  return 2 * rows + column_chunks(rows) * cols;
}

void norm_backward(bool layer, float* dx, float* dweight, float* dbias, const float* dout,
                   const float* x, const float* weight, const float* dresidual, int64_t rows,
                   int64_t cols, float eps, float* scratch, cudaStream_t s) {
  if (rows <= 0 || cols <= 0) return;
  float* stats = scratch;
  float* partial = scratch + 2 * rows;
  const unsigned grid = static_cast<unsigned>(rows);
  norm_stats_kernel<<<grid, threads_for_row(cols), 0, s>>>(layer, stats, x, cols, eps);
  PARASOL_CUDA_LAUNCHED();
  // Parameter gradients first: they read dout, which dx must not alias anyway.
  if (dweight != nullptr)
    add_column_sums_of(dweight, partial, WeightGradTerm{dout, x, stats, cols}, rows, cols, s);
  if (layer && dbias != nullptr)
    add_column_sums_of(dbias, partial, PlainTerm{dout, cols}, rows, cols, s);
  norm_dx_kernel<<<grid, threads_for_row(cols), 0, s>>>(layer, dx, dout, x, weight, dresidual,
                                                        stats, cols);
  PARASOL_CUDA_LAUNCHED();
}

}  // namespace parasol::runtime::cuda
