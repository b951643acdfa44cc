// Collective cost model on a *placed* group: which GPUs of the topology take part. Each
// algorithm's bandwidth is the bottleneck along the paths its flows take in the topology graph,
// where flows that cross the same link in the same direction (of this group and of the groups
// running concurrently, e.g. all data-parallel groups of a stage behind the same NICs) share it.
//
// On GPUs (Profile::nccl) the algorithms and latencies are NCCL's (src/graph/tuning.cc): ring
// all-gather / reduce-scatter take n - 1 steps and all-reduce 2(n - 1), each step over NVLink
// or, nodes - 1 (2(nodes - 1)) times, over the network, with per-protocol step latencies; the
// tree all-reduce (intra-node chain, inter-node double binary tree: hierarchical bandwidth,
// 2 ((ppn - 1) intra + log2(nodes) inter) latency); PAT for all-gather / reduce-scatter with one
// GPU per node; protocols LL, LL128 and Simple trade bandwidth for latency; the fastest
// (algorithm, protocol) wins, as in NCCL. Without NCCL tuning (MPI on the CPU runtime) the
// algorithms are ring, binary tree, hierarchical (intra-server then inter-server) and pairwise
// with the path latency plus the profile's software latency per step.
//
// Sizes follow nccl-tests: all-reduce and broadcast take the buffer size; all-gather the
// gathered (output) size; reduce-scatter the input size; all-to-all the bytes each rank holds
// before the exchange. A ring all-reduce moves 2(n-1)/n of it per rank, all-gather and
// reduce-scatter (n-1)/n.
#pragma once

#include <array>
#include <optional>
#include <string>
#include <vector>

#include "core/cluster.h"
#include "cost_models/profile.h"

namespace parasol::cost {

enum class Collective { kAllReduce, kAllGather, kReduceScatter, kAllToAll, kBroadcast };
enum class Algorithm { kRing, kTree, kHierarchical, kPairwise, kPat };

const char* collective_name(Collective c);
const char* algorithm_name(Algorithm a);

struct CollectiveCost {
  double time_s = 0;
  Algorithm algorithm = Algorithm::kRing;
};

// A group of GPUs (cluster GPU indices, in rank order) priced once; cost() is arithmetic.
class GroupModel {
 public:
  GroupModel() = default;
  // `concurrent`: other groups that run the same collective at the same time (may include
  // `group` itself; it is ignored). Rings longer than kMaxPricedFlows are priced on their
  // first kMaxPricedFlows flows (the pattern repeats along a regular fabric), and only the
  // concurrent groups on the servers those flows touch are counted.
  // `price_all_to_all`: also price the pairwise all-to-all (it samples several exchange steps,
  // so ask for it only on groups that run all-to-alls, the expert-parallel ones); otherwise an
  // all-to-all is priced as a ring.
  GroupModel(const Cluster& cluster, const Profile& profile, std::vector<int> group,
             const std::vector<std::vector<int>>& concurrent = {}, bool price_all_to_all = true);

  static constexpr int kMaxPricedFlows = 64;

  int size() const { return n_; }
  // The fastest algorithm for this collective and size.
  CollectiveCost cost(Collective kind, double bytes) const;
  // One algorithm (kHierarchical falls back to ring when the group is on one server).
  double time(Collective kind, double bytes, Algorithm alg) const;

  // Effective per-flow bandwidths (bytes/s, efficiency applied) and per-step latencies.
  double ring_bw() const { return ring_bw_; }
  double ring_step_latency() const { return ring_lat_; }
  double tree_bw() const { return tree_bw_; }
  // Servers the group spans and its largest number of GPUs on one server.
  int nodes() const { return nodes_; }
  int ranks_per_node() const { return ppn_; }
  // The kind of link that bounds the all-to-all's slowest flow (NCCL's grouped sends, or the
  // slowest sampled pairwise step): the links its bytes are priced at. REQUIRES: constructed with
  // price_all_to_all and at least two members.
  LinkKind all_to_all_link() const { return a2a_link_; }
  // NCCL's latency of one collective (algorithm ring/tree/PAT, protocol 0-2; see NcclTuning),
  // without the bandwidth term. REQUIRES: the profile has NCCL tuning.
  double nccl_latency(Collective kind, int algorithm, int protocol) const;

 private:
  // The concurrent groups that share links with this one's priced flows.
  using Siblings = std::vector<const std::vector<int>*>;
  // The constructor's steps, in order. Servers spanned, GPUs per server, and the transports
  // inside a server and between servers.
  void find_placement(const Cluster& cluster, const std::vector<int>& group);
  // Ring: bottleneck bandwidth and step latency (one step as a point-to-point send).
  void price_ring(const Cluster& cluster, const Profile& profile, const std::vector<int>& group,
                  const Siblings& siblings);
  // Binary tree over the group order: bandwidth, step latency and depth.
  void price_tree(const Cluster& cluster, const Profile& profile, const std::vector<int>& group,
                  const Siblings& siblings);
  // Hierarchical (uniform groups over several servers): intra-server rings, then rails.
  void price_hierarchical(const Cluster& cluster, const Profile& profile,
                          const std::vector<int>& group, const Siblings& siblings);
  // NCCL's multi-channel ring bandwidth and its latency table.
  void price_nccl_ring();
  // Pairwise all-to-all: time per byte of one exchange step and its latency.
  void price_pairwise(const Cluster& cluster, const Profile& profile, const std::vector<int>& group,
                      const Siblings& siblings);
  // NCCL's grouped all-to-all: every send of a rank in flight at once.
  void price_nccl_all_to_all(const Cluster& cluster, const Profile& profile,
                             const std::vector<int>& group, const Siblings& siblings);

  double ring_time(Collective kind, double bytes, int n, double bw, double lat) const;
  // NCCL: the best protocol's time of `algorithm` (kRing, kTree, kPat); infinity if unusable.
  double nccl_time(Collective kind, double bytes, Algorithm algorithm) const;
  double hierarchical_bandwidth_time(Collective kind, double bytes) const;

  std::optional<NcclTuning> nccl_;
  int nodes_ = 1, ppn_ = 1;
  int intra_transport_ = NcclTuning::kNvlink;  // how the group's GPUs on one server are joined
  double inter_path_latency_ = 0;              // hardware latency of a cross-server hop of the ring
  double ring_lat_extra_ = 0;  // the profile's software latency per step (NCCL mode)
  int n_ = 1;
  double ring_bw_ = 0, ring_lat_ = 0;
  double tree_bw_ = 0, tree_lat_ = 0;
  int tree_depth_ = 0;
  bool hierarchical_ = false;
  int local_ = 1, servers_ = 1;
  double intra_bw_ = 0, intra_lat_ = 0, inter_bw_ = 0, inter_lat_ = 0;
  bool pairwise_ = false;
  double a2a_step_time_per_byte_ = 0, a2a_lat_ = 0;
  double a2a_grouped_per_byte_ = 0;
  LinkKind a2a_link_ = LinkKind::kNvswitch;  // all_to_all_link()
  double nccl_ring_bw_ = 0;                  // NCCL's multi-channel ring bandwidth per rank
  // nccl_latency() of every (collective, algorithm, protocol), computed once.
  std::array<std::array<std::array<double, 3>, 3>, 5> nccl_lat_{};
  double compute_nccl_latency(Collective kind, int algorithm,
                              int protocol) const;  // NCCL: all sends at
                                                    // once (seconds per byte of the buffer)
};

// A flow: data sent from one GPU to another at the same time as the other flows of a set.
struct Flow {
  int src;
  int dst;
};
// For each flow, the bandwidth it gets (bytes/s, link efficiency applied) when all `flows` run
// at once, each link direction shared equally by the flows that cross it; its path latency; and
// the kind of the link that bounds its bandwidth (the first such hop along the path).
struct FlowRate {
  double bw;
  double latency;
  LinkKind bound = LinkKind::kNvswitch;
};
std::vector<FlowRate> concurrent_flow_rates(const Cluster& cluster, const Profile& profile,
                                            const std::vector<Flow>& flows);

// Seconds to send `bytes` from GPU a to GPU b alone (pipeline send/recv).
double p2p_time(const Cluster& cluster, const Profile& profile, int a, int b, double bytes);
// Software latency of one point-to-point send beside the path's hardware latency: NCCL's Simple
// ring step (base + per-step latency of the transport) on GPUs, the profile's step latency else.
double p2p_software_latency(const Profile& profile, bool crosses_servers);

// A pipeline hop: every flow of `flows` (each rank of one stage sending to its peer in the next)
// at once. Its bandwidth is the slowest flow's; its latency the largest path latency plus one
// send's software latency (p2p_software_latency; flows[0] says whether the hop crosses servers).
// The one price of a pipeline send, read by the closed form (cost_models/estimate.cc) and the op
// pricer the simulator plays (cost_models/op_cost.cc). A flow from a rank to itself costs
// nothing: infinite bandwidth, no latency. REQUIRES: flows is not empty.
struct HopRate {
  double bw;       // bytes/s
  double latency;  // seconds
};
HopRate pipeline_hop(const Cluster& cluster, const Profile& profile,
                     const std::vector<Flow>& flows);

}  // namespace parasol::cost
