// Export of a plan's per-rank Programs as MLCommons Chakra execution traces (the ET format of
// third_party/chakra/et_def.proto), one file per rank, so that Chakra's tools and the simulators
// that read Chakra (ASTRA-sim) replay what parasol predicts.
//
// A file is Chakra's framing (its protolib encodeMessage): a GlobalMetadata message, then one
// Node message per op of the rank's Program in issue order, each preceded by its size as a
// varint32. A node's id is the op's id (core/program.h); data_deps are the op's deps and the
// previous op on the same stream where it is not among them already (a stream runs its ops in
// order; Chakra's ETFeeder, which ASTRA-sim replays through, honours data_deps only), and that
// stream predecessor is also the node's ctrl_deps. Durations are cost::OpPricer's, the prices the
// simulator plays (cost_models/ op_cost.h), rounded to whole microseconds (duration_micros).
//  - compute ops: COMP_NODE with num_ops (int64, Op::flops), tensor_size (uint64 bytes: Op::bytes
//    where the op has them, else the bytes of the buffers it reads and writes) and is_cpu_op (it
//    runs on the host: cost::runs_on_host);
//  - collectives: COMM_COLL_NODE with comm_type (int64, Chakra's CollectiveCommType: ALL_REDUCE,
//    ALL_GATHER, REDUCE_SCATTER, ALL_TO_ALL, BROADCAST), comm_size (int64 bytes, Op::bytes) and
//    pg_name (string: the id of the rank's group in comm_group.json);
//  - sends and receives: COMM_SEND_NODE / COMM_RECV_NODE with comm_size, pg_name, comm_src and
//    comm_dst (int32 ranks) and comm_tag (int32, Op::tag);
//  - offload and prefetch: MEM_STORE_NODE / MEM_LOAD_NODE with tensor_size.
// Every node also has parasol's op kind as the string attribute "op_kind".
// Besides the traces, comm_group.json maps each pg_name to its ranks (ASTRA-sim's
// --comm-group-configuration format: {"0": [0, 1], ...}).
#pragma once

#include <string>
#include <vector>

#include "core/cluster.h"
#include "core/model.h"
#include "core/plan.h"
#include "cost_models/profile.h"

namespace parasol::traces {

struct ChakraFile {
  std::string name;   // "parasol.<rank>.et" or "comm_group.json"
  std::string bytes;  // the file's content (binary for a trace)
};

// The file name of rank `rank`'s trace: "parasol.<rank>.et" (ASTRA-sim's <prefix>.<rank>.et).
std::string chakra_file_name(int rank);

// The traces of every rank of `plan` (one per rank, in rank order), then comm_group.json.
// REQUIRES: validate(plan, model, cluster) passed.
std::vector<ChakraFile> chakra_export(const Model& model, const Cluster& cluster, const Plan& plan,
                                      const cost::Profile& profile);

}  // namespace parasol::traces
