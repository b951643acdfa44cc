// The MoE dispatcher's bytes on the wire (cost_models/moe_dispatch.h).
#include "cost_models/moe_dispatch.h"

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>

namespace parasol::cost {

double dispatcher_bytes_factor(const Model& m, const Plan& p, int ep_nodes) {
  if (p.moe_dispatcher != MoeDispatcher::kDeepEp || ep_nodes < 2 || !m.is_moe()) return 1.0;
  const double n = ep_nodes, e = m.moe.experts, k = m.moe.top_k;
  if (p.moe_force_balance == MoeForceBalance::kRoundRobin) {
    // Starts t * top_k mod E repeat with period E / gcd(top_k, E), each start once per period.
    const int64_t experts = m.moe.experts, top_k = m.moe.top_k;
    const int64_t period = experts / std::gcd(top_k, experts);
    double spans = 0;
    std::vector<char> reached(static_cast<size_t>(ep_nodes));
    for (int64_t t = 0; t < period; ++t) {
      const int64_t start = t * top_k % experts;
      std::fill(reached.begin(), reached.end(), 0);
      int64_t nodes = 0;
      for (int64_t i = 0; i < top_k; ++i) {
        const int64_t node = (start + i) % experts * ep_nodes / experts;
        if (!reached[static_cast<size_t>(node)]) ++nodes;
        reached[static_cast<size_t>(node)] = 1;
      }
      spans += static_cast<double>(nodes);
    }
    return spans / static_cast<double>(period) / k;
  }
  double none = 1;
  for (int i = 0; i < m.moe.top_k; ++i) none *= std::max(0.0, (e - e / n - i) / (e - i));
  return (n - 1) * (1 - none) / (k * (n - 1) / n);
}

double expert_all_to_all_wire_bytes(const Model& m, const Plan& p, int ep_nodes, double bytes,
                                    bool forward_dispatch) {
  const double factor = dispatcher_bytes_factor(m, p, ep_nodes);
  bytes *= factor;
  if (factor != 1.0 && forward_dispatch && p.fp8_dispatch && p.precision == Dtype::kFp8)
    bytes *= 0.5;
  return bytes;
}

double expert_exchange_time(const GroupModel& gm, const Profile& prof, double wire_bytes,
                            MoeDispatcher dispatcher) {
  const double t = gm.cost(Collective::kAllToAll, wire_bytes).time_s;
  if (gm.size() < 2) return t;
  // The kind of link the group's exchange is bound by (its topology's paths, not a guess): an
  // NVLink-domain link runs at the dispatch kernels' efficiency, a network link at DeepEP-class
  // internode kernels' (NCCL's all-to-all keeps the link's).
  const LinkKind kind = gm.all_to_all_link();
  const bool nvlink = kind == LinkKind::kNvlink || kind == LinkKind::kNvswitch;
  const bool network = kind == LinkKind::kInfiniband || kind == LinkKind::kEthernet;
  double e = 0;
  if (nvlink) e = prof.expert_exchange_nvlink_efficiency;
  if (network && dispatcher == MoeDispatcher::kDeepEp)
    e = gm.nodes() == 2 && prof.expert_exchange_network_efficiency_two_servers > 0
            ? prof.expert_exchange_network_efficiency_two_servers
            : prof.expert_exchange_network_efficiency;
  if (e <= 0) return t;
  // The group's time prices those bytes at that kind's link efficiency; the kernels move them at
  // `e` instead. The efficiency scales the bandwidth term only: a latency-bound exchange keeps its
  // latency (the cost of one byte), whichever efficiency the bytes move at.
  const double latency = std::min(t, gm.cost(Collective::kAllToAll, 1).time_s);
  return latency + (t - latency) * prof.link_eff(kind) / e;
}

double allgather_dispatcher_time(const GroupModel& gm, const Model& m, const Plan& p,
                                 double a2a_bytes, bool dispatch, bool backward) {
  const double eb = dtype_bytes(p.precision == Dtype::kFp32   ? Dtype::kFp32
                                : p.precision == Dtype::kFp16 ? Dtype::kFp16
                                                              : Dtype::kBf16);
  const double pb = dtype_bytes(p.moe_probs_dtype());
  // Every rank's tokens x hidden, in the activations' dtype: the gathered buffer.
  const double hidden = a2a_bytes / std::max(1, m.moe.top_k) * gm.size();
  const double rows = hidden / (eb * static_cast<double>(m.hidden));  // tokens, all ranks
  const double probs = rows * m.moe.experts * pb;
  auto ag = [&](double b) { return gm.cost(Collective::kAllGather, b).time_s; };
  auto rs = [&](double b) { return gm.cost(Collective::kReduceScatter, b).time_s; };
  if (dispatch && !backward) return ag(rows * m.moe.experts) + ag(probs) + ag(hidden);
  if (dispatch) return rs(hidden) + rs(probs);
  return backward ? ag(hidden / eb * pb) : rs(hidden / eb * pb);
}

}  // namespace parasol::cost
