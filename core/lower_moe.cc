// A mixture-of-experts MLP, forward and backward: router, dispatch, all-to-all over ep, the
// routed rows gathered over the experts' tensor-parallel group (SP: tp; an expert grid of its
// own: etp), grouped expert GEMMs, their reduction over that group, all-to-all back, combine;
// and the shared experts (one fused dense MLP on the norm2 output) added to the routed output.
#include "core/lower_internal.h"
#include "core/moe_load.h"

namespace parasol::lowering {

// Before the column-parallel expert GEMMs (and backward before the row-parallel ones' data
// gradients): the routed rows of the experts' TP group, all-gathered.
int Lowerer::expert_gather(int layer, int x, int64_t rows_full, const char* what, bool saved,
                           OpRole r) {
  if (gather_ways_ == 1) return x;
  int full = saved ? act(layer, what, {rows_full, h_}, ldt_) : ws(layer, what, {rows_full, h_});
  role(r, expert_side(in_compute_order(collective(OpKind::kAllGather, gather_group_, layer, what,
                                                  eb_ * rows_full * h_, x, full))));
  return full;
}

int Lowerer::expert_side(int op) {
  P_.ops[op].load = hot_;
  return op;
}

// A copy of the routed rows from one layout to the other (unpadded -> padded to each local
// expert's quantization alignment, or back): tex.fused_multi_row_padding / _unpadding read and
// write every row once; the router probabilities the rows carry are padded with them (experts.py
// @4415119 pads permuted_probs beside the hidden states). The few alignment rows are left out.
void Lowerer::expert_pad(int layer, int buf, int64_t rows, const char* what) {
  if (!p_.expert_fp8_padding || p_.precision != Dtype::kFp8) return;
  const double pb = dtype_bytes(p_.moe_probs_dtype());
  expert_side(elementwise(OpKind::kDispatch, layer, what, double(rows) * h_,
                          2 * (eb_ * h_ + pb) * double(rows), {buf}, {buf}));
}

// After the row-parallel expert GEMM (and backward after the column-parallel data gradient):
// the partial sums reduce-scattered back to this rank's routed rows, or all-reduced in place
// when the TP group routes the same rows (tp > 1 without SP).
int Lowerer::expert_reduce(int layer, int y, int64_t rows_full, const char* what, bool saved) {
  const double bytes = eb_ * rows_full * h_;
  if (gather_ways_ > 1) {
    const int64_t rows = rows_full / gather_ways_;
    int shard = saved ? act(layer, what, {rows, h_}) : ws(layer, what, {rows, h_});
    expert_side(in_compute_order(
        collective(OpKind::kReduceScatter, gather_group_, layer, what, bytes, y, shard)));
    return shard;
  }
  if (!grid_ && t_ > 1)
    expert_side(
        in_compute_order(collective(OpKind::kAllReduce, Group::kTp, layer, what, bytes, y, y)));
  return y;
}

// The memory traffic Megatron's allgather dispatcher adds to the combine around its
// reduce-scatter of every rank's tokens (Tm_ x ep rows, tp 1): forward, unpermute's zeroed output
// (moe_utils.py unpermute @d98e8a64dd: torch.zeros, twice under deterministic algorithms) and,
// where the probabilities' dtype is wider than the activations', token_combine's casts to it and
// back (hidden_states.to(local_probs.dtype) ... .to(hidden_states.dtype)); backward, the casts'
// gradients. 0 under the other dispatchers.
double Lowerer::allgather_combine_bytes(bool backward) const {
  if (p_.moe_dispatcher != MoeDispatcher::kAllGather) return 0;
  const double tokens = static_cast<double>(Tm_) * h_, all = tokens * p_.ep;
  const double pb = dtype_bytes(p_.moe_probs_dtype());
  const double casts = pb != eb_ ? (eb_ + pb) * (all + tokens) : 0;
  if (backward) return casts;
  return (p_.deterministic ? 2 : 1) * eb_ * all + casts;
}

// Returns the MoE output on the norm region's rows.
int Lowerer::moe_forward(int layer, int x1n, const WSet& w, Saved& sv) {
  const int64_t E = experts_, K = topk_;
  const int64_t routed_n = Tm_ * K;           // rows this rank routes
  const int64_t R = routed_n * gather_ways_;  // rows of the expert region (gathered)
  const bool gather = gather_ways_ > 1;
  const bool a2a = p_.ep > 1;
  // With slice_, the router and the dispatch read this rank's rows of the replicated input.
  int logits = ws(layer, "router", {Tm_, E}, Dtype::kFp32);
  fp8_exempt_ = true;  // the router runs outside fp8 autocast
  role(OpRole::kRouter, gemm(layer, "router", Tm_, E, h_, 1, {x1n, w[kRouter]}, {logits}));
  fp8_exempt_ = false;
  sv[sRprobs] = act(layer, "rprobs", {Tm_, E}, Dtype::kFp32);
  // The router's kernels after its GEMM (score function, top-k, aux loss: core/moe_load.h).
  const RouterKernels rk = router_kernels(p_, false);
  const int route = elementwise(OpKind::kRouter, layer, "route", double(Tm_) * E,
                                rk.bytes_per_element * double(Tm_) * E, {logits}, {sv[sRprobs]});
  P_.ops[route].tensors = static_cast<int>(rk.kernels);
  // Dropless routing: the host reads the tokens per expert before it can size the exchange and
  // the grouped GEMMs (Megatron's token_dispatcher.py _maybe_dtoh_and_synchronize and
  // experts.py tokens_per_expert.tolist(); torchtitan's dispatcher .tolist()): a sync per MoE
  // layer forward (and its recompute). Megatron's allgather dispatcher reads them after its
  // gather: below.
  const bool allgather = p_.moe_dispatcher == MoeDispatcher::kAllGather;
  if (!allgather) host_sync("moe.tokens", {route});
  int d = (a2a || gather) ? ws(layer, "disp", {routed_n, h_})
                          : act(layer, "disp", {routed_n, h_}, ldt_);
  // With local_sort_ the dispatch's bytes include the sort of the received rows by local expert
  // (read and write), and the combine's the sort back.
  const double sort = local_sort_ ? 2 * eb_ * R * h_ : 0;
  int gathered = elementwise(OpKind::kDispatch, layer, "dispatch", double(routed_n) * h_,
                             eb_ * R * h_ + sort, {x1n, sv[sRprobs]}, {d});
  if (a2a) {
    int r = gather ? ws(layer, "disp.a2a", {routed_n, h_})
                   : act(layer, "disp.a2a", {routed_n, h_}, ldt_);
    role(BufferRole::kExpertRows, r);
    gathered =
        role(OpRole::kDispatchA2a, expert_side(collective(OpKind::kAllToAll, Group::kEp, layer,
                                                          "disp.a2a", eb_ * routed_n * h_, d, r)));
    d = r;
  }
  if (allgather) {
    // MoEAllGatherTokenDispatcher.dispatch_postprocess (token_dispatcher.py @d98e8a64dd): the
    // local experts' token counts copied to the host (.cpu()) once the routing map is gathered,
    // then the local probabilities' masked_select, whose output size the host reads.
    host_sync("moe.tokens", {gathered});
    host_sync("moe.select", {gathered});
  }
  d = expert_gather(layer, d, R, "disp.ag", true, OpRole::kDispatchGather);
  int o = moe_experts_forward(layer, d, w, sv);
  if (a2a) {
    int r = act(layer, "comb.a2a", {routed_n, h_});
    role(OpRole::kCombineA2a, expert_side(collective(OpKind::kAllToAll, Group::kEp, layer,
                                                     "comb.a2a", eb_ * routed_n * h_, o, r)));
    o = r;
  }
  // The combine keeps the experts' outputs for the probabilities' gradient unless the experts
  // applied them (Plan::moe_probs_in_experts: Megatron-Core's weighted SwiGLU).
  sv[sEret] = p_.moe_probs_in_experts ? -1 : o;
  int y = ws(layer, "moe", {Tm_, h_});
  elementwise(OpKind::kCombine, layer, "combine", double(routed_n) * h_,
              eb_ * R * h_ + sort + allgather_combine_bytes(false), {o, sv[sRprobs]}, {y});
  if (slice_) {  // every TP rank's routed rows, back to the replicated rows
    int full = ws(layer, "moe.ag", {T_, h_});
    in_compute_order(
        collective(OpKind::kAllGather, Group::kTp, layer, "moe.ag", eb_ * T_ * h_, y, full));
    y = full;
  }
  if (m_.moe.shared_experts > 0) {
    const int ys = mlp_forward(layer, shared_mlp(), w, sv);
    const double nh = double(Tn_) * h_;
    int sum = ws(layer, "moe.add", {Tn_, h_});
    role(OpRole::kSum,
         elementwise(OpKind::kResidualAdd, layer, "moe.add", nh, 3 * eb_ * nh, {y, ys}, {sum}));
    y = sum;
  }
  return y;
}

// The grouped expert MLP on the dispatched rows `d`, reduced over the experts' TP group;
// returns its output rows.
int Lowerer::moe_experts_forward(int layer, int d, const WSet& w, Saved& sv) {
  const int64_t K = topk_, le = local_experts_;
  const int64_t routed_n = Tm_ * K, R = routed_n * gather_ways_, rows = ceil_div(R, le);
  const bool a2a = p_.ep > 1;
  expert_pad(layer, d, R, "efc1.pad");
  sv[sDisp] = d;
  sv[sFc1] = role(BufferRole::kExpertRows, act(layer, "efc1", {R, up_ * eff_t_}));
  const bool fc1_loop = p_.moe_gmm_experts && bias_;
  int op1 = expert_side(gemm(layer, "efc1", rows, up_ * eff_t_, h_, le,
                             {d, w[kEfc1], fc1_loop ? -1 : w[kEfc1B]}, {sv[sFc1]}, false,
                             OpKind::kExpertLinear));
  P_.ops[op1].flops = 2.0 * R * up_ * eff_t_ * h_;
  if (fc1_loop) expert_fc1_bias(layer, sv[sFc1], w[kEfc1B], false);
  moe_expert_act(layer, sv);
  const bool gather = gather_ways_ > 1;
  int o = role(BufferRole::kExpertRows,
               gather || a2a ? ws(layer, "efc2", {R, h_}) : act(layer, "efc2", {R, h_}));
  const bool bias_loop = (p_.expert_bias_loop || p_.moe_gmm_experts) && bias_;
  int op2 = expert_side(gemm(layer, "efc2", rows, h_, eff_t_, le,
                             {sv[sAct], w[kEfc2], bias_loop ? -1 : w[kEfc2B]}, {o}, false,
                             OpKind::kExpertLinear));
  P_.ops[op2].flops = 2.0 * R * h_ * eff_t_;
  if (bias_loop) {  // the bias added per local expert after the GEMM (core/moe_load.h)
    const ExpertBiasLoop b = expert_bias_loop(p_, false, le);
    const int op =
        role(OpRole::kExpertBias,
             expert_side(elementwise(OpKind::kBias, layer, "efc2.bias", double(R) * h_,
                                     b.bytes_per_element * R * h_, {o, w[kEfc2B]}, {o})));
    P_.ops[op].tensors = static_cast<int>(le);
  }
  expert_pad(layer, o, R, "efc2.unpad");
  return expert_reduce(layer, o, R, gather ? "efc2.rs" : "efc2.ar", !a2a);
}

// A clamped GLU (Model::glu_clamp) clamps its two inputs before the activation kernel, each an
// eager torch clamp of its half of the fc1 output, as Megatron-Core's
// weighted_bias_quick_geglu_impl runs them (core/fusions/fused_bias_geglu.py @4415119 and
// d98e8a64dd L424-431: x_glu.clamp(max=limit), x_linear.clamp(-limit, limit), then torch.cat of
// the two halves, outside the compiled activation). Forward each clamp reads and writes its half
// and the cat reads both and writes the whole; backward each clamp's gradient reads the gradient
// and its input and writes the gradient, and chunk's backward concatenates the two (the cat's
// backward is views). Under Plan::moe_gmm_experts the clamps are inside the compiled activation
// (NeMo AutoModel's quick_geglu_deepep): no op. Returns the op, or -1 without one.
int Lowerer::expert_act_clamp(int layer, int fc1, int dfc1, bool backward) {
  if (m_.glu_clamp <= 0 || up_ != 2 || p_.moe_gmm_experts) return -1;
  const int64_t R = Tm_ * topk_ * gather_ways_;
  const double half = double(R) * eff_t_;  // elements of one half of the fc1 output
  const double cat = 4 * eb_ * half;       // both halves read, the whole written
  const double bytes = (backward ? 3 : 2) * 2 * eb_ * half + cat;
  const int op = backward ? elementwise(OpKind::kActivation, layer, "eact.clamp", 2 * half, bytes,
                                        {fc1, dfc1}, {dfc1})
                          : elementwise(OpKind::kActivation, layer, "eact.clamp", 2 * half, bytes,
                                        {fc1}, {fc1});
  return role(OpRole::kExpertAct, expert_side(op));
}

// NeMo AutoModel's fc1 bias loop (Plan::moe_gmm_experts; core/moe_load.h expert_bias_loop
// without probabilities) on the fc1 output rows `fc1`: forward it adds the bias `b` in place,
// backward it reads the output gradient `dfc1` and writes the bias gradient `b`.
void Lowerer::expert_fc1_bias(int layer, int fc1, int b, bool backward) {
  const int64_t R = Tm_ * topk_ * gather_ways_, le = local_experts_;
  const double n = double(R) * up_ * eff_t_;
  const ExpertBiasLoop loop = expert_bias_loop(p_, backward, le, false);
  const double bytes = loop.bytes_per_element * n;
  const int op = role(
      OpRole::kExpertFc1Bias,
      expert_side(backward
                      ? elementwise(OpKind::kBias, layer, "efc1.bias", n, bytes, {fc1}, {b})
                      : elementwise(OpKind::kBias, layer, "efc1.bias", n, bytes, {fc1, b}, {fc1})));
  P_.ops[op].tensors = static_cast<int>(le);
}

void Lowerer::moe_expert_act(int layer, Saved& sv) {
  const int64_t R = Tm_ * topk_ * gather_ways_;
  expert_act_clamp(layer, sv[sFc1], -1, false);
  sv[sAct] = role(BufferRole::kExpertRows, act(layer, "eact", {R, eff_t_}, ldt_));
  role(OpRole::kExpertAct,
       expert_side(elementwise(OpKind::kActivation, layer, "eact", double(R) * eff_t_,
                               kb_.activation * R * eff_t_, {sv[sFc1]}, {sv[sAct]})));
}

int Lowerer::moe_backward(int layer, const Saved& sv, int dres, const WSet& w, const WSet& g) {
  const int64_t E = experts_, K = topk_;
  const int64_t routed_n = Tm_ * K, R = routed_n * gather_ways_;
  const bool a2a = p_.ep > 1;
  // With slice_, the combine reads this rank's rows of the replicated output gradient.
  int de = ws(layer, "comb.dx", {routed_n, h_});
  int drp = ws(layer, "rprobs.dx", {Tm_, E}, Dtype::kFp32);
  const double sort = local_sort_ ? 2 * eb_ * R * h_ : 0;  // as moe_forward's
  elementwise(OpKind::kCombine, layer, "combine", double(routed_n) * h_,
              2 * eb_ * R * h_ + sort + allgather_combine_bytes(true),
              {dres, sv[sEret], sv[sRprobs]}, {de, drp});
  int d = de;
  if (a2a) {
    int r = role(BufferRole::kExpertRows, ws(layer, "comb.a2a", {routed_n, h_}));
    role(OpRole::kCombineA2a, expert_side(collective(OpKind::kAllToAll, Group::kEp, layer,
                                                     "comb.a2a", eb_ * routed_n * h_, d, r)));
    d = r;
  }
  d = expert_gather(layer, d, R, "ag", false);
  int dd = moe_experts_backward(layer, sv, d, w, g);
  if (a2a) {
    int r = ws(layer, "disp.a2a", {routed_n, h_});
    role(OpRole::kDispatchA2a, expert_side(collective(OpKind::kAllToAll, Group::kEp, layer,
                                                      "disp.a2a", eb_ * routed_n * h_, dd, r)));
    dd = r;
  }
  int dx1n = act(layer, "ln2.dy", {Tm_, h_});
  // The allgather dispatcher's permute backward adds the rows into a zeroed buffer of every
  // rank's tokens before its reduce-scatter.
  const double zeros = p_.moe_dispatcher == MoeDispatcher::kAllGather
                           ? eb_ * static_cast<double>(Tm_) * p_.ep * h_
                           : 0;
  elementwise(OpKind::kDispatch, layer, "dispatch", double(routed_n) * h_,
              2 * eb_ * R * h_ + sort + zeros, {dd}, {dx1n});
  int dlogits = ws(layer, "router.dy", {Tm_, E}, Dtype::kFp32);
  const RouterKernels rk = router_kernels(p_, true);
  const int route =
      elementwise(OpKind::kRouter, layer, "route", double(Tm_) * E,
                  rk.bytes_per_element * double(Tm_) * E, {drp, sv[sRprobs]}, {dlogits});
  P_.ops[route].tensors = static_cast<int>(rk.kernels);
  fp8_exempt_ = true;
  gemm(layer, "router.dx", Tm_, h_, E, 1, {dlogits, w[kRouter], dx1n}, {dx1n}, true);
  fp8_exempt_ = false;
  role(OpRole::kRouterDw,
       gemm(layer, "router.dw", h_, E, Tm_, 1, {sv[sX1n], dlogits}, {g[kRouter]}));
  if (slice_) {
    int full = act(layer, "ln2.dy.ag", {T_, h_});
    in_compute_order(
        collective(OpKind::kAllGather, Group::kTp, layer, "ln2.dy.ag", eb_ * T_ * h_, dx1n, full));
    dx1n = full;
  }
  if (m_.moe.shared_experts > 0) {
    const int dxs = mlp_backward(layer, shared_mlp(), sv, dres, w, g);
    const double nh = double(Tn_) * h_;
    int sum = act(layer, "moe.add.dx", {Tn_, h_});
    role(OpRole::kSum,
         elementwise(OpKind::kResidualAdd, layer, "moe.add", nh, 3 * eb_ * nh, {dx1n, dxs}, {sum}));
    dx1n = sum;
  }
  return dx1n;
}

// The grouped expert MLP's backward from the gradient `d` of its output rows; returns the
// gradient of the dispatched rows (reduced over the experts' TP group).
int Lowerer::moe_experts_backward(int layer, const Saved& sv, int d, const WSet& w, const WSet& g) {
  const int64_t K = topk_, le = local_experts_;
  const int64_t R = Tm_ * K * gather_ways_, rows = ceil_div(R, le);
  const bool bias_loop = (p_.expert_bias_loop || p_.moe_gmm_experts) && bias_;
  const bool fc1_loop = p_.moe_gmm_experts && bias_;
  expert_pad(layer, d, R, "efc2.unpad");  // Fp8Unpadding's backward pads the output gradient
  if (bias_loop) {  // the backward of the per-expert bias loop (core/moe_load.h)
    const ExpertBiasLoop b = expert_bias_loop(p_, true, le);
    const int op = role(OpRole::kExpertBias,
                        expert_side(elementwise(OpKind::kBias, layer, "efc2.bias", double(R) * h_,
                                                b.bytes_per_element * R * h_, {d}, {g[kEfc2B]})));
    P_.ops[op].tensors = static_cast<int>(le);
  }
  int dact = role(BufferRole::kExpertRows, act(layer, "eact.dx", {R, eff_t_}));
  int op = expert_side(gemm(layer, "efc2.dx", rows, eff_t_, h_, le, {d, w[kEfc2]}, {dact}, true,
                            OpKind::kExpertLinear));
  P_.ops[op].flops = 2.0 * R * eff_t_ * h_;
  op =
      role(OpRole::kWeightGrad,
           expert_side(gemm(layer, "efc2.dw", eff_t_, h_, rows, le, {sv[sAct], d},
                            {g[kEfc2], bias_loop ? -1 : g[kEfc2B]}, false, OpKind::kExpertLinear)));
  P_.ops[op].flops = 2.0 * R * eff_t_ * h_;
  main_grad_add(op, static_cast<int>(le));
  int dfc1 = role(BufferRole::kExpertRows, act(layer, "efc1.dy", {R, up_ * eff_t_}));
  role(OpRole::kExpertAct,
       expert_side(elementwise(OpKind::kActivation, layer, "eact", double(R) * eff_t_,
                               2 * kb_.activation * R * eff_t_, {sv[sFc1], dact},
                               {dfc1, fc1_loop ? -1 : g[kEfc1B]})));
  expert_act_clamp(layer, sv[sFc1], dfc1, true);
  if (fc1_loop) expert_fc1_bias(layer, dfc1, g[kEfc1B], true);
  int dd = role(BufferRole::kExpertRows, ws(layer, "efc1.dx", {R, h_}));
  op = expert_side(gemm(layer, "efc1.dx", rows, h_, up_ * eff_t_, le, {dfc1, w[kEfc1]}, {dd}, true,
                        OpKind::kExpertLinear));
  P_.ops[op].flops = 2.0 * R * h_ * up_ * eff_t_;
  expert_pad(layer, dd, R, "efc1.pad");  // Fp8Padding's backward unpads the input gradient
  dd = expert_reduce(layer, dd, R, "efc1.dx.tp", true);
  op = role(OpRole::kWeightGrad,
            expert_side(gemm(layer, "efc1.dw", h_, up_ * eff_t_, rows, le, {sv[sDisp], dfc1},
                             {g[kEfc1]}, false, OpKind::kExpertLinear)));
  P_.ops[op].flops = 2.0 * R * h_ * up_ * eff_t_;
  main_grad_add(op, static_cast<int>(le));
  return dd;
}

}  // namespace parasol::lowering
