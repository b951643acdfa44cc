// The price of one decoder layer for one micro-batch on one rank, from its lowered fragment
// (core/lower.h's lower_layer_fragment): the same ops the simulator plays in a stage's Program,
// each priced by the op pricer (cost_models/op_cost.h). The closed-form estimate sums these
// prices over a stage's layers, so a layer is described once, by the lowering.
//
// The fragment's passes are played by the Program's execution rules (core/issue_graph.h, whose
// graph links the nodes): an op starts once its dependencies and the op before it on its stream
// have finished; the transfers of one p2p group start together once all of them are ready; a
// receive completes with the send it pairs with (by symmetry a ring neighbour sends when this
// rank does); a send holds its stream until it has completed. What the event simulator adds on top
// (link sharing between concurrent transfers, compute slowed while communication runs) is not
// played here: the closed form charges Profile::overlap_compute_slowdown on the hidden
// communication instead (dp_overlap_compute_slowdown on the data-parallel traffic). The compute
// stream's idle time is the exposed communication, charged to the group of the op the waiting
// compute op (or the pass's end) waited for last, in the waiting op's phase.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <vector>

#include "core/host_issue.h"
#include "core/issue_graph.h"
#include "core/lower.h"
#include "cost_models/op_cost.h"

namespace parasol::cost {

// The MoE block's compute by part (seconds): shares of the compute, not further terms of it.
struct MoeParts {
  double expert_gemm = 0;  // the grouped expert GEMMs (kExpertLinear), at the busiest rank's rows
  double permutation = 0;  // token permutation and un-permutation (kDispatch, kCombine)
  double routing = 0;      // the router's GEMMs and routing kernels (kRouter)
  double activation = 0;   // the routed experts' activation (OpRole::kExpertAct)
  // The experts' biases added per local expert outside the grouped GEMMs: fc2's
  // (OpRole::kExpertBias, Plan::expert_bias_loop or moe_gmm_experts) and fc1's
  // (OpRole::kExpertFc1Bias, Plan::moe_gmm_experts).
  double expert_bias = 0;
  // What the busiest expert-parallel rank's excess rows add to the expert-side compute above
  // (Op::load): included in expert_gemm, activation and expert_bias.
  double imbalance = 0;
  void add(const MoeParts& o, double n) {
    expert_gemm += n * o.expert_gemm;
    permutation += n * o.permutation;
    routing += n * o.routing;
    activation += n * o.activation;
    expert_bias += n * o.expert_bias;
    imbalance += n * o.imbalance;
  }
};

// Per-layer, per-micro-batch prices on one rank.
struct LayerPrice {
  double forward = 0, backward = 0;        // compute seconds
  double tp_forward = 0, tp_backward = 0;  // exposed TP/SP (and expert TP) communication
  double tp_hidden = 0;                    // TP/SP communication overlapped with compute
  double cp_forward = 0, cp_backward = 0;  // exposed CP communication
  double cp_hidden = 0;
  double ep_forward = 0, ep_backward = 0;  // exposed expert all-to-all
  double ep_hidden = 0;
  double forward_flops = 0;  // executed FLOPs of the forward
  // Re-run in the backward under selective recompute by the plan's modules (Plan::recomputes):
  // seconds (with the communication exposed on their path) and FLOPs.
  double selective_recompute = 0, selective_recompute_flops = 0;
  // Bytes the layer's TP (Group::kTp collectives), CP (ring sends) and EP (all-to-alls)
  // communication moves per micro-batch on one rank, forward and backward (with selective
  // recompute) apart, as the fragment's ops carry them (nccl-tests' convention).
  double tp_bytes_forward = 0, tp_bytes_backward = 0;
  double cp_bytes_forward = 0, cp_bytes_backward = 0;
  double ep_bytes_forward = 0, ep_bytes_backward = 0;
  // The MoE block's compute of the layer's passes (forward, backward and selective recompute).
  MoeParts moe;
  // Seconds the host spends issuing the layer's ops (cost_models/host_cost.h): the forward, the
  // backward and the selective recompute inside it (core/host_issue.h's rule paces them).
  double host_forward = 0, host_backward = 0, host_recompute = 0;
  // Device-to-host syncs the host makes in the forward and in the selective recompute (dropless
  // MoE token counts), each throwing away the host's lead.
  int syncs_forward = 0, syncs_recompute = 0;
  // The forward's and the backward's passes (with the selective recompute in it) played with the
  // host cursor (core/host_issue.h's HostPace: each op starts no earlier than the host has issued
  // it, a sync blocks the host): what they do to the host's and the device's clocks. A pass that
  // interleaves two micro-batches' phases (ep_comm_overlap) is the backward's.
  HostPace pace_forward, pace_backward;
};

// A fragment reduced to what its play needs, its compute ops priced: what the closed form keeps
// in its caches instead of the Program (a few dozen bytes per op). Its communication is priced
// per placement of the groups (communication_seconds).
struct PlayableFragment {
  struct Node {
    double seconds = 0;  // compute ops: priced; communication: communication_seconds' entry
    double host = 0;     // seconds the host spends issuing it
    double flops = 0;
    int deps_begin = 0, deps_end = 0;  // its dependencies: deps[deps_begin, deps_end)
    // From the fragment's issue graph (core/issue_graph.h; link_playable): one past the last node
    // of its issue group (its p2p group, or itself alone), the node before it on its stream (-1:
    // none) and, a receive, the node of the send it completes with.
    int issue_end = 0;
    int stream_prev = -1;
    int send = -1;
    int comm = -1;  // communication: its entry in comm_ops (receives: -1)
    uint8_t stream = 0;
    uint8_t phase = 0;     // Phase
    uint8_t category = 0;  // communication: 0 TP (and the rest), 1 CP, 2 EP
    bool compute = false, recv = false;
    bool sync = false;  // a device-to-host sync of the host (OpKind::kSync)
    // The dense module (LayerFragment::modules' index) of the first weight the op reads; -1:
    // it reads none.
    int16_t module = -1;
  };
  std::vector<Node> nodes;  // one per op of the fragment's Program, in issue order
  std::vector<int> deps;
  std::vector<LayerFragment::Pass> passes;
  int streams = 0;
  // The communication ops to price, one per shape the op pricer tells apart (OpPricer::shape),
  // stripped of names and buffers.
  std::vector<Op> comm_ops;
  // Only its *_bytes_* fields (the fragment's communication volumes) and its MoE parts.
  LayerPrice bytes;
  int modules = 0;  // LayerFragment::modules' count
};

// The compute seconds of each use of the layer's dense modules in the fragment's forward and
// backward passes, as DeepSpeed ZeRO-3's lazy gathers see them (core/zero3_live.h, the lowering's
// ds_reach): a use runs from the op that first reads the module's weights to the op that first
// reads the next module's (forward: the modules in order; backward: in reverse, a weight's
// data-gradient op reaching it); ops before the pass's first use join it. Indexed by module.
struct ModuleUseSeconds {
  std::vector<double> forward, backward;
};
ModuleUseSeconds module_use_seconds(const PlayableFragment& f);

// Links f's nodes by the execution rules of `graph`, the issue graph of the Program they were made
// from (one node per op): the issue groups, each node's stream predecessor, each receive's send.
// REQUIRES: no issue group straddles a pass's bounds; a receive inside a pass completes with a
// send issued no later than itself (PARASOL_CHECK).
void link_playable(PlayableFragment& f, const IssueGraph& graph);

// `fragment` made playable, its compute ops priced by `pricer`.
// REQUIRES: `pricer` prices the plan `fragment` was lowered from.
PlayableFragment make_playable(const LayerFragment& fragment, OpPricer& pricer);

// The seconds of each of `f.comm_ops` on stage `stage`'s representative rank and placed groups.
std::vector<double> communication_seconds(const PlayableFragment& f, OpPricer& pricer, int stage);

// The layer's price: the passes played with those communication seconds.
// REQUIRES: comm_seconds.size() == f.comm_ops.size().
LayerPrice play_layer_fragment(const PlayableFragment& f, const std::vector<double>& comm_seconds);

// The three steps at once, on stage `stage`.
LayerPrice price_layer_fragment(const LayerFragment& fragment, OpPricer& pricer, int stage);

// Playable fragments shared by the Estimators of one search (one model, cluster and profile:
// the compute seconds depend on them), so that the workers lower each layer kind once.
// Thread-safe.
class FragmentCache {
 public:
  // (tp, cp, ep, etp, micro-batch, sequence, precision, the plan's switches and the layer kind,
  // the plan's second word of switches): what shapes a fragment's ops and their compute prices
  // (Estimator::fragment).
  using Key = std::tuple<int, int, int, int, int, int64_t, int, int64_t, int64_t>;
  // The fragment of `key`, or null.
  std::shared_ptr<const PlayableFragment> find(const Key& key) const;
  // Files `fragment` under `key` unless another thread did first; returns the one filed.
  std::shared_ptr<const PlayableFragment> insert(const Key& key, PlayableFragment fragment);

 private:
  mutable std::mutex mutex_;
  std::map<Key, std::shared_ptr<const PlayableFragment>> map_;
};

}  // namespace parasol::cost
