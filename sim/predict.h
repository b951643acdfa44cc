// The event simulator as a predictor of published runs (cost_models/accuracy.h): lower the plan,
// play it, and report the step time, MFU and the busiest stage's memory, as
// cost::estimate_prediction does for the closed form. `parasol accuracy --simulate` and the
// accuracy bars test use it.
#pragma once

#include "core/cluster.h"
#include "core/model.h"
#include "core/plan.h"
#include "cost_models/accuracy.h"
#include "cost_models/profile.h"

namespace parasol::sim {

// Memory is what the framework measures of each stage's liveness peak (SimResult::
// memory_per_stage); memory_per_gpu_bytes the largest device_used().
// `reserved`: how the reserved bytes are priced (cost::Predictor).
cost::Prediction simulate_prediction(const Model& m, const Cluster& c, const Plan& p,
                                     const cost::Profile& profile, cost::Reserved reserved);

}  // namespace parasol::sim
