// Chakra execution traces of a lowered plan: traces/chakra_export.h.
#include "traces/chakra_export.h"

#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <google/protobuf/util/delimited_message_util.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <map>

#include "core/error.h"
#include "core/issue_graph.h"
#include "core/json_reader.h"
#include "core/lower.h"
#include "core/rank_layout.h"
#include "cost_models/op_cost.h"
#include "et_def.pb.h"

namespace parasol::traces {

namespace {

namespace pb = ChakraProtoMsg;

// Chakra's version of the schema (its generator writes "1.0.0" at the vendored commit).
constexpr const char* kChakraVersion = "1.0.0";

pb::CollectiveCommType comm_type_of(OpKind k) {
  switch (k) {
    case OpKind::kAllReduce:
      return pb::ALL_REDUCE;
    case OpKind::kAllGather:
      return pb::ALL_GATHER;
    case OpKind::kReduceScatter:
      return pb::REDUCE_SCATTER;
    case OpKind::kAllToAll:
      return pb::ALL_TO_ALL;
    case OpKind::kBroadcast:
      return pb::BROADCAST;
    default:
      PARASOL_CHECK(false, std::string("no Chakra collective for ") + op_kind_name(k));
  }
  return pb::ALL_REDUCE;
}

pb::AttributeProto* add_attr(pb::Node& n, const char* name) {
  pb::AttributeProto* a = n.add_attr();
  a->set_name(name);
  return a;
}

int32_t to_int32(int64_t v, const std::string& what) {
  PARASOL_CHECK(
      v >= std::numeric_limits<int32_t>::min() && v <= std::numeric_limits<int32_t>::max(),
      what + " " + std::to_string(v) + " does not fit Chakra's int32");
  return static_cast<int32_t>(v);
}

// Assigns pg_name ids to groups of ranks in the order they are first met.
class GroupIds {
 public:
  std::string id(const std::vector<int>& ranks) {
    auto it = ids_.find(ranks);
    if (it == ids_.end()) {
      it = ids_.emplace(ranks, static_cast<int>(order_.size())).first;
      order_.push_back(ranks);
    }
    return std::to_string(it->second);
  }
  // ASTRA-sim's comm-group configuration: {"<pg_name>": [ranks]}.
  std::string json() const {
    Json j = Json::object();
    for (size_t i = 0; i < order_.size(); ++i) j[std::to_string(i)] = order_[i];
    return j.dump(1) + "\n";
  }

 private:
  std::map<std::vector<int>, int> ids_;
  std::vector<std::vector<int>> order_;
};

// The peer rank of send or receive `op` of `rank`: the rank of stage peer_stage in its pipeline
// group, or the context-parallel ring neighbour peer_stage (at least 1) places on (a send) or
// back (a receive), as the runtime's executor finds them.
int peer_of(const RankLayout& layout, const Op& op, int rank) {
  const std::vector<int> members = layout.group(op.group, rank);
  const int n = static_cast<int>(members.size());
  if (op.group == Group::kPp) {
    PARASOL_CHECK(op.peer_stage >= 0 && op.peer_stage < n,
                  op.name + ": bad peer stage " + std::to_string(op.peer_stage));
    return members[op.peer_stage];
  }
  int i = 0;
  while (i < n && members[i] != rank) ++i;
  PARASOL_CHECK(i < n, op.name + ": rank " + std::to_string(rank) + " outside its group");
  const int step = (op.peer_stage > 0 ? op.peer_stage : 1) % n;
  return members[(op.kind == OpKind::kSend ? i + step : i - step + n) % n];
}

// The bytes a compute or copy op moves: Op::bytes, else the bytes of its buffers.
double tensor_bytes(const Program& p, const Op& op) {
  if (op.bytes > 0) return op.bytes;
  double b = 0;
  for (int id : op.reads) b += p.buffers[id].bytes();
  for (int id : op.writes) b += p.buffers[id].bytes();
  return b;
}

// The node of `op` with the issue graph's edges (core/issue_graph.h): its dependencies, and the op
// before it on its stream.
pb::Node node_of(const IssueGraph& graph, const Op& op, double seconds, int rank,
                 const RankLayout& layout, GroupIds& groups) {
  const Program& p = graph.program();
  pb::Node n;
  n.set_id(op.id);
  n.set_name(op.name);
  for (int d : graph.deps(op.id)) n.add_data_deps(d);
  const int prev_on_stream = graph.stream_prev(op.id);
  bool listed = prev_on_stream < 0;
  for (int d : graph.deps(op.id)) listed = listed || d == prev_on_stream;
  // Chakra's ETFeeder (the reader ASTRA-sim replays through) resolves a node's data_deps only:
  // the stream's order is written there too, and kept in ctrl_deps for the tools that read them.
  if (!listed) {
    n.add_data_deps(prev_on_stream);
    n.add_ctrl_deps(prev_on_stream);
  }
  n.set_duration_micros(static_cast<uint64_t>(std::llround(std::max(seconds, 0.0) * 1e6)));
  add_attr(n, "op_kind")->set_string_val(op_kind_name(op.kind));
  if (op.kind == OpKind::kOffload || op.kind == OpKind::kPrefetch) {
    n.set_type(op.kind == OpKind::kOffload ? pb::MEM_STORE_NODE : pb::MEM_LOAD_NODE);
    add_attr(n, "tensor_size")->set_uint64_val(static_cast<uint64_t>(tensor_bytes(p, op)));
  } else if (op.kind == OpKind::kSend || op.kind == OpKind::kRecv) {
    const bool send = op.kind == OpKind::kSend;
    const int peer = peer_of(layout, op, rank);
    n.set_type(send ? pb::COMM_SEND_NODE : pb::COMM_RECV_NODE);
    add_attr(n, "comm_size")->set_int64_val(static_cast<int64_t>(op.bytes));
    add_attr(n, "pg_name")->set_string_val(groups.id(layout.group(op.group, rank)));
    add_attr(n, "comm_src")->set_int32_val(send ? rank : peer);
    add_attr(n, "comm_dst")->set_int32_val(send ? peer : rank);
    add_attr(n, "comm_tag")->set_int32_val(to_int32(op.tag, op.name + ": tag"));
  } else if (is_communication(op.kind)) {
    n.set_type(pb::COMM_COLL_NODE);
    add_attr(n, "comm_type")->set_int64_val(comm_type_of(op.kind));
    add_attr(n, "comm_size")->set_int64_val(static_cast<int64_t>(op.bytes));
    add_attr(n, "pg_name")->set_string_val(groups.id(layout.group(op.group, rank)));
  } else {
    n.set_type(pb::COMP_NODE);
    add_attr(n, "num_ops")->set_int64_val(static_cast<int64_t>(std::llround(op.flops)));
    add_attr(n, "tensor_size")->set_uint64_val(static_cast<uint64_t>(tensor_bytes(p, op)));
    add_attr(n, "is_cpu_op")->set_bool_val(op.kind == OpKind::kSync || cost::runs_on_host(p, op));
  }
  return n;
}

void append(std::string& out, const google::protobuf::MessageLite& m) {
  google::protobuf::io::StringOutputStream stream(&out);
  PARASOL_CHECK(google::protobuf::util::SerializeDelimitedToZeroCopyStream(m, &stream),
                "a Chakra message failed to serialize");
}

}  // namespace

std::string chakra_file_name(int rank) { return "parasol." + std::to_string(rank) + ".et"; }

std::vector<ChakraFile> chakra_export(const Model& model, const Cluster& cluster, const Plan& plan,
                                      const cost::Profile& profile) {
  const LoweredPlan lowered = lower(model, cluster, plan);
  const RankLayout& layout = lowered.layout;
  // The simulator's pricing (sim/engine.cc): one representative rank per stage.
  const std::vector<int> reps = layout.stage_representatives();
  std::vector<int> stages(plan.pp);
  for (int s = 0; s < plan.pp; ++s) stages[s] = s;
  cost::PlacementCache places(cluster);
  cost::OpPricer pricer(model, cluster, plan, profile, layout, reps, places);
  std::vector<std::vector<double>> seconds(plan.pp);
  for (int s = 0; s < plan.pp; ++s) {
    const Program& p = lowered.programs[s];
    for (const Op& op : p.ops) {
      const bool host = cost::is_compute_kind(op.kind) && cost::runs_on_host(p, op);
      const bool pp_collective = is_communication(op.kind) && op.group == Group::kPp &&
                                 op.kind != OpKind::kSend && op.kind != OpKind::kRecv;
      seconds[s].push_back(pp_collective ? pricer.pp_collective_time(op, stages)
                                         : pricer.time(op, s, host));
    }
  }

  // The execution rules of each stage's Program, checked once (a malformed one is parasol's bug).
  std::vector<IssueGraph> graphs;
  graphs.reserve(plan.pp);
  for (const Program& p : lowered.programs) graphs.emplace_back(p);

  GroupIds groups;
  std::vector<ChakraFile> files;
  for (int rank = 0; rank < layout.world(); ++rank) {
    const Program& p = lowered.program_of(rank);
    pb::GlobalMetadata meta;
    meta.set_version(kChakraVersion);
    auto* a = meta.add_attr();
    a->set_name("schema");
    a->set_string_val("parasol");
    a = meta.add_attr();
    a->set_name("rank");
    a->set_uint64_val(rank);
    a = meta.add_attr();
    a->set_name("world_size");
    a->set_uint64_val(layout.world());
    a = meta.add_attr();
    a->set_name("stage");
    a->set_uint64_val(p.stage);
    ChakraFile f{chakra_file_name(rank), ""};
    append(f.bytes, meta);
    const IssueGraph& graph = graphs[p.stage];
    PARASOL_CHECK(&graph.program() == &p, "rank " + std::to_string(rank) + "'s Program");
    for (const Op& op : p.ops)
      append(f.bytes, node_of(graph, op, seconds[p.stage][op.id], rank, layout, groups));
    files.push_back(std::move(f));
  }
  files.push_back({"comm_group.json", groups.json()});
  return files;
}

}  // namespace parasol::traces
