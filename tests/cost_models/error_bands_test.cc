// Tests of the error bands (cost_models/error_bands.h): the family rules and the band arithmetic
// checked by hand, the JSON forms, the bands carried by the Profile, and that the bands compiled
// into the library are those the accuracy suites in tests/data/published give now.
#include "cost_models/error_bands.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "core/error.h"
#include "cost_models/accuracy.h"
#include "cost_models/profile.h"

namespace parasol::cost {
namespace {

using Families = std::vector<std::string>;

// Hand-made bands: rms errors 5% (dense A100), 6% (H100), 12% (cp), 8% (ZeRO-3), 30% (MoE).
ErrorBands hand_bands() {
  return {{"dense-3d-a100", 20, -0.03, 0.05, 0.2},
          {"h100-dense", 9, -0.02, 0.06, 0.13},
          {"long-seq-cp", 10, -0.1, 0.12, 0.25},
          {"zero3-fsdp", 18, -0.1, 0.08, 0.28},
          {"moe", 10, 0.1, 0.30, 0.5}};
}

Plan plan(int tp, int cp, int zero) {
  Plan p;
  p.tp = tp;
  p.cp = cp;
  p.zero = zero;
  return p;
}

TEST(ErrorBandFamilies, DenseFamilyFollowsTheDevice) {
  const Model dense = model_preset("llama3-8b");
  EXPECT_EQ(band_families(dense, cluster_preset("dgx-a100-80g", 8), plan(8, 1, 0)),
            Families{"dense-3d-a100"});
  EXPECT_EQ(band_families(dense, cluster_preset("dgx-a100-40g", 8), plan(8, 1, 1)),
            Families{"dense-3d-a100"});
  EXPECT_EQ(band_families(dense, cluster_preset("dgx-h100", 8), plan(8, 1, 0)),
            Families{"h100-dense"});
  EXPECT_EQ(band_families(dense, cluster_preset("dgx-h200", 8), plan(8, 1, 2)),
            Families{"h100-dense"});
  // Meta's Grand Teton H100s (96 GiB at 500 W) are H100s the h100-dense suite measures.
  EXPECT_EQ(band_families(dense, cluster_preset("grand-teton-h100", 8), plan(8, 1, 0)),
            Families{"h100-dense"});
  EXPECT_EQ(band_families(dense, cluster_preset("dgx-b200", 8), plan(8, 1, 0)), Families{});
}

TEST(ErrorBandFamilies, MoeContextParallelAndZero3ReplaceTheDenseFamily) {
  const Model dense = model_preset("llama3-8b"), moe = model_preset("mixtral-8x7b");
  const Cluster h100 = cluster_preset("dgx-h100", 8);
  EXPECT_EQ(band_families(moe, h100, plan(8, 1, 0)), Families{"moe"});
  EXPECT_EQ(band_families(dense, h100, plan(4, 2, 0)), Families{"long-seq-cp"});
  EXPECT_EQ(band_families(dense, h100, plan(8, 1, 3)), Families{"zero3-fsdp"});
  EXPECT_EQ(band_families(moe, h100, plan(2, 2, 3)),
            (Families{"moe", "long-seq-cp", "zero3-fsdp"}));
  // On a device no suite covers the special families still apply (the plan is unvalidated).
  EXPECT_EQ(band_families(moe, cluster_preset("dgx-b200", 8), plan(8, 1, 0)), Families{"moe"});
}

TEST(ErrorBand, HalfWidthIsTheLargestRmsOfTheFamiliesDrawnOn) {
  const ErrorBands bands = hand_bands();
  const Model dense = model_preset("llama3-8b"), moe = model_preset("mixtral-8x7b");
  const Cluster a100 = cluster_preset("dgx-a100-80g", 8), h100 = cluster_preset("dgx-h100", 8);
  ErrorBand b = error_band(bands, dense, a100, plan(8, 1, 0));
  EXPECT_TRUE(b.validated);
  EXPECT_DOUBLE_EQ(b.fraction, 0.05);
  EXPECT_EQ(b.families, Families{"dense-3d-a100"});
  EXPECT_TRUE(b.unvalidated_reason.empty());
  EXPECT_DOUBLE_EQ(error_band(bands, dense, h100, plan(8, 1, 0)).fraction, 0.06);
  // cp (12%) and ZeRO-3 (8%): the larger.
  b = error_band(bands, dense, h100, plan(4, 2, 3));
  EXPECT_TRUE(b.validated);
  EXPECT_DOUBLE_EQ(b.fraction, 0.12);
  // MoE (30%) with cp (12%).
  EXPECT_DOUBLE_EQ(error_band(bands, moe, a100, plan(4, 2, 0)).fraction, 0.30);
  // 10 s at +-12%: [8.8, 11.2]; the pessimistic step is the high end.
  EXPECT_DOUBLE_EQ(pessimistic_step_time(bands, dense, h100, plan(4, 2, 0), 10.0), 11.2);
  const Json j = band_to_json(error_band(bands, dense, h100, plan(4, 2, 0)), 10.0);
  EXPECT_DOUBLE_EQ(j["fraction"].get<double>(), 0.12);
  EXPECT_DOUBLE_EQ(j["low_s"].get<double>(), 8.8);
  EXPECT_DOUBLE_EQ(j["high_s"].get<double>(), 11.2);
  EXPECT_TRUE(j["validated"].get<bool>());
  EXPECT_EQ(j["families"], Json({"long-seq-cp"}));
  EXPECT_FALSE(j.contains("unvalidated_reason"));
  EXPECT_EQ(band_label(error_band(bands, dense, h100, plan(4, 2, 0))), "± 12%");
}

TEST(ErrorBand, UnvalidatedPlansTakeTheLargestRmsOfAllFamilies) {
  const ErrorBands bands = hand_bands();
  const Model dense = model_preset("llama3-8b");
  const Cluster h100 = cluster_preset("dgx-h100", 8);
  // A device no suite covers.
  ErrorBand b = error_band(bands, dense, cluster_preset("dgx-b200", 8), plan(8, 1, 0));
  EXPECT_FALSE(b.validated);
  EXPECT_DOUBLE_EQ(b.fraction, 0.30);
  EXPECT_NE(b.unvalidated_reason.find("B200"), std::string::npos) << b.unvalidated_reason;
  EXPECT_EQ(band_label(b), "± 30% unvalidated");
  EXPECT_DOUBLE_EQ(
      pessimistic_step_time(bands, dense, cluster_preset("dgx-b200", 8), plan(8, 1, 0), 2.0), 2.6);
  // Any offload.
  Plan off = plan(8, 1, 0);
  off.offload.optimizer = true;
  b = error_band(bands, dense, h100, off);
  EXPECT_FALSE(b.validated);
  EXPECT_DOUBLE_EQ(b.fraction, 0.30);
  EXPECT_NE(b.unvalidated_reason.find("offload"), std::string::npos) << b.unvalidated_reason;
  EXPECT_EQ(band_to_json(b, 1.0)["validated"], false);
  EXPECT_TRUE(band_to_json(b, 1.0).contains("unvalidated_reason"));
  // A family without data (absent, or with no runs).
  ErrorBands no_cp = bands;
  no_cp.erase(no_cp.begin() + 2);
  b = error_band(no_cp, dense, h100, plan(4, 2, 0));
  EXPECT_FALSE(b.validated);
  EXPECT_NE(b.unvalidated_reason.find("long-seq-cp"), std::string::npos);
  ErrorBands zero_runs = bands;
  zero_runs[2].runs = 0;
  EXPECT_FALSE(error_band(zero_runs, dense, h100, plan(4, 2, 0)).validated);
  // No bands at all: unvalidated, half-width 0.
  b = error_band(ErrorBands{}, dense, h100, plan(8, 1, 0));
  EXPECT_FALSE(b.validated);
  EXPECT_DOUBLE_EQ(b.fraction, 0);
}

TEST(ErrorBand, LowEndIsNeverNegative) {
  ErrorBand b;
  b.fraction = 1.5;
  b.validated = true;
  EXPECT_DOUBLE_EQ(band_to_json(b, 4.0)["low_s"].get<double>(), 0);
  EXPECT_DOUBLE_EQ(band_to_json(b, 4.0)["high_s"].get<double>(), 10.0);
}

TEST(ErrorBandJson, RoundTripsAndRejectsBadEntriesNamingThem) {
  const ErrorBands bands = hand_bands();
  const ErrorBands back = error_bands_from_json(error_bands_to_json(bands));
  ASSERT_EQ(back.size(), bands.size());
  for (size_t i = 0; i < bands.size(); ++i) {
    EXPECT_EQ(back[i].family, bands[i].family);
    EXPECT_EQ(back[i].runs, bands[i].runs);
    EXPECT_DOUBLE_EQ(back[i].mean_error, bands[i].mean_error);
    EXPECT_DOUBLE_EQ(back[i].rms_error, bands[i].rms_error);
    EXPECT_DOUBLE_EQ(back[i].max_abs_error, bands[i].max_abs_error);
  }
  const ErrorBands file =
      error_bands_from_file_json(error_bands_file_json(bands, {"a.json"}), "bands");
  EXPECT_EQ(file.size(), bands.size());
  auto fails_naming = [](const Json& j, const std::string& field) {
    try {
      error_bands_from_json(j);
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
      return;
    }
    ADD_FAILURE() << "accepted " << j.dump();
  };
  Json dup = error_bands_to_json(bands);
  dup[1]["family"] = "moe";
  fails_naming(dup, "error_bands[4].family");
  Json negative = error_bands_to_json(bands);
  negative[0]["rms_error"] = -0.1;
  fails_naming(negative, "error_bands[0].rms_error");
  Json typo = error_bands_to_json(bands);
  typo[2]["rms"] = 0.1;
  fails_naming(typo, "error_bands[2]");
  fails_naming(Json::object(), "error_bands");
}

TEST(ErrorBandProfile, DefaultProfilesCarryTheEmbeddedBandsAndJsonKeepsThem) {
  const ErrorBands& embedded = embedded_error_bands();
  ASSERT_FALSE(embedded.empty());
  const Profile p = default_profile(device_spec("H100-SXM", "device"));
  ASSERT_EQ(p.error_bands.size(), embedded.size());
  for (size_t i = 0; i < embedded.size(); ++i) {
    EXPECT_EQ(p.error_bands[i].family, embedded[i].family);
    EXPECT_EQ(p.error_bands[i].rms_error, embedded[i].rms_error);
  }
  // A profile file's "error_bands" replace the defaults; without the key they are kept.
  Json j = profile_to_json(p);
  ASSERT_TRUE(j.contains("error_bands"));
  j["error_bands"] = error_bands_to_json(hand_bands());
  const Profile q = profile_from_json(j);
  ASSERT_EQ(q.error_bands.size(), 5u);
  EXPECT_DOUBLE_EQ(q.error_bands[4].rms_error, 0.30);
  const Model dense = model_preset("llama3-8b");
  const Cluster h100 = cluster_preset("dgx-h100", 8);
  EXPECT_DOUBLE_EQ(error_band(q, dense, h100, plan(8, 1, 0)).fraction, 0.06);
  EXPECT_DOUBLE_EQ(pessimistic_step_time(q, dense, h100, plan(8, 1, 0), 1.0), 1.06);
  j.erase("error_bands");
  EXPECT_EQ(profile_from_json(j).error_bands.size(), embedded.size());
}

// The bands compiled into the library must be those the suites give with today's cost models:
// a change to a model or a suite without regenerating cost_models/error_bands.json fails here.
TEST(ErrorBandData, EmbeddedBandsEqualThePublishedSuitesNow) {
  std::vector<std::string> paths;
  for (const auto& e :
       std::filesystem::directory_iterator(std::string(PARASOL_TEST_DATA_DIR) + "/published"))
    if (e.path().extension() == ".json") paths.push_back(e.path().string());
  std::sort(paths.begin(), paths.end());
  ASSERT_FALSE(paths.empty());
  std::vector<PublishedRun> runs;
  for (const std::string& path : paths) {
    auto more = read_accuracy_suite(read_json_file(path), path);
    runs.insert(runs.end(), more.begin(), more.end());
  }
  const ErrorBands now = error_bands_from_report(run_accuracy(runs));
  const ErrorBands& embedded = embedded_error_bands();
  const std::string fix =
      "cost_models/error_bands.json is stale: run tools/update-error-bands.sh and commit it";
  ASSERT_EQ(embedded.size(), now.size()) << fix;
  for (const FamilyBand& n : now) {
    auto it = std::find_if(embedded.begin(), embedded.end(),
                           [&](const FamilyBand& b) { return b.family == n.family; });
    ASSERT_NE(it, embedded.end()) << "family " << n.family << ": " << fix;
    EXPECT_EQ(it->runs, n.runs) << n.family << ": " << fix;
    EXPECT_NEAR(it->mean_error, n.mean_error, 1e-9) << n.family << ": " << fix;
    EXPECT_NEAR(it->rms_error, n.rms_error, 1e-9) << n.family << ": " << fix;
    EXPECT_NEAR(it->max_abs_error, n.max_abs_error, 1e-9) << n.family << ": " << fix;
  }
}

}  // namespace
}  // namespace parasol::cost
