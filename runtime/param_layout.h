// Parameter layout: how the weights a rank holds (the ParamSpecs of its Program's buckets, core/
// program.h) map onto the full model tensors, and how a bucket's flat ZeRO shard maps onto its
// specs. This is what makes the trainer's state plan-independent: initialisation, checkpoints
// and the gradient norm are defined on the full tensors, and every plan cuts its slices from
// them with these maps.
//
// Full tensors (row-major; h = hidden, q = heads * head_dim, kv = kv_heads * head_dim, up = 2
// for swiglu (columns gate | up), else 1; E = experts; o = heads * v_head_dim, the attention
// output; the linears are core/layer_shapes.h's, a bias "<name>.b" beside each when the model
// has linear biases):
//   L<l>.ln1, L<l>.ln2, head.lnf  [h] (rmsnorm) or [2, h] (layernorm: weight row, bias row)
//   L<l>.qkv [h, q + 2 kv] (columns Q | K | V, heads in order)   L<l>.qkv.b [q + 2 kv]
//   L<l>.out [o, h]          L<l>.out.b [h]
//   L<l>.fc1 [h, up * ffn]   L<l>.fc1.b [up * ffn]     L<l>.fc2 [ffn, h]   L<l>.fc2.b [h]
//   L<l>.router [h, E]
//   L<l>.shared_fc1 [h, up * s]  L<l>.shared_fc2 [s, h] (MoE layers with shared experts, s =
//     their fused width; like fc1, fc2)
//   L<l>.efc1 [E, h, up * expert_ffn]   L<l>.efc1.b [E, up * expert_ffn]
//   L<l>.efc2 [E, expert_ffn, h]        L<l>.efc2.b [E, h]
//   emb.table [vocab, h]   emb.pos [seq_len, h]   head.head [h, vocab]
// With multi-head latent attention (r_q = q_lora_rank, r_kv = kv_lora_rank, d = nope + rope
// per head) instead of qkv:
//   L<l>.q_down [h, r_q]   L<l>.q_norm [r_q] (or [2, r_q])   L<l>.q_up [r_q, heads d] (columns
//     per head: nope | rope); without query compression L<l>.q [h, heads d] instead
//   L<l>.kv_down [h, r_kv + rope] (columns: latent | rotary key)   L<l>.kv_norm [r_kv]
//   L<l>.kv_up [r_kv, heads (nope + v_head_dim)] (columns per head: key nope | value)
// Slices of tensor-parallel rank r of t (Megatron): qkv (and its bias) holds Q heads
// [r * heads / t, ...), K and V kv-heads [r * kv_heads / t, ...), concatenated Q | K | V;
// fc1/shared_fc1/efc1 (and biases) hold gate columns slice r and up columns slice r,
// concatenated gate | up; q_up, q and kv_up (and biases) hold heads [r * heads / t, ...);
// out/fc2/shared_fc2/efc2 hold row slice r; emb.table holds rows [r * ceil(vocab / t), ...) and
// head.head the same columns (entries past vocab are padding: zero, in no full tensor); norms,
// out.b, fc2.b, shared_fc2.b, efc2.b, router, MLA's down-projections and latent norms and
// emb.pos are replicated over tp. Expert tensors are split over the experts' tensor-parallel
// degree (Plan::expert_tp(), rank RankCoord::etp) the same way, and expert-parallel rank e
// (RankCoord::eep) holds experts [e * E / ep, (e + 1) * E / ep).
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
  kQNorm,
  kKvNorm,
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
  kQDown,
  kQDownBias,
  kQUp,  // q_up, or q without query compression
  kQUpBias,
  kKvDown,
  kKvDownBias,
  kKvUp,
  kKvUpBias,
  kSfc1,
  kSfc1Bias,
  kSfc2,
  kSfc2Bias,
};

// One full model tensor.
struct TensorInfo {
  std::string name;  // "L3.qkv", "emb.table", ...
  TensorKind kind = TensorKind::kNorm;
  int layer = -1;              // model layer, -1 for emb.* and head.*
  std::vector<int64_t> shape;  // the full tensor, elements per dimension
  bool tp_replicated = false;  // every tensor-parallel rank holds all of it (per expert: every
                               // rank of the experts' tensor-parallel group)
  bool expert = false;         // dimension 0 is the experts, split over ep
  bool tied_copy = false;      // head.head of a tied model: starts as emb.table transposed
  int64_t elements() const;
};

// The full tensor named `name`. Throws parasol::Error("param.<name>", ...) when the model has no
// such tensor (unknown name, layer out of range, a bias of a model without biases, an MLP
// tensor of an MoE layer or the reverse, emb.pos without learned positions).
TensorInfo tensor_info(const Model& model, const std::string& name);

// A shape as error messages write it: "[4, 128]".
std::string shape_text(const std::vector<int64_t>& shape);

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
// tensor parallelism goes: tensors replicated over tp count on tp rank 0 only (expert tensors
// replicated over the experts' TP group on its rank 0), so that the norm all-reduced over tp
// equals the serial one.
bool counts_in_grad_norm(const Model& model, const RankCoord& coord, const std::string& name);

// The elements of bucket `b`'s gradient that the rank at `coord` (index `index` in b.group) adds
// to its partial squared gradient norm, so that the partial norms summed the way lower() emits
// (over tp; over pp; over dp-cp when grad_norm_over_dp_cp(plan)) give the serial norm once per
// element: counts_in_grad_norm, no padding, and, when the norm is summed over b.group's ranks,
// only this rank's ZeRO shard (b.zero >= 1) on the first HSDP replica, or only on index 0
// (b.zero == 0). spec_offset addresses
// the per-spec gradients (b.zero < 2), shard_offset the gradient shard (b.zero >= 2).
std::vector<ShardRun> grad_norm_runs(const Model& model, const Plan& plan, const RankCoord& coord,
                                     const ParamBucket& b, int index);
// Whether lower() sums the gradient norm over dp-cp: gradients differ across those ranks (ZeRO
// >= 1, ep > 1, or an expert grid of its own) and there are several.
bool grad_norm_over_dp_cp(const Plan& plan);

}  // namespace parasol::runtime
