// Tests of LoRA in the lowering (Plan::lora_rank, core/lower_lora.cc) against formulas written
// from the model's shapes alone: the frozen base keeps its weights and nothing else, the adapters
// hold r (in + out) parameters each with their gradients and Adam state, the Program's GEMM FLOPs
// lose the frozen weights' gradients and gain the adapters' six GEMMs; and Megatron's fp8 copy of
// the SwiGLU input (Plan::activation_fp8_input_store).
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "core/liveness.h"
#include "core/lower.h"
#include "core/program.h"

namespace parasol {
namespace {

// llama3-8b cut to two layers on a short sequence: one stage, dp 8, one micro-batch.
struct Case {
  Model m = model_preset("llama3-8b");
  Plan p;
  Case() {
    m.layers = 2;
    p.dp = 8;
    p.zero = 1;
    p.micro_batch = 1;
    p.global_batch = 8;
    p.seq_len = 1024;
  }
};

// Sum of `value(b)` over the persistent device buffers of class `cls`.
double persistent(const Program& prog, BufferClass cls, bool bytes) {
  double n = 0;
  for (const Buffer& b : prog.buffers)
    if (b.persistent && !b.host && b.cls == cls)
      n += bytes ? b.bytes() : static_cast<double>(b.elements());
  return n;
}

double linear_flops(const Program& prog) {
  double f = 0;
  for (const Op& op : prog.ops)
    if (op.kind == OpKind::kLinear) f += op.flops;
  return f;
}

// The layer linears' [in x out] (Llama: no biases): QKV, out-projection, FC1 (gate and up), FC2.
struct Dims {
  double h, qkv, ao, fc1, ffn, vocab, T;
};
Dims dims(const Case& s) {
  const Model& m = s.m;
  return {double(m.hidden),
          double((m.heads + 2 * m.kv_heads) * m.head_dim),
          double(m.heads * m.head_dim),
          2.0 * double(m.ffn),
          double(m.ffn),
          double(m.vocab),
          double(s.p.micro_batch * s.p.seq_len)};
}

TEST(LowerLora, TheFrozenBaseKeepsItsWeightsOnlyAndTheAdaptersTrain) {
  Case s;
  s.p.lora_rank = 16;
  s.p.lora_targets =
      (1u << static_cast<int>(LoraTarget::kQkv)) | (1u << static_cast<int>(LoraTarget::kProj));
  const Program prog = lower_stage(s.m, s.p, 0);
  const Dims d = dims(s);
  const double r = 16;
  // Per layer: A [h x r] and B [r x qkv] for QKV, A [ao x r] and B [r x h] for the projection.
  const double adapters = s.m.layers * r * ((d.h + d.qkv) + (d.ao + d.h));
  const ParamCounts pc = param_counts(s.m);
  const double base = static_cast<double>(pc.total);
  EXPECT_DOUBLE_EQ(persistent(prog, BufferClass::kParam, false), base + adapters);
  // Gradients (Megatron's buffer in fp32, grad_reduce_dtype fp32) for the adapters only.
  EXPECT_DOUBLE_EQ(persistent(prog, BufferClass::kGrad, false), adapters);
  EXPECT_DOUBLE_EQ(persistent(prog, BufferClass::kGrad, true), 4 * adapters);
  // The distributed optimizer's fp32 master and two moments of each layer's adapter shard.
  const double per_layer = r * ((d.h + d.qkv) + (d.ao + d.h));
  EXPECT_DOUBLE_EQ(persistent(prog, BufferClass::kOptimizer, true),
                   s.m.layers * 12 * std::ceil(per_layer / 8));
  int lora_ops = 0;
  for (const Op& op : prog.ops) {
    EXPECT_NE(op.role, OpRole::kWeightGrad) << op.name;
    lora_ops += op.role == OpRole::kLora;
  }
  // Two forward GEMMs and four backward ones per adapter.
  EXPECT_EQ(lora_ops, s.m.layers * 2 * 6);
}

TEST(LowerLora, GemmFlopsLoseTheFrozenWeightGradientsAndGainTheAdapters) {
  Case s;
  const Dims d = dims(s);
  const double linears = d.h * d.qkv + d.ao * d.h + d.h * d.fc1 + d.ffn * d.h;
  const double head = d.h * d.vocab;
  // Full training: forward, data and weight gradient of every linear and the head.
  EXPECT_DOUBLE_EQ(linear_flops(lower_stage(s.m, s.p, 0)), 6 * d.T * (s.m.layers * linears + head));
  for (int rank : {8, 64}) {
    Case l;
    l.p.lora_rank = rank;  // all four targets
    const double r = rank;
    const double adapters = r * ((d.h + d.qkv) + (d.ao + d.h) + (d.h + d.fc1) + (d.ffn + d.h));
    // Forward and data gradient of the frozen weights; six GEMMs of 2 T r (in + out) / 2 each
    // per adapter: x A and u B forward, dB, du, dA and dx backward.
    EXPECT_DOUBLE_EQ(linear_flops(lower_stage(l.m, l.p, 0)),
                     4 * d.T * (l.m.layers * linears + head) + 6 * d.T * l.m.layers * adapters)
        << "rank " << rank;
  }
}

TEST(LowerLora, AdapterDropoutKeepsItsCopyAndMask) {
  Case s;
  s.p.lora_rank = 16;
  s.p.lora_targets = 1u << static_cast<int>(LoraTarget::kProj);
  Case d = s;
  d.p.lora_dropout = 0.1;
  const Liveness a = liveness(lower_stage(s.m, s.p, 0));
  const Liveness b = liveness(lower_stage(d.m, d.p, 0));
  // The projection's input stays for the attention's backward either way; the dropout adds the
  // dropped copy (bf16) and its mask (a byte) per layer, kept to the backward.
  const Dims x = dims(s);
  const double kept = s.m.layers * 3 * x.T * x.ao;
  EXPECT_GT(b.peak_bytes - a.peak_bytes, 0.9 * kept);
  EXPECT_LE(b.peak_bytes - a.peak_bytes, kept + 2 * x.T * x.ao);
}

TEST(LowerLora, TheSwigluKeepsAnFp8CopyOfItsInput) {
  Case s;
  Case f = s;
  f.p.activation_fp8_input_store = true;
  const Program prog = lower_stage(f.m, f.p, 0);
  const Dims d = dims(s);
  int copies = 0, casts = 0;
  for (const Buffer& b : prog.buffers)
    if (b.name.find("fc1.fp8") != std::string::npos) {
      ++copies;
      EXPECT_EQ(b.dtype, Dtype::kFp8);
      EXPECT_DOUBLE_EQ(b.bytes(), d.T * d.fc1);
    }
  for (const Op& op : prog.ops)
    casts += op.kind == OpKind::kCast && op.tags.phase == Phase::kBackward;
  EXPECT_EQ(copies, s.m.layers);
  EXPECT_EQ(casts, s.m.layers);  // cast back before each SwiGLU backward
  // The saved FC1 outputs shrink from 2 bytes an element to 1: the stage's peak by at least
  // every layer but the last's (whose backward casts its copy back first).
  const double saved =
      liveness(lower_stage(s.m, s.p, 0)).peak_bytes - liveness(lower_stage(f.m, f.p, 0)).peak_bytes;
  EXPECT_GE(saved, (s.m.layers - 1) * d.T * d.fc1);
}

}  // namespace
}  // namespace parasol
