// Program: names of op kinds and roles, phases, buffer classes and roles, and streams; buffer
// sizes; JSON output.
#include "core/program.h"

#include <algorithm>

namespace parasol {

const char* op_kind_name(OpKind k) {
  switch (k) {
    case OpKind::kEmbedding:
      return "embedding";
    case OpKind::kNorm:
      return "norm";
    case OpKind::kLinear:
      return "linear";
    case OpKind::kBias:
      return "bias";
    case OpKind::kActivation:
      return "activation";
    case OpKind::kAttention:
      return "attention";
    case OpKind::kResidualAdd:
      return "residual-add";
    case OpKind::kCrossEntropy:
      return "cross-entropy";
    case OpKind::kRouter:
      return "router";
    case OpKind::kDispatch:
      return "dispatch";
    case OpKind::kCombine:
      return "combine";
    case OpKind::kExpertLinear:
      return "expert-linear";
    case OpKind::kAdamW:
      return "adamw";
    case OpKind::kGradNorm:
      return "grad-norm";
    case OpKind::kCast:
      return "cast";
    case OpKind::kParamNorm:
      return "param-norm";
    case OpKind::kCountZeros:
      return "count-zeros";
    case OpKind::kAllReduce:
      return "all-reduce";
    case OpKind::kAllGather:
      return "all-gather";
    case OpKind::kReduceScatter:
      return "reduce-scatter";
    case OpKind::kAllToAll:
      return "all-to-all";
    case OpKind::kBroadcast:
      return "broadcast";
    case OpKind::kSend:
      return "send";
    case OpKind::kRecv:
      return "recv";
    case OpKind::kOffload:
      return "offload";
    case OpKind::kPrefetch:
      return "prefetch";
    case OpKind::kSync:
      return "sync";
  }
  return "?";
}

const char* host_issue_name(HostIssue h) {
  switch (h) {
    case HostIssue::kEager:
      return "eager";
    case HostIssue::kGraphReplay:
      return "graph-replay";
    case HostIssue::kInGraph:
      return "in-graph";
    case HostIssue::kCompiledEntry:
      return "compiled-entry";
    case HostIssue::kCompiled:
      return "compiled";
  }
  return "?";
}

bool is_communication(OpKind k) {
  switch (k) {
    case OpKind::kAllReduce:
    case OpKind::kAllGather:
    case OpKind::kReduceScatter:
    case OpKind::kAllToAll:
    case OpKind::kBroadcast:
    case OpKind::kSend:
    case OpKind::kRecv:
      return true;
    default:
      return false;
  }
}

const char* phase_name(Phase p) {
  switch (p) {
    case Phase::kForward:
      return "fwd";
    case Phase::kBackward:
      return "bwd";
    case Phase::kRecompute:
      return "recompute";
    case Phase::kOptimizer:
      return "optimizer";
  }
  return "?";
}

const char* buffer_class_name(BufferClass c) {
  switch (c) {
    case BufferClass::kParam:
      return "param";
    case BufferClass::kGrad:
      return "grad";
    case BufferClass::kOptimizer:
      return "optimizer";
    case BufferClass::kActivation:
      return "activation";
    case BufferClass::kWorkspace:
      return "workspace";
  }
  return "?";
}

const char* buffer_role_name(BufferRole r) {
  switch (r) {
    case BufferRole::kNone:
      return "none";
    case BufferRole::kTokens:
      return "tokens";
    case BufferRole::kLabels:
      return "labels";
    case BufferRole::kQkv:
      return "qkv";
    case BufferRole::kKvChunk:
      return "kv-chunk";
    case BufferRole::kAttnOut:
      return "attn-out";
    case BufferRole::kAttnLse:
      return "attn-lse";
    case BufferRole::kAttnProbs:
      return "attn-probs";
    case BufferRole::kAttnOutGrad:
      return "attn-out-grad";
    case BufferRole::kQkvGrad:
      return "qkv-grad";
    case BufferRole::kKvGrad:
      return "kv-grad";
    case BufferRole::kEmbeddingTable:
      return "embedding-table";
    case BufferRole::kExpertRows:
      return "expert-rows";
  }
  return "?";
}

const char* op_role_name(OpRole r) {
  switch (r) {
    case OpRole::kNone:
      return "none";
    case OpRole::kQkv:
      return "qkv";
    case OpRole::kQkvDx:
      return "qkv-dx";
    case OpRole::kWeightGrad:
      return "weight-grad";
    case OpRole::kRouter:
      return "router";
    case OpRole::kRouterDw:
      return "router-dw";
    case OpRole::kHead:
      return "head";
    case OpRole::kExpertAct:
      return "expert-act";
    case OpRole::kAttnResidual:
      return "attn-residual";
    case OpRole::kMlpResidual:
      return "mlp-residual";
    case OpRole::kEmbeddingDropout:
      return "embedding-dropout";
    case OpRole::kSum:
      return "sum";
    case OpRole::kDkvFold:
      return "dkv-fold";
    case OpRole::kQkvPack:
      return "qkv-pack";
    case OpRole::kQkvUnpack:
      return "qkv-unpack";
    case OpRole::kXentMax:
      return "xent-max";
    case OpRole::kXentUnfused:
      return "xent-unfused";
    case OpRole::kDispatchA2a:
      return "dispatch-a2a";
    case OpRole::kCombineA2a:
      return "combine-a2a";
    case OpRole::kDispatchGather:
      return "dispatch-gather";
    case OpRole::kExpertBias:
      return "expert-bias";
    case OpRole::kExpertFc1Bias:
      return "expert-fc1-bias";
    case OpRole::kFp8Amax:
      return "fp8-amax";
    case OpRole::kExpertFp8Amax:
      return "expert-fp8-amax";
    case OpRole::kMainGradAdd:
      return "main-grad-add";
    case OpRole::kGeluFc1:
      return "gelu-fc1";
    case OpRole::kGeluFc2Dx:
      return "gelu-fc2-dx";
    case OpRole::kTpPartialsSum:
      return "tp-partials-sum";
    case OpRole::kLora:
      return "lora";
    case OpRole::kLoraDropout:
      return "lora-dropout";
  }
  return "?";
}

double Buffer::bytes() const {
  double n = 1;
  for (int64_t d : shape) n *= static_cast<double>(d);
  return n * dtype_bytes(dtype);
}

double BufferBlock::bytes(const std::vector<Buffer>& all) const {
  return buffers.empty() ? 0.0 : static_cast<double>(elements) * dtype_bytes(all[buffers[0]].dtype);
}

int64_t shape_elements(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

int64_t Buffer::elements() const { return shape_elements(shape); }

int64_t ParamSpec::elements() const { return shape_elements(shape); }

double attention_flops(const AttnShape& a) {
  if (a.v_head_dim == 0 && a.window == 0) {  // the count before MLA and windows, bit for bit
    const double full =
        4.0 * a.batch * a.heads * static_cast<double>(a.seq_q) * a.seq_kv * a.head_dim;
    if (!a.causal || !a.flash) return full;
    // Causal: a query sees the keys up to its position; with seq_q == seq_kv about half.
    return full * 0.5 * (1.0 + 1.0 / std::max<int64_t>(1, a.seq_kv));
  }
  const double dv = a.v_head_dim > 0 ? a.v_head_dim : a.head_dim;
  const double per_pair = 2.0 * a.batch * a.heads * (a.head_dim + dv);
  const double sq = static_cast<double>(a.seq_q), skv = static_cast<double>(a.seq_kv);
  if (!a.causal || !a.flash) return per_pair * sq * skv;
  if (skv <= 0) return 0;
  // Causal pairs of a sequence of seq_kv under the window (program.h), scaled to seq_q.
  const double w = static_cast<double>(a.window);
  const double pairs = a.window > 0 && w < skv ? skv * w - w * (w - 1) / 2 : skv * (skv + 1) / 2;
  return per_pair * (a.seq_q == a.seq_kv ? pairs : sq * pairs / skv);
}

std::string Program::stream_name(int s) const {
  if (s < 0 || s >= static_cast<int>(streams.size())) return "?";
  switch (streams[s]) {
    case StreamKind::kCompute:
      return "compute";
    case StreamKind::kCopy:
      return "copy";
    case StreamKind::kHost:
      return "host";
    case StreamKind::kComm: {
      int n = 0, index = 0;
      for (int i = 0; i < static_cast<int>(streams.size()); ++i) {
        if (streams[i] != StreamKind::kComm) continue;
        if (i == s) index = n;
        ++n;
      }
      return n > 1 ? "comm" + std::to_string(index) : "comm";
    }
  }
  return "?";
}

int Program::add_buffer(Buffer b) {
  b.id = static_cast<int>(buffers.size());
  buffers.push_back(std::move(b));
  return buffers.back().id;
}

int Program::add_op(Op op) {
  op.id = static_cast<int>(ops.size());
  ops.push_back(std::move(op));
  return ops.back().id;
}

int Program::add_block(const std::vector<int>& ids, int64_t elements) {
  BufferBlock b;
  b.buffers = ids;
  int64_t sum = 0;
  const int index = static_cast<int>(blocks.size());
  for (int id : ids) {
    Buffer& buf = buffers[id];
    sum += buf.elements();
    buf.block = index;
  }
  b.elements = std::max(sum, elements);
  blocks.push_back(std::move(b));
  return index;
}

Json program_to_json(const Program& p) {
  Json streams = Json::array();
  for (int s = 0; s < static_cast<int>(p.streams.size()); ++s) streams.push_back(p.stream_name(s));
  Json buffers = Json::array();
  for (const Buffer& b : p.buffers) {
    Json j = {{"id", b.id},
              {"name", b.name},
              {"shape", b.shape},
              {"dtype", dtype_name(b.dtype)},
              {"class", buffer_class_name(b.cls)},
              {"host", b.host},
              {"persistent", b.persistent},
              {"bytes", b.bytes()}};
    if (b.role != BufferRole::kNone) j["role"] = buffer_role_name(b.role);
    buffers.push_back(std::move(j));
  }
  Json ops = Json::array();
  for (const Op& o : p.ops) {
    Json j = {{"id", o.id},
              {"kind", op_kind_name(o.kind)},
              {"name", o.name},
              {"stream", o.stream},
              {"deps", o.deps},
              {"reads", o.reads},
              {"writes", o.writes},
              {"layer", o.tags.layer},
              {"micro_batch", o.tags.micro_batch},
              {"stage", o.tags.stage},
              {"chunk", o.tags.chunk},
              {"phase", phase_name(o.tags.phase)}};
    if (o.role != OpRole::kNone) j["role"] = op_role_name(o.role);
    if (o.host_issue != HostIssue::kEager) j["host_issue"] = host_issue_name(o.host_issue);
    if (o.tensors > 0) j["tensors"] = o.tensors;
    if (o.m || o.n || o.k) {
      j["m"] = o.m;
      j["n"] = o.n;
      j["k"] = o.k;
      j["batch"] = o.batch;
      if (o.kind == OpKind::kLinear || o.kind == OpKind::kExpertLinear)
        j["backward_data"] = o.backward_data;
    }
    if (o.kind == OpKind::kAttention)
      j["attn"] = {
          {"batch", o.attn.batch},   {"seq_q", o.attn.seq_q},       {"seq_kv", o.attn.seq_kv},
          {"heads", o.attn.heads},   {"kv_heads", o.attn.kv_heads}, {"head_dim", o.attn.head_dim},
          {"causal", o.attn.causal}, {"flash", o.attn.flash},       {"dropout", o.attn.dropout}};
    if (o.elements) j["elements"] = o.elements;
    if (o.bytes) j["bytes"] = o.bytes;
    if (o.flops) j["flops"] = o.flops;
    if (is_communication(o.kind)) j["group"] = group_name(o.group);
    if (o.reduce_max) j["reduce"] = "max";
    if (o.peer_stage >= 0) j["peer_stage"] = o.peer_stage;
    if (o.tag >= 0) j["tag"] = o.tag;
    if (o.p2p_group >= 0) j["p2p_group"] = o.p2p_group;
    ops.push_back(std::move(j));
  }
  return {{"stage", p.stage},
          {"ranks", p.ranks},
          {"streams", streams},
          {"buffers", buffers},
          {"ops", ops}};
}

}  // namespace parasol
