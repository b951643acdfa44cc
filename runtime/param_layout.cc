// Parameter layout: full tensor shapes, the tensor/expert-parallel slice of each rank as runs of
// contiguous elements, and the ZeRO shard of a bucket across its specs (see param_layout.h).
#include "runtime/param_layout.h"

#include <algorithm>
#include <charconv>

#include "core/error.h"
#include "core/layer_shapes.h"

namespace parasol::runtime {

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// One dimension of a tensor seen as [E, R, C] (experts, rows, columns): its full and local
// lengths and the segments of local positions that hold full positions.
struct Seg {
  int64_t local = 0, full = 0, count = 0;
};
struct Axis {
  int64_t full = 1, local = 1;
  std::vector<Seg> segs;
};
Axis whole(int64_t n) { return {n, n, {{0, 0, n}}}; }
Axis part(int64_t n, int64_t ways, int64_t r) {
  return {n, n / ways, {{0, r * (n / ways), n / ways}}};
}
// Concatenated slices r of consecutive blocks of `sizes` (Q | K | V, gate | up).
Axis blocks(const std::vector<int64_t>& sizes, int64_t ways, int64_t r) {
  Axis a;
  a.full = a.local = 0;
  for (int64_t n : sizes) {
    const int64_t k = n / ways;
    a.segs.push_back({a.local, a.full + r * k, k});
    a.full += n;
    a.local += k;
  }
  return a;
}
// Vocabulary-parallel: ceil(n / ways) local entries, those past n padding.
Axis vocab_part(int64_t n, int64_t ways, int64_t r) {
  const int64_t k = ceil_div(n, ways), start = r * k;
  const int64_t count = std::max<int64_t>(0, std::min(n, start + k) - start);
  Axis a{n, k, {}};
  if (count > 0) a.segs.push_back({0, start, count});
  return a;
}

struct View {
  Axis e = whole(1), r = whole(1), c = whole(1);
  bool has_e = false, has_r = false;  // dimensions present in the tensor's shape
};

// The shape of the tensor: [E,] [R,] C.
std::vector<int64_t> shape_of(const View& v, bool local) {
  std::vector<int64_t> s;
  if (v.has_e) s.push_back(local ? v.e.local : v.e.full);
  if (v.has_r) s.push_back(local ? v.r.local : v.r.full);
  s.push_back(local ? v.c.local : v.c.full);
  return s;
}

struct Parsed {
  TensorKind kind;
  int layer;
};

Parsed parse_name(const Model& m, const std::string& name) {
  const std::string field = "param." + name;
  if (name == "emb.table") return {TensorKind::kTable, -1};
  if (name == "emb.pos") {
    if (!m.learned_positions) throw Error(field, "the model has no learned positions");
    return {TensorKind::kPos, -1};
  }
  if (name == "head.lnf") return {TensorKind::kNorm, -1};
  if (name == "head.head") return {TensorKind::kHead, -1};
  const size_t dot = name.find('.');
  int layer = -1;
  if (name.size() < 4 || name[0] != 'L' || dot == std::string::npos || dot < 2)
    throw Error(field, "unknown parameter (expected L<layer>.<weight>, emb.*, head.*)");
  auto [ptr, ec] = std::from_chars(name.data() + 1, name.data() + dot, layer);
  if (ec != std::errc() || ptr != name.data() + dot)
    throw Error(field, "unknown parameter (expected L<layer>.<weight>, emb.*, head.*)");
  if (layer < 0 || layer >= m.layers)
    throw Error(field, "layer " + std::to_string(layer) + " is not in [0, " +
                           std::to_string(m.layers) + ")");
  const std::string w = name.substr(dot + 1);
  // Which layers hold a weight.
  enum Where { kAttn, kMla, kMlaQ, kMlaPlainQ, kDenseMlp, kMoe, kShared, kAll };
  struct Entry {
    const char* name;
    TensorKind kind;
    bool bias;  // needs linear_bias
    Where where;
  };
  static const Entry kEntries[] = {
      {"ln1", TensorKind::kNorm, false, kAll},
      {"ln2", TensorKind::kNorm, false, kAll},
      {"qkv", TensorKind::kQkv, false, kAttn},
      {"qkv.b", TensorKind::kQkvBias, true, kAttn},
      {"q_down", TensorKind::kQDown, false, kMlaQ},
      {"q_down.b", TensorKind::kQDownBias, true, kMlaQ},
      {"q_norm", TensorKind::kQNorm, false, kMlaQ},
      {"q_up", TensorKind::kQUp, false, kMlaQ},
      {"q_up.b", TensorKind::kQUpBias, true, kMlaQ},
      {"q", TensorKind::kQUp, false, kMlaPlainQ},
      {"q.b", TensorKind::kQUpBias, true, kMlaPlainQ},
      {"kv_down", TensorKind::kKvDown, false, kMla},
      {"kv_down.b", TensorKind::kKvDownBias, true, kMla},
      {"kv_norm", TensorKind::kKvNorm, false, kMla},
      {"kv_up", TensorKind::kKvUp, false, kMla},
      {"kv_up.b", TensorKind::kKvUpBias, true, kMla},
      {"out", TensorKind::kOut, false, kAll},
      {"out.b", TensorKind::kOutBias, true, kAll},
      {"fc1", TensorKind::kFc1, false, kDenseMlp},
      {"fc1.b", TensorKind::kFc1Bias, true, kDenseMlp},
      {"fc2", TensorKind::kFc2, false, kDenseMlp},
      {"fc2.b", TensorKind::kFc2Bias, true, kDenseMlp},
      {"router", TensorKind::kRouter, false, kMoe},
      {"shared_fc1", TensorKind::kSfc1, false, kShared},
      {"shared_fc1.b", TensorKind::kSfc1Bias, true, kShared},
      {"shared_fc2", TensorKind::kSfc2, false, kShared},
      {"shared_fc2.b", TensorKind::kSfc2Bias, true, kShared},
      {"efc1", TensorKind::kEfc1, false, kMoe},
      {"efc1.b", TensorKind::kEfc1Bias, true, kMoe},
      {"efc2", TensorKind::kEfc2, false, kMoe},
      {"efc2.b", TensorKind::kEfc2Bias, true, kMoe},
  };
  for (const Entry& e : kEntries) {
    if (w != e.name) continue;
    if (e.bias && !m.linear_bias) throw Error(field, "the model has no linear biases");
    const bool moe = m.is_moe_layer(layer), mla = m.mla.enabled();
    const std::string L = "layer " + std::to_string(layer);
    switch (e.where) {
      case kAttn:
        if (mla) throw Error(field, "the model has latent attention (no fused qkv)");
        break;
      case kMla:
      case kMlaQ:
      case kMlaPlainQ:
        if (!mla) throw Error(field, "the model has no latent attention");
        if (e.where == kMlaQ && m.mla.q_lora_rank == 0)
          throw Error(field, "the model's queries are not compressed (q_lora_rank 0)");
        if (e.where == kMlaPlainQ && m.mla.q_lora_rank > 0)
          throw Error(field, "the model's queries are compressed (q_down, q_up)");
        break;
      case kDenseMlp:
        if (moe) throw Error(field, L + " is an MoE layer");
        break;
      case kMoe:
      case kShared:
        if (!moe) throw Error(field, L + " is not MoE");
        if (e.where == kShared && m.moe.shared_experts == 0)
          throw Error(field, "the model has no shared experts");
        break;
      case kAll:
        break;
    }
    return {e.kind, layer};
  }
  throw Error(field, "unknown weight '" + w + "'");
}

// The [E, R, C] view of tensor `kind` for tp rank `tr` of `t` and ep rank `er` of `ep`
// (t = ep = 1: the full tensor).
View view_of(const Model& m, TensorKind kind, int64_t t, int64_t tr, int64_t ep, int64_t er) {
  const int64_t h = m.hidden, q = m.q_dim(), kv = m.kv_dim();
  const int64_t up = m.activation == Activation::kSwiglu ? 2 : 1;
  const int64_t E = m.moe.experts;
  const MlaSpec& a = m.mla;
  const int64_t o = int64_t{m.heads} * m.v_head_dim();  // the attention output
  auto up_blocks = [&](int64_t n) { return blocks(std::vector<int64_t>(up, n), t, tr); };
  // A weight [in, out] (or its bias [out]) with the given column and row axes.
  auto linear = [&](View& v, bool weight, int64_t in, Axis cols) {
    v.has_r = weight;
    v.r = whole(weight ? in : 1);
    v.c = std::move(cols);
  };
  auto norm = [&](View& v, int64_t width) {
    v.has_r = m.norm == Norm::kLayerNorm;
    v.r = whole(v.has_r ? 2 : 1);
    v.c = whole(width);
  };
  View v;
  switch (kind) {
    case TensorKind::kNorm:
      norm(v, h);
      break;
    case TensorKind::kQNorm:
      norm(v, a.q_lora_rank);
      break;
    case TensorKind::kKvNorm:
      norm(v, a.kv_lora_rank);
      break;
    case TensorKind::kQDown:
    case TensorKind::kQDownBias:
      linear(v, kind == TensorKind::kQDown, h, whole(a.q_lora_rank));
      break;
    case TensorKind::kQUp:
    case TensorKind::kQUpBias:
      linear(v, kind == TensorKind::kQUp, a.q_lora_rank > 0 ? a.q_lora_rank : h,
             part(m.heads * a.qk_head_dim(), t, tr));
      break;
    case TensorKind::kKvDown:
    case TensorKind::kKvDownBias:
      linear(v, kind == TensorKind::kKvDown, h, whole(a.kv_lora_rank + a.qk_rope_head_dim));
      break;
    case TensorKind::kKvUp:
    case TensorKind::kKvUpBias:
      linear(v, kind == TensorKind::kKvUp, a.kv_lora_rank,
             part(m.heads * (a.qk_nope_head_dim + a.v_head_dim), t, tr));
      break;
    case TensorKind::kSfc1:
    case TensorKind::kSfc1Bias:
      linear(v, kind == TensorKind::kSfc1, h, up_blocks(m.moe.shared_width()));
      break;
    case TensorKind::kSfc2:
      v.has_r = true;
      v.r = part(m.moe.shared_width(), t, tr);
      v.c = whole(h);
      break;
    case TensorKind::kSfc2Bias:
      v.c = whole(h);
      break;
    case TensorKind::kQkv:
    case TensorKind::kQkvBias:
      v.has_r = kind == TensorKind::kQkv;
      v.r = whole(v.has_r ? h : 1);
      v.c = blocks({q, kv, kv}, t, tr);
      break;
    case TensorKind::kOut:
      v.has_r = true;
      v.r = part(o, t, tr);
      v.c = whole(h);
      break;
    case TensorKind::kFc1:
    case TensorKind::kFc1Bias:
      v.has_r = kind == TensorKind::kFc1;
      v.r = whole(v.has_r ? h : 1);
      v.c = up_blocks(m.ffn);
      break;
    case TensorKind::kFc2:
      v.has_r = true;
      v.r = part(m.ffn, t, tr);
      v.c = whole(h);
      break;
    case TensorKind::kOutBias:
    case TensorKind::kFc2Bias:
      v.c = whole(h);
      break;
    case TensorKind::kRouter:
      v.has_r = true;
      v.r = whole(h);
      v.c = whole(E);
      break;
    case TensorKind::kEfc1:
    case TensorKind::kEfc1Bias:
      v.has_e = true;
      v.e = part(E, ep, er);
      v.has_r = kind == TensorKind::kEfc1;
      v.r = whole(v.has_r ? h : 1);
      v.c = up_blocks(m.moe.expert_ffn);
      break;
    case TensorKind::kEfc2:
      v.has_e = v.has_r = true;
      v.e = part(E, ep, er);
      v.r = part(m.moe.expert_ffn, t, tr);
      v.c = whole(h);
      break;
    case TensorKind::kEfc2Bias:
      v.has_e = true;
      v.e = part(E, ep, er);
      v.c = whole(h);
      break;
    case TensorKind::kTable:
      v.has_r = true;
      v.r = vocab_part(m.vocab, t, tr);
      v.c = whole(h);
      break;
    case TensorKind::kPos:
      v.has_r = true;
      v.r = whole(m.seq_len);
      v.c = whole(h);
      break;
    case TensorKind::kHead:
      v.has_r = true;
      v.r = whole(h);
      v.c = vocab_part(m.vocab, t, tr);
      break;
  }
  return v;
}

bool replicated_over_tp(TensorKind k) {
  switch (k) {
    case TensorKind::kNorm:
    case TensorKind::kQNorm:
    case TensorKind::kKvNorm:
    case TensorKind::kQDown:
    case TensorKind::kQDownBias:
    case TensorKind::kKvDown:
    case TensorKind::kKvDownBias:
    case TensorKind::kOutBias:
    case TensorKind::kFc2Bias:
    case TensorKind::kSfc2Bias:
    case TensorKind::kEfc2Bias:
    case TensorKind::kRouter:
    case TensorKind::kPos:
      return true;
    default:
      return false;
  }
}

bool is_expert(TensorKind k) {
  return k == TensorKind::kEfc1 || k == TensorKind::kEfc1Bias || k == TensorKind::kEfc2 ||
         k == TensorKind::kEfc2Bias;
}

// Experts are split over their own tensor-parallel group and the ep group (the expert grid).
View rank_view(const Model& m, const Plan& p, const RankCoord& c, TensorKind kind) {
  if (is_expert(kind)) return view_of(m, kind, p.expert_tp(), c.etp, p.ep, c.eep);
  return view_of(m, kind, p.tp, c.tp, p.ep, c.ep);
}

}  // namespace

std::string shape_text(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

int64_t TensorInfo::elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

TensorInfo tensor_info(const Model& model, const std::string& name) {
  const Parsed p = parse_name(model, name);
  TensorInfo t;
  t.name = name;
  t.kind = p.kind;
  t.layer = p.layer;
  t.shape = shape_of(view_of(model, p.kind, 1, 0, 1, 0), false);
  t.tp_replicated = replicated_over_tp(p.kind);
  t.expert = is_expert(p.kind);
  t.tied_copy = p.kind == TensorKind::kHead && model.tied_embeddings;
  return t;
}

bool has_tied_head_copy(const Model& model, const Plan& plan) {
  return model.tied_embeddings && plan.pp > 1;
}

std::vector<TensorInfo> model_tensors(const Model& m, bool tied_head_copy) {
  std::vector<std::string> names = {"emb.table"};
  if (m.learned_positions) names.push_back("emb.pos");
  // A layer's tensors in the order of its Program bucket: ln1, the attention block's linears
  // (each with its bias), its norms, ln2, the MLP block's linears, then the experts'.
  for (int l = 0; l < m.layers; ++l) {
    const std::string L = "L" + std::to_string(l) + ".";
    auto linears = [&](const Linears& ls) {
      for (const LinearShape& s : ls) {
        names.push_back(L + s.name);
        if (s.bias) names.push_back(L + s.name + ".b");
      }
    };
    names.push_back(L + "ln1");
    linears(attention_linears(m));
    for (const NormShape& n : attention_norms(m)) names.push_back(L + n.name);
    names.push_back(L + "ln2");
    linears(mlp_linears(m, l));
    if (m.is_moe_layer(l)) linears(expert_linears(m));
  }
  names.push_back("head.lnf");
  if (!m.tied_embeddings || tied_head_copy) names.push_back("head.head");
  std::vector<TensorInfo> out;
  out.reserve(names.size());
  for (const std::string& n : names) out.push_back(tensor_info(m, n));
  return out;
}

std::vector<int64_t> local_shape(const Model& model, const Plan& plan, const RankCoord& coord,
                                 const std::string& name) {
  return shape_of(rank_view(model, plan, coord, parse_name(model, name).kind), true);
}

std::vector<SliceRun> slice_runs(const Model& model, const Plan& plan, const RankCoord& coord,
                                 const ParamSpec& spec) {
  const View v = rank_view(model, plan, coord, parse_name(model, spec.name).kind);
  const std::vector<int64_t> want = shape_of(v, true);
  if (spec.shape != want)
    throw Error("param." + spec.name, "this rank's slice should be " + shape_text(want) + ", got " +
                                          shape_text(spec.shape));
  std::vector<SliceRun> runs;
  auto add = [&](int64_t local, int64_t full, int64_t count) {
    if (count <= 0) return;
    if (!runs.empty()) {
      SliceRun& b = runs.back();
      if (b.local_offset + b.count == local && b.full_offset + b.count == full) {
        b.count += count;
        return;
      }
    }
    runs.push_back({local, full, count});
  };
  for (const Seg& es : v.e.segs)
    for (int64_t e = 0; e < es.count; ++e)
      for (const Seg& rs : v.r.segs)
        for (int64_t r = 0; r < rs.count; ++r) {
          const int64_t lrow = (es.local + e) * v.r.local + rs.local + r;
          const int64_t frow = (es.full + e) * v.r.full + rs.full + r;
          for (const Seg& cs : v.c.segs)
            add(lrow * v.c.local + cs.local, frow * v.c.full + cs.full, cs.count);
        }
  return runs;
}

std::vector<SliceRun> clip_runs(const std::vector<SliceRun>& runs, int64_t begin, int64_t count) {
  std::vector<SliceRun> out;
  const int64_t end = begin + count;
  // First run that ends after `begin`.
  auto it = std::upper_bound(runs.begin(), runs.end(), begin, [](int64_t b, const SliceRun& r) {
    return b < r.local_offset + r.count;
  });
  for (; it != runs.end() && it->local_offset < end; ++it) {
    const int64_t lo = std::max(begin, it->local_offset);
    const int64_t hi = std::min(end, it->local_offset + it->count);
    if (hi > lo) out.push_back({lo, it->full_offset + (lo - it->local_offset), hi - lo});
  }
  return out;
}

namespace {
// Ranks of an HSDP shard group inside a data-parallel group of n (n itself without HSDP).
int shard_ranks(const Plan& plan, bool expert, int n) {
  const int k = plan.shard_degree <= 0 ? n
                : expert               ? plan.expert_shard_ranks()
                                       : plan.dense_shard_ranks();
  return k >= 1 && n % k == 0 ? k : n;
}
}  // namespace

int group_index(const Plan& plan, const RankCoord& coord, Group g) {
  const int dense = coord.cp + plan.cp * coord.dp(grid_ep(plan));
  const int expert = coord.edp;
  const int kd = shard_ranks(plan, false, plan.dp * plan.cp);
  const int ke = shard_ranks(plan, true, plan.expert_dp());
  switch (g) {
    case Group::kDpCp:
      return dense;
    case Group::kExpertDp:
      return expert;
    case Group::kDpShard:
      return dense % kd;
    case Group::kDpReplicate:
      return dense / kd;
    case Group::kExpertShard:
      return expert % ke;
    case Group::kExpertReplicate:
      return expert / ke;
    default:
      throw Error("group", std::string("'") + group_name(g) +
                               "' is not a gradient-reduction group (dp-cp, expert-dp or their "
                               "HSDP shard and replicate groups)");
  }
}

int replica_index(const Plan& plan, const RankCoord& coord, const ParamBucket& b) {
  switch (b.group) {
    case Group::kDpShard:
      return group_index(plan, coord, Group::kDpReplicate);
    case Group::kExpertShard:
      return group_index(plan, coord, Group::kExpertReplicate);
    default:
      return 0;
  }
}

FlatRange shard_range(const ParamBucket& b, int index) {
  if (index < 0 || index >= std::max(1, b.ways))
    throw Error("bucket." + b.name, "group index " + std::to_string(index) + " is not in [0, " +
                                        std::to_string(b.ways) + ")");
  if (b.zero == 0) return {0, b.elements};
  const int64_t begin = std::min(b.elements, index * b.shard);
  return {begin, std::min(b.elements, (index + 1) * b.shard)};
}

std::vector<ShardRun> shard_runs(const ParamBucket& b, int index) {
  const FlatRange r = shard_range(b, index);
  std::vector<ShardRun> out;
  int64_t spec_begin = 0;
  for (size_t s = 0; s < b.specs.size(); ++s) {
    const int64_t n = b.specs[s].elements();
    const int64_t lo = std::max(r.begin, spec_begin), hi = std::min(r.end, spec_begin + n);
    if (hi > lo) out.push_back({static_cast<int>(s), lo - spec_begin, lo - r.begin, hi - lo});
    spec_begin += n;
  }
  return out;
}

std::vector<ShardPiece> shard_pieces(const Model& model, const Plan& plan, const RankCoord& coord,
                                     const ParamBucket& b, int index) {
  std::vector<ShardPiece> out;
  int last_spec = -1;
  std::vector<SliceRun> runs;
  for (const ShardRun& sr : shard_runs(b, index)) {
    if (sr.spec != last_spec) {
      runs = slice_runs(model, plan, coord, b.specs[sr.spec]);
      last_spec = sr.spec;
    }
    for (const SliceRun& r : clip_runs(runs, sr.spec_offset, sr.count))
      out.push_back({sr.spec, r.local_offset, sr.shard_offset + (r.local_offset - sr.spec_offset),
                     r.full_offset, r.count});
  }
  return out;
}

bool counts_in_grad_norm(const Model& model, const RankCoord& coord, const std::string& name) {
  const TensorInfo t = tensor_info(model, name);
  return !t.tp_replicated || (t.expert ? coord.etp : coord.tp) == 0;
}

bool grad_norm_over_dp_cp(const Plan& plan) {
  return (plan.zero >= 1 || plan.ep > 1 || expert_grid(plan)) && plan.dp * plan.cp > 1;
}

std::vector<ShardRun> grad_norm_runs(const Model& model, const Plan& plan, const RankCoord& coord,
                                     const ParamBucket& b, int index) {
  // Whether the norm is summed over b.group's ranks: the data-parallel ranks, or (an expert
  // grid of its own) the expert data-parallel ranks, which span the stage's tp x cp x dp ranks
  // the norm is summed over (tp, and dp-cp when there are several).
  const bool summed_over_group =
      grad_norm_over_dp_cp(plan) || (b.expert && expert_grid(plan) && plan.expert_dp() > 1);
  std::vector<ShardRun> out;
  if (summed_over_group && b.zero == 0 && index != 0) return out;
  if (summed_over_group && replica_index(plan, coord, b) != 0) return out;  // HSDP replicas
  std::vector<char> counts(b.specs.size());
  for (size_t s = 0; s < b.specs.size(); ++s)
    counts[s] = counts_in_grad_norm(model, coord, b.specs[s].name);
  for (const ShardPiece& p : shard_pieces(model, plan, coord, b, index))
    if (counts[p.spec]) out.push_back({p.spec, p.spec_offset, p.shard_offset, p.count});
  return out;
}

}  // namespace parasol::runtime
