// Checkpoint bytes from the plan's sharding and precision, and their transfer time.
#include "cost_models/checkpoint_cost.h"

#include <algorithm>

#include "core/error.h"
#include "cost_models/memory.h"

namespace parasol::cost {

CheckpointSize checkpoint_size(const Model& m, const Plan& p) {
  CheckpointSize s;
  const ParamCounts counts = param_counts(m);
  // Per parameter, as the memory model holds them (memory.cc): weights in the plan's precision
  // (2 bytes, or 4 in fp32), fp32 master weights under mixed precision, two AdamW moments (fp32,
  // or bf16 for a bf16 optimizer whose master is the bf16 weight).
  const bool low = p.precision != Dtype::kFp32;
  const bool pure_bf16 = p.optimizer_dtype == Dtype::kBf16;
  const double w = low ? 2 : 4;
  const double master = low && !pure_bf16 ? 4 : 0;
  const double moments = pure_bf16 ? 4 : 8;
  const double per_param = w + master + moments;
  const double ranks_per_stage = static_cast<double>(p.tp) * p.dp * p.cp;
  for (int stage = 0; stage < p.pp; ++stage) {
    const StageParams sp = stage_params(m, counts, p, stage);
    // A rank holds sp.dense replicated over dp x cp and sp.expert over the expert data-parallel
    // group; each replica's bytes are split among the ranks that hold it.
    const double rank_params = sp.dense / (p.dp * p.cp) + sp.expert / p.expert_dp();
    s.max_rank_bytes = std::max(s.max_rank_bytes, rank_params * per_param);
    // The norms and MLA's down-projections are whole on every tensor-parallel rank: stored once.
    const double layers = p.layers_in_stage(m.layers, stage);
    const double replicated = layers * (counts.norms + counts.attention_replicated) +
                              (stage == p.pp - 1 ? counts.final_norm : 0);
    const double stage_params_unique = rank_params * ranks_per_stage - (p.tp - 1) * replicated;
    s.weights_bytes += stage_params_unique * w;
    s.master_bytes += stage_params_unique * master;
    s.optimizer_bytes += stage_params_unique * moments;
  }
  s.total_bytes = s.weights_bytes + s.master_bytes + s.optimizer_bytes;
  return s;
}

double storage_bandwidth(const Cluster& c) {
  // Llama 3 (arXiv 2407.21783, section 3.3.1): Tectonic sustains 2 TB/s (7 TB/s peak) for the
  // 16,384 GPUs of the 405B run: 2e12 / 16,384 = 122 MB/s per GPU (derived).
  constexpr double kPerGpu = 2e12 / 16384;
  return c.storage_bw > 0 ? c.storage_bw : kPerGpu * c.num_gpus();
}

double checkpoint_transfer_s(const CheckpointSize& size, double storage_bw) {
  PARASOL_CHECK(storage_bw > 0, "storage bandwidth " + std::to_string(storage_bw));
  return size.total_bytes / storage_bw;
}

Json checkpoint_size_to_json(const CheckpointSize& s) {
  return {{"total_GB", s.total_bytes / 1e9},
          {"weights_GB", s.weights_bytes / 1e9},
          {"master_GB", s.master_bytes / 1e9},
          {"optimizer_GB", s.optimizer_bytes / 1e9},
          {"max_rank_GB", s.max_rank_bytes / 1e9}};
}

}  // namespace parasol::cost
