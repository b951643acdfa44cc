// defines: CpuBackend::norm_forward, norm_backward for layernorm and rmsnorm over the last
// dimension. The backward recomputes each row's statistics from x (the Program saves the norm
// input, not mean/rstd) and adds the residual gradient (dx = dnorm + dresidual).
#include <cmath>
#include <vector>

#include "runtime/cpu/cpu_backend.h"
#include "runtime/cpu/vec.h"

namespace parasol::runtime {

namespace {

struct RowStats {
  float mean, rstd;
};

RowStats row_stats(Norm kind, const float* x, int64_t cols, float eps) {
  const float inv = 1.0f / static_cast<float>(cols);
  if (kind == Norm::kLayerNorm) {
    const float mean = cpu::sum(x, cols) * inv;
    const float var = cpu::sum_sq_dev(x, mean, cols) * inv;
    return {mean, 1.0f / std::sqrt(var + eps)};
  }
  const float ms = cpu::dot(x, x, cols) * inv;
  return {0.0f, 1.0f / std::sqrt(ms + eps)};
}

}  // namespace

void CpuBackend::norm_forward(Norm kind, float* out, const float* x, const float* weight,
                              const float* bias, int64_t rows, int64_t cols, float eps) {
  const bool layer = kind == Norm::kLayerNorm;
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * cols;
    float* o = out + r * cols;
    const RowStats s = row_stats(kind, xr, cols, eps);
    if (layer && bias != nullptr) {
      for (int64_t c = 0; c < cols; ++c) o[c] = (xr[c] - s.mean) * s.rstd * weight[c] + bias[c];
    } else {
      for (int64_t c = 0; c < cols; ++c) o[c] = (xr[c] - s.mean) * s.rstd * weight[c];
    }
  }
}

void CpuBackend::norm_backward(Norm kind, float* dx, float* dweight, float* dbias,
                               const float* dout, const float* x, const float* weight,
                               const float* dresidual, int64_t rows, int64_t cols, float eps) {
  const bool layer = kind == Norm::kLayerNorm;
  const float inv = 1.0f / static_cast<float>(cols);
  std::vector<float> xhat(cols), dn(cols);
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * cols;
    const float* g = dout + r * cols;
    const RowStats s = row_stats(kind, xr, cols, eps);
    for (int64_t c = 0; c < cols; ++c) {
      xhat[c] = (xr[c] - s.mean) * s.rstd;
      dn[c] = g[c] * weight[c];
    }
    // Parameter gradients.
    if (dweight != nullptr)
      for (int64_t c = 0; c < cols; ++c) dweight[c] += g[c] * xhat[c];
    if (layer && dbias != nullptr)
      for (int64_t c = 0; c < cols; ++c) dbias[c] += g[c];
    // dx = rstd * (dn - mean(dn) - xhat * mean(dn * xhat)); rmsnorm has no mean(dn) term.
    const float mean_dn = layer ? cpu::sum(dn.data(), cols) * inv : 0.0f;
    const float mean_dnx = cpu::dot(dn.data(), xhat.data(), cols) * inv;
    float* d = dx + r * cols;
    const float* res = dresidual != nullptr ? dresidual + r * cols : nullptr;
    if (res != nullptr) {
      for (int64_t c = 0; c < cols; ++c)
        d[c] = s.rstd * (dn[c] - mean_dn - xhat[c] * mean_dnx) + res[c];
    } else {
      for (int64_t c = 0; c < cols; ++c) d[c] = s.rstd * (dn[c] - mean_dn - xhat[c] * mean_dnx);
    }
  }
}

}  // namespace parasol::runtime
