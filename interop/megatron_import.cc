// Import of a Megatron-LM job: the words of a launch script or argument list (shell quoting,
// continuations, bash arrays, simple variables), Megatron's flags read into a Model and a plan
// JSON. Flag names and defaults as in megatron.cc's source note (NVIDIA/Megatron-LM d98e8a6).
// Megatron-DeepSpeed's flags (deepspeedai/Megatron-DeepSpeed 4efb479 megatron/arguments.py:
// --num-key-value-heads L623, --rotary-position-embeddings-theta L635, --normalization
// layernorm|rmsnorm L647, --use-flash-attn-v2 L930, --use-flash-attn-triton L933,
// --zero-stage L1487, --deepspeed-activation-checkpointing L1524, --checkpoint-in-cpu L1530) and
// DeepSpeed's launcher (--num_nodes, --num_gpus, --hostfile: deepspeed/launcher/runner.py) are
// read as well, with the ds_config.json the launcher names.
#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdlib>
#include <map>
#include <regex>
#include <set>

#include "core/error.h"
#include "interop/deepspeed.h"
#include "interop/megatron.h"
#include "interop/megatron_internal.h"

namespace parasol::interop {

namespace {

bool is_identifier(const std::string& s) {
  if (s.empty() || std::isdigit(static_cast<unsigned char>(s[0]))) return false;
  return std::all_of(s.begin(), s.end(),
                     [](unsigned char c) { return std::isalnum(c) || c == '_'; });
}

// $X, ${X} and ${X:-default} replaced from `vars`; an unknown variable stays as written.
std::string expand(const std::string& w, const std::map<std::string, std::string>& vars) {
  std::string out;
  for (size_t i = 0; i < w.size();) {
    if (w[i] != '$' || i + 1 >= w.size()) {
      out += w[i++];
      continue;
    }
    std::string name, fallback;
    bool has_fallback = false;
    size_t end;
    if (w[i + 1] == '{') {
      end = w.find('}', i);
      if (end == std::string::npos) {
        out += w.substr(i);
        break;
      }
      std::string inner = w.substr(i + 2, end - i - 2);
      const size_t dash = inner.find(":-");
      if (dash != std::string::npos) {
        fallback = inner.substr(dash + 2);
        has_fallback = true;
        inner = inner.substr(0, dash);
      }
      name = inner;
      ++end;
    } else {
      end = i + 1;
      while (end < w.size() && (std::isalnum(static_cast<unsigned char>(w[end])) || w[end] == '_'))
        ++end;
      name = w.substr(i + 1, end - i - 1);
    }
    auto it = vars.find(name);
    if (it != vars.end())
      out += it->second;
    else if (has_fallback)
      out += fallback;
    else
      out += w.substr(i, end - i);
    i = end;
  }
  return out;
}

// The words of `text` as bash splits them (quotes, backslash continuations, comments), with
// array brackets, assignments and array references removed and simple variables expanded.
std::vector<std::string> words_of(const std::string& text) {
  std::vector<std::vector<std::string>> lines(1);
  std::string cur;
  bool in_word = false;
  char quote = 0;
  auto end_word = [&] {
    if (in_word) lines.back().push_back(cur);
    cur.clear();
    in_word = false;
  };
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    // A command substitution $(...) is one word, quotes and spaces inside it included.
    if (c == '$' && quote != '\'' && i + 1 < text.size() && text[i + 1] == '(') {
      size_t j = i;
      for (int depth = 0; j < text.size(); ++j) {
        if (text[j] == '(') ++depth;
        if (text[j] == ')' && --depth == 0) break;
      }
      cur += text.substr(i, j - i + 1);
      in_word = true;
      i = std::min(j, text.size() - 1);
      continue;
    }
    if (quote) {
      if (c == quote)
        quote = 0;
      else
        cur += c;
      continue;
    }
    if (c == '\\' && i + 1 < text.size()) {
      if (text[i + 1] == '\n') {
        end_word();
      } else {
        cur += text[i + 1];
        in_word = true;
      }
      ++i;
    } else if (c == '\'' || c == '"') {
      quote = c;
      in_word = true;
    } else if (c == '#' && !in_word) {
      while (i < text.size() && text[i] != '\n') ++i;
      end_word();
      lines.emplace_back();
    } else if (c == '\n' || c == ';') {
      end_word();
      lines.emplace_back();
    } else if (std::isspace(static_cast<unsigned char>(c))) {
      end_word();
    } else {
      cur += c;
      in_word = true;
    }
  }
  end_word();
  std::map<std::string, std::string> vars;
  std::vector<std::string> out;
  for (auto& line : lines) {
    size_t k = 0;
    if (!line.empty() && line[0] == "export") k = 1;
    for (; k < line.size(); ++k) {
      std::string w = line[k];
      const size_t eq = w.find('=');
      if (eq != std::string::npos && eq > 0 && is_identifier(w.substr(0, eq))) {
        const std::string value = w.substr(eq + 1);
        if (value.rfind("(", 0) == 0) {  // NAME=( ... ): the array's words follow
          w = value.substr(1);
          if (w.empty()) continue;
        } else {
          vars[w.substr(0, eq)] = expand(value, vars);
          continue;
        }
      }
      if (w == ")" || w == "(") continue;
      if (w.find("[@]") != std::string::npos || w.find("[*]") != std::string::npos) continue;
      if (w.size() > 1 && w.back() == ')' && w.find('(') == std::string::npos) w.pop_back();
      out.push_back(expand(w, vars));
    }
  }
  return out;
}

struct Flags {
  std::map<std::string, std::vector<std::string>> values;  // by name without the dashes
  bool has(const std::string& f) const { return values.count(f) > 0; }
  const std::vector<std::string>& all(const std::string& f) const { return values.at(f); }
  std::string one(const std::string& f) const {
    const auto& v = values.at(f);
    if (v.empty()) throw Error("--" + f, "needs a value");
    return v[0];
  }
  int64_t integer(const std::string& f, int64_t min = 1) const {
    const std::string s = one(f);
    int64_t v = 0;
    auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (ec != std::errc() || p != s.data() + s.size())
      throw Error("--" + f, "'" + s +
                                "' is not an integer (parasol expands only variables "
                                "assigned in the same text)");
    if (v < min) throw Error("--" + f, "must be >= " + std::to_string(min));
    return v;
  }
  int64_t integer_or(const std::string& f, int64_t fallback, int64_t min = 1) const {
    return has(f) ? integer(f, min) : fallback;
  }
  double number(const std::string& f) const {
    const std::string s = one(f);
    char* end = nullptr;
    const double v = std::strtod(s.c_str(), &end);
    if (s.empty() || end != s.c_str() + s.size())
      throw Error("--" + f, "'" + s + "' is not a number");
    return v;
  }
  std::string string_or(const std::string& f, const std::string& fallback) const {
    return has(f) ? one(f) : fallback;
  }
};

// Flags parasol reads.
const std::set<std::string> kRead = {
    // model
    "num-layers", "hidden-size", "ffn-hidden-size", "num-attention-heads", "group-query-attention",
    "num-query-groups", "kv-channels", "swiglu", "normalization", "position-embedding-type",
    "rotary-base", "max-position-embeddings", "untie-embeddings-and-output-weights",
    "disable-bias-linear", "attention-dropout", "hidden-dropout", "num-experts", "moe-router-topk",
    "moe-ffn-hidden-size", "moe-shared-expert-intermediate-size", "moe-layer-freq",
    "multi-latent-attention", "q-lora-rank", "kv-lora-rank", "qk-head-dim", "qk-pos-emb-head-dim",
    "v-head-dim", "vocab-size", "seq-length", "qk-layernorm", "rotary-scaling-factor", "mscale",
    "mscale-all-dim",
    // training
    "micro-batch-size", "global-batch-size", "bf16", "fp16", "fp8-format", "fp8-recipe",
    "grad-reduce-in-bf16", "fp8-param-gather", "attention-backend", "recompute-granularity",
    "recompute-method", "recompute-num-layers", "recompute-modules", "recompute-activations",
    "optimizer-cpu-offload", "optimizer-offload-fraction",
    // parallelism
    "tensor-model-parallel-size", "pipeline-model-parallel-size",
    "num-virtual-stages-per-pipeline-rank", "num-layers-per-virtual-pipeline-stage",
    "pipeline-model-parallel-layout", "decoder-first-pipeline-num-layers",
    "decoder-last-pipeline-num-layers", "account-for-embedding-in-pipeline-split",
    "account-for-loss-in-pipeline-split", "sequence-parallel", "context-parallel-size",
    "expert-model-parallel-size", "expert-tensor-parallel-size", "use-distributed-optimizer",
    "num-distributed-optimizer-instances", "use-megatron-fsdp", "data-parallel-sharding-strategy",
    "overlap-grad-reduce", "overlap-param-gather", "tp-comm-overlap",
    "overlap-moe-expert-parallel-comm", "moe-token-dispatcher-type", "moe-flex-dispatcher-backend",
    "moe-router-force-load-balancing", "moe-router-padding-for-fp8",
    "moe-router-padding-for-quantization", "moe-router-dtype", "use-tp-pp-dp-mapping",
    "cp-comm-type", "hierarchical-context-parallel-sizes", "cuda-graph-impl", "cuda-graph-modules",
    "cuda-graph-scope", "enable-cuda-graph", "external-cuda-graph",
    "no-check-for-nan-in-loss-and-grad", "log-params-norm", "log-num-zeros-in-grad",
    "deterministic-mode", "transformer-impl", "no-gradient-accumulation-fusion",
    "no-overlap-p2p-communication", "cross-entropy-loss-fusion",
    // Megatron-DeepSpeed
    "num-key-value-heads", "rotary-position-embeddings-theta", "use-rotary-position-embeddings",
    "use-flash-attn-v2", "use-flash-attn", "use-flash-attn-v1", "use-flash-attn-triton",
    "zero-stage", "deepspeed", "deepspeed_config", "deepspeed-activation-checkpointing",
    "checkpoint-in-cpu", "ds-sequence-parallel-size",
    // torchrun and DeepSpeed's launcher
    "nproc_per_node", "nproc-per-node", "nnodes", "num_nodes", "num_gpus"};

// Flags that do not change the plan: data, tokenizer, learning rate and optimizer
// hyper-parameters, logging, checkpoints, evaluation, torchrun's rendezvous, numerics that do
// not change the work (epsilons, init), kernel-fusion switches parasol does not model.
const std::set<std::string> kHarmless = {
    "mock-data", "split", "train-iters", "train-samples", "seed", "lr", "min-lr", "weight-decay",
    "clip-grad", "init-method-std", "make-vocab-size-divisible-by", "moe-grouped-gemm",
    "moe-aux-loss-coeff", "moe-z-loss-coeff", "use-mcore-models", "use-flash-attn", "num-workers",
    "use-checkpoint-args", "calculate-per-token-loss", "cross-entropy-fusion-impl", "manual-gc",
    "manual-gc-interval", "empty-unused-memory-level", "norm-epsilon", "attention-softmax-in-fp32",
    "apply-query-key-layer-scaling", "use-precision-aware-optimizer", "fp8-amax-history-len",
    "fp8-amax-compute-algo", "moe-permute-fusion", "moe-router-fusion",
    "moe-router-load-balancing-type", "moe-router-score-function", "moe-router-pre-softmax",
    "moe-router-enable-expert-bias", "moe-router-bias-update-rate",
    "moe-router-topk-scaling-factor", "moe-router-num-groups", "moe-router-group-topk",
    "moe-expert-capacity-factor", "moe-pad-expert-input-to-capacity", "moe-token-drop-policy",
    "moe-shared-expert-overlap", "no-masked-softmax-fusion", "no-bias-gelu-fusion",
    "no-bias-swiglu-fusion", "no-bias-dropout-fusion", "no-rope-fusion", "no-load-optim",
    "no-load-rng", "no-save-optim", "no-save-rng", "no-create-attention-mask-in-dataloader",
    "no-mmap-bin-files", "profile", "profile-step-start", "profile-step-end", "profile-ranks",
    "use-pytorch-profiler", "record-memory-history", "node_rank", "node-rank", "master_addr",
    "master-addr", "master_port", "master-port", "max_restarts", "max-restarts", "standalone",
    "ckpt-format", "dist-ckpt-strictness", "wandb-project", "wandb-exp-name", "wandb-save-dir",
    "bias-swiglu-fusion", "position-embedding-fusion", "vocab-file", "merge-file",
    // Megatron-DeepSpeed without pipeline stages (pp 1)
    "no-pipeline-parallel",
    // DeepSpeed's launcher
    "hostfile", "include", "exclude", "launcher", "ssh_port", "no_ssh_check"};
const char* kHarmlessPrefixes[] = {"log-",
                                   "tensorboard",
                                   "wandb-",
                                   "lr-",
                                   "adam-",
                                   "data-",
                                   "tokenizer-",
                                   "save",
                                   "load",
                                   "eval-",
                                   "exit-",
                                   "distributed-",
                                   "rdzv",
                                   "timing-",
                                   "ckpt-",
                                   "warmup",
                                   "weight-decay-",
                                   "start-weight-decay",
                                   "end-weight-decay",
                                   "async-save",
                                   "dataloader-"};

bool harmless(const std::string& f) {
  if (kHarmless.count(f)) return true;
  for (const char* p : kHarmlessPrefixes)
    if (f.rfind(p, 0) == 0) return true;
  return false;
}

// Megatron's flags and their values; torchrun's before the script too.
Flags parse_flags(const std::vector<std::string>& words) {
  Flags f;
  std::string current;
  for (const std::string& w : words) {
    if (w.size() > 2 && w.rfind("--", 0) == 0) {
      std::string name = w.substr(2);
      const size_t eq = name.find('=');
      std::vector<std::string> v;
      if (eq != std::string::npos) {
        v.push_back(name.substr(eq + 1));
        name = name.substr(0, eq);
      }
      // The data-parallel sharding strategy choices are Megatron's (arguments.py L3190).
      if (!kRead.count(name) && !harmless(name))
        throw Error("--" + name,
                    "is not a Megatron-LM flag parasol reads; it may change the "
                    "plan, so remove it to import the rest");
      f.values[name] = v;
      current = eq == std::string::npos ? name : "";
    } else if (w.size() > 3 && w.compare(w.size() - 3, 3, ".py") == 0) {
      current.clear();  // the script: torchrun's flags end here
    } else if (!current.empty()) {
      f.values[current].push_back(w);
    }
  }
  return f;
}

// Megatron's pipeline layout string (pipeline_parallel_layer_layout.py parse_str_to_list) as the
// decoder layers of each virtual stage.
std::vector<int> layout_layers(std::string s, const std::string& flag) {
  s.erase(std::remove(s.begin(), s.end(), ','), s.end());
  s = std::regex_replace(s, std::regex(R"(\s)"), "");
  for (const std::regex& re : {std::regex(R"(\(([^)]+)\)\*(\d+))"), std::regex(R"((.)\*(\d+))")}) {
    std::smatch m;
    std::string out;
    auto it = s.cbegin();
    while (std::regex_search(it, s.cend(), m, re)) {
      out.append(it, m[0].first);
      const int n = std::stoi(m[2].str());
      if (n > 100000) throw Error(flag, "repeat count " + m[2].str() + " is too large");
      for (int i = 0; i < n; ++i) out += m[1].str();
      it = m[0].second;
    }
    out.append(it, s.cend());
    s = out;
  }
  std::vector<int> stages(1, 0);
  std::string flat;
  for (char c : s) {
    if (c == '|') {
      stages.push_back(0);
    } else if (c == 't') {
      ++stages.back();
      flat += c;
    } else if (c == 'E' || c == 'L') {
      flat += c;
    } else {
      throw Error(flag, std::string("'") + c +
                            "' is not a layer parasol places (E, t, L; no MTP layers 'm')");
    }
  }
  if (flat.empty() || flat.front() != 'E' || flat.back() != 'L' ||
      std::count(flat.begin(), flat.end(), 'E') != 1 ||
      std::count(flat.begin(), flat.end(), 'L') != 1)
    throw Error(flag, "must start with the embedding E and end with the loss L, once each");
  return stages;
}

// A moe_layer_freq list expression ("([0]*3+[1]*58)", "[1,0,1,0]") as 0/1 per layer.
struct PatternParser {
  const std::string& s;
  size_t i = 0;
  std::string flag;
  void skip() {
    while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
  }
  [[noreturn]] void fail() { throw Error(flag, "'" + s + "' is not a list expression"); }
  int64_t number() {
    skip();
    size_t j = i;
    while (j < s.size() && std::isdigit(static_cast<unsigned char>(s[j]))) ++j;
    if (j == i || j - i > 6) fail();
    const int64_t v = std::stoll(s.substr(i, j - i));
    i = j;
    return v;
  }
  std::vector<int> atom() {
    skip();
    std::vector<int> v;
    if (i < s.size() && s[i] == '[') {
      ++i;
      skip();
      while (i < s.size() && s[i] != ']') {
        v.push_back(static_cast<int>(number()));
        skip();
        if (i < s.size() && s[i] == ',') ++i;
        skip();
      }
      if (i >= s.size()) fail();
      ++i;
    } else if (i < s.size() && s[i] == '(') {
      ++i;
      v = expr();
      skip();
      if (i >= s.size() || s[i] != ')') fail();
      ++i;
    } else {
      fail();
    }
    return v;
  }
  std::vector<int> term() {
    std::vector<int> v = atom();
    for (skip(); i < s.size() && s[i] == '*'; skip()) {
      ++i;
      const int64_t n = number();
      if (n * static_cast<int64_t>(v.size()) > 1000000) fail();
      std::vector<int> r;
      for (int64_t k = 0; k < n; ++k) r.insert(r.end(), v.begin(), v.end());
      v = r;
    }
    return v;
  }
  std::vector<int> expr() {
    std::vector<int> v = term();
    for (skip(); i < s.size() && s[i] == '+'; skip()) {
      ++i;
      std::vector<int> r = term();
      v.insert(v.end(), r.begin(), r.end());
    }
    return v;
  }
};

// Sets m.moe.every and first_dense from --moe-layer-freq.
void read_moe_layers(const Flags& f, Model& m) {
  if (!f.has("moe-layer-freq")) return;
  const std::string flag = "--moe-layer-freq";
  const std::string s = f.one("moe-layer-freq");
  std::vector<int> pattern;
  if (s.find('[') == std::string::npos) {
    const int64_t n = f.integer("moe-layer-freq");
    for (int l = 0; l < m.layers; ++l) pattern.push_back(l % n == 0 ? 1 : 0);
  } else {
    PatternParser p{s, 0, flag};
    pattern = p.expr();
    p.skip();
    if (p.i != s.size()) p.fail();
  }
  if (static_cast<int>(pattern.size()) != m.layers)
    throw Error(flag, "lists " + std::to_string(pattern.size()) + " layers, not --num-layers " +
                          std::to_string(m.layers));
  for (int every = 1; every <= m.layers; ++every)
    for (int first = 0; first < m.layers; ++first) {
      m.moe.every = every;
      m.moe.first_dense = first;
      bool same = true;
      for (int l = 0; l < m.layers && same; ++l) same = (m.is_moe_layer(l) ? 1 : 0) == pattern[l];
      if (same) return;
    }
  throw Error(flag, "'" + s +
                        "': parasol's MoE layers are the layers l >= first_dense with "
                        "l % every == every - 1; this pattern is not one of them");
}

Model read_model(const Flags& f, const std::string& name) {
  for (const char* req : {"num-layers", "hidden-size", "num-attention-heads", "vocab-size"})
    if (!f.has(req)) throw Error(std::string("--") + req, "is required to import the model");
  Model m;
  m.name = name;
  m.layers = static_cast<int>(f.integer("num-layers"));
  m.hidden = f.integer("hidden-size");
  m.heads = static_cast<int>(f.integer("num-attention-heads"));
  m.vocab = f.integer("vocab-size");
  m.activation = f.has("swiglu") ? Activation::kSwiglu : Activation::kGelu;
  // Megatron's default when --ffn-hidden-size is not given (arguments.py L1320-1329).
  m.ffn =
      f.integer_or("ffn-hidden-size", m.activation == Activation::kSwiglu
                                          ? static_cast<int64_t>((4 * m.hidden * 2 / 3) / 64) * 64
                                          : 4 * m.hidden);
  if (!f.has("max-position-embeddings") && !f.has("seq-length"))
    throw Error("--seq-length", "is required (or --max-position-embeddings)");
  m.seq_len = f.has("max-position-embeddings") ? f.integer("max-position-embeddings")
                                               : f.integer("seq-length");
  // Megatron-LM spells them LayerNorm|RMSNorm, Megatron-DeepSpeed layernorm|rmsnorm.
  const std::string norm = f.string_or("normalization", "LayerNorm");
  if (norm == "RMSNorm" || norm == "rmsnorm")
    m.norm = Norm::kRmsNorm;
  else if (norm == "LayerNorm" || norm == "layernorm")
    m.norm = Norm::kLayerNorm;
  else
    throw Error("--normalization", "'" + norm + "' is not one of LayerNorm|RMSNorm");
  m.qk_norm = f.has("qk-layernorm");  // per-head norms of q and k (Qwen3; Model::qk_norm)
  std::string pos = f.string_or("position-embedding-type", "learned_absolute");
  if (f.has("use-rotary-position-embeddings")) pos = "rope";
  if (pos == "learned_absolute") {
    m.learned_positions = true;
  } else if (pos == "rope") {
    m.learned_positions = false;
    m.rope_theta = f.has("rotary-base") ? f.number("rotary-base")
                   : f.has("rotary-position-embeddings-theta")
                       ? f.number("rotary-position-embeddings-theta")
                       : 10000;
  } else {
    throw Error("--position-embedding-type", "'" + pos + "' is not one of learned_absolute|rope");
  }
  m.tied_embeddings = !f.has("untie-embeddings-and-output-weights");
  m.linear_bias = !f.has("disable-bias-linear");
  // Megatron's dropouts default to 0.1 (transformer_config.py).
  const double ad = f.has("attention-dropout") ? f.number("attention-dropout") : 0.1;
  const double hd = f.has("hidden-dropout") ? f.number("hidden-dropout") : 0.1;
  m.dropout = ad > 0 || hd > 0;
  if (f.has("multi-latent-attention")) {
    // Defaults of arguments.py's "mla" group.
    m.mla.q_lora_rank = f.has("q-lora-rank") ? f.integer("q-lora-rank") : 0;
    m.mla.kv_lora_rank = f.integer_or("kv-lora-rank", 32);
    m.mla.qk_nope_head_dim = f.integer_or("qk-head-dim", 128);
    m.mla.qk_rope_head_dim = f.integer_or("qk-pos-emb-head-dim", 64);
    m.mla.v_head_dim = f.integer_or("v-head-dim", 128);
    // YaRN (rope_type yarn, MLA's default) scales only with --rotary-scaling-factor > 1 (default
    // 1.0); mscale 1.0 and mscale_all_dim 0.0 by default, the pretraining context
    // MLATransformerConfig's original_max_position_embeddings (4096), which has no flag.
    const double factor = f.has("rotary-scaling-factor") ? f.number("rotary-scaling-factor") : 1;
    if (factor > 1)
      m.yarn = {factor, 4096, f.has("mscale") ? f.number("mscale") : 1.0,
                f.has("mscale-all-dim") ? f.number("mscale-all-dim") : 0.0};
    m.head_dim = m.mla.qk_head_dim();
    m.kv_heads = m.heads;
  } else {
    m.kv_heads = f.has("group-query-attention")
                     ? static_cast<int>(f.integer_or("num-query-groups", 1))
                     : m.heads;
    // Megatron-DeepSpeed: GQA whenever --num-key-value-heads differs from the heads.
    if (f.has("num-key-value-heads"))
      m.kv_heads = static_cast<int>(f.integer("num-key-value-heads"));
    if (m.hidden % m.heads != 0 && !f.has("kv-channels"))
      throw Error("--kv-channels",
                  "is required when --num-attention-heads does not divide "
                  "--hidden-size");
    m.head_dim = f.integer_or("kv-channels", m.hidden / m.heads);
  }
  if (f.has("num-experts")) {
    m.moe.experts = static_cast<int>(f.integer("num-experts"));
    m.moe.top_k = static_cast<int>(f.integer_or("moe-router-topk", 2));
    m.moe.expert_ffn = f.integer_or("moe-ffn-hidden-size", m.ffn);
    if (f.has("moe-shared-expert-intermediate-size")) {
      const int64_t s = f.integer("moe-shared-expert-intermediate-size");
      m.moe.shared_experts = 1;
      m.moe.shared_expert_ffn = s == m.moe.expert_ffn ? 0 : s;
    }
    read_moe_layers(f, m);
  }
  validate_model(m, "model");
  return m;
}

Json read_plan(const Flags& f, const Model& m, int gpus) {
  Json j = Json::object();
  const int64_t tp = f.integer_or("tensor-model-parallel-size", 1);
  const int64_t pp = f.integer_or("pipeline-model-parallel-size", 1);
  const int64_t cp = f.integer_or("context-parallel-size", 1);
  j["tp"] = tp;
  j["pp"] = pp;
  j["cp"] = cp;
  j["ep"] = f.integer_or("expert-model-parallel-size", 1);
  if (f.has("expert-tensor-parallel-size") && f.integer("expert-tensor-parallel-size") != tp)
    j["etp"] = f.integer("expert-tensor-parallel-size");
  j["sp"] = f.has("sequence-parallel");
  int64_t dp = 0;
  if (gpus > 0) {
    if (gpus % (tp * pp * cp) != 0)
      throw Error("--nnodes", std::to_string(gpus) + " GPUs do not split into tp x pp x cp = " +
                                  std::to_string(tp * pp * cp));
    dp = gpus / (tp * pp * cp);
    j["dp"] = dp;
  }
  // Pipeline layout. Megatron's embedding/loss accounting (store_true TransformerConfig fields)
  // goes with neither a layout nor first/last stage counts (transformer_config.py L2229-2261).
  const bool embedding_in_split = f.has("account-for-embedding-in-pipeline-split");
  const bool loss_in_split = f.has("account-for-loss-in-pipeline-split");
  const int accounted = int{embedding_in_split} + int{loss_in_split};
  if (accounted > 0) {
    const std::string flag = embedding_in_split ? "--account-for-embedding-in-pipeline-split"
                                                : "--account-for-loss-in-pipeline-split";
    if (f.has("pipeline-model-parallel-layout"))
      throw Error(flag, "Megatron refuses it with --pipeline-model-parallel-layout");
    if (f.has("decoder-first-pipeline-num-layers") || f.has("decoder-last-pipeline-num-layers"))
      throw Error(flag, "Megatron refuses it with --decoder-first/last-pipeline-num-layers");
    j["account_for_embedding_in_pipeline_split"] = embedding_in_split;
    j["account_for_loss_in_pipeline_split"] = loss_in_split;
  }
  int64_t vpp = 1;
  if (f.has("pipeline-model-parallel-layout")) {
    const std::vector<int> stages =
        layout_layers(f.one("pipeline-model-parallel-layout"), "--pipeline-model-parallel-layout");
    if (stages.size() % pp != 0)
      throw Error(
          "--pipeline-model-parallel-layout",
          std::to_string(stages.size()) + " stages are not a multiple of pp " + std::to_string(pp));
    vpp = static_cast<int64_t>(stages.size()) / pp;
    j["stage_layers"] = stages;
  } else if (f.has("num-virtual-stages-per-pipeline-rank")) {
    vpp = f.integer("num-virtual-stages-per-pipeline-rank");
  } else if (f.has("num-layers-per-virtual-pipeline-stage")) {
    // arguments.py L953-979: not with first/last stage counts; the layers per stage count the
    // accounted embedding and loss.
    if (f.has("decoder-first-pipeline-num-layers") || f.has("decoder-last-pipeline-num-layers"))
      throw Error("--num-layers-per-virtual-pipeline-stage",
                  "Megatron refuses it with uneven first/last stages (use "
                  "--num-virtual-stages-per-pipeline-rank)");
    const int64_t n = f.integer("num-layers-per-virtual-pipeline-stage");
    const int64_t slots = m.layers + accounted;
    if (n < 1 || slots % (n * pp) != 0)
      throw Error("--num-layers-per-virtual-pipeline-stage",
                  "pp x this does not divide --num-layers" +
                      std::string(accounted > 0 ? " plus the accounted embedding/loss" : ""));
    vpp = slots / (n * pp);
  }
  if (vpp > 1) j["vpp"] = vpp;
  // Megatron-Core's pipeline exchanges end with torch.cuda.synchronize() where they are batched
  // (batch_p2p_comm = not overlap_p2p_comm, argument_utils.py L307; overlap_p2p_comm is on by
  // default and forced off without virtual stages, arguments.py L1010-1012; batch_p2p_sync on:
  // p2p_communication.py L421-424 @d98e8a6): Plan::p2p_sync. Megatron-DeepSpeed under
  // --deepspeed pipelines with DeepSpeed's PipelineEngine instead, which has no such sync.
  if (pp > 1 && !f.has("deepspeed") && (vpp == 1 || f.has("no-overlap-p2p-communication")))
    j["p2p_sync"] = true;
  if (f.has("decoder-first-pipeline-num-layers"))
    j["first_stage_layers"] = f.integer("decoder-first-pipeline-num-layers");
  if (f.has("decoder-last-pipeline-num-layers"))
    j["last_stage_layers"] = f.integer("decoder-last-pipeline-num-layers");
  // --cp-comm-type: one type for every layer (arguments.py: nargs='+', one value per layer
  // allowed); a2a+p2p needs --hierarchical-context-parallel-sizes [a2a, p2p] whose product is
  // the context-parallel size (arguments.py's checks).
  if (f.has("cp-comm-type")) {
    const std::string type = f.one("cp-comm-type");
    for (const std::string& t : f.all("cp-comm-type"))
      if (t != type)
        throw Error("--cp-comm-type", "one type per layer ('" + type + "', '" + t +
                                          "'): parasol gives every layer the same exchange");
    j["cp_comm_type"] = cp_comm_type_name(parse_cp_comm_type(type, "--cp-comm-type"));
  }
  if (f.has("hierarchical-context-parallel-sizes")) {
    const auto& sizes = f.all("hierarchical-context-parallel-sizes");
    int64_t product = 1;
    for (const std::string& v : sizes) {
      int64_t n = 0;
      auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
      if (ec != std::errc() || p != v.data() + v.size() || n < 1)
        throw Error("--hierarchical-context-parallel-sizes", "'" + v + "' is not a size >= 1");
      product *= n;
    }
    if (sizes.size() != 2 || product != cp)
      throw Error("--hierarchical-context-parallel-sizes",
                  "must be two sizes (all-to-all, ring) whose product is "
                  "--context-parallel-size (" +
                      std::to_string(cp) + ")");
    if (f.string_or("cp-comm-type", "p2p") == "a2a+p2p") j["cp_a2a_size"] = std::stoll(sizes[0]);
  } else if (f.string_or("cp-comm-type", "p2p") == "a2a+p2p") {
    throw Error("--hierarchical-context-parallel-sizes",
                "must be set when a2a+p2p is used in cp comm (Megatron's own check)");
  }
  // Sharding.
  int zero = f.has("use-distributed-optimizer") ? 1 : 0;
  if (f.has("use-megatron-fsdp")) {
    const std::string s = f.string_or("data-parallel-sharding-strategy", "optim_grads_params");
    if (s == "optim_grads_params")
      zero = 3;
    else if (s == "optim_grads")
      zero = 2;
    else if (s == "optim")
      zero = 1;
    else if (s == "no_shard")
      zero = 0;
    else
      throw Error("--data-parallel-sharding-strategy",
                  "'" + s + "' is not one of no_shard|optim|optim_grads|optim_grads_params");
  }
  j["zero"] = zero;
  if (f.has("num-distributed-optimizer-instances")) {
    const int64_t k = f.integer("num-distributed-optimizer-instances");
    if (k > 1) {
      if (zero != 1)
        throw Error("--num-distributed-optimizer-instances", "needs --use-distributed-optimizer");
      if (dp == 0)
        throw Error("--num-distributed-optimizer-instances",
                    "needs the GPU count (torchrun's --nproc_per_node and --nnodes, or --gpus) to "
                    "size the shards");
      if ((dp * cp) % k != 0)
        throw Error("--num-distributed-optimizer-instances",
                    "does not divide the data-parallel group dp x cp = " + std::to_string(dp * cp));
      j["shard_degree"] = dp * cp / k;
    }
  }
  j["overlap_grad_reduce"] = f.has("overlap-grad-reduce");
  // Without sharding there is no parameter gather: the field keeps parasol's default.
  if (zero >= 1) j["overlap_param_gather"] = f.has("overlap-param-gather");
  if (f.has("tp-comm-overlap")) j["tp_comm_overlap"] = true;
  if (f.has("overlap-moe-expert-parallel-comm")) j["ep_comm_overlap"] = true;
  if (f.has("moe-token-dispatcher-type")) {
    const std::string d = f.one("moe-token-dispatcher-type");
    if (d == "flex") {
      const std::string b = f.string_or("moe-flex-dispatcher-backend", "deepep");
      if (b != "deepep" && b != "hybridep")
        throw Error("--moe-flex-dispatcher-backend",
                    "parasol models deepep and hybridep, not " + b);
      j["moe_dispatcher"] = "deepep";
    } else if (d == "allgather") {
      j["moe_dispatcher"] = "allgather";
    } else if (d != "alltoall") {
      throw Error("--moe-token-dispatcher-type",
                  "parasol models alltoall, allgather and flex (DeepEP), not " + d);
    }
  }
  if (f.has("moe-router-force-load-balancing")) j["moe_force_balance"] = "random";
  // The router's dtype (router.py: its logits, and the probabilities the rows carry, in it).
  if (f.has("moe-router-dtype")) {
    const std::string d = f.one("moe-router-dtype");
    if (d == "fp32")
      j["moe_router_fp32"] = true;
    else
      throw Error("--moe-router-dtype",
                  "parasol models the router in fp32 or the activations' "
                  "dtype (no flag), not " +
                      d);
  }
  // Megatron-Core scales each routed row by its router probability inside the experts
  // (experts.py TEGroupedMLP.forward: bias_act_func's permuted_probs, or the input under
  // --moe-apply-probs-on-input) and no dispatcher passes the probabilities to unpermute
  // (token_dispatcher.py L346, L891, L1460 @d98e8a6): no flag turns it off, so every Megatron-Core
  // MoE job is Plan::moe_probs_in_experts. Megatron-DeepSpeed's MoE (--deepspeed) is not.
  if (f.has("num-experts") && f.integer("num-experts") > 1 && !f.has("deepspeed"))
    j["moe_probs_in_experts"] = true;
  // Expert biases under the grouped GEMM (TEGroupedMLP, --moe-grouped-gemm; biases are on unless
  // --disable-bias-linear): Megatron adds the experts' fc2 bias in a Python loop over the local
  // experts (experts.py TEGroupedMLP._apply_bias), which the plan prices (Plan::expert_bias_loop).
  if (f.has("num-experts") && f.has("moe-grouped-gemm") && !f.has("disable-bias-linear"))
    j["expert_bias_loop"] = true;
  // Under fp8 the grouped experts pad each local expert's rows to the quantization alignment with
  // Transformer Engine's Fp8Padding / Fp8Unpadding copies unless the router pads them or
  // HybridEP's dispatch does (experts.py TEGroupedMLP.forward, moe_utils.py
  // skip_routed_expert_padding @4415119): Plan::expert_fp8_padding.
  const bool hybridep = f.has("moe-token-dispatcher-type") &&
                        f.one("moe-token-dispatcher-type") == "flex" &&
                        f.string_or("moe-flex-dispatcher-backend", "deepep") == "hybridep";
  if (f.has("num-experts") && f.has("moe-grouped-gemm") && f.has("fp8-format") && !hybridep &&
      !f.has("moe-router-padding-for-fp8") && !f.has("moe-router-padding-for-quantization"))
    j["expert_fp8_padding"] = true;
  if (f.has("use-tp-pp-dp-mapping")) j["rank_order"] = rank_order_name(kMegatronTpPpDpOrder);
  // The host (core/host_issue.h): Megatron's CUDA graphs (transformer_config.py: --cuda-graph-impl
  // local|transformer_engine graph each layer, full_iteration the forward and backward; the old
  // --enable-cuda-graph / --external-cuda-graph spellings map to local / transformer_engine) and
  // its NaN/Inf check of the loss (on unless --no-check-for-nan-in-loss-and-grad).
  if (f.has("no-check-for-nan-in-loss-and-grad")) j["nan_check"] = false;
  // The per-step statistics it logs (training/config/training_config.py: both off by default).
  if (f.has("log-params-norm")) j["log_params_norm"] = true;
  if (f.has("log-num-zeros-in-grad")) j["log_num_zeros_in_grad"] = true;
  // PyTorch's deterministic algorithms (--deterministic-mode, model_parallel_config.py L229).
  if (f.has("deterministic-mode")) j["deterministic"] = true;
  // --no-gradient-accumulation-fusion: weight gradients added into main_grad by DDP's hook.
  if (f.has("no-gradient-accumulation-fusion")) j["gradient_accumulation_fusion"] = false;
  // The loss: Megatron-Core's fused vocab-parallel cross entropy only under
  // --cross-entropy-loss-fusion (model_parallel_config.py L320 @d98e8a6: off by default);
  // without it the unfused tensor_parallel.vocab_parallel_cross_entropy (core/unfused_xent.h).
  // Megatron-DeepSpeed (--deepspeed) has no such flag and is left as the DeepSpeed export writes
  // it (the fused loss): its own loss, the same unfused code, is not read yet.
  if (!f.has("cross-entropy-loss-fusion") && !f.has("deepspeed"))
    j["cross_entropy_loss_fusion"] = false;
  // The modules its layers call (--transformer-impl): Transformer Engine's or Megatron's own
  // (local) where the arguments name them; an argument list without the flag (whose Megatron
  // default is transformer_engine) stays torch, so that a plan exported without it reads back as
  // it was.
  if (f.has("transformer-impl")) {
    const std::string t = f.one("transformer-impl");
    if (t == "transformer_engine" || t == "local") j["transformer_impl"] = t;
  }
  if (f.has("enable-cuda-graph") || f.has("external-cuda-graph")) j["cuda_graphs"] = "layers";
  if (f.has("cuda-graph-impl")) {
    const std::string g = f.one("cuda-graph-impl");
    if (g == "local" || g == "transformer_engine") {
      j["cuda_graphs"] = "layers";
    } else if (g == "full_iteration") {
      j["cuda_graphs"] = "full_iteration";
    } else if (g != "none") {
      throw Error("--cuda-graph-impl",
                  "parasol models none, local, transformer_engine and full_iteration, not " + g);
    }
  }
  // Batch and sequence.
  j["mbs"] = f.integer_or("micro-batch-size", 1);
  if (f.has("global-batch-size")) j["gbs"] = f.integer("global-batch-size");
  if (f.has("seq-length") && f.integer("seq-length") != m.seq_len)
    j["seq"] = f.integer("seq-length");
  // Precision.
  std::string precision = "fp32";
  if (f.has("bf16")) precision = "bf16";
  if (f.has("fp16")) precision = "fp16";
  if (f.has("fp8-format")) precision = "fp8";
  j["precision"] = precision;
  // Transformer Engine's fp8 recipe (Plan::fp8_recipe; Megatron's default "delayed").
  if (f.has("fp8-format") && f.has("fp8-recipe")) {
    const std::string recipe = f.string_or("fp8-recipe", "delayed");
    if (recipe != "delayed" && recipe != "tensorwise" && recipe != "mxfp8" && recipe != "blockwise")
      throw Error("--fp8-recipe",
                  "'" + recipe + "' is not one of delayed|tensorwise|mxfp8|blockwise");
    if (recipe != "delayed") j["fp8_recipe"] = recipe;
  }
  if (f.has("grad-reduce-in-bf16")) j["grad_reduce_dtype"] = "bf16";
  // --fp8-param-gather: Megatron refuses it without fp8 (TransformerConfig "fp8_param must be
  // used together with fp8 mode") and without the distributed optimizer or Megatron FSDP
  // (arguments.py @d98e8a6 L1095).
  if (f.has("fp8-param-gather")) {
    if (!f.has("fp8-format"))
      throw Error("--fp8-param-gather",
                  "fp8_param must be used together with fp8 mode "
                  "(--fp8-format; Megatron's own check)");
    if (!f.has("use-distributed-optimizer") && !f.has("use-megatron-fsdp"))
      throw Error("--fp8-param-gather",
                  "only supported with the distributed optimizer (--use-distributed-optimizer) "
                  "or Megatron FSDP (Megatron's own check)");
    j["fp8_param_gather"] = true;
  }
  const std::string backend = f.string_or("attention-backend", "auto");
  if (backend == "unfused" || backend == "local") {
    j["flash_attention"] = false;
  } else if (backend == "fused") {
    j["attention_kernel"] = "cudnn";
  } else if (backend != "flash" && backend != "auto") {
    throw Error("--attention-backend",
                "'" + backend + "' is not one of flash|fused|unfused|local|auto");
  }
  // Recompute.
  std::string granularity = f.string_or("recompute-granularity", "");
  if (granularity.empty() && f.has("recompute-activations")) granularity = "selective";
  if (granularity == "selective") {
    j["recompute"] = "selective";
    if (f.has("recompute-modules")) {
      if (f.all("recompute-modules").empty()) throw Error("--recompute-modules", "needs a value");
      j["recompute_modules"] = f.all("recompute-modules");
    }
  } else if (granularity == "full") {
    j["recompute"] = "full";
    const std::string method = f.string_or("recompute-method", "");
    const int64_t n = f.integer_or("recompute-num-layers", 1, 0);
    if (method == "block") {
      j["recompute_layers"] = n;
    } else if (method == "uniform") {
      if (n != 1)
        throw Error("--recompute-num-layers",
                    "uniform recompute of groups of " + std::to_string(n) +
                        " layers is not a parasol plan (uniform with 1: every layer; block k: "
                        "the first k)");
    } else {
      throw Error("--recompute-method", "full recompute needs uniform or block");
    }
  } else if (!granularity.empty()) {
    throw Error("--recompute-granularity", "'" + granularity + "' is not one of full|selective");
  }
  if (f.has("optimizer-cpu-offload")) {
    if (f.has("optimizer-offload-fraction") && f.number("optimizer-offload-fraction") != 1.0)
      throw Error("--optimizer-offload-fraction",
                  "parasol offloads the whole optimizer (fraction 1.0)");
    j["offload"] = "optimizer";
    // HybridDeviceOptimizer steps the offloaded parameters with torch.optim's AdamW on the CPU
    // (megatron/core/optimizer/cpu_offloading/hybrid_optimizer.py).
    j["cpu_optimizer"] = "torch";
  }
  return j;
}

// Megatron-DeepSpeed under --deepspeed: the fields the ds_config.json holds (import_deepspeed)
// replace those of the arguments; where both say them they must agree.
void merge_deepspeed(const Flags& f, const Json& config, const ImportedJob& job, Json& j) {
  // DeepSpeed's Ulysses sequence parallelism: the plan's cp with cp_comm_type a2a
  // (import_deepspeed checks what Megatron-DeepSpeed allows beside it).
  const int64_t ulysses = f.integer_or("ds-sequence-parallel-size", 1);
  if (ulysses < 1 || ulysses > (1 << 20))
    throw Error("--ds-sequence-parallel-size",
                "'" + f.one("ds-sequence-parallel-size") + "' is not a size >= 1");
  if (ulysses > 1 && j["cp"].get<int64_t>() > 1)
    throw Error("--ds-sequence-parallel-size",
                "Megatron-DeepSpeed's sequence parallelism and --context-parallel-size are two "
                "ways to split the sequence; give one");
  if (job.gpus <= 0)
    throw Error("--gpus",
                "is required: the DeepSpeed config's batch keys count data-parallel ranks and "
                "the launcher gives no --num_nodes and --num_gpus");
  const int64_t tp = j["tp"].get<int64_t>(), pp = j["pp"].get<int64_t>();
  const Json ds = import_deepspeed(config, job.gpus,
                                   {static_cast<int>(tp), static_cast<int>(pp), j["sp"].get<bool>(),
                                    static_cast<int>(ulysses)})
                      .plan;
  if (f.has("zero-stage") && f.integer("zero-stage", 0) != ds["zero"].get<int64_t>())
    throw Error("--zero-stage", "is " + f.one("zero-stage") +
                                    " but the DeepSpeed config's "
                                    "zero_optimization.stage is " +
                                    ds["zero"].dump());
  const std::string precision = ds["precision"].get<std::string>();
  for (const char* flag : {"bf16", "fp16"})
    if (f.has(flag) && precision != flag)
      throw Error(std::string("--") + flag,
                  "the DeepSpeed config trains in " + precision + ", not " + flag);
  if (f.has("micro-batch-size") && f.integer("micro-batch-size") != ds["mbs"].get<int64_t>())
    throw Error("--micro-batch-size",
                "differs from the DeepSpeed config's "
                "train_micro_batch_size_per_gpu " +
                    ds["mbs"].dump());
  if (f.has("global-batch-size") && f.integer("global-batch-size") != ds["gbs"].get<int64_t>())
    throw Error("--global-batch-size",
                "differs from the DeepSpeed config's train_batch_size " + ds["gbs"].dump());
  if (ds["cp"].get<int64_t>() > 1) {  // Ulysses, from the flag or the config
    if (j["cp"].get<int64_t>() > 1)
      throw Error("--context-parallel-size",
                  "the DeepSpeed config's sequence_parallel_size splits the sequence already");
    if (!(f.has("use-flash-attn-v2") || f.has("use-flash-attn") || f.has("use-flash-attn-v1")))
      throw Error("--ds-sequence-parallel-size",
                  "parasol prices all-to-all (Ulysses) attention with a fused kernel on each "
                  "rank's heads; add --use-flash-attn-v2");
    for (const char* key : {"cp", "cp_comm_type", "dp"}) j[key] = ds[key];
  }
  for (const char* key :
       {"zero", "overlap_grad_reduce", "overlap_param_gather", "offload", "precision", "reshard",
        "zero3_unit", "zero3_prefetch_bucket", "zero3_max_live_parameters",
        "zero3_max_reuse_distance", "zero3_reduce_bucket", "zero3_param_persistence_threshold",
        "shard_degree", "grad_reduce_dtype", "optimizer_dtype", "mbs", "gbs"}) {
    if (ds.contains(key))
      j[key] = ds[key];
    else
      j.erase(key);
  }
  // Megatron-DeepSpeed's attention: flash-attn with --use-flash-attn(-v1|-v2), flash-attn 1.x's
  // Triton kernel with --use-flash-attn-triton (arguments.py L433: any of them sets
  // use_flash_attn; megatron/model/transformer.py L607-608: the Triton one wins, as
  // FlashSelfAttentionTriton), else its own.
  const bool triton = f.has("use-flash-attn-triton");
  j["flash_attention"] =
      triton || f.has("use-flash-attn-v2") || f.has("use-flash-attn") || f.has("use-flash-attn-v1");
  j.erase("attention_kernel");
  if (triton) j["attention_kernel"] = "triton";
  // --checkpoint-in-cpu is the config's cpu_checkpointing (activation offload) again.
  if (f.has("checkpoint-in-cpu") &&
      !(j.contains("offload") && j["offload"].is_string() &&
        j["offload"].get<std::string>().find("activations") != std::string::npos))
    throw Error("--checkpoint-in-cpu",
                "the DeepSpeed config's activation_checkpointing.cpu_checkpointing is not set");
}

}  // namespace

ImportedJob import_megatron(const std::string& text, const std::string& name, int gpus,
                            const Json* deepspeed_config) {
  const Flags f = parse_flags(words_of(text));
  ImportedJob job;
  const Model m = read_model(f, name);
  int64_t per_node = 0, nodes = 0;
  for (const char* k : {"nproc_per_node", "nproc-per-node", "num_gpus"})
    if (f.has(k)) per_node = f.integer(k);
  for (const char* k : {"nnodes", "num_nodes"}) {
    if (!f.has(k)) continue;
    const std::string n = f.one(k);
    if (n.find(':') == std::string::npos) nodes = f.integer(k);  // not elastic min:max
  }
  if (per_node > 0 && nodes == 0) nodes = 1;
  if (per_node > 0 && per_node * nodes <= (1 << 20)) job.gpus = static_cast<int>(per_node * nodes);
  if (job.gpus == 0 && gpus > 0) job.gpus = gpus;  // --gpus where the text does not say it
  job.plan = read_plan(f, m, job.gpus);
  if (f.has("deepspeed")) {
    if (!deepspeed_config)
      throw Error("--deepspeed_config",
                  "a Megatron-DeepSpeed job keeps its ZeRO, precision and batch settings in "
                  "the DeepSpeed config it names; give it (import the launcher from its folder)");
    merge_deepspeed(f, *deepspeed_config, job, job.plan);
  }
  job.model = m;
  return job;
}

bool looks_like_megatron_args(const std::string& text) {
  const size_t first = text.find_first_not_of(" \t\r\n");
  if (first != std::string::npos && (text[first] == '{' || text[first] == '[')) return false;
  return text.find("--num-layers") != std::string::npos ||
         text.find("--tensor-model-parallel-size") != std::string::npos ||
         text.find("pretrain_gpt.py") != std::string::npos;
}

}  // namespace parasol::interop
