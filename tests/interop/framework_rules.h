// The frameworks' own checks of a job, re-stated from their sources (each rule cites the file
// and line it comes from) and applied to the text parasol exports: an oracle independent of the
// writers' refusal code, for the export tests and the sweep of `search --framework` plans
// (framework_filter_test.cc). Each function returns the rules the files break; empty = the
// framework accepts them (as far as these rules go).
#pragma once

#include <algorithm>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "interop/interop.h"

namespace parasol::interop::rules {

// The flags of an exported argument list: "--flag v ..." one per line inside the bash arrays
// parasol writes (values unquoted), by name without the dashes.
inline std::map<std::string, std::vector<std::string>> flags_of(const std::string& text) {
  std::map<std::string, std::vector<std::string>> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    std::istringstream words(line);
    std::string w;
    if (!(words >> w) || w.rfind("--", 0) != 0) continue;
    std::vector<std::string>& values = out[w.substr(2)];
    for (std::string v; words >> v;) {
      v.erase(std::remove(v.begin(), v.end(), '\''), v.end());
      v.erase(std::remove(v.begin(), v.end(), '"'), v.end());
      values.push_back(v);
    }
  }
  return out;
}

inline long long int_flag(const std::map<std::string, std::vector<std::string>>& f,
                          const std::string& name, long long fallback) {
  auto it = f.find(name);
  return it == f.end() || it->second.empty() ? fallback : std::stoll(it->second[0]);
}

// NVIDIA/Megatron-LM d98e8a6: megatron/training/arguments.py (validate_args),
// megatron/core/transformer/transformer_config.py (TransformerConfig.__post_init__) and
// megatron/core/pipeline_parallel/combined_1f1b.py, over megatron_args.txt.
inline std::vector<std::string> megatron_violations(const std::string& args_text) {
  const auto f = flags_of(args_text);
  auto has = [&](const char* n) { return f.count(n) > 0; };
  std::vector<std::string> broken;
  const long long seq = int_flag(f, "seq-length", 0);
  const long long tp = int_flag(f, "tensor-model-parallel-size", 1);
  const long long pp = int_flag(f, "pipeline-model-parallel-size", 1);
  const long long cp = int_flag(f, "context-parallel-size", 1);
  const long long ep = int_flag(f, "expert-model-parallel-size", 1);
  const long long layers = int_flag(f, "num-layers", 0);
  (void)tp;
  // arguments.py L1314-1317: max_position_embeddings is required; L1353-1356:
  // "max_position_embeddings (X) must be greater than or equal to seq_length (Y)".
  if (!has("max-position-embeddings") || int_flag(f, "max-position-embeddings", 0) < seq)
    broken.push_back("arguments.py L1354: max_position_embeddings >= seq_length");
  // arguments.py L1334-1338: seq-length a multiple of 2 x cp when cp > 1.
  if (cp > 1 && seq % (2 * cp) != 0) broken.push_back("arguments.py L1336: seq % (2 cp) == 0");
  // arguments.py L1441-1442: --tp-comm-overlap needs --sequence-parallel.
  if (has("tp-comm-overlap") && !has("sequence-parallel"))
    broken.push_back("arguments.py L1442: tp_comm_overlap needs sequence_parallel");
  // arguments.py L1095-1097: --fp8-param-gather needs the distributed optimizer (or an FSDP);
  // transformer_config.py L1566-1567: "fp8_param must be used together with fp8 mode".
  if (has("fp8-param-gather") && !has("use-distributed-optimizer") && !has("use-megatron-fsdp"))
    broken.push_back("arguments.py L1096: fp8_param_gather needs the distributed optimizer");
  if (has("fp8-param-gather") && !has("fp8-format"))
    broken.push_back("transformer_config.py L1567: fp8_param needs fp8");
  // arguments.py L1169-1170: Megatron FSDP needs --ckpt-format fsdp_dtensor.
  if (has("use-megatron-fsdp") &&
      (!has("ckpt-format") || f.at("ckpt-format").at(0) != "fsdp_dtensor"))
    broken.push_back("arguments.py L1169: Megatron-FSDP needs ckpt_format fsdp_dtensor");
  // The virtual pipeline size: --num-virtual-stages-per-pipeline-rank, or the stage count of the
  // layout over pp (arguments.py L940-952, L953-979; 1 becomes None).
  long long vpp = int_flag(f, "num-virtual-stages-per-pipeline-rank", 1);
  if (has("pipeline-model-parallel-layout")) {
    const std::string layout = f.at("pipeline-model-parallel-layout").at(0);
    vpp = (std::count(layout.begin(), layout.end(), '|') + 1) / pp;
  }
  // The embedding and loss counted as layers of the split (store_true TransformerConfig fields).
  const long long accounted =
      static_cast<long long>(has("account-for-embedding-in-pipeline-split")) +
      static_cast<long long>(has("account-for-loss-in-pipeline-split"));
  const bool first_last =
      has("decoder-first-pipeline-num-layers") || has("decoder-last-pipeline-num-layers");
  // arguments.py L985-998: without a layout or uneven first/last stages, pp divides the layers
  // (plus the accounted embedding and loss, L991-996).
  if (!has("pipeline-model-parallel-layout") && !first_last && (layers + accounted) % pp != 0)
    broken.push_back("arguments.py L998: pp divides num_layers (+ embedding/loss accounted)");
  // transformer_config.py L2229-2240: first/last stage counts refuse the accounting.
  if (first_last && accounted > 0)
    broken.push_back("transformer_config.py L2235: first/last layers refuse the accounting");
  // transformer_config.py L2242-2262: a layout refuses first/last counts and the accounting.
  if (has("pipeline-model-parallel-layout") && (first_last || accounted > 0))
    broken.push_back("transformer_config.py L2254: a layout refuses other layout arguments");
  // transformer_config.py L2370-2415: with the accounting and vpp, vpp divides the layers per
  // pipeline rank (embedding/loss counted).
  if (accounted > 0 && pp > 0 && (layers + accounted) % pp == 0 &&
      ((layers + accounted) / pp) % int_flag(f, "num-virtual-stages-per-pipeline-rank", 1) != 0)
    broken.push_back("transformer_config.py L2409: vpp divides the layers per pipeline rank");
  if (has("overlap-moe-expert-parallel-comm")) {
    // transformer_config.py L3007-3011: pp > 1 needs virtual_pipeline_model_parallel_size.
    if (pp > 1 && vpp < 2)
      broken.push_back("transformer_config.py L3008: EP overlap with pp > 1 needs vpp");
    // L3012-3015: expert model parallelism.
    if (ep < 2) broken.push_back("transformer_config.py L3013: EP overlap needs ep > 1");
    // L3016-3019: the alltoall or flex dispatcher (Megatron's default is allgather, L891).
    const std::string dispatcher =
        has("moe-token-dispatcher-type") ? f.at("moe-token-dispatcher-type").at(0) : "allgather";
    if (dispatcher != "alltoall" && dispatcher != "flex")
      broken.push_back("transformer_config.py L3016: EP overlap needs alltoall or flex");
    // L3020-3029: no full recompute, no recompute method, no recompute layer count.
    if (has("recompute-granularity") && f.at("recompute-granularity").at(0) == "full")
      broken.push_back("transformer_config.py L3021: EP overlap refuses full recompute");
    if (has("recompute-method"))
      broken.push_back("transformer_config.py L3024: EP overlap refuses a recompute method");
    if (has("recompute-num-layers"))
      broken.push_back("transformer_config.py L3027: EP overlap refuses recompute_num_layers");
    // L3030-3032: "moe" not in recompute_modules.
    if (has("recompute-modules")) {
      const auto& m = f.at("recompute-modules");
      if (std::find(m.begin(), m.end(), "moe") != m.end())
        broken.push_back("transformer_config.py L3030: EP overlap refuses recompute module moe");
    }
    // L3034-3037: a bf16 or fp16 model.
    if (!has("bf16") && !has("fp16"))
      broken.push_back("transformer_config.py L3035: EP overlap needs bf16 or fp16");
    // combined_1f1b.py L205-214: the interleaved combined 1F1B refuses Megatron FSDP chunks.
    if (vpp > 1 && has("use-megatron-fsdp"))
      broken.push_back("combined_1f1b.py L210: EP overlap with vpp refuses Megatron FSDP");
  }
  return broken;
}

// Every option Megatron-DeepSpeed's parser defines (deepspeedai/Megatron-DeepSpeed 4efb479
// megatron/arguments.py parse_args: the option strings of each add_argument of its _add_*_args
// groups, L21-54), and those deepspeed.add_config_arguments adds (deepspeedai/DeepSpeed edaa722
// deepspeed/__init__.py L283-297: --deepspeed, --deepspeed_config, --deepscale,
// --deepscale_config). parse_args calls parser.parse_args(), which exits on any other option
// ("unrecognized arguments"). Names without the leading dashes.
inline const std::set<std::string>& megatron_deepspeed_options() {
  static const std::set<std::string> kOptions = [] {
    std::istringstream in(
        "DDP-impl accumulate-allreduce-grads-in-fp32 adam-beta1 adam-beta2 adam-eps "
        "adlr-autoresume "
        "adlr-autoresume-interval aml-data-download-path apply-layernorm-1p "
        "apply-residual-connection-post-layernorm attention-dropout attention-softmax-in-fp32 "
        "batch-size bert-embedder-type bert-load bert-no-binary-head bf16 biencoder-projection-dim "
        "biencoder-shared-query-context-model block-data-path checkpoint-activations "
        "checkpoint-in-cpu "
        "checkpoint-num-layers classes-fraction clip-grad contigious-checkpointing cpu-optimizer "
        "cpu_torch_adam create-moe-param-group data-cache-path data-efficiency-curriculum-learning "
        "data-impl data-parallel-random-init data-path data-per-class-fraction dataloader-type "
        "decoder-num-layers decoder-seq-length deepscale deepscale_config deepspeed "
        "deepspeed-activation-checkpointing deepspeed_config dino-bottleneck-size "
        "dino-freeze-last-layer dino-head-hidden-size dino-local-crops-number dino-local-img-size "
        "dino-norm-last-layer dino-teacher-temp dino-warmup-teacher-temp "
        "dino-warmup-teacher-temp-epochs disable-bias-linear disable-mem-efficient-ln "
        "disable-moe-token-dropping disable-moe-top2-2nd-expert-sampling "
        "distribute-checkpointed-activations distribute-saved-activations distributed-backend "
        "distributed-timeout-minutes ds-inference ds-sequence-parallel-fpdt "
        "ds-sequence-parallel-fpdt-chunk-size ds-sequence-parallel-fpdt-offloading "
        "ds-sequence-parallel-size ds_fused_adam embedding-path embedding-weights-in-fp32 "
        "empty-unused-memory-level enable-expert-tensor-parallelism enable-zbh1-exact-semantics "
        "enable-zbh1-pipeline encoder-num-layers encoder-seq-length end-weight-decay eod-mask-loss "
        "eval-interval eval-iters evidence-data-path exit-duration-in-mins exit-interval "
        "exit-on-missing-checkpoint exit-signal-handler expert-interval ffn-hidden-size finetune "
        "force-ds-sequence-parallel fp16 fp16-lm-cross-entropy fp32-residual-connection "
        "fp8-amax-compute-algo fp8-amax-history-len fp8-e4m3 fp8-hybrid fp8-interval fp8-margin "
        "global-batch-size head-lr-mult hidden-dropout hidden-size hidden-size-teacher hysteresis "
        "ict-head-size ict-load img-h img-w indexer-batch-size indexer-log-interval inference "
        "inference-batch-times-seqlen-threshold init-method-std init-method-xavier-uniform "
        "initial-loss-scale iter-per-epoch kd kd-alpha-ce kd-beta-ce kd-temp kill-switch-file "
        "kv-channels layernorm-epsilon lazy-mpu-init load load-tag load-teacher local-rank "
        "local_rank "
        "log-batch-size-to-tensorboard log-interval log-memory-to-tensorboard "
        "log-num-zeros-in-grad "
        "log-optimizer-states-to-tensorboard log-params-norm log-timers-to-tensorboard "
        "log-validation-ppl-to-tensorboard log-world-size-to-tensorboard loss-scale "
        "loss-scale-window "
        "lr lr-decay-iters lr-decay-samples lr-decay-style lr-decay-tokens lr-warmup-fraction "
        "lr-warmup-iters lr-warmup-samples lr-warmup-tokens make-vocab-size-divisible-by "
        "mask-factor "
        "mask-prob mask-type max-position-embeddings max-tokens-to-oom memory-centric-tiled-linear "
        "merge-file micro-batch-size min-loss-scale min-lr mlp-type mmap-warmup "
        "model-parallel-size "
        "moe-eval-capacity-factor moe-expert-parallel-size moe-loss-coeff moe-min-capacity "
        "moe-train-capacity-factor mos no-async-tensor-model-parallel-allreduce "
        "no-barrier-with-level-1-timing no-bias-dropout-fusion no-bias-gelu-fusion "
        "no-contiguous-buffers-in-local-ddp no-data-sharding no-fp8-wgrad "
        "no-gradient-accumulation-fusion no-initialization no-load-lr-state no-load-optim "
        "no-load-rng "
        "no-log-learnig-rate-to-tensorboard no-log-loss-scale-to-tensorboard "
        "no-masked-softmax-fusion "
        "no-persist-layer-norm no-pipeline-parallel no-position-embedding "
        "no-query-key-layer-scaling "
        "no-save-optim no-save-rng no-scatter-gather-tensors-in-pipeline normalization "
        "num-attention-heads num-attention-heads-teacher num-channels num-classes num-experts "
        "num-experts-switch num-experts-teacher num-key-value-heads num-layers "
        "num-layers-per-virtual-pipeline-stage num-layers-teacher num-workers onnx-safe "
        "openai-gelu "
        "optimizer output-bert-embeddings overlap-p2p-communication override-opt_param-scheduler "
        "partition-activations patch-dim pipeline-model-parallel-size "
        "pipeline-model-parallel-split-rank profile profile-backward profile-ranks profile_steps "
        "query-in-block-prob rampup-batch-size random-ltd recompute-activations "
        "recompute-granularity "
        "recompute-method recompute-num-layers remote-device repeated-dataloader "
        "reset-attention-mask "
        "reset-iteration reset-position-ids retriever-report-topk-accuracies "
        "retriever-score-scaling "
        "retriever-seq-length retro-add-retriever retro-cyclic-train-iters "
        "retro-encoder-attention-dropout retro-encoder-hidden-dropout retro-encoder-layers "
        "retro-num-neighbors retro-num-retrieved-chunks retro-return-doc-ids retro-workdir "
        "return-data-index rotary-percent rotary-position-embeddings-theta sample-rate save "
        "save-interval scattered-embeddings seed seq-length sequence-parallel sgd-momentum "
        "short-seq-prob skip-train split split-transformers squared-relu "
        "standalone-embedding-stage "
        "start-weight-decay swiglu swin-backbone-type synchronize-each-layer "
        "tensor-model-parallel-size "
        "tensorboard-dir tensorboard-log-interval tensorboard-queue-size test-data-path "
        "tile-factor "
        "timing-log-level timing-log-option titles-data-path tokenizer-model tokenizer-type topk "
        "train-data-exact-num-epochs train-data-path train-desc-path train-doc-idx-path "
        "train-idx-path "
        "train-iters train-sample-idx-path train-samples train-shuffle-idx-path train-tokens "
        "transformer-impl trust-remote-code universal-checkpoint "
        "untie-embeddings-and-output-weights "
        "use-checkpoint-args use-checkpoint-opt_param-scheduler use-cpu-initialization "
        "use-dataset-only "
        "use-distributed-optimizer use-flash-attn use-flash-attn-builder use-flash-attn-triton "
        "use-flash-attn-v1 use-flash-attn-v2 use-one-sent-docs use-pin-memory "
        "use-ring-exchange-p2p "
        "use-rotary-position-embeddings use-tutel valid-data-path vision-backbone-type "
        "vision-pretraining vision-pretraining-type vocab-extra-ids vocab-file vocab-size "
        "wandb-exp-name wandb-project wandb-save-dir warmup weight-decay weight-decay-incr-style "
        "zero-allgather-bucket-size zero-contigious-gradients zero-reduce-bucket-size "
        "zero-reduce-scatter zero-stage ");
    std::set<std::string> out;
    for (std::string w; in >> w;) out.insert(w);
    return out;
  }();
  return kOptions;
}

// deepspeedai/DeepSpeed edaa722 (0.19.6) launcher/runner.py and deepspeedai/Megatron-DeepSpeed
// 4efb479 megatron/arguments.py, over an export's files (name -> text).
inline std::vector<std::string> deepspeed_violations(
    const std::map<std::string, std::string>& files) {
  std::vector<std::string> broken;
  const std::string& sh = files.at("launch_deepspeed.sh");
  const auto f = flags_of(sh);
  if (f.count("deepspeed")) {  // Megatron-DeepSpeed's pretrain_gpt.py
    // arguments.py L60 parser.parse_args(): an option its parser does not define ends the run.
    for (const auto& [name, values] : f)
      if (!megatron_deepspeed_options().count(name))
        broken.push_back("Megatron-DeepSpeed arguments.py L60: unrecognized argument --" + name);
    // arguments.py L310-311: max_position_embeddings >= seq_length.
    if (int_flag(f, "max-position-embeddings", 0) < int_flag(f, "seq-length", 0))
      broken.push_back("Megatron-DeepSpeed arguments.py L311: max_position_embeddings >= seq");
    // arguments.py L444-448: heads divisible by key-value heads.
    const long long heads = int_flag(f, "num-attention-heads", 1);
    if (heads % int_flag(f, "num-key-value-heads", heads) != 0)
      broken.push_back("Megatron-DeepSpeed arguments.py L446: heads % kv_heads == 0");
    // Ulysses (--ds-sequence-parallel-size): parallel_state.py L144-147 asserts tp == pp == 1;
    // arguments.py L974-975: not with --sequence-parallel; DeepSpeed sequence/layer.py asserts
    // the heads of q and of k, v divide by the group.
    if (const long long sp = int_flag(f, "ds-sequence-parallel-size", 1); sp > 1) {
      if (int_flag(f, "tensor-model-parallel-size", 1) > 1 ||
          int_flag(f, "pipeline-model-parallel-size", 1) > 1)
        broken.push_back("Megatron-DeepSpeed parallel_state.py L145: Ulysses without tp or pp");
      if (f.count("sequence-parallel"))
        broken.push_back(
            "Megatron-DeepSpeed arguments.py L975: Ulysses without --sequence-parallel");
      if (heads % sp != 0 || int_flag(f, "num-key-value-heads", heads) % sp != 0)
        broken.push_back("DeepSpeed sequence/layer.py: heads % sequence-parallel size == 0");
    }
    // --use-flash-attn-triton: megatron/model/transformer.py L607-608 runs
    // FlashSelfAttentionTriton, flash-attn's flash_attn_triton.flash_attn_func, whose forward
    // asserts d <= 128 ("FlashAttention only support head dimensions up to 128").
    const long long head_dim =
        int_flag(f, "kv-channels", int_flag(f, "hidden-size", 0) / std::max(1LL, heads));
    if (f.count("use-flash-attn-triton") && head_dim > 128)
      broken.push_back("flash_attn_triton.py _flash_attn_forward: head dim <= 128");
    // arguments.py L401-407: sequence parallelism raises unless CUDA_DEVICE_MAX_CONNECTIONS is
    // "1" on every rank. The launching node's environment reaches its ranks (runner.py L480
    // env = os.environ.copy()); the other nodes get only the EXPORT_ENVS prefixes (L37,
    // L609-614: MLFLOW, PYTHON, MV2, UCX, NCCL) and the KEY=VALUE lines of the file DS_ENV_FILE
    // names (L39-40, L616-623).
    if (f.count("sequence-parallel")) {
      if (sh.find("\nexport CUDA_DEVICE_MAX_CONNECTIONS=1\n") == std::string::npos)
        broken.push_back(
            "Megatron-DeepSpeed arguments.py L403: the launcher exports "
            "CUDA_DEVICE_MAX_CONNECTIONS=1");
      auto env = files.find(".deepspeed_env");
      if (env == files.end() ||
          env->second.find("CUDA_DEVICE_MAX_CONNECTIONS=1\n") == std::string::npos ||
          sh.find("export DS_ENV_FILE=\"$HERE/.deepspeed_env\"") == std::string::npos)
        broken.push_back(
            "runner.py L616-623: .deepspeed_env (via DS_ENV_FILE) carries "
            "CUDA_DEVICE_MAX_CONNECTIONS=1 to the other nodes");
    }
  }
  // runner.py L620-622: every line of the env file splits at '=' into a key and a value.
  if (auto env = files.find(".deepspeed_env"); env != files.end()) {
    std::istringstream in(env->second);
    for (std::string line; std::getline(in, line);)
      if (line.find('=') == std::string::npos || line.find('=') == 0)
        broken.push_back("runner.py L621: '" + line + "' is not KEY=VALUE");
  }
  return broken;
}

// pytorch/torchtitan v0.2.2 over torchtitan.toml: the model registry and the pipelining and
// parallel-dims checks.
inline std::vector<std::string> torchtitan_violations(const std::string& toml) {
  std::vector<std::string> broken;
  auto value = [&](const std::string& key) -> std::string {
    const std::regex re("(^|\\n)" + key + " = \"?([^\"\\n]*)\"?");
    std::smatch m;
    return std::regex_search(toml, m, re) ? m[2].str() : "";
  };
  // models/__init__.py L7-9 _supported_models; protocols/train_spec.py L71-87 raises
  // "TrainSpec <name> is not registered" for any other name.
  const std::set<std::string> registered = {"deepseek_v3", "flux",   "gpt_oss", "llama3",
                                            "llama3_ft",   "llama4", "qwen3"};
  const std::string name = value("name"), flavor = value("flavor");
  if (!registered.count(name)) broken.push_back("train_spec.py L87: TrainSpec " + name);
  // The flavors of the args dicts: llama3/__init__.py L30-91, qwen3/__init__.py L33-168,
  // deepseek_v3/__init__.py L30-130. A flavor outside them must come with parasol's advice to
  // add it (the export's comment names the dict).
  const std::map<std::string, std::set<std::string>> flavors = {
      {"llama3",
       {"debugmodel", "debugmodel_flex_attn", "debugmodel_varlen_attn", "8B", "8B_flex",
        "8B_varlen", "70B", "405B"}},
      {"qwen3",
       {"debugmodel", "0.6B", "1.7B", "4B", "8B", "14B", "32B", "debugmodel_moe", "30B-A3B",
        "235B-A22B"}},
      {"deepseek_v3", {"debugmodel", "debugmodel_flex_attn", "16B", "236B", "671B"}}};
  auto known = flavors.find(name);
  const bool registered_flavor = known != flavors.end() && known->second.count(flavor) > 0;
  if (!registered_flavor && toml.find("matches no torchtitan v0.2.2 flavor") == std::string::npos)
    broken.push_back("train_spec.py: flavor " + flavor + " of " + name + " without advice");
  // train.py L218-223: pipeline parallelism needs the TrainSpec's pipelining_fn (qwen3's is
  // None: qwen3/__init__.py L199).
  const int pp =
      value("pipeline_parallel_degree").empty() ? 1 : std::stoi(value("pipeline_parallel_degree"));
  if (pp > 1 && name == "qwen3") broken.push_back("train.py L219: qwen3 does not pipeline");
  // parallel_dims.py seq_len_divisor L365-372 (asserted by every parallelize_*): seq_len a
  // multiple of tp x 2 cp (tp alone without cp).
  const long long tp = std::stoll(value("tensor_parallel_degree"));
  const long long cp = std::stoll(value("context_parallel_degree"));
  const long long seq = std::stoll(value("seq_len"));
  if (seq % (tp * (cp > 1 ? 2 * cp : 1)) != 0)
    broken.push_back("parallel_dims.py L365: seq_len % (tp x 2 cp) == 0");
  // deepseek_v3/infra/parallelize.py L100-111: DeepEP needs ep > 1 and etp 1.
  if (value("expert_parallel_comm_backend") == "deepep" &&
      (std::stoll(value("expert_parallel_degree")) < 2 ||
       std::stoll(value("expert_tensor_parallel_degree")) > 1))
    broken.push_back("deepseek_v3 parallelize.py L100-111: DeepEP needs ep > 1 and etp 1");
  return broken;
}

// An export's files by name.
inline std::map<std::string, std::string> files_of(const Export& e) {
  std::map<std::string, std::string> out;
  for (const ExportedFile& f : e.files) out[f.name] = f.text;
  return out;
}

// The violations of an export of `framework`.
inline std::vector<std::string> violations(const Export& e) {
  const auto files = files_of(e);
  if (e.framework == "megatron") return megatron_violations(files.at("megatron_args.txt"));
  if (e.framework == "deepspeed") return deepspeed_violations(files);
  return torchtitan_violations(files.at("torchtitan.toml"));
}

}  // namespace parasol::interop::rules
