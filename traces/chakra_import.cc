// Reading Chakra execution traces: traces/chakra_import.h.
#include "traces/chakra_import.h"

#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <google/protobuf/util/delimited_message_util.h>

#include <fstream>
#include <iterator>

#include "core/error.h"
#include "et_def.pb.h"

namespace parasol::traces {

namespace {

namespace pb = ChakraProtoMsg;

ChakraNode node_of(const pb::Node& n) {
  ChakraNode c;
  c.id = n.id();
  c.name = n.name();
  c.type = pb::NodeType_Name(n.type());
  c.data_deps.assign(n.data_deps().begin(), n.data_deps().end());
  c.ctrl_deps.assign(n.ctrl_deps().begin(), n.ctrl_deps().end());
  c.duration_micros = n.duration_micros();
  for (const pb::AttributeProto& a : n.attr()) {
    const std::string& k = a.name();
    if (k == "op_kind") c.op_kind = a.string_val();
    if (k == "num_ops") c.num_ops = a.int64_val();
    if (k == "tensor_size") c.tensor_size = a.uint64_val();
    if (k == "is_cpu_op") c.is_cpu_op = a.bool_val();
    if (k == "comm_size") c.comm_size = a.int64_val();
    if (k == "pg_name") c.pg_name = a.string_val();
    if (k == "comm_src") c.comm_src = a.int32_val();
    if (k == "comm_dst") c.comm_dst = a.int32_val();
    if (k == "comm_tag") c.comm_tag = a.int32_val();
    if (k == "comm_type") {
      const int64_t t = a.int64_val();
      c.comm_type = pb::CollectiveCommType_IsValid(static_cast<int>(t))
                        ? pb::CollectiveCommType_Name(static_cast<pb::CollectiveCommType>(t))
                        : std::to_string(t);
    }
  }
  return c;
}

}  // namespace

ChakraTrace parse_chakra(const std::string& bytes, const std::string& what) {
  google::protobuf::io::ArrayInputStream in(bytes.data(), static_cast<int>(bytes.size()));
  ChakraTrace t;
  pb::GlobalMetadata meta;
  bool eof = false;
  if (!google::protobuf::util::ParseDelimitedFromZeroCopyStream(&meta, &in, &eof))
    throw Error(what, eof ? "empty: no GlobalMetadata message"
                          : "the GlobalMetadata message is truncated or malformed");
  t.version = meta.version();
  for (;;) {
    pb::Node n;
    if (!google::protobuf::util::ParseDelimitedFromZeroCopyStream(&n, &in, &eof)) {
      if (eof) break;
      throw Error(what + ".nodes[" + std::to_string(t.nodes.size()) + "]",
                  "truncated or malformed Node message at byte " + std::to_string(in.ByteCount()));
    }
    t.nodes.push_back(node_of(n));
  }
  return t;
}

ChakraTrace read_chakra(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error(path, "cannot open");
  std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  if (f.bad()) throw Error(path, "cannot read");
  return parse_chakra(bytes, path);
}

}  // namespace parasol::traces
