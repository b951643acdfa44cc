// Embedding kernels against a double reference: the vocab-parallel lookup (shards summed equal the
// unsharded lookup), learned positions with an offset, the scatter-add gradient (accumulating,
// repeated tokens) and that gradient against central finite differences of the reference.
#include <gtest/gtest.h>

#include <vector>

#include "kernel_test_util.h"

namespace parasol::runtime {
namespace {

using test::cpu;
using test::near_normwise;
using test::to_double;

// Reference: out[t] = table[tok - start] if in shard else 0, + pos[t % seq + off].
std::vector<double> ref_embedding(const std::vector<int32_t>& tokens,
                                  const std::vector<double>& table, int64_t start, int64_t vrows,
                                  const std::vector<double>* pos, int64_t off, int64_t seq,
                                  int64_t cols) {
  const int64_t rows = static_cast<int64_t>(tokens.size());
  std::vector<double> out(rows * cols, 0.0);
  for (int64_t t = 0; t < rows; ++t)
    for (int64_t c = 0; c < cols; ++c) {
      double v = 0;
      if (tokens[t] >= start && tokens[t] < start + vrows)
        v = table[(tokens[t] - start) * cols + c];
      if (pos) v += (*pos)[(t % seq + off) * cols + c];
      out[t * cols + c] = v;
    }
  return out;
}

std::vector<int32_t> random_tokens(int64_t n, int32_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> u(0, vocab - 1);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = u(rng);
  return t;
}

TEST(Embedding, ForwardUnshardedWithPositions) {
  const int64_t B = 3, S = 7, C = 24, V = 50, P = 12, off = 3;
  std::vector<int32_t> tok = random_tokens(B * S, V, 1);
  std::vector<float> table = test::random_floats(V * C, 2), pos = test::random_floats(P * C, 3);
  std::vector<float> out(B * S * C);
  cpu().embedding_forward(out.data(), tok.data(), table.data(), 0, V, pos.data(), off, B * S, S, C);
  std::vector<double> dpos = to_double(pos);
  // Exact: a copy plus one addition in fp32 of fp32 inputs.
  EXPECT_TRUE(near_normwise(out, ref_embedding(tok, to_double(table), 0, V, &dpos, off, S, C), 1e-7,
                            "out"));
}

TEST(Embedding, VocabShardsSumToTheFullLookup) {
  const int64_t B = 2, S = 9, C = 16, V = 40;
  std::vector<int32_t> tok = random_tokens(B * S, V, 4);
  std::vector<float> table = test::random_floats(V * C, 5), pos = test::random_floats(S * C, 6);
  for (int64_t shards : {2, 4}) {
    const int64_t vs = V / shards;
    std::vector<double> sum(B * S * C, 0.0);
    for (int64_t r = 0; r < shards; ++r) {
      std::vector<float> out(B * S * C);
      // Positions on shard 0 only (the all-reduce adds them once).
      cpu().embedding_forward(out.data(), tok.data(), table.data() + r * vs * C, r * vs, vs,
                              r == 0 ? pos.data() : nullptr, 0, B * S, S, C);
      for (size_t i = 0; i < sum.size(); ++i) sum[i] += out[i];
    }
    std::vector<double> dpos = to_double(pos);
    std::vector<double> ref = ref_embedding(tok, to_double(table), 0, V, &dpos, 0, S, C);
    std::vector<float> got(sum.begin(), sum.end());
    EXPECT_TRUE(near_normwise(got, ref, 1e-7, "sharded")) << shards;
  }
}

TEST(Embedding, BackwardAccumulatesAndMatchesFiniteDifferences) {
  const int64_t B = 2, S = 5, C = 6, V = 8, start = 2, vrows = 4, off = 1, P = 8;
  std::vector<int32_t> tok = random_tokens(B * S, V, 7);
  tok[0] = tok[3] = start + 1;  // a repeated token of this shard
  std::vector<float> table = test::random_floats(vrows * C, 8), pos = test::random_floats(P * C, 9);
  std::vector<float> dout = test::random_floats(B * S * C, 10);
  std::vector<float> dtable = test::random_floats(vrows * C, 11), dpos(P * C, 0.0f);
  const std::vector<float> dtable0 = dtable;
  cpu().embedding_backward(dtable.data(), dpos.data(), dout.data(), tok.data(), start, vrows, off,
                           B * S, S, C);
  // Reference: dtable = previous contents + scatter of dout; dpos likewise.
  std::vector<double> rt = to_double(dtable0), rp(P * C, 0.0);
  for (int64_t t = 0; t < B * S; ++t)
    for (int64_t c = 0; c < C; ++c) {
      if (tok[t] >= start && tok[t] < start + vrows)
        rt[(tok[t] - start) * C + c] += dout[t * C + c];
      rp[(t % S + off) * C + c] += dout[t * C + c];
    }
  EXPECT_TRUE(near_normwise(dtable, rt, 1e-6, "dtable"));
  EXPECT_TRUE(near_normwise(dpos, rp, 1e-6, "dpos"));

  // Finite differences of L = sum dout . embedding(table, pos) (double reference).
  std::vector<double> tbl = to_double(table), ps = to_double(pos), w = to_double(dout);
  auto loss = [&] {
    return test::weighted_sum(ref_embedding(tok, tbl, start, vrows, &ps, off, S, C), w);
  };
  std::vector<double> fd_t = test::finite_diff(tbl, loss), fd_p = test::finite_diff(ps, loss);
  std::vector<float> gt(vrows * C, 0.0f), gp(P * C, 0.0f);
  cpu().embedding_backward(gt.data(), gp.data(), dout.data(), tok.data(), start, vrows, off, B * S,
                           S, C);
  EXPECT_TRUE(near_normwise(gt, fd_t, 1e-6, "dtable vs fd"));
  EXPECT_TRUE(near_normwise(gp, fd_p, 1e-6, "dpos vs fd"));
}

}  // namespace
}  // namespace parasol::runtime
