// Plan: names, parsing and JSON I/O. Validation lives in plan_validate.cc.
#include "core/plan.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "core/error.h"

namespace parasol {

const char* schedule_name(Schedule s) {
  switch (s) {
    case Schedule::kGpipe:
      return "gpipe";
    case Schedule::k1F1B:
      return "1f1b";
    case Schedule::kInterleaved:
      return "interleaved";
  }
  return "?";
}

const char* recompute_module_name(RecomputeModule m) {
  switch (m) {
    case RecomputeModule::kCoreAttn:
      return "core_attn";
    case RecomputeModule::kMoeAct:
      return "moe_act";
    case RecomputeModule::kLayernorm:
      return "layernorm";
    case RecomputeModule::kMlaUpProj:
      return "mla_up_proj";
    case RecomputeModule::kMlp:
      return "mlp";
    case RecomputeModule::kMoe:
      return "moe";
    case RecomputeModule::kSharedExperts:
      return "shared_experts";
  }
  return "?";
}

std::string recompute_label(const Plan& p) {
  std::string label = recompute_name(p.recompute);
  if (p.recompute != Recompute::kSelective || p.recompute_modules == Plan{}.recompute_modules)
    return label;
  std::string modules;
  for (int i = 0; i < kRecomputeModuleCount; ++i)
    if ((p.recompute_modules >> i) & 1u)
      modules += (modules.empty() ? "" : ",") +
                 std::string(recompute_module_name(static_cast<RecomputeModule>(i)));
  return label + ":" + modules;
}

const char* lora_target_name(LoraTarget t) {
  switch (t) {
    case LoraTarget::kQkv:
      return "linear_qkv";
    case LoraTarget::kProj:
      return "linear_proj";
    case LoraTarget::kFc1:
      return "linear_fc1";
    case LoraTarget::kFc2:
      return "linear_fc2";
  }
  return "?";
}

std::string lora_targets_name(unsigned targets) {
  std::string s;
  for (int i = 0; i < kLoraTargetCount; ++i)
    if ((targets >> i) & 1u)
      s += (s.empty() ? "" : ",") + std::string(lora_target_name(LoraTarget(i)));
  return s;
}

std::string plan_compact(const Plan& p) {
  std::string s =
      "tp" + std::to_string(p.tp) + " pp" + std::to_string(p.pp) + " dp" + std::to_string(p.dp);
  if (p.cp > 1) s += " cp" + std::to_string(p.cp);
  if (p.ep > 1) s += " ep" + std::to_string(p.ep);
  if (p.sequence_parallel) s += " sp";
  if (p.tp_comm_overlap) s += " tpo";
  if (p.tp > 1 && p.tp_impl == TpImpl::kPytorch) s += " tpt";
  if (p.ep_comm_overlap) s += " epo";
  if (p.ep > 1 && p.moe_dispatcher == MoeDispatcher::kAllGather) s += " agd";
  if (p.expert_bias_loop) s += " ebl";
  if (p.expert_fp8_padding) s += " efp";
  if (p.fp8_dispatch) s += " fp8d";
  if (p.fp8_param_gather) s += " fp8pg";
  if (p.activation_fp8_input_store) s += " act8";
  if (p.lora())
    s += " lora" + std::to_string(p.lora_rank) + ":" + lora_targets_name(p.lora_targets);
  if (p.precision == Dtype::kFp8 && p.fp8_recipe != Fp8Recipe::kDelayed)
    s += std::string(" fp8-") + fp8_recipe_name(p.fp8_recipe);
  if (p.moe_router_fusion) s += " rfuse";
  if (p.moe_router_fp32) s += " r32";
  if (p.moe_probs_in_experts) s += " pie";
  if (p.moe_gmm_experts) s += " gmm";
  if (p.moe_force_balance != MoeForceBalance::kNone)
    s += std::string(" fb-") + moe_force_balance_name(p.moe_force_balance);
  if (p.schedule == Schedule::kInterleaved)
    s += " i" + std::to_string(p.vpp);
  else if (p.pp > 1)
    s += std::string(" ") + schedule_name(p.schedule);
  s += " mbs" + std::to_string(p.micro_batch);
  if (p.pipeline_flushes > 1) s += " fl" + std::to_string(p.pipeline_flushes);
  if (p.zero > 0) {
    s += " zero" + std::to_string(p.zero);
    if (p.zero >= 3)
      s += p.reshard == Reshard::kAfterForward    ? ":fwd"
           : p.reshard == Reshard::kAfterBackward ? ":bwd"
                                                  : ":step";
    if (p.zero >= 3 && p.zero3_unit == GatherUnit::kModule) s += ":mod";
    if (p.fsdp_impl != FsdpImpl::kNone) s += std::string(":") + fsdp_impl_name(p.fsdp_impl);
    if (p.shard_degree > 0) s += ":h" + std::to_string(p.shard_degree);
  }
  if (p.recompute != Recompute::kNone) {
    std::string rc = recompute_label(p);
    if (rc.rfind("selective", 0) == 0) rc = "sel" + rc.substr(9);
    s += " rc:" + rc;
    if (p.recompute_layers >= 0) s += ":" + std::to_string(p.recompute_layers);
  }
  if (p.offload.optimizer || p.offload.params || p.offload.activations)
    s += " off:" + offload_name(p.offload);
  if (p.host_framework != HostFramework::kPytorch)
    s += " " + std::string(host_framework_name(p.host_framework));
  if (p.transformer_impl == TransformerImpl::kTransformerEngine) s += " te";
  if (p.transformer_impl == TransformerImpl::kLocal) s += " local";
  if (p.cuda_graphs != CudaGraphs::kNone)
    s += " cg:" + std::string(cuda_graphs_name(p.cuda_graphs));
  if (p.torch_compile) s += " compile";
  if (p.cp > 1 && p.cp_impl == CpImpl::kPytorch)
    s += p.cp_rotate == CpRotate::kAllGather ? " cp:torch-ag" : " cp:torch";
  if (p.cp > 1 && p.cp_comm_type != CpCommType::kP2p) {
    s += " cp:" + std::string(cp_comm_type_name(p.cp_comm_type));
    if (p.cp_comm_type == CpCommType::kA2aP2p) s += std::to_string(p.cp_a2a_size);
  }
  if (p.repeat_kv) s += " repeat-kv";
  if (p.eager_loss) s += " eager-loss";
  if (p.tiled_loss && !p.eager_loss) s += " tiled-loss";
  if (p.gemm_gelu_epilogue) s += " gelu-epilogue";
  if (p.unfused_loss()) s += " unfused-loss";
  if (p.optimizer_impl != OptimizerImpl::kFused)
    s += " opt:" + std::string(optimizer_impl_name(p.optimizer_impl));
  if (p.offload.optimizer && p.cpu_optimizer != CpuOptimizer::kDeepSpeed)
    s += " cpu-opt:" + std::string(cpu_optimizer_name(p.cpu_optimizer));
  return s;
}

const char* recompute_name(Recompute r) {
  switch (r) {
    case Recompute::kNone:
      return "none";
    case Recompute::kSelective:
      return "selective";
    case Recompute::kFull:
      return "full";
    case Recompute::kSelectiveOp:
      return "selective_op";
  }
  return "?";
}

const char* reshard_name(Reshard r) {
  switch (r) {
    case Reshard::kAfterForward:
      return "after_forward";
    case Reshard::kAfterBackward:
      return "after_backward";
    case Reshard::kAfterStep:
      return "after_step";
  }
  return "?";
}

const char* attention_kernel_name(AttentionKernel k) {
  if (k == AttentionKernel::kTriton) return "triton";
  if (k == AttentionKernel::kFa3) return "fa3";
  return k == AttentionKernel::kCudnn ? "cudnn" : "flash2";
}

const char* cp_impl_name(CpImpl c) { return c == CpImpl::kPytorch ? "torch" : "te"; }

CpImpl parse_cp_impl(const std::string& s, const std::string& field) {
  if (s == "te") return CpImpl::kTransformerEngine;
  if (s == "torch") return CpImpl::kPytorch;
  throw Error(field, "'" + s + "' is not one of te|torch");
}

const char* tp_impl_name(TpImpl t) { return t == TpImpl::kPytorch ? "torch" : "megatron"; }

TpImpl parse_tp_impl(const std::string& s, const std::string& field) {
  if (s == "megatron") return TpImpl::kMegatron;
  if (s == "torch") return TpImpl::kPytorch;
  throw Error(field, "'" + s + "' is not one of megatron|torch");
}

const char* cp_rotate_name(CpRotate r) { return r == CpRotate::kAllGather ? "allgather" : "ring"; }

CpRotate parse_cp_rotate(const std::string& s, const std::string& field) {
  if (s == "ring") return CpRotate::kRing;
  if (s == "allgather") return CpRotate::kAllGather;
  throw Error(field, "'" + s + "' is not one of ring|allgather");
}

const char* cp_comm_type_name(CpCommType c) {
  switch (c) {
    case CpCommType::kP2p:
      return "p2p";
    case CpCommType::kAllGather:
      return "all_gather";
    case CpCommType::kA2a:
      return "a2a";
    case CpCommType::kA2aP2p:
      return "a2a+p2p";
  }
  return "p2p";
}

CpCommType parse_cp_comm_type(const std::string& s, const std::string& field) {
  if (s == "p2p") return CpCommType::kP2p;
  if (s == "all_gather" || s == "allgather") return CpCommType::kAllGather;
  if (s == "a2a") return CpCommType::kA2a;
  if (s == "a2a+p2p") return CpCommType::kA2aP2p;
  throw Error(field, "'" + s + "' is not one of p2p|all_gather|a2a|a2a+p2p");
}

const char* moe_dispatcher_name(MoeDispatcher d) {
  switch (d) {
    case MoeDispatcher::kDeepEp:
      return "deepep";
    case MoeDispatcher::kAllGather:
      return "allgather";
    case MoeDispatcher::kAllToAll:
      break;
  }
  return "alltoall";
}

MoeDispatcher parse_moe_dispatcher(const std::string& s, const std::string& field) {
  if (s == "alltoall") return MoeDispatcher::kAllToAll;
  if (s == "deepep") return MoeDispatcher::kDeepEp;
  if (s == "allgather") return MoeDispatcher::kAllGather;
  throw Error(field, "'" + s + "' is not one of alltoall|deepep|allgather");
}

const char* moe_force_balance_name(MoeForceBalance b) {
  switch (b) {
    case MoeForceBalance::kNone:
      return "none";
    case MoeForceBalance::kRandom:
      return "random";
    case MoeForceBalance::kRoundRobin:
      return "round_robin";
  }
  return "none";
}

MoeForceBalance parse_moe_force_balance(const std::string& s, const std::string& field) {
  if (s == "none") return MoeForceBalance::kNone;
  if (s == "random") return MoeForceBalance::kRandom;
  if (s == "round_robin") return MoeForceBalance::kRoundRobin;
  throw Error(field, "'" + s + "' is not one of none|random|round_robin");
}

const char* fp8_recipe_name(Fp8Recipe r) {
  switch (r) {
    case Fp8Recipe::kDelayed:
      return "delayed";
    case Fp8Recipe::kTensorwise:
      return "tensorwise";
    case Fp8Recipe::kMxfp8:
      return "mxfp8";
    case Fp8Recipe::kBlockwise:
      return "blockwise";
  }
  return "delayed";
}

Fp8Recipe parse_fp8_recipe(const std::string& s, const std::string& field) {
  if (s == "delayed") return Fp8Recipe::kDelayed;
  if (s == "tensorwise") return Fp8Recipe::kTensorwise;
  if (s == "mxfp8") return Fp8Recipe::kMxfp8;
  if (s == "blockwise") return Fp8Recipe::kBlockwise;
  throw Error(field, "'" + s + "' is not one of delayed|tensorwise|mxfp8|blockwise");
}

const char* cuda_graphs_name(CudaGraphs g) {
  switch (g) {
    case CudaGraphs::kNone:
      return "none";
    case CudaGraphs::kLayers:
      return "layers";
    case CudaGraphs::kFullIteration:
      return "full_iteration";
  }
  return "?";
}

const char* optimizer_impl_name(OptimizerImpl o) {
  switch (o) {
    case OptimizerImpl::kFused:
      return "fused";
    case OptimizerImpl::kForeach:
      return "foreach";
    case OptimizerImpl::kForLoop:
      return "for_loop";
  }
  return "?";
}

const char* cpu_optimizer_name(CpuOptimizer c) {
  return c == CpuOptimizer::kTorch ? "torch" : "deepspeed";
}

const char* host_framework_name(HostFramework f) {
  return f == HostFramework::kNative ? "native" : "pytorch";
}

const char* transformer_impl_name(TransformerImpl t) {
  switch (t) {
    case TransformerImpl::kTransformerEngine:
      return "transformer_engine";
    case TransformerImpl::kLocal:
      return "local";
    case TransformerImpl::kTorch:
      break;
  }
  return "torch";
}

CudaGraphs parse_cuda_graphs(const std::string& s, const std::string& field) {
  for (CudaGraphs v : {CudaGraphs::kNone, CudaGraphs::kLayers, CudaGraphs::kFullIteration})
    if (s == cuda_graphs_name(v)) return v;
  throw Error(field, "'" + s + "' is not one of none|layers|full_iteration");
}

int parse_te_version(const std::string& s, const std::string& field) {
  // "major.minor", optionally followed by ".patch" or a local suffix ("2.14.0+f031cf87").
  size_t pos = 0;
  auto number = [&]() -> int {
    const size_t start = pos;
    while (pos < s.size() && pos - start < 4 && s[pos] >= '0' && s[pos] <= '9') ++pos;
    if (pos == start) return -1;
    return std::stoi(s.substr(start, pos - start));
  };
  const int major = number();
  const bool dot = pos < s.size() && s[pos] == '.';
  ++pos;
  const int minor = dot ? number() : -1;
  if (major < 1 || minor < 0 || minor > 99)
    throw Error(field, "'" + s + "' is not a Transformer Engine version (major.minor, e.g. 2.14)");
  return major * 100 + minor;
}

std::string te_version_name(int v) {
  return std::to_string(v / 100) + "." + std::to_string(v % 100);
}

OptimizerImpl parse_optimizer_impl(const std::string& s, const std::string& field) {
  for (OptimizerImpl v : {OptimizerImpl::kFused, OptimizerImpl::kForeach, OptimizerImpl::kForLoop})
    if (s == optimizer_impl_name(v)) return v;
  throw Error(field, "'" + s + "' is not one of fused|foreach|for_loop");
}

CpuOptimizer parse_cpu_optimizer(const std::string& s, const std::string& field) {
  if (s == "deepspeed") return CpuOptimizer::kDeepSpeed;
  if (s == "torch") return CpuOptimizer::kTorch;
  throw Error(field, "'" + s + "' is not one of deepspeed|torch");
}

HostFramework parse_host_framework(const std::string& s, const std::string& field) {
  if (s == "pytorch") return HostFramework::kPytorch;
  if (s == "native") return HostFramework::kNative;
  throw Error(field, "'" + s + "' is not one of pytorch|native");
}

TransformerImpl parse_transformer_impl(const std::string& s, const std::string& field) {
  for (TransformerImpl v :
       {TransformerImpl::kTorch, TransformerImpl::kTransformerEngine, TransformerImpl::kLocal})
    if (s == transformer_impl_name(v)) return v;
  throw Error(field, "'" + s + "' is not one of torch|transformer_engine|local");
}

AttentionKernel parse_attention_kernel(const std::string& s, const std::string& field) {
  if (s == "flash2") return AttentionKernel::kFlash2;
  if (s == "cudnn") return AttentionKernel::kCudnn;
  if (s == "triton") return AttentionKernel::kTriton;
  if (s == "fa3") return AttentionKernel::kFa3;
  throw Error(field, "'" + s + "' is not one of flash2|cudnn|triton|fa3");
}

const char* gather_unit_name(GatherUnit u) { return u == GatherUnit::kModule ? "module" : "layer"; }

GatherUnit parse_gather_unit(const std::string& s, const std::string& field) {
  if (s == "layer") return GatherUnit::kLayer;
  if (s == "module") return GatherUnit::kModule;
  throw Error(field, "'" + s + "' is not one of layer|module");
}

const char* fsdp_impl_name(FsdpImpl f) {
  return f == FsdpImpl::kFsdp1 ? "fsdp1" : f == FsdpImpl::kFsdp2 ? "fsdp2" : "none";
}

FsdpImpl parse_fsdp_impl(const std::string& s, const std::string& field) {
  for (FsdpImpl v : {FsdpImpl::kNone, FsdpImpl::kFsdp1, FsdpImpl::kFsdp2})
    if (s == fsdp_impl_name(v)) return v;
  throw Error(field, "'" + s + "' is not one of none|fsdp1|fsdp2");
}

Reshard parse_reshard(const std::string& s, const std::string& field) {
  for (Reshard v : {Reshard::kAfterForward, Reshard::kAfterBackward, Reshard::kAfterStep})
    if (s == reshard_name(v)) return v;
  throw Error(field, "'" + s + "' is not one of after_forward|after_backward|after_step");
}

Schedule parse_schedule(const std::string& s, const std::string& field) {
  for (Schedule v : {Schedule::kGpipe, Schedule::k1F1B, Schedule::kInterleaved})
    if (s == schedule_name(v)) return v;
  throw Error(field, "'" + s + "' is not one of gpipe|1f1b|interleaved");
}

Recompute parse_recompute(const std::string& s, const std::string& field) {
  for (Recompute v :
       {Recompute::kNone, Recompute::kSelective, Recompute::kFull, Recompute::kSelectiveOp})
    if (s == recompute_name(v)) return v;
  throw Error(field, "'" + s + "' is not one of none|selective|full|selective_op");
}

namespace {
// A list separated by `sep` with no empty item ("a,,b", "a," and ",a" are malformed).
bool has_empty_item(const std::string& s, char sep) {
  return s.empty() || s.front() == sep || s.back() == sep ||
         s.find(std::string(2, sep)) != std::string::npos;
}
}  // namespace

Offload parse_offload(const std::string& s, const std::string& field) {
  Offload o;
  if (s.empty() || s == "none") return o;
  if (has_empty_item(s, ',')) throw Error(field, "'" + s + "' has an empty item");
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item == "optimizer")
      o.optimizer = true;
    else if (item == "params")
      o.params = true;
    else if (item == "activations")
      o.activations = true;
    else
      throw Error(field, "'" + item + "' is not one of none|optimizer|params|activations");
  }
  return o;
}

std::string offload_name(const Offload& o) {
  std::string s;
  auto add = [&](bool on, const char* n) {
    if (on) s += (s.empty() ? "" : ",") + std::string(n);
  };
  add(o.optimizer, "optimizer");
  add(o.params, "params");
  add(o.activations, "activations");
  return s.empty() ? "none" : s;
}

const char* dim_name(Dim d) {
  switch (d) {
    case Dim::kTp:
      return "tp";
    case Dim::kCp:
      return "cp";
    case Dim::kEp:
      return "ep";
    case Dim::kDp:
      return "dp";
    case Dim::kPp:
      return "pp";
  }
  return "?";
}

std::string rank_order_name(const std::array<Dim, 5>& order) {
  std::string s;
  for (Dim d : order) s += (s.empty() ? "" : "-") + std::string(dim_name(d));
  return s;
}

std::array<Dim, 5> parse_rank_order(const std::string& s, const std::string& field) {
  std::array<Dim, 5> order{};
  if (has_empty_item(s, '-'))
    throw Error(field, "'" + s + "' must order each of tp, cp, ep, dp, pp once");
  std::stringstream ss(s);
  std::string item;
  int n = 0, seen = 0;
  while (std::getline(ss, item, '-')) {
    bool ok = false;
    for (Dim d : {Dim::kTp, Dim::kCp, Dim::kEp, Dim::kDp, Dim::kPp}) {
      if (item != dim_name(d)) continue;
      int bit = 1 << static_cast<int>(d);
      if (seen & bit) throw Error(field, "'" + item + "' appears twice in '" + s + "'");
      if (n >= 5) break;
      seen |= bit;
      order[n++] = d;
      ok = true;
    }
    if (!ok) throw Error(field, "'" + s + "' must order each of tp, cp, ep, dp, pp once");
  }
  if (n != 5) throw Error(field, "'" + s + "' must order each of tp, cp, ep, dp, pp once");
  return order;
}

int Plan::full_recompute_layers(int layers_per_stage) const {
  if (recompute != Recompute::kFull) return 0;
  return recompute_layers < 0 ? layers_per_stage : std::min(recompute_layers, layers_per_stage);
}

namespace {
bool per_virtual_stage(const Plan& p) {
  return static_cast<int>(p.stage_layers.size()) == p.pp * p.chunks() && p.chunks() > 1;
}
}  // namespace

int Plan::layers_in_stage(int model_layers, int stage) const {
  PARASOL_CHECK(0 <= stage && stage < pp, "stage " + std::to_string(stage));
  if (per_virtual_stage(*this) || accounts_edges()) {
    int n = 0;
    for (int c = 0; c < chunks(); ++c) n += layers_in_chunk(model_layers, stage, c);
    return n;
  }
  if (!stage_layers.empty()) return stage_layers[stage];
  if (first_stage_layers <= 0 && last_stage_layers <= 0) return model_layers / pp;
  if (stage == 0 && first_stage_layers > 0) return first_stage_layers;
  if (stage == pp - 1 && last_stage_layers > 0) return last_stage_layers;
  const int middle = pp - (first_stage_layers > 0) - (last_stage_layers > 0);
  return middle > 0 ? (model_layers - first_stage_layers - last_stage_layers) / middle : 0;
}

std::string Plan::split_field() const {
  if (!stage_layers.empty()) return "plan.stage_layers";
  if (first_stage_layers > 0) return "plan.first_stage_layers";
  if (last_stage_layers > 0) return "plan.last_stage_layers";
  if (account_for_embedding) return "plan.account_for_embedding_in_pipeline_split";
  if (account_for_loss) return "plan.account_for_loss_in_pipeline_split";
  return "plan.pp";
}

int Plan::max_layers_in_stage(int model_layers) const {
  if (!uneven_stages()) return model_layers / pp;
  int most = 0;
  if (!stage_layers.empty()) {
    for (int s = 0; s < pp; ++s) most = std::max(most, layers_in_stage(model_layers, s));
    return most;
  }
  // first, last and the even middle: three values at most.
  for (int s : {0, std::min(1, pp - 1), pp - 1})
    most = std::max(most, layers_in_stage(model_layers, s));
  return most;
}

int Plan::layers_in_chunk(int model_layers, int stage, int chunk) const {
  if (per_virtual_stage(*this)) return stage_layers[chunk * pp + stage];
  if (accounts_edges()) {
    // Megatron's get_num_layers_to_build: (layers + embedding + loss) / (pp x vpp) per virtual
    // stage, less the embedding on the first and the loss on the last.
    const int slots = (model_layers + account_for_embedding + account_for_loss) / (pp * chunks());
    const bool first = stage == 0 && chunk == 0;
    const bool last = stage == pp - 1 && chunk == chunks() - 1;
    return slots - (account_for_embedding && first ? 1 : 0) - (account_for_loss && last ? 1 : 0);
  }
  return layers_in_stage(model_layers, stage) / chunks();
}

int Plan::first_layer(int model_layers, int stage, int chunk) const {
  if (!uneven_stages()) {
    const int per_chunk = model_layers / pp / chunks();
    return (chunk * pp + stage) * per_chunk;
  }
  // Every virtual stage before (chunk, stage) in Megatron's order: chunks 0..chunk-1 of all
  // stages, then chunk `chunk` of stages 0..stage-1.
  int first = 0;
  for (int c = 0; c <= chunk; ++c)
    for (int s = 0; s < (c < chunk ? pp : stage); ++s) first += layers_in_chunk(model_layers, s, c);
  return first;
}

int Plan::expert_shard_ranks() const {
  const int group = expert_dp();
  return shard_degree > 0 ? std::min(group, std::max(1, shard_degree / ep)) : group;
}

Plan plan_from_json(const Json& j, const std::string& path) {
  JsonReader r(j, path);
  r.allow_only({"tp",
                "pp",
                "dp",
                "cp",
                "ep",
                "sp",
                "vpp",
                "zero",
                "mbs",
                "gbs",
                "pipeline_flushes",
                "seq",
                "schedule",
                "recompute",
                "recompute_layers",
                "recompute_modules",
                "offload",
                "precision",
                "flash_attention",
                "attention_kernel",
                "cp_impl",
                "cp_rotate",
                "cp_comm_type",
                "cp_a2a_size",
                "repeat_kv",
                "fused_kernels",
                "expandable_segments",
                "lora_rank",
                "lora_target_modules",
                "lora_dropout",
                "activation_func_fp8_input_store",
                "overlap_grad_reduce",
                "overlap_param_gather",
                "tp_comm_overlap",
                "tp_impl",
                "ep_comm_overlap",
                "moe_dispatcher",
                "moe_force_balance",
                "expert_bias_loop",
                "expert_fp8_padding",
                "fp8_dispatch",
                "fp8_recipe",
                "moe_router_fusion",
                "moe_router_fp32",
                "moe_probs_in_experts",
                "moe_gmm_experts",
                "host_framework",
                "transformer_impl",
                "cuda_graphs",
                "torch_compile",
                "eager_loss",
                "tiled_loss",
                "gemm_gelu_epilogue",
                "optimizer_impl",
                "cpu_optimizer",
                "nan_check",
                "log_params_norm",
                "log_num_zeros_in_grad",
                "p2p_sync",
                "gradient_accumulation_fusion",
                "cross_entropy_loss_fusion",
                "deterministic",
                "transformer_engine_version",
                "reshard",
                "zero3_unit",
                "zero3_prefetch_bucket",
                "zero3_max_live_parameters",
                "zero3_max_reuse_distance",
                "zero3_reduce_bucket",
                "zero3_param_persistence_threshold",
                "fsdp_impl",
                "attention_unpad",
                "loss_metric_passes",
                "shard_degree",
                "grad_reduce_dtype",
                "fp8_param_gather",
                "optimizer_dtype",
                "stage_layers",
                "first_stage_layers",
                "last_stage_layers",
                "account_for_embedding_in_pipeline_split",
                "account_for_loss_in_pipeline_split",
                "etp",
                "rank_order",
                "model",
                "cluster",
                "gpus"});
  constexpr int64_t kMaxDegree = 1 << 20;
  Plan p;
  p.tp = static_cast<int>(r.integer_or("tp", 1, 1, kMaxDegree));
  p.pp = static_cast<int>(r.integer_or("pp", 1, 1, kMaxDegree));
  p.dp = static_cast<int>(r.integer_or("dp", 1, 1, kMaxDegree));
  p.cp = static_cast<int>(r.integer_or("cp", 1, 1, kMaxDegree));
  p.ep = static_cast<int>(r.integer_or("ep", 1, 1, kMaxDegree));
  p.sequence_parallel = r.boolean_or("sp", false);
  p.vpp = static_cast<int>(r.integer_or("vpp", 1, 1, 4096));
  p.zero = static_cast<int>(r.integer_or("zero", 0, 0, 3));
  p.micro_batch = static_cast<int>(r.integer_or("mbs", 1, 1, 1 << 24));
  const int64_t default_gbs = int64_t{p.micro_batch} * p.dp;  // int would overflow
  if (!r.has("gbs") && default_gbs > (1 << 30))
    throw Error(r.field("gbs"),
                "is required when mbs x dp (" + std::to_string(default_gbs) + ") exceeds 2^30");
  p.global_batch = static_cast<int>(r.integer_or("gbs", default_gbs, 1, 1 << 30));
  p.pipeline_flushes = static_cast<int>(r.integer_or("pipeline_flushes", 1, 1, 1 << 30));
  p.seq_len = r.integer_or("seq", 0, 1, int64_t{1} << 24);
  p.schedule = parse_schedule(r.string_or("schedule", p.vpp > 1 ? "interleaved" : "1f1b"),
                              r.field("schedule"));
  p.recompute = parse_recompute(r.string_or("recompute", "none"), r.field("recompute"));
  // Absent: every layer of the stage (-1 in memory); a file or flag gives a count >= 0.
  p.recompute_layers = static_cast<int>(r.integer_or("recompute_layers", -1, 0, 100000));
  // LoRA (Plan::lora_rank): NeMo's LoRA(dim, target_modules, dropout).
  p.lora_rank = static_cast<int>(r.integer_or("lora_rank", 0, 0, 65536));
  if (r.has("lora_target_modules")) {
    // A list of NeMo's names, or one comma-separated string of them (the CLI's flag).
    std::vector<std::pair<std::string, std::string>> names;  // (path, name)
    const Json& raw = r.raw("lora_target_modules");
    if (raw.is_string()) {
      std::stringstream ss(raw.get<std::string>());
      for (std::string n; std::getline(ss, n, ',');)
        names.emplace_back(r.field("lora_target_modules"), n);
    } else if (raw.is_array()) {
      for (const auto& [ipath, item] : r.array("lora_target_modules")) {
        if (!item->is_string()) throw Error(ipath, "must be a string");
        names.emplace_back(ipath, item->get<std::string>());
      }
    } else {
      throw Error(r.field("lora_target_modules"), "must be a list of linear names");
    }
    p.lora_targets = 0;
    for (const auto& [path, name] : names) {
      int found = -1;
      for (int i = 0; i < kLoraTargetCount; ++i)
        if (name == lora_target_name(static_cast<LoraTarget>(i))) found = i;
      if (found < 0)
        throw Error(path,
                    "'" + name + "' is not one of linear_qkv|linear_proj|linear_fc1|linear_fc2");
      p.lora_targets |= 1u << found;
    }
    if (p.lora_targets == 0) throw Error(r.field("lora_target_modules"), "must name a linear");
    if (!p.lora()) throw Error(r.field("lora_target_modules"), "only applies with lora_rank > 0");
  }
  p.lora_dropout = r.number_or("lora_dropout", 0, 0, 0.999);
  p.activation_fp8_input_store = r.boolean_or("activation_func_fp8_input_store", false);
  if (p.lora_dropout > 0 && !p.lora())
    throw Error(r.field("lora_dropout"), "only applies with lora_rank > 0");
  if (r.has("recompute_modules")) {
    // A list of Megatron's names, or one comma-separated string of them.
    std::vector<std::pair<std::string, std::string>> names;  // (path, name)
    const Json& raw = r.raw("recompute_modules");
    if (raw.is_string()) {
      std::stringstream ss(raw.get<std::string>());
      for (std::string n; std::getline(ss, n, ',');)
        names.emplace_back(r.field("recompute_modules"), n);
    } else if (raw.is_array()) {
      for (const auto& [ipath, item] : r.array("recompute_modules")) {
        if (!item->is_string()) throw Error(ipath, "must be a string");
        names.emplace_back(ipath, item->get<std::string>());
      }
    } else {
      throw Error(r.field("recompute_modules"), "must be a list of module names");
    }
    p.recompute_modules = 0;
    for (const auto& [path, name] : names) {
      int found = -1;
      for (int i = 0; i < kRecomputeModuleCount; ++i)
        if (name == recompute_module_name(static_cast<RecomputeModule>(i))) found = i;
      if (found < 0)
        throw Error(path, "'" + name +
                              "' is not one of core_attn|moe_act|layernorm|mla_up_proj|mlp|moe|"
                              "shared_experts");
      p.recompute_modules |= 1u << found;
    }
    if (p.recompute != Recompute::kSelective)
      throw Error(r.field("recompute_modules"), "only applies to recompute selective");
  }
  if (r.has("offload")) {
    const Json& o = r.raw("offload");
    if (o.is_string()) {
      p.offload = parse_offload(o.get<std::string>(), r.field("offload"));
    } else if (o.is_array()) {
      std::string joined;
      for (const auto& [ipath, item] : r.array("offload")) {
        if (!item->is_string()) throw Error(ipath, "must be a string");
        joined += (joined.empty() ? "" : ",") + item->get<std::string>();
      }
      p.offload = parse_offload(joined, r.field("offload"));
    } else {
      throw Error(r.field("offload"), "must be a string or an array of strings");
    }
  }
  p.precision = parse_dtype(r.string_or("precision", "bf16"), r.field("precision"));
  p.flash_attention = r.boolean_or("flash_attention", true);
  p.attention_kernel = parse_attention_kernel(r.string_or("attention_kernel", "flash2"),
                                              r.field("attention_kernel"));
  p.cp_impl = parse_cp_impl(r.string_or("cp_impl", "te"), r.field("cp_impl"));
  p.cp_rotate = parse_cp_rotate(r.string_or("cp_rotate", "ring"), r.field("cp_rotate"));
  p.cp_comm_type = parse_cp_comm_type(r.string_or("cp_comm_type", "p2p"), r.field("cp_comm_type"));
  p.cp_a2a_size = static_cast<int>(r.integer_or("cp_a2a_size", 0, 0, kMaxDegree));
  p.repeat_kv = r.boolean_or("repeat_kv", false);
  p.fused_kernels = r.boolean_or("fused_kernels", true);
  p.expandable_segments = r.boolean_or("expandable_segments", false);
  p.overlap_grad_reduce = r.boolean_or("overlap_grad_reduce", true);
  p.overlap_param_gather = r.boolean_or("overlap_param_gather", true);
  p.tp_comm_overlap = r.boolean_or("tp_comm_overlap", false);
  p.tp_impl = parse_tp_impl(r.string_or("tp_impl", "megatron"), r.field("tp_impl"));
  p.ep_comm_overlap = r.boolean_or("ep_comm_overlap", false);
  p.moe_dispatcher =
      parse_moe_dispatcher(r.string_or("moe_dispatcher", "alltoall"), r.field("moe_dispatcher"));
  p.moe_force_balance = parse_moe_force_balance(r.string_or("moe_force_balance", "none"),
                                                r.field("moe_force_balance"));
  p.expert_bias_loop = r.boolean_or("expert_bias_loop", false);
  p.expert_fp8_padding = r.boolean_or("expert_fp8_padding", false);
  p.fp8_dispatch = r.boolean_or("fp8_dispatch", false);
  p.fp8_recipe = parse_fp8_recipe(r.string_or("fp8_recipe", "delayed"), r.field("fp8_recipe"));
  p.moe_router_fusion = r.boolean_or("moe_router_fusion", false);
  p.moe_router_fp32 = r.boolean_or("moe_router_fp32", false);
  p.moe_probs_in_experts = r.boolean_or("moe_probs_in_experts", false);
  p.moe_gmm_experts = r.boolean_or("moe_gmm_experts", false);
  p.host_framework =
      parse_host_framework(r.string_or("host_framework", "pytorch"), r.field("host_framework"));
  p.transformer_impl =
      parse_transformer_impl(r.string_or("transformer_impl", "torch"), r.field("transformer_impl"));
  p.cuda_graphs = parse_cuda_graphs(r.string_or("cuda_graphs", "none"), r.field("cuda_graphs"));
  p.torch_compile = r.boolean_or("torch_compile", false);
  p.eager_loss = r.boolean_or("eager_loss", false);
  p.tiled_loss = r.boolean_or("tiled_loss", false);
  p.gemm_gelu_epilogue = r.boolean_or("gemm_gelu_epilogue", false);
  p.optimizer_impl =
      parse_optimizer_impl(r.string_or("optimizer_impl", "fused"), r.field("optimizer_impl"));
  p.cpu_optimizer =
      parse_cpu_optimizer(r.string_or("cpu_optimizer", "deepspeed"), r.field("cpu_optimizer"));
  p.nan_check = r.boolean_or("nan_check", true);
  p.log_params_norm = r.boolean_or("log_params_norm", false);
  p.log_num_zeros_in_grad = r.boolean_or("log_num_zeros_in_grad", false);
  p.p2p_sync = r.boolean_or("p2p_sync", false);
  p.gradient_accumulation_fusion = r.boolean_or("gradient_accumulation_fusion", true);
  p.cross_entropy_loss_fusion = r.boolean_or("cross_entropy_loss_fusion", true);
  p.deterministic = r.boolean_or("deterministic", false);
  if (r.has("transformer_engine_version"))
    p.te_version = parse_te_version(r.string("transformer_engine_version"),
                                    r.field("transformer_engine_version"));
  p.reshard = parse_reshard(r.string_or("reshard", "after_forward"), r.field("reshard"));
  p.zero3_unit = parse_gather_unit(r.string_or("zero3_unit", "layer"), r.field("zero3_unit"));
  // DeepSpeed's ds_config writes them as 3e9 (a JSON number): whole numbers of elements.
  auto elements = [&r](const std::string& key, int64_t fallback, double min) {
    const double v = r.number_or(key, static_cast<double>(fallback), min, 1e15);
    if (v != std::floor(v)) throw Error(r.field(key), "must be a whole number of elements");
    return static_cast<int64_t>(v);
  };
  p.zero3_prefetch_bucket = elements("zero3_prefetch_bucket", p.zero3_prefetch_bucket, 1);
  p.zero3_max_live_parameters =
      elements("zero3_max_live_parameters", p.zero3_max_live_parameters, 0);
  p.zero3_max_reuse_distance = elements("zero3_max_reuse_distance", p.zero3_max_reuse_distance, 0);
  p.zero3_reduce_bucket = elements("zero3_reduce_bucket", p.zero3_reduce_bucket, 1);
  p.zero3_param_persistence_threshold =
      elements("zero3_param_persistence_threshold", p.zero3_param_persistence_threshold, 0);
  p.fsdp_impl = parse_fsdp_impl(r.string_or("fsdp_impl", "none"), r.field("fsdp_impl"));
  p.attention_unpad = r.boolean_or("attention_unpad", false);
  p.loss_metric_passes = static_cast<int>(r.integer_or("loss_metric_passes", 0, 0, 8));
  p.shard_degree = static_cast<int>(r.integer_or("shard_degree", 0, 0, kMaxDegree));
  p.grad_reduce_dtype =
      parse_dtype(r.string_or("grad_reduce_dtype", "fp32"), r.field("grad_reduce_dtype"));
  p.optimizer_dtype =
      parse_dtype(r.string_or("optimizer_dtype", "fp32"), r.field("optimizer_dtype"));
  p.fp8_param_gather = r.boolean_or("fp8_param_gather", false);
  if (r.has("stage_layers")) {
    for (const auto& [ipath, item] : r.array("stage_layers")) {
      if (!item->is_number_integer() || item->get<int64_t>() < 1 || item->get<int64_t>() > 100000)
        throw Error(ipath, "must be an integer in [1, 100000]");
      p.stage_layers.push_back(item->get<int>());
    }
    if (p.stage_layers.empty()) throw Error(r.field("stage_layers"), "must not be empty");
    if (r.has("first_stage_layers") || r.has("last_stage_layers"))
      throw Error(r.field("stage_layers"),
                  "give either stage_layers or first/last_stage_layers, not both");
  }
  p.first_stage_layers = static_cast<int>(r.integer_or("first_stage_layers", 0, 1, 100000));
  p.last_stage_layers = static_cast<int>(r.integer_or("last_stage_layers", 0, 1, 100000));
  p.account_for_embedding = r.boolean_or("account_for_embedding_in_pipeline_split", false);
  p.account_for_loss = r.boolean_or("account_for_loss_in_pipeline_split", false);
  p.etp = static_cast<int>(r.integer_or("etp", 0, 1, kMaxDegree));
  if (r.has("rank_order"))
    p.rank_order = parse_rank_order(r.string("rank_order"), r.field("rank_order"));
  p.model_ref = r.string_or("model", "");
  p.cluster_ref = r.string_or("cluster", "");
  p.gpus_ref = static_cast<int>(r.integer_or("gpus", 0, 1, kMaxDegree));
  return p;
}

Json plan_to_json(const Plan& p) {
  Json j = {{"tp", p.tp},
            {"pp", p.pp},
            {"dp", p.dp},
            {"cp", p.cp},
            {"ep", p.ep},
            {"sp", p.sequence_parallel},
            {"vpp", p.vpp},
            {"zero", p.zero},
            {"mbs", p.micro_batch},
            {"gbs", p.global_batch},
            {"schedule", schedule_name(p.schedule)},
            {"recompute", recompute_name(p.recompute)},
            {"offload", offload_name(p.offload)},
            {"precision", dtype_name(p.precision)},
            {"flash_attention", p.flash_attention},
            {"overlap_grad_reduce", p.overlap_grad_reduce},
            {"overlap_param_gather", p.overlap_param_gather},
            {"rank_order", rank_order_name(p.rank_order)}};
  if (p.seq_len > 0) j["seq"] = p.seq_len;
  if (p.zero == 3) j["reshard"] = reshard_name(p.reshard);
  if (p.zero == 3 && p.zero3_unit != GatherUnit::kLayer) {
    j["zero3_unit"] = gather_unit_name(p.zero3_unit);
    const Plan d;
    if (p.zero3_prefetch_bucket != d.zero3_prefetch_bucket)
      j["zero3_prefetch_bucket"] = p.zero3_prefetch_bucket;
    if (p.zero3_max_live_parameters != d.zero3_max_live_parameters)
      j["zero3_max_live_parameters"] = p.zero3_max_live_parameters;
    if (p.zero3_max_reuse_distance != d.zero3_max_reuse_distance)
      j["zero3_max_reuse_distance"] = p.zero3_max_reuse_distance;
    if (p.zero3_reduce_bucket != d.zero3_reduce_bucket)
      j["zero3_reduce_bucket"] = p.zero3_reduce_bucket;
    if (p.zero3_param_persistence_threshold != d.zero3_param_persistence_threshold)
      j["zero3_param_persistence_threshold"] = p.zero3_param_persistence_threshold;
  }
  if (p.shard_degree > 0) j["shard_degree"] = p.shard_degree;
  if (p.fsdp_impl != FsdpImpl::kNone) j["fsdp_impl"] = fsdp_impl_name(p.fsdp_impl);
  if (p.attention_unpad) j["attention_unpad"] = true;
  if (p.loss_metric_passes > 0) j["loss_metric_passes"] = p.loss_metric_passes;
  if (p.grad_reduce_dtype != Dtype::kFp32) j["grad_reduce_dtype"] = dtype_name(p.grad_reduce_dtype);
  if (p.optimizer_dtype != Dtype::kFp32) j["optimizer_dtype"] = dtype_name(p.optimizer_dtype);
  if (p.fp8_param_gather) j["fp8_param_gather"] = true;
  if (p.tp_comm_overlap) j["tp_comm_overlap"] = true;
  if (p.ep_comm_overlap) j["ep_comm_overlap"] = true;
  if (p.moe_dispatcher != MoeDispatcher::kAllToAll)
    j["moe_dispatcher"] = moe_dispatcher_name(p.moe_dispatcher);
  if (p.moe_force_balance != MoeForceBalance::kNone)
    j["moe_force_balance"] = moe_force_balance_name(p.moe_force_balance);
  if (p.expert_bias_loop) j["expert_bias_loop"] = true;
  if (p.expert_fp8_padding) j["expert_fp8_padding"] = true;
  if (p.fp8_dispatch) j["fp8_dispatch"] = true;
  if (p.fp8_recipe != Fp8Recipe::kDelayed) j["fp8_recipe"] = fp8_recipe_name(p.fp8_recipe);
  if (p.moe_router_fusion) j["moe_router_fusion"] = true;
  if (p.moe_router_fp32) j["moe_router_fp32"] = true;
  if (p.moe_probs_in_experts) j["moe_probs_in_experts"] = true;
  if (p.moe_gmm_experts) j["moe_gmm_experts"] = true;
  if (!p.fused_kernels) j["fused_kernels"] = false;
  if (p.expandable_segments) j["expandable_segments"] = true;
  if (p.host_framework != HostFramework::kPytorch)
    j["host_framework"] = host_framework_name(p.host_framework);
  if (p.transformer_impl != TransformerImpl::kTorch)
    j["transformer_impl"] = transformer_impl_name(p.transformer_impl);
  if (p.cuda_graphs != CudaGraphs::kNone) j["cuda_graphs"] = cuda_graphs_name(p.cuda_graphs);
  if (p.torch_compile) j["torch_compile"] = true;
  if (p.eager_loss) j["eager_loss"] = true;
  if (p.tiled_loss) j["tiled_loss"] = true;
  if (p.gemm_gelu_epilogue) j["gemm_gelu_epilogue"] = true;
  if (p.optimizer_impl != OptimizerImpl::kFused)
    j["optimizer_impl"] = optimizer_impl_name(p.optimizer_impl);
  if (p.cpu_optimizer != CpuOptimizer::kDeepSpeed)
    j["cpu_optimizer"] = cpu_optimizer_name(p.cpu_optimizer);
  if (!p.nan_check) j["nan_check"] = false;
  if (p.log_params_norm) j["log_params_norm"] = true;
  if (p.log_num_zeros_in_grad) j["log_num_zeros_in_grad"] = true;
  if (p.p2p_sync) j["p2p_sync"] = true;
  if (!p.gradient_accumulation_fusion) j["gradient_accumulation_fusion"] = false;
  if (!p.cross_entropy_loss_fusion) j["cross_entropy_loss_fusion"] = false;
  if (p.deterministic) j["deterministic"] = true;
  if (p.te_version > 0) j["transformer_engine_version"] = te_version_name(p.te_version);
  if (p.activation_fp8_input_store) j["activation_func_fp8_input_store"] = true;
  if (p.lora()) {
    j["lora_rank"] = p.lora_rank;
    if (p.lora_targets != Plan{}.lora_targets) {
      std::vector<std::string> names;
      for (int i = 0; i < kLoraTargetCount; ++i)
        if ((p.lora_targets >> i) & 1u)
          names.push_back(lora_target_name(static_cast<LoraTarget>(i)));
      j["lora_target_modules"] = names;
    }
    if (p.lora_dropout > 0) j["lora_dropout"] = p.lora_dropout;
  }
  if (p.attention_kernel != AttentionKernel::kFlash2)
    j["attention_kernel"] = attention_kernel_name(p.attention_kernel);
  if (p.cp_impl != CpImpl::kTransformerEngine) j["cp_impl"] = cp_impl_name(p.cp_impl);
  if (p.tp_impl != TpImpl::kMegatron) j["tp_impl"] = tp_impl_name(p.tp_impl);
  if (p.cp_rotate != CpRotate::kRing) j["cp_rotate"] = cp_rotate_name(p.cp_rotate);
  if (p.cp_comm_type != CpCommType::kP2p) j["cp_comm_type"] = cp_comm_type_name(p.cp_comm_type);
  if (p.cp_a2a_size > 0) j["cp_a2a_size"] = p.cp_a2a_size;
  if (p.repeat_kv) j["repeat_kv"] = true;
  if (!p.stage_layers.empty()) j["stage_layers"] = p.stage_layers;
  if (p.first_stage_layers > 0) j["first_stage_layers"] = p.first_stage_layers;
  if (p.last_stage_layers > 0) j["last_stage_layers"] = p.last_stage_layers;
  if (p.account_for_embedding) j["account_for_embedding_in_pipeline_split"] = true;
  if (p.account_for_loss) j["account_for_loss_in_pipeline_split"] = true;
  if (p.etp > 0) j["etp"] = p.etp;
  if (p.pipeline_flushes > 1) j["pipeline_flushes"] = p.pipeline_flushes;
  if (p.recompute_layers >= 0) j["recompute_layers"] = p.recompute_layers;
  if (p.recompute == Recompute::kSelective && p.recompute_modules != Plan{}.recompute_modules) {
    Json modules = Json::array();
    for (int i = 0; i < kRecomputeModuleCount; ++i)
      if ((p.recompute_modules >> i) & 1u)
        modules.push_back(recompute_module_name(static_cast<RecomputeModule>(i)));
    j["recompute_modules"] = modules;
  }
  if (!p.model_ref.empty()) j["model"] = p.model_ref;
  if (!p.cluster_ref.empty()) j["cluster"] = p.cluster_ref;
  if (p.gpus_ref > 0) j["gpus"] = p.gpus_ref;
  return j;
}

Plan runtime_plan(Plan p) {
  p.tp_comm_overlap = false;
  p.ep_comm_overlap = false;
  p.expert_bias_loop = false;
  p.moe_gmm_experts = false;
  p.cp_impl = CpImpl::kTransformerEngine;
  p.cp_rotate = CpRotate::kRing;
  p.cp_comm_type = CpCommType::kP2p;
  p.cp_a2a_size = 0;
  p.repeat_kv = false;
  p.tp_impl = TpImpl::kMegatron;  // where the data-gradient reductions run: an order, not numerics
  p.expert_fp8_padding = false;
  p.fp8_recipe = Fp8Recipe::kDelayed;  // current scaling's amax ops: priced, not run
  // PyTorch FSDP's own copies, MPT's unpadded attention and Composer's metric passes are the
  // frameworks' work around the same numerics, priced by the predictors, not run.
  p.fsdp_impl = FsdpImpl::kNone;
  // DeepSpeed's per-module gathers and gradient buckets (zero3_unit module: the lowering's lazy
  // gathers of core/zero3_live.h) run as a gather and a reduce-scatter per layer: the same sums.
  p.zero3_unit = GatherUnit::kLayer;
  // Megatron's allgather dispatcher brings the same rows to the same experts as the all-to-all
  // the runtime runs; its collectives and syncs are priced, not run.
  if (p.moe_dispatcher == MoeDispatcher::kAllGather) p.moe_dispatcher = MoeDispatcher::kAllToAll;
  p.attention_unpad = false;
  p.loss_metric_passes = 0;
  // torchtitan's op-level policy recomputes some of a layer's ops from kept outputs; the runtime
  // executes the layer without it (the same numerics; the predictors price the policy).
  if (p.recompute == Recompute::kSelectiveOp) p.recompute = Recompute::kNone;
  // Megatron's fp8 copy of the SwiGLU input: the runtime keeps the input in its own dtype (the
  // predictors price the copy and its cast back).
  p.activation_fp8_input_store = false;
  return p;
}

}  // namespace parasol
