// defines: cuda::adamw, grad_sumsq, clip_scale (runtime/cpu/adamw.cc's kernels on the GPU). The
// AdamW constants are rounded to fp32 on the host exactly as the CPU does; the update is one
// thread per element with IEEE division and sqrtf. grad_sumsq is deterministic: a fixed grid of
// kSumsqBlocks blocks accumulates in double, then one block sums the partials in order.
#include "runtime/cuda/cuda_common.cuh"

namespace parasol::runtime::cuda {

namespace {

constexpr int kSumsqBlocks = 264;

__global__ void adamw_kernel(AdamWConsts c, float* param, float* m, float* v, const float* grad,
                             int64_t n, const float* grad_scale) {
  const float scale = grad_scale != nullptr ? *grad_scale : 1.0f;
  PARASOL_GRID_STRIDE(i, n) {
    const float g = grad[i] * scale;
    const float mi = c.b1 * m[i] + c.one_b1 * g;
    const float vi = c.b2 * v[i] + c.one_b2 * g * g;
    m[i] = mi;
    v[i] = vi;
    const float update = (mi / c.bc1) / (sqrtf(vi / c.bc2) + c.eps);
    param[i] -= c.lr * (update + c.wd * param[i]);
  }
}

__global__ void sumsq_partial_kernel(double* partial, const float* grad, int64_t n) {
  __shared__ double red[32];
  double s = 0.0;
  PARASOL_GRID_STRIDE(i, n) {
    const double g = grad[i];
    s += g * g;
  }
  s = block_sum(s, red);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

__global__ void sumsq_finish_kernel(float* sumsq, const double* partial, int blocks) {
  __shared__ double red[32];
  double s = 0.0;
  for (int b = threadIdx.x; b < blocks; b += blockDim.x) s += partial[b];
  s = block_sum(s, red);
  if (threadIdx.x == 0) *sumsq = static_cast<float>(static_cast<double>(*sumsq) + s);
}

__global__ void clip_scale_kernel(float* scale, const float* sumsq, float max_norm,
                                  float loss_scale) {
  const double norm = sqrt(static_cast<double>(*sumsq)) / loss_scale;
  const double clip = max_norm > 0.0f && norm > max_norm ? max_norm / (norm + 1e-6) : 1.0;
  *scale = static_cast<float>(clip / loss_scale);
}

}  // namespace

void adamw(const AdamWConsts& c, float* param, float* m, float* v, const float* grad, int64_t n,
           const float* grad_scale, cudaStream_t s) {
  if (n <= 0) return;
  adamw_kernel<<<grid_for(n), kThreads, 0, s>>>(c, param, m, v, grad, n, grad_scale);
  PARASOL_CUDA_LAUNCHED();
}

int64_t grad_sumsq_scratch() { return kSumsqBlocks; }

void grad_sumsq(float* sumsq, const float* grad, int64_t n, double* scratch, cudaStream_t s) {
  if (n <= 0) return;
  sumsq_partial_kernel<<<kSumsqBlocks, kThreads, 0, s>>>(scratch, grad, n);
  PARASOL_CUDA_LAUNCHED();
  sumsq_finish_kernel<<<1, kThreads, 0, s>>>(sumsq, scratch, kSumsqBlocks);
  PARASOL_CUDA_LAUNCHED();
}

void clip_scale(float* scale, const float* sumsq, float max_norm, float loss_scale,
                cudaStream_t s) {
  clip_scale_kernel<<<1, 1, 0, s>>>(scale, sumsq, max_norm, loss_scale);
  PARASOL_CUDA_LAUNCHED();
}

}  // namespace parasol::runtime::cuda
