// Collective cost model: flows over topology paths with link sharing; ring, tree, hierarchical
// and pairwise (all-to-all) algorithms.
#include "cost_models/collective.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <set>

#include "core/error.h"

namespace parasol::cost {

const char* collective_name(Collective c) {
  switch (c) {
    case Collective::kAllReduce:
      return "all-reduce";
    case Collective::kAllGather:
      return "all-gather";
    case Collective::kReduceScatter:
      return "reduce-scatter";
    case Collective::kAllToAll:
      return "all-to-all";
    case Collective::kBroadcast:
      return "broadcast";
  }
  return "?";
}

const char* algorithm_name(Algorithm a) {
  switch (a) {
    case Algorithm::kRing:
      return "ring";
    case Algorithm::kTree:
      return "tree";
    case Algorithm::kHierarchical:
      return "hierarchical";
    case Algorithm::kPairwise:
      return "pairwise";
    case Algorithm::kPat:
      return "pat";
  }
  return "?";
}

std::vector<FlowRate> concurrent_flow_rates(const Cluster& cluster, const Profile& profile,
                                            const std::vector<Flow>& flows) {
  std::vector<Path> paths;
  paths.reserve(flows.size());
  std::map<std::pair<size_t, bool>, int> load;  // (edge index, direction) -> flows
  auto key = [&](const Hop& h) {
    return std::make_pair(reinterpret_cast<size_t>(h.edge.get_property()), h.forward);
  };
  for (const Flow& f : flows) {
    paths.push_back(cluster.path(f.src, f.dst));
    for (const Hop& h : paths.back()) ++load[key(h)];
  }
  std::vector<FlowRate> out;
  out.reserve(flows.size());
  for (const Path& p : paths) {
    double bw = std::numeric_limits<double>::infinity(), lat = 0;
    LinkKind bound = LinkKind::kNvswitch;
    for (const Hop& h : p) {
      const TopoLink& l = cluster.graph[h.edge];
      const double hop = l.bw * profile.link_eff(l.kind) / load[key(h)];
      if (hop < bw) bw = hop, bound = l.kind;
      lat += l.latency;
    }
    out.push_back({bw, lat, bound});
  }
  return out;
}

double p2p_software_latency(const Profile& profile, bool crosses_servers) {
  double lat = profile.collective_step_latency_s;
  if (profile.nccl) {
    const NcclTuning& t = *profile.nccl;
    const int transport = crosses_servers ? NcclTuning::kNet : NcclTuning::kNvlink;
    lat += t.base_latency_s[NcclTuning::kRing][NcclTuning::kSimple] +
           t.hw_latency_s[transport][NcclTuning::kRing][NcclTuning::kSimple];
  }
  return lat;
}

HopRate pipeline_hop(const Cluster& cluster, const Profile& profile,
                     const std::vector<Flow>& flows) {
  PARASOL_CHECK(!flows.empty(), "a pipeline hop without flows");
  if (flows[0].src == flows[0].dst) return {std::numeric_limits<double>::infinity(), 0};
  HopRate h{std::numeric_limits<double>::infinity(), 0};
  for (const FlowRate& f : concurrent_flow_rates(cluster, profile, flows)) {
    h.bw = std::min(h.bw, f.bw);
    h.latency = std::max(h.latency, f.latency);
  }
  h.latency += p2p_software_latency(
      profile, cluster.server_of(flows[0].src) != cluster.server_of(flows[0].dst));
  return h;
}

double p2p_time(const Cluster& cluster, const Profile& profile, int a, int b, double bytes) {
  if (a == b || bytes <= 0) return 0;
  FlowRate r = concurrent_flow_rates(cluster, profile, {{a, b}})[0];
  return bytes / r.bw + r.latency +
         p2p_software_latency(profile, cluster.server_of(a) != cluster.server_of(b));
}

namespace {

// The slowest flow of `own` (indices [0, own_count) of `flows`) when all flows run together:
// its bandwidth, the largest path latency (plus the profile's step latency), and the kind of
// link that bounds the slowest flow.
struct Bottleneck {
  double bw;
  double latency;
  LinkKind bound;
};
Bottleneck slowest_flow(const Cluster& c, const Profile& p, const std::vector<Flow>& flows,
                        size_t own_count) {
  if (flows.empty()) return {std::numeric_limits<double>::infinity(), 0, LinkKind::kNvswitch};
  auto rates = concurrent_flow_rates(c, p, flows);
  Bottleneck b{std::numeric_limits<double>::infinity(), 0, LinkKind::kNvswitch};
  for (size_t i = 0; i < own_count && i < rates.size(); ++i) {
    if (rates[i].bw < b.bw) b.bw = rates[i].bw, b.bound = rates[i].bound;
    b.latency = std::max(b.latency, rates[i].latency);
  }
  b.latency += p.collective_step_latency_s;
  return b;
}

std::pair<double, double> bottleneck(const Cluster& c, const Profile& p,
                                     const std::vector<Flow>& flows, size_t own_count) {
  const Bottleneck b = slowest_flow(c, p, flows, own_count);
  return {b.bw, b.latency};
}

void add_ring(std::vector<Flow>& flows, const std::vector<int>& g, size_t limit) {
  if (g.size() < 2) return;
  size_t n = std::min(g.size(), limit);
  for (size_t i = 0; i < n; ++i) flows.push_back({g[i], g[(i + 1) % g.size()]});
}

// A binary tree over the group order: each edge carries data both ways.
void add_tree(std::vector<Flow>& flows, const std::vector<int>& g, size_t limit) {
  size_t n = std::min(g.size(), limit);
  for (size_t i = 1; i < n; ++i) {
    flows.push_back({g[(i - 1) / 2], g[i]});
    flows.push_back({g[i], g[(i - 1) / 2]});
  }
}

// Step j of a pairwise all-to-all over g: member i sends to member i + j (the first `limit`).
void add_pairwise_step(std::vector<Flow>& flows, const std::vector<int>& g, int j, size_t limit) {
  const int gn = static_cast<int>(g.size());
  for (int i = 0; i < std::min<int>(gn, limit); ++i) flows.push_back({g[i], g[(i + j) % gn]});
}

// NCCL's grouped all-to-all over g: each member on `server` sends to every other member at once.
void add_grouped_sends(std::vector<Flow>& flows, const Cluster& cluster, const std::vector<int>& g,
                       int server) {
  const int gn = static_cast<int>(g.size());
  for (int i = 0; i < gn; ++i) {
    if (cluster.server_of(g[i]) != server) continue;
    for (int j = 0; j < gn; ++j)
      if (j != i) flows.push_back({g[i], g[j]});
  }
}

// The rails of a group spread over servers (server -> its members): rail i holds the i-th
// member of every server.
std::vector<std::vector<int>> rails_of(const std::map<int, std::vector<int>>& servers) {
  std::vector<std::vector<int>> rails;
  for (const auto& [s, v] : servers)
    for (size_t i = 0; i < v.size(); ++i) {
      if (rails.size() <= i) rails.resize(i + 1);
      rails[i].push_back(v[i]);
    }
  return rails;
}

// The concurrent groups that share links with the priced window of `group` (its first
// limit + 1 members): those other than it, of two or more, with one of their first limit + 1
// members on a server the window touches.
std::vector<const std::vector<int>*> nearby_groups(const Cluster& cluster,
                                                   const std::vector<int>& group,
                                                   const std::vector<std::vector<int>>& concurrent,
                                                   size_t limit) {
  std::set<int> servers;
  for (size_t i = 0; i < std::min(group.size(), limit + 1); ++i)
    servers.insert(cluster.server_of(group[i]));
  std::vector<const std::vector<int>*> siblings;
  for (const auto& g : concurrent) {
    if (g == group || g.size() < 2) continue;
    bool near = false;
    for (size_t i = 0; i < std::min(g.size(), limit + 1) && !near; ++i)
      near = servers.count(cluster.server_of(g[i])) > 0;
    if (near) siblings.push_back(&g);
  }
  return siblings;
}

}  // namespace

GroupModel::GroupModel(const Cluster& cluster, const Profile& profile, std::vector<int> group,
                       const std::vector<std::vector<int>>& concurrent, bool price_all_to_all) {
  n_ = static_cast<int>(group.size());
  if (n_ < 2) return;
  nccl_ = profile.nccl;
  find_placement(cluster, group);
  const Siblings siblings = nearby_groups(cluster, group, concurrent, kMaxPricedFlows);
  price_ring(cluster, profile, group, siblings);
  price_tree(cluster, profile, group, siblings);
  price_hierarchical(cluster, profile, group, siblings);
  price_nccl_ring();
  if (!price_all_to_all) return;
  price_pairwise(cluster, profile, group, siblings);
  if (!nccl_) return;
  price_nccl_all_to_all(cluster, profile, group, siblings);
}

void GroupModel::find_placement(const Cluster& cluster, const std::vector<int>& group) {
  std::map<int, int> per_server;
  for (int g : group) ++per_server[cluster.server_of(g)];
  nodes_ = static_cast<int>(per_server.size());
  for (const auto& [s, k] : per_server) ppn_ = std::max(ppn_, k);
  // The transport inside a server (NVLink/NVSwitch or PCIe) and the hardware latency of a
  // hop between servers, from the first such pair of the group.
  intra_transport_ = NcclTuning::kNvlink;
  bool intra_seen = false, inter_seen = false;
  for (size_t i = 0; i + 1 < group.size() && i < kMaxPricedFlows && !(intra_seen && inter_seen);
       ++i) {
    const int a = group[i], b = group[i + 1];
    if (cluster.server_of(a) == cluster.server_of(b)) {
      if (intra_seen) continue;
      intra_seen = true;
      bool nvlink = true;
      for (const Hop& h : cluster.path(a, b)) {
        LinkKind k = cluster.graph[h.edge].kind;
        nvlink = nvlink && (k == LinkKind::kNvlink || k == LinkKind::kNvswitch);
      }
      intra_transport_ = nvlink ? NcclTuning::kNvlink : NcclTuning::kPci;
    } else if (!inter_seen) {
      inter_seen = true;
      inter_path_latency_ = cluster.path_latency(a, b);
    }
  }
}

void GroupModel::price_ring(const Cluster& cluster, const Profile& profile,
                            const std::vector<int>& group, const Siblings& siblings) {
  const size_t limit = kMaxPricedFlows;
  std::vector<Flow> flows;
  add_ring(flows, group, limit);
  const size_t own = flows.size();
  for (const auto* g : siblings) add_ring(flows, *g, limit);
  std::tie(ring_bw_, ring_lat_) = bottleneck(cluster, profile, flows, own);
  // One ring step as a point-to-point exchange (context-parallel K/V rings): NCCL's send.
  ring_lat_extra_ = profile.collective_step_latency_s;
  if (nccl_) ring_lat_ += p2p_software_latency(profile, nodes_ > 1) - ring_lat_extra_;
}

void GroupModel::price_tree(const Cluster& cluster, const Profile& profile,
                            const std::vector<int>& group, const Siblings& siblings) {
  const size_t limit = kMaxPricedFlows;
  std::vector<Flow> flows;
  add_tree(flows, group, limit);
  const size_t own = flows.size();
  for (const auto* g : siblings) add_tree(flows, *g, limit);
  std::tie(tree_bw_, tree_lat_) = bottleneck(cluster, profile, flows, own);
  tree_depth_ = static_cast<int>(std::ceil(std::log2(n_ + 1.0))) - 1;
}

void GroupModel::price_hierarchical(const Cluster& cluster, const Profile& profile,
                                    const std::vector<int>& group, const Siblings& siblings) {
  const size_t limit = kMaxPricedFlows;
  std::map<int, std::vector<int>> by_server;
  for (int g : group) by_server[cluster.server_of(g)].push_back(g);
  servers_ = static_cast<int>(by_server.size());
  local_ = static_cast<int>(by_server.begin()->second.size());
  bool uniform = true;
  for (const auto& [s, v] : by_server) uniform = uniform && static_cast<int>(v.size()) == local_;
  hierarchical_ = uniform && servers_ > 1 && local_ > 1;
  if (!hierarchical_) return;
  // The concurrent groups run the same two phases at the same time: their members on each
  // server form intra rings, and their i-th members per server form rails across servers.
  std::vector<std::map<int, std::vector<int>>> sibling_servers;
  for (const auto* g : siblings) {
    sibling_servers.emplace_back();
    for (int r : *g) sibling_servers.back()[cluster.server_of(r)].push_back(r);
  }
  // Intra: a ring inside each server, all servers at once (only the first is priced).
  std::vector<Flow> flows;
  const int first_server = by_server.begin()->first;
  add_ring(flows, by_server.begin()->second, limit);
  size_t own = flows.size();
  for (const auto& sb : sibling_servers)
    if (auto it = sb.find(first_server); it != sb.end()) add_ring(flows, it->second, limit);
  std::tie(intra_bw_, intra_lat_) = bottleneck(cluster, profile, flows, own);
  // Inter: `local_` rings across servers at once (one per local index).
  flows.clear();
  std::vector<std::vector<int>> rails = rails_of(by_server);
  add_ring(flows, rails[0], limit);
  own = flows.size();
  for (int i = 1; i < local_; ++i) add_ring(flows, rails[i], limit);
  for (const auto& sb : sibling_servers)
    for (const auto& rail : rails_of(sb)) add_ring(flows, rail, limit);
  std::tie(inter_bw_, inter_lat_) = bottleneck(cluster, profile, flows, own);
}

void GroupModel::price_nccl_ring() {
  // NCCL's ring runs one channel per NIC pair: each channel's ring crosses a server boundary
  // once, through one of the server's NICs, so a ring spanning servers moves data at the
  // in-server ring's bandwidth or at all of its NICs' (shared with the concurrent rings), the
  // smaller; the rails of the hierarchical pass are exactly those NIC paths.
  nccl_ring_bw_ = hierarchical_ ? std::min(intra_bw_, inter_bw_ * local_) : ring_bw_;
  if (nccl_)
    for (Collective k : {Collective::kAllReduce, Collective::kAllGather, Collective::kReduceScatter,
                         Collective::kAllToAll, Collective::kBroadcast})
      for (int a = 0; a < 3; ++a)
        for (int p = 0; p < 3; ++p)
          nccl_lat_[static_cast<int>(k)][a][p] = compute_nccl_latency(k, a, p);
}

void GroupModel::price_pairwise(const Cluster& cluster, const Profile& profile,
                                const std::vector<int>& group, const Siblings& siblings) {
  const size_t limit = kMaxPricedFlows;
  // Pairwise all-to-all: n-1 steps; step j sends i -> i+j. Sample up to 4 steps.
  std::vector<Flow> flows;
  double total = 0, lat = 0, slowest = std::numeric_limits<double>::infinity();
  int samples = 0;
  const int steps = n_ - 1;
  const int stride = std::max(1, steps / 4);
  for (int j = 1; j <= steps; j += stride) {
    flows.clear();
    add_pairwise_step(flows, group, j, limit);
    const size_t own = flows.size();
    // Concurrent groups exchange at the same time (their step j alongside ours).
    for (const auto* g : siblings) add_pairwise_step(flows, *g, j, limit);
    const Bottleneck b = slowest_flow(cluster, profile, flows, own);
    total += 1.0 / b.bw;
    lat = std::max(lat, b.latency);
    if (b.bw < slowest) slowest = b.bw, a2a_link_ = b.bound;
    ++samples;
  }
  a2a_step_time_per_byte_ = total / samples;
  a2a_lat_ = lat;
  pairwise_ = true;
}

void GroupModel::price_nccl_all_to_all(const Cluster& cluster, const Profile& profile,
                                       const std::vector<int>& group, const Siblings& siblings) {
  // NCCL's all-to-all is one group of n - 1 sends and receives per rank, all in flight at once:
  // every rank of the first server sends bytes / n to every other member together (with the
  // concurrent groups' ranks on that server), each link direction shared by the flows on it.
  a2a_lat_ += p2p_software_latency(profile, nodes_ > 1) - ring_lat_extra_;
  const int first_server = cluster.server_of(group[0]);
  std::vector<Flow> flows;
  add_grouped_sends(flows, cluster, group, first_server);
  const size_t own = flows.size();
  for (const auto* g : siblings) add_grouped_sends(flows, cluster, *g, first_server);
  auto rates = concurrent_flow_rates(cluster, profile, flows);
  double slowest = std::numeric_limits<double>::infinity();
  for (size_t i = 0; i < own; ++i)
    if (rates[i].bw < slowest) slowest = rates[i].bw, a2a_link_ = rates[i].bound;
  a2a_grouped_per_byte_ = 1.0 / (slowest * n_);
}

double GroupModel::ring_time(Collective kind, double bytes, int n, double bw, double lat) const {
  if (n < 2 || bytes <= 0) return 0;
  const double f = static_cast<double>(n - 1) / n;
  switch (kind) {
    case Collective::kAllReduce:
      return 2 * (n - 1) * lat + 2 * f * bytes / bw;
    case Collective::kAllGather:
    case Collective::kReduceScatter:
      return (n - 1) * lat + f * bytes / bw;
    case Collective::kBroadcast:
      return (n - 1) * lat + bytes / bw;
    // A ring forwards every chunk hop by hop to its destination: the chunk for the rank d
    // steps ahead crosses d links, so each link carries (bytes / n) x (1 + ... + n-1).
    case Collective::kAllToAll:
      return (n - 1) * lat + (n - 1) / 2.0 * bytes / bw;
  }
  return 0;
}

double GroupModel::hierarchical_bandwidth_time(Collective kind, double bytes) const {
  if (!hierarchical_) return ring_time(kind, bytes, n_, ring_bw_, 0);
  const double shard = bytes / local_;
  switch (kind) {
    case Collective::kAllReduce:
      return 2 * ring_time(Collective::kReduceScatter, bytes, local_, intra_bw_, 0) +
             ring_time(Collective::kAllReduce, shard, servers_, inter_bw_, 0);
    case Collective::kAllGather:
    case Collective::kReduceScatter:
      return ring_time(kind, bytes, local_, intra_bw_, 0) +
             ring_time(kind, shard, servers_, inter_bw_, 0);
    case Collective::kBroadcast:
      return ring_time(kind, bytes, servers_, inter_bw_, 0) +
             ring_time(kind, bytes, local_, intra_bw_, 0);
    case Collective::kAllToAll:
      return std::numeric_limits<double>::infinity();
  }
  return 0;
}

double GroupModel::nccl_latency(Collective kind, int algorithm, int protocol) const {
  return nccl_lat_[static_cast<int>(kind)][algorithm][protocol];
}

double GroupModel::compute_nccl_latency(Collective kind, int algorithm, int protocol) const {
  const NcclTuning& t = *nccl_;
  const int p = protocol;
  const int n = n_, nodes = nodes_;
  // Per-step latencies inside a server and between servers; with one GPU per node NCCL uses
  // the tree's network latency; the Simple protocol adds the path's latency twice (flush).
  double intra = t.hw_latency_s[intra_transport_][algorithm == NcclTuning::kPat ? 2 : algorithm][p];
  double inter = (ppn_ == 1 ? t.hw_latency_s[NcclTuning::kNet][NcclTuning::kTree][p]
                            : t.hw_latency_s[NcclTuning::kNet][algorithm][p]) +
                 inter_path_latency_ * (p == NcclTuning::kSimple ? 2 : 1);
  double lat = t.base_latency_s[algorithm][p];
  if (algorithm == NcclTuning::kRing) {
    const int steps = kind == Collective::kAllReduce   ? 2 * (n - 1)
                      : kind == Collective::kBroadcast ? n
                                                       : n - 1;
    if (kind == Collective::kBroadcast) return lat + steps * (nodes > 1 ? inter : intra);
    const int inter_steps =
        nodes == 1 ? 0 : (kind == Collective::kAllReduce ? 2 * (nodes - 1) : nodes - 1);
    // A ring that spans nodes still pays the proxy's network overhead on every step.
    if (nodes > 1) intra = std::max(intra, t.net_overhead_s * (p == NcclTuning::kSimple ? 3 : 1));
    lat += (steps - inter_steps) * intra + inter_steps * inter;
    if (kind == Collective::kAllReduce && nodes > 1 && p == NcclTuning::kSimple)
      lat *= t.ring_allreduce_plateau;
    return lat;
  }
  if (algorithm == NcclTuning::kTree)
    return lat + 2 * ((ppn_ - 1) * intra + std::floor(std::log2(std::max(1, nodes))) * inter);
  // PAT: logarithmic in nodes, with a linear part per rank.
  return lat + std::floor(std::log2(std::max(1, nodes))) * inter / 3.5 +
         n * t.pat_per_rank_latency_s;
}

double GroupModel::nccl_time(Collective kind, double bytes, Algorithm alg) const {
  const NcclTuning& t = *nccl_;
  const double inf = std::numeric_limits<double>::infinity();
  int algorithm = NcclTuning::kRing;
  double bandwidth_time = 0;  // at Simple's full bandwidth
  switch (alg) {
    case Algorithm::kRing:
      if (kind == Collective::kAllToAll) return inf;
      bandwidth_time = ring_time(kind, bytes, n_, nccl_ring_bw_, 0);
      break;
    case Algorithm::kTree:
      if (kind != Collective::kAllReduce || nodes_ < 2) return inf;
      algorithm = NcclTuning::kTree;
      bandwidth_time = hierarchical_bandwidth_time(kind, bytes) / t.tree_efficiency;
      break;
    case Algorithm::kPat:
      if ((kind != Collective::kAllGather && kind != Collective::kReduceScatter) || ppn_ != 1 ||
          nodes_ < 2)
        return inf;
      algorithm = NcclTuning::kPat;
      bandwidth_time = ring_time(kind, bytes, n_, nccl_ring_bw_, 0) / t.pat_efficiency;
      break;
    default:
      return inf;
  }
  double best = inf;
  for (int p = 0; p < 3; ++p) {
    if (algorithm == NcclTuning::kPat && p != NcclTuning::kSimple) continue;
    double bw_time = bandwidth_time / t.protocol_efficiency[p];
    if (p == NcclTuning::kLL) {
      // LL's bus bandwidth is capped (llMaxBws by node count).
      const double cap = t.ll_max_bw[std::min(nodes_, 3) - 1];
      const double bus = nccl_ring_bw_ * t.protocol_efficiency[p];
      if (bus > cap) bw_time *= bus / cap;
    }
    const double steps = kind == Collective::kAllReduce ? 2.0 * (n_ - 1) : n_ - 1.0;
    best = std::min(best, nccl_latency(kind, algorithm, p) + bw_time + steps * ring_lat_extra_);
  }
  return best;
}

double GroupModel::time(Collective kind, double bytes, Algorithm alg) const {
  if (n_ < 2 || bytes <= 0) return 0;
  if (nccl_ && alg != Algorithm::kPairwise) return nccl_time(kind, bytes, alg);
  switch (alg) {
    case Algorithm::kRing:
      return ring_time(kind, bytes, n_, ring_bw_, ring_lat_);
    case Algorithm::kTree:
      if (kind == Collective::kAllReduce) return 2 * tree_depth_ * tree_lat_ + bytes / tree_bw_;
      if (kind == Collective::kBroadcast) return tree_depth_ * tree_lat_ + bytes / tree_bw_;
      return std::numeric_limits<double>::infinity();
    case Algorithm::kHierarchical: {
      if (!hierarchical_) return ring_time(kind, bytes, n_, ring_bw_, ring_lat_);
      double shard = bytes / local_;
      switch (kind) {
        case Collective::kAllReduce:
          return 2 * ring_time(Collective::kReduceScatter, bytes, local_, intra_bw_, intra_lat_) +
                 ring_time(Collective::kAllReduce, shard, servers_, inter_bw_, inter_lat_);
        case Collective::kAllGather:
        case Collective::kReduceScatter:
          return ring_time(kind, bytes, local_, intra_bw_, intra_lat_) +
                 ring_time(kind, shard, servers_, inter_bw_, inter_lat_);
        case Collective::kBroadcast:
          return ring_time(kind, bytes, servers_, inter_bw_, inter_lat_) +
                 ring_time(kind, bytes, local_, intra_bw_, intra_lat_);
        case Collective::kAllToAll:
          return std::numeric_limits<double>::infinity();
      }
      return 0;
    }
    case Algorithm::kPairwise:
      if (kind != Collective::kAllToAll || !pairwise_)
        return std::numeric_limits<double>::infinity();
      if (nccl_) return a2a_lat_ + bytes * a2a_grouped_per_byte_;
      return (n_ - 1) * (a2a_lat_ + bytes / n_ * a2a_step_time_per_byte_);
    case Algorithm::kPat:
      return std::numeric_limits<double>::infinity();
  }
  return 0;
}

CollectiveCost GroupModel::cost(Collective kind, double bytes) const {
  CollectiveCost best{std::numeric_limits<double>::infinity(), Algorithm::kRing};
  if (n_ < 2 || bytes <= 0) return {0, Algorithm::kRing};
  for (Algorithm a : {Algorithm::kRing, Algorithm::kTree, Algorithm::kHierarchical,
                      Algorithm::kPairwise, Algorithm::kPat}) {
    double t = time(kind, bytes, a);
    if (t < best.time_s) best = {t, a};
  }
  return best;
}

}  // namespace parasol::cost
