// The play of a layer fragment (cost_models/layer_fragment.h) on hand-made fragments whose
// exposed and hidden communication follows from the execution rules by hand: a compute op waits
// for its dependencies and its stream, the compute stream's idle time is charged to the group
// it waited for, communication left running at a pass's end is exposed, a receive completes with
// the send of its tag, a p2p group starts once all its transfers are ready. And on a lowered
// fragment: the compute seconds are the op pricer's, the FLOPs and bytes the ops'.
#include "cost_models/layer_fragment.h"

#include <gtest/gtest.h>

#include <vector>

#include "core/cluster.h"
#include "core/gather_units.h"
#include "core/lower.h"
#include "cost_models/estimate.h"
#include "cost_models/profile.h"

namespace parasol::cost {
namespace {

using Node = PlayableFragment::Node;

// A node: compute (seconds) or communication (its comm_ops entry, priced by the test), with deps;
// beside the nodes, the Program they stand for, whose issue graph links them (link_playable).
struct Builder {
  PlayableFragment f;
  Program prog;
  Builder() {
    prog.streams = {StreamKind::kCompute, StreamKind::kComm, StreamKind::kCopy};
    f.streams = 3;
  }
  int compute(double seconds, Phase phase, std::vector<int> deps, double flops = 0) {
    Node n;
    n.seconds = seconds;
    n.flops = flops;
    n.compute = true;
    n.stream = 0;
    n.phase = static_cast<uint8_t>(phase);
    return add(n, deps, op(OpKind::kLinear, Group::kTp, 0, -1));
  }
  // A ring (Group::kCp) transfer in a p2p group is a send of its own tag, any other a collective.
  int comm(Group g, Phase phase, std::vector<int> deps, int stream = 1, int p2p_group = -1) {
    Node n;
    n.comm = static_cast<int>(f.comm_ops.size());
    Op o;
    o.group = g;
    f.comm_ops.push_back(o);
    n.stream = static_cast<uint8_t>(stream);
    n.phase = static_cast<uint8_t>(phase);
    n.category = g == Group::kCp ? 1 : g == Group::kEp ? 2 : 0;
    const OpKind kind = g == Group::kCp && p2p_group >= 0 ? OpKind::kSend
                        : g == Group::kEp                 ? OpKind::kAllToAll
                                                          : OpKind::kAllReduce;
    return add(n, deps, op(kind, g, stream, p2p_group));
  }
  int recv(int send, Phase phase, int stream, int p2p_group) {
    Node n;
    n.recv = true;
    n.stream = static_cast<uint8_t>(stream);
    n.phase = static_cast<uint8_t>(phase);
    n.category = 1;
    Op o = op(OpKind::kRecv, Group::kCp, stream, p2p_group);
    o.tag = prog.ops[send].tag;
    return add(n, {}, o);
  }
  Op op(OpKind kind, Group g, int stream, int p2p_group) {
    Op o;
    o.kind = kind;
    o.group = g;
    o.stream = stream;
    o.p2p_group = p2p_group;
    o.tag = static_cast<int64_t>(prog.ops.size());
    return o;
  }
  int add(Node n, const std::vector<int>& deps, Op o) {
    n.deps_begin = static_cast<int>(f.deps.size());
    f.deps.insert(f.deps.end(), deps.begin(), deps.end());
    n.deps_end = static_cast<int>(f.deps.size());
    f.nodes.push_back(n);
    o.deps = deps;
    prog.add_op(o);
    return static_cast<int>(f.nodes.size()) - 1;
  }
  void pass(int begin) {
    f.passes.push_back({begin, static_cast<int>(f.nodes.size())});
    link_playable(f, IssueGraph(prog));
  }
};

TEST(LayerFragmentPlay, ChargesIdleComputeToWhatItWaitedFor) {
  Builder b;
  // Forward: a GEMM (1 s), its TP reduction (2 s) on the path of the next GEMM (1 s).
  const int a = b.compute(1, Phase::kForward, {}, 10);
  const int c = b.comm(Group::kTp, Phase::kForward, {a});
  b.compute(1, Phase::kForward, {c}, 5);
  b.pass(0);
  // Backward: an expert all-to-all (0.5 s) beside a GEMM (1 s), a GEMM after both, then a ring
  // send (3 s) nobody in the pass waits for: exposed at the pass's end.
  const int first = static_cast<int>(b.f.nodes.size());
  const int d = b.compute(1, Phase::kBackward, {});
  const int e = b.comm(Group::kEp, Phase::kBackward, {});
  const int g = b.compute(1, Phase::kBackward, {d, e});
  b.comm(Group::kCp, Phase::kBackward, {g});
  b.pass(first);
  const LayerPrice lp = play_layer_fragment(b.f, {2.0, 0.5, 3.0});
  EXPECT_DOUBLE_EQ(lp.forward, 2);
  EXPECT_DOUBLE_EQ(lp.forward_flops, 15);
  EXPECT_DOUBLE_EQ(lp.backward, 2);
  EXPECT_DOUBLE_EQ(lp.tp_forward, 2);
  EXPECT_DOUBLE_EQ(lp.tp_hidden, 0);
  EXPECT_DOUBLE_EQ(lp.ep_forward + lp.ep_backward, 0);
  EXPECT_DOUBLE_EQ(lp.ep_hidden, 0.5);
  EXPECT_DOUBLE_EQ(lp.cp_backward, 3);
  EXPECT_DOUBLE_EQ(lp.cp_hidden, 0);
  // Half as fast an all-to-all (1.5 s) outlasts the first GEMM by 0.5 s.
  const LayerPrice slow = play_layer_fragment(b.f, {2.0, 1.5, 3.0});
  EXPECT_DOUBLE_EQ(slow.ep_backward, 0.5);
  EXPECT_DOUBLE_EQ(slow.ep_hidden, 1.0);
}

TEST(LayerFragmentPlay, ReceivesCompleteWithTheirSendAndP2pGroupsStartTogether) {
  Builder b;
  // Recompute: a ring exchange (send 2 s, recv) grouped with another (a send that waits for a 1 s
  // GEMM, and its recv): the group starts at 1 s, the receive completes at 3 s; the attention
  // after it waits 2 s, charged to the recompute.
  const int gemm = b.compute(1, Phase::kRecompute, {});
  const int s1 = b.comm(Group::kCp, Phase::kRecompute, {}, 1, 7);
  const int s2 = b.comm(Group::kCp, Phase::kRecompute, {gemm}, 1, 7);
  const int r = b.recv(s1, Phase::kRecompute, 1, 7);
  b.recv(s2, Phase::kRecompute, 1, 7);
  b.compute(0.5, Phase::kRecompute, {r}, 3);
  b.pass(0);
  const LayerPrice lp = play_layer_fragment(b.f, {2.0, 0.25});
  EXPECT_DOUBLE_EQ(lp.selective_recompute, 1 + 2 + 0.5);
  EXPECT_DOUBLE_EQ(lp.selective_recompute_flops, 3);
  EXPECT_DOUBLE_EQ(lp.cp_forward + lp.cp_backward, 0);
  EXPECT_DOUBLE_EQ(lp.cp_hidden, 2.25 - 2);
}

// On a lowered fragment the compute seconds are the op pricer's and the FLOPs the ops'.
TEST(LayerFragmentPlay, PricesALoweredFragmentOpByOp) {
  Model m = model_preset("llama3-8b");
  m.layers = 2;
  const Cluster c = cluster_preset("dgx-h100", 8);
  Plan p;
  p.tp = 2;
  p.dp = 4;
  p.sequence_parallel = true;
  p.global_batch = 4;
  const Profile prof = default_profile(c.gpu_device(0));
  const LayerFragment frag = lower_layer_fragment(m, p, 1);
  const RankLayout layout(p);
  const std::vector<int> reps{0};
  PlacementCache places(c);
  OpPricer pricer(m, c, p, prof, layout, reps, places);
  const LayerPrice lp = price_layer_fragment(frag, pricer, 0);
  double fwd = 0, bwd = 0, flops = 0, tp_bytes = 0;
  for (const Op& op : frag.program.ops) {
    if (is_communication(op.kind)) {
      if (op.group == Group::kTp) tp_bytes += op.bytes;
      continue;
    }
    const double t = pricer.time(op, 0, false);
    if (op.tags.phase == Phase::kForward) {
      fwd += t;
      flops += op.flops;
    } else {
      bwd += t;
    }
  }
  EXPECT_NEAR(lp.forward, fwd, 1e-12 * fwd);
  EXPECT_NEAR(lp.backward, bwd, 1e-12 * bwd);
  EXPECT_DOUBLE_EQ(lp.forward_flops, flops);
  EXPECT_DOUBLE_EQ(lp.tp_bytes_forward + lp.tp_bytes_backward, tp_bytes);
  EXPECT_GT(lp.tp_forward, 0);  // SP's f and g are on the forward's path
}

// DeepSpeed's module uses on a lowered GPT layer (core/gather_units.h's six modules: norm, qkv,
// out, norm, fc1, fc2): every compute op of a pass falls in one use, the forward's and the
// backward's uses add up to the passes' compute, and the GEMM-heavy uses outweigh the norms'.
TEST(LayerFragmentPlay, SplitsThePassesByDeepSpeedsModuleUses) {
  const Model m = gpt_model("gpt3-175b", 2, 12288, 96, 51200, 2048, true);
  const Cluster c = cluster_preset("dgx-a100-80g", 8);
  Plan p;
  p.dp = 8;
  p.global_batch = 8;
  const Profile prof = default_profile(c.gpu_device(0));
  const LayerFragment frag = lower_layer_fragment(m, p, 1);
  ASSERT_EQ(frag.modules.size(), dense_layer_weights(m, 1, 1).size());
  const RankLayout layout(p);
  const std::vector<int> reps{0};
  PlacementCache places(c);
  OpPricer pricer(m, c, p, prof, layout, reps, places);
  const PlayableFragment f = make_playable(frag, pricer);
  const ModuleUseSeconds uses = module_use_seconds(f);
  ASSERT_EQ(uses.forward.size(), 6u);
  ASSERT_EQ(uses.backward.size(), 6u);
  const LayerPrice lp = play_layer_fragment(f, communication_seconds(f, pricer, 0));
  double fwd = 0, bwd = 0;
  for (double x : uses.forward) fwd += x;
  for (double x : uses.backward) bwd += x;
  EXPECT_NEAR(fwd, lp.forward, 1e-9 * lp.forward);
  EXPECT_NEAR(bwd, lp.backward, 1e-9 * lp.backward);
  // qkv (with the attention after it) and fc1 (with the activation) outweigh out and the norms.
  EXPECT_GT(uses.forward[1], uses.forward[2]);
  EXPECT_GT(uses.forward[4], uses.forward[3]);
  EXPECT_GT(uses.backward[5], uses.backward[3]);
  for (double x : uses.forward) EXPECT_GT(x, 0);
}

TEST(FragmentCache, FilesTheFirstFragmentOfAKey) {
  FragmentCache cache;
  const FragmentCache::Key key{2, 1, 1, 2, 1, 4096, 1, 0, 0}, other{4, 1, 1, 4, 1, 4096, 1, 0, 0};
  EXPECT_EQ(cache.find(key), nullptr);
  PlayableFragment first, second;
  first.streams = 1;
  second.streams = 2;
  const auto filed = cache.insert(key, first);
  EXPECT_EQ(filed->streams, 1);
  EXPECT_EQ(cache.insert(key, second), filed);  // another thread lowered it too: the first wins
  EXPECT_EQ(cache.find(key), filed);
  EXPECT_EQ(cache.find(other), nullptr);
}

// Estimators that share fragments (the search's workers) price every plan as one alone does,
// whichever of them lowered a fragment first.
TEST(FragmentCache, SharedFragmentsGiveTheEstimatesOfAnEstimatorAlone) {
  Model m = model_preset("mixtral-8x7b");
  m.layers = 4;
  const Cluster c = cluster_preset("dgx-h100", 16);
  const Profile prof = default_profile(c.gpu_device(0));
  std::vector<Plan> plans;
  for (int tp : {1, 2})
    for (int cp : {1, 2})
      for (int mb : {1, 2}) {
        Plan p;
        p.tp = tp, p.cp = cp, p.ep = 2, p.micro_batch = mb;
        p.dp = 16 / (tp * cp);
        p.sequence_parallel = tp > 1;
        p.global_batch = 4 * mb * p.dp;
        plans.push_back(p);
      }
  auto cache = std::make_shared<FragmentCache>();
  Estimator a(m, c, prof), b(m, c, prof);
  a.share_fragments(cache);
  b.share_fragments(cache);
  for (size_t i = 0; i < plans.size(); ++i) {
    SCOPED_TRACE("plan " + std::to_string(i));
    Estimator alone(m, c, prof);
    const double want = alone.estimate(plans[i]).step_time_s;
    EXPECT_EQ(a.estimate(plans[i]).step_time_s, want);  // a lowers, b finds it
    EXPECT_EQ(b.estimate(plans[plans.size() - 1 - i]).step_time_s,
              Estimator(m, c, prof).estimate(plans[plans.size() - 1 - i]).step_time_s);
  }
}

}  // namespace
}  // namespace parasol::cost
