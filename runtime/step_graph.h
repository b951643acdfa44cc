// Whole-step CUDA graphs in parasol's runtime (Plan::cuda_graphs full_iteration: the forward and
// backward of a step captured once and replayed, the optimizer step outside, as Megatron-Core's
// full-iteration graphs): what keeps a Program's step out of one graph, and, step by step,
// whether the executor runs it eagerly, warms it up, captures it or replays it. One decision for
// every backend: the CUDA backend has the capture and replay (Backend::begin_capture,
// end_capture, replay; runtime/cuda/cuda_graph.cc), the CPU backend records none, so on CPUs the
// executor makes the same decisions and runs every step eagerly with the reason reported
// (StepResult::graph_action, graph_reason). The executor stages each step's host traffic outside
// the captured body (StepConfig::stage_host_traffic: the tokens uploaded before, the loss read
// after) and captures the body's ops (every phase but the optimizer's), NCCL's transfers with
// them; a replay launches the graph, then runs the optimizer's ops (runtime/executor.cc).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/model.h"
#include "core/plan.h"
#include "core/program.h"

namespace parasol::runtime {

// What the runtime that would run the graph can capture.
struct GraphSupport {
  bool backend_graphs = false;      // the backend records and replays graphs (cuda)
  bool comm_graphs = false;         // every communicator's calls can be captured (NCCL, not MPI)
  bool device_moe_routing = false;  // Backend::device_moe_routing: no host read sizes the experts
  // The executor stages its host traffic outside the captured region (the micro-batches' tokens
  // uploaded before, the losses read after: StepConfig::stage_host_traffic).
  bool executor_staging = false;
};

// Why the forward and backward of `prog` under `plan` cannot be one graph: each reason names the
// plan field, the op or the runtime part; empty when it can. The optimizer's ops (Phase::
// kOptimizer) run outside the graph and are not looked at.
std::vector<std::string> step_graph_blockers(const Model& model, const Plan& plan,
                                             const Program& prog, const GraphSupport& support);

enum class GraphAction {
  kEager,    // run op by op (graphs not asked for, or blocked: StepGraphPolicy::reason())
  kWarmup,   // run op by op before the capture (the allocator's caches and scratch filled)
  kCapture,  // record the step into a graph, then launch it
  kReplay,   // launch the captured graph
};
const char* graph_action_name(GraphAction a);

// The step-by-step decision. With no blockers: `warmup` eager steps, one capture, then replays
// (a refused capture or a change of the step's shapes sends it back: capture_failed, invalidate).
class StepGraphPolicy {
 public:
  StepGraphPolicy() = default;
  explicit StepGraphPolicy(std::vector<std::string> blockers, int warmup = 1);
  GraphAction next();  // the action of the next step (counts it)
  // The capture of the step just decided was refused (a host copy or synchronisation inside it):
  // every later step eager, `why` kept as the reason.
  void capture_failed(const std::string& why);
  // The captured graph no longer matches the step (its buffers' shapes or addresses changed):
  // warm up and capture again.
  void invalidate();
  const std::vector<std::string>& blockers() const { return blockers_; }
  // Why the last step ran eagerly ("" after a warm-up, capture or replay).
  const std::string& reason() const { return reason_; }
  int64_t captures() const { return captures_; }
  int64_t replays() const { return replays_; }
  int64_t eager_steps() const { return eager_; }

 private:
  std::vector<std::string> blockers_ = {"plan.cuda_graphs: none"};
  int warmup_ = 1;
  int warmed_ = 0;
  bool captured_ = false;
  std::string failed_;
  std::string reason_;
  int64_t captures_ = 0, replays_ = 0, eager_ = 0;
};

}  // namespace parasol::runtime
