// Executor: memory units, the stream scheduler, communication, copies and the optimizer ops.
// The compute ops are in executor_ops.cc.
#include "runtime/executor.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "core/error.h"
#include "runtime/executor_impl.h"
#include "runtime/param_layout.h"
#include "runtime/tensor.h"

namespace parasol::runtime {

namespace {

using Clock = std::chrono::steady_clock;

[[noreturn]] void unsupported(const std::string& field, const std::string& reason) {
  throw Error(field, reason);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Construction: shapes, units, persistent memory.

Executor::Impl::Impl(const Model& m, const Plan& p, const Program& pr, Backend& b, CommSet& c)
    : model(m), plan(p), prog(pr), be(b), comms(c) {
  if (p.precision != Dtype::kFp32)
    unsupported("plan.precision",
                std::string("the runtime's backends store fp32 tensors (the cuda backend's GEMMs "
                            "use bf16 tensor cores); ") +
                    dtype_name(p.precision) + " plans need --precision fp32");
  if (p.grad_reduce_dtype != Dtype::kFp32)
    unsupported("plan.grad_reduce_dtype",
                std::string("the runtime reduces gradients in fp32 (its tensors' dtype); ") +
                    dtype_name(p.grad_reduce_dtype) +
                    " reductions are priced by the simulator but not emulated here: use fp32");
  if (m.is_moe() && b.name() != "cpu")
    unsupported("model.moe",
                "MoE routing is kept in host memory; only the cpu backend runs it yet");
  if (p.cp > 1 && !p.flash_attention)
    unsupported("plan.flash_attention",
                "ring attention (cp > 1) runs with flash attention only in the runtime");
  if (m.tied_embeddings && p.pp > 1)
    unsupported("model.tied_embeddings",
                "tied embeddings with pp > 1 need the embedding-gradient all-reduce between the "
                "first and last stage, which the runtime does not run yet; untie them or use pp 1");
  if (m.vocab % p.tp != 0)
    unsupported("plan.tp", "the runtime needs the vocabulary (" + std::to_string(m.vocab) +
                               ") divisible by tp (" + std::to_string(p.tp) + ")");
  const RankGroups& g = c.groups();
  tp = p.tp;
  tp_idx = g[Group::kTp].index;
  cp = p.cp;
  cp_idx = g[Group::kCp].index;
  dp_idx = g.coord.dp(grid_ep(p));
  Sl = p.seq(m) / p.cp;
  T = int64_t{p.micro_batch} * Sl;
  h = m.hidden;
  vocab_t = (m.vocab + tp - 1) / tp;
  vocab_start = int64_t{tp_idx} * vocab_t;

  const int nb = static_cast<int>(prog.buffers.size());
  elements_.resize(nb);
  ptr_.assign(nb, nullptr);
  unit_of_.assign(nb, -1);
  region_key_.assign(nb, -1);
  for (int i = 0; i < nb; ++i) elements_[i] = prog.buffers[i].elements();
  nominal_elements_ = elements_;
  if (p.ep > 1 && p.offload.activations)
    unsupported("plan.offload", "activation offload with expert parallelism is not run yet");
  // The routed rows gathered over the experts' tensor-parallel group (SP with etp = tp, or an
  // expert grid with etp > 1) vary in number per member under expert parallelism.
  if (p.ep > 1 && !expert_grid(p) && p.sequence_parallel && p.tp > 1)
    unsupported("plan.sp", "sequence parallelism with expert parallelism is not run yet");
  if (p.ep > 1 && expert_grid(p) && p.expert_tp() > 1)
    unsupported("plan.etp", "an expert grid with etp > 1 and ep > 1 is not run yet");
  for (const BufferBlock& blk : prog.blocks) {
    Unit u;
    u.buffers = blk.buffers;
    u.bytes = static_cast<size_t>(blk.bytes(prog.buffers));
    const Buffer& head = prog.buffers[blk.buffers.at(0)];
    u.host = head.host;
    u.persistent = head.persistent;
    u.cls = head.cls;
    for (int id : blk.buffers) unit_of_[id] = static_cast<int>(units_.size());
    units_.push_back(std::move(u));
  }
  for (int i = 0; i < nb; ++i) {
    if (unit_of_[i] >= 0) continue;
    const Buffer& buf = prog.buffers[i];
    Unit u;
    u.buffers = {i};
    u.bytes = static_cast<size_t>(buf.bytes());
    u.host = buf.host;
    u.persistent = buf.persistent;
    u.cls = buf.cls;
    unit_of_[i] = static_cast<int>(units_.size());
    units_.push_back(std::move(u));
  }
  // Distinct units per op, and touch counts.
  op_units_begin_.reserve(prog.ops.size() + 1);
  for (const Op& op : prog.ops) {
    op_units_begin_.push_back(static_cast<int>(op_units_.size()));
    const size_t from = op_units_.size();
    auto add = [&](int buf) {
      const int u = unit_of_[buf];
      for (size_t i = from; i < op_units_.size(); ++i)
        if (op_units_[i] == u) return;
      op_units_.push_back(u);
      ++units_[u].touches;
    };
    for (int r : op.reads) add(r);
    for (int w : op.writes) add(w);
    if (op.kind == OpKind::kGradNorm) grad_norm_buffer_ = op.writes.at(0);
    // A K/V chunk received at ring step j is attended to at step j + 1 (tags: core/lower.cc).
    if (op.kind == OpKind::kRecv && op.group == Group::kCp &&
        prog.buffers[op.writes.at(0)].role == BufferRole::kKvChunk)
      ring_step_[op.writes[0]] = static_cast<int>((op.tag / 2) % p.cp) + 1;
    // An expert-region buffer belongs to the layer and micro-batch of its first op.
    for (const std::vector<int>* ids : {&op.reads, &op.writes})
      for (int id : *ids)
        if (prog.buffers[id].role == BufferRole::kExpertRows && region_key_[id] < 0)
          region_key_[id] = ep_key(op.tags.layer, op.tags.micro_batch);
  }
  op_units_begin_.push_back(static_cast<int>(op_units_.size()));
  for (size_t bi = 0; bi < prog.buckets.size(); ++bi) {
    const ParamBucket& bk = prog.buckets[bi];
    const int i = static_cast<int>(bi);
    for (int id : bk.params) bucket_of_[id] = i;
    for (int id : bk.grads) bucket_of_[id] = i;
    for (int id : {bk.param_shard, bk.grad_shard, bk.opt, bk.host_grad})
      if (id >= 0) bucket_of_[id] = i;
  }
  for (int u = 0; u < static_cast<int>(units_.size()); ++u)
    if (units_[u].persistent) allocate(u);
  sumsq_ = static_cast<float*>(be.alloc(2 * sizeof(float), BufferClass::kWorkspace));
  scale_ = sumsq_ + 1;
}

Executor::Impl::~Impl() {
  for (int u = 0; u < static_cast<int>(units_.size()); ++u)
    if (units_[u].base != nullptr) release(u);
  be.free(sumsq_);
}

void Executor::Impl::allocate(int u) {
  Unit& unit = units_[u];
  if (unit.base != nullptr) return;
  if (plan.ep > 1 && unit.buffers.size() == 1) {
    // Expert-region buffers hold the rows actually routed here this step.
    const int id = unit.buffers[0];
    const int64_t rows = region_rows(id);
    elements_[id] = rows >= 0 ? rows * prog.buffers[id].shape.back() : nominal_elements_[id];
    unit.bytes = static_cast<size_t>(static_cast<double>(elements_[id]) *
                                     dtype_bytes(prog.buffers[id].dtype));
  }
  if (unit.bytes == 0) return;
  unit.base = unit.host ? be.alloc_host(unit.bytes, unit.cls) : be.alloc(unit.bytes, unit.cls);
  char* p = static_cast<char*>(unit.base);
  for (int id : unit.buffers) {
    ptr_[id] = p;
    p += static_cast<size_t>(static_cast<double>(elements_[id]) *
                             dtype_bytes(prog.buffers[id].dtype));
  }
  // Gradient kernels accumulate: gradient buffers start at zero (persistent ones each step).
  if (unit.persistent || unit.cls == BufferClass::kGrad) be.zero(unit.base, unit.bytes);
}

void Executor::Impl::release(int u) {
  Unit& unit = units_[u];
  if (unit.base == nullptr) return;
  if (unit.host)
    be.free_host(unit.base);
  else
    be.free(unit.base);
  unit.base = nullptr;
  for (int id : unit.buffers) ptr_[id] = nullptr;
}

void Executor::Impl::ensure(const Op& op) {
  for (int i = op_units_begin_[op.id]; i < op_units_begin_[op.id + 1]; ++i) {
    const int u = op_units_[i];
    if (units_[u].base != nullptr) continue;
    allocate(u);
    // Inputs nobody writes: the micro-batch's tokens and labels.
    for (int id : units_[u].buffers) {
      const BufferRole role = prog.buffers[id].role;
      if (role != BufferRole::kTokens && role != BufferRole::kLabels) continue;
      const int mb = op.tags.micro_batch;
      std::vector<int32_t> tokens(static_cast<size_t>(T)), labels(static_cast<size_t>(T));
      if (!cfg->batch) throw Error("run.data", "no token source for the step");
      cfg->batch(mb, tokens.data(), labels.data());
      be.copy(ptr_[id], role == BufferRole::kTokens ? tokens.data() : labels.data(),
              T * sizeof(int32_t));
    }
  }
}

void Executor::Impl::finished(const Op& op) {
  for (int i = op_units_begin_[op.id]; i < op_units_begin_[op.id + 1]; ++i) {
    const int u = op_units_[i];
    if (--live_touches_[u] == 0 && !units_[u].persistent) release(u);
  }
}

Flat Executor::Impl::flat(const std::vector<int>& ids) const {
  if (ids.empty()) return {};
  const int u = unit_of_[ids[0]];
  if (ids.size() == 1) {
    const int blk = prog.buffers[ids[0]].block;
    if (blk >= 0 && prog.blocks[blk].buffers.size() == 1)
      return {ptr_[ids[0]], prog.blocks[blk].elements};
    return {ptr_[ids[0]], elements_[ids[0]]};
  }
  const int blk = prog.buffers[ids[0]].block;
  if (blk < 0 || prog.blocks[blk].buffers != ids || units_[u].base == nullptr)
    throw Error("runtime.program",
                prog.buffers[ids[0]].name + " and " + std::to_string(ids.size() - 1) +
                    " more: a collective or copy over buffers that are not one block");
  return {ptr_[ids[0]], prog.blocks[blk].elements};
}

const ParamBucket* Executor::Impl::bucket_of(int buffer) const {
  auto it = bucket_of_.find(buffer);
  return it == bucket_of_.end() ? nullptr : &prog.buckets[it->second];
}

int Executor::Impl::group_index(const ParamBucket& b) const {
  return comms.groups()[b.group].index;
}

// The dropout site is the op's kind and role (the attention core and its recompute share one;
// the residual adds differ by role), with its layer and micro-batch.
uint64_t Executor::Impl::seed_for(const Op& op, bool per_tp_rank) const {
  uint64_t s = mix64(cfg->seed ^ mix64(static_cast<uint64_t>(cfg->step)));
  s = mix64(s ^ (static_cast<uint64_t>(op.kind) << 8 | static_cast<uint64_t>(op.role)));
  s = mix64(s ^ static_cast<uint64_t>(op.tags.layer + 1));
  s = mix64(s ^ static_cast<uint64_t>(op.tags.micro_batch + 1));
  s = mix64(s ^ (static_cast<uint64_t>(dp_idx) << 20 | static_cast<uint64_t>(cp_idx) << 10 |
                 static_cast<uint64_t>(per_tp_rank ? tp_idx : 0)));
  return s;
}

// ---------------------------------------------------------------------------------------------
// Communication.

// A transfer reads what kernels wrote: its stream waits for them (a CUDA event on the cuda
// backend; nothing to wait for on the cpu, whose kernels have finished).
void Executor::Impl::after_kernels(Communicator& comm) {
  void* fence = be.record_fence();
  comm.wait_fence(fence);
  be.release_fence(fence);
}

void Executor::Impl::copy_rows(float* dst, int64_t ld_dst, const float* src, int64_t ld_src,
                               int64_t rows, int64_t cols) {
  if (rows <= 0 || cols <= 0) return;
  if (ld_dst == cols && ld_src == cols) {
    be.copy(dst, src, static_cast<size_t>(rows * cols) * sizeof(float));
    return;
  }
  for (int64_t r = 0; r < rows; ++r)
    be.copy(dst + r * ld_dst, src + r * ld_src, static_cast<size_t>(cols) * sizeof(float));
}

void Executor::Impl::pack_kv(const float* qkv, float* kv, int64_t q_cols, int64_t kv_width) {
  copy_rows(kv, kv_width, qkv + q_cols, q_cols + kv_width, T, kv_width);
}

Request Executor::Impl::start_comm(const Op& op) {
  Communicator& comm = comms.get(op.group);
  const Dtype dt = Dtype::kFp32;  // the cpu backend's storage; bf16 communication comes with cuda
  const int64_t count = comm_count(op.kind, op.bytes, dt, comm.size());
  const int me = comm.index();
  switch (op.kind) {
    case OpKind::kAllReduce: {
      if (op.writes.size() == 1 && prog.buffers[op.writes[0]].block < 0 &&
          elements_[op.writes[0]] != nominal_elements_[op.writes[0]]) {
        // An expert-region buffer (its rows depend on the routing).
        after_kernels(comm);
        return comm.iall_reduce(ptr(op.writes[0]), elements_[op.writes[0]], dt);
      }
      const int blk = prog.buffers[op.writes[0]].block;
      if (op.writes.size() > 1 && (blk < 0 || prog.blocks[blk].buffers != op.writes)) {
        // Buffers of several buckets (the SP norm gradients): packed, reduced, unpacked.
        auto* packed =
            static_cast<float*>(be.alloc(count * sizeof(float), BufferClass::kWorkspace));
        int64_t at = 0;
        for (int id : op.writes) {
          be.copy(packed + at, ptr(id), elements_[id] * sizeof(float));
          at += elements_[id];
        }
        if (at != count) throw Error("runtime.program", op.name + ": payload is not its buffers");
        on_complete_[op.id] = [this, packed, ids = op.writes] {
          int64_t off = 0;
          for (int id : ids) {
            be.copy(ptr(id), packed + off, elements_[id] * sizeof(float));
            off += elements_[id];
          }
          be.free(packed);
        };
        after_kernels(comm);
        return comm.iall_reduce(packed, count, dt);
      }
      Flat f = flat(op.writes);
      void* base = f.base;
      if (f.elements > count) {
        // HSDP under ZeRO 1: this rank's reduce-scattered shard of the bucket's gradients.
        const ParamBucket* b = bucket_of(op.writes[0]);
        if (!b) throw Error("runtime.program", op.name + ": payload is not its buffers");
        base = f.f(int64_t{group_index(*b)} * count);
      }
      after_kernels(comm);
      return op.reduce_max ? comm.iall_reduce_max(base, count, dt)
                           : comm.iall_reduce(base, count, dt);
    }
    case OpKind::kAllGather: {
      if (plan.ep == 1 && op.role == OpRole::kDispatchGather) gather_counts(op, comm);
      Flat src = flat(op.reads), dst = flat(op.writes);
      const void* send = src.base == dst.base ? dst.f(int64_t{me} * count) : src.base;
      after_kernels(comm);
      return comm.iall_gather(send, dst.base, count, dt);
    }
    case OpKind::kReduceScatter: {
      Flat src = flat(op.reads), dst = flat(op.writes);
      if (src.base == dst.base) {
        after_kernels(comm);
        return comm.ireduce_scatter(src.base, src.f(int64_t{me} * count), count, dt);
      }
      const Buffer& out = prog.buffers[op.writes[0]];
      if (out.persistent && out.cls == BufferClass::kGrad) {
        // ZeRO 2/3: the micro-batch's gradients fold into the shard: add the shard reduced so
        // far to this rank's block of the input, then reduce-scatter over it.
        float* mine = src.f(int64_t{me} * count);
        be.residual_forward(mine, nullptr, mine, dst.f(), nullptr, 1, count, 0.0f, 0);
      }
      after_kernels(comm);
      return comm.ireduce_scatter(src.base, dst.base, count, dt);
    }
    case OpKind::kSend: {
      const int buf = op.reads.at(0);
      const void* data = ptr(buf);
      if (op.group == Group::kCp && prog.buffers[buf].role == BufferRole::kQkv) {
        // Ring attention passes K and V of the local chunk: pack them out of the fused QKV.
        const int64_t kv_width = count / T, qkv_cols = elements_[buf] / T;
        auto* staged =
            static_cast<float*>(be.alloc(count * sizeof(float), BufferClass::kWorkspace));
        pack_kv(fptr(buf), staged, qkv_cols - kv_width, kv_width);
        scratch_.push_back(staged);
        data = staged;
      } else if (elements_[buf] > count) {
        // Megatron's pipeline scatter: each tensor-parallel rank sends its 1/tp of the rows.
        data = fptr(buf) + int64_t{tp_idx} * count;
      }
      // Ring attention: the next rank, or peer_stage ranks on (core/lower.h).
      const int ahead = op.peer_stage > 0 ? op.peer_stage : 1;
      const int peer = op.group == Group::kPp ? comms.pp_peer(op.peer_stage)
                                              : comms.groups()[Group::kCp].ring(ahead);
      after_kernels(comm);
      return comm.isend(data, count, peer, op.tag, dt);
    }
    case OpKind::kRecv: {
      const int back = op.peer_stage > 0 ? op.peer_stage : 1;
      const int peer = op.group == Group::kPp ? comms.pp_peer(op.peer_stage)
                                              : comms.groups()[Group::kCp].ring(-back);
      after_kernels(comm);
      return comm.irecv(ptr(op.writes.at(0)), count, peer, op.tag, dt);
    }
    case OpKind::kAllToAll:
      return start_all_to_all(op);
    default:
      throw Error("runtime.op", std::string("not a communication op: ") + op_kind_name(op.kind));
  }
}

// ---------------------------------------------------------------------------------------------
// Copies between device and host.

void Executor::Impl::run_copy(const Op& op) {
  if (op.reads.size() == op.writes.size()) {
    bool pairwise = true;
    for (size_t i = 0; i < op.reads.size(); ++i)
      pairwise = pairwise && elements_[op.reads[i]] == elements_[op.writes[i]];
    if (pairwise) {
      for (size_t i = 0; i < op.reads.size(); ++i)
        be.copy(ptr(op.writes[i]), ptr(op.reads[i]),
                static_cast<size_t>(prog.buffers[op.writes[i]].bytes()));
      return;
    }
  }
  // A bucket's shard moving between a full list and a shard-sized buffer.
  Flat src = flat(op.reads), dst = flat(op.writes);
  const auto eb = static_cast<int64_t>(dtype_bytes(prog.buffers[op.writes[0]].dtype));
  const auto n = static_cast<int64_t>(op.bytes / static_cast<double>(eb));
  const ParamBucket* b = nullptr;
  for (int id : op.reads) b = b ? b : bucket_of(id);
  for (int id : op.writes) b = b ? b : bucket_of(id);
  const int64_t off = b ? int64_t{group_index(*b)} * n : 0;
  be.copy(static_cast<char*>(dst.base) + (dst.elements > n ? off : 0) * eb,
          static_cast<const char*>(src.base) + (src.elements > n ? off : 0) * eb, n * eb);
}

// ---------------------------------------------------------------------------------------------
// Optimizer: gradient norm, AdamW, cast.

void Executor::Impl::run_grad_norm(const Op& op) {
  float* out = fptr(op.writes.at(0));
  be.zero(out, sizeof(float));
  // Each full-tensor element counted once over the ranks the norm is reduced over
  // (runtime/param_layout.h).
  for (const ParamBucket& b : prog.buckets) {
    for (const ShardRun& r : grad_norm_runs(model, plan, comms.groups().coord, b, group_index(b))) {
      const float* g =
          b.zero >= 2 ? fptr(b.grad_shard) + r.shard_offset : fptr(b.grads[r.spec]) + r.spec_offset;
      be.grad_sumsq(out, g, r.count);
    }
  }
}

void Executor::Impl::run_adamw(const Op& op) {
  const ParamBucket* b = nullptr;
  int opt_pos = -1;
  for (size_t i = 0; i < op.reads.size() && !b; ++i)
    if (const ParamBucket* c = bucket_of(op.reads[i]); c && c->opt == op.reads[i]) {
      b = c;
      opt_pos = static_cast<int>(i);
    }
  if (!b) throw Error("runtime.program", op.name + ": AdamW without optimizer state");
  const int64_t n = b->shard, off = int64_t{group_index(*b)} * n;
  std::vector<int> grads(op.reads.begin(), op.reads.begin() + opt_pos);
  Flat g = flat(grads);
  float* opt = fptr(b->opt);
  float *param, *m, *v;
  if (b->master_in_opt) {
    param = opt;
    m = opt + n;
    v = opt + 2 * n;
  } else {
    std::vector<int> first;
    for (int w : op.writes)
      if (w != b->opt) first.push_back(w);
    Flat p = flat(first);
    param = p.f(p.elements > n ? off : 0);
    m = opt;
    v = opt + n;
  }
  if (!scale_ready_) {
    be.clip_scale(scale_, sumsq_, cfg->clip_norm);
    scale_ready_ = true;
  }
  AdamWConfig c = cfg->adamw;
  c.step = cfg->step;
  be.adamw(c, param, m, v, g.f(g.elements > n ? off : 0), n, scale_);
}

void Executor::Impl::run_cast(const Op& op) {
  const ParamBucket* b = bucket_of(op.reads.at(0));
  if (!b) throw Error("runtime.program", op.name + ": cast without optimizer state");
  const int64_t n = b->shard, off = int64_t{group_index(*b)} * n;
  Flat dst = flat(op.writes);
  const Dtype dt = prog.buffers[op.writes[0]].dtype;
  const auto eb = static_cast<int64_t>(dtype_bytes(dt));
  be.cast(static_cast<char*>(dst.base) + (dst.elements > n ? off : 0) * eb, dt, fptr(b->opt),
          Dtype::kFp32, n);
}

void Executor::Impl::after_complete(const Op& op) {
  if (auto it = on_complete_.find(op.id); it != on_complete_.end()) {
    it->second();
    on_complete_.erase(it);
  }
  // The reduced sum of squares outlives its buffer: AdamW ops on the host do not read it.
  for (int w : op.writes)
    if (w == grad_norm_buffer_) be.copy(sumsq_, ptr(w), sizeof(float));
}

// ---------------------------------------------------------------------------------------------
// The step: schedule every stream's ops in issue order as their dependencies finish.

Executor::Executor(const Model& model, const Plan& plan, const Program& program, Backend& backend,
                   CommSet& comms)
    : impl_(std::make_unique<Impl>(model, plan, program, backend, comms)), program_(program) {}

Executor::~Executor() = default;

void* Executor::data(int id) const { return impl_->ptr(id); }

int Executor::group_index(const ParamBucket& b) const { return impl_->group_index(b); }

StepResult Executor::step(const StepConfig& config) {
  Impl& im = *impl_;
  const Program& prog = program_;
  StepResult result;
  im.cfg = &config;
  im.result = &result;
  im.scale_ready_ = false;
  im.routing_.clear();
  im.ep_.clear();
  im.gathered_.clear();
  im.elements_ = im.nominal_elements_;
  im.be.zero(im.sumsq_, sizeof(float));
  im.live_touches_.resize(im.units_.size());
  for (size_t u = 0; u < im.units_.size(); ++u) im.live_touches_[u] = im.units_[u].touches;
  // Gradients accumulate over micro-batches: zero them.
  for (const ParamBucket& b : prog.buckets) {
    if (!b.grads.empty()) {
      Flat g = im.flat(b.grads);
      im.be.zero(g.base, static_cast<size_t>(g.elements) * sizeof(float));
    }
    if (b.grad_shard >= 0) im.be.zero(im.ptr(b.grad_shard), b.shard * sizeof(float));
  }

  const int n_ops = static_cast<int>(prog.ops.size());
  const int n_streams = static_cast<int>(prog.streams.size());
  std::vector<std::vector<int>> queue(n_streams);
  for (const Op& op : prog.ops) queue.at(op.stream).push_back(op.id);
  std::vector<size_t> head(n_streams, 0);
  std::vector<char> done(n_ops, 0);
  struct InFlight {
    int op;
    Request req;
    double start;
  };
  std::vector<InFlight> flying;
  std::vector<char> busy(n_streams, 0);
  // Compute and copy ops are timed by the backend's marks (device time on cuda), transfers by the
  // host clock; mark 0 and t0 are both the step's start.
  im.be.clear_marks();
  if (config.trace) im.be.mark();
  const auto t0 = Clock::now();
  auto now = [&] { return std::chrono::duration<double>(Clock::now() - t0).count(); };
  struct Marked {
    int op, start, end;
  };
  std::vector<Marked> marked;
  auto record = [&](const Op& op, double start, double end) {
    if (!config.trace) return;
    traces::TraceEvent e;
    e.rank = im.comms.world_rank();
    e.stream = op.stream;
    e.name = op.name;
    e.start_s = start;
    e.dur_s = end - start;
    e.op_id = op.id;
    e.kind = op_kind_name(op.kind);
    e.bytes = op.bytes;
    e.flops = op.flops;
    e.layer = op.tags.layer;
    e.micro_batch = op.tags.micro_batch;
    e.phase = phase_name(op.tags.phase);
    result.events.push_back(std::move(e));
  };
  auto complete = [&](const Op& op) {
    im.after_complete(op);
    im.finished(op);
    done[op.id] = 1;
  };
  // Sends are eager (core/lower.h): the stream and the ops that wait on a send go on once it is
  // issued; its buffer is kept (finished() is deferred) until the transfer completes.
  auto eager = [](const Op& op) { return op.kind == OpKind::kSend; };
  int completed = 0;
  int idle_rounds = 0;
  while (completed < n_ops) {
    bool progressed = false;
    for (size_t i = 0; i < flying.size();) {
      if (flying[i].req.test()) {
        const Op& op = prog.ops[flying[i].op];
        record(op, flying[i].start, now());
        if (eager(op)) {
          im.finished(op);
        } else {
          complete(op);
          busy[op.stream] = 0;
        }
        ++completed;
        progressed = true;
        flying.erase(flying.begin() + static_cast<long>(i));
      } else {
        ++i;
      }
    }
    for (int s = 0; s < n_streams; ++s) {
      while (!busy[s] && head[s] < queue[s].size()) {
        const Op& op = prog.ops[queue[s][head[s]]];
        bool ready = true;
        for (int d : op.deps) ready = ready && done[d];
        if (!ready) break;
        ++head[s];
        im.ensure(op);
        static const bool debug = std::getenv("PARASOL_EXEC_DEBUG") != nullptr;
        if (debug)
          std::fprintf(stderr, "[rank %d] start %d %s stream %d\n", im.comms.world_rank(), op.id,
                       op.name.c_str(), op.stream);
        const double start = now();
        const int start_mark = config.trace && !is_communication(op.kind) ? im.be.mark() : -1;
        if (is_communication(op.kind)) {
          flying.push_back({op.id, im.start_comm(op), start});
          if (eager(op))
            done[op.id] = 1;
          else
            busy[s] = 1;
        } else {
          switch (op.kind) {
            case OpKind::kOffload:
            case OpKind::kPrefetch:
              im.run_copy(op);
              break;
            case OpKind::kGradNorm:
              im.run_grad_norm(op);
              break;
            case OpKind::kAdamW:
              im.run_adamw(op);
              break;
            case OpKind::kCast:
              im.run_cast(op);
              break;
            default:
              im.run_compute(op);
          }
          if (config.trace) marked.push_back({op.id, start_mark, im.be.mark()});
          complete(op);
          ++completed;
        }
        progressed = true;
      }
    }
    if (progressed) {
      idle_rounds = 0;
      continue;
    }
    if (flying.empty())
      throw Error("runtime.program", "deadlock: no op can start and none is in flight");
    // Waiting on communication only: let the other ranks on this host run.
    if (++idle_rounds > 64) std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
  im.be.synchronize();
  for (const Marked& m : marked)
    record(prog.ops[m.op], im.be.mark_seconds(m.start), im.be.mark_seconds(m.end));
  for (void* p : im.scratch_) im.be.free(p);
  im.scratch_.clear();
  result.seconds = now();
  float sumsq = 0;
  im.be.copy(&sumsq, im.sumsq_, sizeof(float));
  result.grad_norm = std::sqrt(static_cast<double>(sumsq));
  im.cfg = nullptr;
  im.result = nullptr;
  return result;
}

}  // namespace parasol::runtime
