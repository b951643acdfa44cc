// Helpers of the trainer-state suites (param_layout, param_init, checkpoint): small models and
// plans of every parallel feature, every rank of a plan simulated in-process with its own
// buffers, and a reference map from a rank's slice to the full tensor written element by element
// from Megatron's definitions (heads, gate/up blocks, vocabulary rows), independent of
// runtime/param_layout's run arithmetic.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <deque>
#include <limits>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/cluster.h"
#include "core/lower.h"
#include "core/model.h"
#include "core/plan.h"
#include "core/rank_layout.h"
#include "runtime/param_init.h"

namespace parasol::runtime::testing {

// ---- Models -----------------------------------------------------------------------------------

// GPT-style (layernorm, biases, learned positions), untied; vocab 510 leaves padding rows under
// tp 4 (ceil(510 / 4) = 128, the last rank holds 126).
inline Model gpt_untied(int layers = 2) {
  return gpt_model("gpt-untied", layers, 64, 4, 510, 64, false);
}
// Llama-style with kv_heads = heads (tp 4 divides them).
inline Model llama_kv4() { return llama_model("llama-kv4", 2, 64, 4, 4, 256, 510, 64); }
// GPT-style MoE with biases: layer 1 is MoE (4 experts, top-1), layer 0 dense; odd vocab.
inline Model gpt_moe() {
  Model m = gpt_model("gpt-moe", 2, 64, 4, 501, 64, false);
  m.moe = {4, 1, 128, 2};
  return m;
}
// Multi-head latent attention (heads 4; latents 32 and 16; 8 + 4 query/key dims, 6 value dims),
// with or without query compression; with biases on every linear (GPT-style) when `bias`.
inline Model mla_model(bool q_lora = true, bool bias = false) {
  Model m = bias ? gpt_model("mla-gpt", 2, 64, 4, 510, 64, false)
                 : llama_model("mla", 2, 64, 4, 4, 128, 510, 64);
  m.mla = {q_lora ? 32 : 0, 16, 8, 4, 6};
  m.head_dim = m.mla.qk_head_dim();
  m.kv_heads = m.heads;
  if (!q_lora) m.name += "-plain-q";
  return m;
}
// A dense first layer, then MoE layers with two shared experts of 32 (biases: gpt style).
inline Model shared_moe() {
  Model m = gpt_model("shared-moe", 3, 64, 4, 510, 64, false);
  m.moe = {4, 2, 64, 1, 1, 2, 32};
  return m;
}

// ---- Plans ------------------------------------------------------------------------------------

struct PlanArgs {
  int tp = 1, pp = 1, dp = 1, cp = 1, ep = 1, zero = 0, vpp = 1, etp = 0;
  bool sp = false;
  Dtype precision = Dtype::kBf16;
  bool offload_optimizer = false;
  bool custom_order = false;  // rank order dp-tp-cp-ep-pp instead of tp-cp-ep-dp-pp
  int shard_degree = 0;       // HSDP
  Reshard reshard = Reshard::kAfterForward;
  std::vector<int> stage_layers = {};  // uneven pipeline stages
};

inline Plan make_plan(const PlanArgs& a) {
  Plan p;
  p.tp = a.tp;
  p.pp = a.pp;
  p.dp = a.dp;
  p.cp = a.cp;
  p.ep = a.ep;
  p.etp = a.etp;
  p.zero = a.zero;
  p.vpp = a.vpp;
  p.sequence_parallel = a.sp;
  p.precision = a.precision;
  p.offload.optimizer = a.offload_optimizer;
  if (a.vpp > 1) p.schedule = Schedule::kInterleaved;
  p.micro_batch = 1;
  p.global_batch = a.dp * 2 * a.pp;
  if (a.custom_order) p.rank_order = {Dim::kDp, Dim::kTp, Dim::kCp, Dim::kEp, Dim::kPp};
  p.shard_degree = a.shard_degree;
  p.reshard = a.reshard;
  p.stage_layers = a.stage_layers;
  return p;
}

struct Case {
  std::string name;
  Model model;
  Plan plan;
};

// Every feature the state must survive: tp 2/4 (vocabulary padding), sp, cp, pp 2 (tied head
// copy, interleaved chunks, uneven stages), dp with ZeRO 0..3 (shard padding with dp 3), HSDP,
// master weights in the optimizer state or not, ep, mixed plans and a non-default rank order;
// latent attention, shared experts and an expert grid of its own (etp != tp).
inline std::vector<Case> all_cases() {
  const Model tiny = model_preset("tiny"), tgpt = model_preset("tiny-gpt");
  const Model moe = model_preset("tiny-moe");
  std::vector<Case> c = {
      {"tiny serial", tiny, make_plan({})},
      {"tiny tp2", tiny, make_plan({.tp = 2})},
      {"tiny tp2 sp", tiny, make_plan({.tp = 2, .sp = true})},
      {"llama-kv4 tp4", llama_kv4(), make_plan({.tp = 4})},
      {"gpt-untied tp4", gpt_untied(), make_plan({.tp = 4})},
      {"gpt-untied pp2", gpt_untied(), make_plan({.pp = 2})},
      {"gpt-untied pp2 vpp2", gpt_untied(4), make_plan({.pp = 2, .vpp = 2})},
      {"tiny-gpt tied pp2", tgpt, make_plan({.pp = 2})},
      {"tiny-gpt tied tp2", tgpt, make_plan({.tp = 2})},
      {"tiny dp2 zero0", tiny, make_plan({.dp = 2})},
      {"tiny dp2 zero1", tiny, make_plan({.dp = 2, .zero = 1})},
      {"tiny dp2 zero1 fp32", tiny, make_plan({.dp = 2, .zero = 1, .precision = Dtype::kFp32})},
      {"tiny dp2 zero2 fp32", tiny, make_plan({.dp = 2, .zero = 2, .precision = Dtype::kFp32})},
      {"tiny dp2 zero3", tiny, make_plan({.dp = 2, .zero = 3})},
      {"tiny dp2 zero3 fp32", tiny, make_plan({.dp = 2, .zero = 3, .precision = Dtype::kFp32})},
      {"gpt-untied dp3 zero3", gpt_untied(), make_plan({.dp = 3, .zero = 3})},
      {"tiny cp2 zero1", tiny, make_plan({.cp = 2, .zero = 1})},
      {"tiny dp2 offload fp32", tiny,
       make_plan({.dp = 2, .zero = 1, .precision = Dtype::kFp32, .offload_optimizer = true})},
      {"tiny-moe dp2 ep2", moe, make_plan({.dp = 2, .ep = 2})},
      {"tiny-moe dp4 ep2 zero1", moe, make_plan({.dp = 4, .ep = 2, .zero = 1})},
      {"gpt-moe tp2 dp2 ep2 zero2", gpt_moe(), make_plan({.tp = 2, .dp = 2, .ep = 2, .zero = 2})},
      {"gpt-moe tp2 dp4 ep2 zero3", gpt_moe(), make_plan({.tp = 2, .dp = 4, .ep = 2, .zero = 3})},
      {"gpt-untied tp2 pp2 dp2 zero1", gpt_untied(),
       make_plan({.tp = 2, .pp = 2, .dp = 2, .zero = 1})},
      {"gpt-untied tp2 pp2 dp2 zero1 dp-tp order", gpt_untied(),
       make_plan({.tp = 2, .pp = 2, .dp = 2, .zero = 1, .custom_order = true})},
      {"gpt-moe tp2 cp2 dp2 ep2 zero1 sp", gpt_moe(),
       make_plan({.tp = 2, .dp = 2, .cp = 2, .ep = 2, .zero = 1, .sp = true})},
      {"tiny dp4 hsdp2 zero1", tiny, make_plan({.dp = 4, .zero = 1, .shard_degree = 2})},
      {"gpt-untied dp3 cp2 hsdp3 zero3", gpt_untied(),
       make_plan({.dp = 3, .cp = 2, .zero = 3, .shard_degree = 3})},
      {"tiny-moe dp8 ep2 hsdp4 zero2", moe,
       make_plan({.dp = 8, .ep = 2, .zero = 2, .shard_degree = 4})},
      {"tiny pp2 dp2 zero3 after_step", tiny,
       make_plan({.pp = 2, .dp = 2, .zero = 3, .reshard = Reshard::kAfterStep})},
      {"gpt-untied pp2 stages 1+3 dp2 zero1", gpt_untied(4),
       make_plan({.pp = 2, .dp = 2, .zero = 1, .stage_layers = {1, 3}})},
      {"gpt-untied pp2 vpp2 virtual stages 2+1+1+2", gpt_untied(6),
       make_plan({.pp = 2, .vpp = 2, .stage_layers = {2, 1, 1, 2}})},
      {"mla tp2 dp2 zero1", mla_model(), make_plan({.tp = 2, .dp = 2, .zero = 1})},
      {"mla-gpt plain q tp4 zero0", mla_model(false, true), make_plan({.tp = 4})},
      {"mla-gpt tp2 dp2 zero3", mla_model(true, true), make_plan({.tp = 2, .dp = 2, .zero = 3})},
      {"shared-moe tp2 dp2 ep2 zero2", shared_moe(),
       make_plan({.tp = 2, .dp = 2, .ep = 2, .zero = 2})},
      {"tiny-moe tp2 dp4 ep4 etp1 zero1", moe,
       make_plan({.tp = 2, .dp = 4, .ep = 4, .zero = 1, .etp = 1})},
      {"gpt-moe dp4 etp2 zero3", gpt_moe(), make_plan({.dp = 4, .zero = 3, .etp = 2})},
      {"shared-moe tp2 pp2 stages 1+2 dp2 ep4 etp1 zero2", shared_moe(),
       make_plan(
           {.tp = 2, .pp = 2, .dp = 2, .ep = 4, .zero = 2, .etp = 1, .stage_layers = {1, 2}})},
  };
  return c;
}

// ---- Simulated ranks --------------------------------------------------------------------------

inline int64_t product(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

constexpr float kUnset = std::numeric_limits<float>::quiet_NaN();

// One rank of a plan: its coordinates, its stage's Program and its own buffers (allocated on
// first access, filled with NaN so that an unwritten element shows).
struct SimRank {
  int rank = 0;
  RankCoord coord;
  const Program* program = nullptr;
  std::map<int, std::vector<float>> buffers;

  std::vector<float>& buf(int id) {
    auto it = buffers.find(id);
    if (it == buffers.end())
      it =
          buffers
              .emplace(id, std::vector<float>(
                               static_cast<size_t>(product(program->buffers.at(id).shape)), kUnset))
              .first;
    return it->second;
  }
  BufferAccess access() {
    return [this](int id) { return buf(id).data(); };
  }
  int index(const Plan& p, const ParamBucket& b) const {
    // The index in b.group from RankLayout (the groups the communicators use).
    RankLayout layout(p);
    const std::vector<int> members = layout.group(b.group, rank);
    for (size_t i = 0; i < members.size(); ++i)
      if (members[i] == rank) return static_cast<int>(i);
    ADD_FAILURE() << "rank " << rank << " not in its own group";
    return -1;
  }
};

// Every rank of a plan, simulated.
struct SimRun {
  Model model;
  Plan plan;
  std::vector<Program> programs;  // per stage
  std::deque<SimRank> ranks;      // deque: SimRank addresses stay put (access() captures them)

  SimRun(const Model& m, const Plan& p) : model(m), plan(p) {
    validate(p, m, cluster_preset("dgx-h100", p.gpus()));
    for (int s = 0; s < p.pp; ++s) programs.push_back(lower_stage(m, p, s));
    RankLayout layout(p);
    for (int r = 0; r < layout.world(); ++r) {
      SimRank& sr = ranks.emplace_back();
      sr.rank = r;
      sr.coord = layout.coord(r);
      sr.program = &programs[sr.coord.pp];
    }
  }
};

// ---- Reference slicing ------------------------------------------------------------------------

// The full-tensor element that local element `local` of tensor `name`'s slice on the rank at `c`
// holds, or -1 for padding; from the definitions (Megatron's tensor parallelism, experts split
// over ep), element by element.
inline int64_t ref_full_index(const Model& m, const Plan& p, const RankCoord& c,
                              const std::string& name, int64_t local) {
  const int64_t t = p.tp, r = c.tp, h = m.hidden, hd = m.head_dim;
  const int64_t H = m.heads, KV = m.kv_heads, q = H * hd, kv = KV * hd, W = q + 2 * kv;
  const int64_t up = m.activation == Activation::kSwiglu ? 2 : 1;
  const int64_t V = m.vocab, vt = (V + t - 1) / t;
  // Experts: split over the experts' TP group (etp ways, index c.etp) and the ep group.
  const int64_t et = p.expert_tp(), er = c.etp;
  const int64_t le = m.is_moe() ? m.moe.experts / p.ep : 0, e0 = c.eep * le;
  const std::string w = name.substr(name.find('.') + 1);
  // Column j of the local Q | K | V block: head j / hd of this rank's heads, in its part.
  auto qkv_col = [&](int64_t j) {
    const int64_t Ht = H / t, KVt = KV / t;
    if (j < Ht * hd) return (r * Ht + j / hd) * hd + j % hd;
    j -= Ht * hd;
    if (j < KVt * hd) return q + (r * KVt + j / hd) * hd + j % hd;
    j -= KVt * hd;
    return q + kv + (r * KVt + j / hd) * hd + j % hd;
  };
  // Column j of a local gate | up block of an MLP of width n split `ways` ways, rank `rr`.
  auto up_col = [&](int64_t j, int64_t n, int64_t ways, int64_t rr) {
    const int64_t nt = n / ways;
    return (j / nt) * n + rr * nt + j % nt;
  };
  // Local element of a column-parallel [in, width] weight split by heads (or its bias).
  auto head_cols = [&](int64_t width) {
    const int64_t lw = width / t;
    return (local / lw) * width + r * lw + local % lw;
  };
  const int64_t eff = m.moe.expert_ffn, sw = m.moe.shared_width();
  const int64_t o = H * m.v_head_dim();
  const MlaSpec& a = m.mla;
  if (w == "qkv") return (local / (W / t)) * W + qkv_col(local % (W / t));
  if (w == "qkv.b") return qkv_col(local);
  if (w == "q_up" || w == "q" || w == "q_up.b" || w == "q.b") return head_cols(H * a.qk_head_dim());
  if (w == "kv_up" || w == "kv_up.b") return head_cols(H * (a.qk_nope_head_dim + a.v_head_dim));
  if (w == "out") return (r * (o / t) + local / h) * h + local % h;
  if (w == "fc1" || w == "shared_fc1") {
    const int64_t n = w == "fc1" ? m.ffn : sw, lw = up * n / t;
    return (local / lw) * (up * n) + up_col(local % lw, n, t, r);
  }
  if (w == "fc1.b") return up_col(local, m.ffn, t, r);
  if (w == "shared_fc1.b") return up_col(local, sw, t, r);
  if (w == "fc2") return (r * (m.ffn / t) + local / h) * h + local % h;
  if (w == "shared_fc2") return (r * (sw / t) + local / h) * h + local % h;
  if (w == "efc1") {
    const int64_t lw = up * eff / et, e = local / (h * lw), rest = local % (h * lw);
    return ((e0 + e) * h + rest / lw) * (up * eff) + up_col(rest % lw, eff, et, er);
  }
  if (w == "efc1.b") {
    const int64_t lw = up * eff / et;
    return (e0 + local / lw) * (up * eff) + up_col(local % lw, eff, et, er);
  }
  if (w == "efc2") {
    const int64_t per = (eff / et) * h, e = local / per, rest = local % per;
    return ((e0 + e) * eff + er * (eff / et) + rest / h) * h + rest % h;
  }
  if (w == "efc2.b") return (e0 + local / h) * h + local % h;
  if (w == "table") {
    const int64_t row = r * vt + local / h;
    return row >= V ? -1 : row * h + local % h;
  }
  if (w == "head") {
    const int64_t col = r * vt + local % vt;
    return col >= V ? -1 : (local / vt) * V + col;
  }
  // Replicated: norms (also MLA's latent norms), MLA's down-projections, out.b, fc2.b,
  // shared_fc2.b, router, pos.
  return local;
}

// Flat element `flat` of bucket b as (spec, local element), or (-1, 0) past b.elements.
inline std::pair<int, int64_t> flat_to_spec(const ParamBucket& b, int64_t flat) {
  for (size_t s = 0; s < b.specs.size(); ++s) {
    const int64_t n = product(b.specs[s].shape);
    if (flat < n) return {static_cast<int>(s), flat};
    flat -= n;
  }
  return {-1, 0};
}

// First flat element of this rank's range of b (its ZeRO shard; 0 under ZeRO 0).
inline int64_t shard_begin(const ParamBucket& b, int index) {
  return b.zero >= 1 ? index * b.shard : 0;
}

}  // namespace parasol::runtime::testing
