// The pipeline schedule's unit order (core/pipeline_schedule.h).
#include "core/pipeline_schedule.h"

#include <algorithm>

#include "core/error.h"

namespace parasol {

namespace {
int flush_warmup_units(const Plan& p, int s, int M);

// One flush of M micro-batches, numbered from `first`, appended to `out`.
void flush_steps(const Plan& p, int s, int M, int first,
                 std::vector<std::vector<PipelineUnit>>& out) {
  if (p.schedule == Schedule::kGpipe) {
    for (int i = 0; i < M; ++i) out.push_back({{true, 0, first + i}});
    for (int i = 0; i < M; ++i) out.push_back({{false, 0, first + i}});
    return;
  }
  const bool inter = p.schedule == Schedule::kInterleaved;
  const int total = M * (inter ? p.vpp : 1);
  const int warm = flush_warmup_units(p, s, M);
  auto unit = [&](int k, bool fwd) {
    PipelineUnit u = pipeline_unit(p, k, fwd);
    u.mb += first;
    return u;
  };
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
}

// The forward units stage s runs before its first backward in one flush of M micro-batches.
int flush_warmup_units(const Plan& p, int s, int M) {
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

// The step's (or a play's) M micro-batches in p.pipeline_flushes flushes of M / flushes each.
int flush_size(const Plan& p, int M) {
  const int flushes = std::max(1, p.pipeline_flushes);
  PARASOL_CHECK(M >= 1 && M % flushes == 0, std::to_string(M) + " micro-batches in " +
                                                std::to_string(flushes) + " pipeline flushes");
  return M / flushes;
}
}  // namespace

std::vector<std::vector<PipelineUnit>> pipeline_steps(const Plan& p, int s, int M) {
  PARASOL_CHECK(0 <= s && s < p.pp && M >= 1,
                "stage " + std::to_string(s) + ", micro-batches " + std::to_string(M));
  const int per = flush_size(p, M);
  std::vector<std::vector<PipelineUnit>> out;
  out.reserve(2 * static_cast<size_t>(M) * p.vpp);
  for (int first = 0; first < M; first += per) flush_steps(p, s, per, first, out);
  return out;
}

int pipeline_warmup_units(const Plan& p, int s, int M) {
  return flush_warmup_units(p, s, flush_size(p, M));
}

int pipeline_units_in_flight(const Plan& p, int s, int M) {
  const int per = flush_size(p, M);
  const int total = per * (p.schedule == Schedule::kInterleaved ? p.vpp : 1);
  return std::min(flush_warmup_units(p, s, per) + 1, total);
}

std::vector<std::vector<PipelineUnit>> pipeline_steps(const Plan& p, int s) {
  return pipeline_steps(p, s, p.micro_batches());
}

}  // namespace parasol
