// Export of a plan to Megatron-LM: pretrain_gpt.py's arguments as bash arrays grouped like
// Megatron's examples, and a torchrun launch script.
//
// Every flag below was checked against NVIDIA/Megatron-LM at commit
// d98e8a64ddf34856e74b24714e3bedb2f5a39553 (2026-08-22, Megatron-Core 0.20.0 by
// megatron/core/package_info.py): megatron/training/arguments.py (hand-written flags; the
// --overlap-*, --use-distributed-optimizer,
// --data-parallel-sharding-strategy, --decoder-first/last-pipeline-num-layers,
// --account-for-embedding/loss-in-pipeline-split (TransformerConfig fields),
// --pipeline-model-parallel-layout, --num-virtual-stages-per-pipeline-rank group at L3092-3220;
// the CUDA_DEVICE_MAX_CONNECTIONS checks at L1453-1479 and L1166; --tp-comm-overlap needs
// --sequence-parallel at L1440; moe_freq_type at L327), and the dataclasses whose fields become
// flags through ArgumentGroupFactory (field foo_bar -> --foo-bar): megatron/core/
// model_parallel_config.py, megatron/core/transformer/transformer_config.py (recompute_*,
// fp8 -> --fp8-format, attention_backend, moe_*), megatron/training/config/common_config.py
// (use_megatron_fsdp, use_tp_pp_dp_mapping: tp-cp-ep-dp-pp -> tp-cp-ep-pp-dp),
// megatron/core/transformer/pipeline_parallel_layer_layout.py (layout string: virtual stage
// v = chunk x pp + stage, 'E' embedding first, 'L' loss last, 't' a decoder layer).
// There is no --virtual-pipeline-model-parallel-size flag (arguments.py excludes the field).
// Checks of validate_args and TransformerConfig.__post_init__ the export meets:
//  - arguments.py L1353-1356: max_position_embeddings >= seq_length (asserted for every
//    position embedding type; RoPE does not use the table, so a RoPE model trained past its
//    positions gets --max-position-embeddings = the sequence length);
//  - transformer_config.py L3002-3046 (overlap_moe_expert_parallel_comm): pp > 1 needs
//    virtual_pipeline_model_parallel_size (set from --num-virtual-stages-per-pipeline-rank or a
//    layout with more stages than pp, arguments.py L940-979), ep > 1, the alltoall or flex
//    dispatcher, no full recompute (nor a recompute method or layer count), no "moe" in
//    recompute_modules, bf16 or fp16;
//  - core/pipeline_parallel/combined_1f1b.py L205-214: the EP overlap's interleaved schedule
//    refuses Megatron FSDP model chunks.
// Every refusal is collected (Refusals), so an export names all the fields at once.
#include "interop/megatron.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "core/error.h"
#include "interop/megatron_internal.h"

namespace parasol::interop {

namespace {

using Args = std::vector<std::string>;

std::string str(int64_t v) { return std::to_string(v); }
// The shortest decimal that reads back as `v` (a float argument).
std::string num(double v) {
  std::ostringstream o;
  o.precision(17);
  o << v;
  for (int p = 1; p < 17; ++p) {
    std::ostringstream t;
    t.precision(p);
    t << v;
    if (std::stod(t.str()) == v) return t.str();
  }
  return o.str();
}

void add(Args& a, const std::string& flag, const std::string& value = "") {
  a.push_back(value.empty() ? flag : flag + " " + value);
}

// The layer pattern of moe_layer_freq as a run-length list expression ("([0]*3+[1]*58)"), or ""
// when every layer is MoE (Megatron's default, moe_layer_freq 1).
std::string moe_pattern(const Model& m) {
  std::vector<std::pair<int, int>> runs;  // (is_moe, count)
  for (int l = 0; l < m.layers; ++l) {
    const int v = m.is_moe_layer(l) ? 1 : 0;
    if (!runs.empty() && runs.back().first == v)
      ++runs.back().second;
    else
      runs.push_back({v, 1});
  }
  if (runs.size() == 1 && runs[0].first == 1) return "";
  std::string s = "(";
  for (size_t i = 0; i < runs.size(); ++i)
    s += (i ? "+" : "") + std::string("[") + str(runs[i].first) + "]*" + str(runs[i].second);
  return s + ")";
}

Args model_args(const Model& m, const Plan& p, Refusals& r) {
  if (m.sliding_window > 0)
    r.add("model.sliding_window",
          "Megatron-LM's --window-size has no command-line flag (arguments.py excludes "
          "window_size); parasol does not export sliding-window models to Megatron");
  Args a;
  add(a, "--num-layers", str(m.layers));
  add(a, "--hidden-size", str(m.hidden));
  if (m.ffn > 0) add(a, "--ffn-hidden-size", str(m.ffn));
  add(a, "--num-attention-heads", str(m.heads));
  if (m.mla.enabled()) {
    add(a, "--multi-latent-attention");
    if (m.mla.q_lora_rank > 0) add(a, "--q-lora-rank", str(m.mla.q_lora_rank));
    add(a, "--kv-lora-rank", str(m.mla.kv_lora_rank));
    add(a, "--qk-head-dim", str(m.mla.qk_nope_head_dim));
    add(a, "--qk-pos-emb-head-dim", str(m.mla.qk_rope_head_dim));
    add(a, "--v-head-dim", str(m.mla.v_head_dim));
    // YaRN: multi-latent attention takes it from the "mla" group (arguments.py @4415119
    // _add_mla_args; rope_type yarn by default); absent mscale / mscale_all_dim (HF's None)
    // give the same concentration as Megatron's defaults 1.0 / 0.0.
    if (m.yarn.enabled()) {
      add(a, "--rotary-scaling-factor", num(m.yarn.factor));
      add(a, "--mscale", num(m.yarn.mscale.value_or(1.0)));
      add(a, "--mscale-all-dim", num(m.yarn.mscale_all_dim.value_or(0.0)));
    }
  } else {
    if (m.yarn.enabled())
      r.add("model.rope_scaling",
            "Megatron-LM's command line sets YaRN only for multi-latent attention "
            "(--rotary-scaling-factor, --mscale, --mscale-all-dim); GPT models take it from "
            "Megatron-Bridge's model provider");
    if (m.kv_heads != m.heads) {
      add(a, "--group-query-attention");
      add(a, "--num-query-groups", str(m.kv_heads));
    }
    add(a, "--kv-channels", str(m.head_dim));
  }
  if (m.activation == Activation::kSwiglu) add(a, "--swiglu");
  add(a, "--normalization", m.norm == Norm::kRmsNorm ? "RMSNorm" : "LayerNorm");
  if (m.qk_norm) add(a, "--qk-layernorm");  // Qwen3's per-head q/k norms (Model::qk_norm)
  if (m.learned_positions) {
    add(a, "--position-embedding-type", "learned_absolute");
  } else {
    add(a, "--position-embedding-type", "rope");
    if (m.rope_theta != std::floor(m.rope_theta) || m.rope_theta < 1)
      r.add("model.rope_theta", "Megatron-LM's --rotary-base is an integer");
    else
      add(a, "--rotary-base", str(static_cast<int64_t>(m.rope_theta)));
  }
  // validate_args asserts max_position_embeddings >= seq_length (arguments.py L1354). Learned
  // positions never reach past the table (validate refuses it); RoPE computes the rotation for
  // any position, so a longer sequence only needs the larger count.
  add(a, "--max-position-embeddings", str(std::max(m.seq_len, p.seq(m))));
  if (!m.tied_embeddings) add(a, "--untie-embeddings-and-output-weights");
  if (!m.linear_bias) add(a, "--disable-bias-linear");
  if (!m.dropout) {
    add(a, "--attention-dropout", "0.0");
    add(a, "--hidden-dropout", "0.0");
  }
  if (m.is_moe()) {
    add(a, "--num-experts", str(m.moe.experts));
    add(a, "--moe-router-topk", str(m.moe.top_k));
    add(a, "--moe-ffn-hidden-size", str(m.moe.expert_ffn));
    // The shared experts as Megatron builds them: one fused MLP of their total width.
    if (m.moe.shared_experts > 0)
      add(a, "--moe-shared-expert-intermediate-size", str(m.moe.shared_width()));
    const std::string pattern = moe_pattern(m);
    if (!pattern.empty()) add(a, "--moe-layer-freq", "'" + pattern + "'");
    add(a, "--moe-grouped-gemm");
  }
  return a;
}

Args training_args(const Model& m, const Plan& p, Refusals& r) {
  Args a;
  add(a, "--micro-batch-size", str(p.micro_batch));
  add(a, "--global-batch-size", str(p.global_batch));
  add(a, "--seq-length", str(p.seq(m)));
  switch (p.precision) {
    case Dtype::kBf16:
      add(a, "--bf16");
      break;
    case Dtype::kFp16:
      add(a, "--fp16");
      break;
    case Dtype::kFp8:
      add(a, "--bf16");
      add(a, "--fp8-format", "hybrid");
      if (p.fp8_recipe != Fp8Recipe::kDelayed)
        add(a, "--fp8-recipe", fp8_recipe_name(p.fp8_recipe));
      break;
    case Dtype::kFp32:
      break;
    default:
      r.add("plan.precision",
            std::string("Megatron-LM has no ") + dtype_name(p.precision) + " training mode");
  }
  if (p.grad_reduce_dtype == Dtype::kBf16) {
    add(a, "--grad-reduce-in-bf16");
  } else if (p.grad_reduce_dtype != Dtype::kFp32) {
    r.add("plan.grad_reduce_dtype", std::string("Megatron-LM reduces gradients in fp32 or ") +
                                        "bf16 (--grad-reduce-in-bf16), not " +
                                        dtype_name(p.grad_reduce_dtype));
  }
  if (p.fp8_param_gather) add(a, "--fp8-param-gather");
  // Megatron-LM's pretraining scripts train every weight (LoRA is NeMo's PEFT), and
  // activation_func_fp8_input_store is a TransformerConfig field without a command-line argument
  // (megatron/training/arguments.py @d98e8a6 lists it among the fields it does not expose).
  if (p.lora())
    r.add("plan.lora_rank", "Megatron-LM has no LoRA fine-tuning (NeMo's PEFT runs it)");
  if (p.activation_fp8_input_store)
    r.add("plan.activation_func_fp8_input_store",
          "Megatron-LM has no command-line argument for activation_func_fp8_input_store");
  if (p.optimizer_dtype != Dtype::kFp32)
    r.add("plan.optimizer_dtype",
          "Megatron-LM keeps fp32 master weights (--main-params-dtype is fp32 or fp16)");
  if (!p.fused_kernels)
    r.add("plan.fused_kernels",
          "Megatron-LM runs fused element-wise kernels; eager op-by-op PyTorch has no "
          "Megatron equivalent");
  if (p.flash_attention && p.attention_kernel == AttentionKernel::kTriton)
    r.add("plan.attention_kernel",
          "Megatron-LM's attention backends are flash, fused (cuDNN), unfused and local; it has "
          "no FlashAttention in Triton");
  // fa3 is the flash backend too: Transformer Engine's FlashAttention runs FlashAttention-3 on
  // sm90 wherever flash-attn's hopper build is installed (TE@d0067d0 transformer_engine/pytorch/
  // attention/dot_product_attention/utils.py L540-579, NVTE_FLASH_ATTN_V3 default 1).
  add(a, "--attention-backend",
      !p.flash_attention                              ? "unfused"
      : p.attention_kernel == AttentionKernel::kCudnn ? "fused"
                                                      : "flash");
  if (p.recompute == Recompute::kSelectiveOp)
    r.add("plan.recompute",
          "selective_op is torchtitan's op-level activation checkpointing (keep every other mm "
          "output); Megatron-LM recomputes modules (--recompute-granularity selective "
          "--recompute-modules) or whole layers (full)");
  if (p.recompute == Recompute::kSelective) {
    add(a, "--recompute-granularity", "selective");
    std::string modules;
    for (int i = 0; i < kRecomputeModuleCount; ++i)
      if ((p.recompute_modules >> i) & 1u)
        modules += (modules.empty() ? "" : " ") +
                   std::string(recompute_module_name(static_cast<RecomputeModule>(i)));
    if (!modules.empty()) add(a, "--recompute-modules", modules);
  } else if (p.recompute == Recompute::kFull) {
    add(a, "--recompute-granularity", "full");
    if (p.recompute_layers < 0) {
      add(a, "--recompute-method", "uniform");
      add(a, "--recompute-num-layers", "1");
    } else {
      if (p.chunks() > 1)
        r.add("plan.recompute_layers",
              "counts layers per pipeline stage; Megatron-LM's --recompute-num-layers "
              "counts them per virtual stage, so the interleaved schedule cannot say it");
      add(a, "--recompute-method", "block");
      add(a, "--recompute-num-layers", str(p.recompute_layers));
    }
  }
  if (p.offload.params)
    r.add("plan.offload",
          "Megatron-LM cannot offload parameters (cpu_offloading_weights "
          "has no command-line flag)");
  if (p.offload.activations)
    r.add("plan.offload",
          "Megatron-LM's --cpu-offloading-num-layers offloads fewer than all layers of a "
          "stage; parasol's activation offload (every layer) has no Megatron equivalent");
  if (p.offload.optimizer) {
    add(a, "--optimizer-cpu-offload");
    add(a, "--optimizer-offload-fraction", "1.0");
    add(a, "--use-precision-aware-optimizer");
  }
  // Data-free defaults: synthetic tokens (NullTokenizer pads the vocabulary by one end-of-document
  // token and Megatron rounds it up to --make-vocab-size-divisible-by x tp).
  add(a, "--mock-data");
  add(a, "--tokenizer-type", "NullTokenizer");
  add(a, "--vocab-size", str(m.vocab));
  add(a, "--train-iters", "100");
  add(a, "--lr", "1.0e-4");
  add(a, "--log-interval", "1");
  add(a, "--log-throughput");
  return a;
}

// The plan's rank order without the dimensions of degree 1 (their place does not matter).
std::vector<Dim> used_order(const Plan& p, const std::array<Dim, 5>& order) {
  std::vector<Dim> out;
  for (Dim d : order) {
    const int degree = d == Dim::kTp   ? p.tp
                       : d == Dim::kCp ? p.cp
                       : d == Dim::kEp ? p.ep
                       : d == Dim::kDp ? p.dp
                                       : p.pp;
    if (degree > 1) out.push_back(d);
  }
  return out;
}

// Megatron-Core's checks of --overlap-moe-expert-parallel-comm (TransformerConfig.__post_init__,
// megatron/core/transformer/transformer_config.py at d98e8a6, and the combined 1F1B schedule).
void ep_overlap_refusals(const Plan& p, Refusals& r) {
  const std::string what = "Megatron-Core's --overlap-moe-expert-parallel-comm ";
  if (p.ep < 2)  // transformer_config.py L3012-3015
    r.add("plan.ep", what + "needs expert parallelism (ep > 1)");
  if (p.pp > 1 && p.chunks() < 2)  // L3007-3011
    r.add("plan.vpp", what + "with pp > 1 needs virtual pipeline stages (vpp >= 2)");
  if (p.recompute == Recompute::kFull)  // L3020-3029 (and no recompute method or layer count)
    r.add("plan.recompute", what + "refuses full recompute");
  if (p.recompute == Recompute::kSelective && p.recomputes(RecomputeModule::kMoe))  // L3030-3032
    r.add("plan.recompute_modules", what + "refuses 'moe' in --recompute-modules");
  // L3034-3037: the model in bf16 or fp16 (fp8 trains a bf16 model: --bf16 --fp8-format).
  if (p.precision != Dtype::kBf16 && p.precision != Dtype::kFp16 && p.precision != Dtype::kFp8)
    r.add("plan.precision",
          what + "needs a bf16 or fp16 model, not " + std::string(dtype_name(p.precision)));
  // core/pipeline_parallel/combined_1f1b.py L205-214: the interleaved combined 1F1B asserts no
  // model chunk is wrapped in Megatron FSDP (zero 2 and 3 here).
  if (p.zero >= 2 && p.pp > 1)
    r.add("plan.zero", what +
                           "under a pipeline (the interleaved combined 1F1B) refuses Megatron "
                           "FSDP (zero 2 or 3)");
}

Args parallel_args(const Model& m, const Plan& p, Refusals& r) {
  if (p.schedule == Schedule::kGpipe && p.pp > 1)
    r.add("plan.schedule", "Megatron-LM has no GPipe schedule (1f1b or interleaved)");
  Args a;
  add(a, "--tensor-model-parallel-size", str(p.tp));
  add(a, "--pipeline-model-parallel-size", str(p.pp));
  if (!p.stage_layers.empty()) {
    // Layers of each virtual stage (chunk x pp + stage), as the plan resolves them.
    std::string layout;
    const int chunks = p.chunks();
    for (int v = 0; v < p.pp * chunks; ++v) {
      const int n = p.layers_in_chunk(m.layers, v % p.pp, v / p.pp);
      if (v > 0) layout += "|";
      if (v == 0) layout += "E";
      if (n == 1) layout += "t";
      if (n > 1) layout += "t*" + str(n);
      if (v == p.pp * chunks - 1) layout += "L";
    }
    add(a, "--pipeline-model-parallel-layout", "'" + layout + "'");
  } else {
    if (p.chunks() > 1) add(a, "--num-virtual-stages-per-pipeline-rank", str(p.chunks()));
    if (p.first_stage_layers > 0)
      add(a, "--decoder-first-pipeline-num-layers", str(p.first_stage_layers));
    if (p.last_stage_layers > 0)
      add(a, "--decoder-last-pipeline-num-layers", str(p.last_stage_layers));
    // TransformerConfig fields (transformer_config.py L137-143): the embedding / loss count as a
    // layer of the first / last virtual stage (validate() holds the plan to Megatron's rules).
    if (p.account_for_embedding) add(a, "--account-for-embedding-in-pipeline-split");
    if (p.account_for_loss) add(a, "--account-for-loss-in-pipeline-split");
  }
  if (p.sequence_parallel) add(a, "--sequence-parallel");
  add(a, "--context-parallel-size", str(p.cp));
  if (p.cp > 1 && p.cp_impl != CpImpl::kTransformerEngine)
    r.add("plan.cp_impl",
          "Megatron-LM runs Transformer Engine's context parallelism (cp_impl te), not "
          "PyTorch's context_parallel");
  if (p.cp > 1 && p.repeat_kv)
    r.add("plan.repeat_kv", "Megatron-LM passes the K/V heads to attention unrepeated");
  if (p.tp > 1 && p.tp_impl != TpImpl::kMegatron)
    r.add("plan.tp_impl",
          "Megatron-LM runs its own tensor-parallel layers (tp_impl megatron), not PyTorch's "
          "DTensor tensor parallelism");
  if (p.cp > 1 && p.cp_comm_type != CpCommType::kP2p) {
    add(a, "--cp-comm-type", cp_comm_type_name(p.cp_comm_type));
    if (p.cp_comm_type == CpCommType::kA2aP2p)
      add(a, "--hierarchical-context-parallel-sizes",
          str(p.cp_a2a_size) + " " + str(p.cp / p.cp_a2a_size));
  }
  add(a, "--expert-model-parallel-size", str(p.ep));
  // Always written: Megatron defaults it to tp, which is not what every plan means.
  add(a, "--expert-tensor-parallel-size", str(p.expert_tp()));
  if (p.zero == 1) {
    add(a, "--use-distributed-optimizer");
    if (p.shard_degree > 0 && p.shard_degree != p.dp * p.cp)
      add(a, "--num-distributed-optimizer-instances", str(p.dp * p.cp / p.shard_degree));
  } else if (p.shard_degree > 0 && p.shard_degree != p.dp * p.cp) {
    r.add("plan.shard_degree",
          "Megatron-LM shards over part of the data-parallel group "
          "only with the distributed optimizer (zero 1)");
  }
  if (p.pp > 1 && p.pipeline_flushes > 1)
    r.add("plan.pipeline_flushes",
          "Megatron-LM runs one pipeline schedule over all of a step's micro-batches "
          "(its gradient accumulation)");
  if (p.zero >= 2) {
    if (p.zero == 3 && p.reshard != Reshard::kAfterForward)
      r.add("plan.reshard", std::string("Megatron FSDP frees gathered parameters after ") +
                                "the forward (after_forward), not " + reshard_name(p.reshard));
    add(a, "--use-megatron-fsdp");
    add(a, "--data-parallel-sharding-strategy", p.zero == 2 ? "optim_grads" : "optim_grads_params");
    add(a, "--ckpt-format", "fsdp_dtensor");  // required by Megatron FSDP (arguments.py L1169)
  }
  if (p.overlap_grad_reduce) add(a, "--overlap-grad-reduce");
  if (p.zero >= 1 && p.overlap_param_gather) {
    if (!p.overlap_grad_reduce)
      r.add("plan.overlap_param_gather",
            "Megatron-LM overlaps the parameter gather only with --overlap-grad-reduce");
    add(a, "--overlap-param-gather");
  }
  if (p.tp_comm_overlap) {
    if (!p.sequence_parallel)
      r.add("plan.tp_comm_overlap",
            "Megatron-LM's --tp-comm-overlap needs sequence "
            "parallelism (sp)");
    add(a, "--tp-comm-overlap");
  }
  if (p.ep_comm_overlap) {
    ep_overlap_refusals(p, r);
    add(a, "--overlap-moe-expert-parallel-comm");
  }
  if (!p.nan_check) add(a, "--no-check-for-nan-in-loss-and-grad");
  if (p.log_params_norm) add(a, "--log-params-norm");
  if (p.log_num_zeros_in_grad) add(a, "--log-num-zeros-in-grad");
  if (!p.gradient_accumulation_fusion) add(a, "--no-gradient-accumulation-fusion");
  // Megatron-LM's loss is unfused unless asked (model_parallel_config.py L320 @d98e8a6).
  if (p.cross_entropy_loss_fusion && !p.eager_loss && !p.tiled_loss)
    add(a, "--cross-entropy-loss-fusion");
  // Megatron syncs after every pipeline exchange without virtual stages, whatever the plan says
  // (an exported plan without p2p_sync reads back with it); with them only when the exchanges
  // are batched (--no-overlap-p2p-communication).
  if (p.p2p_sync && p.pp > 1 && p.vpp > 1) add(a, "--no-overlap-p2p-communication");
  // --deterministic-mode (megatron/core/model_parallel_config.py L229; megatron/training/
  // determinism.py: torch.use_deterministic_algorithms(True), and it asserts
  // tp_comm_overlap=False, ARG_VALUES_REQUIRED_FOR_DETERMINISM).
  if (p.deterministic) {
    if (p.tp_comm_overlap)
      r.add("plan.deterministic",
            "Megatron-LM's --deterministic-mode requires --tp-comm-overlap off "
            "(training/determinism.py ARG_VALUES_REQUIRED_FOR_DETERMINISM)");
    if (p.cross_entropy_loss_fusion)
      r.add("plan.cross_entropy_loss_fusion",
            "Megatron-LM's --deterministic-mode requires the unfused loss "
            "(cross_entropy_loss_fusion false: training/determinism.py "
            "ARG_VALUES_REQUIRED_FOR_DETERMINISM)");
    add(a, "--deterministic-mode");
  }
  if (p.transformer_impl != TransformerImpl::kTorch)
    add(a, "--transformer-impl", transformer_impl_name(p.transformer_impl));
  if (p.cuda_graphs != CudaGraphs::kNone)
    add(a, "--cuda-graph-impl",
        p.cuda_graphs == CudaGraphs::kLayers ? "transformer_engine" : "full_iteration");
  if (p.torch_compile)
    r.add("plan.torch_compile", "Megatron-LM does not torch.compile its transformer layers");
  if (p.host_framework != HostFramework::kPytorch)
    r.add("plan.host_framework", "Megatron-LM runs on PyTorch");
  if (p.eager_loss)
    r.add("plan.eager_loss",
          "Megatron-LM's loss is its vocab-parallel cross-entropy, not eager F.cross_entropy");
  if (p.tiled_loss && !p.eager_loss)
    r.add("plan.tiled_loss",
          "Megatron-LM's vocab-parallel cross-entropy keeps its fp32 softmax for the backward; "
          "the vocab-tiled loss is parasol's runtime's");
  if (p.gemm_gelu_epilogue && m.activation == Activation::kGelu)
    r.add("plan.gemm_gelu_epilogue",
          "Megatron-LM runs GELU as its own kernel (--bias-gelu-fusion fuses the bias add, not the "
          "GEMM); the GEMM's GELU epilogue is llm.c's and parasol's runtime's");
  if (m.is_moe()) {
    if (p.moe_dispatcher == MoeDispatcher::kDeepEp) {
      add(a, "--moe-token-dispatcher-type", "flex");
      add(a, "--moe-flex-dispatcher-backend", "deepep");
    } else if (p.moe_dispatcher == MoeDispatcher::kAllGather) {
      add(a, "--moe-token-dispatcher-type", "allgather");
    } else {
      add(a, "--moe-token-dispatcher-type", "alltoall");
    }
    if (p.moe_router_fp32) add(a, "--moe-router-dtype", "fp32");
    // Megatron-Core's forced balance replaces the router logits by random normals
    // (--moe-router-force-load-balancing; router.py, moe_utils.py): no round-robin gate.
    if (p.moe_force_balance == MoeForceBalance::kRandom)
      add(a, "--moe-router-force-load-balancing");
    else if (p.moe_force_balance == MoeForceBalance::kRoundRobin)
      r.add("plan.moe_force_balance",
            "Megatron-Core forces balance with random router logits "
            "(--moe-router-force-load-balancing: random), not a round-robin gate");
  }
  const std::vector<Dim> order = used_order(p, p.rank_order);
  if (order == used_order(p, kMegatronTpPpDpOrder) &&
      order != used_order(p, kMegatronDefaultOrder)) {
    add(a, "--use-tp-pp-dp-mapping");
  } else if (order != used_order(p, kMegatronDefaultOrder)) {
    r.add("plan.rank_order",
          "Megatron-LM orders ranks tp-cp-ep-dp-pp, or tp-cp-ep-pp-dp "
          "with --use-tp-pp-dp-mapping, not " +
              rank_order_name(p.rank_order));
  }
  return a;
}

std::string array_text(const std::string& name, const Args& args) {
  std::string s = name + "=(\n";
  for (const std::string& a : args) s += "    " + a + "\n";
  return s + ")\n";
}

}  // namespace

Refusals megatron_refusals(const Model& model, const Cluster& cluster, const Plan& plan) {
  Refusals r;
  model_args(model, plan, r);
  training_args(model, plan, r);
  parallel_args(model, plan, r);
  try {
    server_layout(cluster, plan.gpus());
  } catch (const Error& e) {
    if (!e.is_user_error()) throw;  // a parasol bug is not a refusal
    r.add(e.field(), e.reason());
  }
  return r;
}

Export export_megatron(const Model& model, const Cluster& cluster, const Plan& plan) {
  // Every refusal first, all of them at once.
  megatron_refusals(model, cluster, plan).raise();
  Refusals none;
  const Args margs = model_args(model, plan, none);
  const Args targs = training_args(model, plan, none);
  const Args pargs = parallel_args(model, plan, none);
  Export e;
  e.framework = "megatron";
  e.version = kMegatronVersion;
  const std::string arrays = array_text("MODEL_ARGS", margs) + "\n" +
                             array_text("TRAINING_ARGS", targs) + "\n" +
                             array_text("MODEL_PARALLEL_ARGS", pargs);
  const std::string what = "# " + model.name + " on " + std::to_string(plan.gpus()) + " GPUs of " +
                           cluster.name + ": tp " + std::to_string(plan.tp) + ", pp " +
                           std::to_string(plan.pp) + ", dp " + std::to_string(plan.dp) + ", cp " +
                           std::to_string(plan.cp) + ", ep " + std::to_string(plan.ep) + ".\n";
  const std::string checked = "# Flags checked against " + std::string(kMegatronVersion) + ".\n" +
                              export_tag_line(model, cluster, plan.gpus());
  e.files.push_back({"megatron_args.txt",
                     "# pretrain_gpt.py arguments written by parasol export (source this file, or\n"
                     "# read it back with `parasol estimate --plan megatron_args.txt`).\n" +
                         what + checked + "\n" + arrays,
                     false});
  const ServerLayout servers = server_layout(cluster, plan.gpus());
  const int gps = servers.per_node, nnodes = servers.nodes;
  // Megatron asserts CUDA_DEVICE_MAX_CONNECTIONS=1 with tp > 1 or cp > 1 before Blackwell,
  // except under FSDP (which asserts it is not 1) or --overlap-moe-expert-parallel-comm.
  const bool one_connection =
      (plan.tp > 1 || plan.cp > 1) && plan.zero < 2 && !plan.ep_comm_overlap;
  std::string sh =
      "#!/bin/bash\n# Megatron-LM launch written by parasol export.\n" + what + checked +
      "# Run on every node with NODE_RANK and MASTER_ADDR set, from a Megatron-LM "
      "checkout\n# (MEGATRON_LM, default: the current directory).\nset -euo pipefail\n\n";
  sh += one_connection ? "export CUDA_DEVICE_MAX_CONNECTIONS=1\n"
                       : (plan.zero >= 2 ? "unset CUDA_DEVICE_MAX_CONNECTIONS  # Megatron FSDP "
                                           "needs more than one\n"
                                         : "");
  sh += "\nGPUS_PER_NODE=" + std::to_string(gps) + "\nNNODES=" + std::to_string(nnodes) +
        "\nNODE_RANK=${NODE_RANK:-0}\nMASTER_ADDR=${MASTER_ADDR:-localhost}\n"
        "MASTER_PORT=${MASTER_PORT:-29500}\n\n" +
        arrays +
        "\ncd \"${MEGATRON_LM:-.}\"\n"
        "torchrun --nproc_per_node \"$GPUS_PER_NODE\" --nnodes \"$NNODES\" --node_rank "
        "\"$NODE_RANK\" \\\n    --master_addr \"$MASTER_ADDR\" --master_port \"$MASTER_PORT\" \\\n"
        "    pretrain_gpt.py \\\n    \"${MODEL_ARGS[@]}\" \\\n    \"${TRAINING_ARGS[@]}\" \\\n"
        "    \"${MODEL_PARALLEL_ARGS[@]}\"\n";
  e.files.push_back({"launch_megatron.sh", sh, true});
  return e;
}

}  // namespace parasol::interop
