// Tests of the busiest expert-parallel rank's load (core/moe_load.h): the expected normal
// maximum against the tabulated expected order statistics, and the load factor against a Monte
// Carlo of random top-k routing done independently here.
#include "core/moe_load.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

namespace parasol {
namespace {

Model moe(int experts, int top_k) {
  Model m = model_preset("mixtral-8x7b");
  m.moe.experts = experts;
  m.moe.top_k = top_k;
  return m;
}

// Expected largest of n standard normals (Harter 1961; e.g. Teichroew 1956): n = 2: 1/sqrt(pi)
// = 0.5642, n = 10: 1.5388, n = 100: 2.5076. Blom's approximation is within 5% at n = 2 and
// within 1% from n = 10.
TEST(MoeLoad, ExpectedNormalMaximumFollowsTheTables) {
  EXPECT_EQ(expected_max_standard_normal(1), 0.0);
  EXPECT_NEAR(expected_max_standard_normal(2), 0.5642, 0.05 * 0.5642);
  EXPECT_NEAR(expected_max_standard_normal(10), 1.5388, 0.01 * 1.5388);
  EXPECT_NEAR(expected_max_standard_normal(100), 2.5076, 0.01 * 2.5076);
  for (int n = 2; n < 512; n *= 2)
    EXPECT_LT(expected_max_standard_normal(n), expected_max_standard_normal(2 * n)) << n;
}

// Each of the group's ep * rows / k tokens picks top_k distinct experts uniformly at random (what
// Megatron's forced balancing does); rank r holds experts [r E/ep, (r+1) E/ep). The mean over
// trials of the busiest rank's rows over the mean rows.
double simulated_factor(int experts, int top_k, int ep, int rows_per_rank, int trials) {
  std::mt19937_64 rng(12345);
  const int tokens = ep * rows_per_rank / top_k, per_rank = experts / ep;
  std::uniform_int_distribution<int> pick(0, experts - 1);
  std::vector<int> chosen;
  double sum = 0;
  for (int t = 0; t < trials; ++t) {
    std::vector<int> load(ep, 0);
    for (int i = 0; i < tokens; ++i) {
      chosen.clear();
      while (static_cast<int>(chosen.size()) < top_k) {  // k distinct experts, by rejection
        const int e = pick(rng);
        if (std::find(chosen.begin(), chosen.end(), e) == chosen.end()) chosen.push_back(e);
      }
      for (int e : chosen) ++load[e / per_rank];
    }
    sum += static_cast<double>(*std::max_element(load.begin(), load.end())) / rows_per_rank;
  }
  return sum / trials;
}

TEST(MoeLoad, FactorMatchesRandomRouting) {
  struct Case {
    int experts, top_k, ep, rows;
  };
  // Mixtral-like (8 experts, top-2, EP8), Qwen3-like (128, top-8, EP16) and small row counts.
  for (const Case& c :
       {Case{8, 2, 8, 1024}, Case{128, 8, 16, 4096}, Case{64, 6, 8, 512}, Case{256, 8, 32, 2048}}) {
    const double mc = simulated_factor(c.experts, c.top_k, c.ep, c.rows, 200);
    const double f = moe_hot_rank_factor(moe(c.experts, c.top_k), c.ep, c.rows);
    EXPECT_GT(f, 1.0);
    // The excess over the mean within 15% of the simulated excess (the normal approximation of
    // the hypergeometric sums and the sampling error of 200 trials).
    EXPECT_NEAR(f - 1, mc - 1, 0.15 * (mc - 1)) << c.experts << " " << c.ep << " " << c.rows;
  }
}

TEST(MoeLoad, NoImbalanceWithoutExpertParallelism) {
  EXPECT_EQ(moe_hot_rank_factor(moe(8, 2), 1, 4096), 1.0);
  EXPECT_EQ(moe_hot_rank_factor(model_preset("llama2-7b"), 8, 4096), 1.0);
  EXPECT_EQ(moe_hot_rank_factor(moe(8, 2), 8, 0), 1.0);
  // More rows per rank: relatively less imbalance (1/sqrt(rows)).
  const Model m = moe(64, 6);
  EXPECT_NEAR(moe_hot_rank_factor(m, 8, 1024) - 1, 2 * (moe_hot_rank_factor(m, 8, 4096) - 1),
              1e-12);
  EXPECT_EQ(moe_hot_rank_rows(m, 1, 1000), 1000);
  EXPECT_GT(moe_hot_rank_rows(m, 8, 1000), 1000);
}

// The round-robin gate played over the group: every rank's token t takes experts (t k + i) mod E;
// rank r holds experts [r E/ep, (r+1) E/ep); the busiest rank's rows over the mean rows.
double round_robin_by_hand(int experts, int top_k, int ep, int rows_per_rank) {
  const int tokens = rows_per_rank / top_k, per_rank = experts / ep;
  std::vector<int> load(ep, 0);
  for (int rank = 0; rank < ep; ++rank)
    for (int t = 0; t < tokens; ++t)
      for (int i = 0; i < top_k; ++i) ++load[(t * top_k + i) % experts / per_rank];
  return static_cast<double>(*std::max_element(load.begin(), load.end())) / rows_per_rank;
}

TEST(MoeLoad, ForcedBalanceByPlan) {
  Plan p;
  p.ep = 8;
  const Model m = moe(64, 6);
  // none and random: the random-routing floor.
  EXPECT_EQ(moe_hot_rank_factor(m, p, 4096), moe_hot_rank_factor(m, 8, 4096));
  p.moe_force_balance = MoeForceBalance::kRandom;
  EXPECT_EQ(moe_hot_rank_factor(m, p, 4096), moe_hot_rank_factor(m, 8, 4096));
  EXPECT_GT(moe_hot_rank_factor(m, p, 4096), 1.0);
  // round_robin: exact balance where the rows fill whole rounds of the experts, and the few
  // extra rows of a partial round on the first rank otherwise.
  p.moe_force_balance = MoeForceBalance::kRoundRobin;
  EXPECT_EQ(moe_hot_rank_factor(m, p, 6 * 64 * 10), 1.0);
  struct Case {
    int experts, top_k, ep, rows;
  };
  for (const Case& c : {Case{64, 6, 8, 6 * 100}, Case{8, 2, 8, 2 * 7}, Case{256, 8, 64, 8 * 4096},
                        Case{128, 4, 8, 4 * 1001}, Case{12, 3, 4, 3 * 5}}) {
    Plan q;
    q.ep = c.ep;
    q.moe_force_balance = MoeForceBalance::kRoundRobin;
    EXPECT_NEAR(moe_hot_rank_factor(moe(c.experts, c.top_k), q, c.rows),
                round_robin_by_hand(c.experts, c.top_k, c.ep, c.rows), 1e-12)
        << c.experts << " " << c.ep << " " << c.rows;
  }
  p.ep = 1;
  EXPECT_EQ(moe_hot_rank_factor(m, p, 4096), 1.0);
}

// Megatron's expert bias loop (TEGroupedMLP._apply_bias), kernel by kernel as PyTorch runs
// `torch.cat([t + b * p for t, b, p in zip(...)]).to(t.dtype)` and its autograd: each kernel's
// bytes per element of the rows (read, write), listed here from the source, summed.
struct Kernel {
  double read, write;
  bool per_expert;
};
ExpertBiasLoop listed(const std::vector<Kernel>& kernels, int64_t experts) {
  ExpertBiasLoop r;
  for (const Kernel& k : kernels) {
    r.bytes_per_element += k.read + k.write;
    r.kernels += k.per_expert ? experts : 1;
  }
  return r;
}
// expert_bias_loop's pass of `p` over `experts` local experts against the listed kernels.
void expect_listed(const Plan& p, bool backward, int64_t experts, const ExpertBiasLoop& want) {
  const ExpertBiasLoop got = expert_bias_loop(p, backward, experts);
  EXPECT_DOUBLE_EQ(got.bytes_per_element, want.bytes_per_element) << "backward " << backward;
  EXPECT_EQ(got.kernels, want.kernels) << "backward " << backward;
}

TEST(MoeLoad, ExpertBiasLoopCountsEachKernelOfTheLoop) {
  Plan p;
  p.precision = Dtype::kBf16;  // the alltoall dispatcher: bf16 probabilities, no promotion
  const int64_t le = 16;
  // Forward: b*p (write bf16), t + bp (read 2 bf16, write bf16), cat (read, write); .to(bf16) is
  // a no-op.
  expect_listed(p, false, le, listed({{0, 2, true}, {4, 2, true}, {2, 2, false}}, le));
  // Backward: grad*p and its sum over rows (the bias gradient), grad*b and its sum over columns
  // (the probabilities' gradient), the bias gradient into its main gradient (a vector: no
  // per-element bytes), and split's backward: the rows' gradients concatenated, and the
  // probabilities' (a column: no per-element bytes).
  expect_listed(p, true, le,
                listed({{2, 2, true},
                        {2, 0, true},
                        {2, 2, true},
                        {2, 0, true},
                        {0, 0, true},
                        {2, 2, false},
                        {0, 0, false}},
                       le));

  // DeepEP/HybridEP carry fp32 probabilities: the loop runs in fp32 and casts back.
  p.moe_dispatcher = MoeDispatcher::kDeepEp;
  ASSERT_EQ(p.moe_probs_dtype(), Dtype::kFp32);
  expect_listed(p, false, le,
                listed({{0, 4, true}, {6, 4, true}, {4, 4, false}, {4, 2, false}}, le));
  // Backward: .to's backward (bf16 -> fp32), each piece's gradient to t cast back to bf16, the
  // two products and sums in fp32, the main-gradient accumulation, split's two concatenations.
  expect_listed(p, true, le,
                listed({{2, 4, false},
                        {4, 2, true},
                        {4, 4, true},
                        {4, 0, true},
                        {4, 4, true},
                        {4, 0, true},
                        {0, 0, true},
                        {2, 2, false},
                        {0, 0, false}},
                       le));
  // FP8 training keeps the GEMM outputs in bf16: as bf16 under the alltoall dispatcher.
  p.moe_dispatcher = MoeDispatcher::kAllToAll;
  p.precision = Dtype::kFp8;
  EXPECT_EQ(p.moe_probs_dtype(), Dtype::kBf16);
  EXPECT_DOUBLE_EQ(expert_bias_loop(p, false, le).bytes_per_element, 12);
}

// NeMo AutoModel's fc1 bias loop (GroupedExpertsDeepEP._apply_bias without probabilities,
// Automodel@8d9bfb90e): t + b in the activation dtype, then cat, the cast a no-op; backward
// split's concatenation of the pieces' gradients, each expert's bias gradient a sum over its rows
// and its write into the stacked parameter's gradient (a vector: no per-element bytes). The
// dispatcher's probability dtype does not enter it.
TEST(MoeLoad, Fc1BiasLoopHasNoProbabilities) {
  Plan p;
  p.precision = Dtype::kBf16;
  p.moe_dispatcher = MoeDispatcher::kDeepEp;  // fp32 probabilities, not read here
  const int64_t le = 4;
  const std::vector<Kernel> fwd = {{2, 2, true}, {2, 2, false}};
  const std::vector<Kernel> bwd = {{2, 2, false}, {2, 0, true}, {0, 0, true}};
  for (bool backward : {false, true}) {
    const ExpertBiasLoop want = listed(backward ? bwd : fwd, le);
    const ExpertBiasLoop got = expert_bias_loop(p, backward, le, false);
    EXPECT_DOUBLE_EQ(got.bytes_per_element, want.bytes_per_element) << "backward " << backward;
    EXPECT_EQ(got.kernels, want.kernels) << "backward " << backward;
  }
}

// Megatron-Core's router after its GEMM (router.py / moe_utils.py @cd4afffa6): the fused path's
// six kernels each way, the eager path's 22 forward and 11 backward, RandomSTE's clone and
// normal_ under forced random balance, AutoModel's FakeBalancedGate under round-robin; each
// kernel reads and writes at most one fp32 [tokens, experts] tensor (8 bytes an element).
TEST(MoeLoad, RouterKernelsCountEachPathOfTheRouter) {
  Plan p;
  auto expect = [&](bool backward, int64_t kernels) {
    const RouterKernels r = router_kernels(p, backward);
    EXPECT_EQ(r.kernels, kernels) << (backward ? "backward" : "forward");
    EXPECT_DOUBLE_EQ(r.bytes_per_element, 8.0 * kernels);
  };
  expect(false, 22);
  expect(true, 11);
  p.moe_router_fusion = true;
  expect(false, 6);
  expect(true, 6);
  p.moe_force_balance = MoeForceBalance::kRandom;
  expect(false, 8);  // + logits.clone().normal_()
  expect(true, 6);   // RandomSTE's backward passes the gradient through
  p.moe_router_fusion = false;
  expect(false, 24);
  p.moe_force_balance = MoeForceBalance::kRoundRobin;  // no router: ones / k, arange % E
  expect(false, 5);
  expect(true, 1);
}

}  // namespace
}  // namespace parasol
