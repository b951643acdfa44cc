// What issuing an op costs the host (host_cost.h).
#include "cost_models/host_cost.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/moe_load.h"

namespace parasol::cost {
namespace {

// Ops whose eager forward is an nn.Module call of its own (Megatron/TE modules, torch.nn).
bool module_kind(OpKind k) {
  switch (k) {
    case OpKind::kLinear:
    case OpKind::kExpertLinear:
    case OpKind::kRouter:
    case OpKind::kAttention:
    case OpKind::kNorm:
    case OpKind::kEmbedding:
    case OpKind::kCrossEntropy:
      return true;
    default:
      return false;
  }
}

// What an op of a transformer layer is under Megatron-Core's Transformer Engine layer spec
// (megatron/core/models/gpt/gpt_layer_specs.py: TELayerNormColumnParallelLinear for QKV and fc1,
// TERowParallelLinear for the attention output and fc2): a te.Linear call (the layer's GEMMs,
// not the router, whose logits are a torch linear, nor the output layer, Megatron's own
// ColumnParallelLinear), the LayerNorm a te.LayerNormLinear adds to it (the layer's norms), or
// neither.
enum class TeModule { kNone, kLinear, kNorm };
TeModule te_module(const Op& op, const Plan& plan) {
  if (plan.transformer_impl != TransformerImpl::kTransformerEngine || op.tags.layer < 0)
    return TeModule::kNone;
  if (op.kind == OpKind::kLinear && op.role != OpRole::kRouter && op.role != OpRole::kRouterDw &&
      op.role != OpRole::kHead)
    return TeModule::kLinear;
  if (op.kind == OpKind::kNorm) return TeModule::kNorm;
  return TeModule::kNone;
}

// Whether `op` is a GEMM of one of Megatron-Core's own tensor-parallel linear modules
// (megatron/core/tensor_parallel/layers.py ColumnParallelLinear / RowParallelLinear, whose
// forward is module code around LinearWithGradAccumulationAndAsyncCommunication, a Python
// autograd.Function): a layer's GEMMs (not the router's) under transformer_impl local, and the
// output layer wherever the plan names Megatron-Core's module sets (GPTModel's output_layer is a
// tensor_parallel.ColumnParallelLinear under either: megatron/core/models/gpt/gpt_model.py
// @5fe3f06658 L246). The output layer is the only GEMM outside a layer.
bool megatron_local_linear(const Op& op, const Plan& plan) {
  if (op.kind != OpKind::kLinear || plan.transformer_impl == TransformerImpl::kTorch) return false;
  if (op.tags.layer < 0) return true;
  return plan.transformer_impl == TransformerImpl::kLocal && op.role != OpRole::kRouter &&
         op.role != OpRole::kRouterDw;
}

bool optimizer_kind(OpKind k) {
  return k == OpKind::kAdamW || k == OpKind::kCast || k == OpKind::kGradNorm;
}

// Megatron's count_zeros_fp32 per gradient tensor: `!= 0` and `.sum()` (count_nonzero on CUDA,
// aten/src/ATen/native/ReduceOps.cpp), `numel - count`, `+ total`; three calls from Python.
constexpr int kCountZerosKernelsPerTensor = 4;
constexpr int kCountZerosPythonPerTensor = 3;
// calc_params_l2_norm's kernels besides the norm of the bucket holding the parameters (training/
// utils/common_utils.py): seven empty buckets' torch.zeros and seven adds combining the eight.
constexpr int kParamNormFixedKernels = 14;

// torch.optim's foreach and for-loop AdamW: about 8 tensor ops per step (step count, two moment
// updates, bias corrections, sqrt, add, addcdiv), 9 with decoupled weight decay.
constexpr int kAdamOps = 9;

double eager_issue_seconds(const Op& op, const Plan& plan, const Profile& f);

}  // namespace

int64_t multi_tensor_launches(int64_t tensors, double elements, int depth) {
  PARASOL_CHECK(depth >= 1 && depth <= 5, "multi-tensor depth " + std::to_string(depth));
  static constexpr int kMaxTensors[5] = {110, 64, 48, 36, 30};
  constexpr double kChunk = 65536, kMaxBlocks = 320;
  const int64_t t = std::max<int64_t>(1, tensors);
  const double chunks = std::max(1.0, std::ceil(elements / kChunk));
  const int64_t by_blocks = static_cast<int64_t>(std::ceil(chunks / kMaxBlocks));
  const int64_t by_tensors = (t + kMaxTensors[depth - 1] - 1) / kMaxTensors[depth - 1];
  return std::max(by_blocks, by_tensors);
}

bool multi_stream_expert_gemm(const Op& op, const Plan& plan) {
  return op.kind == OpKind::kExpertLinear &&
         plan.transformer_impl == TransformerImpl::kTransformerEngine;
}

int64_t kernel_launches(const Op& op, const Plan& plan) {
  const int tensors = std::max(1, op.tensors);
  const bool master = plan.optimizer_dtype == Dtype::kFp32 && plan.precision != Dtype::kFp32;
  switch (op.kind) {
    case OpKind::kAttention: {
      const bool bwd = op.tags.phase == Phase::kBackward;
      const bool flash = op.attn.batch > 0 ? op.attn.flash : plan.flash_attention;
      if (!flash) return bwd ? 6 : 3;
      return bwd && plan.attention_kernel != AttentionKernel::kCudnn ? 3 : 1;
    }
    case OpKind::kAdamW:
      switch (plan.optimizer_impl) {
        case OptimizerImpl::kFused:
          return multi_tensor_launches(tensors, op.elements, master ? 5 : 4);
        case OptimizerImpl::kForeach:
          return kAdamOps * multi_tensor_launches(tensors, op.elements, 2);
        case OptimizerImpl::kForLoop:
          return int64_t{kAdamOps} * tensors;
      }
      return 1;
    case OpKind::kCast:
      if (is_fp8_amax(op.role)) return 2 * int64_t{tensors};  // amax, then scale
      return plan.optimizer_impl == OptimizerImpl::kForLoop
                 ? tensors
                 : multi_tensor_launches(tensors, op.elements, 2);
    case OpKind::kGradNorm:
      return plan.optimizer_impl == OptimizerImpl::kForLoop
                 ? 2 * int64_t{tensors}
                 : multi_tensor_launches(tensors, op.elements, 1) +
                       multi_tensor_launches(tensors, op.elements, 1);
    case OpKind::kBias:
      if (is_expert_bias_loop(op.role))
        return expert_bias_loop(plan, op.tags.phase == Phase::kBackward, tensors,
                                op.role == OpRole::kExpertBias)
            .kernels;
      return 1;
    case OpKind::kExpertLinear:
      return multi_stream_expert_gemm(op, plan) ? std::max<int64_t>(1, op.batch) : 1;
    case OpKind::kRouter:  // the router's kernels after its GEMM (core/moe_load.h)
      return op.m > 0 ? 1 : tensors;
    case OpKind::kCountZeros:
      // count_zeros_fp32 per tensor: `!= 0` and its sum (count_nonzero on CUDA), `numel - count`
      // and the add into the total (its one zero-initialising kernel left out).
      return int64_t{kCountZerosKernelsPerTensor} * tensors;
    case OpKind::kResidualAdd:
      // Megatron-Core DDP's hook: main_grad.add_ per parameter
      // (Plan::gradient_accumulation_fusion).
      return op.role == OpRole::kMainGradAdd ? tensors : 1;
    case OpKind::kParamNorm:
      // calc_params_l2_norm: one multi-tensor L2 norm (its kernel and the cleanup kernel of
      // multi_tensor_l2norm) and its square for the bucket that holds this rank's parameters; the
      // zero-filled norms of the other seven of its eight buckets and the adds that combine them.
      return multi_tensor_launches(tensors, op.elements, 1) + 2 + kParamNormFixedKernels;
    default:
      return 1;
  }
}

AddedKernels deterministic_fills(const Op& op, const Plan& plan) {
  AddedKernels fills;
  if (!plan.deterministic || plan.transformer_impl == TransformerImpl::kTorch || op.tags.layer < 0)
    return fills;
  const bool te = plan.transformer_impl == TransformerImpl::kTransformerEngine;
  const double eb =
      plan.precision == Dtype::kFp32 ? 4 : 2;  // outputs in the math dtype (fp8: bf16)
  const bool bwd = op.tags.phase == Phase::kBackward;
  switch (te_module(op, plan)) {
    case TeModule::kLinear:
      // The weight gradient is a new tensor where the GEMM does not accumulate into main_grad
      // (Plan::gradient_accumulation_fusion off: TE's wgrad GEMM allocates it).
      if (!bwd || op.backward_data || !plan.gradient_accumulation_fusion)
        fills = {1, static_cast<double>(op.m) * static_cast<double>(op.n) *
                        std::max<int64_t>(1, op.batch) * eb};
      return fills;
    case TeModule::kNorm:
      // The output (or dx) and two per-row or per-column statistics.
      return {3, op.elements * eb};
    case TeModule::kNone:
      break;
  }
  if (op.kind != OpKind::kAttention || op.attn.batch <= 0) return fills;
  const AttnShape& a = op.attn;
  const double b = static_cast<double>(a.batch);
  const double dv = static_cast<double>(a.v_head_dim > 0 ? a.v_head_dim : a.head_dim);
  if (a.flash) {
    if (!te) return fills;
    if (!bwd) return {2, b * a.seq_q * a.heads * (dv * eb + 4)};  // output, fp32 LSE
    return {3, b *
                   (static_cast<double>(a.seq_q) * a.heads * a.head_dim +
                    static_cast<double>(a.seq_kv) * a.kv_heads * (a.head_dim + dv)) *
                   eb};  // dQ, dK, dV (backends.py L1489-1491)
  }
  // Unfused: TE's score matrix (torch.empty before baddbmm, backends.py L436) and its fused
  // softmax's output; Megatron-Core's own DotProductAttention (local) takes the score matrix from
  // a global buffer and allocates the softmax's output only (dot_product_attention.py
  // @a53107c006 L189-220). With dropout, native_dropout's output and mask (bool) forward, its
  // gradient backward.
  const double scores = b * a.heads * static_cast<double>(a.seq_q) * a.seq_kv;
  const int64_t score_fills = te ? 2 : 1;
  if (bwd) return a.dropout ? AddedKernels{1, scores * eb} : fills;
  if (!a.dropout) return {score_fills, scores * score_fills * eb};
  return {score_fills + 2, scores * ((score_fills + 1) * eb + 1)};
}

double host_issue_seconds(const Op& op, const Plan& plan, const Profile& f) {
  const AddedKernels fills = deterministic_fills(op, plan);
  const double fill_host =
      static_cast<double>(fills.launches) * (f.host_launch_s + f.host_dispatch_s);
  return eager_issue_seconds(op, plan, f) + (op.host_issue == HostIssue::kEager ? fill_host : 0);
}

namespace {

// host_issue_seconds without the fills deterministic_fills adds.
double eager_issue_seconds(const Op& op, const Plan& plan, const Profile& f) {
  const double launches = static_cast<double>(kernel_launches(op, plan));
  const bool pytorch = plan.host_framework == HostFramework::kPytorch;
  switch (op.host_issue) {
    case HostIssue::kInGraph:
      return 0;
    case HostIssue::kGraphReplay:
      return f.host_graph_launch_s + (pytorch ? f.host_python_s : 0);
    case HostIssue::kCompiledEntry:
      return f.host_compile_guard_s + launches * f.host_launch_s;
    case HostIssue::kCompiled:
      return launches * f.host_launch_s;
    case HostIssue::kEager:
      break;
  }
  const double launch = launches * f.host_launch_s;
  if (!pytorch) return launch;
  // fp8 current scaling's amax and scale kernels: launched by Transformer Engine's C++ quantizer
  // inside the linear module's call (its Python and dispatch are the module's).
  if (is_fp8_amax(op.role)) return launch;
  if (op.role == OpRole::kLora) {
    // A LoRA adapter's linear (core/lower_lora.cc): NeMo's ParallelLinearAdapter runs Megatron's
    // own linear layers, whatever the base layers' implementation: the module call's measured
    // host time in the forward, the autograd.Function's ops issued from Python in the backward
    // (as megatron_local_linear below).
    if (op.tags.phase != Phase::kBackward) return f.host_local_linear_fwd_s;
    return launch + launches * (f.host_dispatch_s + f.host_python_s);
  }
  if (op.role == OpRole::kMainGradAdd || op.role == OpRole::kXentUnfused)
    // Issued from Python, per kernel: Megatron-Core DDP's backward hook (main_grad.add_(grad));
    // the unfused loss's autograd.Function, forward (grad mode off inside it: nothing recorded)
    // and backward (core/unfused_xent.h).
    return launch + launches * (f.host_dispatch_s + f.host_python_s);
  if (const TeModule te = te_module(op, plan); te != TeModule::kNone) {
    // The module call's whole host time, its launches included: the forward (or recompute) at
    // the forward op, the backward autograd.Function at the data gradient, which issues the
    // weight gradient's GEMM too.
    // Before Transformer Engine 2.10 each call cost more (profile.h).
    const double era =
        plan.te_version > 0 && plan.te_version < 210 ? f.host_te_before_2_10_factor : 1.0;
    const bool fwd = op.tags.phase != Phase::kBackward;
    if (te == TeModule::kNorm) return era * (fwd ? f.host_te_norm_fwd_s : f.host_te_norm_bwd_s);
    if (fwd) return era * f.host_te_linear_fwd_s;
    return op.role == OpRole::kWeightGrad ? 0.0 : era * f.host_te_linear_bwd_s;
  }
  const Phase ph = op.tags.phase;
  if (multi_stream_expert_gemm(op, plan)) {
    // One grouped-linear call (te.GroupedLinear, grouped_gemm's gmm); its C++ loop launches the
    // per-expert GEMMs.
    double t = launch + f.host_dispatch_s;
    if (ph == Phase::kForward || ph == Phase::kRecompute)
      t += f.host_python_s + f.host_autograd_s + f.host_module_s;
    return t;
  }
  if (megatron_local_linear(op, plan)) {
    // The forward (or recompute) module call's measured whole host time; the backward is the
    // autograd.Function's Python, which issues each of its ops from Python.
    if (ph != Phase::kBackward) return f.host_local_linear_fwd_s;
    return launch + launches * (f.host_dispatch_s + f.host_python_s);
  }
  double t = launch + launches * f.host_dispatch_s;
  if (op.kind == OpKind::kSync || is_communication(op.kind)) {
    if (ph != Phase::kBackward) t += f.host_python_s;
    return t;
  }
  if (op.kind == OpKind::kCountZeros)
    return t + kCountZerosPythonPerTensor * std::max(1, op.tensors) * f.host_python_s;
  if (op.kind == OpKind::kParamNorm)
    // Its Python filter visits every parameter (a Python call's worth each), then calls each op.
    return t + (std::max(1, op.tensors) + launches) * f.host_python_s;
  if (optimizer_kind(op.kind)) {
    const bool per_kernel = plan.optimizer_impl == OptimizerImpl::kForLoop;
    const double calls = per_kernel                                       ? launches
                         : plan.optimizer_impl == OptimizerImpl::kForeach ? kAdamOps
                                                                          : 1;
    return t + (op.kind == OpKind::kAdamW ? calls : per_kernel ? launches : 1) * f.host_python_s;
  }
  if (ph == Phase::kForward || ph == Phase::kRecompute) {
    t += launches * (f.host_python_s + f.host_autograd_s);
    if (module_kind(op.kind)) t += f.host_module_s;
  }
  return t;
}

}  // namespace

}  // namespace parasol::cost
