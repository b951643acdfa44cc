// Model: validation, derived figures (parameters, FLOPs per token), JSON and HF config import.
#include "core/model.h"

#include "core/error.h"

namespace parasol {

namespace {
// Limits that keep every derived count inside int64 (validated before any count is taken).
constexpr int64_t kMaxLayers = 10000;
constexpr int64_t kMaxHidden = int64_t{1} << 20;
constexpr int64_t kMaxFfn = int64_t{1} << 22;
constexpr int64_t kMaxVocab = int64_t{1} << 24;
constexpr int64_t kMaxSeq = int64_t{1} << 24;
constexpr int64_t kMaxHeads = 1 << 16;
constexpr int64_t kMaxExperts = 4096;
constexpr double kMaxParams = 1e15;

int64_t norm_params(const Model& m) { return m.norm == Norm::kLayerNorm ? 2 * m.hidden : m.hidden; }

int64_t mlp_params(const Model& m, int64_t ffn) {
  int64_t p = m.mlp_matrices() * m.hidden * ffn;
  if (m.linear_bias) p += (m.mlp_matrices() - 1) * ffn + m.hidden;
  return p;
}
}  // namespace

bool Model::is_moe_layer(int layer) const {
  return moe.experts > 0 && moe.every > 0 && layer % moe.every == moe.every - 1;
}

int Model::moe_layer_count() const {
  return moe.experts > 0 && moe.every > 0 ? layers / moe.every : 0;
}

ParamCounts param_counts(const Model& m) {
  ParamCounts p;
  p.embedding = m.vocab * m.hidden + (m.learned_positions ? m.seq_len * m.hidden : 0);
  p.attention = 2 * m.hidden * m.q_dim() + 2 * m.hidden * m.kv_dim();
  if (m.linear_bias) p.attention += m.q_dim() + 2 * m.kv_dim() + m.hidden;
  p.norms = 2 * norm_params(m);
  p.dense_mlp = mlp_params(m, m.ffn);
  p.expert_mlp = m.is_moe() ? mlp_params(m, m.moe.expert_ffn) : 0;
  p.router = m.is_moe() ? m.hidden * m.moe.experts : 0;
  p.dense_layer = p.attention + p.norms + p.dense_mlp;
  p.moe_layer_total = p.attention + p.norms + p.router + m.moe.experts * p.expert_mlp;
  p.moe_layer_active = p.attention + p.norms + p.router + m.moe.top_k * p.expert_mlp;
  p.final_norm = norm_params(m);
  p.lm_head = m.tied_embeddings ? 0 : m.vocab * m.hidden;
  int64_t moe_layers = m.moe_layer_count();
  int64_t dense_layers = m.layers - moe_layers;
  int64_t outer = p.embedding + p.final_norm + p.lm_head;
  p.total = outer + dense_layers * p.dense_layer + moe_layers * p.moe_layer_total;
  p.active = outer + dense_layers * p.dense_layer + moe_layers * p.moe_layer_active;
  return p;
}

FlopsPerToken flops_per_token(const Model& m, int64_t seq) {
  if (seq <= 0) seq = m.seq_len;
  const double h = static_cast<double>(m.hidden);
  const double attn_linear = 2.0 * (2 * h * m.q_dim() + 2 * h * m.kv_dim());
  const double attn_core = 2.0 * 2.0 * static_cast<double>(seq) * m.q_dim();  // QK^T and AV
  const double dense_mlp = 2.0 * m.mlp_matrices() * h * m.ffn;
  const double moe_mlp = 2.0 * m.moe.top_k * m.mlp_matrices() * h * m.moe.expert_ffn +
                         2.0 * h * m.moe.experts;  // active experts + router
  const int moe_layers = m.moe_layer_count();
  const int dense_layers = m.layers - moe_layers;
  FlopsPerToken f;
  f.forward = m.layers * (attn_linear + attn_core) + dense_layers * dense_mlp +
              moe_layers * moe_mlp + 2.0 * h * m.vocab;
  f.model = 3 * f.forward;
  f.with_full_recompute = 4 * f.forward - 2.0 * h * m.vocab;  // the output layer is not recomputed
  return f;
}

void validate_model(const Model& m, const std::string& path) {
  auto f = [&](const char* name) { return path + "." + name; };
  auto positive = [&](int64_t v, const char* name, int64_t max) {
    if (v < 1 || v > max)
      throw Error(f(name), std::to_string(v) + " must be in [1, " + std::to_string(max) + "]");
  };
  positive(m.layers, "layers", kMaxLayers);
  positive(m.hidden, "hidden", kMaxHidden);
  positive(m.heads, "heads", kMaxHeads);
  positive(m.kv_heads, "kv_heads", kMaxHeads);
  positive(m.head_dim, "head_dim", kMaxHidden);
  positive(m.ffn, "ffn", kMaxFfn);
  positive(m.vocab, "vocab", kMaxVocab);
  positive(m.seq_len, "seq_len", kMaxSeq);
  if (m.heads % m.kv_heads != 0)
    throw Error(f("kv_heads"), std::to_string(m.kv_heads) + " does not divide heads (" +
                                   std::to_string(m.heads) + ")");
  if (m.q_dim() > 4 * kMaxHidden) throw Error(f("head_dim"), "heads x head_dim is too large");
  if (m.moe.experts != 0) {
    positive(m.moe.experts, "moe.experts", kMaxExperts);
    positive(m.moe.top_k, "moe.top_k", m.moe.experts);
    positive(m.moe.expert_ffn, "moe.expert_ffn", kMaxFfn);
    positive(m.moe.every, "moe.every", m.layers);
  } else if (m.moe.top_k != 0) {
    throw Error(f("moe.top_k"), "is set but moe.experts is 0");
  }
  // Guard the int64 counts: estimate in double first.
  double h = m.hidden,
         layer = 4.0 * h * m.q_dim() + 3.0 * h * m.ffn + 3.0 * h * m.moe.expert_ffn * m.moe.experts;
  double total = m.layers * layer + 2.0 * h * m.vocab + h * m.seq_len;
  if (total > kMaxParams) throw Error(path, "more than 1e15 parameters is not supported");
}

Model model_from_json(const Json& j, const std::string& path) {
  JsonReader r(j, path);
  r.allow_only({"name", "layers", "hidden", "heads", "kv_heads", "head_dim", "ffn", "vocab",
                "seq_len", "seq", "norm", "activation", "tied_embeddings", "learned_positions",
                "linear_bias", "dropout", "rope_theta", "moe"});
  Model m;
  m.name = r.string_or("name", "custom");
  m.layers = static_cast<int>(r.integer("layers", 1, kMaxLayers));
  m.hidden = r.integer("hidden", 1, kMaxHidden);
  m.heads = static_cast<int>(r.integer("heads", 1, kMaxHeads));
  m.kv_heads = static_cast<int>(r.integer_or("kv_heads", m.heads, 1, kMaxHeads));
  m.head_dim = r.integer_or("head_dim", m.hidden / m.heads, 1, kMaxHidden);
  if (!r.has("head_dim") && m.hidden % m.heads != 0)
    throw Error(r.field("heads"), std::to_string(m.heads) + " does not divide hidden (" +
                                      std::to_string(m.hidden) + ") and head_dim is not given");
  m.ffn = r.integer_or("ffn", 4 * m.hidden, 1, kMaxFfn);
  m.vocab = r.integer("vocab", 1, kMaxVocab);
  if (r.has("seq_len") && r.has("seq"))
    throw Error(r.field("seq"), "give seq_len or seq, not both");
  m.seq_len = r.has("seq") ? r.integer("seq", 1, kMaxSeq) : r.integer("seq_len", 1, kMaxSeq);
  m.norm = r.choice("norm", {"layernorm", "rmsnorm"}, "layernorm") == "rmsnorm" ? Norm::kRmsNorm
                                                                                : Norm::kLayerNorm;
  m.activation = r.choice("activation", {"gelu", "swiglu"}, "gelu") == "swiglu"
                     ? Activation::kSwiglu
                     : Activation::kGelu;
  m.tied_embeddings = r.boolean_or("tied_embeddings", false);
  m.learned_positions = r.boolean_or("learned_positions", false);
  m.linear_bias = r.boolean_or("linear_bias", false);
  m.dropout = r.boolean_or("dropout", false);
  m.rope_theta = r.number_or("rope_theta", 10000, 1, 1e12);
  if (r.has("moe")) {
    JsonReader moe = r.object("moe");
    moe.allow_only({"experts", "top_k", "expert_ffn", "every"});
    m.moe.experts = static_cast<int>(moe.integer("experts", 0, kMaxExperts));
    m.moe.top_k =
        static_cast<int>(moe.integer_or("top_k", m.moe.experts > 0 ? 2 : 0, 0, kMaxExperts));
    m.moe.expert_ffn = moe.integer_or("expert_ffn", m.ffn, 1, kMaxFfn);
    m.moe.every = static_cast<int>(moe.integer_or("every", 1, 1, kMaxLayers));
    if (m.moe.experts == 0 && moe.has("top_k") && m.moe.top_k != 0)
      throw Error(moe.field("top_k"), "is set but experts is 0");
    if (m.moe.experts == 0) m.moe = MoeSpec{};
  }
  validate_model(m, path);
  return m;
}

Json model_to_json(const Model& m) {
  Json j = {{"name", m.name},
            {"layers", m.layers},
            {"hidden", m.hidden},
            {"heads", m.heads},
            {"kv_heads", m.kv_heads},
            {"head_dim", m.head_dim},
            {"ffn", m.ffn},
            {"vocab", m.vocab},
            {"seq_len", m.seq_len},
            {"norm", m.norm == Norm::kRmsNorm ? "rmsnorm" : "layernorm"},
            {"activation", m.activation == Activation::kSwiglu ? "swiglu" : "gelu"},
            {"tied_embeddings", m.tied_embeddings},
            {"learned_positions", m.learned_positions},
            {"linear_bias", m.linear_bias},
            {"dropout", m.dropout},
            {"rope_theta", m.rope_theta}};
  if (m.is_moe())
    j["moe"] = {{"experts", m.moe.experts},
                {"top_k", m.moe.top_k},
                {"expert_ffn", m.moe.expert_ffn},
                {"every", m.moe.every}};
  return j;
}

bool looks_like_hf_config(const Json& j) {
  return j.is_object() && (j.contains("hidden_size") || j.contains("n_embd") ||
                           j.contains("model_type") || j.contains("architectures"));
}

Model model_from_hf_config(const Json& j, const std::string& path) {
  JsonReader r(j, path);
  Model m;
  m.name = r.string_or("_name_or_path", r.string_or("model_type", "hf-model"));
  if (r.has("n_embd")) {  // GPT-2 family
    m.hidden = r.integer("n_embd", 1, kMaxHidden);
    m.layers = static_cast<int>(r.integer("n_layer", 1, kMaxLayers));
    m.heads = static_cast<int>(r.integer("n_head", 1, kMaxHeads));
    m.kv_heads = m.heads;
    m.ffn = r.integer_or("n_inner", 4 * m.hidden, 1, kMaxFfn);  // n_inner = null means 4h
    m.vocab = r.integer("vocab_size", 1, kMaxVocab);
    m.seq_len = r.has("n_positions") ? r.integer("n_positions", 1, kMaxSeq)
                                     : r.integer("n_ctx", 1, kMaxSeq);
    m.norm = Norm::kLayerNorm;
    m.activation = Activation::kGelu;
    m.tied_embeddings = r.boolean_or("tie_word_embeddings", true);
    m.learned_positions = true;
    m.linear_bias = true;
    m.dropout =
        r.number_or("resid_pdrop", 0.1, 0, 1) > 0 || r.number_or("attn_pdrop", 0.1, 0, 1) > 0;
  } else {  // Llama / Mistral / Mixtral names
    m.hidden = r.integer("hidden_size", 1, kMaxHidden);
    m.layers = static_cast<int>(r.integer("num_hidden_layers", 1, kMaxLayers));
    m.heads = static_cast<int>(r.integer("num_attention_heads", 1, kMaxHeads));
    m.kv_heads = static_cast<int>(r.integer_or("num_key_value_heads", m.heads, 1, kMaxHeads));
    m.ffn = r.integer("intermediate_size", 1, kMaxFfn);
    m.vocab = r.integer("vocab_size", 1, kMaxVocab);
    m.seq_len = r.integer_or("max_position_embeddings", 4096, 1, kMaxSeq);
    m.norm = r.has("rms_norm_eps") ? Norm::kRmsNorm : Norm::kLayerNorm;
    std::string act = r.string_or("hidden_act", "silu");
    m.activation = (act == "silu" || act == "swiglu") ? Activation::kSwiglu : Activation::kGelu;
    m.tied_embeddings = r.boolean_or("tie_word_embeddings", false);
    m.learned_positions = false;
    m.linear_bias = r.boolean_or("attention_bias", false);
    m.dropout = r.number_or("attention_dropout", 0, 0, 1) > 0;
    m.rope_theta = r.number_or("rope_theta", 10000, 1, 1e12);
    if (r.has("num_local_experts")) {
      m.moe.experts = static_cast<int>(r.integer("num_local_experts", 1, kMaxExperts));
      m.moe.top_k = static_cast<int>(r.integer_or("num_experts_per_tok", 2, 1, m.moe.experts));
      m.moe.expert_ffn = m.ffn;
      m.moe.every = 1;
    }
  }
  if (r.has("head_dim")) {
    m.head_dim = r.integer("head_dim", 1, kMaxHidden);
  } else {
    if (m.hidden % m.heads != 0)
      throw Error(r.field(r.has("n_embd") ? "n_head" : "num_attention_heads"),
                  "does not divide the hidden size");
    m.head_dim = m.hidden / m.heads;
  }
  validate_model(m, path);
  return m;
}

Model load_model(const std::string& preset_or_path) {
  if (!is_existing_file(preset_or_path)) {
    if (preset_or_path.find('/') != std::string::npos || preset_or_path.ends_with(".json"))
      throw Error("model", "no such file '" + preset_or_path + "'");
    return model_preset(preset_or_path);
  }
  Json j = read_json_file(preset_or_path);
  if (j.is_object() && !j.contains("layers") && looks_like_hf_config(j))
    return model_from_hf_config(j, "model");
  return model_from_json(j, "model");
}

}  // namespace parasol
