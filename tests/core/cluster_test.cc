// Tests core/cluster.h and device.h: presets, generators, explicit graphs, paths, JSON, errors.
#include "core/cluster.h"

#include <gtest/gtest.h>

#include <cmath>
#include <set>
#include <string>

#include "core/device.h"
#include "core/error.h"
#include "tests/core/expect_error.h"

namespace parasol {
namespace {

constexpr double GiB = 1024.0 * 1024.0 * 1024.0;

// Checks that path(a, b) is a walk from GPU a to GPU b over existing edges, that each hop's
// `forward` flag matches its direction, and that every vertex in between forwards traffic.
void ExpectValidPath(const Cluster& c, int a, int b) {
  SCOPED_TRACE("path " + std::to_string(a) + " -> " + std::to_string(b));
  const Path p = c.path(a, b);
  ASSERT_FALSE(p.empty());
  VertexId v = c.gpu_vertex(a);
  for (size_t i = 0; i < p.size(); ++i) {
    VertexId s = boost::source(p[i].edge, c.graph), t = boost::target(p[i].edge, c.graph);
    ASSERT_TRUE(s == v || t == v) << "hop " << i << " does not start where the last ended";
    VertexId next = s == v ? t : s;
    EXPECT_EQ(p[i].forward, v < next) << "hop " << i;
    if (i + 1 < p.size()) {
      EXPECT_TRUE(c.graph[next].forwards) << c.graph[next].name;
    }
    v = next;
  }
  EXPECT_EQ(v, c.gpu_vertex(b));
}

std::set<LinkKind> kinds_on_path(const Cluster& c, int a, int b) {
  std::set<LinkKind> k;
  for (const Hop& h : c.path(a, b)) k.insert(c.graph[h.edge].kind);
  return k;
}

// --- Presets -----------------------------------------------------------------------------------

TEST(ClusterPreset, DgxA100TwoServers) {
  Cluster c = cluster_preset("dgx-a100-80g", 16);
  EXPECT_EQ(c.num_gpus(), 16);
  EXPECT_EQ(c.num_servers(), 2);
  EXPECT_EQ(c.gpus_per_server(), 8);
  EXPECT_EQ(c.server_of(0), 0);
  EXPECT_EQ(c.server_of(7), 0);
  EXPECT_EQ(c.server_of(8), 1);
  EXPECT_EQ(c.server_of(9), 1);
  EXPECT_TRUE(c.homogeneous());
  EXPECT_EQ(c.gpu_device(0).name, "A100-80G");
  EXPECT_EQ(c.gpu_device(15).hbm_bytes, 81920.0 * 1024 * 1024);  // nvidia-smi: 81920 MiB

  // Same server: GPU -> NVSwitch -> GPU at NVLink3's 300 GB/s per direction.
  EXPECT_EQ(c.path(0, 1).size(), 2u);
  EXPECT_EQ(kinds_on_path(c, 0, 1), std::set<LinkKind>{LinkKind::kNvswitch});
  EXPECT_DOUBLE_EQ(c.bottleneck_bw(0, 1), 300e9);
  EXPECT_DOUBLE_EQ(c.path_latency(0, 1), 2e-6);  // two 1 us NVLink hops

  // Across servers: the 200 Gb/s HDR NIC (25 GB/s) is the bottleneck, over InfiniBand.
  EXPECT_TRUE(kinds_on_path(c, 0, 9).count(LinkKind::kInfiniband));
  EXPECT_FALSE(kinds_on_path(c, 0, 9).count(LinkKind::kNvswitch));
  EXPECT_DOUBLE_EQ(c.bottleneck_bw(0, 9), 25e9);
  EXPECT_GT(c.path_latency(0, 9), 0);
  EXPECT_GT(c.path_latency(0, 9), c.path_latency(0, 1));

  for (int a = 0; a < 16; ++a)
    for (int b = 0; b < 16; ++b) {
      if (a == b) continue;
      ExpectValidPath(c, a, b);
      EXPECT_EQ(c.bottleneck_bw(a, b), c.bottleneck_bw(b, a));
      EXPECT_DOUBLE_EQ(c.path_latency(a, b), c.path_latency(b, a));
      EXPECT_DOUBLE_EQ(c.bottleneck_bw(a, b), c.server_of(a) == c.server_of(b) ? 300e9 : 25e9);
    }

  // 2 TB of host memory shared by 8 GPUs, reached over PCIe Gen4 (32 GB/s).
  EXPECT_DOUBLE_EQ(c.host_memory_per_gpu(3), 2048 * GiB / 8);
  EXPECT_DOUBLE_EQ(c.host_link_bw(3), 32e9);
}

TEST(ClusterPreset, RailOptimisedFabric) {
  // DGX H100: GPU i of every server sits on rail i; same-rail traffic stays on the rail's leaf,
  // cross-rail traffic climbs to the spine.
  Cluster c = cluster_preset("dgx-h100", 16);
  EXPECT_EQ(c.path(0, 8).size(), 4u);             // gpu - nic - leaf - nic - gpu
  EXPECT_EQ(c.path(0, 9).size(), 6u);             // gpu - nic - leaf - spine - leaf - nic - gpu
  EXPECT_DOUBLE_EQ(c.bottleneck_bw(0, 8), 50e9);  // 400 Gb/s NDR
  EXPECT_DOUBLE_EQ(c.bottleneck_bw(0, 1), 450e9);
  EXPECT_LT(c.path_latency(0, 8), c.path_latency(0, 9));
}

TEST(ClusterPreset, SingleH200) {
  Cluster c = cluster_preset("h200-1", 1);
  EXPECT_EQ(c.num_gpus(), 1);
  EXPECT_EQ(c.num_servers(), 1);
  EXPECT_EQ(c.gpus_per_server(), 1);
  EXPECT_EQ(c.gpu_device(0).name, "H200");
  EXPECT_DOUBLE_EQ(c.gpu_device(0).hbm_bytes, 143771.0 * 1024 * 1024);  // nvidia-smi: 143771 MiB
  EXPECT_DOUBLE_EQ(c.host_memory_per_gpu(0), 128 * GiB);
  EXPECT_DOUBLE_EQ(c.host_link_bw(0), 64e9);
  ExpectError([] { cluster_preset("h200-1", 2); }, "gpus", "exactly one GPU");
}

// GB200 NVL72: a rack of 72 GPUs on one NVLink domain (900 GB/s per direction), each pair on a
// Grace CPU's NVLink-C2C (450 GB/s per direction), one 400 Gb/s NIC per GPU between racks; a GPU
// count that does not fill the last rack leaves it partly used.
TEST(ClusterPreset, Gb200Nvl72IsOneNvlinkDomainOf72Gpus) {
  Cluster c = cluster_preset("gb200-nvl72", 144);
  EXPECT_EQ(c.num_servers(), 2);
  EXPECT_EQ(c.gpus_per_server(), 72);
  EXPECT_EQ(c.gpu_device(0).name, "GB200");
  EXPECT_DOUBLE_EQ(c.gpu_device(0).peak_flops(Dtype::kBf16), 2.5e15);
  EXPECT_DOUBLE_EQ(c.gpu_device(0).peak_flops(Dtype::kFp8), 5e15);
  EXPECT_DOUBLE_EQ(c.gpu_device(0).hbm_bytes, 189471.0 * 1024 * 1024);  // nvidia-smi: 189471 MiB
  EXPECT_DOUBLE_EQ(c.bottleneck_bw(0, 71), 900e9);
  EXPECT_EQ(kinds_on_path(c, 0, 71), std::set<LinkKind>{LinkKind::kNvswitch});
  EXPECT_DOUBLE_EQ(c.bottleneck_bw(0, 72), 50e9);
  EXPECT_DOUBLE_EQ(c.host_link_bw(5), 450e9);
  EXPECT_DOUBLE_EQ(c.host_memory_per_gpu(5), 240e9);  // a Grace's 480 GB for its two GPUs
  Cluster part = cluster_preset("gb200-nvl72", 128);
  EXPECT_EQ(part.num_gpus(), 128);
  EXPECT_EQ(part.num_servers(), 2);
  EXPECT_EQ(part.gpus_on_server(1).size(), 56u);
  EXPECT_DOUBLE_EQ(part.bottleneck_bw(72, 127), 900e9);
  // The generator form is the preset, partly used last rack included.
  EXPECT_EQ(cluster_to_json(cluster_from_json(cluster_preset_generator("gb200-nvl72"), 128)),
            cluster_to_json(part));
}

TEST(ClusterPreset, H800Mi325xAndDgx2FromTheirDatasheets) {
  Cluster h800 = cluster_preset("dgx-h800", 16);
  EXPECT_EQ(h800.gpu_device(0).name, "H800-SXM");
  EXPECT_DOUBLE_EQ(h800.gpu_device(0).peak_flops(Dtype::kBf16),
                   device_spec("H100-SXM").peak_flops(Dtype::kBf16));
  EXPECT_DOUBLE_EQ(h800.bottleneck_bw(0, 1), 200e9);  // 400 GB/s NVLink, per direction
  EXPECT_DOUBLE_EQ(h800.bottleneck_bw(0, 8), 50e9);
  Cluster mi325x = cluster_preset("mi325x-8", 8);
  EXPECT_EQ(mi325x.gpu_device(0).name, "MI325X");
  EXPECT_DOUBLE_EQ(mi325x.gpu_device(0).hbm_bytes, 256 * GiB - 16.0 * 1024 * 1024);
  EXPECT_DOUBLE_EQ(mi325x.gpu_device(0).hbm_bw, 6e12);
  EXPECT_DOUBLE_EQ(mi325x.bottleneck_bw(0, 7), cluster_preset("mi300x-8", 8).bottleneck_bw(0, 7));
  Cluster dgx2 = cluster_preset("dgx2-v100", 32);
  EXPECT_EQ(dgx2.gpus_per_server(), 16);
  EXPECT_EQ(dgx2.gpu_device(0).name, "V100-32G");
  EXPECT_DOUBLE_EQ(dgx2.gpu_device(0).peak_flops(Dtype::kFp16), 125e12);
  EXPECT_DOUBLE_EQ(dgx2.gpu_device(0).peak_flops(Dtype::kFp8), 125e12);   // no fp8: fp16's
  EXPECT_DOUBLE_EQ(dgx2.gpu_device(0).hbm_bytes, 32768.0 * 1024 * 1024);  // nvidia-smi: 32768 MiB
  EXPECT_DOUBLE_EQ(dgx2.bottleneck_bw(0, 15), 150e9);
  EXPECT_DOUBLE_EQ(dgx2.bottleneck_bw(0, 16), 12.5e9);
  EXPECT_DOUBLE_EQ(dgx2.host_link_bw(0), 16e9);
  ExpectError([] { cluster_preset("dgx2-v100", 24); }, "gpus", "not a multiple of the 16");
}

TEST(ClusterPreset, SmallerThanOneServer) {
  Cluster c = cluster_preset("dgx-h100", 4);
  EXPECT_EQ(c.num_gpus(), 4);
  EXPECT_EQ(c.num_servers(), 1);
  EXPECT_EQ(c.gpus_per_server(), 4);
  EXPECT_DOUBLE_EQ(c.bottleneck_bw(0, 3), 450e9);
}

TEST(ClusterPreset, EveryPresetBuilds) {
  for (const std::string& name : cluster_preset_names()) {
    SCOPED_TRACE(name);
    int gpus = name == "h200-1" ? 1 : 16;
    Cluster c = cluster_preset(name, gpus);
    EXPECT_EQ(c.num_gpus(), gpus);
    for (int b = 1; b < gpus; ++b) ExpectValidPath(c, 0, b);
  }
}

TEST(ClusterPreset, Rejections) {
  ExpectError([] { cluster_preset("dgx-h100", 12); }, "gpus", "not a multiple");
  ExpectError([] { cluster_preset("dgx-h100", 0); }, "gpus", ">= 1");
  ExpectError([] { cluster_preset("dgx-h100", (1 << 20) + 8); }, "gpus", "more than");
  ExpectError([] { cluster_preset("dgx-v100", 8); }, "cluster", "unknown preset 'dgx-v100'");
  ExpectError([] { load_cluster("dgx-h100", 0); }, "gpus", "is required");
  ExpectError([] { load_cluster("/nonexistent/cluster.json", 8); }, "cluster", "no such file");
}

TEST(ClusterPreset, LocalhostIsRanksOnSharedMemory) {
  Cluster c = cluster_preset("localhost", 4);
  EXPECT_EQ(c.num_gpus(), 4);
  EXPECT_EQ(c.num_servers(), 1);
  EXPECT_EQ(c.gpu_device(0).name, kHostCpuDevice);
  // Rank to rank through the shm vertex: two shm links.
  Path p = c.path(0, 3);
  ASSERT_EQ(p.size(), 2u);
  for (const Hop& h : p) EXPECT_EQ(c.graph[h.edge].kind, LinkKind::kShm);
  EXPECT_DOUBLE_EQ(c.bottleneck_bw(0, 3), 12e9);
  EXPECT_GT(c.host_link_bw(0), 0);
  EXPECT_GT(c.host_memory_per_gpu(0), 0);
  // One rank has no shm vertex; 0 ranks are an error.
  EXPECT_EQ(cluster_preset("localhost", 1).num_gpus(), 1);
  ExpectError([] { cluster_preset("localhost", 0); }, "gpus", ">= 1");
  EXPECT_EQ(load_cluster("localhost", 2).name, "localhost");
}

TEST(Cluster, MeasuredDeviceReplacesTheDatasheet) {
  Cluster c = cluster_preset("localhost", 2);
  DeviceSpec measured = device_spec(kHostCpuDevice);
  measured.peak_fp32_flops = 42e9;
  measured.hbm_bw = 9e9;
  c.set_device_spec(measured);
  EXPECT_DOUBLE_EQ(c.gpu_device(1).peak_flops(Dtype::kFp32), 42e9);
  EXPECT_DOUBLE_EQ(c.gpu_device(0).hbm_bw, 9e9);
  // The datasheet itself is unchanged, and so are other clusters.
  EXPECT_DOUBLE_EQ(device_spec(kHostCpuDevice).hbm_bw, 25e9);
  EXPECT_DOUBLE_EQ(cluster_preset("localhost", 2).gpu_device(0).hbm_bw, 25e9);
  // A measured device that the cluster does not use is an error.
  Cluster h = cluster_preset("dgx-h100", 8);
  ExpectError([&] { h.set_device_spec(measured); }, "device_spec.name", "not the device");
}

TEST(Device, JsonRoundTrip) {
  for (const std::string& name : known_devices()) {
    SCOPED_TRACE(name);
    const DeviceSpec& d = device_spec(name);
    DeviceSpec r = device_spec_from_json(Json::parse(device_spec_to_json(d).dump()));
    EXPECT_EQ(r.name, d.name);
    EXPECT_EQ(r.vendor, d.vendor);
    for (Dtype t : {Dtype::kFp32, Dtype::kTf32, Dtype::kBf16, Dtype::kFp16, Dtype::kFp8})
      EXPECT_NEAR(r.peak_flops(t), d.peak_flops(t), 1e-9 * d.peak_flops(t));
    EXPECT_NEAR(r.hbm_bytes, d.hbm_bytes, 1e-9 * d.hbm_bytes);
    EXPECT_NEAR(r.hbm_bw, d.hbm_bw, 1e-9 * d.hbm_bw);
    EXPECT_EQ(r.compute_units, d.compute_units);
    EXPECT_EQ(r.compute_capability, d.compute_capability);
    // A profile that does not repeat it reads the named device's compute capability.
    Json j = device_spec_to_json(d);
    j.erase("compute_capability");
    EXPECT_EQ(device_spec_from_json(j).compute_capability, d.compute_capability);
  }
  Json bad = device_spec_to_json(device_spec("H100-SXM"));
  bad["memory_bw_GBps"] = 0;
  ExpectError([&] { device_spec_from_json(bad); }, "device_spec.memory_bw_GBps", "> 0");
}

TEST(Device, DatasheetLookup) {
  EXPECT_EQ(device_spec("h100-sxm").name, "H100-SXM");  // case-insensitive
  EXPECT_DOUBLE_EQ(device_spec("A100-80G").peak_flops(Dtype::kBf16), 312e12);
  // fp8 falls back to fp16 where unsupported.
  EXPECT_DOUBLE_EQ(device_spec("A100-80G").peak_flops(Dtype::kFp8), 312e12);
  EXPECT_DOUBLE_EQ(device_spec("H100-SXM").peak_flops(Dtype::kFp8), 1978.9e12);
  ExpectError([] { device_spec("V100", "x.device"); }, "x.device", "unknown device 'V100'");
  EXPECT_EQ(parse_dtype("bf16", "f"), Dtype::kBf16);
  EXPECT_DOUBLE_EQ(dtype_bytes(Dtype::kTf32), 4);
  ExpectError([] { parse_dtype("int8", "plan.precision"); }, "plan.precision", "is not one of");
}

// --- Generators through JSON -------------------------------------------------------------------

TEST(ClusterJson, PresetForm) {
  Cluster c = cluster_from_json(Json::parse(R"({"preset": "dgx-a100-80g", "gpus": 16})"));
  EXPECT_EQ(c.num_gpus(), 16);
  // A positive gpus argument overrides the file.
  EXPECT_EQ(
      cluster_from_json(Json::parse(R"({"preset": "dgx-a100-80g", "gpus": 16})"), 32).num_gpus(),
      32);
  ExpectError([] { cluster_from_json(Json::parse(R"({"preset": "dgx-h100", "gpu": 8})")); },
              "cluster.gpu", "unknown field");
}

TEST(ClusterJson, RailAndFatTreeGenerators) {
  Json j = Json::parse(R"({"generator": "rail", "gpus": 32, "device": "A100-80G",
                           "gpus_per_server": 8, "nvlink_GBps": 300, "nic_GBps": 25,
                           "servers_per_leaf": 2})");
  Cluster rail = cluster_from_json(j);
  EXPECT_EQ(rail.num_gpus(), 32);
  EXPECT_EQ(rail.num_servers(), 4);
  EXPECT_DOUBLE_EQ(rail.bottleneck_bw(0, 1), 300e9);
  EXPECT_DOUBLE_EQ(rail.bottleneck_bw(0, 31), 25e9);
  for (int b = 1; b < 32; ++b) ExpectValidPath(rail, 0, b);

  j["generator"] = "fat-tree";
  Cluster fat = cluster_from_json(j);
  EXPECT_EQ(fat.num_gpus(), 32);
  // One leaf per two servers: any two GPUs of servers 0 and 1 meet at their leaf.
  EXPECT_EQ(fat.path(0, 9).size(), 4u);
  EXPECT_EQ(fat.path(0, 17).size(), 6u);  // servers 0 and 2: through the spine
  for (int b = 1; b < 32; ++b) ExpectValidPath(fat, 0, b);

  j["gpus"] = 20;
  ExpectError([&] { cluster_from_json(j); }, "cluster.gpus", "not a multiple");
}

TEST(ClusterJson, OversubscribedUplinkIsTheBottleneck) {
  // Four one-GPU servers, two per leaf, with a 4:1 oversubscribed leaf uplink: the two
  // 100 GB/s NICs under a leaf share a 50 GB/s uplink. PCIe (200 GB/s) is never the bottleneck.
  Json j = Json::parse(R"({"generator": "fat-tree", "gpus": 4, "gpus_per_server": 1,
                           "pcie_GBps": 200, "nics_per_server": 1, "nic_GBps": 100,
                           "servers_per_leaf": 2, "oversubscription": 4})");
  Cluster c = cluster_from_json(j);
  EXPECT_EQ(c.num_servers(), 4);
  EXPECT_DOUBLE_EQ(c.bottleneck_bw(0, 1), 100e9);  // same leaf
  EXPECT_DOUBLE_EQ(c.bottleneck_bw(0, 2), 50e9);   // 2 x 100 / 4 over the spine
}

TEST(ClusterJson, TorusGenerator) {
  Json j = Json::parse(R"({"generator": "torus", "dims": [2, 2, 2], "device": "H100-SXM",
                           "link_GBps": 100, "latency_us": 1})");
  Cluster c = cluster_from_json(j);
  EXPECT_EQ(c.num_gpus(), 8);
  // A 2 x 2 x 2 torus is a cube: a ring of two is one link, so 8 x 3 / 2 = 12 links.
  EXPECT_EQ(boost::num_edges(c.graph), 12u);
  EXPECT_EQ(boost::num_vertices(c.graph), 8u);  // GPUs only
  for (int a = 0; a < 8; ++a)
    for (int b = 0; b < 8; ++b) {
      if (a == b) continue;
      ExpectValidPath(c, a, b);
      // Hop count = Hamming distance of the coordinates; every hop is a GPU-GPU NVLink.
      EXPECT_EQ(c.path(a, b).size(), static_cast<size_t>(__builtin_popcount(a ^ b)));
      for (const Hop& h : c.path(a, b)) {
        EXPECT_EQ(c.graph[h.edge].kind, LinkKind::kNvlink);
        EXPECT_EQ(c.graph[boost::source(h.edge, c.graph)].kind, NodeKind::kGpu);
        EXPECT_EQ(c.graph[boost::target(h.edge, c.graph)].kind, NodeKind::kGpu);
      }
      EXPECT_DOUBLE_EQ(c.bottleneck_bw(a, b), 100e9);
      EXPECT_NEAR(c.path_latency(a, b), 1e-6 * __builtin_popcount(a ^ b), 1e-15);
    }
  // A matching gpus count is accepted; a different one is an error, not silently ignored.
  j["gpus"] = 8;
  EXPECT_EQ(cluster_from_json(j).num_gpus(), 8);
  j["gpus"] = 16;
  ExpectError([&] { cluster_from_json(j); }, "cluster.gpus", "dims");
  j.erase("gpus");
  ExpectError([&] { cluster_from_json(j, 16); }, "cluster.gpus", "dims");
}

TEST(ClusterJson, TorusWrapsAround) {
  // 4 x 4: GPU i at (i % 4, i / 4); ring distance per dimension is min(d, 4 - d).
  Cluster c = cluster_from_json(Json::parse(R"({"generator": "torus", "dims": [4, 4]})"));
  EXPECT_EQ(c.num_gpus(), 16);
  EXPECT_EQ(boost::num_edges(c.graph), 32u);
  auto ring = [](int d) { return std::min(d, 4 - d); };
  for (int a = 0; a < 16; ++a)
    for (int b = 0; b < 16; ++b) {
      if (a == b) continue;
      ExpectValidPath(c, a, b);
      int hops = ring(std::abs(a % 4 - b % 4)) + ring(std::abs(a / 4 - b / 4));
      EXPECT_EQ(c.path(a, b).size(), static_cast<size_t>(hops)) << a << " -> " << b;
    }
}

TEST(ClusterJson, TorusRejections) {
  ExpectError([] { cluster_from_json(Json::parse(R"({"generator": "torus", "dims": [8]})")); },
              "cluster.dims", "2 or 3");
  ExpectError([] { cluster_from_json(Json::parse(R"({"generator": "torus", "dims": [2, 0]})")); },
              "cluster.dims[1]", "[1, 4096]");
  ExpectError([] { cluster_from_json(Json::parse(R"({"generator": "torus", "dims": [2, 2.5]})")); },
              "cluster.dims[1]", "integer");
  // More GPUs than parasol supports (and, for 4096^3, more than an int holds).
  ExpectError(
      [] {
        cluster_from_json(Json::parse(R"({"generator": "torus", "dims": [4096, 4096, 4096]})"));
      },
      "cluster.dims", "1,048,576");
  ExpectError(
      [] { cluster_from_json(Json::parse(R"({"generator": "torus", "dims": [2048, 2048]})")); },
      "cluster.dims", "1,048,576");
  ExpectError(
      [] {
        cluster_from_json(
            Json::parse(R"({"generator": "torus", "dims": [2, 2], "device": "TPU"})"));
      },
      "cluster.device", "unknown device");
}

// --- Explicit graph ------------------------------------------------------------------------------

// Two servers of two GPUs. In each server the GPUs share an NVLink, a host CPU (PCIe, 32 GB/s)
// and one NIC (PCIe 16 GB/s to each GPU, 12.5 GB/s InfiniBand to the switch).
Json two_server_json() {
  return Json::parse(R"({
    "name": "two-by-two",
    "nodes": [
      {"id": "g0", "kind": "gpu", "server": 0, "device": "A100-80G"},
      {"id": "g1", "kind": "gpu", "server": 0, "device": "A100-80G"},
      {"id": "g2", "kind": "gpu", "server": 1, "device": "A100-80G"},
      {"id": "g3", "kind": "gpu", "server": 1, "device": "A100-80G"},
      {"id": "cpu0", "kind": "cpu", "server": 0, "memory_GiB": 512},
      {"id": "cpu1", "kind": "cpu", "server": 1, "memory_GiB": 512},
      {"id": "nic0", "kind": "nic", "server": 0},
      {"id": "nic1", "kind": "nic", "server": 1},
      {"id": "ib", "kind": "switch"}
    ],
    "links": [
      {"a": "g0", "b": "g1", "kind": "nvlink", "bw_GBps": 100, "latency_us": 0.5},
      {"a": "g2", "b": "g3", "kind": "nvlink", "bw_GBps": 100, "latency_us": 0.5},
      {"a": "g0", "b": "cpu0", "kind": "pcie", "bw_GBps": 32},
      {"a": "g1", "b": "cpu0", "kind": "pcie", "bw_GBps": 32},
      {"a": "g2", "b": "cpu1", "kind": "pcie", "bw_GBps": 32},
      {"a": "g3", "b": "cpu1", "kind": "pcie", "bw_GBps": 32},
      {"a": "g0", "b": "nic0", "kind": "pcie", "bw_GBps": 16, "latency_us": 1},
      {"a": "g1", "b": "nic0", "kind": "pcie", "bw_GBps": 16, "latency_us": 1},
      {"a": "g2", "b": "nic1", "kind": "pcie", "bw_GBps": 16, "latency_us": 1},
      {"a": "g3", "b": "nic1", "kind": "pcie", "bw_GBps": 16, "latency_us": 1},
      {"a": "nic0", "b": "ib", "kind": "infiniband", "bw_GBps": 12.5, "latency_us": 2},
      {"a": "nic1", "b": "ib", "kind": "infiniband", "bw_GBps": 12.5, "latency_us": 2}
    ]
  })");
}

TEST(ClusterExplicit, TwoServersSharedNic) {
  Cluster c = cluster_from_json(two_server_json());
  EXPECT_EQ(c.name, "two-by-two");
  EXPECT_EQ(c.num_gpus(), 4);
  EXPECT_EQ(c.num_servers(), 2);
  EXPECT_EQ(c.gpus_per_server(), 2);
  EXPECT_EQ(c.server_of(2), 1);
  EXPECT_EQ(boost::num_edges(c.graph), 12u);

  // Same server: the direct NVLink, one hop.
  ASSERT_EQ(c.path(0, 1).size(), 1u);
  EXPECT_DOUBLE_EQ(c.bottleneck_bw(0, 1), 100e9);
  EXPECT_DOUBLE_EQ(c.path_latency(0, 1), 0.5e-6);

  // Across servers: g - nic - ib - nic - g; InfiniBand (12.5 GB/s) is narrower than PCIe (16).
  for (int a : {0, 1})
    for (int b : {2, 3}) {
      ExpectValidPath(c, a, b);
      EXPECT_EQ(c.path(a, b).size(), 4u);
      EXPECT_DOUBLE_EQ(c.bottleneck_bw(a, b), 12.5e9);
      EXPECT_NEAR(c.path_latency(a, b), (1 + 2 + 2 + 1) * 1e-6, 1e-15);
    }

  // g0 and g1 leave their server over the same NIC uplink (the shared link), on the same edge
  // and in the same direction.
  Path p02 = c.path(0, 2), p13 = c.path(1, 3);
  EXPECT_EQ(p02[1].edge, p13[1].edge);
  EXPECT_EQ(p02[1].forward, p13[1].forward);
  EXPECT_EQ(c.graph[p02[1].edge].kind, LinkKind::kInfiniband);
  // The reverse path uses that link in the other direction.
  Path p20 = c.path(2, 0);
  EXPECT_EQ(p20[2].edge, p02[1].edge);
  EXPECT_NE(p20[2].forward, p02[1].forward);

  EXPECT_DOUBLE_EQ(c.host_memory_per_gpu(0), 256 * GiB);
  EXPECT_DOUBLE_EQ(c.host_link_bw(3), 32e9);
  EXPECT_EQ(c.link_kinds(),
            (std::vector<LinkKind>{LinkKind::kNvlink, LinkKind::kPcie, LinkKind::kInfiniband}));
}

TEST(ClusterExplicit, DefaultsForOptionalFields) {
  Cluster c = cluster_from_json(Json::parse(R"({
    "nodes": [{"id": "a", "kind": "gpu", "server": 0, "device": "H100-SXM"},
              {"id": "b", "kind": "gpu", "server": 0, "device": "H100-SXM"}],
    "links": [{"a": "a", "b": "b", "kind": "nvlink", "bw_GBps": 450}]})"));
  EXPECT_EQ(c.name, "custom");
  EXPECT_DOUBLE_EQ(c.path_latency(0, 1), 1e-6);  // latency_us defaults to 1
  EXPECT_EQ(c.host_memory_per_gpu(0), 0);
  EXPECT_EQ(c.host_link_bw(0), 0);
}

TEST(ClusterExplicit, GpuCountOverrideMustMatch) {
  EXPECT_EQ(cluster_from_json(two_server_json(), 4).num_gpus(), 4);
  ExpectError([] { cluster_from_json(two_server_json(), 8); }, "gpus", "differs");
}

// --- Round trips ---------------------------------------------------------------------------------

void ExpectSameCluster(const Cluster& a, const Cluster& b) {
  EXPECT_EQ(a.name, b.name);
  EXPECT_EQ(a.num_gpus(), b.num_gpus());
  EXPECT_EQ(a.num_servers(), b.num_servers());
  EXPECT_EQ(a.gpus_per_server(), b.gpus_per_server());
  EXPECT_EQ(boost::num_vertices(a.graph), boost::num_vertices(b.graph));
  EXPECT_EQ(boost::num_edges(a.graph), boost::num_edges(b.graph));
  EXPECT_EQ(a.link_kinds(), b.link_kinds());
  for (int g = 0; g < a.num_gpus(); ++g) {
    EXPECT_EQ(a.server_of(g), b.server_of(g));
    EXPECT_EQ(a.gpu_device(g).name, b.gpu_device(g).name);
    EXPECT_DOUBLE_EQ(a.host_memory_per_gpu(g), b.host_memory_per_gpu(g));
  }
  for (int x = 0; x < a.num_gpus(); ++x)
    for (int y = 0; y < a.num_gpus(); ++y) {
      if (x == y) continue;
      EXPECT_EQ(a.path(x, y).size(), b.path(x, y).size());
      EXPECT_DOUBLE_EQ(a.bottleneck_bw(x, y), b.bottleneck_bw(x, y));
      EXPECT_NEAR(a.path_latency(x, y), b.path_latency(x, y), 1e-15);
    }
}

TEST(ClusterJson, RoundTripPreset) {
  Cluster c = cluster_preset("dgx-a100-80g", 16);
  Json j = cluster_to_json(c);
  EXPECT_EQ(j["links"].size(), boost::num_edges(c.graph));
  ExpectSameCluster(c, cluster_from_json(j));
  // The text form survives too.
  ExpectSameCluster(c, cluster_from_json(parse_json(j.dump(2), "cluster")));
}

TEST(ClusterJson, RoundTripTorusAndExplicit) {
  Cluster t = cluster_from_json(Json::parse(R"({"generator": "torus", "dims": [3, 2]})"));
  ExpectSameCluster(t, cluster_from_json(cluster_to_json(t)));
  Cluster e = cluster_from_json(two_server_json());
  ExpectSameCluster(e, cluster_from_json(cluster_to_json(e)));
}

// --- Rejections ----------------------------------------------------------------------------------

TEST(ClusterErrors, DisconnectedGraph) {
  Json j = two_server_json();
  j["links"].erase(11);  // nic1 - ib: server 1 is cut off
  ExpectError([&] { cluster_from_json(j); }, "cluster", "disconnected");
  j["links"] = Json::array();
  ExpectError([&] { cluster_from_json(j); }, "cluster", "disconnected");
}

TEST(ClusterErrors, GpusConnectedOnlyThroughANonForwardingGpu) {
  // g0 - g1 - g2 in a chain: connected, but g1 is an endpoint, not a router.
  Json j = Json::parse(R"({
    "nodes": [{"id": "g0", "kind": "gpu", "server": 0, "device": "H100-SXM"},
              {"id": "g1", "kind": "gpu", "server": 0, "device": "H100-SXM"},
              {"id": "g2", "kind": "gpu", "server": 0, "device": "H100-SXM"}],
    "links": [{"a": "g0", "b": "g1", "kind": "nvlink", "bw_GBps": 450},
              {"a": "g1", "b": "g2", "kind": "nvlink", "bw_GBps": 450}]})");
  ExpectError([&] { cluster_from_json(j); }, "cluster", "no route");
  j["nodes"][1]["forwards"] = true;  // a direct-connect GPU that forwards makes it routable
  Cluster c = cluster_from_json(j);
  EXPECT_EQ(c.path(0, 2).size(), 2u);
}

TEST(ClusterErrors, EveryPairOfGpusMustBeRoutable) {
  // g1 reaches g0 (a direct NVLink) and g2 reaches g0 (through the switch), but g1 cannot reach
  // g2: GPUs do not forward, so g0 is no relay. Accepting this made path(1, 2) empty, with an
  // infinite bottleneck bandwidth and zero latency.
  Json j = Json::parse(R"({
    "nodes": [{"id": "g0", "kind": "gpu", "server": 0, "device": "H100-SXM"},
              {"id": "g1", "kind": "gpu", "server": 0, "device": "H100-SXM"},
              {"id": "g2", "kind": "gpu", "server": 1, "device": "H100-SXM"},
              {"id": "sw", "kind": "switch"}],
    "links": [{"a": "g0", "b": "g1", "kind": "nvlink", "bw_GBps": 450},
              {"a": "g0", "b": "sw", "kind": "infiniband", "bw_GBps": 50},
              {"a": "g2", "b": "sw", "kind": "infiniband", "bw_GBps": 50}]})");
  ExpectError([&] { cluster_from_json(j); }, "cluster", "has no route");
  // Linking g1 to the switch as well makes every pair routable.
  j["links"].push_back({{"a", "g1"}, {"b", "sw"}, {"kind", "infiniband"}, {"bw_GBps", 50}});
  Cluster c = cluster_from_json(j);
  for (int a = 0; a < 3; ++a)
    for (int b = 0; b < 3; ++b)
      if (a != b) ExpectValidPath(c, a, b);
  EXPECT_DOUBLE_EQ(c.bottleneck_bw(1, 2), 50e9);
}

TEST(ClusterErrors, BadBandwidthAndLatency) {
  Json j = two_server_json();
  j["links"][3]["bw_GBps"] = -5;
  ExpectError([&] { cluster_from_json(j); }, "cluster.links[3].bw_GBps", "out of range");
  j["links"][3]["bw_GBps"] = 0;
  ExpectError([&] { cluster_from_json(j); }, "cluster.links[3].bw_GBps", "must be > 0");
  j = two_server_json();
  j["links"][0]["latency_us"] = -1;
  ExpectError([&] { cluster_from_json(j); }, "cluster.links[0].latency_us", "out of range");
  // Built by hand rather than read, finalize() names the link by its endpoints.
  Cluster c = cluster_preset("dgx-h100", 8);
  auto e = *boost::edges(c.graph).first;
  c.graph[e].bw = -1;
  try {
    c.finalize();
    ADD_FAILURE() << "negative bandwidth accepted";
  } catch (const Error& err) {
    EXPECT_NE(err.field().find("bw_GBps"), std::string::npos) << err.what();
  }
  c.graph[e].bw = std::nan("");
  EXPECT_THROW(c.finalize(), Error);
}

TEST(ClusterErrors, UnknownDevice) {
  Json j = two_server_json();
  j["nodes"][2]["device"] = "V100";
  ExpectError([&] { cluster_from_json(j); }, "cluster.nodes[2].device", "unknown device 'V100'");
  j["nodes"][2].erase("device");
  ExpectError([&] { cluster_from_json(j); }, "cluster.nodes[2].device", "is required");
}

TEST(ClusterErrors, DuplicateNodeId) {
  Json j = two_server_json();
  j["nodes"][3]["id"] = "g2";
  ExpectError([&] { cluster_from_json(j); }, "cluster.nodes[3].id", "duplicate node id 'g2'");
}

TEST(ClusterErrors, LinkToUnknownNode) {
  Json j = two_server_json();
  j["links"][5]["b"] = "cpu7";
  ExpectError([&] { cluster_from_json(j); }, "cluster.links[5].b", "unknown node 'cpu7'");
  j = two_server_json();
  j["links"][5]["a"] = "gx";
  ExpectError([&] { cluster_from_json(j); }, "cluster.links[5].a", "unknown node 'gx'");
}

TEST(ClusterErrors, OtherMalformedGraphs) {
  Json j = two_server_json();
  j["links"][0]["b"] = "g0";
  ExpectError([&] { cluster_from_json(j); }, "cluster.links[0].b", "two different nodes");
  j = two_server_json();
  j["links"][0]["kind"] = "carrier-pigeon";
  ExpectError([&] { cluster_from_json(j); }, "cluster.links[0].kind", "is not one of");
  j = two_server_json();
  j["nodes"][0].erase("server");
  ExpectError([&] { cluster_from_json(j); }, "cluster.nodes[0].server", "required for a GPU");
  j = two_server_json();
  j["nodes"][4]["kind"] = "dpu";
  ExpectError([&] { cluster_from_json(j); }, "cluster.nodes[4].kind", "is not one of");
  j = two_server_json();
  j["nodes"][4]["size"] = 1;
  ExpectError([&] { cluster_from_json(j); }, "cluster.nodes[4].size", "unknown field");
  ExpectError([] { cluster_from_json(Json::parse(R"({"nodes": [{"id": "s"}], "links": []})")); },
              "cluster", "has no GPU");
  ExpectError([] { cluster_from_json(Json::parse(R"({"links": []})")); }, "cluster.nodes",
              "is required");
  ExpectError([] { cluster_from_json(Json::parse("[]")); }, "cluster", "must be a JSON object");
}

}  // namespace
}  // namespace parasol
