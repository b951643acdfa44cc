// Vocab-parallel cross-entropy against a double reference: the pieces (row max, sum of
// exponentials, target logit, loss, softmax, backward) on the whole vocabulary, recombined over 2
// and 4 vocabulary shards as the tensor-parallel all-reduces would (max, then sums) giving the
// unsharded loss and gradient; ignored labels; a GPT-2-sized vocabulary; the gradient against
// central finite differences of the reference loss. Tolerance: 1e-5 of the largest reference
// magnitude.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "kernel_test_util.h"

namespace parasol::runtime {
namespace {

using test::cpu;
using test::near_normwise;
using test::to_double;

// Per-row loss log(sum_v exp l_v) - l_label (0 for label < 0).
std::vector<double> ref_loss(const std::vector<double>& logits, const std::vector<int32_t>& labels,
                             int64_t rows, int64_t vocab) {
  std::vector<double> loss(rows, 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    if (labels[r] < 0) continue;
    const double* l = &logits[r * vocab];
    const double mx = *std::max_element(l, l + vocab);
    double s = 0;
    for (int64_t v = 0; v < vocab; ++v) s += std::exp(l[v] - mx);
    loss[r] = std::log(s) + mx - l[labels[r]];
  }
  return loss;
}

// d(dloss * sum_r loss_r)/dlogits = dloss (softmax - onehot).
std::vector<double> ref_grad(const std::vector<double>& logits, const std::vector<int32_t>& labels,
                             int64_t rows, int64_t vocab, double dloss) {
  std::vector<double> g(rows * vocab, 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    if (labels[r] < 0) continue;
    const double* l = &logits[r * vocab];
    const double mx = *std::max_element(l, l + vocab);
    double s = 0;
    for (int64_t v = 0; v < vocab; ++v) s += std::exp(l[v] - mx);
    for (int64_t v = 0; v < vocab; ++v) g[r * vocab + v] = dloss * std::exp(l[v] - mx) / s;
    g[r * vocab + labels[r]] -= dloss;
  }
  return g;
}

std::vector<int32_t> random_labels(int64_t rows, int32_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> u(0, vocab - 1);
  std::vector<int32_t> l(rows);
  for (auto& x : l) x = u(rng);
  return l;
}

// Loss and gradient over `shards` vocabulary shards, combined as Megatron's vocab-parallel
// cross-entropy: all-reduce(max) of the row maxima, all-reduce(sum) of the sums of exponentials
// (taken against the global max) and of the target logits.
void sharded(const std::vector<float>& logits, const std::vector<int32_t>& labels, int64_t rows,
             int64_t vocab, int shards, float dloss, std::vector<float>& loss,
             std::vector<float>& grad) {
  const int64_t vs = vocab / shards;
  std::vector<std::vector<float>> part(shards);  // each shard's [rows x vs] logits
  for (int s = 0; s < shards; ++s)
    for (int64_t r = 0; r < rows; ++r)
      part[s].insert(part[s].end(), logits.begin() + r * vocab + s * vs,
                     logits.begin() + r * vocab + (s + 1) * vs);
  std::vector<float> gmax(rows, -INFINITY), gsum(rows, 0.0f), gtarget(rows, 0.0f);
  for (int s = 0; s < shards; ++s) {
    std::vector<float> mx(rows);
    cpu().xent_row_max(mx.data(), part[s].data(), rows, vs);
    for (int64_t r = 0; r < rows; ++r) gmax[r] = std::max(gmax[r], mx[r]);  // all-reduce max
  }
  for (int s = 0; s < shards; ++s) {
    std::vector<float> se(rows), tg(rows);
    cpu().xent_sum_exp(se.data(), part[s].data(), gmax.data(), rows, vs);
    cpu().xent_target(tg.data(), part[s].data(), labels.data(), rows, vs, s * vs);
    for (int64_t r = 0; r < rows; ++r) {  // all-reduce sum
      gsum[r] += se[r];
      gtarget[r] += tg[r];
    }
  }
  loss.assign(rows, 0.0f);
  cpu().xent_loss(loss.data(), gmax.data(), gsum.data(), gtarget.data(), labels.data(), rows);
  grad.assign(rows * vocab, 0.0f);
  for (int s = 0; s < shards; ++s) {
    std::vector<float> probs(rows * vs);
    cpu().xent_softmax(probs.data(), part[s].data(), gmax.data(), gsum.data(), rows, vs);
    cpu().xent_backward(probs.data(), probs.data(), labels.data(), rows, vs, s * vs, dloss);
    for (int64_t r = 0; r < rows; ++r)
      std::copy(probs.begin() + r * vs, probs.begin() + (r + 1) * vs,
                grad.begin() + r * vocab + s * vs);
  }
}

TEST(CrossEntropy, ShardsRecombineToTheUnshardedLossAndGradient) {
  const int64_t rows = 24, vocab = 96;
  const float dloss = 1.0f / rows;
  std::vector<float> logits = test::random_floats(rows * vocab, 1, -6.0f, 6.0f);
  std::vector<int32_t> labels = random_labels(rows, vocab, 2);
  labels[5] = -100;  // ignored
  const std::vector<double> L = to_double(logits);
  const std::vector<double> rl = ref_loss(L, labels, rows, vocab),
                            rg = ref_grad(L, labels, rows, vocab, dloss);
  for (int shards : {1, 2, 4}) {
    std::vector<float> loss, grad;
    sharded(logits, labels, rows, vocab, shards, dloss, loss, grad);
    EXPECT_TRUE(near_normwise(loss, rl, 1e-5, "loss")) << shards << " shards";
    EXPECT_TRUE(near_normwise(grad, rg, 1e-5, "grad")) << shards << " shards";
    EXPECT_EQ(loss[5], 0.0f);
    for (int64_t v = 0; v < vocab; ++v) EXPECT_EQ(grad[5 * vocab + v], 0.0f);
  }
}

TEST(CrossEntropy, PiecesOnOneShard) {
  // Each piece alone against its definition, on a shard holding ids [32, 64) of 96.
  const int64_t rows = 10, vs = 32, start = 32;
  std::vector<float> logits = test::random_floats(rows * vs, 3, -4.0f, 4.0f);
  std::vector<int32_t> labels = random_labels(rows, 96, 4);
  labels[0] = 40;  // surely in the shard
  labels[1] = 3;   // surely not
  std::vector<float> mx(rows), se(rows), tg(rows);
  cpu().xent_row_max(mx.data(), logits.data(), rows, vs);
  cpu().xent_sum_exp(se.data(), logits.data(), mx.data(), rows, vs);
  cpu().xent_target(tg.data(), logits.data(), labels.data(), rows, vs, start);
  std::vector<double> rmx(rows), rse(rows), rtg(rows);
  for (int64_t r = 0; r < rows; ++r) {
    rmx[r] = *std::max_element(logits.begin() + r * vs, logits.begin() + (r + 1) * vs);
    for (int64_t v = 0; v < vs; ++v) rse[r] += std::exp(double(logits[r * vs + v]) - rmx[r]);
    const int64_t id = labels[r] - start;
    rtg[r] = id >= 0 && id < vs ? logits[r * vs + id] : 0.0;
  }
  EXPECT_TRUE(near_normwise(mx, rmx, 0, "row max"));  // exact: a selection
  EXPECT_TRUE(test::near_elementwise(se.data(), rse, 1e-6, 0, "sum exp"));
  EXPECT_TRUE(near_normwise(tg, rtg, 0, "target"));  // exact: a selection
  EXPECT_NE(tg[0], 0.0f);
  EXPECT_EQ(tg[1], 0.0f);
}

TEST(CrossEntropy, Gpt2Vocabulary) {
  const int64_t rows = 6, vocab = 50304;
  std::vector<float> logits = test::random_floats(rows * vocab, 5, -10.0f, 10.0f);
  std::vector<int32_t> labels = random_labels(rows, 50257, 6);
  std::vector<float> loss, grad;
  sharded(logits, labels, rows, vocab, 1, 1.0f, loss, grad);
  const std::vector<double> L = to_double(logits);
  EXPECT_TRUE(
      test::near_elementwise(loss.data(), ref_loss(L, labels, rows, vocab), 1e-5, 0, "loss"));
  EXPECT_TRUE(near_normwise(grad, ref_grad(L, labels, rows, vocab, 1.0), 1e-5, "grad"));
}

TEST(CrossEntropy, GradientMatchesFiniteDifferences) {
  const int64_t rows = 4, vocab = 12;
  const float dloss = 0.25f;
  std::vector<float> logits = test::random_floats(rows * vocab, 7, -3.0f, 3.0f);
  std::vector<int32_t> labels = random_labels(rows, vocab, 8);
  labels[2] = -1;
  std::vector<float> loss, grad;
  sharded(logits, labels, rows, vocab, 2, dloss, loss, grad);
  std::vector<double> L = to_double(logits);
  auto total = [&] {
    double s = 0;
    for (double l : ref_loss(L, labels, rows, vocab)) s += dloss * l;
    return s;
  };
  EXPECT_TRUE(near_normwise(grad, test::finite_diff(L, total), 1e-5, "dlogits vs fd"));
}

}  // namespace
}  // namespace parasol::runtime
