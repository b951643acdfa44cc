// Layer shapes: the linears, norms and attention core of a decoder layer (see layer_shapes.h).
#include "core/layer_shapes.h"

#include <algorithm>

namespace parasol {

const char* split_name(Split s) {
  switch (s) {
    case Split::kColumn:
      return "column";
    case Split::kRow:
      return "row";
    case Split::kReplicated:
      return "replicated";
  }
  return "?";
}

namespace {

// An MLP of hidden size `ffn`: fc1 (gate | up for swiglu) and fc2.
void add_mlp(Linears& l, const Model& m, const char* fc1, const char* fc2, int64_t ffn) {
  const int64_t up = m.activation == Activation::kSwiglu ? 2 : 1;
  l.push_back({fc1, m.hidden, up * ffn, Split::kColumn, m.linear_bias});
  l.push_back({fc2, ffn, m.hidden, Split::kRow, m.linear_bias});
}

}  // namespace

Linears attention_linears(const Model& m) {
  Linears l;
  const int64_t h = m.hidden;
  const bool b = m.linear_bias;
  if (!m.mla.enabled()) {
    l.push_back({"qkv", h, m.q_dim() + 2 * m.kv_dim(), Split::kColumn, b});
    l.push_back({"out", m.q_dim(), h, Split::kRow, b});
    return l;
  }
  const MlaSpec& a = m.mla;
  const int64_t n = m.heads;
  if (a.q_lora_rank > 0) {
    l.push_back({"q_down", h, a.q_lora_rank, Split::kReplicated, b});
    l.push_back({"q_up", a.q_lora_rank, n * a.qk_head_dim(), Split::kColumn, b});
  } else {
    l.push_back({"q", h, n * a.qk_head_dim(), Split::kColumn, b});
  }
  l.push_back({"kv_down", h, a.kv_lora_rank + a.qk_rope_head_dim, Split::kReplicated, b});
  l.push_back(
      {"kv_up", a.kv_lora_rank, n * (a.qk_nope_head_dim + a.v_head_dim), Split::kColumn, b});
  l.push_back({"out", n * a.v_head_dim, h, Split::kRow, b});
  return l;
}

Norms attention_norms(const Model& m) {
  Norms n;
  if (!m.mla.enabled()) return n;
  if (m.mla.q_lora_rank > 0) n.push_back({"q_norm", m.mla.q_lora_rank});
  n.push_back({"kv_norm", m.mla.kv_lora_rank});
  return n;
}

Linears mlp_linears(const Model& m, int layer) {
  PARASOL_CHECK(0 <= layer && layer < m.layers, "layer " + std::to_string(layer));
  Linears l;
  if (!m.is_moe_layer(layer)) {
    add_mlp(l, m, "fc1", "fc2", m.ffn);
    return l;
  }
  l.push_back({"router", m.hidden, m.moe.experts, Split::kReplicated, false});
  if (m.moe.shared_experts > 0) add_mlp(l, m, "shared_fc1", "shared_fc2", m.moe.shared_width());
  return l;
}

Linears expert_linears(const Model& m) {
  Linears l;
  if (m.is_moe()) add_mlp(l, m, "efc1", "efc2", m.moe.expert_ffn);
  return l;
}

AttnShape attention_shape(const Model& m, int layer, int tp, int64_t batch, int64_t seq_q,
                          int64_t seq_kv, bool flash) {
  PARASOL_CHECK(0 <= layer && layer < m.layers, "layer " + std::to_string(layer));
  PARASOL_CHECK(tp >= 1 && m.heads % tp == 0 && m.kv_heads % tp == 0,
                "tp " + std::to_string(tp) + " does not divide the heads");
  AttnShape a;
  a.batch = batch;
  a.seq_q = seq_q;
  a.seq_kv = seq_kv;
  a.heads = m.heads / tp;
  a.kv_heads = m.kv_heads / tp;
  a.head_dim = m.head_dim;
  a.v_head_dim = m.mla.enabled() ? m.mla.v_head_dim : 0;
  a.window = m.is_windowed_layer(layer) ? m.sliding_window : 0;
  a.causal = true;
  a.flash = flash;
  a.dropout = m.dropout && !flash;
  return a;
}

int context_ring_steps(int cp, int64_t chunk, int64_t window) {
  if (window <= 0) return cp;
  return static_cast<int>(std::min<int64_t>(cp, 1 + (window - 1 + chunk - 1) / chunk));
}

KernelBytes kernel_bytes(const Model& m, const Plan& p) {
  // Activations are stored in the plan's precision (fp8 plans keep bf16 activations).
  const double eb = p.precision == Dtype::kFp32 ? 4 : 2;
  const bool eager = !p.fused_kernels;
  const double up = m.activation == Activation::kSwiglu ? 2 : 1;
  KernelBytes k;
  k.norm = eager && m.norm == Norm::kRmsNorm ? 4 * eb + 28 : 2 * eb;
  k.activation = eager && m.activation == Activation::kSwiglu ? 5 * eb : (up + 1) * eb;
  k.rotary = m.learned_positions ? 0 : eager ? 2 * eb + 16 : 2 * eb;
  k.rotary_backward = 2 * k.rotary;
  if (!m.learned_positions && !eager && m.rope_concentration() != 1.0) {
    k.rotary = 12 * eb;  // Megatron-Core's unfused RoPE (KernelBytes::rotary)
    k.rotary_backward = 14 * eb;
  }
  k.residual = 3 * eb + (m.dropout ? 1 : 0);
  return k;
}

int64_t rotary_columns(const Model& m) {
  if (m.mla.enabled()) return int64_t{m.heads} * m.head_dim + m.head_dim;
  return m.q_dim() + m.kv_dim();
}

int layer_weight_tensors(const Model& m, int layer, bool expert) {
  int n = 0;
  auto linears = [&](const Linears& ls) {
    for (const LinearShape& s : ls) n += s.bias ? 2 : 1;
  };
  if (expert) {
    if (m.is_moe_layer(layer)) linears(expert_linears(m));
    return n;
  }
  n = 2 + static_cast<int>(attention_norms(m).size());
  linears(attention_linears(m));
  linears(mlp_linears(m, layer));
  return n;
}

}  // namespace parasol
