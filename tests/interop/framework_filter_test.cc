// The sweep of `parasol search --framework F` (the search with interop::can_export as its
// filter, as tools/api.cc runs it): for a dense model, Mixtral, Qwen3-30B-A3B and DeepSeek-V3,
// every listed plan exports to F, and the exported files pass F's own checks re-stated from its
// sources (tests/interop/framework_rules.h), which the writers' refusal code does not share.
// The unfiltered search's plans are swept too: each that F's export accepts passes the checks,
// each it refuses names a reason, and for the MoE models the filter removes plans (those
// Megatron-Core refuses for the expert all-to-all overlap among them).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/cluster.h"
#include "core/model.h"
#include "cost_models/profile.h"
#include "interop/interop.h"
#include "sim/search.h"
#include "tests/interop/framework_rules.h"

namespace parasol::interop {
namespace {

struct Space {
  const char* model;
  const char* cluster;
  int gpus;
  int gbs;
};

// The search spaces: small enough for a test, large enough for the MoE plans of the issue
// (expert parallelism with and without the all-to-all overlap, pipelines, recompute sets).
const Space kSpaces[] = {
    {"llama3-8b", "dgx-h100", 32, 128},
    {"mixtral-8x7b", "dgx-h100", 32, 128},
    {"qwen3-30b-a3b", "dgx-h100", 32, 128},
    {"deepseek-v3", "dgx-h100", 128, 512},
};

constexpr int kTop = 30;

class FrameworkFilter : public ::testing::TestWithParam<Space> {};

TEST_P(FrameworkFilter, ListedPlansExportAndPassTheFrameworksChecks) {
  const Space& s = GetParam();
  const Model m = model_preset(s.model);
  const Cluster c = cluster_preset(s.cluster, s.gpus);
  auto search = [&](const std::string& framework) {
    sim::SearchOptions o;
    o.global_batch = s.gbs;
    o.top_k = kTop;
    o.threads = 2;
    if (!framework.empty()) {
      o.accept = [&m, &c, framework](const Plan& p) { return can_export(framework, m, c, p); };
      o.selective_op = runs_selective_op(framework);
      o.tp_impl = framework_tp_impl(framework);
      o.cp_impl = framework_cp_impl(framework);
    }
    return sim::search(m, c, cost::default_profile(c.gpu_device(0)), o);
  };
  const sim::SearchResult all = search("");
  ASSERT_FALSE(all.top.empty());
  for (const std::string& f : framework_names()) {
    SCOPED_TRACE(f);
    if (f == "deepspeed" && m.is_moe()) {
      // DeepSpeed refuses every MoE plan (parasol does not export DeepSpeed-MoE): no list to
      // sweep (the search would enumerate the space for nothing); each plan names the reason.
      for (const sim::Candidate& cand : all.top)
        EXPECT_FALSE(export_refusals(f, m, c, cand.plan).empty()) << plan_to_json(cand.plan);
      continue;
    }
    const sim::SearchResult listed = search(f);
    int refused_unfiltered = 0;
    for (const sim::Candidate& cand : all.top) {
      const auto reasons = export_refusals(f, m, c, cand.plan);
      if (!reasons.empty()) {
        ++refused_unfiltered;
        for (const auto& [field, reason] : reasons) EXPECT_FALSE(field.empty() || reason.empty());
        continue;
      }
      const Export e = export_plan(f, m, c, cand.plan);
      EXPECT_EQ(rules::violations(e), std::vector<std::string>{}) << plan_to_json(cand.plan);
    }
    if (refused_unfiltered == 0) {
      // Nothing to filter: the lists are the same.
      ASSERT_EQ(listed.top.size(), all.top.size());
      for (size_t i = 0; i < all.top.size(); ++i)
        EXPECT_EQ(plan_to_json(listed.top[i].plan), plan_to_json(all.top[i].plan));
    }
    for (const sim::Candidate& cand : listed.top) {
      Export e;
      ASSERT_NO_THROW(e = export_plan(f, m, c, cand.plan)) << plan_to_json(cand.plan);
      EXPECT_EQ(rules::violations(e), std::vector<std::string>{}) << plan_to_json(cand.plan);
    }
    for (const sim::Candidate& cand : listed.pareto)
      EXPECT_TRUE(export_refusals(f, m, c, cand.plan).empty()) << plan_to_json(cand.plan);
    // Its tensor- and context-parallel plans run the framework's own (PyTorch's for torchtitan).
    for (const auto* list : {&listed.top, &listed.pareto})
      for (const sim::Candidate& cand : *list)
        if (cand.plan.tp > 1) EXPECT_EQ(cand.plan.tp_impl, framework_tp_impl(f));
    for (const auto* list : {&listed.top, &listed.pareto})
      for (const sim::Candidate& cand : *list)
        if (cand.plan.cp > 1) EXPECT_EQ(cand.plan.cp_impl, framework_cp_impl(f));
    // The best plan the framework runs is no better than the best of all.
    if (!listed.top.empty()) {
      EXPECT_GE(listed.top.front().score, all.top.front().score);
    }
  }
}

// Megatron-Core's expert all-to-all overlap rules remove MoE plans the unrestricted search
// ranks: among its top plans with the overlap, those with full recompute, 'moe' recompute or a
// pipeline without virtual stages are refused, the others exported.
TEST(FrameworkFilter, TheEpOverlapRulesDecideMegatronsMoePlans) {
  const Model m = model_preset("qwen3-30b-a3b");
  const Cluster c = cluster_preset("dgx-h100", 64);
  sim::SearchOptions o;
  o.global_batch = 256;
  o.top_k = 200;
  o.threads = 2;
  const sim::SearchResult all = sim::search(m, c, cost::default_profile(c.gpu_device(0)), o);
  int overlapped = 0;
  for (const sim::Candidate& cand : all.top) {
    const Plan& p = cand.plan;
    if (!p.ep_comm_overlap) continue;
    ++overlapped;
    const bool breaks = p.recompute == Recompute::kFull || p.recomputes(RecomputeModule::kMoe) ||
                        (p.pp > 1 && p.chunks() < 2) || p.ep < 2 || (p.zero >= 2 && p.pp > 1);
    bool named = false;
    for (const auto& [field, reason] : export_refusals("megatron", m, c, p))
      named = named || reason.find("--overlap-moe-expert-parallel-comm") != std::string::npos;
    EXPECT_EQ(named, breaks) << plan_to_json(p);
  }
  EXPECT_GT(overlapped, 0) << "the search lists no plan with the expert all-to-all overlap";
}

INSTANTIATE_TEST_SUITE_P(Models, FrameworkFilter, ::testing::ValuesIn(kSpaces),
                         [](const ::testing::TestParamInfo<Space>& i) {
                           std::string n = i.param.model;
                           for (char& ch : n)
                             if (ch == '-' || ch == '.') ch = '_';
                           return n;
                         });

}  // namespace
}  // namespace parasol::interop
