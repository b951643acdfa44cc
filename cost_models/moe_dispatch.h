// What the plan's MoE token dispatcher puts on the wire: the factor on the bytes of a plain
// all-to-all (one copy per (token, routed expert) that lives on another rank); and how fast the
// dispatch and combine kernels move them inside an NVLink domain. Used alike by the closed-form
// estimate and by the event simulator's price of each expert all-to-all op.
#pragma once

#include "core/model.h"
#include "core/plan.h"
#include "cost_models/collective.h"
#include "cost_models/profile.h"

namespace parasol::cost {

// DeepEP (Megatron's "flex" dispatcher with DeepEP/HybridEP) sends a token once per remote node
// that holds one of its experts and forwards it inside the node over NVLink. With balanced
// routing of top_k of E experts spread over N nodes, a remote node gets none of a token's
// experts with probability C(E - E/N, k) / C(E, k); the plain all-to-all sends
// top_k (N - 1) / N copies per token across nodes. Returns the ratio of the two (1 for the
// plain all-to-all, or when the expert-parallel group sits in one node).
// Under Plan::moe_force_balance round_robin the experts are not drawn at random: token t takes
// the top_k consecutive experts from t * top_k mod E (core/moe_load.h), and the experts lie in
// order over the group's ranks and nodes (node of expert e: e N / E), so a token reaches the
// nodes its run of experts spans (one, where a node's experts hold whole runs), a remote one
// (N - 1) / N of the time by symmetry; the ratio is the mean span over the starts, over top_k.
double dispatcher_bytes_factor(const Model& m, const Plan& p, int ep_nodes);

// The bytes one expert all-to-all puts on the wire: `bytes` of the plain all-to-all (its send
// buffer) times dispatcher_bytes_factor, and DeepEP's forward dispatch in fp8 when the plan
// trains in fp8 and dispatches fp8 (Plan::fp8_dispatch; half the bytes; the combine and the
// backward's two exchanges stay bf16).
// `forward_dispatch`: the forward pass's dispatch (not its combine, not a backward exchange).
// The one rule both predictors price an expert all-to-all by.
double expert_all_to_all_wire_bytes(const Model& m, const Plan& p, int ep_nodes, double bytes,
                                    bool forward_dispatch);

// Seconds of an expert all-to-all of `wire_bytes` (expert_all_to_all_wire_bytes) on its placed
// group `gm` under the plan's `dispatcher`. Where the group's exchange is bound by an
// NVLink-domain link (GroupModel::all_to_all_link() is NVLink or NVSwitch: one DGX server, one
// NVL72 rack), the token exchange runs at Profile::expert_exchange_nvlink_efficiency of that
// link's bandwidth where the profile has the figure; where it is bound by a network link (across
// servers) and the dispatcher is DeepEP-class (MoeDispatcher::kDeepEp: DeepEP's or HybridEP's
// internode kernels), at Profile::expert_exchange_network_efficiency of the NIC's (its
// _two_servers figure where the group spans two servers): the group's
// collective time at that link kind's efficiency, its bandwidth term scaled by their ratio.
// Otherwise (NCCL's all-to-all across servers, or no figure) the group's collective time.
double expert_exchange_time(const GroupModel& gm, const Profile& prof, double wire_bytes,
                            MoeDispatcher dispatcher);

// Seconds of one expert exchange under Megatron's allgather dispatcher (MoeDispatcher::kAllGather;
// Megatron-LM @d98e8a64dd megatron/core/transformer/moe/token_dispatcher.py
// MoEAllGatherTokenDispatcher, at tp 1 its group is the expert-parallel one) on the placed group
// `gm`. `a2a_bytes` is the send buffer of the plain all-to-all the lowering emits in its place
// (the rank's routed rows: tokens x top_k x hidden in the activations' dtype). Forward, the
// dispatch all-gathers the routing map (bool), the probabilities and the hidden states of every
// rank's tokens (token_dispatch), and the combine reduce-scatters every token's partial output in
// the probabilities' dtype (token_combine: hidden_states.to(local_probs.dtype)); backward, the
// combine's exchange is that reduce-scatter's all-gather and the dispatch's the reduce-scatters
// of the hidden states' and the probabilities' gradients (gather_from_sequence_parallel_region's
// backward). `dispatch`: the dispatch's exchange (else the combine's).
double allgather_dispatcher_time(const GroupModel& gm, const Model& m, const Plan& p,
                                 double a2a_bytes, bool dispatch, bool backward);

}  // namespace parasol::cost
