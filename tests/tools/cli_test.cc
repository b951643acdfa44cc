// Tests of the parasol command line as a user runs it: exit codes (0 ok, 2 user error),
// error messages that name the field, --json outputs, and search -> estimate round trip.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

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
  Result r =
      run("estimate --model llama3-8b --cluster dgx-h100 --gpus 16 --tp 8 --pp 2 --gbs 64 --json");
  ASSERT_EQ(r.code, 0) << r.out;
  auto j = nlohmann::json::parse(r.out);
  for (const char* k : {"step_time_s", "tokens_per_s", "mfu", "hfu", "memory_per_gpu_bytes", "fits",
                        "time_breakdown_s", "memory_breakdown_bytes"})
    EXPECT_TRUE(j.contains(k)) << k;
  EXPECT_GT(j["step_time_s"].get<double>(), 0);
}

TEST(Cli, SearchWritesABestPlanThatEstimateReproduces) {
  std::string path = temp_path("best_plan.json");
  Result s =
      run("search --model llama3-8b --cluster dgx-h100 --gpus 16 --gbs 64 --top 3 --json --out " +
          path);
  ASSERT_EQ(s.code, 0) << s.out;
  auto sj = nlohmann::json::parse(s.out);
  double searched = sj["top"][0]["estimate"]["step_time_s"].get<double>();
  Result e = run("estimate --plan " + path + " --json");
  ASSERT_EQ(e.code, 0) << e.out;
  auto ej = nlohmann::json::parse(e.out);
  EXPECT_NEAR(ej["step_time_s"].get<double>(), searched, 1e-9 * searched);
}

TEST(Cli, AccuracyPrintsEveryRun) {
  Result r = run(std::string("accuracy --json ") + PARASOL_TEST_DATA_DIR +
                 "/published/korthikanti2022.json");
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

TEST(Cli, ShowProgramListsTheOpsOfOneRank) {
  const std::string target =
      "show program --model tiny-gpt --cluster dgx-h100 --gpus 8 --tp 2 --pp 2 --gbs 4";
  Result r = run(target + " --rank 5");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("program of rank 5: stage 1 of 2"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("cross-entropy"), std::string::npos);
  EXPECT_NE(r.out.find("all-reduce"), std::string::npos);
  Result j = run(target + " --rank 0 --json");
  ASSERT_EQ(j.code, 0) << j.out;
  auto program = nlohmann::json::parse(j.out);
  EXPECT_EQ(program["stage"], 0);
  ASSERT_GT(program["ops"].size(), 10u);
  EXPECT_EQ(program["ops"][0]["id"], 0);
  EXPECT_GT(program["peak_bytes"].get<double>(), 0);
  Result bad = run(target + " --rank 99");
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.out.find("--rank"), std::string::npos) << bad.out;
}

TEST(Cli, SimulateJsonAndTrace) {
  const std::string trace = temp_path("simulate_trace.json");
  std::remove(trace.c_str());
  Result r =
      run("simulate --model tiny-gpt --cluster dgx-h100 --gpus 8 --tp 2 --pp 2 --gbs 8 --json "
          "--trace " +
          trace);
  ASSERT_EQ(r.code, 0) << r.out;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_GT(j["step_time_s"].get<double>(), 0);
  EXPECT_GT(j["ops_simulated"].get<int64_t>(), 0);
  EXPECT_EQ(j["peak_memory_per_stage_bytes"].size(), 2u);
  EXPECT_EQ(j["stages"].size(), 2u);
  for (const char* k : {"compute", "bubble", "exposed_comm", "exposed_offload"})
    EXPECT_TRUE(j["breakdown_s"].contains(k)) << k;
  // The trace is Chrome trace JSON with one complete event per simulated op.
  std::ifstream f(trace);
  ASSERT_TRUE(f.good());
  auto t = nlohmann::json::parse(f);
  int64_t complete = 0;
  for (const auto& e : t["traceEvents"]) complete += e["ph"] == "X";
  EXPECT_EQ(complete, j["ops_simulated"].get<int64_t>());

  Result text = run("simulate --model tiny-gpt --cluster dgx-h100 --gpus 8 --tp 2 --pp 2 --gbs 8");
  ASSERT_EQ(text.code, 0) << text.out;
  EXPECT_NE(text.out.find("simulated step time"), std::string::npos) << text.out;
  Result bad = run("simulate --model tiny-gpt --cluster dgx-h100 --gpus 8 --tp 3");
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.out.find("plan.tp"), std::string::npos) << bad.out;
}

}  // namespace
