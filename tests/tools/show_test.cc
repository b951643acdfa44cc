// Tests `parasol show` (tools/show.cc): `show model --json` carries the parameter count and the
// FLOPs per token of the text form, and a model read from a file is named after it; `show
// model|cluster|device` without a name lists every preset, in text and JSON.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "core/cluster.h"
#include "core/device.h"
#include "core/model.h"
#include "tests/tools/run_parasol.h"

namespace parasol::tools {
namespace {

using testing_cli::Result;
using testing_cli::run;

nlohmann::json show_json(const std::string& args) {
  Result r = run("show model " + args + " --json");
  EXPECT_EQ(r.code, 0) << r.out;
  return r.code == 0 ? nlohmann::json::parse(r.out) : nlohmann::json::object();
}

TEST(ShowModelJson, CarriesParametersAndFlopsPerToken) {
  for (const char* name : {"llama3-8b", "mixtral-8x7b", "gpt2-124m"}) {
    SCOPED_TRACE(name);
    const Model m = model_preset(name);
    const ParamCounts pc = param_counts(m);
    const FlopsPerToken f = flops_per_token(m);
    const nlohmann::json j = show_json(name);
    EXPECT_EQ(j["parameters"]["total"], pc.total);
    EXPECT_EQ(j["parameters"]["active"], pc.active);
    EXPECT_DOUBLE_EQ(j["flops_per_token"]["forward"].get<double>(), f.forward);
    EXPECT_DOUBLE_EQ(j["flops_per_token"]["training"].get<double>(), f.model);
    EXPECT_DOUBLE_EQ(j["flops_per_token"]["with_full_recompute"].get<double>(),
                     f.with_full_recompute);
    // The model itself stays a model file parasol reads back.
    EXPECT_EQ(param_counts(model_from_json(j["model"])).total, pc.total);
  }
  // MoE: fewer active parameters than in total.
  const nlohmann::json moe = show_json("mixtral-8x7b");
  EXPECT_LT(moe["parameters"]["active"].get<int64_t>(), moe["parameters"]["total"].get<int64_t>());
}

TEST(ShowModel, AFileModelIsNamedAfterItself) {
  // Not the HF family ("llama"): the file's stem less "_config".
  const std::string hf = std::string(PARASOL_TEST_DATA_DIR) + "/hf/llama3_8b_config.json";
  EXPECT_EQ(show_json(hf)["model"]["name"], "llama3_8b");
  const std::filesystem::path dir =
      std::filesystem::path(testing::TempDir()) / "show_test" / "Mistral-7B-v0.1";
  std::filesystem::create_directories(dir);
  std::filesystem::copy_file(std::string(PARASOL_TEST_DATA_DIR) + "/hf/mistral_7b_config.json",
                             dir / "config.json",
                             std::filesystem::copy_options::overwrite_existing);
  EXPECT_EQ(show_json((dir / "config.json").string())["model"]["name"], "Mistral-7B-v0.1");
  Result r = run("show model " + (dir / "config.json").string());
  EXPECT_NE(r.out.find("model Mistral-7B-v0.1:"), std::string::npos) << r.out;
}

// `show WHAT` without a name: every preset of core/ is a row, with its figures in --json.
TEST(ShowListing, ModelsListEveryPreset) {
  const Result text = run("show model");
  ASSERT_EQ(text.code, 0) << text.out;
  const Result js = run("show model --json");
  ASSERT_EQ(js.code, 0) << js.out;
  const auto rows = nlohmann::json::parse(js.out).at("models");
  const auto names = model_preset_names();
  ASSERT_EQ(rows.size(), names.size());
  for (size_t i = 0; i < names.size(); ++i) {
    SCOPED_TRACE(names[i]);
    EXPECT_NE(text.out.find(names[i]), std::string::npos);
    EXPECT_EQ(rows[i].at("name"), names[i]);
    const Model m = model_preset(names[i]);
    EXPECT_EQ(rows[i].at("layers").get<int>(), m.layers);
    EXPECT_DOUBLE_EQ(rows[i].at("parameters").get<double>(), param_counts(m).total);
  }
  // A name (or --model) still shows that one model, not the list.
  const Result one = run("show model llama3-8b");
  EXPECT_EQ(one.code, 0);
  EXPECT_EQ(one.out.rfind("model llama3-8b", 0), 0u) << one.out;
}

TEST(ShowListing, ClustersListEveryPreset) {
  const Result js = run("show cluster --json");
  ASSERT_EQ(js.code, 0) << js.out;
  const auto rows = nlohmann::json::parse(js.out).at("clusters");
  const auto names = cluster_preset_names();
  ASSERT_EQ(rows.size(), names.size());
  const Result text = run("show cluster");
  for (size_t i = 0; i < names.size(); ++i) {
    SCOPED_TRACE(names[i]);
    EXPECT_EQ(rows[i].at("name"), names[i]);
    EXPECT_NE(text.out.find(names[i]), std::string::npos);
    EXPECT_GE(rows[i].at("gpus_per_server").get<int>(), 1);
    // The device named is a known datasheet.
    EXPECT_NO_THROW(device_spec(rows[i].at("device").get<std::string>()));
  }
  // Today's machines (issue 34): GB200 NVL72 racks, H800, MI325X and DGX-2 servers.
  for (const char* name : {"gb200-nvl72", "dgx-h800", "mi325x-8", "dgx2-v100"})
    EXPECT_NE(text.out.find(name), std::string::npos) << name << "\n" << text.out;
  const Result one = run("show cluster dgx-h100 --gpus 16");
  EXPECT_EQ(one.code, 0) << one.out;
  EXPECT_NE(one.out.find("16 x H100-SXM on 2 server(s)"), std::string::npos) << one.out;
}

TEST(ShowListing, DevicesListEveryDatasheetAndShowOne) {
  const Result js = run("show device --json");
  ASSERT_EQ(js.code, 0) << js.out;
  const auto rows = nlohmann::json::parse(js.out).at("devices");
  const auto names = known_devices();
  ASSERT_EQ(rows.size(), names.size());
  for (size_t i = 0; i < names.size(); ++i) EXPECT_EQ(rows[i].at("name"), names[i]);
  const Result text = run("show device");
  for (const char* name : {"GB200", "H800-SXM", "MI325X", "V100-32G"})
    EXPECT_NE(text.out.find(name), std::string::npos) << name << "\n" << text.out;
  const Result one = run("show device h100-sxm --json");
  ASSERT_EQ(one.code, 0) << one.out;
  const auto d = nlohmann::json::parse(one.out);
  EXPECT_EQ(d.at("name"), "H100-SXM");
  EXPECT_DOUBLE_EQ(d.at("peak_bf16_TFLOPs").get<double>(),
                   device_spec("H100-SXM").peak_bf16_flops / 1e12);
  const Result bad = run("show device no-such-gpu");
  EXPECT_EQ(bad.code, 2) << bad.out;
  EXPECT_NE(bad.out.find("no-such-gpu"), std::string::npos) << bad.out;
}

}  // namespace
}  // namespace parasol::tools
