// Executor: the compute ops of a Program mapped to Backend kernels, following the buffer
// conventions of core/lower.h (which buffers each op reads and writes, in which order). An op
// is recognised by its kind, phase, backward_data and role, a buffer by its position in the op's
// reads and writes or its role (core/program.h); names are never looked at.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <span>

#include "core/error.h"
#include "runtime/executor_impl.h"

namespace parasol::runtime {

namespace {

bool backward(const Op& op) { return op.tags.phase == Phase::kBackward; }

[[noreturn]] void bad_op(const Op& op, const std::string& why) {
  throw Error("runtime.program", op.name + " (" + op_kind_name(op.kind) + "): " + why);
}

// Attention operands as their element type (AttnOperands::typed: bf16, else fp32).
uint16_t* u16(void* p) { return static_cast<uint16_t*>(p); }
const uint16_t* u16(const void* p) { return static_cast<const uint16_t*>(p); }
float* f32(void* p) { return static_cast<float*>(p); }
const float* f32(const void* p) { return static_cast<const float*>(p); }

}  // namespace

Routing Executor::Impl::new_routing(int64_t tokens) {
  const int64_t E = model.moe.experts, K = model.moe.top_k;
  if (!be.device_moe_routing()) return Routing(tokens, E, K);
  if (moe_bad_ == nullptr) {
    moe_bad_ = static_cast<int32_t*>(be.alloc_routing(sizeof(int32_t)));
    be.zero(moe_bad_, sizeof(int32_t));
  }
  return Routing(tokens, E, K, be.alloc_routing(Routing::device_bytes(tokens, E, K)));
}

void Executor::Impl::permute(Routing& r, int64_t tokens) {
  const int64_t E = model.moe.experts, K = model.moe.top_k;
  if (r.on_device)
    be.moe_permutation_device(r.row_of, r.dev_counts, r.offsets, moe_bad_, r.topk_idx, tokens, E,
                              K);
  else  // built on the host from the indices (a host synchronisation on a GPU)
    be.moe_permutation(r.row_of, r.counts.data(), r.topk_idx, tokens, E, K);
  if (!r.on_device) ++result->moe_count_syncs;
}

const std::vector<int64_t>& Executor::Impl::host_counts(Routing& r) {
  if (!r.counts_on_host) {
    std::vector<int32_t> c(r.counts.size());
    be.copy(c.data(), r.dev_counts, sizeof(int32_t) * c.size());  // a host synchronisation
    std::copy(c.begin(), c.end(), r.counts.begin());
    r.counts_on_host = true;
    ++result->moe_count_syncs;
  }
  return r.counts;
}

void Executor::Impl::clear_routing() {
  for (auto& [probs, r] : routing_)
    if (r.block != nullptr) be.free_routing(r.block);
  routing_.clear();
  if (moe_bad_ == nullptr) return;
  int32_t bad = 0;
  be.copy(&bad, moe_bad_, sizeof bad);  // once a step, after the step's kernels
  be.free_routing(moe_bad_);
  moe_bad_ = nullptr;
  if (bad != 0)
    throw Error("runtime.moe_permutation", std::to_string(bad) + " expert indices out of [0, " +
                                               std::to_string(model.moe.experts) + ") this step");
}

Routing& Executor::Impl::routing(const Op& op, int rprobs) {
  auto it = routing_.find(rprobs);
  if (it != routing_.end()) return it->second;
  routing_probs_[ep_key(op.tags.layer, op.tags.micro_batch)] = rprobs;
  // Recover the routing from the saved probabilities (recompute, offload: a new buffer).
  const int64_t E = model.moe.experts, K = model.moe.top_k;
  const int64_t tokens = elements_[rprobs] / E;
  Routing r = new_routing(tokens);
  be.router_topk(r.topk_idx, r.topk_w, fptr(rprobs), tokens, E, K, renormalize());
  permute(r, tokens);
  return routing_.emplace(rprobs, std::move(r)).first->second;
}

Routing& Executor::Impl::routing_of(const Op& op) {
  auto it = routing_probs_.find(ep_key(op.tags.layer, op.tags.micro_batch));
  if (it == routing_probs_.end()) bad_op(op, "no routing for this layer and micro-batch");
  return routing_.at(it->second);
}

int64_t Executor::Impl::region_rows(int buffer) const {
  if (region_key_[buffer] < 0) return -1;
  auto it = ep_.find(region_key_[buffer]);
  return it == ep_.end() ? -1 : it->second.region_rows;
}

// The token exchange of expert parallelism (dropless): tokens -> the ranks of their experts
// (dispatch forward, combine backward) or back (combine forward, dispatch backward), with the
// rows per member from the routing; the first exchange of a layer and micro-batch also trades
// the per-expert counts.
Request Executor::Impl::start_all_to_all(const Op& op) {
  Communicator& comm = comms.get(op.group);
  if (op.group != Group::kEp) bad_op(op, "all-to-all outside the expert-parallel group");
  if (op.role != OpRole::kDispatchA2a && op.role != OpRole::kCombineA2a)
    bad_op(op, "an all-to-all that is neither the dispatch's nor the combine's");
  const bool to_experts = (op.role == OpRole::kDispatchA2a) != (op.tags.phase == Phase::kBackward);
  const int n = comm.size();
  const int64_t E = model.moe.experts, le = E / plan.ep;
  const int64_t key = ep_key(op.tags.layer, op.tags.micro_batch);
  auto it = ep_.find(key);
  if (it == ep_.end() || (to_experts && op.tags.phase != Phase::kBackward)) {
    const std::vector<int64_t>& counts = host_counts(routing_of(op));
    EpExchange x;
    x.send_rows.assign(n, 0);
    for (int64_t e = 0; e < E; ++e) x.send_rows[e / le] += counts[e];
    std::vector<float> mine(static_cast<size_t>(E)), theirs(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; ++e) mine[e] = static_cast<float>(counts[e]);
    comm.all_to_all(std::span<const float>(mine), std::span<float>(theirs));
    x.recv_rows.assign(n, 0);
    x.recv_counts.assign(n, std::vector<int64_t>(static_cast<size_t>(le)));
    for (int j = 0; j < n; ++j)
      for (int64_t e = 0; e < le; ++e) {
        x.recv_counts[j][e] = static_cast<int64_t>(theirs[j * le + e]);
        x.recv_rows[j] += x.recv_counts[j][e];
      }
    for (int j = 0; j < n; ++j) x.region_rows += x.recv_rows[j];
    it = ep_.insert_or_assign(key, std::move(x)).first;
  }
  const EpExchange& x = it->second;
  const int out = op.writes.at(0);
  if (to_experts && elements_[out] != x.region_rows * h) {
    release(unit_of_[out]);  // allocated at the lowered size: re-allocate at the routed one
    allocate(unit_of_[out]);
  }
  std::vector<int64_t> send(n), recv(n);
  for (int j = 0; j < n; ++j) {
    send[j] = (to_experts ? x.send_rows[j] : x.recv_rows[j]) * h;
    recv[j] = (to_experts ? x.recv_rows[j] : x.send_rows[j]) * h;
  }
  after_kernels(comm);
  return comm.iall_to_all_v(ptr(op.reads.at(0)), send, ptr(out), recv, prog.buffers[out].dtype);
}

// The routed rows of every member of the experts' tensor-parallel group, gathered in member
// order: their counts per expert, traded (blocking) over that group before the rows.
void Executor::Impl::gather_counts(const Op& op, Communicator& comm) {
  const int64_t E = model.moe.experts;
  const int n = comm.size();
  const std::vector<int64_t>& c = host_counts(routing_of(op));
  std::vector<float> mine(static_cast<size_t>(E)), all(static_cast<size_t>(E) * n);
  for (int64_t e = 0; e < E; ++e) mine[e] = static_cast<float>(c[e]);
  comm.all_gather(std::span<const float>(mine), std::span<float>(all));
  std::vector<std::vector<int64_t>> counts(n, std::vector<int64_t>(static_cast<size_t>(E)));
  for (int j = 0; j < n; ++j)
    for (int64_t e = 0; e < E; ++e) counts[j][e] = static_cast<int64_t>(all[j * E + e]);
  gathered_[ep_key(op.tags.layer, op.tags.micro_batch)] = std::move(counts);
}

void Executor::Impl::rotate_qk(int qkv, bool inverse) {
  const int64_t hd = model.head_dim, q_heads = model.heads / tp, kv_heads = model.kv_heads / tp;
  const int64_t ld = (q_heads + 2 * kv_heads) * hd;
  const int64_t pos = int64_t{cp_idx} * Sl;
  be.rope(fptr(qkv), ld, T, Sl, pos, q_heads, hd, model.rope_theta, inverse);
  be.rope(fptr(qkv) + q_heads * hd, ld, T, Sl, pos, kv_heads, hd, model.rope_theta, inverse);
}

// rotate_qk on the bf16 QKV buffer (Backend::rope_bf16).
void Executor::Impl::rotate_qk_bf16(int qkv, bool inverse) {
  const int64_t hd = model.head_dim, q_heads = model.heads / tp, kv_heads = model.kv_heads / tp;
  const int64_t ld = (q_heads + 2 * kv_heads) * hd;
  const int64_t pos = int64_t{cp_idx} * Sl;
  auto* x = static_cast<uint16_t*>(ptr_[qkv]);
  be.rope_bf16(x, ld, T, Sl, pos, q_heads, hd, model.rope_theta, inverse);
  be.rope_bf16(x + q_heads * hd, ld, T, Sl, pos, kv_heads, hd, model.rope_theta, inverse);
}

int64_t Executor::Impl::routed_row0(int64_t buffer_rows, int64_t rows) const {
  const bool slice = expert_grid(plan) && tp > 1 && !(plan.sequence_parallel && tp > 1);
  return slice && buffer_rows > rows ? int64_t{tp_idx} * rows : 0;
}

// reads {x [rows x cols], w [width]} writes {y [rows x width], pass [rows x (cols - width)]};
// backward reads {x, dy, dpass, w} writes {dx [rows x cols], dw}.
void Executor::Impl::partial_norm(const Op& op, int64_t width) {
  const int x = op.reads[0], w = op.reads.back();
  const int64_t cols = prog.buffers[x].shape.back(), rows = elements_[x] / cols;
  const int64_t rest = cols - width;
  const bool ln = model.norm == Norm::kLayerNorm;
  auto* xs = static_cast<float*>(be.alloc(rows * width * sizeof(float), BufferClass::kWorkspace));
  copy_rows(xs, width, fptr(x), cols, rows, width);
  if (op.tags.phase != Phase::kBackward) {
    be.norm_forward(model.norm, fptr(op.writes.at(0)), xs, fptr(w), ln ? fptr(w) + width : nullptr,
                    rows, width, norm_eps);
    copy_rows(fptr(op.writes.at(1)), rest, fptr(x) + width, cols, rows, rest);
  } else {
    auto* dxs =
        static_cast<float*>(be.alloc(rows * width * sizeof(float), BufferClass::kWorkspace));
    float* dw = fptr(op.writes.at(1));
    be.norm_backward(model.norm, dxs, dw, ln ? dw + width : nullptr, fptr(op.reads.at(1)), xs,
                     fptr(w), nullptr, rows, width, norm_eps);
    float* dx = fptr(op.writes.at(0));
    copy_rows(dx, cols, dxs, width, rows, width);
    copy_rows(dx + width, cols, fptr(op.reads.at(2)), rest, rows, rest);
    be.free(dxs);
  }
  be.free(xs);
}

// reads {q [T x heads d], kv [T x heads (nope + v)], pe [T x rope]} writes {qkv}: Q | K | V of
// this rank's heads, d = nope + rope: Q = q with RoPE on each head's rotary columns, K = (kv's
// key nope | the rotated shared rotary key), V = kv's values.
void Executor::Impl::mla_pack(const Op& op) {
  const MlaSpec& a = model.mla;
  const int64_t n = model.heads / tp, nope = a.qk_nope_head_dim, rope = a.qk_rope_head_dim;
  const int64_t dqk = nope + rope, vd = a.v_head_dim, kvw = nope + vd;
  const int64_t qc = n * dqk, ld = 2 * qc + n * vd;
  const int64_t pos = int64_t{cp_idx} * Sl;
  float* out = fptr(op.writes.at(0));
  const float *q = fptr(op.reads.at(0)), *kv = fptr(op.reads.at(1)), *pe = fptr(op.reads.at(2));
  copy_rows(out, ld, q, qc, T, qc);
  auto* rot = static_cast<float*>(be.alloc(T * rope * sizeof(float), BufferClass::kWorkspace));
  be.copy(rot, pe, T * rope * sizeof(float));
  if (rotary()) {
    for (int64_t hh = 0; hh < n; ++hh)
      be.rope(out + hh * dqk + nope, ld, T, Sl, pos, 1, rope, model.rope_theta, false);
    be.rope(rot, rope, T, Sl, pos, 1, rope, model.rope_theta, false);
  }
  for (int64_t hh = 0; hh < n; ++hh) {
    copy_rows(out + qc + hh * dqk, ld, kv + hh * kvw, n * kvw, T, nope);
    copy_rows(out + qc + hh * dqk + nope, ld, rot, rope, T, rope);
    copy_rows(out + 2 * qc + hh * vd, ld, kv + hh * kvw + nope, n * kvw, T, vd);
  }
  be.free(rot);
}

// reads {dqkv} writes {dq, dkv, dpe}: mla_pack's backward (the shared rotary key's gradient
// summed over the heads; RoPE undone).
void Executor::Impl::mla_unpack(const Op& op) {
  const MlaSpec& a = model.mla;
  const int64_t n = model.heads / tp, nope = a.qk_nope_head_dim, rope = a.qk_rope_head_dim;
  const int64_t dqk = nope + rope, vd = a.v_head_dim, kvw = nope + vd;
  const int64_t qc = n * dqk, ld = 2 * qc + n * vd;
  const int64_t pos = int64_t{cp_idx} * Sl;
  const float* d = fptr(op.reads.at(0));
  float *dq = fptr(op.writes.at(0)), *dkv = fptr(op.writes.at(1)), *dpe = fptr(op.writes.at(2));
  copy_rows(dq, qc, d, ld, T, qc);
  auto* part = static_cast<float*>(be.alloc(T * rope * sizeof(float), BufferClass::kWorkspace));
  be.zero(dpe, T * rope * sizeof(float));
  for (int64_t hh = 0; hh < n; ++hh) {
    if (rotary()) be.rope(dq + hh * dqk + nope, qc, T, Sl, pos, 1, rope, model.rope_theta, true);
    copy_rows(dkv + hh * kvw, n * kvw, d + qc + hh * dqk, ld, T, nope);
    copy_rows(dkv + hh * kvw + nope, n * kvw, d + 2 * qc + hh * vd, ld, T, vd);
    copy_rows(part, rope, d + qc + hh * dqk + nope, ld, T, rope);
    be.residual_forward(dpe, nullptr, dpe, part, nullptr, T, rope, 0.0f, 0);
  }
  if (rotary()) be.rope(dpe, rope, T, Sl, pos, 1, rope, model.rope_theta, true);
  be.free(part);
}

// ---------------------------------------------------------------------------------------------
// The compute ops: a short switch over op kinds, one function per kind below.

// Mixed precision as Megatron and torch AMP run it: tensors stored in bf16 / fp16, math in
// fp32. The kernels compute in fp32, so each 16-bit buffer op touches is widened into fp32 for the
// op (Backend::alloc_widened, counted apart from the Program's buffers), and each one op writes
// is rounded back to nearest even once the op is done: every stored value is rounded once, every
// product and sum inside a kernel accumulates in fp32 (a GPU's bf16 GEMM with fp32
// accumulation). Buffers an op writes are widened too: some kernels accumulate into them.
void Executor::Impl::run_widened(const Op& op) {
  // The vocab-tiled loss reads and writes the logits in their dtype itself.
  if (op.kind == OpKind::kCrossEntropy && tiled_loss()) return run_compute(op);
  if (cfg->typed_bf16 && be.bf16_kernels() && run_typed(op)) {
    ++result->typed_bf16_ops;
    return;
  }
  struct View {
    int id;
    void* stored;
    float* wide;
    Dtype dt;
    bool written;
  };
  std::vector<View> views;
  auto widen = [&](int id, bool written) {
    const Dtype dt = prog.buffers[id].dtype;
    if ((dt != Dtype::kBf16 && dt != Dtype::kFp16) || ptr_[id] == nullptr) return;
    for (View& v : views)
      if (v.id == id) {
        v.written = v.written || written;
        return;
      }
    const int64_t n = elements_[id];
    auto* wide = static_cast<float*>(be.alloc_widened(static_cast<size_t>(n) * sizeof(float)));
    result->widened_bytes += n * static_cast<int64_t>(sizeof(float));
    if (typed_kind(op)) result->widened_typed_kind_bytes += n * static_cast<int64_t>(sizeof(float));
    if (op.kind == OpKind::kAttention)
      result->widened_attention_bytes += n * static_cast<int64_t>(sizeof(float));
    be.cast(wide, Dtype::kFp32, ptr_[id], dt, n);
    views.push_back({id, ptr_[id], wide, dt, written});
    ptr_[id] = wide;
  };
  // The QKV data gradient of a rotary model rotates its dQKV back in place (run_linear) for the
  // weight gradient that reads it next: a write, so that the rotation reaches the stored buffer.
  const bool rotates = op.kind == OpKind::kLinear && op.role == OpRole::kQkvDx && rotary();
  for (size_t i = 0; i < op.reads.size(); ++i) widen(op.reads[i], rotates && i == 0);
  for (int w : op.writes) widen(w, true);
  if (views.empty()) return run_compute(op);
  auto restore = [&](bool store) {
    for (const View& v : views) {
      if (store && v.written) be.cast(v.stored, v.dt, v.wide, Dtype::kFp32, elements_[v.id]);
      ptr_[v.id] = v.stored;
      be.free_widened(v.wide);
    }
  };
  try {
    run_compute(op);
  } catch (...) {
    restore(false);
    throw;
  }
  restore(true);
}

bool Executor::Impl::typed_kind(const Op& op) const {
  switch (op.kind) {
    case OpKind::kNorm:
    case OpKind::kEmbedding:
      return true;
    case OpKind::kActivation:  // experts' biases are not executed (run_activation)
      return op.writes.size() == 1;
    case OpKind::kResidualAdd:  // the plain adds without a dropout mask, and sums
      if (op.role == OpRole::kSum) return true;
      if (op.role != OpRole::kNone) return false;  // fold, MLA's pack and unpack
      return backward(op) ? op.reads.size() == 1 : op.writes.size() == 1;
    case OpKind::kLinear:  // not the fp32 router's GEMMs (its logits' data gradient reads fp32)
      if (op.role == OpRole::kRouterDw || op.role == OpRole::kRouter) return false;
      for (int id : op.reads)
        if (prog.buffers[id].dtype == Dtype::kFp32) return false;
      return true;
    case OpKind::kDispatch:
    case OpKind::kCombine:
    case OpKind::kExpertLinear:
      return true;
    case OpKind::kAttention:  // flash attention (from the log-sum-exp; no probabilities kept)
      return with_role(op.reads, BufferRole::kAttnProbs) < 0 &&
             with_role(op.writes, BufferRole::kAttnProbs) < 0;
    default:
      return false;
  }
}

// The typed bf16 path (Backend's bf16 entries, backend.h): the same operands as run_norm,
// run_linear, run_activation, run_residual and run_embedding, as bf16 (the parameters' gradients
// fp32, or bf16 for a GEMM's dW under a bf16 gradient dtype; token ids int32). RoPE of rotary
// models runs on the bf16 QKV in place (rope_bf16) after the QKV GEMM and before its data
// gradient. Flash attention runs on the bf16 Q | K | V, output and gradients with its fp32
// log-sum-exp (attention_*_bf16), ring steps and the context-parallel exchanges' layouts included;
// MoE's dispatch, combine and grouped expert GEMMs on bf16 rows (the gates fp32). Left to the
// widening path: MLA's partial norm, the fp32 router's GEMMs (bf16 in, fp32 logits: the router
// computes in fp32, as Megatron-Core's), attention that keeps its probabilities, masked residual
// adds (dropout), the fold and MLA's packing, and any op with another dtype.
bool Executor::Impl::run_typed(const Op& op) {
  if (!typed_kind(op)) return false;
  auto is = [&](int id, Dtype dt) { return prog.buffers[id].dtype == dt && ptr_[id] != nullptr; };
  auto all_bf16 = [&](const std::vector<int>& ids, size_t from = 0) {
    for (size_t i = from; i < ids.size(); ++i)
      if (!is(ids[i], Dtype::kBf16)) return false;
    return true;
  };
  auto u = [&](int id) { return static_cast<uint16_t*>(ptr_[id]); };
  auto f = [&](int id) { return static_cast<float*>(ptr_[id]); };
  switch (op.kind) {
    case OpKind::kNorm:
      return run_typed_norm(op);
    case OpKind::kDispatch:
    case OpKind::kCombine:
    case OpKind::kExpertLinear:
      return run_typed_moe(op);
    case OpKind::kAttention: {
      // Every operand bf16 but the log-sum-exp, which stays fp32 (core/lower_layer.cc).
      for (const auto* ids : {&op.reads, &op.writes})
        for (int id : *ids)
          if (!is(id, prog.buffers[id].role == BufferRole::kAttnLse ? Dtype::kFp32 : Dtype::kBf16))
            return false;
      run_attention(op, true);
      return true;
    }
    case OpKind::kEmbedding: {
      const auto* tokens = static_cast<const int32_t*>(ptr(op.reads.at(backward(op) ? 1 : 0)));
      if (!backward(op)) {
        if (!all_bf16(op.reads, 1) || !all_bf16(op.writes)) return false;
        const uint16_t* pos = op.reads.size() > 2 && tp_idx == 0 ? u(op.reads[2]) : nullptr;
        be.embedding_forward_bf16(u(op.writes[0]), tokens, u(op.reads[1]), vocab_start, vocab_t,
                                  pos, int64_t{cp_idx} * Sl, T, Sl, h);
        return true;
      }
      if (!is(op.reads[0], Dtype::kBf16)) return false;
      for (int w : op.writes)
        if (!is(w, Dtype::kFp32)) return false;
      be.embedding_backward_bf16(f(op.writes[0]), op.writes.size() > 1 ? f(op.writes[1]) : nullptr,
                                 u(op.reads[0]), tokens, vocab_start, vocab_t, int64_t{cp_idx} * Sl,
                                 T, Sl, h);
      return true;
    }
    case OpKind::kActivation: {
      if (!all_bf16(op.reads) || !all_bf16(op.writes)) return false;
      if (!backward(op)) {
        const int out = op.writes[0];
        be.activation_forward_bf16(model.activation, u(out), u(op.reads[0]), rows_of(out),
                                   cols_of(out));
        return true;
      }
      const int din = op.writes[0];
      const int64_t cols = cols_of(din) / (model.activation == Activation::kSwiglu ? 2 : 1);
      be.activation_backward_bf16(model.activation, u(din), u(op.reads[1]), u(op.reads[0]),
                                  rows_of(din), cols);
      return true;
    }
    case OpKind::kResidualAdd: {
      if (!all_bf16(op.reads)) return false;
      if (op.role == OpRole::kSum || !backward(op)) {
        if (!all_bf16(op.writes)) return false;
        const int out = op.writes[0];
        const bool sum = op.role == OpRole::kSum;
        const uint16_t* x = sum || op.reads.size() > 1 ? u(op.reads[0]) : nullptr;
        const uint16_t* y = sum || op.reads.size() > 1 ? u(op.reads[1]) : u(op.reads[0]);
        const uint16_t* bias = !sum && op.reads.size() > 2 ? u(op.reads[2]) : nullptr;
        be.residual_forward_bf16(u(out), x, y, bias, rows_of(out), cols_of(out));
        return true;
      }
      const int dy = op.writes[0];
      if (!is(dy, Dtype::kBf16) || (op.writes.size() > 1 && !is(op.writes[1], Dtype::kFp32)))
        return false;
      be.residual_backward_bf16(u(dy), op.writes.size() > 1 ? f(op.writes[1]) : nullptr,
                                u(op.reads[0]), rows_of(dy), cols_of(dy));
      return true;
    }
    default:
      return run_typed_linear(op);
  }
}

// Forward reads {x, w} writes {y}; backward reads {x, dy[, dres], w} writes {dx, dw} (dw fp32).
bool Executor::Impl::run_typed_norm(const Op& op) {
  auto u = [&](int id) { return static_cast<uint16_t*>(ptr_[id]); };
  const int w = op.reads.back();
  const int64_t cols = cols_of(op.reads[0]), rows = rows_of(op.reads[0]);
  if (cols_of(w) < cols) return false;  // MLA's partial norm
  for (int id : op.reads)
    if (prog.buffers[id].dtype != Dtype::kBf16 || ptr_[id] == nullptr) return false;
  const int out = op.writes.at(0);
  if (prog.buffers[out].dtype != Dtype::kBf16 || ptr_[out] == nullptr) return false;
  const bool ln = model.norm == Norm::kLayerNorm;
  if (!backward(op)) {
    be.norm_forward_bf16(model.norm, u(out), u(op.reads[0]), u(w), ln ? u(w) + cols : nullptr, rows,
                         cols, norm_eps);
    return true;
  }
  const int dw = op.writes.at(1);
  if (prog.buffers[dw].dtype != Dtype::kFp32 || ptr_[dw] == nullptr) return false;
  float* g = static_cast<float*>(ptr_[dw]);
  const uint16_t* dres = op.reads.size() == 4 ? u(op.reads[2]) : nullptr;
  be.norm_backward_bf16(model.norm, u(out), g, ln ? g + cols : nullptr, u(op.reads[1]),
                        u(op.reads[0]), u(w), dres, rows, cols, norm_eps);
  return true;
}

bool Executor::Impl::run_typed_linear(const Op& op) {
  if (op.role == OpRole::kGeluFc1 || op.role == OpRole::kGeluFc2Dx) return run_typed_gelu_gemm(op);
  // Every buffer bf16; a weight gradient's dW may be fp32 (the plan's gradient dtype), its bias
  // gradient must be (the entry's dbias is fp32).
  const bool wgrad = op.role == OpRole::kWeightGrad;
  for (const auto* ids : {&op.reads, &op.writes})
    for (size_t i = 0; i < ids->size(); ++i) {
      const int id = (*ids)[i];
      const Dtype dt = prog.buffers[id].dtype;
      const bool ok = !wgrad || ids == &op.reads ? dt == Dtype::kBf16
                      : i == 0                   ? dt == Dtype::kBf16 || dt == Dtype::kFp32
                                                 : dt == Dtype::kFp32;
      if (!ok || ptr_[id] == nullptr) return false;
    }
  auto u = [&](int id) { return static_cast<uint16_t*>(ptr_[id]); };
  auto layout_of = [&](int wbuf) {
    return prog.buffers[wbuf].role == BufferRole::kEmbeddingTable ? WeightLayout::kOutIn
                                                                  : WeightLayout::kInOut;
  };
  if (wgrad) {
    const int dw = op.writes[0];
    float* db = op.writes.size() > 1 ? W(op, 1) : nullptr;
    be.linear_backward_weight_bf16(ptr_[dw], prog.buffers[dw].dtype, db, u(op.reads.at(0)),
                                   u(op.reads.at(1)), layout_of(dw), op.k, op.n, op.m);
    return true;
  }
  if (op.backward_data) {
    // Rotary models: dQ and dK back through the rotation in place first (as run_linear), stored
    // for the weight gradient that reads dQKV next.
    if (op.role == OpRole::kQkvDx && rotary()) rotate_qk_bf16(op.reads[0], true);
    const bool acc = op.reads.size() == 3;  // as run_linear
    be.linear_backward_data_bf16(u(op.writes.at(0)), u(op.reads.at(0)), u(op.reads.at(1)),
                                 layout_of(op.reads[1]), nullptr, nullptr, op.m, op.k, op.n, acc);
    return true;
  }
  if (op.role == OpRole::kHead && vocab_start + vocab_t > model.vocab)
    bad_op(op, "padded vocabulary");
  const uint16_t* bias = op.reads.size() > 2 ? u(op.reads[2]) : nullptr;
  be.linear_forward_bf16(u(op.writes.at(0)), u(op.reads.at(0)), u(op.reads.at(1)),
                         layout_of(op.reads[1]), bias, nullptr, op.m, op.n, op.k);
  if (op.role == OpRole::kQkv && rotary()) rotate_qk_bf16(op.writes[0], false);
  return true;
}

// Plan::gemm_gelu_epilogue on bf16 storage: FC1 forward {in, W[, b]} -> {pre, out} with GELU in
// the epilogue; FC2's data gradient {dout, W, pre} -> {dpre[, db]} with GELU's derivative in it
// (db, fp32, is formed by FC1's weight gradient, as after the unfused activation).
bool Executor::Impl::run_typed_gelu_gemm(const Op& op) {
  for (int id : op.reads)
    if (prog.buffers[id].dtype != Dtype::kBf16 || ptr_[id] == nullptr) return false;
  for (size_t i = 0; i < op.writes.size(); ++i) {
    const int id = op.writes[i];
    const Dtype want = op.role == OpRole::kGeluFc2Dx && i == 1 ? Dtype::kFp32 : Dtype::kBf16;
    if (prog.buffers[id].dtype != want || ptr_[id] == nullptr) return false;
  }
  auto u = [&](int id) { return static_cast<uint16_t*>(ptr_[id]); };
  if (op.role == OpRole::kGeluFc1) {
    const uint16_t* bias = op.reads.size() > 2 ? u(op.reads[2]) : nullptr;
    be.linear_forward_bf16(u(op.writes.at(1)), u(op.reads.at(0)), u(op.reads.at(1)),
                           WeightLayout::kInOut, bias, u(op.writes.at(0)), op.m, op.n, op.k);
    return true;
  }
  be.linear_backward_data_bf16(u(op.writes.at(0)), u(op.reads.at(0)), u(op.reads.at(1)),
                               WeightLayout::kInOut, u(op.reads.at(2)), nullptr, op.m, op.k, op.n,
                               false);
  return true;
}

// The token and expert rows bf16; the gates' gradient fp32 (the [tokens x E] router buffer); a
// grouped GEMM's buffers as run_typed_linear's (dW fp32 or bf16, its bias gradient fp32).
bool Executor::Impl::run_typed_moe(const Op& op) {
  auto is = [&](int id, Dtype dt) { return prog.buffers[id].dtype == dt && ptr_[id] != nullptr; };
  const bool bwd = backward(op);
  switch (op.kind) {
    case OpKind::kDispatch:
      if (!is(op.reads.at(0), Dtype::kBf16) || !is(op.writes.at(0), Dtype::kBf16)) return false;
      run_dispatch(op, true);
      return true;
    case OpKind::kCombine:
      if (!is(op.reads.at(0), Dtype::kBf16) || !is(op.writes.at(0), Dtype::kBf16)) return false;
      if (bwd && (!is(op.reads.at(1), Dtype::kBf16) || !is(op.writes.at(1), Dtype::kFp32)))
        return false;
      run_combine(op, true);
      return true;
    default: {
      const bool wgrad = op.role == OpRole::kWeightGrad;
      for (int id : op.reads)
        if (!is(id, Dtype::kBf16)) return false;
      for (size_t i = 0; i < op.writes.size(); ++i) {
        const int id = op.writes[i];
        const bool ok = !wgrad   ? is(id, Dtype::kBf16)
                        : i == 0 ? is(id, Dtype::kBf16) || is(id, Dtype::kFp32)
                                 : is(id, Dtype::kFp32);
        if (!ok) return false;
      }
      run_expert_linear(op, true);
      return true;
    }
  }
}

void Executor::Impl::run_compute(const Op& op) {
  switch (op.kind) {
    case OpKind::kEmbedding:
      return run_embedding(op);
    case OpKind::kNorm:
      return run_norm(op);
    case OpKind::kLinear:
      return run_linear(op);
    case OpKind::kActivation:
      return run_activation(op);
    case OpKind::kResidualAdd:
      return run_residual(op);
    case OpKind::kAttention:
      return run_attention(op);
    case OpKind::kCrossEntropy:
      return run_cross_entropy(op);
    case OpKind::kRouter:
      return run_router(op);
    case OpKind::kDispatch:
      return run_dispatch(op);
    case OpKind::kCombine:
      return run_combine(op);
    case OpKind::kExpertLinear:
      return run_expert_linear(op);
    default:
      bad_op(op, "no kernel for this op kind");
  }
}

int Executor::Impl::with_role(const std::vector<int>& ids, BufferRole role) const {
  for (int id : ids)
    if (prog.buffers[id].role == role) return id;
  return -1;
}

// ---- Embedding and cross-entropy: the model's first and last ops.

// Forward reads {tokens, table[, positions]} writes {x}; backward reads {dx, tokens} writes
// {dtable[, dpositions]}. The position table is added by tensor-parallel rank 0 only.
void Executor::Impl::run_embedding(const Op& op) {
  const int64_t cols = h;
  if (!backward(op)) {
    const float* pos = op.reads.size() > 2 && tp_idx == 0 ? R(op, 2) : nullptr;
    be.embedding_forward(W(op, 0), static_cast<const int32_t*>(ptr(op.reads[0])), R(op, 1),
                         vocab_start, vocab_t, pos, int64_t{cp_idx} * Sl, T, Sl, cols);
  } else {
    float* dpos = op.writes.size() > 1 ? W(op, 1) : nullptr;
    be.embedding_backward(W(op, 0), dpos, R(op, 0), static_cast<const int32_t*>(ptr(op.reads[1])),
                          vocab_start, vocab_t, int64_t{cp_idx} * Sl, T, Sl, cols);
  }
}

// The vocabulary-parallel cross-entropy: the row maximum (kXentMax), the forward's partial sums
// (reduced over tp by the next op), and the backward, which also takes the loss.
void Executor::Impl::run_cross_entropy(const Op& op) {
  if (tiled_loss()) return run_tiled_loss(op);
  if (op.role == OpRole::kXentMax) {
    be.xent_row_max(W(op, 0), R(op, 0), T, vocab_t);
    return;
  }
  if (!backward(op)) {
    // reads {logits, labels, row_max}; writes {logits kept in fp32, [sum_exp; target]}.
    float* sums = W(op, 1);
    be.copy(W(op, 0), R(op, 0), static_cast<size_t>(T * vocab_t) * sizeof(float));
    be.xent_sum_exp(sums, R(op, 0), R(op, 2), T, vocab_t);
    be.xent_target(sums + T, R(op, 0), static_cast<const int32_t*>(ptr(op.reads[1])), T, vocab_t,
                   vocab_start);
    return;
  }
  // reads {logits, labels, sums, row_max}; writes {dlogits}. The loss is taken here, from
  // the reduced sums.
  const auto* labels = static_cast<const int32_t*>(ptr(op.reads[1]));
  const float* sums = R(op, 2);
  const float* row_max = R(op, 3);
  // The per-token losses go through the first T elements of dlogits (T x vocab_t, written in full
  // by the softmax below): no memory beyond the Program's buffers.
  float* dev_loss = W(op, 0);
  be.xent_loss(dev_loss, row_max, sums, sums + T, labels, T);
  add_losses(dev_loss, labels);
  be.xent_softmax(W(op, 0), R(op, 0), row_max, sums, T, vocab_t);
  be.xent_backward(W(op, 0), W(op, 0), labels, T, vocab_t, vocab_start,
                   cfg->loss_scale / static_cast<float>(cfg->tokens_per_step));
  if (cfg->inject_overflow) inject_inf(W(op, 0), Dtype::kFp32);  // the fp32 view
}

// The step's loss sum and token count from T per-token losses in device memory: staged, summed
// on the device (read after the step, end_step); else read here (a host synchronisation).
void Executor::Impl::add_losses(const float* dev_loss, const int32_t* labels) {
  if (staged()) {
    be.loss_accumulate(loss_acc_, dev_loss, labels, T);
    return;
  }
  std::vector<float> loss(static_cast<size_t>(T));
  std::vector<int32_t> lab(static_cast<size_t>(T));
  be.copy(loss.data(), dev_loss, T * sizeof(float));
  be.copy(lab.data(), labels, T * sizeof(int32_t));
  for (int64_t t = 0; t < T; ++t)
    if (lab[t] >= 0) {
      result->loss_sum += loss[t];
      ++result->loss_tokens;
    }
}

// Fault injection: +inf into the first element of a loss gradient `p` of dtype `dt`, as an fp16
// overflow: the backward pass carries it everywhere.
void Executor::Impl::inject_inf(void* p, Dtype dt) {
  const float inf = std::numeric_limits<float>::infinity();
  const uint16_t bf16_inf = 0x7F80, fp16_inf = 0x7C00;
  if (dt == Dtype::kFp32)
    be.copy(p, &inf, sizeof(float));
  else
    be.copy(p, dt == Dtype::kBf16 ? &bf16_inf : &fp16_inf, sizeof(uint16_t));
}

// The vocab-tiled loss (plan.tiled_loss, core/lower_edges.cc), the same three ops on the
// logits in their dtype (Backend's xent_*_typed): the row maximum {logits} -> {row_max}; the
// forward {logits, labels, row_max} -> {[sum_exp; target]}; the backward {logits, labels, sums,
// row_max} -> {dlogits}, which also takes the loss.
void Executor::Impl::run_tiled_loss(const Op& op) {
  const int logits = op.reads.at(0);
  const Dtype dt = prog.buffers[logits].dtype;
  if (op.role == OpRole::kXentMax) {
    be.xent_max_typed(W(op, 0), ptr(logits), dt, T, vocab_t);
    return;
  }
  const auto* labels = static_cast<const int32_t*>(ptr(op.reads.at(1)));
  if (!backward(op)) {
    float* sums = W(op, 0);
    be.xent_sums_typed(sums, sums + T, ptr(logits), dt, R(op, 2), labels, T, vocab_t, vocab_start);
    return;
  }
  const float* sums = R(op, 2);
  const float* row_max = R(op, 3);
  // The per-token losses go through the first 4 T bytes of dlogits (T x vocab_t of 2 or 4
  // bytes, vocab_t >= 2), written in full by the backward below, as the untiled loss does.
  const int dlogits = op.writes.at(0);
  be.xent_loss(static_cast<float*>(ptr(dlogits)), row_max, sums, sums + T, labels, T);
  add_losses(static_cast<const float*>(ptr(dlogits)), labels);
  const float dloss = cfg->loss_scale / static_cast<float>(cfg->tokens_per_step);
  be.xent_backward_typed(ptr(dlogits), ptr(logits), dt, row_max, sums, labels, T, vocab_t,
                         vocab_start, dloss);
  if (cfg->inject_overflow) inject_inf(ptr(dlogits), prog.buffers[dlogits].dtype);
}

// ---- Element-wise ops: norms, activations, residual adds.

// Forward reads {x, w} writes {y}; backward reads {x, dy[, dres], w} writes {dx, dw}.
void Executor::Impl::run_norm(const Op& op) {
  const int w = op.reads.back();
  const int64_t cols = cols_of(op.reads[0]), rows = rows_of(op.reads[0]);
  const bool ln = model.norm == Norm::kLayerNorm;
  if (cols_of(w) < cols) {  // MLA's kv_norm: the latent normed, the rotary key passed on
    partial_norm(op, cols_of(w));
    return;
  }
  if (!backward(op)) {
    be.norm_forward(model.norm, W(op, 0), R(op, 0), fptr(w), ln ? fptr(w) + cols : nullptr, rows,
                    cols, norm_eps);
  } else {
    const float* dres = op.reads.size() == 4 ? R(op, 2) : nullptr;
    be.norm_backward(model.norm, W(op, 0), W(op, 1), ln ? W(op, 1) + cols : nullptr, R(op, 1),
                     R(op, 0), fptr(w), dres, rows, cols, norm_eps);
  }
}

// Forward reads {x} writes {y}; backward reads {x, dy} writes {dx} (SwiGLU: x holds both halves).
void Executor::Impl::run_activation(const Op& op) {
  if (!backward(op)) {
    const int out = op.writes[0];
    be.activation_forward(model.activation, W(op, 0), R(op, 0), rows_of(out), cols_of(out));
    return;
  }
  const int din = op.writes[0];
  const int64_t rows = rows_of(din);
  const int64_t cols = cols_of(din) / (model.activation == Activation::kSwiglu ? 2 : 1);
  be.activation_backward(model.activation, W(op, 0), R(op, 1), R(op, 0), rows, cols);
  // The dense FC1 bias gradient is formed by fc1.dw; the experts' here, per expert.
  if (op.role == OpRole::kExpertAct && op.writes.size() > 1)
    bad_op(op, "expert biases are not executed by the runtime yet");
}

// kResidualAdd: the residual adds (bias and dropout fused) and, by role, the element-wise
// rearrangements lowered as one: the K/V gradient fold, MLA's Q | K | V packing, and sums.
void Executor::Impl::run_residual(const Op& op) {
  if (op.role == OpRole::kDkvFold) {
    // dqkv's K and V columns := the K/V gradient accumulator [T x (k + v)] (under cp the
    // ring steps write dK and dV into the travelling accumulators only).
    const int dqkv = op.writes[0], home = op.reads[1];
    const int64_t kv_width = elements_[home] / T, qkv_cols = cols_of(dqkv);
    copy_rows(fptr(dqkv) + (qkv_cols - kv_width), qkv_cols, fptr(home), kv_width, T, kv_width);
    return;
  }
  if (op.role == OpRole::kQkvPack) {
    mla_pack(op);
    return;
  }
  if (op.role == OpRole::kQkvUnpack) {
    mla_unpack(op);
    return;
  }
  if (op.role == OpRole::kSum) {  // the routed and the shared experts' outputs (or gradients)
    const int out = op.writes[0];
    be.residual_forward(W(op, 0), nullptr, R(op, 0), R(op, 1), nullptr, rows_of(out), cols_of(out),
                        0.0f, 0);
    return;
  }
  const bool sp = plan.sequence_parallel && tp > 1;
  const float drop = model.dropout ? cfg->dropout_p : 0.0f;
  if (!backward(op)) {
    const int out = op.writes[0];
    uint8_t* mask = op.writes.size() > 1 ? static_cast<uint8_t*>(ptr(op.writes[1])) : nullptr;
    const float* x = op.reads.size() > 1 ? R(op, 0) : nullptr;
    const float* y = op.reads.size() > 1 ? R(op, 1) : R(op, 0);
    const float* bias = op.reads.size() > 2 ? R(op, 2) : nullptr;
    be.residual_forward(W(op, 0), mask, x, y, bias, rows_of(out), cols_of(out), mask ? drop : 0.0f,
                        seed_for(op, sp));
  } else {
    const int dy = op.writes[0];
    const uint8_t* mask =
        op.reads.size() > 1 ? static_cast<const uint8_t*>(ptr(op.reads[1])) : nullptr;
    float* db = op.writes.size() > 1 ? W(op, 1) : nullptr;
    be.residual_backward(W(op, 0), db, R(op, 0), mask, rows_of(dy), cols_of(dy),
                         mask ? drop : 0.0f);
  }
}

// ---- GEMMs: dense linears and the experts' grouped GEMMs.

// lower.h: forward reads {in, W[, b]}; backward_data {dout, W[, din to add to]}; weight
// gradients (kWeightGrad, kRouterDw) {in, dout} and write {dW[, db]}. W is [k x n] (kInOut), or
// the embedding table [n x k] used as the output layer (tied embeddings: kOutIn).
void Executor::Impl::run_linear(const Op& op) {
  auto layout_of = [&](int wbuf) {
    return prog.buffers[wbuf].role == BufferRole::kEmbeddingTable ? WeightLayout::kOutIn
                                                                  : WeightLayout::kInOut;
  };
  if (op.role == OpRole::kWeightGrad || op.role == OpRole::kRouterDw) {
    const int dw = op.writes[0];
    float* db = op.writes.size() > 1 ? W(op, 1) : nullptr;
    // The router's input: this rank's routed rows (routed_row0).
    const float* in =
        op.role == OpRole::kRouterDw
            ? R(op, 0) + routed_row0(rows_of(op.reads[0]), op.k) * cols_of(op.reads[0])
            : R(op, 0);
    be.linear_backward_weight(W(op, 0), db, in, R(op, 1), layout_of(dw), op.k, op.n, op.m);
  } else if (op.role == OpRole::kGeluFc2Dx) {
    // FC2's data gradient, then GELU's derivative at the saved pre-activation in place (the
    // unfused ops' kernels in one op; FC1's bias gradient is formed by fc1.dw).
    const int dpre = op.writes[0];
    be.linear_backward_data(W(op, 0), R(op, 0), R(op, 1), layout_of(op.reads[1]), op.m, op.k, op.n,
                            false);
    be.activation_backward(Activation::kGelu, W(op, 0), W(op, 0), R(op, 2), rows_of(dpre),
                           cols_of(dpre));
  } else if (op.backward_data) {
    // Rotary embeddings: dQ and dK back through the rotation (its transpose), in place, so
    // that this GEMM and the weight gradient after it see the gradient of the GEMM output.
    if (op.role == OpRole::kQkvDx && rotary()) rotate_qk(op.reads[0], true);
    const bool acc = op.reads.size() == 3;  // router.dx adds to the dispatch gradient
    be.linear_backward_data(W(op, 0), R(op, 0), R(op, 1), layout_of(op.reads[1]), op.m, op.k, op.n,
                            acc);
  } else {
    if (backward(op)) bad_op(op, "a backward GEMM that is neither a data nor a weight gradient");
    const float* bias = op.reads.size() > 2 ? R(op, 2) : nullptr;
    const float* in = op.role == OpRole::kRouter
                          ? R(op, 0) + routed_row0(rows_of(op.reads[0]), op.m) * op.k
                          : R(op, 0);
    be.linear_forward(W(op, 0), in, R(op, 1), layout_of(op.reads[1]), bias, op.m, op.n, op.k);
    // Plan::gemm_gelu_epilogue: the GELU of the pre-activation just written, into writes[1].
    if (op.role == OpRole::kGeluFc1)
      be.activation_forward(Activation::kGelu, W(op, 1), W(op, 0), op.m, op.n);
    // Rotary embeddings on Q and K as soon as they exist (every reader, the ring's K/V
    // sends included, sees them rotated).
    if (op.role == OpRole::kQkv && rotary()) rotate_qk(op.writes[0], false);
    if (op.role == OpRole::kHead && vocab_start + vocab_t > model.vocab)
      bad_op(op, "padded vocabulary");
  }
}

// run_expert_linear on the device path: one grouped GEMM over the routing's offsets; the
// region holds the tokens x top_k rows the routing orders.
void Executor::Impl::run_expert_linear_dev(const Op& op, Routing& r) {
  const int64_t E = model.moe.experts;
  auto u = [&](int id) { return static_cast<uint16_t*>(ptr_[id]); };
  const int in_buf = op.reads[0], out_buf = op.writes[0];
  const int64_t max_rows = std::min(rows_of(in_buf), rows_of(out_buf));
  if (max_rows < r.rows) bad_op(op, "the expert region holds fewer rows than were routed");
  if (op.role == OpRole::kWeightGrad) {
    const int dw = op.writes[0];
    float* db = op.writes.size() > 1 ? W(op, 1) : nullptr;
    be.expert_linear_backward_weight_bf16_dev(
        ptr_[dw], prog.buffers[dw].dtype, db, u(in_buf), u(op.reads[1]), r.offsets, E,
        std::min(rows_of(in_buf), rows_of(op.reads[1])), op.n, op.m);
  } else if (op.backward_data) {
    be.expert_linear_backward_data_bf16_dev(u(out_buf), u(in_buf), u(op.reads[1]), r.offsets, E,
                                            max_rows, op.k, op.n);
  } else {
    if (backward(op)) bad_op(op, "a backward GEMM that is neither a data nor a weight gradient");
    const uint16_t* bias = op.reads.size() > 2 ? u(op.reads[2]) : nullptr;
    be.expert_linear_forward_bf16_dev(u(out_buf), u(in_buf), u(op.reads[1]), bias, r.offsets, E,
                                      max_rows, op.n, op.k);
  }
}

// Rows per local expert of each block of an expert region, in order: this micro-batch's routing
// when every expert is local (one block per member of the experts' TP group when the rows were
// gathered over it); under expert parallelism, one block per sending member, each in expert
// order.
std::vector<const int64_t*> Executor::Impl::expert_blocks(const Op& op) {
  std::vector<const int64_t*> blocks;
  if (plan.ep == 1) {
    auto g = gathered_.find(ep_key(op.tags.layer, op.tags.micro_batch));
    if (g == gathered_.end())
      blocks.push_back(host_counts(routing_of(op)).data());
    else
      for (const auto& c : g->second) blocks.push_back(c.data());
  } else {
    auto it = ep_.find(ep_key(op.tags.layer, op.tags.micro_batch));
    if (it == ep_.end()) bad_op(op, "no token exchange for the expert GEMM");
    for (const auto& c : it->second.recv_counts) blocks.push_back(c.data());
  }
  return blocks;
}

// The experts' grouped GEMMs, one call per block of expert_blocks(): forward {in, W[, b]} ->
// {out}; backward_data {dout, W} -> {din}; weight gradient {in, dout} -> {dW [le x k x n][, db]}.
void Executor::Impl::run_expert_linear(const Op& op, bool typed) {
  const int64_t le = model.moe.experts / plan.ep;
  // Every expert local and its rows not gathered: typed GEMMs from the routing's device offsets
  // (no host read of the counts).
  if (typed && plan.ep == 1 && be.device_moe_routing() &&
      !gathered_.count(ep_key(op.tags.layer, op.tags.micro_batch))) {
    Routing& r = routing_of(op);
    if (r.on_device) return run_expert_linear_dev(op, r);
  }
  const std::vector<const int64_t*> blocks = expert_blocks(op);
  const int in_buf = op.reads[0], out_buf = op.writes[0];
  const int64_t in_cols = cols_of(in_buf), out_cols = cols_of(out_buf);
  // bf16 rows `row` rows into buffer `buf` of `cols` columns.
  auto rows_at = [&](int buf, int64_t row, int64_t cols) {
    return static_cast<uint16_t*>(ptr_[buf]) + row * cols;
  };
  int64_t row = 0;
  for (const int64_t* counts : blocks) {
    int64_t rows = 0;
    for (int64_t e = 0; e < le; ++e) rows += counts[e];
    if (typed) {
      if (op.role == OpRole::kWeightGrad) {
        const int dw = op.writes[0];
        float* db = op.writes.size() > 1 ? W(op, 1) : nullptr;
        be.expert_linear_backward_weight_bf16(
            ptr_[dw], prog.buffers[dw].dtype, db, rows_at(op.reads[0], row, in_cols),
            rows_at(op.reads[1], row, cols_of(op.reads[1])), counts, le, op.n, op.m);
      } else if (op.backward_data) {
        be.expert_linear_backward_data_bf16(
            rows_at(out_buf, row, out_cols), rows_at(in_buf, row, in_cols),
            rows_at(op.reads[1], 0, 0), counts, le, op.k, op.n, false);
      } else {
        if (backward(op))
          bad_op(op, "a backward GEMM that is neither a data nor a weight gradient");
        const uint16_t* bias = op.reads.size() > 2 ? rows_at(op.reads[2], 0, 0) : nullptr;
        be.expert_linear_forward_bf16(rows_at(out_buf, row, out_cols),
                                      rows_at(in_buf, row, in_cols), rows_at(op.reads[1], 0, 0),
                                      bias, counts, le, op.n, op.k);
      }
      row += rows;
      continue;
    }
    if (op.role == OpRole::kWeightGrad) {
      float* db = op.writes.size() > 1 ? W(op, 1) : nullptr;
      be.expert_linear_backward_weight(W(op, 0), db, R(op, 0) + row * in_cols,
                                       R(op, 1) + row * cols_of(op.reads[1]), counts, le, op.n,
                                       op.m);
    } else if (op.backward_data) {
      be.expert_linear_backward_data(W(op, 0) + row * out_cols, R(op, 0) + row * in_cols, R(op, 1),
                                     counts, le, op.k, op.n, false);
    } else {
      if (backward(op)) bad_op(op, "a backward GEMM that is neither a data nor a weight gradient");
      const float* bias = op.reads.size() > 2 ? R(op, 2) : nullptr;
      be.expert_linear_forward(W(op, 0) + row * out_cols, R(op, 0) + row * in_cols, R(op, 1), bias,
                               counts, le, op.n, op.k);
    }
    row += rows;
  }
}

// ---- Attention (flash or with saved probabilities; one ring step under cp > 1).

// The attention op's dims, and Q, K and V: the fused Q | K | V buffer, K and V from a received
// ring chunk (K | V per row), or, under cp > 1, the local chunk packed in the ring's layout (so
// dK/dV land in the same one; workspace the caller frees).
AttnOperands Executor::Impl::attention_operands(const Op& op, bool typed) {
  const AttnShape& a = op.attn;
  AttnOperands x;
  x.typed = typed;
  x.eb = typed ? 2 : 4;
  AttentionDims& d = x.d;
  d.batch = a.batch;
  d.seq_q = a.seq_q;
  d.seq_kv = a.seq_kv;
  d.heads = a.heads;
  d.kv_heads = a.kv_heads;
  d.head_dim = a.head_dim;
  d.v_head_dim = a.v_head_dim;
  d.window = a.window;
  d.causal = a.causal;
  d.dropout_p = a.dropout ? cfg->dropout_p : 0.0f;
  d.dropout_seed = seed_for(op, true);
  // A fused Q | K | V buffer; ring chunks hold K | V per row.
  x.q_cols = a.heads * a.head_dim;
  x.k_cols = a.kv_heads * a.head_dim;
  x.kv_width = x.k_cols + a.kv_heads * d.vd();
  const int qkv = with_role(op.reads, BufferRole::kQkv);
  if (qkv < 0) bad_op(op, "no Q | K | V buffer");
  d.ld_q = x.q_cols + x.kv_width;
  d.ld_o = a.heads * d.vd();
  x.q = ptr(qkv);
  x.k = x.at(x.q, x.q_cols);
  x.v = x.at(x.k, x.k_cols);
  d.ld_kv = d.ld_q;
  const int kv = with_role(op.reads, BufferRole::kKvChunk);
  if (kv >= 0) {
    x.step = ring_step_.at(kv);
    x.k = ptr(kv);
    x.v = x.at(x.k, x.k_cols);
    d.ld_kv = x.kv_width;
  }
  const int src = (cp_idx - x.step + cp) % cp;
  d.causal_offset = int64_t{cp_idx - src} * Sl;
  if (cp > 1 && kv < 0) {
    x.packed = be.alloc(static_cast<size_t>(T * x.kv_width * x.eb), BufferClass::kWorkspace);
    pack_kv(x.q, x.packed, x.q_cols, x.kv_width, x.eb);
    x.k = x.packed;
    x.v = x.at(x.k, x.k_cols);
    d.ld_kv = x.kv_width;
  }
  return x;
}

// Q, K, V from attention_operands(), then the forward or the backward kernel.
void Executor::Impl::run_attention(const Op& op, bool typed) {
  const AttnOperands x = attention_operands(op, typed);
  if (!backward(op))
    attention_forward(op, x);
  else
    attention_backward(op, x);
  if (x.packed) be.free(x.packed);
}

// Writes {out (absent: selective recompute of the probabilities alone)[, lse][, probs]}.
void Executor::Impl::attention_forward(const Op& op, const AttnOperands& x) {
  const int out = with_role(op.writes, BufferRole::kAttnOut);
  const int lse = with_role(op.writes, BufferRole::kAttnLse),
            probs = with_role(op.writes, BufferRole::kAttnProbs);
  void* o = out >= 0 ? ptr(out) : nullptr;
  void* tmp = nullptr;
  if (!o) {  // selective recompute of the probabilities alone
    tmp = be.alloc(static_cast<size_t>(T * x.d.ld_o * x.eb), BufferClass::kWorkspace);
    o = tmp;
  }
  float* l = lse >= 0 ? fptr(lse) : nullptr;
  if (x.typed)
    be.attention_forward_bf16(x.d, static_cast<uint16_t*>(o), l, u16(x.q), u16(x.k), u16(x.v),
                              x.step > 0);
  else
    be.attention_forward(x.d, static_cast<float*>(o), l, probs >= 0 ? fptr(probs) : nullptr,
                         f32(x.q), f32(x.k), f32(x.v), x.step > 0);
  if (tmp) be.free(tmp);
}

// Reads {out, dout[, lse][, probs][, dK/dV accumulator in]}; writes {dqkv[, dK/dV accumulator]}
// (a ring step accumulates into the travelling dK/dV).
void Executor::Impl::attention_backward(const Op& op, const AttnOperands& x) {
  const int out = with_role(op.reads, BufferRole::kAttnOut);
  const int lse = with_role(op.reads, BufferRole::kAttnLse),
            probs = with_role(op.reads, BufferRole::kAttnProbs);
  const int dout = with_role(op.reads, BufferRole::kAttnOutGrad),
            dkv_in = with_role(op.reads, BufferRole::kKvGrad);
  const int dqkv = with_role(op.writes, BufferRole::kQkvGrad),
            dkv = with_role(op.writes, BufferRole::kKvGrad);
  if (out < 0 || dout < 0 || dqkv < 0) bad_op(op, "missing attention buffers");
  void* dq = ptr(dqkv);
  void* dk = const_cast<void*>(x.at(dq, x.q_cols));
  bool acc_kv = false;
  if (dkv >= 0) {
    dk = ptr(dkv);
    if (dkv_in >= 0) {
      be.copy(dk, ptr(dkv_in), static_cast<size_t>(T * x.kv_width * x.eb));
      acc_kv = true;
    }
  }
  void* dv = const_cast<void*>(x.at(dk, x.k_cols));
  const float* l = lse >= 0 ? fptr(lse) : nullptr;
  if (x.typed)
    be.attention_backward_bf16(x.d, u16(dq), u16(dk), u16(dv), u16(ptr(dout)), u16(x.q), u16(x.k),
                               u16(x.v), u16(ptr(out)), l, x.step > 0, acc_kv);
  else
    be.attention_backward(x.d, f32(dq), f32(dk), f32(dv), fptr(dout), f32(x.q), f32(x.k), f32(x.v),
                          fptr(out), l, probs >= 0 ? fptr(probs) : nullptr, x.step > 0, acc_kv);
}

// ---- MoE: routing, dispatch to expert order, combine back.

// Forward reads {logits} writes {probs} and records the routing; backward reads {d top-k weights
// (in the [tokens x E] buffer), probs} writes {dlogits}.
void Executor::Impl::run_router(const Op& op) {
  const int64_t E = model.moe.experts, K = model.moe.top_k;
  if (!backward(op)) {
    const int probs = op.writes[0];
    const int64_t tokens = elements_[probs] / E;
    Routing r = new_routing(tokens);
    be.router_forward(fptr(probs), r.topk_idx, r.topk_w, R(op, 0), tokens, E, K, renormalize());
    permute(r, tokens);
    auto old = routing_.find(probs);
    if (old != routing_.end() && old->second.block != nullptr) be.free_routing(old->second.block);
    routing_.insert_or_assign(probs, std::move(r));
    routing_probs_[ep_key(op.tags.layer, op.tags.micro_batch)] = probs;
  } else {
    const int probs = op.reads[1];
    Routing& r = routing(op, probs);
    const int64_t tokens = elements_[probs] / E;
    be.router_backward(W(op, 0), R(op, 0), fptr(probs), r.topk_idx, tokens, E, K, renormalize());
  }
}

// The routed tokens' rows into expert order (top-k copies per token); backward sums them back.
void Executor::Impl::run_dispatch(const Op& op, bool typed) {
  const int64_t K = model.moe.top_k;
  auto u = [&](int id) { return static_cast<uint16_t*>(ptr_[id]); };
  if (!backward(op)) {  // reads {x, probs}; writes {rows in expert order}
    Routing& r = routing(op, op.reads[1]);
    const int64_t tokens = elements_[op.reads[1]] / model.moe.experts;
    const int64_t row0 = routed_row0(rows_of(op.reads[0]), tokens);
    if (typed)
      be.dispatch_forward_bf16(u(op.writes[0]), u(op.reads[0]) + row0 * h, r.row_of, tokens, K, h);
    else
      be.dispatch_forward(W(op, 0), R(op, 0) + row0 * h, r.row_of, tokens, K, h);
  } else {  // reads {d rows}; writes {dx}: the routing of this micro-batch's layer
    const int dx = op.writes[0];
    const int64_t tokens = rows_of(dx);
    const int32_t* row_of = routing_of(op).row_of;
    if (typed)
      be.dispatch_backward_bf16(u(dx), u(op.reads[0]), row_of, tokens, K, h);
    else
      be.dispatch_backward(W(op, 0), R(op, 0), row_of, tokens, K, h);
  }
}

// The experts' output rows back to token order, weighted by the top-k gates; backward gives the
// rows' and the gates' gradients.
void Executor::Impl::run_combine(const Op& op, bool typed) {
  const int64_t K = model.moe.top_k;
  auto u = [&](int id) { return static_cast<uint16_t*>(ptr_[id]); };
  if (!backward(op)) {  // reads {expert outputs, probs}; writes {y}
    Routing& r = routing(op, op.reads[1]);
    const int64_t tokens = elements_[op.reads[1]] / model.moe.experts;
    if (typed)
      be.combine_forward_bf16(u(op.writes[0]), u(op.reads[0]), r.topk_w, r.row_of, tokens, K, h);
    else
      be.combine_forward(W(op, 0), R(op, 0), r.topk_w, r.row_of, tokens, K, h);
  } else {  // reads {dy, expert outputs, probs}; writes {d expert outputs, d weights}
    Routing& r = routing(op, op.reads[2]);
    const int64_t tokens = elements_[op.reads[2]] / model.moe.experts;
    const int64_t row0 = routed_row0(rows_of(op.reads[0]), tokens);
    if (typed)
      be.combine_backward_bf16(u(op.writes[0]), W(op, 1), u(op.reads[0]) + row0 * h, u(op.reads[1]),
                               r.topk_w, r.row_of, tokens, K, h);
    else
      be.combine_backward(W(op, 0), W(op, 1), R(op, 0) + row0 * h, R(op, 1), r.topk_w, r.row_of,
                          tokens, K, h);
  }
}

}  // namespace parasol::runtime
