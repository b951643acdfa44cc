// Memory cost model: per-rank weights, gradients, optimizer state, activations, the runtime's own
// memory, and host memory taken by offload.
#include "cost_models/memory.h"

#include <algorithm>
#include <cmath>
#include <string_view>

#include "core/fp8_params.h"
#include "core/gather_units.h"
#include "core/layer_shapes.h"
#include "core/offload_rules.h"
#include "core/pipeline_schedule.h"
#include "core/te_weight_cache.h"
#include "core/units.h"
#include "core/vocab_shard.h"
#include "core/zero3_live.h"

namespace parasol::cost {

namespace {
using units::MiB;

double activation_dtype_bytes(const Plan& p) { return p.precision == Dtype::kFp32 ? 4 : 2; }

// The saved bytes of an MoE layer (no recompute) that its forward keeps after the dispatch's
// all-to-all: the experts' saved tensors (FC1 outputs, FC2 input), their outputs kept by the
// combine and the shared experts' (layer_activation_bytes' terms).
double moe_expert_side_bytes(const Model& m, const Plan& p) {
  const double eb = activation_dtype_bytes(p);
  const double lb = p.precision == Dtype::kFp8 ? 1 : eb;
  const double t = p.tp, etp = p.expert_tp();
  const double tokens = static_cast<double>(p.micro_batch) * p.seq(m) / p.cp;
  const double sp = p.sequence_parallel ? t : 1.0;
  const double fc1_outs = m.activation == Activation::kSwiglu ? 2 : 1;
  const double routed = (etp == t ? tokens : tokens / t) * m.moe.top_k;
  const double router_tokens = etp != t ? tokens / t : tokens / sp;
  double bytes = p.moe_probs_in_experts ? 0 : eb * router_tokens * m.moe.top_k * m.hidden;
  bytes += (fc1_outs * eb + lb) * routed * static_cast<double>(m.moe.expert_ffn) / etp;
  if (m.moe.shared_experts > 0)
    bytes += (fc1_outs * eb + lb) * tokens * static_cast<double>(m.moe.shared_width()) / t;
  return bytes;
}

}  // namespace

double lora_layer_params(const Model& m, const Plan& p) {
  if (!p.lora()) return 0;
  double n = 0;
  auto add = [&](const Linears& ls, const char* name, LoraTarget t) {
    if (!p.lora_targets_linear(t)) return;
    for (const LinearShape& s : ls)
      if (std::string_view(s.name) == name)
        n += static_cast<double>(p.lora_rank) * static_cast<double>(s.in + s.out);
  };
  add(attention_linears(m), "qkv", LoraTarget::kQkv);
  add(attention_linears(m), "out", LoraTarget::kProj);
  add(mlp_linears(m, 0), "fc1", LoraTarget::kFc1);
  add(mlp_linears(m, 0), "fc2", LoraTarget::kFc2);
  return n;
}

double layer_activation_bytes(const Model& m, const Plan& p, Recompute recompute, bool moe_layer) {
  const double eb = activation_dtype_bytes(p);
  const double t = p.tp;
  const double tokens = static_cast<double>(p.micro_batch) * p.seq(m) / p.cp;  // per rank
  const double sp = p.sequence_parallel ? t : 1.0;  // split of the norm/dropout regions
  const double h = static_cast<double>(m.hidden);
  if (recompute == Recompute::kFull) return eb * tokens * h / sp;  // the layer input only
  if (recompute == Recompute::kSelectiveOp) {
    // torchtitan's op-level policy (core/plan.h; core/lower_recompute.cc): the layer's input
    // and the cached outputs of the MUST_SAVE ops, each in the activation dtype (torchao's
    // float8 linears return bf16): wq and wv (Q, V), the attention kernel's output and fp32
    // log-sum-exp, w1, w2 (all its rows: the mm's output before any reduction) and, under SP,
    // the reduce-scatters after wo and w2.
    double kept = eb * tokens * h / sp;
    kept += eb * tokens * (m.q_dim() + static_cast<double>(m.kv_heads) * m.v_head_dim()) / t;
    kept += eb * tokens * m.heads * m.v_head_dim() / t + 4.0 * tokens * m.heads / t;
    kept += eb * tokens * static_cast<double>(m.ffn) / t + eb * tokens * h;
    if (sp > 1) kept += 2 * eb * tokens * h / sp;
    return kept;
  }
  // Selective recompute keeps none of what the plan's modules recompute
  // (Plan::recompute_modules; core_attn by default).
  auto recomputed = [&](RecomputeModule module) {
    return recompute == Recompute::kSelective &&
           ((p.recompute_modules >> static_cast<int>(module)) & 1u) != 0;
  };

  // A linear's saved input: under fp8 Transformer Engine keeps the fp8 copy it cast for the GEMM
  // (1 byte; it reads it again for the weight gradient), not the bf16 one.
  const double lb = p.precision == Dtype::kFp8 ? 1 : eb;
  // LoRA (Plan::lora_rank; core/lower_lora.cc): a frozen linear keeps its input only for its
  // adapter's A (without adapter dropout; with it the adapter keeps its dropped copy and mask);
  // each adapter keeps u = x A [tokens x r].
  const bool lora_drop = p.lora() && p.lora_dropout > 0;
  auto input_kept = [&](LoraTarget t) {
    return !p.lora() || (p.lora_targets_linear(t) && !lora_drop);
  };
  double bytes = 0;
  auto adapters = [&](const Linears& ls, const char* a, LoraTarget ta, const char* b,
                      LoraTarget tb) {
    for (const LinearShape& s : ls) {
      const std::string_view n(s.name);
      const bool hit =
          (n == a && p.lora_targets_linear(ta)) || (n == b && p.lora_targets_linear(tb));
      if (hit) bytes += eb * tokens * p.lora_rank + (lora_drop ? (eb + 1) * tokens * s.in : 0);
    }
  };
  adapters(attention_linears(m), "qkv", LoraTarget::kQkv, "out", LoraTarget::kProj);
  if (!moe_layer) adapters(mlp_linears(m, 0), "fc1", LoraTarget::kFc1, "fc2", LoraTarget::kFc2);
  bytes += eb * tokens * h / sp;                                    // norm1 input
  if (input_kept(LoraTarget::kQkv)) bytes += lb * tokens * h / sp;  // QKV input (norm1 output)
  if (m.mla.enabled()) {
    // The latents feeding the up-projections, then Q, K (nope + rope per head) and V.
    const double latents =
        static_cast<double>(m.mla.q_lora_rank) + m.mla.kv_lora_rank + m.mla.qk_rope_head_dim;
    bytes += eb * tokens * latents / sp;
    if (!recomputed(RecomputeModule::kMlaUpProj))
      bytes += eb * tokens * (2.0 * m.q_dim() + m.heads * m.v_head_dim()) / t;
  } else {
    bytes += eb * tokens * (m.q_dim() + 2.0 * m.kv_dim()) / t;  // Q, K, V
  }
  // The attention output (the out-projection's input), which the attention's backward reads too
  // unless it recomputes the core attention or (cp_comm_type a2a) reads the kernel's own output,
  // kept below.
  const bool a2a_out =
      p.cp > 1 && p.cp_impl == CpImpl::kTransformerEngine && p.cp_comm_type == CpCommType::kA2a;
  if (input_kept(LoraTarget::kProj) || (!recomputed(RecomputeModule::kCoreAttn) && !a2a_out))
    bytes += lb * tokens * m.heads * m.v_head_dim() / t;
  if (p.flash_attention) {
    bytes += 4.0 * tokens * m.heads / t;  // softmax log-sum-exp (fp32)
    // cp_comm_type a2a: Transformer Engine's AttnFuncWithCPAndQKVOA2A keeps the kernel's output
    // before its all-to-all back (ctx.save_for_backward), beside the out-projection's input.
    if (p.cp > 1 && p.cp_impl == CpImpl::kTransformerEngine && p.cp_comm_type == CpCommType::kA2a &&
        !recomputed(RecomputeModule::kCoreAttn))
      bytes += eb * tokens * m.heads * m.v_head_dim() / t;
  } else if (!recomputed(RecomputeModule::kCoreAttn)) {
    double scores = static_cast<double>(p.micro_batch) * (m.heads / t) *
                    (static_cast<double>(p.seq(m)) / p.cp) * p.seq(m);
    bytes += scores * (m.dropout ? 2 * eb + 1 : eb);  // softmax out (+ dropout mask and output)
  }
  const double masks = m.dropout ? 2 * tokens * h / sp : 0;  // two residual dropout masks
  bytes += masks;
  bytes += eb * tokens * h / sp;  // norm2 input
  // FC1 input (the norm2 output; in MoE layers the router's, which stays in bf16): recomputed
  // by the layernorm module in MoE layers.
  if (!(moe_layer && recomputed(RecomputeModule::kLayernorm)) && input_kept(LoraTarget::kFc1))
    bytes += (moe_layer ? eb : lb) * tokens * h / sp;
  auto mlp = [&](double rows, double ffn, double parts) {
    const double fc1_outs = m.activation == Activation::kSwiglu ? 2 : 1;
    // FC1 out(s) (an fp8 copy under Plan::activation_fp8_input_store: dense SwiGLU layers), FC2
    // input.
    const double fc1_bytes = p.activation_fp8_input_store && !moe_layer ? 1 : eb;
    return (fc1_outs * fc1_bytes + (input_kept(LoraTarget::kFc2) ? lb : 0)) * rows * ffn / parts;
  };
  if (moe_layer && recomputed(RecomputeModule::kMoe)) {
    // The whole MoE block is re-run from its input.
  } else if (moe_layer) {
    // The router runs on the rank's sequence shard. With experts split tp ways (etp = tp) the
    // TP group's tokens are gathered, so every rank holds all T x top_k routed rows over 1/tp of
    // each expert; with Megatron's expert grid (etp != tp) a rank routes its 1/tp of them over
    // 1/etp of each expert.
    const double etp = p.expert_tp();
    const double routed = (etp == t ? tokens : tokens / t) * m.moe.top_k;
    const double router_tokens = etp != t ? tokens / t : tokens / sp;
    bytes += 4.0 * router_tokens * m.moe.experts;  // router probabilities (fp32)
    bytes += lb * routed * h;                      // dispatched tokens (expert FC1 input)
    // The experts' outputs, kept by the combine for the router probabilities' gradient unless
    // the experts' activation applied them (Plan::moe_probs_in_experts)
    // (Megatron's unpermute with probs saves the permuted tokens; the lowering's sEret): the rows
    // this rank routed, after the experts' tensor-parallel partial sums are reduce-scattered
    // back to it (core/lower_moe.cc expert_reduce).
    if (!p.moe_probs_in_experts) bytes += eb * router_tokens * m.moe.top_k * h;
    bytes += mlp(routed, static_cast<double>(m.moe.expert_ffn), etp);
    // The activation's output (the expert FC2 input), recomputed by moe_act.
    if (recomputed(RecomputeModule::kMoeAct))
      bytes -= lb * routed * static_cast<double>(m.moe.expert_ffn) / etp;
    if (m.moe.shared_experts > 0 && !recomputed(RecomputeModule::kSharedExperts))
      bytes += mlp(tokens, static_cast<double>(m.moe.shared_width()), t);
  } else if (!recomputed(RecomputeModule::kMlp)) {
    bytes += mlp(tokens, static_cast<double>(m.ffn), t);
  }
  return bytes;
}

StageParams stage_params(const Model& m, const ParamCounts& pc, const Plan& p, int stage) {
  if (p.lora()) {
    // The adapters of the stage's layers (core/lower_lora.cc: one bucket a layer).
    Plan base = p;
    base.lora_rank = 0;
    StageParams sp = stage_params(m, pc, base, stage);
    sp.dense_layer = lora_layer_params(m, p);
    sp.embedding = sp.head = 0;
    sp.dense = sp.dense_layers * sp.dense_layer;
    return sp;
  }
  const double t = p.tp;
  // One layer of each kind on this rank: the replicated parts (MLA's down-projections and
  // latent norms, the router) whole, the rest split tp ways; experts split etp ways and spread
  // over ep ranks.
  // A row-parallel linear's bias is not split (Megatron's RowParallelLinear adds it whole after
  // the reduction; core/lower_buckets.cc add_linear_specs): whole on every rank.
  auto row_biases = [&](const Linears& ls, double parts) {
    double whole = 0;
    for (const LinearShape& s : ls)
      if (s.bias && s.split == Split::kRow) whole += static_cast<double>(s.out);
    return whole * (1 - 1 / parts);
  };
  double attention =
      static_cast<double>(pc.attention - pc.attention_replicated) / t + pc.attention_replicated;
  double dense_mlp = pc.dense_mlp / t, shared_mlp = pc.shared_mlp / t;
  double expert = static_cast<double>(pc.expert_mlp) / p.expert_tp();
  if (m.linear_bias && (t > 1 || p.expert_tp() > 1)) {
    attention += row_biases(attention_linears(m), t);
    int dense_at = 0, moe_at = -1;  // a dense layer and an MoE layer of the model
    if (m.is_moe()) {
      for (int l = 0; l < m.layers && moe_at < 0; ++l)
        if (m.is_moe_layer(l)) moe_at = l;
      dense_at = m.is_moe_layer(0) ? -1 : 0;
    }
    if (dense_at >= 0) dense_mlp += row_biases(mlp_linears(m, dense_at), t);
    if (moe_at >= 0) shared_mlp += row_biases(mlp_linears(m, moe_at), t);
    expert += row_biases(expert_linears(m), p.expert_tp());
  }
  const double dense_layer = attention + pc.norms + dense_mlp;
  const double moe_layer = attention + pc.norms + pc.router + shared_mlp;
  const double experts = expert * (static_cast<double>(m.moe.experts) / p.ep);

  int layers = 0, moe_layers = 0;
  if (!p.uneven_stages() && !m.is_moe()) {
    layers = m.layers / p.pp;
  } else {
    for (int c = 0; c < p.chunks(); ++c) {
      const int n = p.layers_in_chunk(m.layers, stage, c);
      layers += n;
      if (m.is_moe()) {
        const int first = p.first_layer(m.layers, stage, c);
        moe_layers += m.moe_layers_between(first, first + n);
      }
    }
  }
  StageParams sp;
  sp.dense_layers = layers - moe_layers;
  sp.moe_layers = moe_layers;
  sp.dense_layer = dense_layer;
  sp.moe_layer = moe_layer;
  sp.expert_layer = experts;
  sp.first_layer_moe = m.is_moe() && m.is_moe_layer(p.first_layer(m.layers, stage, 0));
  // The vocabulary split tp ways, the last rank's part padded (core/vocab_shard.h).
  const double table = static_cast<double>(vocab_shard(m, p.tp)) * m.hidden;
  if (stage == 0) sp.embedding = table + (m.learned_positions ? double(m.seq_len) * m.hidden : 0);
  if (stage == p.pp - 1) {
    // The output projection: its own matrix, or (tied, pp > 1) a copy of the embedding.
    sp.head = pc.final_norm + (!m.tied_embeddings || p.pp > 1 ? table : 0);
  }
  sp.dense = (layers - moe_layers) * dense_layer + moe_layers * moe_layer;
  sp.dense += sp.embedding;
  if (stage == p.pp - 1) {
    sp.dense += pc.final_norm;
    if (!m.tied_embeddings || p.pp > 1) sp.dense += table;
  }
  sp.expert = moe_layers * experts;
  return sp;
}

StageParams stage_params(const Model& m, const Plan& p, int stage) {
  return stage_params(m, param_counts(m), p, stage);
}

double in_flight_micro_batches(const Plan& p, int stage) {
  // The schedule's units in flight at the stage's peak (core/pipeline_schedule.h, the order the
  // lowering emits), each a chunk: 1 / chunks of the stage's activations.
  return static_cast<double>(pipeline_units_in_flight(p, stage, p.micro_batches())) / p.chunks();
}

double runtime_overhead_bytes(const Cluster& c, const Plan& p) {
  if (c.gpu_device(0).vendor == "cpu") return 0;
  // The training process's own device memory besides tensors:
  //  - CUDA context with PyTorch's kernels loaded lazily (CUDA_MODULE_LOADING=LAZY, the default
  //    since CUDA 11.7/PyTorch 2): ~500 MiB per process on A100/H100 (PyTorch's CUDA semantics
  //    notes; NVIDIA "CUDA lazy loading" documentation);
  //  - cuBLAS(Lt) and Transformer Engine workspaces: 32 MiB each on Hopper, 4 MiB before
  //    (cuBLAS documentation, "cublasSetWorkspace");
  //  - NCCL: each communicator allocates per channel a send and a receive buffer per protocol
  //    (NCCL_BUFFSIZE 4 MiB for Simple, plus LL/LL128 buffers): about 2 x 4.6 MiB x channels
  //    per ring peer pair; a plan opens one communicator per parallel dimension it uses
  //    (tp, cp, ep, dp, pp and the embedding group). NCCL opens up to 32 channels on NVSwitch
  //    systems (NCCL_MAX_NCHANNELS) but allocates a channel's buffers only when a connection
  //    uses it; the figure below takes 16 channels per communicator, the middle of that range
  //    (NCCL environment-variable documentation, NCCL_BUFFSIZE, NCCL_MAX_NCHANNELS).
  const double context = 500 * MiB;
  const double workspaces = 2 * 32 * MiB;
  int communicators = 1;  // data parallel (or the world, for the grad-norm reduction)
  for (int degree : {p.tp, p.cp, p.ep, p.pp}) communicators += degree > 1 ? 1 : 0;
  const double per_communicator = 2 * 4.6 * MiB * 16;
  return context + workspaces + communicators * per_communicator;
}

double host_memory_pinnable_bytes(const Cluster& c) {
  return c.host_memory_per_gpu(0) * std::max(1, c.gpus_per_server());
}

namespace {
MemoryBreakdown memory_of_stage(const Model& m, const ParamCounts& pc, const Cluster& c,
                                const Plan& p, int stage);
}  // namespace

MemoryBreakdown memory_per_rank(const Model& m, const Cluster& c, const Plan& p, int stage) {
  const ParamCounts pc = param_counts(m);
  if (stage >= 0) return memory_of_stage(m, pc, c, p, stage);
  {
    MemoryBreakdown best;
    for (int s : {0, p.pp - 1}) {
      MemoryBreakdown b = memory_of_stage(m, pc, c, p, s);
      if (b.total() > best.total()) best = b;
    }
    if (p.pp > 2 && (m.is_moe() || m.sliding_window > 0)) {
      // Layers of different kinds (MoE layers after dense ones, windowed attention): a middle
      // stage with heavier layers can hold the most; every stage.
      for (int s = 1; s < p.pp - 1; ++s) {
        MemoryBreakdown b = memory_of_stage(m, pc, c, p, s);
        if (b.total() > best.total()) best = b;
      }
    } else if (p.pp > 2 && p.uneven_stages()) {
      // Uneven stages of identical layers: the middle stage with the most layers (the earliest
      // of equals, which holds the most micro-batches in flight).
      int largest = 1;
      for (int s = 1; s < p.pp - 1; ++s)
        if (p.layers_in_stage(m.layers, s) > p.layers_in_stage(m.layers, largest)) largest = s;
      MemoryBreakdown b = memory_of_stage(m, pc, c, p, largest);
      if (b.total() > best.total()) best = b;
    }
    return best;
  }
}

namespace {
MemoryBreakdown memory_of_stage(const Model& m, const ParamCounts& pc, const Cluster& c,
                                const Plan& p, int stage) {
  MemoryBreakdown mb;
  const StageParams params = stage_params(m, pc, p, stage);
  const bool low = p.precision != Dtype::kFp32;
  // Optimizer state per parameter: fp32 master (when the weights are low precision) and two
  // AdamW moments; pure bf16: two bf16 moments, bf16 gradients.
  const bool pure_bf16 = p.optimizer_dtype == Dtype::kBf16;
  const double w_bytes = low ? 2 : 4, g_bytes = pure_bf16 ? 2 : 4;
  // Megatron's gradient buffer (ZeRO < 2) accumulates in the parameters' dtype when gradients
  // are reduced in a low precision (param_and_grad_buffer.py @d98e8a6 group_params_for_buffers;
  // the lowering's gbuf_dt_); a sharded gradient stays in the optimizer's dtype.
  const double buffer_g_bytes = p.grad_reduce_dtype == Dtype::kFp32 ? g_bytes : w_bytes;
  const double o_bytes = pure_bf16 ? 4 : low ? 12 : 8;
  const double dense_shard = p.dense_shard_ranks();
  const double expert_shard = p.expert_shard_ranks();
  auto sharded = [&](double bytes_per_param, bool shard) {
    return params.dense * bytes_per_param / (shard ? dense_shard : 1) +
           params.expert * bytes_per_param / (shard ? expert_shard : 1);
  };
  mb.weights = sharded(w_bytes, p.zero >= 3);
  if (p.lora()) {
    // The frozen base weights, whole on every rank of the stage (ZeRO-3 is not lowered with LoRA).
    Plan base = p;
    base.lora_rank = 0;
    mb.weights += w_bytes * stage_params(m, pc, base, stage).total();
  }
  // Under Plan::fp8_param_gather the linear weights are Transformer Engine's fp8 parameters: a
  // 1-byte weight and, where the device keeps one, its 1-byte transpose (core/fp8_params.h,
  // core/lower_buckets.cc), the bytes of a bf16 weight; without the transpose (Blackwell) a byte
  // less each. Without the switch the weights are bf16, and TE keeps an fp8 copy of each across
  // micro-batches and steps (core/te_weight_cache.h): a byte an element, two with the transpose.
  const bool transpose_kept = fp8_weight_transpose_kept(c.gpu_device(0));
  const double te_cached = te_cached_fp8_weight_bytes(p, transpose_kept);
  if ((p.fp8_param_gather && !transpose_kept) || te_cached > 0) {
    double fp8 = 0;  // the stage's fp8 linear weight elements
    for (int ch = 0; ch < p.chunks(); ++ch) {
      const int first = p.first_layer(m.layers, stage, ch);
      for (int l = first; l < first + p.layers_in_chunk(m.layers, stage, ch); ++l) {
        fp8 += fp8_dense_layer_elements(m, p.tp, l);
        if (m.is_moe_layer(l))
          fp8 += fp8_expert_layer_elements(m, p.expert_tp(), m.moe.experts / p.ep);
      }
    }
    mb.weights += te_cached > 0 ? te_cached * fp8 : -fp8;
  }
  mb.gradients = p.zero >= 2 ? sharded(g_bytes, true) : sharded(buffer_g_bytes, false);
  mb.optimizer = sharded(o_bytes, p.zero >= 1);

  const int per_stage = std::max(1, p.layers_in_stage(m.layers, stage));
  const int full_layers = p.full_recompute_layers(per_stage);
  const Recompute rest = p.recompute == Recompute::kFull ? Recompute::kNone : p.recompute;
  int moe = 0;
  for (int ch = 0; m.is_moe() && ch < p.chunks(); ++ch) {
    const int first = p.first_layer(m.layers, stage, ch);
    moe += m.moe_layers_between(first, first + p.layers_in_chunk(m.layers, stage, ch));
  }
  // Partial full recompute covers the first `full_layers` layers of a stage; MoE layers are
  // spread in proportion.
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
  const double vocab_t = static_cast<double>(vocab_shard(m, p.tp));  // padded, as lowered
  // The embedding dropout's mask (no backward reads it under LoRA: the embedding is frozen).
  if (stage == 0 && m.dropout && !p.lora()) stage_act += tokens * m.hidden / sp;
  double in_flight = in_flight_micro_batches(p, stage);
  bool merged_gradient = false;  // the last stage peaks at a loss merged with a backward
  // Micro-batches whose token ids the first stage keeps (its first chunk's).
  double token_mbs = in_flight;
  // FSDP2's root group (the embedding) stays gathered from each micro-batch's forward to its
  // embedding backward, as the token ids do (core/lower_edges.cc fsdp2_root_held); resharded after
  // the step it is among the step's gathered weights (below).
  const double root_table =
      p.zero >= 3 && p.fsdp_impl == FsdpImpl::kFsdp2 && p.reshard != Reshard::kAfterStep
          ? w_bytes * params.embedding
          : 0;
  // What the first stage keeps a micro-batch: its token ids for the embedding's backward (none
  // under LoRA).
  const double per_token_mb = (p.lora() ? 0 : 4 * tokens) + root_table;
  if (p.schedule == Schedule::kInterleaved && per_stage > 0) {
    // Which chunks the in-flight chunk micro-batches belong to, in Megatron's order
    // (core/pipeline_schedule.h's pipeline_unit, schedules.py get_model_chunk_id), weighted by
    // each chunk's layers. In the steady state each
    // backward follows one more forward: the stage holds the most before the steady state's
    // j-th backward for the j (within one period of pp x vpp) whose chunks weigh the most (the
    // last stage at a forward of its last chunk, which runs the loss).
    //
    // Combined 1F1B (ep_comm_overlap, core/lower_schedule.cc interleave_units): the steady
    // state's forward runs merged with the backward after it, segment by segment between their
    // expert all-to-alls, backward first; at the backward's experts the forward has run its
    // first segment only: its chunk's layers up to the first MoE layer's dispatch.
    const int total = p.micro_batches() * p.vpp;
    const int warm =
        static_cast<int>(std::lround(in_flight * p.vpp));  // forwards before backward 0
    const double per_layer = stage_act / per_stage;
    // (The last stage: below, where a steady state merges its losses.)
    const bool combined =
        p.ep_comm_overlap && p.ep > 1 && m.is_moe() && (stage != p.pp - 1 || warm < total);
    std::vector<int> layers_of(static_cast<size_t>(p.vpp));
    std::vector<double> first_segment(static_cast<size_t>(p.vpp));
    for (int c = 0; c < p.vpp; ++c) {
      layers_of[c] = p.layers_in_chunk(m.layers, stage, c);
      first_segment[c] = layers_of[c] * per_layer;
      if (!combined) continue;
      const int first = p.first_layer(m.layers, stage, c);
      for (int l = first; l < first + layers_of[c]; ++l) {
        if (!m.is_moe_layer(l)) continue;
        first_segment[c] = (l - first) * layer_activation_bytes(m, p, rest, false) +
                           layer_activation_bytes(m, p, rest, true) - moe_expert_side_bytes(m, p);
        break;
      }
    }
    double layer_mbs = 0;
    int first_chunk = 0;  // forwards of chunk 0 in flight
    for (int k = 0; k < warm; ++k) {
      const int c = pipeline_unit(p, k, true).chunk;
      layer_mbs += layers_of[c];
      first_chunk += c == 0;
    }
    // The bytes held at the backward after forward `latest` (of chunk cf).
    auto held = [&](int cf) {
      double bytes = layer_mbs * per_layer;
      if (combined) bytes += first_segment[cf] - layers_of[cf] * per_layer;
      return bytes;
    };
    const int c0 = pipeline_unit(p, warm - 1, true).chunk;
    // The last stage under combined 1F1B: its forwards of the last chunk (the loss) run merged
    // with a backward of another micro-batch (core/pipeline_schedule.h's warm-up), whose
    // segments run first: at the loss that backward is done (held below, in the loop).
    const bool merged_loss = combined && stage == p.pp - 1;
    double best_bytes = merged_loss ? 0 : held(c0);
    double best = best_bytes + (stage == 0 ? per_token_mb * first_chunk : 0);
    int best_first = first_chunk;
    for (int j = 0; j + 1 < p.pp * p.vpp && warm + j < total; ++j) {
      // Backward j done, forward warm + j run.
      const int cb = pipeline_unit(p, j, false).chunk;
      const int cf = pipeline_unit(p, warm + j, true).chunk;
      if (merged_loss && pipeline_unit(p, warm - 1 + j, true).chunk == p.vpp - 1) {
        // The loss of forward warm - 1 + j, merged with backward j (done): every forward up to
        // it whole; backward j's input gradient waits for the step's exchange (after the pair).
        const double bytes = (layer_mbs - layers_of[cb]) * per_layer;
        if (bytes > best) best = bytes, best_bytes = bytes, best_first = first_chunk;
      }
      layer_mbs += layers_of[cf] - layers_of[cb];
      first_chunk += (cf == 0) - (cb == 0);
      if (merged_loss) continue;
      // The last stage peaks at the loss: in the forward of its last chunk.
      if (stage == p.pp - 1 && cf != p.vpp - 1) continue;
      const double bytes = held(cf);
      const double weight = bytes + (stage == 0 ? per_token_mb * first_chunk : 0);
      if (weight > best) best = weight, best_bytes = bytes, best_first = first_chunk;
    }
    in_flight = best_bytes / stage_act;
    token_mbs = best_first;
    merged_gradient = merged_loss;
  }
  mb.activations = stage_act * in_flight;
  // The head's saved tensors of a micro-batch on the last stage (below).
  // (The final norm's output is kept for the head's weight gradient: not under LoRA, whose head
  // is frozen.)
  const double head_saved = (p.lora() ? 1 : 2) * eb * tokens * m.hidden / sp + 16 * tokens;
  // The merged backward's input gradient, held at the last stage's loss until the step's
  // exchange (combined 1F1B, above).
  if (merged_gradient) mb.activations += eb * tokens * m.hidden / sp;
  if (stage == p.pp - 1) {
    // The head's saved tensors per micro-batch whose loss backward has not run
    // (core/lower_edges.cc): the last layer's output and the final norm's output (the head
    // GEMM's input), the labels and the loss's fp32 row maxima and sums (16 bytes a token), and
    // the loss's fp32 softmax (log-softmax under eager_loss) kept for its backward. The
    // micro-batch whose loss backward runs is counted in the transient below; GPipe runs every
    // forward first, so the last stage holds the others' too; 1F1B and interleaved run each
    // micro-batch's head backward right after its forward.
    const double heads = p.schedule == Schedule::kGpipe ? p.micro_batches() : 1;
    // (The vocab-tiled loss, plan.tiled_loss, keeps the logits instead: eb bytes a logit.)
    const double softmax = (p.tiled_loss && !p.eager_loss ? eb : 4) * tokens * vocab_t;
    mb.activations += heads * head_saved + (heads - 1) * softmax;
  }
  // The token ids of each micro-batch in flight, kept on the first stage for the embedding's
  // backward (fp32, core/lower_edges.cc).
  if (stage == 0 && !p.lora()) mb.activations += 4 * tokens * token_mbs;
  // The working set is taken at the op where the stage peaks: the loss on the last stage (its
  // logits and softmax), the first backward op on the others. What one of them holds that the
  // other has freed (a layer gathered by ZeRO-3 or prefetched from host memory, a layer rebuilt
  // by full recompute, offloaded activations brought back) counts at its own moment only.
  const bool last = stage == p.pp - 1;
  // A stage without the loss peaks in its first backward, the last layer's MLP
  // (core/lower_layer.cc), and the last stage there too where its layers' backward outweighs its
  // loss (the final norm's backward, core/lower_edges.cc head_backward, writes the residual's
  // gradient that another stage receives; the micro-batch's head tensors are freed by then,
  // below): it holds the output gradient received from the next stage and the
  // FC2 input's gradient, and either FC2's output gradient as FC2's backward reads it (the
  // residual's gradient, all-gathered under sequence parallelism: whole either way) or, once
  // FC2's weight gradient has freed that and the saved FC2 input, the FC1 outputs' gradient
  // (the activation's backward).
  double backward = 0;
  // The layer whose backward runs first: the last of the stage's last chunk.
  const int last_chunk = p.chunks() - 1;
  const int first_backward_layer = p.first_layer(m.layers, stage, last_chunk) +
                                   std::max(0, p.layers_in_chunk(m.layers, stage, last_chunk) - 1);
  const bool moe_backward = m.is_moe() && m.is_moe_layer(first_backward_layer);
  if (moe_backward) {
    // An MoE layer's backward (core/lower_moe.cc moe_backward) peaks either at the combine's
    // backward (the received gradient, the MoE output's gradient, the routed rows' gradient and
    // the router probabilities' fp32 gradient) or at the experts' activation backward (the FC2
    // input's and FC1 outputs' gradients over the gathered rows, once the combine has freed the
    // kept expert outputs and FC2's weight gradient the saved FC2 input).
    const double lb = p.precision == Dtype::kFp8 ? 1 : eb;
    const double t = p.tp, etp = p.expert_tp();
    const double router_tokens = etp != t ? tokens / t : tokens / sp;
    const double rows = router_tokens * m.moe.top_k;  // this rank's routed rows
    const double gathered_rows = (etp == t ? tokens : tokens / t) * m.moe.top_k;
    const double f = static_cast<double>(m.moe.expert_ffn) / etp;
    const double fc1_outs = m.activation == Activation::kSwiglu ? 2 : 1;
    const double dy = eb * tokens * m.hidden / sp;
    const double dprobs = 4 * router_tokens * m.moe.experts;
    const double combine = dy + dy + eb * rows * m.hidden + dprobs;
    const double kept_outputs = p.moe_probs_in_experts ? 0 : eb * rows * m.hidden;
    const double experts =
        dy + dprobs + (eb + fc1_outs * eb - lb) * gathered_rows * f - kept_outputs;
    backward = std::max(combine, experts);
  } else {
    const double lb = p.precision == Dtype::kFp8 ? 1 : eb;
    const double fc1_outs = m.activation == Activation::kSwiglu ? 2 : 1;
    const double ffn_t = tokens * m.ffn / p.tp;
    const double gathered = eb * tokens * m.hidden;
    // What FC2's backward has freed by the activation's backward: the saved FC2 input (read by
    // its weight gradient, or by its LoRA adapter's A gradient), and FC2's adapter's saved u and
    // dropout copy and mask.
    double freed = 0;
    if (!p.lora() || (p.lora_targets_linear(LoraTarget::kFc2) && p.lora_dropout <= 0))
      freed += lb * ffn_t;
    if (p.lora_targets_linear(LoraTarget::kFc2))
      freed += eb * tokens * p.lora_rank + (p.lora_dropout > 0 ? (eb + 1) * ffn_t : 0);
    // Plan::activation_fp8_input_store: the SwiGLU's backward reads its input cast back from the
    // kept fp8 copy, which the cast has freed.
    const double cast_back =
        p.activation_fp8_input_store ? fc1_outs * eb * ffn_t - fc1_outs * ffn_t : 0;
    backward = eb * tokens * m.hidden / sp + eb * ffn_t +
               std::max(gathered, fc1_outs * eb * ffn_t + cast_back - freed);
    // The residual dropout's backward, before FC2's, has freed its saved mask (1 byte a value).
    if (m.dropout) backward -= tokens * m.hidden / sp;
  }
  // The last stage's micro-batch whose backward runs: its loss and head backward have freed the
  // head's saved tensors (counted in the activations above).
  if (last) backward -= head_saved;
  // Megatron's interleaved steady state sends a forward's output only after the backward that
  // follows it (schedules.py forward_backward_pipelining_with_interleaving:
  // send_forward_backward_recv_forward_backward after backward_step_helper): the last forward's
  // output is still held at the backward.
  // Under combined 1F1B the merged forward has not produced its output yet at the peak.
  if (!last && p.schedule == Schedule::kInterleaved &&
      !(p.ep_comm_overlap && p.ep > 1 && m.is_moe()))
    backward += eb * tokens * m.hidden / sp;
  // A layer rebuilt by full recompute in the backward: its saved tensors but the input, which
  // the stage keeps already (core/lower_schedule.cc backward_layers).
  if (full_layers > 0)
    backward += largest_layer - layer_activation_bytes(m, p, Recompute::kFull, moe > 0);
  // The loss (core/lower_edges.cc): Megatron's fused vocab-parallel kernel holds the logits and
  // their fp32 softmax (the backward writes the logits' gradient beside the softmax); eager
  // PyTorch (plan.eager_loss) peaks in the backward at three fp32 logits-sized tensors: the saved
  // log-softmax output, the NLL gradient and the log-softmax gradient; four under TP (PyTorch's
  // loss_parallel computes (nll gradient + exp(log-softmax)) * grad_output with all alive).
  const double eager_bytes = p.tp > 1 ? 16 : 12;
  // The vocab-tiled loss (plan.tiled_loss) holds the logits and their gradient, both in eb.
  const double fused_bytes = p.tiled_loss ? 2 * eb : eb + 4;
  const double loss = last ? (p.eager_loss ? eager_bytes : fused_bytes) * tokens * vocab_t : 0;
  // Offloaded parameters: under ZeRO-3 the host keeps this rank's shard, copied in and gathered
  // as the reshard policy says (below); without it the stage's weights, streamed per layer: the
  // layer in use and the one prefetched (core/lower_buckets.cc acquire), none at the loss.
  const double layer_fraction = std::min(1.0, 2.0 / per_stage);
  if (p.offload.params) {
    if (p.zero < 3) backward += mb.weights * layer_fraction;
    mb.host += mb.weights;
    mb.weights = 0;
  }
  if (p.zero >= 3) {
    // The stage's weights gathered (the lowering's buckets, padded to the shard group).
    const double gathered_stage = w_bytes * params.total();
    const double per_layer = gathered_stage / per_stage;
    switch (p.reshard) {
      case Reshard::kAfterForward:
        // DeepSpeed's coordinator (core/zero3_live.h): the module elements it holds gathered at
        // the first backward op. There the layer's gradients written are FC2's bias (the
        // residual's backward before it adds it, core/lower_layer.cc layer_backward), and a tied
        // table's, from the head's weight gradient to the embedding's backward, in the
        // parameters' dtype as autograd writes DeepSpeed's gradients. Else the layer in use and
        // the prefetched one.
        if (ds_lazy_gathers(m, p)) {
          // (The use that op reads, after its fetch and prefetch, in the micro-batch where
          // they are the most.)
          const int first = p.first_layer(m.layers, stage, 0);
          const DsSchedule ds = ds_stage_schedule(m, p, first, per_stage, p.micro_batches());
          double at_backward = 0;
          for (int use : ds.first_backward)
            at_backward = std::max(at_backward, ds.live[static_cast<size_t>(use)]);
          backward += w_bytes * at_backward;
          const Linears mlp = mlp_linears(m, first_backward_layer);
          if (!mlp.empty() && mlp[mlp.size() - 1].bias)
            backward += w_bytes * static_cast<double>(mlp[mlp.size() - 1].out);
          if (m.tied_embeddings && stage == p.pp - 1) backward += w_bytes * params.embedding;
        } else {
          backward += 2 * per_layer;
        }
        break;
      case Reshard::kAfterBackward:
        // Each layer stays gathered from its forward to its backward, beside the rank's shard:
        // the whole stage at the end of the forward but the embedding, whose backward does not
        // read its table (the lowering frees the gathered copy after its last use).
        mb.weights += gathered_stage - w_bytes * params.embedding;
        break;
      case Reshard::kAfterStep:
        // Parameters gathered for the step beside the shard, gradients accumulated unsharded and
        // reduced once.
        mb.weights += gathered_stage;
        mb.gradients += g_bytes * params.total();  // in the optimizer's dtype, as lowered
        break;
    }
    if (stage == 0) mb.weights += root_table * token_mbs;  // FSDP2's root group (above)
    // DeepSpeed's persistent parameters (core/gather_units.h persistent_params) stay gathered on
    // every rank for the whole step, beside their shard: each its full size, padded to the dense
    // shard group as the lowering's persistent_gathers allocates it.
    const double ways = p.dense_shard_ranks();
    if (p.zero3_unit == GatherUnit::kModule && !p.offload.params && ways > 1)
      for (const PersistentParam& x : stage_persistent_params(m, p, stage))
        mb.weights += w_bytes * std::ceil(x.elements / ways) * ways;
  }

  // Offloaded optimizer state and activations leave the device (a double buffer of two layers'
  // activations stays).
  if (p.offload.optimizer) {
    mb.host += mb.optimizer;
    mb.optimizer = 0;
  }
  // ZeRO-Offload streams each layer's reduced gradients to pinned host memory as the backward
  // produces them (core/offload_rules.h): the fp32 gradient shard lives on the host.
  if (gradients_streamed_to_host(p)) {
    mb.host += mb.gradients;
    mb.gradients = 0;
  }
  if (p.offload.activations) {
    // Each layer's saved tensors leave after its forward and come back one layer ahead of its
    // backward (core/lower_offload.cc): none at the loss, two layers in the backward.
    const double layers_act = stage_act * in_flight;
    mb.host += layers_act;
    mb.activations -= layers_act;
    backward += std::min(layers_act, 2 * stage_act / per_stage);
  }
  mb.transient = last ? std::max(loss, backward) : backward;
  mb.buffers = runtime_overhead_bytes(c, p);
  return mb;
}
}  // namespace

std::vector<MemoryBreakdown> memory_per_stage(const Model& m, const Cluster& c, const Plan& p) {
  const ParamCounts pc = param_counts(m);
  std::vector<MemoryBreakdown> out;
  out.reserve(static_cast<size_t>(p.pp));
  for (int s = 0; s < p.pp; ++s) out.push_back(memory_of_stage(m, pc, c, p, s));
  return out;
}

}  // namespace parasol::cost
