// Model presets: published architectures with their sources.
#include <functional>
#include <map>

#include "core/error.h"
#include "core/model.h"

namespace parasol {

Model gpt_model(const std::string& name, int layers, int64_t hidden, int heads, int64_t vocab,
                int64_t seq, bool tied) {
  Model m;
  m.name = name;
  m.layers = layers;
  m.hidden = hidden;
  m.heads = heads;
  m.kv_heads = heads;
  m.head_dim = hidden / heads;
  m.ffn = 4 * hidden;
  m.vocab = vocab;
  m.seq_len = seq;
  m.norm = Norm::kLayerNorm;
  m.activation = Activation::kGelu;
  m.tied_embeddings = tied;
  m.learned_positions = true;
  m.linear_bias = true;
  m.dropout = true;
  return m;
}

Model llama_model(const std::string& name, int layers, int64_t hidden, int heads, int kv_heads,
                  int64_t ffn, int64_t vocab, int64_t seq) {
  Model m;
  m.name = name;
  m.layers = layers;
  m.hidden = hidden;
  m.heads = heads;
  m.kv_heads = kv_heads;
  m.head_dim = hidden / heads;
  m.ffn = ffn;
  m.vocab = vocab;
  m.seq_len = seq;
  m.norm = Norm::kRmsNorm;
  m.activation = Activation::kSwiglu;
  return m;
}

namespace {

Model with_rope(Model m, double theta) {
  m.rope_theta = theta;
  return m;
}

Model with_moe(Model m, int experts, int top_k, int64_t expert_ffn) {
  m.moe = MoeSpec{};
  m.moe.experts = experts;
  m.moe.top_k = top_k;
  m.moe.expert_ffn = expert_ffn;
  return m;
}

Model with_head_dim(Model m, int64_t head_dim) {
  m.head_dim = head_dim;
  return m;
}

Model with_window(Model m, int64_t window, int full_attention_every) {
  m.sliding_window = window;
  m.full_attention_every = full_attention_every;
  return m;
}

// DeepSeek-V3 (DeepSeek-AI 2024, arXiv:2412.19437, section 4.2, and the HF config.json of
// deepseek-ai/DeepSeek-V3): 61 layers, hidden 7168, 128 heads of MLA (q_lora 1536, kv_lora 512,
// qk_nope 128, qk_rope 64, v 128), the first 3 layers dense (ffn 18432), then 256 routed experts
// (top-8, expert ffn 2048) and 1 shared expert; vocab 129280; pretrained at 4K tokens. The
// multi-token-prediction module (num_nextn_predict_layers = 1, 11.5B more) is not part of the
// model, as in the published 671B.
Model deepseek_v3() {
  Model m = with_rope(llama_model("deepseek-v3", 61, 7168, 128, 128, 18432, 129280, 4096), 1e4);
  m.mla = {1536, 512, 128, 64, 128};
  m.head_dim = m.mla.qk_head_dim();
  m = with_moe(m, 256, 8, 2048);
  m.moe.first_dense = 3;
  m.moe.shared_experts = 1;
  // rope_scaling: YaRN, factor 40, mscale = mscale_all_dim = 1 (concentration 1).
  m.yarn = {40, 4096, 1.0, 1.0};
  return m;
}

// Qwen3 MoE (Qwen Team 2025, "Qwen3 Technical Report", Table 2, and the HF config.json files of
// Qwen/Qwen3-30B-A3B and Qwen/Qwen3-235B-A22B): head_dim 128, 128 experts, top-8, no shared
// experts, every layer MoE, untied embeddings, vocab 151936, rope_theta 1e6; pretrained at 4,096
// tokens (general stage). The per-head q/k RMSNorms run as kernels (qk_norm); their weights
// (2 x 128 per layer) are not counted. ffn (intermediate_size) would size dense layers; these
// models have none.
Model qwen3_moe(const std::string& name, int layers, int64_t hidden, int heads, int kv_heads,
                int64_t ffn, int64_t expert_ffn) {
  Model m = llama_model(name, layers, hidden, heads, kv_heads, ffn, 151936, 4096);
  m.qk_norm = true;
  return with_moe(with_head_dim(with_rope(m, 1e6), 128), 128, 8, expert_ffn);
}

// GPT-OSS (OpenAI 2025, "gpt-oss-120b & gpt-oss-20b Model Card", Table 1, and the HF
// config.json files): hidden 2880, 64 query heads and 8 KV heads of 64, biases on the attention
// and expert linears, experts of ffn 2880 (SwiGLU), top-4, alternating banded (128 tokens) and
// dense attention (layer_types: sliding, full, ...), vocab 201088, untied, rope_theta 150000,
// pretraining context 4,096 (initial_context_length), the GLU's inputs clamped at 7.0
// (swiglu_limit), YaRN rotary scaling of factor 32 from 4,096 positions without mscale
// (rope_scaling; concentration 0.1 ln 32 + 1 = 1.35). Not counted: the router's bias (experts per
// layer) and the attention sinks (heads per layer).
Model gpt_oss(const std::string& name, int layers, int experts) {
  Model m = llama_model(name, layers, 2880, 64, 8, 2880, 201088, 4096);
  m.linear_bias = true;
  m.glu_clamp = 7.0;
  m.yarn = {32, 4096, std::nullopt, std::nullopt};
  return with_window(with_moe(with_head_dim(with_rope(m, 150000), 64), experts, 4, 2880), 128, 2);
}

const std::map<std::string, std::function<Model()>>& model_presets_table() {
  static const std::map<std::string, std::function<Model()>> table = {
      // Radford et al. 2019 / HF "gpt2": 124M parameters.
      {"gpt2-124m", [] { return gpt_model("gpt2-124m", 12, 768, 12, 50257, 1024, true); }},
      // HF "gpt2-xl": 1.56B.
      {"gpt2-1.5b", [] { return gpt_model("gpt2-1.5b", 48, 1600, 25, 50257, 1024, true); }},
      // Brown et al. 2020, Table 2.1: 96 layers, d_model 12288, 96 heads, 2048 context.
      {"gpt3-175b", [] { return gpt_model("gpt3-175b", 96, 12288, 96, 50257, 2048, true); }},
      // Korthikanti et al. 2022, Table 3 (vocab 51200 as in Megatron-LM's padded GPT vocab).
      {"gpt-22b", [] { return gpt_model("gpt-22b", 48, 6144, 64, 51200, 2048, false); }},
      // Smith et al. 2022 (Megatron-Turing NLG 530B): 105 layers, 20480 hidden, 128 heads.
      {"tnlg-530b", [] { return gpt_model("tnlg-530b", 105, 20480, 128, 51200, 2048, false); }},
      // Narayanan et al. 2021, Table 1: 1T model, 128 layers, 25600 hidden, 160 heads.
      {"megatron-1t", [] { return gpt_model("megatron-1t", 128, 25600, 160, 51200, 2048, false); }},
      // Touvron et al. 2023 (Llama 2 7B).
      {"llama2-7b", [] { return llama_model("llama2-7b", 32, 4096, 32, 32, 11008, 32000, 4096); }},
      // Meta Llama 3 model card and config.json: 8B, 70B; Llama 3.1 405B.
      // rope_theta 500000 (config.json).
      {"llama3-8b",
       [] {
         return with_rope(llama_model("llama3-8b", 32, 4096, 32, 8, 14336, 128256, 8192), 5e5);
       }},
      {"llama3-70b",
       [] {
         return with_rope(llama_model("llama3-70b", 80, 8192, 64, 8, 28672, 128256, 8192), 5e5);
       }},
      {"llama3-405b",
       [] {
         return with_rope(llama_model("llama3-405b", 126, 16384, 128, 8, 53248, 128256, 8192), 5e5);
       }},
      // Jiang et al. 2024 (Mixtral of Experts) and its config.json: 8 experts, top-2.
      {"mixtral-8x7b",
       [] {
         return with_moe(llama_model("mixtral-8x7b", 32, 4096, 32, 8, 14336, 32000, 4096), 8, 2,
                         14336);
       }},
      // Jiang et al. 2023 (Mistral 7B), Table 1 and the HF config.json of
      // mistralai/Mistral-7B-v0.1: Llama-style with GQA, a 4096-token sliding window on every
      // layer, context 8192.
      {"mistral-7b",
       [] {
         return with_window(llama_model("mistral-7b", 32, 4096, 32, 8, 14336, 32000, 8192), 4096,
                            0);
       }},
      {"deepseek-v3", deepseek_v3},
      {"qwen3-30b-a3b", [] { return qwen3_moe("qwen3-30b-a3b", 48, 2048, 32, 4, 6144, 768); }},
      {"qwen3-235b-a22b",
       [] { return qwen3_moe("qwen3-235b-a22b", 94, 4096, 64, 4, 12288, 1536); }},
      {"gpt-oss-20b", [] { return gpt_oss("gpt-oss-20b", 24, 32); }},
      {"gpt-oss-120b", [] { return gpt_oss("gpt-oss-120b", 36, 128); }},
      // Small enough to train on a CPU in seconds; Llama-style with GQA.
      {"tiny", [] { return llama_model("tiny", 2, 64, 4, 2, 256, 512, 64); }},
      {"tiny-gpt", [] { return gpt_model("tiny-gpt", 2, 64, 4, 512, 64, true); }},
      {"tiny-moe",
       [] { return with_moe(llama_model("tiny-moe", 2, 64, 4, 2, 128, 512, 64), 4, 2, 128); }},
  };
  return table;
}

}  // namespace

Model model_preset(const std::string& name) {
  auto it = model_presets_table().find(name);
  if (it == model_presets_table().end()) {
    std::string known;
    for (const auto& [n, _] : model_presets_table()) known += (known.empty() ? "" : ", ") + n;
    throw Error("model", "unknown preset '" + name + "' (known: " + known + ")");
  }
  return it->second();
}

std::vector<std::string> model_preset_names() {
  std::vector<std::string> names;
  for (const auto& [n, _] : model_presets_table()) names.push_back(n);
  return names;
}

}  // namespace parasol
