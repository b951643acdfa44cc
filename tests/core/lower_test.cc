// Tests of lower(): the Programs are well formed (ids, deps, streams, buffers, matching
// sends/receives, they run to completion), and every Plan feature (TP with f/g, SP, CP ring,
// EP all-to-all, vocab-parallel embedding/loss, ZeRO 0-3, expert reduction, GPipe/1F1B/
// interleaved order, recompute, offload, optimizer) appears in the Program that inspects it.
#include "core/lower.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <map>
#include <set>
#include <tuple>

#include "core/fp8_params.h"
#include "core/layer_shapes.h"
#include "core/liveness.h"
#include "core/te_weight_cache.h"
#include "tests/core/expect_error.h"
#include "tests/core/megatron_split.h"
#include "tests/core/test_models.h"

namespace parasol {
namespace {

using test_models::tiny_gpt;
using test_models::tiny_mla;
using test_models::tiny_shared;
using test_models::tiny_windowed;

Plan make_plan(int tp, int pp, int dp, int gbs, int mbs = 1) {
  Plan p;
  p.tp = tp;
  p.pp = pp;
  p.dp = dp;
  p.global_batch = gbs;
  p.micro_batch = mbs;
  return p;
}

LoweredPlan lowered(const Model& m, const Plan& p) {
  Cluster c = cluster_preset("dgx-h100", p.gpus());
  validate(p, m, c);
  return lower(m, c, p);
}

using Pred = std::function<bool(const Op&)>;
int count(const Program& p, const Pred& f) {
  int n = 0;
  for (const Op& o : p.ops) n += f(o) ? 1 : 0;
  return n;
}
std::vector<const Op*> select(const Program& p, const Pred& f) {
  std::vector<const Op*> out;
  for (const Op& o : p.ops)
    if (f(o)) out.push_back(&o);
  return out;
}
Pred in(int layer, int mb, Phase ph) {
  return [=](const Op& o) {
    return o.tags.layer == layer && o.tags.micro_batch == mb && o.tags.phase == ph;
  };
}
Pred kind(OpKind k) {
  return [=](const Op& o) { return o.kind == k; };
}
Pred both(Pred a, Pred b) {
  return [=](const Op& o) { return a(o) && b(o); };
}

// The forward/backward units of a Program in issue order: runs of ops with the same
// (forward?, chunk, micro-batch), recompute ops belonging to their backward. Pipeline sends and
// receives are left out: they carry the tags of the unit whose data they move but are exchanged
// between steps (interleaved: after both units of a steady-state step).
struct U {
  bool fwd;
  int chunk, mb;
  bool operator==(const U&) const = default;
};
std::ostream& operator<<(std::ostream& os, const U& u) {
  return os << (u.fwd ? "F" : "B") << "(c" << u.chunk << ",mb" << u.mb << ")";
}
std::vector<U> units(const Program& p) {
  std::vector<U> out;
  for (const Op& o : p.ops) {
    if (o.tags.micro_batch < 0 || o.tags.phase == Phase::kOptimizer) continue;
    if ((o.kind == OpKind::kSend || o.kind == OpKind::kRecv) && o.group == Group::kPp) continue;
    U u{o.tags.phase == Phase::kForward, o.tags.chunk, o.tags.micro_batch};
    if (out.empty() || !(out.back() == u)) out.push_back(u);
  }
  return out;
}

// Structural invariants every Program must hold.
void check_well_formed(const LoweredPlan& lp) {
  for (const Program& p : lp.programs) {
    SCOPED_TRACE("stage " + std::to_string(p.stage));
    ASSERT_EQ(p.streams.size(), 6u);  // compute, comm, copy, dp comm, pp comm, host
    ASSERT_FALSE(p.ranks.empty());
    for (int r : p.ranks) EXPECT_EQ(&lp.program_of(r), &p);
    for (size_t i = 0; i < p.buffers.size(); ++i) EXPECT_EQ(p.buffers[i].id, static_cast<int>(i));
    for (size_t i = 0; i < p.ops.size(); ++i) {
      const Op& o = p.ops[i];
      ASSERT_EQ(o.id, static_cast<int>(i));
      EXPECT_EQ(o.tags.stage, p.stage);
      for (size_t d = 0; d < o.deps.size(); ++d) {
        EXPECT_LT(o.deps[d], o.id) << o.name;
        EXPECT_GE(o.deps[d], 0);
        if (d) {
          EXPECT_LT(o.deps[d - 1], o.deps[d]) << "deps sorted and unique";
        }
      }
      for (int b : o.reads) ASSERT_TRUE(b >= 0 && b < static_cast<int>(p.buffers.size()));
      for (int b : o.writes) ASSERT_TRUE(b >= 0 && b < static_cast<int>(p.buffers.size()));
      bool all_host = !o.reads.empty() || !o.writes.empty();
      for (int b : o.reads) all_host = all_host && p.buffers[b].host;
      for (int b : o.writes) all_host = all_host && p.buffers[b].host;
      if (is_communication(o.kind)) {
        EXPECT_EQ(p.streams[o.stream], StreamKind::kComm) << o.name;
        const bool dp = o.group == Group::kDp || o.group == Group::kDpCp ||
                        o.group == Group::kExpertDp || o.group == Group::kDpShard ||
                        o.group == Group::kDpReplicate || o.group == Group::kExpertShard ||
                        o.group == Group::kExpertReplicate;
        EXPECT_EQ(o.stream, dp ? 3 : o.group == Group::kPp ? 4 : 1) << o.name;
        EXPECT_GT(o.bytes, 0) << o.name;
      } else if (o.kind == OpKind::kSync) {
        EXPECT_EQ(p.streams[o.stream], StreamKind::kHost) << o.name;
        EXPECT_FALSE(o.deps.empty()) << o.name;  // a sync waits for device work
      } else if (o.kind == OpKind::kOffload || o.kind == OpKind::kPrefetch || all_host) {
        EXPECT_EQ(p.streams[o.stream], StreamKind::kCopy) << o.name;
      } else {
        EXPECT_EQ(p.streams[o.stream], StreamKind::kCompute) << o.name;
        // Compute ops on the device touch device buffers only.
        for (int b : o.reads) EXPECT_FALSE(p.buffers[b].host) << o.name;
        for (int b : o.writes) EXPECT_FALSE(p.buffers[b].host) << o.name;
      }
      if (o.kind == OpKind::kLinear || o.kind == OpKind::kExpertLinear) {
        EXPECT_GT(o.m * o.n * o.k, 0) << o.name;
        EXPECT_GT(o.flops, 0);
      }
      if (o.kind == OpKind::kAttention) {
        EXPECT_GT(o.attn.seq_q * o.attn.seq_kv * o.attn.heads, 0);
      }
      if (o.kind == OpKind::kOffload) {
        for (int b : o.reads) EXPECT_FALSE(p.buffers[b].host);
        for (int b : o.writes) EXPECT_TRUE(p.buffers[b].host);
      }
      if (o.kind == OpKind::kPrefetch) {
        for (int b : o.reads) EXPECT_TRUE(p.buffers[b].host);
        for (int b : o.writes) EXPECT_FALSE(p.buffers[b].host);
      }
    }
  }
}

// Plays all Programs with eager sends: a stream runs its next op once the op's deps have run
// and, for a receive, once the matching send has. Returns the ops that never ran.
int unfinished_ops(const LoweredPlan& lp) {
  const int n = static_cast<int>(lp.programs.size());
  std::vector<std::vector<std::vector<int>>> queue(n);
  std::vector<std::vector<size_t>> next(n);
  std::vector<std::vector<char>> done(n);
  for (int s = 0; s < n; ++s) {
    const Program& p = lp.programs[s];
    queue[s].assign(p.streams.size(), {});
    next[s].assign(p.streams.size(), 0);
    done[s].assign(p.ops.size(), 0);
    for (const Op& o : p.ops) queue[s][o.stream].push_back(o.id);
  }
  // (group, from stage, to stage, tag) of sends that ran; the cp ring runs the same Program.
  std::set<std::tuple<int, int, int, int64_t>> sent;
  bool progress = true;
  while (progress) {
    progress = false;
    for (int s = 0; s < n; ++s) {
      const Program& p = lp.programs[s];
      for (size_t st = 0; st < queue[s].size(); ++st) {
        while (next[s][st] < queue[s][st].size()) {
          const Op& o = p.ops[queue[s][st][next[s][st]]];
          bool ready = true;
          for (int d : o.deps) ready = ready && done[s][d];
          if (ready && o.kind == OpKind::kRecv) {
            const int from = o.group == Group::kPp ? o.peer_stage : s;
            ready = sent.count({static_cast<int>(o.group), from, s, o.tag}) > 0;
          }
          if (!ready) break;
          if (o.kind == OpKind::kSend) {
            const int to = o.group == Group::kPp ? o.peer_stage : s;
            EXPECT_TRUE(sent.insert({static_cast<int>(o.group), s, to, o.tag}).second)
                << "duplicate tag " << o.tag;
          }
          done[s][o.id] = 1;
          ++next[s][st];
          progress = true;
        }
      }
    }
  }
  int left = 0;
  for (int s = 0; s < n; ++s)
    for (char d : done[s]) left += d ? 0 : 1;
  return left;
}

// Every send has exactly one receive with its tag at the peer, of the same size, and back.
void check_sends_match(const LoweredPlan& lp) {
  std::map<std::tuple<int, int, int, int64_t>, double> sends, recvs;
  for (const Program& p : lp.programs)
    for (const Op& o : p.ops) {
      if (o.kind != OpKind::kSend && o.kind != OpKind::kRecv) continue;
      const bool pp = o.group == Group::kPp;
      if (pp) {
        EXPECT_NE(o.peer_stage, p.stage);
      } else {
        EXPECT_EQ(o.group, Group::kCp);
      }
      const int peer = pp ? o.peer_stage : p.stage;
      if (o.kind == OpKind::kSend)
        EXPECT_TRUE(
            sends.insert({{static_cast<int>(o.group), p.stage, peer, o.tag}, o.bytes}).second);
      else
        EXPECT_TRUE(
            recvs.insert({{static_cast<int>(o.group), peer, p.stage, o.tag}, o.bytes}).second);
    }
  EXPECT_EQ(sends, recvs);
}

// A battery of plans covering every feature, for the structural checks.
std::vector<std::pair<Model, Plan>> battery() {
  std::vector<std::pair<Model, Plan>> out;
  auto add = [&](Model m, Plan p) { out.emplace_back(std::move(m), p); };
  add(tiny_gpt(), make_plan(2, 2, 1, 4));
  {
    Plan p = make_plan(2, 2, 2, 8);
    p.sequence_parallel = true;
    p.zero = 1;
    add(tiny_gpt(4), p);
  }
  {
    Plan p = make_plan(2, 1, 2, 4);
    p.cp = 2;
    p.zero = 2;
    add(model_preset("tiny"), p);
  }
  {
    Plan p = make_plan(2, 1, 4, 8);
    p.ep = 2;
    p.sequence_parallel = true;
    add(model_preset("tiny-moe"), p);
  }
  {
    Plan p = make_plan(1, 1, 4, 8);
    p.ep = 4;
    p.zero = 3;
    add(model_preset("tiny-moe"), p);
    p.overlap_param_gather = false;
    p.offload.params = true;
    add(model_preset("tiny-moe"), p);
  }
  {
    Plan p = make_plan(1, 2, 2, 8);
    p.schedule = Schedule::kInterleaved;
    p.vpp = 2;
    p.recompute = Recompute::kSelective;
    p.flash_attention = false;
    add(tiny_gpt(4), p);
  }
  {
    Plan p = make_plan(2, 2, 1, 4);
    p.schedule = Schedule::kGpipe;
    p.recompute = Recompute::kFull;
    p.recompute_layers = 1;
    p.offload = {true, true, true};
    add(tiny_gpt(4), p);
  }
  {
    Plan p = make_plan(1, 1, 2, 4);
    p.zero = 3;
    p.offload = {true, true, true};
    p.recompute = Recompute::kFull;
    p.precision = Dtype::kFp32;
    add(tiny_gpt(), p);
  }
  {
    Plan p = make_plan(2, 2, 2, 8);
    p.zero = 2;
    p.cp = 2;
    p.offload.params = true;
    p.overlap_grad_reduce = false;
    add(model_preset("tiny"), p);
    p.recompute = Recompute::kFull;
    p.offload.activations = true;
    add(model_preset("tiny"), p);
    p.recompute = Recompute::kSelective;
    p.recompute_layers = -1;
    p.sequence_parallel = true;
    add(model_preset("tiny"), p);
  }
  {
    Plan p = make_plan(1, 4, 1, 8, 2);
    p.schedule = Schedule::kInterleaved;
    p.vpp = 2;
    p.zero = 1;
    p.offload.optimizer = true;
    add(tiny_gpt(8), p);
  }
  {  // uneven stages, explicit and Megatron's first/last, interleaved
    Plan p = make_plan(1, 2, 2, 8);
    p.stage_layers = {1, 3};
    p.zero = 1;
    p.recompute = Recompute::kFull;
    p.recompute_layers = 1;
    add(tiny_gpt(4), p);
    p = make_plan(2, 4, 1, 8);
    p.schedule = Schedule::kInterleaved;
    p.vpp = 2;
    p.first_stage_layers = 2;
    p.last_stage_layers = 2;
    add(tiny_gpt(12), p);
  }
  for (Reshard r : {Reshard::kAfterForward, Reshard::kAfterBackward, Reshard::kAfterStep}) {
    Plan p = make_plan(1, 2, 2, 8);  // ZeRO-3 with pp, each reshard mode
    p.zero = 3;
    p.reshard = r;
    p.recompute = Recompute::kFull;
    add(model_preset("tiny"), p);
    p.schedule = Schedule::kInterleaved;
    p.vpp = 2;
    p.recompute = Recompute::kNone;
    p.offload.params = r == Reshard::kAfterStep;
    p.overlap_grad_reduce = r != Reshard::kAfterStep;
    add(tiny_gpt(4), p);
  }
  {  // HSDP: dense and expert shard groups, bf16 gradient reductions
    Plan p = make_plan(1, 1, 4, 8);
    p.shard_degree = 2;
    p.zero = 1;
    p.grad_reduce_dtype = Dtype::kBf16;
    add(model_preset("tiny"), p);
    p = make_plan(1, 2, 8, 16);
    p.ep = 2;
    p.shard_degree = 4;
    p.zero = 3;
    p.reshard = Reshard::kAfterStep;
    p.offload.optimizer = true;
    add(model_preset("tiny-moe"), p);
  }
  {  // MLA, windows, shared experts; an expert grid of its own (etp != tp)
    Plan p = make_plan(2, 2, 2, 8);
    p.sequence_parallel = true;
    p.zero = 1;
    add(tiny_mla(), p);
    p.sequence_parallel = false;
    p.cp = 2;
    p.recompute = Recompute::kSelective;
    add(tiny_mla(false), p);
    p.recompute = Recompute::kFull;
    p.offload.activations = true;
    add(tiny_windowed(), p);
    p = make_plan(2, 1, 4, 8);
    p.ep = 4;
    p.etp = 1;
    add(tiny_shared(), p);
    p.sequence_parallel = true;
    p.zero = 3;
    add(tiny_shared(), p);
    p = make_plan(1, 1, 8, 8);  // experts split over etp 2 data-parallel ranks, hsdp
    p.ep = 2;
    p.etp = 2;
    p.shard_degree = 4;
    p.zero = 2;
    add(model_preset("tiny-moe"), p);
  }
  {  // selective recompute's modules
    auto modules = [](std::initializer_list<RecomputeModule> l) {
      unsigned bits = 0;
      for (RecomputeModule r : l) bits |= 1u << static_cast<int>(r);
      return bits;
    };
    using RM = RecomputeModule;
    Plan p = make_plan(2, 1, 4, 8);
    p.ep = 4;
    p.etp = 1;
    p.sequence_parallel = true;
    p.zero = 3;
    p.flash_attention = false;
    p.recompute = Recompute::kSelective;
    p.recompute_modules =
        modules({RM::kCoreAttn, RM::kMlp, RM::kMoeAct, RM::kLayernorm, RM::kSharedExperts});
    add(tiny_shared(), p);
    p = make_plan(1, 1, 4, 8);
    p.ep = 2;
    p.offload.activations = true;
    p.recompute = Recompute::kSelective;
    p.recompute_modules = modules({RM::kMoe, RM::kLayernorm, RM::kMlp});
    add(tiny_shared(), p);
    p = make_plan(2, 1, 2, 4);
    p.cp = 2;
    p.zero = 3;
    p.flash_attention = false;
    p.recompute = Recompute::kSelective;
    p.recompute_modules = modules({RM::kCoreAttn, RM::kMlaUpProj});
    add(tiny_mla(), p);
    p = make_plan(1, 2, 2, 8);
    p.schedule = Schedule::kInterleaved;
    p.vpp = 2;
    p.offload.activations = true;
    p.recompute = Recompute::kSelective;
    p.recompute_modules = modules({RM::kMlp});
    add(tiny_gpt(4), p);
  }
  return out;
}

TEST(Lower, ProgramsAreWellFormedAndRunToCompletion) {
  for (const auto& [m, p] : battery()) {
    SCOPED_TRACE(plan_to_json(p).dump());
    LoweredPlan lp = lowered(m, p);
    ASSERT_EQ(static_cast<int>(lp.programs.size()), p.pp);
    for (int s = 0; s < p.pp; ++s) EXPECT_EQ(lp.programs[s].stage, s);
    check_well_formed(lp);
    check_sends_match(lp);
    EXPECT_EQ(unfinished_ops(lp), 0);
    int ranks = 0;
    for (const Program& prog : lp.programs) ranks += static_cast<int>(prog.ranks.size());
    EXPECT_EQ(ranks, p.gpus());
  }
}

TEST(Lower, TensorParallelUsesMegatronFAndGOperators) {
  const Model m = tiny_gpt();
  LoweredPlan lp = lowered(m, make_plan(2, 1, 1, 1));
  const Program& p = lp.programs[0];
  const int64_t T = m.seq_len, h = m.hidden;
  // Forward of layer 0: column-parallel QKV/FC1 (n split), row-parallel out/FC2 (k split), each
  // row-parallel GEMM followed by an all-reduce of its output over tp.
  auto fwd = select(p, in(0, 0, Phase::kForward));
  std::vector<std::string> seq;
  for (const Op* o : fwd)
    if (o->kind == OpKind::kLinear || o->kind == OpKind::kAllReduce) seq.push_back(o->name);
  EXPECT_EQ(seq, (std::vector<std::string>{"L0.qkv", "L0.out", "L0.out.tp", "L0.fc1", "L0.fc2",
                                           "L0.fc2.tp"}));
  for (const Op* o : fwd) {
    if (o->name == "L0.qkv") {
      EXPECT_EQ(o->n, (m.q_dim() + 2 * m.kv_dim()) / 2);
    } else if (o->name == "L0.out") {
      EXPECT_EQ(o->k, m.q_dim() / 2);
    } else if (o->name == "L0.fc1") {
      EXPECT_EQ(o->n, m.ffn / 2);
    } else if (o->name == "L0.fc2") {
      EXPECT_EQ(o->k, m.ffn / 2);
    }
    if (o->kind == OpKind::kAllReduce) {
      EXPECT_EQ(o->group, Group::kTp);
      EXPECT_EQ(o->bytes, 2.0 * T * h);  // bf16 [T, h]
      EXPECT_EQ(o->stream, 1);
    }
    if (o->kind == OpKind::kNorm) {
      EXPECT_EQ(o->elements, double(T) * h);  // full sequence
    }
  }
  // Backward: the column-parallel input gradients are all-reduced, overlapping the weight
  // gradient GEMM issued after them (which does not wait for the all-reduce).
  auto bwd = select(p, in(0, 0, Phase::kBackward));
  std::vector<std::string> bseq;
  for (const Op* o : bwd)
    if (o->kind == OpKind::kAllReduce) bseq.push_back(o->name);
  EXPECT_EQ(bseq, (std::vector<std::string>{"L0.fc1.dx.tp", "L0.qkv.dx.tp"}));
  for (size_t i = 0; i + 1 < bwd.size(); ++i) {
    if (bwd[i]->kind != OpKind::kAllReduce) continue;
    const Op* wgrad = bwd[i + 1];
    EXPECT_EQ(wgrad->kind, OpKind::kLinear);
    EXPECT_FALSE(wgrad->backward_data);
    EXPECT_EQ(std::count(wgrad->deps.begin(), wgrad->deps.end(), bwd[i]->id), 0);
    EXPECT_TRUE(bwd[i - 1]->backward_data);  // the all-reduce follows the data gradient
  }
}

// PyTorch's DTensor TP (torchtitan, plan tp_impl torch) reduce-scatters the sum of the
// column-parallel data gradients after autograd has run those GEMMs' weight gradients, and the
// norm's backward waits for it: on the compute path, where Megatron runs it beside the weight
// gradient (core/plan.h TpImpl).
TEST(Lower, PytorchTensorParallelReducesTheDataGradientsAfterTheWeightGradients) {
  const Model m = tiny_gpt();
  for (bool overlap : {false, true}) {
    SCOPED_TRACE(overlap ? "async TP" : "TP");
    Plan plan = make_plan(2, 1, 1, 1);
    plan.sequence_parallel = true;
    plan.tp_comm_overlap = overlap;
    for (TpImpl impl : {TpImpl::kMegatron, TpImpl::kPytorch}) {
      plan.tp_impl = impl;
      LoweredPlan lp = lowered(m, plan);
      const Program& p = lp.programs[0];
      for (const char* name : {"L0.fc1", "L0.qkv"}) {
        const std::string rs_name = std::string(name) + ".dx.tp",
                          dw_name = std::string(name) + ".dw";
        auto rs = select(p, [&](const Op& o) {
          return o.name == rs_name && o.tags.phase == Phase::kBackward && o.tags.micro_batch == 0;
        });
        auto dw = select(p, [&](const Op& o) {
          return o.name == dw_name && o.tags.phase == Phase::kBackward && o.tags.micro_batch == 0;
        });
        ASSERT_EQ(rs.size(), 1u);
        ASSERT_EQ(dw.size(), 1u);
        EXPECT_EQ(rs[0]->kind, OpKind::kReduceScatter);
        EXPECT_EQ(rs[0]->bytes, 2.0 * m.seq_len * m.hidden);  // whole, never chunked
        // Who waits for whom: the compute ops after the reduction that depend on it.
        int waiting = 0;
        for (const Op& o : p.ops)
          if (o.id > rs[0]->id && o.stream == 0 &&
              std::count(o.deps.begin(), o.deps.end(), rs[0]->id) > 0)
            ++waiting;
        if (impl == TpImpl::kMegatron) {
          EXPECT_LT(rs[0]->id, dw[0]->id);  // issued first, the weight gradient beside it
          EXPECT_EQ(std::count(dw[0]->deps.begin(), dw[0]->deps.end(), rs[0]->id), 0);
        } else {
          EXPECT_GT(rs[0]->id, dw[0]->id);  // after the weight gradient...
          const int last_dep = *std::max_element(rs[0]->deps.begin(), rs[0]->deps.end());
          EXPECT_GE(last_dep, dw[0]->id);  // ...which it waits for
          EXPECT_GE(waiting, 1);           // and the next compute op waits for it
        }
      }
    }
  }
}

TEST(Lower, SequenceParallelGathersAndScattersWithoutAllReduceInLayers) {
  const Model m = tiny_gpt();
  Plan plan = make_plan(2, 1, 1, 1);
  plan.sequence_parallel = true;
  LoweredPlan lp = lowered(m, plan);
  const Program& p = lp.programs[0];
  const int64_t T = m.seq_len, h = m.hidden;
  EXPECT_EQ(count(p, [](const Op& o) { return o.kind == OpKind::kAllReduce && o.tags.layer >= 0; }),
            0);
  // The gradients of the weights that act on the sequence shard (the norms and the biases of
  // the row-parallel GEMMs, added after the reduce-scatter) are partial sums over the shards:
  // one TP all-reduce of them.
  auto norm_ar = select(p, [](const Op& o) { return o.name == "sp.g.ar"; });
  ASSERT_EQ(norm_ar.size(), 1u);
  EXPECT_EQ(norm_ar[0]->group, Group::kTp);
  // Per layer two layernorms (2 x h each) and two row-parallel biases (h each); the final norm.
  EXPECT_EQ(norm_ar[0]->bytes, 4.0 * ((2 * 2 + 2) * m.layers + 2) * m.hidden);
  for (int layer = 0; layer < m.layers; ++layer) {
    auto f = in(layer, 0, Phase::kForward), b = in(layer, 0, Phase::kBackward);
    EXPECT_EQ(count(p, both(f, kind(OpKind::kAllGather))), 2);
    EXPECT_EQ(count(p, both(f, kind(OpKind::kReduceScatter))), 2);
    // Backward: the conjugates (all-gather before the row-parallel data gradient, reduce-
    // scatter of the column-parallel input gradient) and the column inputs gathered again.
    EXPECT_EQ(count(p, both(b, kind(OpKind::kAllGather))), 4);
    EXPECT_EQ(count(p, both(b, kind(OpKind::kReduceScatter))), 2);
  }
  for (const Op& o : p.ops) {
    if (o.tags.layer < 0) continue;
    // Norms and residuals on the sequence shard; all-gather output / reduce-scatter input full.
    if (o.kind == OpKind::kNorm || o.kind == OpKind::kResidualAdd) {
      EXPECT_EQ(o.elements, double(T / 2) * h) << o.name;
    }
    if (o.kind == OpKind::kAllGather || o.kind == OpKind::kReduceScatter) {
      EXPECT_EQ(o.bytes, 2.0 * T * h) << o.name;
    }
  }
  // Each all-gather feeds a column-parallel GEMM: QKV's input is the gathered buffer.
  auto qkv = select(p, [](const Op& o) {
    return o.name == "L0.qkv" && o.tags.phase == Phase::kForward && o.tags.micro_batch == 0;
  });
  ASSERT_EQ(qkv.size(), 1u);
  const Op& ag = p.ops[qkv[0]->id - 1];
  EXPECT_EQ(ag.kind, OpKind::kAllGather);
  EXPECT_EQ(ag.writes[0], qkv[0]->reads[0]);
}

TEST(Lower, ContextParallelRingExchangesKVChunks) {
  const Model m = model_preset("tiny");
  for (int cp : {2, 4}) {
    Plan plan = make_plan(1, 1, 1, 2);
    plan.cp = cp;
    LoweredPlan lp = lowered(m, plan);
    const Program& p = lp.programs[0];
    const double kv_bytes = 2.0 * 2 * (m.seq_len / cp) * m.kv_dim();  // K and V, bf16
    for (int layer = 0; layer < m.layers; ++layer)
      for (int mb = 0; mb < 2; ++mb) {
        auto f = in(layer, mb, Phase::kForward), b = in(layer, mb, Phase::kBackward);
        auto cp_send = [](const Op& o) { return o.kind == OpKind::kSend && o.group == Group::kCp; };
        auto cp_recv = [](const Op& o) { return o.kind == OpKind::kRecv && o.group == Group::kCp; };
        EXPECT_EQ(count(p, both(f, cp_send)), cp - 1);
        EXPECT_EQ(count(p, both(f, cp_recv)), cp - 1);
        EXPECT_EQ(count(p, both(f, kind(OpKind::kAttention))), cp);
        // Backward: K/V again (cp - 1 hops), and their gradients (cp hops: the last takes the
        // accumulator home, where it is folded into dQKV).
        EXPECT_EQ(count(p, both(b, cp_send)), 2 * (cp - 1) + 1);
        EXPECT_EQ(count(p, both(b, kind(OpKind::kAttention))), cp);
        auto folds = select(p, both(b, [](const Op& o) { return o.name.ends_with("dkv.fold"); }));
        ASSERT_EQ(folds.size(), 1u);
        auto home = select(p, both(b, cp_recv)).back();
        EXPECT_TRUE(std::count(folds[0]->deps.begin(), folds[0]->deps.end(), home->id));
        EXPECT_EQ(folds[0]->reads.back(), home->writes[0]);
        for (const Op* o : select(p, both(f, cp_send))) {
          EXPECT_EQ(o->bytes, kv_bytes);
          EXPECT_EQ(o->stream, 1);
        }
        // Step j > 0 attends to the chunk received at step j - 1.
        auto steps = select(p, both(f, kind(OpKind::kAttention)));
        auto recvs = select(p, both(f, cp_recv));
        for (int j = 1; j < cp; ++j) {
          EXPECT_EQ(steps[j]->attn.seq_q, m.seq_len / cp);
          EXPECT_TRUE(std::count(steps[j]->deps.begin(), steps[j]->deps.end(), recvs[j - 1]->id));
        }
      }
  }
}

TEST(Lower, PytorchRingPassesTheKVGradientsOnInFp32) {
  // PyTorch's context_parallel accumulates dK, dV in fp32 (_attention.py: grad_key/grad_value
  // zeros_like(dtype=float32) under convert_to_f32) and passes that buffer on; Transformer
  // Engine passes them on in the attention's dtype. The K/V themselves travel in bf16 either way.
  const Model m = model_preset("tiny");
  const double elements = 2.0 * (m.seq_len / 4) * m.kv_dim();  // K and V of a chunk pair
  for (CpImpl impl : {CpImpl::kTransformerEngine, CpImpl::kPytorch}) {
    SCOPED_TRACE(cp_impl_name(impl));
    Plan plan = make_plan(1, 1, 1, 1);
    plan.cp = 4;
    plan.cp_impl = impl;
    LoweredPlan lp = lowered(m, plan);
    const Program& p = lp.programs[0];
    const double acc = impl == CpImpl::kPytorch ? 4 : 2;
    auto b = in(0, 0, Phase::kBackward);
    auto dkv = select(p, both(b, [](const Op& o) {
                        return o.kind == OpKind::kSend && o.name.ends_with("dkv.send");
                      }));
    ASSERT_EQ(dkv.size(), 4u);
    for (const Op* o : dkv) EXPECT_EQ(o->bytes, acc * elements);
    auto kv = select(p, both(b, [](const Op& o) {
                       return o.kind == OpKind::kSend && o.name.ends_with("kv.send") &&
                              !o.name.ends_with("dkv.send");
                     }));
    ASSERT_EQ(kv.size(), 3u);
    for (const Op* o : kv) EXPECT_EQ(o->bytes, 2 * elements);
    // The accumulation reads the fp32 (or bf16) accumulator and the step's bf16 gradient and
    // writes the accumulator; the fold reads it and adds it into the bf16 dQKV.
    for (const Op* o : select(p, both(b, [](const Op& o) { return o.name.ends_with("dkv.acc"); })))
      EXPECT_EQ(o->bytes, (2 * acc + 2) * elements);
    for (const Op* o : select(p, both(b, [](const Op& o) { return o.name.ends_with("dkv.fold"); })))
      EXPECT_EQ(o->bytes, (acc + 2 * 2) * elements);
  }
}

TEST(Lower, PytorchAllGatherRotaterGathersTheKVOncePerPass) {
  // torch's _AllGatherRotater (_attention.py, the default rotate_method): exchange_buffers at the
  // first step all-gathers every rank's K | V once; the later steps slice their chunk out of it.
  // The backward gathers again; its K/V gradients still travel the ring (_AllToAllRotater).
  const Model m = model_preset("tiny");
  const int cp = 4;
  const double chunk = 2.0 * (m.seq_len / cp) * m.kv_dim() * 2;  // bf16 K and V of a chunk pair
  Plan plan = make_plan(1, 1, 1, 1);
  plan.cp = cp;
  plan.cp_impl = CpImpl::kPytorch;
  plan.cp_rotate = CpRotate::kAllGather;
  LoweredPlan lp = lowered(m, plan);
  const Program& p = lp.programs[0];
  auto named = [](const char* what) {
    return [what](const Op& o) { return o.name.ends_with(what); };
  };
  for (Phase phase : {Phase::kForward, Phase::kBackward}) {
    SCOPED_TRACE(phase == Phase::kForward ? "forward" : "backward");
    auto pass = in(0, 0, phase);
    auto ag = select(p, both(pass, kind(OpKind::kAllGather)));
    ASSERT_EQ(ag.size(), 1u);
    EXPECT_EQ(ag[0]->group, Group::kCp);
    EXPECT_EQ(ag[0]->bytes, cp * chunk);  // the gathered output (nccl-tests convention)
    EXPECT_EQ(count(p, both(pass, named(".kv.send"))), 0);
    auto steps = select(p, both(pass, kind(OpKind::kAttention)));
    ASSERT_EQ(steps.size(), static_cast<size_t>(cp));
    // The first step attends to the local chunk beside the gather; every later one waits for it.
    EXPECT_FALSE(std::count(steps[0]->deps.begin(), steps[0]->deps.end(), ag[0]->id));
    for (int j = 1; j < cp; ++j)
      EXPECT_TRUE(std::count(steps[j]->deps.begin(), steps[j]->deps.end(), ag[0]->id));
  }
  EXPECT_EQ(count(p, both(in(0, 0, Phase::kBackward), named("dkv.send"))), cp);
}

// Sum of the FLOPs of the attention ops of a pass.
double attention_flops_of(const Program& p, Phase phase) {
  double f = 0;
  for (const Op* o : select(p, both(in(0, 0, phase), kind(OpKind::kAttention)))) f += o->flops;
  return f;
}

TEST(Lower, TransformerEngineAllGatherRunsTwoKernelsAfterOneGather) {
  // Megatron --cp-comm-type all_gather (Transformer Engine's AttnFuncWithCPAndKVAllGather): K and V
  // of every context rank gathered, then one kernel per local chunk against its causal K/V prefix;
  // the backward gathers again and reduce-scatters dK/dV. No ring.
  const Model m = model_preset("tiny");
  const int cp = 4;
  const double chunk = 2.0 * (m.seq_len / cp) * m.kv_dim() * 2;  // bf16 K and V of a chunk pair
  Plan plan = make_plan(1, 1, 1, 1);
  plan.cp = cp;
  plan.cp_comm_type = CpCommType::kAllGather;
  const Program p = lowered(m, plan).programs[0];
  // The rank's share of the causal square: 4 b h d S (S + 1) / 2 / cp (program.cc's count).
  const double S = m.seq_len;
  const double share = 4.0 * m.heads * m.head_dim * S * (S + 1) / 2 / cp;
  for (Phase phase : {Phase::kForward, Phase::kBackward}) {
    SCOPED_TRACE(phase == Phase::kForward ? "forward" : "backward");
    auto pass = in(0, 0, phase);
    auto ag = select(p, both(pass, kind(OpKind::kAllGather)));
    ASSERT_EQ(ag.size(), 1u);
    EXPECT_EQ(ag[0]->group, Group::kCp);
    EXPECT_EQ(ag[0]->bytes, cp * chunk);
    auto kernels = select(p, both(pass, kind(OpKind::kAttention)));
    ASSERT_EQ(kernels.size(), 2u);
    for (const Op* k : kernels) {
      EXPECT_TRUE(std::count(k->deps.begin(), k->deps.end(), ag[0]->id));  // exposed
      EXPECT_EQ(k->attn.seq_q, m.seq_len / cp / 2);
    }
    EXPECT_EQ(count(p, both(pass, kind(OpKind::kSend))), 0);
    const double ratio = phase == Phase::kForward ? 1.0 : kFlashBackwardFlopRatio;
    EXPECT_NEAR(attention_flops_of(p, phase), ratio * share, 1e-9 * share);
  }
  auto rs = select(p, both(in(0, 0, Phase::kBackward), kind(OpKind::kReduceScatter)));
  ASSERT_EQ(rs.size(), 1u);
  EXPECT_EQ(rs[0]->group, Group::kCp);
  EXPECT_EQ(rs[0]->bytes, cp * chunk);
}

TEST(Lower, TransformerEngineAllToAllTradesTheSequenceForHeads) {
  // Megatron --cp-comm-type a2a (DeepSpeed-Ulysses): Q, K, V traded over the context group, one
  // causal kernel on the whole sequence with heads / cp heads, the output traded back; the
  // backward trades dO, then dQ, dK, dV.
  const Model m = model_preset("tiny");
  const int cp = 2;
  Plan plan = make_plan(1, 1, 1, 1);
  plan.cp = cp;
  plan.cp_comm_type = CpCommType::kA2a;
  const Program p = lowered(m, plan).programs[0];
  const double tokens = m.seq_len / cp;
  const double qkv = 2.0 * tokens * (m.heads + 2 * m.kv_heads) * m.head_dim;  // bf16
  const double out = 2.0 * tokens * m.heads * m.head_dim;
  const double S = m.seq_len;
  const double share = 4.0 * m.heads * m.head_dim * S * (S + 1) / 2 / cp;
  for (Phase phase : {Phase::kForward, Phase::kBackward}) {
    SCOPED_TRACE(phase == Phase::kForward ? "forward" : "backward");
    auto pass = in(0, 0, phase);
    auto a2a = select(p, both(pass, kind(OpKind::kAllToAll)));
    ASSERT_EQ(a2a.size(), 2u);
    for (const Op* o : a2a) EXPECT_EQ(o->group, Group::kCp);
    const bool fwd = phase == Phase::kForward;
    EXPECT_EQ(a2a[0]->bytes, fwd ? qkv : out);
    EXPECT_EQ(a2a[1]->bytes, fwd ? out : qkv);
    auto kernels = select(p, both(pass, kind(OpKind::kAttention)));
    ASSERT_EQ(kernels.size(), 1u);
    EXPECT_EQ(kernels[0]->attn.seq_q, m.seq_len);
    EXPECT_EQ(kernels[0]->attn.seq_kv, m.seq_len);
    EXPECT_EQ(kernels[0]->attn.heads, m.heads / cp);
    EXPECT_EQ(kernels[0]->attn.kv_heads, m.kv_heads / cp);
    EXPECT_TRUE(std::count(kernels[0]->deps.begin(), kernels[0]->deps.end(), a2a[0]->id));
    EXPECT_EQ(count(p, both(pass, kind(OpKind::kSend))), 0);
    EXPECT_NEAR(attention_flops_of(p, phase), (fwd ? 1.0 : kFlashBackwardFlopRatio) * share,
                1e-9 * share);
  }
}

TEST(Lower, HierarchicalContextParallelismTradesInGroupsAndRingsAcrossThem) {
  // Megatron --cp-comm-type a2a+p2p --hierarchical-context-parallel-sizes 2 2 (Transformer
  // Engine's AttnFuncWithCPAndKVP2P with a cp_group list): Q, K, V traded inside the all-to-all
  // group (heads for the group's tokens), a ring of cp / 2 steps across the groups on heads / 2
  // heads, the output traded back; the backward trades out and dO, runs the ring backward (K/V
  // and their gradients around the ring) and trades dQ, dK, dV back.
  const Model m = model_preset("tiny");
  const int cp = 4, a = 2, ring = cp / a;
  Plan plan = make_plan(1, 1, 1, 1);
  plan.cp = cp;
  plan.cp_comm_type = CpCommType::kA2aP2p;
  plan.cp_a2a_size = a;
  const Program p = lowered(m, plan).programs[0];
  const double tokens = m.seq_len / cp;
  const double qkv = 2.0 * tokens * (m.heads + 2 * m.kv_heads) * m.head_dim;  // bf16
  const double out = 2.0 * tokens * m.heads * m.head_dim;
  // The K/V a ring step passes: the group's tokens (a x) of heads / a K/V heads.
  const double kv = 2.0 * (a * tokens) * (2 * m.kv_heads / a) * m.head_dim;
  // Each of the ring's steps covers the causal pairs of a chunk of the group's a x tokens
  // (load-balanced: the diagonal step, or half the queries against all keys, or all the queries
  // against half the keys), on heads / a heads: 4 (h / a) d c (c + 1) / 2 with c = S / ring.
  const double c = m.seq_len / ring;
  const double per_step = 4.0 * (m.heads / a) * m.head_dim * c * (c + 1) / 2;
  auto named = [](const char* what) {
    return [what](const Op& o) { return o.name.ends_with(what); };
  };
  for (Phase phase : {Phase::kForward, Phase::kBackward}) {
    SCOPED_TRACE(phase == Phase::kForward ? "forward" : "backward");
    const bool fwd = phase == Phase::kForward;
    auto pass = in(0, 0, phase);
    auto a2a = select(p, both(pass, kind(OpKind::kAllToAll)));
    ASSERT_EQ(a2a.size(), 2u);
    for (const Op* o : a2a) EXPECT_EQ(o->group, Group::kCpA2a);
    EXPECT_EQ(a2a[0]->bytes, fwd ? qkv : 2 * out);  // the backward trades out and dO together
    EXPECT_EQ(a2a[1]->bytes, fwd ? out : qkv);
    auto kernels = select(p, both(pass, kind(OpKind::kAttention)));
    ASSERT_EQ(kernels.size(), static_cast<size_t>(ring));
    for (const Op* k : kernels) {
      EXPECT_EQ(k->attn.heads, m.heads / a);
      EXPECT_EQ(k->attn.kv_heads, m.kv_heads / a);
      EXPECT_EQ(k->attn.seq_q, a * tokens);
      EXPECT_TRUE(std::count(k->deps.begin(), k->deps.end(), a2a[0]->id) ||
                  k != kernels[0]);  // the ring starts after the trade
    }
    EXPECT_NEAR(attention_flops_of(p, phase),
                (fwd ? 1.0 : kFlashBackwardFlopRatio) * ring * per_step, 1e-9 * ring * per_step);
    auto sends = select(p, both(pass, named(".kv.send")));
    ASSERT_EQ(sends.size(), static_cast<size_t>(ring - 1));
    for (const Op* o : sends) {
      EXPECT_EQ(o->group, Group::kCpRing);
      EXPECT_EQ(o->bytes, kv);
    }
    EXPECT_EQ(count(p, both(pass, kind(OpKind::kAllGather))), 0);
  }
  auto dkv = select(p, both(in(0, 0, Phase::kBackward), named("dkv.send")));
  ASSERT_EQ(dkv.size(), static_cast<size_t>(ring));
  for (const Op* o : dkv) EXPECT_EQ(o->group, Group::kCpRing);
}

TEST(Lower, RepeatedKVHeadsTravelWithEveryQueryHead) {
  // GQA expanded before attention (torchtitan's repeat_kv): the kernel and the ring carry heads /
  // kv_heads times the K/V of the model's own heads; the FLOPs do not change.
  Model m = model_preset("tiny");
  ASSERT_LT(m.kv_heads, m.heads);
  const double rep = double(m.heads) / m.kv_heads;
  Plan plan = make_plan(1, 1, 1, 1);
  plan.cp = 2;
  plan.cp_impl = CpImpl::kPytorch;
  auto sends = [](const Program& p) {
    std::vector<double> b;
    for (const Op* o : select(p, [](const Op& o) { return o.kind == OpKind::kSend; }))
      b.push_back(o->bytes);
    return b;
  };
  auto attn = [](const Program& p) {
    return *select(p, [](const Op& o) { return o.kind == OpKind::kAttention; })[0];
  };
  LoweredPlan base = lowered(m, plan);
  plan.repeat_kv = true;
  LoweredPlan rep_kv = lowered(m, plan);
  const std::vector<double> a = sends(base.programs[0]), b = sends(rep_kv.programs[0]);
  ASSERT_EQ(a.size(), b.size());
  ASSERT_FALSE(a.empty());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_DOUBLE_EQ(b[i], rep * a[i]);
  const Op x = attn(base.programs[0]), y = attn(rep_kv.programs[0]);
  EXPECT_EQ(y.attn.kv_heads, y.attn.heads);
  EXPECT_EQ(x.attn.kv_heads, m.kv_heads);
  EXPECT_EQ(y.flops, x.flops);
}

TEST(Lower, ExpertParallelRoutesThroughTwoAllToAllsPerMoELayer) {
  const Model m = model_preset("tiny-moe");
  Plan plan = make_plan(1, 1, 4, 16);  // 4 micro-batches
  plan.ep = 2;
  LoweredPlan lp = lowered(m, plan);
  const Program& p = lp.programs[0];
  for (int layer = 0; layer < m.layers; ++layer) {
    ASSERT_TRUE(m.is_moe_layer(layer));
    auto f = in(layer, 0, Phase::kForward);
    std::vector<OpKind> seq;
    for (const Op* o : select(p, f))
      if (o->kind == OpKind::kRouter || o->kind == OpKind::kDispatch ||
          o->kind == OpKind::kAllToAll || o->kind == OpKind::kExpertLinear ||
          o->kind == OpKind::kCombine)
        seq.push_back(o->kind);
    EXPECT_EQ(seq, (std::vector<OpKind>{OpKind::kRouter, OpKind::kDispatch, OpKind::kAllToAll,
                                        OpKind::kExpertLinear, OpKind::kExpertLinear,
                                        OpKind::kAllToAll, OpKind::kCombine}));
    for (const Op* o : select(p, both(f, kind(OpKind::kAllToAll)))) EXPECT_EQ(o->group, Group::kEp);
    for (const Op* o : select(p, both(f, kind(OpKind::kExpertLinear))))
      EXPECT_EQ(o->batch, m.moe.experts / 2);  // the local experts
    EXPECT_EQ(count(p, both(in(layer, 0, Phase::kBackward), kind(OpKind::kAllToAll))), 2);
    // Gradients: dense weights over dp x cp, experts over (dp / ep) x cp.
    auto ar = select(p, both(in(layer, 3, Phase::kBackward), kind(OpKind::kAllReduce)));
    std::set<Group> groups;
    for (const Op* o : ar) groups.insert(o->group);
    EXPECT_EQ(groups, (std::set<Group>{Group::kDpCp, Group::kExpertDp}));
  }
}

TEST(Lower, EmbeddingAndCrossEntropyAreVocabParallel) {
  const Model m = tiny_gpt();
  LoweredPlan lp = lowered(m, make_plan(2, 2, 1, 2));
  const Program& first = lp.programs[0];
  const Program& last = lp.programs[1];
  auto emb = select(first, both(kind(OpKind::kEmbedding), in(-1, 0, Phase::kForward)));
  ASSERT_EQ(emb.size(), 1u);
  bool table = false;
  for (int b : emb[0]->reads)
    if (first.buffers[b].cls == BufferClass::kParam && first.buffers[b].shape[0] == m.vocab / 2)
      table = true;
  EXPECT_TRUE(table) << "the embedding reads its vocab shard";
  EXPECT_EQ(first.ops[emb[0]->id + 1].kind, OpKind::kAllReduce);
  EXPECT_EQ(count(last, kind(OpKind::kEmbedding)), 0);
  auto head = select(last, [](const Op& o) { return o.name == "head"; });
  ASSERT_EQ(head.size(), 2u);  // one per micro-batch
  EXPECT_EQ(head[0]->n, m.vocab / 2);
  // Megatron's vocab-parallel loss: the row max is all-reduced with max, then the sums of
  // exponentials and the target logits with a sum, in that order.
  EXPECT_EQ(count(last, both(kind(OpKind::kCrossEntropy), in(-1, 0, Phase::kForward))), 2);
  EXPECT_EQ(count(last, both(kind(OpKind::kCrossEntropy), in(-1, 0, Phase::kBackward))), 1);
  auto reductions = select(last, both(kind(OpKind::kAllReduce), in(-1, 0, Phase::kForward)));
  ASSERT_EQ(reductions.size(), 2u);
  EXPECT_TRUE(reductions[0]->reduce_max);
  EXPECT_FALSE(reductions[1]->reduce_max);
  EXPECT_LT(reductions[0]->id, reductions[1]->id);
  EXPECT_EQ(count(first, kind(OpKind::kCrossEntropy)), 0);
}

// Gradient reductions of a layer's dense bucket.
std::vector<const Op*> grad_reductions(const Program& p, int layer, Group g) {
  return select(p, [=](const Op& o) {
    return o.tags.layer == layer && o.group == g && o.tags.phase != Phase::kForward &&
           o.tags.phase != Phase::kRecompute &&
           (o.kind == OpKind::kAllReduce || o.kind == OpKind::kReduceScatter) &&
           o.name.find(".g.") != std::string::npos;
  });
}

TEST(Lower, Zero0AllReducesEachLayerAfterItsLastBackwardOverlapped) {
  const Model m = tiny_gpt(4);
  LoweredPlan lp = lowered(m, make_plan(1, 1, 2, 8));  // 4 micro-batches
  const Program& p = lp.programs[0];
  for (int layer = 0; layer < m.layers; ++layer) {
    auto r = grad_reductions(p, layer, Group::kDpCp);
    ASSERT_EQ(r.size(), 1u);
    EXPECT_EQ(r[0]->kind, OpKind::kAllReduce);
    EXPECT_EQ(r[0]->stream, 3);  // the data-parallel stream, apart from TP traffic
    EXPECT_EQ(r[0]->tags.micro_batch, 3);
    EXPECT_EQ(r[0]->tags.phase, Phase::kBackward);
    // After this layer's last backward op, before the next (lower) layer's backward compute.
    auto last_bwd =
        select(p, both(in(layer, 3, Phase::kBackward), [](const Op& o) { return o.stream == 0; }));
    EXPECT_GT(r[0]->id, last_bwd.back()->id);
    if (layer > 0) {
      EXPECT_LT(r[0]->id, select(p, in(layer - 1, 3, Phase::kBackward)).front()->id);
    }
  }
}

// ZeRO 1 (Megatron's distributed optimizer): each layer's gradients reduce-scattered once, its
// shard updated, the updated shards all-gathered in place: after the optimizer without
// overlap_param_gather; with it (Megatron's forward pre-hooks, param_and_grad_buffer.py
// start_param_sync / finish_param_sync) in the forward, once a step, before the first op that
// reads the layer's weights, which waits for it.
TEST(Lower, Zero1ReduceScattersUpdatesTheShardAndGathers) {
  const Model m = tiny_gpt(2);
  for (bool overlap : {false, true}) {
    SCOPED_TRACE(overlap ? "overlap_param_gather" : "gathered after the optimizer");
    Plan plan = make_plan(1, 1, 4, 8);
    plan.zero = 1;
    plan.overlap_param_gather = overlap;
    LoweredPlan lp = lowered(m, plan);
    const Program& p = lp.programs[0];
    for (int layer = 0; layer < m.layers; ++layer) {
      auto r = grad_reductions(p, layer, Group::kDpCp);
      ASSERT_EQ(r.size(), 1u);
      EXPECT_EQ(r[0]->kind, OpKind::kReduceScatter);
      auto adam = select(p, both(kind(OpKind::kAdamW), in(layer, -1, Phase::kOptimizer)));
      ASSERT_EQ(adam.size(), 1u);
      auto ag = select(
          p, both(kind(OpKind::kAllGather), [&](const Op& o) { return o.tags.layer == layer; }));
      ASSERT_EQ(ag.size(), 1u);
      EXPECT_EQ(ag[0]->group, Group::kDpCp);
      EXPECT_EQ(ag[0]->reads, ag[0]->writes);                    // in place
      EXPECT_NEAR(ag[0]->bytes, 4 * adam[0]->elements * 2, 32);  // bf16 weights, 4 shards
      EXPECT_NEAR(r[0]->bytes, 4 * adam[0]->elements * 4, 64);   // fp32 gradients
      if (!overlap) {
        EXPECT_EQ(ag[0]->tags.phase, Phase::kOptimizer);
        EXPECT_GT(ag[0]->id, adam[0]->id);
        continue;
      }
      EXPECT_EQ(ag[0]->tags.phase, Phase::kForward);
      EXPECT_EQ(ag[0]->tags.micro_batch, 0);
      // The first op of the layer's forward reading its weights waits for the gather.
      const Op* first = nullptr;
      for (const Op* o : select(p, in(layer, 0, Phase::kForward)))
        for (int b : o->reads)
          if (!first && o != ag[0] && b == ag[0]->writes[0]) first = o;
      ASSERT_NE(first, nullptr);
      EXPECT_GT(first->id, ag[0]->id);
      EXPECT_NE(std::find(first->deps.begin(), first->deps.end(), ag[0]->id), first->deps.end());
    }
  }
}

TEST(Lower, Zero2ReduceScattersEveryMicroBatch) {
  const Model m = tiny_gpt(2);
  Plan plan = make_plan(1, 1, 2, 8);
  plan.zero = 2;
  LoweredPlan lp = lowered(m, plan);
  const Program& p = lp.programs[0];
  for (int layer = 0; layer < m.layers; ++layer) {
    auto r = grad_reductions(p, layer, Group::kDpCp);
    ASSERT_EQ(r.size(), 4u);
    for (int mb = 0; mb < 4; ++mb) {
      EXPECT_EQ(r[mb]->kind, OpKind::kReduceScatter);
      EXPECT_EQ(r[mb]->tags.micro_batch, mb);
      // Its inputs are this micro-batch's (non-persistent) gradient buffers.
      for (int b : r[mb]->reads) EXPECT_FALSE(p.buffers[b].persistent);
      for (int b : r[mb]->writes) EXPECT_TRUE(p.buffers[b].persistent);
    }
  }
}

TEST(Lower, Zero3GathersEachLayerBeforeItsFirstGemm) {
  const Model m = tiny_gpt(2);
  Plan plan = make_plan(1, 1, 2, 4);
  plan.zero = 3;
  plan.recompute = Recompute::kFull;
  LoweredPlan lp = lowered(m, plan);
  const Program& p = lp.programs[0];
  for (int layer = 0; layer < m.layers; ++layer)
    for (int mb = 0; mb < 2; ++mb)
      for (Phase ph : {Phase::kForward, Phase::kRecompute}) {
        SCOPED_TRACE(std::to_string(layer) + "/" + std::to_string(mb) + phase_name(ph));
        auto ops = select(p, in(layer, mb, ph));
        auto ag = select(p, both(in(layer, mb, ph), kind(OpKind::kAllGather)));
        // The backward reads the weights its recompute gathered: no gather of its own (FSDP2's
        // pre-backward unshard serves the checkpoint's recompute; core/lower_schedule.cc).
        if (ph == Phase::kRecompute) {
          EXPECT_TRUE(
              select(p, both(in(layer, mb, Phase::kBackward), kind(OpKind::kAllGather))).empty());
        }
        ASSERT_EQ(ag.size(), 1u);
        EXPECT_EQ(ag[0]->group, Group::kDpCp);
        const Op* gemm = nullptr;
        for (const Op* o : ops)
          if (o->kind == OpKind::kLinear && !gemm) gemm = o;
        ASSERT_NE(gemm, nullptr);
        EXPECT_LT(ag[0]->id, gemm->id);
        // The GEMM reads a gathered (non-persistent) weight.
        bool gathered = false;
        for (int b : gemm->reads)
          if (std::count(ag[0]->writes.begin(), ag[0]->writes.end(), b)) gathered = true;
        EXPECT_TRUE(gathered);
        for (int b : ag[0]->writes) EXPECT_FALSE(p.buffers[b].persistent);
        for (int b : ag[0]->reads) EXPECT_TRUE(p.buffers[b].persistent);
      }
  // Gradients reduce-scattered per micro-batch.
  EXPECT_EQ(grad_reductions(p, 0, Group::kDpCp).size(), 2u);
}

TEST(Lower, OneF1BStagesWarmUpThenAlternateThenCoolDown) {
  const Model m = tiny_gpt(4);
  LoweredPlan lp = lowered(m, make_plan(1, 4, 1, 6));
  for (int s = 0; s < 4; ++s) {
    auto u = units(lp.programs[s]);
    ASSERT_EQ(u.size(), 12u);
    const int warm = 4 - s - 1;
    std::vector<U> want;
    for (int i = 0; i < warm; ++i) want.push_back({true, 0, i});
    for (int i = 0; i < 6 - warm; ++i) {
      want.push_back({true, 0, warm + i});
      want.push_back({false, 0, i});
    }
    for (int i = 6 - warm; i < 6; ++i) want.push_back({false, 0, i});
    EXPECT_EQ(u, want) << "stage " << s;
  }
  // Stage 0 starts with pp - 1 forwards before its first backward.
  auto u0 = units(lp.programs[0]);
  EXPECT_TRUE(u0[0].fwd && u0[1].fwd && u0[2].fwd && u0[3].fwd && !u0[4].fwd);
}

TEST(Lower, GPipeRunsAllForwardsFirst) {
  Plan plan = make_plan(1, 2, 1, 4);
  plan.schedule = Schedule::kGpipe;
  LoweredPlan lp = lowered(tiny_gpt(), plan);
  auto u = units(lp.programs[1]);
  ASSERT_EQ(u.size(), 8u);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(u[i], (U{true, 0, i}));
  for (int i = 0; i < 4; ++i) EXPECT_EQ(u[4 + i], (U{false, 0, i}));
}

TEST(Lower, InterleavedOrderAndChunksFollowMegatron) {
  const Model m = tiny_gpt(4);
  Plan plan = make_plan(1, 2, 1, 4);
  plan.schedule = Schedule::kInterleaved;
  plan.vpp = 2;
  LoweredPlan lp = lowered(m, plan);
  // Worked by hand from Megatron's forward_backward_pipelining_with_interleaving: warm-up
  // (pp - s - 1) * 2 + (vpp - 1) * pp virtual micro-batches, chunk (k / pp) % vpp forward and
  // vpp - 1 - that backward, micro-batch (k / (pp * vpp)) * pp + k % pp.
  const std::vector<U> s0 = {{true, 0, 0},  {true, 0, 1},  {true, 1, 0},  {true, 1, 1},
                             {true, 0, 2},  {false, 1, 0}, {true, 0, 3},  {false, 1, 1},
                             {true, 1, 2},  {false, 0, 0}, {true, 1, 3},  {false, 0, 1},
                             {false, 1, 2}, {false, 1, 3}, {false, 0, 2}, {false, 0, 3}};
  const std::vector<U> s1 = {{true, 0, 0}, {true, 0, 1},  {true, 1, 0},  {false, 1, 0},
                             {true, 1, 1}, {false, 1, 1}, {true, 0, 2},  {false, 0, 0},
                             {true, 0, 3}, {false, 0, 1}, {true, 1, 2},  {false, 1, 2},
                             {true, 1, 3}, {false, 1, 3}, {false, 0, 2}, {false, 0, 3}};
  EXPECT_EQ(units(lp.programs[0]), s0);
  EXPECT_EQ(units(lp.programs[1]), s1);
  // Chunk c of stage s holds the layers of virtual stage c * pp + s (one layer each here).
  for (int s = 0; s < 2; ++s)
    for (const Op& o : lp.programs[s].ops)
      if (o.tags.layer >= 0) {
        EXPECT_EQ(o.tags.layer, o.tags.chunk * 2 + s) << o.name;
      }
  // Stage 1 chunk 0 sends to stage 0 chunk 1 (the wrap-around), which receives from stage 1.
  auto wrap = select(lp.programs[1], [](const Op& o) {
    return o.kind == OpKind::kSend && o.tags.chunk == 0 && o.tags.phase == Phase::kForward;
  });
  ASSERT_FALSE(wrap.empty());
  EXPECT_EQ(wrap[0]->peer_stage, 0);
  EXPECT_EQ(count(lp.programs[0], kind(OpKind::kCrossEntropy)), 0);
  EXPECT_EQ(count(lp.programs[1], kind(OpKind::kCrossEntropy)), 12);  // 4 x (max, loss, grad)
  EXPECT_EQ(unfinished_ops(lp), 0);
  // Larger: the warm-up length of every stage.
  Plan big = make_plan(1, 4, 1, 8);
  big.schedule = Schedule::kInterleaved;
  big.vpp = 2;
  LoweredPlan lb = lowered(tiny_gpt(8), big);
  for (int s = 0; s < 4; ++s) {
    auto u = units(lb.programs[s]);
    int warm = 0;
    while (u[warm].fwd) ++warm;
    EXPECT_EQ(warm, std::min((4 - s - 1) * 2 + (2 - 1) * 4, 16) + 1) << s;  // + the steady F
  }
  EXPECT_EQ(unfinished_ops(lb), 0);
}

TEST(Lower, PipelineSendsActivationsForwardAndGradientsBackward) {
  const Model m = tiny_gpt(4);
  LoweredPlan lp = lowered(m, make_plan(2, 4, 1, 2));
  const Program& p = lp.programs[1];
  const double bytes = 2.0 * m.seq_len * m.hidden / 2;  // 1/tp of the bf16 activation
  auto sends = select(p, kind(OpKind::kSend));
  auto recvs = select(p, kind(OpKind::kRecv));
  ASSERT_EQ(sends.size(), 4u);
  ASSERT_EQ(recvs.size(), 4u);
  for (const Op* o : sends) {
    EXPECT_EQ(o->peer_stage, o->tags.phase == Phase::kForward ? 2 : 0);
    EXPECT_EQ(o->bytes, bytes);
    EXPECT_EQ(o->group, Group::kPp);
  }
  for (const Op* o : recvs) {
    EXPECT_EQ(o->peer_stage, o->tags.phase == Phase::kForward ? 0 : 2);
    // The TP group all-gathers the 1/tp pieces.
    EXPECT_EQ(p.ops[o->id + 1].kind, OpKind::kAllGather);
  }
}

TEST(Lower, SelectiveRecomputeReEmitsAttentionBeforeItsBackward) {
  const Model m = tiny_gpt(2);
  Plan plan = make_plan(1, 1, 1, 2);
  plan.recompute = Recompute::kSelective;
  LoweredPlan lp = lowered(m, plan);
  const Program& p = lp.programs[0];
  for (int layer = 0; layer < 2; ++layer)
    for (int mb = 0; mb < 2; ++mb) {
      auto rc = select(p, in(layer, mb, Phase::kRecompute));
      ASSERT_EQ(rc.size(), 1u);
      EXPECT_EQ(rc[0]->kind, OpKind::kAttention);
      auto bwd_attn = select(p, both(in(layer, mb, Phase::kBackward), kind(OpKind::kAttention)));
      ASSERT_EQ(bwd_attn.size(), 1u);
      EXPECT_LT(rc[0]->id, bwd_attn[0]->id);
      EXPECT_GT(rc[0]->id, select(p, in(layer, mb, Phase::kForward)).back()->id);
      EXPECT_TRUE(std::count(bwd_attn[0]->deps.begin(), bwd_attn[0]->deps.end(), rc[0]->id));
    }
}

TEST(Lower, FullRecomputeReEmitsTheForwardOfTheFirstKLayers) {
  const Model m = tiny_gpt(8);
  Plan plan = make_plan(2, 2, 1, 2);
  plan.recompute = Recompute::kFull;
  plan.recompute_layers = 1;
  LoweredPlan lp = lowered(m, plan);
  for (const Program& p : lp.programs) {
    const int first = p.stage * 4;
    for (int layer = first; layer < first + 4; ++layer) {
      auto rc = select(p, in(layer, 0, Phase::kRecompute));
      if (layer != first) {
        EXPECT_TRUE(rc.empty());
        continue;
      }
      // The whole layer forward, TP communication included, before the layer's backward.
      auto fwd = select(p, in(layer, 0, Phase::kForward));
      ASSERT_EQ(rc.size(), fwd.size());
      for (size_t i = 0; i < rc.size(); ++i) EXPECT_EQ(rc[i]->kind, fwd[i]->kind);
      EXPECT_LT(rc.back()->id, select(p, in(layer, 0, Phase::kBackward)).front()->id);
      EXPECT_GT(count(p, both(in(layer, 0, Phase::kRecompute), kind(OpKind::kAllReduce))), 0);
    }
  }
  Plan all = plan;
  all.recompute_layers = -1;
  LoweredPlan la = lowered(m, all);
  for (int layer = 0; layer < 4; ++layer)
    EXPECT_FALSE(select(la.programs[0], in(layer, 1, Phase::kRecompute)).empty());
}

TEST(Lower, OffloadsRunOnTheCopyStream) {
  const Model m = tiny_gpt(4);
  {  // optimizer: state in host memory, gradients down, AdamW on the host, weights back up
    Plan plan = make_plan(1, 1, 2, 4);
    plan.zero = 1;
    plan.offload.optimizer = true;
    LoweredPlan lp = lowered(m, plan);
    const Program& p = lp.programs[0];
    for (const Buffer& b : p.buffers)
      if (b.cls == BufferClass::kOptimizer) {
        EXPECT_TRUE(b.host);
      }
    auto adam = select(p, kind(OpKind::kAdamW));
    ASSERT_FALSE(adam.empty());
    for (const Op* o : adam) {
      EXPECT_EQ(o->stream, 2);
      for (int b : o->reads) EXPECT_TRUE(p.buffers[b].host);
    }
    EXPECT_EQ(count(p,
                    [](const Op& o) {
                      return o.kind == OpKind::kOffload && o.tags.phase == Phase::kBackward;
                    }),
              m.layers + 2);  // every bucket's gradients
    EXPECT_EQ(count(p,
                    [](const Op& o) {
                      return o.kind == OpKind::kPrefetch && o.tags.phase == Phase::kOptimizer;
                    }),
              m.layers + 2);  // every bucket's new weights
  }
  {  // params: weights in host memory, prefetched per layer ahead of use
    Plan plan = make_plan(1, 1, 1, 2);
    plan.offload.params = true;
    LoweredPlan lp = lowered(m, plan);
    const Program& p = lp.programs[0];
    for (const Buffer& b : p.buffers)
      if (b.cls == BufferClass::kParam && b.persistent) {
        EXPECT_TRUE(b.host);
      }
    for (int layer = 0; layer < m.layers; ++layer)
      for (Phase ph : {Phase::kForward, Phase::kBackward}) {
        auto pf = select(p, both(in(layer, 1, ph), kind(OpKind::kPrefetch)));
        ASSERT_EQ(pf.size(), 1u);
        EXPECT_EQ(pf[0]->stream, 2);
        const Op* first = select(p, both(in(layer, 1, ph), kind(OpKind::kLinear))).front();
        EXPECT_LT(pf[0]->id, first->id);
        if (layer > 0 && ph == Phase::kForward) {  // issued while the previous layer computes
          EXPECT_LT(pf[0]->id,
                    select(p, both(in(layer - 1, 1, ph), kind(OpKind::kLinear))).front()->id);
        }
      }
  }
  {  // activations: offloaded after the layer's forward, prefetched before its backward
    Plan plan = make_plan(1, 1, 1, 2);
    plan.offload.activations = true;
    LoweredPlan lp = lowered(m, plan);
    const Program& p = lp.programs[0];
    for (int layer = 0; layer < m.layers; ++layer)
      for (int mb = 0; mb < 2; ++mb) {
        auto off = select(p, both(in(layer, mb, Phase::kForward), kind(OpKind::kOffload)));
        auto pre = select(p, both(in(layer, mb, Phase::kBackward), kind(OpKind::kPrefetch)));
        ASSERT_EQ(off.size(), 1u);
        ASSERT_EQ(pre.size(), 1u);
        EXPECT_EQ(off[0]->stream, 2);
        EXPECT_EQ(pre[0]->stream, 2);
        EXPECT_EQ(off[0]->bytes, pre[0]->bytes);
        EXPECT_EQ(off[0]->id, select(p, in(layer, mb, Phase::kForward)).back()->id);
        EXPECT_LT(pre[0]->id, select(p, both(in(layer, mb, Phase::kBackward),
                                             [](const Op& o) { return o.stream == 0; }))
                                  .front()
                                  ->id);
      }
  }
}

// ZeRO-Offload streams each bucket's fp32 gradients to the host as the backward produces them:
// beside the backward on the copy stream with DeepSpeed's overlap_comm (Plan::overlap_grad_reduce),
// in the backward's own stream without it (DeepSpeed v0.3.0 stage2.py reduce_ipg_grads: the
// current stream), each copy after its bucket's last gradient and before the next layer's
// backward kernels are issued.
TEST(Lower, StreamedGradientCopiesFollowTheReduceOverlap) {
  const Model m = tiny_gpt(4);
  for (bool overlap : {true, false}) {
    Plan plan = make_plan(1, 1, 2, 2);
    plan.zero = 2;
    plan.offload.optimizer = true;
    plan.overlap_grad_reduce = overlap;
    LoweredPlan lp = lowered(m, plan);
    const Program& p = lp.programs[0];
    auto copies = select(p, [](const Op& o) {
      return o.kind == OpKind::kOffload && o.tags.phase == Phase::kBackward;
    });
    ASSERT_EQ(copies.size(), static_cast<size_t>(m.layers + 2)) << overlap;
    double bytes = 0;
    for (const Op* o : copies) {
      EXPECT_EQ(o->stream, overlap ? 2 : 0) << o->name;
      bytes += o->bytes;
    }
    // fp32, this rank's half of every parameter (each bucket's shard rounded up an element).
    const double n = static_cast<double>(param_counts(m).total);
    EXPECT_NEAR(bytes, 4 * n / 2, 4.0 * copies.size()) << overlap;
    if (overlap) continue;
    // In the compute stream, layer l's copy comes after its backward's kernels and before
    // layer l-1's.
    for (int layer = 1; layer < m.layers; ++layer) {
      auto mine = select(p, both(in(layer, 0, Phase::kBackward), kind(OpKind::kOffload)));
      auto below = select(
          p, both(in(layer - 1, 0, Phase::kBackward), [](const Op& o) { return o.stream == 0; }));
      ASSERT_EQ(mine.size(), 1u);
      ASSERT_FALSE(below.empty());
      EXPECT_LT(mine[0]->id, below.front()->id) << layer;
    }
  }
}

TEST(Lower, OptimizerStepNormsClipsUpdatesAndCasts) {
  const Model m = tiny_gpt(4);
  Plan plan = make_plan(2, 2, 2, 8);
  plan.zero = 1;
  LoweredPlan lp = lowered(m, plan);
  for (const Program& p : lp.programs) {
    auto opt = select(p, [](const Op& o) { return o.tags.phase == Phase::kOptimizer; });
    ASSERT_FALSE(opt.empty());
    EXPECT_EQ(opt[0]->kind, OpKind::kGradNorm);
    std::set<Group> norm_groups;
    for (const Op* o : opt)
      if (o->kind == OpKind::kAllReduce) norm_groups.insert(o->group);
    EXPECT_EQ(norm_groups, (std::set<Group>{Group::kTp, Group::kPp, Group::kDpCp}));
    const int buckets = 2 + 1;  // two layers and the embedding or the head
    EXPECT_EQ(count(p, kind(OpKind::kAdamW)), buckets);
    EXPECT_EQ(count(p, kind(OpKind::kCast)), buckets);
    for (const Op* o : select(p, kind(OpKind::kAdamW))) EXPECT_EQ(o->stream, 0);
  }
}

TEST(Lower, GemmFlopsMatchTheModelsFlopsPerToken) {
  for (Model m : {tiny_gpt(4), model_preset("tiny"), model_preset("tiny-moe")}) {
    Plan plan = make_plan(2, 2, 1, 4);
    plan.cp = 1;
    LoweredPlan lp = lowered(m, plan);
    double gemm = 0, attn = 0, router = 0;
    for (const Program& p : lp.programs)
      for (const Op& o : p.ops) {
        if (o.tags.phase != Phase::kForward) continue;
        // The router is replicated over the TP ranks: count it once.
        if (o.kind == OpKind::kLinear && o.name.ends_with("router"))
          router += o.flops;
        else if (o.kind == OpKind::kLinear || o.kind == OpKind::kExpertLinear)
          gemm += o.flops;
        if (o.kind == OpKind::kAttention) attn += o.flops;
      }
    const double tokens = 4.0 * m.seq_len;  // per TP rank: 4 micro-batches
    const FlopsPerToken f = flops_per_token(m);
    const double core = 4.0 * m.seq_len * m.q_dim() * m.layers;  // full attention matrix
    EXPECT_NEAR((gemm * 2 + router) / tokens, f.forward - core, 1e-6 * f.forward) << m.name;
    // Flash attention executes the causal half.
    EXPECT_NEAR(attn * 2 / tokens, core * 0.5 * (1 + 1.0 / m.seq_len), 1e-6 * core) << m.name;
  }
}

// ---------------------------------------------------------------------------------------------
// Uneven pipeline stages, ZeRO-3 with pp and its reshard modes, HSDP, the gradient-reduce dtype.

// The model layers whose dense weights a stage's Program holds, and their chunks.
std::map<int, int> chunk_of_layer(const Program& p) {
  std::map<int, int> out;
  for (const ParamBucket& b : p.buckets)
    if (b.layer >= 0 && !b.expert) out[b.layer] = b.chunk;
  return out;
}
std::vector<int> layers_of(const Program& p) {
  std::vector<int> out;
  for (const auto& [layer, chunk] : chunk_of_layer(p)) out.push_back(layer);
  return out;
}
const ParamBucket* bucket_named(const Program& p, const std::string& name) {
  for (const ParamBucket& b : p.buckets)
    if (b.name == name) return &b;
  return nullptr;
}
Pred layer_is(int layer) {
  return [=](const Op& o) { return o.tags.layer == layer; };
}
Pred on(Group g) {
  return [=](const Op& o) { return is_communication(o.kind) && o.group == g; };
}
Pred phase_is(Phase ph) {
  return [=](const Op& o) { return o.tags.phase == ph; };
}

TEST(Lower, UnevenStagesHoldTheirOwnLayersEmbeddingFirstHeadLast) {
  const Model m = tiny_gpt(4);
  Plan plan = make_plan(1, 2, 1, 4);  // 4 micro-batches
  plan.stage_layers = {1, 3};
  plan.recompute = Recompute::kFull;
  plan.recompute_layers = 1;
  LoweredPlan lp = lowered(m, plan);
  const Program& first = lp.programs[0];
  const Program& last = lp.programs[1];
  EXPECT_EQ(layers_of(first), (std::vector<int>{0}));
  EXPECT_EQ(layers_of(last), (std::vector<int>{1, 2, 3}));
  EXPECT_NE(bucket_named(first, "emb"), nullptr);
  EXPECT_EQ(bucket_named(first, "head"), nullptr);
  EXPECT_EQ(bucket_named(last, "emb"), nullptr);
  EXPECT_NE(bucket_named(last, "head"), nullptr);
  const int M = plan.micro_batches();
  auto forward_gemms = both(kind(OpKind::kLinear), phase_is(Phase::kForward));
  for (const Program* p : {&first, &last})
    for (int layer : layers_of(*p))  // QKV, out, FC1, FC2 per micro-batch
      EXPECT_EQ(count(*p, both(forward_gemms, layer_is(layer))), 4 * M) << layer;
  double flops[2] = {0, 0};
  for (int s = 0; s < 2; ++s)
    for (const Op& o : lp.programs[s].ops)
      if (o.tags.layer >= 0 && o.tags.phase == Phase::kForward) flops[s] += o.flops;
  EXPECT_DOUBLE_EQ(flops[1], 3 * flops[0]);
  // Full recompute of the first recompute_layers layers of each stage: layer 0 and layer 1.
  EXPECT_GT(count(first, both(layer_is(0), phase_is(Phase::kRecompute))), 0);
  EXPECT_GT(count(last, both(layer_is(1), phase_is(Phase::kRecompute))), 0);
  for (int layer : {2, 3})
    EXPECT_EQ(count(last, both(layer_is(layer), phase_is(Phase::kRecompute))), 0) << layer;
  plan.recompute_layers = -1;  // all layers of each stage
  LoweredPlan all = lowered(m, plan);
  for (int layer : {1, 2, 3})
    EXPECT_GT(count(all.programs[1], both(layer_is(layer), phase_is(Phase::kRecompute))), 0);
  EXPECT_EQ(unfinished_ops(lp), 0);
  check_sends_match(lp);
}

TEST(Lower, UnevenInterleavedStagesFollowMegatronsLayerOrder) {
  // 12 layers on pp 4 x vpp 2 with Megatron's first/last stage counts 2: stages hold 2, 4, 4, 2
  // layers, each split over its two chunks; virtual stage (chunk c, stage s) follows all
  // stages' chunk c - 1.
  const Model m = tiny_gpt(12);
  Plan plan = make_plan(1, 4, 1, 8);
  plan.schedule = Schedule::kInterleaved;
  plan.vpp = 2;
  plan.first_stage_layers = 2;
  plan.last_stage_layers = 2;
  LoweredPlan lp = lowered(m, plan);
  const std::map<int, int> want[4] = {{{0, 0}, {6, 1}},
                                      {{1, 0}, {2, 0}, {7, 1}, {8, 1}},
                                      {{3, 0}, {4, 0}, {9, 1}, {10, 1}},
                                      {{5, 0}, {11, 1}}};
  for (int s = 0; s < 4; ++s) {
    SCOPED_TRACE("stage " + std::to_string(s));
    const Program& p = lp.programs[s];
    EXPECT_EQ(chunk_of_layer(p), want[s]);
    for (const Op& o : p.ops)
      if (o.tags.layer >= 0 && o.tags.phase == Phase::kForward) {
        EXPECT_EQ(o.tags.chunk, want[s].at(o.tags.layer)) << o.name;
      }
  }
  ASSERT_NE(bucket_named(lp.programs[0], "emb"), nullptr);
  EXPECT_EQ(bucket_named(lp.programs[0], "emb")->chunk, 0);
  ASSERT_NE(bucket_named(lp.programs[3], "head"), nullptr);
  EXPECT_EQ(bucket_named(lp.programs[3], "head")->chunk, 1);
  EXPECT_EQ(unfinished_ops(lp), 0);
  check_sends_match(lp);
}

TEST(Lower, AccountedEmbeddingAndLossTakeALayerSlotOfTheFirstAndLastVirtualStage) {
  // Megatron's --account-for-embedding/loss-in-pipeline-split: 14 layers + the embedding + the
  // loss = 16 slots on pp 4 x vpp 2, two per virtual stage; the first virtual stage holds the
  // embedding and one layer, the last one layer and the head. Each stage's Program holds the
  // layers Megatron-Core builds there, in its chunks (tests/core/megatron_split.h).
  const Model m = tiny_gpt(14);
  Plan plan = make_plan(1, 4, 1, 8);
  plan.schedule = Schedule::kInterleaved;
  plan.vpp = 2;
  plan.account_for_embedding = true;
  plan.account_for_loss = true;
  LoweredPlan lp = lowered(m, plan);
  const megatron_oracle::AccountedSplit megatron{14, 4, 2, true, true};
  for (int s = 0; s < 4; ++s) {
    SCOPED_TRACE("stage " + std::to_string(s));
    std::map<int, int> want;
    for (int c = 0; c < 2; ++c)
      for (int l = 0; l < megatron.to_build(s, c); ++l) want[megatron.offset(s, c) + l] = c;
    EXPECT_EQ(chunk_of_layer(lp.programs[s]), want);
  }
  EXPECT_EQ(chunk_of_layer(lp.programs[0]), (std::map<int, int>{{0, 0}, {7, 1}, {8, 1}}));
  EXPECT_EQ(chunk_of_layer(lp.programs[3]), (std::map<int, int>{{5, 0}, {6, 0}, {13, 1}}));
  ASSERT_NE(bucket_named(lp.programs[0], "emb"), nullptr);
  EXPECT_EQ(bucket_named(lp.programs[0], "emb")->chunk, 0);
  ASSERT_NE(bucket_named(lp.programs[3], "head"), nullptr);
  EXPECT_EQ(bucket_named(lp.programs[3], "head")->chunk, 1);
  EXPECT_EQ(unfinished_ops(lp), 0);
  check_sends_match(lp);
}

TEST(Lower, PerVirtualStageLayerListsGiveChunksOfAStageTheirOwnCounts) {
  // Megatron's pipeline layout / torch pipelining stages: pp 2 x vpp 2 virtual stages of 2, 1,
  // 1, 2 layers (virtual stage chunk x pp + stage); full recompute of each stage's first two.
  const Model m = tiny_gpt(6);
  Plan plan = make_plan(1, 2, 1, 4);
  plan.schedule = Schedule::kInterleaved;
  plan.vpp = 2;
  plan.stage_layers = {2, 1, 1, 2};
  plan.recompute = Recompute::kFull;
  plan.recompute_layers = 2;
  LoweredPlan lp = lowered(m, plan);
  EXPECT_EQ(chunk_of_layer(lp.programs[0]), (std::map<int, int>{{0, 0}, {1, 0}, {3, 1}}));
  EXPECT_EQ(chunk_of_layer(lp.programs[1]), (std::map<int, int>{{2, 0}, {4, 1}, {5, 1}}));
  const std::set<int> recomputed[2] = {{0, 1}, {2, 4}};
  for (int s = 0; s < 2; ++s) {
    std::set<int> got;
    for (const Op& o : lp.programs[s].ops)
      if (o.tags.phase == Phase::kRecompute) got.insert(o.tags.layer);
    EXPECT_EQ(got, recomputed[s]) << "stage " << s;
  }
  EXPECT_EQ(unfinished_ops(lp), 0);
  check_sends_match(lp);
}

// ---------------------------------------------------------------------------------------------
// Multi-head latent attention, sliding windows, shared experts, an expert grid of its own.

const Op* only(const Program& p, const Pred& f) {
  auto v = select(p, f);
  EXPECT_EQ(v.size(), 1u);
  return v.empty() ? nullptr : v[0];
}
Pred named(const std::string& name, Phase ph = Phase::kForward, int mb = 0) {
  return
      [=](const Op& o) { return o.name == name && o.tags.phase == ph && o.tags.micro_batch == mb; };
}
std::map<std::string, std::vector<int64_t>> specs_of(const ParamBucket& b) {
  std::map<std::string, std::vector<int64_t>> out;
  for (const ParamSpec& s : b.specs) out[s.name] = s.shape;
  return out;
}

TEST(Lower, LatentAttentionEmitsTheLayerShapesProjectionsAndKeepsThePreNormLatents) {
  for (bool q_lora : {true, false}) {
    SCOPED_TRACE(q_lora ? "query compression" : "plain query projection");
    const Model m = tiny_mla(q_lora);
    Plan plan = make_plan(2, 1, 1, 1);
    plan.sequence_parallel = true;
    LoweredPlan lp = lowered(m, plan);
    const Program& p = lp.programs[0];
    const int64_t T = m.seq_len, Tn = T / 2, n = m.heads / 2;
    const MlaSpec& a = m.mla;
    // The weights: layer_shapes' linears split as their Split says, then the latent norms.
    const ParamBucket* b = bucket_named(p, "L0");
    ASSERT_NE(b, nullptr);
    std::map<std::string, std::vector<int64_t>> want = {
        {"L0.ln1", {m.hidden}},
        {"L0.kv_down", {m.hidden, a.kv_lora_rank + a.qk_rope_head_dim}},
        {"L0.kv_up", {a.kv_lora_rank, n * (a.qk_nope_head_dim + a.v_head_dim)}},
        {"L0.kv_norm", {a.kv_lora_rank}},
        {"L0.out", {n * a.v_head_dim, m.hidden}},
        {"L0.ln2", {m.hidden}},
        {"L0.fc1", {m.hidden, 2 * m.ffn / 2}},
        {"L0.fc2", {m.ffn / 2, m.hidden}}};
    if (q_lora) {
      want["L0.q_down"] = {m.hidden, a.q_lora_rank};
      want["L0.q_norm"] = {a.q_lora_rank};
      want["L0.q_up"] = {a.q_lora_rank, n * a.qk_head_dim()};
    } else {
      want["L0.q"] = {m.hidden, n * a.qk_head_dim()};
    }
    EXPECT_EQ(specs_of(*b), want);
    // The forward GEMMs: replicated ones on the sequence shard, column/row-parallel ones on
    // every row; their FLOPs summed over the TP ranks are the linears' FLOPs per token.
    double flops = 0;
    for (const LinearShape& s : attention_linears(m)) {
      const Op* g = only(p, named("L0." + std::string(s.name)));
      ASSERT_NE(g, nullptr) << s.name;
      EXPECT_EQ(g->m, s.split == Split::kReplicated ? Tn : T) << s.name;
      EXPECT_EQ(g->k, s.split == Split::kRow ? s.in / 2 : s.in) << s.name;
      EXPECT_EQ(g->n, s.split == Split::kColumn ? s.out / 2 : s.out) << s.name;
      flops += 2 * g->flops;
    }
    double want_flops = 0;
    for (const LinearShape& s : attention_linears(m)) want_flops += T * s.flops_per_token();
    EXPECT_DOUBLE_EQ(flops, want_flops);
    // Q | K | V packed from the up-projections and the rotary key; the attention core has
    // nope + rope query/key dims and the value dims of its own.
    const Op* pack = only(p, named("L0.qkv.pack"));
    ASSERT_NE(pack, nullptr);
    EXPECT_EQ(pack->reads.size(), 3u);
    const Buffer& qkv = p.buffers[pack->writes.at(0)];
    EXPECT_EQ(qkv.shape, (std::vector<int64_t>{T, n * (2 * a.qk_head_dim() + a.v_head_dim)}));
    const Op* attn = only(p, both(named("L0.attn"), kind(OpKind::kAttention)));
    ASSERT_NE(attn, nullptr);
    EXPECT_EQ(attn->attn.head_dim, a.qk_head_dim());
    EXPECT_EQ(attn->attn.v_head_dim, a.v_head_dim);
    EXPECT_EQ(attn->attn.heads, n);
    EXPECT_EQ(attn->attn.kv_heads, n);
    EXPECT_EQ(attn->reads.at(0), pack->writes.at(0));
    // SP: the normed latents (or the norm1 output) and the rotary key gathered over tp, once
    // each before the up-projections.
    auto f0 = in(0, 0, Phase::kForward);
    EXPECT_EQ(count(p, both(f0, on(Group::kTp))), 3 /* q, kv, rope */ + 1 /* out */ + 2 /* MLP */);
    // The saved pre-norm latents: q_down's and kv_down's outputs live until the backward, which
    // recomputes the latent norms from them.
    auto rc = select(p, both(in(0, 0, Phase::kRecompute), kind(OpKind::kNorm)));
    EXPECT_EQ(rc.size(), q_lora ? 2u : 1u);
    const Op* kv_norm = only(p, both(named("L0.kv_norm", Phase::kBackward), kind(OpKind::kNorm)));
    ASSERT_NE(kv_norm, nullptr);
    EXPECT_EQ(kv_norm->reads.size(), 4u);  // latent, its gradient, the rotary key's, weight
    EXPECT_EQ(p.buffers[kv_norm->writes[0]].shape,
              (std::vector<int64_t>{Tn, a.kv_lora_rank + a.qk_rope_head_dim}));
    // kv_down's data gradient adds to the query side's.
    const Op* kvd = only(p, named("L0.kv_down.dx", Phase::kBackward));
    ASSERT_NE(kvd, nullptr);
    EXPECT_EQ(kvd->reads.size(), 3u);
    EXPECT_EQ(kvd->reads[2], kvd->writes[0]);
    // Under SP the replicated weights' gradients are partial sums over tp.
    const Op* sp = only(p, [](const Op& o) { return o.name == "sp.g.ar"; });
    ASSERT_NE(sp, nullptr);
    std::set<std::string> summed;
    for (int id : sp->reads) summed.insert(p.buffers[id].name);
    EXPECT_TRUE(summed.count("L0.kv_down.g"));
    EXPECT_TRUE(summed.count("L0.kv_norm.g"));
    EXPECT_EQ(summed.count("L0.q_down.g"), q_lora ? 1u : 0u);
    EXPECT_FALSE(summed.count("L0.kv_up.g"));
  }
}

TEST(Lower, SlidingWindowLayersMaskTheirKeysInTheRingStepsTheyReach) {
  const Model m = tiny_windowed();  // layer 0 windowed (16 of 64 keys), layer 1 full
  for (int cp : {1, 2, 4}) {
    SCOPED_TRACE("cp " + std::to_string(cp));
    Plan plan = make_plan(1, 1, 1, 1);
    plan.cp = cp;
    LoweredPlan lp = lowered(m, plan);
    const Program& p = lp.programs[0];
    // The window reaches this rank's chunk and ceil(15 / chunk) before it: 2 chunks of 16 under
    // cp 4 (of 32 under cp 2).
    const int windowed_steps = cp == 4 ? 2 : cp;
    for (int layer = 0; layer < 2; ++layer) {
      for (Phase ph : {Phase::kForward, Phase::kBackward}) {
        auto attn = select(p, both(in(layer, 0, ph), kind(OpKind::kAttention)));
        ASSERT_EQ(attn.size(), static_cast<size_t>(layer == 0 ? windowed_steps : cp));
        for (const Op* o : attn) {
          EXPECT_EQ(o->attn.window, layer == 0 ? m.sliding_window : 0);
          EXPECT_EQ(o->attn.seq_q, m.seq_len / cp);
          if (ph == Phase::kForward) {
            EXPECT_DOUBLE_EQ(o->flops, attention_flops(o->attn));
          }
        }
      }
      if (cp == 1) continue;
      // The K/V gradients go home after the last step: to the next rank after cp steps, cp -
      // steps + 1 ranks on after fewer.
      auto dkv = select(p, both(in(layer, 0, Phase::kBackward), [](const Op& o) {
                          return o.kind == OpKind::kSend && o.name.ends_with("dkv.send");
                        }));
      const int steps = layer == 0 ? windowed_steps : cp;
      ASSERT_EQ(dkv.size(), static_cast<size_t>(steps));
      EXPECT_EQ(dkv.back()->peer_stage, steps < cp ? cp - steps + 1 : -1);
      for (size_t i = 0; i + 1 < dkv.size(); ++i) EXPECT_EQ(dkv[i]->peer_stage, -1);
    }
    const Op* w = select(p, both(in(0, 0, Phase::kForward), kind(OpKind::kAttention)))[0];
    const Op* f = select(p, both(in(1, 0, Phase::kForward), kind(OpKind::kAttention)))[0];
    if (cp < 4) {
      EXPECT_LT(w->flops, f->flops);
    }
  }
}

TEST(Lower, SharedExpertsRunBesideTheRoutedOnesAfterTheDenseLayers) {
  const Model m = tiny_shared();  // layer 0 dense; 1, 2 MoE with 2 shared experts of 32
  Plan plan = make_plan(2, 1, 2, 2);
  plan.ep = 2;
  LoweredPlan lp = lowered(m, plan);
  const Program& p = lp.programs[0];
  const int64_t sw = m.moe.shared_width();
  EXPECT_EQ(specs_of(*bucket_named(p, "L0")).count("L0.fc1"), 1u);
  EXPECT_EQ(bucket_named(p, "L0.experts"), nullptr);
  for (int layer : {1, 2}) {
    const std::string L = "L" + std::to_string(layer);
    auto specs = specs_of(*bucket_named(p, L));
    EXPECT_EQ(specs[L + ".router"], (std::vector<int64_t>{m.hidden, m.moe.experts}));
    EXPECT_EQ(specs[L + ".shared_fc1"], (std::vector<int64_t>{m.hidden, 2 * sw / 2}));
    EXPECT_EQ(specs[L + ".shared_fc2"], (std::vector<int64_t>{sw / 2, m.hidden}));
    EXPECT_EQ(specs.count(L + ".fc1"), 0u);
    ASSERT_NE(bucket_named(p, L + ".experts"), nullptr);
    // The shared MLP with tp's g after its row-parallel GEMM, added to the routed output.
    const Op* fc2 = only(p, named(L + ".shared_fc2"));
    ASSERT_NE(fc2, nullptr);
    EXPECT_EQ(fc2->k, sw / 2);
    const Op* ar = only(p, named(L + ".shared_fc2.tp"));
    ASSERT_NE(ar, nullptr);
    EXPECT_EQ(ar->kind, OpKind::kAllReduce);
    const Op* add = only(p, named(L + ".moe.add"));
    ASSERT_NE(add, nullptr);
    const Op* combine = only(p, both(named(L + ".combine"), kind(OpKind::kCombine)));
    ASSERT_NE(combine, nullptr);
    EXPECT_EQ(add->reads, (std::vector<int>{combine->writes[0], ar->writes[0]}));
    // Backward: the two input gradients added.
    EXPECT_NE(only(p, named(L + ".moe.add", Phase::kBackward)), nullptr);
    EXPECT_NE(only(p, named(L + ".shared_fc1.dw", Phase::kBackward)), nullptr);
  }
  // The MLP-block FLOPs of an MoE layer per token: router, top-k routed experts and the shared
  // experts (flops_per_token's count).
  double gemm = 0;
  for (const Op& o : p.ops)
    if (o.tags.layer == 1 && o.tags.phase == Phase::kForward && o.tags.micro_batch == 0 &&
        (o.kind == OpKind::kExpertLinear || o.name.find("fc") != std::string::npos ||
         o.name.ends_with("router")))
      gemm += o.flops * (o.name.ends_with("router") ? 1 : 2);
  const double tokens = m.seq_len;
  double want = 0;
  for (const LinearShape& s : mlp_linears(m, 1)) want += tokens * s.flops_per_token();
  for (const LinearShape& s : expert_linears(m)) want += tokens * m.moe.top_k * s.flops_per_token();
  EXPECT_DOUBLE_EQ(gemm, want);
}

TEST(Lower, AnExpertGridOfItsOwnRoutesEachRanksTokensOverItsEpGroup) {
  const Model m = model_preset("tiny-moe");
  for (bool sp : {true, false}) {
    SCOPED_TRACE(sp ? "sp" : "no sp");
    Plan plan = make_plan(2, 1, 4, 4);  // tp 2, etp 1, ep 4: edp 2
    plan.ep = 4;
    plan.etp = 1;
    plan.sequence_parallel = sp;
    LoweredPlan lp = lowered(m, plan);
    const Program& p = lp.programs[0];
    const int64_t T = m.seq_len, Tm = T / 2, K = m.moe.top_k;
    // Each TP rank routes half of the TP group's tokens.
    const Op* router = only(p, both(named("L1.router"), kind(OpKind::kLinear)));
    ASSERT_NE(router, nullptr);
    EXPECT_EQ(router->m, Tm);
    auto a2a = select(p, both(in(1, 0, Phase::kForward), kind(OpKind::kAllToAll)));
    ASSERT_EQ(a2a.size(), 2u);
    for (const Op* o : a2a) {
      EXPECT_EQ(o->group, Group::kEp);
      EXPECT_EQ(o->bytes, 2.0 * Tm * K * m.hidden);
    }
    // Whole experts (etp 1): no tensor-parallel collective between the all-to-alls.
    for (const Op* o : select(p, in(1, 0, Phase::kForward))) {
      if (o->id > a2a[0]->id && o->id < a2a[1]->id) {
        EXPECT_FALSE(is_communication(o->kind)) << o->name;
      }
    }
    const ParamBucket* e = bucket_named(p, "L1.experts");
    ASSERT_NE(e, nullptr);
    EXPECT_EQ(e->group, Group::kExpertDp);
    EXPECT_EQ(e->ways, 2);
    EXPECT_EQ(specs_of(*e)["L1.efc1"],
              (std::vector<int64_t>{1, m.hidden, 2 * m.moe.expert_ffn}));  // 4 experts / ep 4
    // Without SP each rank routes a slice of the replicated rows: the routed output and the
    // dispatch gradient are gathered back over tp, and the router's gradient summed over tp.
    EXPECT_EQ(count(p, named("L1.moe.ag")), sp ? 0 : 1);
    EXPECT_EQ(count(p, named("L1.ln2.dy.ag", Phase::kBackward)), sp ? 0 : 1);
    const Op* spg = only(p, [](const Op& o) { return o.name == "sp.g.ar"; });
    ASSERT_NE(spg, nullptr);
    std::set<std::string> summed;
    for (int id : spg->reads) summed.insert(p.buffers[id].name);
    EXPECT_TRUE(summed.count("L1.router.g"));
    EXPECT_EQ(summed.count("L1.ln1.g"), sp ? 1u : 0u);
    // The gradient norm is summed over every rank of the stage.
    EXPECT_EQ(count(p, both(phase_is(Phase::kOptimizer), on(Group::kDpCp))), 1);
  }
  // tp 1, etp 2: the routed rows of two data-parallel ranks gathered over the expert TP group.
  Plan plan = make_plan(1, 1, 4, 4);
  plan.etp = 2;
  LoweredPlan lp = lowered(m, plan);
  const Program& p = lp.programs[0];
  const Op* ag = only(p, named("L1.disp.ag"));
  ASSERT_NE(ag, nullptr);
  EXPECT_EQ(ag->group, Group::kExpertTp);
  const Op* rs = only(p, named("L1.efc2.rs"));
  ASSERT_NE(rs, nullptr);
  EXPECT_EQ(rs->group, Group::kExpertTp);
  EXPECT_EQ(specs_of(*bucket_named(p, "L1.experts"))["L1.efc2"],
            (std::vector<int64_t>{4, m.moe.expert_ffn / 2, m.hidden}));
  EXPECT_EQ(bucket_named(p, "L1.experts")->ways, 2);  // edp = 4 / (2 x 1)
}

// ZeRO-3 over dp 2 with pp 2 (two layers per stage, four micro-batches): how often each layer's
// weights are gathered and its gradients reduce-scattered, per reshard mode.
TEST(Lower, Zero3ReshardModesGatherAndReduceScatterPerMicroBatchOrPerStep) {
  Model m = model_preset("tiny");
  m.layers = 4;
  for (Schedule sched : {Schedule::k1F1B, Schedule::kInterleaved})
    for (bool full : {false, true})
      for (Reshard r : {Reshard::kAfterForward, Reshard::kAfterBackward, Reshard::kAfterStep}) {
        Plan plan = make_plan(1, 2, 2, 8);
        plan.zero = 3;
        plan.reshard = r;
        plan.schedule = sched;
        plan.vpp = sched == Schedule::kInterleaved ? 2 : 1;
        if (full) plan.recompute = Recompute::kFull;
        SCOPED_TRACE(plan_to_json(plan).dump());
        const int M = plan.micro_batches();
        LoweredPlan lp = lowered(m, plan);
        EXPECT_EQ(unfinished_ops(lp), 0);
        // Resharded after the forward: gathered for the forward and once for the backward (with
        // its full recompute, which the backward's gather serves).
        const int uses = r == Reshard::kAfterForward ? 2 * M : r == Reshard::kAfterBackward ? M : 1;
        const int scatters = r == Reshard::kAfterStep ? 1 : M;
        for (const Program& p : lp.programs)
          for (int layer : layers_of(p)) {
            const ParamBucket* b = bucket_named(p, "L" + std::to_string(layer));
            ASSERT_NE(b, nullptr);
            EXPECT_EQ(b->group, Group::kDpCp);
            EXPECT_EQ(b->zero, 3);
            auto gathers = select(p, both(both(kind(OpKind::kAllGather), on(Group::kDpCp)),
                                          both(layer_is(layer), [](const Op& o) {
                                            return o.tags.phase != Phase::kOptimizer;
                                          })));
            auto rs = select(
                p, both(kind(OpKind::kReduceScatter), both(on(Group::kDpCp), layer_is(layer))));
            ASSERT_EQ(static_cast<int>(gathers.size()), uses) << layer;
            ASSERT_EQ(static_cast<int>(rs.size()), scatters) << layer;
            for (const Op* o : gathers) EXPECT_EQ(o->bytes, 2.0 * b->shard * b->ways);  // bf16
            for (const Op* o : rs) EXPECT_EQ(o->bytes, 4.0 * b->shard * b->ways);       // fp32
            std::set<int> mbs;
            for (const Op* o : gathers) {
              if (r != Reshard::kAfterForward) {
                EXPECT_EQ(o->tags.phase, Phase::kForward);
              }
              mbs.insert(o->tags.micro_batch);
            }
            if (r == Reshard::kAfterBackward) {
              EXPECT_EQ(static_cast<int>(mbs.size()), M);
            }
            if (r != Reshard::kAfterStep) continue;
            // The gradients accumulate unsharded over the step (one fp32 block, not persistent),
            // reduce-scattered into the shard once, after the layer's last backward.
            const Op& scatter = *rs[0];
            EXPECT_EQ(scatter.writes, std::vector<int>{b->grad_shard});
            int last_write = -1;
            for (int g : scatter.reads) {
              const Buffer& buf = p.buffers[g];
              EXPECT_EQ(buf.cls, BufferClass::kGrad);
              EXPECT_FALSE(buf.persistent);
              EXPECT_EQ(buf.name.find(".m"), std::string::npos) << buf.name;
              for (const Op& o : p.ops)
                if (std::count(o.writes.begin(), o.writes.end(), g) && o.id != scatter.id)
                  last_write = std::max(last_write, o.id);
            }
            ASSERT_GE(last_write, 0);
            EXPECT_EQ(p.ops[last_write].tags.phase, Phase::kBackward);
            EXPECT_EQ(p.ops[last_write].tags.micro_batch, M - 1);
            EXPECT_GT(scatter.id, last_write);
          }
      }
}

// FSDP2 under a pipeline (ZeRO-3 resharded after the step, pp 2; core/fsdp_pipeline_reduce.h):
// a chunk's gradients are reduce-scattered after its last backward, and the compute stream and
// the next exchange's point-to-point ops wait for them. Resharded after the backward, the
// reduce-scatters of every micro-batch run beside the backward: no compute op waits for one.
TEST(Lower, PipelinedFsdpReductionsAfterTheStepBlockTheComputeStream) {
  Model m = model_preset("tiny");
  m.layers = 4;
  for (Schedule sched : {Schedule::k1F1B, Schedule::kInterleaved})
    for (Reshard r : {Reshard::kAfterBackward, Reshard::kAfterStep}) {
      Plan plan = make_plan(1, 2, 2, 8);
      plan.zero = 3;
      plan.reshard = r;
      plan.schedule = sched;
      plan.vpp = sched == Schedule::kInterleaved ? 2 : 1;
      SCOPED_TRACE(plan_to_json(plan).dump());
      LoweredPlan lp = lowered(m, plan);
      EXPECT_EQ(unfinished_ops(lp), 0);
      int checked = 0;  // compute ops and exchanges after a reduce-scatter, over the stages
      for (const Program& p : lp.programs) {
        int scatters = 0, candidates = 0, waited = 0, p2p_after = 0, p2p_waited = 0;
        for (const Op& o : p.ops) {
          if (o.kind != OpKind::kReduceScatter || o.group != Group::kDpCp) continue;
          ++scatters;
          // The chunk's last backward compute is done before it.
          for (const Op& later : p.ops)
            if (later.id > o.id && later.stream == 0 && later.tags.phase == Phase::kBackward &&
                later.tags.chunk == o.tags.chunk && r == Reshard::kAfterStep) {
              ADD_FAILURE() << later.name << " after " << o.name;
            }
          const Op* next_compute = nullptr;
          for (const Op& later : p.ops)
            if (later.id > o.id && later.stream == 0) {
              next_compute = &later;
              break;
            }
          // (The optimizer reads the reduced shard whichever way.)
          if (next_compute != nullptr && next_compute->tags.phase != Phase::kOptimizer) {
            ++candidates;
            if (std::count(next_compute->deps.begin(), next_compute->deps.end(), o.id) > 0)
              ++waited;
          }
          const Op* next_p2p = nullptr;
          for (const Op& later : p.ops)
            if (later.id > o.id && (later.kind == OpKind::kSend || later.kind == OpKind::kRecv)) {
              next_p2p = &later;
              break;
            }
          if (next_p2p != nullptr) {
            ++p2p_after;
            bool after = false;
            for (int d : next_p2p->deps) after = after || d >= o.id;
            p2p_waited += after ? 1 : 0;
          }
        }
        ASSERT_GT(scatters, 0);
        checked += candidates + p2p_after;
        if (r == Reshard::kAfterStep) {
          EXPECT_EQ(waited, candidates);
          EXPECT_EQ(p2p_waited, p2p_after);
        } else {
          EXPECT_EQ(waited, 0);
        }
      }
      EXPECT_GT(checked, 0);
    }
}

// FSDP2's foreach_reduce makes the reduce-scatter stream wait for the compute stream
// (reduce_scatter_stream.wait_stream(current_stream)): a chunk's held-back reductions, issued
// after its last backward, start after all of it, not as soon as their own layer's gradients are
// written (two layers a chunk: the later layer's gradients are complete before the earlier
// layer's backward runs).
TEST(Lower, PipelinedFsdpReductionsWaitForTheChunksWholeBackward) {
  Model m = model_preset("tiny");
  m.layers = 8;
  for (Schedule sched : {Schedule::k1F1B, Schedule::kInterleaved}) {
    Plan plan = make_plan(1, 2, 2, 8);
    plan.zero = 3;
    plan.reshard = Reshard::kAfterStep;
    plan.schedule = sched;
    plan.vpp = sched == Schedule::kInterleaved ? 2 : 1;
    SCOPED_TRACE(plan_to_json(plan).dump());
    LoweredPlan lp = lowered(m, plan);
    EXPECT_EQ(unfinished_ops(lp), 0);
    int checked = 0;
    for (const Program& p : lp.programs) {
      int last_compute = -1;
      for (const Op& o : p.ops) {
        if (o.stream == 0 && o.kind != OpKind::kReduceScatter) last_compute = o.id;
        if (o.kind != OpKind::kReduceScatter || o.group != Group::kDpCp) continue;
        ASSERT_GE(last_compute, 0);
        ASSERT_FALSE(o.deps.empty()) << o.name;
        EXPECT_GE(*std::max_element(o.deps.begin(), o.deps.end()), last_compute)
            << o.name << " starts before " << p.ops[last_compute].name;
        ++checked;
      }
    }
    EXPECT_GT(checked, 2 * 4);
  }
}

TEST(Lower, Zero3ReshardedAfterBackwardHoldsTwoMicroBatchesWeightsUnder1F1B) {
  // Stage 0 of a 1F1B pp 2 pipeline runs F0 F1 B0 ...: resharded after the backward, the weights
  // gathered for micro-batch 0 live until its backward, past the gather for micro-batch 1.
  Model m = model_preset("tiny");
  m.layers = 4;
  Plan plan = make_plan(1, 2, 2, 8);
  plan.zero = 3;
  plan.reshard = Reshard::kAfterBackward;
  LoweredPlan lp = lowered(m, plan);
  const Program& p = lp.programs[0];
  auto gathers = select(p, both(kind(OpKind::kAllGather), layer_is(0)));
  ASSERT_GE(gathers.size(), 2u);
  const Op& g0 = *gathers[0];
  const Op& g1 = *gathers[1];
  EXPECT_EQ(g0.tags.micro_batch, 0);
  EXPECT_EQ(g1.tags.micro_batch, 1);
  const int w0 = g0.writes[0];
  const Op* last_use = nullptr;
  for (const Op& o : p.ops)
    if (std::count(o.reads.begin(), o.reads.end(), w0)) last_use = &o;
  ASSERT_NE(last_use, nullptr);
  EXPECT_EQ(last_use->tags.phase, Phase::kBackward);
  EXPECT_EQ(last_use->tags.micro_batch, 0);
  EXPECT_LT(g1.id, last_use->id);
  EXPECT_NE(g1.writes[0], w0);
}

TEST(Lower, HsdpShardsInsideGroupsOfShardDegreeAndAllReducesAcrossReplicas) {
  Model m = model_preset("tiny");
  for (int zero : {1, 2, 3}) {
    Plan plan = make_plan(1, 1, 4, 8);  // dp 4 in 2 shard groups of 2; 2 micro-batches
    plan.shard_degree = 2;
    plan.zero = zero;
    SCOPED_TRACE("zero " + std::to_string(zero));
    LoweredPlan lp = lowered(m, plan);
    const Program& p = lp.programs[0];
    EXPECT_EQ(unfinished_ops(lp), 0);
    const int M = plan.micro_batches();
    for (const ParamBucket& b : p.buckets) {
      SCOPED_TRACE(b.name);
      EXPECT_EQ(b.group, Group::kDpShard);
      EXPECT_EQ(b.ways, 2);
      EXPECT_EQ(b.shard, (b.elements + 1) / 2);
      auto mine = [&](const Op& o) {
        return o.tags.layer == b.layer && (b.layer >= 0 || o.name.starts_with(b.name + "."));
      };
      auto rs = select(p, both(mine, kind(OpKind::kReduceScatter)));
      auto ar = select(p, both(mine, kind(OpKind::kAllReduce)));
      auto ag = select(p, both(mine, kind(OpKind::kAllGather)));
      ASSERT_EQ(static_cast<int>(rs.size()), zero == 1 ? 1 : M);
      ASSERT_EQ(ar.size(), 1u);  // once per step, after the last reduce-scatter
      for (const Op* o : rs) {
        EXPECT_EQ(o->group, Group::kDpShard);
        EXPECT_EQ(o->bytes, 4.0 * b.shard * 2);
      }
      EXPECT_EQ(ar[0]->group, Group::kDpReplicate);
      EXPECT_EQ(ar[0]->bytes, 4.0 * b.shard);
      EXPECT_GT(ar[0]->id, rs.back()->id);
      EXPECT_EQ(ar[0]->writes, rs.back()->writes);  // the reduce-scattered shard
      EXPECT_EQ(ar[0]->tags.micro_batch, M - 1);
      // Parameters are gathered inside the shard group: after the update (ZeRO 1/2), per use
      // (ZeRO 3).
      ASSERT_FALSE(ag.empty());
      for (const Op* o : ag) {
        EXPECT_EQ(o->group, Group::kDpShard);
        EXPECT_EQ(o->bytes, 2.0 * b.shard * 2);
      }
    }
    // The gradient norm still sums over the whole data-parallel group.
    auto norm = select(p, [](const Op& o) { return o.name == "norm.ar"; });
    ASSERT_EQ(norm.size(), 1u);
    EXPECT_EQ(norm[0]->group, Group::kDpCp);
  }
}

TEST(Lower, HsdpExpertBucketsShardInsideTheExpertGroupsPart) {
  const Model m = model_preset("tiny-moe");
  {  // dp 8, ep 2, shard degree 4: experts shard over 4 / 2 = 2 of their 4 data-parallel ranks
    Plan plan = make_plan(1, 1, 8, 16);
    plan.ep = 2;
    plan.shard_degree = 4;
    plan.zero = 2;
    LoweredPlan lp = lowered(m, plan);
    const Program& p = lp.programs[0];
    const ParamBucket* d = bucket_named(p, "L0");
    const ParamBucket* e = bucket_named(p, "L0.experts");
    ASSERT_TRUE(d && e);
    EXPECT_EQ(d->group, Group::kDpShard);
    EXPECT_EQ(d->ways, 4);
    EXPECT_EQ(e->group, Group::kExpertShard);
    EXPECT_EQ(e->ways, 2);
    auto rep = select(p, both(layer_is(0), on(Group::kExpertReplicate)));
    ASSERT_EQ(rep.size(), 1u);
    EXPECT_EQ(rep[0]->bytes, 4.0 * e->shard);
    EXPECT_EQ(count(p, both(layer_is(0), on(Group::kDpReplicate))), 1);
  }
  {  // shard degree 2 = ep: one rank per expert shard group, so experts stay replicated (DDP)
    Plan plan = make_plan(1, 1, 4, 8);
    plan.ep = 2;
    plan.shard_degree = 2;
    plan.zero = 1;
    LoweredPlan lp = lowered(m, plan);
    const ParamBucket* e = bucket_named(lp.programs[0], "L0.experts");
    ASSERT_NE(e, nullptr);
    EXPECT_EQ(e->group, Group::kExpertDp);
    EXPECT_EQ(e->zero, 0);
    auto ar = select(lp.programs[0], both(layer_is(0), on(Group::kExpertDp)));
    ASSERT_EQ(ar.size(), 1u);
    EXPECT_EQ(ar[0]->kind, OpKind::kAllReduce);
    EXPECT_EQ(ar[0]->bytes, 4.0 * e->elements);
  }
}

TEST(Lower, GradReduceDtypeSetsTheBytesOfDataParallelGradientReductions) {
  Model m = model_preset("tiny");
  for (int zero : {0, 1, 3}) {
    Plan plan = make_plan(1, 1, 4, 8);
    plan.zero = zero;
    if (zero > 0) plan.shard_degree = 2;
    LoweredPlan fp32 = lowered(m, plan);
    plan.grad_reduce_dtype = Dtype::kBf16;
    LoweredPlan bf16 = lowered(m, plan);
    const Program& a = fp32.programs[0];
    const Program& b = bf16.programs[0];
    ASSERT_EQ(a.ops.size(), b.ops.size());
    int reductions = 0;
    for (size_t i = 0; i < a.ops.size(); ++i) {
      const Op& x = a.ops[i];
      const bool grad = (x.kind == OpKind::kReduceScatter || x.kind == OpKind::kAllReduce) &&
                        x.name != "norm.ar" && x.stream == 3;
      reductions += grad;
      EXPECT_EQ(b.ops[i].bytes, grad ? x.bytes / 2 : x.bytes) << x.name;
    }
    EXPECT_GT(reductions, 0);
  }
}

// Megatron-Core --fp8-param-gather (Plan::fp8_param_gather): every linear weight but the router
// is a 1-byte buffer with a 1-byte transpose beside it, the rest stays bf16, the persistent bytes
// are unchanged, and the distributed optimizer's all-gather of a bucket moves one byte for each
// fp8 element and two for the rest, padded per dtype.
TEST(Lower, Fp8ParamGatherKeepsLinearWeightsInFp8AndGathersThemInFp8) {
  const Model m = model_preset("tiny-moe");
  Plan plan = make_plan(2, 1, 4, 8);
  plan.ep = 2;
  plan.zero = 1;
  plan.precision = Dtype::kFp8;
  plan.grad_reduce_dtype = Dtype::kBf16;
  const LoweredPlan bf16 = lowered(m, plan);
  plan.fp8_param_gather = true;
  const LoweredPlan fp8 = lowered(m, plan);
  const Program& a = bf16.programs[0];
  const Program& b = fp8.programs[0];
  int fp8_weights = 0, transposes = 0;
  double fp8_elements = 0;
  for (const Buffer& buf : b.buffers) {
    if (buf.cls != BufferClass::kParam || !buf.persistent) continue;
    // "L<n>.<slot>.w": a linear's weight slot (its bias is "<slot>.b").
    const size_t dot = buf.name.find('.');
    const std::string slot = buf.name.starts_with("L") && buf.name.ends_with(".w")
                                 ? buf.name.substr(dot + 1, buf.name.size() - dot - 3)
                                 : "";
    const bool linear = slot == "qkv" || slot == "out" || slot == "fc1" || slot == "fc2" ||
                        slot == "efc1" || slot == "efc2";
    if (buf.name.ends_with(".wT")) {
      EXPECT_EQ(buf.dtype, Dtype::kFp8) << buf.name;
      ++transposes;
      continue;
    }
    EXPECT_EQ(buf.dtype, linear ? Dtype::kFp8 : Dtype::kBf16) << buf.name;
    if (linear) fp8_elements += static_cast<double>(buf.elements());
    fp8_weights += linear;
  }
  EXPECT_GT(fp8_weights, 0);
  EXPECT_EQ(transposes, fp8_weights);
  // The router is bf16 (outside fp8) and the embedding and head too.
  for (const Buffer& buf : b.buffers)
    if (buf.name.find("router") != std::string::npos || buf.name.starts_with("emb.") ||
        buf.name.starts_with("head."))
      EXPECT_NE(buf.dtype, Dtype::kFp8) << buf.name;
  // The same persistent bytes up to the per-dtype padding (< ways elements a bucket and dtype).
  const double pa = liveness(a).persistent_bytes, pb = liveness(b).persistent_bytes;
  EXPECT_NEAR(pb, pa, 2.0 * 4 * 2 * b.buckets.size());
  // The all-gathers move the fp8 weights at one byte: what they move less is the fp8 elements
  // (up to padding).
  double ag_a = 0, ag_b = 0;
  int gathers = 0;
  ASSERT_EQ(a.ops.size(), b.ops.size());
  for (size_t i = 0; i < a.ops.size(); ++i) {
    if (a.ops[i].kind != OpKind::kAllGather || !is_data_parallel(a.ops[i].group)) continue;
    ++gathers;
    ag_a += a.ops[i].bytes;
    ag_b += b.ops[i].bytes;
    EXPECT_LE(b.ops[i].bytes, a.ops[i].bytes) << a.ops[i].name;
  }
  EXPECT_GT(gathers, 0);
  // This rank's fp8 elements are 1/ways of what a gather moves: dense over dp 4, experts over 2.
  EXPECT_NEAR(ag_a - ag_b, fp8_elements, 2.0 * 4 * b.buckets.size());
  EXPECT_GT(fp8_elements, 0);
  // Every other op is the same (the layer fragments do not change).
  for (size_t i = 0; i < a.ops.size(); ++i)
    if (a.ops[i].kind != OpKind::kAllGather)
      EXPECT_EQ(a.ops[i].bytes, b.ops[i].bytes) << a.ops[i].name;
}

// Transformer Engine keeps a transpose of each fp8 weight only where the device's fp8 GEMMs take
// TN operands only (is_non_tn_fp8_gemm_supported: compute capability 10.x-11.x and 13.0 on take
// any layout): a Blackwell plan (GB200, B200) holds no transpose buffer, a Hopper one (H100,
// H200) one per fp8 weight; the ops are the same, and the persistent bytes differ by one byte an
// fp8 element. lower() reads the device from the cluster.
TEST(Lower, Fp8WeightTransposesOnlyWhereTheDevicesFp8GemmsTakeTnOperandsOnly) {
  const Model m = model_preset("tiny-moe");
  Plan plan = make_plan(2, 1, 4, 8);
  plan.ep = 2;
  plan.zero = 1;
  plan.precision = Dtype::kFp8;
  plan.grad_reduce_dtype = Dtype::kBf16;
  plan.fp8_param_gather = true;
  auto count_buffers = [](const Program& p, bool transposes) {
    int n = 0;
    double elements = 0;
    for (const Buffer& b : p.buffers)
      if (b.cls == BufferClass::kParam && b.persistent && b.dtype == Dtype::kFp8 &&
          b.name.ends_with(".wT") == transposes) {
        ++n;
        elements += static_cast<double>(b.elements());
      }
    return std::pair<int, double>{n, elements};
  };
  const Program hopper = lower_stage(m, plan, 0, device_spec("H100-SXM"));
  const auto [fp8_weights, fp8_elements] = count_buffers(hopper, false);
  ASSERT_GT(fp8_weights, 0);
  for (const char* name : {"H100-SXM", "H200", "GB200", "B200"}) {
    SCOPED_TRACE(name);
    const DeviceSpec& d = device_spec(name);
    const bool kept = d.compute_capability < 100;
    EXPECT_EQ(fp8_weight_transpose_kept(d), kept);
    const Program p = lower_stage(m, plan, 0, d);
    EXPECT_EQ(count_buffers(p, false).first, fp8_weights);
    EXPECT_EQ(count_buffers(p, true).first, kept ? fp8_weights : 0);
    EXPECT_NEAR(liveness(hopper).persistent_bytes - liveness(p).persistent_bytes,
                kept ? 0.0 : fp8_elements, 0.5);
    ASSERT_EQ(p.ops.size(), hopper.ops.size());
    for (size_t i = 0; i < p.ops.size(); ++i) EXPECT_EQ(p.ops[i].bytes, hopper.ops[i].bytes);
  }
  // The cluster's device: a GB200 NVL72 rack lowers without transposes, a DGX H100 with them.
  for (const char* preset : {"gb200-nvl72", "dgx-h100"}) {
    const Cluster c = cluster_preset(preset, plan.gpus());
    validate(plan, m, c);
    const LoweredPlan l = lower(m, c, plan);
    EXPECT_EQ(count_buffers(l.programs[0], true).first,
              std::string(preset) == "dgx-h100" ? fp8_weights : 0)
        << preset;
  }
  // TE's rule by compute capability: 10.x and 11.x take any layout, 12.x (the RTX Blackwell
  // parts) TN only, 13.0 on any layout; no CUDA compute capability (AMD) keeps the transpose.
  DeviceSpec d = device_spec("H100-SXM");
  for (const auto& [cc, kept] : std::vector<std::pair<int, bool>>{{70, true},
                                                                  {80, true},
                                                                  {89, true},
                                                                  {90, true},
                                                                  {100, false},
                                                                  {103, false},
                                                                  {110, false},
                                                                  {120, true},
                                                                  {121, true},
                                                                  {130, false},
                                                                  {0, true}}) {
    d.compute_capability = cc;
    EXPECT_EQ(fp8_weight_transpose_kept(d), kept) << cc;
  }
}

// Without --fp8-param-gather, Transformer Engine quantizes each fp8 linear's bf16 weight on a
// micro-batch's first forward and keeps the copy (core/te_weight_cache.h): a persistent 1-byte
// buffer per linear weight but the router (the experts' too), and its transpose where the device
// keeps one (H100, not GB200). The ops are the same; the persistent bytes grow by two bytes an fp8
// element on Hopper, one on Blackwell. None under PyTorch's linears, fp8_param_gather, ZeRO-3, the
// MXFP8 recipe or bf16.
TEST(Lower, TransformerEngineCachesAnFp8CopyOfEachBf16LinearWeight) {
  const Model m = model_preset("tiny-moe");
  Plan plan = make_plan(2, 1, 4, 8);
  plan.ep = 2;
  plan.zero = 1;
  plan.precision = Dtype::kFp8;
  plan.grad_reduce_dtype = Dtype::kBf16;
  auto cached = [](const Program& p, const char* suffix) {
    int n = 0;
    double elements = 0;
    for (const Buffer& b : p.buffers)
      if (b.cls == BufferClass::kParam && b.persistent && b.name.ends_with(suffix)) {
        EXPECT_EQ(b.dtype, Dtype::kFp8) << b.name;
        ++n;
        elements += static_cast<double>(b.elements());
      }
    return std::pair<int, double>{n, elements};
  };
  Plan torch = plan;
  torch.transformer_impl = TransformerImpl::kTorch;
  plan.transformer_impl = TransformerImpl::kTransformerEngine;
  for (const char* name : {"H100-SXM", "GB200"}) {
    SCOPED_TRACE(name);
    const DeviceSpec& d = device_spec(name);
    const bool kept = fp8_weight_transpose_kept(d);
    EXPECT_EQ(te_cached_fp8_weight_bytes(plan, kept), kept ? 2.0 : 1.0);
    const Program base = lower_stage(m, torch, 0, d);
    const Program te = lower_stage(m, plan, 0, d);
    EXPECT_EQ(cached(base, ".w.fp8").first, 0);
    // One copy per fp8 linear weight: what fp8_param_gather would store in fp8.
    Plan gather = plan;
    gather.fp8_param_gather = true;
    const Program fp8_params = lower_stage(m, gather, 0, d);
    int fp8_weights = 0;
    double fp8_elements = 0;
    for (const Buffer& b : fp8_params.buffers)
      if (b.persistent && b.dtype == Dtype::kFp8 && b.name.ends_with(".w")) {
        ++fp8_weights;
        fp8_elements += static_cast<double>(b.elements());
      }
    ASSERT_GT(fp8_weights, 0);
    EXPECT_EQ(cached(te, ".w.fp8"), (std::pair<int, double>{fp8_weights, fp8_elements}));
    EXPECT_EQ(cached(te, ".w.fp8T").first, kept ? fp8_weights : 0);
    EXPECT_EQ(cached(fp8_params, ".w.fp8").first, 0);
    EXPECT_NEAR(liveness(te).persistent_bytes - liveness(base).persistent_bytes,
                (kept ? 2 : 1) * fp8_elements, 0.5);
    ASSERT_EQ(te.ops.size(), base.ops.size());
    for (size_t i = 0; i < te.ops.size(); ++i) EXPECT_EQ(te.ops[i].bytes, base.ops[i].bytes);
  }
  for (auto change : std::vector<std::function<void(Plan&)>>{
           [](Plan& p) { p.zero = 3; }, [](Plan& p) { p.fp8_recipe = Fp8Recipe::kMxfp8; },
           [](Plan& p) { p.precision = Dtype::kBf16; }}) {
    Plan other = plan;
    change(other);
    EXPECT_EQ(te_cached_fp8_weight_bytes(other, true), 0.0);
    EXPECT_EQ(cached(lower_stage(m, other, 0, device_spec("H100-SXM")), ".w.fp8").first, 0);
  }
}

TEST(Lower, SequenceParallelSumsPartialGradientsOverTpBeforeEachShardedReduction) {
  // Under SP a layer's norm and row-parallel bias gradients are partial per TP rank: with ZeRO 2
  // they are all-reduced over tp before every reduce-scatter of their bucket.
  const Model m = tiny_gpt(2);
  Plan plan = make_plan(2, 1, 2, 4);  // 2 micro-batches
  plan.sequence_parallel = true;
  plan.zero = 2;
  LoweredPlan lp = lowered(m, plan);
  const Program& p = lp.programs[0];
  const double h = m.hidden;
  for (int layer = 0; layer < 2; ++layer)
    for (int mb = 0; mb < 2; ++mb) {
      auto ar = select(p, both(in(layer, mb, Phase::kBackward),
                               [](const Op& o) { return o.name.ends_with("sp.g.ar"); }));
      auto rs = select(p, both(in(layer, mb, Phase::kBackward), on(Group::kDpCp)));
      ASSERT_EQ(ar.size(), 1u);
      ASSERT_EQ(rs.size(), 1u);
      EXPECT_EQ(ar[0]->group, Group::kTp);
      EXPECT_EQ(ar[0]->bytes, 4.0 * (2 * 2 * h + 2 * h));  // two layernorms, two biases
      EXPECT_LT(ar[0]->id, rs[0]->id);
      EXPECT_TRUE(std::count(rs[0]->deps.begin(), rs[0]->deps.end(), ar[0]->id));
    }
  EXPECT_EQ(count(p, [](const Op& o) { return o.name == "sp.g.ar"; }), 0);
}

// Its speed is measured in tests/bench/sim_bench.cc (BM_LowerGpt3_1024), not here: a timed test
// fails on a loaded machine.
TEST(Lower, Gpt3At1024GpusLowersEveryMicroBatch) {
  const Model m = model_preset("gpt3-175b");
  Plan plan = make_plan(8, 8, 16, 2048);  // 128 micro-batches per pipeline, 1F1B
  plan.sequence_parallel = true;
  plan.recompute = Recompute::kSelective;
  Cluster c = cluster_preset("dgx-a100-80g", 1024);
  validate(plan, m, c);
  auto t0 = std::chrono::steady_clock::now();
  LoweredPlan lp = lower(m, c, plan);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  size_t ops = 0;
  for (const Program& p : lp.programs) ops += p.ops.size();
  EXPECT_GT(ops / 8, 50000u);
  RecordProperty("lower_seconds", std::to_string(s));
  std::printf("GPT-3 175B TP8 PP8 DP16 SP, 128 micro-batches: %zu ops in %.3f s\n", ops, s);
}

}  // namespace
}  // namespace parasol
