// The executor's typed bf16 path (Backend's bf16 entries, runtime/backend.h; run_typed in
// runtime/executor_ops.cc): a bf16 plan on the CPU backend runs the linear GEMMs (forward, data
// and weight gradients), the norms, activations, residual adds, RoPE, the embedding and flash
// attention (bf16 Q | K | V, output and gradients, fp32 log-sum-exp) on bf16 storage, and widens
// none of their operands (0 bytes widened for attention, counted apart);
// the same plan with the entries hidden (TrainerOptions::typed_bf16 = false) widens them. The two
// runs agree within a tolerance derived as trainer_mpi_test's bf16 one:
//  * the typed GEMMs sum the same exact bf16 products as the widened ones in fp32 in another
//    order (tiles of 64 x 256 outputs, runtime/cpu/bf16_ops.cc), so a stored GEMM output can
//    round to the other neighbouring bf16 value: at most one rounding of u = 2^-8 differs per
//    GEMM output (the element-wise kernels widen, run the fp32 kernel and round as the widening
//    path does: equal bit for bit, tests/runtime/cpu/bf16_ops_test.cc). The typed attention runs
//    the fp32 attention's body on per-head tiles of the same bf16 values (other GEMM strides:
//    summation order again, tests/runtime/cpu/attention_bf16_test.cc), so its stored output and
//    dQ | dK | dV may differ by one rounding too. Along a token's forward path that is n_f = 5 L
//    + 1 outputs (QKV, attention, projection, FC1, FC2 per layer and the head), plus L for rotary
//    models (the typed path stores the QKV GEMM's output, then RoPE's: Q and K rounded twice, once
//    on the widening path); the backward adds the data gradients' n_b = 5 L + 1 (the weight
//    gradients are fp32, the plan's gradient dtype: their summation order is an fp32 rounding,
//    far below).
//  * rounding errors as independent zero-mean variables (Higham & Mary, SIAM J. Sci. Comput.
//    41(5), 2019): below lambda sqrt(n) u with probability >= 1 - 2 exp(-lambda^2 / 2), lambda
//    = 6; the loss, a mean over N tokens, within lambda u sqrt(n_f / N) relative, and the first
//    step's gradient norm, a root of a sum over every token's contributions, within
//    lambda u sqrt((n_f + n_b) / N) relative. Later steps' losses (their parameters moved by
//    AdamW steps from gradients within that bound) are held to the same bound, as the trainer
//    suite holds them.
// One rank (MPI_COMM_SELF): run under mpirun -np 1 (tests/runtime/CMakeLists.txt).
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "core/model.h"
#include "core/plan.h"
#include "core/program.h"
#include "runtime/comm/mpi_communicator.h"
#include "runtime/cpu/cpu_backend.h"
#include "runtime/trainer.h"
#include "tests/runtime/mpi_test_util.h"

namespace parasol::runtime {
namespace {

constexpr int kSteps = 3;
constexpr double kU = 1.0 / 256;  // bf16 unit roundoff
constexpr double kLambda = 6;

Plan bf16_plan() {
  Plan p;
  p.global_batch = 4;
  p.micro_batch = 2;
  p.precision = Dtype::kBf16;
  return p;
}

std::vector<StepStats> train(const Model& m, bool typed, bool gelu_epilogue = false,
                             bool device_routing = true) {
  Plan plan = bf16_plan();
  plan.gemm_gelu_epilogue = gelu_epilogue;
  auto comms = make_mpi_comm_set(plan, MPI_COMM_SELF);
  CpuBackend backend(1);
  backend.set_device_moe_routing(device_routing);
  TrainerOptions o;
  o.adamw.lr = 1e-3;
  o.typed_bf16 = typed;
  Trainer t(m, plan, backend, *comms, o);
  std::vector<StepStats> out;
  for (int i = 0; i < kSteps; ++i) out.push_back(t.step());
  return out;
}

// Trains m both ways; `all_typed`: every op of the typed kinds takes the typed path.
void expect_typed_path(const Model& m, bool all_typed, bool gelu_epilogue = false) {
  SCOPED_TRACE(m.name + (gelu_epilogue ? " gemm_gelu_epilogue" : ""));
  const std::vector<StepStats> typed = train(m, true, gelu_epilogue),
                               wide = train(m, false, gelu_epilogue);
  const double tokens = double(bf16_plan().global_batch) * bf16_plan().seq(m);
  const double n_b = 5.0 * m.layers + 1;
  const double n_f = n_b + (m.learned_positions ? 0 : m.layers);
  const double loss_tol = kLambda * kU * std::sqrt(n_f / tokens);
  const double norm_tol = kLambda * kU * std::sqrt((n_f + n_b) / tokens);
  for (int i = 0; i < kSteps; ++i) {
    SCOPED_TRACE(::testing::Message() << "step " << i + 1);
    EXPECT_GT(typed[i].typed_bf16_ops, 0);
    EXPECT_EQ(wide[i].typed_bf16_ops, 0);
    EXPECT_GT(wide[i].widened_typed_kind_bytes, 0);
    EXPECT_GT(wide[i].widened_attention_bytes, 0);
    EXPECT_LE(wide[i].widened_attention_bytes, wide[i].widened_typed_kind_bytes);
    EXPECT_EQ(typed[i].widened_attention_bytes, 0);
    if (all_typed)
      EXPECT_EQ(typed[i].widened_typed_kind_bytes, 0);
    else
      EXPECT_GT(typed[i].widened_typed_kind_bytes, 0);
    EXPECT_LT(typed[i].widened_typed_kind_bytes, wide[i].widened_typed_kind_bytes);
    EXPECT_EQ(wide[i].widened_bytes - wide[i].widened_typed_kind_bytes,
              typed[i].widened_bytes - typed[i].widened_typed_kind_bytes);
    EXPECT_NEAR(typed[i].loss, wide[i].loss, loss_tol * std::fabs(wide[i].loss));
  }
  EXPECT_NEAR(typed[0].grad_norm, wide[0].grad_norm, norm_tol * wide[0].grad_norm);
  EXPECT_LT(typed.back().loss, typed.front().loss);  // it trains
  std::printf(
      "%s: typed ops %lld per step; widened bytes of the typed kinds %lld (typed) vs %lld, of"
      " attention %lld vs %lld; losses %.7f vs %.7f (tolerance %.2e relative)\n",
      m.name.c_str(), static_cast<long long>(typed[0].typed_bf16_ops),
      static_cast<long long>(typed[0].widened_typed_kind_bytes),
      static_cast<long long>(wide[0].widened_typed_kind_bytes),
      static_cast<long long>(typed[0].widened_attention_bytes),
      static_cast<long long>(wide[0].widened_attention_bytes), typed.back().loss, wide.back().loss,
      loss_tol);
}

// GPT: learned positions, biases, layernorm, tied head (W stored [vocab x hidden]): every linear
// GEMM and every norm forward runs typed.
TEST(TypedBf16, GptRunsEveryGemmAndNormTypedAndMatchesTheWideningPath) {
  expect_typed_path(gpt_model("gpt-tiny", 2, 64, 4, 256, 32, true), true);
}

// The same GPT with FC1's GELU in its GEMM's epilogue (Plan::gemm_gelu_epilogue): the fused FC1
// and FC2 data-gradient GEMMs run typed (linear_forward_bf16 / linear_backward_data_bf16 with
// gelu_pre), the widening path runs them as the fp32 GEMM then the fp32 GELU on the unrounded
// product; each stored output is rounded once either way, so the bounds above hold.
TEST(TypedBf16, GeluEpilogueGemmsRunTyped) {
  expect_typed_path(gpt_model("gpt-tiny", 2, 64, 4, 256, 32, true), true, true);
}

// Llama: RoPE on the bf16 QKV in place (rope_bf16) after the QKV GEMM and before its data
// gradient; SwiGLU, RMSNorm: every op of the typed kinds runs typed.
TEST(TypedBf16, LlamaRunsEveryOpTypedRopeIncluded) {
  expect_typed_path(llama_model("llama-tiny", 2, 64, 4, 2, 128, 256, 32), true);
}

// Mixtral-style MoE (4 experts, top 2, every layer): the dispatch, the combine and the grouped
// expert GEMMs run typed too (moe_bf16.cc, Backend's per-expert GEMMs); the router computes in
// fp32 (its logits and probabilities are fp32 buffers; its GEMMs widen their bf16 operands and
// are not of the typed kinds). The expert GEMMs take the places of FC1 and FC2 in n_f and n_b;
// dispatch and combine equal the widening path's bit for bit (tests/runtime/cpu/moe_bf16_test.cc).
TEST(TypedBf16, MoeRunsDispatchCombineAndExpertGemmsTyped) {
  Model m = llama_model("moe-tiny", 2, 64, 4, 2, 128, 256, 32);
  m.moe = {4, 2, 64, 1};
  expect_typed_path(m, true);
}

// MoE routing kept on the device (Backend::device_moe_routing): the top-k indices, gates,
// permutation and per-expert offsets in the backend's routing memory, the typed grouped expert
// GEMMs sized from the device offsets (CpuBackend's *_bf16_dev, as the CUDA backend's
// grouped_gemm_bf16): no host read of the counts in a step (moe_count_syncs 0), where the host
// path reads them once per routing (every layer's forward and the recomputed ones: 2 layers x 2
// micro-batches here). The same permutation and the same per-expert GEMMs: equal bit for bit.
TEST(TypedBf16, MoeRoutingStaysOnTheDevice) {
  Model m = llama_model("moe-tiny", 2, 64, 4, 2, 128, 256, 32);
  m.moe = {4, 2, 64, 1};
  const std::vector<StepStats> dev = train(m, true, false, true),
                               host = train(m, true, false, false);
  for (int i = 0; i < kSteps; ++i) {
    SCOPED_TRACE(::testing::Message() << "step " << i + 1);
    EXPECT_EQ(dev[i].moe_count_syncs, 0);
    EXPECT_EQ(host[i].moe_count_syncs, 2 * 2);
    EXPECT_EQ(dev[i].loss, host[i].loss);
    EXPECT_EQ(dev[i].grad_norm, host[i].grad_norm);
    EXPECT_EQ(dev[i].typed_bf16_ops, host[i].typed_bf16_ops);
  }
  // The widening path (fp32 grouped GEMMs on host counts) reads them once per routing too.
  const std::vector<StepStats> wide = train(m, false, false, true);
  EXPECT_EQ(wide[0].moe_count_syncs, 2 * 2);
}

// Whole-step CUDA graphs on CPUs (runtime/step_graph.h): a full_iteration plan takes the same
// decision as on a GPU and runs eagerly, each step reporting why (the CPU backend records no
// graphs), and trains as the ungraphed plan does, bit for bit.
TEST(TypedBf16, FullIterationGraphsRunEagerWithTheReasonOnCpus) {
  const Model m = gpt_model("gpt-tiny", 2, 64, 4, 256, 32, true);
  Plan plan = bf16_plan();
  plan.cuda_graphs = CudaGraphs::kFullIteration;
  plan.nan_check = false;
  auto comms = make_mpi_comm_set(plan, MPI_COMM_SELF);
  CpuBackend backend(1);
  TrainerOptions o;
  o.adamw.lr = 1e-3;
  Trainer t(m, plan, backend, *comms, o);
  const std::vector<StepStats> plain = train(m, true);
  for (int i = 0; i < kSteps; ++i) {
    const StepStats s = t.step();
    EXPECT_EQ(s.graph_action, "eager");
    EXPECT_NE(s.graph_reason.find("records no CUDA graphs"), std::string::npos) << s.graph_reason;
    EXPECT_EQ(s.loss, plain[i].loss);
  }
  EXPECT_EQ(plain[0].graph_action, "eager");
  EXPECT_NE(plain[0].graph_reason.find("plan.cuda_graphs"), std::string::npos);
}

// The QKV weight gradient of a rotary model (the fix of e848ddc): the weight gradient reads
// dQKV after the data-gradient GEMM has rotated dQ and dK back through RoPE in place, so the
// rotation must reach the stored bf16 dQKV. Before the fix the widening path rotated an fp32 view
// and dropped it: the Q and K columns of dW took the gradient of the rotated output, off by
// rotations of up to `pos` radians per pair (O(1) relative at llama-tiny's 32 positions), while
// the V columns were right. The bf16 gradient is held to the fp32 run's within the rounding
// bound: each element of dW is a sum over tokens of x_t * dqkv_t whose factors carry at most
// n = n_f + n_b + 1 bf16 roundings (the forward's GEMM and attention outputs, the backward's
// data gradients, the parameters' own rounding) and one more for RoPE's store; as independent
// rounding errors (Higham & Mary) within lambda u sqrt(n + 1) of each product, and so of dW's norm
// where the sum's terms do not cancel more than they add (the V columns, which no rotation touches,
// are held to the same bound: it is the noise of bf16 training, not a bound fitted to Q and K).
std::vector<float> qkv_weight_grads(const Model& m, Dtype precision, bool typed) {
  Plan plan = bf16_plan();
  plan.precision = precision;
  auto comms = make_mpi_comm_set(plan, MPI_COMM_SELF);
  CpuBackend backend(1);
  TrainerOptions o;
  o.typed_bf16 = typed;
  o.dropout_p = 0.0f;
  Trainer t(m, plan, backend, *comms, o);
  t.step();
  const Program& prog = t.program();
  std::vector<int> grads;
  for (const Op& op : prog.ops)
    if (op.kind == OpKind::kLinear && op.role == OpRole::kWeightGrad &&
        prog.buffers[op.reads.at(1)].role == BufferRole::kQkvGrad &&
        std::find(grads.begin(), grads.end(), op.writes[0]) == grads.end())
      grads.push_back(op.writes[0]);
  std::vector<float> out;
  for (int g : grads) {
    EXPECT_EQ(prog.buffers[g].dtype, Dtype::kFp32);
    std::vector<float> host(static_cast<size_t>(prog.buffers[g].elements()));
    backend.copy(host.data(), t.executor().data(g), host.size() * sizeof(float));
    out.insert(out.end(), host.begin(), host.end());
  }
  return out;
}

void expect_rotary_qkv_gradient(bool typed) {
  const Model m = llama_model("llama-tiny", 2, 64, 4, 2, 128, 256, 32);
  const std::vector<float> ref = qkv_weight_grads(m, Dtype::kFp32, false);
  const std::vector<float> got = qkv_weight_grads(m, Dtype::kBf16, typed);
  ASSERT_EQ(ref.size(), got.size());
  ASSERT_EQ(ref.size(), size_t(m.layers) * m.hidden * (m.heads + 2 * m.kv_heads) * m.head_dim);
  const int64_t cols = (m.heads + 2 * m.kv_heads) * m.head_dim;
  const int64_t qk = (m.heads + m.kv_heads) * m.head_dim;  // Q | K columns, then V
  double d2[2] = {0, 0}, r2[2] = {0, 0};
  for (size_t i = 0; i < ref.size(); ++i) {
    const int part = static_cast<int64_t>(i) % cols < qk ? 0 : 1;
    d2[part] += (double(got[i]) - ref[i]) * (double(got[i]) - ref[i]);
    r2[part] += double(ref[i]) * ref[i];
  }
  const double n = (5.0 * m.layers + 1) * 2 + 1 + 1;
  const double tol = kLambda * kU * std::sqrt(n);
  const double qk_rel = std::sqrt(d2[0] / r2[0]), v_rel = std::sqrt(d2[1] / r2[1]);
  std::printf("QKV dW, bf16 (%s) against fp32: Q|K %.4f, V %.4f relative (bound %.4f)\n",
              typed ? "typed" : "widened", qk_rel, v_rel, tol);
  EXPECT_GT(r2[0], 0.0);
  EXPECT_LT(qk_rel, tol);
  EXPECT_LT(v_rel, tol);
}

TEST(TypedBf16, RotaryQkvWeightGradientFollowsTheRotationOnTheWideningPath) {
  expect_rotary_qkv_gradient(false);
}

TEST(TypedBf16, RotaryQkvWeightGradientFollowsTheRotationOnTheTypedPath) {
  expect_rotary_qkv_gradient(true);
}

// fp32 plans have no bf16 buffer: nothing runs typed.
TEST(TypedBf16, Fp32PlansDoNotTakeIt) {
  const Model m = gpt_model("gpt-tiny", 1, 64, 4, 256, 32, true);
  Plan plan = bf16_plan();
  plan.precision = Dtype::kFp32;
  auto comms = make_mpi_comm_set(plan, MPI_COMM_SELF);
  CpuBackend backend(1);
  Trainer t(m, plan, backend, *comms, TrainerOptions{});
  const StepStats s = t.step();
  EXPECT_EQ(s.typed_bf16_ops, 0);
  EXPECT_EQ(s.widened_bytes, 0);
}

}  // namespace
}  // namespace parasol::runtime

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
  ::testing::InitGoogleTest(&argc, argv);
  const int any = parasol::runtime::testing::run_all_ranks();
  MPI_Finalize();
  return any;
}
