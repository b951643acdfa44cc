// Multi-head latent attention's projections (DeepSeek-V2/V3; core/layer_shapes.h), forward and
// backward. On the rank's sequence shard (the norm region): the replicated down-projections
// (q_down, kv_down) and the latent norms (q_norm on the query latent; kv_norm on the kv latent,
// passing the rotary key through); under SP the latents and the rotary key are all-gathered
// (Megatron's f), then the column-parallel up-projections (q_up or q, kv_up) and "qkv.pack",
// which forms this rank's heads of Q | K | V: Q from q_up with RoPE on each head's rotary
// columns, K from kv_up's non-rotary key and the rotated shared rotary key, V from kv_up. The
// attention core then runs as on a fused QKV buffer, with v_head_dim values.
//
// Saved: the pre-norm latents (q_down and kv_down outputs) and Q | K | V, as
// cost::layer_activation_bytes counts them; the backward recomputes the normed latents from the
// saved ones (a norm forward in the recompute phase) for the up-projections' weight gradients.
// Under mla_up_proj recompute Q | K | V are not kept: the recompute (lower_recompute.cc) re-runs
// the latent norms and mla_up_forward, and the backward reuses those normed latents.
#include "core/lower_internal.h"

namespace parasol::lowering {

// The latent norms on the saved pre-norm latents: the normed query latent, and the normed kv
// latent with the rotary key passed through (the norm's weight covers the latent's columns
// only; core/lower.h).
Lowerer::Latents Lowerer::mla_latents(int layer, const Saved& sv, const WSet& w) {
  const MlaSpec& a = m_.mla;
  const int64_t ql = a.q_lora_rank, kl = a.kv_lora_rank, rope = a.qk_rope_head_dim;
  Latents l;
  if (ql > 0) {
    l.q = ws(layer, "q_norm", {Tn_, ql});
    elementwise(OpKind::kNorm, layer, "q_norm", double(Tn_) * ql, kb_.norm * Tn_ * ql,
                {sv[sQLat], w[kQNorm]}, {l.q});
  }
  l.kv = ws(layer, "kv_norm", {Tn_, kl});
  l.pe = ws(layer, "kv_pe", {Tn_, rope});
  elementwise(OpKind::kNorm, layer, "kv_norm", double(Tn_) * kl, kb_.norm * Tn_ * (kl + rope),
              {sv[sKvLat], w[kKvNorm]}, {l.kv, l.pe});
  return l;
}

void Lowerer::mla_forward(int layer, const WSet& w, Saved& sv) {
  const MlaSpec& a = m_.mla;
  const int64_t ql = a.q_lora_rank, kl = a.kv_lora_rank, rope = a.qk_rope_head_dim;
  const int xn = sv[sXn];
  if (ql > 0) {
    sv[sQLat] = act(layer, "q_lat", {Tn_, ql});
    gemm(layer, "q_down", Tn_, ql, h_, 1, {xn, w[kQDown], w[kQDownB]}, {sv[sQLat]});
  }
  sv[sKvLat] = act(layer, "kv_lat", {Tn_, kl + rope});
  gemm(layer, "kv_down", Tn_, kl + rope, h_, 1, {xn, w[kKvDown], w[kKvDownB]}, {sv[sKvLat]});
  mla_up_forward(layer, mla_latents(layer, sv, w), w, sv);
}

// The column-parallel up-projections on every row of the sequence, from the normed latents (the
// norm1 output for q without query compression), and "qkv.pack" into sv[sQkv].
void Lowerer::mla_up_forward(int layer, const Latents& lat, const WSet& w, Saved& sv) {
  const MlaSpec& a = m_.mla;
  const int64_t ql = a.q_lora_rank, kl = a.kv_lora_rank, rope = a.qk_rope_head_dim;
  const int64_t kv_up_cols = heads_t_ * (a.qk_nope_head_dim + a.v_head_dim);
  const int xn = sv[sXn];
  const char* q_name = ql > 0 ? "q_up" : "q";
  const int q_in = tp_gather_in(layer, ql > 0 ? lat.q : xn, T_, true);
  const Slot qw = ql > 0 ? kQUp : kQ;
  const int q = ws(layer, q_name, {T_, q_cols_});
  gemm(layer, q_name, T_, q_cols_, ql > 0 ? ql : h_, 1, {q_in, w[qw], w[qw + 1]}, {q});
  const int kv_in = tp_gather_in(layer, lat.kv, T_, true);
  const int kv = ws(layer, "kv_up", {T_, kv_up_cols});
  gemm(layer, "kv_up", T_, kv_up_cols, kl, 1, {kv_in, w[kKvUp], w[kKvUpB]}, {kv});
  const int pe = tp_gather_in(layer, lat.pe, T_, true);
  sv[sQkv] = role(BufferRole::kQkv, act(layer, "qkv", {T_, qkv_cols_}));
  const double moved = double(T_) * (q_cols_ + kv_up_cols + rope + qkv_cols_);
  role(OpRole::kQkvPack,
       rotary_epilogue(elementwise(OpKind::kResidualAdd, layer, "qkv.pack", double(T_) * qkv_cols_,
                                   eb_ * moved, {q, kv, pe}, {sv[sQkv]}),
                       false));
}

// Returns the gradient of the norm1 output (its sequence shard).
int Lowerer::mla_backward(int layer, const Saved& sv, int dqkv, const WSet& w, const WSet& g) {
  const MlaSpec& a = m_.mla;
  const int64_t ql = a.q_lora_rank, kl = a.kv_lora_rank, rope = a.qk_rope_head_dim;
  const int64_t kv_up_cols = heads_t_ * (a.qk_nope_head_dim + a.v_head_dim);
  const int xn = sv[sXn];
  // The normed latents again, for the up-projections' weight gradients (unless the recompute of
  // the up-projections formed them).
  Latents lat{sv[sQn], sv[sKvn], sv[sKpe]};
  if (lat.kv < 0) {
    at(layer, Phase::kRecompute);
    lat = mla_latents(layer, sv, w);
    at(layer, Phase::kBackward);
  }
  const int dq = ws(layer, ql > 0 ? "q_up.dy" : "q.dy", {T_, q_cols_});
  const int dkv = ws(layer, "kv_up.dy", {T_, kv_up_cols});
  const int dpe = ws(layer, "kv_pe.dy", {T_, rope});
  const double moved = double(T_) * (q_cols_ + kv_up_cols + rope + qkv_cols_);
  role(OpRole::kQkvUnpack,
       rotary_epilogue(elementwise(OpKind::kResidualAdd, layer, "qkv.unpack",
                                   double(T_) * qkv_cols_, eb_ * moved, {dqkv}, {dq, dkv, dpe}),
                       true));
  // kv: the up-projection's gradients, reduced over tp (partial sums over this rank's heads),
  // then the norm's backward (the rotary key's gradient passing through) and the
  // down-projection's.
  const int kv_in = tp_gather_in(layer, lat.kv, T_);
  const int dkvn_p = ws(layer, "kv_up.dx", {T_, kl});
  gemm(layer, "kv_up.dx", T_, kl, kv_up_cols, 1, {dkv, w[kKvUp]}, {dkvn_p}, true);
  const int dkvn = tp_reduce_out(layer, dkvn_p, T_, "kv_up.dx.tp");
  role(OpRole::kWeightGrad,
       gemm(layer, "kv_up.dw", kl, kv_up_cols, T_, 1, {kv_in, dkv}, {g[kKvUp], g[kKvUpB]}));
  const int dpe_n = tp_reduce_out(layer, dpe, T_, "kv_pe.dx.tp");
  const int dkv_lat = ws(layer, "kv_lat.dx", {Tn_, kl + rope});
  elementwise(OpKind::kNorm, layer, "kv_norm", double(Tn_) * kl, 2 * kb_.norm * Tn_ * (kl + rope),
              {sv[sKvLat], dkvn, dpe_n, w[kKvNorm]}, {dkv_lat, g[kKvNorm]});
  // q: the up-projection (or the plain q projection), the norm and the down-projection.
  int dxn;
  const int q_in = tp_gather_in(layer, ql > 0 ? lat.q : xn, T_);
  const int64_t q_k = ql > 0 ? ql : h_;
  const int dqin_p = ws(layer, ql > 0 ? "q_up.dx" : "q.dx", {T_, q_k});
  const Slot qw = ql > 0 ? kQUp : kQ;
  gemm(layer, ql > 0 ? "q_up.dx" : "q.dx", T_, q_k, q_cols_, 1, {dq, w[qw]}, {dqin_p}, true);
  const int dqin = tp_reduce_out(layer, dqin_p, T_, ql > 0 ? "q_up.dx.tp" : "q.dx.tp");
  role(OpRole::kWeightGrad, gemm(layer, ql > 0 ? "q_up.dw" : "q.dw", q_k, q_cols_, T_, 1,
                                 {q_in, dq}, {g[qw], g[qw + 1]}));
  if (ql > 0) {
    const int dq_lat = ws(layer, "q_lat.dx", {Tn_, ql});
    elementwise(OpKind::kNorm, layer, "q_norm", double(Tn_) * ql, 2 * kb_.norm * Tn_ * ql,
                {sv[sQLat], dqin, w[kQNorm]}, {dq_lat, g[kQNorm]});
    dxn = ws(layer, "q_down.dx", {Tn_, h_});
    gemm(layer, "q_down.dx", Tn_, h_, ql, 1, {dq_lat, w[kQDown]}, {dxn}, true);
    role(OpRole::kWeightGrad,
         gemm(layer, "q_down.dw", h_, ql, Tn_, 1, {xn, dq_lat}, {g[kQDown], g[kQDownB]}));
  } else {
    dxn = dqin;
  }
  // kv_down's data gradient adds to the query side's.
  gemm(layer, "kv_down.dx", Tn_, h_, kl + rope, 1, {dkv_lat, w[kKvDown], dxn}, {dxn}, true);
  role(OpRole::kWeightGrad,
       gemm(layer, "kv_down.dw", h_, kl + rope, Tn_, 1, {xn, dkv_lat}, {g[kKvDown], g[kKvDownB]}));
  return dxn;
}

}  // namespace parasol::lowering
