// A decoder layer's forward and backward: norms, column-parallel QKV, attention (flash or
// materialised, GQA; a ring of context-parallel steps under cp > 1), row-parallel
// out-projection, residuals (+ dropout) and the dense MLP. The MoE MLP is in lower_moe.cc.
#include "core/lower_internal.h"

namespace parasol::lowering {

void Lowerer::attention_forward(int layer, Saved& sv, bool recompute) {
  const int mb = tags_.micro_batch;
  std::vector<int> outs;
  if (!recompute) {
    sv[sAo] = act(layer, "attn", {T_, q_cols_});
    outs.push_back(sv[sAo]);
  } else if (flash_) {
    sv[sAoRc] = ws(layer, "attn.rc", {T_, q_cols_});
    outs.push_back(sv[sAoRc]);
  }
  if (flash_) {
    if (!recompute) {
      sv[sLse] = act(layer, "lse", {p_.micro_batch, heads_t_, Sl_}, Dtype::kFp32);
      outs.push_back(sv[sLse]);
    }
  } else {
    const std::vector<int64_t> scores = {p_.micro_batch, heads_t_, Sl_, seq_};
    sv[sProbs] = act(layer, "probs", scores);
    outs.push_back(sv[sProbs]);
    if (m_.dropout) {
      sv[sPmask] = act(layer, "pmask", scores, Dtype::kFp8);
      sv[sPdrop] = act(layer, "pdrop", scores);
      outs.push_back(sv[sPmask]);
      outs.push_back(sv[sPdrop]);
    }
  }
  const int cp = p_.cp;
  const AttnShape a = attention_shape();
  const double flops = attention_flops(a);
  // Tags of the forward, the full-layer recompute and the selective recompute differ.
  const int phase = recompute ? 3 : tags_.phase == Phase::kRecompute ? 2 : 0;
  const double kv_bytes = 2 * eb_ * T_ * kv_cols_;
  int kv = -1;  // the K/V chunk in hand (-1: the local one, inside qkv)
  for (int j = 0; j < cp; ++j) {
    int next = -1;
    if (j < cp - 1) {
      // Ring attention: pass the chunk in hand on while attending to it.
      next = ws(layer, "kv", {2, T_, kv_cols_});
      p2p(OpKind::kSend, Group::kCp, -1, cp_tag(layer, mb, phase, j, 0), layer, "kv.send", kv_bytes,
          kv >= 0 ? kv : sv[sQkv]);
      p2p(OpKind::kRecv, Group::kCp, -1, cp_tag(layer, mb, phase, j, 0), layer, "kv.recv", kv_bytes,
          next);
    }
    Op op = make(OpKind::kAttention, layer, recompute ? "attn.rc" : "attn", kCompute);
    op.attn = a;
    op.flops = flops;
    op.elements = double(T_) * q_cols_;
    set(op.reads, {sv[sQkv], kv});
    set(op.writes, outs);
    emit(op);
    kv = next;
  }
}

// The K/V gradient of ring step `step` travels on with its chunk; after the last step it goes
// home to the chunk's owner (the next rank), which folds it into its dQKV. Returns the
// accumulator received for the next step (-1 after the last).
int Lowerer::ring_dkv_exchange(int layer, int mb, int step, int dkv, int dqkv) {
  const int cp = p_.cp;
  const double kv_bytes = 2 * eb_ * T_ * kv_cols_;
  if (cp == 1) return -1;
  int recv = ws(layer, "dkv", {2, T_, kv_cols_});
  p2p(OpKind::kSend, Group::kCp, -1, cp_tag(layer, mb, 1, step, 1), layer, "dkv.send", kv_bytes,
      dkv);
  p2p(OpKind::kRecv, Group::kCp, -1, cp_tag(layer, mb, 1, step, 1), layer, "dkv.recv", kv_bytes,
      recv);
  if (step < cp - 1) return recv;
  elementwise(OpKind::kResidualAdd, layer, "dkv.fold", 2.0 * T_ * kv_cols_, 3 * kv_bytes,
              {dqkv, recv}, {dqkv});
  return -1;
}

int Lowerer::attention_backward(int layer, const Saved& sv, int dao) {
  const int mb = tags_.micro_batch;
  const int cp = p_.cp;
  int dqkv = act(layer, "dqkv", {T_, qkv_cols_});
  const AttnShape a = attention_shape();
  const double flops = (flash_ ? 2.5 : 2.0) * attention_flops(a);  // flash recomputes scores
  const double kv_bytes = 2 * eb_ * T_ * kv_cols_;
  const int out = sv[sAoRc] >= 0 ? sv[sAoRc] : sv[sAo];
  int kv = -1, dkv_in = -1;
  for (int j = 0; j < cp; ++j) {
    int next = -1;
    if (j < cp - 1) {
      next = ws(layer, "kv", {2, T_, kv_cols_});
      p2p(OpKind::kSend, Group::kCp, -1, cp_tag(layer, mb, 1, j, 0), layer, "kv.send", kv_bytes,
          kv >= 0 ? kv : sv[sQkv]);
      p2p(OpKind::kRecv, Group::kCp, -1, cp_tag(layer, mb, 1, j, 0), layer, "kv.recv", kv_bytes,
          next);
    }
    int dkv = cp > 1 ? ws(layer, "dkv", {2, T_, kv_cols_}) : -1;
    Op op = make(OpKind::kAttention, layer, "attn", kCompute);
    op.attn = a;
    op.flops = flops;
    op.elements = double(T_) * q_cols_;
    set(op.reads, {sv[sQkv], kv, out, sv[sLse], sv[sProbs], sv[sPmask], sv[sPdrop], dao, dkv_in});
    set(op.writes, {dqkv, dkv});
    emit(op);
    dkv_in = ring_dkv_exchange(layer, mb, j, dkv, dqkv);
    kv = next;
  }
  return dqkv;
}

int Lowerer::layer_forward(int layer, int x, const WSet& w, Saved& sv) {
  sv = no_saved();
  sv[sX] = x;
  const double nh = double(Tn_) * h_;
  // Attention block.
  sv[sXn] = act(layer, "ln1", {Tn_, h_});
  elementwise(OpKind::kNorm, layer, "ln1", nh, 2 * eb_ * nh, {x, w[kNorm1]}, {sv[sXn]});
  int in = tp_gather_in(layer, sv[sXn], T_);
  sv[sQkv] = act(layer, "qkv", {T_, qkv_cols_});
  gemm(layer, "qkv", T_, qkv_cols_, h_, 1, {in, w[kQkv], w[kQkvB]}, {sv[sQkv]});
  attention_forward(layer, sv, false);
  int o = ws(layer, "out", {T_, h_});
  gemm(layer, "out", T_, h_, q_cols_, 1, {sv[sAo], w[kOut]}, {o});
  int a = tp_reduce_out(layer, o, T_, "out.tp");
  sv[sX1] = act(layer, "res1", {Tn_, h_});
  if (m_.dropout) sv[sMask1] = act(layer, "mask1", {Tn_, h_}, Dtype::kFp8);
  elementwise(OpKind::kResidualAdd, layer, "res1", nh, (3 * eb_ + drop_) * nh, {x, a, w[kOutB]},
              {sv[sX1], sv[sMask1]});
  // MLP block.
  sv[sX1n] = act(layer, "ln2", {Tn_, h_});
  elementwise(OpKind::kNorm, layer, "ln2", nh, 2 * eb_ * nh, {sv[sX1], w[kNorm2]}, {sv[sX1n]});
  const int y =
      m_.is_moe_layer(layer) ? moe_forward(layer, sv[sX1n], w, sv) : mlp_forward(layer, w, sv);
  int x2 = act(layer, "res2", {Tn_, h_});
  if (m_.dropout) sv[sMask2] = act(layer, "mask2", {Tn_, h_}, Dtype::kFp8);
  elementwise(OpKind::kResidualAdd, layer, "res2", nh, (3 * eb_ + drop_) * nh,
              {sv[sX1], y, w[kFc2B]}, {x2, sv[sMask2]});
  return x2;
}

// Column-parallel FC1, activation, row-parallel FC2 on the norm2 output; returns the MLP output
// on the norm region's rows.
int Lowerer::mlp_forward(int layer, const WSet& w, Saved& sv) {
  int in = tp_gather_in(layer, sv[sX1n], T_);
  sv[sFc1] = act(layer, "fc1", {T_, up_ * ffn_t_});
  gemm(layer, "fc1", T_, up_ * ffn_t_, h_, 1, {in, w[kFc1], w[kFc1B]}, {sv[sFc1]});
  sv[sAct] = act(layer, "act", {T_, ffn_t_});
  elementwise(OpKind::kActivation, layer, "act", double(T_) * ffn_t_, (up_ + 1) * eb_ * T_ * ffn_t_,
              {sv[sFc1]}, {sv[sAct]});
  int o2 = ws(layer, "fc2", {T_, h_});
  gemm(layer, "fc2", T_, h_, ffn_t_, 1, {sv[sAct], w[kFc2]}, {o2});
  return tp_reduce_out(layer, o2, T_, "fc2.tp");
}

int Lowerer::mlp_backward(int layer, const Saved& sv, int dres2, const WSet& w, const WSet& g) {
  int d = tp_gather_in(layer, dres2, T_);  // conjugate of g
  int da = act(layer, "act.dy", {T_, ffn_t_});
  gemm(layer, "fc2.dx", T_, ffn_t_, h_, 1, {d, w[kFc2]}, {da}, true);
  gemm(layer, "fc2.dw", ffn_t_, h_, T_, 1, {sv[sAct], d}, {g[kFc2]});
  int dfc1 = act(layer, "fc1.dy", {T_, up_ * ffn_t_});
  elementwise(OpKind::kActivation, layer, "act", double(T_) * ffn_t_,
              2 * (up_ + 1) * eb_ * T_ * ffn_t_, {sv[sFc1], da}, {dfc1, g[kFc1B]});
  int in = tp_gather_in(layer, sv[sX1n], T_);  // FC1's input again, for its weight gradient
  int dxp = ws(layer, "fc1.dx", {T_, h_});
  gemm(layer, "fc1.dx", T_, h_, up_ * ffn_t_, 1, {dfc1, w[kFc1]}, {dxp}, true);
  int dx1n = tp_reduce_out(layer, dxp, T_, "fc1.dx.tp");  // conjugate of f
  gemm(layer, "fc1.dw", h_, up_ * ffn_t_, T_, 1, {in, dfc1}, {g[kFc1], g[kFc1B]});
  return dx1n;
}

int Lowerer::layer_backward(int layer, const Saved& sv, int dy, const WSet& w, const WSet& g) {
  const double nh = double(Tn_) * h_;
  // Residual 2 (and the FC2 bias, added there).
  int dres2 = act(layer, "res2.dx", {Tn_, h_});
  elementwise(OpKind::kResidualAdd, layer, "res2", nh, 2 * (3 * eb_ + drop_) * nh, {dy, sv[sMask2]},
              {dres2, g[kFc2B]});
  const int dx1n = m_.is_moe_layer(layer) ? moe_backward(layer, sv, dres2, w, g)
                                          : mlp_backward(layer, sv, dres2, w, g);
  int dx1 = act(layer, "ln2.dx", {Tn_, h_});
  elementwise(OpKind::kNorm, layer, "ln2", nh, 4 * eb_ * nh, {sv[sX1], dx1n, dy, w[kNorm2]},
              {dx1, g[kNorm2]});
  // Residual 1 (and the out-projection bias).
  int dres1 = act(layer, "res1.dx", {Tn_, h_});
  elementwise(OpKind::kResidualAdd, layer, "res1", nh, 2 * (3 * eb_ + drop_) * nh,
              {dx1, sv[sMask1]}, {dres1, g[kOutB]});
  int d = tp_gather_in(layer, dres1, T_);
  int dao = act(layer, "attn.dy", {T_, q_cols_});
  gemm(layer, "out.dx", T_, q_cols_, h_, 1, {d, w[kOut]}, {dao}, true);
  gemm(layer, "out.dw", q_cols_, h_, T_, 1, {sv[sAo], d}, {g[kOut]});
  int dqkv = attention_backward(layer, sv, dao);
  int in = tp_gather_in(layer, sv[sXn], T_);
  int dxp = ws(layer, "qkv.dx", {T_, h_});
  gemm(layer, "qkv.dx", T_, h_, qkv_cols_, 1, {dqkv, w[kQkv]}, {dxp}, true);
  int dxn = tp_reduce_out(layer, dxp, T_, "qkv.dx.tp");
  gemm(layer, "qkv.dw", h_, qkv_cols_, T_, 1, {in, dqkv}, {g[kQkv], g[kQkvB]});
  int dx = act(layer, "ln1.dx", {Tn_, h_});
  elementwise(OpKind::kNorm, layer, "ln1", nh, 4 * eb_ * nh, {sv[sX], dxn, dx1, w[kNorm1]},
              {dx, g[kNorm1]});
  return dx;
}

}  // namespace parasol::lowering
