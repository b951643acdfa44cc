// Parameter layout: how the weights a rank holds (the ParamSpecs of its Program's buckets, core/
// program.h) map onto the full model tensors, and how a bucket's flat ZeRO shard maps onto its
// specs. This is what makes the trainer's state plan-independent: initialisation, checkpoints
// and the gradient norm are defined on the full tensors, and every plan cuts its slices from
// them with these maps.
//
// Full tensors (row-major; h = hidden, q = heads * head_dim, kv = kv_heads * head_dim, up = 2
// for swiglu (columns gate | up), else 1; E = experts):
//   L<l>.ln1, L<l>.ln2, head.lnf  [h] (rmsnorm) or [2, h] (layernorm: weight row, bias row)
//   L<l>.qkv [h, q + 2 kv] (columns Q | K | V, heads in order)   L<l>.qkv.b [q + 2 kv]
//   L<l>.out [q, h]          L<l>.out.b [h]
//   L<l>.fc1 [h, up * ffn]   L<l>.fc1.b [up * ffn]     L<l>.fc2 [ffn, h]   L<l>.fc2.b [h]
//   L<l>.router [h, E]
//   L<l>.efc1 [E, h, up * expert_ffn]   L<l>.efc1.b [E, up * expert_ffn]
//   L<l>.efc2 [E, expert_ffn, h]        L<l>.efc2.b [E, h]
//   emb.table [vocab, h]   emb.pos [seq_len, h]   head.head [h, vocab]
// Slices of tensor-parallel rank r of t (Megatron): qkv (and its bias) holds Q heads
// [r * heads / t, ...), K and V kv-heads [r * kv_heads / t, ...), concatenated Q | K | V;
// fc1/efc1 (and biases) hold gate columns slice r and up columns slice r, concatenated gate | up;
// out/fc2/efc2 hold row slice r; emb.table holds rows [r * ceil(vocab / t), ...) and head.head
// the same columns (entries past vocab are padding: zero, in no full tensor); norms, out.b,
// fc2.b, efc2.b, router and emb.pos are replicated over tp. Expert tensors: ep rank e holds
// experts [e * E / ep, (e + 1) * E / ep).
// Tied embeddings: the serial model has no head.head (the head reads emb.table); with pp > 1 the
// last stage keeps a copy (core/lower.h), the full tensor head.head [h, vocab], which starts as
// the transpose of emb.table.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/model.h"
#include "core/plan.h"
#include "core/program.h"
#include "core/rank_layout.h"

namespace parasol::runtime {

enum class TensorKind {
  kNorm,  // ln1, ln2, lnf
  kQkv,
  kQkvBias,
  kOut,
  kOutBias,
  kFc1,
  kFc1Bias,
  kFc2,
  kFc2Bias,
  kRouter,
  kEfc1,
  kEfc1Bias,
  kEfc2,
  kEfc2Bias,
  kTable,
  kPos,
  kHead,
};

// One full model tensor.
struct TensorInfo {
  std::string name;  // "L3.qkv", "emb.table", ...
  TensorKind kind = TensorKind::kNorm;
  int layer = -1;              // model layer, -1 for emb.* and head.*
  std::vector<int64_t> shape;  // the full tensor, elements per dimension
  bool tp_replicated = false;  // every tensor-parallel rank holds all of it (per expert)
  bool expert = false;         // dimension 0 is the experts, split over ep
  bool tied_copy = false;      // head.head of a tied model: starts as emb.table transposed
  int64_t elements() const;
};

// The full tensor named `name`. Throws parasol::Error("param.<name>", ...) when the model has no
// such tensor (unknown name, layer out of range, a bias of a model without biases, an MLP
// tensor of an MoE layer or the reverse, emb.pos without learned positions).
TensorInfo tensor_info(const Model& model, const std::string& name);

// Every full tensor of the model, in Program order (emb, layers, head). head.head is included
// when the embeddings are untied, or when tied_head_copy (tied with pp > 1).
std::vector<TensorInfo> model_tensors(const Model& model, bool tied_head_copy = false);
// Whether `plan` keeps a head.head copy of tied embeddings (tied and pp > 1).
bool has_tied_head_copy(const Model& model, const Plan& plan);

// A run of contiguous elements: local (row-major slice) [local_offset, local_offset + count)
// holds full (row-major tensor) [full_offset, full_offset + count).
struct SliceRun {
  int64_t local_offset = 0;
  int64_t full_offset = 0;
  int64_t count = 0;
  bool operator==(const SliceRun&) const = default;
};

// The shape of tensor `name`'s slice held by the rank at `coord` (what lower() puts in its
// ParamSpec, padding included).
std::vector<int64_t> local_shape(const Model& model, const Plan& plan, const RankCoord& coord,
                                 const std::string& name);

// The runs mapping the slice `spec` of the rank at `coord` onto its full tensor, ordered by
// local_offset (adjacent runs contiguous in both are merged). Padding elements are in no run.
// Throws parasol::Error("param.<name>", ...) when spec.shape is not local_shape(...).
std::vector<SliceRun> slice_runs(const Model& model, const Plan& plan, const RankCoord& coord,
                                 const ParamSpec& spec);

// The parts of `runs` (ordered by local_offset) that fall in local [begin, begin + count).
std::vector<SliceRun> clip_runs(const std::vector<SliceRun>& runs, int64_t begin, int64_t count);

// The index of the rank at `coord` in its `g` group (Group::kDpCp, kExpertDp, kDpShard,
// kDpReplicate, kExpertShard or kExpertReplicate: the groups buckets are sharded and reduced
// over), in RankLayout::group order (= the index of runtime/comm/groups.h). Throws
// parasol::Error("group", ...) for other groups.
int group_index(const Plan& plan, const RankCoord& coord, Group g);

// HSDP: which replica of its shard the rank at `coord` holds of bucket `b` (its index in the
// replicate group of b.group); 0 for a bucket sharded over the whole data-parallel group.
int replica_index(const Plan& plan, const RankCoord& coord, const ParamBucket& b);

// The flat range of bucket `b` that the rank with index `index` in b.group updates: its ZeRO
// shard [index * shard, (index + 1) * shard) when b.zero >= 1 (clipped to b.elements; the rest
// is padding), the whole bucket when b.zero == 0. Throws parasol::Error("bucket.<name>", ...)
// unless 0 <= index < b.ways.
struct FlatRange {
  int64_t begin = 0, end = 0;
};
FlatRange shard_range(const ParamBucket& b, int index);

// A run of that range within one spec: shard (or opt row) [shard_offset, shard_offset + count)
// holds spec `spec`'s local elements [spec_offset, spec_offset + count).
struct ShardRun {
  int spec = 0;
  int64_t spec_offset = 0;
  int64_t shard_offset = 0;
  int64_t count = 0;
  bool operator==(const ShardRun&) const = default;
};
// The runs of shard_range(b, index) over b.specs, in order; they cover the range exactly.
std::vector<ShardRun> shard_runs(const ParamBucket& b, int index);

// A run of a shard mapped all the way onto a full tensor (padding left out).
struct ShardPiece {
  int spec = 0;
  int64_t spec_offset = 0;   // local element of the spec
  int64_t shard_offset = 0;  // element of the shard (opt row, param_shard, grad_shard)
  int64_t full_offset = 0;   // element of the full tensor b.specs[spec].name
  int64_t count = 0;
};
std::vector<ShardPiece> shard_pieces(const Model& model, const Plan& plan, const RankCoord& coord,
                                     const ParamBucket& b, int index);

// Whether this rank counts its elements of spec `name` in the global gradient norm as far as
// tensor parallelism goes: tensors replicated over tp count on tp rank 0 only, so that the
// norm all-reduced over tp equals the serial one.
bool counts_in_grad_norm(const Model& model, const RankCoord& coord, const std::string& name);

// The elements of bucket `b`'s gradient that the rank at `coord` (index `index` in b.group) adds
// to its partial squared gradient norm, so that the partial norms summed the way lower() emits
// (over tp; over pp; over dp-cp when plan.zero >= 1 or plan.ep > 1) give the serial norm once
// per element: counts_in_grad_norm, no padding, and, when the norm is summed over dp-cp, only
// this rank's ZeRO shard (b.zero >= 1) on the first HSDP replica, or only on index 0
// (b.zero == 0). spec_offset addresses
// the per-spec gradients (b.zero < 2), shard_offset the gradient shard (b.zero >= 2).
std::vector<ShardRun> grad_norm_runs(const Model& model, const Plan& plan, const RankCoord& coord,
                                     const ParamBucket& b, int index);

}  // namespace parasol::runtime
