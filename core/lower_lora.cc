// LoRA adapters (Plan::lora_rank): the adapter bucket of a layer and each adapter's ops, as NeMo 2
// runs them on Megatron-Core (nemo/collections/llm/peft/lora.py LoRALinear: the wrapped linear's
// output plus adapter(x); ParallelLinearAdapter: dropout(x) ("pre"), linear_in (A), linear_out
// (B), scaled by alpha / r inside B's output; the MLPerf Training v5.0 llama2_70b_lora reference,
// train.py prepare_model @ab57af8 of the v5.0 results mirror). At tp 1 (the only degree lowered:
// core/plan_validate.cc) A and B are whole on every rank.
//
// Forward: xd = dropout(x) (with its 1-byte mask, both kept) or x itself; u = xd A [T x r] kept;
// y += u B (B's GEMM accumulates into the frozen linear's output).
// Backward: dB = u^T dy; du = dy B^T; dA = xd^T du; dx += du A^T (through the dropout mask).
// The base linear's weight-gradient GEMM is not emitted (core/lower_layer.cc), so the liveness
// keeps its input only where an adapter reads it.
#include "core/lower_internal.h"

namespace parasol::lowering {

namespace {
// The adapter slots (A, then B) and names of target `t`.
Slot lora_a(LoraTarget t) { return static_cast<Slot>(kLoraQkvA + 2 * static_cast<int>(t)); }
Slot lora_b(LoraTarget t) { return static_cast<Slot>(lora_a(t) + 1); }
const char* kWhat[kLoraTargetCount][8] = {
    {"lora.qkv.drop", "lora.qkv.mask", "lora.qkv.a", "lora.qkv.b", "lora.qkv.b.dw", "lora.qkv.b.dx",
     "lora.qkv.a.dw", "lora.qkv.a.dx"},
    {"lora.out.drop", "lora.out.mask", "lora.out.a", "lora.out.b", "lora.out.b.dw", "lora.out.b.dx",
     "lora.out.a.dw", "lora.out.a.dx"},
    {"lora.fc1.drop", "lora.fc1.mask", "lora.fc1.a", "lora.fc1.b", "lora.fc1.b.dw", "lora.fc1.b.dx",
     "lora.fc1.a.dw", "lora.fc1.a.dx"},
    {"lora.fc2.drop", "lora.fc2.mask", "lora.fc2.a", "lora.fc2.b", "lora.fc2.b.dw", "lora.fc2.b.dx",
     "lora.fc2.a.dw", "lora.fc2.a.dx"}};
enum What { kDrop, kMask, kA, kB, kBDw, kBDx, kADw, kADx };
}  // namespace

void Lowerer::add_lora_bucket(int chunk, int layer, int local) {
  if (!p_.lora()) return;
  const int64_t r = p_.lora_rank;
  // The target linears' [in x out] (core/layer_shapes.h's, whole at tp 1).
  const int64_t shapes[kLoraTargetCount][2] = {
      {h_, qkv_cols_}, {ao_cols_, h_}, {h_, up_ * ffn_t_}, {ffn_t_, h_}};
  Bucket b;
  b.layer = layer;
  b.chunk = chunk;
  for (int i = 0; i < kLoraTargetCount; ++i) {
    const auto t = static_cast<LoraTarget>(i);
    if (!p_.lora_targets_linear(t)) continue;
    b.specs.push_back({lora_a(t), {shapes[i][0], r}});
    b.specs.push_back({lora_b(t), {r, shapes[i][1]}});
  }
  layer_buckets_[local][1] = static_cast<int>(buckets_.size());
  add_bucket(std::move(b));
}

void Lowerer::lora_forward(int layer, LoraTarget t, int x, int64_t in, int y, int64_t out,
                           const WSet& w, Saved& sv) {
  if (!p_.lora_targets_linear(t)) return;
  const int i = static_cast<int>(t);
  const char* const* what = kWhat[i];
  const int64_t r = p_.lora_rank;
  // The adapters run outside fp8 autocast: no amax kernels (core/lower_emit.cc fp8_amax).
  fp8_exempt_ = true;
  int xa = x;
  if (p_.lora_dropout > 0) {
    // Dropout reads x and writes the dropped copy (the activation dtype) and its mask (a byte).
    const double n = double(T_) * in;
    sv[sLoraX + i] = act(layer, what[kDrop], {T_, in});
    sv[sLoraMask + i] = act(layer, what[kMask], {T_, in}, Dtype::kFp8);
    role(OpRole::kLoraDropout, elementwise(OpKind::kResidualAdd, layer, what[kDrop], n,
                                           n * (dtype_bytes(buf_at(x).dtype) + eb_ + 1), {x},
                                           {sv[sLoraX + i], sv[sLoraMask + i]}));
    xa = sv[sLoraX + i];
  } else {
    sv[sLoraX + i] = x;
  }
  sv[sLoraU + i] = act(layer, what[kA], {T_, r});
  role(OpRole::kLora, gemm(layer, what[kA], T_, r, in, 1, {xa, w[lora_a(t)]}, {sv[sLoraU + i]}));
  role(OpRole::kLora, gemm(layer, what[kB], T_, out, r, 1, {sv[sLoraU + i], w[lora_b(t)], y}, {y}));
  fp8_exempt_ = false;
}

void Lowerer::lora_backward(int layer, LoraTarget t, int dy, int64_t in, int dx, int64_t out,
                            const Saved& sv, const WSet& w, const WSet& g) {
  if (!p_.lora_targets_linear(t)) return;
  const int i = static_cast<int>(t);
  const char* const* what = kWhat[i];
  const int64_t r = p_.lora_rank;
  fp8_exempt_ = true;
  main_grad_add(role(OpRole::kLora,
                     gemm(layer, what[kBDw], r, out, T_, 1, {sv[sLoraU + i], dy}, {g[lora_b(t)]})));
  const int du = ws(layer, what[kBDx], {T_, r});
  role(OpRole::kLora, gemm(layer, what[kBDx], T_, r, out, 1, {dy, w[lora_b(t)]}, {du}, true));
  main_grad_add(role(OpRole::kLora,
                     gemm(layer, what[kADw], in, r, T_, 1, {sv[sLoraX + i], du}, {g[lora_a(t)]})));
  if (p_.lora_dropout > 0) {
    // A's data gradient, then the dropout's backward adds it, masked, into the input gradient.
    const int dxd = ws(layer, what[kADx], {T_, in});
    role(OpRole::kLora, gemm(layer, what[kADx], T_, in, r, 1, {du, w[lora_a(t)]}, {dxd}, true));
    const double n = double(T_) * in;
    role(OpRole::kLoraDropout, elementwise(OpKind::kResidualAdd, layer, what[kDrop], n,
                                           n * (eb_ + 1 + 2 * dtype_bytes(buf_at(dx).dtype)),
                                           {dxd, sv[sLoraMask + i], dx}, {dx}));
  } else {
    role(OpRole::kLora, gemm(layer, what[kADx], T_, in, r, 1, {du, w[lora_a(t)], dx}, {dx}, true));
  }
  fp8_exempt_ = false;
}

}  // namespace parasol::lowering
