// validate(plan, model, cluster): every rule that makes a plan impossible to run, each naming
// the offending field and the reason.
#include <algorithm>
#include <string>
#include <utility>

#include "core/device_family.h"
#include "core/error.h"
#include "core/plan.h"

namespace parasol {

namespace {
std::string s(int64_t v) { return std::to_string(v); }

void require_divides(int64_t d, int64_t n, const std::string& field, const std::string& what) {
  if (n % d != 0) throw Error(field, s(d) + " does not divide " + what + " (" + s(n) + ")");
}

// Megatron's embedding/loss accounting (transformer_config.py __post_init__ and
// transformer_block.py get_num_layers_to_build, NVIDIA/Megatron-LM d98e8a6): not with a layout
// or first/last stage counts; the layers plus the accounted embedding and loss split evenly over
// pp and then over vpp. Megatron builds a virtual stage left with no transformer layer (a
// stand-alone embedding or loss stage); parasol's lowering needs one in each.
void validate_accounted_split(const Plan& p, const Model& m) {
  const std::string field = p.account_for_embedding ? "plan.account_for_embedding_in_pipeline_split"
                                                    : "plan.account_for_loss_in_pipeline_split";
  if (!p.stage_layers.empty())
    throw Error(field,
                "cannot be set with stage_layers (Megatron: a pipeline layout places the "
                "embedding and loss itself)");
  if (p.first_stage_layers > 0 || p.last_stage_layers > 0)
    throw Error(field,
                "cannot be set with first/last_stage_layers (Megatron's TransformerConfig refuses "
                "both)");
  const int64_t slots = int64_t{m.layers} + p.account_for_embedding + p.account_for_loss;
  if (slots % p.pp != 0)
    throw Error(field, "the model's " + s(m.layers) + " layers with the embedding/loss counted (" +
                           s(slots) + ") do not split evenly over pp " + s(p.pp));
  if ((slots / p.pp) % p.chunks() != 0)
    throw Error(field, s(slots / p.pp) + " layers per pipeline stage (embedding/loss counted) " +
                           "do not split into the " + s(p.chunks()) + " virtual stages (vpp)");
  if (slots / (int64_t{p.pp} * p.chunks()) < 2 && p.pp * p.chunks() > 1)
    throw Error(field, "leaves a virtual stage with only the " +
                           std::string(p.account_for_embedding ? "embedding" : "loss") +
                           " and no transformer layer (" + s(slots) +
                           " over pp x vpp = " + s(int64_t{p.pp} * p.chunks()) +
                           "); parasol needs a layer in every virtual stage");
}

// Uneven pipeline stages: an explicit list, or Megatron's first/last stage layer counts with the
// remaining layers spread evenly over the middle stages; every stage's layers split evenly over
// its virtual stages.
void validate_stage_layers(const Plan& p, const Model& m) {
  if (p.accounts_edges()) return validate_accounted_split(p, m);
  const int chunks = p.chunks();
  if (!p.stage_layers.empty()) {
    const int n = static_cast<int>(p.stage_layers.size());
    const bool virtual_list = chunks > 1 && n == p.pp * chunks;
    if (n != p.pp && !virtual_list)
      throw Error(
          "plan.stage_layers",
          "lists " + s(n) + " stages but pp is " + s(p.pp) +
              (chunks > 1 ? " (or pp x vpp = " + s(p.pp * chunks) + " virtual stages)" : ""));
    int64_t sum = 0;
    for (size_t i = 0; i < p.stage_layers.size(); ++i) {
      const std::string field = "plan.stage_layers[" + s(i) + "]";
      if (p.stage_layers[i] < 1) throw Error(field, s(p.stage_layers[i]) + " must be >= 1");
      if (!virtual_list && p.stage_layers[i] % chunks != 0)
        throw Error(field, s(p.stage_layers[i]) + " layers do not split into the " + s(chunks) +
                               " virtual stages (vpp) of the stage; list the pp x vpp virtual "
                               "stages instead");
      sum += p.stage_layers[i];
    }
    if (sum != m.layers)
      throw Error("plan.stage_layers",
                  "sums to " + s(sum) + " layers but the model has " + s(m.layers));
    return;
  }
  const int first = p.first_stage_layers, last = p.last_stage_layers;
  if (first < 0 || last < 0)
    throw Error(first < 0 ? "plan.first_stage_layers" : "plan.last_stage_layers", "must be >= 0");
  const int given = (first > 0) + (last > 0);
  if (p.pp < given + (given == 2 ? 0 : 1) || p.pp < 2)
    throw Error(first > 0 ? "plan.first_stage_layers" : "plan.last_stage_layers",
                "needs pp >= " + s(std::max(2, given)) + " (pp is " + s(p.pp) + ")");
  const int64_t rest = int64_t{m.layers} - first - last;
  const int middle = p.pp - given;
  if (rest < middle || (middle == 0 && rest != 0))
    throw Error(first > 0 ? "plan.first_stage_layers" : "plan.last_stage_layers",
                "leaves " + s(rest) + " of the model's " + s(m.layers) + " layers for " +
                    s(middle) + " other stages");
  if (middle > 0 && rest % middle != 0)
    throw Error(first > 0 ? "plan.first_stage_layers" : "plan.last_stage_layers",
                "leaves " + s(rest) + " layers, which do not split evenly over the " + s(middle) +
                    " other stages");
  for (int st = 0; st < p.pp; ++st)
    if (p.layers_in_stage(m.layers, st) % chunks != 0)
      throw Error(st == 0          ? "plan.first_stage_layers"
                  : st == p.pp - 1 ? "plan.last_stage_layers"
                                   : "plan.pp",
                  s(p.layers_in_stage(m.layers, st)) + " layers of stage " + s(st) +
                      " do not split into the " + s(chunks) + " virtual stages (vpp)");
}

// The largest tensor one micro-batch makes must have a byte count that 64-bit arithmetic holds
// (with room for the sums of several): every size of the lowering and the cost models is an
// int64 product of these factors, so a plan past this bound is refused rather than computed.
void validate_tensor_sizes(const Plan& p, const Model& m) {
  constexpr double kMaxTensorBytes = 0x1p60;  // 1 EiB; int64 holds 8 EiB
  constexpr double kBytesPerElement = 8;      // the widest: fp32 values or Adam's pair of moments
  const double tokens = static_cast<double>(p.micro_batch) * static_cast<double>(p.seq(m));
  const double width = std::max<double>(
      {static_cast<double>(m.hidden), static_cast<double>(m.ffn), static_cast<double>(m.vocab),
       static_cast<double>(m.q_dim()),
       m.is_moe() ? static_cast<double>(m.moe.top_k) * static_cast<double>(m.moe.expert_ffn)
                  : 0.0});
  const double activations = tokens * width * kBytesPerElement;
  if (activations > kMaxTensorBytes)
    throw Error("plan.mbs", "mbs x seq x the widest layer (" + s(p.micro_batch) + " x " +
                                s(p.seq(m)) + " x " + s(static_cast<int64_t>(width)) +
                                ") is too large: its byte count overflows 64-bit sizes");
  const double scores = static_cast<double>(p.micro_batch) * static_cast<double>(m.heads) *
                        static_cast<double>(p.seq(m)) * static_cast<double>(p.seq(m)) *
                        kBytesPerElement;
  if (!p.flash_attention && scores > kMaxTensorBytes)
    throw Error("plan.flash_attention",
                "false materialises mbs x heads x seq x seq attention scores, whose byte count "
                "overflows 64-bit sizes; use fused attention");
}
}  // namespace

// torchtitan's op-level policy, as core/lower_recompute.cc lowers it: the mm order of a Llama
// block (separate Q, K, V projections, a SwiGLU MLP, no biases), flash attention (the SDPA
// kernel whose outputs _save_list names), one attention kernel per layer (no context
// parallelism), and torchtitan's tensor parallelism, which is sequence parallel.
std::string selective_op_refusal(const Plan& p, const Model& m) {
  const std::string why = "selective_op (torchtitan's op-level AC) is modelled for ";
  if (m.is_moe() || m.mla.enabled())
    return why + "dense Llama blocks; the model has MoE or MLA layers";
  if (m.activation != Activation::kSwiglu || m.linear_bias || m.dropout)
    return why + "Llama blocks (SwiGLU MLP, no linear biases, no dropout)";
  if (!p.flash_attention) return why + "fused attention (SDPA flash): flash_attention is off";
  if (p.cp > 1) return why + "cp 1; context parallelism is not priced";
  if (p.tp > 1 && !p.sequence_parallel)
    return why + "tensor parallelism with sequence parallelism (torchtitan's); sp is off";
  return "";
}

void validate(const Plan& p, const Model& m, const Cluster& c) {
  // Ranges first: plans built in code (search) skip plan_from_json's checks, and a degree of 0
  // would divide by zero below.
  for (const auto& [v, name] : {std::pair{p.tp, "tp"},
                                {p.pp, "pp"},
                                {p.dp, "dp"},
                                {p.cp, "cp"},
                                {p.ep, "ep"},
                                {p.vpp, "vpp"},
                                {p.micro_batch, "mbs"},
                                {p.global_batch, "gbs"}})
    if (v < 1) throw Error(std::string("plan.") + name, s(v) + " must be >= 1");
  if (p.zero < 0 || p.zero > 3) throw Error("plan.zero", s(p.zero) + " must be 0 to 3");
  if (p.recompute_layers < -1)
    throw Error("plan.recompute_layers", s(p.recompute_layers) + " must be >= -1 (-1 = all)");
  if (p.seq_len < 0) throw Error("plan.seq", s(p.seq_len) + " must be >= 0 (0 = the model's)");
  // Tensor parallelism splits heads, KV heads and MLP columns.
  require_divides(p.tp, m.heads, "plan.tp", "attention heads");
  require_divides(p.tp, m.kv_heads, "plan.tp", "KV heads");
  require_divides(p.tp, m.ffn, "plan.tp", "the MLP size ffn");
  if (m.is_moe() && p.expert_tp() == p.tp)
    require_divides(p.tp, m.moe.expert_ffn, "plan.tp", "the expert MLP size");
  const int gpus = c.num_gpus();
  // In double: four int degrees can overflow int64; a product equal to gpus is exact.
  const double product = static_cast<double>(p.tp) * p.pp * p.dp * p.cp;
  if (product != gpus)
    throw Error("plan", "tp x pp x dp x cp = " + s(p.tp) + " x " + s(p.pp) + " x " + s(p.dp) +
                            " x " + s(p.cp) + " = " +
                            (product < 9e18 ? s(static_cast<int64_t>(product)) : "more than 9e18") +
                            " differs from the " + s(gpus) + " GPUs of the cluster");
  const int64_t seq = p.seq(m);
  validate_tensor_sizes(p, m);
  if (m.learned_positions && seq > m.seq_len)
    throw Error("plan.seq",
                s(seq) + " exceeds the " + s(m.seq_len) + " learned positions of the model");
  if (p.sequence_parallel) {
    if (p.tp == 1) throw Error("plan.sp", "sequence parallelism needs tp > 1");
    require_divides(p.tp, seq / p.cp, "plan.tp", "the sequence per context rank with sp");
  }
  // Pipelines.
  if (p.vpp > 1 && p.schedule != Schedule::kInterleaved)
    throw Error("plan.vpp", s(p.vpp) + " virtual stages need schedule interleaved, not " +
                                schedule_name(p.schedule));
  if (p.schedule == Schedule::kInterleaved) {
    if (p.pp < 2) throw Error("plan.schedule", "interleaved needs pp > 1");
    if (p.vpp < 2) throw Error("plan.vpp", "interleaved needs vpp >= 2");
  }
  // Megatron-Core's combined 1F1B (combined_1f1b.py) pairs a forward with a backward without a
  // pipeline or in the interleaved schedule only.
  if (p.ep_comm_overlap && p.pp > 1 && p.schedule != Schedule::kInterleaved)
    throw Error("plan.ep_comm_overlap",
                "Megatron-Core overlaps expert all-to-alls across micro-batches without a pipeline "
                "or with the interleaved schedule, not " +
                    std::string(schedule_name(p.schedule)) + " with pp " + s(p.pp));
  // The host (core/host_issue.h).
  if (p.torch_compile && p.host_framework != HostFramework::kPytorch)
    throw Error("plan.torch_compile", "torch.compile needs host_framework pytorch, not " +
                                          std::string(host_framework_name(p.host_framework)));
  if (p.transformer_impl != TransformerImpl::kTorch && p.host_framework != HostFramework::kPytorch)
    throw Error("plan.transformer_impl",
                std::string(p.transformer_impl == TransformerImpl::kLocal
                                ? "Megatron-Core's local modules"
                                : "Transformer Engine's modules") +
                    " are PyTorch modules; they need host_framework pytorch, not " +
                    std::string(host_framework_name(p.host_framework)));
  if (p.eager_loss && p.host_framework != HostFramework::kPytorch)
    throw Error("plan.eager_loss",
                "the eager loss is PyTorch's F.cross_entropy; it needs "
                "host_framework pytorch, not " +
                    std::string(host_framework_name(p.host_framework)));
  // Megatron refuses a full-iteration graph with the NaN check (arguments.py: its loss .item()
  // cannot be captured), and a sync inside any graph cannot be replayed.
  if (p.cuda_graphs == CudaGraphs::kFullIteration && p.nan_check)
    throw Error("plan.cuda_graphs",
                "full_iteration needs nan_check false (Megatron: --no-check-for-nan-in-loss-and-"
                "grad; the check's device-to-host sync cannot be captured in a graph)");
  if (p.cuda_graphs == CudaGraphs::kFullIteration && p.p2p_sync && p.pp > 1)
    throw Error("plan.p2p_sync",
                "a full_iteration graph cannot capture the torch.cuda.synchronize() after each "
                "pipeline exchange; p2p_sync needs cuda_graphs none or layers");
  if (p.cuda_graphs == CudaGraphs::kFullIteration && m.is_moe())
    throw Error("plan.cuda_graphs",
                "full_iteration cannot capture a dropless MoE layer's token-count sync");
  if (!p.uneven_stages()) {
    require_divides(int64_t{p.pp} * p.vpp, m.layers, "plan.pp",
                    "layers (pp x vpp must divide them)");
  } else {
    validate_stage_layers(p, m);
  }
  // Batches.
  if (p.global_batch % (int64_t{p.dp} * p.micro_batch) != 0)
    throw Error("plan.gbs", s(p.global_batch) + " is not a multiple of dp x mbs = " + s(p.dp) +
                                " x " + s(p.micro_batch));
  if (p.pipeline_flushes < 1)
    throw Error("plan.pipeline_flushes", s(p.pipeline_flushes) + " must be >= 1");
  if (p.micro_batches() % p.pipeline_flushes != 0)
    throw Error("plan.pipeline_flushes", s(p.pipeline_flushes) +
                                             " does not divide the micro-batch count (" +
                                             s(p.micro_batches()) + ")");
  if (p.schedule == Schedule::kInterleaved && p.flush_micro_batches() % p.pp != 0)
    throw Error(p.pipeline_flushes > 1 ? "plan.pipeline_flushes" : "plan.gbs",
                "interleaved needs the micro-batch count" +
                    std::string(p.pipeline_flushes > 1 ? " of a flush (" : " (") +
                    s(p.flush_micro_batches()) + ") to be a multiple of pp (" + s(p.pp) + ")");
  // Experts.
  if (p.ep > 1 && !m.is_moe())
    throw Error("plan.ep", s(p.ep) + " > 1 but the model has no experts");
  if (m.is_moe()) require_divides(p.ep, m.moe.experts, "plan.ep", "experts");
  if (p.etp < 0) throw Error("plan.etp", s(p.etp) + " must be >= 1 (0 = tp)");
  if (p.etp > 0 && !m.is_moe()) throw Error("plan.etp", "is set but the model has no experts");
  if (p.moe_force_balance != MoeForceBalance::kNone && !m.is_moe())
    throw Error("plan.moe_force_balance", std::string(moe_force_balance_name(p.moe_force_balance)) +
                                              " is set but the model has no experts");
  // Megatron's allgather dispatcher gathers over TP x EP (token_dispatcher.py
  // MoEAllGatherTokenDispatcher); parasol prices it over the expert-parallel group alone.
  if (p.moe_dispatcher == MoeDispatcher::kAllGather && (p.tp > 1 || p.expert_tp() > 1))
    throw Error("plan.moe_dispatcher",
                "allgather is modelled at tp 1 and etp 1 only (its all-gather spans TP x EP)");
  if (p.moe_dispatcher == MoeDispatcher::kAllGather && p.ep_comm_overlap)
    throw Error("plan.ep_comm_overlap",
                "Megatron overlaps the alltoall and flex dispatchers' exchanges only, not "
                "allgather's (transformer_config.py @d98e8a64dd)");
  if (p.expert_tp() == p.tp) {
    require_divides(p.ep, p.dp, "plan.ep",
                    "dp (expert parallelism is carved out of data parallelism)");
  } else {
    // Megatron's expert grid: etp x ep x edp over each stage's tp x cp x dp ranks.
    require_divides(int64_t{p.expert_tp()} * p.ep, int64_t{p.tp} * p.cp * p.dp, "plan.ep",
                    "tp x cp x dp with etp x ep = " + s(p.expert_tp()) + " x " + s(p.ep));
    if (m.is_moe())
      require_divides(p.expert_tp(), m.moe.expert_ffn, "plan.etp", "the expert MLP size");
  }
  // Context parallelism: causal load balancing cuts each sequence into 2 x cp chunks.
  if (p.cp > 1) require_divides(2 * p.cp, seq, "plan.cp", "the sequence length (2 x cp chunks)");
  if (p.cp_rotate == CpRotate::kAllGather && p.cp_impl != CpImpl::kPytorch)
    throw Error("plan.cp_rotate",
                "allgather is PyTorch's rotater (cp_impl torch); Transformer Engine's ring "
                "(cp_impl te) passes the K/V shards point to point");
  // Megatron's --cp-comm-type: Transformer Engine's exchanges.
  if (p.cp_comm_type != CpCommType::kP2p && p.cp_impl != CpImpl::kTransformerEngine)
    throw Error("plan.cp_comm_type",
                std::string(cp_comm_type_name(p.cp_comm_type)) +
                    " is Megatron-Core's --cp-comm-type (cp_impl te); PyTorch's context_parallel "
                    "(cp_impl torch) chooses with cp_rotate");
  if (p.cp > 1 && p.cp_comm_type != CpCommType::kP2p && !p.flash_attention)
    throw Error("plan.cp_comm_type", std::string(cp_comm_type_name(p.cp_comm_type)) +
                                         " runs Transformer Engine's fused attention "
                                         "(flash_attention true)");
  // megatron/training/arguments.py: --hierarchical-context-parallel-sizes must be set when
  // a2a+p2p is used, and multiply to the context-parallel size.
  if (p.cp_comm_type == CpCommType::kA2aP2p) {
    if (p.cp_a2a_size < 2 || p.cp_a2a_size >= p.cp)
      throw Error("plan.cp_a2a_size",
                  s(p.cp_a2a_size) +
                      " must be set to the all-to-all group of a2a+p2p: from 2 to "
                      "cp / 2 (cp " +
                      s(p.cp) + ")");
    require_divides(p.cp_a2a_size, p.cp, "plan.cp_a2a_size", "cp");
  } else if (p.cp_a2a_size != 0) {
    throw Error("plan.cp_a2a_size", "is set but cp_comm_type is " +
                                        std::string(cp_comm_type_name(p.cp_comm_type)) +
                                        ", not a2a+p2p");
  }
  if (p.cp > 1 && (p.cp_comm_type == CpCommType::kA2a || p.cp_comm_type == CpCommType::kA2aP2p)) {
    // context_parallel.py AttnFuncWithCPAndQKVOA2A: 'requires num_heads % cp_size == 0 for Q, K,
    // V' (the heads of this tensor-parallel rank; cp_size the all-to-all group's).
    const int a2a = p.cp_comm_type == CpCommType::kA2a ? p.cp : p.cp_a2a_size;
    const std::string why = "of this tensor-parallel rank (" +
                            std::string(cp_comm_type_name(p.cp_comm_type)) + " splits them over " +
                            s(a2a) + " context ranks)";
    require_divides(a2a, m.heads / p.tp, "plan.cp", "the attention heads " + why);
    require_divides(a2a, std::max<int64_t>(1, m.kv_heads / p.tp), "plan.cp",
                    "the K/V heads " + why);
  }
  // Sharding.
  if (p.reshard != Reshard::kAfterForward && p.zero != 3)
    throw Error("plan.reshard", std::string(reshard_name(p.reshard)) +
                                    " applies to ZeRO-3 (sharded parameters), not ZeRO-" +
                                    s(p.zero));
  if (p.fsdp_impl != FsdpImpl::kNone && (p.zero != 3 || p.zero3_unit != GatherUnit::kLayer))
    throw Error("plan.fsdp_impl", std::string(fsdp_impl_name(p.fsdp_impl)) +
                                      " needs zero 3 with zero3_unit layer (FSDP's units)");
  if (p.attention_unpad &&
      (!p.flash_attention || p.attention_kernel != AttentionKernel::kFlash2 || p.cp > 1))
    throw Error("plan.attention_unpad",
                "needs flash_attention with attention_kernel flash2 and no context parallelism "
                "(flash-attn's varlen path)");
  if (p.zero3_unit != GatherUnit::kLayer && p.zero != 3)
    throw Error("plan.zero3_unit", std::string(gather_unit_name(p.zero3_unit)) +
                                       " applies to ZeRO-3 (sharded parameters), not ZeRO-" +
                                       s(p.zero));
  {
    // DeepSpeed ZeRO-3's coordinator and bucket sizes (ds_config keys) mean nothing elsewhere.
    const Plan d;
    const std::pair<const char*, bool> ds_keys[] = {
        {"plan.zero3_prefetch_bucket", p.zero3_prefetch_bucket != d.zero3_prefetch_bucket},
        {"plan.zero3_max_live_parameters",
         p.zero3_max_live_parameters != d.zero3_max_live_parameters},
        {"plan.zero3_max_reuse_distance", p.zero3_max_reuse_distance != d.zero3_max_reuse_distance},
        {"plan.zero3_reduce_bucket", p.zero3_reduce_bucket != d.zero3_reduce_bucket},
        {"plan.zero3_param_persistence_threshold",
         p.zero3_param_persistence_threshold != d.zero3_param_persistence_threshold}};
    for (const auto& [field, set] : ds_keys)
      if (set && (p.zero != 3 || p.zero3_unit != GatherUnit::kModule))
        throw Error(field, "is DeepSpeed ZeRO-3's: it needs zero 3 with zero3_unit module");
    if (p.zero3_max_live_parameters < 0 || p.zero3_max_reuse_distance < 0)
      throw Error(p.zero3_max_live_parameters < 0 ? "plan.zero3_max_live_parameters"
                                                  : "plan.zero3_max_reuse_distance",
                  "must be >= 0 elements");
    if (p.zero3_param_persistence_threshold < 0)
      throw Error("plan.zero3_param_persistence_threshold", "must be >= 0 elements");
    // DeepSpeed's prefetch bucket of 0 is overlap_param_gather false.
    if (p.zero3_prefetch_bucket < 1)
      throw Error("plan.zero3_prefetch_bucket",
                  "must be >= 1 element (no prefetch: overlap_param_gather false)");
    if (p.zero3_reduce_bucket < 1) throw Error("plan.zero3_reduce_bucket", "must be >= 1 element");
  }
  if (p.shard_degree > 0) {
    if (p.zero == 0) throw Error("plan.shard_degree", "needs ZeRO 1-3 (there is nothing to shard)");
    require_divides(p.shard_degree, int64_t{p.dp} * p.cp, "plan.shard_degree",
                    "the data-parallel group dp x cp");
    if (p.ep > 1 && (p.shard_degree % p.ep != 0 || p.expert_dp() % (p.shard_degree / p.ep) != 0))
      throw Error("plan.shard_degree", s(p.shard_degree) + " must be a multiple of ep (" + s(p.ep) +
                                           ") whose quotient divides the expert data-parallel "
                                           "group (= " +
                                           s(p.expert_dp()) + ")");
  }
  if (p.optimizer_dtype != Dtype::kFp32 && p.optimizer_dtype != Dtype::kBf16)
    throw Error("plan.optimizer_dtype",
                std::string(dtype_name(p.optimizer_dtype)) + " must be fp32 or bf16");
  if (p.optimizer_dtype == Dtype::kBf16 && p.precision != Dtype::kBf16)
    throw Error("plan.optimizer_dtype",
                std::string("bf16 optimizer state keeps bf16 weights; the precision is ") +
                    dtype_name(p.precision));
  if (p.grad_reduce_dtype != Dtype::kFp32 && p.grad_reduce_dtype != Dtype::kBf16 &&
      p.grad_reduce_dtype != Dtype::kFp16)
    throw Error("plan.grad_reduce_dtype",
                std::string(dtype_name(p.grad_reduce_dtype)) + " must be fp32, bf16 or fp16");
  // Megatron-Core --fp8-param-gather: fp8 weights need fp8 training (TransformerConfig:
  // "fp8_param must be used together with fp8 mode") and the distributed optimizer
  // (arguments.py @d98e8a6: "--fp8-param-gather only supported with distributed optimizer, torch
  // fsdp2, megatron fsdp"); parasol models the distributed optimizer's buffers only.
  if (p.fp8_param_gather) {
    if (p.precision != Dtype::kFp8)
      throw Error("plan.fp8_param_gather",
                  std::string("fp8 weights need precision fp8, not ") + dtype_name(p.precision));
    if (p.zero < 1 || p.zero > 2)
      throw Error(
          "plan.fp8_param_gather",
          "fp8 weights are gathered by Megatron's distributed optimizer: zero 1 or 2, not " +
              s(p.zero));
    if (p.offload.params || p.offload.optimizer)
      throw Error("plan.fp8_param_gather",
                  "fp8 weights with parameters or optimizer in host memory are not modelled");
  }
  // Recompute.
  if (p.recompute_layers >= 0 && p.recompute != Recompute::kFull)
    throw Error("plan.recompute_layers", "only applies to recompute full");
  if (p.recompute_layers > p.max_layers_in_stage(m.layers))
    throw Error("plan.recompute_layers", s(p.recompute_layers) + " exceeds the " +
                                             s(p.max_layers_in_stage(m.layers)) +
                                             " layers of the largest stage");
  // torchtitan's op-level policy where it is modelled (selective_op_refusal).
  if (p.recompute == Recompute::kSelectiveOp)
    if (std::string why = selective_op_refusal(p, m); !why.empty())
      throw Error("plan.recompute", why);
  if (p.activation_fp8_input_store && m.is_moe())
    throw Error("plan.activation_func_fp8_input_store",
                "is modelled for dense MLPs only (not MoE experts)");
  if (p.activation_fp8_input_store && m.activation != Activation::kSwiglu)
    throw Error("plan.activation_func_fp8_input_store",
                "applies to SwiGLU only (Megatron-Core: \"Storing activation input in FP8 is "
                "supported only for SwiGLU.\")");
  // LoRA (Plan::lora_rank): what parasol models of NeMo's LoRA (core/lower_lora.cc).
  if (p.lora()) {
    // The price caches hold the rank in three bits (cost_models/estimate.cc price_flags_more).
    if (p.lora_rank > 128 || (p.lora_rank & (p.lora_rank - 1)) != 0)
      throw Error("plan.lora_rank", s(p.lora_rank) +
                                        " is not modelled: the predictors hold ranks 1, 2, 4, ..., "
                                        "128");
    if (p.lora_targets == 0 || p.lora_targets >= (1u << kLoraTargetCount))
      throw Error("plan.lora_target_modules",
                  "must name linear_qkv, linear_proj, linear_fc1 or "
                  "linear_fc2");
    // NeMo's ParallelLinearAdapter splits A or B over the tensor-parallel group and adds its
    // own collectives (and with a2a_experimental all-to-alls): not lowered yet.
    if (p.tp > 1) throw Error("plan.lora_rank", "LoRA adapters are modelled at tp 1 only");
    if (m.is_moe() || m.mla.enabled())
      throw Error("plan.lora_rank",
                  "LoRA adapters are modelled on dense models with GQA/MHA "
                  "attention only (not MoE or MLA)");
    if (p.zero >= 3)
      throw Error("plan.lora_rank",
                  "LoRA with ZeRO-3 / FSDP (sharded frozen weights) is not "
                  "modelled; use zero 0 to 2 (Megatron's distributed optimizer)");
    if (p.offload.any()) throw Error("plan.offload", "offload with LoRA is not modelled");
    if (p.recompute == Recompute::kSelectiveOp)
      throw Error("plan.recompute", "torchtitan's op-level recompute with LoRA is not modelled");
    if (p.gemm_gelu_epilogue && m.activation == Activation::kGelu)
      throw Error("plan.gemm_gelu_epilogue", "FC1's GELU epilogue with LoRA is not modelled");
  }
  // Recompute modules: those the model has.
  if (p.recomputes(RecomputeModule::kMlaUpProj) && !m.mla.enabled())
    throw Error("plan.recompute_modules", "mla_up_proj needs a model with MLA attention");
  for (RecomputeModule r :
       {RecomputeModule::kMoeAct, RecomputeModule::kMoe, RecomputeModule::kSharedExperts})
    if (p.recomputes(r) && !m.is_moe())
      throw Error("plan.recompute_modules",
                  std::string(recompute_module_name(r)) + " needs a model with MoE layers");
  if (p.recomputes(RecomputeModule::kSharedExperts) && m.moe.shared_experts == 0)
    throw Error("plan.recompute_modules", "shared_experts needs a model with shared experts");
  // Offload and precision.
  if (p.offload.any() && c.host_memory_per_gpu(0) <= 0)
    throw Error("plan.offload", offload_name(p.offload) +
                                    " needs host memory, and the cluster's "
                                    "servers have none");
  if (p.offload.any() && c.host_link_bw(0) <= 0)
    throw Error("plan.offload", "no link joins the GPUs to host memory");
  const DeviceSpec& dev = c.gpu_device(0);
  if (p.precision == Dtype::kFp8 && dev.peak_fp8_flops <= 0)
    throw Error("plan.precision", std::string("fp8 is not supported by ") + dev.name);
  if (p.precision == Dtype::kTf32)
    throw Error("plan.precision", "tf32 is a math mode, not a training precision; use fp32");
  // FlashAttention-3 is built for sm90 only (Dao-AILab/flash-attention hopper/README.md:
  // "Requirements: H100 / H800 GPU, CUDA >= 12.3"): the Hopper family (core/device_family.h).
  if (p.flash_attention && p.attention_kernel == AttentionKernel::kFa3 &&
      device_family(dev) != DeviceFamily::kHopper)
    throw Error("plan.attention_kernel",
                std::string("fa3 (FlashAttention-3) runs on Hopper GPUs only, not ") + dev.name);
}

}  // namespace parasol
