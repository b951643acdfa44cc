// lower: Plan -> one Program per pipeline stage (see lower.h for the conventions). A Lowerer
// builds the Program of one stage: its persistent buffers (parameters, gradients and optimizer
// state per bucket: a layer's dense or expert weights, the embedding, the head), then the
// forward and backward units of the pipeline schedule, then the optimizer step. Dependencies
// are derived from the buffers each op reads and writes as it is emitted.
#include "core/lower.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <cstring>
#include <initializer_list>

#include "core/error.h"

namespace parasol {

namespace {

// Weight slots of a layer (and of the embedding and head buckets).
enum Slot : int {
  kNorm1,
  kQkv,
  kQkvB,
  kOut,
  kOutB,
  kNorm2,
  kFc1,
  kFc1B,
  kFc2,
  kFc2B,
  kRouter,
  kEfc1,
  kEfc1B,
  kEfc2,
  kEfc2B,
  kTable,
  kPos,
  kFnorm,
  kHead,
  kSlots
};
constexpr const char* kSlotName[kSlots] = {
    "ln1",    "qkv",  "qkv.b",  "out",  "out.b",  "ln2",   "fc1", "fc1.b", "fc2", "fc2.b",
    "router", "efc1", "efc1.b", "efc2", "efc2.b", "table", "pos", "lnf",   "head"};
using WSet = std::array<int, kSlots>;  // buffer id per slot, -1 when absent
WSet no_weights() {
  WSet w;
  w.fill(-1);
  return w;
}

// Buffers one layer's backward reads, for one micro-batch.
enum SavedSlot : int {
  sX,      // layer input = norm1 input
  sXn,     // norm1 output = QKV input (sequence shard under SP)
  sQkv,    // Q, K, V
  sAo,     // attention output = out-projection input
  sLse,    // flash: softmax log-sum-exp (fp32)
  sProbs,  // materialised: softmax output
  sPmask,  // materialised with dropout: attention dropout mask
  sPdrop,  // materialised with dropout: dropped probabilities
  sAoRc,   // selective recompute (flash): recomputed attention output
  sMask1,  // residual dropout masks
  sX1,     // norm2 input
  sX1n,    // norm2 output = FC1 / router input
  sFc1,    // FC1 output(s) = activation input
  sAct,    // activation output = FC2 input
  sMask2,
  sRprobs,  // MoE: router probabilities (fp32)
  sDisp,    // MoE: dispatched tokens = expert FC1 input
  sEret,    // MoE: expert outputs returned to their tokens (router gradient)
  sSlots
};
using Saved = std::array<int, sSlots>;
Saved no_saved() {
  Saved s;
  s.fill(-1);
  return s;
}

struct Spec {
  Slot slot;
  std::vector<int64_t> shape;
};

// Parameters reduced and updated together: a layer's dense or expert weights, the embedding,
// the head.
struct Bucket {
  int layer = -1;          // model layer; -1 for the embedding and head buckets
  int chunk = 0;           // virtual pipeline chunk holding it
  const char* label = "";  // name of an embedding/head bucket
  bool expert = false;
  Group group = Group::kDpCp;
  int ways = 1;  // ranks its gradients are reduced over
  int zero = 0;  // effective ZeRO stage (0 when ways == 1)
  std::vector<Spec> specs;
  double elements = 0;         // parameters on this rank before ZeRO sharding
  int64_t shard = 0;           // parameters this rank updates
  WSet params = no_weights();  // ZeRO < 3: one buffer per weight
  WSet grads = no_weights();   // ZeRO < 2: one fp32 buffer per weight
  int param_shard = -1, grad_shard = -1, opt = -1, host_grad = -1;
  bool master_in_opt = false;  // opt row 0 is the fp32 master copy
  // Elements a ZeRO gather or scatter moves: the shards of all ways (the tail is padding).
  double padded() const { return static_cast<double>(shard) * ways; }
  std::vector<int> list(const WSet& w) const {
    std::vector<int> out;
    out.reserve(specs.size());
    for (const Spec& s : specs) out.push_back(w[s.slot]);
    return out;
  }
};

struct Unit {
  bool forward;
  int chunk, mb;
};

// The order of forward and backward units of stage `s` (Megatron's schedules).
std::vector<Unit> schedule(const Plan& p, int s) {
  const int M = p.micro_batches();
  std::vector<Unit> out;
  out.reserve(2 * static_cast<size_t>(M) * p.vpp);
  if (p.schedule == Schedule::kGpipe) {
    for (int i = 0; i < M; ++i) out.push_back({true, 0, i});
    for (int i = 0; i < M; ++i) out.push_back({false, 0, i});
    return out;
  }
  const bool inter = p.schedule == Schedule::kInterleaved;
  const int pp = p.pp, vpp = inter ? p.vpp : 1;
  const int total = M * vpp;
  const int warm =
      inter ? std::min((pp - s - 1) * 2 + (vpp - 1) * pp, total) : std::min(pp - s - 1, M);
  auto unit = [&](int k, bool fwd) -> Unit {
    if (!inter) return {fwd, 0, k};
    int c = (k / pp) % vpp;
    return {fwd, fwd ? c : vpp - 1 - c, (k / (pp * vpp)) * pp + k % pp};
  };
  for (int k = 0; k < warm; ++k) out.push_back(unit(k, true));
  for (int j = 0; j < total - warm; ++j) {
    out.push_back(unit(warm + j, true));
    out.push_back(unit(j, false));
  }
  for (int j = total - warm; j < total; ++j) out.push_back(unit(j, false));
  return out;
}

// Short names without per-op heap allocations for typical sizes.
std::string name(int layer, const char* what, int mb = -1) {
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

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Streams: compute; layer communication (TP, CP, EP); copy; data-parallel gradient and ZeRO
// traffic; pipeline sends and receives. Separate streams keep a gradient all-reduce from
// delaying the next layer's TP collective or a pipeline send (as separate NCCL streams do).
constexpr int kCompute = 0, kComm = 1, kCopy = 2, kDpComm = 3, kPpComm = 4, kStreams = 5;

int comm_stream(Group g) {
  switch (g) {
    case Group::kDp:
    case Group::kDpCp:
    case Group::kExpertDp:
      return kDpComm;
    case Group::kPp:
      return kPpComm;
    default:
      return kComm;
  }
}

class Lowerer {
 public:
  Lowerer(const Model& m, const Plan& p, int stage);
  Program run();

 private:
  // --- emission
  Buffer& buf_at(int id) { return P_.buffers[id]; }
  int buffer(std::string nm, std::vector<int64_t> shape, Dtype dt, BufferClass cls,
             bool host = false, bool persistent = false);
  int act(int layer, const char* what, std::vector<int64_t> shape, Dtype dt) {
    return buffer(name(layer, what, tags_.micro_batch), std::move(shape), dt,
                  BufferClass::kActivation);
  }
  int act(int layer, const char* what, std::vector<int64_t> shape) {
    return act(layer, what, std::move(shape), adt_);
  }
  int ws(int layer, const char* what, std::vector<int64_t> shape, Dtype dt) {
    return buffer(name(layer, what, tags_.micro_batch), std::move(shape), dt,
                  BufferClass::kWorkspace);
  }
  int ws(int layer, const char* what, std::vector<int64_t> shape) {
    return ws(layer, what, std::move(shape), adt_);
  }
  Op make(OpKind kind, int layer, const char* what, int stream);
  AttnShape attention_shape() const;  // one attention step of this rank (a cp chunk)
  static void set(std::vector<int>& to, std::initializer_list<int> ids);
  static void set(std::vector<int>& to, const std::vector<int>& ids);
  int emit(Op& op, std::initializer_list<int> extra = {});
  int gemm(int layer, const char* what, int64_t m, int64_t n, int64_t k, int64_t batch,
           std::initializer_list<int> reads, std::initializer_list<int> writes,
           bool backward_data = false, OpKind kind = OpKind::kLinear);
  int elementwise(OpKind kind, int layer, const char* what, double elements, double bytes,
                  std::initializer_list<int> reads, std::initializer_list<int> writes);
  int collective(OpKind kind, Group g, int layer, const char* what, double bytes,
                 const std::vector<int>& reads, const std::vector<int>& writes,
                 std::initializer_list<int> extra = {});
  int collective(OpKind kind, Group g, int layer, const char* what, double bytes, int read,
                 int write) {
    return collective(kind, g, layer, what, bytes, std::vector<int>{read}, std::vector<int>{write});
  }
  int p2p(OpKind kind, Group g, int peer_stage, int64_t tag, int layer, const char* what,
          double bytes, int buffer_id);
  int copy(OpKind kind, int layer, const char* what, double bytes, const std::vector<int>& reads,
           const std::vector<int>& writes, std::initializer_list<int> extra = {});
  void at(int layer, Phase phase) {
    tags_.layer = layer;
    tags_.phase = phase;
  }

  // --- tensor-parallel operators (Megatron's f and g)
  int tp_gather_in(int layer, int x, int64_t rows_full);  // SP all-gather before column-parallel
  int tp_reduce_out(int layer, int y, int64_t rows_full, const char* what);  // after row-parallel

  // --- model pieces
  void build_buckets();
  void add_bucket(Bucket b);
  int embedding_forward(int mb);
  void embedding_backward(int mb, int dy);
  void head_forward(int x, int mb);
  int head_backward(int mb);
  int layer_forward(int layer, int x, const WSet& w, Saved& sv);
  void attention_forward(int layer, Saved& sv, bool recompute);
  int layer_backward(int layer, const Saved& sv, int dy, const WSet& w, const WSet& g);
  int attention_backward(int layer, const Saved& sv, int dao);
  int moe_forward(int layer, int x1n, const WSet& w, Saved& sv);
  int moe_backward(int layer, const Saved& sv, int dres, const WSet& w, const WSet& g);
  int64_t cp_tag(int layer, int mb, int phase, int step, int kind) const;
  int64_t pp_tag(int sender_virtual, bool backward, int mb) const;

  // --- units
  void forward_unit(int chunk, int mb);
  void backward_unit(int chunk, int mb);
  void acquire(const Bucket& b, WSet& out, int dep);
  WSet layer_weights(int layer, int dep);
  WSet unit_grads(Bucket& b);
  WSet layer_grads(int layer);
  void after_backward(Bucket& b, bool last);
  void final_reduce(Bucket& b);
  Saved offload_saved(int layer, const Saved& sv);
  Saved prefetch_saved(int layer, const Saved& sv, int dep);
  void optimizer();
  void update(Bucket& b, int norm, int norm_op);
  void export_buckets();  // Program::buckets from buckets_

  const Model& m_;
  const Plan& p_;
  const int s_;
  int pp_, vpp_, V_, M_, Lc_, per_stage_, full_k_;
  int64_t t_, seq_, Sl_, T_, Tn_, h_, heads_t_, kv_heads_t_, hd_, qkv_cols_, q_cols_, kv_cols_, up_,
      ffn_t_, eff_t_, experts_, local_experts_, topk_, vocab_t_;
  Dtype adt_, wdt_;
  double eb_, wb_, drop_;
  bool sp_, flash_, bias_;
  Program P_;
  OpTags tags_;
  const char* bucket_label_ = nullptr;  // prefix of op names of an embedding/head bucket
  struct Label {                        // names the ops of bucket `b` while in scope
    Label(Lowerer* l, const Bucket& b) : l(l) {
      l->bucket_label_ = b.layer < 0 ? b.label : nullptr;
    }
    ~Label() { l->bucket_label_ = nullptr; }
    Lowerer* l;
  };
  std::vector<int> last_writer_;
  std::vector<std::array<int, kStreams>> last_reader_;
  int order_after_ = -1;   // when >= 0, every emitted op also waits for this op
  int last_compute_ = -1;  // the latest op on the compute stream

  std::vector<Bucket> buckets_;
  std::vector<std::array<int, 2>> layer_buckets_;  // stage-local layer -> dense, expert bucket
  int emb_bucket_ = -1, head_bucket_ = -1;
  std::vector<WSet> unit_grads_;  // per bucket, within the current unit
  std::vector<char> unit_grads_valid_;
  std::vector<int> backward_done_;  // per chunk: backward units emitted
  // Saved activations per (chunk, micro-batch, layer of chunk); on host when offloaded.
  std::vector<Saved> saved_;
  struct EdgeSaved {
    int tokens = -1, mask = -1;                                             // embedding
    int x = -1, xf = -1, probs = -1, labels = -1, sums = -1, row_max = -1;  // head
  };
  std::vector<EdgeSaved> emb_saved_, head_saved_;
  std::vector<int> deferred_;  // buckets whose final reduction waits for the optimizer
};

Lowerer::Lowerer(const Model& m, const Plan& p, int stage) : m_(m), p_(p), s_(stage) {
  pp_ = p.pp;
  vpp_ = p.schedule == Schedule::kInterleaved ? p.vpp : 1;
  V_ = pp_ * vpp_;
  M_ = p.micro_batches();
  per_stage_ = m.layers / pp_;
  Lc_ = per_stage_ / vpp_;
  full_k_ = p.full_recompute_layers(per_stage_);
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
  qkv_cols_ = (m.q_dim() + 2 * m.kv_dim()) / t_;
  q_cols_ = m.q_dim() / t_;
  kv_cols_ = m.kv_dim() / t_;
  up_ = m.activation == Activation::kSwiglu ? 2 : 1;
  ffn_t_ = m.ffn / t_;
  eff_t_ = m.is_moe() ? m.moe.expert_ffn / t_ : 0;
  experts_ = m.moe.experts;
  local_experts_ = m.is_moe() ? m.moe.experts / p.ep : 0;
  topk_ = m.moe.top_k;
  vocab_t_ = ceil_div(m.vocab, t_);
  adt_ = p.precision == Dtype::kFp32   ? Dtype::kFp32
         : p.precision == Dtype::kFp16 ? Dtype::kFp16
                                       : Dtype::kBf16;
  wdt_ = adt_;
  eb_ = dtype_bytes(adt_);
  wb_ = dtype_bytes(wdt_);
  drop_ = m.dropout ? 1 : 0;
  flash_ = p.flash_attention;
  bias_ = m.linear_bias;
  tags_.stage = stage;
}

// ---------------------------------------------------------------------------------------------
// Emission.

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
  last_reader_.push_back({-1, -1, -1, -1, -1});
  return P_.add_buffer(std::move(b));
}

AttnShape Lowerer::attention_shape() const {
  AttnShape a;
  a.batch = p_.micro_batch;
  a.seq_q = Sl_;
  a.seq_kv = Sl_;
  a.heads = heads_t_;
  a.kv_heads = kv_heads_t_;
  a.head_dim = hd_;
  a.causal = true;
  a.flash = flash_;
  a.dropout = m_.dropout && !flash_;
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

int Lowerer::emit(Op& op, std::initializer_list<int> extra) {
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
  std::sort(deps.begin(), deps.end());
  const int id = P_.add_op(std::move(op));
  if (st == kCompute) last_compute_ = id;
  const Op& o = P_.ops[id];
  for (int r : o.reads) last_reader_[r][st] = id;
  for (int w : o.writes) {
    last_writer_[w] = id;
    last_reader_[w] = {-1, -1, -1, -1, -1};
  }
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

int Lowerer::collective(OpKind kind, Group g, int layer, const char* what, double bytes,
                        const std::vector<int>& reads, const std::vector<int>& writes,
                        std::initializer_list<int> extra) {
  Op op = make(kind, layer, what, comm_stream(g));
  op.group = g;
  op.bytes = bytes;
  set(op.reads, reads);
  set(op.writes, writes);
  return emit(op, extra);
}

int Lowerer::p2p(OpKind kind, Group g, int peer_stage, int64_t tag, int layer, const char* what,
                 double bytes, int buffer_id) {
  Op op = make(kind, layer, what, comm_stream(g));
  op.group = g;
  op.peer_stage = peer_stage;
  op.tag = tag;
  op.bytes = bytes;
  if (kind == OpKind::kSend)
    op.reads.push_back(buffer_id);
  else
    op.writes.push_back(buffer_id);
  return emit(op);
}

int Lowerer::copy(OpKind kind, int layer, const char* what, double bytes,
                  const std::vector<int>& reads, const std::vector<int>& writes,
                  std::initializer_list<int> extra) {
  Op op = make(kind, layer, what, kCopy);
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

// ---------------------------------------------------------------------------------------------
// Tensor-parallel operators.

// f forward (and the input of a column-parallel weight gradient): under SP, all-gather the
// sequence shard into a full-sequence workspace; otherwise the input itself.
int Lowerer::tp_gather_in(int layer, int x, int64_t rows_full) {
  if (!sp_) return x;
  const int64_t cols = buf_at(x).shape.back();
  int full = ws(layer, "ag", {rows_full, cols});
  collective(OpKind::kAllGather, Group::kTp, layer, "ag", eb_ * rows_full * cols, x, full);
  return full;
}

// g forward (after a row-parallel GEMM) and f backward (after a column-parallel data gradient):
// all-reduce in place, or reduce-scatter to the sequence shard under SP.
int Lowerer::tp_reduce_out(int layer, int y, int64_t rows_full, const char* what) {
  if (t_ == 1) return y;
  const int64_t cols = buf_at(y).shape.back();
  const double bytes = eb_ * rows_full * cols;
  if (!sp_) {
    collective(OpKind::kAllReduce, Group::kTp, layer, what, bytes, y, y);
    return y;
  }
  int shard = act(layer, what, {rows_full / t_, cols});
  collective(OpKind::kReduceScatter, Group::kTp, layer, what, bytes, y, shard);
  return shard;
}

// ---------------------------------------------------------------------------------------------
// Buckets and persistent state.

void Lowerer::add_bucket(Bucket b) {
  const bool low = p_.precision != Dtype::kFp32;
  b.elements = 0;
  for (const Spec& s : b.specs) {
    double n = 1;
    for (int64_t d : s.shape) n *= static_cast<double>(d);
    b.elements += n;
  }
  b.zero = b.ways > 1 ? p_.zero : 0;
  b.shard = static_cast<int64_t>(b.zero >= 1 ? std::ceil(b.elements / b.ways) : b.elements);
  const bool host_params = p_.offload.params;
  auto bname = [&](const char* what, const char* suffix) {
    std::string n = b.layer >= 0 ? name(b.layer, what) : std::string(b.label) + "." + what;
    return n + suffix;
  };
  const int64_t padded = b.zero >= 1 ? b.shard * b.ways : 0;
  if (b.zero < 3) {
    for (const Spec& s : b.specs)
      b.params[s.slot] = buffer(bname(kSlotName[s.slot], ".w"), s.shape, wdt_, BufferClass::kParam,
                                host_params, true);
    P_.add_block(b.list(b.params), padded);
  } else {
    b.param_shard = buffer(bname(b.expert ? "experts" : "params", ".w"), {b.shard}, wdt_,
                           BufferClass::kParam, host_params, true);
  }
  if (b.zero < 2) {
    for (const Spec& s : b.specs)
      b.grads[s.slot] = buffer(bname(kSlotName[s.slot], ".g"), s.shape, Dtype::kFp32,
                               BufferClass::kGrad, false, true);
    P_.add_block(b.list(b.grads), padded);
  } else {
    b.grad_shard = buffer(bname(b.expert ? "experts" : "params", ".g"), {b.shard}, Dtype::kFp32,
                          BufferClass::kGrad, false, true);
  }
  // The fp32 master weights live in the optimizer state unless the parameters themselves are
  // fp32 and where the optimizer runs.
  b.master_in_opt = low || p_.offload.optimizer || p_.offload.params;
  b.opt = buffer(bname(b.expert ? "experts" : "params", ".opt"), {b.master_in_opt ? 3 : 2, b.shard},
                 Dtype::kFp32, BufferClass::kOptimizer, p_.offload.optimizer, true);
  if (p_.offload.optimizer)
    b.host_grad = buffer(bname(b.expert ? "experts" : "params", ".hg"), {b.shard}, Dtype::kFp32,
                         BufferClass::kGrad, true, true);
  buckets_.push_back(std::move(b));
}

void Lowerer::build_buckets() {
  const int64_t h = h_;
  const std::vector<int64_t> norm =
      m_.norm == Norm::kLayerNorm ? std::vector<int64_t>{2, h} : std::vector<int64_t>{h};
  const int dense_ways = p_.dp * p_.cp;
  const int expert_ways = p_.dp / p_.ep * p_.cp;
  layer_buckets_.assign(per_stage_, {-1, -1});
  for (int c = 0; c < vpp_; ++c) {
    const int v = c * pp_ + s_;
    if (v == 0) {
      Bucket b;
      b.label = "emb";
      b.chunk = c;
      b.ways = dense_ways;
      b.specs.push_back({kTable, {vocab_t_, h}});
      if (m_.learned_positions) b.specs.push_back({kPos, {m_.seq_len, h}});
      emb_bucket_ = static_cast<int>(buckets_.size());
      add_bucket(std::move(b));
    }
    for (int j = 0; j < Lc_; ++j) {
      const int layer = v * Lc_ + j;
      const bool moe = m_.is_moe_layer(layer);
      Bucket d;
      d.layer = layer;
      d.chunk = c;
      d.ways = dense_ways;
      d.specs.push_back({kNorm1, norm});
      d.specs.push_back({kQkv, {h, qkv_cols_}});
      if (bias_) d.specs.push_back({kQkvB, {qkv_cols_}});
      d.specs.push_back({kOut, {q_cols_, h}});
      if (bias_) d.specs.push_back({kOutB, {h}});
      d.specs.push_back({kNorm2, norm});
      if (!moe) {
        d.specs.push_back({kFc1, {h, up_ * ffn_t_}});
        if (bias_) d.specs.push_back({kFc1B, {up_ * ffn_t_}});
        d.specs.push_back({kFc2, {ffn_t_, h}});
        if (bias_) d.specs.push_back({kFc2B, {h}});
      } else {
        d.specs.push_back({kRouter, {h, experts_}});
      }
      layer_buckets_[c * Lc_ + j][0] = static_cast<int>(buckets_.size());
      add_bucket(std::move(d));
      if (moe) {
        Bucket e;
        e.layer = layer;
        e.chunk = c;
        e.expert = true;
        e.group = Group::kExpertDp;
        e.ways = expert_ways;
        const int64_t le = local_experts_;
        e.specs.push_back({kEfc1, {le, h, up_ * eff_t_}});
        if (bias_) e.specs.push_back({kEfc1B, {le, up_ * eff_t_}});
        e.specs.push_back({kEfc2, {le, eff_t_, h}});
        if (bias_) e.specs.push_back({kEfc2B, {le, h}});
        layer_buckets_[c * Lc_ + j][1] = static_cast<int>(buckets_.size());
        add_bucket(std::move(e));
      }
    }
    if (v == V_ - 1) {
      Bucket b;
      b.label = "head";
      b.chunk = c;
      b.ways = dense_ways;
      b.specs.push_back({kFnorm, norm});
      // Tied embeddings share the table on a single stage; with pp > 1 the last stage holds a
      // copy (Megatron), reduced like any other weight.
      if (!m_.tied_embeddings || pp_ > 1) b.specs.push_back({kHead, {h, vocab_t_}});
      head_bucket_ = static_cast<int>(buckets_.size());
      add_bucket(std::move(b));
    }
  }
}

// Device buffers holding bucket `b`'s weights for one use: the persistent ones, or per-use
// copies gathered (ZeRO-3) and/or prefetched from host memory (parameter offload). `dep`: an
// op the first copy/gather waits for (keeps it one use ahead); -1 for none.
void Lowerer::acquire(const Bucket& b, WSet& out, int dep) {
  Label label(this, b);
  if (b.zero < 3 && !p_.offload.params) {
    for (const Spec& s : b.specs) out[s.slot] = b.params[s.slot];
    return;
  }
  const int layer = b.layer;
  std::vector<int> dev;
  dev.reserve(b.specs.size());
  for (const Spec& s : b.specs) {
    out[s.slot] = buffer(name(layer, kSlotName[s.slot], tags_.micro_batch), s.shape, wdt_,
                         BufferClass::kParam);
    dev.push_back(out[s.slot]);
  }
  P_.add_block(dev, b.zero >= 3 ? b.shard * b.ways : 0);
  if (b.zero < 3) {
    copy(OpKind::kPrefetch, layer, b.expert ? "experts.prefetch" : "w.prefetch", wb_ * b.elements,
         b.list(b.params), dev, {dep});
    return;
  }
  int src = b.param_shard;
  if (p_.offload.params) {
    int d = buffer(name(layer, "shard", tags_.micro_batch), {b.shard}, wdt_, BufferClass::kParam);
    copy(OpKind::kPrefetch, layer, "shard.prefetch", wb_ * b.shard, {src}, {d}, {dep});
    src = d;
    dep = -1;
  }
  collective(OpKind::kAllGather, b.group, layer, b.expert ? "experts.ag" : "w.ag", wb_ * b.padded(),
             {src}, dev, {dep});
}

WSet Lowerer::layer_weights(int local, int dep) {
  WSet w = no_weights();
  for (int bi : layer_buckets_[local])
    if (bi >= 0) acquire(buckets_[bi], w, dep);
  return w;
}

// Gradient buffers of bucket `b` for the current unit: persistent (ZeRO < 2) or per-micro-batch
// buffers that a reduce-scatter folds into the shard.
WSet Lowerer::unit_grads(Bucket& b) {
  if (b.zero < 2) return b.grads;
  const int bi = static_cast<int>(&b - buckets_.data());
  if (unit_grads_valid_[bi]) return unit_grads_[bi];
  WSet g = no_weights();
  for (const Spec& s : b.specs)
    g[s.slot] = buffer(name(b.layer, kSlotName[s.slot], tags_.micro_batch) + ".g", s.shape,
                       Dtype::kFp32, BufferClass::kGrad);
  P_.add_block(b.list(g), b.shard * b.ways);
  unit_grads_[bi] = g;
  unit_grads_valid_[bi] = 1;
  return g;
}

WSet Lowerer::layer_grads(int local) {
  WSet g = no_weights();
  for (int bi : layer_buckets_[local]) {
    if (bi < 0) continue;
    WSet part = unit_grads(buckets_[bi]);
    for (const Spec& s : buckets_[bi].specs) g[s.slot] = part[s.slot];
  }
  return g;
}

// After bucket `b`'s gradients of one micro-batch are complete: ZeRO >= 2 reduce-scatters them
// now; ZeRO 0/1 reduce after the last micro-batch (overlapped with the rest of the backward).
void Lowerer::after_backward(Bucket& b, bool last) {
  Label label(this, b);
  const int layer = b.layer;
  if (b.zero >= 2) {
    const int bi = static_cast<int>(&b - buckets_.data());
    collective(OpKind::kReduceScatter, b.group, layer, b.expert ? "experts.g.rs" : "g.rs",
               4.0 * b.padded(), b.list(unit_grads_[bi]), {b.grad_shard});
    if (last && p_.offload.optimizer)
      copy(OpKind::kOffload, layer, "g.offload", 4.0 * b.shard, {b.grad_shard}, {b.host_grad});
    return;
  }
  if (!last) return;
  if (!p_.overlap_grad_reduce) {
    deferred_.push_back(static_cast<int>(&b - buckets_.data()));
    return;
  }
  final_reduce(b);
}

void Lowerer::final_reduce(Bucket& b) {
  Label label(this, b);
  const int layer = b.layer;
  const std::vector<int> g = b.list(b.grads);
  if (b.zero == 0 && b.ways > 1)
    collective(OpKind::kAllReduce, b.group, layer, b.expert ? "experts.g.ar" : "g.ar",
               4.0 * b.elements, g, g);
  else if (b.zero == 1)
    collective(OpKind::kReduceScatter, b.group, layer, b.expert ? "experts.g.rs" : "g.rs",
               4.0 * b.padded(), g, g);
  if (p_.offload.optimizer)
    copy(OpKind::kOffload, layer, "g.offload", 4.0 * b.shard, g, {b.host_grad});
}

// ---------------------------------------------------------------------------------------------
// Embedding and head.

int Lowerer::embedding_forward(int mb) {
  at(-1, Phase::kForward);
  WSet w = no_weights();
  acquire(buckets_[emb_bucket_], w, -1);
  EdgeSaved& es = emb_saved_[mb];
  es.tokens =
      buffer(name(-1, "tokens", mb), {p_.micro_batch, Sl_}, Dtype::kFp32, BufferClass::kActivation);
  int emb = act(-1, "emb", {T_, h_});
  elementwise(OpKind::kEmbedding, -1, "emb", double(T_) * h_, 2 * eb_ * T_ * h_,
              {es.tokens, w[kTable], w[kPos]}, {emb});
  int x = tp_reduce_out(-1, emb, T_, "emb.tp");
  if (m_.dropout) {
    int out = act(-1, "emb.out", {Tn_, h_});
    es.mask = act(-1, "emb.mask", {Tn_, h_}, Dtype::kFp8);
    elementwise(OpKind::kResidualAdd, -1, "emb.drop", double(Tn_) * h_, (2 * eb_ + 1) * Tn_ * h_,
                {x}, {out, es.mask});
    x = out;
  }
  return x;
}

void Lowerer::embedding_backward(int mb, int dy) {
  at(-1, Phase::kBackward);
  EdgeSaved& es = emb_saved_[mb];
  if (es.mask >= 0) {
    int d = act(-1, "emb.dx", {Tn_, h_});
    elementwise(OpKind::kResidualAdd, -1, "emb.drop", double(Tn_) * h_,
                2 * (2 * eb_ + 1) * Tn_ * h_, {dy, es.mask}, {d});
    dy = d;
  }
  int full = tp_gather_in(-1, dy, T_);
  Bucket& b = buckets_[emb_bucket_];
  WSet g = unit_grads(b);
  elementwise(OpKind::kEmbedding, -1, "emb", double(T_) * h_, 3 * eb_ * T_ * h_, {full, es.tokens},
              {g[kTable], g[kPos]});
}

void Lowerer::head_forward(int x, int mb) {
  at(-1, Phase::kForward);
  WSet w = no_weights();
  acquire(buckets_[head_bucket_], w, -1);
  if (w[kHead] < 0) acquire(buckets_[emb_bucket_], w, -1);
  const int head = w[kHead] >= 0 ? w[kHead] : w[kTable];
  EdgeSaved& hs = head_saved_[mb];
  hs.x = x;
  hs.xf = act(-1, "lnf", {Tn_, h_});
  elementwise(OpKind::kNorm, -1, "lnf", double(Tn_) * h_, 2 * eb_ * Tn_ * h_, {x, w[kFnorm]},
              {hs.xf});
  int in = tp_gather_in(-1, hs.xf, T_);
  int logits = ws(-1, "logits", {T_, vocab_t_});
  gemm(-1, "head", T_, vocab_t_, h_, 1, {in, head}, {logits});
  hs.labels =
      buffer(name(-1, "labels", mb), {p_.micro_batch, Sl_}, Dtype::kFp32, BufferClass::kActivation);
  hs.probs = act(-1, "softmax", {T_, vocab_t_}, Dtype::kFp32);
  // Vocab-parallel loss (Megatron): the row maximum is reduced with max over TP first, then the
  // shifted sum of exponentials and the target logit with a sum; the backward normalises the
  // exponentials by the global sum.
  hs.row_max = act(-1, "ce.max", {T_}, Dtype::kFp32);
  const int row_max = hs.row_max;
  elementwise(OpKind::kCrossEntropy, -1, "xent.max", double(T_) * vocab_t_, eb_ * T_ * vocab_t_,
              {logits}, {row_max});
  if (t_ > 1) {
    const int op =
        collective(OpKind::kAllReduce, Group::kTp, -1, "xent.max.ar", 4.0 * T_, row_max, row_max);
    P_.ops[op].reduce_max = true;
  }
  hs.sums = act(-1, "ce.sums", {2, T_}, Dtype::kFp32);
  elementwise(OpKind::kCrossEntropy, -1, "xent", double(T_) * vocab_t_, (eb_ + 4) * T_ * vocab_t_,
              {logits, hs.labels, row_max}, {hs.probs, hs.sums});
  if (t_ > 1) collective(OpKind::kAllReduce, Group::kTp, -1, "xent.ar", 8.0 * T_, hs.sums, hs.sums);
}

int Lowerer::head_backward(int mb) {
  at(-1, Phase::kBackward);
  EdgeSaved& hs = head_saved_[mb];
  int dlogits = ws(-1, "dlogits", {T_, vocab_t_});
  elementwise(OpKind::kCrossEntropy, -1, "xent", double(T_) * vocab_t_, (4 + eb_) * T_ * vocab_t_,
              {hs.probs, hs.labels, hs.sums, hs.row_max}, {dlogits});
  WSet w = no_weights();
  acquire(buckets_[head_bucket_], w, -1);
  const bool own = w[kHead] >= 0;
  if (!own) acquire(buckets_[emb_bucket_], w, -1);
  const int head = own ? w[kHead] : w[kTable];
  int in = tp_gather_in(-1, hs.xf, T_);
  int dxp = ws(-1, "head.dx", {T_, h_});
  gemm(-1, "head.dx", T_, h_, vocab_t_, 1, {dlogits, head}, {dxp}, true);
  int dxf = tp_reduce_out(-1, dxp, T_, "head.dx.tp");
  WSet g = unit_grads(buckets_[head_bucket_]);
  const int ghead = own ? g[kHead] : unit_grads(buckets_[emb_bucket_])[kTable];
  gemm(-1, "head.dw", h_, vocab_t_, T_, 1, {in, dlogits}, {ghead});
  int dy = act(-1, "lnf.dx", {Tn_, h_});
  elementwise(OpKind::kNorm, -1, "lnf", double(Tn_) * h_, 4 * eb_ * Tn_ * h_,
              {hs.x, dxf, w[kFnorm]}, {dy, g[kFnorm]});
  return dy;
}

// ---------------------------------------------------------------------------------------------
// One decoder layer.

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
    // The K/V gradient of the chunk in hand travels on with it; after the last step it goes
    // home to the chunk's owner (the next rank), which folds it into its dQKV.
    int dkv = cp > 1 ? ws(layer, "dkv", {2, T_, kv_cols_}) : -1;
    Op op = make(OpKind::kAttention, layer, "attn", kCompute);
    op.attn = a;
    op.flops = flops;
    op.elements = double(T_) * q_cols_;
    set(op.reads, {sv[sQkv], kv, out, sv[sLse], sv[sProbs], sv[sPmask], sv[sPdrop], dao, dkv_in});
    set(op.writes, {dqkv, dkv});
    emit(op);
    if (j < cp - 1) {
      int recv = ws(layer, "dkv", {2, T_, kv_cols_});
      p2p(OpKind::kSend, Group::kCp, -1, cp_tag(layer, mb, 1, j, 1), layer, "dkv.send", kv_bytes,
          dkv);
      p2p(OpKind::kRecv, Group::kCp, -1, cp_tag(layer, mb, 1, j, 1), layer, "dkv.recv", kv_bytes,
          recv);
      dkv_in = recv;
    } else if (cp > 1) {
      int home = ws(layer, "dkv", {2, T_, kv_cols_});
      p2p(OpKind::kSend, Group::kCp, -1, cp_tag(layer, mb, 1, j, 1), layer, "dkv.send", kv_bytes,
          dkv);
      p2p(OpKind::kRecv, Group::kCp, -1, cp_tag(layer, mb, 1, j, 1), layer, "dkv.recv", kv_bytes,
          home);
      elementwise(OpKind::kResidualAdd, layer, "dkv.fold", 2.0 * T_ * kv_cols_, 3 * kv_bytes,
                  {dqkv, home}, {dqkv});
    }
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
  int y;
  if (m_.is_moe_layer(layer)) {
    y = moe_forward(layer, sv[sX1n], w, sv);
  } else {
    in = tp_gather_in(layer, sv[sX1n], T_);
    sv[sFc1] = act(layer, "fc1", {T_, up_ * ffn_t_});
    gemm(layer, "fc1", T_, up_ * ffn_t_, h_, 1, {in, w[kFc1], w[kFc1B]}, {sv[sFc1]});
    sv[sAct] = act(layer, "act", {T_, ffn_t_});
    elementwise(OpKind::kActivation, layer, "act", double(T_) * ffn_t_,
                (up_ + 1) * eb_ * T_ * ffn_t_, {sv[sFc1]}, {sv[sAct]});
    int o2 = ws(layer, "fc2", {T_, h_});
    gemm(layer, "fc2", T_, h_, ffn_t_, 1, {sv[sAct], w[kFc2]}, {o2});
    y = tp_reduce_out(layer, o2, T_, "fc2.tp");
  }
  int x2 = act(layer, "res2", {Tn_, h_});
  if (m_.dropout) sv[sMask2] = act(layer, "mask2", {Tn_, h_}, Dtype::kFp8);
  elementwise(OpKind::kResidualAdd, layer, "res2", nh, (3 * eb_ + drop_) * nh,
              {sv[sX1], y, w[kFc2B]}, {x2, sv[sMask2]});
  return x2;
}

// Router, dispatch, all-to-all over ep, (SP: all-gather over tp), grouped expert MLP, (reduce
// over tp), all-to-all back, combine. Returns the MoE output on the norm region's rows.
int Lowerer::moe_forward(int layer, int x1n, const WSet& w, Saved& sv) {
  const int64_t E = experts_, K = topk_, le = local_experts_;
  const int64_t routed_n = Tn_ * K;  // rows this rank routes
  const int64_t R = T_ * K;          // rows of the expert region (gathered over tp)
  const int64_t rows = ceil_div(R, le);
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

int Lowerer::moe_backward(int layer, const Saved& sv, int dres, const WSet& w, const WSet& g) {
  const int64_t E = experts_, K = topk_, le = local_experts_;
  const int64_t routed_n = Tn_ * K, R = T_ * K, rows = ceil_div(R, le);
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

int Lowerer::layer_backward(int layer, const Saved& sv, int dy, const WSet& w, const WSet& g) {
  const double nh = double(Tn_) * h_;
  // Residual 2 (and the FC2 bias, added there).
  int dres2 = act(layer, "res2.dx", {Tn_, h_});
  elementwise(OpKind::kResidualAdd, layer, "res2", nh, 2 * (3 * eb_ + drop_) * nh, {dy, sv[sMask2]},
              {dres2, g[kFc2B]});
  int dx1n;
  if (m_.is_moe_layer(layer)) {
    dx1n = moe_backward(layer, sv, dres2, w, g);
  } else {
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
    dx1n = tp_reduce_out(layer, dxp, T_, "fc1.dx.tp");  // conjugate of f
    gemm(layer, "fc1.dw", h_, up_ * ffn_t_, T_, 1, {in, dfc1}, {g[kFc1], g[kFc1B]});
  }
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

// ---------------------------------------------------------------------------------------------
// Activation offload.

Saved Lowerer::offload_saved(int layer, const Saved& sv) {
  Saved host = no_saved();
  std::vector<int> from, to;
  double bytes = 0;
  for (int i = 0; i < sSlots; ++i) {
    if (sv[i] < 0) continue;
    const Buffer& b = buf_at(sv[i]);
    std::string nm = b.name + ".h";
    std::vector<int64_t> shape = b.shape;
    Dtype dt = b.dtype;
    bytes += b.bytes();
    host[i] = buffer(std::move(nm), std::move(shape), dt, BufferClass::kActivation, true);
    from.push_back(sv[i]);
    to.push_back(host[i]);
  }
  copy(OpKind::kOffload, layer, "act.offload", bytes, from, to);
  return host;
}

Saved Lowerer::prefetch_saved(int layer, const Saved& host, int dep) {
  Saved dev = no_saved();
  std::vector<int> from, to;
  double bytes = 0;
  for (int i = 0; i < sSlots; ++i) {
    if (host[i] < 0) continue;
    const Buffer& b = buf_at(host[i]);
    std::string nm = b.name.substr(0, b.name.size() - 2);
    std::vector<int64_t> shape = b.shape;
    Dtype dt = b.dtype;
    bytes += b.bytes();
    dev[i] = buffer(std::move(nm), std::move(shape), dt, BufferClass::kActivation);
    from.push_back(host[i]);
    to.push_back(dev[i]);
  }
  copy(OpKind::kPrefetch, layer, "act.prefetch", bytes, from, to, {dep});
  return dev;
}

// ---------------------------------------------------------------------------------------------
// Units of the schedule.

void Lowerer::forward_unit(int c, int mb) {
  tags_.chunk = c;
  tags_.micro_batch = mb;
  const int v = c * pp_ + s_;
  int x;
  if (v == 0) {
    x = embedding_forward(mb);
  } else {
    at(-1, Phase::kForward);
    const int peer = (s_ - 1 + pp_) % pp_;
    const int64_t tag = pp_tag(v - 1, false, mb);
    if (t_ > 1 && !sp_) {
      // Megatron's scatter/gather: each TP rank receives 1/tp and the TP group all-gathers.
      int part = ws(-1, "recv", {ceil_div(T_, t_), h_});
      p2p(OpKind::kRecv, Group::kPp, peer, tag, -1, "recv", eb_ * T_ * h_ / t_, part);
      x = act(-1, "x", {T_, h_});
      collective(OpKind::kAllGather, Group::kTp, -1, "recv.ag", eb_ * T_ * h_, part, x);
    } else {
      x = act(-1, "x", {Tn_, h_});
      p2p(OpKind::kRecv, Group::kPp, peer, tag, -1, "recv", eb_ * Tn_ * h_, x);
    }
  }
  // Layers, each use's weights acquired one layer ahead.
  std::vector<WSet> w(Lc_);
  auto acquire_use = [&](int j, int dep) {
    at(v * Lc_ + j, Phase::kForward);
    w[j] = layer_weights(c * Lc_ + j, dep);
  };
  const bool ahead = p_.overlap_param_gather;
  if (Lc_ > 0 && ahead) acquire_use(0, -1);
  int prev_last = -1;
  for (int j = 0; j < Lc_; ++j) {
    if (!ahead) acquire_use(j, -1);
    if (ahead && j + 1 < Lc_) acquire_use(j + 1, prev_last);
    const int layer = v * Lc_ + j;
    at(layer, Phase::kForward);
    Saved sv;
    int out = layer_forward(layer, x, w[j], sv);
    prev_last = static_cast<int>(P_.ops.size()) - 1;
    Saved keep = no_saved();
    if (c * Lc_ + j < full_k_) {
      keep[sX] = sv[sX];
    } else {
      keep = sv;
      if (p_.recompute == Recompute::kSelective && !flash_)
        keep[sProbs] = keep[sPmask] = keep[sPdrop] = -1;
    }
    if (p_.offload.activations) keep = offload_saved(layer, keep);
    saved_[(static_cast<size_t>(c) * M_ + mb) * Lc_ + j] = keep;
    x = out;
  }
  if (v == V_ - 1) {
    head_forward(x, mb);
  } else {
    at(-1, Phase::kForward);
    const int peer = (s_ + 1) % pp_;
    const double bytes = t_ > 1 && !sp_ ? eb_ * T_ * h_ / t_ : eb_ * Tn_ * h_;
    p2p(OpKind::kSend, Group::kPp, peer, pp_tag(v, false, mb), -1, "send", bytes, x);
  }
}

void Lowerer::backward_unit(int c, int mb) {
  tags_.chunk = c;
  tags_.micro_batch = mb;
  std::fill(unit_grads_valid_.begin(), unit_grads_valid_.end(), 0);
  const int v = c * pp_ + s_;
  const bool last = ++backward_done_[c] == M_;
  int dy;
  if (v == V_ - 1) {
    dy = head_backward(mb);
    Bucket& hb = buckets_[head_bucket_];
    at(-1, Phase::kBackward);
    after_backward(hb, last);
  } else {
    at(-1, Phase::kBackward);
    const int peer = (s_ + 1) % pp_;
    const int64_t tag = pp_tag(v + 1, true, mb);
    if (t_ > 1 && !sp_) {
      int part = ws(-1, "recv", {ceil_div(T_, t_), h_});
      p2p(OpKind::kRecv, Group::kPp, peer, tag, -1, "recv", eb_ * T_ * h_ / t_, part);
      dy = act(-1, "dy", {T_, h_});
      collective(OpKind::kAllGather, Group::kTp, -1, "recv.ag", eb_ * T_ * h_, part, dy);
    } else {
      dy = act(-1, "dy", {Tn_, h_});
      p2p(OpKind::kRecv, Group::kPp, peer, tag, -1, "recv", eb_ * Tn_ * h_, dy);
    }
  }
  // Uses in order: for each layer (last first) its recompute (full) and its backward.
  struct Use {
    int j;
    bool recompute;
  };
  std::vector<Use> uses;
  uses.reserve(2 * Lc_);
  for (int j = Lc_ - 1; j >= 0; --j) {
    if (c * Lc_ + j < full_k_) uses.push_back({j, true});
    uses.push_back({j, false});
  }
  struct Acquired {
    WSet w;
    Saved acts;
  };
  std::vector<Acquired> acq(uses.size());
  auto acquire_use = [&](size_t u, int dep) {
    const Use& use = uses[u];
    const int layer = v * Lc_ + use.j;
    at(layer, use.recompute ? Phase::kRecompute : Phase::kBackward);
    acq[u].w = layer_weights(c * Lc_ + use.j, dep);
    Saved& stored = saved_[(static_cast<size_t>(c) * M_ + mb) * Lc_ + use.j];
    const bool full = c * Lc_ + use.j < full_k_;
    acq[u].acts = stored;
    // Offloaded activations come back before their first use (the recompute under full).
    if (p_.offload.activations && (use.recompute || !full))
      acq[u].acts = prefetch_saved(layer, stored, dep);
  };
  const bool ahead = p_.overlap_param_gather;
  if (!uses.empty() && ahead) acquire_use(0, -1);
  int prev_last = -1;
  Saved recomputed = no_saved();
  for (size_t u = 0; u < uses.size(); ++u) {
    if (!ahead) acquire_use(u, -1);
    if (ahead && u + 1 < uses.size()) acquire_use(u + 1, prev_last);
    const Use& use = uses[u];
    const int local = c * Lc_ + use.j;
    const int layer = v * Lc_ + use.j;
    if (use.recompute) {
      at(layer, Phase::kRecompute);
      layer_forward(layer, acq[u].acts[sX], acq[u].w, recomputed);
    } else {
      Saved sv = local < full_k_ ? recomputed : acq[u].acts;
      if (p_.recompute == Recompute::kSelective) {
        at(layer, Phase::kRecompute);
        attention_forward(layer, sv, true);
      }
      at(layer, Phase::kBackward);
      WSet g = layer_grads(local);
      dy = layer_backward(layer, sv, dy, acq[u].w, g);
      for (int bi : layer_buckets_[local])
        if (bi >= 0) after_backward(buckets_[bi], last);
    }
    prev_last = static_cast<int>(P_.ops.size()) - 1;
  }
  if (v == 0) {
    embedding_backward(mb, dy);
    at(-1, Phase::kBackward);
    after_backward(buckets_[emb_bucket_], last);
  } else {
    at(-1, Phase::kBackward);
    const int peer = (s_ - 1 + pp_) % pp_;
    const double bytes = t_ > 1 && !sp_ ? eb_ * T_ * h_ / t_ : eb_ * Tn_ * h_;
    p2p(OpKind::kSend, Group::kPp, peer, pp_tag(v, true, mb), -1, "send", bytes, dy);
  }
}

// ---------------------------------------------------------------------------------------------
// Optimizer step.

// AdamW on bucket `b`'s shard and the new low-precision weights where the next step reads them.
void Lowerer::update(Bucket& b, int norm, int norm_op) {
  Label label(this, b);
  const int layer = b.layer;
  const bool cast = b.master_in_opt;  // the new weights are cast (or copied) from the master
  const bool host = p_.offload.optimizer;
  const bool host_params = p_.offload.params;
  const double n = static_cast<double>(b.shard);
  const int stream = host ? kCopy : kCompute;
  std::vector<int> grads = host         ? std::vector<int>{b.host_grad}
                           : b.zero < 2 ? b.list(b.grads)
                                        : std::vector<int>{b.grad_shard};
  // Where the new weights of this rank's shard go first: the destination itself when it lives
  // where the optimizer ran, else a staging buffer copied over.
  const bool full_params = b.zero < 3;
  const bool gather = full_params && b.zero >= 1;  // ZeRO 1/2: all-gather the updated shards
  std::vector<int> dest = full_params ? b.list(b.params) : std::vector<int>{b.param_shard};
  const bool dest_host = host_params;
  std::vector<int> first = dest;  // what the optimizer writes
  if (gather) {
    if (host) {
      first = {buffer(name(layer, "w.new") + ".h", {b.shard}, wdt_, BufferClass::kParam, true)};
    } else if (dest_host) {
      first = {buffer(name(layer, "w.new"), {b.shard}, wdt_, BufferClass::kParam)};
    }
  } else if (host != dest_host) {
    first = {buffer(name(layer, "w.new") + (host ? ".h" : ""), {b.shard}, wdt_, BufferClass::kParam,
                    host)};
  }
  Op adam = make(OpKind::kAdamW, layer, b.expert ? "experts.adamw" : "adamw", stream);
  adam.elements = n;
  adam.bytes = 28.0 * n;
  set(adam.reads, grads);
  adam.reads.push_back(b.opt);
  if (!host) adam.reads.push_back(norm);
  adam.writes.push_back(b.opt);
  if (!cast) {
    set(adam.reads, first);
    set(adam.writes, first);
  }
  emit(adam, {host ? norm_op : -1});
  if (cast) {
    Op op = make(OpKind::kCast, layer, b.expert ? "experts.cast" : "cast", stream);
    op.elements = n;
    op.bytes = (4 + wb_) * n;
    op.reads.push_back(b.opt);
    set(op.writes, first);
    emit(op);
  }
  if (gather) {
    int shard = first[0];
    if (host) {  // bring the new shard to the device (into the parameters when they live there)
      if (dest_host) {
        shard = buffer(name(layer, "w.new"), {b.shard}, wdt_, BufferClass::kParam);
        copy(OpKind::kPrefetch, layer, "w.prefetch", wb_ * n, first, {shard});
      } else {
        copy(OpKind::kPrefetch, layer, "w.prefetch", wb_ * n, first, dest);
      }
    }
    if (!dest_host) {
      const std::vector<int> src = host ? dest : first;
      collective(OpKind::kAllGather, b.group, layer, b.expert ? "experts.w.ag" : "w.ag",
                 wb_ * b.padded(), src, dest);
    } else {
      std::vector<int> full;
      for (const Spec& s : b.specs)
        full.push_back(
            buffer(name(layer, kSlotName[s.slot]) + ".new", s.shape, wdt_, BufferClass::kParam));
      P_.add_block(full, b.shard * b.ways);
      collective(OpKind::kAllGather, b.group, layer, b.expert ? "experts.w.ag" : "w.ag",
                 wb_ * b.padded(), {shard}, full);
      copy(OpKind::kOffload, layer, "w.offload", wb_ * b.elements, full, dest);
    }
  } else if (first != dest) {
    copy(dest_host ? OpKind::kOffload : OpKind::kPrefetch, layer,
         dest_host ? "w.offload" : "w.prefetch", wb_ * n, first, dest);
  }
}

void Lowerer::optimizer() {
  tags_.micro_batch = -1;
  tags_.chunk = 0;
  at(-1, Phase::kOptimizer);
  // Without overlap_grad_reduce the reductions start once the whole backward has finished.
  order_after_ = deferred_.empty() ? -1 : last_compute_;
  for (int bi : deferred_) {
    at(buckets_[bi].layer, Phase::kOptimizer);
    tags_.chunk = buckets_[bi].chunk;
    final_reduce(buckets_[bi]);
  }
  order_after_ = -1;
  at(-1, Phase::kOptimizer);
  if (sp_) {
    // Under SP each TP rank saw a different sequence shard: the replicated weights that act on
    // it (norms, routers, and the biases of row-parallel GEMMs, added after the
    // reduce-scatter) have partial gradients, summed over TP (Megatron's
    // allreduce_layernorm_grads). ZeRO-2/3 buckets fold theirs into the reduce-scattered shard.
    std::vector<int> g;
    double n = 0;
    for (const Bucket& b : buckets_) {
      if (b.zero >= 2) continue;
      for (const Spec& sp : b.specs) {
        if (sp.slot != kNorm1 && sp.slot != kNorm2 && sp.slot != kFnorm && sp.slot != kRouter &&
            sp.slot != kOutB && sp.slot != kFc2B)
          continue;
        g.push_back(b.grads[sp.slot]);
        double e = 1;
        for (int64_t d : sp.shape) e *= static_cast<double>(d);
        n += e;
      }
    }
    if (!g.empty()) collective(OpKind::kAllReduce, Group::kTp, -1, "sp.g.ar", 4 * n, g, g);
  }
  // Global gradient norm: this rank's shard, summed over the ranks holding other shards.
  Op op = make(OpKind::kGradNorm, -1, "grad.norm", kCompute);
  double n = 0;
  for (const Bucket& b : buckets_) {
    n += static_cast<double>(b.shard);
    if (b.zero < 2)
      set(op.reads, b.list(b.grads));
    else
      op.reads.push_back(b.grad_shard);
  }
  int norm = buffer("grad.norm", {1}, Dtype::kFp32, BufferClass::kWorkspace);
  op.writes.push_back(norm);
  op.elements = n;
  op.bytes = 4 * n;
  int norm_op = emit(op);
  tags_.chunk = 0;
  const bool sharded = p_.zero >= 1 || p_.ep > 1;
  if (t_ > 1) norm_op = collective(OpKind::kAllReduce, Group::kTp, -1, "norm.ar", 4, norm, norm);
  if (pp_ > 1) norm_op = collective(OpKind::kAllReduce, Group::kPp, -1, "norm.ar", 4, norm, norm);
  if (sharded && p_.dp * p_.cp > 1)
    norm_op = collective(OpKind::kAllReduce, Group::kDpCp, -1, "norm.ar", 4, norm, norm);
  for (Bucket& b : buckets_) {
    at(b.layer, Phase::kOptimizer);
    tags_.chunk = b.chunk;
    update(b, norm, norm_op);
  }
}

void Lowerer::export_buckets() {
  P_.buckets.reserve(buckets_.size());
  for (const Bucket& b : buckets_) {
    ParamBucket out;
    const std::string prefix = b.layer >= 0 ? name(b.layer, "") : std::string(b.label) + ".";
    out.name = b.layer >= 0 ? prefix.substr(0, prefix.size() - 1) + (b.expert ? ".experts" : "")
                            : std::string(b.label);
    out.layer = b.layer;
    out.chunk = b.chunk;
    out.expert = b.expert;
    out.group = b.group;
    out.ways = b.ways;
    out.zero = b.zero;
    for (const Spec& s : b.specs) out.specs.push_back({prefix + kSlotName[s.slot], s.shape});
    out.elements = static_cast<int64_t>(b.elements);
    out.shard = b.shard;
    if (b.zero < 3) out.params = b.list(b.params);
    out.param_shard = b.param_shard;
    if (b.zero < 2) out.grads = b.list(b.grads);
    out.grad_shard = b.grad_shard;
    out.opt = b.opt;
    out.master_in_opt = b.master_in_opt;
    out.host_grad = b.host_grad;
    P_.buckets.push_back(std::move(out));
  }
}

Program Lowerer::run() {
  P_.stage = s_;
  P_.streams = {StreamKind::kCompute, StreamKind::kComm, StreamKind::kCopy, StreamKind::kComm,
                StreamKind::kComm};
  const size_t est = static_cast<size_t>(M_) * per_stage_ * 60 + 1024;
  P_.ops.reserve(est);
  P_.buffers.reserve(est);
  last_writer_.reserve(est);
  last_reader_.reserve(est);
  build_buckets();
  unit_grads_.assign(buckets_.size(), no_weights());
  unit_grads_valid_.assign(buckets_.size(), 0);
  backward_done_.assign(vpp_, 0);
  saved_.assign(static_cast<size_t>(vpp_) * M_ * Lc_, no_saved());
  emb_saved_.assign(M_, {});
  head_saved_.assign(M_, {});
  for (const Unit& u : schedule(p_, s_)) {
    if (u.forward)
      forward_unit(u.chunk, u.mb);
    else
      backward_unit(u.chunk, u.mb);
  }
  optimizer();
  export_buckets();
  return std::move(P_);
}

}  // namespace

const Program& LoweredPlan::program_of(int rank) const {
  return programs.at(layout.coord(rank).pp);
}

namespace {
// Plan features the estimate prices but the lowering does not emit yet: a clear error instead
// of a Program that silently differs from the plan.
void require_lowerable(const Plan& p) {
  if (p.uneven_stages())
    throw Error("plan.stage_layers", "uneven pipeline stages are not lowered to Programs yet");
  if (p.zero == 3 && p.pp > 1)
    throw Error("plan.zero", "ZeRO-3 with pp > 1 is not lowered to Programs yet");
  if (p.reshard != Reshard::kAfterForward)
    throw Error("plan.reshard", "is not lowered to Programs yet");
  if (p.shard_degree > 0) throw Error("plan.shard_degree", "is not lowered to Programs yet");
  if (p.grad_reduce_dtype != Dtype::kFp32)
    throw Error("plan.grad_reduce_dtype", "is not lowered to Programs yet");
}
}  // namespace

Program lower_stage(const Model& model, const Plan& plan, int stage) {
  require_lowerable(plan);
  Lowerer l(model, plan, stage);
  Program p = l.run();
  RankLayout layout(plan);
  for (int r = 0; r < layout.world(); ++r)
    if (layout.coord(r).pp == stage) p.ranks.push_back(r);
  return p;
}

LoweredPlan lower(const Model& model, const Cluster& cluster, const Plan& plan) {
  (void)cluster;
  LoweredPlan out{plan, RankLayout(plan), {}};
  out.programs.reserve(plan.pp);
  for (int s = 0; s < plan.pp; ++s) out.programs.push_back(lower_stage(model, plan, s));
  return out;
}

}  // namespace parasol
