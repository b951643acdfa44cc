// tools/sweep.h: axes' errors, the cluster of a point (a device's own servers, per-GPU figures, a
// partly used last server), a point equal to the search of the
// same request, no-plan rows, the journal's resume after a torn line, CSV.
#include "tools/sweep.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <sstream>

#include "core/cluster.h"
#include "tests/core/expect_error.h"

namespace parasol::tools {
namespace {

// `expr` must throw a user error naming `field`, its message holding `text`.
#define EXPECT_USER_ERROR(expr, field, text) ExpectError([&] { (void)(expr); }, field, text)

// Everything of a row but the time its search took.
Json without_timing(Json row) {
  row.erase("search_s");
  return row;
}

SweepSpec small_sweep() {
  SweepSpec s;
  s.model = "llama3-8b";
  s.cluster = "dgx-h100";
  s.gpus = 16;
  s.search.gbs = 64;
  s.axes.push_back(parse_sweep_axis("device=A100-80G,H100-SXM"));
  s.axes.push_back(parse_sweep_axis("gpus=8,16"));
  return s;
}

TEST(SweepAxis, BadAxesNameTheAxisAndTheValue) {
  EXPECT_USER_ERROR(parse_sweep_axis("nics=8"), "--vary nics", "unknown key");
  EXPECT_USER_ERROR(parse_sweep_axis("gpus="), "--vary gpus", "no values");
  EXPECT_USER_ERROR(parse_sweep_axis("gpus=8,,16"), "--vary gpus", "empty value");
  EXPECT_USER_ERROR(parse_sweep_axis("gpus=eight"), "--vary gpus", "'eight' is not a number");
  EXPECT_USER_ERROR(parse_sweep_axis("gpus=8.5"), "--vary gpus", "not an integer");
  EXPECT_USER_ERROR(parse_sweep_axis("gpus=64:8:8"), "--vary gpus", "STOP is below START");
  EXPECT_USER_ERROR(parse_sweep_axis("gpus=8:64:0"), "--vary gpus", "step must be > 0");
  EXPECT_USER_ERROR(parse_sweep_axis("gpus=8:64:x1"), "--vary gpus", "factor must be > 1");
  EXPECT_USER_ERROR(parse_sweep_axis("gpus"), "--vary", "not KEY=V1,V2");

  SweepSpec s = small_sweep();
  s.axes.push_back(parse_sweep_axis("nic_GBps=50,-1"));
  EXPECT_USER_ERROR(prepare_sweep(s), "--vary nic_GBps", "'-1': cluster.nic_GBps:");
  s = small_sweep();
  s.axes.push_back(parse_sweep_axis("device=Z100"));
  EXPECT_USER_ERROR(prepare_sweep(s), "--vary device", "given twice");
  s = small_sweep();
  s.axes[0] = parse_sweep_axis("device=A100-80G,Z100");
  EXPECT_USER_ERROR(prepare_sweep(s), "--vary device", "'Z100'");
  s = small_sweep();
  s.axes.push_back(parse_sweep_axis("model=gpt5-99t"));
  EXPECT_USER_ERROR(prepare_sweep(s), "--vary model", "'gpt5-99t'");
}

TEST(SweepAxis, AValueNoClusterCanHoldTheModelIsAnErrorAMixedOneARow) {
  // GPT-3 175B's training state is 2.8 TB: 8 A100s hold 640 GB (with no offload).
  SweepSpec s;
  s.model = "gpt3-175b";
  s.search.no_offload = true;
  s.axes.push_back(parse_sweep_axis("gpus=8"));
  EXPECT_USER_ERROR(prepare_sweep(s), "--vary gpus", "'8': no cluster of the sweep with gpus=8");
  // With another model that 8 GPUs hold, the value is useful: GPT-3's 8-GPU point is a row.
  s.axes[0] = parse_sweep_axis("gpus=8,64");
  s.axes.push_back(parse_sweep_axis("model=gpt3-175b,llama3-8b"));
  prepare_sweep(s);
  const Json row = run_sweep_point(s, 0, 1);
  EXPECT_EQ(row["point"]["model"], "gpt3-175b");
  EXPECT_EQ(row["status"], "no_plan");
  EXPECT_NE(row["reason"].get<std::string>().find("cannot hold"), std::string::npos);
}

TEST(SweepCluster, ADeviceTakesItsServersAndPerGpuFiguresScale) {
  SweepSpec s;
  s.cluster = "dgx-a100-80g";
  s.axes.push_back(parse_sweep_axis("device=B200"));
  s.axes.push_back(parse_sweep_axis("gpus_per_server=16"));  // no B200-class server of 16
  prepare_sweep(s);
  const Json c = sweep_point_request(s, 0)["cluster"];
  const Json b200 = cluster_preset_generator("dgx-b200");
  EXPECT_EQ(c["nvlink_GBps"], b200["nvlink_GBps"]);  // DGX B200's NVLink5, not the A100's
  EXPECT_EQ(c["gpus_per_server"], 16);
  EXPECT_EQ(c["nics_per_server"], 16);  // one NIC per GPU, as the base
  EXPECT_DOUBLE_EQ(c["host_memory_GiB"].get<double>(), b200["host_memory_GiB"].get<double>() * 2);
  // A figure that is an axis keeps its value.
  s.axes.push_back(parse_sweep_axis("nvlink_GBps=100"));
  prepare_sweep(s);
  EXPECT_DOUBLE_EQ(sweep_point_request(s, 0)["cluster"]["nvlink_GBps"].get<double>(), 100);
}

// gpus_per_server=72 on a B200 or GB200 base is a GB200 NVL72 rack: the gb200-nvl72 preset's
// server figures (its NVLink domain, Grace C2C host links, hosts and NICs) and device, not DGX
// B200's scaled by 9; a device axis keeps its device.
TEST(SweepCluster, SeventyTwoGpusPerServerOfBlackwellAreTheNvl72Rack) {
  const Json nvl72 = cluster_preset_generator("gb200-nvl72");
  for (const std::string base : {"dgx-b200", "gb200-nvl72"}) {
    SCOPED_TRACE(base);
    SweepSpec s;
    s.cluster = base;
    s.gpus = 144;
    s.axes.push_back(parse_sweep_axis("gpus_per_server=8,72"));
    prepare_sweep(s);
    const Json c = sweep_point_request(s, 1)["cluster"];
    ASSERT_EQ(c["gpus_per_server"], 72);
    for (const char* k : {"device", "nvlink_GBps", "pcie_GBps", "nics_per_server", "nic_GBps",
                          "host_memory_GiB", "gpus_per_pcie_switch", "pcie_uplink_GBps", "sockets",
                          "host_memory_bw_GBps", "servers_per_leaf"})
      EXPECT_EQ(c[k], nvl72[k]) << k;
    EXPECT_EQ(cluster_to_json(cluster_from_json(c, 144)),
              cluster_to_json(cluster_preset("gb200-nvl72", 144)));
    // 8 per server on the same silicon is DGX B200 (from the NVL72 base too).
    const Json eight = sweep_point_request(s, 0)["cluster"];
    EXPECT_EQ(eight["device"], "B200");
    EXPECT_EQ(eight["host_memory_GiB"], cluster_preset_generator("dgx-b200")["host_memory_GiB"]);
  }
  // A device axis keeps its device on the rack's servers.
  SweepSpec d;
  d.cluster = "dgx-a100-80g";
  d.axes.push_back(parse_sweep_axis("device=B200"));
  d.axes.push_back(parse_sweep_axis("gpus_per_server=72"));
  prepare_sweep(d);
  const Json c = sweep_point_request(d, 0)["cluster"];
  EXPECT_EQ(c["device"], "B200");
  EXPECT_EQ(c["host_memory_GiB"], nvl72["host_memory_GiB"]);
  EXPECT_EQ(c["pcie_GBps"], nvl72["pcie_GBps"]);
  // Another silicon keeps its own servers, scaled per GPU (no H100 server of 72).
  SweepSpec h;
  h.cluster = "dgx-h100";
  h.axes.push_back(parse_sweep_axis("gpus_per_server=72"));
  prepare_sweep(h);
  const Json hc = sweep_point_request(h, 0)["cluster"];
  EXPECT_EQ(hc["device"], "H100-SXM");
  EXPECT_EQ(hc["nvlink_GBps"], cluster_preset_generator("dgx-h100")["nvlink_GBps"]);
}

// One GPU per server on DGX H200 is DGX H200's servers at one GPU each (its NVLink, PCIe, NIC and
// host figures; NICs, sockets and host memory per GPU), not the h200-1 box: the server-size rule
// brings another product of one silicon, never another box of the same product.
TEST(SweepCluster, AServerSizeOfTheSameProductKeepsTheBasesServers) {
  const Json dgx = cluster_preset_generator("dgx-h200");
  SweepSpec s;
  s.model = "llama3-8b";
  s.cluster = "dgx-h200";
  s.gpus = 8;
  s.axes.push_back(parse_sweep_axis("gpus_per_server=1,8"));
  prepare_sweep(s);
  const Json one = sweep_point_request(s, 0)["cluster"];
  EXPECT_EQ(one["name"], "dgx-h200");
  EXPECT_EQ(one["device"], "H200");
  EXPECT_EQ(one["gpus_per_server"], 1);
  for (const char* k : {"nvlink_GBps", "pcie_GBps", "nic_GBps", "gpus_per_pcie_switch",
                        "pcie_uplink_GBps", "host_memory_bw_GBps", "servers_per_leaf"})
    EXPECT_EQ(one[k], dgx[k]) << k;
  EXPECT_EQ(one["nics_per_server"], dgx["nics_per_server"].get<int>() / 8);
  EXPECT_DOUBLE_EQ(one["host_memory_GiB"].get<double>(), dgx["host_memory_GiB"].get<double>() / 8);
  EXPECT_EQ(one["sockets"], 1);
  // Eight per server is the preset itself.
  const Json eight = sweep_point_request(s, 1)["cluster"];
  EXPECT_EQ(cluster_to_json(cluster_from_json(eight, 8)),
            cluster_to_json(cluster_preset("dgx-h200", 8)));
}

TEST(SweepCluster, AGpuCountOfPartServersLeavesTheLastPartlyUsed) {
  SweepSpec s;
  s.axes.push_back(parse_sweep_axis("gpus_per_server=72"));
  prepare_sweep(s);
  const Json r = sweep_point_request(s, 0);
  const Cluster c = cluster_from_json(r["cluster"], 1024);
  EXPECT_EQ(c.num_gpus(), 1024);
  EXPECT_EQ(c.num_servers(), 15);
  EXPECT_EQ(c.gpus_on_server(14).size(), 1024u - 14 * 72);
  EXPECT_EQ(c.gpus_on_server(0).size(), 72u);
  // Without the sweep's switch the generator still refuses it, naming the key that allows it.
  Json g = r["cluster"];
  g.erase("partial_last_server");
  EXPECT_USER_ERROR(cluster_from_json(g, 1024), "cluster.gpus", "partial_last_server");
}

TEST(SweepPoint, EqualsTheSearchOfItsRequest) {
  SweepSpec s = small_sweep();
  prepare_sweep(s);
  ASSERT_EQ(sweep_point_count(s), 4);
  for (int64_t i : {int64_t{1}, int64_t{3}}) {
    const Json row = run_sweep_point(s, i, 1);
    ASSERT_EQ(row["status"], "ok") << row.dump();
    Json request = sweep_point_request(s, i);
    request["top"] = 1;
    const Json search = search_request(request);
    EXPECT_EQ(row["best_plan"], search["best_plan"]);
    EXPECT_DOUBLE_EQ(row["step_time_s"].get<double>(),
                     search["top"][0]["estimate"]["step_time_s"].get<double>());
    EXPECT_EQ(row["plan"], plan_compact(plan_from_json(search["best_plan"])));
    // Steady figures: 1e9 tokens at the row's rate on every GPU of the point.
    EXPECT_EQ(row["train"]["basis"], "steady");
    const double time_s = 1e9 / row["tokens_per_s"].get<double>();
    EXPECT_NEAR(row["train"]["time_s"].get<double>(), time_s, 1e-9 * time_s);
    EXPECT_NEAR(row["train"]["gpu_hours"].get<double>(), time_s * row["gpus"].get<int>() / 3600,
                1e-6);
    EXPECT_TRUE(row["train"]["cost"].is_null());
  }
}

TEST(SweepPoint, TheSearchFlagsActAsSearchTakesThem) {
  // --framework, --robust and --simulate-top reach each point's search: the row is the first of
  // the search of the same request with those flags.
  SweepSpec s = small_sweep();
  s.search.framework = "megatron";
  s.search.robust = true;
  s.search.simulate_top = 2;
  prepare_sweep(s);
  const Json row = run_sweep_point(s, 3, 1);
  ASSERT_EQ(row["status"], "ok");
  Json request = sweep_point_request(s, 3);
  EXPECT_EQ(request["framework"], "megatron");
  request["top"] = 2;
  const Json search = search_request(request);
  EXPECT_EQ(row["best_plan"], search["best_plan"]);
  ASSERT_TRUE(search["top"][0].contains("simulated_step_time_s"));
  EXPECT_DOUBLE_EQ(row["simulated_step_time_s"].get<double>(),
                   search["top"][0]["simulated_step_time_s"].get<double>());
}

TEST(SweepPoint, TokensAndPricesGiveTheTimeToTrainAndItsCost) {
  SweepSpec s = small_sweep();
  s.search.job.tokens = 1e11;
  s.search.job.price_per_gpu_hour = 2.0;
  s.device_price["H100-SXM"] = 3.0;
  prepare_sweep(s);
  const Json a100 = run_sweep_point(s, 1, 1), h100 = run_sweep_point(s, 3, 1);
  ASSERT_EQ(a100["status"], "ok");
  ASSERT_EQ(h100["status"], "ok");
  Json request = sweep_point_request(s, 3);
  request["top"] = 1;
  const Json search = search_request(request);
  EXPECT_EQ(h100["train"]["basis"], "tokens");
  EXPECT_DOUBLE_EQ(h100["train"]["time_s"].get<double>(),
                   search["top"][0]["job"]["time_to_train_s"].get<double>());
  EXPECT_DOUBLE_EQ(h100["train"]["cost"].get<double>(),
                   h100["train"]["gpu_hours"].get<double>() * 3.0);
  EXPECT_DOUBLE_EQ(a100["train"]["cost"].get<double>(),
                   a100["train"]["gpu_hours"].get<double>() * 2.0);
}

TEST(SweepPoint, APointWithoutAPlanIsARow) {
  // 15 GPUs hold Llama 3 70B's state, but no split of 15 fits its 64 heads, 80 layers and a
  // batch of 64: the search finds no plan, and the row says what the search said.
  SweepSpec s;
  s.model = "llama3-70b";
  s.search.gbs = 64;
  s.search.no_offload = true;
  s.axes.push_back(parse_sweep_axis("gpus=15,16"));
  prepare_sweep(s);
  const Json row = run_sweep_point(s, 0, 1);
  EXPECT_EQ(row["status"], "no_plan");
  EXPECT_NE(row["reason"].get<std::string>().find("search"), std::string::npos) << row["reason"];
  EXPECT_FALSE(row.contains("plan"));
}

TEST(SweepRun, ResumesAfterATornLineToTheSameRows) {
  SweepSpec s = small_sweep();
  prepare_sweep(s);
  const std::string journal = testing::TempDir() + "/sweep_resume.jsonl";
  SweepRunOptions o;
  o.threads = 2;
  o.journal = journal;
  const std::vector<Json> full = run_sweep(s, o);
  ASSERT_EQ(full.size(), 4u);
  std::vector<std::string> lines;
  {
    std::ifstream in(journal);
    for (std::string l; std::getline(in, l);) lines.push_back(l);
  }
  ASSERT_EQ(lines.size(), 5u);  // the header and four rows
  // Interrupted after two rows, in the middle of writing the third.
  {
    std::ofstream out(journal, std::ios::trunc);
    out << lines[0] << "\n" << lines[1] << "\n" << lines[2] << "\n" << lines[3].substr(0, 40);
  }
  // A report of the journal as it is (a torn last line: that point is not done yet).
  EXPECT_EQ(read_sweep_file(journal)["rows"].size(), 2u);
  o.resume = true;
  int64_t resumed = -1;
  const std::vector<Json> again = run_sweep(s, o, &resumed);
  EXPECT_EQ(resumed, 2);
  ASSERT_EQ(again.size(), full.size());
  for (size_t i = 0; i < full.size(); ++i)
    EXPECT_EQ(without_timing(again[i]), without_timing(full[i]));
  // The resumed rows were kept as written (not recomputed), and the journal reads back whole.
  const Json doc = read_sweep_file(journal);
  ASSERT_EQ(doc["rows"].size(), 4u);
  EXPECT_EQ(Json::parse(lines[1]), doc["rows"][Json::parse(lines[1])["index"].get<int>()]);
  // A journal of another sweep is refused, naming --resume.
  s.search.gbs = 128;
  EXPECT_USER_ERROR(run_sweep(s, o), "--resume", "another sweep");
  std::remove(journal.c_str());
}

TEST(SweepRun, SharesOfRanksTogetherAreTheWhole) {
  SweepSpec s = small_sweep();
  prepare_sweep(s);
  SweepRunOptions o;
  o.threads = 1;
  const std::vector<Json> whole = run_sweep(s, o);
  std::vector<Json> parts;
  for (int r = 0; r < 3; ++r) {
    o.rank = r;
    o.ranks = 3;
    for (Json& row : run_sweep(s, o)) {
      EXPECT_EQ(row["index"].get<int>() % 3, r);
      parts.push_back(std::move(row));
    }
  }
  const Json a = sweep_document(s, whole), b = sweep_document(s, parts);
  ASSERT_EQ(a["rows"].size(), b["rows"].size());
  for (size_t i = 0; i < a["rows"].size(); ++i)
    EXPECT_EQ(without_timing(a["rows"][i]), without_timing(b["rows"][i]));
}

TEST(SweepOutput, CsvHasARowPerPointAndQuotesReasons) {
  SweepSpec s;
  s.model = "llama3-70b";
  s.search.gbs = 64;
  s.search.no_offload = true;
  s.axes.push_back(parse_sweep_axis("device=A100-80G"));
  s.axes.push_back(parse_sweep_axis("gpus=15,16"));
  prepare_sweep(s);
  SweepRunOptions o;
  o.threads = 1;
  const std::string csv = sweep_csv(sweep_document(s, run_sweep(s, o)));
  std::istringstream in(csv);
  std::vector<std::string> lines;
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0].rfind("index,device,gpus,status,plan,", 0), 0u) << lines[0];
  EXPECT_EQ(lines[1].rfind("0,A100-80G,15,no_plan,,", 0), 0u) << lines[1];
  EXPECT_EQ(lines[2].rfind("1,A100-80G,16,ok,tp", 0), 0u) << lines[2];
  // A cell holding a comma or a quote is quoted, its quotes doubled.
  Json doc = sweep_document(s, {});
  doc["rows"].push_back({{"index", 0},
                         {"point", {{"device", "A,100"}, {"gpus", 8}}},
                         {"status", "no_plan"},
                         {"reason", "no \"plan\", at all"}});
  EXPECT_NE(sweep_csv(doc).find("0,\"A,100\",8,no_plan,"), std::string::npos) << sweep_csv(doc);
  EXPECT_NE(sweep_csv(doc).find(",\"no \"\"plan\"\", at all\"\n"), std::string::npos);
}

}  // namespace
}  // namespace parasol::tools
