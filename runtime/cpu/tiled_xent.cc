// defines: cpu::xent_tiled_forward, xent_tiled_max, xent_tiled_sums, xent_rescale,
// xent_tiled_backward, xent_tiled_chain, xent_block_chain, xent_sum_rel_bound
// (runtime/cpu/tiled_xent.h): the vocab-tiled cross-entropy on the host, the reference of
// runtime/cuda/xent_tiled.cu; and CpuBackend::xent_*_typed (the executor's tiled loss) on them.
#include "runtime/cpu/tiled_xent.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/error.h"
#include "runtime/cpu/cpu_backend.h"
#include "runtime/tensor.h"

namespace parasol::runtime::cpu {

namespace {

void check_dtype(Dtype d, const char* what) {
  if (d != Dtype::kFp32 && d != Dtype::kBf16)
    throw Error("runtime.xent", std::string(what) + ": logits of dtype " + dtype_name(d) +
                                    " (the tiled cross-entropy takes fp32 or bf16)");
}

struct Fp32Logits {
  const float* p;
  float operator()(int64_t i) const { return p[i]; }
};
struct Bf16Logits {
  const uint16_t* p;
  float operator()(int64_t i) const { return bf16_to_fp32(p[i]); }
};

// The running (M, S) of one row after taking a tile whose maximum is m and shifted sum s.
void merge(float& M, float& S, float m, float s) {
  if (m == -std::numeric_limits<float>::infinity()) return;  // an empty or all -inf tile
  if (m <= M) {
    S += s * std::exp(m - M);
  } else {
    S = S * std::exp(M - m) + s;  // exp(-inf) = 0 for the first tile
    M = m;
  }
}

template <typename L>
void forward_rows(float* row_max, float* sum_exp, float* target, L l, const int32_t* labels,
                  int64_t rows, int64_t vocab, int64_t vocab_start, int64_t tile) {
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t base = r * vocab;
    float M = -std::numeric_limits<float>::infinity(), S = 0.0f;
    for (int64_t t0 = 0; t0 < vocab; t0 += tile) {
      const int64_t t1 = std::min(vocab, t0 + tile);
      float m = -std::numeric_limits<float>::infinity();
      for (int64_t v = t0; v < t1; ++v) m = std::max(m, l(base + v));
      float s = 0.0f;
      if (m != -std::numeric_limits<float>::infinity())
        for (int64_t v = t0; v < t1; ++v) s += std::exp(l(base + v) - m);
      merge(M, S, m, s);
    }
    row_max[r] = M;
    sum_exp[r] = S;
    const int64_t id = static_cast<int64_t>(labels[r]) - vocab_start;
    target[r] = labels[r] >= 0 && id >= 0 && id < vocab ? l(base + id) : 0.0f;
  }
}

}  // namespace

void xent_tiled_forward(float* row_max, float* sum_exp, float* target, const void* logits,
                        Dtype dtype, const int32_t* labels, int64_t rows, int64_t vocab,
                        int64_t vocab_start, int64_t tile) {
  check_dtype(dtype, "xent_tiled_forward");
  if (tile <= 0) throw Error("runtime.xent", "xent_tiled_forward: tile must be positive");
  if (dtype == Dtype::kFp32)
    forward_rows(row_max, sum_exp, target, Fp32Logits{static_cast<const float*>(logits)}, labels,
                 rows, vocab, vocab_start, tile);
  else
    forward_rows(row_max, sum_exp, target, Bf16Logits{static_cast<const uint16_t*>(logits)}, labels,
                 rows, vocab, vocab_start, tile);
}

void xent_tiled_max(float* row_max, const void* logits, Dtype dtype, int64_t rows, int64_t vocab) {
  check_dtype(dtype, "xent_tiled_max");
  for (int64_t r = 0; r < rows; ++r) {
    float m = -std::numeric_limits<float>::infinity();
    for (int64_t v = 0; v < vocab; ++v)
      m = std::max(m, dtype == Dtype::kFp32
                          ? static_cast<const float*>(logits)[r * vocab + v]
                          : bf16_to_fp32(static_cast<const uint16_t*>(logits)[r * vocab + v]));
    row_max[r] = m;
  }
}

void xent_tiled_sums(float* sum_exp, float* target, const void* logits, Dtype dtype,
                     const float* row_max, const int32_t* labels, int64_t rows, int64_t vocab,
                     int64_t vocab_start, int64_t tile) {
  std::vector<float> own(static_cast<size_t>(rows));  // the kernel's registers
  xent_tiled_forward(own.data(), sum_exp, target, logits, dtype, labels, rows, vocab, vocab_start,
                     tile);
  xent_rescale(sum_exp, own.data(), row_max, rows);
}

void xent_rescale(float* sum_exp, const float* local_max, const float* global_max, int64_t rows) {
  for (int64_t r = 0; r < rows; ++r)
    if (sum_exp[r] != 0.0f) sum_exp[r] *= std::exp(local_max[r] - global_max[r]);
}

void xent_tiled_backward(void* dlogits, const void* logits, Dtype dtype, const float* row_max,
                         const float* sum_exp, const int32_t* labels, int64_t rows, int64_t vocab,
                         int64_t vocab_start, float dloss) {
  check_dtype(dtype, "xent_tiled_backward");
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t base = r * vocab;
    const int64_t id = static_cast<int64_t>(labels[r]) - vocab_start;
    const float mx = row_max[r], inv = 1.0f / sum_exp[r];
    for (int64_t v = 0; v < vocab; ++v) {
      float d = 0.0f;
      if (labels[r] >= 0) {
        const float x = dtype == Dtype::kFp32
                            ? static_cast<const float*>(logits)[base + v]
                            : bf16_to_fp32(static_cast<const uint16_t*>(logits)[base + v]);
        d = dloss * (std::exp(x - mx) * inv - (v == id ? 1.0f : 0.0f));
      }
      if (dtype == Dtype::kFp32)
        static_cast<float*>(dlogits)[base + v] = d;
      else
        static_cast<uint16_t*>(dlogits)[base + v] = fp32_to_bf16(d);
    }
  }
}

XentChain xent_tiled_chain(int64_t vocab, int64_t tile) {
  const int64_t t = std::max<int64_t>(1, std::min(tile, vocab));
  const int64_t tiles = (vocab + t - 1) / t;
  // A term: its exp, tile - 1 adds, then at most every later merge rescales it (an exp, a
  // product) and adds (one more rounding) - its own merge included.
  return XentChain{(t - 1) + 2 * tiles, 1 + tiles};
}

XentChain xent_block_chain(int64_t vocab, int threads, int vec) {
  const int64_t per_sweep = int64_t{threads} * vec;
  const int64_t sweeps = (vocab + per_sweep - 1) / per_sweep;
  int levels = 0;  // the warp tree
  for (int o = 16; o > 0; o >>= 1) ++levels;
  const int64_t merges = levels + threads / 32;  // then the warps one after another
  // Per sweep: vec adds into the running sum and a rescale (an exp, a product); per merge of two
  // pairs: a rescale of each side (an exp, a product) and their add.
  return XentChain{sweeps * (vec + 1) + merges * 2, 1 + sweeps + merges};
}

double xent_sum_rel_bound(const XentChain& c, double exp_ulps) {
  const double u = std::ldexp(1.0, -24);
  const double n = static_cast<double>(c.roundings);
  return n * u / (1.0 - n * u) + static_cast<double>(c.exps) * exp_ulps * 2.0 * u;
}

}  // namespace parasol::runtime::cpu

namespace parasol::runtime {

void CpuBackend::xent_max_typed(float* row_max, const void* logits, Dtype dtype, int64_t rows,
                                int64_t vocab) {
  cpu::xent_tiled_max(row_max, logits, dtype, rows, vocab);
}

void CpuBackend::xent_sums_typed(float* sum_exp, float* target, const void* logits, Dtype dtype,
                                 const float* row_max, const int32_t* labels, int64_t rows,
                                 int64_t vocab, int64_t vocab_start) {
  cpu::xent_tiled_sums(sum_exp, target, logits, dtype, row_max, labels, rows, vocab, vocab_start);
}

void CpuBackend::xent_backward_typed(void* dlogits, const void* logits, Dtype dtype,
                                     const float* row_max, const float* sum_exp,
                                     const int32_t* labels, int64_t rows, int64_t vocab,
                                     int64_t vocab_start, float dloss) {
  cpu::xent_tiled_backward(dlogits, logits, dtype, row_max, sum_exp, labels, rows, vocab,
                           vocab_start, dloss);
}

}  // namespace parasol::runtime
