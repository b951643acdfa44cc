// Tests core/layer_shapes.h (the linears, norms and attention core of a decoder layer, and their
// agreement with param_counts and flops_per_token) and core/program.h's attention_flops with
// value head dims and sliding windows (brute force over (query, key) pairs).
#include "core/layer_shapes.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <type_traits>
#include <vector>

#include "core/model.h"
#include "core/program.h"

namespace parasol {
namespace {

// Plain values: the cost model may build them for every candidate plan.
static_assert(std::is_trivially_copyable_v<Linears>);
static_assert(std::is_trivially_copyable_v<Norms>);

std::vector<std::string> names(const Linears& l) {
  std::vector<std::string> n;
  for (const LinearShape& s : l) n.push_back(s.name);
  return n;
}

void ExpectLinear(const LinearShape& s, const char* name, int64_t in, int64_t out, Split split,
                  bool bias) {
  EXPECT_STREQ(s.name, name);
  EXPECT_EQ(s.in, in) << name;
  EXPECT_EQ(s.out, out) << name;
  EXPECT_EQ(s.split, split) << name << ": " << split_name(s.split);
  EXPECT_EQ(s.bias, bias) << name;
}

// Models covering every feature: the presets and variants of them.
std::vector<Model> all_models() {
  std::vector<Model> ms;
  for (const std::string& n : model_preset_names()) ms.push_back(model_preset(n));
  Model m = model_preset("deepseek-v3");  // MLA without query compression, layernorm, biases
  m.name = "mla-plain-q";
  m.mla.q_lora_rank = 0;
  m.norm = Norm::kLayerNorm;
  m.linear_bias = true;
  ms.push_back(m);
  m = model_preset("tiny-moe");  // gelu experts with biases, shared experts of their own size
  m.name = "tiny-moe-shared";
  m.layers = 6;
  m.activation = Activation::kGelu;
  m.linear_bias = true;
  m.moe.every = 2;
  m.moe.first_dense = 2;
  m.moe.shared_experts = 3;
  m.moe.shared_expert_ffn = 40;
  ms.push_back(m);
  return ms;
}

// --- The shapes ------------------------------------------------------------------------------

TEST(LayerShapes, LlamaAttentionAndMlp) {
  const Model m = model_preset("tiny");  // h 64, 4 heads, 2 KV heads of 16, ffn 256, swiglu
  const Linears a = attention_linears(m);
  ASSERT_EQ(a.size(), 2);
  ExpectLinear(a[0], "qkv", 64, 64 + 2 * 32, Split::kColumn, false);
  ExpectLinear(a[1], "out", 64, 64, Split::kRow, false);
  EXPECT_TRUE(attention_norms(m).empty());
  const Linears f = mlp_linears(m, 0);
  ASSERT_EQ(f.size(), 2);
  ExpectLinear(f[0], "fc1", 64, 2 * 256, Split::kColumn, false);  // gate | up
  ExpectLinear(f[1], "fc2", 256, 64, Split::kRow, false);
  EXPECT_TRUE(expert_linears(m).empty());
}

TEST(LayerShapes, GptBiasesAndGeluMlp) {
  const Model m = model_preset("gpt2-124m");
  for (const LinearShape& s : attention_linears(m)) EXPECT_TRUE(s.bias) << s.name;
  const Linears f = mlp_linears(m, 5);
  ExpectLinear(f[0], "fc1", 768, 3072, Split::kColumn, true);
  ExpectLinear(f[1], "fc2", 3072, 768, Split::kRow, true);
  EXPECT_EQ(f[0].params(), 768 * 3072 + 3072);
}

TEST(LayerShapes, MlaLinearsNormsAndSplits) {
  // DeepSeek-V3: h 7168, 128 heads, q_lora 1536, kv_lora 512, nope 128, rope 64, v 128.
  const Model m = model_preset("deepseek-v3");
  const Linears a = attention_linears(m);
  ASSERT_EQ(a.size(), 5);
  ExpectLinear(a[0], "q_down", 7168, 1536, Split::kReplicated, false);
  ExpectLinear(a[1], "q_up", 1536, 128 * 192, Split::kColumn, false);
  ExpectLinear(a[2], "kv_down", 7168, 512 + 64, Split::kReplicated, false);
  ExpectLinear(a[3], "kv_up", 512, 128 * (128 + 128), Split::kColumn, false);
  ExpectLinear(a[4], "out", 128 * 128, 7168, Split::kRow, false);
  const Norms n = attention_norms(m);
  ASSERT_EQ(n.size(), 2);
  EXPECT_STREQ(n[0].name, "q_norm");
  EXPECT_EQ(n[0].width, 1536);
  EXPECT_STREQ(n[1].name, "kv_norm");
  EXPECT_EQ(n[1].width, 512);
  EXPECT_EQ(n[1].params(m), 512);  // RMSNorm
}

TEST(LayerShapes, MlaWithoutQueryCompression) {
  Model m = model_preset("deepseek-v3");
  m.mla.q_lora_rank = 0;  // DeepSeek-V2-Lite: a plain q projection
  EXPECT_EQ(names(attention_linears(m)),
            (std::vector<std::string>{"q", "kv_down", "kv_up", "out"}));
  ExpectLinear(attention_linears(m)[0], "q", 7168, 128 * 192, Split::kColumn, false);
  ASSERT_EQ(attention_norms(m).size(), 1);
  EXPECT_STREQ(attention_norms(m)[0].name, "kv_norm");
}

TEST(LayerShapes, FirstDenseLayersThenRouterAndSharedExperts) {
  const Model m = model_preset("deepseek-v3");
  for (int l = 0; l < 3; ++l) {
    const Linears f = mlp_linears(m, l);
    ASSERT_EQ(f.size(), 2) << l;
    ExpectLinear(f[0], "fc1", 7168, 2 * 18432, Split::kColumn, false);
    ExpectLinear(f[1], "fc2", 18432, 7168, Split::kRow, false);
  }
  const Linears f = mlp_linears(m, 3);
  ASSERT_EQ(f.size(), 3);
  ExpectLinear(f[0], "router", 7168, 256, Split::kReplicated, false);
  ExpectLinear(f[1], "shared_fc1", 7168, 2 * 2048, Split::kColumn, false);
  ExpectLinear(f[2], "shared_fc2", 2048, 7168, Split::kRow, false);
  const Linears e = expert_linears(m);
  ASSERT_EQ(e.size(), 2);
  ExpectLinear(e[0], "efc1", 7168, 2 * 2048, Split::kColumn, false);
  ExpectLinear(e[1], "efc2", 2048, 7168, Split::kRow, false);
  // Mixtral: no shared experts, the router alone.
  EXPECT_EQ(names(mlp_linears(model_preset("mixtral-8x7b"), 0)),
            (std::vector<std::string>{"router"}));
}

TEST(LayerShapes, SharedExpertsAreOneFusedMlp) {
  Model m = model_preset("tiny-moe");  // h 64, swiglu
  m.linear_bias = true;
  m.moe.shared_experts = 2;
  m.moe.shared_expert_ffn = 48;
  const Linears f = mlp_linears(m, 0);
  ExpectLinear(f[1], "shared_fc1", 64, 2 * 96, Split::kColumn, true);
  ExpectLinear(f[2], "shared_fc2", 96, 64, Split::kRow, true);
  EXPECT_FALSE(f[0].bias);  // parasol's router has no bias
}

TEST(LayerShapes, AttentionShapeOfALayer) {
  const Model oss = model_preset("gpt-oss-120b");  // 64 heads, 8 KV heads of 64; window 128 on
                                                   // even layers, full on odd ones
  AttnShape a = attention_shape(oss, 0, 4, 2, 1024, 4096, true);
  EXPECT_EQ(a.batch, 2);
  EXPECT_EQ(a.seq_q, 1024);
  EXPECT_EQ(a.seq_kv, 4096);
  EXPECT_EQ(a.heads, 16);
  EXPECT_EQ(a.kv_heads, 2);
  EXPECT_EQ(a.head_dim, 64);
  EXPECT_EQ(a.v_head_dim, 0);
  EXPECT_EQ(a.window, 128);
  EXPECT_TRUE(a.causal);
  EXPECT_TRUE(a.flash);
  EXPECT_EQ(attention_shape(oss, 1, 4, 2, 1024, 4096, true).window, 0);
  EXPECT_EQ(attention_shape(oss, 34, 1, 1, 8, 8, true).window, 128);
  EXPECT_EQ(attention_shape(oss, 35, 1, 1, 8, 8, true).window, 0);

  const AttnShape d = attention_shape(model_preset("deepseek-v3"), 10, 8, 1, 4096, 4096, false);
  EXPECT_EQ(d.heads, 16);
  EXPECT_EQ(d.kv_heads, 16);  // MLA: every head has its own key and value
  EXPECT_EQ(d.head_dim, 192);
  EXPECT_EQ(d.v_head_dim, 128);
  EXPECT_EQ(d.window, 0);
  EXPECT_FALSE(d.flash);

  const Model gpt = model_preset("gpt2-124m");  // dropout: only the materialised kernel's
  EXPECT_TRUE(attention_shape(gpt, 0, 1, 1, 8, 8, false).dropout);
  EXPECT_FALSE(attention_shape(gpt, 0, 1, 1, 8, 8, true).dropout);
  // Without MLA and windows the shape prices exactly as before the new fields.
  const Model llama = model_preset("llama3-8b");
  const AttnShape l = attention_shape(llama, 3, 2, 1, 8192, 8192, true);
  EXPECT_EQ(l.v_head_dim, 0);
  EXPECT_EQ(l.window, 0);
}

// --- Shapes agree with param_counts and flops_per_token ---------------------------------------

int64_t params(const Linears& l) {
  int64_t n = 0;
  for (const LinearShape& s : l) n += s.params();
  return n;
}

TEST(LayerShapes, ParamCountsAreTheShapesParameters) {
  for (const Model& m : all_models()) {
    SCOPED_TRACE(m.name);
    ASSERT_NO_THROW(validate_model(m));
    const ParamCounts c = param_counts(m);
    int64_t norms = 0, replicated = 0;
    for (const NormShape& n : attention_norms(m)) norms += n.params(m);
    for (const LinearShape& s : attention_linears(m))
      if (s.split == Split::kReplicated) replicated += s.params();
    EXPECT_EQ(c.attention, params(attention_linears(m)) + norms);
    EXPECT_EQ(c.attention_replicated, replicated + norms);
    EXPECT_EQ(c.expert_mlp, params(expert_linears(m)));
    // Every layer: two pre-norms, the attention block, the MLP block's dense linears and, in an
    // MoE layer, every routed expert (top_k of them for the active count).
    int64_t total = c.embedding + c.final_norm + c.lm_head;
    int64_t active = total;
    for (int l = 0; l < m.layers; ++l) {
      const int64_t layer = c.norms + c.attention + params(mlp_linears(m, l));
      total += layer + (m.is_moe_layer(l) ? m.moe.experts * c.expert_mlp : 0);
      active += layer + (m.is_moe_layer(l) ? m.moe.top_k * c.expert_mlp : 0);
      if (m.is_moe_layer(l)) {
        EXPECT_EQ(params(mlp_linears(m, l)), c.router + c.shared_mlp) << l;
      } else {
        EXPECT_EQ(params(mlp_linears(m, l)), c.dense_mlp) << l;
      }
    }
    EXPECT_EQ(c.total, total);
    EXPECT_EQ(c.active, active);
  }
}

TEST(LayerShapes, ForwardFlopsAreTheShapesFlopsPlusAttentionCoreAndLogits) {
  for (const Model& m : all_models()) {
    SCOPED_TRACE(m.name);
    const int64_t seq = m.seq_len;
    double linears = 0, core = 0;
    for (int l = 0; l < m.layers; ++l) {
      for (const LinearShape& s : attention_linears(m)) linears += s.flops_per_token();
      for (const LinearShape& s : mlp_linears(m, l)) linears += s.flops_per_token();
      if (m.is_moe_layer(l))
        for (const LinearShape& s : expert_linears(m)) linears += m.moe.top_k * s.flops_per_token();
      // The core from the layer's attention shape: the flash kernel's causal pairs P per
      // sequence; Megatron's MFU convention counts 2 P - S of them (the whole matrix without a
      // window, its symmetric band with one).
      const AttnShape a = attention_shape(m, l, 1, 1, seq, seq, true);
      const double causal = attention_flops(a);
      const double per_pair =
          2.0 * a.heads * (a.head_dim + (a.v_head_dim ? a.v_head_dim : a.head_dim));
      core += (2.0 * causal - per_pair * seq) / seq;
    }
    const double logits = 2.0 * m.hidden * m.vocab;
    EXPECT_NEAR(flops_per_token(m).forward, linears + core + logits,
                1e-12 * flops_per_token(m).forward);
  }
}

// --- attention_flops -----------------------------------------------------------------------------

// (query, key) pairs a causal kernel with window w (0 = none) computes for one sequence of s.
int64_t brute_pairs(int64_t s, int64_t w) {
  int64_t n = 0;
  for (int64_t i = 0; i < s; ++i)
    for (int64_t j = 0; j <= i; ++j)
      if (w == 0 || i - j < w) ++n;
  return n;
}

AttnShape shape(int64_t sq, int64_t skv, int64_t window, int64_t v_head_dim, bool flash = true) {
  AttnShape a;
  a.batch = 3;
  a.seq_q = sq;
  a.seq_kv = skv;
  a.heads = 5;
  a.kv_heads = 5;
  a.head_dim = 7;
  a.v_head_dim = v_head_dim;
  a.window = window;
  a.flash = flash;
  return a;
}

TEST(ProgramAttentionFlops, WindowedCausalCountsEveryPairOnce) {
  for (int64_t s = 1; s <= 24; ++s) {
    for (int64_t w = 0; w <= 30; ++w) {
      for (int64_t dv : {int64_t{0}, int64_t{11}}) {
        const double per_pair = 2.0 * 3 * 5 * (7 + (dv ? dv : 7));
        const double expected = per_pair * static_cast<double>(brute_pairs(s, w));
        if (w == 0 && dv == 0) {  // the pre-window formula: equal up to rounding
          EXPECT_NEAR(attention_flops(shape(s, s, w, dv)), expected, 1e-12 * expected);
        } else {
          EXPECT_EQ(attention_flops(shape(s, s, w, dv)), expected) << s << " " << w << " " << dv;
        }
      }
    }
  }
}

TEST(ProgramAttentionFlops, MaterialisedAndNonCausalComputeTheWholeMatrix) {
  // The score matrix is computed in full, then masked, whatever the window.
  EXPECT_EQ(attention_flops(shape(16, 16, 4, 0, false)), 2.0 * 3 * 5 * 14 * 16 * 16);
  EXPECT_EQ(attention_flops(shape(16, 16, 4, 9, false)), 2.0 * 3 * 5 * 16 * 16 * 16);
  AttnShape a = shape(16, 16, 4, 9);
  a.causal = false;  // a window is a causal mask: ignored here
  EXPECT_EQ(attention_flops(a), 2.0 * 3 * 5 * 16 * 16 * 16);
}

TEST(ProgramAttentionFlops, ValueHeadDimCountsAvSeparately) {
  // MLA: QK^T over 192 dims, AV over 128.
  AttnShape a = shape(64, 64, 0, 128, false);
  a.head_dim = 192;
  EXPECT_EQ(attention_flops(a), 2.0 * 3 * 5 * 64 * 64 * 192 + 2.0 * 3 * 5 * 64 * 64 * 128);
  a.flash = true;
  EXPECT_EQ(attention_flops(a), 2.0 * 3 * 5 * (192 + 128) * (64 * 65 / 2));
}

TEST(ProgramAttentionFlops, NewFieldsZeroKeepTheFormerCountBitForBit) {
  for (bool flash : {true, false})
    for (bool causal : {true, false})
      for (auto [sq, skv] : std::vector<std::pair<int64_t, int64_t>>{
               {4096, 4096}, {1024, 4096}, {1, 1}, {333, 8191}}) {
        AttnShape a = shape(sq, skv, 0, 0, flash);
        a.causal = causal;
        const double full =
            4.0 * a.batch * a.heads * static_cast<double>(a.seq_q) * a.seq_kv * a.head_dim;
        const double former =
            !causal || !flash ? full : full * 0.5 * (1.0 + 1.0 / std::max<int64_t>(1, a.seq_kv));
        EXPECT_EQ(attention_flops(a), former);
      }
}

TEST(ProgramAttentionFlops, ContextParallelChunkIsAnAverageShareOfTheSequence) {
  // seq_q = S / cp queries of a load-balanced layout: seq_q P(S, W) / S pairs, so that the cp
  // ranks together count the sequence's pairs exactly.
  const int64_t S = 64, cp = 4;
  for (int64_t w : {int64_t{0}, int64_t{5}, int64_t{64}, int64_t{100}}) {
    const double one = attention_flops(shape(S / cp, S, w, 9));
    EXPECT_NEAR(cp * one, attention_flops(shape(S, S, w, 9)), 1e-9 * one) << w;
    EXPECT_NEAR(one, 2.0 * 3 * 5 * 16 * (S / cp) * brute_pairs(S, w) / double(S), 1e-9 * one);
  }
}

TEST(ProgramAttentionFlops, WindowAtLeastTheSequenceIsFullCausal) {
  for (int64_t w : {int64_t{32}, int64_t{33}, int64_t{1} << 20})
    EXPECT_EQ(attention_flops(shape(32, 32, w, 9)), attention_flops(shape(32, 32, 0, 9))) << w;
  // A window of 1: each query attends itself only.
  EXPECT_EQ(attention_flops(shape(32, 32, 1, 9)), 2.0 * 3 * 5 * 16 * 32);
}

// The memory-bound kernels' bytes per element, fused and eager (PyTorch op by op), in bf16 and
// fp32, from the kernels' reads and writes counted by hand.
TEST(KernelBytes, FusedAndEagerKernels) {
  Model m = model_preset("llama3-8b");  // RMSNorm, SwiGLU, RoPE, no dropout
  Plan p;
  p.precision = Dtype::kBf16;
  KernelBytes k = kernel_bytes(m, p);
  EXPECT_EQ(k.norm, 4);        // read and write 2-byte elements
  EXPECT_EQ(k.activation, 6);  // read gate and up, write the product
  EXPECT_EQ(k.rotary, 4);
  EXPECT_EQ(k.residual, 6);  // read two, write one
  p.fused_kernels = false;
  k = kernel_bytes(m, p);
  EXPECT_EQ(k.norm, 4 * 2 + 28);    // upcast, square, mean, scale, downcast, weight
  EXPECT_EQ(k.activation, 5 * 2);   // silu, then the multiply
  EXPECT_EQ(k.rotary, 2 * 2 + 16);  // through complex fp32
  EXPECT_EQ(k.rotary_backward, 2 * k.rotary);
  EXPECT_EQ(k.residual, 6);
  p.precision = Dtype::kFp32;
  EXPECT_EQ(kernel_bytes(m, p).norm, 4 * 4 + 28);
  // LayerNorm is one ATen kernel even in eager; GELU reads one input; learned positions have no
  // rotary embedding; dropout adds its 1-byte mask to the residual.
  Model g = model_preset("gpt3-175b");
  g.dropout = true;
  p.precision = Dtype::kBf16;
  k = kernel_bytes(g, p);
  EXPECT_EQ(k.norm, 4);
  EXPECT_EQ(k.activation, 4);
  EXPECT_EQ(k.rotary, 0);
  EXPECT_EQ(k.residual, 7);
}

// A YaRN model whose concentration factor is not 1 runs Megatron-Core's unfused RoPE
// (rope_utils.py @4415119 L279-284): 12 eb forward, 14 eb backward, by the kernels counted in
// core/layer_shapes.h; YaRN with a concentration of 1 (DeepSeek-V3) keeps the fused kernel, and an
// eager plan keeps its own eager RoPE.
TEST(KernelBytes, YarnConcentrationUnfusesRope) {
  Plan p;
  p.precision = Dtype::kBf16;
  Model m = model_preset("gpt-oss-120b");
  ASSERT_GT(m.rope_concentration(), 1.3);
  KernelBytes k = kernel_bytes(m, p);
  EXPECT_EQ(k.rotary, 12 * 2);
  EXPECT_EQ(k.rotary_backward, 14 * 2);
  m.yarn.mscale = 1.0;
  m.yarn.mscale_all_dim = 1.0;
  k = kernel_bytes(m, p);
  EXPECT_EQ(k.rotary, 4);
  EXPECT_EQ(k.rotary_backward, 8);
  EXPECT_EQ(kernel_bytes(model_preset("deepseek-v3"), p).rotary, 4);
  p.fused_kernels = false;
  EXPECT_EQ(kernel_bytes(model_preset("gpt-oss-120b"), p).rotary, 2 * 2 + 16);
}

// The ring steps a windowed layer runs: its own chunk and the chunks its window reaches back.
TEST(ContextRing, StepsAWindowReaches) {
  EXPECT_EQ(context_ring_steps(4, 8192, 0), 4);     // no window: every chunk
  EXPECT_EQ(context_ring_steps(4, 8192, 1), 1);     // only the diagonal
  EXPECT_EQ(context_ring_steps(4, 8192, 4096), 2);  // reaches into the previous chunk
  EXPECT_EQ(context_ring_steps(4, 8192, 8193), 2);  // a whole chunk back, from its first query
  EXPECT_EQ(context_ring_steps(4, 8192, 8194), 3);  // one token further: the chunk before that
  EXPECT_EQ(context_ring_steps(4, 8192, 1 << 20), 4);
}

TEST(KernelBytes, RotaryColumnsAreQueriesAndKeys) {
  const Model m = model_preset("llama3-8b");  // 32 heads, 8 KV heads of 128
  EXPECT_EQ(rotary_columns(m), 32 * 128 + 8 * 128);
  const Model d = model_preset("deepseek-v3");  // MLA: every head's query dims and the shared key
  EXPECT_EQ(rotary_columns(d), int64_t{d.heads} * d.head_dim + d.head_dim);
}

}  // namespace
}  // namespace parasol
