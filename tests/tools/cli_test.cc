// Tests of the parasol command line as a user runs it: exit codes (0 ok, 2 user error),
// error messages that name the field, --json outputs, and search -> estimate round trip.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

namespace {

struct Result {
  int code;
  std::string out;  // stdout and stderr together
};

Result run(const std::string& args) {
  std::string cmd = std::string(PARASOL_BIN) + " " + args + " 2>&1";
  FILE* pipe = popen(cmd.c_str(), "r");
  std::string out;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0) out.append(buf.data(), n);
  int status = pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

std::string temp_path(const std::string& name) {
  return (testing::TempDir().empty() ? std::string("/tmp/") : testing::TempDir()) + name;
}

TEST(Cli, ValidateRejectsTpThatDoesNotDivideHeads) {
  Result r = run("validate --model llama3-8b --cluster dgx-h100 --gpus 16 --tp 3 --pp 1 --dp 5");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("plan.tp"), std::string::npos) << r.out;
}

TEST(Cli, ValidateAcceptsAValidPlan) {
  Result r = run("validate --model llama3-8b --cluster dgx-h100 --gpus 16 --tp 8 --pp 2 --gbs 32");
  EXPECT_EQ(r.code, 0) << r.out;
}

TEST(Cli, UnknownPresetAndMissingFileAreUserErrors) {
  Result a = run("show model no-such-model");
  EXPECT_EQ(a.code, 2);
  EXPECT_NE(a.out.find("unknown preset"), std::string::npos) << a.out;
  Result b = run("estimate --model /nonexistent/model.json --gpus 8 --tp 8");
  EXPECT_EQ(b.code, 2);
  EXPECT_NE(b.out.find("no such file"), std::string::npos) << b.out;
  Result c = run("validate --tp notanumber");
  EXPECT_EQ(c.code, 2) << c.out;
}

TEST(Cli, MalformedPlanFileNamesTheField) {
  std::string path = temp_path("bad_plan.json");
  std::ofstream(path) << R"({"tp": "eight", "pp": 1})";
  Result r = run("validate --model gpt2-124m --cluster dgx-h100 --gpus 8 --plan " + path);
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("plan.tp"), std::string::npos) << r.out;
  std::ofstream(path) << R"({"tp": 8, "pp": )";
  r = run("validate --model gpt2-124m --cluster dgx-h100 --gpus 8 --plan " + path);
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("malformed JSON"), std::string::npos) << r.out;
}

TEST(Cli, EstimateJsonHasTheDocumentedKeys) {
  Result r = run("estimate --model llama3-8b --cluster dgx-h100 --gpus 16 --tp 8 --pp 2 --gbs 64 --json");
  ASSERT_EQ(r.code, 0) << r.out;
  auto j = nlohmann::json::parse(r.out);
  for (const char* k : {"step_time_s", "tokens_per_s", "mfu", "hfu", "memory_per_gpu_bytes", "fits",
                        "time_breakdown_s", "memory_breakdown_bytes"})
    EXPECT_TRUE(j.contains(k)) << k;
  EXPECT_GT(j["step_time_s"].get<double>(), 0);
}

TEST(Cli, SearchWritesABestPlanThatEstimateReproduces) {
  std::string path = temp_path("best_plan.json");
  Result s = run("search --model llama3-8b --cluster dgx-h100 --gpus 16 --gbs 64 --top 3 --json --out " + path);
  ASSERT_EQ(s.code, 0) << s.out;
  auto sj = nlohmann::json::parse(s.out);
  double searched = sj["top"][0]["estimate"]["step_time_s"].get<double>();
  Result e = run("estimate --plan " + path + " --json");
  ASSERT_EQ(e.code, 0) << e.out;
  auto ej = nlohmann::json::parse(e.out);
  EXPECT_NEAR(ej["step_time_s"].get<double>(), searched, 1e-9 * searched);
}

TEST(Cli, AccuracyPrintsEveryRun) {
  Result r = run(std::string("accuracy --json ") + PARASOL_TEST_DATA_DIR + "/published/korthikanti2022.json");
  ASSERT_EQ(r.code, 0) << r.out;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["runs"].size(), 8u);
}

TEST(Cli, ShowPrintsTheDefaults) {
  Result r = run("show");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("gpt3-175b"), std::string::npos);
  EXPECT_NE(r.out.find("dgx-a100-80g"), std::string::npos);
  EXPECT_NE(r.out.find("plan: tp 8"), std::string::npos);
}

}  // namespace
