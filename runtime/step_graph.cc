// defines: step_graph_blockers, graph_action_name, StepGraphPolicy (runtime/step_graph.h).
#include "runtime/step_graph.h"

#include <utility>

namespace parasol::runtime {

std::vector<std::string> step_graph_blockers(const Model& model, const Plan& plan,
                                             const Program& prog, const GraphSupport& s) {
  std::vector<std::string> why;
  if (plan.cuda_graphs != CudaGraphs::kFullIteration) {
    why.push_back(std::string("plan.cuda_graphs: ") + cuda_graphs_name(plan.cuda_graphs) +
                  ", not full_iteration");
    return why;
  }
  if (!s.backend_graphs) why.push_back("the backend records no CUDA graphs");
  if (!s.executor_staging)
    why.push_back(
        "the executor uploads each micro-batch's tokens and reads its loss inside the step "
        "(runtime/executor_ops.cc add_losses; StepConfig::stage_host_traffic off)");
  if (model.is_moe() && (plan.ep > 1 || !s.device_moe_routing))
    why.push_back(plan.ep > 1 ? "plan.ep " + std::to_string(plan.ep) +
                                    ": the expert exchange is sized from counts read on the host"
                              : "the backend reads the MoE counts on the host");
  bool sync = false, host = false, comm = false;
  for (const Op& op : prog.ops) {
    if (op.tags.phase == Phase::kOptimizer) continue;  // outside the graph
    if (!sync && op.kind == OpKind::kSync) {
      why.push_back("op " + op.name + ": a device-to-host synchronisation");
      sync = true;
    }
    if (!host) {
      for (const auto* ids : {&op.reads, &op.writes})
        for (int id : *ids)
          if (!host && prog.buffers[id].host) {
            why.push_back("op " + op.name + ": a copy to or from host memory (offload)");
            host = true;
          }
    }
    if (!comm && !s.comm_graphs && is_communication(op.kind)) {
      why.push_back("op " + op.name + ": communication that cannot be captured (MPI)");
      comm = true;
    }
  }
  // A replay runs the graph and then only the optimizer's ops: a buffer of the step (not
  // persistent) that the optimizer reads or writes would not be allocated for them.
  std::vector<char> body(prog.buffers.size(), 0);
  for (const Op& op : prog.ops)
    if (op.tags.phase != Phase::kOptimizer)
      for (const auto* ids : {&op.reads, &op.writes})
        for (int id : *ids) body[id] = 1;
  for (const Op& op : prog.ops) {
    if (op.tags.phase != Phase::kOptimizer) continue;
    for (const auto* ids : {&op.reads, &op.writes})
      for (int id : *ids)
        if (body[id] && !prog.buffers[id].persistent) {
          why.push_back("buffer " + prog.buffers[id].name + ": used by the step's body and by " +
                        "the optimizer's op " + op.name + " (not persistent)");
          return why;
        }
  }
  return why;
}

const char* graph_action_name(GraphAction a) {
  switch (a) {
    case GraphAction::kEager:
      return "eager";
    case GraphAction::kWarmup:
      return "warmup";
    case GraphAction::kCapture:
      return "capture";
    case GraphAction::kReplay:
      return "replay";
  }
  return "?";
}

StepGraphPolicy::StepGraphPolicy(std::vector<std::string> blockers, int warmup)
    : blockers_(std::move(blockers)), warmup_(warmup < 0 ? 0 : warmup) {}

GraphAction StepGraphPolicy::next() {
  reason_.clear();
  if (!blockers_.empty() || !failed_.empty()) {
    reason_ = !failed_.empty() ? failed_ : blockers_.front();
    ++eager_;
    return GraphAction::kEager;
  }
  if (captured_) {
    ++replays_;
    return GraphAction::kReplay;
  }
  if (warmed_ < warmup_) {
    ++warmed_;
    ++eager_;
    return GraphAction::kWarmup;
  }
  captured_ = true;
  ++captures_;
  return GraphAction::kCapture;
}

void StepGraphPolicy::capture_failed(const std::string& why) {
  failed_ = "capture refused: " + why;
  captured_ = false;
}

void StepGraphPolicy::invalidate() {
  captured_ = false;
  warmed_ = 0;
}

}  // namespace parasol::runtime
