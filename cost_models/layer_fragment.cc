// A layer fragment made playable, its communication priced per placement, and its passes played
// by the Program's execution rules into a LayerPrice (layer_fragment.h).
#include "cost_models/layer_fragment.h"

#include <algorithm>
#include <unordered_map>

#include "core/error.h"

namespace parasol::cost {
namespace {

enum Category : uint8_t { kTpCat, kCpCat, kEpCat };

Category category(Group g) {
  if (g == Group::kCp || g == Group::kCpA2a || g == Group::kCpRing) return kCpCat;
  if (g == Group::kEp) return kEpCat;
  return kTpCat;
}

// Exposed seconds of `cat` in `phase` (a recomputed module's exposure counts toward the
// recompute's time).
void charge(LayerPrice& lp, int cat, Phase phase, double seconds) {
  if (phase == Phase::kRecompute) {
    lp.selective_recompute += seconds;
    return;
  }
  const bool fwd = phase == Phase::kForward;
  double* exposed[3][2] = {{&lp.tp_forward, &lp.tp_backward},
                           {&lp.cp_forward, &lp.cp_backward},
                           {&lp.ep_forward, &lp.ep_backward}};
  *exposed[cat][fwd ? 0 : 1] += seconds;
}

}  // namespace

namespace {
// Files a compute op's seconds under its MoE part, if it has one.
void add_moe_part(const Op& op, double seconds, MoeParts& parts) {
  const bool expert_act = op.role == OpRole::kExpertAct;
  const bool expert_bias = is_expert_bias_loop(op.role);
  // The grouped GEMMs with their fp8 current-scaling amax kernels (their quantisation is part of
  // the GEMMs' price: compute.h linear_gemm_time).
  if (op.kind == OpKind::kExpertLinear || op.role == OpRole::kExpertFp8Amax)
    parts.expert_gemm += seconds;
  else if (op.kind == OpKind::kDispatch || op.kind == OpKind::kCombine)
    parts.permutation += seconds;
  else if (op.kind == OpKind::kRouter || op.role == OpRole::kRouter || op.role == OpRole::kRouterDw)
    parts.routing += seconds;
  else if (expert_act)
    parts.activation += seconds;
  else if (expert_bias)
    parts.expert_bias += seconds;
  if ((op.kind == OpKind::kExpertLinear || op.role == OpRole::kExpertFp8Amax || expert_act ||
       expert_bias) &&
      op.load > 1)
    parts.imbalance += seconds * (1 - 1 / op.load);
}

// Pass `pass` played with the host cursor from host clock h0 and device clock d0 (core/
// host_issue.h, core/issue_graph.h: an op starts once issued, its dependencies and its stream
// allow; the ops of an issue group together; a sync blocks the host until it has run); returns
// the device clock at the pass's end and sets `h` to the host's. `free`/`end` are scratch of the
// fragment's size (free: as in play_layer_fragment).
double pace_pass(const PlayableFragment& f, const LayerFragment::Pass& pass,
                 const std::vector<double>& comm_seconds, double h0, double d0, double& h,
                 std::vector<double>& free, std::vector<double>& end) {
  const std::vector<PlayableFragment::Node>& nodes = f.nodes;
  h = h0;
  double pass_end = d0;
  for (int i = pass.begin; i < pass.end;) {
    const int last = nodes[i].issue_end;
    // The group's stream is free once the ops before it on it have ended (d0 at the pass's start).
    const int prev = nodes[i].stream_prev;
    const double stream = prev >= pass.begin ? free[prev] : d0;
    double at = stream;
    for (int j = i; j < last; ++j) {
      const PlayableFragment::Node& nd = nodes[j];
      h += nd.host;                                      // issued
      for (int d = nd.deps_begin; d < nd.deps_end; ++d)  // the passes before have ended
        if (f.deps[d] >= pass.begin) at = std::max(at, end[f.deps[d]]);
    }
    at = std::max(at, h);
    for (int j = i; j < last; ++j) {
      const PlayableFragment::Node& nd = nodes[j];
      if (nd.recv) continue;
      end[j] = at + (nd.comm >= 0 ? comm_seconds[nd.comm] : nd.seconds);
      if (nd.sync) h = end[j];  // the host wakes when the sync has run
    }
    for (int j = i; j < last; ++j)
      if (nodes[j].recv) end[j] = std::max(at, end[nodes[j].send]);
    for (int j = i; j < last; ++j) {
      free[j] = std::max(j > i ? free[j - 1] : stream, end[j]);
      pass_end = std::max(pass_end, end[j]);
    }
    i = last;
  }
  return pass_end;
}

// The pass's HostPace: played from the host's clock alone and from the device's alone (the map
// is max-plus linear in the two).
HostPace pass_pace(const PlayableFragment& f, const LayerFragment::Pass& pass,
                   const std::vector<double>& comm_seconds, std::vector<double>& free,
                   std::vector<double>& end) {
  HostPace m;
  m.dh = pace_pass(f, pass, comm_seconds, 0, HostPace::kNever, m.hh, free, end);
  m.dd = pace_pass(f, pass, comm_seconds, HostPace::kNever, 0, m.hd, free, end);
  return m;
}

}  // namespace

PlayableFragment make_playable(const LayerFragment& fragment, OpPricer& pricer) {
  const std::vector<Op>& ops = fragment.program.ops;
  PlayableFragment f;
  f.passes = fragment.passes;
  f.streams = static_cast<int>(fragment.program.streams.size());
  f.nodes.resize(ops.size());
  std::vector<char> in_pass(ops.size(), 0);
  for (const LayerFragment::Pass& pass : fragment.passes) {
    PARASOL_CHECK(
        0 <= pass.begin && pass.begin <= pass.end && pass.end <= static_cast<int>(ops.size()),
        "fragment pass [" + std::to_string(pass.begin) + ", " + std::to_string(pass.end) + ")");
    std::fill(in_pass.begin() + pass.begin, in_pass.begin() + pass.end, 1);
  }
  // The communication ops to price: one per shape the op pricer tells apart.
  std::unordered_map<OpShape, int, OpShapeHash> distinct;
  for (size_t i = 0; i < ops.size(); ++i) {
    const Op& op = ops[i];
    PlayableFragment::Node& n = f.nodes[i];
    n.deps_begin = static_cast<int>(f.deps.size());
    f.deps.insert(f.deps.end(), op.deps.begin(), op.deps.end());
    n.deps_end = static_cast<int>(f.deps.size());
    n.stream = static_cast<uint8_t>(op.stream);
    n.phase = static_cast<uint8_t>(op.tags.phase);
    n.flops = op.flops;
    const bool comm = is_communication(op.kind);
    if (op.kind == OpKind::kSync) {
      n.sync = true;
      if (in_pass[i]) {
        n.host = pricer.host_time(op);
        n.seconds = pricer.time(op, 0, false);
      }
      continue;
    }
    PARASOL_CHECK(comm || is_compute_kind(op.kind), "fragment op '" + op.name + "' is a copy");
    n.compute = !comm;
    if (!in_pass[i]) continue;  // outside the passes: done before they start
    n.host = pricer.host_time(op);
    if (!comm) {
      n.seconds = pricer.time(op, 0, false);
      add_moe_part(op, n.seconds, f.bytes.moe);
      continue;
    }
    n.category = category(op.group);
    LayerPrice& b = f.bytes;
    const bool fwd = op.tags.phase == Phase::kForward;
    if (op.group == Group::kTp && op.kind != OpKind::kSend && op.kind != OpKind::kRecv)
      (fwd ? b.tp_bytes_forward : b.tp_bytes_backward) += op.bytes;
    if ((op.group == Group::kCp || op.group == Group::kCpRing) && op.kind == OpKind::kSend)
      (fwd ? b.cp_bytes_forward : b.cp_bytes_backward) += op.bytes;
    if (op.group == Group::kEp && op.kind == OpKind::kAllToAll)
      (fwd ? b.ep_bytes_forward : b.ep_bytes_backward) += op.bytes;
    if (op.kind == OpKind::kRecv) {
      n.recv = true;
      continue;
    }
    auto [it, added] =
        distinct.emplace(pricer.shape(op, 0, false), static_cast<int>(f.comm_ops.size()));
    if (added) {
      Op priced = op;
      priced.name.clear();
      priced.deps = {};
      priced.reads = {};
      priced.writes = {};
      f.comm_ops.push_back(std::move(priced));
    }
    n.comm = it->second;
  }
  // Each op's dense module: the first of the layer's module weights it reads.
  f.modules = static_cast<int>(fragment.modules.size());
  std::unordered_map<int, int> module_of;
  for (size_t k = 0; k < fragment.modules.size(); ++k)
    for (int b : fragment.modules[k]) module_of.emplace(b, static_cast<int>(k));
  for (size_t i = 0; i < ops.size() && !module_of.empty(); ++i)
    for (int r : ops[i].reads)
      if (auto it = module_of.find(r); it != module_of.end()) {
        f.nodes[i].module = static_cast<int16_t>(it->second);
        break;
      }
  link_playable(f, IssueGraph(fragment.program));
  return f;
}

ModuleUseSeconds module_use_seconds(const PlayableFragment& f) {
  ModuleUseSeconds out;
  const int k = f.modules;
  out.forward.assign(static_cast<size_t>(k), 0.0);
  out.backward.assign(static_cast<size_t>(k), 0.0);
  if (k == 0) return out;
  for (const LayerFragment::Pass& pass : f.passes) {
    if (pass.begin >= pass.end) continue;
    int at = -1;  // the use reached; -1: none yet (its ops join the first)
    double before = 0;
    const bool forward =
        f.nodes[static_cast<size_t>(pass.begin)].phase == static_cast<uint8_t>(Phase::kForward);
    for (int i = pass.begin; i < pass.end; ++i) {
      const PlayableFragment::Node& n = f.nodes[static_cast<size_t>(i)];
      // Forward: modules in order; backward: in reverse (a module read again later, a norm's
      // weight in its backward after the linear's, reaches nothing new).
      if (n.module >= 0 && (at < 0 || (forward ? n.module > at : n.module < at))) at = n.module;
      if (!n.compute) continue;
      std::vector<double>& v = forward ? out.forward : out.backward;
      if (at < 0)
        before += n.seconds;
      else
        v[static_cast<size_t>(at)] += n.seconds + before, before = 0;
    }
    if (before > 0) (forward ? out.forward : out.backward)[forward ? 0 : k - 1] += before;
  }
  return out;
}

void link_playable(PlayableFragment& f, const IssueGraph& graph) {
  PARASOL_CHECK(graph.size() == static_cast<int>(f.nodes.size()),
                "a fragment's issue graph of " + std::to_string(graph.size()) + " ops for " +
                    std::to_string(f.nodes.size()) + " nodes");
  for (int i = 0; i < graph.size(); ++i) {
    PlayableFragment::Node& n = f.nodes[i];
    n.issue_end = graph.issue_end(i);
    n.stream_prev = graph.stream_prev(i);
    n.send = graph.is_recv(i) ? graph.partner(i) : -1;
  }
  for (const LayerFragment::Pass& pass : f.passes) {
    if (pass.begin == pass.end) continue;
    PARASOL_CHECK(
        graph.issue_begin(pass.begin) == pass.begin && graph.issue_end(pass.end - 1) == pass.end,
        "an issue group straddles the fragment pass [" + std::to_string(pass.begin) + ", " +
            std::to_string(pass.end) + ")");
    for (int i = pass.begin; i < pass.end; ++i)
      PARASOL_CHECK(
          !f.nodes[i].recv || (f.nodes[i].send >= 0 && f.nodes[i].send < f.nodes[i].issue_end),
          "fragment recv " + std::to_string(i) + " before its send");
  }
}

std::vector<double> communication_seconds(const PlayableFragment& f, OpPricer& pricer, int stage) {
  std::vector<double> out;
  out.reserve(f.comm_ops.size());
  for (const Op& op : f.comm_ops) out.push_back(pricer.time_once(op, stage, false));
  return out;
}

LayerPrice play_layer_fragment(const PlayableFragment& f, const std::vector<double>& comm_seconds) {
  PARASOL_CHECK(comm_seconds.size() == f.comm_ops.size(), "a price per communication op");
  const std::vector<PlayableFragment::Node>& nodes = f.nodes;
  const size_t n = nodes.size();
  auto seconds = [&](const PlayableFragment::Node& nd) {
    return nd.comm >= 0 ? comm_seconds[nd.comm] : nd.seconds;
  };
  // free[i]: when op i's stream is free after it (the latest end of it and the ops before it on
  // its stream in its pass, or the pass's start).
  std::vector<double> start(n, 0), end(n, 0), free(n, 0);
  LayerPrice lp = f.bytes;
  double comm_total[3] = {0, 0, 0}, exposed_total[3] = {0, 0, 0};
  double t0 = 0;
  for (const LayerFragment::Pass& pass : f.passes) {
    for (int i = pass.begin; i < pass.end;) {
      // The ops issued together (a p2p group's transfers, or the op alone), on one stream.
      const int last = nodes[i].issue_end;
      const int prev = nodes[i].stream_prev;
      const double stream = prev >= pass.begin ? free[prev] : t0;
      double at = stream;
      for (int j = i; j < last; ++j) {
        const PlayableFragment::Node& nd = nodes[j];
        for (int d = nd.deps_begin; d < nd.deps_end; ++d) at = std::max(at, end[f.deps[d]]);
      }
      for (int j = i; j < last; ++j) {  // sends (and any other op) first, then receives
        if (nodes[j].recv) continue;
        start[j] = at;
        end[j] = at + seconds(nodes[j]);
      }
      for (int j = i; j < last; ++j) {
        if (!nodes[j].recv) continue;
        start[j] = at;
        end[j] = std::max(at, end[nodes[j].send]);
      }
      for (int j = i; j < last; ++j) free[j] = std::max(j > i ? free[j - 1] : stream, end[j]);
      i = last;
    }
    double pass_end = t0;
    for (int i = pass.begin; i < pass.end; ++i) pass_end = std::max(pass_end, end[i]);

    // Compute, and the compute stream's idle time charged to what it waited for.
    double cursor = t0;
    for (int i = pass.begin; i < pass.end; ++i) {
      const PlayableFragment::Node& nd = nodes[i];
      const Phase phase = static_cast<Phase>(nd.phase);
      (phase == Phase::kForward     ? lp.host_forward
       : phase == Phase::kRecompute ? lp.host_recompute
                                    : lp.host_backward) += nd.host;
      if (nd.sync) {
        (phase == Phase::kForward ? lp.syncs_forward : lp.syncs_recompute) += 1;
        continue;
      }
      if (!nd.compute) {
        if (!nd.recv) comm_total[nd.category] += seconds(nd);
        continue;
      }
      const double gap = start[i] - cursor;
      if (gap > 0) {
        int waited = -1;
        for (int d = nd.deps_begin; d < nd.deps_end; ++d)
          if (waited < 0 || end[f.deps[d]] > end[waited]) waited = f.deps[d];
        PARASOL_CHECK(waited >= 0 && !nodes[waited].compute,
                      "a fragment's compute op waits on no communication");
        charge(lp, nodes[waited].category, phase, gap);
        exposed_total[nodes[waited].category] += gap;
      }
      cursor = end[i];
      switch (phase) {
        case Phase::kForward:
          lp.forward += nd.seconds;
          lp.forward_flops += nd.flops;
          break;
        case Phase::kRecompute:
          lp.selective_recompute += nd.seconds;
          lp.selective_recompute_flops += nd.flops;
          break;
        default:
          lp.backward += nd.seconds;
          break;
      }
    }
    // Communication still running when the pass's compute is done: the next layer waits for it.
    if (pass_end > cursor) {
      int last = pass.begin;
      for (int i = pass.begin; i < pass.end; ++i)
        if (end[i] > end[last]) last = i;
      charge(lp, nodes[last].category, static_cast<Phase>(nodes[last].phase), pass_end - cursor);
      exposed_total[nodes[last].category] += pass_end - cursor;
    }
    t0 = pass_end;
  }
  // The passes with the host cursor: the forward's, and the rest (the backward's) after it.
  for (const LayerFragment::Pass& pass : f.passes) {
    const HostPace m = pass_pace(f, pass, comm_seconds, free, end);
    const bool forward = pass.begin < pass.end &&
                         static_cast<Phase>(nodes[pass.begin].phase) == Phase::kForward &&
                         static_cast<Phase>(nodes[pass.end - 1].phase) == Phase::kForward;
    HostPace& into = forward ? lp.pace_forward : lp.pace_backward;
    into = into.then(m);
  }
  lp.tp_hidden = std::max(0.0, comm_total[kTpCat] - exposed_total[kTpCat]);
  lp.cp_hidden = std::max(0.0, comm_total[kCpCat] - exposed_total[kCpCat]);
  lp.ep_hidden = std::max(0.0, comm_total[kEpCat] - exposed_total[kEpCat]);
  return lp;
}

LayerPrice price_layer_fragment(const LayerFragment& fragment, OpPricer& pricer, int stage) {
  const PlayableFragment f = make_playable(fragment, pricer);
  return play_layer_fragment(f, communication_seconds(f, pricer, stage));
}

std::shared_ptr<const PlayableFragment> FragmentCache::find(const Key& key) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = map_.find(key);
  return it == map_.end() ? nullptr : it->second;
}

std::shared_ptr<const PlayableFragment> FragmentCache::insert(const Key& key,
                                                              PlayableFragment fragment) {
  auto made = std::make_shared<const PlayableFragment>(std::move(fragment));
  std::lock_guard<std::mutex> lock(mutex_);
  return map_.emplace(key, std::move(made)).first->second;
}

}  // namespace parasol::cost
