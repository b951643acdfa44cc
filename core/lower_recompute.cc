// Selective recompute of Megatron-Core's --recompute-modules (core/plan.h's RecomputeModule):
// which of a layer's saved slots the recomputed modules do not keep after the forward, and the
// module forwards re-run in Phase::kRecompute before the layer's backward to refill them:
//   core_attn       the attention core (materialised: the probabilities, masks not kept);
//   moe_act         the routed experts' activation from the kept expert FC1 output (MoE layers);
//   layernorm       the pre-MLP norm of MoE layers from the kept norm2 input;
//   mla_up_proj     MLA's latent norms, up-projections and RoPE from the kept latents;
//   mlp             the dense MLP from its kept input (dense layers; TP collectives included);
//   moe             the whole MoE block from its kept input (router, dispatch and all-to-alls,
//                   experts, combine, shared experts);
//   shared_experts  the shared experts' MLP from its kept input (MoE layers).
// Full recompute (the first layers of a stage under Recompute::kFull) is lower_schedule.cc's.
//
// torchtitan's op-level selective activation checkpointing (Recompute::kSelectiveOp;
// torchtitan/parallelisms/parallelize_llama.py @9dec370 _apply_ac_to_transformer_block, the same
// at e7c0cae torchtitan/models/llama3/parallelize_llama.py): torch.utils.checkpoint's selective
// checkpointing with a policy that MUST_SAVEs the outputs of the ops in _save_list (aten.mm, the
// SDPA flash and efficient kernels, _c10d_functional.reduce_scatter_tensor, abs, max) except
// every second aten.mm counted per block and per forward, and PREFER_RECOMPUTEs all else. A Llama
// block runs wq, wk, wv, wo, w1, w3, w2 in that order (torchtitan/models/llama/model.py:
// Attention.forward's `self.wq(x), self.wk(x), self.wv(x)`, then self.wo; FeedForward's
// `self.w2(F.silu(self.w1(x)) * self.w3(x))`), so the mm counts 2, 4 and 6 (wk, wo, w3) are
// recomputed. What the layer keeps: its input (the checkpoint's argument), the cached outputs of
// wq, wv, the attention kernel (output and log-sum-exp), w1, w2 and, under SP, the two
// reduce-scatters. The backward's recompute re-runs the block's forward with the cached outputs
// returned instead of re-run: attention_norm, wk (its input gathered again under SP), RoPE, wo,
// the first residual add, ffn_norm, w3 (gathered again) and the SwiGLU; the w2 mm and the
// attention kernel are not re-run.
#include <initializer_list>

#include "core/lower_internal.h"

namespace parasol::lowering {

void Lowerer::drop_recomputed(int layer, Saved& keep) const {
  if (op_ac_) {
    Saved kept = no_saved();
    for (SavedSlot s : {sX, sQkv, sAo, sLse, sFc1, sFc2o, sOutRs, sMlpRs}) kept[s] = keep[s];
    keep = kept;
    return;
  }
  auto drop = [&](std::initializer_list<SavedSlot> slots) {
    for (SavedSlot s : slots) keep[s] = -1;
  };
  auto on = [&](RecomputeModule r) { return p_.recomputes(r); };
  const bool moe = m_.is_moe_layer(layer);
  if (on(RecomputeModule::kCoreAttn) && !flash_) drop({sProbs, sPmask, sPdrop});
  // Under the a2a exchange the kernel's own output (before its all-to-all back) is kept for the
  // backward; a recomputed core attention keeps none of it.
  if (on(RecomputeModule::kCoreAttn) && flash_ && p_.cp > 1 &&
      p_.cp_impl == CpImpl::kTransformerEngine && p_.cp_comm_type == CpCommType::kA2a)
    drop({sAoRc});
  if (on(RecomputeModule::kMlaUpProj) && mla_) drop({sQkv});
  if (!moe) {
    if (on(RecomputeModule::kMlp)) drop({sFc1, sAct});
    return;
  }
  if (on(RecomputeModule::kLayernorm)) drop({sX1n});
  if (on(RecomputeModule::kMoe)) drop({sRprobs, sDisp, sFc1, sAct, sEret, sSfc1, sSact});
  if (on(RecomputeModule::kMoeAct)) drop({sAct});
  if (on(RecomputeModule::kSharedExperts)) drop({sSfc1, sSact});
}

// In dependency order: the norm before the MLP block that reads it, the MLP block (its backward
// comes first), Q | K | V before the attention core that reads them.
void Lowerer::recompute_modules(int layer, const WSet& w, Saved& sv) {
  if (op_ac_) return recompute_ops(layer, w, sv);
  auto on = [&](RecomputeModule r) { return p_.recomputes(r); };
  const bool moe = m_.is_moe_layer(layer);
  at(layer, Phase::kRecompute);
  if (moe && on(RecomputeModule::kLayernorm)) mlp_norm(layer, w, sv);
  if (!moe && on(RecomputeModule::kMlp)) mlp_forward(layer, dense_mlp(), w, sv);
  if (moe && on(RecomputeModule::kMoe)) {
    moe_forward(layer, sv[sX1n], w, sv);
  } else if (moe) {
    if (on(RecomputeModule::kMoeAct)) moe_expert_act(layer, sv);
    if (on(RecomputeModule::kSharedExperts) && m_.moe.shared_experts > 0)
      mlp_forward(layer, shared_mlp(), w, sv);
  }
  if (mla_ && on(RecomputeModule::kMlaUpProj)) {
    const Latents lat = mla_latents(layer, sv, w);
    mla_up_forward(layer, lat, w, sv);
    sv[sQn] = lat.q;
    sv[sKvn] = lat.kv;
    sv[sKpe] = lat.pe;
  }
  if (on(RecomputeModule::kCoreAttn)) attention_forward(layer, sv, true);
}

// torchtitan's op-level policy: the block's PREFER_RECOMPUTE ops in forward order, from its kept
// input and cached mm, attention and reduce-scatter outputs.
void Lowerer::recompute_ops(int layer, const WSet& w, Saved& sv) {
  at(layer, Phase::kRecompute);
  const double nh = double(Tn_) * h_;
  // attention_norm, then wk (the 2nd mm) with RoPE on Q and K (their type_as outputs feed SDPA).
  sv[sXn] = ws(layer, "ln1", {Tn_, h_}, ldt_);
  elementwise(OpKind::kNorm, layer, "ln1", nh, kb_.norm * nh, {sv[sX], w[kNorm1]}, {sv[sXn]});
  const int in = tp_gather_in(layer, sv[sXn], T_, true);
  sv[sK] = ws(layer, "k", {T_, k_cols_});
  rotary_epilogue(gemm(layer, "k", T_, k_cols_, h_, 1, {in, w[kQkv], sv[sQkv]}, {sv[sK]}), false);
  // wo (the 4th mm) from the cached attention output; under SP its reduce-scatter's output is
  // cached and not re-run.
  const int o = ws(layer, "out", {T_, h_});
  gemm(layer, "out", T_, h_, ao_cols_, 1, {sv[sAo], w[kOut]}, {o});
  sv[sX1] = ws(layer, "res1", {Tn_, h_});
  elementwise(OpKind::kResidualAdd, layer, "res1", nh, kb_.residual * nh,
              {sv[sX], sp_ ? sv[sOutRs] : o}, {sv[sX1]});
  // ffn_norm, then w3 (the 6th mm) and the SwiGLU from the cached w1 output.
  mlp_norm(layer, w, sv);
  const int in2 = tp_gather_in(layer, sv[sX1n], T_, true);
  sv[sFc3] = ws(layer, "fc3", {T_, ffn_t_});
  gemm(layer, "fc3", T_, ffn_t_, h_, 1, {in2, w[kFc1]}, {sv[sFc3]});
  // The recompute ends at w2, whose cached output (and under SP the reduce-scatter's after it)
  // the replay pops and drops: the last reads of what no backward op reads.
  sv[sAct] = ws(layer, "act", {T_, ffn_t_}, ldt_);
  elementwise(OpKind::kActivation, layer, "act", double(T_) * ffn_t_, kb_.activation * T_ * ffn_t_,
              {sv[sFc1], sv[sFc3], sv[sFc2o], sv[sMlpRs]}, {sv[sAct]});
}

}  // namespace parasol::lowering
