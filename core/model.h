// Model: what to train. A decoder-only transformer (GPT, Llama, Mistral, Mixtral, Qwen-MoE,
// DeepSeek-V3 and GPT-OSS families: GQA, MoE with shared experts and leading dense layers,
// multi-head latent attention, sliding windows), read from parasol's JSON, a Hugging Face
// config.json or a preset name. Derived figures (parameter counts, FLOPs per token) live here and
// nowhere else; the shapes of a layer's linears are in core/layer_shapes.h.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/json_reader.h"

namespace parasol {

enum class Norm { kLayerNorm, kRmsNorm };
enum class Activation { kGelu, kSwiglu };

struct MoeSpec {
  int experts = 0;         // routed experts per MoE layer; 0 = dense model
  int top_k = 0;           // routed experts each token is sent to
  int64_t expert_ffn = 0;  // MLP hidden size of one routed expert
  int every = 1;           // layer l is MoE when l >= first_dense && l % every == every - 1
  int first_dense = 0;     // the first layers are dense (DeepSeek's first_k_dense_replace)
  int shared_experts = 0;  // always-active shared experts per MoE layer (DeepSeek, Qwen2-MoE)
  int64_t shared_expert_ffn = 0;  // MLP hidden size of ONE shared expert; 0 = expert_ffn

  // MLP hidden size of one shared expert (expert_ffn unless shared_expert_ffn is given).
  int64_t shared_ffn() const { return shared_expert_ffn > 0 ? shared_expert_ffn : expert_ffn; }
  // Width of the shared experts taken together: they run as one fused dense MLP of this hidden
  // size (as Megatron-LM and DeepSeek's reference code build them), so with linear biases the
  // bias is counted once, not per shared expert.
  int64_t shared_width() const { return shared_experts * shared_ffn(); }
};

// DeepSeek-V2/V3 multi-head latent attention (Liu et al. 2024, "DeepSeek-V2", section 2.1).
// q = W_qup norm(W_qdown x) (or W_q x without query compression); the latent kv vector
// c = norm(W_kvdown x)[:kv_lora_rank] is expanded per head into a non-rotary key part of
// qk_nope_head_dim and a value of v_head_dim; the rotary key part (qk_rope_head_dim) comes from
// W_kvdown directly and is shared by all heads. Attention scores use qk_nope + qk_rope per head.
struct MlaSpec {
  int64_t q_lora_rank = 0;       // query latent size; 0 = no query compression (plain q proj)
  int64_t kv_lora_rank = 0;      // key/value latent size; 0 = MLA off
  int64_t qk_nope_head_dim = 0;  // per-head query/key dims without rotary embedding
  int64_t qk_rope_head_dim = 0;  // per-head query/key dims with rotary embedding
  int64_t v_head_dim = 0;        // per-head value dims

  bool enabled() const { return kv_lora_rank > 0; }
  int64_t qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
};

// YaRN rotary scaling (Peng et al. 2023, arXiv 2309.00071; HF config.json rope_scaling with
// rope_type "yarn": GPT-OSS, DeepSeek-V3). The frequencies it rescales cost nothing; what costs is
// its concentration factor (rope_concentration()), the scale on RoPE's cos and sin, which
// Transformer Engine's fused RoPE kernel cannot take (core/layer_shapes.h KernelBytes::rotary).
struct YarnSpec {
  double factor = 0;  // the context scaling factor s; 0 = no YaRN (plain RoPE)
  int64_t original_max_position_embeddings = 0;  // pretraining context (informational)
  // HF / Megatron-Core's mscale and mscale_all_dim; absent (GPT-OSS) as HF's None.
  std::optional<double> mscale, mscale_all_dim;

  bool enabled() const { return factor > 0; }
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
  // The GLU's inputs clamped before the activation (GPT-OSS: gate <= limit, -limit <= up <=
  // limit, HF config swiglu_limit 7.0); 0 = no clamp. The frameworks clamp them eagerly, outside
  // the fused activation kernel (core/lower_moe.cc).
  double glu_clamp = 0;
  YarnSpec yarn;  // RoPE's YaRN scaling (when !learned_positions); factor 0 = none
  // RMSNorm on each head's query and key before the rotary embedding (Qwen3, OLMo 2: HF
  // q_norm / k_norm; Megatron-Core's qk_layernorm, two TENorm calls per layer); it adds a
  // norm over the query and one over the key columns, forward and backward (core/lower_layer.cc).
  bool qk_norm = false;
  MoeSpec moe;
  MlaSpec mla;  // with MLA: head_dim = qk_nope + qk_rope and kv_heads = heads
  // Sliding-window attention: a query at position i attends keys max(0, i - W + 1)..i.
  int64_t sliding_window = 0;    // W in tokens; 0 = full causal attention on every layer
  int full_attention_every = 0;  // with a window: layer l uses full attention when
                                 // (l + 1) % k == 0 (GPT-OSS alternates: k = 2); 0 = every
                                 // layer is windowed (Mistral-7B-v0.1)

  bool is_moe() const { return moe.experts > 0; }
  // YaRN's concentration (attention) factor on RoPE's cos and sin: 1 without YaRN or with s <= 1;
  // m(s, 1) = 0.1 ln s + 1 when mscale or mscale_all_dim is absent; else m(s, mscale) /
  // m(s, mscale_all_dim), m(s, a) = 0.1 a ln s + 1 (Megatron-Core @4415119
  // yarn_rotary_pos_embedding.py _yarn_get_concentration_factor; HF's yarn attention_factor).
  double rope_concentration() const;
  // experts > 0 && l >= moe.first_dense && l % moe.every == moe.every - 1.
  bool is_moe_layer(int layer) const;
  int moe_layer_count() const;  // MoE layers among [0, layers)
  // MoE layers among [first, last) (a pipeline stage's layers).
  int moe_layers_between(int first, int last) const;
  // True when layer `layer` attends through the sliding window (false without a window).
  bool is_windowed_layer(int layer) const;
  int windowed_layer_count() const;
  // Query width: heads x head_dim (with MLA: heads x (qk_nope + qk_rope)).
  int64_t q_dim() const { return heads * head_dim; }
  // Key width: kv_heads x head_dim (with MLA the expanded keys: heads x (qk_nope + qk_rope)).
  int64_t kv_dim() const { return kv_heads * head_dim; }
  // Per-head value dims: head_dim, or MLA's v_head_dim.
  int64_t v_head_dim() const { return mla.enabled() ? mla.v_head_dim : head_dim; }
  // Number of weight matrices of the MLP (3 for swiglu: gate, up, down; 2 for gelu).
  int mlp_matrices() const { return activation == Activation::kSwiglu ? 3 : 2; }
};

// Parameter counts (elements). "active" counts only top_k routed experts per MoE layer (the
// shared experts are always active). Per layer:
//   attention (no MLA): q, k, v, o = 2 h (heads hd) + 2 h (kv_heads hd) (+ biases q+2kv+h).
//   attention (MLA, r_q = q_lora_rank, r_kv = kv_lora_rank, n = heads, d_qk = nope + rope):
//     q:   h r_q + r_q (latent norm) + r_q n d_qk, or h n d_qk without query compression
//     kv:  h (r_kv + rope) + r_kv (latent norm) + r_kv n (nope + v)
//     out: n v h
//   (latent norms are of the model's norm kind: x2 for layernorm); biases on every linear when
//   linear_bias.
//   MLP of hidden f: mlp_matrices h f (+ biases (mlp_matrices - 1) f + h).
//   dense layer: attention + norms + MLP(ffn); the first moe.first_dense layers are dense.
//   MoE layer: attention + norms + router (h experts) + experts MLP(expert_ffn) + one fused
//   MLP(shared_experts x shared_ffn) for the shared experts.
// Not counted: DeepSeek's multi-token-prediction module (num_nextn_predict_layers), router
// biases (GPT-OSS, DeepSeek's e_score_correction_bias), GPT-OSS attention sinks, Qwen3 q/k
// norms and Qwen2-MoE's shared-expert gate: each below 1e-4 of the total.
struct ParamCounts {
  int64_t embedding = 0;             // token embedding (+ learned positions)
  int64_t attention = 0;             // per layer: the attention block's linears (+ biases, MLA
                                     // latent norms)
  int64_t attention_replicated = 0;  // the part of `attention` replicated over tensor
                                     // parallelism: MLA's down-projections and latent norms
  int64_t norms = 0;                 // per layer: the two norms
  int64_t dense_mlp = 0;             // per dense layer MLP (ffn)
  int64_t expert_mlp = 0;            // one routed expert's MLP
  int64_t shared_mlp = 0;            // per MoE layer: the shared experts (one fused MLP)
  int64_t router = 0;                // per MoE layer
  int64_t dense_layer = 0;           // attention + norms + dense MLP
  int64_t moe_layer_total = 0;       // attention + norms + router + shared + all routed experts
  int64_t moe_layer_active = 0;      // attention + norms + router + shared + top_k routed experts
  int64_t final_norm = 0;
  int64_t lm_head = 0;  // 0 when tied
  int64_t total = 0;
  int64_t active = 0;
};
ParamCounts param_counts(const Model& m);

// Megatron-convention FLOPs per token (multiply-add = 2 FLOPs, full attention matrix counted,
// as in Narayanan et al. 2021 eq. 3 generalised to GQA, SwiGLU, MoE active experts, shared
// experts, MLA and sliding windows). Per layer, forward:
//   linears: 2 x (the weights of the attention block's linears), 2 x mlp_matrices h ffn (dense
//     layer) or 2 x mlp_matrices h (top_k expert_ffn + shared width) + 2 h experts (MoE layer);
//   attention core: 2 K heads (d_qk + d_v) for QK^T and AV, where K is the keys per query:
//     K = S (seq) on a full layer: Megatron counts the whole S x S matrix, not its causal half;
//     K = 2 P(S, W) / S - 1 on a windowed layer, P(S, W) = S W - W (W - 1) / 2 the (query, key)
//       pairs of a causal window W < S (P = S (S + 1) / 2 for W >= S). That is the same
//       convention applied to a window: drop the causal half of the mask, keep the symmetric
//       band |i - j| < W (2 P - S pairs). It equals S at W = S, so the count is continuous in W;
//       the causal kernel itself does P(S, W) / S pairs per query (core/program.h);
//   logits: 2 h vocab.
// Norms, biases, softmax and activations are not counted.
struct FlopsPerToken {
  double forward = 0;              // one forward pass
  double model = 0;                // training step without recompute: 3 x forward (MFU numerator)
  double with_full_recompute = 0;  // model + the layers' forward again (the output layer is
                                   // not recomputed): HFU numerator under full recompute
};
// seq: the sequence length the attention term uses (0 = model.seq_len).
FlopsPerToken flops_per_token(const Model& m, int64_t seq = 0);

// Validates the fields and their consistency (first_dense < layers, MLA needs kv_heads == heads
// and head_dim == qk_nope + qk_rope, a window >= 1, ...); throws parasol::Error naming
// "<path>.<field>".
void validate_model(const Model& m, const std::string& path = "model");

// parasol's own JSON (fields as in the struct; "norm": "layernorm|rmsnorm", "activation":
// "gelu|swiglu", "moe": {"experts", "top_k", "expert_ffn", "every", "first_dense",
// "shared_experts", "shared_expert_ffn"}, "mla": {"q_lora_rank", "kv_lora_rank",
// "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"}, "sliding_window",
// "full_attention_every", "rope_scaling": {"rope_type": "yarn", "factor",
// "original_max_position_embeddings", "mscale", "mscale_all_dim"}). With "mla", head_dim defaults
// to qk_nope + qk_rope and kv_heads to heads. Throws parasol::Error on any malformed field.
Model model_from_json(const Json& j, const std::string& path = "model");
Json model_to_json(const Model& m);
// A Hugging Face config.json, read as it is: GPT-2, Llama, Mistral (sliding_window), Mixtral,
// Qwen2/Qwen3(-MoE) (num_experts, decoder_sparse_step, mlp_only_layers,
// shared_expert_intermediate_size), DeepSeek-V2/V3 (n_routed_experts, n_shared_experts,
// first_k_dense_replace, moe_layer_freq, MLA) and GPT-OSS (num_local_experts, layer_types)
// names. A key that describes structure parasol cannot express (MoE layers that are not
// first_dense/every, a layer_types pattern other than full_attention_every, hybrid layers, ...)
// is an Error naming the key, never silently dropped. DeepSeek's multi-token-prediction module
// (num_nextn_predict_layers) is not part of the model.
Model model_from_hf_config(const Json& j, const std::string& path = "model");
bool looks_like_hf_config(const Json& j);

// Builders of the two families the presets use. GPT: layernorm, gelu, ffn = 4h, learned
// positions, linear biases, dropout, no GQA. Llama: rmsnorm, swiglu, RoPE, no biases or dropout.
Model gpt_model(const std::string& name, int layers, int64_t hidden, int heads, int64_t vocab,
                int64_t seq, bool tied_embeddings);
Model llama_model(const std::string& name, int layers, int64_t hidden, int heads, int kv_heads,
                  int64_t ffn, int64_t vocab, int64_t seq);

// Presets: gpt2-124m, gpt3-175b, megatron-1t, llama3-8b, llama3-70b, llama3-405b,
// mixtral-8x7b, mistral-7b, deepseek-v3, qwen3-30b-a3b, qwen3-235b-a22b, gpt-oss-20b,
// gpt-oss-120b, tiny, tiny-moe, gpt-22b, tnlg-530b, ...
Model model_preset(const std::string& name);
std::vector<std::string> model_preset_names();

// A preset name, a parasol model JSON file or an HF config.json file. A model read from a file is
// named by the file's own name (parasol JSON "name", HF "_name_or_path"), else by the file: its
// stem less "_config"/"-config"/".config", or for config.json the folder it is in.
Model load_model(const std::string& preset_or_path);

}  // namespace parasol
