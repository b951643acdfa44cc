// The load of the busiest rank of an expert-parallel group: under dropless routing every rank
// processes the rows routed to its experts, and the combine of each MoE layer waits for the
// slowest rank, so the hottest rank's rows set the layer's expert time. The lowering emits the
// hot rank's rows (core/lower_moe.cc), so that both predictors price it and the memory model
// holds it; the op pricer's breakdown names the excess "imbalance".
#pragma once

#include <cstdint>

#include "core/model.h"

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
// are of the same kind in expectation): a rank that holds E / ep experts gets, from each token,
// a hypergeometric count with mean k / ep and variance k (1/ep)(1 - 1/ep)(E - k)/(E - 1), so
// over the group's ep rows_per_rank / k tokens its rows have mean rows_per_rank and standard
// deviation sqrt(rows_per_rank (1 - 1/ep)(E - k)/(E - 1)); the expected busiest rank is
// expected_max_standard_normal(ep) standard deviations above the mean. This is the floor every
// dropless router reaches (learned routing is at best as balanced as a random one). 1 for a
// dense model, ep <= 1, or no rows.
double moe_hot_rank_factor(const Model& m, int ep, double rows_per_rank);

// The hot rank's rows: ceil(rows_per_rank x moe_hot_rank_factor).
int64_t moe_hot_rank_rows(const Model& m, int ep, int64_t rows_per_rank);

}  // namespace parasol
