// Which ops CUDA graphs and torch.compile issue differently (host_issue.h).
#include "core/host_issue.h"

#include <set>
#include <tuple>

namespace parasol {
namespace {

// Element-wise kinds torch.compile's Inductor fuses into one kernel when they follow each other.
bool elementwise(OpKind k) {
  switch (k) {
    case OpKind::kNorm:
    case OpKind::kBias:
    case OpKind::kActivation:
    case OpKind::kResidualAdd:
      return true;
    default:
      return false;
  }
}

// Ops of an MoE block: their layer syncs on its token counts, which no graph can capture.
bool moe_op(const Op& op) {
  if (is_expert_bias_loop(op.role)) return true;
  switch (op.kind) {
    case OpKind::kRouter:
    case OpKind::kDispatch:
    case OpKind::kCombine:
    case OpKind::kExpertLinear:
      return true;
    default:
      return op.group == Group::kEp && is_communication(op.kind);
  }
}

// The stream of the host and of the layer ops a graph or compiled region holds (lower_internal.h:
// compute 0, layer communication 1).
bool layer_stream(const Program& p, const Op& op) {
  return op.stream <= 1 && p.streams[op.stream] != StreamKind::kHost;
}

}  // namespace

void mark_host_issue(const Model& model, const Plan& plan, Program& program) {
  for (Op& op : program.ops) op.host_issue = HostIssue::kEager;
  if (plan.cuda_graphs == CudaGraphs::kNone && !plan.torch_compile) return;
  using Key = std::tuple<int, int, int, int>;  // layer, micro-batch, chunk, phase
  std::set<Key> graphs, regions;
  std::set<int> moe_layers;
  for (int l = 0; l < model.layers; ++l)
    if (model.is_moe_layer(l)) moe_layers.insert(l);
  bool whole_started = false;
  const Op* previous = nullptr;  // the op before, in its compiled region
  for (Op& op : program.ops) {
    const OpTags& t = op.tags;
    const bool host_op = program.streams[op.stream] == StreamKind::kHost;
    if (host_op) continue;
    if (plan.cuda_graphs == CudaGraphs::kFullIteration && t.phase != Phase::kOptimizer) {
      op.host_issue = whole_started ? HostIssue::kInGraph : HostIssue::kGraphReplay;
      whole_started = true;
      continue;
    }
    const bool in_layer = t.layer >= 0 && t.phase != Phase::kOptimizer && layer_stream(program, op);
    if (!in_layer) continue;
    const Key key{t.layer, t.micro_batch, t.chunk, static_cast<int>(t.phase)};
    if (plan.cuda_graphs == CudaGraphs::kLayers && moe_layers.count(t.layer) == 0 && !moe_op(op)) {
      op.host_issue = graphs.insert(key).second ? HostIssue::kGraphReplay : HostIssue::kInGraph;
      continue;
    }
    if (!plan.torch_compile) continue;
    if (regions.insert(key).second) {
      op.host_issue = HostIssue::kCompiledEntry;
    } else {
      const bool fused = previous && elementwise(op.kind) && elementwise(previous->kind) &&
                         previous->tags.layer == t.layer && previous->tags.phase == t.phase &&
                         previous->tags.micro_batch == t.micro_batch;
      op.host_issue = fused ? HostIssue::kInGraph : HostIssue::kCompiled;
    }
    previous = &op;
  }
}

}  // namespace parasol
