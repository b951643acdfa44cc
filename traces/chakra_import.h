// Reading Chakra execution traces (MLCommons Chakra's ET format, third_party/chakra/
// et_def.proto) back: the nodes of one rank's file with their dependencies and the attributes
// that traces/chakra_export.h writes, so that an export can be checked against the Program it
// came from, and a Chakra trace written by other tools can be inspected.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace parasol::traces {

struct ChakraNode {
  uint64_t id = 0;
  std::string name;
  std::string type;  // Chakra's NodeType name: "COMP_NODE", "COMM_COLL_NODE", "COMM_SEND_NODE", ...
  std::vector<uint64_t> data_deps;
  std::vector<uint64_t> ctrl_deps;
  uint64_t duration_micros = 0;
  // The attributes of chakra_export.h, where the node has them (else their defaults).
  std::string op_kind;       // parasol's op kind
  int64_t num_ops = 0;       // FLOPs
  uint64_t tensor_size = 0;  // bytes
  bool is_cpu_op = false;
  std::string comm_type;  // Chakra's CollectiveCommType name ("ALL_REDUCE", ...); "" when none
  int64_t comm_size = 0;  // bytes
  std::string pg_name;
  int32_t comm_src = -1, comm_dst = -1, comm_tag = -1;
};

struct ChakraTrace {
  std::string version;            // GlobalMetadata.version
  std::vector<ChakraNode> nodes;  // in file order
};

// Parses a trace's bytes: a GlobalMetadata message then Node messages, each preceded by its size
// as a varint32 (Chakra's protolib framing). A truncated or malformed message is a
// parasol::Error naming `what` and the message's position.
ChakraTrace parse_chakra(const std::string& bytes, const std::string& what);
// Reads and parses the file at `path`; an unreadable file is a parasol::Error naming it.
ChakraTrace read_chakra(const std::string& path);

}  // namespace parasol::traces
