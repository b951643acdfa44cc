// Tests of core/gather_units.h: DeepSpeed ZeRO-3's coalescing of gathers and gradient buckets,
// counted by hand on a Llama-2-70B-shaped layer, and the lowering's calls against them.
#include "core/gather_units.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "core/cluster.h"
#include "core/error.h"
#include "core/lower.h"
#include "core/model.h"
#include "core/plan.h"
#include "core/zero3_live.h"

namespace parasol {
namespace {

// Llama 2 70B: hidden 8192, 64 heads, 8 KV heads, ffn 28672, SwiGLU, RMSNorm, no biases.
Model llama70b() { return llama_model("llama-70b", 80, 8192, 64, 8, 28672, 32000, 4096); }

TEST(GatherUnits, DenseLayerWeightsInForwardOrder) {
  const std::vector<double> w = dense_layer_weights(llama70b(), 1, 0);
  // norm, qkv (8192 x (8192 + 2 x 1024)), out, norm, fc1 (gate | up), fc2.
  const std::vector<double> want = {8192, 8192.0 * 10240, 8192.0 * 8192,
                                    8192, 8192.0 * 57344, 28672.0 * 8192};
  EXPECT_EQ(w, want);
  // Tensor parallelism splits the column linears' outputs and the row linears' inputs.
  const std::vector<double> w8 = dense_layer_weights(llama70b(), 8, 0);
  EXPECT_EQ(w8[1], w[1] / 8);
  EXPECT_EQ(w8[5], w[5] / 8);
  EXPECT_EQ(w8[0], 8192);
}

TEST(GatherUnits, DeepSpeedGathersCoalesceUpToThePrefetchBucket) {
  // 5e7 elements: norm + qkv (83.9M) reach it, out (67.1M) alone, norm + fc1 (469.8M), fc2
  // (234.9M): four all-gathers a layer.
  const std::vector<double> w = dense_layer_weights(llama70b(), 1, 0);
  const std::vector<double> calls = gather_calls(w, 5e7);
  ASSERT_EQ(calls.size(), 4u);
  EXPECT_EQ(calls[0], 8192 + 8192.0 * 10240);
  EXPECT_EQ(calls[1], 8192.0 * 8192);
  EXPECT_EQ(calls[2], 8192 + 8192.0 * 57344);
  EXPECT_EQ(calls[3], 28672.0 * 8192);
  // Small weights share a call until it holds the bucket; the rest is the last call.
  EXPECT_EQ(gather_calls({1, 2, 3, 4}, 3), (std::vector<double>{3, 3, 4}));
  EXPECT_EQ(gather_calls({1, 2}, 0), (std::vector<double>{3}));
}

TEST(GatherUnits, DeepSpeedReduceBucketsNeverOverflow) {
  // 5e8 elements, backward order: fc2 (234.9M), then fc1 (469.8M) would overflow: reduce fc2;
  // fc1 + norm (469.8M) then out would overflow: reduce; out + qkv + norm (151M): three calls.
  std::vector<double> w = dense_layer_weights(llama70b(), 1, 0);
  const std::vector<double> back(w.rbegin(), w.rend());
  const std::vector<double> calls = reduce_calls(back, 5e8);
  ASSERT_EQ(calls.size(), 3u);
  EXPECT_EQ(calls[0], 28672.0 * 8192);
  EXPECT_EQ(calls[1], 8192.0 * 57344 + 8192);
  EXPECT_EQ(calls[2], 8192.0 * 8192 + 8192.0 * 10240 + 8192);
  // A gradient larger than the bucket is reduced alone.
  EXPECT_EQ(reduce_calls({1, 5, 1}, 3), (std::vector<double>{1, 5, 1}));
}

TEST(GatherUnits, FractionsFollowThePlansUnit) {
  const std::vector<double> w = dense_layer_weights(llama70b(), 1, 0);
  Plan p;
  p.zero = 3;
  EXPECT_EQ(gather_fractions(p, w), (std::vector<double>{1.0}));
  EXPECT_EQ(reduce_fractions(p, w), (std::vector<double>{1.0}));
  p.zero3_unit = GatherUnit::kModule;
  double sum = 0;
  for (double f : gather_fractions(p, w)) sum += f;
  EXPECT_NEAR(sum, 1.0, 1e-12);
  EXPECT_EQ(gather_fractions(p, w).size(), 4u);
  EXPECT_EQ(reduce_fractions(p, w).size(), 3u);
}

TEST(GatherUnits, TheLoweringGathersTheCoordinatorsCopiesAndReducesItsBuckets) {
  // A lowered DeepSpeed ZeRO-3 Program (core/zero3_live.h): the gathered copies of modules that
  // the coordinator's schedule fetches, those fetched at one use from one layer in one all-gather
  // (2-byte weights), and one reduce-scatter
  // per reduce bucket of each layer's gradients (4-byte gradients), in backward order.
  Model m = llama70b();
  m.layers = 2;
  Plan p;
  p.dp = 8;
  p.global_batch = 8;
  p.zero = 3;
  p.zero3_unit = GatherUnit::kModule;
  ASSERT_TRUE(ds_lazy_gathers(m, p));
  const Program prog = lower_stage(m, p, 0);
  const DsTrace t = ds_stage_trace(m, p, 0, m.layers);
  const DsSchedule s = ds_stage_schedule(m, p, 0, m.layers, 1);
  // The copies, and the all-gathers: those one use fetches from one layer go together; the
  // norms' weights (8,192 elements, under stage3_param_persistence_threshold's 1e5) are
  // persistent, never gathered.
  const std::vector<double> moved = gathered_layer_weights(m, p, 0);
  EXPECT_EQ(moved[0], 0);
  EXPECT_EQ(moved[3], 0);
  double copied = 0;
  int copies = 0;
  std::set<std::pair<int, int>> fetches;
  for (size_t i = 0; i < t.elements.size(); ++i)
    if (s.source[i] == static_cast<int>(i)) {
      const double n = moved[static_cast<size_t>(t.module[i] % t.per_layer)];
      copied += n, ++copies;
      if (n > 0) fetches.insert({s.fetch_step[i], t.module[i] / t.per_layer});
    }
  const std::vector<double> w = dense_layer_weights(m, 1, 0);
  const std::vector<double> back(w.rbegin(), w.rend());
  const std::vector<double> rs = reduce_calls(back, 5e8);
  double gathered = 0;
  int gathers = 0;
  std::vector<double> scatters;
  for (const Op& o : prog.ops) {
    if (o.tags.layer < 0 || o.tags.phase == Phase::kOptimizer) continue;
    if (o.kind == OpKind::kAllGather) gathered += o.bytes, ++gathers;
    if (o.kind == OpKind::kReduceScatter) scatters.push_back(o.bytes);
  }
  EXPECT_EQ(gathers, static_cast<int>(fetches.size()));
  EXPECT_LT(gathers, copies);
  EXPECT_NEAR(gathered / (2 * copied), 1.0, 1e-6);
  // The default reuse distance (1e9) keeps the last layer's last modules from its forward to
  // its backward: fewer gathers than a forward and a backward of every module.
  EXPECT_LT(copies, 2 * m.layers * static_cast<int>(w.size()));
  ASSERT_EQ(scatters.size(), static_cast<size_t>(m.layers) * rs.size());
  for (size_t i = 0; i < scatters.size(); ++i)
    EXPECT_NEAR(scatters[i] / (4 * rs[i % rs.size()]), 1.0, 1e-6) << i;
  // FSDP's layer units: one call each.
  p.zero3_unit = GatherUnit::kLayer;
  for (const Op& o : lower_stage(m, p, 0).ops) EXPECT_TRUE(o.calls.empty()) << o.name;
}

// stage3_param_persistence_threshold (1e5 by default): GPT-3 175B's norms (12,288 elements, a
// weight and a bias each) and biases (qkv 36,864, out 12,288, fc1 49,152, fc2 12,288) are
// persistent; a 25,600-wide layer's fc1 bias (102,400) is not. The lowering gathers them after
// the step, one all-gather each, then the host waits; the coordinator's gathers leave them out.
TEST(GatherUnits, PersistentParametersAreGatheredOnlyAfterTheStep) {
  Model m = gpt_model("gpt3-175b", 2, 12288, 96, 51200, 2048, true);
  Plan p;
  p.dp = 8;
  p.global_batch = 8;
  p.zero = 3;
  p.zero3_unit = GatherUnit::kModule;
  const double h = 12288;
  const std::vector<PersistentParam> x = persistent_params(m, p, 0);
  ASSERT_EQ(x.size(), 8u);
  const std::vector<double> want = {h, h, 3 * h, h, h, h, 4 * h, h};
  const std::vector<int> module = {0, 0, 1, 2, 3, 3, 4, 5};
  for (size_t i = 0; i < x.size(); ++i) {
    EXPECT_EQ(x[i].elements, want[i]) << i;
    EXPECT_EQ(x[i].module, module[i]) << i;
  }
  const std::vector<double> w = dense_layer_weights(m, 1, 0);
  const std::vector<double> g = gathered_layer_weights(m, p, 0);
  EXPECT_EQ(g, (std::vector<double>{0, 3 * h * h, h * h, 0, 4 * h * h, 4 * h * h}));
  Model wide = gpt_model("megatron-1t", 2, 25600, 160, 51200, 2048, true);
  EXPECT_EQ(persistent_params(wide, p, 0).size(), 7u);  // fc1's bias is not
  auto post_step = [&](const Plan& q) {
    std::vector<double> bytes;
    bool synced = false;
    for (const Op& o : lower_stage(m, q, 0).ops) {
      if (o.tags.phase != Phase::kOptimizer) continue;
      if (o.kind == OpKind::kAllGather) bytes.push_back(o.bytes), synced = false;
      if (o.kind == OpKind::kSync && !bytes.empty()) synced = true;
    }
    EXPECT_TRUE(bytes.empty() || synced) << "the host does not wait for the gathers";
    return bytes;
  };
  const std::vector<double> bytes = post_step(p);
  ASSERT_EQ(bytes.size(), x.size() * m.layers);
  for (size_t i = 0; i < bytes.size(); ++i)
    EXPECT_EQ(bytes[i], 2 * want[i % want.size()]) << i;  // 8 ranks divide each
  // A threshold of 0: nothing persists, every module is gathered whole, nothing after the step.
  p.zero3_param_persistence_threshold = 0;
  EXPECT_TRUE(persistent_params(m, p, 0).empty());
  EXPECT_EQ(gathered_layer_weights(m, p, 0), w);
  EXPECT_TRUE(post_step(p).empty());
  // FSDP's units have no persistent parameters.
  p.zero3_unit = GatherUnit::kLayer;
  p.zero3_param_persistence_threshold = Plan{}.zero3_param_persistence_threshold;
  EXPECT_TRUE(persistent_params(m, p, 0).empty());
  EXPECT_TRUE(post_step(p).empty());
}

TEST(GatherUnits, ThePlansBucketsSetTheCalls) {
  // The plan's zero3_prefetch_bucket and zero3_reduce_bucket (DeepSpeed's ds_config keys), not
  // constants: Megatron-DeepSpeed's 1T recipe reduces in 9e7-element buckets.
  const std::vector<double> w = dense_layer_weights(llama70b(), 1, 0);
  Plan p;
  p.zero = 3;
  p.zero3_unit = GatherUnit::kModule;
  p.zero3_reduce_bucket = 90000000;
  // fc2 (234.9M), fc1 (469.8M), norm + out (67.1M), qkv + norm (83.9M): each over 9e7 with
  // the next, four calls.
  EXPECT_EQ(reduce_fractions(p, w).size(), 4u);
  p.zero3_prefetch_bucket = 1;  // every module its own gather
  EXPECT_EQ(gather_fractions(p, w).size(), w.size());
}

// DeepSpeed's coordinator walked by hand. Three modules of 4, 6, 2 elements used in order a, b,
// c, b (b reused): with a prefetch bucket of 5 and max_live 100, the use of a fetches a (4) and
// prefetches b (6 >= 5: one module), 10 live; a is released (never reused); at b, c is
// prefetched (2 < 5, then b's second entry: already live, its elements still counted as v0.6.2
// does: 8 >= 5), 8 live; b stays (reused 2 elements later), c is released; then b alone.
TEST(GatherUnits, TheCoordinatorBoundsTheLiveParameters) {
  const std::vector<double> trace = {4, 6, 2, 6};
  const std::vector<int> module = {0, 1, 2, 1};
  EXPECT_EQ(deepspeed_live_peak(trace, module, 5, 100, 100), 10);
  // max_live 4: nothing is prefetched once 4 elements are live; the modules in use are fetched
  // regardless: b (kept for its reuse) and c, 8.
  EXPECT_EQ(deepspeed_live_peak(trace, module, 5, 4, 100), 8);
  // No prefetch bucket: the module in use and what the reuse distance keeps (b beside c).
  EXPECT_EQ(deepspeed_live_peak(trace, module, 0, 100, 100), 8);
  // A reuse distance of 1: b is released after its first use (2 elements lie between), so no
  // two modules are ever live together.
  EXPECT_EQ(deepspeed_live_peak(trace, module, 0, 100, 1), 6);
  EXPECT_EQ(deepspeed_live_peak({}, {}, 5, 100, 100), 0);
}

// The 1T GPT of DeepSpeed on Azure (hidden 25600, tp 1): a layer of 7.9e9 elements, its MLP
// linears 2.6e9 each. Under stage3_max_live_parameters 3e9 and a 5e7 prefetch bucket the
// coordinator holds the module in use and the one prefetched after it, at most fc1 and fc2
// (5.2e9), where a layer and the next prefetched whole would be 15.7e9.
TEST(GatherUnits, TheOneTrillionRecipeHoldsTwoModulesNotTwoLayers) {
  Model m = gpt_model("gpt-1t", 4, 25600, 160, 50304, 1024, true);
  const std::vector<double> w = dense_layer_weights(m, 1, 0);
  std::vector<double> trace;
  std::vector<int> module;
  for (int layer = 0; layer < 4; ++layer)
    for (size_t k = 0; k < w.size(); ++k) {
      trace.push_back(w[k]);
      module.push_back(layer * 100 + static_cast<int>(k));
    }
  double layer = 0, fc = 0;
  for (double x : w) layer += x;
  for (double x : w) fc = std::max(fc, x);
  const double peak = deepspeed_live_peak(trace, module, 5e7, 3e9, 3e9);
  EXPECT_NEAR(peak, 2 * fc, 2 * 25600 + 102400 + 1);  // fc1 and fc2 (with their biases)
  EXPECT_LT(peak, layer);
}

// Under full recompute DeepSpeed keeps a module gathered from its recompute to its backward only
// when what is used in between holds at most stage3_max_reuse_distance elements: the last module
// always (nothing between); in the 1T layer with the recipe's 3e9 none other (fc2's 2.6e9 twice
// lies between fc1's uses), with the default 1e9 in a Llama 70B layer only fc2.
TEST(GatherUnits, TheReuseDistanceDecidesWhatTheBackwardGathersAgain) {
  Plan p;
  p.zero = 3;
  const std::vector<double> w70 = dense_layer_weights(llama70b(), 1, 0);
  EXPECT_TRUE(regathered_weights(p, w70).empty());  // FSDP's layer units: unsharded once
  p.zero3_unit = GatherUnit::kModule;
  std::vector<double> again = regathered_weights(p, w70);
  // fc2's 234.9M twice = 469.8M <= 1e9: fc1 kept; fc1 + fc2 twice > 1e9: the rest gathered.
  ASSERT_EQ(again.size(), 4u);
  EXPECT_EQ(again[0], w70[3]);  // backward order: the MLP norm first
  EXPECT_EQ(again[3], w70[0]);
  p.zero3_max_reuse_distance = int64_t{1} << 40;  // everything kept
  EXPECT_TRUE(regathered_weights(p, w70).empty());
  Model t = gpt_model("gpt-1t", 4, 25600, 160, 50304, 1024, true);
  const std::vector<double> w1t = dense_layer_weights(t, 1, 0);
  p.zero3_max_reuse_distance = 3000000000;
  EXPECT_EQ(regathered_weights(p, w1t).size(), w1t.size() - 1);
}

TEST(GatherUnits, OnlyZero3HasAUnit) {
  Plan p;
  p.zero = 2;
  p.dp = 8;
  p.global_batch = 8;
  p.zero3_unit = GatherUnit::kModule;
  EXPECT_THROW(validate(p, llama70b(), cluster_preset("dgx-h100", 8)), Error);
  EXPECT_EQ(parse_gather_unit("module", "plan.zero3_unit"), GatherUnit::kModule);
  EXPECT_THROW(parse_gather_unit("param", "plan.zero3_unit"), Error);
}

}  // namespace
}  // namespace parasol
