// Tests `parasol show` (tools/show.cc): `show model --json` carries the parameter count and the
// FLOPs per token of the text form, and a model read from a file is named after it.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

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

}  // namespace
}  // namespace parasol::tools
