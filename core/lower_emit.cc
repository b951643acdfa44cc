// The Lowerer's shared state and emission helpers: the stage's shapes, buffers, ops and the
// dependencies derived from the buffers each op reads and writes, pipeline and ring tags, and
// Megatron's tensor-parallel f/g operators.
#include <algorithm>
#include <charconv>
#include <cstring>

#include "core/lower_internal.h"
#include "core/moe_load.h"
#include "core/vocab_shard.h"

namespace parasol::lowering {

// Short names without per-op heap allocations for typical sizes.
std::string name(int layer, const char* what, int mb) {
  char buf[64];
  char* p = buf;
  char* end = buf + sizeof buf;
  if (layer >= 0) {
    *p++ = 'L';
    p = std::to_chars(p, end, layer).ptr;
    *p++ = '.';
  }
  size_t n = std::min<size_t>(std::strlen(what), 40);
  std::memcpy(p, what, n);
  p += n;
  if (mb >= 0) {
    *p++ = '.';
    *p++ = 'm';
    p = std::to_chars(p, end, mb).ptr;
  }
  return std::string(buf, p);
}

int comm_stream(Group g) {
  if (is_data_parallel(g)) return kDpComm;
  return g == Group::kPp ? kPpComm : kComm;
}

Lowerer::Lowerer(const Model& m, const Plan& p, int stage, bool fp8_weight_transpose)
    : m_(m), p_(p), s_(stage), fp8_transpose_(fp8_weight_transpose) {
  pp_ = p.pp;
  vpp_ = p.schedule == Schedule::kInterleaved ? p.vpp : 1;
  V_ = pp_ * vpp_;
  M_ = p.micro_batches();
  // Uneven pipelines give each stage (or each virtual stage) its own count
  // (Plan::layers_in_chunk), in Megatron's order of virtual stages (Plan::first_layer).
  per_stage_ = p.layers_in_stage(m.layers, stage);
  full_k_ = p.full_recompute_layers(per_stage_);
  first_layer_.resize(vpp_);
  layers_in_chunk_.resize(vpp_);
  chunk_base_.assign(vpp_ + 1, 0);
  for (int c = 0; c < vpp_; ++c) {
    first_layer_[c] = p.first_layer(m.layers, stage, c);
    layers_in_chunk_[c] = p.layers_in_chunk(m.layers, stage, c);
    chunk_base_[c + 1] = chunk_base_[c] + layers_in_chunk_[c];
  }
  init_shapes();
  tags_.stage = stage;
}

// This rank's tensor shapes (tensor-, context- and expert-parallel shards) and dtypes.
void Lowerer::init_shapes() {
  const Model& m = m_;
  const Plan& p = p_;
  t_ = p.tp;
  seq_ = p.seq(m);
  Sl_ = seq_ / p.cp;
  T_ = int64_t{p.micro_batch} * Sl_;
  sp_ = p.sequence_parallel && p.tp > 1;
  Tn_ = sp_ ? T_ / t_ : T_;
  h_ = m.hidden;
  heads_t_ = m.heads / t_;
  kv_heads_t_ = m.kv_heads / t_;
  hd_ = m.head_dim;
  mla_ = m.mla.enabled();
  q_cols_ = m.q_dim() / t_;
  kv_cols_ = m.kv_dim() / t_;
  // MLA: Q and K of heads x (nope + rope) columns (kv_heads = heads), V of heads x v_head_dim.
  k_cols_ = kv_cols_;
  v_cols_ = kv_heads_t_ * m.v_head_dim();
  ao_cols_ = heads_t_ * m.v_head_dim();
  qkv_cols_ = q_cols_ + k_cols_ + v_cols_;
  up_ = m.activation == Activation::kSwiglu ? 2 : 1;
  ffn_t_ = m.ffn / t_;
  etp_ = p.expert_tp();
  grid_ = etp_ != t_;
  eff_t_ = m.is_moe() ? m.moe.expert_ffn / etp_ : 0;
  experts_ = m.moe.experts;
  local_experts_ = m.is_moe() ? m.moe.experts / p.ep : 0;
  topk_ = m.moe.top_k;
  vocab_t_ = vocab_shard(m, t_);
  adt_ = p.precision == Dtype::kFp32   ? Dtype::kFp32
         : p.precision == Dtype::kFp16 ? Dtype::kFp16
                                       : Dtype::kBf16;
  wdt_ = adt_;
  odt_ = p.optimizer_dtype == Dtype::kBf16 ? Dtype::kBf16 : Dtype::kFp32;
  gdt_ = odt_;
  // Megatron's gradient buffer (distributed/param_and_grad_buffer.py @d98e8a6,
  // group_params_for_buffers: grad_dtype = torch.float if grad_reduce_in_fp32 else param.dtype):
  // gradients reduced in a low precision accumulate in the parameters' dtype.
  gbuf_dt_ = p.grad_reduce_dtype == Dtype::kFp32 ? gdt_ : wdt_;
  ldt_ = p.precision == Dtype::kFp8 ? Dtype::kFp8 : adt_;
  eb_ = dtype_bytes(adt_);
  wb_ = dtype_bytes(wdt_);
  drop_ = m.dropout ? 1 : 0;
  kb_ = kernel_bytes(m, p);
  flash_ = p.flash_attention;
  bias_ = m.linear_bias;
  op_ac_ = p.recompute == Recompute::kSelectiveOp;
  gb_ = dtype_bytes(p.grad_reduce_dtype);
  // Routing: with an expert grid of its own every rank routes distinct tokens, its 1/tp of the
  // TP group's (its sequence shard under SP, else a slice of the replicated rows), and the
  // routed rows are gathered over the experts' TP group; otherwise the TP group routes its rows
  // together (gathered over tp under SP).
  Tm_ = grid_ ? T_ / t_ : Tn_;
  slice_ = grid_ && t_ > 1 && !sp_;
  gather_group_ = grid_ ? Group::kExpertTp : Group::kTp;
  gather_ways_ = grid_ ? etp_ : sp_ ? t_ : 1;
  hot_ =
      m.is_moe() ? moe_hot_rank_factor(m, p, static_cast<double>(Tm_ * topk_ * gather_ways_)) : 1.0;
  // megatron/core/transformer/moe/token_dispatcher.py (MoEAlltoAllTokenDispatcher): "Permutation
  // 2: Sort tokens by local expert" (sort_chunks_by_idxs in dispatch_postprocess) when
  // num_local_experts > 1, and "Unpermutation 2" in combine_preprocess; the flex dispatchers
  // (DeepEP) permute once on each side, HybridEP inside its communication kernel.
  local_sort_ =
      m.is_moe() && p.ep > 1 && local_experts_ > 1 && p.moe_dispatcher == MoeDispatcher::kAllToAll;
}

int Lowerer::buffer(std::string nm, std::vector<int64_t> shape, Dtype dt, BufferClass cls,
                    bool host, bool persistent) {
  Buffer b;
  b.name = std::move(nm);
  b.shape = std::move(shape);
  b.dtype = dt;
  b.cls = cls;
  b.host = host;
  b.persistent = persistent;
  last_writer_.push_back(-1);
  last_reader_.emplace_back().fill(-1);
  return P_.add_buffer(std::move(b));
}

AttnShape Lowerer::attention_shape(int layer) const {
  const int a2a = hierarchical_cp() ? cp_a2a_ranks(p_) : 1;
  AttnShape a = parasol::attention_shape(m_, layer, static_cast<int>(t_) * a2a, p_.micro_batch,
                                         Sl_ * a2a, Sl_ * a2a, flash_);
  if (p_.repeat_kv) a.kv_heads = a.heads;  // the kernel sees the repeated K/V heads
  return a;
}

Op Lowerer::make(OpKind kind, int layer, const char* what, int stream) {
  Op op;
  op.kind = kind;
  op.name =
      layer < 0 && bucket_label_ ? std::string(bucket_label_) + "." + what : name(layer, what);
  op.stream = stream;
  return op;
}

int Lowerer::host_sync(const char* what, std::vector<int> waits) {
  Op op = make(OpKind::kSync, -1, what, kHost);
  op.tags = tags_;
  for (int w : waits)
    if (w >= 0) op.deps.push_back(w);
  std::sort(op.deps.begin(), op.deps.end());
  return P_.add_op(std::move(op));
}

int Lowerer::main_grad_add(int dw, int tensors) {
  if (p_.gradient_accumulation_fusion) return dw;
  const Op& gemm = P_.ops[dw];
  const int grad = gemm.writes.empty() ? -1 : gemm.writes.front();
  if (grad < 0) return dw;
  const int layer = gemm.tags.layer;
  const std::string what =
      (layer < 0 ? gemm.name : gemm.name.substr(gemm.name.find('.') + 1)) + ".acc";
  // The weight's elements: the GEMM's m x n per expert.
  const double n = static_cast<double>(gemm.m) * static_cast<double>(gemm.n) *
                   static_cast<double>(std::max<int64_t>(1, gemm.batch));
  const double grad_bytes = dtype_bytes(buf_at(grad).dtype);
  // Reads the new gradient (the math dtype), reads and writes main_grad.
  const int op =
      role(OpRole::kMainGradAdd, elementwise(OpKind::kResidualAdd, layer, what.c_str(), n,
                                             n * (eb_ + 2 * grad_bytes), {grad}, {grad}));
  P_.ops[op].tensors = std::max(1, tensors);
  return dw;
}

void Lowerer::set(std::vector<int>& to, std::initializer_list<int> ids) {
  to.reserve(ids.size());
  for (int id : ids)
    if (id >= 0) to.push_back(id);
}

void Lowerer::set(std::vector<int>& to, const std::vector<int>& ids) {
  to.reserve(ids.size());
  for (int id : ids)
    if (id >= 0) to.push_back(id);
}

// Issues `op` with its dependencies: the last writer of every buffer it reads, and across
// streams the last writer and readers of every buffer it writes, plus `extra` and order_after_.
int Lowerer::emit(Op& op, std::initializer_list<int> extra) {
  if (ds_lazy_) ds_reach(op.reads);
  op.tags = tags_;
  std::vector<int>& deps = op.deps;
  auto add = [&](int d) {
    if (d < 0) return;
    for (int e : deps)
      if (e == d) return;
    deps.push_back(d);
  };
  const int st = op.stream;
  for (int r : op.reads) add(last_writer_[r]);
  for (int w : op.writes) {
    int lw = last_writer_[w];
    if (lw >= 0 && P_.ops[lw].stream != st) add(lw);
    for (int other = 0; other < kStreams; ++other)
      if (other != st) add(last_reader_[w][other]);
  }
  for (int d : extra) add(d);
  add(order_after_);
  if (st == kCompute && !chunked_gathers_.empty()) {
    for (ChunkedGather& g : chunked_gathers_) add(g.computes_seen++ == 0 ? g.head : g.rest);
    std::erase_if(chunked_gathers_, [](const ChunkedGather& g) { return g.computes_seen >= 2; });
  }
  if (st == kCompute && !next_compute_waits_.empty()) {
    for (int d : next_compute_waits_) add(d);
    next_compute_waits_.clear();
  }
  std::sort(deps.begin(), deps.end());
  const int id = P_.add_op(std::move(op));
  if (st == kCompute) last_compute_ = id;
  const Op& o = P_.ops[id];
  for (int r : o.reads) last_reader_[r][st] = id;
  for (int w : o.writes) {
    last_writer_[w] = id;
    last_reader_[w].fill(-1);
  }
  if (ds_lazy_ && !ds_reduce_of_buffer_.empty()) ds_written(std::vector<int>(o.writes));
  return id;
}

int Lowerer::gemm(int layer, const char* what, int64_t m, int64_t n, int64_t k, int64_t batch,
                  std::initializer_list<int> reads, std::initializer_list<int> writes,
                  bool backward_data, OpKind kind) {
  Op op = make(kind, layer, what, kCompute);
  op.m = m;
  op.n = n;
  op.k = k;
  op.batch = batch;
  op.flops = 2.0 * m * n * k * batch;
  op.backward_data = backward_data;
  set(op.reads, reads);
  set(op.writes, writes);
  const int amax = fp8_amax(kind, layer, what, m * k * batch, batch, backward_data, op.reads);
  return emit(op, {amax});
}

// Under fp8 current scaling (Fp8Recipe::kTensorwise) Transformer Engine computes the amax of a
// linear's fp8 operand (the forward input, the data gradient's output gradient) and its scale
// before the cast: one more read of the bf16 operand and two kernels per quantised tensor, the
// grouped experts' tensors one by one (core/plan.h Fp8Recipe). Not the router (outside fp8
// autocast), the output layer (bf16) or a weight gradient (it reuses the transposed copies).
// Returns the op (its GEMM waits for it), or -1.
int Lowerer::fp8_amax(OpKind kind, int layer, const char* what, int64_t elements, int64_t tensors,
                      bool backward_data, const std::vector<int>& reads) {
  if (p_.precision != Dtype::kFp8 || p_.fp8_recipe != Fp8Recipe::kTensorwise || fp8_exempt_ ||
      layer < 0 || reads.empty() || (kind != OpKind::kLinear && kind != OpKind::kExpertLinear))
    return -1;
  if (tags_.phase == Phase::kBackward && !backward_data) return -1;
  Op op = make(OpKind::kCast, layer, (std::string(what) + ".amax").c_str(), kCompute);
  op.role = kind == OpKind::kExpertLinear ? OpRole::kExpertFp8Amax : OpRole::kFp8Amax;
  op.elements = static_cast<double>(elements);
  op.bytes = dtype_bytes(Dtype::kBf16) * static_cast<double>(elements);
  op.tensors = static_cast<int>(std::max<int64_t>(1, tensors));
  if (kind == OpKind::kExpertLinear) op.load = hot_;
  op.reads.push_back(reads.front());
  return emit(op);
}

int Lowerer::elementwise(OpKind kind, int layer, const char* what, double elements, double bytes,
                         std::initializer_list<int> reads, std::initializer_list<int> writes) {
  Op op = make(kind, layer, what, kCompute);
  op.elements = elements;
  op.bytes = bytes;
  set(op.reads, reads);
  set(op.writes, writes);
  return emit(op);
}

int Lowerer::in_compute_order(int op) {
  std::vector<int>& deps = P_.ops[op].deps;
  if (last_compute_ >= 0 && std::find(deps.begin(), deps.end(), last_compute_) == deps.end()) {
    deps.push_back(last_compute_);
    std::sort(deps.begin(), deps.end());
  }
  next_compute_waits_.push_back(op);
  return op;
}

int Lowerer::rotary_epilogue(int op, bool backward) {
  P_.ops[op].epilogue_bytes = (backward ? kb_.rotary_backward : kb_.rotary) * double(T_) *
                              double(rotary_columns(m_)) / double(t_);
  return op;
}

int Lowerer::collective(OpKind kind, Group g, int layer, const char* what, double bytes,
                        const std::vector<int>& reads, const std::vector<int>& writes,
                        std::initializer_list<int> extra) {
  const bool expert_a2a = kind == OpKind::kAllToAll && g == Group::kEp;
  Op op = make(kind, layer, what, expert_a2a && p_.ep_comm_overlap ? kEpComm : comm_stream(g));
  op.group = g;
  op.bytes = bytes;
  set(op.reads, reads);
  set(op.writes, writes);
  const int id = emit(op, extra);
  return expert_a2a && !p_.ep_comm_overlap ? in_compute_order(id) : id;
}

int Lowerer::p2p(OpKind kind, Group g, int peer_stage, int64_t tag, int layer, const char* what,
                 double bytes, int buffer_id, std::initializer_list<int> extra) {
  Op op = make(kind, layer, what, comm_stream(g));
  op.group = g;
  op.peer_stage = peer_stage;
  op.tag = tag;
  op.p2p_group = p2p_group_;
  op.bytes = bytes;
  if (kind == OpKind::kSend)
    op.reads.push_back(buffer_id);
  else
    op.writes.push_back(buffer_id);
  return emit(op, extra);
}

int Lowerer::copy(OpKind kind, int layer, const char* what, double bytes,
                  const std::vector<int>& reads, const std::vector<int>& writes,
                  std::initializer_list<int> extra, int stream) {
  Op op = make(kind, layer, what, stream);
  op.bytes = bytes;
  set(op.reads, reads);
  set(op.writes, writes);
  return emit(op, extra);
}

int64_t Lowerer::cp_tag(int layer, int mb, int phase, int step, int kind) const {
  return ((((int64_t{layer} * M_ + mb) * 4 + phase) * p_.cp + step) * 2 + kind);
}

int64_t Lowerer::pp_tag(int sender_virtual, bool backward, int mb) const {
  return (int64_t{sender_virtual} * 2 + (backward ? 1 : 0)) * M_ + mb;
}

// f forward (and the input of a column-parallel weight gradient): under SP, all-gather the
// sequence shard into a full-sequence workspace; otherwise the input itself.
int Lowerer::tp_gather_in(int layer, int x, int64_t rows_full, bool overlapped) {
  if (!sp_) return x;
  const int64_t cols = buf_at(x).shape.back();
  int full = ws(layer, "ag", {rows_full, cols});
  const double bytes = eb_ * rows_full * cols;
  const int chunks = overlapped ? p_.tp_overlap_chunks() : 1;
  if (chunks == 1) {
    const int id = collective(OpKind::kAllGather, Group::kTp, layer, "ag", bytes, x, full);
    if (overlapped) in_compute_order(id);
    return full;
  }
  const int head = collective(OpKind::kAllGather, Group::kTp, layer, "ag", bytes / chunks, x, full);
  const int rest = collective(OpKind::kAllGather, Group::kTp, layer, "ag.rest",
                              bytes - bytes / chunks, std::vector<int>{x}, std::vector<int>{});
  chunked_gathers_.push_back({head, rest, 0});
  return full;
}

// g forward (after a row-parallel GEMM) and f backward (after a column-parallel data gradient):
// all-reduce in place, or reduce-scatter to the sequence shard under SP.
int Lowerer::tp_reduce_out(int layer, int y, int64_t rows_full, const char* what, bool overlapped,
                           bool on_path_always) {
  if (t_ == 1) return y;
  const int64_t cols = buf_at(y).shape.back();
  double bytes = eb_ * rows_full * cols;
  const OpKind kind = sp_ ? OpKind::kReduceScatter : OpKind::kAllReduce;
  const int chunks = overlapped ? p_.tp_overlap_chunks() : 1;
  const double partials_bytes = dtype_bytes(buf_at(y).dtype) * double(rows_full) * double(cols);
  const bool fused = chunks > 1 && last_compute_ >= 0;
  if (fused) {
    // The chunks before the last run beside the GEMM that produces them (y's writer, the last
    // compute op): they wait for what it waits for, and move no buffer of their own.
    Op rest = make(kind, layer, (std::string(what) + ".rest").c_str(), comm_stream(Group::kTp));
    rest.group = Group::kTp;
    rest.bytes = bytes - bytes / chunks;
    rest.deps = P_.ops[last_compute_].deps;
    emit(rest);
    bytes /= chunks;
  }
  // On the compute path unless overlapped with chunks (then the chunks before it ran beside
  // the GEMM); the data gradients' reductions (not `overlapped`) run beside the weight gradient,
  // or after it on the path (`on_path_always`, Plan::tp_impl torch).
  const bool on_path = (overlapped && chunks == 1) || on_path_always;
  if (!sp_) {
    const int id = collective(OpKind::kAllReduce, Group::kTp, layer, what, bytes, y, y);
    if (on_path) in_compute_order(id);
    return y;
  }
  int shard = act(layer, what, {rows_full / t_, cols});
  const int id = collective(OpKind::kReduceScatter, Group::kTp, layer, what, bytes, y, shard);
  if (on_path) in_compute_order(id);
  if (fused && p_.tp_impl == TpImpl::kPytorch) {
    // PyTorch's async TP exchanges the partial chunks and sums them after (core/program.h
    // OpRole::kTpPartialsSum): every partial read, the shard written, on the compute path.
    const double n = double(rows_full) * double(cols);
    role(OpRole::kTpPartialsSum,
         elementwise(OpKind::kResidualAdd, layer, (std::string(what) + ".sum").c_str(), n,
                     partials_bytes * (1.0 + 1.0 / t_), {y, shard}, {shard}));
  }
  return shard;
}

}  // namespace parasol::lowering
