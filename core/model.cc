// Model: validation, derived figures (parameters, FLOPs per token), JSON and HF config import.
#include "core/model.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <initializer_list>
#include <string_view>

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

int64_t norm_params(const Model& m, int64_t width) {
  return m.norm == Norm::kLayerNorm ? 2 * width : width;
}
int64_t norm_params(const Model& m) { return norm_params(m, m.hidden); }

int64_t mlp_params(const Model& m, int64_t ffn) {
  int64_t p = m.mlp_matrices() * m.hidden * ffn;
  if (m.linear_bias) p += (m.mlp_matrices() - 1) * ffn + m.hidden;
  return p;
}

// Weights of the attention block's linear maps (no biases, no norms): what the forward
// multiplies each token by.
int64_t attention_weights(const Model& m) {
  const int64_t h = m.hidden;
  if (!m.mla.enabled()) return 2 * h * m.q_dim() + 2 * h * m.kv_dim();
  const MlaSpec& a = m.mla;
  const int64_t n = m.heads;
  const int64_t q = a.q_lora_rank > 0 ? h * a.q_lora_rank + a.q_lora_rank * n * a.qk_head_dim()
                                      : h * n * a.qk_head_dim();
  const int64_t kv = h * (a.kv_lora_rank + a.qk_rope_head_dim) +
                     a.kv_lora_rank * n * (a.qk_nope_head_dim + a.v_head_dim);
  return q + kv + n * a.v_head_dim * h;
}

// Causal (query, key) pairs of one sequence of `seq` tokens under a window of `window` keys
// (0 = none): sum over i of min(i + 1, W) = S W - W (W - 1) / 2 for W < S, else S (S + 1) / 2.
double causal_pairs(double seq, double window) {
  if (window <= 0 || window >= seq) return seq * (seq + 1) / 2;
  return seq * window - window * (window - 1) / 2;
}
}  // namespace

bool Model::is_moe_layer(int layer) const {
  return moe.experts > 0 && moe.every > 0 && layer >= moe.first_dense &&
         layer % moe.every == moe.every - 1;
}

int Model::moe_layers_between(int first, int last) const {
  if (!is_moe()) return 0;
  int n = 0;
  for (int l = std::max(first, 0); l < std::min(last, layers); ++l) n += is_moe_layer(l) ? 1 : 0;
  return n;
}

int Model::moe_layer_count() const { return moe_layers_between(0, layers); }

bool Model::is_windowed_layer(int layer) const {
  if (sliding_window <= 0) return false;
  return full_attention_every <= 0 || (layer + 1) % full_attention_every != 0;
}

int Model::windowed_layer_count() const {
  if (sliding_window <= 0) return 0;
  int n = 0;
  for (int l = 0; l < layers; ++l) n += is_windowed_layer(l) ? 1 : 0;
  return n;
}

ParamCounts param_counts(const Model& m) {
  ParamCounts p;
  p.embedding = m.vocab * m.hidden + (m.learned_positions ? m.seq_len * m.hidden : 0);
  p.attention = attention_weights(m);
  if (m.mla.enabled()) {
    const MlaSpec& a = m.mla;
    p.attention_replicated = (a.q_lora_rank > 0 ? m.hidden * a.q_lora_rank : 0) +
                             m.hidden * (a.kv_lora_rank + a.qk_rope_head_dim);
    const int64_t norms =
        (a.q_lora_rank > 0 ? norm_params(m, a.q_lora_rank) : 0) + norm_params(m, a.kv_lora_rank);
    p.attention += norms;
    p.attention_replicated += norms;
    if (m.linear_bias) {
      const int64_t down_bias = a.q_lora_rank + a.kv_lora_rank + a.qk_rope_head_dim;
      p.attention +=
          down_bias + m.heads * (a.qk_head_dim() + a.qk_nope_head_dim + a.v_head_dim) + m.hidden;
      p.attention_replicated += down_bias;
    }
  } else if (m.linear_bias) {
    p.attention += m.q_dim() + 2 * m.kv_dim() + m.hidden;
  }
  p.norms = 2 * norm_params(m);
  p.dense_mlp = mlp_params(m, m.ffn);
  p.expert_mlp = m.is_moe() ? mlp_params(m, m.moe.expert_ffn) : 0;
  p.shared_mlp = m.is_moe() && m.moe.shared_experts > 0 ? mlp_params(m, m.moe.shared_width()) : 0;
  p.router = m.is_moe() ? m.hidden * m.moe.experts : 0;
  p.dense_layer = p.attention + p.norms + p.dense_mlp;
  const int64_t moe_common = p.attention + p.norms + p.router + p.shared_mlp;
  p.moe_layer_total = moe_common + m.moe.experts * p.expert_mlp;
  p.moe_layer_active = moe_common + m.moe.top_k * p.expert_mlp;
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
  const double attn_linear = 2.0 * static_cast<double>(attention_weights(m));
  // QK^T over d_qk = head_dim and AV over d_v per head and key: 2 K heads (d_qk + d_v). Without
  // MLA d_qk = d_v and heads (d_qk + d_v) = 2 q_dim, as in Megatron's 4 K q_dim.
  const double core_width = static_cast<double>(m.q_dim() + m.heads * m.v_head_dim());
  const double attn_full = 2.0 * static_cast<double>(seq) * core_width;
  // A windowed layer: K = 2 P(S, W) / S - 1 keys per query (the symmetric band; model.h).
  const int windowed = m.windowed_layer_count();
  const double s = static_cast<double>(seq);
  const double keys_windowed =
      windowed > 0 ? 2.0 * causal_pairs(s, static_cast<double>(m.sliding_window)) / s - 1.0 : 0.0;
  const double attn_windowed = 2.0 * keys_windowed * core_width;
  const double dense_mlp = 2.0 * m.mlp_matrices() * h * m.ffn;
  const double moe_mlp = 2.0 * m.moe.top_k * m.mlp_matrices() * h * m.moe.expert_ffn +
                         2.0 * h * m.moe.experts +  // active routed experts + router
                         2.0 * m.mlp_matrices() * h * m.moe.shared_width();  // shared experts
  const int moe_layers = m.moe_layer_count();
  const int dense_layers = m.layers - moe_layers;
  FlopsPerToken f;
  f.forward = (m.layers - windowed) * (attn_linear + attn_full) +
              windowed * (attn_linear + attn_windowed) + dense_layers * dense_mlp +
              moe_layers * moe_mlp + 2.0 * h * m.vocab;
  f.model = 3 * f.forward;
  f.with_full_recompute = 4 * f.forward - 2.0 * h * m.vocab;  // the output layer is not recomputed
  return f;
}

double Model::rope_concentration() const {
  if (learned_positions || !yarn.enabled() || yarn.factor <= 1) return 1.0;
  auto m = [&](double a) { return 0.1 * a * std::log(yarn.factor) + 1.0; };
  if (!yarn.mscale || !yarn.mscale_all_dim) return m(1.0);
  return m(*yarn.mscale) / m(*yarn.mscale_all_dim);
}

namespace {
// A rope_scaling object (parasol's JSON or HF config.json, the same names): YaRN's figures. Only
// "yarn" is read; HF's other types (linear, dynamic, llama3, ...) rescale the frequencies alone
// and cost nothing, so `hf` skips them; parasol's JSON takes only "yarn". beta_fast, beta_slow and
// truncate shape the frequencies (no cost) and are accepted from HF only.
void read_rope_scaling(const JsonReader& r, Model& m, bool hf) {
  if (!r.has("rope_scaling")) return;
  const JsonReader y = r.object("rope_scaling");
  if (y.has("rope_type") && y.has("type") && y.string("rope_type") != y.string("type"))
    throw Error(y.field("type"), "differs from rope_type");
  const std::string type = y.has("rope_type") ? y.string("rope_type") : y.string_or("type", "");
  if (type != "yarn") {
    if (hf) return;
    throw Error(y.field(y.has("rope_type") ? "rope_type" : "type"),
                "'" + type + "' is not 'yarn' (the only rope_scaling parasol prices)");
  }
  if (hf)
    y.allow_only({"rope_type", "type", "factor", "original_max_position_embeddings", "mscale",
                  "mscale_all_dim", "beta_fast", "beta_slow", "truncate"});
  else
    y.allow_only({"rope_type", "type", "factor", "original_max_position_embeddings", "mscale",
                  "mscale_all_dim"});
  m.yarn.factor = y.number("factor", 1e-6, 1e6);
  m.yarn.original_max_position_embeddings =
      y.integer_or("original_max_position_embeddings", 0, 0, kMaxSeq);
  if (y.has("mscale")) m.yarn.mscale = y.number("mscale", 0, 1e3);
  if (y.has("mscale_all_dim")) m.yarn.mscale_all_dim = y.number("mscale_all_dim", 0, 1e3);
}
}  // namespace

void validate_model(const Model& m, const std::string& path) {
  auto f = [&](const char* name) { return path + "." + name; };
  auto in_range = [&](int64_t v, const char* name, int64_t min, int64_t max) {
    if (v < min || v > max)
      throw Error(f(name), std::to_string(v) + " must be in [" + std::to_string(min) + ", " +
                               std::to_string(max) + "]");
  };
  auto positive = [&](int64_t v, const char* name, int64_t max) { in_range(v, name, 1, max); };
  auto unset_without = [&](int64_t v, const char* name, const char* needed) {
    if (v != 0) throw Error(f(name), std::string("is set but ") + needed + " is 0");
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
  if (m.learned_positions && m.yarn.enabled())
    throw Error(f("rope_scaling"), "is set but learned_positions has no rotary embedding");
  if (m.moe.experts != 0) {
    positive(m.moe.experts, "moe.experts", kMaxExperts);
    positive(m.moe.top_k, "moe.top_k", m.moe.experts);
    positive(m.moe.expert_ffn, "moe.expert_ffn", kMaxFfn);
    positive(m.moe.every, "moe.every", m.layers);
    in_range(m.moe.first_dense, "moe.first_dense", 0, m.layers - 1);
    in_range(m.moe.shared_experts, "moe.shared_experts", 0, kMaxExperts);
    in_range(m.moe.shared_expert_ffn, "moe.shared_expert_ffn", 0, kMaxFfn);
    if (m.moe.shared_experts == 0)
      unset_without(m.moe.shared_expert_ffn, "moe.shared_expert_ffn", "moe.shared_experts");
    if (m.moe.shared_width() > kMaxFfn)
      throw Error(f("moe.shared_experts"), "shared_experts x shared expert ffn is too large");
    if (m.moe_layer_count() == 0)
      throw Error(f("moe.first_dense"),
                  std::to_string(m.moe.first_dense) + " leaves no MoE layer (every " +
                      std::to_string(m.moe.every) + ", " + std::to_string(m.layers) + " layers)");
  } else {
    unset_without(m.moe.top_k, "moe.top_k", "moe.experts");
    unset_without(m.moe.first_dense, "moe.first_dense", "moe.experts");
    unset_without(m.moe.shared_experts, "moe.shared_experts", "moe.experts");
    unset_without(m.moe.shared_expert_ffn, "moe.shared_expert_ffn", "moe.experts");
  }
  in_range(m.mla.kv_lora_rank, "mla.kv_lora_rank", 0, kMaxHidden);
  if (m.mla.enabled()) {
    const MlaSpec& a = m.mla;
    in_range(a.q_lora_rank, "mla.q_lora_rank", 0, kMaxHidden);
    in_range(a.qk_nope_head_dim, "mla.qk_nope_head_dim", 0, kMaxHidden);
    in_range(a.qk_rope_head_dim, "mla.qk_rope_head_dim", 0, kMaxHidden);
    positive(a.v_head_dim, "mla.v_head_dim", kMaxHidden);
    if (a.qk_head_dim() < 1)
      throw Error(f("mla.qk_nope_head_dim"), "qk_nope_head_dim + qk_rope_head_dim must be >= 1");
    if (m.head_dim != a.qk_head_dim())
      throw Error(f("head_dim"), std::to_string(m.head_dim) +
                                     " must equal mla.qk_nope_head_dim + mla.qk_rope_head_dim (" +
                                     std::to_string(a.qk_head_dim()) + ") with MLA");
    if (m.kv_heads != m.heads)
      throw Error(f("kv_heads"), std::to_string(m.kv_heads) + " must equal heads (" +
                                     std::to_string(m.heads) + ") with MLA");
    if (m.heads * a.v_head_dim > 4 * kMaxHidden)
      throw Error(f("mla.v_head_dim"), "heads x v_head_dim is too large");
  } else {
    unset_without(m.mla.q_lora_rank, "mla.q_lora_rank", "mla.kv_lora_rank");
    unset_without(m.mla.qk_nope_head_dim, "mla.qk_nope_head_dim", "mla.kv_lora_rank");
    unset_without(m.mla.qk_rope_head_dim, "mla.qk_rope_head_dim", "mla.kv_lora_rank");
    unset_without(m.mla.v_head_dim, "mla.v_head_dim", "mla.kv_lora_rank");
  }
  in_range(m.sliding_window, "sliding_window", 0, kMaxSeq);
  in_range(m.full_attention_every, "full_attention_every", 0, m.layers);
  if (m.sliding_window == 0)
    unset_without(m.full_attention_every, "full_attention_every", "sliding_window");
  // Guard the int64 counts: estimate in double first.
  const double h = m.hidden;
  const double mla = m.mla.enabled() ? h * (m.mla.q_lora_rank + m.mla.kv_lora_rank) +
                                           (m.mla.q_lora_rank + m.mla.kv_lora_rank + h) * m.heads *
                                               (m.head_dim + m.mla.v_head_dim)
                                     : 0.0;
  const double layer = 4.0 * h * m.q_dim() + mla + 3.0 * h * m.ffn +
                       3.0 * h * m.moe.expert_ffn * m.moe.experts +
                       3.0 * h * static_cast<double>(m.moe.shared_width());
  const double total = m.layers * layer + 2.0 * h * m.vocab + h * m.seq_len;
  if (total > kMaxParams) throw Error(path, "more than 1e15 parameters is not supported");
}

Model model_from_json(const Json& j, const std::string& path) {
  JsonReader r(j, path);
  r.allow_only({"name",
                "layers",
                "hidden",
                "heads",
                "kv_heads",
                "head_dim",
                "ffn",
                "vocab",
                "seq_len",
                "seq",
                "norm",
                "activation",
                "tied_embeddings",
                "learned_positions",
                "linear_bias",
                "dropout",
                "rope_theta",
                "glu_clamp",
                "rope_scaling",
                "qk_norm",
                "moe",
                "mla",
                "sliding_window",
                "full_attention_every"});
  Model m;
  m.name = r.string_or("name", "custom");
  m.layers = static_cast<int>(r.integer("layers", 1, kMaxLayers));
  m.hidden = r.integer("hidden", 1, kMaxHidden);
  m.heads = static_cast<int>(r.integer("heads", 1, kMaxHeads));
  if (r.has("mla")) {
    JsonReader mla = r.object("mla");
    mla.allow_only(
        {"q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"});
    m.mla.kv_lora_rank = mla.integer("kv_lora_rank", 0, kMaxHidden);
    m.mla.q_lora_rank = mla.integer_or("q_lora_rank", 0, 0, kMaxHidden);
    m.mla.qk_nope_head_dim = mla.integer("qk_nope_head_dim", 0, kMaxHidden);
    m.mla.qk_rope_head_dim = mla.integer("qk_rope_head_dim", 0, kMaxHidden);
    m.mla.v_head_dim = mla.integer("v_head_dim", 0, kMaxHidden);
  }
  const bool mla = m.mla.enabled();
  m.kv_heads = static_cast<int>(r.integer_or("kv_heads", m.heads, 1, kMaxHeads));
  m.head_dim =
      r.integer_or("head_dim", mla ? m.mla.qk_head_dim() : m.hidden / m.heads, 1, kMaxHidden);
  if (!r.has("head_dim") && !mla && m.hidden % m.heads != 0)
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
  m.glu_clamp = r.number_or("glu_clamp", 0, 0, 1e6);
  read_rope_scaling(r, m, false);
  m.qk_norm = r.boolean_or("qk_norm", false);
  m.sliding_window = r.integer_or("sliding_window", 0, 0, kMaxSeq);
  m.full_attention_every = static_cast<int>(r.integer_or("full_attention_every", 0, 0, m.layers));
  if (r.has("moe")) {
    JsonReader moe = r.object("moe");
    moe.allow_only({"experts", "top_k", "expert_ffn", "every", "first_dense", "shared_experts",
                    "shared_expert_ffn"});
    m.moe.experts = static_cast<int>(moe.integer("experts", 0, kMaxExperts));
    m.moe.top_k =
        static_cast<int>(moe.integer_or("top_k", m.moe.experts > 0 ? 2 : 0, 0, kMaxExperts));
    m.moe.expert_ffn = moe.integer_or("expert_ffn", m.ffn, 1, kMaxFfn);
    m.moe.every = static_cast<int>(moe.integer_or("every", 1, 1, kMaxLayers));
    m.moe.first_dense = static_cast<int>(moe.integer_or("first_dense", 0, 0, m.layers - 1));
    m.moe.shared_experts = static_cast<int>(moe.integer_or("shared_experts", 0, 0, kMaxExperts));
    m.moe.shared_expert_ffn = moe.integer_or("shared_expert_ffn", 0, 0, kMaxFfn);
    if (m.moe.experts == 0) {
      // What only an MoE model has is not silently dropped.
      for (const char* key : {"top_k", "first_dense", "shared_experts", "shared_expert_ffn"})
        if (moe.has(key) && moe.integer(key, 0, kMaxFfn) != 0)
          throw Error(moe.field(key), "is set but experts is 0");
      m.moe = MoeSpec{};
    }
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
                {"every", m.moe.every},
                {"first_dense", m.moe.first_dense},
                {"shared_experts", m.moe.shared_experts},
                {"shared_expert_ffn", m.moe.shared_expert_ffn}};
  if (m.mla.enabled())
    j["mla"] = {{"q_lora_rank", m.mla.q_lora_rank},
                {"kv_lora_rank", m.mla.kv_lora_rank},
                {"qk_nope_head_dim", m.mla.qk_nope_head_dim},
                {"qk_rope_head_dim", m.mla.qk_rope_head_dim},
                {"v_head_dim", m.mla.v_head_dim}};
  if (m.glu_clamp > 0) j["glu_clamp"] = m.glu_clamp;
  if (m.yarn.enabled()) {
    j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", m.yarn.factor}};
    if (m.yarn.original_max_position_embeddings > 0)
      j["rope_scaling"]["original_max_position_embeddings"] =
          m.yarn.original_max_position_embeddings;
    if (m.yarn.mscale) j["rope_scaling"]["mscale"] = *m.yarn.mscale;
    if (m.yarn.mscale_all_dim) j["rope_scaling"]["mscale_all_dim"] = *m.yarn.mscale_all_dim;
  }
  if (m.qk_norm) j["qk_norm"] = true;
  if (m.sliding_window > 0) {
    j["sliding_window"] = m.sliding_window;
    j["full_attention_every"] = m.full_attention_every;
  }
  return j;
}

bool looks_like_hf_config(const Json& j) {
  return j.is_object() && (j.contains("hidden_size") || j.contains("n_embd") ||
                           j.contains("model_type") || j.contains("architectures"));
}

namespace {

// --- Hugging Face config.json ------------------------------------------------------------------

// One element of a JSON array, read with the strict reader's checks and named by its path.
int64_t element_integer(const std::string& path, const Json& v, int64_t min, int64_t max) {
  Json wrap = Json::object();
  wrap[path] = v;
  return JsonReader(wrap, "").integer(path, min, max);
}
std::string element_string(const std::string& path, const Json& v) {
  Json wrap = Json::object();
  wrap[path] = v;
  return JsonReader(wrap, "").string(path);
}

// The first of `keys` present (not null) in the config, or "" when none is.
std::string first_present(const JsonReader& r, std::initializer_list<const char*> keys) {
  for (const char* k : keys)
    if (r.has(k)) return k;
  return "";
}

// An integer that several HF families name differently (num_local_experts, num_experts,
// n_routed_experts): the first present; another one present with a different value is an error.
int64_t aliased_integer(const JsonReader& r, std::initializer_list<const char*> keys,
                        int64_t fallback, int64_t min, int64_t max) {
  std::string first;
  int64_t value = fallback;
  for (const char* k : keys) {
    if (!r.has(k)) continue;
    const int64_t v = r.integer(k, min, max);
    if (first.empty()) {
      first = k;
      value = v;
    } else if (v != value) {
      throw Error(r.field(k), std::to_string(v) + " disagrees with " + first + " (" +
                                  std::to_string(value) + ")");
    }
  }
  return value;
}

// Keys of configs whose layers are not all attention + MLP blocks of one kind (hybrid
// Mamba/linear-attention models, gated attention outputs): parasol cannot express them.
constexpr const char* kUnsupportedHfKeys[] = {
    "attn_layer_period",   "attn_layer_offset",       "expert_layer_period",
    "expert_layer_offset", "hybrid_override_pattern", "layers_block_type",
    "linear_attn_config",  "full_attn_layers",        "block_types",
    "mamba_d_state",       "attn_output_gate"};

// The MoE layers of an HF config as a per-layer list, following each family's definition:
//   DeepSeek: l >= first_k_dense_replace and l % moe_layer_freq == 0 (freq may be a 0/1 list);
//   Qwen2/3-MoE: l not in mlp_only_layers and (l + 1) % decoder_sparse_step == 0;
//   mlp_layer_types: "sparse" / "dense" per layer; Mixtral, GPT-OSS: every layer.
// Then fits parasol's first_dense and every to it; a set that does not fit is an Error naming
// the key that made it.
void read_hf_moe_layers(const JsonReader& r, Model& m) {
  const int L = m.layers;
  std::vector<bool> moe(L, true);
  // The key an unexpressible set is blamed on: the most specific one that is not at its default.
  constexpr const char* kKeys[] = {"mlp_only_layers", "mlp_layer_types", "moe_layer_freq",
                                   "decoder_sparse_step", "first_k_dense_replace"};
  bool set[5] = {};
  auto blame = [&](const std::string& key) {
    for (int i = 0; i < 5; ++i) set[i] = set[i] || key == kKeys[i];
  };
  const int64_t first_k = r.integer_or("first_k_dense_replace", 0, 0, L);
  if (first_k > 0) blame("first_k_dense_replace");
  for (int l = 0; l < first_k; ++l) moe[l] = false;
  if (r.has("moe_layer_freq")) {
    if (r.raw("moe_layer_freq").is_array()) {
      const auto flags = r.array("moe_layer_freq");
      if (static_cast<int>(flags.size()) != L)
        throw Error(r.field("moe_layer_freq"), "has " + std::to_string(flags.size()) +
                                                   " entries for " + std::to_string(L) + " layers");
      for (int l = 0; l < L; ++l)
        if (element_integer(flags[l].first, *flags[l].second, 0, 1) == 0) moe[l] = false;
      blame("moe_layer_freq");
    } else {
      const int64_t freq = r.integer("moe_layer_freq", 1, L);
      if (freq != 1) blame("moe_layer_freq");
      for (int l = 0; l < L; ++l)
        if (l % freq != 0) moe[l] = false;
    }
  }
  const int64_t step = r.integer_or("decoder_sparse_step", 1, 1, L);
  if (step != 1) blame("decoder_sparse_step");
  for (int l = 0; l < L; ++l)
    if ((l + 1) % step != 0) moe[l] = false;
  if (r.has("mlp_only_layers")) {
    const auto only = r.array("mlp_only_layers");
    for (const auto& [field, v] : only) moe[element_integer(field, *v, 0, L - 1)] = false;
    if (!only.empty()) blame("mlp_only_layers");
  }
  if (r.has("mlp_layer_types")) {
    const auto types = r.array("mlp_layer_types");
    if (static_cast<int>(types.size()) != L)
      throw Error(r.field("mlp_layer_types"), "has " + std::to_string(types.size()) +
                                                  " entries for " + std::to_string(L) + " layers");
    for (int l = 0; l < L; ++l) {
      const std::string t = element_string(types[l].first, *types[l].second);
      if (t != "sparse" && t != "dense")
        throw Error(types[l].first, "'" + t + "' is not one of sparse|dense");
      if (t == "dense") moe[l] = false;
    }
    blame("mlp_layer_types");
  }
  std::string culprit = "num_hidden_layers";
  for (int i = 4; i >= 0; --i)
    if (set[i]) culprit = kKeys[i];
  std::vector<int> ids;
  for (int l = 0; l < L; ++l)
    if (moe[l]) ids.push_back(l);
  if (ids.empty()) throw Error(r.field(culprit), "leaves no MoE layer");
  // parasol's layers: l >= first_dense && l % every == every - 1. The first MoE layer fixes
  // first_dense's range; the gap between the first two fixes every (with one MoE layer, any
  // every that puts no second one before the last layer).
  auto fits = [&](int every, int first_dense) {
    for (int l = 0; l < L; ++l)
      if (moe[l] != (l >= first_dense && l % every == every - 1)) return false;
    return true;
  };
  std::vector<int> candidates;
  if (ids.size() >= 2) {
    candidates.push_back(ids[1] - ids[0]);
  } else {
    for (int e = 1; e <= ids[0] + 1; ++e)
      if ((ids[0] + 1) % e == 0 && ids[0] + e >= L) candidates.push_back(e);
  }
  for (int every : candidates) {
    if (ids[0] % every != every - 1) continue;
    const int first_dense = std::max(0, ids[0] - every + 1);
    if (fits(every, first_dense)) {
      m.moe.every = every;
      m.moe.first_dense = first_dense;
      return;
    }
  }
  std::string list;
  for (size_t i = 0; i < ids.size() && i < 8; ++i) list += (i ? ", " : "") + std::to_string(ids[i]);
  if (ids.size() > 8) list += ", ...";
  throw Error(r.field(culprit), "its MoE layers (" + list +
                                    ") are not expressible as parasol's moe.first_dense and "
                                    "moe.every (layer l is MoE when l >= first_dense and "
                                    "l % every == every - 1)");
}

// Sliding windows: layer_types ("sliding_attention" | "full_attention" per layer: GPT-OSS,
// newer transformers), else sliding_window on every layer unless use_sliding_window is false
// (Qwen writes a sliding_window it does not use). Qwen's max_window_layers split is refused.
void read_hf_windows(const JsonReader& r, Model& m) {
  const int L = m.layers;
  const int64_t window = r.integer_or("sliding_window", 0, 0, kMaxSeq);
  if (r.has("layer_types")) {
    const auto types = r.array("layer_types");
    if (static_cast<int>(types.size()) != L)
      throw Error(r.field("layer_types"), "has " + std::to_string(types.size()) + " entries for " +
                                              std::to_string(L) + " layers");
    std::vector<bool> full(L);
    for (int l = 0; l < L; ++l) {
      const std::string t = element_string(types[l].first, *types[l].second);
      if (t != "sliding_attention" && t != "full_attention")
        throw Error(types[l].first, "'" + t + "' is not one of sliding_attention|full_attention");
      full[l] = t == "full_attention";
    }
    if (std::find(full.begin(), full.end(), false) == full.end()) return;  // all full
    const int first_full =
        static_cast<int>(std::find(full.begin(), full.end(), true) - full.begin());
    if (window == 0)
      throw Error(r.field("sliding_window"), "is not given but layer_types has sliding layers");
    m.sliding_window = window;
    m.full_attention_every = first_full == L ? 0 : first_full + 1;
    for (int l = 0; l < L; ++l)
      if (full[l] == m.is_windowed_layer(l))
        throw Error(r.field("layer_types"),
                    "its full_attention layers are not every k-th layer (layer l full when "
                    "(l + 1) % k == 0), the pattern parasol expresses");
    return;
  }
  if (window == 0 || !r.boolean_or("use_sliding_window", true)) return;
  if (r.has("max_window_layers"))
    throw Error(r.field("max_window_layers"),
                "splits layers into windowed and full by max_window_layers, which parasol "
                "cannot express; give layer_types");
  m.sliding_window = window;
}

// MLA (DeepSeek-V2/V3): head_dim = qk_nope + qk_rope, kv_heads = heads. transformers writes
// "head_dim" = qk_rope_head_dim for these models, so head_dim is not read here.
void read_hf_mla(const JsonReader& r, Model& m) {
  m.mla.kv_lora_rank = r.integer("kv_lora_rank", 1, kMaxHidden);
  m.mla.q_lora_rank = r.integer_or("q_lora_rank", 0, 0, kMaxHidden);  // null: no compression
  m.mla.qk_nope_head_dim = r.integer("qk_nope_head_dim", 0, kMaxHidden);
  m.mla.qk_rope_head_dim = r.integer("qk_rope_head_dim", 0, kMaxHidden);
  m.mla.v_head_dim = r.integer("v_head_dim", 1, kMaxHidden);
  if (r.has("qk_head_dim") && r.integer("qk_head_dim", 1, kMaxHidden) != m.mla.qk_head_dim())
    throw Error(r.field("qk_head_dim"), "differs from qk_nope_head_dim + qk_rope_head_dim (" +
                                            std::to_string(m.mla.qk_head_dim()) + ")");
  if (m.linear_bias)
    throw Error(r.field("attention_bias"), "biases on MLA projections are not supported");
  m.head_dim = m.mla.qk_head_dim();
  m.kv_heads = m.heads;
}

// Routed experts, shared experts and which layers are MoE.
void read_hf_moe(const JsonReader& r, Model& m) {
  m.moe.experts = static_cast<int>(aliased_integer(
      r, {"num_local_experts", "num_experts", "n_routed_experts"}, 0, 1, kMaxExperts));
  if (m.moe.experts == 0) {
    for (const char* k :
         {"n_shared_experts", "num_shared_experts", "shared_expert_intermediate_size"})
      if (r.has(k) && !(r.raw(k).is_number() && r.raw(k).get<double>() == 0))
        throw Error(r.field(k), "is set but the config has no routed experts");
    m.moe = MoeSpec{};
    return;
  }
  m.moe.top_k = static_cast<int>(
      aliased_integer(r, {"num_experts_per_tok", "experts_per_token"}, 2, 1, m.moe.experts));
  // The expert MLP: moe_intermediate_size where the family has one (DeepSeek, Qwen-MoE), else
  // intermediate_size is the expert's (Mixtral, GPT-OSS).
  m.moe.expert_ffn = r.integer_or("moe_intermediate_size", m.ffn, 1, kMaxFfn);
  if (r.has("shared_expert_intermediate_size")) {
    // Qwen2-MoE: one shared expert of that hidden size (its sigmoid gate, h weights per MoE
    // layer, is not counted).
    const int64_t width = r.integer("shared_expert_intermediate_size", 0, kMaxFfn);
    const std::string n_key = first_present(r, {"n_shared_experts", "num_shared_experts"});
    if (!n_key.empty() && r.integer(n_key, 0, kMaxExperts) != (width > 0 ? 1 : 0))
      throw Error(r.field(n_key),
                  "with shared_expert_intermediate_size, parasol reads one shared expert of "
                  "that size; another count is ambiguous");
    m.moe.shared_experts = width > 0 ? 1 : 0;
    m.moe.shared_expert_ffn = width;
  } else {
    // DeepSeek: n_shared_experts experts of moe_intermediate_size each.
    m.moe.shared_experts = static_cast<int>(
        aliased_integer(r, {"n_shared_experts", "num_shared_experts"}, 0, 0, kMaxExperts));
  }
  read_hf_moe_layers(r, m);
}

}  // namespace

Model model_from_hf_config(const Json& j, const std::string& path) {
  JsonReader r(j, path);
  Model m;
  m.name = r.string_or("_name_or_path", r.string_or("model_type", "hf-model"));
  const std::string type = r.string_or("model_type", "");
  for (const char* key : kUnsupportedHfKeys)
    if (r.has(key) && !(r.raw(key).is_boolean() && !r.raw(key).get<bool>()))
      throw Error(r.field(key), "describes a layer structure parasol cannot express");
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
  } else {  // Llama / Mistral / Mixtral / Qwen / DeepSeek / GPT-OSS names
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
    // parasol's linear_bias puts biases on the attention and the MLP linears together.
    if (r.has("mlp_bias") && r.boolean("mlp_bias") != m.linear_bias)
      throw Error(r.field("mlp_bias"),
                  "differs from attention_bias; parasol's linear_bias covers both");
    if (type == "gpt_oss" && !m.linear_bias)  // GPT-OSS experts always have biases
      throw Error(r.field("attention_bias"),
                  "is false but gpt_oss experts have biases; parasol's linear_bias covers both");
    m.dropout = r.number_or("attention_dropout", 0, 0, 1) > 0;
    m.rope_theta = r.number_or("rope_theta", 10000, 1, 1e12);
    m.glu_clamp = r.number_or("swiglu_limit", 0, 0, 1e6);  // GPT-OSS
    read_rope_scaling(r, m, true);                         // GPT-OSS, DeepSeek-V3: YaRN
    // Qwen3's attention normalises each query and key head (modeling_qwen3.py q_norm, k_norm).
    m.qk_norm = type == "qwen3" || type == "qwen3_moe";
    if (r.has("kv_lora_rank")) read_hf_mla(r, m);
    read_hf_moe(r, m);
    read_hf_windows(r, m);
  }
  if (m.mla.enabled()) {
    // read_hf_mla set head_dim to qk_nope + qk_rope.
  } else if (r.has("head_dim")) {
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

namespace {
// The name a model file's path gives it: the file's stem less a "_config"/"-config"/".config"
// suffix ("gpt2_config.json" -> "gpt2"), or, for a file named config.json, the folder it is in
// ("hf/Llama-3-8B/config.json" -> "Llama-3-8B").
std::string name_from_path(const std::string& path) {
  const std::filesystem::path p = std::filesystem::absolute(path).lexically_normal();
  std::string stem = p.stem().string();
  if (stem == "config" && p.has_parent_path() && !p.parent_path().filename().empty())
    return p.parent_path().filename().string();
  for (const char* suffix : {"_config", "-config", ".config"})
    if (stem.size() > std::string_view(suffix).size() && stem.ends_with(suffix))
      return stem.substr(0, stem.size() - std::string_view(suffix).size());
  return stem;
}

// The non-empty string at `key` of the object `j`, or "".
std::string own_name(const Json& j, const char* key) {
  if (!j.is_object() || !j.contains(key) || !j[key].is_string()) return "";
  return j[key].get<std::string>();
}
}  // namespace

Model load_model(const std::string& preset_or_path) {
  if (!is_existing_file(preset_or_path)) {
    if (preset_or_path.find('/') != std::string::npos || preset_or_path.ends_with(".json"))
      throw Error("model", "no such file '" + preset_or_path + "'");
    return model_preset(preset_or_path);
  }
  Json j = read_json_file(preset_or_path);
  const bool hf = j.is_object() && !j.contains("layers") && looks_like_hf_config(j);
  Model m = hf ? model_from_hf_config(j, "model") : model_from_json(j, "model");
  // Named by the document when it names itself, else by its file.
  const std::string own = own_name(j, hf ? "_name_or_path" : "name");
  m.name = own.empty() ? name_from_path(preset_or_path) : own;
  return m;
}

}  // namespace parasol
