// Parameter layout: full tensor shapes, the tensor/expert-parallel slice of each rank as runs of
// contiguous elements, and the ZeRO shard of a bucket across its specs (see param_layout.h).
#include "runtime/param_layout.h"

#include <algorithm>
#include <charconv>

#include "core/error.h"

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
  struct Entry {
    const char* name;
    TensorKind kind;
    bool bias, moe, dense;  // needs linear_bias, exists on MoE layers, on dense layers
  };
  static const Entry kEntries[] = {
      {"ln1", TensorKind::kNorm, false, true, true},
      {"ln2", TensorKind::kNorm, false, true, true},
      {"qkv", TensorKind::kQkv, false, true, true},
      {"qkv.b", TensorKind::kQkvBias, true, true, true},
      {"out", TensorKind::kOut, false, true, true},
      {"out.b", TensorKind::kOutBias, true, true, true},
      {"fc1", TensorKind::kFc1, false, false, true},
      {"fc1.b", TensorKind::kFc1Bias, true, false, true},
      {"fc2", TensorKind::kFc2, false, false, true},
      {"fc2.b", TensorKind::kFc2Bias, true, false, true},
      {"router", TensorKind::kRouter, false, true, false},
      {"efc1", TensorKind::kEfc1, false, true, false},
      {"efc1.b", TensorKind::kEfc1Bias, true, true, false},
      {"efc2", TensorKind::kEfc2, false, true, false},
      {"efc2.b", TensorKind::kEfc2Bias, true, true, false},
  };
  for (const Entry& e : kEntries) {
    if (w != e.name) continue;
    if (e.bias && !m.linear_bias) throw Error(field, "the model has no linear biases");
    const bool moe = m.is_moe_layer(layer);
    if (moe && !e.moe) throw Error(field, "layer " + std::to_string(layer) + " is an MoE layer");
    if (!moe && !e.dense) throw Error(field, "layer " + std::to_string(layer) + " is not MoE");
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
  auto up_blocks = [&](int64_t n) { return blocks(std::vector<int64_t>(up, n), t, tr); };
  View v;
  switch (kind) {
    case TensorKind::kNorm:
      v.has_r = m.norm == Norm::kLayerNorm;
      v.r = whole(v.has_r ? 2 : 1);
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
      v.r = part(q, t, tr);
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
    case TensorKind::kOutBias:
    case TensorKind::kFc2Bias:
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

View rank_view(const Model& m, const Plan& p, const RankCoord& c, TensorKind kind) {
  return view_of(m, kind, p.tp, c.tp, p.ep, c.ep);
}

std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

}  // namespace

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
  for (int l = 0; l < m.layers; ++l) {
    const std::string L = "L" + std::to_string(l) + ".";
    const bool b = m.linear_bias;
    std::vector<std::string> ws = {"ln1", "qkv"};
    if (b) ws.push_back("qkv.b");
    ws.push_back("out");
    if (b) ws.push_back("out.b");
    ws.push_back("ln2");
    if (!m.is_moe_layer(l)) {
      for (const char* w : {"fc1", "fc1.b", "fc2", "fc2.b"})
        if (b || std::string(w).find(".b") == std::string::npos) ws.push_back(w);
    } else {
      ws.push_back("router");
      for (const char* w : {"efc1", "efc1.b", "efc2", "efc2.b"})
        if (b || std::string(w).find(".b") == std::string::npos) ws.push_back(w);
    }
    for (const std::string& w : ws) names.push_back(L + w);
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
    throw Error("param." + spec.name, "this rank's slice should be " + shape_str(want) + ", got " +
                                          shape_str(spec.shape));
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
  const int dense = coord.cp + plan.cp * coord.dp(plan.ep);
  const int expert = coord.cp + plan.cp * coord.dpx;
  const int kd = shard_ranks(plan, false, plan.dp * plan.cp);
  const int ke = shard_ranks(plan, true, plan.dp / plan.ep * plan.cp);
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
  return !tensor_info(model, name).tp_replicated || coord.tp == 0;
}

std::vector<ShardRun> grad_norm_runs(const Model& model, const Plan& plan, const RankCoord& coord,
                                     const ParamBucket& b, int index) {
  const bool summed_over_dpcp = (plan.zero >= 1 || plan.ep > 1) && plan.dp * plan.cp > 1;
  std::vector<ShardRun> out;
  if (summed_over_dpcp && b.zero == 0 && index != 0) return out;
  if (summed_over_dpcp && replica_index(plan, coord, b) != 0) return out;  // HSDP replicas
  std::vector<char> counts(b.specs.size());
  for (size_t s = 0; s < b.specs.size(); ++s)
    counts[s] = counts_in_grad_norm(model, coord, b.specs[s].name);
  for (const ShardPiece& p : shard_pieces(model, plan, coord, b, index))
    if (counts[p.spec]) out.push_back({p.spec, p.spec_offset, p.shard_offset, p.count});
  return out;
}

}  // namespace parasol::runtime
