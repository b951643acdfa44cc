// Memory cost model: per-rank weights, gradients, optimizer state, activations, the runtime's own
// memory, and host memory taken by offload.
#include "cost_models/memory.h"

#include <algorithm>
#include <cmath>

#include "core/layer_shapes.h"
#include "core/offload_rules.h"
#include "core/pipeline_schedule.h"

namespace parasol::cost {

namespace {
constexpr double MiB = 1024.0 * 1024.0;

double activation_dtype_bytes(const Plan& p) { return p.precision == Dtype::kFp32 ? 4 : 2; }

}  // namespace

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
  double bytes = 0;
  bytes += (eb + lb) * tokens * h / sp;  // norm1 input, QKV input (norm1 output)
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
  bytes += lb * tokens * m.heads * m.v_head_dim() / t;  // attention output = out-proj input
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
  if (!(moe_layer && recomputed(RecomputeModule::kLayernorm)))
    bytes += (moe_layer ? eb : lb) * tokens * h / sp;
  auto mlp = [&](double rows, double ffn, double parts) {
    const double fc1_outs = m.activation == Activation::kSwiglu ? 2 : 1;
    return (fc1_outs * eb + lb) * rows * ffn / parts;  // FC1 out(s), FC2 input
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
    // The experts' outputs, kept by the combine for the router probabilities' gradient
    // (Megatron's unpermute with probs saves the permuted tokens; the lowering's sEret).
    bytes += eb * routed * h;
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
  const double t = p.tp;
  // One layer of each kind on this rank: the replicated parts (MLA's down-projections and
  // latent norms, the router) whole, the rest split tp ways; experts split etp ways and spread
  // over ep ranks.
  const double attention =
      static_cast<double>(pc.attention - pc.attention_replicated) / t + pc.attention_replicated;
  const double dense_layer = attention + pc.norms + pc.dense_mlp / t;
  const double moe_layer = attention + pc.norms + pc.router + pc.shared_mlp / t;
  const double experts = static_cast<double>(pc.expert_mlp) / p.expert_tp() *
                         (static_cast<double>(m.moe.experts) / p.ep);

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
  const double table = static_cast<double>(m.vocab) * m.hidden / t;
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
  const double o_bytes = pure_bf16 ? 4 : low ? 12 : 8;
  const double dense_shard = p.dense_shard_ranks();
  const double expert_shard = p.expert_shard_ranks();
  auto sharded = [&](double bytes_per_param, bool shard) {
    return params.dense * bytes_per_param / (shard ? dense_shard : 1) +
           params.expert * bytes_per_param / (shard ? expert_shard : 1);
  };
  mb.weights = sharded(w_bytes, p.zero >= 3);
  // fp8 weights are counted as Transformer Engine's fp8 parameters (NeMo's performance configs,
  // fp8_params / fp8_param_gather): a 1-byte weight and its 1-byte transpose, the bytes of the
  // bf16 weight. Runs that keep bf16 weights and cast them once per step also keep the two fp8
  // copies (2 more bytes a linear weight); no plan switch says which yet.
  mb.gradients = sharded(g_bytes, p.zero >= 2);
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
  if (stage == 0 && m.dropout) stage_act += tokens * m.hidden / sp;  // embedding dropout mask
  double in_flight = in_flight_micro_batches(p, stage);
  if (p.schedule == Schedule::kInterleaved && per_stage > 0) {
    // Which chunks the in-flight chunk micro-batches belong to, in the schedule's order
    // (core/pipeline_schedule.h's pipeline_unit), weighted by each chunk's layers: the average
    // of in_flight_micro_batches when the chunks are equal, exact when they are not.
    const int chunk_mbs = static_cast<int>(std::lround(in_flight * p.vpp));
    double layer_mbs = 0;
    int chunk = -1, chunk_layers = 0;  // the chunk of the k before, and its layers
    for (int k = 0; k < chunk_mbs; ++k) {
      const int c = pipeline_unit(p, k, true).chunk;
      if (c != chunk) chunk_layers = p.layers_in_chunk(m.layers, stage, chunk = c);
      layer_mbs += chunk_layers;
    }
    in_flight = layer_mbs / per_stage;
  }
  mb.activations = stage_act * in_flight;
  if (stage == p.pp - 1) {
    // The head's saved tensors per micro-batch whose loss backward has not run
    // (core/lower_edges.cc): the last layer's output and the final norm's output (the head
    // GEMM's input), the labels and the loss's fp32 row maxima and sums (16 bytes a token), and
    // the loss's fp32 softmax (log-softmax under eager_loss) kept for its backward. The
    // micro-batch whose loss backward runs is counted in the transient below; GPipe runs every
    // forward first, so the last stage holds the others' too; 1F1B and interleaved run each
    // micro-batch's head backward right after its forward.
    const double heads = p.schedule == Schedule::kGpipe ? p.micro_batches() : 1;
    const double head = 2 * eb * tokens * m.hidden / sp + 16 * tokens;
    const double softmax = 4 * tokens * m.vocab / p.tp;
    mb.activations += heads * head + (heads - 1) * softmax;
  }
  // The token ids of each micro-batch in flight, kept on the first stage for the embedding's
  // backward (fp32, core/lower_edges.cc).
  if (stage == 0) mb.activations += 4 * tokens * in_flight_micro_batches(p, stage);
  if (stage != p.pp - 1 && !m.is_moe() && !m.mla.enabled()) {
    // A stage without the loss peaks in its first backward, the last layer's MLP
    // (core/lower_layer.cc): it holds the output gradient received from the next stage and the
    // FC2 input's gradient, and either the gradient's sequence-parallel all-gather (FC2's input
    // and weight gradients) or, once FC2's weight gradient has freed that and the saved FC2
    // input, the FC1 outputs' gradient (the activation's backward).
    const double lb = p.precision == Dtype::kFp8 ? 1 : eb;
    const double fc1_outs = m.activation == Activation::kSwiglu ? 2 : 1;
    const double ffn_t = tokens * m.ffn / p.tp;
    const double gathered = p.sequence_parallel && p.tp > 1 ? eb * tokens * m.hidden : 0;
    mb.transient +=
        eb * tokens * m.hidden / sp + eb * ffn_t + std::max(gathered, (fc1_outs * eb - lb) * ffn_t);
  }

  // Transient working set: a layer rebuilt by full recompute; fp32 logits and their gradient on
  // the last stage; ZeRO-3 gathers.
  if (full_layers > 0) mb.transient += largest_layer;
  // The loss (core/lower_edges.cc): Megatron's fused vocab-parallel kernel holds the logits and
  // their fp32 softmax (the backward writes the logits' gradient beside the softmax); eager
  // PyTorch (plan.eager_loss) peaks in the backward at three fp32 logits-sized tensors: the saved
  // log-softmax output, the NLL gradient and the log-softmax gradient; four under TP (PyTorch's
  // loss_parallel computes (nll gradient + exp(log-softmax)) * grad_output with all alive).
  const double eager_bytes = p.tp > 1 ? 16 : 12;
  if (stage == p.pp - 1)
    mb.transient += (p.eager_loss ? eager_bytes : eb + 4) * tokens * m.vocab / p.tp;
  // Offloaded parameters: under ZeRO-3 the host keeps this rank's shard, copied in and gathered
  // as the reshard policy says (below); without it the stage's weights, streamed per layer.
  const double layer_fraction = std::min(1.0, 2.0 / per_stage);
  if (p.offload.params) {
    const double kept = p.zero >= 3 ? 0 : mb.weights * layer_fraction;
    mb.host += mb.weights - kept;
    mb.weights = kept;
  }
  if (p.zero >= 3) {
    const double gathered_stage = w_bytes * params.total();
    const double per_layer = gathered_stage / per_stage;
    switch (p.reshard) {
      case Reshard::kAfterForward:
        mb.transient += 2 * per_layer;  // the layer in use and the prefetched one
        break;
      case Reshard::kAfterBackward:
        // Each layer stays gathered from its forward to its backward: the whole stage at the
        // end of the forward.
        mb.weights += gathered_stage - mb.weights;
        mb.transient += per_layer;
        break;
      case Reshard::kAfterStep:
        // Parameters gathered for the step, gradients accumulated unsharded and reduced once.
        mb.weights += gathered_stage - mb.weights;
        mb.gradients += dtype_bytes(p.grad_reduce_dtype) * params.total();
        break;
    }
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
    double kept = std::min(mb.activations, 2 * stage_act / per_stage);
    mb.host += mb.activations - kept;
    mb.activations = kept;
  }
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
