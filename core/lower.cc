// lower: Plan -> one Program per pipeline stage (see lower.h for the conventions). A Lowerer
// (core/lower_internal.h) builds the Program of one stage: its persistent buffers (parameters,
// gradients and optimizer state per bucket: a layer's dense or expert weights, the embedding,
// the head), then the forward and backward units of the pipeline schedule, then the optimizer
// step. Dependencies are derived from the buffers each op reads and writes as it is emitted.
#include "core/lower.h"

#include <string>

#include "core/error.h"
#include "core/lower_internal.h"

namespace parasol {

const Program& LoweredPlan::program_of(int rank) const {
  return programs.at(layout.coord(rank).pp);
}

namespace {
// Model and plan features the estimate prices but the lowering does not emit yet: a clear error
// instead of a Program that silently differs from the model or the plan.
void require_lowerable(const Model& m, const Plan& p) {
  if (m.mla.enabled()) throw Error("model.mla", "latent attention is not lowered to Programs yet");
  if (m.sliding_window > 0)
    throw Error("model.sliding_window", "windowed attention is not lowered to Programs yet");
  if (m.is_moe() && m.moe.shared_experts > 0)
    throw Error("model.moe.shared_experts", "shared experts are not lowered to Programs yet");
  if (p.expert_tp() != p.tp)
    throw Error("plan.etp", "expert tensor parallelism other than tp (" + std::to_string(p.etp) +
                                " vs " + std::to_string(p.tp) + ") is not lowered to Programs yet");
}
}  // namespace

Program lower_stage(const Model& model, const Plan& plan, int stage) {
  require_lowerable(model, plan);
  lowering::Lowerer l(model, plan, stage);
  Program p = l.run();
  RankLayout layout(plan);
  for (int r = 0; r < layout.world(); ++r)
    if (layout.coord(r).pp == stage) p.ranks.push_back(r);
  return p;
}

LoweredPlan lower(const Model& model, const Cluster& cluster, const Plan& plan) {
  (void)cluster;
  LoweredPlan out{plan, RankLayout(plan), {}};
  out.programs.reserve(plan.pp);
  for (int s = 0; s < plan.pp; ++s) out.programs.push_back(lower_stage(model, plan, s));
  return out;
}

}  // namespace parasol
