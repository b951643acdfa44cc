// Whole-step CUDA graphs' decisions (runtime/step_graph.h): the blockers a Program's step has
// under each runtime (the CPU backend records no graphs; MPI communication, offload copies and
// host syncs cannot be captured; an executor that does not stage its host traffic outside the
// step; a step's buffer the optimizer reads, which a replay would not allocate), and the policy's
// warm-up, capture, replay, invalidation and refused capture.
#include "runtime/step_graph.h"

#include <gtest/gtest.h>

#include <string>

#include "core/cluster.h"
#include "core/lower.h"

namespace parasol::runtime {
namespace {

bool mentions(const std::vector<std::string>& why, const std::string& what) {
  for (const std::string& w : why)
    if (w.find(what) != std::string::npos) return true;
  return false;
}

Plan graphed(int tp = 1) {
  Plan p;
  p.tp = tp;
  p.micro_batch = 1;
  p.global_batch = 2;
  p.cuda_graphs = CudaGraphs::kFullIteration;
  p.nan_check = false;  // validate(): Megatron's NaN check syncs the host inside the graph
  return p;
}

GraphSupport all() {
  GraphSupport s;
  s.backend_graphs = s.comm_graphs = s.device_moe_routing = s.executor_staging = true;
  return s;
}

TEST(StepGraph, BlockersNameWhatKeepsTheStepOutOfOneGraph) {
  const Model m = gpt_model("gpt-tiny", 2, 64, 4, 256, 32, true);
  Plan p = graphed();
  validate(p, m, cluster_preset("dgx-h100", 1));
  const Program prog = lower_stage(m, p, 0);
  EXPECT_TRUE(step_graph_blockers(m, p, prog, all()).empty());
  GraphSupport cpu = all();
  cpu.backend_graphs = false;
  cpu.executor_staging = false;
  const auto why = step_graph_blockers(m, p, prog, cpu);
  EXPECT_TRUE(mentions(why, "backend records no CUDA graphs"));
  EXPECT_TRUE(mentions(why, "add_losses"));
  // Tensor parallelism's all-reduces on a communicator that cannot be captured.
  Plan tp2 = graphed(2);
  GraphSupport mpi = all();
  mpi.comm_graphs = false;
  EXPECT_TRUE(mentions(step_graph_blockers(m, tp2, lower_stage(m, tp2, 0), mpi), "communication"));
  EXPECT_TRUE(step_graph_blockers(m, tp2, lower_stage(m, tp2, 0), all()).empty());
  // Offloaded activations: copies to host memory inside the step.
  Plan off = graphed();
  off.offload.activations = true;
  EXPECT_TRUE(mentions(step_graph_blockers(m, off, lower_stage(m, off, 0), all()), "host memory"));
  // Graphs not asked for: the plan field says so, and nothing else is looked at.
  Plan none = graphed();
  none.cuda_graphs = CudaGraphs::kNone;
  const auto n = step_graph_blockers(m, none, prog, all());
  ASSERT_EQ(n.size(), 1u);
  EXPECT_TRUE(mentions(n, "plan.cuda_graphs"));
}

// A replay runs only the optimizer's ops after the graph: an optimizer op that reads a buffer of
// the step's body (not persistent) keeps the step out of a graph, naming the buffer.
TEST(StepGraph, AStepBufferTheOptimizerReadsBlocksTheGraph) {
  const Model m = gpt_model("gpt-tiny", 2, 64, 4, 256, 32, true);
  Plan p = graphed();
  validate(p, m, cluster_preset("dgx-h100", 1));
  Program prog = lower_stage(m, p, 0);
  ASSERT_TRUE(step_graph_blockers(m, p, prog, all()).empty());
  int act = -1;
  for (const Op& op : prog.ops)
    if (op.tags.phase != Phase::kOptimizer)
      for (int id : op.writes)
        if (act < 0 && !prog.buffers[id].persistent) act = id;
  ASSERT_GE(act, 0);
  for (Op& op : prog.ops)
    if (op.tags.phase == Phase::kOptimizer) {
      op.reads.push_back(act);
      break;
    }
  EXPECT_TRUE(mentions(step_graph_blockers(m, p, prog, all()),
                       "buffer " + prog.buffers[act].name + ": used by the step's body"));
}

TEST(StepGraph, PolicyWarmsUpCapturesOnceThenReplays) {
  StepGraphPolicy g({}, 2);
  EXPECT_EQ(g.next(), GraphAction::kWarmup);
  EXPECT_EQ(g.next(), GraphAction::kWarmup);
  EXPECT_EQ(g.next(), GraphAction::kCapture);
  EXPECT_EQ(g.next(), GraphAction::kReplay);
  EXPECT_EQ(g.next(), GraphAction::kReplay);
  EXPECT_EQ(g.reason(), "");
  g.invalidate();  // the step's shapes changed: warm up and capture again
  EXPECT_EQ(g.next(), GraphAction::kWarmup);
  EXPECT_EQ(g.next(), GraphAction::kWarmup);
  EXPECT_EQ(g.next(), GraphAction::kCapture);
  g.capture_failed("copy() to host memory");
  EXPECT_EQ(g.next(), GraphAction::kEager);
  EXPECT_NE(g.reason().find("copy() to host memory"), std::string::npos);
  EXPECT_EQ(g.captures(), 2);
  EXPECT_EQ(g.replays(), 2);
  EXPECT_EQ(g.eager_steps(), 5);  // four warm-ups and the eager step
  StepGraphPolicy blocked({"the backend records no CUDA graphs"});
  EXPECT_EQ(blocked.next(), GraphAction::kEager);
  EXPECT_EQ(blocked.reason(), "the backend records no CUDA graphs");
  EXPECT_EQ(StepGraphPolicy().next(), GraphAction::kEager);
}

}  // namespace
}  // namespace parasol::runtime
