// A mixture-of-experts MLP, forward and backward: router, dispatch, all-to-all over ep (SP:
// all-gather over tp), grouped expert GEMMs, (reduce over tp), all-to-all back, combine.
#include "core/lower_internal.h"

namespace parasol::lowering {

// Returns the MoE output on the norm region's rows.
int Lowerer::moe_forward(int layer, int x1n, const WSet& w, Saved& sv) {
  const int64_t E = experts_, K = topk_;
  const int64_t routed_n = Tn_ * K;  // rows this rank routes
  const int64_t R = T_ * K;          // rows of the expert region (gathered over tp)
  int logits = ws(layer, "router", {Tn_, E}, Dtype::kFp32);
  gemm(layer, "router", Tn_, E, h_, 1, {x1n, w[kRouter]}, {logits});
  sv[sRprobs] = act(layer, "rprobs", {Tn_, E}, Dtype::kFp32);
  elementwise(OpKind::kRouter, layer, "route", double(Tn_) * E, 8.0 * Tn_ * E, {logits},
              {sv[sRprobs]});
  const bool gather = sp_;
  const bool a2a = p_.ep > 1;
  int d = (a2a || gather) ? ws(layer, "disp", {routed_n, h_}) : act(layer, "disp", {routed_n, h_});
  elementwise(OpKind::kDispatch, layer, "dispatch", double(routed_n) * h_, eb_ * R * h_,
              {x1n, sv[sRprobs]}, {d});
  if (a2a) {
    int r = gather ? ws(layer, "disp.a2a", {routed_n, h_}) : act(layer, "disp.a2a", {routed_n, h_});
    collective(OpKind::kAllToAll, Group::kEp, layer, "disp.a2a", eb_ * routed_n * h_, d, r);
    d = r;
  }
  if (gather) {
    int g = act(layer, "disp.ag", {R, h_});
    collective(OpKind::kAllGather, Group::kTp, layer, "disp.ag", eb_ * R * h_, d, g);
    d = g;
  }
  int o = moe_experts_forward(layer, d, w, sv);
  if (a2a) {
    int r = act(layer, "comb.a2a", {routed_n, h_});
    collective(OpKind::kAllToAll, Group::kEp, layer, "comb.a2a", eb_ * routed_n * h_, o, r);
    o = r;
  }
  sv[sEret] = o;
  int y = ws(layer, "moe", {Tn_, h_});
  elementwise(OpKind::kCombine, layer, "combine", double(routed_n) * h_, eb_ * R * h_,
              {o, sv[sRprobs]}, {y});
  return y;
}

// The grouped expert MLP on the dispatched rows `d`, reduced over tp; returns its output rows.
int Lowerer::moe_experts_forward(int layer, int d, const WSet& w, Saved& sv) {
  const int64_t K = topk_, le = local_experts_;
  const int64_t routed_n = Tn_ * K, R = T_ * K, rows = ceil_div(R, le);
  const bool a2a = p_.ep > 1;
  sv[sDisp] = d;
  sv[sFc1] = act(layer, "efc1", {R, up_ * eff_t_});
  int op1 = gemm(layer, "efc1", rows, up_ * eff_t_, h_, le, {d, w[kEfc1], w[kEfc1B]}, {sv[sFc1]},
                 false, OpKind::kExpertLinear);
  P_.ops[op1].flops = 2.0 * R * up_ * eff_t_ * h_;
  sv[sAct] = act(layer, "eact", {R, eff_t_});
  elementwise(OpKind::kActivation, layer, "eact", double(R) * eff_t_, (up_ + 1) * eb_ * R * eff_t_,
              {sv[sFc1]}, {sv[sAct]});
  int o = (t_ > 1 && sp_) || a2a ? ws(layer, "efc2", {R, h_}) : act(layer, "efc2", {R, h_});
  int op2 = gemm(layer, "efc2", rows, h_, eff_t_, le, {sv[sAct], w[kEfc2], w[kEfc2B]}, {o}, false,
                 OpKind::kExpertLinear);
  P_.ops[op2].flops = 2.0 * R * h_ * eff_t_;
  if (t_ > 1) {
    if (sp_) {
      int r = a2a ? ws(layer, "efc2.rs", {routed_n, h_}) : act(layer, "efc2.rs", {routed_n, h_});
      collective(OpKind::kReduceScatter, Group::kTp, layer, "efc2.rs", eb_ * R * h_, o, r);
      o = r;
    } else {
      collective(OpKind::kAllReduce, Group::kTp, layer, "efc2.ar", eb_ * R * h_, o, o);
    }
  }
  return o;
}

int Lowerer::moe_backward(int layer, const Saved& sv, int dres, const WSet& w, const WSet& g) {
  const int64_t E = experts_, K = topk_;
  const int64_t routed_n = Tn_ * K, R = T_ * K;
  const bool a2a = p_.ep > 1;
  int de = ws(layer, "comb.dx", {routed_n, h_});
  int drp = ws(layer, "rprobs.dx", {Tn_, E}, Dtype::kFp32);
  elementwise(OpKind::kCombine, layer, "combine", double(routed_n) * h_, 2 * eb_ * R * h_,
              {dres, sv[sEret], sv[sRprobs]}, {de, drp});
  int d = de;
  if (a2a) {
    int r = ws(layer, "comb.a2a", {routed_n, h_});
    collective(OpKind::kAllToAll, Group::kEp, layer, "comb.a2a", eb_ * routed_n * h_, d, r);
    d = r;
  }
  d = tp_gather_in(layer, d, R);
  int dd = moe_experts_backward(layer, sv, d, w, g);
  if (a2a) {
    int r = ws(layer, "disp.a2a", {routed_n, h_});
    collective(OpKind::kAllToAll, Group::kEp, layer, "disp.a2a", eb_ * routed_n * h_, dd, r);
    dd = r;
  }
  int dx1n = act(layer, "ln2.dy", {Tn_, h_});
  elementwise(OpKind::kDispatch, layer, "dispatch", double(routed_n) * h_, 2 * eb_ * R * h_, {dd},
              {dx1n});
  int dlogits = ws(layer, "router.dy", {Tn_, E}, Dtype::kFp32);
  elementwise(OpKind::kRouter, layer, "route", double(Tn_) * E, 16.0 * Tn_ * E, {drp, sv[sRprobs]},
              {dlogits});
  gemm(layer, "router.dx", Tn_, h_, E, 1, {dlogits, w[kRouter], dx1n}, {dx1n}, true);
  gemm(layer, "router.dw", h_, E, Tn_, 1, {sv[sX1n], dlogits}, {g[kRouter]});
  return dx1n;
}

// The grouped expert MLP's backward from the gradient `d` of its output rows; returns the
// gradient of the dispatched rows (reduced over tp).
int Lowerer::moe_experts_backward(int layer, const Saved& sv, int d, const WSet& w, const WSet& g) {
  const int64_t K = topk_, le = local_experts_;
  const int64_t R = T_ * K, rows = ceil_div(R, le);
  int dact = act(layer, "eact.dx", {R, eff_t_});
  int op = gemm(layer, "efc2.dx", rows, eff_t_, h_, le, {d, w[kEfc2]}, {dact}, true,
                OpKind::kExpertLinear);
  P_.ops[op].flops = 2.0 * R * eff_t_ * h_;
  op = gemm(layer, "efc2.dw", eff_t_, h_, rows, le, {sv[sAct], d}, {g[kEfc2], g[kEfc2B]}, false,
            OpKind::kExpertLinear);
  P_.ops[op].flops = 2.0 * R * eff_t_ * h_;
  int dfc1 = act(layer, "efc1.dy", {R, up_ * eff_t_});
  elementwise(OpKind::kActivation, layer, "eact", double(R) * eff_t_,
              2 * (up_ + 1) * eb_ * R * eff_t_, {sv[sFc1], dact}, {dfc1, g[kEfc1B]});
  int dd = ws(layer, "efc1.dx", {R, h_});
  op = gemm(layer, "efc1.dx", rows, h_, up_ * eff_t_, le, {dfc1, w[kEfc1]}, {dd}, true,
            OpKind::kExpertLinear);
  P_.ops[op].flops = 2.0 * R * h_ * up_ * eff_t_;
  dd = tp_reduce_out(layer, dd, R, "efc1.dx.tp");
  op = gemm(layer, "efc1.dw", h_, up_ * eff_t_, rows, le, {sv[sDisp], dfc1}, {g[kEfc1]}, false,
            OpKind::kExpertLinear);
  P_.ops[op].flops = 2.0 * R * h_ * up_ * eff_t_;
  return dd;
}

}  // namespace parasol::lowering
