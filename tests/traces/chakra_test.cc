// Chakra execution traces (traces/chakra_export.h, traces/chakra_import.h): the export of tiny on
// an H100 server with tensor, pipeline and data parallelism read back has every rank's ops, their
// dependencies, kinds, sizes and groups as the Program says, the op pricer's durations, sends and
// receives that pair across the files; truncated or missing files are errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <tuple>

#include "core/cluster.h"
#include "core/error.h"
#include "core/json_reader.h"
#include "core/lower.h"
#include "core/model.h"
#include "core/plan.h"
#include "core/rank_layout.h"
#include "cost_models/op_cost.h"
#include "cost_models/profile.h"
#include "traces/chakra_export.h"
#include "traces/chakra_import.h"

namespace parasol::traces {
namespace {

// tiny on 8 H100s: tp 2, pp 2, dp 2, validated.
Plan tiny_plan(const Model& model, const Cluster& cluster) {
  Plan p;
  p.tp = 2;
  p.pp = 2;
  p.dp = 2;
  p.micro_batch = 1;
  p.global_batch = 8;
  validate(p, model, cluster);
  return p;
}

struct Exported {
  Model model = model_preset("tiny");
  Cluster cluster = cluster_preset("dgx-h100", 8);
  Plan plan = tiny_plan(model, cluster);
  cost::Profile profile = cost::default_profile(cluster.gpu_device(0));
  LoweredPlan lowered = lower(model, cluster, plan);
  std::vector<ChakraFile> files = chakra_export(model, cluster, plan, profile);
  std::vector<ChakraTrace> traces;  // per rank
  Json groups;                      // comm_group.json

  Exported() {
    for (int r = 0; r < lowered.layout.world(); ++r)
      traces.push_back(parse_chakra(files.at(r).bytes, files.at(r).name));
    groups = Json::parse(files.back().bytes);
  }
};

const Exported& exported() {
  static const Exported e;
  return e;
}

std::vector<uint64_t> ids(const std::vector<int>& v) { return {v.begin(), v.end()}; }

TEST(Chakra, OneFilePerRankThenTheGroups) {
  const Exported& e = exported();
  ASSERT_EQ(e.files.size(), 9u);
  for (int r = 0; r < 8; ++r) EXPECT_EQ(e.files[r].name, "parasol." + std::to_string(r) + ".et");
  EXPECT_EQ(e.files.back().name, "comm_group.json");
  for (const ChakraTrace& t : e.traces) EXPECT_EQ(t.version, "1.0.0");
}

TEST(Chakra, RoundTripKeepsEveryOpAndItsDependencies) {
  const Exported& e = exported();
  for (int r = 0; r < 8; ++r) {
    const Program& p = e.lowered.program_of(r);
    const ChakraTrace& t = e.traces[r];
    ASSERT_EQ(t.nodes.size(), p.ops.size()) << "rank " << r;
    std::vector<int> last(p.streams.size(), -1);
    for (const Op& op : p.ops) {
      const ChakraNode& n = t.nodes[op.id];
      EXPECT_EQ(n.id, static_cast<uint64_t>(op.id));
      EXPECT_EQ(n.name, op.name);
      EXPECT_EQ(n.op_kind, op_kind_name(op.kind));
      // The stream's order, where the deps do not already say it: in data_deps (what Chakra's
      // ETFeeder reads) and ctrl_deps.
      const int prev = last[op.stream];
      const bool said =
          prev < 0 || std::find(op.deps.begin(), op.deps.end(), prev) != op.deps.end();
      std::vector<uint64_t> data = ids(op.deps);
      if (!said) data.push_back(static_cast<uint64_t>(prev));
      EXPECT_EQ(n.data_deps, data) << op.name;
      EXPECT_EQ(n.ctrl_deps, said ? std::vector<uint64_t>{} : std::vector<uint64_t>{uint64_t(prev)})
          << op.name;
      last[op.stream] = op.id;
    }
  }
}

TEST(Chakra, DataDependenciesAloneKeepEachStreamInOrder) {
  // A reader that honours data_deps only (Chakra's ETFeeder) replays each node when its data
  // deps are done. Its critical path through the durations must then be at least each stream's
  // serial time (a stream runs one op at a time), as in parasol's simulator; with the stream
  // order in ctrl_deps only, the path would be that of the ops' data flow alone.
  const Exported& e = exported();
  for (int r = 0; r < 8; ++r) {
    const Program& p = e.lowered.program_of(r);
    const ChakraTrace& t = e.traces[r];
    std::map<uint64_t, const ChakraNode*> by_id;
    for (const ChakraNode& n : t.nodes) by_id[n.id] = &n;
    std::map<uint64_t, double> finish;  // microseconds
    double path = 0;
    for (const Op& op : p.ops) {  // issue order: every dep comes before
      const ChakraNode& n = *by_id.at(op.id);
      double start = 0;
      for (uint64_t d : n.data_deps) start = std::max(start, finish.at(d));
      finish[n.id] = start + n.duration_micros;
      path = std::max(path, finish[n.id]);
    }
    std::vector<double> serial(p.streams.size(), 0);
    for (const Op& op : p.ops) serial[op.stream] += by_id.at(op.id)->duration_micros;
    for (size_t s = 0; s < serial.size(); ++s)
      EXPECT_GE(path, serial[s]) << "rank " << r << " stream " << s;
  }
}

TEST(Chakra, NodesCarryKindsSizesAndGroups) {
  const Exported& e = exported();
  std::map<std::string, int> types;
  std::set<std::string> colls;
  for (int r = 0; r < 8; ++r) {
    const Program& p = e.lowered.program_of(r);
    for (const Op& op : p.ops) {
      const ChakraNode& n = e.traces[r].nodes[op.id];
      ++types[n.type];
      if (op.kind == OpKind::kSend || op.kind == OpKind::kRecv) {
        EXPECT_EQ(n.type, op.kind == OpKind::kSend ? "COMM_SEND_NODE" : "COMM_RECV_NODE");
        EXPECT_EQ(n.comm_size, static_cast<int64_t>(op.bytes));
        EXPECT_EQ(n.comm_tag, op.tag);
        EXPECT_EQ(op.kind == OpKind::kSend ? n.comm_src : n.comm_dst, r);
      } else if (is_communication(op.kind)) {
        EXPECT_EQ(n.type, "COMM_COLL_NODE");
        EXPECT_EQ(n.comm_size, static_cast<int64_t>(op.bytes));
        colls.insert(n.comm_type);
        const char* want = op.kind == OpKind::kAllReduce       ? "ALL_REDUCE"
                           : op.kind == OpKind::kAllGather     ? "ALL_GATHER"
                           : op.kind == OpKind::kReduceScatter ? "REDUCE_SCATTER"
                           : op.kind == OpKind::kAllToAll      ? "ALL_TO_ALL"
                                                               : "BROADCAST";
        EXPECT_EQ(n.comm_type, want) << op.name;
      } else if (cost::is_compute_kind(op.kind)) {
        EXPECT_EQ(n.type, "COMP_NODE");
        EXPECT_EQ(n.num_ops, std::llround(op.flops));
        EXPECT_GT(n.tensor_size, 0u) << op.name;
      }
      if (is_communication(op.kind)) {
        // pg_name names this rank's group of the op in comm_group.json.
        ASSERT_TRUE(e.groups.contains(n.pg_name)) << op.name;
        EXPECT_EQ(e.groups[n.pg_name].get<std::vector<int>>(), e.lowered.layout.group(op.group, r))
            << op.name;
      }
    }
  }
  EXPECT_GT(types["COMP_NODE"], 0);
  EXPECT_GT(types["COMM_COLL_NODE"], 0);
  EXPECT_GT(types["COMM_SEND_NODE"], 0);
  EXPECT_EQ(types["COMM_SEND_NODE"], types["COMM_RECV_NODE"]);
  EXPECT_TRUE(colls.count("ALL_REDUCE")) << "tensor-parallel and gradient all-reduces";
}

TEST(Chakra, SendsAndReceivesPairAcrossTheFiles) {
  const Exported& e = exported();
  // (src, dst, tag, bytes) of every send, and of every receive.
  std::multiset<std::tuple<int, int, int, int64_t>> sends, recvs;
  for (const ChakraTrace& t : e.traces)
    for (const ChakraNode& n : t.nodes) {
      const auto key = std::make_tuple(n.comm_src, n.comm_dst, n.comm_tag, n.comm_size);
      if (n.type == "COMM_SEND_NODE") sends.insert(key);
      if (n.type == "COMM_RECV_NODE") recvs.insert(key);
    }
  EXPECT_FALSE(sends.empty());
  EXPECT_EQ(sends, recvs);
  for (const auto& [src, dst, tag, bytes] : sends) EXPECT_NE(src, dst);
}

TEST(Chakra, DurationsAreTheOpPricersPrices) {
  const Exported& e = exported();
  const RankLayout& layout = e.lowered.layout;
  const std::vector<int> reps = layout.stage_representatives();
  cost::PlacementCache places(e.cluster);
  cost::OpPricer pricer(e.model, e.cluster, e.plan, e.profile, layout, reps, places);
  uint64_t total = 0;
  for (int s = 0; s < e.plan.pp; ++s) {
    const Program& p = e.lowered.programs[s];
    for (const Op& op : p.ops) {
      if (is_communication(op.kind) && op.group == Group::kPp && op.kind != OpKind::kSend &&
          op.kind != OpKind::kRecv)
        continue;
      const bool host = cost::is_compute_kind(op.kind) && cost::runs_on_host(p, op);
      const ChakraNode& n = e.traces[reps[s]].nodes[op.id];
      EXPECT_EQ(n.duration_micros,
                static_cast<uint64_t>(std::llround(pricer.time(op, s, host) * 1e6)))
          << op.name;
      total += n.duration_micros;
    }
  }
  EXPECT_GT(total, 0u);
}

TEST(Chakra, TruncatedEmptyAndMissingFilesAreErrors) {
  const std::string& good = exported().files[0].bytes;
  EXPECT_THROW(parse_chakra("", "empty.et"), Error);
  try {
    parse_chakra(good.substr(0, good.size() - 3), "cut.et");
    FAIL() << "a truncated file was read";
  } catch (const Error& err) {
    EXPECT_EQ(err.field().rfind("cut.et.nodes[", 0), 0u) << err.field();
  }
  EXPECT_THROW(parse_chakra(std::string("\x05\xff\xff", 3), "bad.et"), Error);
  EXPECT_THROW(read_chakra("/nonexistent/parasol.0.et"), Error);
}

}  // namespace
}  // namespace parasol::traces
