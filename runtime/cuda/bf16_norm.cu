// defines: cuda::norm_forward_bf16, norm_backward_bf16 (and its scratch size): layernorm and
// rmsnorm on bf16 storage, norm.cu's algorithm (one block per row, deterministic block
// reductions in fp32, two passes for the layernorm variance; the backward recomputes the
// statistics, sums the weight and bias gradients over fixed chunks of rows, then writes dx) with
// 8-wide bf16 accesses (bf16_vec.cuh). The forward can fuse the residual add before the norm (as
// Transformer Engine's and Apex's fused add + norm): the row is x + y rounded to bf16, written to
// sum_out (the residual stream) and normalised.
#include "runtime/cuda/bf16_vec.cuh"

namespace parasol::runtime::cuda {

namespace {

constexpr int kV = kBf16Vec;

// The row's value group at c0: x + y (rounded to bf16) when y is not null, else x.
__device__ inline void row_group(float (&v)[kV], const uint16_t* x, const uint16_t* y, int64_t c0,
                                 int64_t cols, bool al) {
  load_bf16x8(v, x, c0, cols, al);
  if (y != nullptr) {
    float t[kV];
    load_bf16x8(t, y, c0, cols, al);
#pragma unroll
    for (int k = 0; k < kV; ++k) v[k] = bf16_to_fp32(fp32_to_bf16(v[k] + t[k]));
  }
}

#define PARASOL_ROW_GROUPS(c0, cols) \
  for (int64_t c0 = int64_t{threadIdx.x} * kV; c0 < (cols); c0 += int64_t{blockDim.x} * kV)

__device__ inline void stats_of(bool layer, const uint16_t* xr, const uint16_t* yr, int64_t cols,
                                float eps, bool al, float* red, float& mean, float& rstd) {
  const float inv = 1.0f / static_cast<float>(cols);
  float s = 0.0f;
  float v[kV];
  if (layer) {
    PARASOL_ROW_GROUPS(c0, cols) {
      row_group(v, xr, yr, c0, cols, al);
#pragma unroll
      for (int k = 0; k < kV; ++k) s += v[k];  // padding is 0
    }
    mean = block_sum(s, red) * inv;
    s = 0.0f;
    PARASOL_ROW_GROUPS(c0, cols) {
      row_group(v, xr, yr, c0, cols, al);
      for (int k = 0; k < kV && c0 + k < cols; ++k) {
        const float d = v[k] - mean;
        s += d * d;
      }
    }
  } else {
    mean = 0.0f;
    PARASOL_ROW_GROUPS(c0, cols) {
      row_group(v, xr, yr, c0, cols, al);
#pragma unroll
      for (int k = 0; k < kV; ++k) s += v[k] * v[k];
    }
  }
  rstd = 1.0f / sqrtf(block_sum(s, red) * inv + eps);
}

__global__ void forward_kernel(bool layer, uint16_t* out, uint16_t* sum_out, const uint16_t* x,
                               const uint16_t* y, const uint16_t* weight, const uint16_t* bias,
                               int64_t cols, float eps, bool al) {
  __shared__ float red[32];
  const int64_t r = blockIdx.x;
  const uint16_t* xr = x + r * cols;
  const uint16_t* yr = y != nullptr ? y + r * cols : nullptr;
  float mean, rstd;
  stats_of(layer, xr, yr, cols, eps, al, red, mean, rstd);
  const bool with_bias = layer && bias != nullptr;
  PARASOL_ROW_GROUPS(c0, cols) {
    float v[kV], w[kV], b[kV];
    row_group(v, xr, yr, c0, cols, al);
    if (sum_out != nullptr) store_bf16x8(sum_out + r * cols, v, c0, cols, al);
    load_bf16x8(w, weight, c0, cols, al);
    if (with_bias) load_bf16x8(b, bias, c0, cols, al);
#pragma unroll
    for (int k = 0; k < kV; ++k) {
      const float o = (v[k] - mean) * rstd * w[k];
      v[k] = with_bias ? o + b[k] : o;
    }
    store_bf16x8(out + r * cols, v, c0, cols, al);
  }
}

__global__ void stats_kernel(bool layer, float* stats, const uint16_t* x, int64_t cols, float eps,
                             bool al) {
  __shared__ float red[32];
  const int64_t r = blockIdx.x;
  float mean, rstd;
  stats_of(layer, x + r * cols, nullptr, cols, eps, al, red, mean, rstd);
  if (threadIdx.x == 0) {
    stats[2 * r] = mean;
    stats[2 * r + 1] = rstd;
  }
}

struct WeightGradTerm {
  const uint16_t* dout;
  const uint16_t* x;
  const float* stats;
  int64_t cols;
  __device__ float operator()(int64_t r, int64_t c) const {
    const float xhat = (bf16_to_fp32(x[r * cols + c]) - stats[2 * r]) * stats[2 * r + 1];
    return bf16_to_fp32(dout[r * cols + c]) * xhat;
  }
};
struct Bf16Term {
  const uint16_t* x;
  int64_t cols;
  __device__ float operator()(int64_t r, int64_t c) const { return bf16_to_fp32(x[r * cols + c]); }
};

__global__ void dx_kernel(bool layer, uint16_t* dx, const uint16_t* dout, const uint16_t* x,
                          const uint16_t* weight, const uint16_t* dresidual, const float* stats,
                          int64_t cols, bool al) {
  __shared__ float red[32];
  const int64_t r = blockIdx.x;
  const float mean = stats[2 * r], rstd = stats[2 * r + 1];
  const uint16_t* xr = x + r * cols;
  const uint16_t* g = dout + r * cols;
  const float inv = 1.0f / static_cast<float>(cols);
  float s_dn = 0.0f, s_dnx = 0.0f;
  float xv[kV], gv[kV], wv[kV];
  PARASOL_ROW_GROUPS(c0, cols) {
    load_bf16x8(xv, xr, c0, cols, al);
    load_bf16x8(gv, g, c0, cols, al);
    load_bf16x8(wv, weight, c0, cols, al);
    for (int k = 0; k < kV && c0 + k < cols; ++k) {
      const float dn = gv[k] * wv[k];
      s_dn += dn;
      s_dnx += dn * ((xv[k] - mean) * rstd);
    }
  }
  const float mean_dn = layer ? block_sum(s_dn, red) * inv : 0.0f;
  const float mean_dnx = block_sum(s_dnx, red) * inv;
  PARASOL_ROW_GROUPS(c0, cols) {
    float d[kV], res[kV];
    load_bf16x8(xv, xr, c0, cols, al);
    load_bf16x8(gv, g, c0, cols, al);
    load_bf16x8(wv, weight, c0, cols, al);
    if (dresidual != nullptr) load_bf16x8(res, dresidual + r * cols, c0, cols, al);
#pragma unroll
    for (int k = 0; k < kV; ++k) {
      const float xhat = (xv[k] - mean) * rstd;
      const float v = rstd * (gv[k] * wv[k] - mean_dn - xhat * mean_dnx);
      d[k] = dresidual != nullptr ? v + res[k] : v;  // dx may alias dresidual: read, then write
    }
    store_bf16x8(dx + r * cols, d, c0, cols, al);
  }
}

int threads_for(int64_t cols) { return cols >= 4096 ? 256 : (cols >= 1024 ? 128 : 64); }

bool all_aligned(int64_t cols, std::initializer_list<const void*> ps) {
  for (const void* p : ps)
    if (!bf16_rows_aligned(p, cols, cols)) return false;
  return true;
}

}  // namespace

void norm_forward_bf16(bool layer, uint16_t* out, uint16_t* sum_out, const uint16_t* x,
                       const uint16_t* y, const uint16_t* weight, const uint16_t* bias,
                       int64_t rows, int64_t cols, float eps, cudaStream_t s) {
  if (rows <= 0 || cols <= 0) return;
  const bool al = all_aligned(cols, {out, sum_out, x, y, weight, bias});
  forward_kernel<<<static_cast<unsigned>(rows), threads_for(cols), 0, s>>>(
      layer, out, sum_out, x, y, weight, bias, cols, eps, al);
  PARASOL_CUDA_LAUNCHED();
}

int64_t norm_backward_bf16_scratch(int64_t rows, int64_t cols) {
  return 2 * rows + column_chunks(rows) * cols;
}

void norm_backward_bf16(bool layer, uint16_t* dx, float* dweight, float* dbias,
                        const uint16_t* dout, const uint16_t* x, const uint16_t* weight,
                        const uint16_t* dresidual, int64_t rows, int64_t cols, float eps,
                        float* scratch, cudaStream_t s) {
  if (rows <= 0 || cols <= 0) return;
  const bool al = all_aligned(cols, {dx, dout, x, weight, dresidual});
  float* stats = scratch;
  float* partial = scratch + 2 * rows;
  const unsigned grid = static_cast<unsigned>(rows);
  stats_kernel<<<grid, threads_for(cols), 0, s>>>(layer, stats, x, cols, eps, al);
  PARASOL_CUDA_LAUNCHED();
  if (dweight != nullptr)
    add_column_sums_of(dweight, partial, WeightGradTerm{dout, x, stats, cols}, rows, cols, s);
  if (layer && dbias != nullptr)
    add_column_sums_of(dbias, partial, Bf16Term{dout, cols}, rows, cols, s);
  dx_kernel<<<grid, threads_for(cols), 0, s>>>(layer, dx, dout, x, weight, dresidual, stats, cols,
                                               al);
  PARASOL_CUDA_LAUNCHED();
}

}  // namespace parasol::runtime::cuda
