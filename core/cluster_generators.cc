// Cluster generators (DGX-style servers, rail-optimised and fat-tree fabrics, tori) and the
// named presets, with the datasheet source of every figure.
#include <algorithm>
#include <functional>
#include <map>

#include "core/cluster.h"
#include "core/device_family.h"
#include "core/error.h"
#include "core/sibling_presets.h"
#include "core/units.h"

namespace parasol {

namespace {
using units::GB;
using units::GiB;

VertexId add_node(Cluster& c, NodeKind kind, std::string name, int server, bool forwards,
                  std::string device = "", double memory = 0, double memory_bw = 0) {
  TopoNode n;
  n.kind = kind;
  n.name = std::move(name);
  n.server = server;
  n.forwards = forwards;
  n.device = std::move(device);
  n.memory_bytes = memory;
  n.memory_bw = memory_bw;
  return boost::add_vertex(n, c.graph);
}

void add_link(Cluster& c, VertexId a, VertexId b, LinkKind kind, double bw, double latency) {
  boost::add_edge(a, b, TopoLink{kind, bw, latency}, c.graph);
}
}  // namespace

Cluster build_cluster(const std::string& name, const ServerSpec& server, int servers,
                      const FabricSpec& fabric, int last_server_gpus) {
  if (servers < 1) throw Error("cluster.servers", "must be >= 1");
  if (server.gpus < 1) throw Error("cluster.gpus_per_server", "must be >= 1");
  PARASOL_CHECK(last_server_gpus >= 0 && last_server_gpus <= server.gpus,
                "a partly filled last server holds at most a server's GPUs");
  Cluster c;
  c.name = name;
  const std::string& dev = server.device;
  std::vector<std::vector<VertexId>> nics(servers);
  for (int s = 0; s < servers; ++s) {
    std::string p = "s" + std::to_string(s) + ".";
    // The last server may be partly filled: its GPUs keep their places (PCIe switch, rail).
    const int gpus_here = s == servers - 1 && last_server_gpus > 0 ? last_server_gpus : server.gpus;
    std::vector<VertexId> gpus;
    for (int i = 0; i < gpus_here; ++i)
      gpus.push_back(add_node(c, NodeKind::kGpu, p + "gpu" + std::to_string(i), s, false, dev));
    // CPU sockets (host memory split evenly), joined to each other.
    const int sockets = std::max(1, server.sockets);
    std::vector<VertexId> cpus;
    for (int k = 0; k < sockets; ++k)
      cpus.push_back(add_node(c, NodeKind::kCpu, p + "cpu" + (sockets > 1 ? std::to_string(k) : ""),
                              s, true, "", server.host_memory_bytes / sockets,
                              server.host_memory_bw));
    for (int k = 1; k < sockets; ++k)
      add_link(c, cpus[0], cpus[k], LinkKind::kPcie,
               server.pcie_uplink_bw > 0 ? 2 * server.pcie_uplink_bw : server.pcie_bw,
               server.pcie_latency);
    if (server.nvlink_bw > 0 && gpus_here > 1) {
      VertexId sw = add_node(c, NodeKind::kSwitch, p + "nvswitch", s, true);
      for (VertexId g : gpus)
        add_link(c, g, sw, LinkKind::kNvswitch, server.nvlink_bw, server.nvlink_latency);
    }
    // Where GPU i and NIC k attach on the PCIe side: a PCIe switch shared by
    // gpus_per_pcie_switch GPUs (uplinked to a socket), or a socket directly.
    const int per_switch = server.gpus_per_pcie_switch;
    std::vector<VertexId> pcie_switch;
    if (per_switch > 0) {
      const int switches = (server.gpus + per_switch - 1) / per_switch;
      for (int k = 0; k < switches; ++k) {
        VertexId sw = add_node(c, NodeKind::kSwitch, p + "pcie" + std::to_string(k), s, true);
        add_link(c, sw, cpus[static_cast<int64_t>(k) * sockets / switches], LinkKind::kPcie,
                 server.pcie_uplink_bw, server.pcie_latency);
        pcie_switch.push_back(sw);
      }
    }
    auto attach_point = [&](int gpu_index) {
      if (per_switch > 0) return pcie_switch[gpu_index / per_switch];
      return cpus[static_cast<int64_t>(gpu_index) * sockets / server.gpus];
    };
    for (int i = 0; i < gpus_here; ++i)
      add_link(c, gpus[i], attach_point(i), LinkKind::kPcie, server.pcie_bw, server.pcie_latency);
    if (servers > 1) {
      for (int k = 0; k < server.nics; ++k)
        nics[s].push_back(add_node(c, NodeKind::kNic, p + "nic" + std::to_string(k), s, true));
      // GPU i reaches NIC i * nics / gpus (its rail) over PCIe: beside it on its PCIe switch
      // (GPUDirect RDMA) on DGX servers. The link is modelled GPU to NIC so that each GPU keeps
      // its own rail; the estimate charges host copies for the NIC traffic that shares the
      // GPU's PCIe link (cost::Estimator).
      for (int i = 0; i < gpus_here; ++i) {
        int k = static_cast<int>(static_cast<int64_t>(i) * server.nics / server.gpus);
        add_link(c, gpus[i], nics[s][k], LinkKind::kPcie, server.pcie_bw, server.pcie_latency);
      }
    }
  }
  if (servers > 1) {
    const int per_leaf = std::max(1, fabric.servers_per_leaf);
    const int groups = (servers + per_leaf - 1) / per_leaf;
    VertexId spine = add_node(c, NodeKind::kSwitch, "spine", -1, true);
    for (int grp = 0; grp < groups; ++grp) {
      int first = grp * per_leaf, last = std::min(servers, first + per_leaf);
      int rails = fabric.kind == FabricKind::kRailOptimized ? server.nics : 1;
      for (int r = 0; r < rails; ++r) {
        std::string leaf_name =
            "leaf" + std::to_string(grp) +
            (fabric.kind == FabricKind::kRailOptimized ? ".rail" + std::to_string(r) : "");
        VertexId leaf = add_node(c, NodeKind::kSwitch, leaf_name, -1, true);
        int down_ports = 0;
        for (int s = first; s < last; ++s) {
          for (int k = 0; k < server.nics; ++k) {
            if (fabric.kind == FabricKind::kRailOptimized && k != r) continue;
            add_link(c, nics[s][k], leaf, LinkKind::kInfiniband, server.nic_bw, server.nic_latency);
            ++down_ports;
          }
        }
        // Leaf uplinks to the spine, aggregated into one link of the leaf's uplink capacity.
        add_link(c, leaf, spine, LinkKind::kInfiniband,
                 down_ports * server.nic_bw / fabric.oversubscription, fabric.switch_latency);
      }
    }
  }
  c.finalize();
  return c;
}

Cluster build_torus(const std::string& name, const std::string& device, std::vector<int> dims,
                    double link_bw, double link_latency) {
  if (dims.size() < 2 || dims.size() > 3)
    throw Error("cluster.dims", "a torus has 2 or 3 dimensions");
  device_spec(device, "cluster.device");
  Cluster c;
  c.name = name;
  int64_t product = 1;  // checked as it grows: an int product of 3 dims can overflow
  for (int d : dims) {
    if (d < 1) throw Error("cluster.dims", std::to_string(d) + " must be >= 1");
    product *= d;
    if (product > (1 << 20))
      throw Error("cluster.dims", "a torus of more than 1,048,576 GPUs is not supported");
  }
  const int n = static_cast<int>(product);
  std::vector<VertexId> g(n);
  for (int i = 0; i < n; ++i)
    g[i] = add_node(c, NodeKind::kGpu, "gpu" + std::to_string(i), i, true, device);
  std::vector<int> stride(dims.size(), 1);
  for (size_t k = 1; k < dims.size(); ++k) stride[k] = stride[k - 1] * dims[k - 1];
  for (int i = 0; i < n; ++i)
    for (size_t k = 0; k < dims.size(); ++k) {
      if (dims[k] == 1) continue;
      int coord = (i / stride[k]) % dims[k];
      int j = i + (((coord + 1) % dims[k]) - coord) * stride[k];
      if (dims[k] == 2 && coord == 1) continue;  // a ring of two is one link
      add_link(c, g[i], g[j], LinkKind::kNvlink, link_bw, link_latency);
    }
  c.finalize();
  return c;
}

Cluster build_localhost(int ranks) {
  if (ranks < 1) throw Error("gpus", "must be >= 1");
  if (ranks > 1024) throw Error("gpus", std::to_string(ranks) + " ranks on one host is too many");
  // Figures (nominal; a host's real ones come from `parasol calibrate --probe` and a fit):
  //  - shm: MPI over shared memory moves a message with one memcpy (Open MPI's vader/CMA
  //    single copy) at about half a one-thread STREAM copy's bytes/s: ~12 GB/s per direction
  //    per rank on a host with ~25 GB/s of copy bandwidth; 0.5 us per link (two links, about
  //    1 us rank to rank, the usual shared-memory MPI latency). The profile's shm efficiency
  //    covers the rest (double copies of small messages, contention).
  //  - host link (offload copies): one memcpy, ~12 GB/s.
  //  - host memory: 16 GiB per rank, as the device's nominal memory.
  constexpr double kShmBw = 12 * GB, kShmLatency = 0.5e-6, kCopyBw = 12 * GB;
  Cluster c;
  c.name = "localhost";
  std::vector<VertexId> cpu_ranks;
  for (int i = 0; i < ranks; ++i)
    cpu_ranks.push_back(
        add_node(c, NodeKind::kGpu, "rank" + std::to_string(i), 0, false, kHostCpuDevice));
  // The host's memory does not forward: ranks talk through the shm vertex only.
  VertexId host = add_node(c, NodeKind::kCpu, "host", 0, false, "", 16 * GiB * ranks);
  if (ranks > 1) {
    VertexId shm = add_node(c, NodeKind::kSwitch, "shm", 0, true);
    for (VertexId r : cpu_ranks) add_link(c, r, shm, LinkKind::kShm, kShmBw, kShmLatency);
  }
  for (VertexId r : cpu_ranks) add_link(c, r, host, LinkKind::kShm, kCopyBw, kShmLatency);
  c.finalize();
  return c;
}

namespace {

struct Preset {
  ServerSpec server;
  FabricSpec fabric;
  // Whether a GPU count that is not a whole number of servers leaves the last partly used (a
  // job on 72-GPU NVLink racks seldom fills its last one); otherwise an error.
  bool partial_last_server = false;
};

const std::map<std::string, Preset>& cluster_presets_table() {
  static const std::map<std::string, Preset> table = [] {
    std::map<std::string, Preset> t;
    // DGX A100 (NVIDIA DGX A100 datasheet; SuperPOD reference architecture): 8 A100 on
    // NVSwitch, NVLink3 600 GB/s per GPU = 300 GB/s per direction; PCIe Gen4 x16 (32 GB/s per
    // direction); 8 ConnectX-6 HDR 200 Gb/s (25 GB/s) compute NICs, one per GPU; 2 TB host
    // memory (640 GB model). SuperPOD: rail-optimised, non-blocking, 20 servers per SU.
    // Host side (DGX A100 User Guide, system topology): four PCIe Gen4 switches, each with two
    // GPUs and their two NICs, uplinked to one of two AMD EPYC 7742 sockets by Gen4 x16
    // (32 GB/s); each socket has 8 channels of DDR4-3200 (204.8 GB/s).
    Preset a100;
    a100.server = {"A100-80G", 8,    300 * GB,   1e-6, 32 * GB, 1e-6, 8,
                   25 * GB,    2e-6, 2048 * GiB, 2,    32 * GB, 2,    204.8 * GB};
    a100.fabric = {FabricKind::kRailOptimized, 20, 1.0, 0.5e-6};
    t["dgx-a100-80g"] = a100;
    Preset a100_40 = a100;
    a100_40.server.device = "A100-40G";
    a100_40.server.host_memory_bytes = 1024 * GiB;  // DGX A100 320 GB model: 1 TB
    t["dgx-a100-40g"] = a100_40;
    // DGX H100 datasheet: NVLink4 900 GB/s per GPU (450 per direction), PCIe Gen5 (64 GB/s),
    // 8 ConnectX-7 NDR 400 Gb/s (50 GB/s), 2 TB host memory; SuperPOD SU of 32 servers. Host
    // side (DGX H100 User Guide): PCIe Gen5 switches with two GPUs and their NICs each,
    // uplinked by Gen5 x16 (64 GB/s) to two Intel Xeon Platinum 8480C sockets with 8 channels
    // of DDR5-4800 each (307.2 GB/s).
    Preset h100;
    h100.server = {"H100-SXM", 8,    450 * GB,   1e-6, 64 * GB, 1e-6, 8,
                   50 * GB,    2e-6, 2048 * GiB, 2,    64 * GB, 2,    307.2 * GB};
    h100.fabric = {FabricKind::kRailOptimized, 32, 1.0, 0.5e-6};
    t["dgx-h100"] = h100;
    // Meta's Grand Teton H100 servers as torchtitan benchmarks them: 8 GPUs on NVLink
    // (900 GB/s per GPU), 400 Gb/s RDMA per GPU, HBM2e H100s at 500 W (device H100-SXM-96G-500W).
    Preset teton = h100;
    teton.server.device = "H100-SXM-96G-500W";
    t["grand-teton-h100"] = teton;
    Preset h200 = h100;  // DGX H200 datasheet: same fabric and NVLink as DGX H100.
    h200.server.device = "H200";
    t["dgx-h200"] = h200;
    // DGX B200 datasheet: NVLink5 1.8 TB/s per GPU (900 per direction), 8x 400 Gb/s,
    // 4 TB host memory; two Intel Xeon Platinum 8570 sockets, 8 channels of DDR5-5600 each
    // (358.4 GB/s).
    Preset b200 = h100;
    b200.server.device = "B200";
    b200.server.nvlink_bw = 900 * GB;
    b200.server.host_memory_bytes = 4096 * GiB;
    b200.server.host_memory_bw = 358.4 * GB;
    t["dgx-b200"] = b200;
    Preset mi300x = h100;
    mi300x.server.device = "MI300X";
    mi300x.server.nvlink_bw = 448 * GB;
    // AMD Instinct MI300X platforms: two AMD EPYC 9004 sockets, 12 channels of DDR5-4800 each
    // (460.8 GB/s); the PCIe side as DGX H100's (Gen5 switches, two GPUs each).
    mi300x.server.host_memory_bw = 460.8 * GB;
    t["mi300x-8"] = mi300x;
    // DGX H800: the DGX H100 system with H800 GPUs, whose NVLink is cut to 400 GB/s per GPU
    // (NVIDIA H800 SXM5 datasheet) = 200 GB/s per direction; the rest as DGX H100 (8x 400 Gb/s).
    Preset h800 = h100;
    h800.server.device = "H800-SXM";
    h800.server.nvlink_bw = 200 * GB;
    t["dgx-h800"] = h800;
    // AMD Instinct MI325X platform: the MI300X platform's baseboard (AMD: MI325X is a drop-in
    // upgrade of the MI300X platform; Infinity Fabric 7 links x 64 GB/s per direction per GPU)
    // with MI325X GPUs; host side as mi300x-8.
    Preset mi325x = mi300x;
    mi325x.server.device = "MI325X";
    t["mi325x-8"] = mi325x;
    // NVIDIA GB200 NVL72 (GB200 NVL72 and DGX GB200 datasheets): one 72-GPU NVLink domain per
    // rack, NVLink5 1.8 TB/s per GPU (900 GB/s per direction; 130 TB/s for 72) on NVLink
    // switch trays; 36 Grace CPUs, each joined to its two GPUs by NVLink-C2C at 900 GB/s
    // (bidirectional: 450 per direction, shared by the pair), with up to 480 GB of LPDDR5X at
    // up to 512 GB/s each (17 TB and 18.4 TB/s for the rack); 72 ConnectX-7 400 Gb/s NICs, one
    // per GPU (DGX GB200). Fabric: the DGX SuperPOD with DGX GB200's scalable unit of 8 racks
    // (576 GPUs), rail-optimised.
    Preset nvl72;
    nvl72.server = {"GB200", 72,   900 * GB,        1e-6, 450 * GB, 1e-6, 72,
                    50 * GB, 2e-6, 36 * 480.0 * GB, 2,    450 * GB, 36,   512 * GB};
    nvl72.fabric = {FabricKind::kRailOptimized, 8, 1.0, 0.5e-6};
    nvl72.partial_last_server = true;
    t["gb200-nvl72"] = nvl72;
    // NVIDIA DGX-2 (DGX-2 datasheet and User Guide): 16 V100-SXM3-32GB on 12 NVSwitches, 6
    // NVLink2 links of 25 GB/s per direction per GPU (150 GB/s; 300 GB/s bidirectional); PCIe
    // Gen3 x16 (~16 GB/s per direction) with two GPUs and a NIC per PCIe switch; 8 ConnectX-5
    // 100 Gb/s (12.5 GB/s) NICs; 1.5 TB of host memory on two Intel Xeon Platinum 8168 sockets
    // with 6 channels of DDR4-2666 each (128 GB/s). Fabric: as the DGX A100 SuperPOD's
    // rail-optimised units of 20 servers (no DGX-2 fabric figure is cited).
    Preset dgx2;
    dgx2.server = {"V100-32G", 16,   150 * GB,   1e-6, 16 * GB, 1e-6, 8,
                   12.5 * GB,  2e-6, 1536 * GiB, 2,    16 * GB, 2,    128 * GB};
    dgx2.fabric = {FabricKind::kRailOptimized, 20, 1.0, 0.5e-6};
    t["dgx2-v100"] = dgx2;
    // One H200 in a host with PCIe Gen5 and 128 GiB of memory (the box parasol's GPU checks use).
    Preset h200_1;
    h200_1.server = {"H200", 1, 0, 1e-6, 64 * GB, 1e-6, 1, 50 * GB, 2e-6, 128 * GiB, 0, 0, 1, 0};
    t["h200-1"] = h200_1;
    return t;
  }();
  return table;
}

}  // namespace

Cluster cluster_preset(const std::string& name, int gpus) {
  if (name == "localhost") return build_localhost(gpus);
  auto it = cluster_presets_table().find(name);
  if (it == cluster_presets_table().end()) {
    std::string known = "localhost";
    for (const auto& [n, _] : cluster_presets_table()) known += ", " + n;
    throw Error("cluster", "unknown preset '" + name + "' (known: " + known + ")");
  }
  if (gpus < 1) throw Error("gpus", "must be >= 1");
  if (gpus > (1 << 20)) throw Error("gpus", std::to_string(gpus) + " is more than 1,048,576");
  ServerSpec server = it->second.server;
  if (gpus > server.gpus && gpus % server.gpus != 0 && !it->second.partial_last_server)
    throw Error("gpus", std::to_string(gpus) + " is not a multiple of the " +
                            std::to_string(server.gpus) + " GPUs per server of " + name);
  if (name == "h200-1" && gpus != 1) throw Error("gpus", "h200-1 has exactly one GPU");
  int servers = 1;
  if (gpus <= server.gpus) {
    server.gpus = gpus;
  } else {
    servers = (gpus + server.gpus - 1) / server.gpus;
  }
  return build_cluster(name, server, servers, it->second.fabric,
                       servers > 1 ? gpus % server.gpus : 0);
}

ClusterPresetSpec cluster_preset_spec(const std::string& name) {
  auto it = cluster_presets_table().find(name);
  if (it == cluster_presets_table().end()) {
    std::string known;
    for (const auto& [n, _] : cluster_presets_table()) known += (known.empty() ? "" : ", ") + n;
    throw Error("cluster", "'" + name + "' is not a server preset (known: " + known + ")");
  }
  return {it->second.server, it->second.fabric};
}

Json cluster_preset_generator(const std::string& name) {
  const ClusterPresetSpec p = cluster_preset_spec(name);
  const ServerSpec& s = p.server;
  Json g{{"generator", p.fabric.kind == FabricKind::kRailOptimized ? "rail" : "fat-tree"},
         {"name", name},
         {"device", s.device},
         {"gpus_per_server", s.gpus},
         {"nvlink_GBps", s.nvlink_bw / GB},
         {"pcie_GBps", s.pcie_bw / GB},
         {"nics_per_server", s.nics},
         {"nic_GBps", s.nic_bw / GB},
         {"host_memory_GiB", s.host_memory_bytes / GiB},
         {"gpus_per_pcie_switch", s.gpus_per_pcie_switch},
         {"pcie_uplink_GBps", (s.pcie_uplink_bw > 0 ? s.pcie_uplink_bw : s.pcie_bw) / GB},
         {"sockets", s.sockets},
         {"host_memory_bw_GBps", s.host_memory_bw / GB},
         {"servers_per_leaf", p.fabric.servers_per_leaf},
         {"oversubscription", p.fabric.oversubscription},
         {"switch_latency_us", p.fabric.switch_latency * 1e6}};
  if (cluster_presets_table().at(name).partial_last_server) g["partial_last_server"] = true;
  return g;
}

std::string cluster_preset_for_device(const std::string& device) {
  for (const auto& [n, p] : cluster_presets_table())
    if (p.server.device == device && p.server.gpus > 1) return n;
  return "";
}

std::string cluster_preset_of_sibling(const std::string& device, int64_t gpus_per_server) {
  // Products of one silicon: core/device_family.h silicon_siblings.
  for (const auto& [n, p] : cluster_presets_table())
    if (p.server.gpus == gpus_per_server && silicon_siblings(device, p.server.device)) return n;
  return "";
}

std::vector<std::string> cluster_preset_names() {
  std::vector<std::string> names = {"localhost"};
  for (const auto& [n, _] : cluster_presets_table()) names.push_back(n);
  return names;
}

}  // namespace parasol
