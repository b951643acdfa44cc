// The vocab-tiled cross-entropy (runtime/cpu/tiled_xent.h) against the untiled formula in double
// on the same (widened) logits: row_max exactly, sum_exp and the loss within the rounding bound
// the header derives (xent_sum_rel_bound of the tiles' chain, exps to kExpUlps ulps), and the
// gradient within that bound plus the rounding of its storage dtype. Rows sorted ascending make
// the running maximum rise in every tile, the worst case of the rescales.
#include "runtime/cpu/tiled_xent.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "runtime/cpu/cpu_backend.h"
#include "runtime/tensor.h"

namespace parasol::runtime::cpu {
namespace {

constexpr double kExpUlps = 1.0;  // glibc's expf: correctly rounded but for ~0.5 ulp cases
const double kU = std::ldexp(1.0, -24);

struct Logits {
  int64_t rows, vocab;
  std::vector<float> wide;     // the values (bf16-representable when bf16)
  std::vector<uint16_t> bf16;  // the stored bf16, when dtype is bf16
  Dtype dtype;
  const void* data() const {
    return dtype == Dtype::kFp32 ? static_cast<const void*>(wide.data())
                                 : static_cast<const void*>(bf16.data());
  }
};

// Logits uniform in [-spread, spread]; every other row sorted ascending.
Logits make(int64_t rows, int64_t vocab, Dtype dtype, float spread, uint32_t seed) {
  Logits l{rows, vocab, std::vector<float>(static_cast<size_t>(rows * vocab)), {}, dtype};
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-spread, spread);
  for (float& x : l.wide) x = u(rng);
  for (int64_t r = 0; r < rows; r += 2)
    std::sort(l.wide.begin() + r * vocab, l.wide.begin() + (r + 1) * vocab);
  if (dtype == Dtype::kBf16) {
    l.bf16.resize(l.wide.size());
    for (size_t i = 0; i < l.wide.size(); ++i) {
      l.bf16[i] = fp32_to_bf16(l.wide[i]);
      l.wide[i] = bf16_to_fp32(l.bf16[i]);
    }
  }
  return l;
}

std::vector<int32_t> labels_for(int64_t rows, int64_t vocab_total, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> lab(static_cast<size_t>(rows));
  for (auto& x : lab) x = static_cast<int32_t>(rng() % vocab_total);
  lab[1] = -1;  // an ignored row
  return lab;
}

struct Ref {
  std::vector<double> max, sum, loss;
};

// The untiled formula over the shard [vocab_start, vocab_start + vocab) of full rows.
Ref reference(const Logits& l, const std::vector<int32_t>& labels) {
  Ref ref;
  for (int64_t r = 0; r < l.rows; ++r) {
    const float* x = l.wide.data() + r * l.vocab;
    double m = -std::numeric_limits<double>::infinity();
    for (int64_t v = 0; v < l.vocab; ++v) m = std::max(m, double{x[v]});
    double s = 0;
    for (int64_t v = 0; v < l.vocab; ++v) s += std::exp(double{x[v]} - m);
    ref.max.push_back(m);
    ref.sum.push_back(s);
    ref.loss.push_back(labels[r] < 0 ? 0.0 : std::log(s) + m - x[labels[r]]);
  }
  return ref;
}

void check_forward(const Logits& l, int64_t tile, const std::string& what) {
  const auto labels = labels_for(l.rows, l.vocab, 7);
  const Ref ref = reference(l, labels);
  std::vector<float> mx(l.rows), sum(l.rows), target(l.rows);
  xent_tiled_forward(mx.data(), sum.data(), target.data(), l.data(), l.dtype, labels.data(), l.rows,
                     l.vocab, 0, tile);
  const double rel = xent_sum_rel_bound(xent_tiled_chain(l.vocab, tile), kExpUlps);
  for (int64_t r = 0; r < l.rows; ++r) {
    EXPECT_EQ(double{mx[r]}, ref.max[r]) << what << " row " << r;  // a max is exact
    EXPECT_LE(std::abs(sum[r] - ref.sum[r]), rel * ref.sum[r] + 0.5 * 2 * kU * ref.sum[r])
        << what << " row " << r << " (bound " << rel << ")";
    if (labels[r] < 0) continue;
    EXPECT_EQ(target[r], l.wide[r * l.vocab + labels[r]]) << what;
    // The loss as the executor forms it: log(S) + M - target in fp32 (log to an ulp, the two
    // fp32 operations a rounding each of their magnitudes).
    const float loss = std::log(sum[r]) + mx[r] - target[r];
    const double mag = std::abs(std::log(ref.sum[r])) + std::abs(ref.max[r]) + std::abs(target[r]);
    const double tol = 1.01 * rel + 6 * kU * mag;
    EXPECT_NEAR(loss, ref.loss[r], tol) << what << " row " << r;
  }
}

TEST(TiledXent, ForwardMatchesTheUntiledFormulaFp32AndBf16) {
  for (Dtype d : {Dtype::kFp32, Dtype::kBf16}) {
    const Logits l = make(6, 50257, d, 20.0f, 3);
    for (int64_t tile : {int64_t{1}, int64_t{7}, kXentTile, int64_t{50257}, int64_t{1} << 20})
      check_forward(l, tile, std::string(dtype_name(d)) + " tile " + std::to_string(tile));
  }
}

// The executor's pieces (plan.tiled_loss; CpuBackend::xent_*_typed): the row maximum alone, then
// the sums relative to a given maximum at least the row's own (under TP the global one): the
// tiled pass's sum rescaled once more (one exp and one product: xent_tiled_chain's chain plus
// those), against the untiled formula in double relative to that maximum.
TEST(TiledXent, TypedEntriesTakeTheMaximumThenTheSumsRelativeToAGivenMaximum) {
  CpuBackend be(1);
  for (Dtype d : {Dtype::kFp32, Dtype::kBf16}) {
    SCOPED_TRACE(dtype_name(d));
    const Logits l = make(6, 50257, d, 20.0f, 11);
    const auto labels = labels_for(l.rows, l.vocab, 13);
    const Ref ref = reference(l, labels);
    std::vector<float> mx(l.rows), sum(l.rows), target(l.rows);
    be.xent_max_typed(mx.data(), l.data(), d, l.rows, l.vocab);
    for (int64_t r = 0; r < l.rows; ++r) EXPECT_EQ(double{mx[r]}, ref.max[r]) << "row " << r;
    // A given maximum above the row's (a larger logit on another shard): 3.5 above.
    std::vector<float> given(mx);
    for (float& g : given) g += 3.5f;
    be.xent_sums_typed(sum.data(), target.data(), l.data(), d, given.data(), labels.data(), l.rows,
                       l.vocab, 0);
    XentChain c = xent_tiled_chain(l.vocab, kXentTile);
    c.roundings += 1;
    c.exps += 1;
    const double rel = xent_sum_rel_bound(c, kExpUlps);
    for (int64_t r = 0; r < l.rows; ++r) {
      const double want = ref.sum[r] * std::exp(ref.max[r] - double{given[r]});
      EXPECT_LE(std::abs(sum[r] - want), rel * want + 2 * kU * want) << "row " << r;
      if (labels[r] >= 0) EXPECT_EQ(target[r], l.wide[r * l.vocab + labels[r]]);
    }
  }
}

TEST(TiledXent, TheBoundIsTightEnoughToCatchAMissingRescale) {
  // Merging tiles without the rescale of the earlier sum (S += s when the maximum rises) is off by
  // factors like exp(M' - M); the stated tolerance is far below that, so the test above can fail.
  const Logits l = make(2, 4096, Dtype::kFp32, 20.0f, 5);
  const double rel = xent_sum_rel_bound(xent_tiled_chain(l.vocab, 64), kExpUlps);
  EXPECT_LT(rel, 1e-4);
  // A tiling whose tiles all have one maximum still needs no rescale, but a sorted row raises its
  // maximum in each of the 64 tiles: the naive sum differs by far more than the bound.
  const float* x = l.wide.data();
  double naive = 0, good = 0, m = -1e30;
  for (int64_t t0 = 0; t0 < l.vocab; t0 += 64) {
    double tm = -1e30, s = 0;
    for (int64_t v = t0; v < t0 + 64; ++v) tm = std::max(tm, double{x[v]});
    for (int64_t v = t0; v < t0 + 64; ++v) s += std::exp(x[v] - tm);
    naive += s;
    good = tm > m ? good * std::exp(m - tm) + s : good + s * std::exp(tm - m);
    m = std::max(m, tm);
  }
  EXPECT_GT(std::abs(naive - good) / good, 100 * rel);
}

TEST(TiledXent, TensorParallelShardsRescaledAndSummedEqualTheWholeRow) {
  const int64_t rows = 4, vocab = 6000, half = 2500;  // unequal shards
  const Logits whole = make(rows, vocab, Dtype::kBf16, 15.0f, 11);
  const auto labels = labels_for(rows, vocab, 13);
  const Ref ref = reference(whole, labels);
  std::vector<float> gmax(rows, -std::numeric_limits<float>::infinity()), gsum(rows, 0.0f),
      gtarget(rows, 0.0f);
  std::vector<std::vector<float>> lmax(2, std::vector<float>(rows)), lsum = lmax, ltarget = lmax;
  const int64_t starts[2] = {0, half}, widths[2] = {half, vocab - half};
  for (int k = 0; k < 2; ++k) {
    std::vector<uint16_t> shard;
    for (int64_t r = 0; r < rows; ++r)
      shard.insert(shard.end(), whole.bf16.begin() + r * vocab + starts[k],
                   whole.bf16.begin() + r * vocab + starts[k] + widths[k]);
    xent_tiled_forward(lmax[k].data(), lsum[k].data(), ltarget[k].data(), shard.data(),
                       Dtype::kBf16, labels.data(), rows, widths[k], starts[k], 512);
    for (int64_t r = 0; r < rows; ++r) gmax[r] = std::max(gmax[r], lmax[k][r]);  // all-reduce max
  }
  for (int k = 0; k < 2; ++k) {
    xent_rescale(lsum[k].data(), lmax[k].data(), gmax.data(), rows);
    for (int64_t r = 0; r < rows; ++r) {
      gsum[r] += lsum[k][r];  // all-reduce sum
      gtarget[r] += ltarget[k][r];
    }
  }
  XentChain c = xent_tiled_chain(std::max(widths[0], widths[1]), 512);
  c.roundings += 2;  // the rescale's product and the shards' sum
  c.exps += 1;       // the rescale's exp
  const double rel = xent_sum_rel_bound(c, kExpUlps);
  for (int64_t r = 0; r < rows; ++r) {
    EXPECT_EQ(double{gmax[r]}, ref.max[r]);
    EXPECT_LE(std::abs(gsum[r] - ref.sum[r]), (rel + kU) * ref.sum[r]) << "row " << r;
    if (labels[r] >= 0) {
      EXPECT_EQ(gtarget[r], whole.wide[r * vocab + labels[r]]);
    }
  }
}

TEST(TiledXent, BackwardFromTheLogitsInTheirDtypeInPlace) {
  for (Dtype d : {Dtype::kFp32, Dtype::kBf16}) {
    const int64_t rows = 5, vocab = 3001, start = 1000;  // this shard's ids 1000..4000
    Logits l = make(rows, vocab, d, 10.0f, 17);
    auto labels = labels_for(rows, vocab, 19);
    for (auto& x : labels)
      if (x >= 0) x += static_cast<int32_t>(start);
    labels[2] = 7;  // a label in another shard
    std::vector<float> mx(rows), sum(rows), target(rows);
    xent_tiled_forward(mx.data(), sum.data(), target.data(), l.data(), d, labels.data(), rows,
                       vocab, start, 256);
    const double rel = xent_sum_rel_bound(xent_tiled_chain(vocab, 256), kExpUlps);
    const float dloss = 0.125f;
    // In place over the logits' own storage.
    std::vector<float> f32 = l.wide;
    std::vector<uint16_t> b16 = l.bf16;
    void* buf = d == Dtype::kFp32 ? static_cast<void*>(f32.data()) : b16.data();
    xent_tiled_backward(buf, buf, d, mx.data(), sum.data(), labels.data(), rows, vocab, start,
                        dloss);
    // Storage rounding: the unit roundoff of the dtype (bf16: 8 significant bits, 2^-8 relative).
    const double store = d == Dtype::kFp32 ? kU : std::ldexp(1.0, -8);
    for (int64_t r = 0; r < rows; ++r) {
      double m = -1e300, s = 0;
      for (int64_t v = 0; v < vocab; ++v) m = std::max(m, double{l.wide[r * vocab + v]});
      for (int64_t v = 0; v < vocab; ++v) s += std::exp(l.wide[r * vocab + v] - m);
      for (int64_t v = 0; v < vocab; ++v) {
        const double p = std::exp(l.wide[r * vocab + v] - m) / s;
        const bool hit = labels[r] >= 0 && labels[r] - start == v;
        const double ref = labels[r] < 0 ? 0.0 : dloss * (p - (hit ? 1.0 : 0.0));
        const double got =
            d == Dtype::kFp32 ? f32[r * vocab + v] : bf16_to_fp32(b16[r * vocab + v]);
        // p carries S's error, its exp's (kExpUlps), 1/S's and the product's roundings, then
        // the subtraction and the dloss product: (rel + 6u) p; then the store.
        const double e = dloss * p * (rel + 6 * kU) + dloss * 2 * kU * (hit ? 1.0 : 0.0);
        ASSERT_LE(std::abs(got - ref), e + store * (std::abs(ref) + e))
            << dtype_name(d) << " row " << r << " col " << v;
      }
    }
  }
}

TEST(TiledXent, RefusesOtherDtypesNamingThem) {
  std::vector<uint16_t> x(4, 0);
  std::vector<float> a(1), b(1), c(1);
  std::vector<int32_t> lab(1, 0);
  try {
    xent_tiled_forward(a.data(), b.data(), c.data(), x.data(), Dtype::kFp16, lab.data(), 1, 4, 0);
    FAIL() << "accepted fp16 logits";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("fp16"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace parasol::runtime::cpu
