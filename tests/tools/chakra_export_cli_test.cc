// `parasol export --to chakra` through the executable: one trace per rank and comm_group.json
// written into -o's folder and read back (traces/chakra_import.h) with the Program's op count,
// a plan file as input, and the user errors (exit 2, the flag named): no -o, an -o that cannot be
// a folder, --json, --profile for a framework target.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "core/cluster.h"
#include "core/lower.h"
#include "core/model.h"
#include "tests/tools/run_parasol.h"
#include "traces/chakra_import.h"

namespace {

using parasol::testing_cli::Result;
using parasol::testing_cli::run;

std::string temp_path(const std::string& name) {
  return (testing::TempDir().empty() ? std::string("/tmp/") : testing::TempDir()) + "chakra_cli_" +
         name;
}

const std::string kPlan = "--model tiny --cluster dgx-h100 --gpus 8 --tp 2 --pp 2 --mbs 1 --gbs 8";

TEST(ChakraExportCli, WritesOneTracePerRankThatReadsBack) {
  const std::string dir = temp_path("out");
  std::filesystem::remove_all(dir);
  Result r = run("export --to chakra " + kPlan + " -o " + dir);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("wrote " + dir + "/parasol.7.et"), std::string::npos) << r.out;
  EXPECT_TRUE(std::filesystem::exists(dir + "/comm_group.json"));
  EXPECT_FALSE(std::filesystem::exists(dir + "/parasol.8.et"));

  parasol::Plan p;
  p.tp = 2;
  p.pp = 2;
  p.dp = 2;
  p.micro_batch = 1;
  p.global_batch = 8;
  const parasol::Model m = parasol::model_preset("tiny");
  const parasol::Cluster c = parasol::cluster_preset("dgx-h100", 8);
  parasol::validate(p, m, c);
  const parasol::LoweredPlan lowered = parasol::lower(m, c, p);
  for (int rank = 0; rank < 8; ++rank) {
    const parasol::traces::ChakraTrace t =
        parasol::traces::read_chakra(dir + "/parasol." + std::to_string(rank) + ".et");
    EXPECT_EQ(t.nodes.size(), lowered.program_of(rank).ops.size()) << rank;
  }

  // The same plan from a plan file.
  const std::string plan = temp_path("plan.json");
  std::ofstream(plan) << R"({"model": "tiny", "cluster": "dgx-h100", "gpus": 8, "tp": 2,
                            "pp": 2, "dp": 2, "mbs": 1, "gbs": 8})";
  const std::string dir2 = temp_path("out2");
  std::filesystem::remove_all(dir2);
  r = run("export --to chakra --plan " + plan + " -o " + dir2);
  ASSERT_EQ(r.code, 0) << r.out;
  for (const char* f : {"/parasol.0.et", "/parasol.5.et", "/comm_group.json"}) {
    std::ifstream a(dir + f, std::ios::binary), b(dir2 + f, std::ios::binary);
    EXPECT_EQ(std::string(std::istreambuf_iterator<char>(a), {}),
              std::string(std::istreambuf_iterator<char>(b), {}))
        << f;
  }
}

TEST(ChakraExportCli, BadOutputsAreUserErrors) {
  Result r = run("export --to chakra " + kPlan);
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("error: -o"), std::string::npos) << r.out;

  const std::string file = temp_path("a_file");
  std::ofstream(file) << "x";
  r = run("export --to chakra " + kPlan + " -o " + file + "/sub");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("error: -o"), std::string::npos) << r.out;

  r = run("export --to chakra " + kPlan + " -o " + temp_path("j") + " --json");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("error: --json"), std::string::npos) << r.out;

  r = run("export --to megatron " + kPlan + " --profile " + file);
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("error: --profile"), std::string::npos) << r.out;
}

}  // namespace
