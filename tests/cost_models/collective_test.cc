// Tests the collective cost model (cost_models/collective.h) on hand-built topology graphs.
#include "cost_models/collective.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "core/cluster.h"
#include "core/json_reader.h"

namespace parasol::cost {
namespace {

// Link efficiencies chosen for the tests, per LinkKind (nvlink, nvswitch, pcie, ib, ethernet).
constexpr double kNvswitchEff = 0.8;
constexpr double kPcieEff = 0.75;
constexpr double kIbEff = 0.9;
constexpr double kStepLatency = 5e-6;

// The generic (MPI-style) algorithms: NCCL's tuning off (tests/cost_models/nccl_test.cc
// covers NCCL's).
Profile test_profile() {
  Profile p = default_profile(device_spec("A100-80G"));
  p.link_efficiency = {0.7, kNvswitchEff, kPcieEff, kIbEff, 0.6};
  p.collective_step_latency_s = kStepLatency;
  p.nccl.reset();
  return p;
}

// Small helpers that write the explicit-graph JSON form of cluster_from_json.
struct GraphBuilder {
  Json nodes = Json::array();
  Json links = Json::array();
  void gpu(const std::string& id, int server) {
    nodes.push_back({{"id", id}, {"kind", "gpu"}, {"server", server}, {"device", "A100-80G"}});
  }
  void node(const std::string& id, const std::string& kind, int server = -1) {
    Json n = {{"id", id}, {"kind", kind}};
    if (server >= 0) n["server"] = server;
    nodes.push_back(n);
  }
  void link(const std::string& a, const std::string& b, const std::string& kind, double gbps,
            double latency_us) {
    links.push_back(
        {{"a", a}, {"b", b}, {"kind", kind}, {"bw_GBps", gbps}, {"latency_us", latency_us}});
  }
  Cluster build() const {
    return cluster_from_json({{"name", "test"}, {"nodes", nodes}, {"links", links}});
  }
};

// (1) Four GPUs on one switch, 100 GB/s per direction, 1 us per link.
Cluster one_switch(int gpus = 4) {
  GraphBuilder g;
  g.node("sw", "switch", 0);
  for (int i = 0; i < gpus; ++i) {
    g.gpu("g" + std::to_string(i), 0);
    g.link("g" + std::to_string(i), "sw", "nvswitch", 100, 1);
  }
  return g.build();
}

// (2) Two servers of 8 GPUs on an NVSwitch (300 GB/s); `nics` NICs per server, each serving
// 8 / nics consecutive GPUs over its own 64 GB/s PCIe link; NICs at 50 GB/s to one leaf switch.
Cluster two_servers_with_nics(int nics) {
  GraphBuilder g;
  g.node("leaf", "switch");
  for (int s = 0; s < 2; ++s) {
    std::string nvs = "nvs" + std::to_string(s);
    g.node(nvs, "switch", s);
    for (int n = 0; n < nics; ++n) {
      std::string nic = "nic" + std::to_string(s) + "_" + std::to_string(n);
      g.node(nic, "nic", s);
      g.link(nic, "leaf", "infiniband", 50, 1);
    }
    for (int i = 0; i < 8; ++i) {
      std::string gpu = "g" + std::to_string(s * 8 + i);
      g.gpu(gpu, s);
      g.link(gpu, nvs, "nvswitch", 300, 1);
      g.link(gpu, "nic" + std::to_string(s) + "_" + std::to_string(i / (8 / nics)), "pcie", 64, 1);
    }
  }
  return g.build();
}

// (3, 4, 5) Two servers of 4 GPUs; each server's GPUs on its NVSwitch (300 GB/s); the two
// NVSwitches joined by one slow 10 GB/s link, so a cross-server path is GPU - switch - (slow) -
// switch - GPU: the bottleneck sits in the middle of the path.
constexpr double kSlowGBps = 10;
Cluster two_servers_slow_middle() {
  GraphBuilder g;
  g.node("nvs0", "switch", 0);
  g.node("nvs1", "switch", 1);
  for (int i = 0; i < 8; ++i) {
    std::string gpu = "g" + std::to_string(i);
    g.gpu(gpu, i / 4);
    g.link(gpu, i < 4 ? "nvs0" : "nvs1", "nvswitch", 300, 1);
  }
  g.link("nvs0", "nvs1", "infiniband", kSlowGBps, 2);
  return g.build();
}

double rel(double a, double b) { return std::fabs(a - b) / std::fabs(b); }

// ---------------------------------------------------------------------------------------------

TEST(CollectiveNames, Printable) {
  EXPECT_STREQ(collective_name(Collective::kAllReduce), "all-reduce");
  EXPECT_STREQ(collective_name(Collective::kAllGather), "all-gather");
  EXPECT_STREQ(collective_name(Collective::kReduceScatter), "reduce-scatter");
  EXPECT_STREQ(collective_name(Collective::kAllToAll), "all-to-all");
  EXPECT_STREQ(collective_name(Collective::kBroadcast), "broadcast");
  EXPECT_STREQ(algorithm_name(Algorithm::kRing), "ring");
  EXPECT_STREQ(algorithm_name(Algorithm::kTree), "tree");
  EXPECT_STREQ(algorithm_name(Algorithm::kHierarchical), "hierarchical");
  EXPECT_STREQ(algorithm_name(Algorithm::kPairwise), "pairwise");
}

TEST(RingOnOneSwitch, BandwidthAndLatencyAreTheLinksOnes) {
  Cluster c = one_switch();
  Profile p = test_profile();
  GroupModel g(c, p, {0, 1, 2, 3});
  EXPECT_EQ(g.size(), 4);
  // Every ring flow uses its own up-link and down-link: the full link bandwidth.
  EXPECT_NEAR(g.ring_bw(), 100e9 * kNvswitchEff, 1e-3);
  // Two 1 us hops plus the software step latency.
  EXPECT_NEAR(g.ring_step_latency(), 2e-6 + kStepLatency, 1e-15);
}

TEST(RingOnOneSwitch, AllReduceMatchesRingFormula) {
  Cluster c = one_switch();
  Profile p = test_profile();
  GroupModel g(c, p, {0, 1, 2, 3});
  const double n = 4, bw = 100e9 * kNvswitchEff, lat = 2e-6 + kStepLatency;
  for (double s : {1e6, 1e8, 4e9}) {
    const double expected = 2 * (n - 1) / n * s / bw + 2 * (n - 1) * lat;
    const double ring = g.time(Collective::kAllReduce, s, Algorithm::kRing);
    EXPECT_LT(rel(ring, expected), 1e-9) << s;
    // The best algorithm on a single switch is the ring (a tree halves a parent's up-link).
    CollectiveCost best = g.cost(Collective::kAllReduce, s);
    EXPECT_LE(best.time_s, ring);
  }
  const double big = 4e9;
  EXPECT_LT(rel(g.cost(Collective::kAllReduce, big).time_s, 1.5 * big / (100e9 * kNvswitchEff)),
            0.01);
  EXPECT_EQ(g.cost(Collective::kAllReduce, big).algorithm, Algorithm::kRing);
}

TEST(RingOnOneSwitch, NcclTestsRelations) {
  Cluster c = one_switch();
  Profile p = test_profile();
  GroupModel g(c, p, {0, 1, 2, 3});
  const double s = 1e9, n = 4, bw = 100e9 * kNvswitchEff, lat = 2e-6 + kStepLatency;
  const double ag = g.time(Collective::kAllGather, s, Algorithm::kRing);
  const double rs = g.time(Collective::kReduceScatter, s, Algorithm::kRing);
  const double ar = g.time(Collective::kAllReduce, s, Algorithm::kRing);
  // busbw = algbw x (n-1)/n for all-gather and reduce-scatter, x 2(n-1)/n for all-reduce.
  EXPECT_LT(rel(ag, (n - 1) / n * s / bw + (n - 1) * lat), 1e-9);
  EXPECT_LT(rel(rs, (n - 1) / n * s / bw + (n - 1) * lat), 1e-9);
  EXPECT_LT(rel(ar, rs + ag), 1e-9);  // all-reduce = reduce-scatter + all-gather
  // Bus bandwidth (nccl-tests definition) equals the effective link bandwidth for large sizes.
  EXPECT_LT(rel(s / g.cost(Collective::kAllGather, s).time_s * (n - 1) / n, bw), 0.01);
  EXPECT_LT(rel(s / g.cost(Collective::kAllReduce, s).time_s * 2 * (n - 1) / n, bw), 0.01);
  // A pipelined ring broadcast moves the whole buffer over every link once.
  EXPECT_LT(rel(g.time(Collective::kBroadcast, s, Algorithm::kRing), s / bw + (n - 1) * lat), 1e-9);
}

TEST(RingOnOneSwitch, TrivialCasesCostNothing) {
  Cluster c = one_switch();
  Profile p = test_profile();
  GroupModel single(c, p, {2});
  EXPECT_EQ(single.size(), 1);
  EXPECT_EQ(single.cost(Collective::kAllReduce, 1e9).time_s, 0);
  GroupModel g(c, p, {0, 1, 2, 3});
  EXPECT_EQ(g.cost(Collective::kAllReduce, 0).time_s, 0);
  GroupModel empty;
  EXPECT_EQ(empty.cost(Collective::kAllGather, 1e9).time_s, 0);
}

TEST(RingOnOneSwitch, TimeGrowsWithBytes) {
  Cluster c = one_switch();
  Profile p = test_profile();
  GroupModel g(c, p, {0, 1, 2, 3});
  for (Collective k : {Collective::kAllReduce, Collective::kAllGather, Collective::kReduceScatter,
                       Collective::kAllToAll, Collective::kBroadcast}) {
    double prev = 0;
    for (double s : {1e3, 1e5, 1e7, 1e9}) {
      double t = g.cost(k, s).time_s;
      EXPECT_GT(t, prev) << collective_name(k);
      EXPECT_TRUE(std::isfinite(t)) << collective_name(k);
      prev = t;
    }
  }
}

TEST(RingOnOneSwitch, PairwiseAllToAll) {
  Cluster c = one_switch();
  Profile p = test_profile();
  GroupModel g(c, p, {0, 1, 2, 3});
  // Each rank sends (n-1)/n of its bytes, each step's flows on distinct links.
  const double s = 1e9, n = 4, bw = 100e9 * kNvswitchEff, lat = 2e-6 + kStepLatency;
  EXPECT_LT(rel(g.time(Collective::kAllToAll, s, Algorithm::kPairwise),
                (n - 1) / n * s / bw + (n - 1) * lat),
            1e-9);
  EXPECT_LT(rel(g.cost(Collective::kAllToAll, s).time_s, (n - 1) / n * s / bw), 0.01);
  EXPECT_TRUE(std::isinf(g.time(Collective::kAllReduce, s, Algorithm::kPairwise)));
}

// (2) NIC sharing.
TEST(NicSharing, TwoNicsPerServerQuarterTheCrossServerBandwidth) {
  Profile p = test_profile();
  for (int nics : {2, 8}) {
    Cluster c = two_servers_with_nics(nics);
    ASSERT_EQ(c.num_gpus(), 16);
    ASSERT_EQ(c.num_servers(), 2);
    // Data-parallel pairs {i, 8 + i} all reduce at once, as the dp groups of a tp = 8 plan would.
    std::vector<std::vector<int>> all;
    for (int i = 0; i < 8; ++i) all.push_back({i, 8 + i});
    GroupModel g(c, p, {0, 8}, all);
    // 8 / nics GPUs push through each NIC's 50 GB/s; PCIe (64 GB/s x 0.75 = 48) is not the limit.
    const double flows_per_nic = 8.0 / nics;
    const double expected = std::min(64e9 * kPcieEff, 50e9 * kIbEff / flows_per_nic);
    EXPECT_NEAR(g.ring_bw(), expected, 1e-6 * expected) << nics << " NICs";
    // 4 hops (GPU-NIC, NIC-leaf, leaf-NIC, NIC-GPU), 1 us each, plus the software step.
    EXPECT_NEAR(g.ring_step_latency(), 4e-6 + kStepLatency, 1e-12);
  }
  Profile q = test_profile();
  std::vector<std::vector<int>> all;
  for (int i = 0; i < 8; ++i) all.push_back({i, 8 + i});
  GroupModel two(two_servers_with_nics(2), q, {0, 8}, all);
  GroupModel eight(two_servers_with_nics(8), q, {0, 8}, all);
  EXPECT_NEAR(eight.ring_bw() / two.ring_bw(), 4.0, 1e-9);
  const double s = 1e9;
  EXPECT_NEAR(
      two.cost(Collective::kAllReduce, s).time_s / eight.cost(Collective::kAllReduce, s).time_s,
      4.0, 0.05);
}

TEST(NicSharing, GroupAloneGetsTheWholeNic) {
  Profile p = test_profile();
  Cluster c = two_servers_with_nics(2);
  GroupModel alone(c, p, {0, 8});
  EXPECT_NEAR(alone.ring_bw(), 50e9 * kIbEff, 1e-3);
}

TEST(NicSharing, ConcurrentFlowRatesShareTheNic) {
  Profile p = test_profile();
  Cluster c = two_servers_with_nics(2);
  // GPUs 0..3 share NIC 0 of server 0; GPUs 4..7 NIC 1.
  auto r = concurrent_flow_rates(c, p, {{0, 8}, {1, 9}, {2, 10}, {4, 12}});
  ASSERT_EQ(r.size(), 4u);
  for (int i = 0; i < 3; ++i) EXPECT_NEAR(r[i].bw, 50e9 * kIbEff / 3, 1e-3);
  EXPECT_NEAR(r[3].bw, 50e9 * kIbEff, 1e-3);
  for (const FlowRate& f : r) EXPECT_NEAR(f.latency, 4e-6, 1e-12);
}

// (3) Bottleneck in the middle of the path.
TEST(SlowMiddleLink, BottleneckIsTheMiddleLink) {
  Cluster c = two_servers_slow_middle();
  Profile p = test_profile();
  auto r = concurrent_flow_rates(c, p, {{0, 4}});
  ASSERT_EQ(r.size(), 1u);
  EXPECT_NEAR(r[0].bw, kSlowGBps * 1e9 * kIbEff, 1e-3);
  EXPECT_NEAR(r[0].latency, 1e-6 + 2e-6 + 1e-6, 1e-12);
  // Same-server flows never see the slow link.
  r = concurrent_flow_rates(c, p, {{0, 1}});
  EXPECT_NEAR(r[0].bw, 300e9 * kNvswitchEff, 1e-3);
  GroupModel g(c, p, {0, 4});
  EXPECT_NEAR(g.ring_bw(), kSlowGBps * 1e9 * kIbEff, 1e-3);
}

TEST(SlowMiddleLink, SameDirectionFlowsShareOppositeDirectionsDoNot) {
  Cluster c = two_servers_slow_middle();
  Profile p = test_profile();
  const double full = kSlowGBps * 1e9 * kIbEff;
  auto same = concurrent_flow_rates(c, p, {{0, 4}, {1, 5}});
  EXPECT_NEAR(same[0].bw, full / 2, 1e-3);
  EXPECT_NEAR(same[1].bw, full / 2, 1e-3);
  auto opposite = concurrent_flow_rates(c, p, {{0, 4}, {5, 1}});
  EXPECT_NEAR(opposite[0].bw, full, 1e-3);
  EXPECT_NEAR(opposite[1].bw, full, 1e-3);
  auto three = concurrent_flow_rates(c, p, {{0, 4}, {1, 5}, {2, 6}, {7, 3}});
  EXPECT_NEAR(three[0].bw, full / 3, 1e-3);
  EXPECT_NEAR(three[3].bw, full, 1e-3);
}

TEST(P2p, BytesOverBandwidthPlusLatency) {
  Cluster c = two_servers_slow_middle();
  Profile p = test_profile();
  const double bw = kSlowGBps * 1e9 * kIbEff, path_latency = 4e-6;
  for (double bytes : {1e3, 1e6, 1e9}) {
    const double t = p2p_time(c, p, 0, 4, bytes);
    const double wire = bytes / bw + path_latency;
    // The path latency plus at most one software step.
    EXPECT_GE(t, wire * (1 - 1e-12)) << bytes;
    EXPECT_LE(t, wire + p.collective_step_latency_s + 1e-12) << bytes;
  }
  EXPECT_LT(rel(p2p_time(c, p, 0, 4, 1e10), 1e10 / bw), 0.01);
  EXPECT_EQ(p2p_time(c, p, 3, 3, 1e9), 0);
  EXPECT_EQ(p2p_time(c, p, 0, 4, 0), 0);
  // Symmetric on a symmetric graph; faster inside a server.
  EXPECT_DOUBLE_EQ(p2p_time(c, p, 0, 4, 1e8), p2p_time(c, p, 4, 0, 1e8));
  EXPECT_LT(p2p_time(c, p, 0, 1, 1e8), p2p_time(c, p, 0, 4, 1e8));
}

// (4) Hierarchical beats the flat ring across slow inter-server links.
TEST(Hierarchical, BeatsFlatRingAcrossServers) {
  Cluster c = two_servers_slow_middle();
  Profile p = test_profile();
  GroupModel g(c, p, {0, 1, 2, 3, 4, 5, 6, 7});
  const double s = 4e9;
  const double slow = kSlowGBps * 1e9 * kIbEff, fast = 300e9 * kNvswitchEff;
  // Flat ring: 3 -> 4 and 7 -> 0 cross the slow link in opposite directions, 2(n-1)/n S each.
  const double flat = g.time(Collective::kAllReduce, s, Algorithm::kRing);
  EXPECT_LT(rel(flat, 2.0 * 7 / 8 * s / slow), 0.01);
  // Hierarchical: reduce-scatter and all-gather inside each server (4 GPUs), and 4 rails each
  // all-reducing S/4 between the 2 servers, all 4 rails sharing the slow link.
  const double hier_expected = 2 * (3.0 / 4 * s / fast) + 2.0 * 1 / 2 * (s / 4) / (slow / 4);
  const double hier = g.time(Collective::kAllReduce, s, Algorithm::kHierarchical);
  EXPECT_LT(rel(hier, hier_expected), 0.01);
  EXPECT_LT(hier, 0.7 * flat);
  CollectiveCost best = g.cost(Collective::kAllReduce, s);
  EXPECT_EQ(best.algorithm, Algorithm::kHierarchical);
  EXPECT_DOUBLE_EQ(best.time_s, hier);
  // All-gather: within a server (S, 4 ranks) and across servers (S/4, 2 ranks per rail).
  const double ag = g.time(Collective::kAllGather, s, Algorithm::kHierarchical);
  EXPECT_LT(rel(ag, 3.0 / 4 * s / fast + 1.0 / 2 * (s / 4) / (slow / 4)), 0.01);
}

TEST(Hierarchical, FallsBackToRingOnOneServer) {
  Cluster c = one_switch();
  Profile p = test_profile();
  GroupModel g(c, p, {0, 1, 2, 3});
  EXPECT_DOUBLE_EQ(g.time(Collective::kAllReduce, 1e9, Algorithm::kHierarchical),
                   g.time(Collective::kAllReduce, 1e9, Algorithm::kRing));
}

// All-to-all must respect the bisection of the cut: with 4 GPUs on each side, each rank sends
// half of its bytes across, so 4 x S/2 = 2S cross the slow link in each direction.
TEST(AllToAll, RespectsTheBisectionBandwidth) {
  Cluster c = two_servers_slow_middle();
  Profile p = test_profile();
  GroupModel g(c, p, {0, 1, 2, 3, 4, 5, 6, 7});
  const double s = 1e9, slow = kSlowGBps * 1e9 * kIbEff;
  const double bound = 2 * s / slow;
  CollectiveCost a2a = g.cost(Collective::kAllToAll, s);
  EXPECT_GE(a2a.time_s, bound * (1 - 1e-9)) << algorithm_name(a2a.algorithm);
  EXPECT_LT(rel(a2a.time_s, bound), 0.01);
}

// (5) Concurrent groups on a shared link halve the bandwidth, whichever algorithm wins.
TEST(Concurrency, TwoGroupsOnOneLinkHalveTheBandwidth) {
  Cluster c = two_servers_slow_middle();
  Profile p = test_profile();
  std::vector<int> a = {0, 4}, b = {1, 5};
  GroupModel alone(c, p, a);
  GroupModel shared(c, p, a, {a, b});
  EXPECT_NEAR(shared.ring_bw(), alone.ring_bw() / 2, 1e-3);
  EXPECT_NEAR(shared.tree_bw(), alone.tree_bw() / 2, 1e-3);
  const double s = 4e9;
  for (Collective k : {Collective::kAllReduce, Collective::kAllGather, Collective::kReduceScatter,
                       Collective::kAllToAll, Collective::kBroadcast})
    EXPECT_NEAR(shared.cost(k, s).time_s / alone.cost(k, s).time_s, 2.0, 0.02)
        << collective_name(k);
  // A concurrent group on the other side of nothing (same server, no shared link) changes nothing.
  GroupModel local(c, p, {0, 1}, {{0, 1}, {2, 3}});
  GroupModel local_alone(c, p, {0, 1});
  EXPECT_DOUBLE_EQ(local.ring_bw(), local_alone.ring_bw());
}

TEST(Concurrency, HierarchicalGroupsSharingTheInterServerLink) {
  // Two 4-GPU groups, each with 2 GPUs on each server: each group's hierarchical all-reduce puts
  // S/2 x 2 rails = S on the slow link per direction; two groups at once need 2S / slow.
  Cluster c = two_servers_slow_middle();
  Profile p = test_profile();
  std::vector<int> a = {0, 1, 4, 5}, b = {2, 3, 6, 7};
  GroupModel shared(c, p, a, {a, b});
  const double s = 4e9, slow = kSlowGBps * 1e9 * kIbEff;
  EXPECT_GE(shared.cost(Collective::kAllReduce, s).time_s, 2 * s / slow * (1 - 1e-9));
  GroupModel alone(c, p, a);
  EXPECT_GE(alone.cost(Collective::kAllReduce, s).time_s, s / slow * (1 - 1e-9));
  EXPECT_NEAR(
      shared.cost(Collective::kAllReduce, s).time_s / alone.cost(Collective::kAllReduce, s).time_s,
      2.0, 0.05);
}

TEST(ConcurrentFlowRates, EmptyAndSingle) {
  Cluster c = one_switch();
  Profile p = test_profile();
  EXPECT_TRUE(concurrent_flow_rates(c, p, {}).empty());
  auto r = concurrent_flow_rates(c, p, {{0, 1}});
  ASSERT_EQ(r.size(), 1u);
  EXPECT_NEAR(r[0].bw, 100e9 * kNvswitchEff, 1e-3);
  EXPECT_NEAR(r[0].latency, 2e-6, 1e-12);
  // Two flows into the same GPU share its down-link.
  r = concurrent_flow_rates(c, p, {{0, 2}, {1, 2}, {3, 1}});
  EXPECT_NEAR(r[0].bw, 50e9 * kNvswitchEff, 1e-3);
  EXPECT_NEAR(r[1].bw, 50e9 * kNvswitchEff, 1e-3);
  EXPECT_NEAR(r[2].bw, 100e9 * kNvswitchEff, 1e-3);
}

TEST(ConcurrentFlowRates, UsesTheProfileEfficiencyOfTheLinkKind) {
  Cluster c = one_switch();
  Profile p = test_profile();
  p.link_efficiency[static_cast<int>(LinkKind::kNvswitch)] = 0.5;
  EXPECT_NEAR(concurrent_flow_rates(c, p, {{0, 1}})[0].bw, 50e9, 1e-3);
}

}  // namespace
}  // namespace parasol::cost
