// Tests core/model.h: param counts and FLOPs vs published figures, HF import, JSON, errors.
#include "core/model.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "core/error.h"
#include "tests/core/expect_error.h"

namespace parasol {
namespace {

const std::string kDataDir = PARASOL_TEST_DATA_DIR;

// Relative difference |a - b| / |b|.
double rel(double a, double b) { return std::abs(a - b) / std::abs(b); }

void ExpectSameModel(const Model& a, const Model& b) {
  EXPECT_EQ(a.name, b.name);
  EXPECT_EQ(a.layers, b.layers);
  EXPECT_EQ(a.hidden, b.hidden);
  EXPECT_EQ(a.heads, b.heads);
  EXPECT_EQ(a.kv_heads, b.kv_heads);
  EXPECT_EQ(a.head_dim, b.head_dim);
  EXPECT_EQ(a.ffn, b.ffn);
  EXPECT_EQ(a.vocab, b.vocab);
  EXPECT_EQ(a.seq_len, b.seq_len);
  EXPECT_EQ(a.norm, b.norm);
  EXPECT_EQ(a.activation, b.activation);
  EXPECT_EQ(a.tied_embeddings, b.tied_embeddings);
  EXPECT_EQ(a.learned_positions, b.learned_positions);
  EXPECT_EQ(a.linear_bias, b.linear_bias);
  EXPECT_EQ(a.dropout, b.dropout);
  EXPECT_EQ(a.moe.experts, b.moe.experts);
  EXPECT_EQ(a.moe.top_k, b.moe.top_k);
  EXPECT_EQ(a.moe.expert_ffn, b.moe.expert_ffn);
  EXPECT_EQ(a.moe.every, b.moe.every);
}

// --- Parameter counts vs published figures ----------------------------------------------------

struct Published {
  const char* preset;
  double total;      // published parameter count
  double tolerance;  // relative
};

class PublishedParams : public ::testing::TestWithParam<Published> {};

TEST_P(PublishedParams, TotalMatchesPublishedFigure) {
  const Published& p = GetParam();
  ParamCounts c = param_counts(model_preset(p.preset));
  EXPECT_LE(rel(static_cast<double>(c.total), p.total), p.tolerance)
      << p.preset << ": " << c.total << " vs published " << p.total;
}

INSTANTIATE_TEST_SUITE_P(Presets, PublishedParams,
                         ::testing::Values(
                             // Meta Llama 3 model card: 8.03B.
                             Published{"llama3-8b", 8.03e9, 0.005},
                             // Brown et al. 2020 / Narayanan et al. 2021: 174.6B.
                             Published{"gpt3-175b", 174.6e9, 0.005},
                             // HF openai-community/gpt2 num_parameters(): 124.44M.
                             Published{"gpt2-124m", 124.44e6, 0.01},
                             // Meta Llama 3 70B: 70.55B; Llama 3.1 405B: 405.8B.
                             Published{"llama3-70b", 70.55e9, 0.01},
                             Published{"llama3-405b", 405.8e9, 0.01},
                             // Jiang et al. 2024 (Mixtral of Experts): 46.7B total.
                             Published{"mixtral-8x7b", 46.7e9, 0.01}),
                         [](const auto& info) {
                           std::string n = info.param.preset;
                           for (char& ch : n)
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return n;
                         });

TEST(ModelParams, MixtralActiveMatchesPublishedFigure) {
  // Jiang et al. 2024: 12.9B active parameters per token (top-2 of 8 experts).
  ParamCounts c = param_counts(model_preset("mixtral-8x7b"));
  EXPECT_LE(rel(static_cast<double>(c.active), 12.9e9), 0.01) << c.active;
  EXPECT_LT(c.active, c.total);
}

TEST(ModelParams, Gpt2ExactHuggingFaceCount) {
  // GPT2LMHeadModel.from_pretrained("gpt2").num_parameters() == 124,439,808 (tied lm_head).
  EXPECT_EQ(param_counts(model_preset("gpt2-124m")).total, 124439808);
}

TEST(ModelParams, GptFamilyMatchesClosedForm) {
  // GPT with biases, LayerNorm, GELU MLP of 4h, learned positions:
  //   per layer 12h^2 + 13h (qkv+o weights 4h^2, biases 4h; MLP 8h^2, biases 5h; 2 LN 4h)
  //   plus token embedding Vh, positions sh, final LN 2h, and an untied head Vh.
  for (const char* name :
       {"gpt2-124m", "gpt2-1.5b", "gpt3-175b", "gpt-22b", "tnlg-530b", "megatron-1t"}) {
    Model m = model_preset(name);
    const int64_t l = m.layers, h = m.hidden, V = m.vocab, s = m.seq_len;
    int64_t expected = l * (12 * h * h + 13 * h) + V * h + s * h + 2 * h;
    if (!m.tied_embeddings) expected += V * h;
    EXPECT_EQ(param_counts(m).total, expected) << name;
    EXPECT_EQ(param_counts(m).active, expected) << name;
  }
}

TEST(ModelParams, LlamaFamilyMatchesClosedForm) {
  // Llama: no biases, RMSNorm (h each), SwiGLU (3 matrices), GQA k/v of kv_heads x head_dim,
  // untied embeddings, RoPE (no position table).
  for (const char* name : {"llama2-7b", "llama3-8b", "llama3-70b", "llama3-405b"}) {
    Model m = model_preset(name);
    const int64_t l = m.layers, h = m.hidden, V = m.vocab, f = m.ffn;
    const int64_t kv = static_cast<int64_t>(m.kv_heads) * (h / m.heads);
    int64_t expected = l * (2 * h * h + 2 * h * kv + 3 * h * f + 2 * h) + 2 * V * h + h;
    EXPECT_EQ(param_counts(m).total, expected) << name;
  }
}

TEST(ModelParams, MixtralMatchesClosedForm) {
  // 32 layers of attention (h=4096, 8 KV heads of 128) + router (h x 8) + 8 SwiGLU experts.
  const int64_t l = 32, h = 4096, kv = 8 * 128, f = 14336, V = 32000, E = 8;
  const int64_t attn = 2 * h * h + 2 * h * kv, expert = 3 * h * f, norms = 2 * h;
  ParamCounts c = param_counts(model_preset("mixtral-8x7b"));
  EXPECT_EQ(c.total, l * (attn + norms + h * E + E * expert) + 2 * V * h + h);
  EXPECT_EQ(c.active, l * (attn + norms + h * E + 2 * expert) + 2 * V * h + h);
  EXPECT_EQ(c.expert_mlp, expert);
  EXPECT_EQ(c.router, h * E);
}

TEST(ModelParams, MoeEveryOtherLayer) {
  // every = 2: layers 1, 3 of 4 are MoE.
  Model m = model_preset("tiny-moe");
  m.layers = 4;
  m.moe.every = 2;
  ASSERT_NO_THROW(validate_model(m));
  EXPECT_FALSE(m.is_moe_layer(0));
  EXPECT_TRUE(m.is_moe_layer(1));
  EXPECT_FALSE(m.is_moe_layer(2));
  EXPECT_TRUE(m.is_moe_layer(3));
  EXPECT_EQ(m.moe_layer_count(), 2);
  ParamCounts c = param_counts(m);
  EXPECT_EQ(c.total,
            c.embedding + c.final_norm + c.lm_head + 2 * c.dense_layer + 2 * c.moe_layer_total);
}

// --- FLOPs per token ---------------------------------------------------------------------------

// Narayanan et al. 2021, eq. 3 without recompute: an iteration of B sequences of s tokens
// costs 72 B s l h^2 (1 + s/(6h) + V/(12 l h)) FLOPs, i.e. this much per token.
double megatron_model_flops_per_token(double l, double h, double s, double V) {
  return 72.0 * l * h * h * (1.0 + s / (6.0 * h) + V / (12.0 * l * h));
}

TEST(ModelFlops, Gpt3MatchesMegatronFormula) {
  Model m = model_preset("gpt3-175b");
  m.vocab = 51200;  // Megatron-LM's padded GPT vocabulary, as in the paper
  const double expected = megatron_model_flops_per_token(96, 12288, 2048, 51200);
  FlopsPerToken f = flops_per_token(m);
  EXPECT_LE(rel(f.model, expected), 1e-12) << f.model << " vs " << expected;
  EXPECT_LE(rel(f.forward, expected / 3), 1e-12);
}

TEST(ModelFlops, SequenceArgumentOverridesModelSeq) {
  Model m = model_preset("gpt3-175b");
  m.vocab = 51200;
  for (double s : {1024.0, 4096.0, 8192.0}) {
    FlopsPerToken f = flops_per_token(m, static_cast<int64_t>(s));
    EXPECT_LE(rel(f.model, megatron_model_flops_per_token(96, 12288, s, 51200)), 1e-12) << s;
  }
  // seq = 0 means the model's own sequence length.
  EXPECT_EQ(flops_per_token(m, 0).model, flops_per_token(m, m.seq_len).model);
}

TEST(ModelFlops, FullRecomputeAddsTheLayersForwardButNotTheOutputLayer) {
  for (const std::string& name : model_preset_names()) {
    Model m = model_preset(name);
    FlopsPerToken f = flops_per_token(m);
    EXPECT_GT(f.forward, 0) << name;
    const double logits = 2.0 * m.hidden * m.vocab;
    EXPECT_LE(rel(f.with_full_recompute, f.model + f.forward - logits), 1e-12) << name;
    EXPECT_LE(rel(f.model, 3.0 * f.forward), 1e-12) << name;
  }
}

TEST(ModelFlops, Gpt3FullRecomputeNearMegatronHfuFormula) {
  // Narayanan et al. eq. 3 with recompute: 96 B s l h^2 (1 + s/(6h) + V/(16 l h)); the logits
  // (6hV per token) are not recomputed. Biases and norms are not counted by either.
  Model m = model_preset("gpt3-175b");
  m.vocab = 51200;
  const double l = 96, h = 12288, s = 2048, V = 51200;
  const double megatron = 96.0 * l * h * h * (1.0 + s / (6.0 * h) + V / (16.0 * l * h));
  const double f = flops_per_token(m).with_full_recompute;
  EXPECT_LE(rel(f, megatron), 1e-12);
}

TEST(ModelFlops, GqaSwigluForwardIsTwicePerTokenWeightsPlusAttention) {
  // Forward FLOPs = 2 x (weights of the layers' linear maps) + 4 l s (heads x head_dim) for
  // QK^T and AV + 2 h V for the logits (norms and biases not counted).
  Model m = model_preset("llama3-8b");
  const double l = 32, h = 4096, q = 4096, kv = 1024, f = 14336, V = 128256, s = 8192;
  const double linear = 2 * h * q + 2 * h * kv + 3 * h * f;
  const double expected = 2 * l * linear + 4 * l * s * q + 2 * h * V;
  EXPECT_LE(rel(flops_per_token(m).forward, expected), 1e-12);
}

TEST(ModelFlops, MoeCountsActiveExpertsAndRouter) {
  Model m = model_preset("mixtral-8x7b");
  const double l = 32, h = 4096, q = 4096, kv = 1024, f = 14336, V = 32000, s = 4096;
  const double per_layer = 2 * (2 * h * q + 2 * h * kv) + 4 * s * q +  // attention
                           2 * 2 * (3 * h * f) +                       // two active experts
                           2 * h * 8;                                  // router
  EXPECT_LE(rel(flops_per_token(m).forward, l * per_layer + 2 * h * V), 1e-12);
}

// --- Hugging Face config.json import -----------------------------------------------------------

Json hf(const std::string& file) { return read_json_file(kDataDir + "/hf/" + file); }

TEST(HfConfig, Llama3_8bEqualsPreset) {
  Json j = hf("llama3_8b_config.json");
  ASSERT_TRUE(looks_like_hf_config(j));
  Model m = model_from_hf_config(j);
  Model p = model_preset("llama3-8b");
  EXPECT_EQ(param_counts(m).total, param_counts(p).total);
  EXPECT_EQ(m.layers, 32);
  EXPECT_EQ(m.hidden, 4096);
  EXPECT_EQ(m.heads, 32);
  EXPECT_EQ(m.kv_heads, 8);
  EXPECT_EQ(m.head_dim, 128);
  EXPECT_EQ(m.ffn, 14336);
  EXPECT_EQ(m.vocab, 128256);
  EXPECT_EQ(m.seq_len, 8192);
  EXPECT_EQ(m.norm, Norm::kRmsNorm);
  EXPECT_EQ(m.activation, Activation::kSwiglu);
  EXPECT_FALSE(m.tied_embeddings);
  EXPECT_FALSE(m.learned_positions);
  EXPECT_FALSE(m.linear_bias);
  EXPECT_FALSE(m.is_moe());
  EXPECT_EQ(flops_per_token(m).model, flops_per_token(p).model);
}

TEST(HfConfig, Gpt2EqualsPresetWithNInnerNullOrAbsent) {
  Json j = hf("gpt2_config.json");
  ASSERT_FALSE(j.contains("n_inner"));  // the published file omits it: 4 x n_embd
  const int64_t preset_total = param_counts(model_preset("gpt2-124m")).total;
  Model absent = model_from_hf_config(j);
  EXPECT_EQ(absent.ffn, 4 * 768);
  EXPECT_EQ(param_counts(absent).total, preset_total);
  j["n_inner"] = nullptr;  // as GPT2Config.to_dict() writes it
  Model null_inner = model_from_hf_config(j);
  EXPECT_EQ(null_inner.ffn, 4 * 768);
  EXPECT_EQ(param_counts(null_inner).total, preset_total);
  EXPECT_TRUE(null_inner.tied_embeddings);
  EXPECT_TRUE(null_inner.learned_positions);
  EXPECT_TRUE(null_inner.linear_bias);
  EXPECT_EQ(null_inner.norm, Norm::kLayerNorm);
  EXPECT_EQ(null_inner.activation, Activation::kGelu);
  EXPECT_EQ(null_inner.seq_len, 1024);
  j["n_inner"] = 1024;  // an explicit n_inner is honoured
  EXPECT_EQ(model_from_hf_config(j).ffn, 1024);
}

TEST(HfConfig, MixtralEqualsPreset) {
  Model m = model_from_hf_config(hf("mixtral_config.json"));
  Model p = model_preset("mixtral-8x7b");
  EXPECT_EQ(param_counts(m).total, param_counts(p).total);
  EXPECT_EQ(param_counts(m).active, param_counts(p).active);
  EXPECT_EQ(m.moe.experts, 8);
  EXPECT_EQ(m.moe.top_k, 2);
  EXPECT_EQ(m.moe.expert_ffn, 14336);
  EXPECT_EQ(m.moe.every, 1);
  EXPECT_EQ(m.seq_len, 32768);  // max_position_embeddings
}

TEST(HfConfig, LoadModelDetectsHfFiles) {
  Model m = load_model(kDataDir + "/hf/llama3_8b_config.json");
  EXPECT_EQ(param_counts(m).total, param_counts(model_preset("llama3-8b")).total);
  Model g = load_model(kDataDir + "/hf/gpt2_config.json");
  EXPECT_EQ(param_counts(g).total, 124439808);
}

TEST(HfConfig, ErrorsNameTheHfField) {
  Json j = hf("llama3_8b_config.json");
  j["num_attention_heads"] = 3;  // does not divide 4096, no head_dim
  ExpectError([&] { model_from_hf_config(j); }, "model.num_attention_heads", "divide");
  j = hf("llama3_8b_config.json");
  j.erase("hidden_size");
  ExpectError([&] { model_from_hf_config(j); }, "model.hidden_size", "required");
  j = hf("llama3_8b_config.json");
  j["intermediate_size"] = "14336";
  ExpectError([&] { model_from_hf_config(j); }, "model.intermediate_size", "integer");
  j = hf("mixtral_config.json");
  j["num_experts_per_tok"] = 9;  // more than the 8 experts
  ExpectError([&] { model_from_hf_config(j); }, "model.num_experts_per_tok", "out of range");
  j = hf("gpt2_config.json");
  j["n_head"] = 7;  // does not divide 768
  ExpectError([&] { model_from_hf_config(j); }, "model.n_head", "divide");
  j = hf("gpt2_config.json");
  j.erase("n_positions");
  j.erase("n_ctx");
  ExpectError([&] { model_from_hf_config(j); }, "model.n_ctx", "required");
}

// --- parasol JSON --------------------------------------------------------------------------------

TEST(ModelJson, RoundTripEveryPreset) {
  for (const std::string& name : model_preset_names()) {
    SCOPED_TRACE(name);
    Model m = model_preset(name);
    ASSERT_NO_THROW(validate_model(m));
    Model back = model_from_json(model_to_json(m));
    ExpectSameModel(m, back);
    EXPECT_EQ(param_counts(back).total, param_counts(m).total);
  }
}

TEST(ModelJson, DefaultsAndSeqAlias) {
  Model m = model_from_json(
      Json::parse(R"({"layers": 2, "hidden": 64, "heads": 4, "vocab": 512, "seq": 128})"));
  EXPECT_EQ(m.name, "custom");
  EXPECT_EQ(m.kv_heads, 4);
  EXPECT_EQ(m.head_dim, 16);
  EXPECT_EQ(m.ffn, 256);
  EXPECT_EQ(m.seq_len, 128);
  EXPECT_EQ(m.norm, Norm::kLayerNorm);
  EXPECT_EQ(m.activation, Activation::kGelu);
  EXPECT_FALSE(m.is_moe());
}

TEST(ModelJson, MoeDefaults) {
  Model m = model_from_json(Json::parse(
      R"({"layers": 2, "hidden": 64, "heads": 4, "ffn": 96, "vocab": 512, "seq_len": 64,
          "moe": {"experts": 4}})"));
  EXPECT_EQ(m.moe.experts, 4);
  EXPECT_EQ(m.moe.top_k, 2);
  EXPECT_EQ(m.moe.expert_ffn, 96);
  EXPECT_EQ(m.moe.every, 1);
}

Json tiny_json() {
  return Json::parse(
      R"({"name": "t", "layers": 2, "hidden": 64, "heads": 4, "kv_heads": 2, "ffn": 256,
          "vocab": 512, "seq_len": 64, "norm": "rmsnorm", "activation": "swiglu"})");
}

TEST(ModelErrors, KvHeadsNotDividingHeads) {
  Json j = tiny_json();
  j["kv_heads"] = 3;
  ExpectError([&] { model_from_json(j); }, "model.kv_heads", "does not divide heads (4)");
}

TEST(ModelErrors, MissingRequiredField) {
  Json j = tiny_json();
  j.erase("layers");
  ExpectError([&] { model_from_json(j); }, "model.layers", "is required");
  j = tiny_json();
  j.erase("vocab");
  ExpectError([&] { model_from_json(j); }, "model.vocab", "is required");
}

TEST(ModelErrors, UnknownFieldIsATypo) {
  Json j = tiny_json();
  j["num_layers"] = 2;
  ExpectError([&] { model_from_json(j); }, "model.num_layers", "unknown field");
}

TEST(ModelErrors, WrongTypesAndRanges) {
  Json j = tiny_json();
  j["layers"] = 2.5;
  ExpectError([&] { model_from_json(j); }, "model.layers", "integer");
  j = tiny_json();
  j["hidden"] = 0;
  ExpectError([&] { model_from_json(j); }, "model.hidden", "out of range");
  // Text reads 0 as an unsigned integer; the reader's range check still applies.
  ExpectError(
      [] {
        model_from_json(parse_json(R"({"layers": 0, "hidden": 64, "heads": 4,
                                                  "vocab": 512, "seq_len": 64})",
                                   "model"));
      },
      "model.layers", "0 is out of range in [1, 10000]");
  j = tiny_json();
  j["norm"] = "batchnorm";
  ExpectError([&] { model_from_json(j); }, "model.norm", "is not one of layernorm|rmsnorm");
  j = tiny_json();
  j["tied_embeddings"] = "yes";
  ExpectError([&] { model_from_json(j); }, "model.tied_embeddings", "true or false");
  ExpectError([&] { model_from_json(Json::array()); }, "model", "must be a JSON object");
}

TEST(ModelErrors, HeadsMustDivideHiddenWithoutHeadDim) {
  Json j = tiny_json();
  j["heads"] = 6;
  j["kv_heads"] = 6;
  ExpectError([&] { model_from_json(j); }, "model.heads", "does not divide hidden (64)");
  j["head_dim"] = 16;  // explicit head_dim lifts the requirement
  EXPECT_EQ(model_from_json(j).q_dim(), 96);
}

TEST(ModelErrors, SeqAndSeqLenTogether) {
  Json j = tiny_json();
  j["seq"] = 64;
  ExpectError([&] { model_from_json(j); }, "model.seq", "not both");
}

TEST(ModelErrors, MoeFields) {
  Json j = tiny_json();
  j["moe"] = {{"experts", 4}, {"top_k", 5}};
  ExpectError([&] { model_from_json(j); }, "model.moe.top_k", "must be in [1, 4]");
  j["moe"] = {{"experts", 4}, {"every", 3}};  // more than the 2 layers
  ExpectError([&] { model_from_json(j); }, "model.moe.every", "must be in [1, 2]");
  j["moe"] = {{"experts", 4}, {"shared", 1}};
  ExpectError([&] { model_from_json(j); }, "model.moe.shared", "unknown field");
  j["moe"] = 4;
  ExpectError([&] { model_from_json(j); }, "model.moe", "must be a JSON object");
  j["moe"] = {{"experts", 0}, {"top_k", 2}};  // top_k without experts is not silently dropped
  ExpectError([&] { model_from_json(j); }, "model.moe.top_k", "experts is 0");
}

TEST(ModelErrors, ValidateStructFields) {
  Model m = model_preset("tiny");
  m.moe.top_k = 2;  // experts == 0
  ExpectError([&] { validate_model(m); }, "model.moe.top_k", "moe.experts is 0");
  m = model_preset("tiny");
  m.layers = 0;
  ExpectError([&] { validate_model(m, "m"); }, "m.layers", "must be in [1, 10000]");
  m = model_preset("tiny");
  m.heads = 5;
  m.kv_heads = 2;
  ExpectError([&] { validate_model(m); }, "model.kv_heads", "does not divide heads (5)");
}

TEST(ModelErrors, TooManyParameters) {
  // 10000 layers of hidden 2^20 is > 1e15 parameters; every field alone is in range.
  Json j = {{"layers", 10000}, {"hidden", 1 << 20}, {"heads", 1024},
            {"ffn", 1 << 22},  {"vocab", 1 << 24},  {"seq_len", 1024}};
  ExpectError([&] { model_from_json(j); }, "model", "1e15");
}

TEST(ModelErrors, UnknownPresetAndMissingFile) {
  ExpectError([] { model_preset("gpt5"); }, "model", "unknown preset 'gpt5'");
  ExpectError([] { load_model("gpt5"); }, "model", "unknown preset");
  ExpectError([] { load_model("/nonexistent/model.json"); }, "model", "no such file");
}

}  // namespace
}  // namespace parasol

namespace parasol {
namespace {

TEST(Model, RopeThetaFromHfConfigsPresetsAndJson) {
  const std::string dir = PARASOL_TEST_DATA_DIR;
  EXPECT_EQ(load_model(dir + "/hf/llama3_8b_config.json").rope_theta, 500000.0);
  EXPECT_EQ(load_model(dir + "/hf/mixtral_config.json").rope_theta, 1000000.0);
  EXPECT_EQ(model_preset("llama3-70b").rope_theta, 500000.0);
  EXPECT_EQ(model_preset("llama2-7b").rope_theta, 10000.0);
  Model m = model_preset("tiny");
  m.rope_theta = 123456;
  EXPECT_EQ(model_from_json(model_to_json(m)).rope_theta, 123456.0);
  Json bad = model_to_json(m);
  bad["rope_theta"] = -1;
  EXPECT_THROW(model_from_json(bad), Error);
}

}  // namespace
}  // namespace parasol
