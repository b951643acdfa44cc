// The optimizer step: deferred gradient reductions (without overlap_grad_reduce), the SP
// all-reduce of replicated weights' gradients, the global gradient norm, and per bucket AdamW on
// this rank's shard, the cast to the low-precision weights, and the ZeRO 1/2 all-gather of the
// updated shards (through host memory under offload).
#include "core/lower_internal.h"
#include "core/optimizer_traffic.h"

namespace parasol::lowering {

// Where the optimizer writes the new weights of this rank's shard: the destination itself when
// it lives where the optimizer ran, else a staging buffer published by publish_update().
std::vector<int> Lowerer::update_target(const Bucket& b, bool gather,
                                        const std::vector<int>& dest) {
  const int layer = b.layer;
  const bool host = p_.offload.optimizer;
  const bool dest_host = p_.offload.params;
  if (gather) {
    if (host)
      return {buffer(name(layer, "w.new") + ".h", {b.shard}, wdt_, BufferClass::kParam, true)};
    if (dest_host) return {buffer(name(layer, "w.new"), {b.shard}, wdt_, BufferClass::kParam)};
  } else if (host != dest_host) {
    return {buffer(name(layer, "w.new") + (host ? ".h" : ""), {b.shard}, wdt_, BufferClass::kParam,
                   host)};
  }
  return dest;
}

// AdamW on bucket `b`'s shard and the new low-precision weights where the next step reads them.
void Lowerer::update(Bucket& b, int norm, int norm_op) {
  Label label(this, b);
  const int layer = b.layer;
  const bool cast = b.master_in_opt;  // the new weights are cast (or copied) from the master
  const bool host = p_.offload.optimizer;
  const double n = static_cast<double>(b.shard);
  const int stream = host ? kCopy : kCompute;
  std::vector<int> grads = host         ? std::vector<int>{b.host_grad}
                           : b.zero < 2 ? b.list(b.grads)
                                        : std::vector<int>{b.grad_shard};
  const bool full_params = b.zero < 3;
  // ZeRO 1/2: all-gather the updated shards (none on one rank: single-GPU ZeRO-Offload).
  const bool gather = full_params && b.zero >= 1 && b.ways > 1;
  std::vector<int> dest = full_params ? b.list(b.params) : std::vector<int>{b.param_shard};
  std::vector<int> first = update_target(b, gather, dest);  // what the optimizer writes
  Op adam = make(OpKind::kAdamW, layer, b.expert ? "experts.adamw" : "adamw", stream);
  adam.elements = n;
  adam.tensors = static_cast<int>(b.specs.size());
  const AdamTraffic traffic = adam_traffic_per_param(wdt_, odt_, cast);
  adam.bytes = traffic.step * n;
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
    op.tensors = static_cast<int>(b.specs.size());
    op.bytes = traffic.cast * n;
    op.reads.push_back(b.opt);
    set(op.writes, first);
    emit(op);
  }
  publish_update(b, gather, first, dest);
}

// Moves the updated shard `first` to the weights `dest`: ZeRO 1/2 all-gather the shards (from
// the device; host-resident parameters receive the gathered weights by a copy), else a copy
// between host and device when they differ.
void Lowerer::publish_update(const Bucket& b, bool gather, const std::vector<int>& first,
                             const std::vector<int>& dest) {
  const int layer = b.layer;
  const bool host = p_.offload.optimizer;
  const bool dest_host = p_.offload.params;
  const double n = static_cast<double>(b.shard);
  if (!gather) {
    if (first != dest)
      copy(dest_host ? OpKind::kOffload : OpKind::kPrefetch, layer,
           dest_host ? "w.offload" : "w.prefetch", wb_ * n, first, dest);
    return;
  }
  int shard = first[0];
  if (host) {  // bring the new shard to the device (into the parameters when they live there)
    if (dest_host) {
      shard = buffer(name(layer, "w.new"), {b.shard}, wdt_, BufferClass::kParam);
      copy(OpKind::kPrefetch, layer, "w.prefetch", wb_ * n, first, {shard});
    } else {
      copy(OpKind::kPrefetch, layer, "w.prefetch", wb_ * n, first, dest);
    }
  }
  const char* what = b.expert ? "experts.w.ag" : "w.ag";
  if (gathers_in_forward(b)) return;  // gather_updated(), in the next step's forward
  if (!dest_host) {
    const std::vector<int> src = host ? dest : first;
    collective(OpKind::kAllGather, b.group, layer, what, updated_gather_bytes(b), src, dest);
    return;
  }
  std::vector<int> full;
  for (const Spec& s : b.specs)
    full.push_back(slot_buffer(s.slot, name(layer, kSlotName[s.slot]) + ".new", s.shape, wdt_,
                               BufferClass::kParam));
  P_.add_block(full, b.shard * b.ways);
  collective(OpKind::kAllGather, b.group, layer, what, wb_ * b.padded(), {shard}, full);
  copy(OpKind::kOffload, layer, "w.offload", wb_ * b.elements, full, dest);
}

// Without overlap_grad_reduce the reductions start once the whole backward has finished.
void Lowerer::deferred_reductions() {
  order_after_ = deferred_.empty() ? -1 : last_compute_;
  for (int bi : deferred_) {
    at(buckets_[bi].layer, Phase::kOptimizer);
    tags_.chunk = buckets_[bi].chunk;
    final_reduce(buckets_[bi]);
  }
  order_after_ = -1;
}

namespace {
// Whether the gradient of weight `slot` is a partial sum over the TP ranks: under SP each TP
// rank saw a different sequence shard, so the replicated weights that act on it (norms, MLA's
// down-projections and latent norms, routers, and the biases of row-parallel GEMMs, added after
// the reduce-scatter) have partial gradients, summed over TP (Megatron's
// allreduce_layernorm_grads); with an expert grid of its own and no SP, each TP rank routes its
// own slice of the tokens, so the router's gradient is partial.
bool partial_over_tp(Slot slot, bool sp, bool slice) {
  switch (slot) {
    case kRouter:
      return sp || slice;
    case kNorm1:
    case kNorm2:
    case kFnorm:
    case kOutB:
    case kFc2B:
    case kSfc2B:
    case kQDown:
    case kQDownB:
    case kKvDown:
    case kKvDownB:
    case kQNorm:
    case kKvNorm:
      return sp;
    default:
      return false;
  }
}

// Appends bucket `b`'s partial gradients in `g` to `ids` and their elements to `n`.
void sp_partial_grads(const Bucket& b, const WSet& g, bool sp, bool slice, std::vector<int>& ids,
                      double& n) {
  for (const Spec& s : b.specs) {
    if (!partial_over_tp(s.slot, sp, slice)) continue;
    ids.push_back(g[s.slot]);
    double e = 1;
    for (int64_t d : s.shape) e *= static_cast<double>(d);
    n += e;
  }
}
}  // namespace

// The SP partial gradients of the ZeRO 0/1 buckets, summed over TP in one all-reduce before the
// optimizer (ZeRO-2/3 buckets sum theirs before each reduce-scatter: sp_bucket_all_reduce()).
void Lowerer::sp_grad_all_reduce() {
  std::vector<int> g;
  double n = 0;
  for (const Bucket& b : buckets_)
    if (b.zero < 2 && !b.frozen) sp_partial_grads(b, b.grads, sp_, slice_, g, n);
  if (!g.empty()) collective(OpKind::kAllReduce, Group::kTp, -1, "sp.g.ar", 4 * n, g, g);
}

// ZeRO-2/3 under SP: bucket `b`'s partial gradients `g` (of a micro-batch, or the step's
// accumulators) summed over TP before they are reduce-scattered over the data-parallel ranks.
void Lowerer::sp_bucket_all_reduce(const Bucket& b, const WSet& g) {
  if (!sp_ && !slice_) return;
  std::vector<int> ids;
  double n = 0;
  sp_partial_grads(b, g, sp_, slice_, ids, n);
  if (!ids.empty()) collective(OpKind::kAllReduce, Group::kTp, b.layer, "sp.g.ar", 4 * n, ids, ids);
}

// Global gradient norm: this rank's shard, summed over the ranks holding other shards. Returns
// the norm buffer; norm_op is the last op that writes it.
int Lowerer::grad_norm(int& norm_op) {
  Op op = make(OpKind::kGradNorm, -1, "grad.norm", kCompute);
  double n = 0;
  for (const Bucket& b : buckets_) {
    if (b.frozen) continue;
    n += static_cast<double>(b.shard);
    op.tensors += static_cast<int>(b.specs.size());
    if (b.zero < 2)
      set(op.reads, b.list(b.grads));
    else
      op.reads.push_back(b.stream_grads ? b.host_grad : b.grad_shard);
  }
  int norm = buffer("grad.norm", {1}, Dtype::kFp32, BufferClass::kWorkspace);
  op.writes.push_back(norm);
  op.elements = n;
  op.bytes = kGradNormBytesPerParam * n;
  norm_op = emit(op);
  tags_.chunk = 0;
  grad_stats_all_reduce(norm, norm_op);
  return norm;
}

// A gradient statistic's scalar `buf` summed over the ranks holding other parts of the gradients
// (Megatron's grad_stats_parallel_group); `last_op` becomes the last op that writes it.
void Lowerer::grad_stats_all_reduce(int buf, int& last_op) {
  // Gradients differ across the data-parallel ranks when sharded there: ZeRO, experts carved out
  // of dp, or an expert grid of its own (whose groups span the stage's ranks).
  const bool sharded = p_.zero >= 1 || p_.ep > 1 || grid_;
  const char* what = P_.ops[last_op].kind == OpKind::kGradNorm ? "norm.ar" : "stat.ar";
  if (t_ > 1) last_op = collective(OpKind::kAllReduce, Group::kTp, -1, what, 4, buf, buf);
  if (pp_ > 1) last_op = collective(OpKind::kAllReduce, Group::kPp, -1, what, 4, buf, buf);
  if (sharded && p_.dp * p_.cp > 1)
    last_op = collective(OpKind::kAllReduce, Group::kDpCp, -1, what, 4, buf, buf);
}

// Megatron's --log-num-zeros-in-grad: count_zeros_fp32 after the clip and before the step
// (megatron/core/optimizer/optimizer.py step(); clip_grads.py count_zeros_fp32): per gradient
// tensor of this rank's optimizer, count_nonzero, `numel - count` and an add into the total, then
// an all-reduce and `.item()`: the host waits for the gradients before it issues the step.
void Lowerer::count_zeros() {
  // One op per gradient tensor (a bucket's shard under ZeRO-2/3), as the Python loop issues them:
  // the host issues the next tensor's kernels while the device runs the last one's.
  const int zeros = buffer("grad.zeros", {1}, Dtype::kFp32, BufferClass::kWorkspace);
  int last = -1;
  auto count = [&](int grad, int tensors, double elements) {
    Op op = make(OpKind::kCountZeros, -1, "grad.zeros", kCompute);
    op.tensors = tensors;
    op.elements = elements;
    op.bytes = kCountZerosBytesPerParam * elements;
    op.reads.push_back(grad);
    op.reads.push_back(zeros);
    op.writes.push_back(zeros);
    last = emit(op);
  };
  for (const Bucket& b : buckets_) {
    if (b.frozen) continue;
    if (b.zero >= 2) {
      count(b.stream_grads ? b.host_grad : b.grad_shard, static_cast<int>(b.specs.size()),
            static_cast<double>(b.shard));
      continue;
    }
    // This rank's part of each tensor: its share of the bucket's shard.
    const double share = b.elements > 0 ? static_cast<double>(b.shard) / b.elements : 0;
    for (const Spec& sp : b.specs) {
      double e = 1;
      for (int64_t d : sp.shape) e *= static_cast<double>(d);
      count(b.grads[sp.slot], 1, e * share);
    }
  }
  if (last < 0) return;
  tags_.chunk = 0;
  grad_stats_all_reduce(zeros, last);
  host_sync("grad.zeros.item", {last});
}

// Megatron's --log-params-norm: calc_params_l2_norm after the step (megatron/training/training.py
// train loop; training/utils/common_utils.py): a multi-tensor L2 norm of this rank's fp32 main
// parameters (the distributed optimizer's shards), all-reduced over the data-parallel ranks
// holding the other shards and the model-parallel ranks, then `.item()`.
void Lowerer::params_norm() {
  at(-1, Phase::kOptimizer);
  tags_.micro_batch = -1;
  tags_.chunk = 0;
  Op op = make(OpKind::kParamNorm, -1, "param.norm", kCompute);
  double n = 0;
  for (const Bucket& b : buckets_) {
    if (b.frozen) continue;
    n += static_cast<double>(b.shard);
    op.tensors += static_cast<int>(b.specs.size());
    if (b.master_in_opt && !p_.offload.optimizer)
      op.reads.push_back(b.opt);
    else if (b.zero < 3)
      set(op.reads, b.list(b.params));
    else
      op.reads.push_back(b.param_shard);
  }
  const int norm = buffer("param.norm", {1}, Dtype::kFp32, BufferClass::kWorkspace);
  op.writes.push_back(norm);
  op.elements = n;
  op.bytes = kParamNormBytesPerParam * n;
  int last = emit(op);
  grad_stats_all_reduce(norm, last);
  host_sync("param.norm.item", {last});
}

void Lowerer::optimizer() {
  tags_.micro_batch = -1;
  tags_.chunk = 0;
  at(-1, Phase::kOptimizer);
  deferred_reductions();
  at(-1, Phase::kOptimizer);
  if (sp_ || slice_) sp_grad_all_reduce();
  int norm_op = -1;
  const int norm = grad_norm(norm_op);
  if (p_.log_num_zeros_in_grad) count_zeros();
  for (Bucket& b : buckets_) {
    if (b.frozen) continue;
    at(b.layer, Phase::kOptimizer);
    tags_.chunk = b.chunk;
    update(b, norm, norm_op);
  }
  at(-1, Phase::kOptimizer);
  persistent_gathers();
}

}  // namespace parasol::lowering
