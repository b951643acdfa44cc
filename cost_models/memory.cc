// Memory cost model: per-rank weights, gradients, optimizer state, activations and buffers.
#include "cost_models/memory.h"

#include <algorithm>

namespace parasol::cost {

namespace {
constexpr double GiB = 1024.0 * 1024.0 * 1024.0;
// CUDA context, cuBLAS/NCCL workspaces and allocator slack kept free on every GPU.
constexpr double kRuntimeReserve = 1.0 * GiB;

double activation_dtype_bytes(const Plan& p) { return p.precision == Dtype::kFp32 ? 4 : 2; }
}  // namespace

double layer_activation_bytes(const Model& m, const Plan& p, Recompute recompute, bool moe_layer) {
  const double eb = activation_dtype_bytes(p);
  const double t = p.tp;
  const double tokens = static_cast<double>(p.micro_batch) * p.seq(m) / p.cp;  // per rank
  const double sp = p.sequence_parallel ? t : 1.0;  // split of the norm/dropout regions
  const double h = static_cast<double>(m.hidden);
  if (recompute == Recompute::kFull) return eb * tokens * h / sp;  // the layer input only

  double bytes = 0;
  bytes += 2 * eb * tokens * h / sp;  // norm1 input, QKV input (norm1 output)
  bytes += eb * tokens * (m.q_dim() + 2.0 * m.kv_dim()) / t;  // Q, K, V
  bytes += eb * tokens * m.q_dim() / t;                       // attention output = out-proj input
  if (p.flash_attention) {
    bytes += 4.0 * tokens * m.heads / t;  // softmax log-sum-exp (fp32)
  } else if (recompute != Recompute::kSelective) {
    double scores = static_cast<double>(p.micro_batch) * (m.heads / t) *
                    (static_cast<double>(p.seq(m)) / p.cp) * p.seq(m);
    bytes += scores * (m.dropout ? 2 * eb + 1 : eb);  // softmax out (+ dropout mask and output)
  }
  const double masks = m.dropout ? 2 * tokens * h / sp : 0;  // two residual dropout masks
  bytes += masks;
  bytes += 2 * eb * tokens * h / sp;  // norm2 input, FC1 input
  auto mlp = [&](double rows, double ffn) {
    double per = m.activation == Activation::kSwiglu ? 3 : 2;  // FC1 out(s) + FC2 input
    return per * eb * rows * ffn / t;
  };
  if (moe_layer) {
    const double routed = tokens * m.moe.top_k;
    bytes += 4.0 * tokens * m.moe.experts;  // router probabilities (fp32)
    bytes += eb * routed * h / sp;          // dispatched tokens (expert FC1 input)
    bytes += mlp(routed / sp, static_cast<double>(m.moe.expert_ffn));
  } else {
    bytes += mlp(tokens, static_cast<double>(m.ffn));
  }
  return bytes;
}

namespace {
// MoE layers among layers [first, last).
int moe_layers_in(const Model& m, int first, int last) {
  if (!m.is_moe()) return 0;
  auto upto = [&](int n) { return n / m.moe.every; };  // MoE layers among [0, n)
  return upto(last) - upto(first);
}
}  // namespace

StageParams stage_params(const Model& m, const Plan& p, int stage) {
  ParamCounts pc = param_counts(m);
  const double t = p.tp;
  const int per_stage = m.layers / p.pp;
  const int moe = moe_layers_in(m, stage * per_stage, (stage + 1) * per_stage);
  const int dense = per_stage - moe;
  StageParams sp;
  sp.dense = dense * ((pc.attention + pc.dense_mlp) / t + pc.norms) +
             moe * (pc.attention / t + pc.norms + pc.router);
  sp.expert = moe * static_cast<double>(m.moe.experts) * pc.expert_mlp / (t * p.ep);
  const double table = static_cast<double>(m.vocab) * m.hidden / t;
  if (stage == 0) sp.dense += table + (m.learned_positions ? double(m.seq_len) * m.hidden : 0);
  if (stage == p.pp - 1) {
    sp.dense += pc.final_norm;
    // The output projection: its own matrix, or (tied, pp > 1) a copy of the embedding.
    if (!m.tied_embeddings || p.pp > 1) sp.dense += table;
  }
  return sp;
}

double in_flight_micro_batches(const Plan& p, int stage) {
  const int m = p.micro_batches();
  switch (p.schedule) {
    case Schedule::kGpipe:
      return m;
    case Schedule::k1F1B:
      return std::min(p.pp - stage, m);
    case Schedule::kInterleaved: {
      // Megatron: warm-up chunks (pp - rank - 1) * 2 + (vpp - 1) * pp, plus the one in flight.
      int chunks = (p.pp - stage - 1) * 2 + (p.vpp - 1) * p.pp + 1;
      return std::min<double>(chunks, static_cast<double>(m) * p.vpp) / p.vpp;
    }
  }
  return m;
}

MemoryBreakdown memory_per_rank(const Model& m, const Cluster& c, const Plan& p, int stage) {
  if (stage < 0) {
    MemoryBreakdown best;
    for (int s : {0, p.pp - 1}) {
      MemoryBreakdown b = memory_per_rank(m, c, p, s);
      if (b.total() > best.total()) best = b;
    }
    return best;
  }
  (void)c;
  MemoryBreakdown mb;
  const StageParams params = stage_params(m, p, stage);
  const bool low = p.precision != Dtype::kFp32;
  const double w_bytes = low ? 2 : 4, g_bytes = 4, o_bytes = low ? 12 : 8;
  const double dense_shard = static_cast<double>(p.dp) * p.cp;
  const double expert_shard = static_cast<double>(p.dp) / p.ep * p.cp;
  auto sharded = [&](double bytes_per_param, bool shard) {
    return params.dense * bytes_per_param / (shard ? dense_shard : 1) +
           params.expert * bytes_per_param / (shard ? expert_shard : 1);
  };
  mb.weights = sharded(w_bytes, p.zero >= 3);
  mb.gradients = sharded(g_bytes, p.zero >= 2);
  mb.optimizer = sharded(o_bytes, p.zero >= 1);

  const int per_stage = m.layers / p.pp;
  const int full_layers = p.full_recompute_layers(per_stage);
  const Recompute rest = p.recompute == Recompute::kFull ? Recompute::kNone : p.recompute;
  // Partial full recompute covers the first `full_layers` layers of a stage; MoE layers are
  // spread evenly, so split them in proportion.
  const int moe = moe_layers_in(m, stage * per_stage, (stage + 1) * per_stage);
  const double moe_share = static_cast<double>(moe) / per_stage;
  auto layers_bytes = [&](Recompute r, double count) {
    return count * ((1 - moe_share) * layer_activation_bytes(m, p, r, false) +
                    moe_share * layer_activation_bytes(m, p, r, true));
  };
  double stage_act =
      layers_bytes(Recompute::kFull, full_layers) + layers_bytes(rest, per_stage - full_layers);
  double largest_layer = layer_activation_bytes(m, p, Recompute::kNone, moe > 0);
  const double eb = activation_dtype_bytes(p);
  const double tokens = static_cast<double>(p.micro_batch) * p.seq(m) / p.cp;
  const double sp = p.sequence_parallel ? p.tp : 1.0;
  if (stage == 0 && m.dropout) stage_act += tokens * m.hidden / sp;  // embedding dropout mask
  mb.activations = stage_act * in_flight_micro_batches(p, stage);

  // Transient working set: a layer rebuilt by full recompute; fp32 logits and their gradient on
  // the last stage; ZeRO-3 gathers of the current and the prefetched layer.
  if (full_layers > 0) mb.transient += largest_layer;
  if (stage == p.pp - 1) mb.transient += (eb + 4) * tokens * m.vocab / p.tp;
  if (p.zero >= 3) mb.transient += 2 * w_bytes * params.total() / per_stage;

  // Offload: moved state leaves the device (a double buffer of two layers stays).
  const double layer_fraction = std::min(1.0, 2.0 / per_stage);
  if (p.offload.optimizer) {
    mb.host += mb.optimizer;
    mb.optimizer = 0;
  }
  if (p.offload.params) {
    double kept = mb.weights * layer_fraction;
    mb.host += mb.weights - kept;
    mb.weights = kept;
  }
  if (p.offload.activations) {
    double kept = std::min(mb.activations, 2 * stage_act / per_stage);
    mb.host += mb.activations - kept;
    mb.activations = kept;
  }
  mb.buffers = kRuntimeReserve;
  return mb;
}

}  // namespace parasol::cost
