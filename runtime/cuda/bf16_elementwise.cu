// defines: cuda::bias_act_bf16, gelu_backward_bf16, swiglu_forward_bf16, swiglu_backward_bf16,
// residual_forward_bf16, add_column_sums_bf16, add_f32: the element-wise kernels on bf16 storage
// (fp32 math in registers, 8 elements per 16-byte access where the rows allow: bf16_vec.cuh), the
// counterparts of activation.cu, residual.cu and linear.cu's bias kernels, and the separate
// kernels of a cuBLASLt epilogue that could not be fused (gemm_bf16.cc).
#include "runtime/cuda/bf16_vec.cuh"

namespace parasol::runtime::cuda {

namespace {

constexpr int kV = kBf16Vec;

// One thread per 8 columns of a row: (row, c0) of the grid-stride index i over rows * groups.
struct Groups {
  int64_t cols, groups;
  __device__ void at(int64_t i, int64_t& r, int64_t& c0) const {
    r = i / groups;
    c0 = (i % groups) * kV;
  }
};
Groups groups_of(int64_t cols) { return Groups{cols, (cols + kV - 1) / kV}; }

__global__ void bias_act_kernel(uint16_t* x, int64_t ld, uint16_t* pre, const uint16_t* bias,
                                bool gelu, int64_t rows, Groups g, bool aligned) {
  PARASOL_GRID_STRIDE(i, rows * g.groups) {
    int64_t r, c0;
    g.at(i, r, c0);
    float v[kV], b[kV];
    load_bf16x8(v, x + r * ld, c0, g.cols, aligned);
    if (bias != nullptr) {
      load_bf16x8(b, bias, c0, g.cols, aligned);
#pragma unroll
      for (int k = 0; k < kV; ++k) v[k] += b[k];
    }
    if (pre != nullptr) store_bf16x8(pre + r * g.cols, v, c0, g.cols, aligned);
    if (gelu) {
#pragma unroll
      for (int k = 0; k < kV; ++k) v[k] = gelu_of(v[k]);
    }
    store_bf16x8(x + r * ld, v, c0, g.cols, aligned);
  }
}

__global__ void gelu_backward_kernel(uint16_t* din, const uint16_t* dout, const uint16_t* in,
                                     int64_t n, bool aligned) {
  PARASOL_GRID_STRIDE(i, (n + kV - 1) / kV) {
    const int64_t c0 = i * kV;
    float d[kV], x[kV];
    load_bf16x8(d, dout, c0, n, aligned);
    load_bf16x8(x, in, c0, n, aligned);
#pragma unroll
    for (int k = 0; k < kV; ++k) d[k] *= gelu_grad_of(x[k]);
    store_bf16x8(din, d, c0, n, aligned);
  }
}

__global__ void swiglu_forward_kernel(uint16_t* out, const uint16_t* in, int64_t rows, Groups g,
                                      bool aligned) {
  PARASOL_GRID_STRIDE(i, rows * g.groups) {
    int64_t r, c0;
    g.at(i, r, c0);
    float gate[kV], up[kV];
    load_bf16x8(gate, in + r * 2 * g.cols, c0, g.cols, aligned);
    load_bf16x8(up, in + r * 2 * g.cols + g.cols, c0, g.cols, aligned);
#pragma unroll
    for (int k = 0; k < kV; ++k) gate[k] = gate[k] * sigmoidf_acc(gate[k]) * up[k];
    store_bf16x8(out + r * g.cols, gate, c0, g.cols, aligned);
  }
}

__global__ void swiglu_backward_kernel(uint16_t* din, const uint16_t* dout, const uint16_t* in,
                                       int64_t rows, Groups g, bool aligned) {
  PARASOL_GRID_STRIDE(i, rows * g.groups) {
    int64_t r, c0;
    g.at(i, r, c0);
    float gate[kV], up[kV], d[kV], dg[kV], du[kV];
    load_bf16x8(gate, in + r * 2 * g.cols, c0, g.cols, aligned);
    load_bf16x8(up, in + r * 2 * g.cols + g.cols, c0, g.cols, aligned);
    load_bf16x8(d, dout + r * g.cols, c0, g.cols, aligned);
#pragma unroll
    for (int k = 0; k < kV; ++k) {
      const float s = sigmoidf_acc(gate[k]);
      dg[k] = d[k] * up[k] * s * (1.0f + gate[k] * (1.0f - s));
      du[k] = d[k] * gate[k] * s;
    }
    store_bf16x8(din + r * 2 * g.cols, dg, c0, g.cols, aligned);
    store_bf16x8(din + r * 2 * g.cols + g.cols, du, c0, g.cols, aligned);
  }
}

__global__ void residual_kernel(uint16_t* out, const uint16_t* x, const uint16_t* y,
                                const uint16_t* bias, int64_t rows, Groups g, bool aligned) {
  PARASOL_GRID_STRIDE(i, rows * g.groups) {
    int64_t r, c0;
    g.at(i, r, c0);
    float v[kV], t[kV];
    load_bf16x8(v, y + r * g.cols, c0, g.cols, aligned);
    if (bias != nullptr) {  // y + bias first, as the CPU's x + (y + bias)
      load_bf16x8(t, bias, c0, g.cols, aligned);
#pragma unroll
      for (int k = 0; k < kV; ++k) v[k] += t[k];
    }
    if (x != nullptr) {
      load_bf16x8(t, x + r * g.cols, c0, g.cols, aligned);
#pragma unroll
      for (int k = 0; k < kV; ++k) v[k] = t[k] + v[k];
    }
    store_bf16x8(out + r * g.cols, v, c0, g.cols, aligned);
  }
}

struct Bf16Term {
  const uint16_t* x;
  int64_t cols;
  __device__ float operator()(int64_t r, int64_t c) const { return bf16_to_fp32(x[r * cols + c]); }
};

__global__ void add_f32_kernel(float* out, const float* in, int64_t n) {
  PARASOL_GRID_STRIDE(i, n) { out[i] += in[i]; }
}

}  // namespace

void bias_act_bf16(uint16_t* x, int64_t ld, uint16_t* pre, const uint16_t* bias, bool gelu,
                   int64_t rows, int64_t cols, cudaStream_t s) {
  if (rows <= 0 || cols <= 0) return;
  const Groups g = groups_of(cols);
  const bool al = bf16_rows_aligned(x, ld, cols) && bf16_rows_aligned(pre, cols, cols) &&
                  bf16_rows_aligned(bias, cols, cols);
  bias_act_kernel<<<grid_for(rows * g.groups), kThreads, 0, s>>>(x, ld, pre, bias, gelu, rows, g,
                                                                 al);
  PARASOL_CUDA_LAUNCHED();
}

void gelu_backward_bf16(uint16_t* din, const uint16_t* dout, const uint16_t* in, int64_t n,
                        cudaStream_t s) {
  if (n <= 0) return;
  const bool al =
      bf16_rows_aligned(din, n, n) && bf16_rows_aligned(dout, n, n) && bf16_rows_aligned(in, n, n);
  gelu_backward_kernel<<<grid_for((n + kV - 1) / kV), kThreads, 0, s>>>(din, dout, in, n, al);
  PARASOL_CUDA_LAUNCHED();
}

void swiglu_forward_bf16(uint16_t* out, const uint16_t* in, int64_t rows, int64_t cols,
                         cudaStream_t s) {
  if (rows <= 0 || cols <= 0) return;
  const Groups g = groups_of(cols);
  const bool al = bf16_rows_aligned(out, cols, cols) && bf16_rows_aligned(in, 2 * cols, cols);
  swiglu_forward_kernel<<<grid_for(rows * g.groups), kThreads, 0, s>>>(out, in, rows, g, al);
  PARASOL_CUDA_LAUNCHED();
}

void swiglu_backward_bf16(uint16_t* din, const uint16_t* dout, const uint16_t* in, int64_t rows,
                          int64_t cols, cudaStream_t s) {
  if (rows <= 0 || cols <= 0) return;
  const Groups g = groups_of(cols);
  const bool al = bf16_rows_aligned(din, 2 * cols, cols) && bf16_rows_aligned(dout, cols, cols) &&
                  bf16_rows_aligned(in, 2 * cols, cols);
  swiglu_backward_kernel<<<grid_for(rows * g.groups), kThreads, 0, s>>>(din, dout, in, rows, g, al);
  PARASOL_CUDA_LAUNCHED();
}

void residual_forward_bf16(uint16_t* out, const uint16_t* x, const uint16_t* y,
                           const uint16_t* bias, int64_t rows, int64_t cols, cudaStream_t s) {
  if (rows <= 0 || cols <= 0) return;
  const Groups g = groups_of(cols);
  const bool al = bf16_rows_aligned(out, cols, cols) && bf16_rows_aligned(x, cols, cols) &&
                  bf16_rows_aligned(y, cols, cols) && bf16_rows_aligned(bias, cols, cols);
  residual_kernel<<<grid_for(rows * g.groups), kThreads, 0, s>>>(out, x, y, bias, rows, g, al);
  PARASOL_CUDA_LAUNCHED();
}

void add_column_sums_bf16(float* out, const uint16_t* x, int64_t rows, int64_t cols, float* scratch,
                          cudaStream_t s) {
  add_column_sums_of(out, scratch, Bf16Term{x, cols}, rows, cols, s);
}

void add_f32(float* out, const float* in, int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  add_f32_kernel<<<grid_for(n), kThreads, 0, s>>>(out, in, n);
  PARASOL_CUDA_LAUNCHED();
}

}  // namespace parasol::runtime::cuda
