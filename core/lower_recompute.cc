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
#include <initializer_list>

#include "core/lower_internal.h"

namespace parasol::lowering {

void Lowerer::drop_recomputed(int layer, Saved& keep) const {
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

}  // namespace parasol::lowering
