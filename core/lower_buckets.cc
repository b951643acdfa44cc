// Parameter buckets (a layer's dense or expert weights, the embedding, the head) and their
// persistent state (parameters, gradients, optimizer state, ZeRO shards), the per-use weights
// (ZeRO-3 all-gathers, parameter prefetch from host memory) and the data-parallel gradient
// reductions (all-reduce, reduce-scatter), and Program::buckets.
#include <algorithm>
#include <cmath>
#include <string_view>

#include "core/error.h"
#include "core/fp8_params.h"
#include "core/fsdp_copies.h"
#include "core/fsdp_pipeline_reduce.h"
#include "core/gather_units.h"
#include "core/lower_internal.h"
#include "core/offload_rules.h"
#include "core/te_weight_cache.h"

namespace parasol::lowering {

namespace {
// "L3.<what>" of a layer's bucket, "<label>.<what>" of the embedding or head.
std::string weight_name(const Bucket& b, const char* what) {
  return b.layer >= 0 ? name(b.layer, what) : std::string(b.label) + "." + what;
}
}  // namespace

// The groups bucket `b`'s state is sharded over (its gradients reduced over): the data-parallel
// group (dp x cp; experts the expert data-parallel group, Plan::expert_dp()), or under HSDP its
// shard groups, with the replicas across them; a shard group of one rank replicates the bucket
// over the whole group (ZeRO 0).
void Lowerer::set_reduction(Bucket& b) const {
  const int full = b.expert ? p_.expert_dp() : p_.dp * p_.cp;
  const int k = p_.shard_degree <= 0 ? full
                : b.expert           ? p_.expert_shard_ranks()
                                     : p_.dense_shard_ranks();
  b.group = b.expert ? Group::kExpertDp : Group::kDpCp;
  b.ways = full;
  b.zero = full > 1 ? p_.zero : 0;
  if (k == 1) b.zero = 0;
  // ZeRO-Offload streams the gradients to host memory even on one rank (a ZeRO-2 bucket of one
  // way: DeepSpeed's single-GPU ZeRO-Offload), with nothing to shard or gather.
  b.stream_grads = gradients_streamed_to_host(p_) && (b.zero >= 2 || full == 1);
  if (b.stream_grads && b.zero < 2) b.zero = 2;
  if (k > 1 && k < full) {
    b.group = b.expert ? Group::kExpertShard : Group::kDpShard;
    b.ways = k;
    b.rgroup = b.expert ? Group::kExpertReplicate : Group::kDpReplicate;
    b.rways = full / k;
  }
  b.step_grads = b.zero >= 3 && p_.reshard == Reshard::kAfterStep;
}

void Lowerer::add_bucket(Bucket b) {
  const bool low = p_.precision != Dtype::kFp32;
  b.elements = 0;
  for (const Spec& s : b.specs) {
    double n = 1;
    for (int64_t d : s.shape) n *= static_cast<double>(d);
    b.elements += n;
  }
  set_reduction(b);
  if (b.frozen) b.zero = 0;  // nothing of it in the optimizer to shard
  b.shard = static_cast<int64_t>(b.zero >= 1 ? std::ceil(b.elements / b.ways) : b.elements);
  const bool host_params = p_.offload.params;
  auto bname = [&](const char* what, const char* suffix) { return weight_name(b, what) + suffix; };
  const char* whole = b.expert ? "experts" : "params";
  const int64_t padded = b.zero >= 1 ? b.shard * b.ways : 0;
  if (b.zero < 3) {
    // Plan::fp8_param_gather: the fp8 weights in a uint8 buffer of their own, beside the bf16
    // rest (Megatron's buffers by param dtype), each padded to the shard group, and the
    // transpose Transformer Engine keeps of each where the device's fp8 GEMMs take TN operands
    // only (Float8Tensor's _transpose; none on Blackwell: core/fp8_params.h).
    std::vector<int> fp8_ids, other_ids;
    double fp8_n = 0;
    for (const Spec& s : b.specs) {
      b.params[s.slot] =
          slot_buffer(s.slot, bname(kSlotName[s.slot], ".w"), s.shape, s.fp8 ? Dtype::kFp8 : wdt_,
                      BufferClass::kParam, host_params, true);
      (s.fp8 ? fp8_ids : other_ids).push_back(b.params[s.slot]);
      if (!s.fp8) continue;
      fp8_n += static_cast<double>(shape_elements(s.shape));
      if (fp8_transpose_)
        buffer(bname(kSlotName[s.slot], ".wT"),
               std::vector<int64_t>(s.shape.rbegin(), s.shape.rend()), Dtype::kFp8,
               BufferClass::kParam, false, true);
    }
    b.fp8_elements = fp8_n;
    // Transformer Engine's cached fp8 copy of each fp8 linear's bf16 weight, kept across
    // micro-batches and steps (core/te_weight_cache.h): its data and, where the device keeps
    // one, its transpose, persistent, outside the parameter buffers.
    if (const double cached = te_cached_fp8_weight_bytes(p_, fp8_transpose_); cached > 0)
      for (const Spec& s : b.specs) {
        if (!s.fp8_linear) continue;
        buffer(bname(kSlotName[s.slot], ".w.fp8"), s.shape, Dtype::kFp8, BufferClass::kParam, false,
               true);
        if (cached > 1)
          buffer(bname(kSlotName[s.slot], ".w.fp8T"),
                 std::vector<int64_t>(s.shape.rbegin(), s.shape.rend()), Dtype::kFp8,
                 BufferClass::kParam, false, true);
      }
    if (fp8_ids.empty()) {
      P_.add_block(b.list(b.params), padded);
    } else {
      auto pad = [&](double n) {
        return b.zero >= 1 ? static_cast<int64_t>(std::ceil(n / b.ways)) * b.ways : 0;
      };
      P_.add_block(fp8_ids, pad(fp8_n));
      if (!other_ids.empty()) P_.add_block(other_ids, pad(b.elements - fp8_n));
    }
  } else {
    b.param_shard =
        buffer(bname(whole, ".w"), {b.shard}, wdt_, BufferClass::kParam, host_params, true);
  }
  if (b.frozen) {
    // A frozen base bucket (Plan::lora_rank): its parameters only.
    buckets_.push_back(std::move(b));
    return;
  }
  if (b.zero < 2) {
    for (const Spec& s : b.specs)
      b.grads[s.slot] = slot_buffer(s.slot, bname(kSlotName[s.slot], ".g"), s.shape, gbuf_dt_,
                                    BufferClass::kGrad, false, true);
    P_.add_block(b.list(b.grads), padded);
  } else if (!b.stream_grads) {
    b.grad_shard = buffer(bname(whole, ".g"), {b.shard}, gdt_, BufferClass::kGrad, false, true);
  }
  // The fp32 master weights live in the optimizer state unless the parameters themselves are
  // fp32 (or pure bf16, their own master) and where the optimizer runs.
  b.master_in_opt = (low && odt_ == Dtype::kFp32) || p_.offload.optimizer || p_.offload.params;
  b.opt = buffer(bname(whole, ".opt"), {b.master_in_opt ? 3 : 2, b.shard}, odt_,
                 BufferClass::kOptimizer, p_.offload.optimizer, true);
  if (p_.offload.optimizer)
    b.host_grad = buffer(bname(whole, ".hg"), {b.shard}, gdt_, BufferClass::kGrad, true, true);
  buckets_.push_back(std::move(b));
}

std::vector<int64_t> Lowerer::norm_shape() const {
  return m_.norm == Norm::kLayerNorm ? std::vector<int64_t>{2, h_} : std::vector<int64_t>{h_};
}

void Lowerer::add_embedding_bucket(int chunk) {
  Bucket b;
  b.label = "emb";
  b.chunk = chunk;
  b.frozen = p_.lora();
  b.specs.push_back({kTable, {vocab_t_, h_}});
  if (m_.learned_positions) b.specs.push_back({kPos, {m_.seq_len, h_}});
  emb_bucket_ = static_cast<int>(buckets_.size());
  add_bucket(std::move(b));
}

namespace {
// The weight slot of core/layer_shapes.h's linear or norm `name`.
Slot slot_named(const char* name) {
  static constexpr std::pair<const char*, Slot> kByName[] = {
      {"qkv", kQkv},   {"out", kOut},        {"q_down", kQDown},    {"q_up", kQUp},
      {"q", kQ},       {"kv_down", kKvDown}, {"kv_up", kKvUp},      {"fc1", kFc1},
      {"fc2", kFc2},   {"router", kRouter},  {"shared_fc1", kSfc1}, {"shared_fc2", kSfc2},
      {"efc1", kEfc1}, {"efc2", kEfc2},      {"q_norm", kQNorm},    {"kv_norm", kKvNorm}};
  for (const auto& [n, slot] : kByName)
    if (std::string_view(n) == name) return slot;
  check_failed("name is one of kByName's",
               std::string("no weight slot for the layer's '") + name + "'", __FILE__, __LINE__);
}
}  // namespace

static_assert(kQkvB == kQkv + 1 && kOutB == kOut + 1 && kFc1B == kFc1 + 1 && kFc2B == kFc2 + 1 &&
                  kEfc1B == kEfc1 + 1 && kEfc2B == kEfc2 + 1 && kQDownB == kQDown + 1 &&
                  kQUpB == kQUp + 1 && kQB == kQ + 1 && kKvDownB == kKvDown + 1 &&
                  kKvUpB == kKvUp + 1 && kSfc1B == kSfc1 + 1 && kSfc2B == kSfc2 + 1,
              "a linear's bias slot follows its weight slot");

// A linear's weight (and bias) as this rank holds it: split `parts` ways as its Split says.
void Lowerer::add_linear_specs(Bucket& b, const LinearShape& s, int64_t parts) const {
  const Slot slot = slot_named(s.name);
  const int64_t in = s.split == Split::kRow ? s.in / parts : s.in;
  const int64_t out = s.split == Split::kColumn ? s.out / parts : s.out;
  b.specs.push_back(
      {slot, {in, out}, p_.fp8_param_gather && fp8_param_linear(s), fp8_param_linear(s)});
  if (s.bias) b.specs.push_back({static_cast<Slot>(slot + 1), {out}});
}

// The dense bucket of `layer` (stage-local index `local`) and, for an MoE layer, its expert
// bucket; the linears and norms are core/layer_shapes.h's.
void Lowerer::add_layer_buckets(int chunk, int layer, int local) {
  const std::vector<int64_t> norm = norm_shape();
  const bool moe = m_.is_moe_layer(layer);
  Bucket d;
  d.layer = layer;
  d.chunk = chunk;
  d.frozen = p_.lora();
  d.specs.push_back({kNorm1, norm});
  for (const LinearShape& s : attention_linears(m_)) add_linear_specs(d, s, t_);
  for (const NormShape& n : attention_norms(m_))
    d.specs.push_back({slot_named(n.name), m_.norm == Norm::kLayerNorm
                                               ? std::vector<int64_t>{2, n.width}
                                               : std::vector<int64_t>{n.width}});
  d.specs.push_back({kNorm2, norm});
  for (const LinearShape& s : mlp_linears(m_, layer)) add_linear_specs(d, s, t_);
  layer_buckets_[local][0] = static_cast<int>(buckets_.size());
  add_bucket(std::move(d));
  add_lora_bucket(chunk, layer, local);
  if (!moe) return;
  Bucket e;
  e.layer = layer;
  e.chunk = chunk;
  e.expert = true;
  const int64_t le = local_experts_;
  // Each local expert's linears, split over the experts' tensor-parallel degree.
  for (const LinearShape& s : expert_linears(m_)) {
    Bucket one;
    add_linear_specs(one, s, etp_);
    for (Spec sp : one.specs) {
      sp.shape.insert(sp.shape.begin(), le);
      e.specs.push_back(std::move(sp));
    }
  }
  layer_buckets_[local][1] = static_cast<int>(buckets_.size());
  add_bucket(std::move(e));
}

void Lowerer::add_head_bucket(int chunk) {
  Bucket b;
  b.label = "head";
  b.chunk = chunk;
  b.frozen = p_.lora();
  b.specs.push_back({kFnorm, norm_shape()});
  // Tied embeddings share the table on a single stage; with pp > 1 the last stage holds a
  // copy (Megatron), reduced like any other weight.
  if (!m_.tied_embeddings || pp_ > 1) b.specs.push_back({kHead, {h_, vocab_t_}});
  head_bucket_ = static_cast<int>(buckets_.size());
  add_bucket(std::move(b));
}

void Lowerer::build_buckets() {
  layer_buckets_.assign(per_stage_, {-1, -1});
  for (int c = 0; c < vpp_; ++c) {
    const int v = c * pp_ + s_;
    if (v == 0) add_embedding_bucket(c);
    for (int j = 0; j < layers_in_chunk_[c]; ++j)
      add_layer_buckets(c, layer_of(c, j), local_of(c, j));
    if (v == V_ - 1) add_head_bucket(c);
  }
}

// The key of bucket `b`'s weights in held_ when they stay gathered past this use (ZeRO-3
// resharded after the backward: per micro-batch; after the step: per bucket), else -1.
int Lowerer::held_key(const Bucket& b) const {
  if (b.zero < 3 || p_.reshard == Reshard::kAfterForward) return -1;
  const int bi = static_cast<int>(&b - buckets_.data());
  return p_.reshard == Reshard::kAfterStep ? bi : bi * M_ + tags_.micro_batch;
}

// Device buffers holding bucket `b`'s weights for one use: the persistent ones, per-use copies
// gathered (ZeRO-3) and/or prefetched from host memory (parameter offload), or the copy
// gathered by an earlier use that is still held (ZeRO-3 resharded after the backward or the
// step). `dep`: an op the first copy/gather waits for (keeps it one use ahead); -1 for none.
void Lowerer::acquire(const Bucket& b, WSet& out, int dep) {
  Label label(this, b);
  if (b.zero < 3 && !p_.offload.params) {
    for (const Spec& s : b.specs) out[s.slot] = b.params[s.slot];
    if (gathers_in_forward(b)) gather_updated(b, dep);
    return;
  }
  if (ds_lazy_ && b.zero >= 3 && !b.expert && b.layer >= 0) {
    ds_acquire(b, out);
    return;
  }
  const int key = held_key(b);
  if (key >= 0 && held_valid_[key]) {
    for (const Spec& s : b.specs) out[s.slot] = held_[key][s.slot];
    return;
  }
  const int layer = b.layer;
  // Weights held for the whole step belong to no micro-batch.
  const int mb = b.zero >= 3 && p_.reshard == Reshard::kAfterStep ? -1 : tags_.micro_batch;
  std::vector<int> dev;
  dev.reserve(b.specs.size());
  WSet mine = no_weights();
  for (const Spec& s : b.specs) {
    mine[s.slot] =
        slot_buffer(s.slot, name(layer, kSlotName[s.slot], mb), s.shape, wdt_, BufferClass::kParam);
    out[s.slot] = mine[s.slot];
    dev.push_back(mine[s.slot]);
  }
  P_.add_block(dev, b.zero >= 3 ? b.shard * b.ways : 0);
  if (b.zero < 3) {
    copy(OpKind::kPrefetch, layer, b.expert ? "experts.prefetch" : "w.prefetch", wb_ * b.elements,
         b.list(b.params), dev, {dep});
    return;
  }
  gather(b, dev, dep);
  if (key < 0) return;
  held_[key] = mine;
  held_valid_[key] = 1;
}

// ZeRO-3: all-gather bucket `b`'s shards over its shard group into `dev` (the shard prefetched
// from host memory first under parameter offload).
void Lowerer::gather(const Bucket& b, const std::vector<int>& dev, int dep) {
  const int layer = b.layer;
  int src = b.param_shard;
  if (p_.offload.params) {
    int d = buffer(name(layer, "shard", tags_.micro_batch), {b.shard}, wdt_, BufferClass::kParam);
    copy(OpKind::kPrefetch, layer, "shard.prefetch", wb_ * b.shard, {src}, {d}, {dep});
    src = d;
    dep = -1;
  }
  // FSDP1 casts the fp32 shard to the parameter dtype first, on its pre-unshard stream (a side
  // stream: the copy stream here).
  for (const FsdpCopy& c : fsdp_gather_copies(p_, false)) {
    const int cast = ws(layer, c.what, {b.shard});
    copy(OpKind::kResidualAdd, layer, c.what, c.bytes(b.padded(), double(b.shard)), {src}, {cast},
         {dep}, kCopy);
    src = cast;
    dep = -1;
  }
  const int ag = collective(OpKind::kAllGather, b.group, layer, b.expert ? "experts.ag" : "w.ag",
                            wb_ * b.padded(), {src}, dev, {dep});
  set_calls(b, ag, gather_fractions(p_, b.weight_elements()));
  if (!fsdp_gather_copies(p_, true).empty())
    pending_copy_out_.emplace_back(static_cast<int>(&b - buckets_.data()), dev);
}

// FSDP2's copy-out (foreach_all_gather_copy_out, in wait_for_unshard on the compute stream) of
// every gather whose buffers the use `w` reads: issued at the use, so that the compute before it
// does not wait for the gather.
void Lowerer::fsdp_copy_out(const WSet& w) {
  for (size_t i = 0; i < pending_copy_out_.size();) {
    const auto& [bi, dev] = pending_copy_out_[i];
    bool used = false;
    for (int id : w)
      if (id >= 0 && id == dev.front()) used = true;
    if (!used) {
      ++i;
      continue;
    }
    const Bucket& b = buckets_[static_cast<size_t>(bi)];
    Label label(this, b);
    for (const FsdpCopy& c : fsdp_gather_copies(p_, true)) {
      Op op = make(OpKind::kResidualAdd, b.layer, c.what, kCompute);
      op.elements = b.padded();
      op.bytes = c.bytes(b.padded(), double(b.shard));
      set(op.reads, dev);
      set(op.writes, dev);
      emit(op);
    }
    pending_copy_out_.erase(pending_copy_out_.begin() + static_cast<std::ptrdiff_t>(i));
  }
}

// FSDP's kernels around a reduce-scatter of bucket `b` (core/fsdp_copies.h): before it, on the
// unsharded gradients `grads`; after it, on the shard `grads`. On the compute stream: they are
// memory-bound kernels taking the GPU beside the backward (FSDP1 runs its cast and division on
// its post-backward stream, the concatenation is autograd's). FSDP1's work in place; FSDP2's
// copy-in writes the reduce-scatter input, a buffer of its own in the reduce dtype
// (torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py @010ae4a foreach_reduce:
// reduce_scatter_comm.allocate(..., dtype=reduce_dtype), foreach_reduce_scatter_copy_in, then
// unsharded_grads.clear()), which the reduce-scatter reads: the unsharded gradients are freed
// once it is filled.
std::vector<int> Lowerer::fsdp_reduce_copies(const Bucket& b, const std::vector<int>& grads,
                                             bool after) {
  std::vector<int> out = grads;
  for (const FsdpCopy& c : parasol::fsdp_reduce_copies(p_, b.ways, after)) {
    Op op = make(OpKind::kResidualAdd, b.layer, c.what, kCompute);
    op.elements = after ? double(b.shard) : b.padded();
    op.bytes = c.bytes(b.padded(), double(b.shard));
    set(op.reads, out);
    if (!after && p_.fsdp_impl == FsdpImpl::kFsdp2) {
      const std::string mb =
          tags_.micro_batch >= 0 ? ".m" + std::to_string(tags_.micro_batch) : std::string();
      out = {buffer(weight_name(b, b.expert ? "experts" : "params") + ".g.rs_in" + mb,
                    {static_cast<int64_t>(b.padded())}, p_.grad_reduce_dtype, BufferClass::kGrad)};
    }
    set(op.writes, out);
    emit(op);
  }
  return out;
}

// Megatron-Core's distributed optimizer under --overlap-param-gather (distributed/
// param_and_grad_buffer.py @d98e8a6: start_param_sync / finish_param_sync, called from the
// forward pre-hooks of distributed_data_parallel.py): the step does not gather the updated shards
// after the optimizer; the next forward's pre-hook of a bucket's first parameter waits for its
// all-gather (issuing it if none is in flight: the first bucket's is exposed) and dispatches the
// next bucket's, so each gather runs one bucket ahead beside the forward. A one-step Program is
// the steady state: the gathers of the last step's update open this step's forward. Without
// overlap_param_gather (or with the optimizer or parameters offloaded) they follow the optimizer.
bool Lowerer::gathers_in_forward(const Bucket& b) const {
  return b.zero >= 1 && b.zero < 3 && b.ways > 1 && p_.overlap_param_gather &&
         !p_.offload.optimizer && !p_.offload.params;
}

void Lowerer::gather_updated(const Bucket& b, int dep) {
  const size_t bi = static_cast<size_t>(&b - buckets_.data());
  if (gathered_in_forward_[bi]) return;
  gathered_in_forward_[bi] = 1;
  Label label(this, b);
  const std::vector<int> params = b.list(b.params);
  collective(OpKind::kAllGather, b.group, b.layer, b.expert ? "experts.w.ag" : "w.ag",
             updated_gather_bytes(b), params, params, {dep});
}

// Bytes of the distributed optimizer's all-gather of bucket `b`'s updated weights: the shards of
// all ways in the weights' dtype; under Plan::fp8_param_gather the fp8 weights' shards move one
// byte an element (their own padded buffer, as add_bucket lays them out).
double Lowerer::updated_gather_bytes(const Bucket& b) const {
  if (b.fp8_elements <= 0) return wb_ * b.padded();
  auto pad = [&](double n) { return std::ceil(n / b.ways) * b.ways; };
  const double rest = b.elements - b.fp8_elements;
  return pad(b.fp8_elements) + (rest > 0 ? wb_ * pad(rest) : 0.0);
}

// ZeRO-3 under DeepSpeed's per-module granularity (Plan::zero3_unit, core/gather_units.h): the
// calls op `id` of a layer's dense bucket is issued as, each carrying `fractions` of its bytes.
// Expert buckets and the embedding and head stay one call each.
void Lowerer::set_calls(const Bucket& b, int id, const std::vector<double>& fractions) {
  if (b.zero < 3 || b.expert || b.layer < 0 || fractions.size() < 2) return;
  Op& op = P_.ops[static_cast<size_t>(id)];
  for (double f : fractions) op.calls.push_back(f * op.bytes);
}

void Lowerer::regather_layer(int local, const WSet& w, int dep) {
  if (p_.zero < 3 || p_.zero3_unit != GatherUnit::kModule || p_.offload.params ||
      p_.reshard != Reshard::kAfterForward)
    return;
  for (int bi : layer_buckets_[local]) {
    if (bi < 0) continue;
    const Bucket& b = buckets_[bi];
    if (b.zero < 3 || b.expert || b.layer < 0 || b.ways < 2) continue;
    const std::vector<double> weights = b.weight_elements();
    const std::vector<double> again = regathered_weights(p_, weights);
    double all = 0, part = 0;
    for (double x : weights) all += x;
    for (double x : again) part += x;
    if (part <= 0 || all <= 0) continue;
    Label label(this, b);
    // The modules kept are the layer's last ones (the elements between a module's two uses
    // shrink towards the end of the layer), so the first again.size() modules are gathered
    // again: only their weights are written (the backward of the kept ones does not wait).
    std::vector<int> dev;
    size_t module = 0;
    for (size_t i = 0; i < b.specs.size(); ++i) {
      if (i > 0 && !is_bias_slot(b.specs[i].slot)) ++module;
      if (module < again.size()) dev.push_back(w[b.specs[i].slot]);
    }
    const int ag = collective(OpKind::kAllGather, b.group, b.layer, "w.reag",
                              wb_ * b.padded() * (part / all), {b.param_shard}, dev, {dep});
    std::vector<double> calls = gather_calls(again, static_cast<double>(p_.zero3_prefetch_bucket));
    for (double& x : calls) x /= part;
    set_calls(b, ag, calls);
  }
}

void Lowerer::ds_acquire(const Bucket& b, WSet& out) {
  const std::vector<double> weights = b.weight_elements();
  // The elements each module's gather moves: its persistent parameters are whole already.
  std::vector<double> gathered = gathered_layer_weights(m_, p_, b.layer);
  if (gathered.size() != weights.size()) gathered = weights;
  const int modules = static_cast<int>(weights.size());
  const bool backward = tags_.phase == Phase::kBackward;
  const int first = ds_next_;
  ds_next_ += modules;
  PARASOL_CHECK(ds_next_ <= static_cast<int>(ds_.source.size()),
                "DeepSpeed's schedule holds fewer module uses than the stage's lowering acquires");
  const int bi = static_cast<int>(&b - buckets_.data());
  size_t si = 0;
  for (int k = 0; k < modules; ++k) {
    // Module k: a weight and the bias slots that follow it.
    std::vector<size_t> specs{si++};
    while (si < b.specs.size() && is_bias_slot(b.specs[si].slot)) specs.push_back(si++);
    const int use = first + (backward ? modules - 1 - k : k);
    const int src = ds_.source[static_cast<size_t>(use)];
    if (ds_copy_of_source_[static_cast<size_t>(src)] < 0) {
      DsCopy c;
      c.bucket = bi;
      c.elements = gathered[static_cast<size_t>(k)];
      c.fetch_step = ds_.fetch_step[static_cast<size_t>(use)];
      for (size_t s : specs) {
        const Spec& sp = b.specs[s];
        c.buffers.push_back(slot_buffer(sp.slot,
                                        name(b.layer, kSlotName[sp.slot], tags_.micro_batch),
                                        sp.shape, wdt_, BufferClass::kParam));
      }
      P_.add_block(c.buffers);
      ds_copy_of_source_[static_cast<size_t>(src)] = static_cast<int>(ds_copies_.size());
      ds_pending_.push_back(static_cast<int>(ds_copies_.size()));
      ds_copies_.push_back(std::move(c));
    }
    const std::vector<int> bufs =
        ds_copies_[static_cast<size_t>(ds_copy_of_source_[static_cast<size_t>(src)])].buffers;
    for (size_t j = 0; j < specs.size(); ++j) {
      out[b.specs[specs[j]].slot] = bufs[j];
      const size_t id = static_cast<size_t>(bufs[j]);
      if (ds_uses_of_buffer_.size() <= id) ds_uses_of_buffer_.resize(id + 1);
      ds_uses_of_buffer_[id].push_back(use);
    }
  }
  // A copy whose fetching use was reached already (a prefetch beyond the acquired uses) is
  // issued at its acquire.
  ds_reach({});
}

// The uses reached by an op reading `reads`: a buffer's first use after the last one reached.
// Every copy fetched at a use up to the furthest reached is issued, before the op.
void Lowerer::ds_reach(const std::vector<int>& reads) {
  int reach = ds_reached_;
  for (int r : reads) {
    if (r < 0 || static_cast<size_t>(r) >= ds_uses_of_buffer_.size()) continue;
    for (int u : ds_uses_of_buffer_[static_cast<size_t>(r)])
      if (u > ds_reached_) {
        reach = std::max(reach, u);
        break;
      }
  }
  ds_reached_ = reach;
  std::vector<int> now;
  std::erase_if(ds_pending_, [&](int ci) {
    if (ds_copies_[static_cast<size_t>(ci)].fetch_step > ds_reached_) return false;
    now.push_back(ci);
    return true;
  });
  // The copies one use fetches from one bucket go in one all-gather (DeepSpeed gathers the
  // parameters it fetches at a use together: a norm rides with the linear after it).
  std::stable_sort(now.begin(), now.end(), [&](int a, int b) {
    const DsCopy& x = ds_copies_[static_cast<size_t>(a)];
    const DsCopy& y = ds_copies_[static_cast<size_t>(b)];
    return x.fetch_step != y.fetch_step ? x.fetch_step < y.fetch_step : x.bucket < y.bucket;
  });
  for (size_t i = 0; i < now.size();) {
    const DsCopy& c = ds_copies_[static_cast<size_t>(now[i])];
    std::vector<int> group;
    for (size_t j = i; j < now.size(); ++j) {
      const DsCopy& d = ds_copies_[static_cast<size_t>(now[j])];
      if (d.fetch_step != c.fetch_step || d.bucket != c.bucket) break;
      group.push_back(now[j]);
    }
    i += group.size();
    ds_gather(group);
  }
}

void Lowerer::ds_gather(const std::vector<int>& copies) {
  std::vector<int> dev;
  double elements = 0;
  for (int ci : copies) {
    DsCopy& c = ds_copies_[static_cast<size_t>(ci)];
    c.issued = true;
    dev.insert(dev.end(), c.buffers.begin(), c.buffers.end());
    elements += c.elements;
  }
  if (elements <= 0) return;  // persistent parameters only: nothing to gather
  const Bucket& b =
      buckets_[static_cast<size_t>(ds_copies_[static_cast<size_t>(copies[0])].bucket)];
  Label label(this, b);
  collective(OpKind::kAllGather, b.group, b.layer, "w.ag", wb_ * elements, {b.param_shard}, dev,
             {});
}

void Lowerer::persistent_gathers() {
  if (p_.zero < 3 || p_.zero3_unit != GatherUnit::kModule || p_.offload.params) return;
  // After the step: the host issues them once the optimizer's last op is done.
  const int step_end = static_cast<int>(P_.ops.size()) - 1;
  int last = -1;
  for (const Bucket& b : buckets_) {
    if (b.zero < 3 || b.expert || b.layer < 0 || b.ways < 2) continue;
    Label label(this, b);
    for (const PersistentParam& x : persistent_params(m_, p_, b.layer)) {
      const int64_t shard = static_cast<int64_t>(std::ceil(x.elements / b.ways));
      const int in = buffer(name(b.layer, "w.persist.shard"), {shard}, wdt_, BufferClass::kParam);
      // The gathered copy stays on every rank for the whole step (the coordinator never
      // releases it): a persistent buffer, its full size on each rank.
      const int whole = buffer(name(b.layer, "w.persist"), {shard * b.ways}, wdt_,
                               BufferClass::kParam, /*host=*/false, /*persistent=*/true);
      last = collective(OpKind::kAllGather, b.group, b.layer, "w.persist.ag",
                        wb_ * static_cast<double>(shard * b.ways), {in}, {whole},
                        {last >= 0 ? last : step_end});
    }
  }
  if (last >= 0) host_sync("persist.sync", {last});
}

WSet Lowerer::ds_unit_grads(Bucket& b) {
  const int bi = static_cast<int>(&b - buckets_.data());
  if (unit_grads_valid_[static_cast<size_t>(bi)]) return unit_grads_[static_cast<size_t>(bi)];
  WSet g = no_weights();
  for (const Spec& s : b.specs)
    g[s.slot] = slot_buffer(s.slot, name(b.layer, kSlotName[s.slot], tags_.micro_batch) + ".g",
                            s.shape, wdt_, BufferClass::kGrad);
  unit_grads_[static_cast<size_t>(bi)] = g;
  unit_grads_valid_[static_cast<size_t>(bi)] = 1;
  // The modules' gradient buffers (a weight and its bias), grouped in backward order into
  // reduce buckets as core/gather_units.h reduce_calls groups them.
  std::vector<std::vector<int>> modules;
  const std::vector<double> elements = b.weight_elements();
  size_t si = 0;
  while (si < b.specs.size()) {
    std::vector<int> ids{g[b.specs[si++].slot]};
    while (si < b.specs.size() && is_bias_slot(b.specs[si].slot))
      ids.push_back(g[b.specs[si++].slot]);
    modules.push_back(std::move(ids));
  }
  const double bucket = static_cast<double>(p_.zero3_reduce_bucket);
  DsReduce open;
  auto close = [&]() {
    if (open.grads.empty()) return;
    open.bucket = bi;
    open.unwritten = static_cast<int>(open.grads.size());
    const int index = static_cast<int>(ds_reduces_.size());
    for (int id : open.grads) {
      if (ds_reduce_of_buffer_.size() <= static_cast<size_t>(id))
        ds_reduce_of_buffer_.resize(static_cast<size_t>(id) + 1, -1);
      ds_reduce_of_buffer_[static_cast<size_t>(id)] = index;
    }
    ds_reduces_.push_back(std::move(open));
    open = DsReduce{};
  };
  for (size_t k = modules.size(); k-- > 0;) {
    if (bucket > 0 && !open.grads.empty() && open.elements + elements[k] > bucket) close();
    open.grads.insert(open.grads.end(), modules[k].begin(), modules[k].end());
    open.elements += elements[k];
  }
  close();
  return g;
}

// After an op: a reduce bucket whose last gradient it wrote is reduce-scattered now.
void Lowerer::ds_written(const std::vector<int>& writes) {
  for (int w : writes) {
    if (w < 0 || static_cast<size_t>(w) >= ds_reduce_of_buffer_.size()) continue;
    const int r = ds_reduce_of_buffer_[static_cast<size_t>(w)];
    if (r < 0) continue;
    ds_reduce_of_buffer_[static_cast<size_t>(w)] = -1;
    if (--ds_reduces_[static_cast<size_t>(r)].unwritten == 0) ds_reduce(r);
  }
}

// Reduce bucket `r` reduce-scattered into the gradient shard (ZeRO-Offload: into a transient
// shard copied to the pinned host gradient, core/offload_rules.h).
void Lowerer::ds_reduce(int r) {
  DsReduce& red = ds_reduces_[static_cast<size_t>(r)];
  if (red.issued) return;
  red.issued = true;
  for (int id : red.grads)
    if (id >= 0 && static_cast<size_t>(id) < ds_reduce_of_buffer_.size())
      ds_reduce_of_buffer_[static_cast<size_t>(id)] = -1;
  const std::vector<int> grads = red.grads;
  const double shard = std::ceil(red.elements / buckets_[static_cast<size_t>(red.bucket)].ways);
  const Bucket& b = buckets_[static_cast<size_t>(red.bucket)];
  Label label(this, b);
  if (!b.stream_grads) {
    collective(OpKind::kReduceScatter, b.group, b.layer, "g.rs", gb_ * shard * b.ways, grads,
               {b.grad_shard});
    return;
  }
  const int dst = buffer(name(b.layer, "params.g", tags_.micro_batch),
                         {static_cast<int64_t>(shard)}, gdt_, BufferClass::kGrad);
  collective(OpKind::kReduceScatter, b.group, b.layer, "g.rs", gb_ * shard * b.ways, grads, {dst});
  replica_reduce(b, {dst});
  offload_grad_shard(b, {dst}, shard);
}

WSet Lowerer::layer_weights(int local, int dep) {
  WSet w = no_weights();
  for (int bi : layer_buckets_[local])
    if (bi >= 0) acquire(buckets_[bi], w, dep);
  return w;
}

// Gradient buffers of bucket `b` for the current unit: persistent (ZeRO < 2), the step's
// unsharded accumulator (ZeRO-3 resharded after the step) or per-micro-batch buffers that a
// reduce-scatter folds into the shard (under DeepSpeed's coordinator in the parameters' dtype,
// as autograd writes them: ds_unit_grads for the layers).
WSet Lowerer::unit_grads(Bucket& b) {
  if (b.zero < 2) return b.grads;
  if (ds_lazy_ && b.zero >= 3 && !b.expert && b.layer >= 0 && !b.step_grads)
    return ds_unit_grads(b);
  if (b.step_grads) {
    if (b.acc[b.specs[0].slot] < 0) {
      for (const Spec& s : b.specs)
        b.acc[s.slot] = slot_buffer(s.slot, weight_name(b, kSlotName[s.slot]) + ".g", s.shape, gdt_,
                                    BufferClass::kGrad);
      P_.add_block(b.list(b.acc), b.shard * b.ways);
    }
    return b.acc;
  }
  const int bi = static_cast<int>(&b - buckets_.data());
  if (unit_grads_valid_[bi]) return unit_grads_[bi];
  // FSDP2's unsharded gradients are autograd's, in the unsharded parameters' dtype
  // (MixedPrecisionPolicy.param_dtype, torch/distributed/fsdp/_fully_shard/_fsdp_api.py @01d5c2c:
  // "the dtype for the unsharded parameter and hence the dtype for forward/backward
  // computation"); its copy-in casts them to the reduce dtype (fsdp_reduce_copies).
  const Dtype dt = ds_lazy_ || p_.fsdp_impl == FsdpImpl::kFsdp2 ? wdt_ : gdt_;
  WSet g = no_weights();
  for (const Spec& s : b.specs)
    g[s.slot] = slot_buffer(s.slot, name(b.layer, kSlotName[s.slot], tags_.micro_batch) + ".g",
                            s.shape, dt, BufferClass::kGrad);
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
// now (and after the last micro-batch all-reduces the shard over the HSDP replicas); ZeRO 0/1 and
// ZeRO-3 resharded after the step reduce after the last micro-batch (overlapped with the rest of
// the backward).
void Lowerer::after_backward(Bucket& b, bool last) {
  if (b.frozen) return;
  Label label(this, b);
  const int layer = b.layer;
  if (ds_lazy_ && b.zero >= 3 && !b.expert && b.layer >= 0 && !b.step_grads) {
    // DeepSpeed's reduce buckets went as their gradients completed; any left go now.
    const int bi = static_cast<int>(&b - buckets_.data());
    for (size_t i = 0; i < ds_reduces_.size(); ++i)
      if (ds_reduces_[i].bucket == bi && !ds_reduces_[i].issued) ds_reduce(static_cast<int>(i));
    unit_grads_valid_[static_cast<size_t>(bi)] = 0;
    if (!b.stream_grads && last) {
      replica_reduce(b, {b.grad_shard});
      if (p_.offload.optimizer) offload_grad_shard(b, {b.grad_shard});
    }
    return;
  }
  if (b.stream_grads) {
    stream_grads(b);
    return;
  }
  if (b.zero >= 2 && !b.step_grads) {
    const int bi = static_cast<int>(&b - buckets_.data());
    sp_bucket_all_reduce(b, unit_grads_[bi]);
    const std::vector<int> in = fsdp_reduce_copies(b, b.list(unit_grads_[bi]), false);
    const int rs =
        collective(OpKind::kReduceScatter, b.group, layer, b.expert ? "experts.g.rs" : "g.rs",
                   gb_ * b.padded(), in, {b.grad_shard});
    set_calls(b, rs, reduce_fractions(p_, b.weight_elements()));
    fsdp_reduce_copies(b, {b.grad_shard}, true);
    if (last) replica_reduce(b, {b.grad_shard});
    if (last && p_.offload.optimizer) offload_grad_shard(b, {b.grad_shard});
    return;
  }
  if (!last) return;
  if (b.step_grads && chunk_reductions_block_compute(p_)) {
    chunk_reductions_.push_back(static_cast<int>(&b - buckets_.data()));
    return;
  }
  if (!p_.overlap_grad_reduce) {
    deferred_.push_back(static_cast<int>(&b - buckets_.data()));
    return;
  }
  final_reduce(b);
}

void Lowerer::chunk_reductions() {
  const int order_after = order_after_;
  for (int bi : chunk_reductions_) {
    Bucket& b = buckets_[bi];
    at(b.layer, Phase::kBackward);
    const int begin = static_cast<int>(P_.ops.size());
    // FSDP2's foreach_reduce copies the unit's gradients in on the compute stream and makes the
    // reduce-scatter stream wait for the compute stream (reduce_scatter_stream.wait_stream(
    // current_stream)): called after the chunk's last backward, each unit's reduction waits for
    // everything the compute stream was given before it, the chunk's whole backward included,
    // not only for the unit's own gradients (core/fsdp_pipeline_reduce.h).
    order_after_ = last_compute_;
    final_reduce(b);
    order_after_ = order_after;
    // The next op of the compute stream (the next unit's reduce-scatter input, or the next
    // unit) waits for this unit's collectives.
    for (int id = begin; id < static_cast<int>(P_.ops.size()); ++id)
      if (P_.ops[id].stream != kCompute) {
        next_compute_waits_.push_back(id);
        reductions_wait_ = std::max(reductions_wait_, id);
      }
  }
  chunk_reductions_.clear();
}

// ZeRO-Offload: bucket `b`'s gradients of the step's one micro-batch reduce-scattered into a
// transient shard (none to reduce on one rank), summed over the HSDP replicas, and copied in fp32
// into the pinned host gradient the CPU optimizer reads (DeepSpeed casts the reduced bucket to
// fp32 on the device and copies 4 bytes an element), on the compute stream where the framework
// issues the copies there (core/offload_rules.h, gradient_copies_serialized).
void Lowerer::stream_grads(Bucket& b) {
  const int layer = b.layer;
  const int bi = static_cast<int>(&b - buckets_.data());
  std::vector<int> src = b.list(unit_grads_[bi]);
  sp_bucket_all_reduce(b, unit_grads_[bi]);
  if (b.ways > 1) src = fsdp_reduce_copies(b, src, false);
  if (b.ways > 1) {
    const int shard = buffer(
        weight_name(b, b.expert ? "experts" : "params") + ".g" +
            (tags_.micro_batch >= 0 ? ".m" + std::to_string(tags_.micro_batch) : std::string()),
        {b.shard}, gdt_, BufferClass::kGrad);
    const int rs = collective(OpKind::kReduceScatter, b.group, layer,
                              b.expert ? "experts.g.rs" : "g.rs", gb_ * b.padded(), src, {shard});
    set_calls(b, rs, reduce_fractions(p_, b.weight_elements()));
    fsdp_reduce_copies(b, {shard}, true);
    replica_reduce(b, {shard});
    src = {shard};
  }
  offload_grad_shard(b, src);
}

// The copy of bucket `b`'s reduced gradient shard (`src`) into its pinned host gradient, in the
// dtype and on the stream its framework copies it (core/offload_rules.h): after the
// reduce-scatter on the data-parallel stream (FSDP), on the compute stream (DeepSpeed without
// overlap_comm), else on the copy stream.
// DeepSpeed's ZeRO-3 copies it with a blocking copy_: the host waits for it (and so for the
// bucket's reduce-scatter) before it issues more of the backward (gradient_copies_block_host).
void Lowerer::offload_grad_shard(const Bucket& b, const std::vector<int>& src, double elements) {
  const int stream = gradient_copies_on_reduce_stream(p_) ? kDpComm
                     : gradient_copies_serialized(p_)     ? kCompute
                                                          : kCopy;
  const double n = elements < 0 ? static_cast<double>(b.shard) : elements;
  const int c = copy(OpKind::kOffload, b.layer, "g.offload", offloaded_gradient_bytes(p_) * n, src,
                     {b.host_grad}, {}, stream);
  if (gradient_copies_block_host(p_)) host_sync("g.offload.sync", {c});
}

// The once-per-step reduction of bucket `b`'s accumulated gradients: all-reduce (ZeRO 0),
// reduce-scatter in place (ZeRO 1) or into the shard (ZeRO-3 after the step), then the HSDP
// replicas' all-reduce of the shard.
void Lowerer::final_reduce(Bucket& b) {
  Label label(this, b);
  const int layer = b.layer;
  const char* rs = b.expert ? "experts.g.rs" : "g.rs";
  if (b.step_grads) {
    sp_bucket_all_reduce(b, b.acc);
    const std::vector<int> in = fsdp_reduce_copies(b, b.list(b.acc), false);
    const int id = collective(OpKind::kReduceScatter, b.group, layer, rs, gb_ * b.padded(), in,
                              {b.grad_shard});
    set_calls(b, id, reduce_fractions(p_, b.weight_elements()));
    fsdp_reduce_copies(b, {b.grad_shard}, true);
    replica_reduce(b, {b.grad_shard});
    if (p_.offload.optimizer) offload_grad_shard(b, {b.grad_shard});
    return;
  }
  const std::vector<int> g = b.list(b.grads);
  if (b.zero == 0 && b.ways > 1) {
    collective(OpKind::kAllReduce, b.group, layer, b.expert ? "experts.g.ar" : "g.ar",
               gb_ * b.elements, g, g);
  } else if (b.zero == 1) {
    collective(OpKind::kReduceScatter, b.group, layer, rs, gb_ * b.padded(), g, g);
    replica_reduce(b, g);
  }
  if (p_.offload.optimizer) offload_grad_shard(b, g);
}

// HSDP: this rank's reduce-scattered gradient shard summed over its replicas. `grads` is the
// shard, or the bucket's flat gradients whose shard (ZeRO 1, in place) is this rank's range.
void Lowerer::replica_reduce(const Bucket& b, const std::vector<int>& grads) {
  if (b.rways <= 1) return;
  collective(OpKind::kAllReduce, b.rgroup, b.layer, b.expert ? "experts.g.rep" : "g.rep",
             gb_ * b.shard, grads, grads);
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
    // Streamed gradients: the shard the optimizer and the gradient norm read is the host's.
    out.grad_shard = b.stream_grads ? b.host_grad : b.grad_shard;
    out.opt = b.opt;
    out.master_in_opt = b.master_in_opt;
    out.host_grad = b.host_grad;
    P_.buckets.push_back(std::move(out));
  }
}

}  // namespace parasol::lowering
