// Loading of the command line's model, cluster, plan and profile: the plan flags as a JSON
// overlay read by plan_from_json.
#include "tools/spec.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <sstream>

#include "core/error.h"
#include "interop/deepspeed.h"
#include "interop/megatron.h"
#include "tools/flag_checks.h"

namespace parasol::tools {

namespace {

constexpr int64_t kMaxDegree = 1 << 20;  // plan_from_json's bound on degrees

// `text` as a JSON value of the kind it spells: an integer, else a number, else the string.
Json json_scalar(const std::string& text) {
  int64_t i = 0;
  const char* end = text.data() + text.size();
  auto [p, ec] = std::from_chars(text.data(), end, i);
  if (ec == std::errc() && p == end && !text.empty()) return i;
  char* stop = nullptr;
  const double d = std::strtod(text.c_str(), &stop);
  if (!text.empty() && stop == text.c_str() + text.size()) return d;
  return text;
}

// An integer plan flag. A value an int of T cannot hold goes to o.raw for plan_from_json. Its
// --help type is INT, or UINT for a count without an upper bound (DeepSpeed's element counts,
// where any large value means "no limit"; plan validation refuses the negative ones).
template <class T>
void int_flag(CLI::App* cmd, SpecOptions& o, const std::string& name, const std::string& key,
              std::optional<T>& dst, const std::string& help, const char* type = "INT") {
  cmd->add_option_function<std::string>(
         name,
         [&o, &dst, key](const std::string& text) {
           const Json v = json_scalar(text);
           if (v.is_number_integer() && v.get<int64_t>() >= std::numeric_limits<T>::min() &&
               v.get<int64_t>() <= std::numeric_limits<T>::max()) {
             dst = static_cast<T>(v.get<int64_t>());
             o.raw.erase(key);
           } else {
             dst.reset();
             o.raw[key] = v;
           }
         },
         help)
      ->type_name(type);
}

// A boolean plan flag: alone it means true; it also takes true|false (1|0, yes|no, on|off).
void bool_flag(CLI::App* cmd, SpecOptions& o, const std::string& name, const std::string& key,
               std::optional<bool>& dst, const std::string& help) {
  cmd->add_option_function<std::string>(
         name,
         [&o, &dst, key](const std::string& text) {
           std::string t = text;
           std::transform(t.begin(), t.end(), t.begin(),
                          [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
           if (t.empty() || t == "true" || t == "1" || t == "yes" || t == "on") {
             dst = true;
           } else if (t == "false" || t == "0" || t == "no" || t == "off") {
             dst = false;
           } else {
             dst.reset();
             o.raw[key] = text;
             return;
           }
           o.raw.erase(key);
         },
         help + " (alone: true)")
      ->expected(0, 1)
      ->type_name("[BOOL]");
}

// "4,6,6" as a JSON array; an item that is not an integer stays a string for plan_from_json.
Json layer_list(const std::string& text) {
  Json a = Json::array();
  size_t start = 0;
  while (start <= text.size() && !text.empty()) {
    const size_t comma = std::min(text.find(',', start), text.size());
    a.push_back(json_scalar(text.substr(start, comma - start)));
    start = comma + 1;
  }
  return a;
}

// The GPUs a plan file's own degrees occupy (its "gpus" field aside): flags re-split them.
int file_gpus(const Json& file) {
  JsonReader r(file, "plan");
  int64_t n = 1;
  for (const char* k : {"tp", "pp", "dp", "cp"})
    n = std::min<int64_t>(n * r.integer_or(k, 1, 1, kMaxDegree), kMaxDegree);
  return static_cast<int>(n);
}

// The end of loading, after the model and the cluster: dp from the GPU count when
// `derive_dp` (an Error naming tp, pp or cp when they do not divide it), the plan read from `j`
// with its references (an empty one is left out), and the profile: `profile` null (the device's
// default), a path or a profile object.
void finish_spec(Spec& s, Json& j, const Plan& given, bool derive_dp, const std::string& model_ref,
                 const std::string& cluster_ref, const Json& profile) {
  const int n = s.cluster->num_gpus();
  if (derive_dp) {
    const int64_t rest = int64_t{given.tp} * given.pp * given.cp;
    if (n % rest != 0) {
      const char* field = n % given.tp                ? "plan.tp"
                          : n % (given.tp * given.pp) ? "plan.pp"
                                                      : "plan.cp";
      throw Error(field, "tp x pp x cp = " + std::to_string(rest) + " does not divide the " +
                             std::to_string(n) + " GPUs");
    }
    j["dp"] = n / rest;
  }
  j.erase("model");
  j.erase("cluster");
  if (!model_ref.empty()) j["model"] = model_ref;
  if (!cluster_ref.empty()) j["cluster"] = cluster_ref;
  j["gpus"] = n;
  s.plan = plan_from_json(j, "plan");
  const DeviceSpec& dev = s.cluster->gpu_device(0);
  if (profile.is_null()) {
    s.profile = cost::default_profile(dev);
  } else if (profile.is_string()) {
    s.profile = cost::load_profile(profile.get<std::string>(), dev);
  } else {
    s.profile = cost::profile_from_json(profile, "profile");
    if (s.profile.device != dev.name)
      throw Error(
          "profile.device",
          "'" + s.profile.device + "' describes another device than the cluster's " + dev.name);
  }
  // A profile of measured figures (the host CPU's, `parasol calibrate --probe`) replaces the
  // device's datasheet for this cluster.
  if (s.profile.measured_device) s.cluster->set_device_spec(*s.profile.measured_device);
}

// What --plan names: a parasol plan JSON, or a job of another framework read into one.
struct PlanFile {
  Json plan;                   // the plan JSON object
  std::optional<Model> model;  // the imported job's model (Megatron's arguments)
  int gpus = 0;                // the imported job's GPU count when it gives it
  bool imported = false;       // read from another framework's format
};

// Reads --plan FILE by its content: another framework's job (interop::import_file: Megatron-LM
// arguments or launch script, a DeepSpeed launcher or ds_config.json, a torchtitan job TOML;
// --gpus, --model, --cluster and --tp, --pp, --sp tell it what the file does not say), or a
// parasol plan JSON. Throws parasol::Error naming the file or the offending flag or key.
PlanFile read_plan_file(const std::string& path, const SpecOptions& o, CLI::App* cmd) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return {read_json_file(path), std::nullopt, 0, false};  // read_json_file's error
  std::stringstream buf;
  buf << in.rdbuf();
  const std::string text = buf.str();
  interop::ImportOptions io;
  io.gpus = cmd->count("--gpus") ? o.gpus : 0;
  io.model = cmd->count("--model") ? o.model : "";
  io.cluster_given = cmd->count("--cluster") > 0;
  io.tp = o.tp.value_or(1);
  io.pp = o.pp.value_or(1);
  io.sequence_parallel = o.sp.value_or(false);
  if (std::optional<interop::ImportedJob> job = interop::import_file(path, text, io))
    return {job->plan, job->model, job->gpus, true};
  return {parse_json(text, path), std::nullopt, 0, false};
}

}  // namespace

void add_target_flags(CLI::App* cmd, SpecOptions& o) {
  cmd->add_option("--model", o.model, "model: preset name, parasol JSON or HF config.json")
      ->capture_default_str();
  cmd->add_option("--cluster", o.cluster, "cluster: preset name or cluster JSON")
      ->capture_default_str();
  cmd->add_option("--gpus", o.gpus, "GPU count (with a cluster preset)")
      ->check(count_in(1, 1 << 20));
}

void add_plan_flags(CLI::App* cmd, SpecOptions& o) {
  cmd->add_option("--plan", o.plan_file,
                  "plan JSON file, Megatron-LM arguments or launch script, or DeepSpeed config "
                  "(flags below override its fields)");
  int_flag(cmd, o, "--tp", "tp", o.tp, "tensor-parallel degree");
  int_flag(cmd, o, "--pp", "pp", o.pp, "pipeline-parallel degree");
  int_flag(cmd, o, "--dp", "dp", o.dp, "data-parallel degree (default: GPUs / (tp x pp x cp))");
  int_flag(cmd, o, "--cp", "cp", o.cp, "context-parallel degree");
  int_flag(cmd, o, "--ep", "ep", o.ep, "expert-parallel degree");
  int_flag(cmd, o, "--etp", "etp", o.etp, "expert tensor-parallel degree (default: tp)");
  bool_flag(cmd, o, "--sp", "sp", o.sp, "sequence parallelism");
  int_flag(cmd, o, "--vpp", "vpp", o.vpp, "virtual pipeline stages per rank (interleaved)");
  int_flag(cmd, o, "--zero", "zero", o.zero, "ZeRO stage 0-3");
  cmd->add_option("--reshard", o.reshard,
                  "ZeRO-3: after_forward|after_backward|after_step (when gathered parameters "
                  "are freed)");
  cmd->add_option("--zero3-unit", o.zero3_unit,
                  "ZeRO-3: layer|module (one gather per layer as FSDP, or DeepSpeed's per-module "
                  "gathers)");
  int_flag(cmd, o, "--zero3-prefetch-bucket", "zero3_prefetch_bucket", o.zero3_prefetch_bucket,
           "DeepSpeed ZeRO-3 (zero3-unit module): stage3_prefetch_bucket_size, elements "
           "(default 5e7)",
           "UINT");
  int_flag(cmd, o, "--zero3-max-live-parameters", "zero3_max_live_parameters",
           o.zero3_max_live_parameters,
           "DeepSpeed ZeRO-3: stage3_max_live_parameters, elements (default 1e9)", "UINT");
  int_flag(cmd, o, "--zero3-max-reuse-distance", "zero3_max_reuse_distance",
           o.zero3_max_reuse_distance,
           "DeepSpeed ZeRO-3: stage3_max_reuse_distance, elements (default 1e9)", "UINT");
  int_flag(cmd, o, "--zero3-reduce-bucket", "zero3_reduce_bucket", o.zero3_reduce_bucket,
           "DeepSpeed ZeRO-3: reduce_bucket_size, elements (default 5e8)", "UINT");
  int_flag(cmd, o, "--zero3-param-persistence-threshold", "zero3_param_persistence_threshold",
           o.zero3_param_persistence_threshold,
           "DeepSpeed ZeRO-3: stage3_param_persistence_threshold, elements: smaller parameters "
           "are never partitioned (default 1e5)",
           "UINT");
  int_flag(cmd, o, "--shard-degree", "shard_degree", o.shard_degree,
           "HSDP: shard over groups of this many data-parallel ranks (0 = all)");
  cmd->add_option("--grad-reduce-dtype", o.grad_reduce_dtype,
                  "dtype gradients are reduced in: fp32|bf16|fp16");
  bool_flag(cmd, o, "--fp8-param-gather", "fp8_param_gather", o.fp8_param_gather,
            "fp8 plans, ZeRO 1/2: linear weights kept in fp8 and all-gathered in fp8 "
            "(Megatron-Core --fp8-param-gather)");
  int_flag(cmd, o, "--mbs", "mbs", o.mbs, "micro-batch size (sequences)");
  int_flag(cmd, o, "--gbs", "gbs", o.gbs, "global batch size (sequences; default dp x mbs)");
  int_flag(cmd, o, "--pipeline-flushes", "pipeline_flushes", o.pipeline_flushes,
           "pipeline schedules run one after another per step, each filled and drained (NeMo "
           "AutoModel: its gradient-accumulation steps under pipeline parallelism)");
  int_flag(cmd, o, "--seq", "seq", o.seq, "sequence length (default: the model's)");
  cmd->add_option("--schedule", o.schedule, "gpipe|1f1b|interleaved");
  cmd->add_option("--stage-layers", o.stage_layers,
                  "layers of each pipeline stage (or virtual stage), comma list: 4,6,6,4");
  int_flag(cmd, o, "--first-stage-layers", "first_stage_layers", o.first_stage_layers,
           "layers of the first pipeline stage (the rest split evenly)");
  int_flag(cmd, o, "--last-stage-layers", "last_stage_layers", o.last_stage_layers,
           "layers of the last pipeline stage (the rest split evenly)");
  bool_flag(cmd, o, "--account-for-embedding-in-pipeline-split",
            "account_for_embedding_in_pipeline_split", o.account_for_embedding,
            "the embedding counts as a layer of the first stage in the split (Megatron's flag)");
  bool_flag(cmd, o, "--account-for-loss-in-pipeline-split", "account_for_loss_in_pipeline_split",
            o.account_for_loss,
            "the loss counts as a layer of the last stage in the split (Megatron's flag)");
  cmd->add_option("--recompute", o.recompute, "none|selective|full|selective_op");
  int_flag(cmd, o, "--recompute-layers", "recompute_layers", o.recompute_layers,
           "full recompute of the first k layers per stage");
  int_flag(cmd, o, "--lora-rank", "lora_rank", o.lora_rank,
           "LoRA fine-tuning: the adapters' rank (NeMo's LoRA dim); every base weight frozen "
           "(0: every weight trains)");
  cmd->add_option("--lora-target-modules", o.lora_target_modules,
                  "the linears LoRA adapts, comma list of NeMo's names: linear_qkv,linear_proj,"
                  "linear_fc1,linear_fc2 (default: all four)");
  cmd->add_option("--lora-dropout", o.lora_dropout,
                  "dropout probability on the LoRA adapters' input (NeMo's dropout_position pre)");
  bool_flag(cmd, o, "--activation-func-fp8-input-store", "activation_func_fp8_input_store",
            o.activation_fp8_input_store,
            "the SwiGLU keeps an fp8 copy of its input for the backward (Megatron-Core's "
            "activation_func_fp8_input_store)");
  cmd->add_option("--recompute-modules", o.recompute_modules,
                  "selective recompute of these modules, comma list (Megatron's names): "
                  "core_attn,moe_act,layernorm,mla_up_proj,mlp,moe,shared_experts");
  cmd->add_option("--offload", o.offload, "none or a comma list of optimizer,params,activations");
  cmd->add_option("--precision", o.precision, "fp32|bf16|fp16|fp8");
  bool_flag(cmd, o, "--flash-attention", "flash_attention", o.flash, "fused attention");
  cmd->add_option("--attention-kernel", o.attention_kernel,
                  "fused attention kernel: flash2|cudnn|triton|fa3");
  cmd->add_option("--cp-impl", o.cp_impl,
                  "context-parallel ring: te|torch (Transformer Engine's, as Megatron and NeMo run "
                  "it, or PyTorch's context_parallel, as torchtitan runs it)");
  cmd->add_option("--tp-impl", o.tp_impl,
                  "whose tensor-parallel layers: megatron|torch (Megatron's, the data gradient's "
                  "reduction beside the weight gradient, or PyTorch's DTensor TP, as torchtitan "
                  "runs it: after the weight gradients)");
  cmd->add_option("--cp-rotate", o.cp_rotate,
                  "how cp-impl torch moves K/V: ring|allgather (PyTorch's rotate_method "
                  "alltoall, or allgather: its default, one all-gather per attention pass)");
  cmd->add_option("--cp-comm-type", o.cp_comm_type,
                  "how cp-impl te moves the sequence shards: p2p|all_gather|a2a|a2a+p2p "
                  "(Megatron-Core --cp-comm-type)");
  int_flag(cmd, o, "--cp-a2a-size", "cp_a2a_size", o.cp_a2a_size,
           "cp-comm-type a2a+p2p: ranks of each all-to-all group (Megatron-Core "
           "--hierarchical-context-parallel-sizes A cp/A)");
  bool_flag(cmd, o, "--repeat-kv", "repeat_kv", o.repeat_kv,
            "the model code repeats the K/V heads to the query heads before attention "
            "(torchtitan's Llama before enable_gqa)");
  bool_flag(cmd, o, "--tp-comm-overlap", "tp_comm_overlap", o.tp_comm_overlap,
            "TP/SP communication pipelined with the GEMMs (Megatron-Core --tp-comm-overlap)");
  bool_flag(cmd, o, "--ep-comm-overlap", "ep_comm_overlap", o.ep_comm_overlap,
            "expert all-to-all overlapped with another micro-batch's compute");
  bool_flag(cmd, o, "--overlap-grad-reduce", "overlap_grad_reduce", o.overlap_grad_reduce,
            "gradient reduction overlapped with the backward (Megatron --overlap-grad-reduce)");
  bool_flag(cmd, o, "--overlap-param-gather", "overlap_param_gather", o.overlap_param_gather,
            "parameter all-gather overlapped with the forward (Megatron --overlap-param-gather)");
  cmd->add_option("--moe-dispatcher", o.moe_dispatcher,
                  "MoE token dispatch: alltoall|deepep|allgather (Megatron "
                  "--moe-token-dispatcher-type alltoall, flex with DeepEP/HybridEP, or allgather)");
  cmd->add_option("--moe-force-balance", o.moe_force_balance,
                  "benchmark routing that forces balanced experts: none|random (Megatron "
                  "--moe-router-force-load-balancing)|round_robin (NeMo AutoModel's "
                  "fake_balanced_gate, torchtitan's _debug_force_load_balance)");
  cmd->add_option("--optimizer-dtype", o.optimizer_dtype,
                  "dtype of the Adam moments (and master weights): fp32|bf16");
  bool_flag(cmd, o, "--fused-kernels", "fused_kernels", o.fused_kernels,
            "element-wise work in fused kernels (Megatron/TE, torch.compile); false: eager "
            "PyTorch op by op");
  cmd->add_option("--rank-order", o.rank_order, "e.g. tp-cp-ep-dp-pp (first varies fastest)");
  cmd->add_option("--cuda-graphs", o.cuda_graphs,
                  "none|layers|full_iteration: CUDA graphs replaying each layer's forward and "
                  "backward, or the whole forward and backward (Megatron --cuda-graph-impl, "
                  "torchtitan)");
  bool_flag(cmd, o, "--torch-compile", "torch_compile", o.torch_compile,
            "each transformer layer torch.compile'd (torchtitan --compile)");
  bool_flag(cmd, o, "--eager-loss", "eager_loss", o.eager_loss,
            "the loss as eager F.cross_entropy of fp32-upcast logits (torchtitan); false: a "
            "fused vocab-parallel kernel (Megatron)");
  bool_flag(cmd, o, "--tiled-loss", "tiled_loss", o.tiled_loss,
            "the loss as a vocab-tiled kernel on the logits in their dtype, no fp32 softmax "
            "(llm.c, Liger, parasol's runtime); false: Megatron's fused loss");
  bool_flag(cmd, o, "--gemm-gelu-epilogue", "gemm_gelu_epilogue", o.gemm_gelu_epilogue,
            "FC1's GELU in its GEMM's epilogue and its derivative in FC2's data-gradient GEMM "
            "(cuBLASLt GELU_AUX / DGELU: llm.c's gelu_fusion); GELU models only");
  cmd->add_option("--optimizer-impl", o.optimizer_impl,
                  "fused|foreach|for_loop: how Adam launches its kernels");
  cmd->add_option("--cpu-optimizer", o.cpu_optimizer,
                  "deepspeed|torch: the CPU optimizer of an offloaded optimizer (DeepSpeedCPUAdam, "
                  "or torch.optim's fused AdamW on the host: FSDP CPU offload, Megatron)");
  cmd->add_option("--host-framework", o.host_framework,
                  "pytorch|native: what issues the kernels (native: a C++/CUDA program, llm.c)");
  cmd->add_option("--transformer-impl", o.transformer_impl,
                  "torch|transformer_engine|local: the modules a layer's GEMMs and norms are "
                  "called through, whose calls the host pays (Megatron --transformer-impl)");
  bool_flag(cmd, o, "--nan-check", "nan_check", o.nan_check,
            "Megatron's NaN/Inf check of the loss (--check-for-nan-in-loss-and-grad, default "
            "true): two device-to-host syncs per micro-batch");
  bool_flag(cmd, o, "--log-params-norm", "log_params_norm", o.log_params_norm,
            "Megatron's --log-params-norm: the parameters' L2 norm and a device-to-host sync "
            "after every step");
  bool_flag(cmd, o, "--log-num-zeros-in-grad", "log_num_zeros_in_grad", o.log_num_zeros_in_grad,
            "Megatron's --log-num-zeros-in-grad: the gradients' zeros counted tensor by tensor "
            "and a device-to-host sync before every optimizer step");
  bool_flag(cmd, o, "--p2p-sync", "p2p_sync", o.p2p_sync,
            "Megatron-Core's batched pipeline exchanges, each followed by torch.cuda.synchronize() "
            "(its schedules without virtual stages)");
  bool_flag(cmd, o, "--moe-probs-in-experts", "moe_probs_in_experts", o.moe_probs_in_experts,
            "Megatron-Core's experts scale the routed rows by the router's probabilities and the "
            "combine unpermutes without them (what Megatron-Core runs; the import sets it)");
  bool_flag(cmd, o, "--gradient-accumulation-fusion", "gradient_accumulation_fusion",
            o.gradient_accumulation_fusion,
            "Megatron's gradient-accumulation fusion (default true; false: "
            "--no-gradient-accumulation-fusion, each weight gradient added into main_grad by a "
            "Python hook)");
  bool_flag(cmd, o, "--cross-entropy-loss-fusion", "cross_entropy_loss_fusion",
            o.cross_entropy_loss_fusion,
            "Megatron's fused vocab-parallel loss (default true; false: Megatron's default "
            "unfused vocab_parallel_cross_entropy, an fp32 copy of the logits and about 20 "
            "kernels issued from Python)");
  bool_flag(cmd, o, "--deterministic", "deterministic", o.deterministic,
            "PyTorch's deterministic algorithms (Megatron's --deterministic-mode): each output "
            "Transformer Engine allocates is NaN-filled first, a kernel more each");
  cmd->add_option("--transformer-engine-version", o.transformer_engine_version,
                  "major.minor of the Transformer Engine the run uses (before 2.10 its module "
                  "calls cost the host more)");
}

void add_profile_flag(CLI::App* cmd, SpecOptions& o) {
  cmd->add_option("--profile", o.profile_file, "calibrated profile JSON (default: the device's)");
}

Json plan_overlay(const SpecOptions& o, Json j) {
  if (!j.is_object()) return j;  // plan_from_json rejects it
  // A layout given on the command line replaces the file's other form of it.
  const bool first_last = o.first_stage_layers || o.last_stage_layers ||
                          o.raw.count("first_stage_layers") || o.raw.count("last_stage_layers");
  const bool accounted =
      o.account_for_embedding.value_or(false) || o.account_for_loss.value_or(false);
  if (o.stage_layers || accounted) {
    j.erase("first_stage_layers");
    j.erase("last_stage_layers");
  }
  if (first_last || accounted) j.erase("stage_layers");
  if (o.stage_layers || first_last) {
    j.erase("account_for_embedding_in_pipeline_split");
    j.erase("account_for_loss_in_pipeline_split");
  }
  auto set = [&j](const char* key, const auto& v) {
    if (v) j[key] = *v;
  };
  set("tp", o.tp);
  set("pp", o.pp);
  set("dp", o.dp);
  set("cp", o.cp);
  set("ep", o.ep);
  set("etp", o.etp);
  set("sp", o.sp);
  set("vpp", o.vpp);
  set("zero", o.zero);
  set("reshard", o.reshard);
  set("zero3_unit", o.zero3_unit);
  set("zero3_prefetch_bucket", o.zero3_prefetch_bucket);
  set("zero3_max_live_parameters", o.zero3_max_live_parameters);
  set("zero3_max_reuse_distance", o.zero3_max_reuse_distance);
  set("zero3_reduce_bucket", o.zero3_reduce_bucket);
  set("zero3_param_persistence_threshold", o.zero3_param_persistence_threshold);
  set("shard_degree", o.shard_degree);
  set("grad_reduce_dtype", o.grad_reduce_dtype);
  set("fp8_param_gather", o.fp8_param_gather);
  set("mbs", o.mbs);
  set("gbs", o.gbs);
  set("pipeline_flushes", o.pipeline_flushes);
  set("seq", o.seq);
  set("schedule", o.schedule);
  set("first_stage_layers", o.first_stage_layers);
  set("last_stage_layers", o.last_stage_layers);
  set("account_for_embedding_in_pipeline_split", o.account_for_embedding);
  set("account_for_loss_in_pipeline_split", o.account_for_loss);
  set("recompute", o.recompute);
  set("recompute_layers", o.recompute_layers);
  set("recompute_modules", o.recompute_modules);
  set("lora_rank", o.lora_rank);
  set("lora_target_modules", o.lora_target_modules);
  set("lora_dropout", o.lora_dropout);
  set("activation_func_fp8_input_store", o.activation_fp8_input_store);
  set("offload", o.offload);
  set("precision", o.precision);
  set("flash_attention", o.flash);
  set("attention_kernel", o.attention_kernel);
  set("cp_impl", o.cp_impl);
  set("cp_rotate", o.cp_rotate);
  set("tp_impl", o.tp_impl);
  set("cp_comm_type", o.cp_comm_type);
  set("cp_a2a_size", o.cp_a2a_size);
  set("repeat_kv", o.repeat_kv);
  set("tp_comm_overlap", o.tp_comm_overlap);
  set("ep_comm_overlap", o.ep_comm_overlap);
  set("rank_order", o.rank_order);
  set("overlap_grad_reduce", o.overlap_grad_reduce);
  set("overlap_param_gather", o.overlap_param_gather);
  set("moe_dispatcher", o.moe_dispatcher);
  set("moe_force_balance", o.moe_force_balance);
  set("optimizer_dtype", o.optimizer_dtype);
  set("fused_kernels", o.fused_kernels);
  set("cuda_graphs", o.cuda_graphs);
  set("torch_compile", o.torch_compile);
  set("eager_loss", o.eager_loss);
  set("tiled_loss", o.tiled_loss);
  set("gemm_gelu_epilogue", o.gemm_gelu_epilogue);
  set("optimizer_impl", o.optimizer_impl);
  set("cpu_optimizer", o.cpu_optimizer);
  set("host_framework", o.host_framework);
  set("transformer_impl", o.transformer_impl);
  set("nan_check", o.nan_check);
  set("log_params_norm", o.log_params_norm);
  set("log_num_zeros_in_grad", o.log_num_zeros_in_grad);
  set("deterministic", o.deterministic);
  set("p2p_sync", o.p2p_sync);
  set("moe_probs_in_experts", o.moe_probs_in_experts);
  set("gradient_accumulation_fusion", o.gradient_accumulation_fusion);
  set("cross_entropy_loss_fusion", o.cross_entropy_loss_fusion);
  set("transformer_engine_version", o.transformer_engine_version);
  if (o.stage_layers) j["stage_layers"] = layer_list(*o.stage_layers);
  if (o.vpp && *o.vpp > 1 && !o.schedule) j["schedule"] = "interleaved";
  for (const auto& [key, v] : o.raw) j[key] = v;
  return j;
}

Spec load_spec(const SpecOptions& o, CLI::App* cmd, bool need_plan) {
  Spec s;
  const bool has_file = !o.plan_file.empty();
  const PlanFile pf = has_file ? read_plan_file(o.plan_file, o, cmd)
                               : PlanFile{Json::object(), std::nullopt, 0, false};
  const Json& file = pf.plan;
  Json j = plan_overlay(o, file);
  // Every field checked, flags and file alike; the degrees decide the GPU count and dp below.
  const Plan given = plan_from_json(j, "plan");
  std::string model_ref = o.model, cluster_ref = o.cluster;
  int gpus = o.gpus;
  const bool imported_model = pf.model && cmd->count("--model") == 0;
  if (has_file) {
    if (cmd->count("--model") == 0 && !given.model_ref.empty()) model_ref = given.model_ref;
    if (cmd->count("--cluster") == 0 && !given.cluster_ref.empty()) cluster_ref = given.cluster_ref;
    if (cmd->count("--gpus") == 0 && given.gpus_ref > 0) gpus = given.gpus_ref;
    if (cmd->count("--gpus") == 0 && pf.gpus > 0) gpus = pf.gpus;
    if (gpus == 0) gpus = file_gpus(file);
  } else if (gpus == 0 && need_plan) {
    gpus = given.gpus();  // no GPU count: the flags' degrees decide it
  }
  // An imported job's model (Megatron's arguments give its shape) unless --model is given; it is
  // no preset or file, so the plan keeps no reference to it.
  if (imported_model) model_ref.clear();
  s.model = imported_model ? *pf.model : load_model(model_ref);
  s.cluster = std::make_unique<Cluster>(load_cluster(cluster_ref, gpus));
  // An imported job without its GPU count has no dp: it comes from --gpus as without a file.
  const bool derive_dp =
      !o.dp && (!has_file || o.tp || o.pp || o.cp || (pf.imported && !file.contains("dp")));
  finish_spec(s, j, given, derive_dp, model_ref, cluster_ref,
              o.profile_file.empty() ? Json() : Json(o.profile_file));
  return s;
}

Spec load_request(const Json& request, bool need_plan) {
  if (!request.is_object()) throw Error("request", "must be an object (a dict)");
  Json j = request;
  const Json model = j.value("model", Json()), cluster = j.value("cluster", Json());
  const Json profile = j.value("profile", Json());
  // The model and cluster objects are read below; the plan keeps the references that are names.
  for (const char* k : {"model", "cluster", "profile"}) j.erase(k);
  const Plan given = plan_from_json(j, "plan");
  int gpus = given.gpus_ref;
  if (gpus == 0 && need_plan) gpus = given.gpus();
  Spec s;
  if (model.is_string()) {
    s.model = load_model(model.get<std::string>());
  } else if (model.is_object()) {
    s.model = !model.contains("layers") && looks_like_hf_config(model)
                  ? model_from_hf_config(model, "model")
                  : model_from_json(model, "model");
  } else if (model.is_null()) {
    s.model = load_model(SpecOptions{}.model);
  } else {
    throw Error("model", "must be a preset name, a path or a model object");
  }
  if (cluster.is_string())
    s.cluster = std::make_unique<Cluster>(load_cluster(cluster.get<std::string>(), gpus));
  else if (cluster.is_object())
    s.cluster = std::make_unique<Cluster>(cluster_from_json(cluster, gpus, "cluster"));
  else if (cluster.is_null())
    s.cluster = std::make_unique<Cluster>(load_cluster(SpecOptions{}.cluster, gpus));
  else
    throw Error("cluster", "must be a preset name, a path or a cluster object");
  const std::string model_ref = model.is_string() ? model.get<std::string>()
                                : model.is_null() ? SpecOptions{}.model
                                                  : "";
  const std::string cluster_ref = cluster.is_string() ? cluster.get<std::string>()
                                  : cluster.is_null() ? SpecOptions{}.cluster
                                                      : "";
  finish_spec(s, j, given, !request.contains("dp"), model_ref, cluster_ref, profile);
  return s;
}

}  // namespace parasol::tools
