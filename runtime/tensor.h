// Numeric helpers every backend (and the tests) share, so that all backends agree bit for bit:
// the dropout mask of a seed (a counter-based hash, no RNG state), and the fp32 <-> bf16 / fp16
// conversions (round to nearest, ties to even) of the storage dtypes.
#pragma once

#include <bit>
#include <cstdint>

namespace parasol::runtime {

// SplitMix64's output function (Steele, Lea & Flood 2014): a bijective 64-bit mix.
constexpr uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// The threshold of dropout probability p in [0, 1): an element is dropped when its 32 random
// bits are below it.
inline uint32_t dropout_threshold(float p) {
  if (p <= 0.0f) return 0;
  const double t = static_cast<double>(p) * 4294967296.0;
  return t >= 4294967295.0 ? 0xFFFFFFFFu : static_cast<uint32_t>(t);
}

// Whether element `index` of the mask drawn with `seed` is kept: the high 32 bits of the
// SplitMix64 stream of `seed` at position index + 1, compared with dropout_threshold(p).
inline bool dropout_keep(uint64_t seed, uint64_t index, uint32_t threshold) {
  return static_cast<uint32_t>(mix64(seed + (index + 1) * 0x9E3779B97F4A7C15ull) >> 32) >=
         threshold;
}

// ---- bf16: the high half of an fp32 ----------------------------------------------------------
inline uint16_t fp32_to_bf16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((x >> 16) | 0x0040u);  // NaN
  const uint32_t rounded = x + 0x7FFFu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(rounded >> 16);
}
inline float bf16_to_fp32(uint16_t h) {
  return std::bit_cast<float>(static_cast<uint32_t>(h) << 16);
}

// ---- fp16 (IEEE binary16) ------------------------------------------------------------------
inline uint16_t fp32_to_fp16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t ax = x & 0x7FFFFFFFu;
  if (ax >= 0x7F800000u)
    return static_cast<uint16_t>(sign | (ax > 0x7F800000u ? 0x7E00u : 0x7C00u));
  if (ax >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);  // >= 65520 rounds to inf
  const int e = static_cast<int>(ax >> 23) - 127;
  const uint32_t mant = ax & 0x7FFFFFu;
  if (e >= -14) {  // normal half
    uint32_t h = (static_cast<uint32_t>(e + 15) << 10) | (mant >> 13);
    const uint32_t rem = mant & 0x1FFFu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // may carry into the exponent
    return static_cast<uint16_t>(sign | h);
  }
  if (e < -25) return static_cast<uint16_t>(sign);
  // Subnormal half: units of 2^-24; the significand m * 2^(e-23) is m >> (-e-1) units.
  const uint32_t m = mant | 0x800000u;
  const int shift = -e - 1;  // 14 .. 24
  uint32_t h = m >> shift;
  const uint32_t rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1);
  if (rem > half || (rem == half && (h & 1u))) ++h;
  return static_cast<uint16_t>(sign | h);
}

inline float fp16_to_fp32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu, mant = h & 0x3FFu;
  if (exp == 0) {
    const float v = static_cast<float>(mant) * 5.9604644775390625e-8f;  // mant * 2^-24, exact
    return std::bit_cast<float>(std::bit_cast<uint32_t>(v) | sign);
  }
  if (exp == 31) return std::bit_cast<float>(sign | 0x7F800000u | (mant << 13));
  return std::bit_cast<float>(sign | ((exp + 112u) << 23) | (mant << 13));
}

}  // namespace parasol::runtime
