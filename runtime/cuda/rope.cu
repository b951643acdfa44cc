// defines: cuda::rope (runtime/cpu/rope.cc's kernel on the GPU): one thread per (row, head,
// pair); the angle is formed in double as on the CPU (pow, sin, cos), then rounded to fp32.
#include "runtime/cuda/cuda_common.cuh"

namespace parasol::runtime::cuda {

namespace {

__global__ void rope_kernel(float* x, int64_t ld, int64_t rows, int64_t seq, int64_t pos_offset,
                            int64_t heads, int64_t head_dim, double theta, double sign) {
  const int64_t half = head_dim / 2;
  PARASOL_GRID_STRIDE(i, rows * heads * half) {
    const int64_t j = i % half, h = (i / half) % heads, t = i / (half * heads);
    const double angle = static_cast<double>(t % seq + pos_offset) *
                         pow(theta, -2.0 * static_cast<double>(j) / static_cast<double>(head_dim));
    const float c = static_cast<float>(cos(angle)), s = static_cast<float>(sign * sin(angle));
    float* a = x + t * ld + h * head_dim + j;
    float* b = a + half;
    const float u = *a, v = *b;
    *a = u * c - v * s;
    *b = u * s + v * c;
  }
}

}  // namespace

void rope(float* x, int64_t ld, int64_t rows, int64_t seq, int64_t pos_offset, int64_t heads,
          int64_t head_dim, double theta, bool inverse, cudaStream_t s) {
  const int64_t n = rows * heads * (head_dim / 2);
  if (n <= 0) return;
  rope_kernel<<<grid_for(n), kThreads, 0, s>>>(x, ld, rows, seq, pos_offset, heads, head_dim, theta,
                                               inverse ? -1.0 : 1.0);
  PARASOL_CUDA_LAUNCHED();
}

}  // namespace parasol::runtime::cuda
