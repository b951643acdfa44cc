// torchtitan: see interop/torchtitan.h.
//
// Keys checked against pytorch/torchtitan tag v0.2.2 = 73a0e6979dd10b6b1904098eb3c8f62c18ab87ce
// (2026-02-20; the last release with TOML job files: 9810191 replaced them with Python config
// functions):
//  - torchtitan/config/job_config.py: [model] name/flavor/hf_assets_path; [training]
//    local_batch_size, global_batch_size, seq_len, dtype, mixed_precision_param,
//    mixed_precision_reduce (only "float32"), enable_cpu_offload (params, grads and optimizer);
//    [parallelism] data_parallel_replicate_degree, data_parallel_shard_degree,
//    fsdp_reshard_after_forward (default|always|never), tensor_parallel_degree,
//    enable_async_tensor_parallel, pipeline_parallel_degree, pipeline_parallel_schedule,
//    pipeline_parallel_layers_per_stage, pipeline_parallel_first/last_stage_less_layers
//    (default 1), pipeline_parallel_microbatch_size, context_parallel_degree,
//    context_parallel_rotate_method, expert_parallel_degree, expert_tensor_parallel_degree,
//    expert_parallel_comm_backend; [activation_checkpoint] mode (default "selective"),
//    selective_ac_option (default "2": every 2nd block fully checkpointed; "op": the op-level
//    policy of torchtitan/distributed/activation_checkpoint.py, parasol's selective_op);
//    [compile] enable, components; [debug] moe_force_load_balance (models/moe/moe.py L234-249:
//    round-robin experts; set by deepseek_v3 and llama4 model/args.py).
//  - torchtitan/distributed/parallel_dims.py: dp_replicate x dp_shard x cp x tp x pp = world;
//    etp = tp or 1; FSDP whenever dp_shard > 1 or cp > 1 (fsdp mesh = dp_shard x cp); experts
//    on ["pp", "dp_replicate", "efsdp", "ep", "etp"], efsdp = dp_shard x cp x tp / (etp x ep);
//    seq_len divisible by tp x 2 cp.
//  - torchtitan/models/llama3/infra/parallelize.py: reshard_after_forward "default" = not
//    pp_enabled (and the last block never resharded), DDP only as the sole parallelism, tensor
//    parallelism with SequenceParallel norms.
//  - torchtitan/distributed/pipeline_parallel.py: stage split, layers_per_stage rule,
//    microbatches = local_batch_size / pipeline_parallel_microbatch_size.
//  - torchtitan/models/llama3/__init__.py (flavors 8B, 70B, 405B), train_configs/llama3_70b.toml,
//    run_train.sh and multinode_trainer.slurm (the launch lines).
//  - The model registry: torchtitan/models/__init__.py _supported_models (deepseek_v3, flux,
//    gpt_oss, llama3, llama3_ft, llama4, qwen3) and protocols/train_spec.py get_train_spec
//    L71-87 ("TrainSpec <name> is not registered"): [model] name is the folder, flavor a key of
//    its args dict: torchtitan/models/qwen3/__init__.py qwen3_args (0.6B ... 32B, 30B-A3B,
//    235B-A22B; get_train_spec pipelining_fn=None), torchtitan/models/deepseek_v3/__init__.py
//    deepseekv3_args (16B, 236B, 671B; pipelining_fn=pipeline_llm), llama4/__init__.py
//    (TransformerModelArgs with moe_args, interleave_moe_layer_step; pipelining).
//  - torchtitan/train.py L218-223: "Pipeline Parallel is enabled but <name> does not support
//    pipelining" when the TrainSpec has no pipelining_fn (qwen3).
//  - torchtitan/train.py train_step L547-585 and forward_backward_step L481-511: one
//    pp_schedule.step() per gradient-accumulation step, global / (local x dp) of them: under
//    pipeline parallelism each is a flush of its own (plan pipeline_flushes).
//  - DeepEP: only deepseek_v3 builds its MoE with expert_parallel_comm_backend
//    (models/deepseek_v3/model/args.py L116, model.py L358-362; qwen3 and llama4 build the
//    standard MoE), and deepseek_v3/infra/parallelize.py L100-111 refuses it with ETP > 1.
#include "interop/torchtitan.h"

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <regex>
#include <sstream>
#include <string>

#include "core/error.h"

namespace parasol::interop {

const char* const kTorchtitanVersion = "torchtitan v0.2.2 (pytorch/torchtitan 73a0e69)";

namespace {

std::string toml_str(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out + "\"";
}

const char* toml_bool(bool b) { return b ? "true" : "false"; }

// Llama 3 FFN width of torchtitan's TransformerModelArgs (FeedForward in
// torchtitan/models/llama3/model/model.py): 4 dim, x 2/3, x multiplier, rounded up to multiple_of.
int64_t llama3_ffn(int64_t dim, double multiplier, int64_t multiple_of) {
  int64_t h = 4 * dim;
  h = 2 * h / 3;
  h = static_cast<int64_t>(multiplier * static_cast<double>(h));
  return multiple_of * ((h + multiple_of - 1) / multiple_of);
}

struct Flavor {
  const char* flavor;
  const char* hf_assets;
  int layers;
  int64_t dim;
  int heads;
  int kv_heads;
  double ffn_multiplier;
  int64_t multiple_of;
};

// torchtitan/models/llama3/__init__.py llama3_args at v0.2.2 (rope_theta 500000; the vocabulary
// comes from the tokenizer in hf_assets_path: Llama 3's 128256).
constexpr Flavor kLlama3[] = {
    {"8B", "./assets/hf/Llama-3.1-8B", 32, 4096, 32, 8, 1.3, 1024},
    {"70B", "./assets/hf/Llama-3.1-70B", 80, 8192, 64, 8, 1.3, 4096},
    {"405B", "./assets/hf/Llama-3.1-405B", 126, 16384, 128, 8, 1.2, 4096},
};

const Flavor* llama3_flavor(const Model& m) {
  const bool llama_shape = m.norm == Norm::kRmsNorm && m.activation == Activation::kSwiglu &&
                           !m.tied_embeddings && !m.learned_positions && !m.linear_bias &&
                           !m.is_moe() && !m.mla.enabled() && m.sliding_window == 0 &&
                           m.rope_theta == 500000 && m.vocab == 128256;
  if (!llama_shape) return nullptr;
  for (const Flavor& f : kLlama3)
    if (m.layers == f.layers && m.hidden == f.dim && m.heads == f.heads &&
        m.kv_heads == f.kv_heads && m.head_dim == f.dim / f.heads &&
        m.ffn == llama3_ffn(f.dim, f.ffn_multiplier, f.multiple_of))
      return &f;
  return nullptr;
}

// torchtitan/models/qwen3/__init__.py qwen3_args at v0.2.2: vocab 151936, head_dim 128, RMSNorm,
// SwiGLU, no biases; MoE flavors with every layer MoE, no shared experts. The rotary base is not
// compared (it changes no cost; 235B-A22B has 5e6 there, 1e6 in Qwen's config.json). The
// tokenizer folders: the train_configs' (qwen3_0.6b.toml ... qwen3_32b.toml), else
// scripts/download_hf_assets.py's ./assets/hf/<Hugging Face repository name>.
struct QwenFlavor {
  const char* flavor;
  const char* hf_assets;
  int layers;
  int64_t dim;
  int heads;
  int kv_heads;
  int64_t hidden_dim;  // the dense FFN (hidden_dim)
  bool tied;
  int experts;  // 0: dense
  int top_k;
  int64_t moe_inter_dim;
};
constexpr QwenFlavor kQwen3[] = {
    {"0.6B", "./assets/hf/Qwen3-0.6B", 28, 1024, 16, 8, 3072, true, 0, 0, 0},
    {"1.7B", "./assets/hf/Qwen3-1.7B", 28, 2048, 16, 8, 6144, true, 0, 0, 0},
    {"4B", "./assets/hf/Qwen3-4B", 36, 2560, 32, 8, 9728, true, 0, 0, 0},
    {"8B", "./assets/hf/Qwen3-8B", 36, 4096, 32, 8, 12288, false, 0, 0, 0},
    {"14B", "./assets/hf/Qwen3-14B", 40, 5120, 40, 8, 17408, false, 0, 0, 0},
    {"32B", "./assets/hf/Qwen3-32B", 64, 5120, 64, 8, 25600, false, 0, 0, 0},
    {"30B-A3B", "./assets/hf/Qwen3-30B-A3B", 48, 2048, 32, 4, 6144, false, 128, 8, 768},
    {"235B-A22B", "./assets/hf/Qwen3-235B-A22B", 94, 4096, 64, 4, 12288, false, 128, 8, 1536},
};

const QwenFlavor* qwen3_flavor(const Model& m) {
  const bool qwen_shape = m.norm == Norm::kRmsNorm && m.activation == Activation::kSwiglu &&
                          !m.learned_positions && !m.linear_bias && !m.mla.enabled() &&
                          m.sliding_window == 0 && m.vocab == 151936 && m.head_dim == 128;
  if (!qwen_shape) return nullptr;
  for (const QwenFlavor& f : kQwen3) {
    if (m.layers != f.layers || m.hidden != f.dim || m.heads != f.heads ||
        m.kv_heads != f.kv_heads || m.tied_embeddings != f.tied || m.moe.experts != f.experts)
      continue;
    if (f.experts == 0 && m.ffn == f.hidden_dim) return &f;
    if (f.experts > 0 && m.moe.top_k == f.top_k && m.moe.expert_ffn == f.moe_inter_dim &&
        m.moe.shared_experts == 0 && m.moe.every == 1 && m.moe.first_dense == 0)
      return &f;
  }
  return nullptr;
}

// torchtitan/models/deepseek_v3/__init__.py deepseekv3_args at v0.2.2 (MLA, the first
// n_dense_layers dense of width inter_dim, MoE layers of moe_inter_dim experts with
// num_shared_experts shared ones of the same width). Tokenizer folders: train_configs
// deepseek_v3_16b.toml and deepseek_v3_671b.toml; 236B's by download_hf_assets.py's naming.
struct DeepSeekFlavor {
  const char* flavor;
  const char* hf_assets;
  int64_t vocab;
  int64_t dim;
  int64_t inter_dim;
  int64_t moe_inter_dim;
  int layers;
  int dense_layers;
  int heads;
  int experts;
  int shared;
  int top_k;
  int64_t q_lora_rank;
};
constexpr DeepSeekFlavor kDeepSeekV3[] = {
    {"16B", "./assets/hf/deepseek-moe-16b-base", 102400, 2048, 10944, 1408, 27, 1, 16, 64, 2, 6, 0},
    {"236B", "./assets/hf/DeepSeek-V2", 102400, 5120, 12288, 1536, 60, 1, 128, 160, 2, 6, 1536},
    {"671B", "./assets/hf/DeepSeek-V3.1-Base", 129280, 7168, 18432, 2048, 61, 3, 128, 256, 1, 8,
     1536},
};

const DeepSeekFlavor* deepseek_v3_flavor(const Model& m) {
  // kv_lora_rank 512, qk_nope 128, qk_rope 64, v 128 in every flavor.
  if (!m.mla.enabled() || !m.is_moe() || m.mla.kv_lora_rank != 512 ||
      m.mla.qk_nope_head_dim != 128 || m.mla.qk_rope_head_dim != 64 || m.mla.v_head_dim != 128 ||
      m.norm != Norm::kRmsNorm || m.activation != Activation::kSwiglu || m.linear_bias ||
      m.learned_positions || m.tied_embeddings || m.sliding_window != 0 || m.moe.every != 1)
    return nullptr;
  for (const DeepSeekFlavor& f : kDeepSeekV3)
    if (m.vocab == f.vocab && m.hidden == f.dim && m.ffn == f.inter_dim &&
        m.moe.expert_ffn == f.moe_inter_dim && m.layers == f.layers &&
        m.moe.first_dense == f.dense_layers && m.heads == f.heads && m.moe.experts == f.experts &&
        m.moe.shared_experts == f.shared && m.moe.shared_ffn() == f.moe_inter_dim &&
        m.moe.top_k == f.top_k && m.mla.q_lora_rank == f.q_lora_rank)
      return &f;
  return nullptr;
}

}  // namespace

std::optional<TorchtitanModel> torchtitan_model(const Model& m) {
  if (const Flavor* f = llama3_flavor(m)) return TorchtitanModel{"llama3", f->flavor, f->hf_assets};
  if (const QwenFlavor* f = qwen3_flavor(m))
    return TorchtitanModel{"qwen3", f->flavor, f->hf_assets};
  if (const DeepSeekFlavor* f = deepseek_v3_flavor(m))
    return TorchtitanModel{"deepseek_v3", f->flavor, f->hf_assets};
  return std::nullopt;
}

std::string torchtitan_family(const Model& m) {
  if (const std::optional<TorchtitanModel> t = torchtitan_model(m)) return t->name;
  if (m.mla.enabled()) return "deepseek_v3";
  if (m.head_dim * m.heads != m.hidden) return "qwen3";  // the only args with a head_dim
  return m.is_moe() ? "llama4" : "llama3";
}

namespace {

// What each TrainSpec supports (get_train_spec's pipelining_fn; the MoE built with DeepEP).
bool family_pipelines(const std::string& family) { return family != "qwen3"; }
bool family_deepep(const std::string& family) { return family == "deepseek_v3"; }

// The comment and keys of [model] for a model with no registered flavor: the TrainSpec whose
// args can describe it and the entry to add there.
std::string flavor_advice(const Model& m, const std::string& family) {
  std::ostringstream t;
  t << "# parasol model " << m.name << " matches no torchtitan v0.2.2 flavor. Add an entry named "
    << toml_str(m.name) << " to the\n";
  if (family == "deepseek_v3") {
    t << "# deepseekv3_args in torchtitan/models/deepseek_v3/__init__.py\n# (DeepSeekV3ModelArgs: "
         "dim="
      << m.hidden << ", n_layers=" << m.layers << ", n_heads=" << m.heads
      << ",\n# inter_dim=" << m.ffn << ", n_dense_layers=" << m.moe.first_dense
      << ", moe_inter_dim=" << m.moe.expert_ffn << ", q_lora_rank=" << m.mla.q_lora_rank
      << ", kv_lora_rank=" << m.mla.kv_lora_rank
      << ",\n# moe_args=MoEArgs(num_experts=" << m.moe.experts
      << ", num_shared_experts=" << m.moe.shared_experts << ", top_k=" << m.moe.top_k
      << "), vocab_size=" << m.vocab << ").\n";
  } else if (family == "qwen3") {
    t << "# qwen3_args in torchtitan/models/qwen3/__init__.py\n# (Qwen3ModelArgs: dim=" << m.hidden
      << ", n_layers=" << m.layers << ", n_heads=" << m.heads << ",\n# n_kv_heads=" << m.kv_heads
      << ", head_dim=" << m.head_dim << ", hidden_dim=" << m.ffn
      << ", enable_weight_tying=" << (m.tied_embeddings ? "True" : "False")
      << ", vocab_size=" << m.vocab;
    if (m.is_moe())
      t << ",\n# moe_enabled=True, moe_inter_dim=" << m.moe.expert_ffn
        << ", moe_args=MoEArgs(num_experts=" << m.moe.experts
        << ", num_shared_experts=" << m.moe.shared_experts << ", top_k=" << m.moe.top_k << ")";
    t << "); qwen3 has no pipeline parallelism.\n";
  } else if (family == "llama4") {
    t << "# llama4_args in torchtitan/models/llama4/__init__.py\n# (TransformerModelArgs: dim="
      << m.hidden << ", n_layers=" << m.layers << ", n_heads=" << m.heads
      << ",\n# n_kv_heads=" << m.kv_heads << ", vocab_size=" << m.vocab
      << ", moe_args=MoEArgs(num_experts=" << m.moe.experts
      << ", num_shared_experts=" << m.moe.shared_experts << ", top_k=" << m.moe.top_k
      << "),\n# interleave_moe_layer_step=" << m.moe.every
      << ", auto_scale_hidden_dim=False,\n# ffn_dim_multiplier and multiple_of giving the expert "
         "FFN "
      << m.moe.expert_ffn << ").\n";
  } else {
    t << "# llama3_args in torchtitan/models/llama3/__init__.py\n# (TransformerModelArgs: dim="
      << m.hidden << ", n_layers=" << m.layers << ", n_heads=" << m.heads
      << ",\n# n_kv_heads=" << m.kv_heads << ", vocab_size=" << m.vocab
      << ", ffn_dim_multiplier and multiple_of giving the FFN " << m.ffn << ").\n";
  }
  t << "name = " << toml_str(family) << "\nflavor = " << toml_str(m.name) << "\n";
  return t.str();
}

// The FSDP degrees: data_parallel_replicate_degree and data_parallel_shard_degree.
struct DpDegrees {
  int replicate = 1;
  int shard = 1;
};

DpDegrees dp_degrees(const Plan& p) {
  if (p.zero == 1 || p.zero == 2)
    throw Error("plan.zero",
                "torchtitan shards with FSDP2 (ZeRO-3: zero 3) or replicates "
                "(zero 0); it has no ZeRO-1/2 (for FSDP's SHARD_GRAD_OP use zero 3 "
                "with reshard after_backward)");
  if (p.zero == 0) {
    if (p.cp > 1)
      throw Error("plan.zero",
                  "torchtitan applies FSDP over the context-parallel group whenever "
                  "cp > 1 (parallel_dims.py fsdp_enabled); use zero 3");
    if (p.dp > 1 && p.gpus() != p.dp)
      throw Error("plan.zero",
                  "torchtitan's DDP (zero 0) runs only as the sole parallelism "
                  "(\"DDP has not supported > 1D parallelism\"); use zero 3");
    return {p.dp, 1};
  }
  const int group = p.dense_shard_ranks();  // FSDP mesh: dp_shard x cp
  if (group % p.cp != 0)
    throw Error("plan.shard_degree", "torchtitan's FSDP group is dp_shard x cp; " +
                                         std::to_string(group) + " is not a multiple of cp " +
                                         std::to_string(p.cp));
  const int shard = group / p.cp;
  return {p.dp / shard, shard};
}

const char* reshard_policy(const Plan& p, const DpDegrees& d) {
  if (p.zero != 3 || (d.shard == 1 && p.cp == 1)) return "default";  // no FSDP
  if (p.pp == 1) {
    if (p.reshard == Reshard::kAfterForward) return "always";
    if (p.reshard == Reshard::kAfterBackward) return "never";
    throw Error("plan.reshard",
                "torchtitan without pipeline parallelism reduce-scatters "
                "gradients every micro-batch (train.py gradient accumulation "
                "keeps FSDP's gradient sync on); after_step needs pp > 1");
  }
  if (p.reshard == Reshard::kAfterStep) return "default";  // never resharded under pp
  throw Error("plan.reshard",
              "with pipeline parallelism torch.distributed.pipelining keeps FSDP "
              "parameters unsharded and reduce-scatters gradients once per step "
              "(after_step); use reshard after_step");
}

// Pipeline keys: the schedule, layers per virtual stage and the first/last stage reductions that
// reproduce the plan's split exactly.
struct PipelineKeys {
  const char* schedule = "1F1B";
  int layers_per_stage = 0;  // 0: leave torchtitan's default stage count
  int first_less = 0;
  int last_less = 0;
};

// torchtitan's layer-level selective AC (selective_ac_option "n": every n-th block fully
// checkpointed, torchtitan/distributed/activation_checkpoint.py _apply_layer_sac) checkpoints
// layers / n blocks of a one-stage model: the n whose count is the plan's recompute_layers under
// full recompute (the smallest such n), or 0 when there is none (or the plan has a pipeline,
// whose stages count on).
int layer_ac_every(const Model& model, const Plan& p) {
  if (p.recompute != Recompute::kFull || p.pp != 1 || p.recompute_layers <= 0) return 0;
  for (int n = 2; n <= model.layers; ++n)
    if (model.layers / n == p.recompute_layers) return n;
  return 0;
}

PipelineKeys pipeline_keys(const Model& model, const Plan& p) {
  PipelineKeys k;
  const int chunks = p.chunks();
  k.schedule = p.schedule == Schedule::kGpipe ? "GPipe" : chunks > 1 ? "Interleaved1F1B" : "1F1B";
  if (p.schedule == Schedule::kInterleaved && chunks < 2)
    throw Error("plan.vpp", "torchtitan's Interleaved1F1B needs at least 2 stages per rank");
  const int stages = p.pp * chunks;
  std::vector<int> want(stages);
  for (int c = 0; c < chunks; ++c)
    for (int s = 0; s < p.pp; ++s) want[c * p.pp + s] = p.layers_in_chunk(model.layers, s, c);
  bool found = false;
  for (int first = 0; first <= model.layers && !found; ++first)
    for (int last = 0; last <= model.layers && !found; ++last)
      if (torchtitan_stage_split(model.layers, stages, first, last) == want) {
        k.first_less = first;
        k.last_less = last;
        found = true;
      }
  if (!found)
    throw Error(p.split_field(),
                "torchtitan splits layers evenly except for fewer layers on the first and last "
                "stage; it cannot place this plan's split");
  const int eff = model.layers + k.first_less + k.last_less;
  for (int lps = 1; lps <= eff; ++lps)
    if ((eff + lps - 1) / lps == stages) {
      k.layers_per_stage = lps;
      break;
    }
  if (k.layers_per_stage == 0 && chunks != (chunks > 1 ? 2 : 1))
    throw Error("plan.vpp", "no pipeline_parallel_layers_per_stage gives " +
                                std::to_string(stages) + " stages");
  return k;
}

void check_torchtitan_expressible(const Model& model, const Plan& p, Refusals& r) {
  constexpr std::array<Dim, 5> kTitanOrder = {Dim::kTp, Dim::kCp, Dim::kEp, Dim::kDp, Dim::kPp};
  if (p.rank_order != kTitanOrder)
    r.add("plan.rank_order",
          "torchtitan's device mesh is pp, dp_replicate, dp_shard, cp, "
          "tp (tp fastest): rank order tp-cp-ep-dp-pp");
  if (p.precision != Dtype::kBf16 && p.precision != Dtype::kFp32)
    r.add("plan.precision", std::string("torchtitan's mixed_precision_param is bfloat16 or "
                                        "float32, not ") +
                                dtype_name(p.precision));
  if (p.grad_reduce_dtype != Dtype::kFp32)
    r.add("plan.grad_reduce_dtype", "torchtitan's mixed_precision_reduce is float32 only");
  if (p.optimizer_dtype == Dtype::kBf16 && p.precision != Dtype::kBf16)
    r.add("plan.optimizer_dtype", "torchtitan's training.dtype bfloat16 trains in bf16");
  if (p.cp > 1 && p.cp_comm_type != CpCommType::kP2p)
    r.add("plan.cp_comm_type", std::string(cp_comm_type_name(p.cp_comm_type)) +
                                   " is Transformer Engine's (Megatron-Core --cp-comm-type); "
                                   "torchtitan runs PyTorch's context_parallel (cp_rotate)");
  if (p.offload.activations) r.add("plan.offload", "torchtitan v0.2.2 has no activation offload");
  if (p.offload.optimizer != p.offload.params)
    r.add("plan.offload",
          "torchtitan's training.enable_cpu_offload (FSDP2 CPUOffloadPolicy) "
          "moves parameters, gradients and optimizer state together; offload "
          "optimizer,params or nothing");
  if (p.offload.params && p.zero != 3)
    r.add("plan.offload", "torchtitan offloads through FSDP: needs zero 3");
  if (p.recompute == Recompute::kSelective)
    r.add("plan.recompute",
          "torchtitan's selective AC is per-op (save matmuls, recompute "
          "the rest: recompute selective_op) or every n-th layer, not Megatron's module sets");
  if (p.recompute == Recompute::kFull && p.recompute_layers >= 0 &&
      p.recompute_layers < p.max_layers_in_stage(model.layers) && layer_ac_every(model, p) == 0)
    r.add("plan.recompute_layers",
          "torchtitan's full AC wraps every layer and its layer-level selective AC every n-th "
          "block (selective_ac_option n, one pipeline stage): the first k per stage is neither "
          "unless k = layers / n");
  if (p.cp > 1 && p.cp_impl != CpImpl::kPytorch)
    r.add("plan.cp_impl",
          "torchtitan's context parallelism is PyTorch's context_parallel (cp_impl torch: "
          "torchtitan/distributed/utils.py create_context_parallel_ctx), not Transformer "
          "Engine's ring");
  if (p.tp > 1 && p.tp_impl != TpImpl::kPytorch)
    r.add("plan.tp_impl",
          "torchtitan's tensor parallelism is PyTorch's DTensor TP (tp_impl torch: "
          "models/llama3/infra/parallelize.py apply_tp), not Megatron's layers");
  if (p.tp > 1 && !p.sequence_parallel)
    r.add("plan.sequence_parallel",
          "torchtitan's tensor parallelism always shards norms "
          "and dropout over the sequence (SequenceParallel)");
  if (p.tp_comm_overlap && !p.fused_kernels)
    r.add("plan.tp_comm_overlap",
          "torchtitan's async tensor parallelism needs "
          "torch.compile (plan.fused_kernels)");
  if (!p.fused_kernels && !p.eager_loss)
    r.add("plan.eager_loss",
          "torchtitan compiles its loss only with the model (compile.enable, plan.fused_kernels); "
          "without compile the loss runs eagerly (set eager_loss)");
  if (p.tiled_loss && !p.eager_loss)
    r.add("plan.tiled_loss", "torchtitan's loss is F.cross_entropy, not a vocab-tiled kernel");
  if (p.lora()) r.add("plan.lora_rank", "torchtitan trains every weight (it has no LoRA)");
  if (p.activation_fp8_input_store)
    r.add("plan.activation_func_fp8_input_store",
          "torchtitan keeps the SwiGLU input in the activation dtype");
  if (p.gemm_gelu_epilogue && model.activation == Activation::kGelu)
    r.add("plan.gemm_gelu_epilogue", "torchtitan runs its activation as its own kernel");
  if (!p.flash_attention)
    r.add("plan.flash_attention", "torchtitan's attention is SDPA's fused kernel");
  else if (p.attention_kernel == AttentionKernel::kTriton ||
           p.attention_kernel == AttentionKernel::kFa3)
    r.add(
        "plan.attention_kernel",
        "torchtitan's attention is SDPA's flash (FlashAttention-2) or cuDNN kernel, not " +
            std::string(p.attention_kernel == AttentionKernel::kFa3 ? "FlashAttention-3"
                                                                    : "FlashAttention in Triton"));
  if (p.ep_comm_overlap)
    r.add("plan.ep_comm_overlap",
          "torchtitan overlaps expert communication only under "
          "its DualPipeV schedule, which parasol does not model");
  const int64_t seq = p.seq(model);
  if (seq % (2 * p.tp * p.cp) != 0)
    r.add("plan.seq",
          "torchtitan needs seq_len divisible by tp x 2 cp = " + std::to_string(2 * p.tp * p.cp));
  if (p.ep > 1 && p.expert_tp() != 1 && p.expert_tp() != p.tp)
    r.add("plan.etp",
          "torchtitan supports expert tensor parallelism 1 or tp "
          "(parallel_dims.py: \"Currently we only support ETP=TP or ETP=1\")");
  const std::string family = torchtitan_family(model);
  if (p.pp > 1 && !family_pipelines(family))
    r.add("plan.pp", "torchtitan's " + family + " TrainSpec has no pipelining_fn (models/" +
                         family +
                         "/__init__.py): train.py raises \"Pipeline Parallel is enabled but " +
                         family + " does not support pipelining\"");
  // torchtitan's forced balance ([debug] moe_force_load_balance) is the round-robin gate
  // (models/moe/moe.py _debug_force_load_balance_routing), wired into deepseek_v3 and llama4
  // only (model/args.py update_from_config).
  if (p.moe_force_balance == MoeForceBalance::kRandom)
    r.add("plan.moe_force_balance",
          "torchtitan's forced balance is the round-robin gate (round_robin), not random logits");
  else if (p.moe_force_balance == MoeForceBalance::kRoundRobin && family != "deepseek_v3" &&
           family != "llama4")
    r.add("plan.moe_force_balance",
          "torchtitan's " + family +
              " model ignores [debug] moe_force_load_balance (only deepseek_v3 and llama4 set "
              "_debug_force_load_balance)");
  if (p.moe_dispatcher == MoeDispatcher::kAllGather)
    r.add("plan.moe_dispatcher",
          "torchtitan has no all-gather token dispatcher (Megatron-Core's allgather)");
  if (p.ep > 1 && p.moe_dispatcher == MoeDispatcher::kDeepEp) {
    if (!family_deepep(family))
      r.add("plan.moe_dispatcher",
            "torchtitan's " + family +
                " model builds the standard MoE whatever expert_parallel_comm_backend says; "
                "only deepseek_v3 builds DeepEP's (models/deepseek_v3/model/args.py moe_impl)");
    else if (p.expert_tp() > 1)
      r.add("plan.etp",
            "torchtitan's DeepEP refuses expert tensor parallelism "
            "(deepseek_v3/infra/parallelize.py: \"DeepEP with Expert Tensor Parallelism (ETP) "
            "is not supported yet\")");
  }
}

}  // namespace

std::vector<int> torchtitan_stage_split(int layers, int stages, int first_less, int last_less) {
  if (stages < 1 || layers < 1 || first_less < 0 || last_less < 0) return {};
  if (stages == 1) return {layers};
  const int eff = layers + first_less + last_less;
  if (stages > eff) return {};
  const int per = eff / stages, extra = eff % stages;
  if (per == 0 || first_less > per || last_less > per) return {};
  std::vector<int> out;
  int current = 0;
  for (int i = 0; i < stages; ++i) {
    int n = per + (i < extra ? 1 : 0);
    if (i == 0)
      n -= first_less;
    else if (i == stages - 1)
      n -= last_less;
    n = std::max(0, std::min(n, layers - current));
    current += n;
    out.push_back(n);
  }
  if (current != layers) return {};  // torchtitan would drop layers: not a split parasol can use
  return out;
}

namespace {

// Runs a check that throws its refusal, adding it to `r`; false when it refused.
template <class F>
bool collect(Refusals& r, F&& check) {
  try {
    check();
    return true;
  } catch (const Error& e) {
    if (!e.is_user_error()) throw;
    r.add(e.field(), e.reason());
    return false;
  }
}

}  // namespace

Refusals torchtitan_refusals(const Model& model, const Cluster& cluster, const Plan& plan) {
  validate(plan, model, cluster);  // parasol's own rules: one error, thrown
  Refusals r;
  check_torchtitan_expressible(model, plan, r);
  DpDegrees d;
  if (collect(r, [&] { d = dp_degrees(plan); })) {
    collect(r, [&] { reshard_policy(plan, d); });
    if (plan.offload.params && d.shard == 1 && plan.cp == 1)
      r.add("plan.offload",
            "torchtitan offloads through FSDP (fully_shard's "
            "CPUOffloadPolicy), which it applies only when dp_shard or cp > 1");
    if (plan.ep > 1) {
      const int span = d.shard * plan.cp * plan.tp / plan.expert_tp();
      if (span % plan.ep != 0)
        r.add("plan.ep", "torchtitan carves expert parallelism out of dp_shard x cp x tp / etp = " +
                             std::to_string(span) +
                             " ranks (not across data_parallel_replicate_degree)");
    }
  }
  collect(r, [&] { server_layout(cluster, plan.gpus()); });
  if (plan.pp > 1) collect(r, [&] { pipeline_keys(model, plan); });
  return r;
}

Export export_torchtitan(const Model& model, const Cluster& cluster, const Plan& plan) {
  torchtitan_refusals(model, cluster, plan).raise();
  const DpDegrees d = dp_degrees(plan);
  const char* reshard = reshard_policy(plan, d);
  const int gpus = plan.gpus();
  const ServerLayout servers = server_layout(cluster, gpus);
  const int per_node = servers.per_node, nodes = servers.nodes;
  const std::optional<TorchtitanModel> titan = torchtitan_model(model);

  std::ostringstream t;
  t << "# " << kTorchtitanVersion << " job config (torchtitan/config/job_config.py at v0.2.2,\n"
    << "# the last release with TOML job files), written by parasol export --to torchtitan.\n"
    << "# " << model.name << " on " << cluster.name << ", " << gpus << " GPUs (" << nodes << " x "
    << per_node << "); plan: tp " << plan.tp << ", pp " << plan.pp << ", dp " << plan.dp << ", cp "
    << plan.cp << ", ep " << plan.ep << ", zero " << plan.zero << ".\n"
    << "# Launch: launch_torchtitan.sh (run_train.sh with NGPU and CONFIG_FILE, or torchrun).\n"
    << export_tag_line(model, cluster, gpus) << "\n";
  t << "[job]\n"
    << "dump_folder = \"./outputs\"\n"
    << "description = " << toml_str("parasol plan: " + model.name + " on " + cluster.name)
    << "\n\n";
  t << "[model]\n";
  if (titan) {
    t << "name = " << toml_str(titan->name) << "\n"
      << "flavor = " << toml_str(titan->flavor) << "\n"
      << "hf_assets_path = " << toml_str(titan->hf_assets) << "\n\n";
  } else {
    t << flavor_advice(model, torchtitan_family(model)) << "\n";
  }
  // Under pipeline parallelism each gradient-accumulation step is one schedule (a flush):
  // local_batch_size carries a flush's micro-batches (train.py train_step @73a0e69).
  const int64_t local_batch = plan.pp > 1
                                  ? plan.global_batch / (int64_t{plan.dp} * plan.pipeline_flushes)
                                  : plan.micro_batch;
  const bool bf16 = plan.precision == Dtype::kBf16;
  t << "[training]\n"
    << "# local_batch_size per data-parallel rank; global_batch_size / (local x dp) = "
    << plan.global_batch / (local_batch * plan.dp) << " gradient accumulation step(s)\n"
    << "local_batch_size = " << local_batch << "\n"
    << "global_batch_size = " << plan.global_batch << "\n"
    << "seq_len = " << plan.seq(model) << "\n"
    << "dtype = " << (plan.optimizer_dtype == Dtype::kBf16 ? "\"bfloat16\"" : "\"float32\"") << "\n"
    << "mixed_precision_param = " << (bf16 ? "\"bfloat16\"" : "\"float32\"") << "\n"
    << "mixed_precision_reduce = \"float32\"\n"
    << "enable_cpu_offload = " << toml_bool(plan.offload.params) << "\n\n";
  t << "[parallelism]\n"
    << "data_parallel_replicate_degree = " << d.replicate << "\n"
    << "data_parallel_shard_degree = " << d.shard << "\n"
    << "fsdp_reshard_after_forward = \"" << reshard << "\"\n"
    << "tensor_parallel_degree = " << plan.tp << "\n";
  if (plan.tp > 1)
    t << "enable_async_tensor_parallel = " << toml_bool(plan.tp_comm_overlap) << "\n";
  t << "pipeline_parallel_degree = " << plan.pp << "\n";
  if (plan.pp > 1) {
    const PipelineKeys k = pipeline_keys(model, plan);
    t << "pipeline_parallel_schedule = " << toml_str(k.schedule) << "\n";
    if (k.layers_per_stage > 0)
      t << "pipeline_parallel_layers_per_stage = " << k.layers_per_stage << "\n";
    t << "pipeline_parallel_first_stage_less_layers = " << k.first_less << "\n"
      << "pipeline_parallel_last_stage_less_layers = " << k.last_less << "\n"
      << "pipeline_parallel_microbatch_size = " << plan.micro_batch << "\n";
  }
  t << "context_parallel_degree = " << plan.cp << "\n";
  if (plan.cp > 1)
    t << "# PyTorch's context_parallel: K/V shards "
      << (plan.cp_rotate == CpRotate::kAllGather ? "all-gathered once per attention pass\n"
                                                 : "passed on each ring step\n")
      << "context_parallel_rotate_method = "
      << (plan.cp_rotate == CpRotate::kAllGather ? "\"allgather\"" : "\"alltoall\"") << "\n";
  t << "expert_parallel_degree = " << plan.ep << "\n"
    << "expert_tensor_parallel_degree = " << (plan.ep > 1 ? plan.expert_tp() : 1) << "\n";
  if (plan.ep > 1)
    t << "expert_parallel_comm_backend = "
      << (plan.moe_dispatcher == MoeDispatcher::kDeepEp ? "\"deepep\"" : "\"standard\"") << "\n";
  t << "\n[activation_checkpoint]\n";
  if (plan.recompute == Recompute::kSelectiveOp) {
    t << "# op-level: keep the mm (every other one), SDPA and reduce-scatter outputs\n"
      << "mode = \"selective\"\nselective_ac_option = \"op\"\n\n";
  } else if (const int every = layer_ac_every(model, plan); every > 0) {
    t << "# every " << every << "-th block fully checkpointed (parasol: full, recompute_layers "
      << plan.recompute_layers << ")\nmode = \"selective\"\nselective_ac_option = \"" << every
      << "\"\n\n";
  } else {
    t << "mode = " << (plan.recompute == Recompute::kFull ? "\"full\"" : "\"none\"") << "\n\n";
  }
  if (plan.moe_force_balance == MoeForceBalance::kRoundRobin)
    t << "[debug]\n"
      << "# round-robin experts (parasol's moe_force_balance round_robin)\n"
      << "moe_force_load_balance = true\n\n";
  t << "[compile]\n"
    << "# fused element-wise kernels (parasol's fused_kernels) come from torch.compile\n"
    << "enable = " << toml_bool(plan.fused_kernels) << "\n"
    << (plan.fused_kernels && plan.eager_loss ? "components = [\"model\"]\n"
                                              : "components = [\"model\", \"loss\"]\n");

  std::ostringstream sh;
  sh << "#!/usr/bin/env bash\n"
     << "# Written by parasol export --to torchtitan (" << kTorchtitanVersion << ").\n"
     << "# Run from a torchtitan v0.2.2 checkout; CONFIG_FILE is this folder's torchtitan.toml.\n"
     << "set -euo pipefail\n"
     << "CONFIG_FILE=${CONFIG_FILE:-$(dirname \"$0\")/torchtitan.toml}\n";
  if (nodes == 1) {
    sh << "NGPU=" << per_node << " CONFIG_FILE=\"$CONFIG_FILE\" ./run_train.sh \"$@\"\n";
  } else {
    sh << "# Run on each of the " << nodes
       << " servers (as multinode_trainer.slurm does); "
          "MASTER_ADDR = the first server.\n"
       << "torchrun --nnodes " << nodes << " --nproc_per_node " << per_node
       << " --rdzv_id 101 --rdzv_backend c10d \\\n"
       << "  --rdzv_endpoint \"${MASTER_ADDR:?set MASTER_ADDR}:29500\" \\\n"
       << "  -m torchtitan.train --job.config_file \"$CONFIG_FILE\" \"$@\"\n";
  }

  Export e;
  e.framework = "torchtitan";
  e.version = kTorchtitanVersion;
  e.files.push_back({"torchtitan.toml", t.str(), false});
  e.files.push_back({"launch_torchtitan.sh", sh.str(), true});
  return e;
}

// ---- Import of a job TOML.

namespace {

// The TOML subset reader: a cursor over one value's text.
struct TomlValue {
  const std::string& s;
  size_t i;
  std::string where;  // "<what>: line N"

  [[noreturn]] void fail(const std::string& why) const { throw Error(where, why); }
  void skip() {
    while (i < s.size()) {
      if (s[i] == '#') {
        while (i < s.size() && s[i] != '\n') ++i;
      } else if (std::isspace(static_cast<unsigned char>(s[i]))) {
        ++i;
      } else {
        break;
      }
    }
  }
  Json value() {
    skip();
    if (i >= s.size()) fail("a value is missing");
    const char c = s[i];
    if (c == '"' || c == '\'') return string();
    if (c == '[') {
      ++i;
      Json a = Json::array();
      for (skip(); i < s.size() && s[i] != ']'; skip()) {
        a.push_back(value());
        skip();
        if (i < s.size() && s[i] == ',') ++i;
      }
      if (i >= s.size()) fail("an array is not closed");
      ++i;
      return a;
    }
    if (c == '{') fail("inline tables are not read");
    size_t j = i;
    while (j < s.size() && s[j] != ',' && s[j] != ']' && s[j] != '#' && s[j] != '\n') ++j;
    std::string word = s.substr(i, j - i);
    while (!word.empty() && std::isspace(static_cast<unsigned char>(word.back()))) word.pop_back();
    i = j;
    if (word == "true") return true;
    if (word == "false") return false;
    std::string digits;
    for (char d : word)
      if (d != '_') digits += d;
    char* e = nullptr;
    errno = 0;
    const long long n = std::strtoll(digits.c_str(), &e, 10);
    if (!digits.empty() && *e == '\0' && errno == 0) return n;
    const double x = std::strtod(digits.c_str(), &e);
    if (!digits.empty() && *e == '\0') return x;
    fail("'" + word + "' is not a TOML value parasol reads");
  }
  Json string() {
    const char q = s[i++];
    if (s.compare(i, 2, std::string(2, q)) == 0) fail("multi-line strings are not read");
    std::string out;
    for (; i < s.size() && s[i] != q; ++i) {
      if (s[i] == '\n') fail("a string is not closed");
      if (q == '"' && s[i] == '\\' && i + 1 < s.size()) {
        const char e = s[++i];
        out += e == 'n' ? '\n' : e == 't' ? '\t' : e;
      } else {
        out += s[i];
      }
    }
    if (i >= s.size()) fail("a string is not closed");
    ++i;
    return out;
  }
};

// "a.b" or "\"a\"" as its parts.
std::vector<std::string> key_parts(std::string key, const std::string& where) {
  std::vector<std::string> parts;
  std::string cur;
  char quote = 0;
  for (char c : key) {
    if (quote) {
      if (c == quote)
        quote = 0;
      else
        cur += c;
    } else if (c == '"' || c == '\'') {
      quote = c;
    } else if (c == '.') {
      parts.push_back(cur);
      cur.clear();
    } else if (!std::isspace(static_cast<unsigned char>(c))) {
      cur += c;
    }
  }
  parts.push_back(cur);
  for (const std::string& p : parts)
    if (p.empty()) throw Error(where, "'" + key + "' is not a key");
  return parts;
}

bool is_table_line(const std::string& line) {
  static const std::regex table(R"(^\s*\[\[?\s*[A-Za-z_"'][^\]]*\]\]?\s*(#.*)?$)");
  return std::regex_match(line, table);
}

bool is_key_line(const std::string& line) {
  static const std::regex key(R"(^\s*[A-Za-z_][A-Za-z0-9_.\-]*\s*=\s*\S.*$)");
  return std::regex_match(line, key);
}

}  // namespace

bool looks_like_toml(const std::string& text) {
  const size_t first = text.find_first_not_of(" \t\r\n");
  if (first == std::string::npos || text[first] == '{') return false;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    const size_t at = line.find_first_not_of(" \t\r");
    if (at == std::string::npos || line[at] == '#') continue;
    return is_table_line(line) || is_key_line(line);  // the first line that is not a comment
  }
  return false;
}

bool looks_like_torchtitan_toml(const std::string& text) {
  if (!looks_like_toml(text)) return false;
  static const std::regex table(R"((^|\n)\s*\[\s*(parallelism|training|model)\s*\])");
  return std::regex_search(text, table);
}

Json parse_toml(const std::string& text, const std::string& what) {
  Json root = Json::object();
  Json* table = &root;
  size_t i = 0;
  int line_no = 1;
  auto where = [&] { return what + ": line " + std::to_string(line_no); };
  while (i < text.size()) {
    const size_t eol = std::min(text.find('\n', i), text.size());
    std::string line = text.substr(i, eol - i);
    const size_t at = line.find_first_not_of(" \t\r");
    if (at == std::string::npos || line[at] == '#') {
      i = eol + 1;
      ++line_no;
      continue;
    }
    if (line[at] == '[') {
      if (line.compare(at, 2, "[[") == 0) throw Error(where(), "arrays of tables are not read");
      const size_t close = line.find(']', at);
      if (close == std::string::npos) throw Error(where(), "a table name is not closed");
      table = &root;
      for (const std::string& part : key_parts(line.substr(at + 1, close - at - 1), where())) {
        Json& next = (*table)[part];
        if (next.is_null()) next = Json::object();
        if (!next.is_object()) throw Error(where(), "'" + part + "' is not a table");
        table = &next;
      }
      i = eol + 1;
      ++line_no;
      continue;
    }
    const size_t eq = line.find('=');
    if (eq == std::string::npos) throw Error(where(), "is neither a [table] nor key = value");
    const std::vector<std::string> parts = key_parts(line.substr(at, eq - at), where());
    TomlValue v{text, i + eq + 1, where()};
    Json value = v.value();
    // The rest of the (last) line holds nothing but a comment.
    size_t k = v.i;
    while (k < text.size() && (text[k] == ' ' || text[k] == '\t' || text[k] == '\r')) ++k;
    if (k < text.size() && text[k] != '\n' && text[k] != '#')
      throw Error(where(), "unexpected text after the value");
    Json* t = table;
    for (size_t p = 0; p + 1 < parts.size(); ++p) {
      Json& next = (*t)[parts[p]];
      if (next.is_null()) next = Json::object();
      if (!next.is_object()) throw Error(where(), "'" + parts[p] + "' is not a table");
      t = &next;
    }
    if (t->contains(parts.back())) throw Error(where(), "'" + parts.back() + "' is given twice");
    (*t)[parts.back()] = std::move(value);
    line_no += static_cast<int>(std::count(text.begin() + static_cast<std::ptrdiff_t>(i),
                                           text.begin() + static_cast<std::ptrdiff_t>(v.i), '\n'));
    i = std::min(text.find('\n', v.i), text.size()) + 1;
    ++line_no;
  }
  return root;
}

namespace {

// The parasol preset torchtitan's [model] name and flavor describe, or "".
std::string preset_of(const std::string& name, const std::string& flavor) {
  for (const std::string& preset : model_preset_names()) {
    const std::optional<TorchtitanModel> t = torchtitan_model(model_preset(preset));
    if (t && t->name == name && t->flavor == flavor) return preset;
  }
  return "";
}

// The plan fields that say `split` (layers per virtual stage, c x pp + s) the way a plan says it
// most simply: nothing (even), first/last stage layers (one chunk), or stage_layers.
void set_split(Json& j, const Model& m, const std::vector<int>& split) {
  auto matches = [&](const Json& candidate) {
    Json c = j;
    for (const auto& [k, v] : candidate.items()) c[k] = v;
    Plan p;
    try {
      p = plan_from_json(c);
    } catch (const Error& e) {
      if (!e.is_user_error()) throw;  // a parasol bug is not a candidate that does not fit
      return false;
    }
    const int chunks = p.chunks();
    for (int v = 0; v < static_cast<int>(split.size()); ++v)
      if (p.layers_in_chunk(m.layers, v % p.pp, v / p.pp) != split[v]) return false;
    return static_cast<int>(split.size()) == p.pp * chunks;
  };
  std::vector<Json> candidates = {Json::object()};
  if (j["vpp"].get<int>() == 1) {
    candidates.push_back({{"first_stage_layers", split.front()}});
    candidates.push_back({{"last_stage_layers", split.back()}});
    candidates.push_back(
        {{"first_stage_layers", split.front()}, {"last_stage_layers", split.back()}});
  }
  for (const Json& c : candidates)
    if (matches(c)) {
      for (const auto& [k, v] : c.items()) j[k] = v;
      return;
    }
  j["stage_layers"] = split;
}

}  // namespace

ImportedJob import_torchtitan(const std::string& text, int gpus, const Model* given) {
  const Json t = parse_toml(text, "torchtitan");
  const JsonReader r(t, "torchtitan");
  const Json empty = Json::object();
  auto table = [&](const char* name) {
    return r.has(name) ? r.object(name) : JsonReader(empty, r.field(name));
  };
  ImportedJob job;
  Json j = Json::object();
  // The model.
  const JsonReader mr = table("model");
  const std::string name = mr.string_or("name", "llama3"), flavor = mr.string_or("flavor", "");
  const std::string preset = preset_of(name, flavor);
  Model m;
  if (!preset.empty()) {
    m = model_preset(preset);
    j["model"] = preset;
  } else if (given) {
    m = *given;
  } else {
    throw Error(mr.field("flavor"),
                "'" + name + "' flavor '" + flavor + "' is no parasol model preset; give --model");
  }
  // Degrees.
  const JsonReader par = table("parallelism");
  constexpr int64_t kMax = 1 << 20;
  const int64_t replicate = par.integer_or("data_parallel_replicate_degree", 1, 1, kMax);
  const int64_t tp = par.integer_or("tensor_parallel_degree", 1, 1, kMax);
  const int64_t pp = par.integer_or("pipeline_parallel_degree", 1, 1, kMax);
  const int64_t cp = par.integer_or("context_parallel_degree", 1, 1, kMax);
  const int64_t ep = par.integer_or("expert_parallel_degree", 1, 1, kMax);
  int64_t shard = par.integer_or("data_parallel_shard_degree", -1, -1, kMax);
  if (shard == 0) throw Error(par.field("data_parallel_shard_degree"), "must be -1 or >= 1");
  if (shard == -1) {
    const int64_t rest = replicate * tp * pp * cp;
    if (gpus <= 0)
      throw Error(par.field("data_parallel_shard_degree"),
                  "-1 (the rest of the GPUs) needs the GPU count: give --gpus");
    if (gpus % rest != 0)
      throw Error(par.field("data_parallel_shard_degree"),
                  "-1: " + std::to_string(gpus) +
                      " GPUs are not a multiple of the other degrees' " + std::to_string(rest));
    shard = gpus / rest;
  }
  const int64_t dp = replicate * shard;
  job.gpus = static_cast<int>(dp * tp * pp * cp);
  if (gpus > 0 && gpus != job.gpus)
    throw Error(par.field("data_parallel_shard_degree"),
                "the degrees multiply to " + std::to_string(job.gpus) + " GPUs, not --gpus " +
                    std::to_string(gpus));
  j["tp"] = tp;
  j["pp"] = pp;
  j["cp"] = cp;
  // torchtitan's context parallelism is PyTorch's context_parallel (torch.distributed.tensor.
  // experimental; torchtitan/distributed/utils.py create_context_parallel_ctx).
  if (cp > 1) j["cp_impl"] = "torch";
  j["dp"] = dp;
  j["ep"] = ep;
  j["sp"] = tp > 1;  // torchtitan's TP always shards norms over the sequence
  // PyTorch's DTensor tensor parallelism (torch.distributed.tensor.parallel, models/llama3/infra/
  // parallelize.py apply_tp): the data gradients' reductions after the weight gradients.
  if (tp > 1) j["tp_impl"] = "torch";
  if (ep > 1) {
    const int64_t etp = par.integer_or("expert_tensor_parallel_degree", 1, 1, kMax);
    if (etp != tp) j["etp"] = etp;
    if (par.choice("expert_parallel_comm_backend", {"standard", "deepep"}, "standard") == "deepep")
      j["moe_dispatcher"] = "deepep";
  }
  if (tp > 1 && par.boolean_or("enable_async_tensor_parallel", false)) j["tp_comm_overlap"] = true;
  // torch's _cp_options.rotate_method: "allgather" (_AllGatherRotater, the default of torchtitan's
  // job_config.py @v0.2.2 L446-451) or "alltoall" (_AllToAllRotater, the ring).
  if (cp > 1 && par.choice("context_parallel_rotate_method", {"allgather", "alltoall"},
                           "allgather") == "allgather")
    j["cp_rotate"] = "allgather";
  // Sharding: FSDP whenever dp_shard or cp > 1 (parallel_dims.py fsdp_enabled).
  const bool fsdp = shard > 1 || cp > 1;
  j["zero"] = fsdp ? 3 : 0;
  const std::string policy =
      par.choice("fsdp_reshard_after_forward", {"default", "always", "never"}, "default");
  if (fsdp) {
    if (replicate > 1) j["shard_degree"] = shard * cp;
    j["reshard"] = policy == "never"               ? "after_backward"
                   : policy == "always" || pp == 1 ? "after_forward"
                                                   : "after_step";
  }
  // Pipeline.
  const JsonReader tr = table("training");
  const int64_t local = tr.integer_or("local_batch_size", 8, 1, int64_t{1} << 30);
  int64_t mbs = local;
  j["vpp"] = 1;
  if (pp > 1) {
    const std::string schedule =
        par.choice("pipeline_parallel_schedule", {"1F1B", "GPipe", "Interleaved1F1B"}, "1F1B");
    j["schedule"] = schedule == "GPipe" ? "gpipe" : schedule == "1F1B" ? "1f1b" : "interleaved";
    const int64_t first = par.integer_or("pipeline_parallel_first_stage_less_layers", 1, 0, kMax);
    const int64_t last = par.integer_or("pipeline_parallel_last_stage_less_layers", 1, 0, kMax);
    int64_t stages = pp * (schedule == "Interleaved1F1B" ? 2 : 1);
    if (par.has("pipeline_parallel_layers_per_stage")) {
      const int64_t lps = par.integer("pipeline_parallel_layers_per_stage", 1, kMax);
      stages = (m.layers + first + last + lps - 1) / lps;
    }
    if (stages % pp != 0 || (schedule != "Interleaved1F1B" && stages != pp))
      throw Error(par.field("pipeline_parallel_layers_per_stage"),
                  "gives " + std::to_string(stages) + " stages, which schedule " + schedule +
                      " cannot place on " + std::to_string(pp) + " ranks");
    j["vpp"] = stages / pp;
    const std::vector<int> split = torchtitan_stage_split(
        m.layers, static_cast<int>(stages), static_cast<int>(first), static_cast<int>(last));
    if (split.empty())
      throw Error(par.field("pipeline_parallel_first_stage_less_layers"),
                  "torchtitan cannot split " + std::to_string(m.layers) + " layers into " +
                      std::to_string(stages) + " stages this way");
    set_split(j, m, split);
    mbs = par.integer_or("pipeline_parallel_microbatch_size", 1, 1, int64_t{1} << 30);
    if (local % mbs != 0)
      throw Error(par.field("pipeline_parallel_microbatch_size"),
                  "does not divide local_batch_size " + std::to_string(local));
  }
  j["mbs"] = mbs;
  const int64_t global = tr.integer_or("global_batch_size", -1, -1, int64_t{1} << 40);
  j["gbs"] = global > 0 ? global : local * dp;
  // Under pipeline parallelism train_step runs one pp_schedule.step() per gradient-accumulation
  // step (train.py train_step and forward_backward_step @73a0e69): a flush of its own each.
  if (pp > 1 && global > local * dp && global % (local * dp) == 0)
    j["pipeline_flushes"] = global / (local * dp);
  // Sequence, precision, offload.
  const int64_t seq = tr.integer_or("seq_len", 2048, 1, int64_t{1} << 40);
  if (seq != m.seq_len || preset.empty()) j["seq"] = seq;
  const std::string dtype = tr.choice("dtype", {"float32", "bfloat16"}, "float32");
  const std::string param = tr.choice("mixed_precision_param", {"bfloat16", "float32"}, "bfloat16");
  tr.choice("mixed_precision_reduce", {"float32"}, "float32");
  j["precision"] = dtype == "bfloat16" || param == "bfloat16" ? "bf16" : "fp32";
  if (dtype == "bfloat16") j["optimizer_dtype"] = "bf16";
  j["grad_reduce_dtype"] = "fp32";
  if (tr.boolean_or("enable_cpu_offload", false)) {
    // FSDP2's CPUOffloadPolicy: the sharded parameters, gradients and optimizer state on the
    // host, where torch.optim's optimizer steps them (cpu_optimizer torch).
    j["offload"] = "optimizer,params";
    j["cpu_optimizer"] = "torch";
  }
  // Activation checkpointing: torchtitan's default is its selective AC, every 2nd block.
  const JsonReader ac = table("activation_checkpoint");
  const std::string mode =
      ac.choice("mode", {"selective", "full", "memory_budget", "none"}, "selective");
  if (mode == "memory_budget")
    throw Error(ac.field("mode"),
                "'memory_budget' leaves what is kept to torch.compile's partitioner; not a parasol "
                "plan: use selective (op or n), full or none");
  j["recompute"] = mode;
  if (mode == "selective") {
    const std::string option = ac.string_or("selective_ac_option", "2");
    const bool digits =
        !option.empty() && option.size() < 9 &&
        std::all_of(option.begin(), option.end(), [](char c) { return c >= '0' && c <= '9'; });
    if (option == "op") {
      j["recompute"] = "selective_op";
    } else if (digits && std::stoi(option) <= 1) {
      j["recompute"] = "full";  // "0" and "1" checkpoint every block (`not ac_freq or ...`)
    } else if (digits) {
      // Every n-th block fully checkpointed: layers / n of them, which parasol's full recompute
      // of the first k layers matches in bytes and time on one pipeline stage.
      const int every = std::stoi(option);
      if (pp != 1)
        throw Error(ac.field("selective_ac_option"),
                    "'" + option + "' checkpoints every " + option +
                        "-th block counted across the rank's pipeline stages; parasol's "
                        "recompute_layers counts the first k of each stage: with a pipeline use "
                        "op, full or none");
      j["recompute"] = m.layers / every > 0 ? "full" : "none";
      if (m.layers / every > 0) j["recompute_layers"] = m.layers / every;
    } else {
      throw Error(ac.field("selective_ac_option"),
                  "'" + option + "' is neither 'op' nor a positive layer frequency");
    }
  }
  // Compile: fused element-wise kernels.
  if (table("debug").boolean_or("moe_force_load_balance", false)) {
    if (!m.is_moe())
      throw Error(table("debug").field("moe_force_load_balance"), "the model has no experts");
    j["moe_force_balance"] = "round_robin";
  }
  const JsonReader cr = table("compile");
  // components: ["model", "loss"] by default (torchtitan/config/configs.py); the loss runs
  // eagerly (F.cross_entropy of the fp32-upcast logits, torchtitan/components/loss.py) unless
  // compiled.
  const bool enabled = cr.boolean_or("enable", false);
  bool compiled = enabled, loss_compiled = enabled;
  if (enabled && cr.has("components")) {
    bool model_part = false, loss_part = false;
    for (const auto& [path, v] : cr.array("components")) {
      model_part = model_part || (v->is_string() && v->get<std::string>() == "model");
      loss_part = loss_part || (v->is_string() && v->get<std::string>() == "loss");
    }
    compiled = model_part;
    loss_compiled = loss_part;
  }
  if (!compiled) j["fused_kernels"] = false;
  if (!loss_compiled) j["eager_loss"] = true;
  j["flash_attention"] = true;  // SDPA's fused kernels
  job.plan = j;
  return job;
}

}  // namespace parasol::interop
