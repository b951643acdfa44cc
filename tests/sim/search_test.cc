// Tests the plan search (sim/search.h): validity, order, Pareto front, optimality, bad batches.
#include "sim/search.h"

#include <gtest/gtest.h>

#include <atomic>
#include <vector>

#include "core/cluster.h"
#include "core/error.h"
#include "core/lower.h"
#include "core/model.h"
#include "core/plan.h"
#include "cost_models/estimate.h"
#include "cost_models/memory.h"
#include "sim/engine.h"

namespace parasol::sim {
namespace {

class SearchLlama : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    model_ = new Model(model_preset("llama3-8b"));
    cluster_ = new Cluster(cluster_preset("dgx-h100", 16));
    profile_ = new cost::Profile(cost::default_profile(cluster_->gpu_device(0)));
    SearchOptions o;
    o.global_batch = 64;
    o.threads = 2;
    o.top_k = 20;
    o.progress = [](double f) {
      EXPECT_GE(f, 0);
      EXPECT_LE(f, 1);
      last_progress_ = f;
    };
    result_ = new SearchResult(search(*model_, *cluster_, *profile_, o));
  }
  static void TearDownTestSuite() {
    delete result_;
    delete profile_;
    delete cluster_;
    delete model_;
  }
  static Model* model_;
  static Cluster* cluster_;
  static cost::Profile* profile_;
  static SearchResult* result_;
  static double last_progress_;
};
Model* SearchLlama::model_ = nullptr;
Cluster* SearchLlama::cluster_ = nullptr;
cost::Profile* SearchLlama::profile_ = nullptr;
SearchResult* SearchLlama::result_ = nullptr;
double SearchLlama::last_progress_ = -1;

TEST_F(SearchLlama, FindsFittingPlansAndCountsThem) {
  const SearchResult& r = *result_;
  ASSERT_FALSE(r.top.empty());
  EXPECT_LE(static_cast<int>(r.top.size()), 20);
  EXPECT_GE(r.enumerated, r.evaluated);
  EXPECT_GE(r.evaluated, static_cast<int64_t>(r.top.size()));
  EXPECT_GE(r.fitting, static_cast<int64_t>(r.top.size()));
  EXPECT_GT(r.seconds, 0);
  EXPECT_DOUBLE_EQ(last_progress_, 1.0);
}

TEST_F(SearchLlama, EveryReturnedPlanValidatesAndFits) {
  auto check = [&](const Candidate& c) {
    EXPECT_NO_THROW(validate(c.plan, *model_, *cluster_)) << plan_to_json(c.plan).dump();
    EXPECT_EQ(c.plan.global_batch, 64);
    EXPECT_EQ(c.plan.gpus(), 16);
    EXPECT_TRUE(c.estimate.fits);
    EXPECT_LE(c.estimate.memory_per_gpu_bytes, cluster_->gpu_device(0).hbm_bytes);
  };
  for (const Candidate& c : result_->top) check(c);
  for (const Candidate& c : result_->pareto) check(c);
}

TEST_F(SearchLlama, TopIsSortedByThroughput) {
  const auto& top = result_->top;
  for (size_t i = 1; i < top.size(); ++i)
    EXPECT_GE(top[i - 1].estimate.tokens_per_s, top[i].estimate.tokens_per_s) << i;
}

TEST_F(SearchLlama, ParetoFrontTradesThroughputForMemory) {
  const auto& front = result_->pareto;
  ASSERT_FALSE(front.empty());
  for (size_t i = 1; i < front.size(); ++i) {
    EXPECT_GE(front[i - 1].estimate.tokens_per_s, front[i].estimate.tokens_per_s) << i;
    EXPECT_GT(front[i - 1].estimate.memory_per_gpu_bytes, front[i].estimate.memory_per_gpu_bytes)
        << i;
  }
  // The fastest plan is on the front; no top plan dominates a front plan.
  EXPECT_DOUBLE_EQ(front[0].estimate.tokens_per_s, result_->top[0].estimate.tokens_per_s);
  for (const Candidate& t : result_->top)
    for (const Candidate& f : front) {
      const bool dominates = t.estimate.tokens_per_s > f.estimate.tokens_per_s &&
                             t.estimate.memory_per_gpu_bytes < f.estimate.memory_per_gpu_bytes;
      EXPECT_FALSE(dominates);
    }
}

TEST_F(SearchLlama, EstimatesEqualTheClosedForm) {
  for (const Candidate& c : result_->top) {
    cost::Estimate e = cost::estimate(*model_, *cluster_, c.plan, *profile_);
    EXPECT_DOUBLE_EQ(c.estimate.step_time_s, e.step_time_s);
    EXPECT_DOUBLE_EQ(c.estimate.tokens_per_s, e.tokens_per_s);
    EXPECT_DOUBLE_EQ(c.estimate.memory_per_gpu_bytes, e.memory_per_gpu_bytes);
  }
}

TEST_F(SearchLlama, NoHandBuiltPlanBeatsTheBest) {
  // A slice of the space built by hand: Megatron-style plans without offload or context
  // parallelism. None may beat the search's best.
  const double best = result_->top[0].estimate.tokens_per_s;
  int tried = 0;
  for (int tp : {1, 2, 4, 8})
    for (int pp : {1, 2, 4})
      for (int mbs : {1, 2, 4}) {
        if (tp * pp > 16) continue;
        const int dp = 16 / (tp * pp);
        if (64 % (dp * mbs)) continue;
        for (int zero : {0, 1})
          for (Recompute r : {Recompute::kNone, Recompute::kSelective, Recompute::kFull}) {
            Plan p;
            p.tp = tp;
            p.pp = pp;
            p.dp = dp;
            p.sequence_parallel = tp > 1;
            p.micro_batch = mbs;
            p.global_batch = 64;
            p.zero = zero;
            p.recompute = r;
            validate(p, *model_, *cluster_);
            cost::Estimate e = cost::estimate(*model_, *cluster_, p, *profile_);
            if (!e.fits) continue;
            ++tried;
            EXPECT_LE(e.tokens_per_s, best * (1 + 1e-12)) << plan_to_json(p).dump();
          }
      }
  EXPECT_GT(tried, 10);
}

// Brute force on a tiny case: the whole space the search claims to cover, rebuilt by hand.
TEST(SearchTiny, BestEqualsExhaustiveEnumeration) {
  Model m = model_preset("tiny");  // 2 layers, 4 heads, 2 KV heads, seq 64
  Cluster c = cluster_preset("dgx-h100", 4);
  cost::Profile prof = cost::default_profile(c.gpu_device(0));
  SearchOptions o;
  o.global_batch = 8;
  o.threads = 2;
  o.search_offload = false;
  SearchResult r = search(m, c, prof, o);
  ASSERT_FALSE(r.top.empty());

  double best = 0;
  int64_t fitting = 0;
  for (int tp : {1, 2, 4})
    for (int cp : {1, 2, 4})
      for (int pp : {1, 2, 4}) {
        if (4 % (tp * cp * pp)) continue;
        const int dp = 4 / (tp * cp * pp);
        for (int mbs : {1, 2, 4, 8})
          for (int sched = 0; sched < 3; ++sched)
            for (int vpp : {1, 2})
              for (int sp : {0, 1})
                for (int zero = 0; zero <= 3; ++zero)
                  for (int rec = 0; rec < 3; ++rec)
                    for (int layers : {-1, 1}) {
                      Plan p;
                      p.tp = tp;
                      p.cp = cp;
                      p.pp = pp;
                      p.dp = dp;
                      p.micro_batch = mbs;
                      p.global_batch = 8;
                      p.schedule = static_cast<Schedule>(sched);
                      p.vpp = vpp;
                      p.sequence_parallel = sp;
                      p.zero = zero;
                      p.recompute = static_cast<Recompute>(rec);
                      p.recompute_layers = layers;
                      try {
                        validate(p, m, c);
                      } catch (const Error&) {
                        continue;
                      }
                      cost::Estimate e = cost::estimate(m, c, p, prof);
                      if (!e.fits) continue;
                      ++fitting;
                      best = std::max(best, e.tokens_per_s);
                    }
      }
  ASSERT_GT(fitting, 0);
  // The search may not enumerate every variant (e.g. ZeRO with a single data-parallel rank),
  // but none of the valid plans built here beats its best, and its best is one of them.
  EXPECT_LE(best, r.top[0].estimate.tokens_per_s * (1 + 1e-12));
  EXPECT_NEAR(r.top[0].estimate.tokens_per_s, best, 1e-9 * best);
}

TEST(SearchTiny, ThreadCountDoesNotChangeTheAnswer) {
  Model m = model_preset("tiny");
  Cluster c = cluster_preset("dgx-h100", 4);
  cost::Profile prof = cost::default_profile(c.gpu_device(0));
  SearchOptions o;
  o.global_batch = 8;
  o.threads = 1;
  SearchResult one = search(m, c, prof, o);
  o.threads = 2;
  SearchResult two = search(m, c, prof, o);
  EXPECT_EQ(one.enumerated, two.enumerated);
  EXPECT_EQ(one.fitting, two.fitting);
  ASSERT_FALSE(one.top.empty());
  EXPECT_DOUBLE_EQ(one.top[0].estimate.tokens_per_s, two.top[0].estimate.tokens_per_s);
  EXPECT_EQ(one.pareto.size(), two.pareto.size());
}

TEST(SearchTiny, BatchNoDataParallelDegreeDividesFindsNothing) {
  // 8 GPUs, 2 layers (pp <= 2), tp <= 2 (2 KV heads), a 34-token sequence (cp = 1): dp >= 2,
  // and a global batch of 3 is divisible by none of dp = 2, 4, 8.
  Model m = model_preset("tiny");
  Cluster c = cluster_preset("dgx-h100", 8);
  cost::Profile prof = cost::default_profile(c.gpu_device(0));
  SearchOptions o;
  o.global_batch = 3;
  o.seq_len = 34;
  o.threads = 2;
  SearchResult r;
  try {
    r = search(m, c, prof, o);
  } catch (const Error&) {
    return;  // an Error is an acceptable answer
  }
  EXPECT_TRUE(r.top.empty());
  EXPECT_TRUE(r.pareto.empty());
  EXPECT_EQ(r.fitting, 0);
}

TEST(SearchTiny, MissingGlobalBatchIsAnError) {
  Model m = model_preset("tiny");
  Cluster c = cluster_preset("dgx-h100", 4);
  cost::Profile prof = cost::default_profile(c.gpu_device(0));
  SearchOptions o;
  EXPECT_THROW(search(m, c, prof, o), Error);
  o.global_batch = 8;
  o.top_k = 0;
  EXPECT_THROW(search(m, c, prof, o), Error);
}

TEST(SearchTiny, RespectsTopKAndMaxTp) {
  Model m = model_preset("tiny");
  Cluster c = cluster_preset("dgx-h100", 4);
  cost::Profile prof = cost::default_profile(c.gpu_device(0));
  SearchOptions o;
  o.global_batch = 8;
  o.threads = 2;
  o.top_k = 3;
  o.max_tp = 1;
  SearchResult r = search(m, c, prof, o);
  ASSERT_EQ(r.top.size(), 3u);
  for (const Candidate& cand : r.top) EXPECT_EQ(cand.plan.tp, 1);
}

TEST(SearchResimulate, ReRanksTheTopPlansBySimulatedStepTime) {
  Model m = model_preset("tiny");
  Cluster c = cluster_preset("dgx-h100", 4);
  cost::Profile prof = cost::default_profile(c.gpu_device(0));
  SearchOptions o;
  o.global_batch = 8;
  o.threads = 2;
  o.top_k = 6;
  SearchResult r = search(m, c, prof, o);
  ASSERT_EQ(r.top.size(), 6u);
  const Plan untouched = r.top[5].plan;
  resimulate_top(m, c, prof, 4, r);
  for (int i = 0; i < 4; ++i) {
    // Each simulated time is the simulator's own answer for that plan ...
    SimResult direct = simulate(m, c, lower(m, c, r.top[i].plan), prof, false);
    EXPECT_DOUBLE_EQ(r.top[i].simulated_step_s, direct.step_time_s);
    // ... and the re-ranked head is in increasing simulated time.
    if (i > 0) {
      EXPECT_LE(r.top[i - 1].simulated_step_s, r.top[i].simulated_step_s);
    }
  }
  // Plans past the re-ranked head keep their place and are not simulated.
  EXPECT_EQ(r.top[5].simulated_step_s, 0);
  EXPECT_EQ(plan_to_json(r.top[5].plan), plan_to_json(untouched));
}

}  // namespace
}  // namespace parasol::sim
