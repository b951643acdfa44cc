// Layer shapes: the one description of a decoder layer's linear maps, norms and attention core
// that the lowering (core/lower.cc), the closed-form cost model (cost_models/) and the parameter
// counts (core/model.h) all read, so that none of them re-derives a shape of its own. Shapes are
// full sizes (before tensor parallelism) with the Megatron-LM split that says how tp shards them.
// Plain values in fixed-capacity lists: no allocation per call, safe to call from any thread.
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "core/error.h"
#include "core/model.h"
#include "core/plan.h"
#include "core/program.h"

namespace parasol {

// Megatron-LM tensor-parallel split of a linear map's weight.
enum class Split {
  kColumn,      // output columns split over tp (ColumnParallelLinear): out / tp per rank
  kRow,         // input rows split over tp (RowParallelLinear): in / tp per rank, then reduced
  kReplicated,  // every tp rank holds the whole weight (MLA's down-projections, the router)
};
const char* split_name(Split s);

// y[tokens x out] = x[tokens x in] W[in x out] (+ b[out]).
struct LinearShape {
  const char* name = "";  // static string: "qkv", "out", "q_down", "fc1", "router", ...
  int64_t in = 0;         // input features (full size)
  int64_t out = 0;        // output features (full size)
  Split split = Split::kColumn;
  bool bias = false;

  int64_t weights() const { return in * out; }
  int64_t params() const { return in * out + (bias ? out : 0); }
  // Forward FLOPs per token: 2 in out (multiply-add = 2).
  double flops_per_token() const { return 2.0 * static_cast<double>(in) * out; }
};

// A norm over `width` features of the model's norm kind (RMSNorm: width weights, LayerNorm:
// weight and bias). Replicated over tp.
struct NormShape {
  const char* name = "";
  int64_t width = 0;
  int64_t params(const Model& m) const { return m.norm == Norm::kLayerNorm ? 2 * width : width; }
};

// A list of at most N values, in order, held inline.
template <typename T, int N>
class ShapeList {
 public:
  static constexpr int kCapacity = N;
  // REQUIRES: size() < kCapacity.
  void push_back(const T& v) {
    PARASOL_CHECK(size_ < kCapacity, "a ShapeList of capacity " + std::to_string(kCapacity));
    items_[size_++] = v;
  }
  int size() const { return size_; }
  bool empty() const { return size_ == 0; }
  const T& operator[](int i) const { return items_[i]; }
  const T* begin() const { return items_.data(); }
  const T* end() const { return items_.data() + size_; }

 private:
  std::array<T, N> items_{};
  int size_ = 0;
};
using Linears = ShapeList<LinearShape, 6>;
using Norms = ShapeList<NormShape, 2>;

// The attention block's linears of one layer, in forward order (the same in every layer):
//   no MLA: qkv (h -> q_dim + 2 kv_dim, column) and out (q_dim -> h, row);
//   MLA:    q_down (h -> q_lora, replicated) and q_up (q_lora -> heads (nope + rope), column),
//           or q (h -> heads (nope + rope), column) without query compression;
//           kv_down (h -> kv_lora + rope, replicated: the latent and the shared rotary key),
//           kv_up (kv_lora -> heads (nope + v), column), out (heads v -> h, row).
// Every linear has a bias when model.linear_bias.
Linears attention_linears(const Model& m);

// The norms inside the attention block: MLA's norms on the q latent (when q_lora > 0) and on
// the kv latent, in forward order; empty without MLA. (The layer's two pre-norms of `hidden`
// features are ParamCounts::norms.)
Norms attention_norms(const Model& m);

// The MLP block's dense linears of layer `layer`, in forward order:
//   dense layer: fc1 (h -> up ffn, column; up = 2 for swiglu: gate | up) and fc2 (ffn -> h, row);
//   MoE layer:   router (h -> experts, replicated, no bias), then the shared experts as one fused
//                MLP: shared_fc1 (h -> up shared_width, column) and shared_fc2 (shared_width ->
//                h, row) when moe.shared_experts > 0. Not the routed experts (grouped GEMMs
//                over the routed tokens; their shapes are expert_linears).
// REQUIRES: 0 <= layer < m.layers.
Linears mlp_linears(const Model& m, int layer);

// One routed expert's linears: efc1 (h -> up expert_ffn, column) and efc2 (expert_ffn -> h, row),
// split over tp inside each expert as Megatron-LM's expert tensor parallelism does; empty for a
// dense model.
Linears expert_linears(const Model& m);

// Weight tensors of layer `layer`'s dense parameters (its two norms, the attention's extra norms,
// the attention and MLP linears with their biases) or, `expert`, of its routed experts' linears
// (each linear one tensor over the local experts): the tensors an optimizer step walks, as the
// lowering's parameter buckets list them (core/lower_buckets.cc).
int layer_weight_tensors(const Model& m, int layer, bool expert);

// The attention core of layer `layer` for `seq_q` queries of `batch` sequences that attend
// `seq_kv` keys (seq_q < seq_kv for a context-parallel chunk, see attention_flops), on a rank
// holding 1/tp of the heads: heads / tp, kv_heads / tp (MLA: heads / tp), head_dim (the q/k
// dims: nope + rope with MLA), v_head_dim (MLA's, else 0 = head_dim), window (the model's
// sliding window on a windowed layer, else 0), causal, `flash`, and dropout when the model has
// it and the kernel is materialised.
// REQUIRES: tp divides m.heads and m.kv_heads; 0 <= layer < m.layers.
AttnShape attention_shape(const Model& m, int layer, int tp, int64_t batch, int64_t seq_q,
                          int64_t seq_kv, bool flash);

// The steps of a context-parallel ring over `cp` chunks of `chunk` tokens that a layer with a
// sliding window of `window` tokens (0: none) runs: every chunk without a window; with one, this
// rank's chunk and the ceil((window - 1) / chunk) before it, at most cp. The lowering emits an
// attention op per step and the closed form prices as many.
int context_ring_steps(int cp, int64_t chunk, int64_t window);

// HBM bytes per element that a layer's memory-bound kernels move in forward, as the plan's
// kernels run them (the backward of each moves twice as many): fused (Megatron-Core, Transformer
// Engine, torch.compile) or op by op in PyTorch eager (plan.fused_kernels = false). The lowering
// writes them into its ops' bytes and the closed form prices the same ops, so both read this.
struct KernelBytes {
  // A norm, per element of its input: fused, read and write once (2 eb); eager RMSNorm upcasts,
  // squares, averages, scales, downcasts and multiplies op by op (4 eb + 28, torchtitan's
  // RMSNorm); LayerNorm is one ATen kernel even in eager.
  double norm = 0;
  // The MLP activation, per element of its output: fused, read the fc1 output(s) and write the
  // product ((up + 1) eb); eager SwiGLU runs silu, then the multiply (5 eb).
  double activation = 0;
  // Rotary embeddings, per element of Q and K: fused, read and write (2 eb); eager upcasts to
  // complex fp32, multiplies and casts back (2 eb + 16). 0 for learned positions. A YaRN model
  // whose concentration factor is not 1 (Model::rope_concentration) cannot run Transformer
  // Engine's fused RoPE, which takes no scale: Megatron-Core then runs its unfused
  // _apply_rotary_pos_emb_bshd (rope_utils.py @4415119 L279-284, L92-126): t * cos, the
  // rotate-half's negation (half the elements) and cat, * sin, the add and the final cat with
  // the empty pass-through part: 2 + 1 + 2 + 2 + 3 + 2 = 12 eb.
  double rotary = 0;
  // The same on the backward (the gradient of Q and K): twice `rotary` fused or eager; Megatron's
  // unfused RoPE as autograd runs it: g * sin, the negation's backward (half), the chunk's
  // backward cat, g * cos, the sum of the two paths, and the empty pass-through slice's zero
  // gradient written and added: 2 + 1 + 2 + 2 + 3 + 1 + 3 = 14 eb.
  double rotary_backward = 0;
  // A residual add with its dropout mask when the model has one (3 eb + 1 byte).
  double residual = 0;
};
KernelBytes kernel_bytes(const Model& m, const Plan& p);

// Columns of one token's Q and K that RoPE rotates, over all heads (before tp): q_dim + kv_dim;
// MLA: the heads' query dims and the shared rotary key (heads x head_dim + head_dim, as
// Megatron's MLA applies its RoPE kernel to q and the key).
int64_t rotary_columns(const Model& m);

}  // namespace parasol
