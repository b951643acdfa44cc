// The load of the busiest rank of an expert-parallel group: under dropless routing every rank
// processes the rows routed to its experts, and the combine of each MoE layer waits for the
// slowest rank, so the hottest rank's rows set the layer's expert time. The lowering emits the
// hot rank's rows (core/lower_moe.cc), so that both predictors price it and the memory model
// holds it; the op pricer's breakdown names the excess "imbalance".
#pragma once

#include <cstdint>

#include "core/model.h"
#include "core/plan.h"

namespace parasol {

// The expected maximum of n independent standard normal variables, by Blom's approximation
// Phi^-1((n - 0.375) / (n + 0.25)) (G. Blom, "Statistical Estimates and Transformed
// Beta-Variables", 1958; within 1% of the tabulated expected normal order statistics of Harter
// 1961 for n = 2..400). 0 for n <= 1.
double expected_max_standard_normal(int n);

// The rows the busiest of `ep` ranks receives over the mean `rows_per_rank`, when each token
// picks its top_k of the model's experts uniformly at random (Megatron-Core's
// moe_router_force_load_balancing replaces the router logits by random normals,
// megatron/core/transformer/moe/router.py; torchtitan's and AutoModel's forced-balance gates
// are round-robin instead, priced by the Plan overload below): a rank that holds E / ep experts
// gets, from each token,
// a hypergeometric count with mean k / ep and variance k (1/ep)(1 - 1/ep)(E - k)/(E - 1), so
// over the group's ep rows_per_rank / k tokens its rows have mean rows_per_rank and standard
// deviation sqrt(rows_per_rank (1 - 1/ep)(E - k)/(E - 1)); the expected busiest rank is
// expected_max_standard_normal(ep) standard deviations above the mean. This is the floor every
// dropless router reaches (learned routing is at best as balanced as a random one). 1 for a
// dense model, ep <= 1, or no rows.
double moe_hot_rank_factor(const Model& m, int ep, double rows_per_rank);

// The busiest rank's factor under the plan's forced balance (Plan::moe_force_balance):
// moe_hot_rank_factor for none and random; for round_robin the exact count of the gate that
// gives token t of every rank the experts (t * top_k + i) mod E, i < top_k (NVIDIA-NeMo/
// Automodel@8d9bfb90e nemo_automodel/components/moe/layers.py L509-552 FakeBalancedGate:
// `torch.arange(x.size(0) * a_exp).view(-1, a_exp) % available_experts`, the gate when the
// benchmark sets fake_balanced_gate, L868; pytorch/torchtitan v0.2.2 torchtitan/models/moe/
// moe.py L234-249 _debug_force_load_balance_routing, the same round-robin; a rank holds the
// experts from ep_rank x E/ep on, Automodel layers.py L258-260): a rank's rows_per_rank =
// T top_k routed rows are the consecutive integers
// 0..T top_k - 1 modulo E, so expert e gets floor(T top_k / E), plus one for the first
// T top_k mod E experts, from each of the ep ranks; the first rank (experts 0..E/ep - 1) is the
// busiest. 1 for a dense model, ep <= 1, or no rows.
double moe_hot_rank_factor(const Model& m, const Plan& p, double rows_per_rank);

// The hot rank's rows: ceil(rows_per_rank x moe_hot_rank_factor).
int64_t moe_hot_rank_rows(const Model& m, int ep, int64_t rows_per_rank);

// Megatron-Core's expert fc2 bias loop (Plan::expert_bias_loop; TEGroupedMLP._apply_bias,
// megatron/core/transformer/moe/experts.py @4415119): for each local expert e, on its rows t_e
// (the fc2 output, activation dtype a) and their router probabilities p_e (Plan::moe_probs_dtype
// q), `t_e + b_e * p_e` in the wider dtype w = max(a, q) (PyTorch's type promotion), then
// torch.cat of the pieces and .to(a). Per element of the routed rows x hidden, HBM bytes read
// plus written:
//  forward:  b*p writes w; the add reads a + w and writes w; cat reads and writes w; the cast
//            (only when w != a) reads w and writes a;
//  backward: the cast's backward (w != a) reads a, writes w; each piece's gradient to t_e cast
//            back (w != a) reads w, writes a; mul's backward for b and for p, each a product
//            (read w, write w) then a sum over rows or columns (read w); split's backward
//            concatenates the pieces' gradients (read a, write a).
// Kernels: forward 2 per expert (mul, add), cat, and the cast when w != a; backward 4 per expert
// (two products and two sums), the per-expert gradient casts and the cast's backward when
// w != a, the accumulation of each expert's bias gradient into its main gradient (Megatron's
// DDP hook), and the two concatenations of split's backward (rows and probabilities).
// Without probabilities (probs false: NeMo AutoModel's fc1 bias under Plan::moe_gmm_experts,
// GroupedExpertsDeepEP._apply_bias `t + b` in the activation dtype a, Automodel@8d9bfb90e
// nemo_automodel/components/moe/layers.py): forward the add reads and writes a, cat reads and
// writes a, and the cast is no copy; backward split's backward concatenates the pieces'
// gradients (read a, write a) and each expert's bias gradient is a sum over its rows (read a).
// Kernels: forward one add per expert and the cat; backward one sum per expert, each expert's
// gradient written into the stacked bias's gradient (the backward of iterating the [E, n]
// parameter), and the cat.
struct ExpertBiasLoop {
  double bytes_per_element = 0;
  int64_t kernels = 0;
};
ExpertBiasLoop expert_bias_loop(const Plan& plan, bool backward, int64_t local_experts,
                                bool probs = true);

// The kernels of Megatron-Core's router after its gating GEMM, on the [tokens, experts] scores
// (megatron/core/transformer/moe/router.py TopKRouter.routing and moe_utils.py @cd4afffa6: the
// softmax score function of Megatron's default, the top-k not pre-softmax, one load-balancing
// loss of Megatron's default type aux_loss, as every Megatron recipe of the suite sets, and no
// z-loss). Forward:
//  - fused (Plan::moe_router_fusion): fused_topk_with_score_function, fused_compute_score_for_
//    moe_aux_loss, routing_map.sum(dim=0) for the tokens per expert, fused_moe_aux_loss, and the
//    metrics tracker's aux_loss / coeff and its accumulation: 6;
//  - eager: topk, softmax, type_as, zeros_like + scatter of the probabilities, zeros_like + int +
//    scatter + bool of the routing map (9); the aux-loss scores' softmax, topk and routing map
//    (6); the tokens per expert (1); the loss's probs.sum(dim=0), product, sum and scale (4); the
//    tracker (2): 22;
//  - under Plan::moe_force_balance random, RandomSTE's logits.clone().normal_() adds 2.
// Backward:
//  - fused: MoEAuxLossAutoScaler's ones_like x scale (2), the three fused kernels' backward (3),
//    the sum of the logits' two gradients (1): 6;
//  - eager: the scaler (2), the loss's product and expand (2), the aux scores' softmax backward
//    (1), the scatter's gather, type_as, softmax backward, topk's zeros + scatter (5), the sum of
//    the logits' gradients (1): 11.
// Under Plan::moe_force_balance round_robin the gate is NeMo AutoModel's FakeBalancedGate
// (Automodel@01883b41 nemo_automodel/components/moe/layers.py): torch.ones / a_exp, arange,
// remainder, type_as: 5 kernels forward, none backward (its weights are constants; 1 kept for
// the gradient the lowering's router GEMMs read, which it emits under every gate).
// Each kernel reads and writes at most one fp32 [tokens, experts] tensor: 8 bytes per element
// each (the routing op's bytes; an upper bound: the top-k outputs are [tokens, top_k]). The
// time of so small a tensor is mostly the kernels' gaps (Profile::kernel_overhead_s each).
struct RouterKernels {
  double bytes_per_element = 0;  // per element of the [tokens, experts] scores
  int64_t kernels = 0;
};
RouterKernels router_kernels(const Plan& plan, bool backward);

}  // namespace parasol
