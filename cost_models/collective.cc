// Collective cost model: flows over topology paths with link sharing; ring, tree, hierarchical
// and pairwise (all-to-all) algorithms.
#include "cost_models/collective.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <set>

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
    for (const Hop& h : p) {
      const TopoLink& l = cluster.graph[h.edge];
      bw = std::min(bw, l.bw * profile.link_eff(l.kind) / load[key(h)]);
      lat += l.latency;
    }
    out.push_back({bw, lat});
  }
  return out;
}

double p2p_time(const Cluster& cluster, const Profile& profile, int a, int b, double bytes) {
  if (a == b || bytes <= 0) return 0;
  FlowRate r = concurrent_flow_rates(cluster, profile, {{a, b}})[0];
  return bytes / r.bw + r.latency + profile.collective_step_latency_s;
}

namespace {

// The slowest flow of `own` (indices [0, own_count) of `flows`) when all flows run together.
std::pair<double, double> bottleneck(const Cluster& c, const Profile& p,
                                     const std::vector<Flow>& flows, size_t own_count) {
  if (flows.empty()) return {std::numeric_limits<double>::infinity(), 0};
  auto rates = concurrent_flow_rates(c, p, flows);
  double bw = std::numeric_limits<double>::infinity(), lat = 0;
  for (size_t i = 0; i < own_count && i < rates.size(); ++i) {
    bw = std::min(bw, rates[i].bw);
    lat = std::max(lat, rates[i].latency);
  }
  return {bw, lat + p.collective_step_latency_s};
}

void add_ring(std::vector<Flow>& flows, const std::vector<int>& g, size_t limit) {
  if (g.size() < 2) return;
  size_t n = std::min(g.size(), limit);
  for (size_t i = 0; i < n; ++i) flows.push_back({g[i], g[(i + 1) % g.size()]});
}

}  // namespace

GroupModel::GroupModel(const Cluster& cluster, const Profile& profile, std::vector<int> group,
                       const std::vector<std::vector<int>>& concurrent, bool price_all_to_all) {
  n_ = static_cast<int>(group.size());
  if (n_ < 2) return;
  const size_t limit = kMaxPricedFlows;
  // Servers touched by the priced window of this group.
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

  // Ring.
  std::vector<Flow> flows;
  add_ring(flows, group, limit);
  size_t own = flows.size();
  for (const auto* g : siblings) add_ring(flows, *g, limit);
  std::tie(ring_bw_, ring_lat_) = bottleneck(cluster, profile, flows, own);

  // Binary tree over the group order: each edge carries data both ways.
  flows.clear();
  auto add_tree = [&](const std::vector<int>& g) {
    size_t n = std::min(g.size(), limit);
    for (size_t i = 1; i < n; ++i) {
      flows.push_back({g[(i - 1) / 2], g[i]});
      flows.push_back({g[i], g[(i - 1) / 2]});
    }
  };
  add_tree(group);
  own = flows.size();
  for (const auto* g : siblings) add_tree(*g);
  std::tie(tree_bw_, tree_lat_) = bottleneck(cluster, profile, flows, own);
  tree_depth_ = static_cast<int>(std::ceil(std::log2(n_ + 1.0))) - 1;

  // Hierarchical: GPUs per server inside the group, then one ring per local index.
  std::map<int, std::vector<int>> by_server;
  for (int g : group) by_server[cluster.server_of(g)].push_back(g);
  servers_ = static_cast<int>(by_server.size());
  local_ = static_cast<int>(by_server.begin()->second.size());
  bool uniform = true;
  for (const auto& [s, v] : by_server) uniform = uniform && static_cast<int>(v.size()) == local_;
  hierarchical_ = uniform && servers_ > 1 && local_ > 1;
  if (hierarchical_) {
    // The concurrent groups run the same two phases at the same time: their members on each
    // server form intra rings, and their i-th members per server form rails across servers.
    std::vector<std::map<int, std::vector<int>>> sibling_servers;
    for (const auto* g : siblings) {
      sibling_servers.emplace_back();
      for (int r : *g) sibling_servers.back()[cluster.server_of(r)].push_back(r);
    }
    // Intra: a ring inside each server, all servers at once (only the first is priced).
    flows.clear();
    const int first_server = by_server.begin()->first;
    add_ring(flows, by_server.begin()->second, limit);
    own = flows.size();
    for (const auto& sb : sibling_servers)
      if (auto it = sb.find(first_server); it != sb.end()) add_ring(flows, it->second, limit);
    std::tie(intra_bw_, intra_lat_) = bottleneck(cluster, profile, flows, own);
    // Inter: `local_` rings across servers at once (one per local index).
    auto rails_of = [](const std::map<int, std::vector<int>>& servers) {
      std::vector<std::vector<int>> rails;
      for (const auto& [s, v] : servers)
        for (size_t i = 0; i < v.size(); ++i) {
          if (rails.size() <= i) rails.resize(i + 1);
          rails[i].push_back(v[i]);
        }
      return rails;
    };
    flows.clear();
    std::vector<std::vector<int>> rails = rails_of(by_server);
    add_ring(flows, rails[0], limit);
    own = flows.size();
    for (int i = 1; i < local_; ++i) add_ring(flows, rails[i], limit);
    for (const auto& sb : sibling_servers)
      for (const auto& rail : rails_of(sb)) add_ring(flows, rail, limit);
    std::tie(inter_bw_, inter_lat_) = bottleneck(cluster, profile, flows, own);
  }

  if (!price_all_to_all) return;
  // Pairwise all-to-all: n-1 steps; step j sends i -> i+j. Sample up to 4 steps.
  double total = 0, lat = 0;
  int samples = 0;
  const int steps = n_ - 1;
  const int stride = std::max(1, steps / 4);
  for (int j = 1; j <= steps; j += stride) {
    flows.clear();
    for (int i = 0; i < std::min<int>(n_, limit); ++i)
      flows.push_back({group[i], group[(i + j) % n_]});
    own = flows.size();
    // Concurrent groups exchange at the same time (their step j alongside ours).
    for (const auto* g : siblings) {
      const int gn = static_cast<int>(g->size());
      for (int i = 0; i < std::min<int>(gn, limit); ++i)
        flows.push_back({(*g)[i], (*g)[(i + j) % gn]});
    }
    auto [bw, l] = bottleneck(cluster, profile, flows, own);
    total += 1.0 / bw;
    lat = std::max(lat, l);
    ++samples;
  }
  a2a_step_time_per_byte_ = total / samples;
  a2a_lat_ = lat;
  pairwise_ = true;
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

double GroupModel::time(Collective kind, double bytes, Algorithm alg) const {
  if (n_ < 2 || bytes <= 0) return 0;
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
      return (n_ - 1) * (a2a_lat_ + bytes / n_ * a2a_step_time_per_byte_);
  }
  return 0;
}

CollectiveCost GroupModel::cost(Collective kind, double bytes) const {
  CollectiveCost best{std::numeric_limits<double>::infinity(), Algorithm::kRing};
  if (n_ < 2 || bytes <= 0) return {0, Algorithm::kRing};
  for (Algorithm a :
       {Algorithm::kRing, Algorithm::kTree, Algorithm::kHierarchical, Algorithm::kPairwise}) {
    double t = time(kind, bytes, a);
    if (t < best.time_s) best = {t, a};
  }
  return best;
}

}  // namespace parasol::cost
