// Tests of the commands as functions (tools/api.h) and of load_request (tools/spec.h): what a
// request derives (dp, the GPU count), a model, cluster and profile given as objects, the
// command options kept out of the plan, and the errors naming the field. The equality with the
// parasol executable's --json is tests/python's.
#include "tools/api.h"

#include <gtest/gtest.h>

#include "core/error.h"
#include "tests/core/expect_error.h"

namespace parasol::tools {
namespace {

const Json kTarget = {{"model", "llama3-8b"}, {"cluster", "dgx-h100"}, {"gpus", 16}};

Json with(Json j, const Json& more) {
  for (const auto& [k, v] : more.items()) j[k] = v;
  return j;
}

TEST(LoadRequest, DerivesDpAndKeepsTheReferences) {
  Spec s = load_request(with(kTarget, {{"tp", 2}, {"pp", 2}}), true);
  EXPECT_EQ(s.plan.dp, 4);
  EXPECT_EQ(s.plan.global_batch, 4);  // dp x mbs, as without a plan file
  EXPECT_EQ(s.cluster->num_gpus(), 16);
  EXPECT_EQ(s.plan.model_ref, "llama3-8b");
  EXPECT_EQ(s.plan.cluster_ref, "dgx-h100");
  EXPECT_EQ(s.plan.gpus_ref, 16);
}

TEST(LoadRequest, WithoutGpusTheDegreesDecide) {
  Spec s =
      load_request({{"model", "llama3-8b"}, {"cluster", "dgx-h100"}, {"tp", 2}, {"dp", 4}}, true);
  EXPECT_EQ(s.cluster->num_gpus(), 8);
}

TEST(LoadRequest, ModelAndClusterObjects) {
  const Model preset = load_model("llama3-8b");
  Json model = model_to_json(preset);
  model["layers"] = 16;
  Spec s = load_request(
      with(kTarget,
           {{"model", model}, {"cluster", {{"preset", "dgx-h100"}, {"gpus", 16}}}, {"tp", 2}}),
      true);
  EXPECT_EQ(s.model.layers, 16);
  EXPECT_EQ(s.cluster->num_gpus(), 16);
  EXPECT_TRUE(s.plan.model_ref.empty());  // an object is no reference
  EXPECT_TRUE(s.plan.cluster_ref.empty());
  EXPECT_EQ(s.plan.dp, 8);
}

TEST(LoadRequest, ProfileObjectMustDescribeTheClustersDevice) {
  Spec h100 = load_request(with(kTarget, {{"tp", 2}}), true);
  const Json profile = cost::profile_to_json(h100.profile);
  Spec s = load_request(with(kTarget, {{"tp", 2}, {"profile", profile}}), true);
  EXPECT_EQ(s.profile.device, h100.profile.device);
  ExpectError(
      [&] {
        load_request(with(kTarget, {{"cluster", "dgx-a100-80g"}, {"profile", profile}}), true);
      },
      "profile.device", "another device");
}

TEST(LoadRequest, ErrorsNameTheField) {
  ExpectError([] { load_request(Json::array(), true); }, "request", "must be an object");
  ExpectError([] { load_request(with(kTarget, {{"tp", 3}}), true); }, "plan.tp", "does not divide");
  ExpectError([] { load_request(with(kTarget, {{"model", 1}}), true); }, "model", "preset name");
  ExpectError(
      [] {
        load_request(with(kTarget, {{"cluster", true}}), true);
      },
      "cluster", "preset name");
}

TEST(Requests, CommandOptionsStayOutOfThePlan) {
  const Json e = estimate_request(with(kTarget, {{"tp", 2}, {"tokens", 1e12}}));
  EXPECT_TRUE(e.contains("job"));
  EXPECT_FALSE(e["plan"].contains("tokens"));
  const Json s = simulate_request(with(kTarget, {{"tp", 2}, {"slow_rank", 0}, {"slow_factor", 2}}));
  EXPECT_GT(s["stragglers"]["mean_s"].get<double>(), s["step_time_s"].get<double>());
  ExpectError(
      [] {
        estimate_request(with(kTarget, {{"tp", 2}, {"tokenz", 1}}));
      },
      "plan.tokenz", "unknown");
}

TEST(Requests, EstimateRequestIsTheDocumentOfItsSpec) {
  const Json request = with(kTarget, {{"tp", 2}, {"pp", 2}, {"gbs", 32}});
  Spec s = load_request(request, true);
  EXPECT_EQ(estimate_request(request), estimate_document(s, run_estimate(s, JobFlags{})));
  EXPECT_EQ(validate_request(request), validate_document(s));
}

TEST(Requests, SearchTakesNoPlanKeys) {
  ExpectError([] { search_request(with(kTarget, {{"tp", 2}})); }, "search.tp", "");
  ExpectError([] { search_request(with(kTarget, {{"gbs", 0}})); }, "search.gbs", ">= 1");
  const Json r = search_request(with(kTarget, {{"gbs", 64}, {"top", 2}}));
  ASSERT_EQ(r["top"].size(), 2u);
  EXPECT_EQ(r["best_plan"]["gpus"], 16);
  EXPECT_EQ(r["best_plan"]["model"], "llama3-8b");
  EXPECT_EQ(r["best_plan"]["gbs"], 64);
}

// torchtitan's op-level recompute is in the space of `search` and `search --framework
// torchtitan`, and not enumerated for a framework whose export refuses it.
TEST(Requests, SearchListsOpLevelRecomputeWhereTheFrameworkRunsIt) {
  struct Listed {
    int64_t enumerated = 0;
    int op_level = 0;
  };
  auto search = [](const std::string& framework) {
    Json request = {{"model", "tiny"}, {"cluster", "dgx-h100"}, {"gpus", 8},
                    {"gbs", 16},       {"top", 100000},         {"threads", 1}};
    if (!framework.empty()) request["framework"] = framework;
    const Json r = search_request(request);
    Listed l;
    l.enumerated = r["enumerated"].get<int64_t>();
    for (const Json& row : r["top"]) l.op_level += row["plan"]["recompute"] == "selective_op";
    return l;
  };
  const Listed any = search(""), titan = search("torchtitan");
  EXPECT_GT(any.op_level, 0);
  EXPECT_GT(titan.op_level, 0);
  EXPECT_EQ(titan.enumerated, any.enumerated);
  for (const char* f : {"megatron", "deepspeed"}) {
    SCOPED_TRACE(f);
    const Listed l = search(f);
    EXPECT_EQ(l.op_level, 0);
    EXPECT_LT(l.enumerated, any.enumerated);
  }
}

}  // namespace
}  // namespace parasol::tools
