// Tests the NCCL mode of the collective model (cost_models/collective.h with Profile::nccl):
// NCCL's latency formulas (src/graph/tuning.cc) worked by hand, the protocol choice, PAT, the
// multi-channel ring's bandwidth across servers and the grouped all-to-all.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/cluster.h"
#include "cost_models/collective.h"
#include "cost_models/profile.h"

namespace parasol::cost {
namespace {

constexpr double us = 1e-6;
using T = NcclTuning;

std::vector<int> iota(int first, int n, int stride = 1) {
  std::vector<int> v;
  for (int i = 0; i < n; ++i) v.push_back(first + i * stride);
  return v;
}

TEST(NcclLatency, RingInsideOneServerByHand) {
  // 8 GPUs of one DGX A100 on NVSwitch: NVLink steps only.
  Cluster c = cluster_preset("dgx-a100-80g", 8);
  Profile p = default_profile(c.gpu_device(0));
  GroupModel g(c, p, iota(0, 8));
  EXPECT_EQ(g.nodes(), 1);
  EXPECT_EQ(g.ranks_per_node(), 8);
  // all-gather: base + 7 steps; all-reduce: base + 14 steps.
  EXPECT_NEAR(g.nccl_latency(Collective::kAllGather, T::kRing, T::kSimple), (8.4 + 7 * 3.4) * us,
              1e-12);
  EXPECT_NEAR(g.nccl_latency(Collective::kAllGather, T::kRing, T::kLL), (6.6 + 7 * 0.6) * us,
              1e-12);
  EXPECT_NEAR(g.nccl_latency(Collective::kAllReduce, T::kRing, T::kLL128), (14.0 + 14 * 1.9) * us,
              1e-12);
  // A tiny message takes LL's latency (plus a negligible bandwidth term).
  const double tiny = g.cost(Collective::kAllGather, 64).time_s;
  EXPECT_NEAR(tiny, (6.6 + 7 * 0.6) * us, 0.05 * us);
}

TEST(NcclLatency, RingAcrossServersPaysTheNetworkSteps) {
  // 16 GPUs on 2 DGX A100 servers: 15 all-gather steps, one of them between servers. The
  // intra-server steps of a multi-node ring pay the proxy's network overhead (AMD host: 2 us,
  // x3 for Simple); the network step NCCL's 14 us plus the path's latency twice (Simple).
  Cluster c = cluster_preset("dgx-a100-80g", 16);
  Profile p = default_profile(c.gpu_device(0));
  GroupModel g(c, p, iota(0, 16));
  EXPECT_EQ(g.nodes(), 2);
  const double path = c.path_latency(7, 8);
  EXPECT_GT(path, 0);
  const double simple = (8.4 + 14 * std::max(3.4, 3 * 2.0) + 1 * 14.0) * us + 2 * path;
  EXPECT_NEAR(g.nccl_latency(Collective::kAllGather, T::kRing, T::kSimple), simple, 1e-12);
  const double ll128 = (14.0 + 14 * std::max(1.9, 2.0) + 1 * 4.0) * us + path;
  EXPECT_NEAR(g.nccl_latency(Collective::kAllGather, T::kRing, T::kLL128), ll128, 1e-12);
  // All-reduce: 30 steps, 2 of them between servers; Simple's latency x1.4 (ring plateau).
  const double ar = ((8.4 + 28 * 6.0 + 2 * 14.0) * us + 2 * 2 * path) * 1.4;
  EXPECT_NEAR(g.nccl_latency(Collective::kAllReduce, T::kRing, T::kSimple), ar, 1e-12);
}

TEST(NcclLatency, RingLatencyGrowsWithTheRanksTreeWithTheLogOfNodes) {
  // The latency of a ring collective is linear in the ranks: this is what flattens the step
  // time of FSDP at a thousand data-parallel ranks.
  Profile p = default_profile(device_spec("H100-SXM"));
  Cluster big = cluster_preset("dgx-h100", 1024), small = cluster_preset("dgx-h100", 128);
  GroupModel g1024(big, p, iota(0, 1024), {}, false);
  GroupModel g128(small, p, iota(0, 128), {}, false);
  const double l1024 = g1024.nccl_latency(Collective::kAllGather, T::kRing, T::kSimple);
  const double l128 = g128.nccl_latency(Collective::kAllGather, T::kRing, T::kSimple);
  EXPECT_GT(l1024, 7.5 * l128);
  EXPECT_GT(l1024, 1023 * 3.4 * us);
  // A small all-reduce over 1024 ranks takes the tree (2 log2(128 nodes) network steps).
  CollectiveCost ar = g1024.cost(Collective::kAllReduce, 1 << 16);
  EXPECT_EQ(ar.algorithm, Algorithm::kTree);
  EXPECT_LT(g1024.nccl_latency(Collective::kAllReduce, T::kTree, T::kLL),
            0.1 * g1024.nccl_latency(Collective::kAllReduce, T::kRing, T::kLL));
}

TEST(NcclLatency, PatWithOneGpuPerNode) {
  // One GPU on each of 4 servers (a data-parallel group under tp 8): PAT's logarithmic latency
  // with its linear part, 8 + log2(4) x inter / 3.5 + 4 x 2.8 us; inter = the tree's 14 us plus
  // the path twice (Simple).
  Cluster c = cluster_preset("dgx-h100", 32);
  Profile p = default_profile(c.gpu_device(0));
  GroupModel g(c, p, iota(0, 4, 8));
  EXPECT_EQ(g.ranks_per_node(), 1);
  const double inter = 14 * us + 2 * c.path_latency(0, 8);
  EXPECT_NEAR(g.nccl_latency(Collective::kAllGather, T::kPat, T::kSimple),
              8 * us + 2 * inter / 3.5 + 4 * 2.8 * us, 1e-12);
  // PAT moves data at 0.75 of the ring's bandwidth: a large all-gather takes the ring.
  EXPECT_EQ(g.cost(Collective::kAllGather, 1e9).algorithm, Algorithm::kRing);
  EXPECT_NEAR(g.time(Collective::kAllGather, 1e9, Algorithm::kPat) -
                  g.nccl_latency(Collective::kAllGather, T::kPat, T::kSimple),
              (g.time(Collective::kAllGather, 1e9, Algorithm::kRing) -
               g.nccl_latency(Collective::kAllGather, T::kRing, T::kSimple)) /
                  0.75,
              1e-9);
}

TEST(NcclBandwidth, MultiChannelRingUsesEveryNicOfTheServer) {
  // A 64-GPU data-parallel group on 8 DGX A100 servers (tp 1): NCCL's rings cross each server
  // boundary on different NICs, so a large all-gather moves at 8 NICs' bandwidth per server,
  // not one NIC's (HDR 25 GB/s x 0.92 each).
  Cluster c = cluster_preset("dgx-a100-80g", 64);
  Profile p = default_profile(c.gpu_device(0));
  GroupModel g(c, p, iota(0, 64), {}, false);
  const double s = 8e9, nic = 25e9 * p.link_eff(LinkKind::kInfiniband);
  const double bw_time = g.cost(Collective::kAllGather, s).time_s -
                         g.nccl_latency(Collective::kAllGather, T::kRing, T::kSimple);
  EXPECT_NEAR(bw_time, 63.0 / 64 * s / (8 * nic), 0.02 * bw_time);
  // The same GPUs as one flat ring would take one NIC per boundary: 8x slower.
  EXPECT_NEAR(g.ring_bw(), nic, 1e-3 * nic);
}

TEST(NcclAllToAll, AllSendsInFlightShareTheNic) {
  // 16 GPUs on 2 DGX H100 servers, each GPU behind its own 50 GB/s NIC: every rank sends S/16 to
  // each of 8 ranks of the other server at once through its NIC (and 7 over NVLink).
  Cluster c = cluster_preset("dgx-h100", 16);
  Profile p = default_profile(c.gpu_device(0));
  GroupModel g(c, p, iota(0, 16));
  const double s = 1e9, nic = 50e9 * p.link_eff(LinkKind::kInfiniband);
  const double t = g.time(Collective::kAllToAll, s, Algorithm::kPairwise);
  const double expected = 8 * (s / 16) / nic;
  EXPECT_GT(t, expected);
  EXPECT_NEAR(t, expected, 0.05 * expected);
  EXPECT_EQ(g.cost(Collective::kAllToAll, s).algorithm, Algorithm::kPairwise);
}

TEST(NcclP2p, SoftwareLatencyIsOneSimpleRingStep) {
  Profile p = default_profile(device_spec("H100-SXM"));
  EXPECT_NEAR(p2p_software_latency(p, false), (8.4 + 3.4) * us, 1e-12);
  EXPECT_NEAR(p2p_software_latency(p, true), (8.4 + 14.0) * us, 1e-12);
  p.nccl.reset();
  p.collective_step_latency_s = 3 * us;
  EXPECT_NEAR(p2p_software_latency(p, true), 3 * us, 1e-15);
}

}  // namespace
}  // namespace parasol::cost
