// Tests of the MoE dispatcher's bytes on the wire (cost_models/moe_dispatch.h) against the
// combinatorics done independently: the expected number of remote nodes a token's top_k experts
// touch over the plain all-to-all's top_k (N - 1) / N copies.
#include "cost_models/moe_dispatch.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <vector>

#include "core/cluster.h"

namespace parasol::cost {
namespace {

// log C(n, k) through lgamma: an independent way to count the routings that miss a node.
double log_choose(double n, double k) {
  return std::lgamma(n + 1) - std::lgamma(k + 1) - std::lgamma(n - k + 1);
}

constexpr MoeDispatcher kA2a = MoeDispatcher::kAllToAll;

Model moe(int experts, int top_k) {
  Model m = model_preset("mixtral-8x7b");
  m.moe.experts = experts;
  m.moe.top_k = top_k;
  return m;
}

TEST(DispatcherBytes, DeepEpSendsOneCopyPerRemoteNodeHoldingAnExpert) {
  Plan p;
  p.moe_dispatcher = MoeDispatcher::kDeepEp;
  // 8 experts, top-2, 2 nodes of 4 experts: a token misses the other node with probability
  // C(4,2)/C(8,2) = 6/28, so DeepEP sends 22/28 copies against the plain 2 x 1/2 = 1.
  EXPECT_NEAR(dispatcher_bytes_factor(moe(8, 2), p, 2), 22.0 / 28.0, 1e-12);
  for (int nodes : {2, 4, 8, 32}) {
    const double e = 256, k = 8, per_node = e / nodes;
    const double miss = std::exp(log_choose(e - per_node, k) - log_choose(e, k));
    const double expected = (nodes - 1) * (1 - miss) / (k * (nodes - 1) / nodes);
    EXPECT_NEAR(dispatcher_bytes_factor(moe(256, 8), p, nodes), expected, 1e-9) << nodes;
    EXPECT_LT(dispatcher_bytes_factor(moe(256, 8), p, nodes), 1.0) << nodes;
  }
}

TEST(DispatcherBytes, ThePlainAllToAllAndOneNodeMoveEveryCopy) {
  Plan p;
  EXPECT_EQ(dispatcher_bytes_factor(moe(256, 8), p, 8), 1.0);  // all-to-all dispatcher
  p.moe_dispatcher = MoeDispatcher::kDeepEp;
  EXPECT_EQ(dispatcher_bytes_factor(moe(256, 8), p, 1), 1.0);  // inside one node
  // Top-1 routing has nothing to deduplicate.
  EXPECT_NEAR(dispatcher_bytes_factor(moe(64, 1), p, 4), 1.0, 1e-12);
}

// The round-robin gate (AutoModel's FakeBalancedGate, torchtitan's _debug_force_load_balance)
// played token by token: each rank's token t takes experts (t k + i) mod E, experts lie in order
// over the group's nodes, DeepEP sends one copy per remote node a token reaches; averaged over the
// source nodes and over the plain all-to-all's k (N - 1) / N copies per token.
double round_robin_by_hand(int experts, int top_k, int nodes) {
  const int tokens = 4 * experts;  // whole periods of the starts
  double remote = 0;
  for (int home = 0; home < nodes; ++home)
    for (int t = 0; t < tokens; ++t) {
      std::vector<bool> reached(nodes, false);
      for (int i = 0; i < top_k; ++i) reached[(t * top_k + i) % experts * nodes / experts] = true;
      for (int n = 0; n < nodes; ++n) remote += reached[n] && n != home ? 1 : 0;
    }
  remote /= static_cast<double>(nodes) * tokens;
  return remote / (top_k * (nodes - 1.0) / nodes);
}

TEST(DispatcherBytes, RoundRobinGateReachesTheNodesOfItsRunOfExperts) {
  Plan p;
  p.moe_dispatcher = MoeDispatcher::kDeepEp;
  p.moe_force_balance = MoeForceBalance::kRoundRobin;
  // DeepSeek-V3 on EP64 over 8 nodes (32 experts a node), Kimi-K2 on 4 nodes (96), GPT-OSS-120B
  // on 8 nodes (16): every run of top_k experts sits in one node, one remote copy (N - 1) / N of
  // the time: 1 / top_k of the plain exchange, far below random routing's.
  EXPECT_NEAR(dispatcher_bytes_factor(moe(256, 8), p, 8), 1.0 / 8, 1e-12);
  EXPECT_NEAR(dispatcher_bytes_factor(moe(384, 8), p, 4), 1.0 / 8, 1e-12);
  EXPECT_NEAR(dispatcher_bytes_factor(moe(128, 4), p, 8), 1.0 / 4, 1e-12);
  // Runs that straddle nodes or wrap from the last expert to the first.
  for (auto [e, k, n] :
       {std::array<int, 3>{8, 3, 2}, {8, 3, 4}, {12, 5, 3}, {64, 6, 8}, {16, 2, 16}, {6, 4, 2}})
    EXPECT_NEAR(dispatcher_bytes_factor(moe(e, k), p, n), round_robin_by_hand(e, k, n), 1e-12)
        << e << " " << k << " " << n;
  EXPECT_NEAR(dispatcher_bytes_factor(moe(8, 3), p, 2), 0.5, 1e-12);  // spans 1,2,2,1,1,2,2,1
  // Random logits (Megatron's forced balance) route as the trained router's floor does.
  Plan random = p;
  random.moe_force_balance = MoeForceBalance::kRandom;
  Plan none = p;
  none.moe_force_balance = MoeForceBalance::kNone;
  EXPECT_EQ(dispatcher_bytes_factor(moe(256, 8), random, 8),
            dispatcher_bytes_factor(moe(256, 8), none, 8));
  EXPECT_GT(dispatcher_bytes_factor(moe(256, 8), random, 8), 4 * (1.0 / 8));
  // The plain all-to-all moves a copy per (token, remote expert) whatever the gate.
  p.moe_dispatcher = MoeDispatcher::kAllToAll;
  EXPECT_EQ(dispatcher_bytes_factor(moe(256, 8), p, 8), 1.0);
}

// The bytes each expert all-to-all puts on the wire, the rule both predictors price by: the
// plain exchange moves its send buffer; DeepEP the deduplicated copies; under fp8 with an fp8
// dispatch (DeepSeek's framework) DeepEP's forward dispatch moves half of those (fp8 rows), its
// combine and the backward's two do not; Megatron's bf16 dispatch (fp8_dispatch off) all of them.
TEST(DispatcherBytes, WireBytesOfEachAllToAll) {
  const Model m = moe(8, 2);
  Plan p;
  const double send = 1e6;
  EXPECT_EQ(expert_all_to_all_wire_bytes(m, p, 2, send, true), send);
  p.precision = Dtype::kFp8;
  EXPECT_EQ(expert_all_to_all_wire_bytes(m, p, 2, send, true), send);  // plain: no fp8 rows
  p.moe_dispatcher = MoeDispatcher::kDeepEp;
  const double dedup = send * 22.0 / 28.0;
  EXPECT_NEAR(expert_all_to_all_wire_bytes(m, p, 2, send, true), dedup, 1e-6);
  p.fp8_dispatch = true;
  EXPECT_NEAR(expert_all_to_all_wire_bytes(m, p, 2, send, true), dedup / 2, 1e-6);
  EXPECT_NEAR(expert_all_to_all_wire_bytes(m, p, 2, send, false), dedup, 1e-6);
  p.precision = Dtype::kBf16;
  EXPECT_NEAR(expert_all_to_all_wire_bytes(m, p, 2, send, true), dedup, 1e-6);
  // Inside one node DeepEP moves every copy over NVLink in the dtype of the rows.
  p.precision = Dtype::kFp8;
  EXPECT_EQ(expert_all_to_all_wire_bytes(m, p, 1, send, true), send);
}

// Where the group's exchange is bound by an NVLink-domain link the token exchange runs at the
// profile's expert-exchange efficiency of that link: the group's all-to-all time at the link
// kind's efficiency, times their ratio; a group bound by the network, or a profile without the
// figure, keeps the group's time.
TEST(ExpertExchange, NvlinkDomainRunsAtTheDispatchKernelsEfficiency) {
  const Cluster c = cluster_preset("dgx-h100", 16);
  Profile prof = default_profile(c.gpu_device(0));
  prof.expert_exchange_nvlink_efficiency = 0.4;
  std::vector<int> one_server, two_servers;
  for (int i = 0; i < 16; ++i) {
    if (i < 8) one_server.push_back(i);
    two_servers.push_back(i);
  }
  const double bytes = 256e6;
  const GroupModel in(c, prof, one_server), across(c, prof, two_servers);
  // A DGX's GPUs meet at its NVSwitch; two servers' exchange is bound by their NICs.
  ASSERT_EQ(in.all_to_all_link(), LinkKind::kNvswitch);
  ASSERT_EQ(across.all_to_all_link(), LinkKind::kInfiniband);
  const double link = prof.link_eff(LinkKind::kNvswitch);
  const double plain = in.cost(Collective::kAllToAll, bytes).time_s;
  const double latency = in.cost(Collective::kAllToAll, 1).time_s;
  ASSERT_LT(latency, plain);
  EXPECT_NEAR(expert_exchange_time(in, prof, bytes, kA2a), latency + (plain - latency) * link / 0.4,
              1e-12 * plain);
  // The exchange's bytes move at the kernels' efficiency, not the link's: a faster NVSwitch link
  // never slows the exchange, at any size (the latency is not the link's), and the efficiency of
  // a kind the group does not cross (point-to-point NVLink) does not move it.
  Profile faster = prof;
  faster.link_efficiency[static_cast<int>(LinkKind::kNvswitch)] = 0.95;
  Profile other = prof;
  other.link_efficiency[static_cast<int>(LinkKind::kNvlink)] = 0.95;
  const GroupModel in_fast(c, faster, one_server), in_other(c, other, one_server);
  for (double b : {1e3, 1e5, 1e7, 256e6}) {
    EXPECT_LE(expert_exchange_time(in_fast, faster, b, kA2a),
              expert_exchange_time(in, prof, b, kA2a) * (1 + 1e-12))
        << b;
    EXPECT_DOUBLE_EQ(expert_exchange_time(in_other, other, b, kA2a),
                     expert_exchange_time(in, prof, b, kA2a))
        << b;
  }
  // A faster exchange kernel never slows it either.
  Profile kernels = prof;
  kernels.expert_exchange_nvlink_efficiency = 0.6;
  EXPECT_LT(expert_exchange_time(in, kernels, bytes, kA2a),
            expert_exchange_time(in, prof, bytes, kA2a));
  EXPECT_DOUBLE_EQ(expert_exchange_time(across, prof, bytes, kA2a),
                   across.cost(Collective::kAllToAll, bytes).time_s);
  prof.expert_exchange_nvlink_efficiency = 0;
  const GroupModel in0(c, prof, one_server);
  EXPECT_DOUBLE_EQ(expert_exchange_time(in0, prof, bytes, kA2a),
                   in0.cost(Collective::kAllToAll, bytes).time_s);
  // The defaults: Blackwell's kernels reach less of NVLink5 than Hopper's of NVLink4.
  EXPECT_LT(default_profile(device_spec("GB200")).expert_exchange_nvlink_efficiency,
            default_profile(device_spec("H100-SXM")).expert_exchange_nvlink_efficiency);
}

// Megatron's allgather dispatcher (token_dispatcher.py MoEAllGatherTokenDispatcher @d98e8a64dd)
// on one DGX's 8 ranks, counted by hand from a rank's 4096 tokens of hidden 4096 (top-2 of 8
// experts, bf16): forward, all-gathers of the routing map (bool), the probabilities and the
// hidden states of all 8 x 4096 tokens; the combine a reduce-scatter of them in the
// probabilities' dtype; backward the reverse, the probabilities' gradient reduce-scattered too.
TEST(AllGatherDispatcher, GathersEveryTokenAndReducesInTheProbabilitiesDtype) {
  const Cluster c = cluster_preset("dgx-h100", 8);
  const Profile prof = default_profile(c.gpu_device(0));
  std::vector<int> ranks = {0, 1, 2, 3, 4, 5, 6, 7};
  const GroupModel g(c, prof, ranks);
  const Model m = moe(8, 2);
  ASSERT_EQ(m.hidden, 4096);
  Plan p;
  p.ep = 8;
  p.moe_dispatcher = MoeDispatcher::kAllGather;
  const double tokens = 4096, all = 8 * tokens;
  const double a2a = tokens * 2 * m.hidden * 2;  // the all-to-all's send buffer in its place
  auto ag = [&](double b) { return g.cost(Collective::kAllGather, b).time_s; };
  auto rs = [&](double b) { return g.cost(Collective::kReduceScatter, b).time_s; };
  const double hidden = all * m.hidden * 2, map = all * 8, probs16 = all * 8 * 2;
  EXPECT_NEAR(allgather_dispatcher_time(g, m, p, a2a, true, false),
              ag(map) + ag(probs16) + ag(hidden), 1e-12);
  EXPECT_NEAR(allgather_dispatcher_time(g, m, p, a2a, false, false), rs(hidden), 1e-12);
  EXPECT_NEAR(allgather_dispatcher_time(g, m, p, a2a, false, true), ag(hidden), 1e-12);
  EXPECT_NEAR(allgather_dispatcher_time(g, m, p, a2a, true, true), rs(hidden) + rs(probs16), 1e-12);
  // --moe-router-dtype fp32: the combine and its gradient move fp32 rows.
  p.moe_router_fp32 = true;
  EXPECT_NEAR(allgather_dispatcher_time(g, m, p, a2a, false, false), rs(2 * hidden), 1e-12);
  EXPECT_NEAR(allgather_dispatcher_time(g, m, p, a2a, false, true), ag(2 * hidden), 1e-12);
  EXPECT_NEAR(allgather_dispatcher_time(g, m, p, a2a, true, false),
              ag(map) + ag(2 * probs16) + ag(hidden), 1e-12);
  // Every rank's tokens reach every rank: more than the all-to-all's routed copies.
  EXPECT_GT(allgather_dispatcher_time(g, m, p, a2a, true, false),
            expert_exchange_time(g, prof, a2a, MoeDispatcher::kAllToAll));
}

// Across servers, DeepEP-class kernels (MoeDispatcher::kDeepEp) move the bytes that cross the
// NIC at the profile's internode exchange efficiency (its two-server figure over two servers);
// NCCL's all-to-all keeps the link's; a profile without the figures (Blackwell's) keeps the
// group's time.
TEST(ExpertExchange, DeepEpAcrossServersRunsAtTheInternodeKernelsEfficiency) {
  const Cluster c = cluster_preset("dgx-h100", 32);
  const Profile prof = default_profile(c.gpu_device(0));
  ASSERT_GT(prof.expert_exchange_network_efficiency, 0);
  ASSERT_GT(prof.expert_exchange_network_efficiency_two_servers, 0);
  EXPECT_LT(prof.expert_exchange_network_efficiency_two_servers,
            prof.expert_exchange_network_efficiency);
  const double bytes = 256e6;
  for (int servers : {2, 4}) {
    SCOPED_TRACE(servers);
    std::vector<int> group;
    for (int i = 0; i < 8 * servers; ++i) group.push_back(i);
    const GroupModel across(c, prof, group);
    ASSERT_EQ(across.all_to_all_link(), LinkKind::kInfiniband);
    ASSERT_EQ(across.nodes(), servers);
    const double e = servers == 2 ? prof.expert_exchange_network_efficiency_two_servers
                                  : prof.expert_exchange_network_efficiency;
    const double plain = across.cost(Collective::kAllToAll, bytes).time_s;
    const double latency = across.cost(Collective::kAllToAll, 1).time_s;
    EXPECT_DOUBLE_EQ(expert_exchange_time(across, prof, bytes, kA2a), plain);
    EXPECT_NEAR(expert_exchange_time(across, prof, bytes, MoeDispatcher::kDeepEp),
                latency + (plain - latency) * prof.link_eff(LinkKind::kInfiniband) / e,
                1e-12 * plain);
    Profile none = prof;
    none.expert_exchange_network_efficiency = 0;
    none.expert_exchange_network_efficiency_two_servers = 0;
    EXPECT_DOUBLE_EQ(expert_exchange_time(across, none, bytes, MoeDispatcher::kDeepEp), plain);
  }
  EXPECT_EQ(default_profile(device_spec("B200")).expert_exchange_network_efficiency, 0);
  EXPECT_EQ(default_profile(device_spec("B200")).expert_exchange_network_efficiency_two_servers, 0);
}

// The predicted internode exchange against HybridEP's published H100 table (deepseek-ai/DeepEP
// branch hybrid-ep @94a9f8f docs/README_Hybrid-EP.md: 4096 tokens a rank, hidden 7168, top-8, 8
// experts a rank, BF16, Torch API, 16 SMs): dispatch 54.47 / 47.36 / 41.24 GB/s at 16 / 32 / 64
// ranks, where the bytes are every (token, node it reaches) pair, its own node included
// (tests/utils.py count_rdma_send_from_routing_map): the measured seconds are those bytes over
// the figure, the expected nodes counted here independently (1 - C(E - E/N, k) / C(E, k) per
// node). parasol's wire bytes and exchange time on 2, 4 and 8 DGX H100s stay within 30% (EP16,
// where the NVLink leg weighs most, is the farthest: about -24%).
TEST(ExpertExchange, InternodeExchangeFollowsHybridEpOnH100) {
  const double tokens = 4096, hidden = 7168, top_k = 8;
  const struct {
    int ranks;
    double gbps;
  } rows[] = {{16, 54.47}, {32, 47.36}, {64, 41.24}};
  for (const auto& r : rows) {
    const int nodes = r.ranks / 8, experts = 8 * r.ranks;
    const double miss =
        std::exp(log_choose(experts - experts / nodes, top_k) - log_choose(experts, top_k));
    const double measured = tokens * nodes * (1 - miss) * hidden * 2 / (r.gbps * 1e9);
    const Cluster c = cluster_preset("dgx-h100", r.ranks);
    const Profile prof = default_profile(c.gpu_device(0));
    std::vector<int> group;
    for (int i = 0; i < r.ranks; ++i) group.push_back(i);
    const GroupModel gm(c, prof, group);
    Model m = moe(experts, static_cast<int>(top_k));
    Plan p;
    p.moe_dispatcher = MoeDispatcher::kDeepEp;
    const double send = tokens * top_k * hidden * 2;
    const double wire = expert_all_to_all_wire_bytes(m, p, nodes, send, false);
    const double t = expert_exchange_time(gm, prof, wire, MoeDispatcher::kDeepEp);
    EXPECT_GT(t, 0.7 * measured) << r.ranks;
    EXPECT_LT(t, 1.3 * measured) << r.ranks;
  }
}

// An NVL72 rack is one NVLink domain: an expert group of 32 of its GPUs is bound by NVSwitch.
TEST(ExpertExchange, Nvl72GroupIsBoundByNvswitch) {
  const Cluster c = cluster_preset("gb200-nvl72", 72);
  const Profile prof = default_profile(c.gpu_device(0));
  std::vector<int> group;
  for (int i = 0; i < 32; ++i) group.push_back(i);
  const GroupModel gm(c, prof, group);
  EXPECT_EQ(gm.all_to_all_link(), LinkKind::kNvswitch);
  const double t = gm.cost(Collective::kAllToAll, 256e6).time_s;
  EXPECT_GT(expert_exchange_time(gm, prof, 256e6, kA2a), t);  // 0.55 of the link, below its 0.8
}

}  // namespace
}  // namespace parasol::cost
