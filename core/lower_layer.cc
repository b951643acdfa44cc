// A decoder layer's forward and backward: norms, column-parallel QKV (or MLA's projections,
// lower_mla.cc), attention (flash or materialised, GQA, sliding windows; a ring of
// context-parallel steps under cp > 1), row-parallel out-projection, residuals (+ dropout) and
// the dense MLP. The MoE MLP is in lower_moe.cc.
#include <algorithm>

#include "core/error.h"
#include "core/lower_internal.h"

namespace parasol::lowering {

void Lowerer::attention_forward(int layer, Saved& sv, bool recompute) {
  if (p_.cp > 1 && p_.cp_impl == CpImpl::kTransformerEngine) {
    if (p_.cp_comm_type == CpCommType::kA2a) return attention_forward_a2a(layer, sv, recompute);
    if (p_.cp_comm_type == CpCommType::kAllGather)
      return attention_forward_allgather(layer, sv, recompute);
  }
  const int mb = tags_.micro_batch;
  const AttnShape a = attention_shape(layer);
  // Hierarchical context parallelism (a2a+p2p, Transformer Engine's AttnFuncWithCPAndKVP2P with
  // a cp_group list): an all-to-all inside the cp_a2a_size group first trades this rank's tokens
  // of every head for its group's tokens of heads / cp_a2a_size heads (flash_attn_a2a_communicate
  // of q, k, v before the ring; exposed, on the compute stream's order), the ring below runs over
  // the groups, and an all-to-all trades the output back. The forward keeps the traded Q | K | V
  // for the backward (ctx.save_for_backward(q, kv, ...) after the exchange).
  int qkv = sv[sQkv];
  if (hierarchical_cp()) {
    qkv = role(BufferRole::kQkv, recompute ? ws(layer, "qkv.a2a", {T_, qkv_cols_})
                                           : act(layer, "qkv.a2a", {T_, qkv_cols_}));
    in_compute_order(collective(OpKind::kAllToAll, Group::kCpA2a, layer, "qkv.a2a",
                                eb_ * double(T_) * qkv_cols_, sv[sQkv], qkv));
    if (!recompute) sv[sQkv] = qkv;
  }
  std::vector<int> outs;
  int ring_out = -1;  // hierarchical: the ring's output, before its all-to-all back
  if (hierarchical_cp()) {
    ring_out = ws(layer, "attn.ring", {T_, ao_cols_}, ldt_);
    outs.push_back(ring_out);
  } else if (!recompute) {
    // torchtitan's op-level policy caches SDPA's own (bf16) output, not a linear's fp8 input.
    sv[sAo] = role(BufferRole::kAttnOut, act(layer, "attn", {T_, ao_cols_}, op_ac_ ? adt_ : ldt_));
    outs.push_back(sv[sAo]);
  } else if (flash_) {
    sv[sAoRc] = role(BufferRole::kAttnOut, ws(layer, "attn.rc", {T_, ao_cols_}));
    outs.push_back(sv[sAoRc]);
  }
  if (flash_) {
    if (!recompute) {
      sv[sLse] = role(BufferRole::kAttnLse,
                      act(layer, "lse", {p_.micro_batch, a.heads, a.seq_q}, Dtype::kFp32));
      outs.push_back(sv[sLse]);
    }
  } else {
    const std::vector<int64_t> scores = {p_.micro_batch, heads_t_, Sl_, seq_};
    sv[sProbs] = role(BufferRole::kAttnProbs, act(layer, "probs", scores));
    outs.push_back(sv[sProbs]);
    if (m_.dropout) {
      sv[sPmask] = act(layer, "pmask", scores, Dtype::kFp8);
      sv[sPdrop] = act(layer, "pdrop", scores);
      outs.push_back(sv[sPmask]);
      outs.push_back(sv[sPdrop]);
    }
  }
  const double flops = attention_flops(a);
  // Tags of the forward, the full-layer recompute and the selective recompute differ.
  const int phase = recompute ? 3 : tags_.phase == Phase::kRecompute ? 2 : 0;
  const double kv_bytes = eb_ * T_ * kv_exchange_cols();
  const int steps = ring_steps(layer);
  const Group ring = cp_ring_group();
  const int gathered =
      p_.cp_rotate == CpRotate::kAllGather && steps > 1 ? kv_all_gather(layer, qkv) : -1;
  int kv = -1;  // the K/V chunk in hand (-1: the local one, inside qkv)
  const std::vector<int> unpadded =
      p_.attention_unpad && flash_ ? unpad_qkv(layer, qkv) : std::vector<int>{};
  for (int j = 0; j < steps; ++j) {
    int next = -1;
    if (gathered >= 0) {
      if (j > 0) kv = gathered;  // the step's chunk, sliced out of the gathered K/V
    } else if (j < steps - 1) {
      // Ring attention: pass the chunk in hand on while attending to it.
      next = role(BufferRole::kKvChunk, ws(layer, "kv", {T_, kv_exchange_cols()}));
      // One exchange with the ring neighbours (one p2p group).
      begin_p2p_group();
      // Issued with the attention (Transformer Engine's ring: the NCCL stream waits for the
      // compute enqueued before it), not as soon as Q | K | V exist.
      p2p(OpKind::kSend, ring, -1, cp_tag(layer, mb, phase, j, 0), layer, "kv.send", kv_bytes,
          kv >= 0 ? kv : qkv, {last_compute_});
      p2p(OpKind::kRecv, ring, -1, cp_tag(layer, mb, phase, j, 0), layer, "kv.recv", kv_bytes,
          next);
      end_p2p_group();
    }
    Op op = make(OpKind::kAttention, layer, recompute ? "attn.rc" : "attn", kCompute);
    op.attn = a;
    op.flops = flops;
    op.elements = double(T_) * ao_cols_;
    set(op.reads, {qkv, sv[sK], kv});
    set(op.reads, unpadded);
    set(op.writes, outs);
    emit(op);
    if (gathered < 0) kv = next;
  }
  if (!unpadded.empty() && !outs.empty()) pad_output(layer, outs.front());
  if (ring_out < 0) return;
  // The output traded back to this rank's tokens of every head (flash_attn_a2a_communicate of
  // out after the ring), the buffer the out-projection reads and the backward keeps.
  const int o = recompute ? (sv[sAoRc] = ws(layer, "attn.rc", {T_, ao_cols_}))
                          : (sv[sAo] = act(layer, "attn", {T_, ao_cols_}, ldt_));
  role(BufferRole::kAttnOut, o);
  in_compute_order(collective(OpKind::kAllToAll, Group::kCpA2a, layer, "attn.a2a",
                              eb_ * double(T_) * ao_cols_, ring_out, o));
}

bool Lowerer::hierarchical_cp() const {
  return p_.cp > 1 && p_.cp_impl == CpImpl::kTransformerEngine &&
         p_.cp_comm_type == CpCommType::kA2aP2p && cp_a2a_ranks(p_) > 1;
}

int Lowerer::cp_ring_size() const { return p_.cp / cp_a2a_ranks(p_); }

Group Lowerer::cp_ring_group() const { return hierarchical_cp() ? Group::kCpRing : Group::kCp; }

int64_t Lowerer::kv_exchange_cols() const {
  const int64_t rep = p_.repeat_kv && kv_heads_t_ > 0 ? heads_t_ / kv_heads_t_ : 1;
  return (k_cols_ + v_cols_) * rep;
}

int Lowerer::kv_all_gather(int layer, int src) {
  const int64_t cols = kv_exchange_cols();
  const int gathered = role(BufferRole::kKvChunk, ws(layer, "kv.all", {T_ * p_.cp, cols}));
  // ft_c.all_gather_tensor of the concatenated K | V, issued with the pass's first step (after the
  // compute enqueued before it, the torch.cat that packs K and V).
  collective(OpKind::kAllGather, Group::kCp, layer, "kv.ag", eb_ * double(T_) * cols * p_.cp, {src},
             {gathered}, {last_compute_});
  return gathered;
}

// Bytes per element of the K/V gradient accumulator a context-parallel ring passes on: the
// attention's dtype under Transformer Engine, fp32 under PyTorch's ring (_attention.py:
// convert_to_f32, grad_key/grad_value zeros_like(dtype=float32)).
double Lowerer::dkv_bytes_per_element() const { return p_.cp_impl == CpImpl::kPytorch ? 4.0 : eb_; }

// The ring steps of layer `layer`: cp, or under a sliding window the chunks it reaches (this
// rank's and the ceil((window - 1) / chunk) before it).
int Lowerer::ring_steps(int layer) const {
  const AttnShape a = attention_shape(layer);
  return context_ring_steps(hierarchical_cp() ? cp_ring_size() : p_.cp, a.seq_q, a.window);
}

// The K/V gradient of ring step `step` of `steps` travels on with its chunk; after the last step
// it goes home to the chunk's owner (the next rank after cp steps; cp - steps + 1 ranks on after
// fewer), which folds it into its dQKV. Returns the accumulator received for the next step (-1
// after the last).
int Lowerer::ring_dkv_exchange(int layer, int mb, int step, int steps, int dkv, int dqkv) {
  const int cp = hierarchical_cp() ? cp_ring_size() : p_.cp;
  const Group ring = cp_ring_group();
  if (cp == 1) return -1;
  // The accumulator travels in the attention's dtype (Transformer Engine) or in fp32 (PyTorch's
  // ring accumulates the K/V gradients in fp32 and passes that buffer on).
  const double kv_bytes = dkv_bytes_per_element() * T_ * kv_exchange_cols();
  const bool last = step == steps - 1;
  const int distance = last && steps < cp ? cp - steps + 1 : -1;  // -1: the next rank
  int recv = role(BufferRole::kKvGrad, ws(layer, "dkv", {T_, kv_exchange_cols()}));
  begin_p2p_group();
  p2p(OpKind::kSend, ring, distance, cp_tag(layer, mb, 1, step, 1), layer, "dkv.send", kv_bytes,
      dkv);
  p2p(OpKind::kRecv, ring, distance, cp_tag(layer, mb, 1, step, 1), layer, "dkv.recv", kv_bytes,
      recv);
  end_p2p_group();
  if (!last) return recv;
  role(OpRole::kDkvFold,
       elementwise(OpKind::kResidualAdd, layer, "dkv.fold", double(T_) * kv_exchange_cols(),
                   kv_bytes + 2 * eb_ * T_ * (k_cols_ + v_cols_), {dqkv, recv}, {dqkv}));
  return -1;
}

int Lowerer::attention_backward(int layer, const Saved& sv, int dao) {
  if (p_.cp > 1 && p_.cp_impl == CpImpl::kTransformerEngine) {
    if (p_.cp_comm_type == CpCommType::kA2a) return attention_backward_a2a(layer, sv, dao);
    if (p_.cp_comm_type == CpCommType::kAllGather)
      return attention_backward_allgather(layer, sv, dao);
  }
  const int mb = tags_.micro_batch;
  const int cp = p_.cp;
  const bool hier = hierarchical_cp();
  // Hierarchical: the ring's dQ | dK | dV, traded back after it.
  int dqkv = hier ? ws(layer, "dqkv.ring", {T_, qkv_cols_})
                  : role(BufferRole::kQkvGrad, act(layer, "dqkv", {T_, qkv_cols_}));
  const AttnShape a = attention_shape(layer);
  const double flops = (flash_ ? kFlashBackwardFlopRatio : 2.0) * attention_flops(a);
  const int64_t kv_cols = kv_exchange_cols();
  const double kv_bytes = eb_ * T_ * kv_cols;
  int out = sv[sAoRc] >= 0 ? sv[sAoRc] : sv[sAo];
  if (hier) {
    // AttnFuncWithCPAndKVP2P.backward: out and dout traded to the ring's heads in one
    // flash_attn_a2a_communicate([out, dout]) before the ring.
    const int traded = ws(layer, "odo.a2a", {T_, 2 * ao_cols_});
    in_compute_order(collective(OpKind::kAllToAll, Group::kCpA2a, layer, "odo.a2a",
                                2 * eb_ * double(T_) * ao_cols_, {out, dao}, {traded}));
    out = dao = traded;
  }
  const Group ring = cp_ring_group();
  const int steps = ring_steps(layer);
  // The backward's K/V rotater gathers again (its K/V gradients travel the ring either way).
  const int gathered =
      p_.cp_rotate == CpRotate::kAllGather && steps > 1 ? kv_all_gather(layer, sv[sQkv]) : -1;
  int kv = -1, dkv_in = -1;
  const bool unpad = p_.attention_unpad && flash_ && !hier;
  if (unpad) dao = unpad_dout(layer, dao);
  for (int j = 0; j < steps; ++j) {
    int next = -1;
    if (gathered >= 0) {
      if (j > 0) kv = gathered;
    } else if (j < steps - 1) {
      next = role(BufferRole::kKvChunk, ws(layer, "kv", {T_, kv_cols}));
      begin_p2p_group();
      p2p(OpKind::kSend, ring, -1, cp_tag(layer, mb, 1, j, 0), layer, "kv.send", kv_bytes,
          kv >= 0 ? kv : sv[sQkv], {last_compute_});  // with the attention, as forward
      p2p(OpKind::kRecv, ring, -1, cp_tag(layer, mb, 1, j, 0), layer, "kv.recv", kv_bytes, next);
      end_p2p_group();
    }
    int dkv = cp > 1 ? role(BufferRole::kKvGrad, ws(layer, "dkv", {T_, kv_cols})) : -1;
    Op op = make(OpKind::kAttention, layer, "attn", kCompute);
    op.attn = a;
    op.flops = flops;
    op.elements = double(T_) * ao_cols_;
    set(op.reads, {sv[sQkv], sv[sK], kv, out, sv[sLse], sv[sProbs], sv[sPmask], sv[sPdrop], dao});
    set(op.writes, {dqkv, dkv});
    emit(op);
    // The accumulator that came with the chunk is added after the step's own gradient (as
    // Transformer Engine's ring does), so that its exchange runs beside the step's attention.
    if (dkv_in >= 0)
      role(OpRole::kSum,
           elementwise(OpKind::kResidualAdd, layer, "dkv.acc", double(T_) * kv_cols,
                       (2 * dkv_bytes_per_element() + eb_) * T_ * kv_cols, {dkv, dkv_in}, {dkv}));
    dkv_in = ring_dkv_exchange(layer, mb, j, steps, dkv, dqkv);
    if (gathered < 0) kv = next;
  }
  if (unpad) pad_qkv_grad(layer, dqkv);
  if (!hier) return dqkv;
  // dq, dk, dv traded back to this rank's tokens of every head (flash_attn_a2a_communicate after
  // the ring).
  const int back = role(BufferRole::kQkvGrad, act(layer, "dqkv", {T_, qkv_cols_}));
  in_compute_order(collective(OpKind::kAllToAll, Group::kCpA2a, layer, "dqkv.a2a",
                              eb_ * double(T_) * qkv_cols_, dqkv, back));
  return back;
}

AttnShape Lowerer::allgather_attention_shape(int layer) const {
  // Rank r's chunks r and 2cp - 1 - r (of Sl / 2 queries each) attend to the gathered K/V up to
  // their own end: (r + 1) and (2cp - r) chunks, bottom-right causal. Their pairs sum to the
  // rank's share of the causal square, cp x (Sl / 2)^2 x 2 per kernel on average: the causal
  // count of Sl / 2 queries against the whole sequence (core/program.cc attention_flops).
  AttnShape a = parasol::attention_shape(m_, layer, static_cast<int>(t_), p_.micro_batch, Sl_ / 2,
                                         seq_, flash_);
  return a;
}

AttnShape Lowerer::a2a_attention_shape(int layer) const {
  // After the all-to-all this rank holds every token of heads / (tp x cp) heads.
  return parasol::attention_shape(m_, layer, static_cast<int>(t_) * p_.cp, p_.micro_batch, seq_,
                                  seq_, flash_);
}

// Transformer Engine's AttnFuncWithCPAndKVAllGather (context_parallel.py): K and V of every
// context rank all-gathered (exposed: both kernels read the gathered buffer), then one kernel per
// local chunk, each against its causal K/V prefix.
void Lowerer::attention_forward_allgather(int layer, Saved& sv, bool recompute) {
  std::vector<int> outs;
  if (!recompute) {
    sv[sAo] = role(BufferRole::kAttnOut, act(layer, "attn", {T_, ao_cols_}, ldt_));
    sv[sLse] = role(BufferRole::kAttnLse,
                    act(layer, "lse", {p_.micro_batch, heads_t_, Sl_}, Dtype::kFp32));
    outs = {sv[sAo], sv[sLse]};
  } else {
    sv[sAoRc] = role(BufferRole::kAttnOut, ws(layer, "attn.rc", {T_, ao_cols_}));
    outs = {sv[sAoRc]};
  }
  const int gathered = kv_all_gather(layer, sv[sQkv]);
  const AttnShape a = allgather_attention_shape(layer);
  for (int j = 0; j < 2; ++j) {
    Op op = make(OpKind::kAttention, layer, recompute ? "attn.rc" : "attn", kCompute);
    op.attn = a;
    op.flops = attention_flops(a);
    op.elements = double(T_) * ao_cols_ / 2;
    set(op.reads, {sv[sQkv], gathered});
    set(op.writes, outs);
    emit(op);
  }
}

// Its backward: K and V gathered again, the two chunks' kernels write the gradient of the whole
// gathered K/V, which a reduce-scatter returns to the ranks that own it (exposed).
int Lowerer::attention_backward_allgather(int layer, const Saved& sv, int dao) {
  const int dqkv = role(BufferRole::kQkvGrad, act(layer, "dqkv", {T_, qkv_cols_}));
  const int64_t cols = kv_exchange_cols();
  const int gathered = kv_all_gather(layer, sv[sQkv]);
  const int dkv_all = role(BufferRole::kKvGrad, ws(layer, "dkv.all", {T_ * p_.cp, cols}));
  const AttnShape a = allgather_attention_shape(layer);
  const int out = sv[sAoRc] >= 0 ? sv[sAoRc] : sv[sAo];
  for (int j = 0; j < 2; ++j) {
    Op op = make(OpKind::kAttention, layer, "attn", kCompute);
    op.attn = a;
    op.flops = kFlashBackwardFlopRatio * attention_flops(a);
    op.elements = double(T_) * ao_cols_ / 2;
    set(op.reads, {sv[sQkv], gathered, out, sv[sLse], dao});
    set(op.writes, {dqkv, dkv_all});
    emit(op);
  }
  const int dkv = role(BufferRole::kKvGrad, ws(layer, "dkv", {T_, cols}));
  in_compute_order(collective(OpKind::kReduceScatter, Group::kCp, layer, "dkv.rs",
                              eb_ * double(T_) * cols * p_.cp, dkv_all, dkv));
  role(OpRole::kDkvFold,
       elementwise(OpKind::kResidualAdd, layer, "dkv.fold", double(T_) * cols,
                   eb_ * T_ * cols + 2 * eb_ * T_ * (k_cols_ + v_cols_), {dqkv, dkv}, {dqkv}));
  return dqkv;
}

// Transformer Engine's AttnFuncWithCPAndQKVOA2A (DeepSpeed-Ulysses): an all-to-all over the
// context group trades this rank's tokens of every head for every token of heads / cp heads
// (Q, K and V; exposed, on the compute stream's order), one causal kernel runs on the whole
// sequence, and an all-to-all trades its output back. The forward keeps the traded Q | K | V
// and the kernel's output for the backward (ctx.save_for_backward after the exchange).
void Lowerer::attention_forward_a2a(int layer, Saved& sv, bool recompute) {
  const AttnShape a = a2a_attention_shape(layer);
  const int qkv = role(BufferRole::kQkv, recompute ? ws(layer, "qkv.a2a", {T_, qkv_cols_})
                                                   : act(layer, "qkv.a2a", {T_, qkv_cols_}));
  in_compute_order(collective(OpKind::kAllToAll, Group::kCp, layer, "qkv.a2a",
                              eb_ * double(T_) * qkv_cols_, sv[sQkv], qkv));
  // The kernel's own output, in the activation dtype (the attention runs in bf16 under fp8, and
  // its all-to-all back moves eb_ bytes a value): only the out-projection's input after it is
  // the linear's fp8 copy.
  const int o = role(BufferRole::kAttnOut, recompute ? ws(layer, "attn.rc", {T_, ao_cols_})
                                                     : act(layer, "attn.a2a", {T_, ao_cols_}));
  std::vector<int> outs = {o};
  if (!recompute) {
    sv[sLse] = role(BufferRole::kAttnLse,
                    act(layer, "lse", {p_.micro_batch, a.heads, seq_}, Dtype::kFp32));
    outs.push_back(sv[sLse]);
  }
  Op op = make(OpKind::kAttention, layer, recompute ? "attn.rc" : "attn", kCompute);
  op.attn = a;
  op.flops = attention_flops(a);
  op.elements = double(T_) * ao_cols_;
  set(op.reads, {qkv});
  set(op.writes, outs);
  emit(op);
  sv[sAoRc] = o;  // the kernel's own output, which its backward reads
  if (recompute) return;
  sv[sQkv] = qkv;  // the backward reads the traded Q | K | V
  sv[sAo] = role(BufferRole::kAttnOut, act(layer, "attn", {T_, ao_cols_}, ldt_));
  in_compute_order(collective(OpKind::kAllToAll, Group::kCp, layer, "attn.a2a",
                              eb_ * double(T_) * ao_cols_, o, sv[sAo]));
}

// Its backward: dO traded to heads, the kernel's backward, dQ | dK | dV traded back.
int Lowerer::attention_backward_a2a(int layer, const Saved& sv, int dao) {
  const AttnShape a = a2a_attention_shape(layer);
  const int d_o = ws(layer, "dattn.a2a", {T_, ao_cols_});
  in_compute_order(collective(OpKind::kAllToAll, Group::kCp, layer, "dattn.a2a",
                              eb_ * double(T_) * ao_cols_, dao, d_o));
  const int dh = ws(layer, "dqkv.a2a", {T_, qkv_cols_});
  Op op = make(OpKind::kAttention, layer, "attn", kCompute);
  op.attn = a;
  op.flops = kFlashBackwardFlopRatio * attention_flops(a);
  op.elements = double(T_) * ao_cols_;
  set(op.reads, {sv[sQkv], sv[sAoRc], sv[sLse], d_o});
  set(op.writes, {dh});
  emit(op);
  const int dqkv = role(BufferRole::kQkvGrad, act(layer, "dqkv", {T_, qkv_cols_}));
  in_compute_order(collective(OpKind::kAllToAll, Group::kCp, layer, "dqkv.a2a",
                              eb_ * double(T_) * qkv_cols_, dh, dqkv));
  return dqkv;
}

// Qwen3's per-head RMSNorms of the query and the key before the rotary embedding: Megatron-Core's
// q_layernorm and k_layernorm (qk_layernorm: two TENorm calls over head_dim, megatron/core/
// transformer/attention.py SelfAttention.get_query_key_value_tensors @cd4afffa6), HF's q_norm and
// k_norm (transformers models/qwen3/modeling_qwen3.py): one norm each over this rank's query and
// key columns, forward reading and writing them, backward reading their gradient and input and
// writing the gradient, as the layer's other norms (KernelBytes::norm).
void Lowerer::qk_norms(int layer, int qkv, int k, int dqkv) {
  if (!m_.qk_norm || mla_) return;
  const bool backward = dqkv >= 0;
  const double per = (backward ? 2 : 1) * kb_.norm * double(T_);
  const double cols[2] = {double(q_cols_), double(k_cols_)};
  const char* what[2] = {"q.norm", "k.norm"};
  for (int i = 0; i < 2; ++i) {
    const int kept = i == 1 && k >= 0 ? k : qkv;
    if (backward)
      elementwise(OpKind::kNorm, layer, what[i], double(T_) * cols[i], per * cols[i], {dqkv, kept},
                  {dqkv});
    else
      elementwise(OpKind::kNorm, layer, what[i], double(T_) * cols[i], per * cols[i], {kept},
                  {kept});
  }
}

int Lowerer::layer_forward(int layer, int x, const WSet& w, Saved& sv) {
  sv = no_saved();
  sv[sX] = x;
  const double nh = double(Tn_) * h_;
  // Attention block.
  sv[sXn] = act(layer, "ln1", {Tn_, h_}, ldt_);
  elementwise(OpKind::kNorm, layer, "ln1", nh, kb_.norm * nh, {x, w[kNorm1]}, {sv[sXn]});
  if (mla_) {
    mla_forward(layer, w, sv);
  } else {
    int in = tp_gather_in(layer, sv[sXn], T_, true);
    if (op_ac_) {
      // torchtitan's wq, wk, wv (the block's 1st to 3rd mm): Q and V kept, K (the 2nd) not.
      sv[sQkv] = role(BufferRole::kQkv, act(layer, "qv", {T_, q_cols_ + v_cols_}));
      sv[sK] = ws(layer, "k", {T_, k_cols_});
    } else {
      sv[sQkv] = role(BufferRole::kQkv, act(layer, "qkv", {T_, qkv_cols_}));
    }
    role(OpRole::kQkv, rotary_epilogue(gemm(layer, "qkv", T_, qkv_cols_, h_, 1,
                                            {in, w[kQkv], w[kQkvB]}, {sv[sQkv], sv[sK]}),
                                       false));
    lora_forward(layer, LoraTarget::kQkv, in, h_, sv[sQkv], qkv_cols_, w, sv);
    qk_norms(layer, sv[sQkv], sv[sK], -1);
  }
  attention_forward(layer, sv, false);
  int o = ws(layer, "out", {T_, h_});
  gemm(layer, "out", T_, h_, ao_cols_, 1, {sv[sAo], w[kOut]}, {o});
  lora_forward(layer, LoraTarget::kProj, sv[sAo], ao_cols_, o, h_, w, sv);
  int a = tp_reduce_out(layer, o, T_, "out.tp", true);
  if (op_ac_ && sp_) sv[sOutRs] = a;  // torchtitan's policy keeps reduce_scatter outputs
  sv[sX1] = act(layer, "res1", {Tn_, h_});
  if (m_.dropout) sv[sMask1] = act(layer, "mask1", {Tn_, h_}, Dtype::kFp8);
  role(OpRole::kAttnResidual,
       elementwise(OpKind::kResidualAdd, layer, "res1", nh, kb_.residual * nh, {x, a, w[kOutB]},
                   {sv[sX1], sv[sMask1]}));
  // MLP block.
  mlp_norm(layer, w, sv);
  const int y = m_.is_moe_layer(layer) ? moe_forward(layer, sv[sX1n], w, sv)
                                       : mlp_forward(layer, dense_mlp(), w, sv);
  if (op_ac_ && sp_) sv[sMlpRs] = y;
  int x2 = act(layer, "res2", {Tn_, h_});
  if (m_.dropout) sv[sMask2] = act(layer, "mask2", {Tn_, h_}, Dtype::kFp8);
  // The MLP block's row-parallel bias: the dense FC2's, or the shared experts' FC2's.
  role(OpRole::kMlpResidual,
       elementwise(OpKind::kResidualAdd, layer, "res2", nh, kb_.residual * nh,
                   {sv[sX1], y, w[kFc2B] >= 0 ? w[kFc2B] : w[kSfc2B]}, {x2, sv[sMask2]}));
  return x2;
}

void Lowerer::mlp_norm(int layer, const WSet& w, Saved& sv) {
  const double nh = double(Tn_) * h_;
  // The router reads MoE layers' norm2 output in bf16.
  sv[sX1n] = act(layer, "ln2", {Tn_, h_}, m_.is_moe_layer(layer) ? adt_ : ldt_);
  elementwise(OpKind::kNorm, layer, "ln2", nh, kb_.norm * nh, {sv[sX1], w[kNorm2]}, {sv[sX1n]});
}

Lowerer::Mlp Lowerer::dense_mlp() const {
  return {kFc1, kFc1B, kFc2, sFc1, sAct, "fc1", "act", "fc2", ffn_t_};
}

Lowerer::Mlp Lowerer::shared_mlp() const {
  return {kSfc1,        kSfc1B,       kSfc2,
          sSfc1,        sSact,        "shared_fc1",
          "shared_act", "shared_fc2", m_.moe.shared_width() / t_};
}

// Column-parallel FC1, activation, row-parallel FC2 on the norm2 output; returns the MLP output
// on the norm region's rows.
int Lowerer::mlp_forward(int layer, const Mlp& mlp, const WSet& w, Saved& sv) {
  const int64_t f = mlp.cols;
  const std::string fc1 = mlp.fc1_name, fc2 = mlp.fc2_name, act_name = mlp.act_name;
  int in = tp_gather_in(layer, sv[sX1n], T_, true);
  // torchtitan's op-level policy (dense Llama blocks only): w1 (the 5th mm) kept, w3 (the 6th)
  // not, w2 (the 7th) kept.
  const bool split = op_ac_ && mlp.s_fc1 == sFc1;
  if (split) {
    sv[sFc1] = act(layer, fc1.c_str(), {T_, f});
    sv[sFc3] = ws(layer, "fc3", {T_, f});
  } else if (fp8_act_store(mlp)) {
    // FC1's output lives until the SwiGLU has run; the SwiGLU keeps an fp8 copy of it.
    sv[mlp.s_fc1] = ws(layer, fc1.c_str(), {T_, up_ * f});
  } else {
    sv[mlp.s_fc1] = act(layer, fc1.c_str(), {T_, up_ * f});
  }
  if (gelu_epilogue()) {
    // One GEMM writes the pre-activation (kept for the backward) and its GELU (Plan::
    // gemm_gelu_epilogue): the pre-activation's write is its epilogue's only extra traffic.
    sv[mlp.s_act] = act(layer, act_name.c_str(), {T_, f}, ldt_);
    const int op = gemm(layer, fc1.c_str(), T_, f, h_, 1, {in, w[mlp.fc1], w[mlp.fc1b]},
                        {sv[mlp.s_fc1], sv[mlp.s_act]});
    P_.ops[op].role = OpRole::kGeluFc1;
    P_.ops[op].epilogue_bytes = dtype_bytes(P_.buffers[sv[mlp.s_fc1]].dtype) * double(T_) * f;
  } else {
    gemm(layer, fc1.c_str(), T_, up_ * f, h_, 1, {in, w[mlp.fc1], w[mlp.fc1b]},
         {sv[mlp.s_fc1], split ? sv[sFc3] : -1});
    if (mlp.s_fc1 == sFc1) lora_forward(layer, LoraTarget::kFc1, in, h_, sv[sFc1], up_ * f, w, sv);
    sv[mlp.s_act] = act(layer, act_name.c_str(), {T_, f}, ldt_);
    // Plan::activation_fp8_input_store: the SwiGLU also writes the fp8 copy of its input it keeps
    // (a byte an element).
    const int stored =
        fp8_act_store(mlp) ? act(layer, (fc1 + ".fp8").c_str(), {T_, up_ * f}, Dtype::kFp8) : -1;
    elementwise(OpKind::kActivation, layer, act_name.c_str(), double(T_) * f,
                kb_.activation * T_ * f + (stored >= 0 ? double(T_) * up_ * f : 0.0),
                {sv[mlp.s_fc1], split ? sv[sFc3] : -1}, {sv[mlp.s_act], stored});
    if (stored >= 0) sv[mlp.s_fc1] = stored;
  }
  int o2 = split ? act(layer, fc2.c_str(), {T_, h_}) : ws(layer, fc2.c_str(), {T_, h_});
  if (split) sv[sFc2o] = o2;
  gemm(layer, fc2.c_str(), T_, h_, f, 1, {sv[mlp.s_act], w[mlp.fc2]}, {o2});
  if (mlp.s_fc1 == sFc1) lora_forward(layer, LoraTarget::kFc2, sv[sAct], f, o2, h_, w, sv);
  return tp_reduce_out(layer, o2, T_, (fc2 + ".tp").c_str(), true);
}

int Lowerer::mlp_backward(int layer, const Mlp& mlp, const Saved& sv, int dres2, const WSet& w,
                          const WSet& g) {
  const int64_t f = mlp.cols;
  const std::string fc1 = mlp.fc1_name, fc2 = mlp.fc2_name, act_name = mlp.act_name;
  int d = tp_gather_in(layer, dres2, T_, true);  // conjugate of g
  int dfc1 = -1;
  if (gelu_epilogue()) {
    // FC2's data gradient through GELU's derivative in its epilogue (with FC1's bias gradient):
    // FC1's output gradient at once, reading the saved pre-activation inside the GEMM.
    dfc1 = act(layer, (fc1 + ".dy").c_str(), {T_, f});
    const int op = gemm(layer, (fc2 + ".dx").c_str(), T_, f, h_, 1, {d, w[mlp.fc2], sv[mlp.s_fc1]},
                        {dfc1, g[mlp.fc1b]}, true);
    P_.ops[op].role = OpRole::kGeluFc2Dx;
    P_.ops[op].epilogue_bytes = dtype_bytes(P_.buffers[sv[mlp.s_fc1]].dtype) * double(T_) * f;
  }
  int da = -1;
  if (dfc1 < 0) {
    da = act(layer, (act_name + ".dy").c_str(), {T_, f});
    gemm(layer, (fc2 + ".dx").c_str(), T_, f, h_, 1, {d, w[mlp.fc2]}, {da}, true);
    if (mlp.s_fc1 == sFc1) lora_backward(layer, LoraTarget::kFc2, d, f, da, h_, sv, w, g);
  }
  // A frozen weight (Plan::lora_rank) has no weight-gradient GEMM.
  if (trains(mlp.fc2))
    main_grad_add(role(OpRole::kWeightGrad, gemm(layer, (fc2 + ".dw").c_str(), f, h_, T_, 1,
                                                 {sv[mlp.s_act], d}, {g[mlp.fc2]})));
  if (dfc1 < 0) {
    // Plan::activation_fp8_input_store: the kept fp8 input cast back first (SwiGLUFunction's
    // backward: input.to(ctx.ori_input_dtype)).
    int in_act = sv[mlp.s_fc1];
    if (fp8_act_store(mlp)) {
      const double n = double(T_) * up_ * f;
      in_act = ws(layer, (fc1 + ".bf16").c_str(), {T_, up_ * f});
      elementwise(OpKind::kCast, layer, (fc1 + ".bf16").c_str(), n, n * (1 + eb_), {sv[mlp.s_fc1]},
                  {in_act});
    }
    dfc1 = act(layer, (fc1 + ".dy").c_str(), {T_, up_ * f});
    elementwise(OpKind::kActivation, layer, act_name.c_str(), double(T_) * f,
                2 * kb_.activation * T_ * f, {in_act, mlp.s_fc1 == sFc1 ? sv[sFc3] : -1, da},
                {dfc1, g[mlp.fc1b]});
  }
  // FC1's input again, for its weight gradient.
  int in = trains(mlp.fc1) ? tp_gather_in(layer, sv[sX1n], T_) : -1;
  int dxp = ws(layer, (fc1 + ".dx").c_str(), {T_, h_});
  gemm(layer, (fc1 + ".dx").c_str(), T_, h_, up_ * f, 1, {dfc1, w[mlp.fc1]}, {dxp}, true);
  if (mlp.s_fc1 == sFc1) lora_backward(layer, LoraTarget::kFc1, dfc1, h_, dxp, up_ * f, sv, w, g);
  return tp_reduce_dgrad(layer, dxp, (fc1 + ".dx.tp").c_str(), [&] {  // conjugate of f
    if (trains(mlp.fc1))
      main_grad_add(role(OpRole::kWeightGrad, gemm(layer, (fc1 + ".dw").c_str(), h_, up_ * f, T_, 1,
                                                   {in, dfc1}, {g[mlp.fc1], g[mlp.fc1b]})));
  });
}

int Lowerer::layer_backward(int layer, const Saved& sv, int dy, const WSet& w, const WSet& g) {
  const double nh = double(Tn_) * h_;
  // Residual 2 (and the FC2 bias, added there).
  int dres2 = act(layer, "res2.dx", {Tn_, h_});
  role(OpRole::kMlpResidual,
       elementwise(OpKind::kResidualAdd, layer, "res2", nh, 2 * kb_.residual * nh, {dy, sv[sMask2]},
                   {dres2, g[kFc2B] >= 0 ? g[kFc2B] : g[kSfc2B]}));
  const int dx1n = m_.is_moe_layer(layer) ? moe_backward(layer, sv, dres2, w, g)
                                          : mlp_backward(layer, dense_mlp(), sv, dres2, w, g);
  int dx1 = act(layer, "ln2.dx", {Tn_, h_});
  elementwise(OpKind::kNorm, layer, "ln2", nh, 2 * kb_.norm * nh, {sv[sX1], dx1n, dy, w[kNorm2]},
              {dx1, g[kNorm2]});
  // Residual 1 (and the out-projection bias).
  int dres1 = act(layer, "res1.dx", {Tn_, h_});
  role(OpRole::kAttnResidual,
       elementwise(OpKind::kResidualAdd, layer, "res1", nh, 2 * kb_.residual * nh,
                   {dx1, sv[sMask1]}, {dres1, g[kOutB]}));
  int d = tp_gather_in(layer, dres1, T_, true);  // conjugate of g
  int dao = role(BufferRole::kAttnOutGrad, act(layer, "attn.dy", {T_, ao_cols_}));
  gemm(layer, "out.dx", T_, ao_cols_, h_, 1, {d, w[kOut]}, {dao}, true);
  lora_backward(layer, LoraTarget::kProj, d, ao_cols_, dao, h_, sv, w, g);
  if (trains(kOut))
    main_grad_add(role(OpRole::kWeightGrad,
                       gemm(layer, "out.dw", ao_cols_, h_, T_, 1, {sv[sAo], d}, {g[kOut]})));
  int dqkv = attention_backward(layer, sv, dao);
  int dxn;
  if (mla_) {
    dxn = mla_backward(layer, sv, dqkv, w, g);
  } else {
    qk_norms(layer, sv[sQkv], sv[sK], dqkv);
    int in = trains(kQkv) ? tp_gather_in(layer, sv[sXn], T_) : -1;
    int dxp = ws(layer, "qkv.dx", {T_, h_});
    role(OpRole::kQkvDx,
         rotary_epilogue(gemm(layer, "qkv.dx", T_, h_, qkv_cols_, 1, {dqkv, w[kQkv]}, {dxp}, true),
                         true));
    lora_backward(layer, LoraTarget::kQkv, dqkv, h_, dxp, qkv_cols_, sv, w, g);
    dxn = tp_reduce_dgrad(layer, dxp, "qkv.dx.tp", [&] {
      if (trains(kQkv))
        main_grad_add(role(OpRole::kWeightGrad, gemm(layer, "qkv.dw", h_, qkv_cols_, T_, 1,
                                                     {in, dqkv}, {g[kQkv], g[kQkvB]})));
    });
  }
  int dx = act(layer, "ln1.dx", {Tn_, h_});
  elementwise(OpKind::kNorm, layer, "ln1", nh, 2 * kb_.norm * nh, {sv[sX], dxn, dx1, w[kNorm1]},
              {dx, g[kNorm1]});
  return dx;
}

}  // namespace parasol::lowering
