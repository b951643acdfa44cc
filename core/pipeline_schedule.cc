// The pipeline schedule's unit order (core/pipeline_schedule.h).
#include "core/pipeline_schedule.h"

#include <algorithm>

#include "core/error.h"

namespace parasol {

std::vector<std::vector<PipelineUnit>> pipeline_steps(const Plan& p, int s, int M) {
  PARASOL_CHECK(0 <= s && s < p.pp && M >= 1,
                "stage " + std::to_string(s) + ", micro-batches " + std::to_string(M));
  std::vector<std::vector<PipelineUnit>> out;
  out.reserve(2 * static_cast<size_t>(M) * p.vpp);
  if (p.schedule == Schedule::kGpipe) {
    for (int i = 0; i < M; ++i) out.push_back({{true, 0, i}});
    for (int i = 0; i < M; ++i) out.push_back({{false, 0, i}});
    return out;
  }
  const bool inter = p.schedule == Schedule::kInterleaved;
  const int total = M * (inter ? p.vpp : 1);
  const int warm = pipeline_warmup_units(p, s, M);
  auto unit = [&](int k, bool fwd) { return pipeline_unit(p, k, fwd); };
  for (int k = 0; k < warm; ++k) out.push_back({unit(k, true)});
  for (int j = 0; j < total - warm; ++j) {
    if (inter) {
      out.push_back({unit(warm + j, true), unit(j, false)});
    } else {
      out.push_back({unit(warm + j, true)});
      out.push_back({unit(j, false)});
    }
  }
  for (int j = total - warm; j < total; ++j) out.push_back({unit(j, false)});
  return out;
}

int pipeline_warmup_units(const Plan& p, int s, int M) {
  PARASOL_CHECK(0 <= s && s < p.pp && M >= 1,
                "stage " + std::to_string(s) + ", micro-batches " + std::to_string(M));
  if (p.schedule == Schedule::kGpipe) return M;
  if (p.schedule == Schedule::kInterleaved) {
    // Megatron-Core's get_pp_rank_microbatches (megatron/core/pipeline_parallel/schedules.py
    // L964-970 at d98e8a6): under overlap_moe_expert_parallel_comm one more forward before the
    // steady state, "to ensure the forward and backward computations are independent in all
    // 1f1b steps" (without it the last stage's steady steps of the last chunk pair a
    // micro-batch's forward with its own backward, which combined 1F1B cannot run together).
    const int combined = p.ep_comm_overlap ? 1 : 0;
    return std::min((p.pp - s - 1) * 2 + (p.vpp - 1) * p.pp + combined, M * p.vpp);
  }
  return std::min(p.pp - s - 1, M);
}

int pipeline_units_in_flight(const Plan& p, int s, int M) {
  const int total = M * (p.schedule == Schedule::kInterleaved ? p.vpp : 1);
  return std::min(pipeline_warmup_units(p, s, M) + 1, total);
}

std::vector<std::vector<PipelineUnit>> pipeline_steps(const Plan& p, int s) {
  return pipeline_steps(p, s, p.micro_batches());
}

}  // namespace parasol
