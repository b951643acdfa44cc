// Tests of selective recompute's modules (Plan::recompute_modules; core/lower_recompute.cc): each
// module's forward re-runs in Phase::kRecompute before its layer's backward, the backward reads
// the recomputed buffers (the forward's copies die with the forward), and the stage's liveness
// peak falls below that of core_attn alone; core_attn alone lowers as selective recompute did.
#include <gtest/gtest.h>

#include <initializer_list>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/liveness.h"
#include "core/lower.h"
#include "tests/core/test_models.h"

namespace parasol {
namespace {

using test_models::tiny_gpt;
using test_models::tiny_mla;
using test_models::tiny_shared;
using test_models::tiny_windowed;

using RM = RecomputeModule;

// A GPipe plan (every micro-batch's activations saved at once, so that they set the peak).
Plan gpipe(int tp, int dp, int ep, int micro_batches) {
  Plan p;
  p.tp = tp;
  p.dp = dp;
  p.ep = ep;
  p.global_batch = dp * micro_batches;
  p.micro_batch = 1;
  p.schedule = Schedule::kGpipe;
  return p;
}

Plan with_modules(Plan p, std::initializer_list<RM> modules) {
  p.recompute = Recompute::kSelective;
  p.recompute_modules = 0;
  for (RM r : modules) p.recompute_modules |= 1u << static_cast<int>(r);
  return p;
}

Program stage0(const Model& m, const Plan& p) {
  validate(p, m, cluster_preset("dgx-h100", p.gpus()));
  return lower_stage(m, p, 0);
}

// "L3.fc1.m0" -> "fc1".
std::string base(const std::string& name) {
  std::string s = name.substr(name.find('.') + 1);
  return s.substr(0, s.rfind(".m"));
}

// The recompute ops of (layer, micro-batch): base name -> kinds, in issue order.
std::multimap<std::string, OpKind> recompute_ops(const Program& p, int layer, int mb) {
  std::multimap<std::string, OpKind> out;
  for (const Op& o : p.ops)
    if (o.tags.layer == layer && o.tags.micro_batch == mb && o.tags.phase == Phase::kRecompute)
      out.emplace(base(o.name), o.kind);
  return out;
}
std::multimap<std::string, OpKind> ops(std::initializer_list<std::pair<const char*, OpKind>> l) {
  std::multimap<std::string, OpKind> out;
  for (const auto& [n, k] : l) out.emplace(n, k);
  return out;
}

// Who reads the buffers named `name` ("L1.eact.m0"): those a forward op wrote, and those a
// recompute op wrote, by the phases of their readers.
struct Readers {
  int forward_buffers = 0, recomputed_buffers = 0;
  int forward_read_later = 0;      // reads of forward-written ones in the recompute or backward
  int recomputed_read_by_bwd = 0;  // reads of recompute-written ones in the backward
};
Readers readers(const Program& p, const std::string& name) {
  std::vector<int> writer_phase(p.buffers.size(), -1);
  for (const Op& o : p.ops)
    for (int b : o.writes)
      if (writer_phase[b] < 0) writer_phase[b] = static_cast<int>(o.tags.phase);
  Readers r;
  for (const Buffer& b : p.buffers) {
    if (b.name != name) continue;
    if (writer_phase[b.id] == static_cast<int>(Phase::kForward)) ++r.forward_buffers;
    if (writer_phase[b.id] == static_cast<int>(Phase::kRecompute)) ++r.recomputed_buffers;
  }
  for (const Op& o : p.ops)
    for (int b : o.reads) {
      if (p.buffers[b].name != name) continue;
      const int w = writer_phase[b];
      if (w == static_cast<int>(Phase::kForward) && o.tags.phase != Phase::kForward)
        ++r.forward_read_later;
      if (w == static_cast<int>(Phase::kRecompute) && o.tags.phase == Phase::kBackward)
        ++r.recomputed_read_by_bwd;
    }
  return r;
}

// `what` of (layer, mb) is recomputed: the forward's copy is not read after the forward, the
// recomputed one is read by the backward.
void expect_refilled(const Program& p, int layer, int mb, const std::string& what) {
  SCOPED_TRACE("L" + std::to_string(layer) + "." + what);
  const Readers r =
      readers(p, "L" + std::to_string(layer) + "." + what + ".m" + std::to_string(mb));
  EXPECT_EQ(r.forward_buffers, 1);
  EXPECT_EQ(r.forward_read_later, 0);
  EXPECT_EQ(r.recomputed_buffers, 1);
  EXPECT_GT(r.recomputed_read_by_bwd, 0);
}

double peak(const Program& p) { return liveness(p).peak_bytes; }

TEST(LowerRecompute, CoreAttnAloneReEmitsTheAttentionCoreAsSelectiveRecomputeDid) {
  const Model m = tiny_gpt(2);
  for (bool flash : {true, false}) {
    SCOPED_TRACE(flash ? "flash" : "materialised");
    Plan none = gpipe(2, 1, 1, 2);
    none.flash_attention = flash;
    const Plan sel = with_modules(none, {RM::kCoreAttn});
    Plan by_default = none;
    by_default.recompute = Recompute::kSelective;
    ASSERT_EQ(by_default.recompute_modules, sel.recompute_modules);
    const Program a = stage0(m, none), b = stage0(m, by_default);
    // The plan without recompute plus one attention core per layer and micro-batch.
    ASSERT_EQ(b.ops.size(), a.ops.size() + 2 * 2);
    std::vector<std::pair<std::string, OpKind>> fb_a, fb_b;
    for (const Op& o : a.ops) fb_a.emplace_back(o.name, o.kind);
    for (const Op& o : b.ops)
      if (o.tags.phase != Phase::kRecompute) fb_b.emplace_back(o.name, o.kind);
    EXPECT_EQ(fb_a, fb_b);
    for (int layer = 0; layer < 2; ++layer)
      for (int mb = 0; mb < 2; ++mb)
        EXPECT_EQ(recompute_ops(b, layer, mb), ops({{"attn.rc", OpKind::kAttention}}));
    if (flash) {  // the softmax statistics are kept; the output is recomputed
      EXPECT_EQ(readers(b, "L1.lse.m0").forward_read_later, 1);
      EXPECT_EQ(readers(b, "L1.attn.rc.m0").recomputed_read_by_bwd, 1);
    } else {  // the probabilities are recomputed, not kept
      expect_refilled(b, 1, 0, "probs");
      EXPECT_LT(peak(b), peak(a));
    }
  }
  // Without core_attn among the modules the materialised probabilities are kept and read.
  Plan p = gpipe(2, 1, 1, 2);
  p.flash_attention = false;
  const Program mlp_only = stage0(m, with_modules(p, {RM::kMlp}));
  EXPECT_EQ(recompute_ops(mlp_only, 1, 0).count("attn.rc"), 0u);
  EXPECT_EQ(readers(mlp_only, "L1.probs.m0").forward_read_later, 1);
}

TEST(LowerRecompute, MlpReRunsTheDenseMlpWithItsTensorParallelCollectives) {
  const Model m = tiny_shared();  // layer 0 dense, 1 and 2 MoE
  for (bool sp : {false, true}) {
    SCOPED_TRACE(sp ? "sp" : "no sp");
    Plan p = gpipe(2, 1, 1, 4);
    p.sequence_parallel = sp;
    const Program base_prog = stage0(m, with_modules(p, {RM::kCoreAttn}));
    const Program prog = stage0(m, with_modules(p, {RM::kMlp}));
    for (int mb = 0; mb < 4; ++mb) {
      auto want = ops({{"fc1", OpKind::kLinear},
                       {"act", OpKind::kActivation},
                       {"fc2", OpKind::kLinear},
                       {"fc2.tp", sp ? OpKind::kReduceScatter : OpKind::kAllReduce}});
      if (sp) want.emplace("ag", OpKind::kAllGather);
      EXPECT_EQ(recompute_ops(prog, 0, mb), want);
      EXPECT_TRUE(recompute_ops(prog, 1, mb).empty()) << "MoE layers have no dense MLP";
      expect_refilled(prog, 0, mb, "fc1");
      expect_refilled(prog, 0, mb, "act");
    }
    EXPECT_LT(peak(prog), peak(base_prog));
  }
}

TEST(LowerRecompute, MoeActReRunsTheExpertActivationFromTheKeptFc1Output) {
  const Model m = model_preset("tiny-moe");
  const Plan p = gpipe(1, 2, 2, 4);
  const Program base_prog = stage0(m, with_modules(p, {RM::kCoreAttn}));
  const Program prog = stage0(m, with_modules(p, {RM::kMoeAct}));
  for (int layer = 0; layer < 2; ++layer)
    for (int mb = 0; mb < 4; ++mb) {
      EXPECT_EQ(recompute_ops(prog, layer, mb), ops({{"eact", OpKind::kActivation}}));
      expect_refilled(prog, layer, mb, "eact");
      EXPECT_EQ(readers(prog, "L" + std::to_string(layer) + ".efc1.m" + std::to_string(mb))
                    .forward_read_later,
                2);  // the recompute and the activation's backward
    }
  EXPECT_LT(peak(prog), peak(base_prog));
}

TEST(LowerRecompute, LayernormReRunsTheMoeLayersPreMlpNorm) {
  const Model m = tiny_shared();
  const Plan p = gpipe(1, 2, 2, 4);
  const Program base_prog = stage0(m, with_modules(p, {RM::kCoreAttn}));
  const Program prog = stage0(m, with_modules(p, {RM::kLayernorm}));
  for (int mb = 0; mb < 4; ++mb) {
    EXPECT_TRUE(recompute_ops(prog, 0, mb).empty()) << "the dense layer's norm is fused";
    for (int layer : {1, 2}) {
      EXPECT_EQ(recompute_ops(prog, layer, mb), ops({{"ln2", OpKind::kNorm}}));
      expect_refilled(prog, layer, mb, "ln2");
    }
  }
  EXPECT_LT(peak(prog), peak(base_prog));
}

TEST(LowerRecompute, MoeReRunsRouterDispatchAllToAllsExpertsCombineAndSharedExperts) {
  const Model m = tiny_shared();
  const Plan p = gpipe(1, 2, 2, 4);
  const Program base_prog = stage0(m, with_modules(p, {RM::kCoreAttn}));
  const Program prog = stage0(m, with_modules(p, {RM::kMoe}));
  for (int mb = 0; mb < 4; ++mb) {
    EXPECT_TRUE(recompute_ops(prog, 0, mb).empty());
    for (int layer : {1, 2}) {
      SCOPED_TRACE("L" + std::to_string(layer) + " mb " + std::to_string(mb));
      const auto rc = recompute_ops(prog, layer, mb);
      // The recomputed routing syncs on its token counts again (Megatron: +1 sync when the MoE
      // is recomputed).
      const auto want = ops({{"router", OpKind::kLinear},
                             {"route", OpKind::kRouter},
                             {"tokens", OpKind::kSync},
                             {"dispatch", OpKind::kDispatch},
                             {"disp.a2a", OpKind::kAllToAll},
                             {"efc1", OpKind::kExpertLinear},
                             {"eact", OpKind::kActivation},
                             {"efc2", OpKind::kExpertLinear},
                             {"comb.a2a", OpKind::kAllToAll},
                             {"combine", OpKind::kCombine},
                             {"shared_fc1", OpKind::kLinear},
                             {"shared_act", OpKind::kActivation},
                             {"shared_fc2", OpKind::kLinear},
                             {"moe.add", OpKind::kResidualAdd}});
      EXPECT_EQ(rc, want);
      for (const char* what : {"rprobs", "efc1", "eact", "comb.a2a", "shared_fc1", "shared_act"})
        expect_refilled(prog, layer, mb, what);
    }
  }
  EXPECT_LT(peak(prog), peak(base_prog));
  // moe re-runs the experts' activation and the shared experts itself: adding moe_act and
  // shared_experts changes nothing.
  const Program all = stage0(m, with_modules(p, {RM::kMoe, RM::kMoeAct, RM::kSharedExperts}));
  EXPECT_EQ(all.ops.size(), prog.ops.size());
}

TEST(LowerRecompute, SharedExpertsReRunTheSharedMlp) {
  const Model m = tiny_shared();
  const Plan p = gpipe(2, 1, 1, 4);
  const Program base_prog = stage0(m, with_modules(p, {RM::kCoreAttn}));
  const Program prog = stage0(m, with_modules(p, {RM::kSharedExperts}));
  for (int mb = 0; mb < 4; ++mb) {
    EXPECT_TRUE(recompute_ops(prog, 0, mb).empty());
    for (int layer : {1, 2}) {
      EXPECT_EQ(recompute_ops(prog, layer, mb), ops({{"shared_fc1", OpKind::kLinear},
                                                     {"shared_act", OpKind::kActivation},
                                                     {"shared_fc2", OpKind::kLinear},
                                                     {"shared_fc2.tp", OpKind::kAllReduce}}));
      expect_refilled(prog, layer, mb, "shared_fc1");
      expect_refilled(prog, layer, mb, "shared_act");
    }
  }
  EXPECT_LT(peak(prog), peak(base_prog));
}

TEST(LowerRecompute, MlaUpProjReRunsTheUpProjectionsFromTheKeptLatents) {
  for (bool q_lora : {true, false}) {
    SCOPED_TRACE(q_lora ? "q_lora" : "no q_lora");
    const Model m = tiny_mla(q_lora);
    const Plan p = gpipe(2, 1, 1, 4);
    const Program base_prog = stage0(m, with_modules(p, {RM::kCoreAttn}));
    const Program prog = stage0(m, with_modules(p, {RM::kMlaUpProj}));
    for (int layer = 0; layer < 2; ++layer)
      for (int mb = 0; mb < 4; ++mb) {
        // The latent norms once (the backward's weight gradients reuse them), the
        // up-projections and RoPE.
        auto want = ops({{"kv_norm", OpKind::kNorm},
                         {"kv_up", OpKind::kLinear},
                         {"qkv.pack", OpKind::kResidualAdd}});
        if (q_lora) {
          want.emplace("q_norm", OpKind::kNorm);
          want.emplace("q_up", OpKind::kLinear);
        } else {
          want.emplace("q", OpKind::kLinear);
        }
        EXPECT_EQ(recompute_ops(prog, layer, mb), want);
        expect_refilled(prog, layer, mb, "qkv");
        expect_refilled(prog, layer, mb, "kv_norm");  // read by kv_up.dw
      }
    EXPECT_LT(peak(prog), peak(base_prog));
  }
}

// Names of the layer-1, micro-batch-0 buffers that activation offload copies to the host.
std::multiset<std::string> offloaded(const Program& p) {
  std::multiset<std::string> out;
  for (const Op& o : p.ops)
    if (o.kind == OpKind::kOffload && o.tags.layer == 1 && o.tags.micro_batch == 0)
      for (int b : o.reads) out.insert(base(p.buffers[b].name));
  return out;
}

TEST(LowerRecompute, ActivationOffloadMovesOnlyWhatIsKept) {
  struct Case {
    Model m;
    bool flash;
    std::vector<RM> modules;
    std::vector<std::string> dropped, kept;
  };
  const std::vector<Case> cases = {
      {tiny_gpt(2), false, {RM::kCoreAttn}, {"probs"}, {"qkv", "attn", "fc1"}},
      {tiny_gpt(2), true, {RM::kMlp}, {"fc1", "act"}, {"ln2", "lse"}},
      {tiny_shared(), true, {RM::kMoeAct}, {"eact"}, {"efc1", "ln2"}},
      {tiny_shared(), true, {RM::kLayernorm}, {"ln2"}, {"res1", "eact"}},
      {tiny_shared(), true, {RM::kSharedExperts}, {"shared_fc1", "shared_act"}, {"eact"}},
      {tiny_shared(),
       true,
       {RM::kMoe},
       {"rprobs", "efc1", "eact", "comb.a2a", "shared_fc1", "shared_act"},
       {"ln2", "res1"}},
      {tiny_mla(true), true, {RM::kMlaUpProj}, {"qkv"}, {"q_lat", "kv_lat", "ln1"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.m.name + " " + recompute_module_name(c.modules[0]));
    Plan p = gpipe(1, 2, c.m.is_moe() ? 2 : 1, 2);
    p.flash_attention = c.flash;
    p.offload.activations = true;
    Plan rc = with_modules(p, {});
    for (RM r : c.modules) rc.recompute_modules |= 1u << static_cast<int>(r);
    const auto without = offloaded(stage0(c.m, p));
    const Program prog = stage0(c.m, rc);
    const auto with = offloaded(prog);
    for (const std::string& d : c.dropped) {
      EXPECT_EQ(without.count(d), 1u) << d;
      EXPECT_EQ(with.count(d), 0u) << d;
      expect_refilled(prog, 1, 0, d);
    }
    for (const std::string& k : c.kept) EXPECT_EQ(with.count(k), 1u) << k;
  }
}

// torchtitan's op-level policy (Recompute::kSelectiveOp): the recompute's GEMMs are the mms
// that torchtitan's policy does not save, counted here from the Llama block's mm order
// (torchtitan/models/llama/model.py @9dec370) and the policy's rule (MUST_SAVE unless the mm
// count is even, parallelize_llama.py _custom_policy), independently of the lowering.
struct TorchtitanMm {
  const char* name;
  int64_t n, k;  // output and input columns on one rank (tp 1)
};
std::vector<TorchtitanMm> llama_block_mms(const Model& m) {
  return {{"wq", m.q_dim(), m.hidden}, {"wk", m.kv_dim(), m.hidden}, {"wv", m.kv_dim(), m.hidden},
          {"wo", m.hidden, m.q_dim()}, {"w1", m.ffn, m.hidden},      {"w3", m.ffn, m.hidden},
          {"w2", m.hidden, m.ffn}};
}

TEST(LowerRecompute, SelectiveOpReRunsEverySecondMmOfTheBlockAndItsElementwiseOps) {
  const Model m = model_preset("tiny");  // Llama: GQA, SwiGLU, RMSNorm, no biases
  for (bool sp : {false, true}) {
    SCOPED_TRACE(sp ? "tp2 sp" : "tp1");
    Plan p = gpipe(sp ? 2 : 1, 1, 1, 2);
    p.sequence_parallel = sp;
    p.recompute = Recompute::kSelectiveOp;
    const Program prog = stage0(m, p);
    const int64_t T = m.seq_len, t = p.tp;
    // The mms whose count in the block is even, as (m, n, k) GEMM shapes on this rank.
    std::multiset<std::vector<int64_t>> want;
    double want_flops = 0;
    const std::vector<TorchtitanMm> mms = llama_block_mms(m);
    for (size_t i = 0; i < mms.size(); ++i) {
      if ((i + 1) % 2 != 0) continue;  // odd counts are saved
      // Column-parallel (wk, w3) split their outputs, row-parallel (wo) their inputs.
      const bool row_parallel = std::string(mms[i].name) == "wo";
      const int64_t n = row_parallel ? mms[i].n : mms[i].n / t;
      const int64_t k = row_parallel ? mms[i].k / t : mms[i].k;
      want.insert({T, n, k});
      want_flops += 2.0 * T * n * k;
    }
    ASSERT_EQ(want.size(), 3u);  // wk, wo, w3
    for (int layer = 0; layer < 2; ++layer)
      for (int mb = 0; mb < 2; ++mb) {
        std::multiset<std::vector<int64_t>> got;
        double flops = 0;
        std::multiset<OpKind> kinds;
        for (const Op& o : prog.ops) {
          if (o.tags.layer != layer || o.tags.micro_batch != mb ||
              o.tags.phase != Phase::kRecompute)
            continue;
          kinds.insert(o.kind);
          if (o.kind == OpKind::kLinear) {
            got.insert({o.m, o.n, o.k});
            flops += o.flops;
          }
        }
        EXPECT_EQ(got, want);
        EXPECT_DOUBLE_EQ(flops, want_flops);
        // The norms, the first residual add and the SwiGLU re-run; the attention kernel, whose
        // outputs the policy saves, does not; under SP the inputs of wk and w3 are gathered again
        // and the reduce-scatters (saved) are not re-run.
        EXPECT_EQ(kinds.count(OpKind::kNorm), 2u);
        EXPECT_EQ(kinds.count(OpKind::kResidualAdd), 1u);
        EXPECT_EQ(kinds.count(OpKind::kActivation), 1u);
        EXPECT_EQ(kinds.count(OpKind::kAttention), 0u);
        EXPECT_EQ(kinds.count(OpKind::kAllGather), sp ? 2u : 0u);
        EXPECT_EQ(kinds.count(OpKind::kReduceScatter), 0u);
        EXPECT_EQ(kinds.count(OpKind::kAllReduce), 0u);
        // What is recomputed is not kept: the forward's copies die with the forward.
        for (const char* what : {"ln1", "k", "res1", "ln2", "fc3", "act"})
          expect_refilled(prog, layer, mb, what);
        // What the policy saves is kept for the backward (or, for w2's output, until the
        // recompute's replay pops it).
        const std::string tag = "L" + std::to_string(layer) + ".";
        const std::string suffix = ".m" + std::to_string(mb);
        for (const char* what : {"qv", "attn", "lse", "fc1", "fc2"})
          EXPECT_GT(readers(prog, tag + what + suffix).forward_read_later, 0) << what;
      }
  }
}

TEST(LowerRecompute, SelectiveOpIsRefusedWhereTheLlamaMmOrderDoesNotHold) {
  // The field validate() names for `p` on `m` ("ok" when it accepts the plan).
  auto refused = [](const Model& m, const Plan& p) -> std::string {
    try {
      validate(p, m, cluster_preset("dgx-h100", p.gpus()));
    } catch (const Error& e) {
      return e.field();
    }
    return "ok";
  };
  Plan p = gpipe(1, 1, 1, 2);
  p.recompute = Recompute::kSelectiveOp;
  const Model llama = model_preset("tiny");
  EXPECT_EQ(refused(llama, p), "ok");
  EXPECT_EQ(refused(tiny_gpt(2), p), "plan.recompute");    // GELU MLP, biases, dropout
  EXPECT_EQ(refused(tiny_shared(), p), "plan.recompute");  // MoE layers
  Plan no_flash = p;
  no_flash.flash_attention = false;
  EXPECT_EQ(refused(llama, no_flash), "plan.recompute");
  Plan tp = gpipe(2, 1, 1, 2);
  tp.recompute = Recompute::kSelectiveOp;
  EXPECT_EQ(refused(llama, tp), "plan.recompute");  // TP without SP
  tp.sequence_parallel = true;
  EXPECT_EQ(refused(llama, tp), "ok");
  Plan cp = gpipe(1, 1, 1, 2);
  cp.cp = 2;
  cp.recompute = Recompute::kSelectiveOp;
  EXPECT_EQ(refused(llama, cp), "plan.recompute");
}

}  // namespace
}  // namespace parasol
