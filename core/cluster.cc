// Cluster: graph validation, indexing, path queries and JSON I/O.
#include "core/cluster.h"

#include <algorithm>
#include <boost/graph/connected_components.hpp>
#include <cmath>
#include <deque>
#include <iterator>
#include <limits>
#include <map>
#include <set>
#include <unordered_map>

#include "core/error.h"
#include "core/units.h"

namespace parasol {

namespace {
using units::GiB;
}

const char* node_kind_name(NodeKind k) {
  switch (k) {
    case NodeKind::kGpu:
      return "gpu";
    case NodeKind::kCpu:
      return "cpu";
    case NodeKind::kNic:
      return "nic";
    case NodeKind::kSwitch:
      return "switch";
  }
  return "?";
}

const char* link_kind_name(LinkKind k) {
  switch (k) {
    case LinkKind::kNvlink:
      return "nvlink";
    case LinkKind::kNvswitch:
      return "nvswitch";
    case LinkKind::kPcie:
      return "pcie";
    case LinkKind::kInfiniband:
      return "infiniband";
    case LinkKind::kEthernet:
      return "ethernet";
    case LinkKind::kShm:
      return "shm";
  }
  return "?";
}

LinkKind parse_link_kind(const std::string& s, const std::string& field) {
  for (LinkKind k : kAllLinkKinds)
    if (s == link_kind_name(k)) return k;
  throw Error(field, "'" + s + "' is not one of nvlink|nvswitch|pcie|infiniband|ethernet|shm");
}

void Cluster::finalize() {
  gpus_.clear();
  int max_server = -1;
  std::string first_device;
  homogeneous_ = true;
  for (VertexId v : boost::make_iterator_range(boost::vertices(graph))) {
    const TopoNode& n = graph[v];
    max_server = std::max(max_server, n.server);
    if (n.kind != NodeKind::kGpu) continue;
    device_spec(n.device, "cluster.nodes." + n.name + ".device");  // throws when unknown
    if (first_device.empty()) first_device = n.device;
    homogeneous_ = homogeneous_ && n.device == first_device;
    gpus_.push_back(v);
  }
  if (gpus_.empty()) throw Error("cluster", "has no GPU");
  datasheet_ = homogeneous_ ? &device_spec(first_device) : nullptr;
  for (EdgeId e : boost::make_iterator_range(boost::edges(graph))) {
    const TopoLink& l = graph[e];
    std::string where = "cluster.links(" + graph[boost::source(e, graph)].name + "-" +
                        graph[boost::target(e, graph)].name + ")";
    if (!(l.bw > 0) || !std::isfinite(l.bw)) throw Error(where + ".bw_GBps", "must be > 0");
    if (!(l.latency >= 0) || !std::isfinite(l.latency))
      throw Error(where + ".latency_us", "must be >= 0");
  }
  // Connectivity among GPUs (through any vertices).
  std::vector<int> component(boost::num_vertices(graph));
  boost::connected_components(graph, component.data());
  for (VertexId g : gpus_)
    if (component[g] != component[gpus_[0]])
      throw Error("cluster", "graph is disconnected: GPU '" + graph[g].name +
                                 "' cannot reach GPU '" + graph[gpus_[0]].name + "'");
  // GPUs keep graph order (generators add them server by server); servers index memory.
  num_servers_ = max_server + 1;
  if (num_servers_ <= 0) num_servers_ = 1;
  gpus_on_server_.assign(num_servers_, 0);
  host_memory_of_server_.assign(num_servers_, 0.0);
  for (VertexId v : boost::make_iterator_range(boost::vertices(graph))) {
    const TopoNode& n = graph[v];
    if (n.server < 0) continue;
    if (n.kind == NodeKind::kGpu) ++gpus_on_server_[n.server];
    if (n.kind == NodeKind::kCpu) host_memory_of_server_[n.server] += n.memory_bytes;
  }
  for (VertexId g : gpus_)
    if (graph[g].server < 0)
      throw Error("cluster.nodes." + graph[g].name + ".server", "GPU needs a server index >= 0");
  gpus_per_server_ = *std::max_element(gpus_on_server_.begin(), gpus_on_server_.end());
  // Route check: every pair of GPUs must be joined by a path whose inner vertices forward (the
  // paths path() finds). Reaching GPU 0 is not enough, since GPUs do not forward: routes 1-0 and
  // 0-2 make no route 1-2. Two GPUs are joined when they are adjacent, or when a forwarding
  // neighbour of each (a forwarding GPU: itself) lies in one component of the forwarding vertices.
  const size_t n = boost::num_vertices(graph);
  std::vector<size_t> parent(n);
  for (size_t v = 0; v < n; ++v) parent[v] = v;
  auto root = [&](size_t v) {
    while (parent[v] != v) v = parent[v] = parent[parent[v]];
    return v;
  };
  for (EdgeId e : boost::make_iterator_range(boost::edges(graph))) {
    VertexId s = boost::source(e, graph), t = boost::target(e, graph);
    if (graph[s].forwards && graph[t].forwards) parent[root(s)] = root(t);
  }
  std::vector<std::vector<size_t>> entries(gpus_.size());  // components each GPU can enter
  std::vector<size_t> entered_by(n, 0);                    // GPUs that can enter a component
  for (size_t i = 0; i < gpus_.size(); ++i) {
    std::vector<size_t>& in = entries[i];
    if (graph[gpus_[i]].forwards) {
      in.push_back(root(gpus_[i]));
    } else {
      for (EdgeId e : boost::make_iterator_range(boost::out_edges(gpus_[i], graph)))
        if (graph[boost::target(e, graph)].forwards) in.push_back(root(boost::target(e, graph)));
    }
    std::sort(in.begin(), in.end());
    in.erase(std::unique(in.begin(), in.end()), in.end());
    for (size_t comp : in) ++entered_by[comp];
  }
  // Common case: one component that every GPU enters. Otherwise test the pairs.
  if (gpus_.size() > 1 &&
      std::find(entered_by.begin(), entered_by.end(), gpus_.size()) == entered_by.end()) {
    for (size_t i = 0; i < gpus_.size(); ++i)
      for (size_t j = i + 1; j < gpus_.size(); ++j) {
        std::vector<size_t> both;
        std::set_intersection(entries[i].begin(), entries[i].end(), entries[j].begin(),
                              entries[j].end(), std::back_inserter(both));
        if (both.empty() && !boost::edge(gpus_[i], gpus_[j], graph).second)
          throw Error("cluster", "GPU '" + graph[gpus_[j]].name + "' has no route to GPU '" +
                                     graph[gpus_[i]].name + "' through switches, NICs or hosts");
      }
  }
}

const DeviceSpec& Cluster::gpu_device(int gpu) const {
  if (homogeneous_ && datasheet_) {  // the common case, without a name lookup
    (void)gpus_.at(gpu);
    return measured_index_ >= 0 ? measured_devices_[measured_index_] : *datasheet_;
  }
  const DeviceSpec& datasheet = device_spec(graph[gpus_.at(gpu)].device);
  for (const DeviceSpec& d : measured_devices_)
    if (d.name == datasheet.name) return d;
  return datasheet;
}

void Cluster::set_device_spec(const DeviceSpec& measured) {
  DeviceSpec d = measured;
  d.name = device_spec(measured.name, "device_spec.name").name;  // the canonical spelling
  bool used = false;
  for (VertexId g : gpus_) used = used || device_spec(graph[g].device).name == d.name;
  if (!used)
    throw Error("device_spec.name", "'" + d.name + "' is not the device of cluster '" + name +
                                        "' (" + graph[gpus_.at(0)].device + ")");
  for (DeviceSpec& old : measured_devices_)
    if (old.name == d.name) {
      old = d;
      return;
    }
  measured_devices_.push_back(d);
  if (datasheet_ && datasheet_->name == d.name)
    measured_index_ = static_cast<int>(measured_devices_.size()) - 1;
}

double Cluster::host_memory_per_gpu(int gpu) const {
  int s = server_of(gpu);
  return gpus_on_server_[s] ? host_memory_of_server_[s] / gpus_on_server_[s] : 0.0;
}

std::pair<Path, VertexId> Cluster::host_path(int gpu) const {
  VertexId g = gpus_.at(gpu);
  std::pair<Path, VertexId> best{{}, g};
  for (VertexId v : boost::make_iterator_range(boost::vertices(graph))) {
    if (graph[v].kind != NodeKind::kCpu || graph[v].server != graph[g].server) continue;
    Path p = path_between(g, v);
    if (!p.empty() && (best.first.empty() || p.size() < best.first.size())) best = {p, v};
  }
  return best;
}

std::vector<int> Cluster::gpus_on_server(int server) const {
  std::vector<int> out;
  for (int i = 0; i < num_gpus(); ++i)
    if (server_of(i) == server) out.push_back(i);
  return out;
}

double Cluster::host_link_bw(int gpu) const {
  VertexId g = gpus_.at(gpu);
  double best = 0;
  for (VertexId v : boost::make_iterator_range(boost::vertices(graph))) {
    if (graph[v].kind != NodeKind::kCpu || graph[v].server != graph[g].server) continue;
    double bw = std::numeric_limits<double>::infinity();
    for (const Hop& h : path_between(g, v)) bw = std::min(bw, graph[h.edge].bw);
    if (std::isfinite(bw)) best = std::max(best, bw);
  }
  return best;
}

Path Cluster::path_between(VertexId a, VertexId b) const {
  // Level-synchronous bidirectional BFS: explores only the neighbourhoods of the two ends, so a
  // query costs the same on a 16-GPU and a 16,384-GPU fabric. Only forwarding vertices are
  // expanded (and may join the two halves); the ends themselves need not forward.
  Path p;
  if (a == b) return p;
  struct Reached {
    VertexId from;
    EdgeId edge;
  };
  std::unordered_map<VertexId, Reached> side[2];
  std::vector<VertexId> frontier[2] = {{a}, {b}};
  const VertexId ends[2] = {a, b};
  side[0].emplace(a, Reached{a, EdgeId{}});
  side[1].emplace(b, Reached{b, EdgeId{}});
  VertexId meet = a;
  bool found = false;
  while (!found && !frontier[0].empty() && !frontier[1].empty()) {
    const int x = frontier[0].size() <= frontier[1].size() ? 0 : 1, y = 1 - x;
    std::vector<VertexId> next;
    for (VertexId u : frontier[x]) {
      for (EdgeId e : boost::make_iterator_range(boost::out_edges(u, graph))) {
        VertexId w = boost::target(e, graph);
        if (side[x].count(w)) continue;
        side[x].emplace(w, Reached{u, e});
        if (side[y].count(w) && (w == ends[y] || graph[w].forwards)) {
          meet = w;
          found = true;
          break;
        }
        if (graph[w].forwards) next.push_back(w);
      }
      if (found) break;
    }
    frontier[x] = std::move(next);
  }
  if (!found) return p;
  for (VertexId v = meet; v != a;) {  // a ... meet
    const Reached& r = side[0].at(v);
    p.push_back({r.edge, r.from < v});
    v = r.from;
  }
  std::reverse(p.begin(), p.end());
  for (VertexId v = meet; v != b;) {  // meet ... b
    const Reached& r = side[1].at(v);
    p.push_back({r.edge, v < r.from});
    v = r.from;
  }
  return p;
}

Path Cluster::path(int gpu_a, int gpu_b) const {
  if (gpu_a == gpu_b) return {};
  return path_between(gpus_.at(gpu_a), gpus_.at(gpu_b));
}

double Cluster::bottleneck_bw(int gpu_a, int gpu_b) const {
  double bw = std::numeric_limits<double>::infinity();
  for (const Hop& h : path(gpu_a, gpu_b)) bw = std::min(bw, graph[h.edge].bw);
  return bw;
}

double Cluster::path_latency(int gpu_a, int gpu_b) const {
  double lat = 0;
  for (const Hop& h : path(gpu_a, gpu_b)) lat += graph[h.edge].latency;
  return lat;
}

std::vector<LinkKind> Cluster::link_kinds() const {
  std::set<LinkKind> kinds;
  for (EdgeId e : boost::make_iterator_range(boost::edges(graph))) kinds.insert(graph[e].kind);
  return {kinds.begin(), kinds.end()};
}

// --- JSON ----------------------------------------------------------------------------------

namespace {

Cluster explicit_graph_from_json(const JsonReader& r) {
  r.allow_only({"name", "nodes", "links", "storage_GBps", "restart_s"});
  Cluster c;
  c.name = r.string_or("name", "custom");
  std::map<std::string, VertexId> ids;
  for (const auto& [path, node] : r.array("nodes")) {
    JsonReader n(*node, path);
    n.allow_only({"id", "kind", "server", "device", "memory_GiB", "memory_bw_GBps", "forwards"});
    TopoNode t;
    t.name = n.string("id");
    if (ids.count(t.name)) throw Error(n.field("id"), "duplicate node id '" + t.name + "'");
    std::string kind = n.choice("kind", {"gpu", "cpu", "nic", "switch"}, "switch");
    t.kind = kind == "gpu"   ? NodeKind::kGpu
             : kind == "cpu" ? NodeKind::kCpu
             : kind == "nic" ? NodeKind::kNic
                             : NodeKind::kSwitch;
    t.server = static_cast<int>(n.integer_or("server", -1, -1, 1 << 24));
    if (t.kind == NodeKind::kGpu) {
      t.device = n.string("device");
      device_spec(t.device, n.field("device"));
      if (t.server < 0) throw Error(n.field("server"), "is required for a GPU");
    }
    t.memory_bytes = n.number_or("memory_GiB", 0, 0, 1e9) * GiB;
    t.memory_bw = n.number_or("memory_bw_GBps", 0, 0, 1e9) * 1e9;
    t.forwards = n.boolean_or("forwards", t.kind != NodeKind::kGpu);
    ids[t.name] = boost::add_vertex(t, c.graph);
  }
  for (const auto& [path, link] : r.array("links")) {
    JsonReader l(*link, path);
    l.allow_only({"a", "b", "kind", "bw_GBps", "latency_us"});
    std::string a = l.string("a"), b = l.string("b");
    if (!ids.count(a)) throw Error(l.field("a"), "unknown node '" + a + "'");
    if (!ids.count(b)) throw Error(l.field("b"), "unknown node '" + b + "'");
    if (a == b) throw Error(l.field("b"), "a link must join two different nodes");
    TopoLink t;
    t.kind = parse_link_kind(l.string("kind"), l.field("kind"));
    double bw = l.number("bw_GBps", 0, 1e9);
    if (!(bw > 0)) throw Error(l.field("bw_GBps"), "must be > 0, got " + l.raw("bw_GBps").dump());
    t.bw = bw * 1e9;
    t.latency = l.number_or("latency_us", 1.0, 0, 1e9) * 1e-6;
    boost::add_edge(ids[a], ids[b], t, c.graph);
  }
  c.finalize();
  return c;
}

Cluster generator_from_json(const JsonReader& r, int gpus) {
  r.allow_only({"generator",
                "name",
                "gpus",
                "device",
                "gpus_per_server",
                "nvlink_GBps",
                "pcie_GBps",
                "nics_per_server",
                "nic_GBps",
                "host_memory_GiB",
                "servers_per_leaf",
                "gpus_per_pcie_switch",
                "pcie_uplink_GBps",
                "sockets",
                "host_memory_bw_GBps",
                "oversubscription",
                "switch_latency_us",
                "partial_last_server",
                "dims",
                "link_GBps",
                "latency_us",
                "storage_GBps",
                "restart_s"});
  std::string kind = r.choice("generator", {"rail", "fat-tree", "torus"}, "rail");
  std::string name = r.string_or("name", kind);
  // A torus's dims fix its GPU count: gpus is optional there, and must agree when given.
  if (gpus <= 0 && (kind != "torus" || r.has("gpus")))
    gpus = static_cast<int>(r.integer("gpus", 1, 1 << 20));
  if (kind == "torus") {
    std::vector<int> dims;
    int64_t product = 1;
    for (const auto& [path, d] : r.array("dims")) {
      if (!d->is_number_integer() || d->get<int64_t>() < 1 || d->get<int64_t>() > 4096)
        throw Error(path, "must be an integer in [1, 4096]");
      dims.push_back(d->get<int>());
      product = std::min<int64_t>(product * dims.back(), int64_t{1} << 40);
    }
    if (gpus > 0 && gpus != product)
      throw Error(r.field("gpus"), std::to_string(gpus) + " differs from the " +
                                       std::to_string(product) + " GPUs of the torus dims");
    return build_torus(name, r.string_or("device", "H100-SXM"), dims,
                       r.number_or("link_GBps", 100, 1e-6, 1e9) * 1e9,
                       r.number_or("latency_us", 1, 0, 1e6) * 1e-6);
  }
  ServerSpec s;
  s.device = r.string_or("device", s.device);
  device_spec(s.device, r.field("device"));
  s.gpus = static_cast<int>(r.integer_or("gpus_per_server", s.gpus, 1, 1024));
  s.nvlink_bw = r.number_or("nvlink_GBps", s.nvlink_bw / 1e9, 0, 1e9) * 1e9;
  s.pcie_bw = r.number_or("pcie_GBps", s.pcie_bw / 1e9, 1e-6, 1e9) * 1e9;
  s.nics = static_cast<int>(r.integer_or("nics_per_server", s.nics, 1, 1024));
  s.nic_bw = r.number_or("nic_GBps", s.nic_bw / 1e9, 1e-6, 1e9) * 1e9;
  s.host_memory_bytes = r.number_or("host_memory_GiB", s.host_memory_bytes / GiB, 0, 1e9) * GiB;
  s.gpus_per_pcie_switch = static_cast<int>(r.integer_or("gpus_per_pcie_switch", 0, 0, 1024));
  s.pcie_uplink_bw = r.number_or("pcie_uplink_GBps", s.pcie_bw / 1e9, 1e-6, 1e9) * 1e9;
  s.sockets = static_cast<int>(r.integer_or("sockets", 1, 1, 64));
  s.host_memory_bw = r.number_or("host_memory_bw_GBps", 0, 0, 1e9) * 1e9;
  FabricSpec f;
  f.kind = kind == "rail" ? FabricKind::kRailOptimized : FabricKind::kFatTree;
  f.servers_per_leaf =
      static_cast<int>(r.integer_or("servers_per_leaf", f.servers_per_leaf, 1, 1 << 16));
  f.oversubscription = r.number_or("oversubscription", 1.0, 1.0, 1e6);
  f.switch_latency = r.number_or("switch_latency_us", f.switch_latency * 1e6, 0, 1e6) * 1e-6;
  // A GPU count that is not a whole number of servers is an error unless the last server may be
  // partly filled (a job on NVLink domains of 72 GPUs rarely fills its last one).
  const bool partial = r.boolean_or("partial_last_server", false);
  if (gpus % s.gpus != 0 && gpus > s.gpus && !partial)
    throw Error(r.field("gpus"),
                std::to_string(gpus) + " is not a multiple of gpus_per_server (" +
                    std::to_string(s.gpus) +
                    "; \"partial_last_server\": true lets the last be partly used)");
  if (gpus < s.gpus) s.gpus = gpus;
  const int servers = (gpus + s.gpus - 1) / s.gpus;
  return build_cluster(name, s, servers, f, gpus % s.gpus);
}

// The job-level figures every form of cluster JSON may carry (Cluster::storage_bw, restart_s).
Cluster with_job_figures(Cluster c, const JsonReader& r) {
  c.storage_bw = r.number_or("storage_GBps", 0, 0, 1e9) * 1e9;
  c.restart_s = r.number_or("restart_s", 0, 0, 1e7);
  return c;
}
}  // namespace

Cluster cluster_from_json(const Json& j, int gpus, const std::string& path) {
  JsonReader r(j, path);
  if (r.has("preset")) {
    r.allow_only({"preset", "gpus", "storage_GBps", "restart_s"});
    int n = gpus > 0 ? gpus : static_cast<int>(r.integer("gpus", 1, 1 << 20));
    return with_job_figures(cluster_preset(r.string("preset"), n), r);
  }
  if (r.has("generator")) return with_job_figures(generator_from_json(r, gpus), r);
  Cluster c = with_job_figures(explicit_graph_from_json(r), r);
  if (gpus > 0 && gpus != c.num_gpus())
    throw Error("gpus", std::to_string(gpus) + " differs from the " + std::to_string(c.num_gpus()) +
                            " GPUs of the cluster file");
  return c;
}

Json cluster_to_json(const Cluster& c) {
  Json nodes = Json::array(), links = Json::array();
  const auto& g = c.graph;
  for (VertexId v : boost::make_iterator_range(boost::vertices(g))) {
    const TopoNode& n = g[v];
    Json jn = {{"id", n.name}, {"kind", node_kind_name(n.kind)}};
    if (n.server >= 0) jn["server"] = n.server;
    if (n.kind == NodeKind::kGpu) jn["device"] = n.device;
    if (n.memory_bytes > 0) jn["memory_GiB"] = n.memory_bytes / GiB;
    if (n.memory_bw > 0) jn["memory_bw_GBps"] = n.memory_bw / 1e9;
    if (n.forwards != (n.kind != NodeKind::kGpu)) jn["forwards"] = n.forwards;
    nodes.push_back(jn);
  }
  for (EdgeId e : boost::make_iterator_range(boost::edges(g))) {
    const TopoLink& l = g[e];
    links.push_back({{"a", g[boost::source(e, g)].name},
                     {"b", g[boost::target(e, g)].name},
                     {"kind", link_kind_name(l.kind)},
                     {"bw_GBps", l.bw / 1e9},
                     {"latency_us", l.latency * 1e6}});
  }
  Json j = {{"name", c.name}, {"nodes", nodes}, {"links", links}};
  if (c.storage_bw > 0) j["storage_GBps"] = c.storage_bw / 1e9;
  if (c.restart_s > 0) j["restart_s"] = c.restart_s;
  return j;
}

Cluster load_cluster(const std::string& preset_or_path, int gpus) {
  if (is_existing_file(preset_or_path))
    return cluster_from_json(read_json_file(preset_or_path), gpus);
  if (preset_or_path.find('/') != std::string::npos || preset_or_path.ends_with(".json"))
    throw Error("cluster", "no such file '" + preset_or_path + "'");
  if (gpus <= 0) throw Error("gpus", "is required with a cluster preset (--gpus N)");
  return cluster_preset(preset_or_path, gpus);
}

}  // namespace parasol
