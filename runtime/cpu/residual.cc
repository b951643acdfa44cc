// defines: CpuBackend::residual_forward, residual_backward: out = x + dropout(y + bias), Megatron's
// bias-dropout-add, with the mask drawn from a seed (runtime/tensor.h) and stored one byte per
// element; the backward scales the gradient by the mask and sums the bias gradient.
#include "core/error.h"
#include "runtime/cpu/cpu_backend.h"
#include "runtime/cpu/vec.h"
#include "runtime/tensor.h"

namespace parasol::runtime {

void CpuBackend::residual_forward(float* out, uint8_t* mask, const float* x, const float* y,
                                  const float* bias, int64_t rows, int64_t cols, float dropout_p,
                                  uint64_t seed) {
  if (dropout_p < 0.0f || dropout_p >= 1.0f)
    throw Error("runtime.residual", "dropout_p must be in [0, 1)");
  const bool drop = dropout_p > 0.0f;
  if (drop && mask == nullptr) throw Error("runtime.residual", "dropout needs a mask buffer");
  const uint32_t threshold = dropout_threshold(dropout_p);
  const float keep_scale = 1.0f / (1.0f - dropout_p);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t base = r * cols;
    float* o = out + base;
    const float* yr = y + base;
    const float* xr = x != nullptr ? x + base : nullptr;
    if (drop) {
      uint8_t* m = mask + base;
      for (int64_t c = 0; c < cols; ++c)
        m[c] = dropout_keep(seed, static_cast<uint64_t>(base + c), threshold) ? 1 : 0;
      for (int64_t c = 0; c < cols; ++c) {
        const float val = (yr[c] + (bias ? bias[c] : 0.0f)) * (m[c] ? keep_scale : 0.0f);
        o[c] = (xr ? xr[c] : 0.0f) + val;
      }
    } else if (xr != nullptr && bias != nullptr) {
      for (int64_t c = 0; c < cols; ++c) o[c] = xr[c] + (yr[c] + bias[c]);
    } else if (xr != nullptr) {
      for (int64_t c = 0; c < cols; ++c) o[c] = xr[c] + yr[c];
    } else if (bias != nullptr) {
      for (int64_t c = 0; c < cols; ++c) o[c] = yr[c] + bias[c];
    } else if (o != yr) {
      for (int64_t c = 0; c < cols; ++c) o[c] = yr[c];
    }
  }
}

void CpuBackend::residual_backward(float* dy, float* dbias, const float* dout, const uint8_t* mask,
                                   int64_t rows, int64_t cols, float dropout_p) {
  const int64_t n = rows * cols;
  if (mask != nullptr) {
    const float keep_scale = 1.0f / (1.0f - dropout_p);
    for (int64_t i = 0; i < n; ++i) dy[i] = mask[i] ? dout[i] * keep_scale : 0.0f;
  } else if (dy != dout) {
    for (int64_t i = 0; i < n; ++i) dy[i] = dout[i];
  }
  if (dbias != nullptr) cpu::add_column_sums(dbias, dy, rows, cols);
}

}  // namespace parasol::runtime
