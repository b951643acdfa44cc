// Cluster: the devices and the topology graph that joins them (Boost.Graph adjacency_list).
// Vertices are GPUs, host CPUs (with host memory), NICs and switches; edges are links with a
// kind, a bandwidth per direction and a latency. GPUs are numbered 0..N-1 in the order ranks
// are placed on them (server by server). Generators and presets build DGX-style servers joined
// by fat trees or rail-optimised fabrics, and tori.
#pragma once

#include <boost/graph/adjacency_list.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/json_reader.h"

namespace parasol {

enum class NodeKind { kGpu, kCpu, kNic, kSwitch };
// kShm: shared memory between processes of one host (the CPU runtime's ranks on `localhost`).
enum class LinkKind { kNvlink, kNvswitch, kPcie, kInfiniband, kEthernet, kShm };
inline constexpr int kLinkKinds = 6;
// Every LinkKind, in enum order.
inline constexpr LinkKind kAllLinkKinds[kLinkKinds] = {LinkKind::kNvlink,   LinkKind::kNvswitch,
                                                       LinkKind::kPcie,     LinkKind::kInfiniband,
                                                       LinkKind::kEthernet, LinkKind::kShm};

const char* node_kind_name(NodeKind k);
const char* link_kind_name(LinkKind k);
LinkKind parse_link_kind(const std::string& s, const std::string& field);

struct TopoNode {
  NodeKind kind = NodeKind::kSwitch;
  std::string name;
  int server = -1;          // server (host box) index; -1 for fabric switches
  std::string device;       // kGpu: datasheet name (see device.h)
  double memory_bytes = 0;  // kCpu: host memory in bytes
  double memory_bw = 0;     // kCpu: host memory bandwidth in bytes/s (0 = not a limit)
  bool forwards = true;     // may carry traffic between other vertices (false for GPUs
                            // except in direct-connect fabrics such as tori)
};

struct TopoLink {
  LinkKind kind = LinkKind::kPcie;
  double bw = 0;       // bytes/s in each direction
  double latency = 0;  // seconds
};

using TopologyGraph =
    boost::adjacency_list<boost::vecS, boost::vecS, boost::undirectedS, TopoNode, TopoLink>;
using VertexId = TopologyGraph::vertex_descriptor;
using EdgeId = TopologyGraph::edge_descriptor;

// One hop of a path: the link and its direction. Links are full duplex and each direction has
// its own bandwidth; `forward` is true when the hop goes from the lower to the higher vertex id.
struct Hop {
  EdgeId edge;
  bool forward;
};
using Path = std::vector<Hop>;

class Cluster {
 public:
  std::string name;
  TopologyGraph graph;
  // The cluster around the GPUs that a whole job meets (cost_models/time_to_train.h). 0 = not
  // given: the cost models take their sourced defaults (cost_models/checkpoint_cost.cc,
  // cost_models/reliability.cc).
  double storage_bw = 0;  // bytes/s: aggregate write and read bandwidth of checkpoint storage
  double restart_s = 0;   // seconds from an interruption to training again (detection,
                          // rescheduling, process and communicator start; checkpoint read apart)

  // Checks the graph and indexes it: at least one GPU, known devices, positive bandwidths,
  // non-negative latencies, every GPU reachable from every other. Throws parasol::Error
  // ("cluster.links[3].bw_GBps: ..." style paths where the source is known).
  // REQUIRES: called after the graph is built and before any query below.
  void finalize();

  int num_gpus() const { return static_cast<int>(gpus_.size()); }
  int num_servers() const { return num_servers_; }
  // GPUs on the largest server.
  int gpus_per_server() const { return gpus_per_server_; }
  VertexId gpu_vertex(int gpu) const { return gpus_.at(gpu); }
  int server_of(int gpu) const { return graph[gpus_.at(gpu)].server; }
  // Datasheet of GPU `gpu` (all GPUs of a cluster share one device; see homogeneous()): the
  // figures given to set_device_spec() for its device name, else device_spec()'s.
  const DeviceSpec& gpu_device(int gpu = 0) const;
  // Replaces, for this cluster, the datasheet of the GPUs whose device is named `measured.name`
  // by `measured` (e.g. the host CPU's figures measured by `parasol calibrate --probe`).
  // Throws parasol::Error("device_spec.name") when no GPU of the cluster has that device.
  void set_device_spec(const DeviceSpec& measured);
  bool homogeneous() const { return homogeneous_; }
  // Host memory of the server of `gpu` divided by the GPUs on that server (bytes); 0 when the
  // server has no CPU vertex with memory.
  double host_memory_per_gpu(int gpu) const;
  // Bottleneck bandwidth (bytes/s per direction) between a GPU and its host memory; 0 if none.
  double host_link_bw(int gpu) const;
  // The path from a GPU to the nearest host-memory (kCpu) vertex of its server, and that vertex;
  // an empty path when the server has none.
  std::pair<Path, VertexId> host_path(int gpu) const;
  // The GPUs on the server of `gpu` (cluster indices).
  std::vector<int> gpus_on_server(int server) const;

  // Shortest path (fewest hops; only forwarding vertices in between) between two GPUs.
  // Empty when a == b. Thread-compatible: const queries may run concurrently.
  Path path(int gpu_a, int gpu_b) const;
  // Smallest link bandwidth along path(a, b), and the sum of its link latencies.
  double bottleneck_bw(int gpu_a, int gpu_b) const;
  double path_latency(int gpu_a, int gpu_b) const;

  // Distinct link kinds present, for summaries.
  std::vector<LinkKind> link_kinds() const;

 private:
  Path path_between(VertexId a, VertexId b) const;

  std::vector<VertexId> gpus_;
  std::vector<DeviceSpec> measured_devices_;  // set_device_spec()
  const DeviceSpec* datasheet_ = nullptr;     // the GPUs' datasheet when homogeneous
  int measured_index_ = -1;                   // its measured replacement, if any
  std::vector<int> gpus_on_server_;
  std::vector<double> host_memory_of_server_;
  int num_servers_ = 0;
  int gpus_per_server_ = 0;
  bool homogeneous_ = true;
};

// --- Building blocks and generators -------------------------------------------------------

// One DGX/HGX-style server type: GPUs on an NVSwitch (or none), a host CPU, one NIC per
// `gpus / nics` GPUs.
struct ServerSpec {
  std::string device = "H100-SXM";
  int gpus = 8;
  double nvlink_bw = 450e9;  // per GPU per direction into the NVSwitch; 0 = no NVSwitch
  double nvlink_latency = 1e-6;
  double pcie_bw = 64e9;  // a GPU's own PCIe link (to its switch or CPU), per direction
  double pcie_latency = 1e-6;
  int nics = 8;
  double nic_bw = 50e9;       // per NIC per direction
  double nic_latency = 2e-6;  // NIC to first switch, including the adapter
  double host_memory_bytes = 2048.0 * (1 << 30);
  // The host side: GPUs (and the NICs beside them) behind PCIe switches of `gpus_per_pcie_switch`
  // GPUs each, whose uplink to a CPU socket is `pcie_uplink_bw` (0 switches: each GPU and NIC
  // attaches to a socket directly); `sockets` CPU sockets share the host memory equally, each
  // with `host_memory_bw` bytes/s of memory bandwidth (0 = not a limit).
  int gpus_per_pcie_switch = 0;
  double pcie_uplink_bw = 0;
  int sockets = 1;
  double host_memory_bw = 0;
};

enum class FabricKind { kRailOptimized, kFatTree };

struct FabricSpec {
  FabricKind kind = FabricKind::kRailOptimized;
  int servers_per_leaf = 32;      // servers under one leaf (per rail for rail-optimised)
  double oversubscription = 1.0;  // leaf downlink / uplink capacity (1 = non-blocking)
  double switch_latency = 1e-6;   // per switch hop
};

// `servers` servers joined by the fabric (no fabric when servers == 1). With
// `last_server_gpus` > 0 the last server holds only that many of its GPUs (a job of N GPUs on
// NVLink domains that do not divide N: the last domain partly used), each in its place.
Cluster build_cluster(const std::string& name, const ServerSpec& server, int servers,
                      const FabricSpec& fabric, int last_server_gpus = 0);
// A 2D or 3D torus of GPUs with direct links (dims product = GPUs); each GPU forwards.
Cluster build_torus(const std::string& name, const std::string& device, std::vector<int> dims,
                    double link_bw, double link_latency);

// `ranks` ranks of the CPU runtime on this host (device "cpu-host"), joined by shared memory
// (see cluster_generators.cc for the figures).
Cluster build_localhost(int ranks);

// Presets taking a GPU count: dgx-a100-80g, dgx-a100-40g, dgx-h100, grand-teton-h100, dgx-h200,
// dgx-h800, dgx-b200, gb200-nvl72 (72-GPU NVLink racks), mi300x-8, mi325x-8, dgx2-v100, h200-1
// (one H200 box; gpus must be 1), localhost (N CPU-runtime ranks on this host; build_localhost).
// Tori come from the generator (JSON).
Cluster cluster_preset(const std::string& name, int gpus);
std::vector<std::string> cluster_preset_names();

// A server preset's building blocks (every preset but localhost). Throws parasol::Error
// ("cluster") naming the known ones for another name.
struct ClusterPresetSpec {
  ServerSpec server;
  FabricSpec fabric;
};
ClusterPresetSpec cluster_preset_spec(const std::string& name);
// The generator JSON of a server preset: cluster_from_json of it with N GPUs builds the same
// cluster as cluster_preset(name, N). What `parasol sweep` varies.
Json cluster_preset_generator(const std::string& name);
// The first preset (in name order) whose multi-GPU servers hold `device`; "" when none.
std::string cluster_preset_for_device(const std::string& device);

// JSON: either {"preset": NAME, "gpus": N}, a generator
// {"generator": "rail"|"fat-tree"|"torus", ...}, or an explicit graph
// {"name", "nodes": [{"id","kind","server","device","memory_GiB","forwards"}],
//  "links": [{"a","b","kind","bw_GBps","latency_us"}]}.
// `gpus` (> 0) overrides the GPU count of preset and generator forms. Every form also takes
// "storage_GBps" (Cluster::storage_bw) and "restart_s" (Cluster::restart_s).
Cluster cluster_from_json(const Json& j, int gpus = 0, const std::string& path = "cluster");
Json cluster_to_json(const Cluster& c);  // explicit graph form
// A preset name (with gpus) or a JSON file.
Cluster load_cluster(const std::string& preset_or_path, int gpus);

}  // namespace parasol
