// defines: CpuBackend::adamw (one AdamW step with bias correction and decoupled weight decay,
// gradients scaled by the clip factor), grad_sumsq (the squared gradient norm of one buffer,
// accumulated into a scalar) and clip_scale (the global-norm clipping factor).
#include <cmath>

#include "core/error.h"
#include "runtime/cpu/cpu_backend.h"

namespace parasol::runtime {

void CpuBackend::adamw(const AdamWConfig& c, float* param, float* m, float* v, const float* grad,
                       int64_t n, const float* grad_scale) {
  if (c.step < 1) throw Error("runtime.adamw", "step must be >= 1 (bias correction)");
  const float scale = grad_scale != nullptr ? *grad_scale : 1.0f;
  // Constants in double, then rounded once: 1 - beta2 in fp32 arithmetic would lose digits.
  const auto bc1 = static_cast<float>(1.0 - std::pow(c.beta1, static_cast<double>(c.step)));
  const auto bc2 = static_cast<float>(1.0 - std::pow(c.beta2, static_cast<double>(c.step)));
  const auto b1 = static_cast<float>(c.beta1), b2 = static_cast<float>(c.beta2);
  const auto one_b1 = static_cast<float>(1.0 - c.beta1), one_b2 = static_cast<float>(1.0 - c.beta2);
  const auto lr = static_cast<float>(c.lr), eps = static_cast<float>(c.eps);
  const auto wd = static_cast<float>(c.weight_decay);
  for (int64_t i = 0; i < n; ++i) {
    const float g = grad[i] * scale;
    const float mi = b1 * m[i] + one_b1 * g;
    const float vi = b2 * v[i] + one_b2 * g * g;
    m[i] = mi;
    v[i] = vi;
    const float update = (mi / bc1) / (std::sqrt(vi / bc2) + eps);
    param[i] -= lr * (update + wd * param[i]);
  }
}

void CpuBackend::grad_sumsq(float* sumsq, const float* grad, int64_t n) {
  constexpr int kLanes = 8;
  double acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) {
      const double g = grad[i + j];
      acc[j] += g * g;
    }
  double s = 0.0;
  for (double a : acc) s += a;
  for (; i < n; ++i) s += static_cast<double>(grad[i]) * grad[i];
  *sumsq = static_cast<float>(static_cast<double>(*sumsq) + s);
}

void CpuBackend::clip_scale(float* scale, const float* sumsq, float max_norm, float loss_scale) {
  const double norm = std::sqrt(static_cast<double>(*sumsq)) / loss_scale;
  const double clip = max_norm > 0.0f && norm > max_norm ? max_norm / (norm + 1e-6) : 1.0;
  *scale = static_cast<float>(clip / loss_scale);
}

}  // namespace parasol::runtime
