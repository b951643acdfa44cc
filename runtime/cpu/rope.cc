// CpuBackend::rope: the rotary position embedding of Q and K columns, in place; the inverse
// rotation is its backward (runtime/backend.h).
#include <cmath>
#include <vector>

#include "core/error.h"
#include "runtime/cpu/cpu_backend.h"

namespace parasol::runtime {

void CpuBackend::rope(float* x, int64_t ld, int64_t rows, int64_t seq, int64_t pos_offset,
                      int64_t heads, int64_t head_dim, double theta, bool inverse) {
  if (head_dim % 2 != 0 || seq <= 0 || theta <= 0)
    throw Error("runtime.rope", "head_dim must be even, seq and theta positive");
  const int64_t half = head_dim / 2;
  std::vector<double> freq(static_cast<size_t>(half));
  for (int64_t j = 0; j < half; ++j)
    freq[j] = std::pow(theta, -2.0 * static_cast<double>(j) / static_cast<double>(head_dim));
  std::vector<float> c(static_cast<size_t>(half)), s(static_cast<size_t>(half));
  const double sign = inverse ? -1.0 : 1.0;
  for (int64_t t = 0; t < rows; ++t) {
    const double p = static_cast<double>(t % seq + pos_offset);
    for (int64_t j = 0; j < half; ++j) {
      c[j] = static_cast<float>(std::cos(p * freq[j]));
      s[j] = static_cast<float>(sign * std::sin(p * freq[j]));
    }
    float* row = x + t * ld;
    for (int64_t h = 0; h < heads; ++h) {
      float* a = row + h * head_dim;
      float* b = a + half;
      for (int64_t j = 0; j < half; ++j) {
        const float u = a[j], v = b[j];
        a[j] = u * c[j] - v * s[j];
        b[j] = u * s[j] + v * c[j];
      }
    }
  }
}

}  // namespace parasol::runtime
