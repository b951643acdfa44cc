// `parasol trace import`, `compare --measured` and `calibrate --measured` through the executable,
// on the bundled PyTorch profiler traces (tests/data/traces) and an Nsight Systems SQLite export
// the test writes: the written trace holds every imported event, the printed summary names the
// unclassified kernels, and broken or truncated files, a missing plan input and conflicting
// arguments are user errors (exit 2) naming the file.
#include <gtest/gtest.h>
#include <sqlite3.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "tests/tools/run_parasol.h"

namespace parasol::testing_cli {
namespace {

const std::string kData = std::string(PARASOL_TEST_DATA_DIR) + "/traces/";
const std::string kRanks =
    kData + "hta_sampled_rank-0.json.gz " + kData + "hta_sampled_rank-1.json.gz";
// The sampled traces are ranks 0 and 1 of a 128-rank job (distributedInfo.world_size): the plan
// must have its world size (a tiny model's plan: the mechanics only).
const std::string kA100 = " --model tiny --cluster dgx-a100-80g --gpus 128 --precision fp32";

std::string temp(const std::string& name) { return ::testing::TempDir() + name; }

nlohmann::json json_of(const Result& r) {
  EXPECT_EQ(r.code, 0) << r.out;
  return nlohmann::json::parse(r.out);
}

TEST(TraceImportCli, WritesParasolsSchemaAndSummarises) {
  const std::string out = temp("imported.json");
  const nlohmann::json s = json_of(run("trace import --json -o " + out + " " + kRanks));
  EXPECT_EQ(s["ranks"], 2);
  EXPECT_EQ(s["files"].size(), 2u);
  int by_kind = 0;
  for (const auto& [k, v] : s["by_kind"].items()) by_kind += v["events"].get<int>();
  EXPECT_EQ(by_kind, s["events"].get<int>());
  // The written file is parasol's trace schema: one complete event per imported event.
  std::ifstream f(out);
  const nlohmann::json t = nlohmann::json::parse(f);
  EXPECT_EQ(t["otherData"]["source"], "measured");
  int complete = 0;
  for (const auto& e : t["traceEvents"]) complete += e["ph"] == "X";
  EXPECT_EQ(complete, s["events"].get<int>());

  const Result text = run("trace import " + kRanks);
  EXPECT_EQ(text.code, 0) << text.out;
  EXPECT_NE(text.out.find("unclassified kernels"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("fbgemm_gpu::permute_2D_lengths_kernel"), std::string::npos);
  EXPECT_NE(text.out.find("all-to-all"), std::string::npos);
  EXPECT_NE(text.out.find("launch gaps"), std::string::npos);
}

TEST(TraceImportCli, BrokenFilesExitTwoNamingTheFile) {
  const std::string cut = temp("cut.json");
  std::ofstream(cut) << R"({"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": 1, )";
  Result r = run("trace import " + cut);
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find(cut), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("column"), std::string::npos) << r.out;

  const std::string bad = temp("bad.json");
  std::ofstream(bad) << R"({"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": 1,
                           "dur": "x", "pid": 0, "tid": 7}]})";
  r = run("trace import " + bad);
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find(bad + ".traceEvents[0].dur"), std::string::npos) << r.out;

  // parasol's own trace imports as a measurement without op ids (cli_test's
  // Cli.RunTraceWithoutOpIdsComparesByKindAsPlainCompare); one without events is refused.
  const std::string own = temp("own.json");
  std::ofstream(own) << R"({"traceEvents": [], "otherData": {"generator": "parasol"}})";
  r = run("trace import " + own);
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("is a trace parasol wrote, without events"), std::string::npos) << r.out;
  // A JSON document that is neither: no Kineto header, categories or parasol generator.
  const std::string other = temp("other.json");
  std::ofstream(other) << R"({"traceEvents": [{"ph": "X", "name": "x", "ts": 1, "dur": 1,
                             "pid": 0, "tid": 0}]})";
  r = run("trace import " + other);
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("not a PyTorch profiler trace"), std::string::npos) << r.out;

  r = run("trace import /nonexistent/trace.json");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_EQ(run("trace import").code, 2);
  EXPECT_EQ(run("trace").code, 2);
}

TEST(TraceImportCli, NsightSystemsSqliteExport) {
  // A report in the tables of `nsys export --type sqlite` (a subset of their columns): a GEMM, an
  // NCCL all-reduce and a kernel no rule knows, with their launch calls.
  const std::string db_path = temp("report.sqlite");
  std::remove(db_path.c_str());
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(db_path.c_str(), &db), SQLITE_OK);
  const char* sql = R"(
CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER NOT NULL, end INTEGER NOT NULL,
  deviceId INTEGER, streamId INTEGER NOT NULL, correlationId INTEGER,
  demangledName INTEGER NOT NULL, shortName INTEGER NOT NULL);
CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (start INTEGER NOT NULL, end INTEGER NOT NULL,
  correlationId INTEGER, nameId INTEGER);
INSERT INTO StringIds VALUES (1, 'sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n'),
  (2, 'ncclDevKernel_AllReduce_Sum_bf16_RING_LL'), (3, 'void mystery_kernel(int)'), (4, 'k');
INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (0, 500, 1, 4), (600, 700, 2, 4), (800, 900, 3, 4);
INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (1000, 3000, 0, 7, 1, 1, 4),
  (3000, 9000, 0, 13, 2, 2, 4), (9000, 9500, 0, 7, 3, 3, 4);
)";
  ASSERT_EQ(sqlite3_exec(db, sql, nullptr, nullptr, nullptr), SQLITE_OK);
  sqlite3_close(db);
  const nlohmann::json s = json_of(run("trace import --json " + db_path));
  EXPECT_EQ(s["kernels"], 3);
  EXPECT_EQ(s["by_kind"]["linear"]["events"], 1);
  EXPECT_EQ(s["by_kind"]["all-reduce"]["events"], 1);
  ASSERT_EQ(s["unclassified"].size(), 1u);
  EXPECT_EQ(s["unclassified"][0]["name"], "void mystery_kernel(int)");
  EXPECT_EQ(s["collectives"][0]["sized"], 0);  // a report carries no message sizes
  // A report and a Kineto trace of another rank import together.
  const nlohmann::json both =
      json_of(run("trace import --json " + db_path + " " + kData + "hta_sampled_rank-1.json.gz"));
  EXPECT_EQ(both["ranks"], 2);
}

TEST(CompareMeasuredCli, ImportedTracesBesideThePlan) {
  const nlohmann::json c = json_of(run("compare --json --measured " + kRanks + kA100));
  EXPECT_EQ(c["measured_ranks"], 2);
  EXPECT_EQ(c["measured_kind"], "imported");
  bool linear = false;
  for (const auto& row : c["by_kind"])
    if (row["key"] == "linear") {
      linear = true;
      EXPECT_GT(row["predicted_s"].get<double>(), 0);
      EXPECT_GT(row["measured_s"].get<double>(), 0);
      EXPECT_GT(row["events"].get<int>(), 0);
    }
  EXPECT_TRUE(linear);
  // The imported kernels' phases, from the CPU ops that launched them (autograd: bwd).
  std::map<std::string, double> phase;
  for (const auto& row : c["by_phase"]) phase[row["key"]] = row["measured_s"].get<double>();
  EXPECT_GT(phase["fwd"], 0);
  EXPECT_GT(phase["bwd"], 0);
  std::set<std::string> roles;
  for (const auto& row : c["by_stream"]) roles.insert(row["key"].get<std::string>());
  EXPECT_TRUE(roles.count("compute"));
  EXPECT_TRUE(roles.count("comm"));
  EXPECT_GT(c["step"]["measured_s"].get<double>(), 0);
  EXPECT_GT(c["step"]["predicted_s"].get<double>(), 0);

  const Result text = run("compare --measured " + kRanks + kA100);
  EXPECT_EQ(text.code, 0) << text.out;
  EXPECT_NE(text.out.find("by stream"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("step time error"), std::string::npos) << text.out;

  // Trace files besides --measured, or nothing to compare: user errors.
  EXPECT_EQ(run("compare x.json --measured " + kRanks + kA100).code, 2);
  EXPECT_EQ(run("compare").code, 2);
}

TEST(CalibrateMeasuredCli, FitsFromImportedKernels) {
  const std::string profile = temp("kineto_profile.json");
  // On these traces the fit lowers the kernels' weighted log error and replays their summed time
  // closer to the trace than the default profile (calibrate.h): the profile is written.
  std::remove(profile.c_str());
  const nlohmann::json c =
      json_of(run("calibrate --json -o " + profile + " --measured " + kRanks + kA100));
  EXPECT_GT(c["samples"].get<int>(), 0);
  EXPECT_LT(c["rms_log_error_after"].get<double>(), c["rms_log_error_before"].get<double>());
  EXPECT_FALSE(c["replay_worse"].get<bool>());
  // A figure the traces ask more of than the device can give is pinned at its bound, and
  // marked: these A100 kernels priced on a V100 (allowed as a mismatch) move their bytes faster
  // than the V100's 900 GB/s HBM2 allows (the A100's is 2 TB/s).
  const std::string v100 =
      " --allow-mismatch --model tiny --cluster dgx2-v100 --gpus 128 --precision fp32";
  const std::string slower_profile = temp("kineto_profile_v100.json");
  const nlohmann::json slower =
      json_of(run("calibrate --json -o " + slower_profile + " --measured " + kRanks + v100));
  bool marked = false;
  for (const auto& p : slower["params"])
    if (p["name"] == "memory_efficiency" && p["at_bound"].get<bool>()) {
      EXPECT_EQ(p["fitted"].get<double>(), p["upper"].get<double>());
      marked = true;
    }
  EXPECT_TRUE(marked) << slower.dump();
  const Result pinned = run("calibrate -o " + slower_profile + " --measured " + kRanks + v100);
  EXPECT_EQ(pinned.code, 0) << pinned.out;
  EXPECT_NE(pinned.out.find("at its bound (0.01, 1): the traces ask for more"), std::string::npos)
      << pinned.out;
  const Result fitted = run("calibrate -o " + profile + " --measured " + kRanks + kA100);
  EXPECT_EQ(fitted.code, 0) << fitted.out;
  std::ifstream f(profile);
  EXPECT_TRUE(f.good());
  const nlohmann::json p = nlohmann::json::parse(f);
  EXPECT_TRUE(p.contains("device"));

  // Priced as a bf16 job (allowed though the traces ran fp32), no GEMM is fitted and the fit of
  // the memory-bound kernels alone replays the summed kernel time further from the trace than
  // the default profile: an error, nothing written, unless --allow-worse.
  const std::string bf16_plan =
      " --allow-mismatch --model tiny --cluster dgx-a100-80g --gpus 128 --precision bf16";
  const std::string worse_profile = temp("kineto_profile_worse.json");
  std::remove(worse_profile.c_str());
  const Result worse = run("calibrate -o " + worse_profile + " --measured " + kRanks + bf16_plan);
  EXPECT_EQ(worse.code, 2);
  EXPECT_NE(worse.out.find("replays the traced kernels further from the trace than the base "
                           "profile"),
            std::string::npos)
      << worse.out;
  EXPECT_FALSE(std::ifstream(worse_profile).good());
  const Result allowed_worse =
      run("calibrate --allow-worse -o " + worse_profile + " --measured " + kRanks + bf16_plan);
  EXPECT_EQ(allowed_worse.code, 0) << allowed_worse.out;
  EXPECT_NE(allowed_worse.out.find("(further from the trace: --allow-worse)"), std::string::npos)
      << allowed_worse.out;
  EXPECT_TRUE(std::ifstream(worse_profile).good());

  EXPECT_EQ(run("calibrate --measured " + kRanks + kA100).code, 2);  // no -o
  // A bf16 plan fits none of the traces' (fp32, tf32-math) GEMMs: their efficiency is kept.
  // It contradicts the traces (their GEMMs ran fp32): an error naming both, unless allowed.
  const Result refused = run("calibrate --json -o " + profile + " --measured " + kRanks +
                             " --model tiny --cluster dgx-a100-80g --gpus 128 --precision bf16");
  EXPECT_EQ(refused.code, 2);
  EXPECT_NE(refused.out.find("dtype: most of the trace's GEMM time ran fp32, the plan's "
                             "precision is bf16"),
            std::string::npos)
      << refused.out;
  // Allowed, the mismatch is a warning on stderr (the harness reads it before the JSON).
  Result allowed =
      run("calibrate --json --allow-mismatch --allow-worse -o " + profile + " --measured " +
          kRanks + " --model tiny --cluster dgx-a100-80g --gpus 128 --precision bf16");
  EXPECT_EQ(allowed.out.rfind("warning: dtype: most of the trace's GEMM time ran fp32", 0), 0u);
  allowed.out = allowed.out.substr(allowed.out.find('{'));
  const nlohmann::json bf16 = json_of(allowed);
  for (const auto& p : bf16["params"]) {
    if (p["name"] == "gemm_efficiency.bf16") {
      EXPECT_EQ(p["samples"], 0);
    }
  }
  // parasol's own traces and --measured Kineto traces together: a user error.
  EXPECT_EQ(run("calibrate x.json -o " + profile + " --measured " + kRanks + kA100).code, 2);
}

TEST(CalibrateMeasuredCli, ATraceOfAnotherJobIsRefusedNamingBoth) {
  const std::string profile = temp("mismatch_profile.json");
  // Rank 0 of a job that ran on A100s (deviceProperties) as 2 ranks (distributedInfo): an H100
  // plan, and one of 8 ranks, contradict it.
  const std::string nccl = kData + "hta_nccl_step5_rank-0.json.gz";
  const Result h100 = run("calibrate -o " + profile + " --measured " + nccl +
                          " --model tiny --cluster dgx-h100 --gpus 2 --precision fp32");
  EXPECT_EQ(h100.code, 2);
  EXPECT_NE(h100.out.find("device: the trace ran on NVIDIA A100-PG509-200, the plan's cluster "
                          "has H100"),
            std::string::npos)
      << h100.out;
  EXPECT_NE(h100.out.find("--allow-mismatch"), std::string::npos) << h100.out;
  const Result eight = run("compare --measured " + nccl +
                           " --model tiny --cluster dgx-a100-80g --gpus 8 --precision fp32");
  EXPECT_EQ(eight.code, 2);
  EXPECT_NE(eight.out.find("world size: the trace's job had 2 ranks (distributedInfo.world_size), "
                           "the plan has 8"),
            std::string::npos)
      << eight.out;
  // Asked for, it is priced anyway, with the mismatch as a warning.
  const Result allowed = run("calibrate --allow-mismatch -o " + profile + " --measured " + nccl +
                             " --model tiny --cluster dgx-h100 --gpus 2 --precision fp32");
  EXPECT_EQ(allowed.code, 0) << allowed.out;
  EXPECT_NE(allowed.out.find("warning: device: the trace ran on NVIDIA A100"), std::string::npos);
}

}  // namespace
}  // namespace parasol::testing_cli
