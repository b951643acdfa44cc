// Tests core/model.h: param counts and FLOPs vs published figures, HF import, JSON, errors.
#include "core/model.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

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
  EXPECT_EQ(a.moe.first_dense, b.moe.first_dense);
  EXPECT_EQ(a.moe.shared_experts, b.moe.shared_experts);
  EXPECT_EQ(a.moe.shared_expert_ffn, b.moe.shared_expert_ffn);
  EXPECT_EQ(a.mla.q_lora_rank, b.mla.q_lora_rank);
  EXPECT_EQ(a.mla.kv_lora_rank, b.mla.kv_lora_rank);
  EXPECT_EQ(a.mla.qk_nope_head_dim, b.mla.qk_nope_head_dim);
  EXPECT_EQ(a.mla.qk_rope_head_dim, b.mla.qk_rope_head_dim);
  EXPECT_EQ(a.mla.v_head_dim, b.mla.v_head_dim);
  EXPECT_EQ(a.sliding_window, b.sliding_window);
  EXPECT_EQ(a.full_attention_every, b.full_attention_every);
  EXPECT_EQ(a.rope_theta, b.rope_theta);
  EXPECT_EQ(a.yarn.factor, b.yarn.factor);
  EXPECT_EQ(a.yarn.original_max_position_embeddings, b.yarn.original_max_position_embeddings);
  EXPECT_EQ(a.yarn.mscale, b.yarn.mscale);
  EXPECT_EQ(a.yarn.mscale_all_dim, b.yarn.mscale_all_dim);
  EXPECT_EQ(a.rope_concentration(), b.rope_concentration());
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

INSTANTIATE_TEST_SUITE_P(
    Presets, PublishedParams,
    ::testing::Values(
        // Meta Llama 3 model card: 8.03B.
        Published{"llama3-8b", 8.03e9, 0.005},
        // Brown et al. 2020 / Narayanan et al. 2021: 174.6B.
        Published{"gpt3-175b", 174.6e9, 0.005},
        // HF openai-community/gpt2 num_parameters(): 124.44M.
        Published{"gpt2-124m", 124.44e6, 0.01},
        // Meta Llama 3 70B: 70.55B; Llama 3.1 405B: 405.8B.
        Published{"llama3-70b", 70.55e9, 0.01}, Published{"llama3-405b", 405.8e9, 0.01},
        // Jiang et al. 2024 (Mixtral of Experts): 46.7B total.
        Published{"mixtral-8x7b", 46.7e9, 0.01},
        // Jiang et al. 2023 (Mistral 7B) / HF mistralai/Mistral-7B-v0.1: 7.24B.
        Published{"mistral-7b", 7.24e9, 0.01},
        // deepseek-ai/DeepSeek-V3 README_WEIGHTS.md: main model 671B, without the
        // multi-token-prediction module (11.5B unique, 14B with its shared embedding and head).
        Published{"deepseek-v3", 671e9, 0.01},
        // Qwen3 model cards (Qwen/Qwen3-30B-A3B, Qwen/Qwen3-235B-A22B): 30.5B and 235B in total.
        Published{"qwen3-30b-a3b", 30.5e9, 0.01}, Published{"qwen3-235b-a22b", 235e9, 0.01},
        // OpenAI 2025, gpt-oss model card, Table 1: 116.83B and 20.91B.
        Published{"gpt-oss-120b", 116.83e9, 0.01}, Published{"gpt-oss-20b", 20.91e9, 0.01}),
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

// A model file is named by the document when it names itself, else by the file: the stem less
// "_config", or the folder of a config.json; never by the HF family (model_type).
TEST(ModelFiles, AreNamedByTheirOwnNameElseByTheirFile) {
  EXPECT_EQ(load_model(kDataDir + "/hf/gpt2_config.json").name, "gpt2");
  EXPECT_EQ(load_model(kDataDir + "/hf/llama3_8b_config.json").name, "llama3_8b");
  EXPECT_EQ(load_model(kDataDir + "/hf/mixtral_config.json").name, "mixtral");
  const std::filesystem::path dir =
      std::filesystem::path(testing::TempDir()) / "model_name_test" / "Meta-Llama-3-8B";
  std::filesystem::create_directories(dir);
  Json hf_j = hf("llama3_8b_config.json");
  std::ofstream((dir / "config.json").string()) << hf_j.dump();
  EXPECT_EQ(load_model((dir / "config.json").string()).name, "Meta-Llama-3-8B");
  hf_j["_name_or_path"] = "meta-llama/Meta-Llama-3-8B";
  std::ofstream((dir / "named.json").string()) << hf_j.dump();
  EXPECT_EQ(load_model((dir / "named.json").string()).name, "meta-llama/Meta-Llama-3-8B");
  Json own = model_to_json(model_preset("tiny"));
  own.erase("name");
  std::ofstream((dir / "my-model.json").string()) << own.dump();
  EXPECT_EQ(load_model((dir / "my-model.json").string()).name, "my-model");
  own["name"] = "small one";
  std::ofstream((dir / "my-model.json").string()) << own.dump();
  EXPECT_EQ(load_model((dir / "my-model.json").string()).name, "small one");
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

TEST(ModelJson, YarnConcentration) {
  Json j = tiny_json();
  EXPECT_EQ(model_from_json(j).rope_concentration(), 1.0);  // no YaRN
  j["rope_scaling"] = Json::parse(R"({"rope_type": "yarn", "factor": 32})");
  EXPECT_NEAR(model_from_json(j).rope_concentration(), 0.1 * std::log(32.0) + 1, 1e-12);
  // Megatron-Core's _yarn_get_concentration_factor: m(s, mscale) / m(s, mscale_all_dim).
  j["rope_scaling"] = Json::parse(R"({"type": "yarn", "factor": 40, "mscale": 1.0,
                                      "mscale_all_dim": 0.5})");
  const double l = std::log(40.0);
  EXPECT_NEAR(model_from_json(j).rope_concentration(), (0.1 * l + 1) / (0.05 * l + 1), 1e-12);
  j["rope_scaling"]["mscale_all_dim"] = 1.0;
  EXPECT_EQ(model_from_json(j).rope_concentration(), 1.0);
  j["rope_scaling"] = Json::parse(R"({"rope_type": "yarn", "factor": 1})");
  EXPECT_EQ(model_from_json(j).rope_concentration(), 1.0);  // s <= 1 scales nothing
}

TEST(ModelErrors, RopeScaling) {
  Json j = tiny_json();
  j["rope_scaling"] = Json::parse(R"({"rope_type": "llama3", "factor": 8})");
  ExpectError([&] { model_from_json(j); }, "model.rope_scaling.rope_type", "not 'yarn'");
  j["rope_scaling"] = Json::parse(R"({"rope_type": "yarn"})");
  ExpectError([&] { model_from_json(j); }, "model.rope_scaling.factor", "is required");
  j["rope_scaling"] = Json::parse(R"({"rope_type": "yarn", "factor": 32, "beta_fast": 32})");
  ExpectError([&] { model_from_json(j); }, "model.rope_scaling.beta_fast", "unknown field");
  j["rope_scaling"] = Json::parse(R"({"rope_type": "yarn", "factor": 32})");
  j["learned_positions"] = true;
  ExpectError([&] { model_from_json(j); }, "model.rope_scaling", "learned_positions");
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

// --- MoE and long-context features: first dense layers, shared experts, MLA, sliding windows ---

namespace parasol {
namespace {

const std::string kHfDir = std::string(PARASOL_TEST_DATA_DIR) + "/hf/";

double rel_to(double a, double b) { return std::abs(a - b) / std::abs(b); }

// 4 layers, h 8, 2 heads of 4 (no GQA), ffn 16, vocab 10, seq 8, RMSNorm, SwiGLU, untied; MoE:
// 4 experts of ffn 6, top-2, the first layer dense, 2 shared experts of ffn 3.
Model small_moe() {
  Model m = llama_model("small-moe", 4, 8, 2, 2, 16, 10, 8);
  m.moe.experts = 4;
  m.moe.top_k = 2;
  m.moe.expert_ffn = 6;
  m.moe.first_dense = 1;
  m.moe.shared_experts = 2;
  m.moe.shared_expert_ffn = 3;
  return m;
}

// 2 layers, h 16, 2 heads; MLA q_lora 4, kv_lora 6, nope 3, rope 2 (head_dim 5), v 7; ffn 8,
// vocab 10, seq 4, RMSNorm, SwiGLU, untied.
Model small_mla() {
  Model m = llama_model("small-mla", 2, 16, 2, 2, 8, 10, 4);
  m.mla = {4, 6, 3, 2, 7};
  m.head_dim = 5;
  return m;
}

TEST(ModelParams, FirstDenseLayersAndSharedExpertsByHand) {
  const Model m = small_moe();
  ASSERT_NO_THROW(validate_model(m));
  EXPECT_FALSE(m.is_moe_layer(0));
  for (int l = 1; l < 4; ++l) EXPECT_TRUE(m.is_moe_layer(l)) << l;
  EXPECT_EQ(m.moe_layer_count(), 3);
  EXPECT_EQ(m.moe.shared_width(), 6);
  const ParamCounts c = param_counts(m);
  EXPECT_EQ(c.attention, 256);   // q, k, v, o: 4 x 8 x 8
  EXPECT_EQ(c.norms, 16);        // 2 x 8
  EXPECT_EQ(c.dense_mlp, 384);   // 3 x 8 x 16 (the dense layer uses ffn)
  EXPECT_EQ(c.expert_mlp, 144);  // 3 x 8 x 6
  EXPECT_EQ(c.shared_mlp, 144);  // one fused MLP of 2 x 3: 3 x 8 x 6
  EXPECT_EQ(c.router, 32);       // 8 x 4
  EXPECT_EQ(c.dense_layer, 656);
  EXPECT_EQ(c.moe_layer_total, 256 + 16 + 32 + 144 + 4 * 144);   // 1024
  EXPECT_EQ(c.moe_layer_active, 256 + 16 + 32 + 144 + 2 * 144);  // 736
  // Embedding 80 + final norm 8 + head 80; 1 dense layer and 3 MoE layers.
  EXPECT_EQ(c.total, 168 + 656 + 3 * 1024);
  EXPECT_EQ(c.active, 168 + 656 + 3 * 736);
}

TEST(ModelParams, SharedExpertFfnDefaultsToTheExperts) {
  Model m = small_moe();
  m.moe.shared_experts = 1;
  m.moe.shared_expert_ffn = 0;  // = expert_ffn (DeepSeek)
  EXPECT_EQ(m.moe.shared_ffn(), 6);
  EXPECT_EQ(param_counts(m).shared_mlp, 3 * 8 * 6);
}

TEST(ModelParams, MoeLayersBetweenFollowsIsMoeLayer) {
  Model m = model_preset("tiny-moe");
  m.layers = 13;
  m.moe.every = 3;
  m.moe.first_dense = 4;
  ASSERT_NO_THROW(validate_model(m));
  // MoE layers: l >= 4 and l % 3 == 2: 5, 8, 11.
  std::vector<int> moe;
  for (int l = 0; l < m.layers; ++l)
    if (m.is_moe_layer(l)) moe.push_back(l);
  EXPECT_EQ(moe, (std::vector<int>{5, 8, 11}));
  EXPECT_EQ(m.moe_layer_count(), 3);
  EXPECT_EQ(m.moe_layers_between(0, 6), 1);
  EXPECT_EQ(m.moe_layers_between(6, 13), 2);
  EXPECT_EQ(m.moe_layers_between(9, 11), 0);
}

TEST(ModelParams, MlaByHand) {
  const Model m = small_mla();
  ASSERT_NO_THROW(validate_model(m));
  const ParamCounts c = param_counts(m);
  // q: 16 x 4 + norm 4 + 4 x (2 x 5) = 108; kv: 16 x (6 + 2) + norm 6 + 6 x 2 x (3 + 7) = 254;
  // out: 2 x 7 x 16 = 224.
  EXPECT_EQ(c.attention, 108 + 254 + 224);
  EXPECT_EQ(c.attention_replicated, 16 * 4 + 16 * 8 + 4 + 6);  // down-projections, latent norms
  EXPECT_EQ(c.dense_layer, 586 + 32 + 3 * 16 * 8);
  EXPECT_EQ(c.total, 2 * 1002 + 160 + 16 + 160);  // + embedding, final norm, head
  Model plain = m;
  plain.mla.q_lora_rank = 0;  // q: 16 x 2 x 5, no latent
  EXPECT_EQ(param_counts(plain).attention, 160 + 254 + 224);
  EXPECT_EQ(param_counts(plain).attention_replicated, 16 * 8 + 6);
  EXPECT_EQ(m.v_head_dim(), 7);
  EXPECT_EQ(m.q_dim(), 10);
}

TEST(ModelParams, ActiveParametersMatchPublishedFigures) {
  struct Case {
    const char* preset;
    double active;  // published
    bool without_input_embedding;
    double tolerance;
  };
  for (const Case& k : {
           // deepseek-ai/DeepSeek-V3 README_WEIGHTS.md: 36.6B activated "including 0.9B for the
           // output Head" (the input embedding is a lookup); the paper rounds to 37B.
           Case{"deepseek-v3", 36.6e9, true, 0.01},
           // OpenAI gpt-oss model card, Table 1: 5.13B and 3.61B active, which count the
           // unembedding but not the embedding.
           Case{"gpt-oss-120b", 5.13e9, true, 0.01},
           Case{"gpt-oss-20b", 3.61e9, true, 0.01},
           // Qwen3 model cards: 22B and 3.3B activated (the latter 3.35B truncated).
           Case{"qwen3-235b-a22b", 22e9, false, 0.01},
           Case{"qwen3-30b-a3b", 3.3e9, false, 0.02},
       }) {
    const Model m = model_preset(k.preset);
    const ParamCounts c = param_counts(m);
    const double active = static_cast<double>(c.active) -
                          (k.without_input_embedding ? double(m.vocab) * m.hidden : 0);
    EXPECT_LE(rel_to(active, k.active), k.tolerance) << k.preset << ": " << active;
  }
  // Qwen3 model cards: non-embedding parameters 29.9B and 234B.
  for (auto [name, published] :
       {std::pair{"qwen3-30b-a3b", 29.9e9}, std::pair{"qwen3-235b-a22b", 234e9}}) {
    const Model m = model_preset(name);
    const double non_embedding = param_counts(m).total - 2.0 * m.vocab * m.hidden;
    EXPECT_LE(rel_to(non_embedding, published), 0.01) << name;
  }
}

TEST(ModelParams, DeepSeekV3ExactCount) {
  // 3 dense layers of 583,483,392 (MLA 187,107,328 + norms 14,336 + MLP 3 x 7168 x 18432) and 58
  // MoE layers of 11,507,286,016 (MLA + norms + router 7168 x 256 + 257 experts of
  // 3 x 7168 x 2048), embedding and head 129280 x 7168 each, final norm 7168.
  const ParamCounts c = param_counts(model_preset("deepseek-v3"));
  EXPECT_EQ(c.attention, 187107328);
  EXPECT_EQ(c.dense_layer, 583483392);
  EXPECT_EQ(c.moe_layer_total, 11507286016);
  EXPECT_EQ(c.total, 671026404352);
  EXPECT_EQ(c.active, 37552282624);
}

TEST(ModelParams, GptOssExactCount) {
  // Per layer: q/k/v/o 2 x 2880 x 4096 + 2 x 2880 x 512 with biases 4096 + 2 x 512 + 2880;
  // norms 2 x 2880; router 2880 x E; experts of 3 x 2880 x 2880 + biases 2 x 2880 + 2880.
  for (auto [name, layers, experts, total] :
       {std::tuple{"gpt-oss-120b", 36, 128, int64_t{116829149760}},
        std::tuple{"gpt-oss-20b", 24, 32, int64_t{20914754880}}}) {
    const int64_t attention = 2 * 2880 * 4096 + 2 * 2880 * 512 + 4096 + 2 * 512 + 2880;
    const int64_t expert = 3 * 2880 * 2880 + 2 * 2880 + 2880;
    const int64_t layer = attention + 2 * 2880 + 2880 * experts + experts * expert;
    const int64_t expected = layers * layer + 2 * int64_t{201088} * 2880 + 2880;
    EXPECT_EQ(expected, total) << name;
    EXPECT_EQ(param_counts(model_preset(name)).total, total) << name;
  }
}

TEST(ModelFlops, FirstDenseAndSharedExpertsByHand) {
  // Per token at seq 8: attention linears 2 x 256, core 2 x 8 x (8 + 8) per layer; the dense
  // layer's MLP 2 x 384; an MoE layer: 2 experts 2 x 2 x 144 + router 2 x 32 + shared 2 x 144;
  // logits 2 x 8 x 10.
  const FlopsPerToken f = flops_per_token(small_moe());
  EXPECT_EQ(f.forward, 4 * (512 + 256) + 768 + 3 * (576 + 64 + 288) + 160);
  EXPECT_EQ(f.model, 3 * f.forward);
}

TEST(ModelFlops, MlaByHand) {
  // Attention linears 2 x (64 + 40 + 128 + 120 + 224); core 2 x 4 keys x 2 heads x (5 + 7);
  // MLP 2 x 384; logits 2 x 16 x 10.
  EXPECT_EQ(flops_per_token(small_mla()).forward, 2 * (1152 + 192 + 768) + 320);
}

TEST(ModelFlops, DeepSeekV3AttentionCoreUsesQkAndValueDims) {
  Model m = model_preset("deepseek-v3");
  const double f4k = flops_per_token(m, 4096).forward, f8k = flops_per_token(m, 8192).forward;
  // Each extra key adds 2 heads (192 + 128) FLOPs per layer.
  EXPECT_NEAR(f8k - f4k, 61 * 4096 * 2.0 * 128 * (192 + 128), 1e-6 * f8k);
}

// 2 layers, h 8, 2 heads of 4, ffn 16, vocab 10, seq 8; window 3 on layer 0, layer 1 full.
Model small_windowed() {
  Model m = llama_model("small-window", 2, 8, 2, 2, 16, 10, 8);
  m.sliding_window = 3;
  m.full_attention_every = 2;
  return m;
}

TEST(ModelFlops, SlidingWindowByHand) {
  const Model m = small_windowed();
  ASSERT_NO_THROW(validate_model(m));
  EXPECT_TRUE(m.is_windowed_layer(0));
  EXPECT_FALSE(m.is_windowed_layer(1));
  EXPECT_EQ(m.windowed_layer_count(), 1);
  // Layer 0: P(8, 3) = 8 x 3 - 3 = 21 causal pairs; the symmetric band |i - j| < 3 has
  // 2 x 21 - 8 = 34 pairs (3 + 4 + 5 + 5 + 5 + 5 + 4 + 3), 4.25 keys per query: core
  // 2 x 4.25 x 16. Layer 1: 8 keys per query, core 2 x 8 x 16. Linears 2 x 256 and 2 x 384 per
  // layer, logits 160.
  EXPECT_EQ(flops_per_token(m).forward, (512 + 136) + (512 + 256) + 2 * 768 + 160);
  // The window is not part of the parameters.
  Model full = m;
  full.sliding_window = 0;
  full.full_attention_every = 0;
  EXPECT_EQ(param_counts(m).total, param_counts(full).total);
}

TEST(ModelFlops, SlidingWindowIsContinuousAtTheSequenceLength) {
  Model m = model_preset("mistral-7b");
  Model full = m;
  full.sliding_window = 0;
  for (int64_t seq : {int64_t{1024}, int64_t{4096}}) {  // W >= S: every query sees all keys
    EXPECT_EQ(flops_per_token(m, seq).forward, flops_per_token(full, seq).forward) << seq;
  }
  // One token past the window changes the count by about one key per query, not by half.
  const double at = flops_per_token(m, 4096).forward, past = flops_per_token(m, 4097).forward;
  const double per_key = 32 * 2.0 * 32 * (128 + 128);
  EXPECT_NEAR(past - at, per_key, 0.01 * per_key);
  // Far past the window the keys per query approach 2 W - 1 (the band), not S.
  const double s = 1 << 20, w = 4096, k = 2 * (s * w - w * (w - 1) / 2) / s - 1;
  EXPECT_NEAR(flops_per_token(m, 1 << 20).forward - flops_per_token(full, 1).forward,
              32 * 2.0 * k * 32 * 256 - 32 * 2.0 * 1 * 32 * 256,
              1e-9 * flops_per_token(m, 1 << 20).forward);
}

TEST(ModelFlops, GptOssAlternatesWindowedAndFullLayers) {
  const Model m = model_preset("gpt-oss-120b");
  EXPECT_EQ(m.windowed_layer_count(), 18);
  for (int l = 0; l < m.layers; ++l) EXPECT_EQ(m.is_windowed_layer(l), l % 2 == 0) << l;
  const double s = 4096, w = 128, core = 2.0 * 64 * (64 + 64);  // per key
  const double keys = 18 * s + 18 * (2 * (s * w - w * (w - 1) / 2) / s - 1);
  Model none = m;
  none.sliding_window = 0;
  none.full_attention_every = 0;
  EXPECT_NEAR(flops_per_token(none).forward - flops_per_token(m).forward, (36 * s - keys) * core,
              1e-9 * flops_per_token(m).forward);
}

// --- Hugging Face configs with the new features ------------------------------------------------

Json hf_file(const std::string& file) { return read_json_file(kHfDir + file); }

void ExpectSameCounts(const Model& a, const Model& b) {
  EXPECT_EQ(param_counts(a).total, param_counts(b).total);
  EXPECT_EQ(param_counts(a).active, param_counts(b).active);
  EXPECT_EQ(flops_per_token(a, 4096).forward, flops_per_token(b, 4096).forward);
}

TEST(HfConfig, DeepSeekV3) {
  const Model m = model_from_hf_config(hf_file("deepseek_v3_config.json"));
  EXPECT_EQ(m.layers, 61);
  EXPECT_EQ(m.hidden, 7168);
  EXPECT_EQ(m.heads, 128);
  EXPECT_EQ(m.kv_heads, 128);
  EXPECT_EQ(m.head_dim, 192);  // qk_nope 128 + qk_rope 64
  EXPECT_EQ(m.ffn, 18432);     // the dense layers' intermediate_size
  EXPECT_EQ(m.vocab, 129280);
  EXPECT_EQ(m.seq_len, 163840);
  EXPECT_EQ(m.mla.q_lora_rank, 1536);
  EXPECT_EQ(m.mla.kv_lora_rank, 512);
  EXPECT_EQ(m.mla.qk_nope_head_dim, 128);
  EXPECT_EQ(m.mla.qk_rope_head_dim, 64);
  EXPECT_EQ(m.mla.v_head_dim, 128);
  EXPECT_EQ(m.moe.experts, 256);
  EXPECT_EQ(m.moe.top_k, 8);
  EXPECT_EQ(m.moe.expert_ffn, 2048);
  EXPECT_EQ(m.moe.first_dense, 3);
  EXPECT_EQ(m.moe.every, 1);
  EXPECT_EQ(m.moe.shared_experts, 1);
  EXPECT_EQ(m.moe.shared_ffn(), 2048);
  EXPECT_EQ(m.sliding_window, 0);
  EXPECT_EQ(m.norm, Norm::kRmsNorm);
  EXPECT_EQ(m.activation, Activation::kSwiglu);
  EXPECT_FALSE(m.tied_embeddings);
  EXPECT_FALSE(m.linear_bias);
  // YaRN 40 with mscale = mscale_all_dim = 1: the concentration cancels to 1.
  EXPECT_EQ(m.yarn.factor, 40);
  EXPECT_EQ(m.yarn.mscale.value_or(0), 1.0);
  EXPECT_EQ(m.rope_concentration(), 1.0);
  EXPECT_EQ(model_preset("deepseek-v3").rope_concentration(), 1.0);
  ExpectSameCounts(m, model_preset("deepseek-v3"));
}

TEST(HfConfig, Qwen3Moe) {
  for (auto [file, preset] : {std::pair{"qwen3_30b_a3b_config.json", "qwen3-30b-a3b"},
                              std::pair{"qwen3_235b_a22b_config.json", "qwen3-235b-a22b"}}) {
    SCOPED_TRACE(file);
    const Model m = model_from_hf_config(hf_file(file));
    const Model p = model_preset(preset);
    EXPECT_EQ(m.layers, p.layers);
    EXPECT_EQ(m.hidden, p.hidden);
    EXPECT_EQ(m.heads, p.heads);
    EXPECT_EQ(m.kv_heads, 4);
    EXPECT_EQ(m.head_dim, 128);  // given: not hidden / heads
    EXPECT_EQ(m.moe.experts, 128);
    EXPECT_EQ(m.moe.top_k, 8);
    EXPECT_EQ(m.moe.expert_ffn, p.moe.expert_ffn);
    EXPECT_EQ(m.moe.every, 1);
    EXPECT_EQ(m.moe.first_dense, 0);
    EXPECT_EQ(m.moe.shared_experts, 0);
    EXPECT_EQ(m.sliding_window, 0);  // sliding_window null, use_sliding_window false
    EXPECT_EQ(m.rope_theta, 1e6);
    EXPECT_TRUE(m.qk_norm);  // model_type qwen3_moe: q_norm and k_norm per head
    EXPECT_TRUE(p.qk_norm);
    EXPECT_TRUE(model_from_json(model_to_json(m)).qk_norm);
    ExpectSameCounts(m, p);
  }
  EXPECT_FALSE(model_preset("mixtral-8x7b").qk_norm);
  EXPECT_FALSE(model_from_json(model_to_json(model_preset("mixtral-8x7b"))).qk_norm);
}

TEST(HfConfig, GptOss) {
  for (auto [file, preset, layers, experts] :
       {std::tuple{"gpt_oss_120b_config.json", "gpt-oss-120b", 36, 128},
        std::tuple{"gpt_oss_20b_config.json", "gpt-oss-20b", 24, 32}}) {
    SCOPED_TRACE(file);
    const Model m = model_from_hf_config(hf_file(file));
    EXPECT_EQ(m.layers, layers);
    EXPECT_EQ(m.hidden, 2880);
    EXPECT_EQ(m.heads, 64);
    EXPECT_EQ(m.kv_heads, 8);
    EXPECT_EQ(m.head_dim, 64);
    EXPECT_EQ(m.moe.experts, experts);
    EXPECT_EQ(m.moe.top_k, 4);
    EXPECT_EQ(m.moe.expert_ffn, 2880);
    EXPECT_EQ(m.sliding_window, 128);
    EXPECT_EQ(m.full_attention_every, 2);  // layer_types: sliding, full, sliding, ...
    EXPECT_TRUE(m.linear_bias);
    EXPECT_EQ(m.activation, Activation::kSwiglu);
    EXPECT_EQ(m.rope_theta, 150000);
    // rope_scaling: YaRN 32 from 4,096, no mscale: concentration 0.1 ln 32 + 1.
    EXPECT_EQ(m.yarn.factor, 32);
    EXPECT_EQ(m.yarn.original_max_position_embeddings, 4096);
    EXPECT_FALSE(m.yarn.mscale.has_value());
    EXPECT_NEAR(m.rope_concentration(), 0.1 * std::log(32.0) + 1, 1e-12);
    EXPECT_EQ(model_preset(preset).rope_concentration(), m.rope_concentration());
    ExpectSameCounts(m, model_preset(preset));
  }
}

TEST(HfConfig, MistralAndMixtralWindows) {
  const Model m = model_from_hf_config(hf_file("mistral_7b_config.json"));
  EXPECT_EQ(m.sliding_window, 4096);
  EXPECT_EQ(m.full_attention_every, 0);  // every layer
  EXPECT_EQ(m.windowed_layer_count(), 32);
  ExpectSameCounts(m, model_preset("mistral-7b"));
  EXPECT_EQ(model_from_hf_config(hf_file("mixtral_config.json")).sliding_window, 0);  // null
  EXPECT_EQ(load_model(kHfDir + "mistral_7b_config.json").sliding_window, 4096);
}

TEST(HfConfig, QwenMoeLayerSelection) {
  Json j = hf_file("qwen3_30b_a3b_config.json");
  j["decoder_sparse_step"] = 2;  // layers 1, 3, 5, ...
  Model m = model_from_hf_config(j);
  EXPECT_EQ(m.moe.every, 2);
  EXPECT_EQ(m.moe.first_dense, 0);
  EXPECT_EQ(m.moe_layer_count(), 24);
  j = hf_file("qwen3_30b_a3b_config.json");
  j["mlp_only_layers"] = {0, 1};  // expressible: the first two layers dense
  m = model_from_hf_config(j);
  EXPECT_EQ(m.moe.first_dense, 2);
  EXPECT_EQ(m.moe.every, 1);
  EXPECT_EQ(m.moe_layer_count(), 46);
  j["mlp_only_layers"] = {5};  // not expressible
  ExpectError([&] { model_from_hf_config(j); }, "model.mlp_only_layers", "not expressible");
  j["mlp_only_layers"] = {48};
  ExpectError([&] { model_from_hf_config(j); }, "model.mlp_only_layers[0]", "out of range");
  j["mlp_only_layers"] = Json::array();
  for (int l = 0; l < 48; ++l) j["mlp_only_layers"].push_back(l);
  ExpectError([&] { model_from_hf_config(j); }, "model.mlp_only_layers", "no MoE layer");
}

TEST(HfConfig, SharedExpertIntermediateSize) {
  // Qwen2-MoE names: one shared expert of shared_expert_intermediate_size.
  Json j = hf_file("qwen3_30b_a3b_config.json");
  j["shared_expert_intermediate_size"] = 5632;
  Model m = model_from_hf_config(j);
  EXPECT_EQ(m.moe.shared_experts, 1);
  EXPECT_EQ(m.moe.shared_ffn(), 5632);
  EXPECT_EQ(param_counts(m).shared_mlp, 3 * 2048 * 5632);
  j["n_shared_experts"] = 2;
  ExpectError([&] { model_from_hf_config(j); }, "model.n_shared_experts", "ambiguous");
}

TEST(HfConfig, DeepSeekVariants) {
  Json j = hf_file("deepseek_v3_config.json");
  j["q_lora_rank"] = nullptr;  // DeepSeek-V2-Lite: no query compression
  j["head_dim"] = 64;          // what newer transformers write (= qk_rope_head_dim): not read
  Model m = model_from_hf_config(j);
  EXPECT_EQ(m.mla.q_lora_rank, 0);
  EXPECT_EQ(m.head_dim, 192);
  j = hf_file("deepseek_v3_config.json");
  j["qk_head_dim"] = 190;
  ExpectError([&] { model_from_hf_config(j); }, "model.qk_head_dim", "differs");
  j = hf_file("deepseek_v3_config.json");
  j["attention_bias"] = true;
  ExpectError([&] { model_from_hf_config(j); }, "model.attention_bias", "MLA");
  j = hf_file("deepseek_v3_config.json");
  j["moe_layer_freq"] = 2;  // layers 4, 6, 8, ...: not l % every == every - 1
  ExpectError([&] { model_from_hf_config(j); }, "model.moe_layer_freq", "not expressible");
  j = hf_file("deepseek_v3_config.json");
  j["first_k_dense_replace"] = 0;
  j["moe_layer_freq"] = std::vector<int>(61, 1);  // a per-layer list (MiniMax style)
  j["moe_layer_freq"][0] = 0;
  m = model_from_hf_config(j);
  EXPECT_EQ(m.moe.first_dense, 1);
  j["moe_layer_freq"] = {1, 1};
  ExpectError([&] { model_from_hf_config(j); }, "model.moe_layer_freq", "2 entries for 61 layers");
  j = hf_file("deepseek_v3_config.json");
  j["n_routed_experts"] = nullptr;  // dense, but with shared experts: refused
  ExpectError([&] { model_from_hf_config(j); }, "model.n_shared_experts", "no routed experts");
}

TEST(HfConfig, LayerTypes) {
  Json j = hf_file("gpt_oss_20b_config.json");
  j["layer_types"] = std::vector<std::string>(24, "sliding_attention");
  EXPECT_EQ(model_from_hf_config(j).full_attention_every, 0);
  j["layer_types"] = std::vector<std::string>(24, "full_attention");
  EXPECT_EQ(model_from_hf_config(j).sliding_window, 0);
  j["layer_types"] = std::vector<std::string>(24, "sliding_attention");
  for (int l = 3; l < 24; l += 4) j["layer_types"][l] = "full_attention";  // 3 sliding : 1 full
  Model m = model_from_hf_config(j);
  EXPECT_EQ(m.full_attention_every, 4);
  EXPECT_EQ(m.windowed_layer_count(), 18);
  j["layer_types"][0] = "full_attention";  // full first: not every k-th layer
  ExpectError([&] { model_from_hf_config(j); }, "model.layer_types", "every k-th layer");
  j["layer_types"][0] = "linear_attention";
  ExpectError([&] { model_from_hf_config(j); }, "model.layer_types[0]", "not one of");
  j["layer_types"] = {"sliding_attention", "full_attention"};
  ExpectError([&] { model_from_hf_config(j); }, "model.layer_types", "2 entries for 24 layers");
  j = hf_file("gpt_oss_20b_config.json");
  j["sliding_window"] = nullptr;
  ExpectError([&] { model_from_hf_config(j); }, "model.sliding_window", "sliding layers");
}

TEST(HfConfig, SlidingWindowFlags) {
  Json j = hf_file("qwen3_30b_a3b_config.json");
  j["sliding_window"] = 4096;  // written but unused: use_sliding_window is false
  EXPECT_EQ(model_from_hf_config(j).sliding_window, 0);
  j["use_sliding_window"] = true;  // then max_window_layers decides which layers: refused
  ExpectError([&] { model_from_hf_config(j); }, "model.max_window_layers", "layer_types");
  j.erase("max_window_layers");
  EXPECT_EQ(model_from_hf_config(j).sliding_window, 4096);
}

TEST(HfConfig, StructureParasolCannotExpressIsAnError) {
  Json j = hf_file("mistral_7b_config.json");
  j["hybrid_override_pattern"] = "M-M-M*-";  // Nemotron-H: Mamba layers
  ExpectError([&] { model_from_hf_config(j); }, "model.hybrid_override_pattern", "cannot express");
  j = hf_file("qwen3_30b_a3b_config.json");
  j["attn_output_gate"] = true;  // Qwen3-Next
  ExpectError([&] { model_from_hf_config(j); }, "model.attn_output_gate", "cannot express");
  j["attn_output_gate"] = false;
  EXPECT_NO_THROW(model_from_hf_config(j));
  j = hf_file("llama3_8b_config.json");
  j["mlp_bias"] = true;  // attention_bias false
  ExpectError([&] { model_from_hf_config(j); }, "model.mlp_bias", "attention_bias");
  j = hf_file("gpt_oss_20b_config.json");
  j["attention_bias"] = false;
  ExpectError([&] { model_from_hf_config(j); }, "model.attention_bias", "experts have biases");
  j = hf_file("gpt_oss_20b_config.json");
  j["experts_per_token"] = 2;  // disagrees with num_experts_per_tok
  ExpectError([&] { model_from_hf_config(j); }, "model.experts_per_token", "disagrees");
}

// --- parasol JSON with the new fields ------------------------------------------------------------

TEST(ModelJson, NewFieldsRoundTrip) {
  for (Model m : {small_moe(), small_mla(), small_windowed(), model_preset("deepseek-v3"),
                  model_preset("gpt-oss-120b")}) {
    SCOPED_TRACE(m.name);
    const Json j = model_to_json(m);
    const Model back = model_from_json(j);
    ExpectSameModel(m, back);
    EXPECT_EQ(param_counts(back).total, param_counts(m).total);
    EXPECT_EQ(model_to_json(back), j);
  }
  // What a model without the features writes is unchanged: no "mla", no window keys.
  const Json j = model_to_json(model_preset("llama3-8b"));
  EXPECT_FALSE(j.contains("mla"));
  EXPECT_FALSE(j.contains("sliding_window"));
  EXPECT_FALSE(j.contains("full_attention_every"));
}

TEST(ModelJson, MlaDefaultsHeadDimAndKvHeads) {
  const Model m = model_from_json(Json::parse(
      R"({"layers": 2, "hidden": 16, "heads": 2, "ffn": 8, "vocab": 10, "seq_len": 4,
          "norm": "rmsnorm", "activation": "swiglu",
          "mla": {"q_lora_rank": 4, "kv_lora_rank": 6, "qk_nope_head_dim": 3,
                  "qk_rope_head_dim": 2, "v_head_dim": 7}})"));
  EXPECT_EQ(m.head_dim, 5);
  EXPECT_EQ(m.kv_heads, 2);
  EXPECT_EQ(param_counts(m).total, param_counts(small_mla()).total);
}

Json small_json() {
  return Json::parse(
      R"({"name": "t", "layers": 4, "hidden": 64, "heads": 4, "kv_heads": 4, "ffn": 256,
          "vocab": 512, "seq_len": 64, "norm": "rmsnorm", "activation": "swiglu"})");
}

TEST(ModelErrors, NewMoeFields) {
  Json j = small_json();
  j["moe"] = {{"experts", 4}, {"first_dense", 4}};
  ExpectError([&] { model_from_json(j); }, "model.moe.first_dense", "out of range in [0, 3]");
  j["moe"] = {{"experts", 4}, {"every", 4}, {"first_dense", 1}};  // MoE layer 3 only: fine
  EXPECT_EQ(model_from_json(j).moe_layer_count(), 1);
  j["moe"] = {{"experts", 4}, {"every", 2}, {"first_dense", 3}};  // layer 3 is MoE
  EXPECT_EQ(model_from_json(j).moe_layer_count(), 1);
  Model m = model_from_json(j);
  m.moe.every = 4;
  m.moe.first_dense = 3;
  EXPECT_NO_THROW(validate_model(m));
  m.moe.every = 3;  // layers 2 only, below first_dense 3: none
  ExpectError([&] { validate_model(m); }, "model.moe.first_dense", "leaves no MoE layer");
  j["moe"] = {{"experts", 4}, {"shared_experts", -1}};
  ExpectError([&] { model_from_json(j); }, "model.moe.shared_experts", "out of range");
  j["moe"] = {{"experts", 4}, {"shared_expert_ffn", 32}};
  ExpectError([&] { model_from_json(j); }, "model.moe.shared_expert_ffn",
              "is set but moe.shared_experts is 0");
  j["moe"] = {{"experts", 0}, {"shared_experts", 1}};
  ExpectError([&] { model_from_json(j); }, "model.moe.shared_experts", "experts is 0");
  j["moe"] = {{"experts", 0}, {"first_dense", 1}};
  ExpectError([&] { model_from_json(j); }, "model.moe.first_dense", "experts is 0");
  m = model_preset("tiny");
  m.moe.shared_experts = 1;  // a dense model
  ExpectError([&] { validate_model(m); }, "model.moe.shared_experts", "moe.experts is 0");
  m = model_preset("tiny");
  m.moe.first_dense = 1;
  ExpectError([&] { validate_model(m); }, "model.moe.first_dense", "moe.experts is 0");
}

TEST(ModelErrors, MlaFields) {
  Json j = small_json();
  j["mla"] = {{"kv_lora_rank", 32}, {"qk_nope_head_dim", 8}, {"qk_rope_head_dim", 8}};
  ExpectError([&] { model_from_json(j); }, "model.mla.v_head_dim", "is required");
  j["mla"]["v_head_dim"] = 16;
  j["mla"]["rank"] = 3;
  ExpectError([&] { model_from_json(j); }, "model.mla.rank", "unknown field");
  j["mla"].erase("rank");
  EXPECT_EQ(model_from_json(j).head_dim, 16);
  j["head_dim"] = 12;
  ExpectError([&] { model_from_json(j); }, "model.head_dim", "qk_nope_head_dim + ");
  j.erase("head_dim");
  j["kv_heads"] = 2;
  ExpectError([&] { model_from_json(j); }, "model.kv_heads", "must equal heads (4) with MLA");
  j.erase("kv_heads");
  j["mla"]["v_head_dim"] = 0;
  ExpectError([&] { model_from_json(j); }, "model.mla.v_head_dim", "must be in [1, ");
  j["mla"]["v_head_dim"] = 16;
  j["mla"]["qk_nope_head_dim"] = 0;
  j["mla"]["qk_rope_head_dim"] = 0;
  j["head_dim"] = 1;
  ExpectError([&] { model_from_json(j); }, "model.mla.qk_nope_head_dim", ">= 1");
  j.erase("head_dim");
  j["mla"] = {{"kv_lora_rank", 0},
              {"q_lora_rank", 8},
              {"qk_nope_head_dim", 0},
              {"qk_rope_head_dim", 0},
              {"v_head_dim", 0}};  // MLA off, but q_lora given
  ExpectError([&] { model_from_json(j); }, "model.mla.q_lora_rank",
              "is set but mla.kv_lora_rank is 0");
  j["mla"]["kv_lora_rank"] = -1;
  ExpectError([&] { model_from_json(j); }, "model.mla.kv_lora_rank", "out of range");
  Model m = model_preset("tiny");
  m.mla.kv_lora_rank = -5;
  ExpectError([&] { validate_model(m); }, "model.mla.kv_lora_rank", "must be in [0, ");
  m = model_preset("tiny");
  m.mla.v_head_dim = 8;
  ExpectError([&] { validate_model(m); }, "model.mla.v_head_dim", "mla.kv_lora_rank is 0");
}

TEST(ModelErrors, WindowFields) {
  Json j = small_json();
  j["sliding_window"] = -1;
  ExpectError([&] { model_from_json(j); }, "model.sliding_window", "out of range");
  j["sliding_window"] = 0;
  j["full_attention_every"] = 2;
  ExpectError([&] { model_from_json(j); }, "model.full_attention_every",
              "is set but sliding_window is 0");
  j["sliding_window"] = 16;
  j["full_attention_every"] = 5;  // more than the 4 layers
  ExpectError([&] { model_from_json(j); }, "model.full_attention_every", "out of range in [0, 4]");
  j["full_attention_every"] = 4;
  EXPECT_EQ(model_from_json(j).windowed_layer_count(), 3);
  Model m = model_preset("tiny");
  m.sliding_window = -3;
  ExpectError([&] { validate_model(m); }, "model.sliding_window", "must be in [0, ");
  m.sliding_window = 0;
  m.full_attention_every = 1;
  ExpectError([&] { validate_model(m); }, "model.full_attention_every", "sliding_window is 0");
}

}  // namespace
}  // namespace parasol
