// Model: what to train. A decoder-only transformer (GPT, Llama, Mixtral families), read from
// parasol's JSON, a Hugging Face config.json or a preset name. Derived figures (parameter
// counts, FLOPs per token) live here and nowhere else.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/json_reader.h"

namespace parasol {

enum class Norm { kLayerNorm, kRmsNorm };
enum class Activation { kGelu, kSwiglu };

struct MoeSpec {
  int experts = 0;         // experts per MoE layer; 0 = dense model
  int top_k = 0;           // experts each token is routed to
  int64_t expert_ffn = 0;  // hidden size of one expert's MLP
  int every = 1;  // every `every`-th layer is MoE (layer l is MoE when l % every == every-1)
};

struct Model {
  std::string name;
  int layers = 0;
  int64_t hidden = 0;
  int heads = 0;
  int kv_heads = 0;      // = heads without GQA
  int64_t head_dim = 0;  // = hidden / heads unless given
  int64_t ffn = 0;       // MLP hidden size of a dense layer
  int64_t vocab = 0;
  int64_t seq_len = 0;  // default training sequence length
  Norm norm = Norm::kLayerNorm;
  Activation activation = Activation::kGelu;
  bool tied_embeddings = false;
  bool learned_positions = false;  // GPT-style absolute position table (RoPE when false)
  bool linear_bias = false;        // biases on linear layers (GPT-2/3)
  bool dropout = false;            // dropout on attention probabilities and residuals (GPT-2/3)
  double rope_theta = 10000;       // rotary embedding base (when !learned_positions)
  MoeSpec moe;

  bool is_moe() const { return moe.experts > 0; }
  bool is_moe_layer(int layer) const;
  int moe_layer_count() const;
  int64_t q_dim() const { return heads * head_dim; }
  int64_t kv_dim() const { return kv_heads * head_dim; }
  // Number of weight matrices of the MLP (3 for swiglu: gate, up, down; 2 for gelu).
  int mlp_matrices() const { return activation == Activation::kSwiglu ? 3 : 2; }
};

// Parameter counts (elements). "active" counts only top_k experts per MoE layer.
struct ParamCounts {
  int64_t embedding = 0;         // token embedding (+ learned positions)
  int64_t attention = 0;         // per layer: q, k, v, o (+ biases)
  int64_t norms = 0;             // per layer: the two norms
  int64_t dense_mlp = 0;         // per dense layer MLP
  int64_t expert_mlp = 0;        // one expert's MLP
  int64_t router = 0;            // per MoE layer
  int64_t dense_layer = 0;       // attention + norms + dense MLP
  int64_t moe_layer_total = 0;   // attention + norms + router + all experts
  int64_t moe_layer_active = 0;  // attention + norms + router + top_k experts
  int64_t final_norm = 0;
  int64_t lm_head = 0;  // 0 when tied
  int64_t total = 0;
  int64_t active = 0;
};
ParamCounts param_counts(const Model& m);

// Megatron-convention FLOPs per token (multiply-add = 2 FLOPs, full attention matrix counted,
// as in Narayanan et al. 2021 eq. 3 generalised to GQA, SwiGLU and MoE active experts).
struct FlopsPerToken {
  double forward = 0;              // one forward pass
  double model = 0;                // training step without recompute: 3 x forward (MFU numerator)
  double with_full_recompute = 0;  // model + the layers' forward again (the output layer is
                                   // not recomputed): HFU numerator under full recompute
};
// seq: the sequence length the attention term uses (0 = model.seq_len).
FlopsPerToken flops_per_token(const Model& m, int64_t seq = 0);

// Validates the fields; throws parasol::Error naming "<path>.<field>".
void validate_model(const Model& m, const std::string& path = "model");

// parasol's own JSON (fields as in the struct; "norm": "layernorm|rmsnorm", "activation":
// "gelu|swiglu", "moe": {...}). Throws parasol::Error on any malformed field.
Model model_from_json(const Json& j, const std::string& path = "model");
Json model_to_json(const Model& m);
// A Hugging Face config.json (Llama/Mistral/Mixtral or GPT-2 names).
Model model_from_hf_config(const Json& j, const std::string& path = "model");
bool looks_like_hf_config(const Json& j);

// Builders of the two families the presets use. GPT: layernorm, gelu, ffn = 4h, learned
// positions, linear biases, dropout, no GQA. Llama: rmsnorm, swiglu, RoPE, no biases or dropout.
Model gpt_model(const std::string& name, int layers, int64_t hidden, int heads, int64_t vocab,
                int64_t seq, bool tied_embeddings);
Model llama_model(const std::string& name, int layers, int64_t hidden, int heads, int kv_heads,
                  int64_t ffn, int64_t vocab, int64_t seq);

// Presets: gpt2-124m, gpt3-175b, megatron-1t, llama3-8b, llama3-70b, llama3-405b,
// mixtral-8x7b, tiny, tiny-moe, gpt-22b, tnlg-530b, ...
Model model_preset(const std::string& name);
std::vector<std::string> model_preset_names();

// A preset name, a parasol model JSON file or an HF config.json file.
Model load_model(const std::string& preset_or_path);

}  // namespace parasol
