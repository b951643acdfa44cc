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
  m.moe = {experts, top_k, expert_ffn, 1};
  return m;
}

const std::map<std::string, std::function<Model()>>& presets() {
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
  auto it = presets().find(name);
  if (it == presets().end()) {
    std::string known;
    for (const auto& [n, _] : presets()) known += (known.empty() ? "" : ", ") + n;
    throw Error("model", "unknown preset '" + name + "' (known: " + known + ")");
  }
  return it->second();
}

std::vector<std::string> model_preset_names() {
  std::vector<std::string> names;
  for (const auto& [n, _] : presets()) names.push_back(n);
  return names;
}

}  // namespace parasol
