// lower: Plan -> one Program per pipeline stage (see lower.h for the conventions). A Lowerer
// (core/lower_internal.h) builds the Program of one stage: its persistent buffers (parameters,
// gradients and optimizer state per bucket: a layer's dense or expert weights, the embedding,
// the head), then the forward and backward units of the pipeline schedule, then the optimizer
// step. Dependencies are derived from the buffers each op reads and writes as it is emitted.
#include "core/lower.h"

#include <cstdlib>
#include <string_view>

#include "core/fp8_params.h"
#include "core/lower_internal.h"

namespace parasol {

const Program& LoweredPlan::program_of(int rank) const {
  PARASOL_CHECK(0 <= rank && rank < layout.world(), "rank " + std::to_string(rank));
  return programs.at(layout.coord(rank).pp);
}

Program lower_stage(const Model& model, const Plan& plan, int stage) {
  return lower_stage(model, plan, stage, device_spec("H100-SXM"));
}

Program lower_stage(const Model& model, const Plan& plan, int stage, const DeviceSpec& device) {
  PARASOL_CHECK(0 <= stage && stage < plan.pp, "stage " + std::to_string(stage));
  // Fault injection for the tests of the failure kinds (tests/tools/failure_kinds_test.cc): with
  // PARASOL_TEST_BREAK_LOWERING in the environment, a check fails here as a lowering bug would;
  // with PARASOL_TEST_BREAK_LOWERING=program, the lowering returns a malformed Program instead
  // (its first op depends on an op that does not exist), as a bug that no check of the lowering
  // catches would, for the engine's contract checks to report.
  const char* broken = std::getenv("PARASOL_TEST_BREAK_LOWERING");
  PARASOL_CHECK(broken == nullptr || std::string_view(broken) == "program",
                "injected by PARASOL_TEST_BREAK_LOWERING");
  lowering::Lowerer l(model, plan, stage, fp8_weight_transpose_kept(device));
  Program p = l.run();
  if (broken && !p.ops.empty()) p.ops.front().deps.push_back(static_cast<int>(p.ops.size()));
  RankLayout layout(plan);
  for (int r = 0; r < layout.world(); ++r)
    if (layout.coord(r).pp == stage) p.ranks.push_back(r);
  return p;
}

LoweredPlan lower(const Model& model, const Cluster& cluster, const Plan& plan) {
  LoweredPlan out{plan, RankLayout(plan), {}};
  out.programs.reserve(plan.pp);
  for (int s = 0; s < plan.pp; ++s)
    out.programs.push_back(lower_stage(model, plan, s, cluster.gpu_device(0)));
  return out;
}

}  // namespace parasol
