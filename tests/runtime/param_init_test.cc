// Tests of runtime/param_init: the draws are pure functions of (seed, name, index) with the
// GPT-2 scheme's statistics, and init_bucket gives every element of every rank's parameters,
// master row and ZeRO shard exactly the value of the serial run's full tensor (padding 0, Adam
// moments 0), whatever the plan.
#include "runtime/param_init.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <set>

#include "state_test_util.h"

namespace parasol::runtime {
namespace {

using testing::all_cases;
using testing::Case;
using testing::flat_to_spec;
using testing::make_plan;
using testing::product;
using testing::ref_full_index;
using testing::shard_begin;
using testing::SimRank;
using testing::SimRun;

constexpr uint64_t kSeed = 1234;

struct Stats {
  double mean = 0, std = 0, within_1sd = 0;
};
Stats stats_of(const Model& m, const std::string& name, uint64_t seed) {
  const TensorInfo t = tensor_info(m, name);
  double s = 0, s2 = 0;
  const int64_t n = t.elements();
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    v[i] = init_value(m, t, seed, i);
    s += v[i];
    s2 += v[i] * v[i];
  }
  Stats st;
  st.mean = s / n;
  st.std = std::sqrt(s2 / n - st.mean * st.mean);
  for (double x : v) st.within_1sd += std::abs(x - st.mean) <= st.std;
  st.within_1sd /= n;
  return st;
}

TEST(ParamInit, DrawsAreAPureFunctionOfSeedNameAndIndex) {
  const Model m = model_preset("tiny");
  for (int64_t i : {0, 1, 77, 4095})
    EXPECT_EQ(init_value(m, "L0.qkv", kSeed, i), init_value(m, "L0.qkv", kSeed, i));
  int same_seed = 0, same_name = 0, same_index = 0;
  for (int64_t i = 0; i < 1000; ++i) {
    const float v = init_value(m, "L0.qkv", kSeed, i);
    same_seed += v == init_value(m, "L0.qkv", kSeed + 1, i);
    same_name += v == init_value(m, "L1.qkv", kSeed, i);
    same_index += v == init_value(m, "L0.qkv", kSeed, i + 1);
  }
  EXPECT_EQ(same_seed, 0);
  EXPECT_EQ(same_name, 0);
  EXPECT_EQ(same_index, 0);
}

// GPT-2: N(0, 0.02) weights, residual projections scaled by 1 / sqrt(2 layers), positions
// N(0, 0.01), and Gaussian (68.3% within one standard deviation).
TEST(ParamInit, FollowsTheGpt2Scheme) {
  const Model m = model_preset("tiny-gpt");  // 2 layers
  const Model moe = testing::gpt_moe();
  const double resid = 0.02 / std::sqrt(2.0 * 2);
  const std::map<std::string, double> want = {
      {"emb.table", 0.02}, {"L0.qkv", 0.02},  {"L0.fc1", 0.02},   {"L1.out", resid},
      {"L1.fc2", resid},   {"emb.pos", 0.01}, {"head.head", 0.02}};
  for (const auto& [name, sd] : want) {
    const Stats s = stats_of(m, name, kSeed);
    const int64_t n = tensor_info(m, name).elements();
    EXPECT_NEAR(s.mean, 0.0, 5 * sd / std::sqrt(double(n))) << name;
    EXPECT_NEAR(s.std, sd, 0.05 * sd) << name;
    EXPECT_NEAR(s.within_1sd, 0.6827, 0.03) << name;
  }
  EXPECT_NEAR(stats_of(moe, "L1.router", kSeed).std, 0.02, 0.004);
  EXPECT_NEAR(stats_of(moe, "L1.efc1", kSeed).std, 0.02, 0.001);
  EXPECT_NEAR(stats_of(moe, "L1.efc2", kSeed).std, resid, 0.05 * resid);
  // Norms: weight 1, layernorm bias 0; linear biases 0.
  for (int64_t i = 0; i < 64; ++i) {
    EXPECT_EQ(init_value(m, "L0.ln1", kSeed, i), 1.0f);
    EXPECT_EQ(init_value(m, "L0.ln1", kSeed, 64 + i), 0.0f);
    EXPECT_EQ(init_value(m, "head.lnf", kSeed, 64 + i), 0.0f);
    EXPECT_EQ(init_value(m, "L0.out.b", kSeed, i), 0.0f);
    EXPECT_EQ(init_value(moe, "L1.efc2.b", kSeed, i), 0.0f);
  }
  for (int64_t i = 0; i < 192; ++i) EXPECT_EQ(init_value(m, "L0.qkv.b", kSeed, i), 0.0f);
  const Model tiny = model_preset("tiny");  // rmsnorm: weights only
  EXPECT_EQ(init_value(tiny, "L1.ln2", kSeed, 63), 1.0f);
}

// The head copy of tied embeddings starts as the table, transposed.
TEST(ParamInit, TiedHeadCopyIsTheTableTransposed) {
  const Model m = model_preset("tiny-gpt");
  for (int64_t v : {0, 3, 511})
    for (int64_t i : {0, 17, 63})
      EXPECT_EQ(init_value(m, "head.head", kSeed, i * 512 + v),
                init_value(m, "emb.table", kSeed, v * 64 + i));
}

// The serial run's full tensors: its parameter buffers (tp = 1: local = full), and with
// tied_copy the head copy a tied model keeps under pp > 1.
std::map<std::string, std::vector<float>> serial_tensors(const Model& m, uint64_t seed,
                                                         bool tied_copy) {
  const Plan p = make_plan({});
  SimRun run(m, p);
  std::map<std::string, std::vector<float>> full;
  for (SimRank& r : run.ranks) {
    init_buckets(m, p, r.coord, r.program->buckets, r.access(), seed);
    for (const ParamBucket& b : r.program->buckets)
      for (size_t s = 0; s < b.specs.size(); ++s) {
        EXPECT_EQ(b.specs[s].shape, tensor_info(m, b.specs[s].name).shape);
        full[b.specs[s].name] = r.buf(b.params[s]);
      }
  }
  if (tied_copy) {  // the pp > 1 head copy: the serial table, transposed
    const std::vector<float>& table = full.at("emb.table");
    std::vector<float>& head = full["head.head"];
    head.resize(table.size());
    for (int64_t v = 0; v < m.vocab; ++v)
      for (int64_t i = 0; i < m.hidden; ++i) head[i * m.vocab + v] = table[v * m.hidden + i];
  }
  return full;
}

// Every plan's every rank holds, in every parameter buffer, master row and ZeRO shard, exactly
// the serial full tensor's element (the reference map), 0 in padding, and zero m and v.
TEST(ParamInit, EveryPlanStartsFromTheSerialWeights) {
  std::map<std::string, std::map<std::string, std::vector<float>>> serial;
  for (const Case& c : all_cases()) {
    SCOPED_TRACE(c.name);
    const bool copy = has_tied_head_copy(c.model, c.plan);
    const std::string key = model_to_json(c.model).dump() + (copy ? "+copy" : "");
    if (!serial.count(key)) serial[key] = serial_tensors(c.model, kSeed, copy);
    const auto& full = serial[key];
    SimRun run(c.model, c.plan);
    int64_t checked = 0, padding = 0;
    for (SimRank& r : run.ranks) {
      for (const ParamBucket& b : r.program->buckets) {
        const int index = r.index(c.plan, b);
        init_bucket(c.model, c.plan, r.coord, index, b, r.access(), kSeed);
        // The value element `local` of spec s must have (0 for padding).
        auto want = [&](int s, int64_t local) {
          const std::string& name = b.specs[s].name;
          const int64_t f = ref_full_index(c.model, c.plan, r.coord, name, local);
          padding += f < 0;
          return f < 0 ? 0.0f : full.at(name)[f];
        };
        // The flat shard (param_shard or a row of opt).
        auto check_shard = [&](const float* row, const char* what) {
          for (int64_t k = 0; k < b.shard; ++k) {
            const auto [s, off] = flat_to_spec(b, shard_begin(b, index) + k);
            const float w = s < 0 ? 0.0f : want(s, off);
            ASSERT_EQ(row[k], w) << what << " of " << b.name << " element " << k << " on rank "
                                 << r.rank;
            ++checked;
          }
        };
        if (b.zero < 3) {
          for (size_t s = 0; s < b.specs.size(); ++s) {
            const std::vector<float>& p = r.buf(b.params[s]);
            for (int64_t i = 0; i < static_cast<int64_t>(p.size()); ++i) {
              ASSERT_EQ(p[i], want(static_cast<int>(s), i))
                  << b.specs[s].name << " element " << i << " on rank " << r.rank;
              ++checked;
            }
          }
        } else {
          check_shard(r.buf(b.param_shard).data(), "param_shard");
        }
        const float* opt = r.buf(b.opt).data();
        int row = 0;
        if (b.master_in_opt) check_shard(opt + b.shard * row++, "master");
        for (int64_t k = 0; k < 2 * b.shard; ++k) ASSERT_EQ(opt[b.shard * row + k], 0.0f);
      }
    }
    EXPECT_GT(checked, 0);
    if (c.name.find("tp4") != std::string::npos) {
      EXPECT_GT(padding, 0);
    }
  }
}

TEST(ParamInit, CoversMasterAndNonMasterLayouts) {
  // The cases exercise both optimizer layouts and ZeRO-3 shards.
  int master = 0, plain = 0, z3 = 0;
  for (const Case& c : all_cases())
    for (const ParamBucket& b : lower_stage(c.model, c.plan, 0).buckets) {
      master += b.master_in_opt;
      plain += !b.master_in_opt;
      z3 += b.zero == 3;
    }
  EXPECT_GT(master, 0);
  EXPECT_GT(plain, 0);
  EXPECT_GT(z3, 0);
}

}  // namespace
}  // namespace parasol::runtime
