// Tests core/host_issue.h: the host cursor's rule against hand-worked timelines, the closed
// form's segment rule, and how the lowering marks the ops CUDA graphs and torch.compile issue
// (and where it puts the host's syncs).
#include "core/host_issue.h"

#include <gtest/gtest.h>

#include <map>
#include <set>
#include <tuple>
#include <vector>

#include "core/cluster.h"
#include "core/error.h"
#include "core/lower.h"
#include "core/model.h"

namespace parasol {
namespace {

TEST(HostCursor, IssuesInOrderAndBlocksOnASync) {
  HostCursor h;
  EXPECT_DOUBLE_EQ(h.issue(2e-6), 2e-6);
  EXPECT_DOUBLE_EQ(h.issue(3e-6), 5e-6);
  // The device work the sync waits for ends after the host reached it: the host waits.
  EXPECT_DOUBLE_EQ(h.sync(40e-6, 10e-6), 50e-6);
  // Ends before: the host only wakes.
  EXPECT_DOUBLE_EQ(h.sync(1e-6, 10e-6), 60e-6);
  EXPECT_DOUBLE_EQ(h.issue(1e-6), 61e-6);
}

// HostPace against the cursor played op by op on one device stream (an independent loop): each
// op starts once the host has issued it and the op before it has run; a sync blocks the host
// until the device is done and wakes it.
TEST(HostPace, ComposedStretchesPlayAsTheCursorOpByOp) {
  struct Step {
    double host, device;
    bool sync;
  };
  const std::vector<Step> steps = {{5, 1, false}, {1, 9, false}, {4, 2, false}, {0.5, 0, true},
                                   {2, 3, false}, {6, 1, false}, {1, 7, false}};
  const double wake = 0.75;
  for (double h0 : {0.0, 3.0})
    for (double d0 : {0.0, 10.0, 40.0}) {
      HostCursor cursor;
      cursor.t = h0;
      double device = d0;
      HostPace pace;
      for (const Step& s : steps) {
        if (s.sync) {
          cursor.issue(s.host);
          cursor.sync(device, wake);
          pace = pace.then(HostPace::sync(s.host, wake));
          continue;
        }
        device = std::max(cursor.issue(s.host), device) + s.device;
        pace = pace.then(HostPace::op(s.host, s.device));
      }
      SCOPED_TRACE("h0 " + std::to_string(h0) + " d0 " + std::to_string(d0));
      EXPECT_DOUBLE_EQ(pace.host_after(h0, d0), cursor.t);
      EXPECT_DOUBLE_EQ(pace.device_after(h0, d0), device);
    }
  // Host-bound at first, device-bound after: from a sync, the stretch takes more than the
  // longer of its host (6) and device (10) sums: 5 + 1 + 9 = 15 (the device waits for the host's
  // first op, then runs the second's nine seconds behind it).
  const HostPace a = HostPace::op(5, 1).then(HostPace::op(1, 9));
  EXPECT_DOUBLE_EQ(a.from_sync(), 15);
  EXPECT_GT(a.from_sync(), host_paced(6, 10));
  // Repeated by squaring as by composing one at a time.
  HostPace b;
  for (int i = 0; i < 13; ++i) b = b.then(a);
  const HostPace r = a.repeat(13);
  EXPECT_DOUBLE_EQ(r.hh, b.hh);
  EXPECT_DOUBLE_EQ(r.dh, b.dh);
  EXPECT_DOUBLE_EQ(r.dd, b.dd);
  EXPECT_EQ(r.hd, HostPace::kNever);
}

TEST(HostCursor, SegmentTakesTheLongerOfHostAndDevice) {
  EXPECT_DOUBLE_EQ(host_paced(3, 5), 5);
  EXPECT_DOUBLE_EQ(host_paced(7, 5), 7);
}

Plan small_plan() {
  Plan p;
  p.dp = 8;
  p.micro_batch = 4;
  p.global_batch = 64;  // two micro-batches
  return p;
}

struct Lowered {
  Model m = model_preset("gpt2-124m");
  Cluster c = cluster_preset("dgx-h100", 8);
  Program lower_with(const Plan& p) {
    validate(p, m, c);
    return lower(m, c, p).programs.at(0);
  }
};

TEST(MarkHostIssue, EagerByDefault) {
  Lowered l;
  Program p = l.lower_with(small_plan());
  for (const Op& op : p.ops) EXPECT_EQ(op.host_issue, HostIssue::kEager) << op.name;
}

TEST(MarkHostIssue, LayerGraphsReplayOncePerLayerPass) {
  Lowered l;
  Plan pl = small_plan();
  pl.cuda_graphs = CudaGraphs::kLayers;
  Program p = l.lower_with(pl);
  using Key = std::tuple<int, int, int>;  // layer, micro-batch, phase
  std::map<Key, int> replays, members;
  for (const Op& op : p.ops) {
    const Key k{op.tags.layer, op.tags.micro_batch, static_cast<int>(op.tags.phase)};
    const bool layer_op =
        op.tags.layer >= 0 && op.tags.phase != Phase::kOptimizer && op.stream <= 1;
    if (!layer_op) {
      EXPECT_EQ(op.host_issue, HostIssue::kEager) << op.name;
      continue;
    }
    if (op.host_issue == HostIssue::kGraphReplay) ++replays[k];
    EXPECT_TRUE(op.host_issue == HostIssue::kGraphReplay || op.host_issue == HostIssue::kInGraph)
        << op.name;
    ++members[k];
  }
  ASSERT_FALSE(members.empty());
  // Forward and backward of each of the 12 layers for each of the 2 micro-batches.
  EXPECT_EQ(members.size(), 12u * 2 * 2);
  for (const auto& [k, n] : members) EXPECT_EQ(replays[k], 1);
}

TEST(MarkHostIssue, FullIterationIsOneGraphOutsideTheOptimizer) {
  Lowered l;
  Plan pl = small_plan();
  pl.cuda_graphs = CudaGraphs::kFullIteration;
  pl.nan_check = false;
  Program p = l.lower_with(pl);
  int replays = 0;
  for (const Op& op : p.ops) {
    if (op.kind == OpKind::kSync || op.tags.phase == Phase::kOptimizer) {
      EXPECT_EQ(op.host_issue, HostIssue::kEager) << op.name;
      continue;
    }
    replays += op.host_issue == HostIssue::kGraphReplay;
  }
  EXPECT_EQ(replays, 1);
}

TEST(MarkHostIssue, CompileEntersARegionPerLayerPassAndFusesElementwiseRuns) {
  Lowered l;
  Plan pl = small_plan();
  pl.torch_compile = true;
  Program p = l.lower_with(pl);
  std::set<std::tuple<int, int, int>> entered;
  int fused = 0;
  for (size_t i = 0; i < p.ops.size(); ++i) {
    const Op& op = p.ops[i];
    const auto k =
        std::make_tuple(op.tags.layer, op.tags.micro_batch, static_cast<int>(op.tags.phase));
    if (op.host_issue == HostIssue::kCompiledEntry) {
      EXPECT_TRUE(entered.insert(k).second);
    }
    if (op.host_issue == HostIssue::kInGraph) {
      ++fused;
      // Fused into the element-wise op just before it in the same region.
      size_t j = i - 1;
      while (j > 0 && (p.ops[j].stream > 1 || p.ops[j].tags.layer != op.tags.layer)) --j;
      const Op& prev = p.ops[j];
      EXPECT_TRUE(prev.kind == OpKind::kNorm || prev.kind == OpKind::kBias ||
                  prev.kind == OpKind::kActivation || prev.kind == OpKind::kResidualAdd)
          << op.name;
    }
  }
  EXPECT_EQ(entered.size(), 12u * 2 * 2);
  EXPECT_GT(fused, 0);
}

TEST(HostSyncs, NanCheckTwicePerMicroBatchOnTheLossAndOneAtTheStepEnd) {
  Lowered l;
  Plan pl = small_plan();
  Program p = l.lower_with(pl);
  int host_stream = -1;
  for (size_t s = 0; s < p.streams.size(); ++s)
    if (p.streams[s] == StreamKind::kHost) host_stream = static_cast<int>(s);
  ASSERT_GE(host_stream, 0);
  EXPECT_EQ(p.stream_name(host_stream), "host");
  int checks = 0, ends = 0;
  for (const Op& op : p.ops) {
    if (op.kind != OpKind::kSync) continue;
    EXPECT_EQ(op.stream, host_stream);
    ASSERT_FALSE(op.deps.empty());
    if (op.tags.phase == Phase::kForward) {
      ++checks;
      EXPECT_EQ(p.ops[op.deps[0]].kind, OpKind::kCrossEntropy) << op.name;
    } else {
      ++ends;
      EXPECT_EQ(op.id, static_cast<int>(p.ops.size()) - 1);  // the last op of the step
    }
  }
  EXPECT_EQ(checks, 2 * pl.micro_batches());
  EXPECT_EQ(ends, 1);
  pl.nan_check = false;
  int left = 0;
  for (const Op& op : l.lower_with(pl).ops) left += op.kind == OpKind::kSync;
  EXPECT_EQ(left, 1);
}

TEST(HostSyncs, DroplessMoeSyncsOnItsTokenCountsPerLayerForward) {
  const Model m = model_preset("tiny-moe");
  const Cluster c = cluster_preset("dgx-h100", 8);
  Plan p;
  p.dp = 8;
  p.ep = 4;
  p.micro_batch = 1;
  p.global_batch = 16;
  p.nan_check = false;
  validate(p, m, c);
  const Program prog = lower(m, c, p).programs.at(0);
  int moe_layers = 0;
  for (int l = 0; l < m.layers; ++l) moe_layers += m.is_moe_layer(l);
  int syncs = 0;
  for (const Op& op : prog.ops) {
    if (op.kind != OpKind::kSync || op.tags.phase == Phase::kOptimizer) continue;
    ++syncs;
    EXPECT_EQ(op.tags.phase, Phase::kForward);
    EXPECT_EQ(prog.ops[op.deps.at(0)].kind, OpKind::kRouter) << op.name;  // the routing's counts
  }
  EXPECT_EQ(syncs, moe_layers * p.micro_batches());
}

TEST(HostSyncs, ValidationRefusesASyncInsideAGraphAndCompileWithoutPytorch) {
  Lowered l;
  Plan pl = small_plan();
  pl.cuda_graphs = CudaGraphs::kFullIteration;
  EXPECT_THROW(validate(pl, l.m, l.c), Error);  // nan_check's sync cannot be captured
  pl.nan_check = false;
  EXPECT_NO_THROW(validate(pl, l.m, l.c));
  Plan q = small_plan();
  q.torch_compile = true;
  q.host_framework = HostFramework::kNative;
  EXPECT_THROW(validate(q, l.m, l.c), Error);
}

// Megatron's --log-num-zeros-in-grad and --log-params-norm (clip_grads.py count_zeros_fp32
// before the optimizer step; training/utils/common_utils.py calc_params_l2_norm after the step):
// each reads every tensor the rank's optimizer holds and ends in an .item() that the host waits
// on.
TEST(HostSyncs, MegatronLoggedStatisticsEachEndInASync) {
  Lowered l;
  Plan pl = small_plan();
  pl.zero = 1;
  const Program plain = l.lower_with(pl);
  for (const Op& op : plain.ops) {
    EXPECT_NE(op.kind, OpKind::kCountZeros);
    EXPECT_NE(op.kind, OpKind::kParamNorm);
  }
  pl.log_num_zeros_in_grad = true;
  pl.log_params_norm = true;
  const Program p = l.lower_with(pl);
  // Whether op `a` reaches op `b` through dependencies.
  auto reaches = [&](int a, int b) {
    std::set<int> seen;
    std::vector<int> todo = {b};
    while (!todo.empty()) {
      const int x = todo.back();
      todo.pop_back();
      if (x == a) return true;
      if (!seen.insert(x).second) continue;
      for (int d : p.ops[x].deps) todo.push_back(d);
    }
    return false;
  };
  const Op* norm = nullptr;
  int zeros = -1, pnorm = -1, zeros_sync = -1, step_sync = -1, first_adam = -1;
  std::vector<int> zeros_reads;
  int zeros_tensors = 0;
  double zeros_elements = 0;
  for (const Op& op : p.ops) {
    if (op.kind == OpKind::kGradNorm) norm = &op;
    if (op.kind == OpKind::kCountZeros) {
      // One op per gradient tensor, each adding into the count the one before wrote.
      if (zeros >= 0) {
        EXPECT_TRUE(reaches(zeros, op.id));
      }
      zeros = op.id;
      zeros_reads.push_back(op.reads.at(0));
      zeros_tensors += op.tensors;
      zeros_elements += op.elements;
    }
    if (op.kind == OpKind::kParamNorm) pnorm = op.id;
    if (op.kind == OpKind::kAdamW && first_adam < 0) first_adam = op.id;
    if (op.kind == OpKind::kSync && op.name.find("grad.zeros") != std::string::npos)
      zeros_sync = op.id;
    if (op.kind == OpKind::kSync && op.name.find("step.sync") != std::string::npos)
      step_sync = op.id;
  }
  ASSERT_NE(norm, nullptr);
  ASSERT_GE(zeros, 0);
  ASSERT_GE(pnorm, 0);
  ASSERT_GE(zeros_sync, 0);
  ASSERT_GE(step_sync, 0);
  // The zero count reads the gradients the norm reads, tensor by tensor, and sums them over the
  // distributed optimizer's data-parallel ranks.
  EXPECT_EQ(zeros_reads, norm->reads);
  EXPECT_EQ(zeros_tensors, norm->tensors);
  EXPECT_NEAR(zeros_elements, norm->elements, 1e-6 * norm->elements);
  EXPECT_EQ(zeros_reads.size(), static_cast<size_t>(zeros_tensors));  // one op per tensor
  EXPECT_TRUE(reaches(zeros, zeros_sync));
  EXPECT_LT(zeros_sync, first_adam);  // the host waits for it before it issues the step
  bool reduced = false;
  for (const Op& op : p.ops)
    reduced |= op.kind == OpKind::kAllReduce && op.group == Group::kDpCp && reaches(zeros, op.id) &&
               reaches(op.id, zeros_sync);
  EXPECT_TRUE(reduced);
  // The parameter norm follows the step's closing sync, reads the updated optimizer shards, and
  // its own sync ends the step.
  EXPECT_GT(pnorm, step_sync);
  EXPECT_TRUE(reaches(first_adam, pnorm));
  EXPECT_DOUBLE_EQ(p.ops[pnorm].elements, norm->elements);
  const Op& last = p.ops.back();
  EXPECT_EQ(last.kind, OpKind::kSync);
  EXPECT_TRUE(reaches(pnorm, last.id));
  int syncs = 0, plain_syncs = 0;
  for (const Op& op : p.ops) syncs += op.kind == OpKind::kSync;
  for (const Op& op : plain.ops) plain_syncs += op.kind == OpKind::kSync;
  EXPECT_EQ(syncs, plain_syncs + 2);
}

// Megatron-Core's non-interleaved schedule ends each batched exchange with
// torch.cuda.synchronize() (Plan::p2p_sync): a sync on the host after every call, on the last op
// of every device stream. Sends and receives the same way (the warm-up's send_forward then
// recv_forward) are two calls; opposite ways (send_forward_recv_backward) one.
TEST(HostSyncs, PipelineExchangesSyncTheDeviceUnderP2pSync) {
  Lowered l;
  l.c = cluster_preset("dgx-h100", 8);
  Plan pl;
  pl.pp = 2;
  pl.dp = 4;
  pl.micro_batch = 1;
  pl.global_batch = 16;  // four micro-batches per pipeline
  pl.nan_check = false;
  auto syncs = [&](const Program& p) {
    int n = 0;
    for (const Op& op : p.ops) {
      if (op.kind != OpKind::kSync || op.name.find("p2p.sync") == std::string::npos) continue;
      ++n;
      // Every device stream's last op before it, the exchange's transfers among them.
      bool after_transfer = false;
      for (int d : op.deps)
        after_transfer =
            after_transfer || p.ops[d].kind == OpKind::kSend || p.ops[d].kind == OpKind::kRecv;
      EXPECT_TRUE(after_transfer) << op.name;
      for (const Op& before : p.ops) {
        if (before.id >= op.id) break;
        if (before.stream == op.stream) continue;
        bool covered = false;  // the sync waits for it or for a later op of its stream
        for (int d : op.deps)
          covered = covered || (p.ops[d].stream == before.stream && d >= before.id);
        EXPECT_TRUE(covered) << op.name << " leaves " << before.name;
      }
    }
    return n;
  };
  validate(pl, l.m, l.c);
  const LoweredPlan plain = lower(l.m, l.c, pl);
  for (const Program& p : plain.programs) EXPECT_EQ(syncs(p), 0);
  pl.p2p_sync = true;
  validate(pl, l.m, l.c);
  const LoweredPlan synced = lower(l.m, l.c, pl);
  // A call after each unit that sends or before one that receives: the first stage sends after
  // each forward (its backwards send nothing), the last after each backward (with the receive of
  // the next forward), so at least one a micro-batch and at most two.
  const int first = syncs(synced.programs.at(0)), last = syncs(synced.programs.at(1));
  EXPECT_GE(first, pl.micro_batches());
  EXPECT_LE(first, 2 * pl.micro_batches() + 1);
  EXPECT_GE(last, pl.micro_batches());
  EXPECT_LE(last, 2 * pl.micro_batches() + 1);
  // Without a pipeline there is no exchange to sync.
  Plan flat = small_plan();
  flat.p2p_sync = true;
  EXPECT_EQ(syncs(l.lower_with(flat)), 0);
  // A full-iteration graph cannot capture the syncs.
  pl.nan_check = false;
  pl.cuda_graphs = CudaGraphs::kFullIteration;
  EXPECT_THROW(validate(pl, l.m, l.c), Error);
}

// Megatron's --no-gradient-accumulation-fusion (Plan::gradient_accumulation_fusion off): after
// each weight-gradient GEMM of a layer (and the output layer) DDP's backward hook adds the new
// gradient into main_grad: one element-wise op on the gradient per weight.
TEST(HostSyncs, WithoutGradientAccumulationFusionEachWeightGradientIsAddedIntoMainGrad) {
  Lowered l;
  Plan pl = small_plan();
  pl.transformer_impl = TransformerImpl::kTransformerEngine;
  auto adds = [](const Program& p) {
    int n = 0;
    for (const Op& op : p.ops) {
      if (op.role != OpRole::kMainGradAdd) continue;
      ++n;
      EXPECT_EQ(op.tags.phase, Phase::kBackward);
      const Op& dw = p.ops.at(op.deps.at(0));
      EXPECT_EQ(dw.role, OpRole::kWeightGrad) << op.name;
      EXPECT_EQ(op.elements, static_cast<double>(dw.m) * dw.n) << op.name;
    }
    return n;
  };
  EXPECT_EQ(adds(l.lower_with(pl)), 0);
  pl.gradient_accumulation_fusion = false;
  // QKV, out, fc1 and fc2 per layer, and the output layer, per micro-batch.
  EXPECT_EQ(adds(l.lower_with(pl)), (4 * l.m.layers + 1) * pl.micro_batches());
}

TEST(HostPlan, SwitchesRoundTripThroughJson) {
  Plan p = small_plan();
  p.cuda_graphs = CudaGraphs::kLayers;
  p.torch_compile = true;
  p.optimizer_impl = OptimizerImpl::kForLoop;
  p.nan_check = false;
  p.log_params_norm = true;
  p.log_num_zeros_in_grad = true;
  p.deterministic = true;
  p.te_version = 208;
  p.p2p_sync = true;
  p.gradient_accumulation_fusion = false;
  const Plan q = plan_from_json(plan_to_json(p));
  EXPECT_TRUE(q.p2p_sync);
  EXPECT_FALSE(q.gradient_accumulation_fusion);
  EXPECT_FALSE(plan_from_json(plan_to_json(small_plan())).p2p_sync);
  EXPECT_TRUE(plan_from_json(plan_to_json(small_plan())).gradient_accumulation_fusion);
  EXPECT_TRUE(q.log_params_norm);
  EXPECT_TRUE(q.log_num_zeros_in_grad);
  EXPECT_TRUE(q.deterministic);
  EXPECT_EQ(q.te_version, 208);
  EXPECT_EQ(plan_to_json(p)["transformer_engine_version"], "2.8");
  EXPECT_FALSE(plan_from_json(plan_to_json(small_plan())).deterministic);
  EXPECT_EQ(plan_from_json(plan_to_json(small_plan())).te_version, 0);
  // The version as uv.lock and pip print it, local suffix and patch included.
  Json v = plan_to_json(small_plan());
  v["transformer_engine_version"] = "2.14.0+f031cf87";
  EXPECT_EQ(plan_from_json(v).te_version, 214);
  EXPECT_FALSE(plan_from_json(plan_to_json(small_plan())).log_params_norm);
  EXPECT_EQ(q.cuda_graphs, CudaGraphs::kLayers);
  EXPECT_TRUE(q.torch_compile);
  EXPECT_EQ(q.optimizer_impl, OptimizerImpl::kForLoop);
  EXPECT_FALSE(q.nan_check);
  Json j = plan_to_json(small_plan());
  j["cuda_graphs"] = "sometimes";
  try {
    plan_from_json(j);
    FAIL() << "accepted a bad cuda_graphs";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("plan.cuda_graphs"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace parasol
