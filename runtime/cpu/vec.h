// Vector building blocks of the CPU kernels, written so that the compiler vectorises them without
// -ffast-math: reductions over 16 independent partial sums (a plain `s += x[i]` loop stays
// serial; partial sums are also more accurate than one running sum), and an exp with no libm
// call (glibc's expf is scalar). The runtime is compiled with -fno-trapping-math, which lets the
// compiler turn the selects of exp_fast into vector blends.
//
// PARASOL_CPU_CLONES marks a function whose loops are worth compiling twice, for the x86-64
// baseline (SSE2) and for x86-64-v3 (AVX2, FMA), the better one picked when the program loads
// (GCC's function multiversioning); elsewhere it is empty.
#pragma once

#include <bit>
#include <cstdint>
#include <limits>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && defined(__linux__)
#define PARASOL_CPU_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define PARASOL_CPU_CLONES
#endif

namespace parasol::runtime::cpu {

inline constexpr int kLanes = 16;

inline float lanes_total(const float* acc) {
  float s = 0.0f;
  for (int j = 0; j < kLanes; ++j) s += acc[j];
  return s;
}

// sum_i x[i]
inline float sum(const float* __restrict x, int64_t n) {
  float acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) acc[j] += x[i + j];
  float s = lanes_total(acc);
  for (; i < n; ++i) s += x[i];
  return s;
}

// max_i x[i] (-inf for n = 0; NaNs are not propagated).
inline float max(const float* __restrict x, int64_t n) {
  float acc[kLanes];
  for (int j = 0; j < kLanes; ++j) acc[j] = -std::numeric_limits<float>::infinity();
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) acc[j] = x[i + j] > acc[j] ? x[i + j] : acc[j];
  float m = acc[0];
  for (int j = 1; j < kLanes; ++j) m = acc[j] > m ? acc[j] : m;
  for (; i < n; ++i) m = x[i] > m ? x[i] : m;
  return m;
}

// sum_i x[i] * y[i]
inline float dot(const float* __restrict x, const float* __restrict y, int64_t n) {
  float acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) acc[j] += x[i + j] * y[i + j];
  float s = lanes_total(acc);
  for (; i < n; ++i) s += x[i] * y[i];
  return s;
}

// sum_i (x[i] - c)^2
inline float sum_sq_dev(const float* __restrict x, float c, int64_t n) {
  float acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) {
      const float d = x[i + j] - c;
      acc[j] += d * d;
    }
  float s = lanes_total(acc);
  for (; i < n; ++i) s += (x[i] - c) * (x[i] - c);
  return s;
}

// sum_i x[i] * y[i] * z[i]
inline float dot3(const float* __restrict x, const float* __restrict y, const float* __restrict z,
                  int64_t n) {
  float acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) acc[j] += x[i + j] * y[i + j] * z[i + j];
  float s = lanes_total(acc);
  for (; i < n; ++i) s += x[i] * y[i] * z[i];
  return s;
}

// sum_i x[i] accumulated in double (softmax denominators over a vocabulary).
inline double sum_f64(const float* __restrict x, int64_t n) {
  constexpr int kD = 8;
  double acc[kD] = {};
  int64_t i = 0;
  for (; i + kD <= n; i += kD)
    for (int j = 0; j < kD; ++j) acc[j] += x[i + j];
  double s = 0.0;
  for (int j = 0; j < kD; ++j) s += acc[j];
  for (; i < n; ++i) s += x[i];
  return s;
}

// e^x within 1e-7 relative (Cephes' expf: x = n ln2 + r, |r| <= ln2 / 2, a degree-7 polynomial
// for e^r, 2^n from the exponent bits). e^x = 0 below -87.34 (also for -inf), +inf above 88.72,
// NaN for NaN.
inline float exp_fast(float x) {
  constexpr float kLo = -87.3365f, kHi = 88.7228f;
  constexpr float kLog2e = 1.44269504088896341f, kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  // NaN clamps to kLo (every comparison with it is false), so that n below is finite: the
  // float-to-int conversion of a NaN is undefined behaviour. The NaN itself is returned at the end.
  float xc = x >= kLo ? x : kLo;
  xc = xc > kHi ? kHi : xc;
  const float n = (xc * kLog2e + kRound) - kRound;
  const float r = (xc - n * kLn2Hi) - n * kLn2Lo;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  // 2^n for n in [-126, 128]: n = 128 (x within 0.35 of the overflow threshold) as 2^127 * 2.
  const float n_hi = n > 127.0f ? 127.0f : n;
  const auto e = static_cast<uint32_t>(static_cast<int32_t>(n_hi) + 127);
  float y = p * std::bit_cast<float>(e << 23) * (n > 127.0f ? 2.0f : 1.0f);
  y = x < kLo ? 0.0f : y;
  y = x > kHi ? std::numeric_limits<float>::infinity() : y;
  return x != x ? x : y;
}

// x[i] = e^(x[i] - c).
inline void exp_shifted(float* __restrict x, float c, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = exp_fast(x[i] - c);
}

// 1 / (1 + e^-x).
inline float sigmoid(float x) { return 1.0f / (1.0f + exp_fast(-x)); }

// Column sums: out[c] += sum_r x[r][c] over [rows x cols].
inline void add_column_sums(float* __restrict out, const float* __restrict x, int64_t rows,
                            int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * cols;
    for (int64_t c = 0; c < cols; ++c) out[c] += xr[c];
  }
}

}  // namespace parasol::runtime::cpu
