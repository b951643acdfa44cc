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
#include "core/issue_graph.h"
#include "core/vocab_shard.h"
#include "runtime/comm/idle_wait.h"
#include "runtime/executor_impl.h"
#include "runtime/param_layout.h"
#include "runtime/tensor.h"

namespace parasol::runtime {

namespace {

using Clock = std::chrono::steady_clock;

bool is16(Dtype d) { return d == Dtype::kBf16 || d == Dtype::kFp16; }

[[noreturn]] void unsupported(const std::string& field, const std::string& reason) {
  throw Error(field, reason);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Construction: shapes, units, persistent memory.

Executor::Impl::Impl(const Model& m, const Plan& p, const Program& pr, Backend& b, CommSet& c)
    : model(m), plan(p), prog(pr), graph(pr), be(b), comms(c) {
  check_supported();
  init_shapes();
  build_units();
  index_ops();
  index_buckets();
  allocate_persistent();
  GraphSupport can;
  can.backend_graphs = be.records_graphs();  // CudaBackend::begin_capture / replay (cpu: none)
  can.device_moe_routing = be.device_moe_routing();
  can.executor_staging = true;  // StepConfig::stage_host_traffic (a step without it runs eagerly)
  can.comm_graphs = true;       // every communicator the step's transfers use can be captured
  for (const Op& op : prog.ops) {
    if (is_communication(op.kind) && op.tags.phase != Phase::kOptimizer)
      can.comm_graphs = can.comm_graphs && comms.get(op.group).capturable();
    if (op.kind == OpKind::kAttention && op.attn.dropout) has_dropout_ = true;
  }
  has_dropout_ = has_dropout_ || model.dropout;
  graph_ = StepGraphPolicy(step_graph_blockers(model, plan, prog, can));
}

void Executor::Impl::check_supported() const {
  const Model& m = model;
  const Plan& p = plan;
  // Mixed precision (Megatron's, torch AMP's): bf16 / fp16 parameters, activations and their
  // gradients, fp32 gradients of the parameters, fp32 master weights and optimizer state; the
  // kernels compute in fp32 on widened operands (run_widened).
  if (p.precision != Dtype::kFp32 && !is16(p.precision))
    unsupported("plan.precision", std::string("the runtime stores fp32, bf16 or fp16 tensors; ") +
                                      dtype_name(p.precision) +
                                      " plans are priced by the simulator only");
  if (p.precision != Dtype::kFp32 && p.optimizer_dtype != Dtype::kFp32)
    unsupported("plan.optimizer_dtype",
                std::string("the runtime keeps fp32 master weights and moments; ") +
                    dtype_name(p.optimizer_dtype) + " optimizer state is not run yet");
  if (p.grad_reduce_dtype != Dtype::kFp32 && p.grad_reduce_dtype != Dtype::kBf16)
    unsupported("plan.grad_reduce_dtype",
                std::string("the runtime reduces gradients in fp32 or bf16; ") +
                    dtype_name(p.grad_reduce_dtype) + " reductions are not run");
  if (m.is_moe() && p.moe_probs_in_experts)
    unsupported("plan.moe_probs_in_experts",
                "the runtime's combine scales the rows by the router's probabilities; the "
                "experts' weighted activation is priced by the simulator only");
  if (m.is_moe() && be.name() != "cpu")
    unsupported("model.moe",
                "MoE routing is kept in host memory; only the cpu backend runs it yet");
  if (p.cp > 1 && !p.flash_attention)
    unsupported("plan.flash_attention",
                "ring attention (cp > 1) runs with flash attention only in the runtime");
  if (p.cp > 1 && p.cp_impl == CpImpl::kTransformerEngine && p.cp_comm_type == CpCommType::kA2aP2p)
    unsupported("plan.cp_comm_type",
                "hierarchical context parallelism (a2a+p2p) is priced by the simulator only; the "
                "runtime runs the p2p ring");
  if (p.lora())
    unsupported("plan.lora_rank",
                "LoRA fine-tuning (frozen base weights, adapters) is priced by the predictors "
                "only; the runtime trains every weight");
  if (m.tied_embeddings && p.pp > 1)
    unsupported("model.tied_embeddings",
                "tied embeddings with pp > 1 need the embedding-gradient all-reduce between the "
                "first and last stage, which the runtime does not run yet; untie them or use pp 1");
  if (m.vocab % p.tp != 0)
    unsupported("plan.tp", "the runtime needs the vocabulary (" + std::to_string(m.vocab) +
                               ") divisible by tp (" + std::to_string(p.tp) + ")");
  if (p.ep > 1 && p.offload.activations)
    unsupported("plan.offload", "activation offload with expert parallelism is not run yet");
  // The routed rows gathered over the experts' tensor-parallel group (SP with etp = tp, or an
  // expert grid with etp > 1) vary in number per member under expert parallelism.
  if (p.ep > 1 && !expert_grid(p) && p.sequence_parallel && p.tp > 1)
    unsupported("plan.sp", "sequence parallelism with expert parallelism is not run yet");
  if (p.ep > 1 && expert_grid(p) && p.expert_tp() > 1)
    unsupported("plan.etp", "an expert grid with etp > 1 and ep > 1 is not run yet");
  if (p.tiled_loss && !p.eager_loss && p.precision != Dtype::kFp32 && p.precision != Dtype::kBf16)
    unsupported("plan.tiled_loss", "the vocab-tiled loss reads fp32 or bf16 logits, not " +
                                       std::string(dtype_name(p.precision)));
  if (p.eager_loss)
    unsupported("plan.eager_loss",
                "the runtime runs the fused vocab-parallel loss; the eager loss's fp32 copies are "
                "priced by the simulator only");
}

// Shapes of this rank, as core/lower.cc computes them.
void Executor::Impl::init_shapes() {
  const RankGroups& g = comms.groups();
  tp = plan.tp;
  tp_idx = g[Group::kTp].index;
  cp = plan.cp;
  cp_idx = g[Group::kCp].index;
  dp_idx = g.coord.dp(grid_ep(plan));
  Sl = plan.seq(model) / plan.cp;
  T = int64_t{plan.micro_batch} * Sl;
  h = model.hidden;
  vocab_t = vocab_shard(model, tp);
  vocab_start = int64_t{tp_idx} * vocab_t;
}

// Every buffer's elements and pointer slot; one unit per block (in block order), then one per
// buffer outside any block (in buffer order).
void Executor::Impl::build_units() {
  const int nb = static_cast<int>(prog.buffers.size());
  elements_.resize(nb);
  ptr_.assign(nb, nullptr);
  unit_of_.assign(nb, -1);
  region_key_.assign(nb, -1);
  for (int i = 0; i < nb; ++i) elements_[i] = prog.buffers[i].elements();
  nominal_elements_ = elements_;
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
}

// Distinct units per op and each unit's touch count; the grad-norm buffer, the ring step of each
// received K/V chunk, and the layer and micro-batch of each expert-region buffer.
void Executor::Impl::index_ops() {
  op_units_begin_.reserve(prog.ops.size() + 1);
  stage_slot_.assign(prog.buffers.size(), -1);
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
      ring_step_[op.writes[0]] = static_cast<int>((op.tag / 2) % plan.cp) + 1;
    // An expert-region buffer belongs to the layer and micro-batch of its first op.
    for (const std::vector<int>* ids : {&op.reads, &op.writes})
      for (int id : *ids)
        if (prog.buffers[id].role == BufferRole::kExpertRows && region_key_[id] < 0)
          region_key_[id] = ep_key(op.tags.layer, op.tags.micro_batch);
    // A token or label buffer holds the micro-batch of its first op: its staging slot.
    for (const std::vector<int>* ids : {&op.reads, &op.writes})
      for (int id : *ids) {
        const BufferRole role = prog.buffers[id].role;
        if ((role != BufferRole::kTokens && role != BufferRole::kLabels) || stage_slot_[id] >= 0)
          continue;
        PARASOL_CHECK(op.tags.micro_batch >= 0, "a token buffer outside a micro-batch");
        stage_slot_[id] = 2 * op.tags.micro_batch + (role == BufferRole::kLabels ? 1 : 0);
        stage_slots_ = std::max(stage_slots_, 2 * (op.tags.micro_batch + 1));
      }
  }
  op_units_begin_.push_back(static_cast<int>(op_units_.size()));
}

// Each bucket's parameters, gradients, shards, optimizer state and host gradients -> the bucket.
void Executor::Impl::index_buckets() {
  for (size_t bi = 0; bi < prog.buckets.size(); ++bi) {
    const ParamBucket& bk = prog.buckets[bi];
    const int i = static_cast<int>(bi);
    for (int id : bk.params) bucket_of_[id] = i;
    for (int id : bk.grads) bucket_of_[id] = i;
    for (int id : {bk.param_shard, bk.grad_shard, bk.opt, bk.host_grad})
      if (id >= 0) bucket_of_[id] = i;
  }
}

// Persistent units live as long as the Executor, allocated in unit order.
void Executor::Impl::allocate_persistent() {
  for (int u = 0; u < static_cast<int>(units_.size()); ++u)
    if (units_[u].persistent) allocate(u);
}

// The optimizer's two device scalars (the reduced sum of squares, the clip scale) exist from the
// step's gradient norm (or first AdamW) to its end, as the step's other workspaces do, so that
// they are not held beside the activations at the forward and backward passes' peak.
void Executor::Impl::ensure_scalars() {
  if (sumsq_ != nullptr) return;
  sumsq_ = static_cast<float*>(be.alloc(2 * sizeof(float), BufferClass::kWorkspace));
  scale_ = sumsq_ + 1;
  be.zero(sumsq_, 2 * sizeof(float));
}

Executor::Impl::~Impl() {
  for (int u = 0; u < static_cast<int>(units_.size()); ++u)
    if (units_[u].base != nullptr) release(u);
  for (auto& [probs, r] : routing_)
    if (r.block != nullptr) be.free_routing(r.block);
  be.free_routing(moe_bad_);
  be.free(sumsq_);
  sumsq_ = scale_ = nullptr;
  be.free_staging(staging_);
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
    for (int id : units_[u].buffers)
      if (stage_slot_[id] >= 0) fill_input(id, op.tags.micro_batch);
  }
}

// Staged: a device copy from the step's staging memory (its slot was uploaded before the first
// op); else the former path, an upload of the micro-batch's tokens or labels from the host.
void Executor::Impl::fill_input(int id, int micro_batch) {
  const auto bytes = static_cast<size_t>(T) * sizeof(int32_t);
  const bool labels = prog.buffers[id].role == BufferRole::kLabels;
  if (staged()) {
    be.copy(ptr_[id], static_cast<const int32_t*>(staging_) + int64_t{stage_slot_[id]} * T, bytes);
    return;
  }
  std::vector<int32_t> tokens(static_cast<size_t>(T)), label(static_cast<size_t>(T));
  if (!cfg->batch) throw Error("run.data", "no token source for the step");
  cfg->batch(micro_batch, tokens.data(), label.data());
  be.copy(ptr_[id], labels ? label.data() : tokens.data(), bytes);
}

// Every micro-batch's tokens and labels in one upload to the staging memory (allocated on the
// first step, kept: its address is fixed for a captured graph), and the loss accumulator zeroed.
void Executor::Impl::stage_inputs() {
  const int64_t ints = int64_t{stage_slots_} * T;
  const size_t acc_at = (static_cast<size_t>(ints) * sizeof(int32_t) + 7) / 8 * 8;
  if (staging_ == nullptr) {
    staging_ = be.alloc_staging(acc_at + 2 * sizeof(double));
    loss_acc_ = reinterpret_cast<double*>(static_cast<char*>(staging_) + acc_at);
  }
  if (ints > 0) {
    if (!cfg->batch) throw Error("run.data", "no token source for the step");
    std::vector<int32_t> host(static_cast<size_t>(ints));
    for (int mb = 0; mb < stage_slots_ / 2; ++mb)
      cfg->batch(mb, host.data() + int64_t{2 * mb} * T, host.data() + int64_t{2 * mb + 1} * T);
    be.copy(staging_, host.data(), static_cast<size_t>(ints) * sizeof(int32_t));
  }
  be.zero(loss_acc_, 2 * sizeof(double));
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
  const auto eb = static_cast<int64_t>(dtype_bytes(prog.buffers[ids[0]].dtype));
  if (ids.size() == 1) {
    const int blk = prog.buffers[ids[0]].block;
    if (blk >= 0 && prog.blocks[blk].buffers.size() == 1)
      return {ptr_[ids[0]], prog.blocks[blk].elements, eb};
    return {ptr_[ids[0]], elements_[ids[0]], eb};
  }
  const int blk = prog.buffers[ids[0]].block;
  if (blk < 0 || prog.blocks[blk].buffers != ids || units_[u].base == nullptr)
    throw Error("runtime.program",
                prog.buffers[ids[0]].name + " and " + std::to_string(ids.size() - 1) +
                    " more: a collective or copy over buffers that are not one block");
  return {ptr_[ids[0]], prog.blocks[blk].elements, eb};
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

void Executor::Impl::copy_rows_of(void* dst, int64_t ld_dst, const void* src, int64_t ld_src,
                                  int64_t rows, int64_t cols, int64_t eb) {
  if (rows <= 0 || cols <= 0) return;
  auto* d = static_cast<char*>(dst);
  const auto* s = static_cast<const char*>(src);
  if (ld_dst == cols && ld_src == cols) {
    be.copy(d, s, static_cast<size_t>(rows * cols * eb));
    return;
  }
  for (int64_t r = 0; r < rows; ++r)
    be.copy(d + r * ld_dst * eb, s + r * ld_src * eb, static_cast<size_t>(cols * eb));
}

void Executor::Impl::pack_kv(const void* qkv, void* kv, int64_t q_cols, int64_t kv_width,
                             int64_t eb) {
  copy_rows_of(kv, kv_width, static_cast<const char*>(qkv) + q_cols * eb, q_cols + kv_width, T,
               kv_width, eb);
}

Dtype Executor::Impl::comm_dtype(const Op& op) const {
  const int buf = op.kind == OpKind::kSend ? op.reads.at(0) : op.writes.at(0);
  const Buffer& b = prog.buffers[buf];
  switch (op.group) {
    case Group::kDpCp:
    case Group::kDpShard:
    case Group::kDpReplicate:
    case Group::kExpertDp:
    case Group::kExpertShard:
    case Group::kExpertReplicate:
      if (b.cls == BufferClass::kGrad) return plan.grad_reduce_dtype;
      break;
    default:
      break;
  }
  return b.dtype;
}

void* Executor::Impl::stage_narrow(const Op& op, const void* src, int64_t n, Dtype src_dt,
                                   Dtype dt) {
  (void)op;
  void* staging = be.alloc(static_cast<size_t>(n) * dtype_bytes(dt), BufferClass::kWorkspace);
  be.cast(staging, dt, src, src_dt, n);
  return staging;
}

void Executor::Impl::unstage_on_complete(const Op& op, void* staging, int64_t from, void* dst,
                                         int64_t n, Dtype dst_dt, Dtype dt) {
  on_complete_[op.id] = [this, staging, from, dst, n, dst_dt, dt] {
    const auto eb = static_cast<int64_t>(dtype_bytes(dt));
    // Through fp32 (Backend::cast converts to and from fp32).
    if (dst_dt == Dtype::kFp32) {
      be.cast(dst, dst_dt, static_cast<char*>(staging) + from * eb, dt, n);
    } else {
      throw Error("runtime.program", "a narrowed reduction into a non-fp32 buffer");
    }
    be.free(staging);
  };
}

// A short switch over the communication kinds, one function per kind below; `count` is the
// payload's elements (comm_count of the op's bytes).
Request Executor::Impl::start_comm(const Op& op) {
  Communicator& comm = comms.get(op.group);
  if (op.kind == OpKind::kAllToAll) return start_all_to_all(op);
  const Dtype dt = comm_dtype(op);
  const int64_t count = comm_count(op.kind, op.bytes, dt, comm.size());
  switch (op.kind) {
    case OpKind::kAllReduce:
      return start_all_reduce(op, comm, count, dt);
    case OpKind::kAllGather:
      return start_all_gather(op, comm, count, dt);
    case OpKind::kReduceScatter:
      return start_reduce_scatter(op, comm, count, dt);
    case OpKind::kSend:
      return start_send(op, comm, count, dt);
    case OpKind::kRecv:
      return start_recv(op, comm, count, dt);
    case OpKind::kAllToAll:
      return start_all_to_all(op);
    default:
      throw Error("runtime.op", std::string("not a communication op: ") + op_kind_name(op.kind));
  }
}

// In place over op's writes: an expert-region buffer at its routed size, buffers of several
// buckets packed, or one block (under HSDP with ZeRO 1, this rank's shard of it).
Request Executor::Impl::start_all_reduce(const Op& op, Communicator& comm, int64_t count,
                                         Dtype dt) {
  if (op.writes.size() == 1 && prog.buffers[op.writes[0]].block < 0 &&
      elements_[op.writes[0]] != nominal_elements_[op.writes[0]]) {
    // An expert-region buffer (its rows depend on the routing).
    after_kernels(comm);
    return comm.iall_reduce(ptr(op.writes[0]), elements_[op.writes[0]], dt);
  }
  const int blk = prog.buffers[op.writes[0]].block;
  if (op.writes.size() > 1 && (blk < 0 || prog.blocks[blk].buffers != op.writes))
    return start_packed_all_reduce(op, comm, count, dt);
  Flat f = flat(op.writes);
  void* base = f.base;
  if (f.elements > count) {
    // HSDP under ZeRO 1: this rank's reduce-scattered shard of the bucket's gradients.
    const ParamBucket* b = bucket_of(op.writes[0]);
    if (!b) throw Error("runtime.program", op.name + ": payload is not its buffers");
    base = f.at(int64_t{group_index(*b)} * count);
  }
  const Dtype stored = prog.buffers[op.writes[0]].dtype;
  if (dt != stored) {
    // Gradients reduced in a narrower dtype than they are kept in.
    void* staging = stage_narrow(op, base, count, stored, dt);
    unstage_on_complete(op, staging, 0, base, count, stored, dt);
    base = staging;
  }
  after_kernels(comm);
  return op.reduce_max ? comm.iall_reduce_max(base, count, dt) : comm.iall_reduce(base, count, dt);
}

Request Executor::Impl::start_packed_all_reduce(const Op& op, Communicator& comm, int64_t count,
                                                Dtype dt) {
  const auto eb = static_cast<int64_t>(dtype_bytes(dt));
  for (int id : op.writes)
    if (prog.buffers[id].dtype != dt)
      throw Error("runtime.program", op.name + ": packed buffers of another dtype");
  auto* packed = static_cast<char*>(be.alloc(count * eb, BufferClass::kWorkspace));
  int64_t at = 0;
  for (int id : op.writes) {
    be.copy(packed + at * eb, ptr(id), elements_[id] * eb);
    at += elements_[id];
  }
  if (at != count) throw Error("runtime.program", op.name + ": payload is not its buffers");
  on_complete_[op.id] = [this, packed, eb, ids = op.writes] {
    int64_t off = 0;
    for (int id : ids) {
      be.copy(ptr(id), packed + off * eb, elements_[id] * eb);
      off += elements_[id];
    }
    be.free(packed);
  };
  after_kernels(comm);
  return comm.iall_reduce(packed, count, dt);
}

// reads -> writes, or in place (this rank's block of the writes); a dispatch gather without
// expert parallelism first trades the routed rows' counts.
Request Executor::Impl::start_all_gather(const Op& op, Communicator& comm, int64_t count,
                                         Dtype dt) {
  if (plan.ep == 1 && op.role == OpRole::kDispatchGather) gather_counts(op, comm);
  const int me = comm.index();
  Flat src = flat(op.reads), dst = flat(op.writes);
  const void* send = src.base == dst.base ? dst.at(int64_t{me} * count) : src.base;
  after_kernels(comm);
  return comm.iall_gather(send, dst.base, count, dt);
}

// reads -> writes, or in place (into this rank's block); ZeRO 2/3 fold the shard reduced so far.
Request Executor::Impl::start_reduce_scatter(const Op& op, Communicator& comm, int64_t count,
                                             Dtype dt) {
  const int me = comm.index();
  Flat src = flat(op.reads), dst = flat(op.writes);
  const Dtype stored = prog.buffers[op.writes[0]].dtype;
  const int n = comm.size();
  if (src.base == dst.base) {
    if (dt != stored) {
      // Gradients reduced in a narrower dtype: the whole input rounded, this rank's block back.
      void* staging = stage_narrow(op, src.base, count * n, stored, dt);
      unstage_on_complete(op, staging, int64_t{me} * count, src.at(int64_t{me} * count), count,
                          stored, dt);
      after_kernels(comm);
      const auto eb = static_cast<int64_t>(dtype_bytes(dt));
      return comm.ireduce_scatter(staging, static_cast<char*>(staging) + me * count * eb, count,
                                  dt);
    }
    after_kernels(comm);
    return comm.ireduce_scatter(src.base, src.at(int64_t{me} * count), count, dt);
  }
  const Buffer& out = prog.buffers[op.writes[0]];
  if (out.persistent && out.cls == BufferClass::kGrad) {
    // ZeRO 2/3: the micro-batch's gradients fold into the shard: add the shard reduced so
    // far to this rank's block of the input, then reduce-scatter over it.
    float* mine = src.f(int64_t{me} * count);
    be.residual_forward(mine, nullptr, mine, dst.f(), nullptr, 1, count, 0.0f, 0);
  }
  if (dt != stored) {
    void* staging = stage_narrow(op, src.base, count * n, stored, dt);
    unstage_on_complete(op, staging, int64_t{me} * count, dst.base, count, stored, dt);
    after_kernels(comm);
    const auto eb = static_cast<int64_t>(dtype_bytes(dt));
    return comm.ireduce_scatter(staging, static_cast<char*>(staging) + me * count * eb, count, dt);
  }
  after_kernels(comm);
  return comm.ireduce_scatter(src.base, dst.base, count, dt);
}

// To the next pipeline stage (or peer_stage on), or along the context-parallel ring.
Request Executor::Impl::start_send(const Op& op, Communicator& comm, int64_t count, Dtype dt) {
  const int buf = op.reads.at(0);
  const void* data = ptr(buf);
  const auto eb = static_cast<int64_t>(dtype_bytes(dt));
  if (op.group == Group::kCp && prog.buffers[buf].role == BufferRole::kQkv) {
    // Ring attention passes K and V of the local chunk: pack them out of the fused QKV.
    const int64_t kv_width = count / T, qkv_cols = elements_[buf] / T;
    void* staged = be.alloc(count * eb, BufferClass::kWorkspace);
    pack_kv(ptr(buf), staged, qkv_cols - kv_width, kv_width, eb);
    scratch_.push_back(staged);
    data = staged;
  } else if (elements_[buf] > count) {
    // Megatron's pipeline scatter: each tensor-parallel rank sends its 1/tp of the rows.
    data = static_cast<const char*>(ptr(buf)) + int64_t{tp_idx} * count * eb;
  }
  // Ring attention: the next rank, or peer_stage ranks on (core/lower.h).
  const int ahead = op.peer_stage > 0 ? op.peer_stage : 1;
  const int peer = op.group == Group::kPp ? comms.pp_peer(op.peer_stage)
                                          : comms.groups()[Group::kCp].ring(ahead);
  after_kernels(comm);
  return comm.isend(data, count, peer, op.tag, dt);
}

// From the previous pipeline stage (or peer_stage back), or along the context-parallel ring.
Request Executor::Impl::start_recv(const Op& op, Communicator& comm, int64_t count, Dtype dt) {
  const int back = op.peer_stage > 0 ? op.peer_stage : 1;
  const int peer = op.group == Group::kPp ? comms.pp_peer(op.peer_stage)
                                          : comms.groups()[Group::kCp].ring(-back);
  after_kernels(comm);
  return comm.irecv(ptr(op.writes.at(0)), count, peer, op.tag, dt);
}

// ---------------------------------------------------------------------------------------------
// Copies between device and host.

void Executor::Impl::run_copy(const Op& op) {
  const Dtype src_dt = prog.buffers[op.reads.at(0)].dtype,
              dst_dt = prog.buffers[op.writes.at(0)].dtype;
  if (src_dt != dst_dt) return run_widening_copy(op, src_dt, dst_dt);
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

// A bf16 gradient buffer (grad_reduce_in_bf16) into the fp32 host gradient of the CPU optimizer:
// this rank's shard widened on the device (DeepSpeed casts the reduced bucket to fp32 there,
// core/lower_buckets.cc stream_grads), then copied; op.bytes counts the fp32 elements.
void Executor::Impl::run_widening_copy(const Op& op, Dtype src_dt, Dtype dst_dt) {
  if (dst_dt != Dtype::kFp32)
    throw Error("runtime.program", op.name + ": a copy into a narrower dtype");
  Flat src = flat(op.reads), dst = flat(op.writes);
  const auto n = static_cast<int64_t>(op.bytes / static_cast<double>(sizeof(float)));
  const ParamBucket* b = nullptr;
  for (int id : op.reads) b = b ? b : bucket_of(id);
  for (int id : op.writes) b = b ? b : bucket_of(id);
  const int64_t off = b ? int64_t{group_index(*b)} * n : 0;
  void* widened = nullptr;
  const float* g = grads_fp32(src.at(src.elements > n ? off : 0), src_dt, n, &widened);
  be.copy(dst.f(dst.elements > n ? off : 0), g, static_cast<size_t>(n) * sizeof(float));
  if (widened) be.free_widened(widened);
}

// ---------------------------------------------------------------------------------------------
// Optimizer: gradient norm, AdamW, cast.

const float* Executor::Impl::grads_fp32(const void* src, Dtype dt, int64_t n, void** widened) {
  *widened = nullptr;
  if (dt == Dtype::kFp32) return static_cast<const float*>(src);
  const auto bytes = static_cast<size_t>(n) * sizeof(float);
  *widened = be.alloc_widened(bytes);
  result->widened_bytes += static_cast<int64_t>(bytes);
  be.cast(*widened, Dtype::kFp32, src, dt, n);
  return static_cast<const float*>(*widened);
}

void Executor::Impl::run_grad_norm(const Op& op) {
  float* out = fptr(op.writes.at(0));
  be.zero(out, sizeof(float));
  // Each full-tensor element counted once over the ranks the norm is reduced over
  // (runtime/param_layout.h).
  for (const ParamBucket& b : prog.buckets) {
    for (const ShardRun& r : grad_norm_runs(model, plan, comms.groups().coord, b, group_index(b))) {
      const int id = b.zero >= 2 ? b.grad_shard : b.grads[r.spec];
      const int64_t at = b.zero >= 2 ? r.shard_offset : r.spec_offset;
      const Dtype dt = prog.buffers[id].dtype;
      void* widened = nullptr;
      const float* g =
          grads_fp32(static_cast<const char*>(ptr(id)) + at * static_cast<int64_t>(dtype_bytes(dt)),
                     dt, r.count, &widened);
      be.grad_sumsq(out, g, r.count);
      if (widened) be.free_widened(widened);
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
    ensure_scalars();
    if (cfg->skip_on_overflow) {
      float sumsq = 0;
      be.copy(&sumsq, sumsq_, sizeof(float));  // a device-to-host sync, as Megatron's found_inf
      skip_update_ = !std::isfinite(sumsq);
    }
    be.clip_scale(scale_, sumsq_, cfg->clip_norm, cfg->loss_scale);
    scale_ready_ = true;
  }
  if (skip_update_) return;
  AdamWConfig c = cfg->adamw;
  c.step = cfg->optimizer_step > 0 ? cfg->optimizer_step : cfg->step;
  void* widened = nullptr;
  const float* grad =
      grads_fp32(g.at(g.elements > n ? off : 0), prog.buffers[grads.at(0)].dtype, n, &widened);
  be.adamw(c, param, m, v, grad, n, scale_);
  if (widened) be.free_widened(widened);
}

void Executor::Impl::run_cast(const Op& op) {
  if (skip_update_) return;  // the master copy did not change
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
    if (w == grad_norm_buffer_) {
      ensure_scalars();
      be.copy(sumsq_, ptr(w), sizeof(float));
    }
}

// ---------------------------------------------------------------------------------------------
// The step: schedule every stream's ops in issue order as their dependencies finish.

Executor::Executor(const Model& model, const Plan& plan, const Program& program, Backend& backend,
                   CommSet& comms)
    : impl_(std::make_unique<Impl>(model, plan, program, backend, comms)), program_(program) {}

Executor::~Executor() = default;

void* Executor::data(int id) const { return impl_->ptr(id); }

int Executor::group_index(const ParamBucket& b) const { return impl_->group_index(b); }

// One step's scheduling state: the Program's execution rules (core/issue_graph.h: dependencies,
// stream order, the host's cursor, p2p groups issued together, a ring receive completing with
// its send, eager sends) advanced by an IssueState; each stream's next op to issue; the
// transfers in flight; and the trace marks of the ops run on the calling thread.
//
// What the executor adds to the rules is how its host thread reaches the ops: it runs (cpu) or
// launches (cuda) each compute-stream op itself, so it reaches no further than the first
// compute op it has not issued yet; the transfers after that op wait for it, as a framework's
// host thread launches a transfer where its program does (a ZeRO-3 gather one layer ahead, not
// every gather at the start of the step; liveness, core/liveness.h, predicts memory in that
// order). A device-to-host sync stops it until the sync's dependencies have completed (a CUDA
// .item(): nothing after it in the Program is launched before), and the transfers of one p2p group
// complete together once each has landed (one NCCL group completes as a whole).
struct Executor::Impl::Scheduler {
  Scheduler(Impl& impl, const StepConfig& cfg, StepResult& res);
  void run();     // until every op has completed
  void finish();  // the trace's marked events, the send staging freed, the step's wall time
  // The step's body (every op but the optimizer's) as a graph: kCapture records it (its
  // transfers joined to the compute stream by their fences, not waited on by the host), then
  // launches it; kReplay launches the captured graph and only advances the rules over the body's
  // ops (nothing allocated, run or started). run() then runs the optimizer's ops.
  void run_body(GraphAction action);

 private:
  struct InFlight {
    int op;
    Request req;
    double start;
    bool landed = false;    // its request has completed; the rules may still hold its completion
    bool replayed = false;  // a replayed graph ran it: no completion work
  };
  bool in_body(const Op& op) const { return op.tags.phase != Phase::kOptimizer; }
  void loop();  // until every op (or, body_only, every op of the body) has completed
  void completed(const Op& op);  // the rules told, the body's count kept
  struct Marked {
    int op, start, end;
  };
  double now() const { return std::chrono::duration<double>(Clock::now() - t0).count(); }
  void record(const Op& op, double start, double end);  // a trace event (when tracing)
  // When tracing: a sample of the device bytes allocated now (time t) for the memory counter.
  void sample_memory(double t);
  void complete(const Op& op);
  bool poll_transfers();    // completes the transfers that have finished
  void reach();             // the host reaches as far as the rules and its thread let it
  bool issue_ready(int s);  // issues stream s's ops in order while the rules let them go
  void issue(const Op& op);
  void inject_failure(const Op& op) const;
  bool tested(InFlight& f);

  Impl& im;
  const Program& prog;
  const IssueGraph& graph;
  const StepConfig& config;
  StepResult& result;
  // Sends are eager (core/lower.h): the stream and the ops that wait on a send go on once it is
  // issued; its buffer is kept (finished() is deferred) until the transfer completes.
  IssueState state;
  std::vector<int> next;  // per stream: its next op to issue (-1: none left)
  std::vector<InFlight> flying;
  std::vector<Marked> marked;
  bool body_only = false;                  // issue no optimizer op (run_body)
  bool capture = false;                    // the backend records the body (run_body)
  bool replay = false;                     // the backend replayed the body (run_body)
  int body_left = 0;                       // the body's ops not completed yet
  int64_t last_live = -1, last_peak = -1;  // the memory counter's last sample and peak seen
  double last_sample_t = 0;
  Clock::time_point t0;
};

Executor::Impl::Scheduler::Scheduler(Impl& impl, const StepConfig& cfg, StepResult& res)
    : im(impl),
      prog(impl.prog),
      graph(impl.graph),
      config(cfg),
      result(res),
      state(impl.graph, IssueRules{.eager_sends = true}) {
  next.resize(prog.streams.size());
  for (int s = 0; s < graph.streams(); ++s) next[s] = graph.stream_first(s);
  for (const Op& op : prog.ops) body_left += in_body(op) ? 1 : 0;
  // Compute and copy ops are timed by the backend's marks (device time on cuda), transfers by the
  // host clock; mark 0 and t0 are both the step's start.
  im.be.clear_marks();
  if (config.trace) im.be.mark();
  t0 = Clock::now();
  sample_memory(0);
}

void Executor::Impl::Scheduler::record(const Op& op, double start, double end) {
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
}

// Samples are taken where the executor allocates or frees: when an op is issued (after its
// buffers are allocated), when it completes (after what it last touched is freed) and at the end
// of the step, all by the host clock. Where the allocation peak (Backend::device_memory's
// peak_total, which the trainer reports) rose since the previous sample, e.g. by a kernel's
// transient workspace, that peak is sampled halfway between the two: the counter's maximum is
// the step's measured peak.
void Executor::Impl::Scheduler::sample_memory(double t) {
  if (!config.trace) return;
  const MemoryStats m = im.be.device_memory();
  const int rank = im.comms.world_rank();
  if (m.peak_total > last_peak) {
    // The peak rose above what is live now between the previous sample and this one.
    if (m.peak_total > m.live_total)
      result.counters.push_back({rank, "device memory", "bytes", (last_sample_t + t) / 2,
                                 static_cast<double>(m.peak_total)});
    last_peak = m.peak_total;
  }
  if (m.live_total != last_live) {
    result.counters.push_back(
        {rank, "device memory", "bytes", t, static_cast<double>(m.live_total)});
    last_live = m.live_total;
  }
  last_sample_t = t;
}

void Executor::Impl::Scheduler::completed(const Op& op) {
  state.completed(op.id);
  if (in_body(op)) --body_left;
}

void Executor::Impl::Scheduler::complete(const Op& op) {
  im.after_complete(op);
  im.finished(op);
  completed(op);
}

bool Executor::Impl::Scheduler::poll_transfers() {
  bool progressed = false;
  for (size_t i = 0; i < flying.size();) {
    InFlight& f = flying[i];
    if (!f.landed && tested(f)) {
      f.landed = true;
      state.landed(f.op);
      progressed = true;
    }
    // A p2p group completes as a whole (a ring receive with its send, a pipeline step's sends
    // with its receives).
    if (!f.landed || !state.can_complete(f.op)) {
      ++i;
      continue;
    }
    const Op& op = prog.ops[f.op];
    record(op, f.start, now());
    if (graph.is_send(op.id) || f.replayed) {  // eager: its stream and dependents went on
      im.finished(op);
      completed(op);
    } else {
      complete(op);
    }
    sample_memory(now());
    progressed = true;
    flying.erase(flying.begin() + static_cast<long>(i));
  }
  return progressed;
}

void Executor::Impl::Scheduler::reach() {
  while (state.can_reach()) {
    const int c = state.cursor();
    if (c > 0 && prog.streams[prog.ops[c - 1].stream] == StreamKind::kCompute &&
        !state.is_issued(c - 1))
      return;  // the host thread has yet to run (launch) that compute op
    state.reach();
  }
}

// Point-to-point transfers are issued in explicit groups (Communicator::begin_group), as NCCL
// must see them: where a send completes only once its receive is posted and a communicator's
// groups run in order (NCCL; the MPI communicator's strict mode), neighbours that exchange
// deadlock unless each exchange is one group. The issue graph says which transfers are issued
// together (IssueGraph::issue_begin/issue_end: Op::p2p_group, Megatron's batched isend/irecv of a
// pipeline step, a ring attention step); every other transfer is a group of its own, so that the
// communicator's batching of consecutive calls (NcclCommunicator) never joins transfers of
// different rounds.
bool Executor::Impl::Scheduler::issue_ready(int s) {
  bool progressed = false;
  while (next[s] >= 0) {
    reach();
    const int i = next[s];
    if (body_only && !in_body(prog.ops[i])) break;
    if (!state.ready(i)) break;
    const int begin = graph.issue_begin(i), end = graph.issue_end(i);
    state.issued(i);
    next[s] = graph.stream_next(end - 1);
    const Op& op = prog.ops[i];
    if (graph.is_send(i) || graph.is_recv(i)) {
      Communicator& comm = im.comms.get(op.group);
      comm.begin_group();
      for (int j = begin; j < end; ++j) issue(prog.ops[j]);
      comm.end_group();
    } else {
      issue(op);
      // A local op ran to completion on this thread: back to the loop, which polls the
      // transfers in flight and lets the other streams start theirs, before the next one.
      // Without this the compute stream ran its whole backward pass before the gradient
      // stream could start a bucket's all-reduce, and MPI (which progresses only inside a
      // call) never moved a byte beside compute.
      if (!is_communication(op.kind)) return true;
    }
    progressed = true;
  }
  return progressed;
}

// Whether an in-flight transfer has completed; a failure (the peer's error, the communication
// timeout) is rethrown naming the op as well as the call.
bool Executor::Impl::Scheduler::tested(InFlight& f) {
  if (capture) {
    // Recording: neither the host nor an event query may wait. The compute stream waits for the
    // transfer's event (joining its stream back into the capture), and what follows is ordered
    // after it on the device.
    void* fence = f.req.fence();
    if (fence == nullptr)
      throw Error("runtime.graph",
                  prog.ops[f.op].name + ": a transfer without a device fence cannot be captured");
    im.be.wait_fence(fence);
    f.req.detach();
    return true;
  }
  try {
    return f.req.test();
  } catch (const Error& e) {
    const Op& op = prog.ops[f.op];
    throw Error(
        "runtime.program",
        op.name + " (" + op_kind_name(op.kind) + ", op " + std::to_string(op.id) + "): " + e.what(),
        e.kind());
  }
}

// Fault injection for the tests of failure handling (tests/tools/failure_test.sh): with
// PARASOL_TEST_FAIL_AT="<world rank>:<op id>" in the environment, that rank throws when it
// starts that op, as a kernel or a transfer failing there would; with PARASOL_TEST_STALL_AT it
// stops there instead.
void Executor::Impl::Scheduler::inject_failure(const Op& op) const {
  // The injection points, read once per process: {rank, op id}, or {-1, -1} when unset.
  auto point = [](const char* var) {
    std::pair<int, int> at{-1, -1};
    const char* v = std::getenv(var);
    if (v == nullptr || std::sscanf(v, "%d:%d", &at.first, &at.second) != 2) at = {-1, -1};
    return at;
  };
  static const std::pair<int, int> fail = point("PARASOL_TEST_FAIL_AT");
  static const std::pair<int, int> stall = point("PARASOL_TEST_STALL_AT");
  if (fail.second < 0 && stall.second < 0) return;
  const std::pair<int, int> here{im.comms.world_rank(), op.id};
  if (here == fail)
    throw SystemError("runtime.program", op.name + " (" + op_kind_name(op.kind) + ", op " +
                                             std::to_string(op.id) + "): injected failure");
  // PARASOL_TEST_STALL_AT: the rank hangs there (a stalled GPU or host), alive but silent.
  if (here == stall) std::this_thread::sleep_for(std::chrono::hours(1));
}

// Allocates what op touches, then starts a transfer (the rules hold its stream until it
// completes unless it is an eager send) or runs the op to completion on this thread.
void Executor::Impl::Scheduler::issue(const Op& op) {
  inject_failure(op);
  if (replay && in_body(op)) {  // the replayed graph ran it: the rules only
    if (is_communication(op.kind)) {
      flying.push_back({op.id, Request(), now(), true, true});
    } else {
      im.finished(op);
      completed(op);
    }
    return;
  }
  im.ensure(op);
  static const bool debug = std::getenv("PARASOL_EXEC_DEBUG") != nullptr;
  if (debug)
    std::fprintf(stderr, "[rank %d] start %d %s stream %d\n", im.comms.world_rank(), op.id,
                 op.name.c_str(), op.stream);
  const double start = now();
  sample_memory(start);
  // Kernels are timed by the backend's marks (device time on cuda); on a backend whose marks are
  // the host clock, by the host clock itself, as transfers are: two readings of one clock taken
  // at different instants (mark 0 and t0) would misorder a kernel and a transfer that ran close
  // together (tests/runtime/trainer_mpi_test.cc rebuilds the executed order from the trace).
  const bool by_marks = config.trace && !is_communication(op.kind) && !im.be.marks_on_host_clock();
  const int start_mark = by_marks ? im.be.mark() : -1;
  if (is_communication(op.kind)) {
    flying.push_back({op.id, im.start_comm(op), start});
  } else {
    im.run_local(op);
    if (by_marks)
      marked.push_back({op.id, start_mark, im.be.mark()});
    else
      record(op, start, now());
    complete(op);
    sample_memory(now());
  }
}

void Executor::Impl::Scheduler::run() { loop(); }

void Executor::Impl::Scheduler::run_body(GraphAction action) {
  PARASOL_CHECK(action == GraphAction::kCapture || action == GraphAction::kReplay,
                "run_body without a graph");
  body_only = true;
  if (action == GraphAction::kReplay) {
    im.be.replay(im.graph_id_);
    replay = true;
    loop();
    replay = false;
  } else {
    capture = true;
    im.be.begin_capture();
    try {
      loop();
      im.graph_id_ = im.be.end_capture();
    } catch (const Error& e) {
      im.graph_.capture_failed(e.what());
      throw;
    }
    capture = false;
    im.be.replay(im.graph_id_);  // the recording ran nothing: run it now
    im.graph_peak_ = im.be.device_memory().peak_total;
  }
  body_only = false;
}

void Executor::Impl::Scheduler::loop() {
  IdleWait idle;
  while (body_only ? body_left > 0 : !state.done()) {
    bool progressed = poll_transfers();
    for (int s = 0; s < graph.streams(); ++s)
      if (issue_ready(s)) progressed = true;
    if (progressed) {
      idle = IdleWait{};
      continue;
    }
    // Waiting is for a transfer to land; one that has landed waits for nothing but the rules.
    if (std::all_of(flying.begin(), flying.end(), [](const InFlight& f) { return f.landed; }))
      throw InternalError("runtime.program", "deadlock: no op can start and none is in flight");
    idle.pause();  // waiting on communication only (runtime/comm/idle_wait.h)
  }
}

void Executor::Impl::Scheduler::finish() {
  im.be.synchronize();
  for (const Marked& m : marked)
    record(prog.ops[m.op], im.be.mark_seconds(m.start), im.be.mark_seconds(m.end));
  for (void* p : im.scratch_) im.be.free(p);
  im.scratch_.clear();
  result.seconds = now();
  sample_memory(result.seconds);
}

void Executor::Impl::begin_step(const StepConfig& config, StepResult& res) {
  cfg = &config;
  result = &res;
  scale_ready_ = false;
  skip_update_ = false;
  clear_routing();
  ep_.clear();
  gathered_.clear();
  elements_ = nominal_elements_;
  live_touches_.resize(units_.size());
  for (size_t u = 0; u < units_.size(); ++u) live_touches_[u] = units_[u].touches;
  // Gradients accumulate over micro-batches: zero them.
  for (const ParamBucket& b : prog.buckets) {
    if (!b.grads.empty()) {
      Flat g = flat(b.grads);
      be.zero(g.base, static_cast<size_t>(g.elements * g.eb));
    }
    if (b.grad_shard >= 0)
      be.zero(ptr(b.grad_shard), b.shard * dtype_bytes(prog.buffers[b.grad_shard].dtype));
  }
}

void Executor::Impl::run_local(const Op& op) {
  switch (op.kind) {
    case OpKind::kOffload:
    case OpKind::kPrefetch:
      run_copy(op);
      break;
    case OpKind::kSync:
      break;  // its deps have completed: the host has waited for them
    case OpKind::kCountZeros:
    case OpKind::kParamNorm:
      break;  // a statistic the framework only logs: nothing of the step reads it
    case OpKind::kGradNorm:
      run_grad_norm(op);
      break;
    case OpKind::kAdamW:
      run_adamw(op);
      break;
    case OpKind::kCast:
      run_cast(op);
      break;
    default:
      // A kernel of Megatron's unfused loss beyond the fused loss's ops (core/unfused_xent.h):
      // the fused ops compute the same loss and gradient. Async TP's partials sum: the
      // reduce-scatter before it has summed them.
      if (op.role == OpRole::kXentUnfused || op.role == OpRole::kTpPartialsSum) break;
      run_widened(op);
  }
}

void Executor::Impl::end_step(StepResult& res) {
  if (staged()) {  // the loss, summed on the device, read once
    double acc[2] = {0, 0};
    be.copy(acc, loss_acc_, sizeof acc);
    res.loss_sum = acc[0];
    res.loss_tokens = static_cast<int64_t>(acc[1]);
  }
  float sumsq = 0;
  if (sumsq_ != nullptr) be.copy(&sumsq, sumsq_, sizeof(float));
  be.free(sumsq_);
  sumsq_ = scale_ = nullptr;
  res.grad_norm = std::sqrt(static_cast<double>(sumsq)) / cfg->loss_scale;
  res.overflow = !std::isfinite(sumsq);
  clear_routing();  // the step's routing memory, its expert indices checked
  cfg = nullptr;
  result = nullptr;
}

// What the captured kernels took by value from the step's config (a change sends the policy back
// to warm-up and capture): the loss gradient's scale, the tokens it is averaged over, the typed
// path. Dropout's seeds change every step, so a step with dropout is never captured.
std::vector<double> Executor::Impl::graph_key(const StepConfig& c) const {
  return {c.loss_scale, static_cast<double>(c.tokens_per_step), c.typed_bf16 ? 1.0 : 0.0};
}

GraphAction Executor::Impl::decide_graph(const StepConfig& c, StepResult& r) {
  std::string why;
  if (graph_.blockers().empty()) {
    if (c.trace)
      why = "a traced step runs op by op (each kernel timed between its own events)";
    else if (!c.stage_host_traffic)
      why = "StepConfig::stage_host_traffic off: the step uploads tokens and reads losses";
    else if (has_dropout_ && c.dropout_p > 0)
      why = "dropout: each step's mask seeds are kernel arguments (seed_for), not device memory";
    else if (c.inject_overflow)
      why = "an injected overflow: a host write into the step's loss gradient";
  }
  if (!why.empty()) {
    r.graph_action = GraphAction::kEager;
    r.graph_reason = why;
    return r.graph_action;
  }
  std::vector<double> key = graph_key(c);
  if (graph_id_ >= 0 && key != graph_key_) {  // the captured kernels' arguments changed
    graph_.invalidate();
    graph_id_ = -1;
  }
  r.graph_action = graph_.next();
  r.graph_reason = graph_.reason();
  if (r.graph_action == GraphAction::kCapture) graph_key_ = std::move(key);
  return r.graph_action;
}

// Outside the step's ops: the gradients zeroed and the inputs staged before, the loss and the
// norm read after (end_step). Between them nothing touches host memory when the inputs are
// staged, and the body can be a graph (runtime/step_graph.h).
StepResult Executor::step(const StepConfig& config) {
  Impl& im = *impl_;
  StepResult result;
  im.begin_step(config, result);
  const GraphAction action = im.decide_graph(config, result);
  if (im.staged()) im.stage_inputs();
  Impl::Scheduler scheduler(im, config, result);
  const Backend::HostTraffic before = im.be.host_traffic();
  if (action == GraphAction::kCapture || action == GraphAction::kReplay) scheduler.run_body(action);
  if (action == GraphAction::kCapture) {  // the body's counts, which its replays repeat
    StepResult& c = im.graph_counts_;
    c.typed_bf16_ops = result.typed_bf16_ops;
    c.widened_bytes = result.widened_bytes;
    c.widened_typed_kind_bytes = result.widened_typed_kind_bytes;
    c.widened_attention_bytes = result.widened_attention_bytes;
    c.moe_count_syncs = result.moe_count_syncs;
  }
  scheduler.run();
  const Backend::HostTraffic after = im.be.host_traffic();
  if (before.reads >= 0) {
    result.step_host_reads = after.reads - before.reads;
    result.step_host_writes = after.writes - before.writes;
  }
  if (action == GraphAction::kReplay) {
    const StepResult& c = im.graph_counts_;
    result.graph_peak_bytes = im.graph_peak_;
    result.typed_bf16_ops += c.typed_bf16_ops;
    result.widened_bytes += c.widened_bytes;
    result.widened_typed_kind_bytes += c.widened_typed_kind_bytes;
    result.widened_attention_bytes += c.widened_attention_bytes;
    result.moe_count_syncs += c.moe_count_syncs;
  }
  scheduler.finish();
  im.end_step(result);
  return result;
}

}  // namespace parasol::runtime
