// The runtime's correctness suite: every Plan feature trained for real under MPI (up to 8 ranks)
// against the serial run of the same model (every degree 1): the losses of 3 steps within 1e-5
// relative and every parameter after 3 steps within 1e-4 (relative to its tensor's largest
// magnitude), compared through plan-independent checkpoints. Also: a checkpoint saved under one
// plan resumes under another with the serial losses; recompute reuses the dropout masks; the
// measured peak memory of each rank (gathered from every rank) holds the parameters, gradients and
// Adam moments of the tensor slices that rank owns, counted from the model's tensors and the
// parameter layout, and is the liveness prediction within 5%.
//
// One binary, run with 8 ranks; a plan of N ranks runs on world ranks 0..N-1 while the others
// wait. The serial reference runs on world rank 0 alone (MPI_COMM_SELF).
#include <gtest/gtest.h>
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <map>
#include <set>
#include <thread>

#include "core/error.h"
#include "core/liveness.h"
#include "core/lower.h"
#include "runtime/checkpoint.h"
#include "runtime/comm/mpi_communicator.h"
#include "runtime/cpu/cpu_backend.h"
#include "runtime/data.h"
#include "runtime/executor.h"
#include "runtime/host_staging.h"
#include "runtime/param_init.h"
#include "runtime/param_layout.h"
#include "runtime/trainer.h"
#include "tests/runtime/mpi_test_util.h"
#include "tests/runtime/test_backend.h"

namespace parasol::runtime {
namespace {

constexpr int kSteps = 3;

using testing::quiet_barrier;
using testing::world_rank;
using testing::world_size;

// A shared scratch directory (made by rank 0).
const std::string& scratch() {
  static std::string dir = [] {
    char buf[256] = {0};
    if (world_rank() == 0) {
      std::string t = (std::filesystem::temp_directory_path() / "parasol-runtime-XXXXXX").string();
      std::snprintf(buf, sizeof buf, "%s", t.c_str());
      if (mkdtemp(buf) == nullptr) std::abort();
    }
    MPI_Bcast(buf, sizeof buf, MPI_CHAR, 0, MPI_COMM_WORLD);
    return std::string(buf);
  }();
  return dir;
}

// Llama-style (rmsnorm, swiglu, GQA) and GPT-style (layernorm, gelu, biases, learned positions)
// models of 4 layers, small enough for 8 oversubscribed ranks.
Model llama4() {
  Model m = llama_model("llama4", 4, 64, 8, 4, 128, 256, 32);
  return m;
}
Model gpt4(bool dropout = false) {
  Model m = gpt_model("gpt4", 4, 64, 4, 256, 32, false);
  m.dropout = dropout;
  return m;
}
Model moe4() {
  Model m = llama_model("moe4", 2, 64, 4, 2, 128, 256, 32);
  m.moe = {4, 2, 64, 1};
  return m;
}
// DeepSeek-style multi-head latent attention (query latent 32, kv latent 16, 8 + 4 query/key
// dims per head, 6 value dims), with or without query compression.
Model mla4(bool q_lora = true) {
  Model m = llama_model(q_lora ? "mla4" : "mla4-q", 4, 64, 4, 4, 128, 256, 32);
  m.mla = {q_lora ? 32 : 0, 16, 8, 4, 6};
  m.head_dim = m.mla.qk_head_dim();
  return m;
}
// Sliding windows of 8 of the 32 tokens on every other layer (GPT-OSS's alternation).
Model windowed4() {
  Model m = llama4();
  m.name = "windowed4";
  m.sliding_window = 8;
  m.full_attention_every = 2;
  return m;
}
Model windowed_gpt4() {
  Model m = gpt4();
  m.name = "windowed-gpt4";
  m.sliding_window = 5;
  return m;
}
// A dense first layer, then MoE layers with two shared experts (one fused MLP of 2 x 32).
Model shared_moe4() {
  Model m = llama_model("shared-moe4", 3, 64, 4, 2, 128, 256, 32);
  m.moe = {4, 2, 64, 1, 1, 2, 32};
  return m;
}

// The precision the suite trains every plan in: fp32, or with PARASOL_TEST_PRECISION=bf16 in the
// environment the same plans in mixed precision (bf16 parameters, activations and their
// gradients; fp32 parameter gradients, master weights and Adam moments), each against the serial
// bf16 run (tests/runtime/CMakeLists.txt runs the suite both ways).
Dtype suite_precision() {
  static const Dtype d = [] {
    const char* v = std::getenv("PARASOL_TEST_PRECISION");
    if (v == nullptr || *v == '\0' || std::string(v) == "fp32") return Dtype::kFp32;
    if (std::string(v) == "bf16") return Dtype::kBf16;
    std::fprintf(stderr, "PARASOL_TEST_PRECISION=%s: not fp32 or bf16\n", v);
    std::abort();
  }();
  return d;
}

Plan base_plan(int gbs = 8) {
  Plan p;
  p.global_batch = gbs;
  p.micro_batch = 1;
  p.precision = suite_precision();
  return p;
}

// bf16's unit roundoff: 8 significant bits, round to nearest: u = 2^-8.
constexpr double kBf16Roundoff = 1.0 / 256;
constexpr double kLr = 1e-3;  // AdamW's learning rate in train()

std::string describe(const Plan& p) {
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "tp%d pp%d dp%d cp%d ep%d sp%d vpp%d %s zero%d %s shard%d rc%d flash%d off%d%d%d",
                p.tp, p.pp, p.dp, p.cp, p.ep, p.sequence_parallel ? 1 : 0, p.vpp,
                schedule_name(p.schedule), p.zero, reshard_name(p.reshard), p.shard_degree,
                static_cast<int>(p.recompute), p.flash_attention ? 1 : 0, p.offload.optimizer,
                p.offload.params, p.offload.activations);
  std::string out = buf;
  for (int i = 0; i < kRecomputeModuleCount; ++i)
    if (p.recompute == Recompute::kSelective && (p.recompute_modules >> i) & 1u)
      out += std::string(" ") + recompute_module_name(static_cast<RecomputeModule>(i));
  for (int l : p.stage_layers) out += " " + std::to_string(l);
  if (p.first_stage_layers > 0) out += " first " + std::to_string(p.first_stage_layers);
  if (p.last_stage_layers > 0) out += " last " + std::to_string(p.last_stage_layers);
  return out;
}

// One rank's device memory after its steps: measured by the backend's allocator, predicted by
// liveness, and the bytes of the parameter slices it owns counted independently of the Program:
// the model's full tensors (runtime/param_layout.h) of its stage's layers (the embedding on the
// first stage, the head on the last), each cut to local_shape() for its coordinates.
struct RankMemory {
  double in_plan = 0;  // 1 for a rank of the plan
  double peak_total = 0;
  std::array<double, kBufferClasses> peak{};  // by BufferClass
  double predicted_peak = 0;
  double owned_elements = 0;       // elements of the parameter slices it owns (unsharded)
  double executed_order_peak = 0;  // liveness over the order the executor issued the ops
  double counter_peak = 0;         // the largest sample of the traced step's device-memory counter
};

// The liveness peak of `prog` with its ops taken in the order the executor started them (the
// trace of a step): the executor issues each stream's ops as their dependencies finish, not in
// the Program's issue order that liveness() follows. A transfer holds its buffers until it
// completes, while the host runs other ops: it appears twice, where it started and where it
// ended, so that its buffers are live in between.
double executed_order_peak(const Program& prog, const std::vector<traces::TraceEvent>& events) {
  std::vector<std::pair<double, int>> at;  // (time, op id)
  for (const traces::TraceEvent& e : events) {
    at.emplace_back(e.start_s, e.op_id);
    if (is_communication(prog.ops.at(e.op_id).kind)) at.emplace_back(e.end_s(), e.op_id);
  }
  std::stable_sort(at.begin(), at.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  Program order = prog;
  order.ops.clear();
  std::set<int> seen;
  for (const auto& [t, id] : at) {
    Op op = prog.ops.at(id);
    op.id = static_cast<int>(order.ops.size());
    order.ops.push_back(std::move(op));
    seen.insert(id);
  }
  if (seen.size() != prog.ops.size()) return -1;  // not every op traced
  return liveness(order).peak_bytes;
}

struct Outcome {
  std::vector<double> losses;
  int64_t peak_bytes = 0;
  double predicted_peak = 0;
  std::vector<RankMemory> ranks;  // every rank of `world`, gathered
};

// Elements of the parameter slices the rank at `co` owns before any ZeRO sharding.
double owned_elements(const Model& m, const Plan& plan, const RankCoord& co) {
  std::vector<bool> mine(m.layers, false);
  for (int c = 0; c < plan.chunks(); ++c) {
    const int first = plan.first_layer(m.layers, co.pp, c);
    for (int l = first; l < first + plan.layers_in_chunk(m.layers, co.pp, c); ++l) mine[l] = true;
  }
  double n = 0;
  for (const TensorInfo& t : model_tensors(m, has_tied_head_copy(m, plan))) {
    const bool held = t.layer >= 0                   ? mine[t.layer]
                      : t.name.rfind("emb.", 0) == 0 ? co.pp == 0
                                                     : co.pp == plan.pp - 1;
    if (!held) continue;
    double e = 1;
    for (int64_t d : local_shape(m, plan, co, t.name)) e *= d;
    n += e;
  }
  return n;
}

// Trains `plan` on the first plan.gpus() world ranks for `steps` steps (after resuming from
// `resume` when given) and saves to `save` when given. Returns rank 0's outcome (empty on ranks
// outside the plan).
Outcome train(const Model& m, const Plan& plan, int steps, const std::string& save,
              const std::string& resume = "", MPI_Comm world = MPI_COMM_WORLD) {
  int size = 0, rank = 0;
  MPI_Comm_size(world, &size);
  MPI_Comm_rank(world, &rank);
  const int n = plan.gpus();
  MPI_Comm sub;
  MPI_Comm_split(world, rank < n ? 0 : MPI_UNDEFINED, rank, &sub);
  Outcome out;
  RankMemory mem;
  if (sub != MPI_COMM_NULL) {
    // An error on one rank would leave the others waiting in a collective: abort the run.
    try {
      auto comms = make_mpi_comm_set(plan, sub);
      auto backend_ptr = testing::make_test_backend(1);
      Backend& backend = *backend_ptr;
      TrainerOptions opt;
      opt.adamw.lr = kLr;
      // Some gradients are mathematically zero (the key bias: softmax ignores a shift of every
      // score) and numerically rounding noise, which AdamW with eps 1e-8 turns into updates of
      // random sign and full size lr. A larger eps keeps such elements still, in every plan, so
      // that the parameters compare; the well-conditioned gradients dwarf it.
      opt.adamw.eps = 1e-6;
      Trainer t(m, plan, backend, *comms, opt);
      if (!resume.empty()) t.load(resume);
      for (int i = 0; i < steps; ++i) {
        StepStats s = t.step(/*trace=*/i == steps - 1);  // the last step's issue order
        out.losses.push_back(s.loss);
        out.peak_bytes = s.peak_bytes;
      }
      out.predicted_peak = liveness(t.program()).peak_bytes;
      mem.in_plan = 1;
      const MemoryStats stats = backend.device_memory();
      mem.peak_total = static_cast<double>(stats.peak_total);
      for (int c = 0; c < kBufferClasses; ++c) mem.peak[c] = static_cast<double>(stats.peak[c]);
      mem.predicted_peak = out.predicted_peak;
      mem.executed_order_peak = executed_order_peak(t.program(), t.last_events());
      for (const traces::TraceCounter& c : t.last_counters())
        mem.counter_peak = std::max(mem.counter_peak, c.value);
      mem.owned_elements = owned_elements(m, plan, RankLayout(plan).coord(rank));
      if (!save.empty()) t.save(save);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "rank %d, %s %s: %s\n", world_rank(), m.name.c_str(),
                   describe(plan).c_str(), e.what());
      MPI_Abort(MPI_COMM_WORLD, 3);
    }
    MPI_Comm_free(&sub);
  }
  quiet_barrier(world);
  out.ranks.resize(size);
  constexpr int kFields = sizeof(RankMemory) / sizeof(double);
  static_assert(sizeof(RankMemory) == kFields * sizeof(double));
  MPI_Allgather(&mem, kFields, MPI_DOUBLE, out.ranks.data(), kFields, MPI_DOUBLE, world);
  return out;
}

// The serial run of (model, global batch): losses and checkpoint after kSteps, on rank 0.
struct Reference {
  std::vector<double> losses;
  std::string dir;
};
const Reference& serial(const Model& m, int gbs, Dtype precision = suite_precision()) {
  static std::map<std::string, Reference> cache;
  const std::string key =
      m.name + (m.dropout ? "-drop" : "") + "-" + std::to_string(gbs) + "-" + dtype_name(precision);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  Reference ref;
  ref.dir = scratch() + "/serial-" + key;
  if (world_rank() == 0) {
    Plan p = base_plan(gbs);
    p.precision = precision;
    ref.losses = train(m, p, kSteps, ref.dir, "", MPI_COMM_SELF).losses;
  }
  quiet_barrier(MPI_COMM_WORLD);
  return cache.emplace(key, ref).first->second;
}

// Largest |a - b| / largest |b| over one state file pair.
double file_error(const std::string& a, const std::string& b) {
  auto read = [](const std::string& p) {
    std::ifstream f(p, std::ios::binary);
    std::vector<float> v;
    float x;
    while (f.read(reinterpret_cast<char*>(&x), sizeof x)) v.push_back(x);
    return v;
  };
  std::vector<float> va = read(a), vb = read(b);
  if (va.size() != vb.size() || va.empty()) return 1e30;
  double diff = 0, scale = 0;
  for (size_t i = 0; i < va.size(); ++i) {
    diff = std::max(diff, std::fabs(static_cast<double>(va[i]) - vb[i]));
    scale = std::max(scale, std::fabs(static_cast<double>(vb[i])));
  }
  return scale > 0 ? diff / scale : diff;
}

// Largest |a - b| over one state file pair.
double file_abs_error(const std::string& a, const std::string& b) {
  auto read = [](const std::string& p) {
    std::ifstream f(p, std::ios::binary);
    std::vector<float> v;
    float x;
    while (f.read(reinterpret_cast<char*>(&x), sizeof x)) v.push_back(x);
    return v;
  };
  std::vector<float> va = read(a), vb = read(b);
  if (va.size() != vb.size() || va.empty()) return 1e30;
  double diff = 0;
  for (size_t i = 0; i < va.size(); ++i)
    diff = std::max(diff, std::fabs(static_cast<double>(va[i]) - vb[i]));
  return diff;
}

// How far a plan's run may be from the serial run of the same precision.
//
// fp32: losses within 1e-5 relative, every state tensor (parameters, Adam moments) within 1e-4
// of its largest magnitude (summation orders only).
//
// bf16: the plan rounds some stored tensors differently from the serial run: a reduction split
// over the w = tp x cp ranks that hold a token's activations rounds each rank's partial to bf16
// and the bf16 sum again (up to w + 1 roundings of u = 2^-8 where the serial run has one), at
// the two residual branches of each of the L layers, plus the embedding and the logits: at most
// n = 2 L (w + 1) + 2 roundings along a token's path. Rounding errors behave as independent
// zero-mean variables (Higham & Mary, "A New Approach to Probabilistic Rounding Error Analysis",
// SIAM J. Sci. Comput. 41(5), 2019): their sum stays below lambda sqrt(n) u with probability at
// least 1 - 2 exp(-lambda^2 / 2); lambda = 6 (1.5e-8). The loss is the mean over the N tokens of
// the step, whose independent errors average by 1 / sqrt(N): relative tolerance
// lambda u sqrt(n / N). Parameters: the fp32 master weights move by AdamW's bounded steps, so two
// runs whose gradients differ by rounding can differ per element by at most the two steps'
// sizes: |m^ / (sqrt(v^) + eps)| <= sqrt(max_i w_i / w'_i) (Cauchy-Schwarz over the bias-corrected
// weights w of beta1 and w' of beta2 of each step's gradient), so the masters differ by at most
// B_t = B_(t-1) (1 + lr wd) + 2 lr r_t after step t; a wrong shard, gather or cast moves a weight
// by its magnitude, far beyond. The moments follow the gradients of rounding-level elements
// (zero-mean gradients such as the key bias's), which are not compared in bf16.
struct Tolerance {
  double loss = 0;       // relative, per step
  double state = 0;      // fp32: per checkpoint tensor, largest |a - b| / largest |b| (file_error)
  double param_abs = 0;  // bf16: largest |a - b| of the master weights
};
Tolerance tolerance(const Model& m, const Plan& plan) {
  if (plan.precision == Dtype::kFp32) return {1e-5, 1e-4, 0};
  Tolerance t;
  const double w = double(plan.tp) * plan.cp;
  // FC1's GELU in its GEMM's epilogue (Plan::gemm_gelu_epilogue) against the serial run's
  // separate activation: GELU reads the fp32 product where the serial run reads its bf16
  // rounding, and FC2's data gradient meets GELU's derivative unrounded: two roundings per layer.
  const double fused = plan.gemm_gelu_epilogue && m.activation == Activation::kGelu ? 2.0 : 0.0;
  const double n = 2.0 * m.layers * (w + 1) + 2 + fused * m.layers;
  const double tokens = double(plan.global_batch) * plan.seq(m);
  constexpr double kLambda = 6;
  t.loss = kLambda * kBf16Roundoff * std::sqrt(n / tokens);
  const AdamWConfig a;  // train()'s betas and weight decay
  double bound = 0;
  for (int step = 1; step <= kSteps; ++step) {
    double worst = 0;
    for (int i = 1; i <= step; ++i) {
      const double w1 = (1 - a.beta1) * std::pow(a.beta1, step - i) / (1 - std::pow(a.beta1, step));
      const double w2 = (1 - a.beta2) * std::pow(a.beta2, step - i) / (1 - std::pow(a.beta2, step));
      worst = std::max(worst, w1 / w2);
    }
    bound = bound * (1 + kLr * a.weight_decay) + 2 * kLr * std::sqrt(worst);
  }
  t.param_abs = bound;
  return t;
}

// Trains `plan` and checks it against the serial run.
void expect_matches_serial(const Model& m, const Plan& plan) {
  SCOPED_TRACE(m.name + " " + describe(plan));
  const Reference& ref = serial(m, plan.global_batch, plan.precision);
  static int run = 0;
  const std::string dir = scratch() + "/run" + std::to_string(run++);
  Outcome got = train(m, plan, kSteps, dir);
  if (world_rank() != 0) return;
  const Tolerance tol = tolerance(m, plan);
  ASSERT_EQ(got.losses.size(), ref.losses.size());
  double worst_loss = 0, worst_state = 0;
  for (size_t i = 0; i < got.losses.size(); ++i) {
    EXPECT_NEAR(got.losses[i], ref.losses[i], tol.loss * std::fabs(ref.losses[i]))
        << "step " << i + 1;
    worst_loss = std::max(worst_loss, std::fabs(got.losses[i] - ref.losses[i]) / ref.losses[i]);
  }
  EXPECT_LT(got.losses.back(), got.losses.front());  // it trains
  // The saves are step directories under dir and ref.dir (runtime/checkpoint.h).
  const std::string got_dir = resolve_checkpoint(dir), ref_dir = resolve_checkpoint(ref.dir);
  for (const TensorInfo& t : model_tensors(m)) {
    if (plan.precision != Dtype::kFp32) {
      const double e = file_abs_error(checkpoint_file(got_dir, "params", t.name),
                                      checkpoint_file(ref_dir, "params", t.name));
      EXPECT_LE(e, tol.param_abs) << "params/" << t.name;
      worst_state = std::max(worst_state, e / tol.param_abs);
      continue;
    }
    for (const char* kind : {"params", "adam_m", "adam_v"}) {
      const double e = file_error(checkpoint_file(got_dir, kind, t.name),
                                  checkpoint_file(ref_dir, kind, t.name));
      EXPECT_LE(e, tol.state) << kind << "/" << t.name;
      worst_state = std::max(worst_state, e);
    }
  }
  if (std::getenv("PARASOL_TEST_VERBOSE"))
    std::fprintf(stderr, "%s %s: loss %.3g (tolerance %.3g) state %.3g\n", m.name.c_str(),
                 describe(plan).c_str(), worst_loss, tol.loss, worst_state);
}

// Fails the test on rank 0 when it failed on any rank.
class Runtime : public ::testing::Test {
 protected:
  void TearDown() override {
    const int mine = HasFailure() ? 1 : 0;
    std::vector<int> all(world_size());
    MPI_Allgather(&mine, 1, MPI_INT, all.data(), 1, MPI_INT, MPI_COMM_WORLD);
    for (int r = 1; r < world_size(); ++r)
      if (all[r] && world_rank() == 0) ADD_FAILURE() << "failed on rank " << r;
  }
};

TEST_F(Runtime, TensorParallel) {
  for (int tp : {2, 4}) {
    Plan p = base_plan();
    p.tp = tp;
    expect_matches_serial(llama4(), p);
    p.sequence_parallel = true;
    expect_matches_serial(gpt4(), p);
  }
}

TEST_F(Runtime, PipelineSchedules) {
  for (Schedule s : {Schedule::kGpipe, Schedule::k1F1B}) {
    for (int pp : {2, 4}) {
      Plan p = base_plan();
      p.pp = pp;
      p.schedule = s;
      expect_matches_serial(pp == 2 ? llama4() : gpt4(), p);
    }
  }
  Plan p = base_plan();
  p.pp = 2;
  p.vpp = 2;
  p.schedule = Schedule::kInterleaved;
  expect_matches_serial(llama4(), p);
  Model eight = llama4();
  eight.layers = 8;
  eight.name = "llama8";
  p.pp = 4;
  expect_matches_serial(eight, p);
}

TEST_F(Runtime, DataParallelAndZero) {
  for (int zero = 0; zero <= 3; ++zero) {
    Plan p = base_plan();
    p.dp = 2;
    p.zero = zero;
    expect_matches_serial(gpt4(), p);
  }
  for (int zero : {1, 3}) {
    Plan p = base_plan();
    p.dp = 4;
    p.zero = zero;
    expect_matches_serial(llama4(), p);
  }
}

// Data parallelism overlaps the gradient reduction with the backward pass, as DDP does and as the
// cost models price it: a bucket's all-reduce starts once its gradients are complete, while the
// earlier layers' backward still runs (and the compute stream does not run the whole backward
// pass before the gradient stream may start a transfer).
TEST_F(Runtime, GradientReductionStartsBesideTheBackwardPass) {
  Plan p = base_plan(/*gbs=*/2);  // one micro-batch per rank: each bucket is final in its layer
  p.dp = 2;
  const Model m = gpt4();
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm sub;
  MPI_Comm_split(MPI_COMM_WORLD, rank < p.gpus() ? 0 : MPI_UNDEFINED, rank, &sub);
  if (sub != MPI_COMM_NULL) {
    auto comms = make_mpi_comm_set(p, sub);
    auto backend = testing::make_test_backend(1);
    Trainer t(m, p, *backend, *comms, TrainerOptions{});
    t.step(/*trace=*/false);
    t.step(/*trace=*/true);
    double first_reduction_start = 1e30, last_backward_end = -1;
    int reductions = 0;
    for (const traces::TraceEvent& e : t.last_events()) {
      const Op& op = t.program().ops.at(e.op_id);
      if (op.kind == OpKind::kAllReduce && op.group == Group::kDpCp) {  // a gradient bucket
        ++reductions;
        first_reduction_start = std::min(first_reduction_start, e.start_s);
      } else if (e.phase == "bwd" && !is_communication(op.kind)) {
        last_backward_end = std::max(last_backward_end, e.end_s());
      }
    }
    EXPECT_GE(reductions, 2) << "gradient buckets";
    EXPECT_GT(last_backward_end, 0);
    EXPECT_LT(first_reduction_start, last_backward_end)
        << "the first gradient all-reduce started after the backward pass ended";
    MPI_Comm_free(&sub);
  }
  quiet_barrier(MPI_COMM_WORLD);
}

TEST_F(Runtime, ContextParallel) {
  Plan p = base_plan();
  p.cp = 2;
  expect_matches_serial(llama4(), p);
  p.tp = 2;
  expect_matches_serial(gpt4(), p);
}

TEST_F(Runtime, Recompute) {
  for (bool flash : {true, false})
    for (Recompute r : {Recompute::kSelective, Recompute::kFull}) {
      Plan p = base_plan();
      p.tp = 2;
      p.flash_attention = flash;
      p.recompute = r;
      expect_matches_serial(gpt4(), p);
    }
  Plan p = base_plan();
  p.pp = 2;
  p.recompute = Recompute::kFull;
  p.recompute_layers = 1;
  expect_matches_serial(llama4(), p);
}

// Selective recompute of Megatron's modules: each module's forward re-run before the backward
// (TP collectives, the experts' all-to-alls and MLA's up-projections included) gives the serial
// run's losses and parameters.
Plan with_modules(Plan p, std::initializer_list<RecomputeModule> modules) {
  p.recompute = Recompute::kSelective;
  p.recompute_modules = 0;
  for (RecomputeModule r : modules) p.recompute_modules |= 1u << static_cast<int>(r);
  return p;
}

TEST_F(Runtime, RecomputeModules) {
  using RM = RecomputeModule;
  Plan p = base_plan();
  p.tp = 2;
  p.flash_attention = false;
  expect_matches_serial(gpt4(), with_modules(p, {RM::kMlp, RM::kCoreAttn}));
  p.sequence_parallel = true;
  p.flash_attention = true;
  expect_matches_serial(llama4(), with_modules(p, {RM::kMlp}));
  p = base_plan();
  p.dp = 2;
  p.ep = 2;
  expect_matches_serial(moe4(), with_modules(p, {RM::kMoeAct, RM::kLayernorm}));
  expect_matches_serial(moe4(), with_modules(p, {RM::kMoe}));
  expect_matches_serial(shared_moe4(), with_modules(p, {RM::kSharedExperts}));
  p.tp = 2;
  expect_matches_serial(shared_moe4(), with_modules(p, {RM::kMoe, RM::kLayernorm, RM::kMlp}));
  p.dp = 4;
  p.ep = 4;
  p.etp = 1;
  p.sequence_parallel = true;
  expect_matches_serial(moe4(), with_modules(p, {RM::kMoe}));
  p = base_plan();
  p.tp = 2;
  expect_matches_serial(mla4(), with_modules(p, {RM::kMlaUpProj}));
  p.sequence_parallel = true;
  p.flash_attention = false;
  expect_matches_serial(mla4(false), with_modules(p, {RM::kMlaUpProj, RM::kCoreAttn}));
}

TEST_F(Runtime, Offload) {
  for (int which = 0; which < 3; ++which) {
    Plan p = base_plan();
    p.dp = 2;
    p.zero = which == 1 ? 3 : 1;
    p.offload.optimizer = which == 0;
    p.offload.params = which == 1;
    p.offload.activations = which == 2;
    expect_matches_serial(gpt4(), p);
  }
}

TEST_F(Runtime, MixtureOfExperts) {
  Plan p = base_plan();
  p.dp = 2;
  expect_matches_serial(moe4(), p);
  p.tp = 2;
  p.dp = 1;
  expect_matches_serial(moe4(), p);
}

TEST_F(Runtime, ExpertParallelTop1AndTop2) {
  for (int top_k : {1, 2}) {
    Model m = moe4();
    m.moe.top_k = top_k;
    m.name += "-top" + std::to_string(top_k);
    for (int ep : {2, 4}) {
      Plan p = base_plan();
      p.dp = 4;
      p.ep = ep;
      p.zero = ep == 2 ? 1 : 0;
      expect_matches_serial(m, p);
    }
  }
  Plan p = base_plan();
  p.tp = 2;
  p.dp = 2;
  p.ep = 2;
  p.recompute = Recompute::kFull;
  expect_matches_serial(moe4(), p);
}

TEST_F(Runtime, MixedPlans) {
  Plan p = base_plan();
  p.tp = 2;
  p.pp = 2;
  p.dp = 2;
  expect_matches_serial(llama4(), p);
  p.sequence_parallel = true;
  p.zero = 1;
  p.schedule = Schedule::kInterleaved;
  p.vpp = 2;
  expect_matches_serial(gpt4(), p);
}

TEST_F(Runtime, SequenceParallelWithShardedGradients) {
  // The norms' and row-parallel biases' partial gradients are summed over tp before the
  // data-parallel reduce-scatter.
  for (int zero : {2, 3}) {
    Plan p = base_plan();
    p.tp = 2;
    p.dp = 2;
    p.sequence_parallel = true;
    p.zero = zero;
    expect_matches_serial(gpt4(), p);
  }
  Plan p = base_plan();
  p.tp = 2;
  p.pp = 2;
  p.dp = 2;
  p.sequence_parallel = true;
  p.zero = 3;
  p.reshard = Reshard::kAfterStep;
  expect_matches_serial(llama4(), p);
}

TEST_F(Runtime, UnevenPipelineStages) {
  for (Schedule s : {Schedule::kGpipe, Schedule::k1F1B}) {
    Plan p = base_plan();
    p.pp = 2;
    p.schedule = s;
    p.stage_layers = {1, 3};
    expect_matches_serial(llama4(), p);
  }
  Plan p = base_plan();
  p.pp = 2;
  p.dp = 2;
  p.zero = 1;
  p.stage_layers = {3, 1};
  p.recompute = Recompute::kFull;
  p.recompute_layers = 1;
  expect_matches_serial(gpt4(), p);
  // Megatron's first/last stage layer counts, interleaved: 12 layers on pp 4 x vpp 2 hold 2, 4,
  // 4, 2 layers.
  Model twelve = llama4();
  twelve.layers = 12;
  twelve.name = "llama12";
  p = base_plan();
  p.pp = 4;
  p.vpp = 2;
  p.schedule = Schedule::kInterleaved;
  p.first_stage_layers = 2;
  p.last_stage_layers = 2;
  expect_matches_serial(twelve, p);
  // Per-virtual-stage counts (Megatron's layout): chunks of one stage of different sizes.
  Model six = llama4();
  six.layers = 6;
  six.name = "llama6";
  p = base_plan();
  p.pp = 2;
  p.vpp = 2;
  p.schedule = Schedule::kInterleaved;
  p.stage_layers = {2, 1, 1, 2};
  expect_matches_serial(six, p);
}

TEST_F(Runtime, Zero3WithPipelineInEachReshardMode) {
  for (Schedule s : {Schedule::k1F1B, Schedule::kInterleaved})
    for (Reshard r : {Reshard::kAfterForward, Reshard::kAfterBackward, Reshard::kAfterStep}) {
      Plan p = base_plan();
      p.pp = 2;
      p.dp = 2;
      p.zero = 3;
      p.reshard = r;
      p.schedule = s;
      p.vpp = s == Schedule::kInterleaved ? 2 : 1;
      expect_matches_serial(llama4(), p);
    }
  // With full recompute (the recompute reuses the held weights) and uneven stages.
  Plan p = base_plan();
  p.pp = 2;
  p.dp = 2;
  p.zero = 3;
  p.reshard = Reshard::kAfterBackward;
  p.recompute = Recompute::kFull;
  p.stage_layers = {3, 1};
  expect_matches_serial(gpt4(), p);
}

TEST_F(Runtime, HybridShardedDataParallel) {
  for (int zero : {1, 2, 3}) {
    Plan p = base_plan();
    p.dp = 4;
    p.shard_degree = 2;
    p.zero = zero;
    expect_matches_serial(llama4(), p);
  }
  Plan p = base_plan();
  p.dp = 4;
  p.pp = 2;
  p.shard_degree = 2;
  p.zero = 3;
  p.reshard = Reshard::kAfterStep;
  expect_matches_serial(gpt4(), p);
  // Experts shard over 4 / ep = 2 of their 4 data-parallel ranks, dense weights over 4 of 8.
  p = base_plan();
  p.dp = 8;
  p.ep = 2;
  p.shard_degree = 4;
  p.zero = 1;
  expect_matches_serial(moe4(), p);
}

// fp8 plans are priced by the simulator; the runtime refuses them naming the field.
TEST_F(Runtime, Fp8PlansAreRefusedByName) {
  if (world_rank() == 0) {
    Plan p = base_plan();
    p.precision = Dtype::kFp8;
    auto comms = make_mpi_comm_set(p, MPI_COMM_SELF);
    auto backend_ptr = testing::make_test_backend(1);
    Backend& backend = *backend_ptr;
    const Model m = llama4();
    try {
      Trainer t(m, p, backend, *comms, TrainerOptions{});
      ADD_FAILURE() << "an fp8 plan was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("plan.precision"), std::string::npos) << e.what();
    }
  }
  quiet_barrier(MPI_COMM_WORLD);
}

// Gradients reduced in bf16 (Megatron's grad_reduce_in_fp32 off), in a bf16 plan, against the
// serial bf16 run (fp32 gradients) within the bf16 tolerance (in both suites). Under ZeRO 0 and 1
// the gradient buffer itself is bf16, as Megatron's (distributed/param_and_grad_buffer.py
// @d98e8a6: grad_dtype = param.dtype unless grad_reduce_in_fp32): each of a rank's k = 8
// micro-batches adds its weight gradient into it rounded once, the all-reduce or reduce-scatter
// sums in bf16, and the optimizer reads it widened (Megatron's main_grad.float()). Under ZeRO 2
// the fp32 gradients are rounded for the reduce-scatter and widened back. The tolerance is the
// suite's (tolerance()): the loss's first step is before any update and equal; later steps and
// the master weights move by AdamW's steps, each bounded by sqrt(max w / w') whatever the
// gradient, so the k + 1 extra roundings of a gradient element stay inside param_abs, while a
// gradient buffer read in the wrong dtype moves the weights by their magnitude (it trained NaN).
// Under ZeRO < 2 the measured gradient bytes are 2 a parameter (expect_memory_of_every_rank).
void expect_memory_of_every_rank(const Model& m, const Plan& plan, const Outcome& got);

TEST_F(Runtime, GradientsReducedInBfloat) {
  const Model m = llama4();
  for (int zero : {0, 1, 2}) {
    Plan p = base_plan(16);
    p.precision = Dtype::kBf16;
    p.dp = 2;
    p.zero = zero;
    p.grad_reduce_dtype = Dtype::kBf16;
    SCOPED_TRACE(describe(p));
    // The Program's gradient buffers are bf16 below ZeRO 2 (else this tests the staging path).
    const Program prog = lower_stage(m, p, 0);
    int grads = 0;
    for (const ParamBucket& b : prog.buckets)
      for (int id : b.grads) {
        EXPECT_EQ(prog.buffers[id].dtype, zero < 2 ? Dtype::kBf16 : Dtype::kFp32);
        ++grads;
      }
    if (zero < 2) EXPECT_GT(grads, 0);
    expect_matches_serial(m, p);
    // Below ZeRO 2 nothing is staged: the measured peak is the Program's. (ZeRO 2's rounded
    // copies of the fp32 gradients are workspaces the Program does not list, as many at once as
    // reductions the executor has in flight: up to 15% over liveness under load.)
    if (zero < 2) expect_memory_of_every_rank(m, p, train(m, p, 1, ""));
  }
}

// FSDP2 (fsdp_impl fsdp2) keeps its root group's gathered embedding table from the forward to the
// embedding's backward (core/lower_edges.cc fsdp2_root_held: the backward lists the table, which
// the executor does not read): it trains as the serial run, and the measured peak is the
// liveness prediction that holds the table.
TEST_F(Runtime, Fsdp2HoldsTheEmbeddingTableToItsBackward) {
  const Model m = llama4();
  for (Reshard r : {Reshard::kAfterForward, Reshard::kAfterBackward}) {
    Plan p = base_plan();
    p.dp = 2;
    p.zero = 3;
    p.reshard = r;
    p.fsdp_impl = FsdpImpl::kFsdp2;
    SCOPED_TRACE(describe(p));
    expect_matches_serial(m, p);
    expect_memory_of_every_rank(m, p, train(m, p, 1, ""));
  }
}

// Mixed-precision checkpoints keep the fp32 master weights and Adam moments: a run saved after 2
// steps and resumed for the third equals the uninterrupted 3 steps bit for bit (the loss, and
// every checkpoint file), the bf16 weights being the masters rounded as the step's cast rounds
// them.
TEST_F(Runtime, MixedPrecisionResumesBitForBit) {
  const Model m = gpt4();
  Plan p = base_plan();
  p.precision = Dtype::kBf16;
  p.tp = 2;
  p.dp = 2;
  p.zero = 1;
  const std::string whole = scratch() + "/bf16-whole", part = scratch() + "/bf16-part",
                    resumed = scratch() + "/bf16-resumed";
  Outcome a = train(m, p, 3, whole);
  train(m, p, 2, part);
  Outcome b = train(m, p, 1, resumed, part);
  if (world_rank() != 0) return;
  ASSERT_EQ(a.losses.size(), 3u);
  ASSERT_EQ(b.losses.size(), 1u);
  EXPECT_EQ(b.losses[0], a.losses[2]);
  const std::string da = resolve_checkpoint(whole), db = resolve_checkpoint(resumed);
  for (const TensorInfo& t : model_tensors(m))
    for (const char* kind : {"params", "adam_m", "adam_v"})
      EXPECT_EQ(file_error(checkpoint_file(db, kind, t.name), checkpoint_file(da, kind, t.name)),
                0.0)
          << kind << "/" << t.name;
}

// 200 steps of the `tiny` model (serial) in bf16 track the fp32 run's losses. The bound: mixed
// precision is meant to train as fp32 does (Micikevicius et al., "Mixed Precision Training",
// ICLR 2018; Kalamkar et al., "A Study of BFLOAT16 for Deep Learning Training", 2019: bf16 loss
// curves on fp32's within run-to-run noise); here the runs share data and initialisation, so
// their only difference is rounding: each step's loss within 2 % of fp32's, and the mean of the
// last 20 steps within 0.5 %, while both fall by far more than that (over 20 %).
TEST_F(Runtime, MixedPrecisionTracksFp32OnTiny) {
  if (world_rank() == 0) {
    const Model m = model_preset("tiny");
    auto losses = [&](Dtype precision) {
      Plan p = base_plan(4);
      p.micro_batch = 2;
      p.precision = precision;
      auto comms = make_mpi_comm_set(p, MPI_COMM_SELF);
      auto backend_ptr = testing::make_test_backend(1);
      TrainerOptions opt;
      opt.adamw.lr = 3e-3;
      Trainer t(m, p, *backend_ptr, *comms, opt);
      std::vector<double> out;
      for (int i = 0; i < 200; ++i) out.push_back(t.step().loss);
      return out;
    };
    const std::vector<double> fp32 = losses(Dtype::kFp32), bf16 = losses(Dtype::kBf16);
    double worst = 0, tail32 = 0, tail16 = 0;
    for (size_t i = 0; i < fp32.size(); ++i) {
      worst = std::max(worst, std::fabs(bf16[i] - fp32[i]) / fp32[i]);
      if (i >= fp32.size() - 20) {
        tail32 += fp32[i] / 20;
        tail16 += bf16[i] / 20;
      }
    }
    std::fprintf(stderr,
                 "tiny, 200 steps: bf16 vs fp32 worst step %.4f, last-20 mean %.4f vs %.4f\n",
                 worst, tail16, tail32);
    EXPECT_LE(worst, 0.02);
    EXPECT_LE(std::fabs(tail16 - tail32) / tail32, 0.005);
    EXPECT_LT(tail32, 0.8 * fp32[0]);
    EXPECT_LT(tail16, 0.8 * bf16[0]);
  }
  quiet_barrier(MPI_COMM_WORLD);
}

TEST_F(Runtime, CheckpointResumesUnderAnotherPlan) {
  const Model m = llama4();
  const Reference& ref = serial(m, 8);
  Plan a = base_plan();
  a.tp = 2;
  a.dp = 2;
  a.zero = 2;
  const std::string dir = scratch() + "/resume";
  train(m, a, 2, dir);
  Plan b = base_plan();
  b.pp = 2;
  b.dp = 2;
  b.zero = 3;
  Outcome got = train(m, b, 1, "", dir);
  if (world_rank() == 0) {
    ASSERT_EQ(got.losses.size(), 1u);
    EXPECT_NEAR(got.losses[0], ref.losses[2],
                std::max(tolerance(m, a).loss, tolerance(m, b).loss) * ref.losses[2]);
  }
  // Saved under HSDP ZeRO-3 (resharded after the step) on uneven stages, resumed under ZeRO-1
  // on the opposite split, then under HSDP ZeRO-1 with another shard degree.
  Plan c = base_plan();
  c.pp = 2;
  c.dp = 4;
  c.shard_degree = 2;
  c.zero = 3;
  c.reshard = Reshard::kAfterStep;
  c.stage_layers = {1, 3};
  const std::string hsdp = scratch() + "/resume-hsdp";
  train(m, c, 1, hsdp);
  Plan d = base_plan();
  d.pp = 2;
  d.dp = 2;
  d.zero = 1;
  d.stage_layers = {3, 1};
  const std::string uneven = scratch() + "/resume-uneven";
  Outcome second = train(m, d, 1, uneven, hsdp);
  Plan e = base_plan();
  e.dp = 8;
  e.shard_degree = 4;
  e.zero = 1;
  Outcome third = train(m, e, 1, "", uneven);
  if (world_rank() == 0) {
    ASSERT_EQ(second.losses.size(), 1u);
    ASSERT_EQ(third.losses.size(), 1u);
    EXPECT_NEAR(second.losses[0], ref.losses[1], tolerance(m, d).loss * ref.losses[1]);
    EXPECT_NEAR(third.losses[0], ref.losses[2], tolerance(m, e).loss * ref.losses[2]);
  }
}

TEST_F(Runtime, RecomputeReusesTheDropoutMasks) {
  const Model m = gpt4(true);
  Plan a = base_plan();
  a.tp = 2;
  a.flash_attention = false;
  Outcome plain = train(m, a, 2, "");
  a.recompute = Recompute::kFull;
  Outcome full = train(m, a, 2, "");
  a.recompute = Recompute::kSelective;
  Outcome sel = train(m, a, 2, "");
  if (world_rank() == 0) {
    for (size_t i = 0; i < plain.losses.size(); ++i) {
      EXPECT_NEAR(full.losses[i], plain.losses[i], 1e-6 * plain.losses[i]);
      EXPECT_NEAR(sel.losses[i], plain.losses[i], 1e-6 * plain.losses[i]);
    }
  }
}

// Checks the memory of every rank of the plan (gathered by train()), on rank 0. In fp32 with
// AdamW a rank holds, for E owned parameter elements: the parameters (4 E bytes), their
// gradients (4 E) and the two Adam moments (8 E), no low-precision copy or master weights; in
// mixed precision (bf16) the parameters are 2 E bytes and the optimizer state holds the fp32
// master weights beside the moments (12 E), the gradients staying fp32 (Megatron's main_grad);
// ZeRO shards them over the plan's shard ranks S (stage 1: the moments, 2: and the gradients,
// 3: and the parameters), each bucket's flat range padded to a multiple of S (at most S - 1
// elements per tensor). The measured peak also holds activations and workspaces, which liveness
// predicts (5%: the allocator's view of blocks and in-place ops).
void expect_memory_of_every_rank(const Model& m, const Plan& plan, const Outcome& got) {
  if (world_rank() != 0) return;
  const int n = plan.gpus();
  ASSERT_EQ(static_cast<int>(got.ranks.size()), world_size());
  const double shards = plan.zero >= 1 ? plan.dense_shard_ranks() : 1;
  const double tensors = static_cast<double>(model_tensors(m, true).size());
  const bool mixed = plan.precision != Dtype::kFp32;
  const double param_bytes = dtype_bytes(plan.precision);  // per element
  const double opt_copies = mixed ? 3 : 2;                 // (master,) m, v
  for (int r = 0; r < world_size(); ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    const RankMemory& x = got.ranks[r];
    ASSERT_EQ(x.in_plan, r < n ? 1.0 : 0.0);
    if (r >= n) continue;
    const double e = x.owned_elements;
    ASSERT_GT(e, 0);
    // Bytes of one copy of the owned elements, whole or sharded (with the padding's bound).
    auto expect_copy = [&](BufferClass c, double bytes, bool sharded, const char* what) {
      const double measured = x.peak[static_cast<int>(c)];
      const double whole = bytes * e;
      if (!sharded || shards == 1) {
        EXPECT_EQ(measured, whole) << what;
      } else {
        EXPECT_GE(measured, whole / shards) << what;
        EXPECT_LE(measured, whole / shards + bytes * tensors * (shards - 1)) << what;
      }
    };
    const bool experts = m.is_moe() && (plan.ep > 1 || plan.expert_tp() != plan.tp);
    if (!experts) {  // expert tensors shard over their own data-parallel group
      expect_copy(BufferClass::kOptimizer, 4 * opt_copies, plan.zero >= 1, "Adam moments");
      if (plan.zero < 3) {
        expect_copy(BufferClass::kParam, param_bytes, false, "parameters");
      } else {
        // The shard, and at most the whole again in the weights gathered for the layers in
        // flight (the reshard mode decides how many are held at once).
        const double param = x.peak[static_cast<int>(BufferClass::kParam)];
        const double pb = param_bytes;
        EXPECT_GE(param, pb * e / shards);
        EXPECT_LE(param, pb * e / shards + pb * e + pb * tensors * (shards - 1));
      }
      // Gradients: one whole copy without ZeRO and under stage 1 (in bf16 where a mixed-precision
      // plan reduces them in bf16: Megatron's buffer in the parameters' dtype); from stage 2 the
      // reduced shard is kept and the whole is only a reduction buffer, at least the shard.
      const double grad = x.peak[static_cast<int>(BufferClass::kGrad)];
      const double buffer_bytes = mixed && plan.grad_reduce_dtype == Dtype::kBf16 ? 2 : 4;
      if (plan.zero < 2) {
        EXPECT_EQ(grad, buffer_bytes * e) << "gradients";
      } else {
        EXPECT_GE(grad, 4 * e / shards) << "gradients";
      }
    }
    // The trace's memory counter (the last step, traced) peaks at the measured peak.
    EXPECT_EQ(x.counter_peak, x.peak_total);
    // Parameters, gradients (reduce buffers) and moments are all on the device at the peak.
    EXPECT_GE(x.peak_total, x.peak[static_cast<int>(BufferClass::kParam)] +
                                x.peak[static_cast<int>(BufferClass::kOptimizer)]);
    // The allocator follows the buffers' lifetimes in the order the executor issued the ops:
    // exactly, but for the scratch workspaces of kernels the Program does not list.
    EXPECT_GE(x.peak_total, x.executed_order_peak);
    EXPECT_LE(x.peak_total,
              x.executed_order_peak + x.peak[static_cast<int>(BufferClass::kWorkspace)]);
    // The prediction follows the Program's issue order. It may not be optimistic by more than
    // the workspaces (5%); it may be pessimistic where the executor starts a stream's op later
    // than its place in the issue order (a ZeRO-3 gather or a gradient reduce-scatter waiting
    // for its dependencies on a pipeline's last stage: 5.9% on the HSDP pipeline below, whose
    // executed-order liveness is the measured peak to the byte), which only overstates memory.
    EXPECT_LE(x.peak_total, 1.05 * x.predicted_peak);
    EXPECT_GE(x.peak_total, 0.9 * x.predicted_peak);
  }
}

// The vocab-tiled loss (plan.tiled_loss: the loss and its gradient read from the logits in their
// dtype, Backend's xent_*_typed) against the serial run of the untiled loss: one rank, tp 2 (each
// shard's sums taken relative to the all-reduced maximum) and pp 2 (the logits saved on the last
// stage); and under tp 2 with flash attention each rank's measured peak is the liveness
// prediction of its Program (no fp32 logits held).
TEST_F(Runtime, TiledLoss) {
  for (int tp : {1, 2}) {
    Plan p = base_plan();
    p.tp = tp;
    p.tiled_loss = true;
    expect_matches_serial(llama4(), p);
  }
  Plan p = base_plan();
  p.pp = 2;
  p.tiled_loss = true;
  expect_matches_serial(gpt4(), p);
  p = base_plan();
  p.tp = 2;
  p.tiled_loss = true;
  p.flash_attention = true;
  expect_memory_of_every_rank(gpt4(), p, train(gpt4(), p, 1, ""));
}

// FC1's GELU in its GEMM's epilogue and its derivative in FC2's data gradient (Plan::
// gemm_gelu_epilogue: one op each, no activation op) against the serial run of the separate
// activation: one rank, tp 2 (FC1 column-parallel: each rank's GELU of its columns), pp 2 with
// full recompute (the fused GEMM replayed); under tp 2 with flash attention each rank's measured
// peak is the liveness prediction of its Program.
TEST_F(Runtime, GeluEpilogue) {
  const Model m = gpt4();
  for (int tp : {1, 2}) {
    Plan p = base_plan();
    p.tp = tp;
    p.gemm_gelu_epilogue = true;
    expect_matches_serial(m, p);
  }
  Plan p = base_plan();
  p.pp = 2;
  p.recompute = Recompute::kFull;
  p.gemm_gelu_epilogue = true;
  expect_matches_serial(m, p);
  p = base_plan();
  p.tp = 2;
  p.flash_attention = true;
  p.gemm_gelu_epilogue = true;
  expect_memory_of_every_rank(m, p, train(m, p, 1, ""));
}

TEST_F(Runtime, MeasuredPeakMemoryIsTheLivenessPrediction) {
  const Model m = gpt4();
  std::vector<Plan> plans;
  Plan p = base_plan();
  plans.push_back(p);
  p.tp = 2;
  p.pp = 2;
  plans.push_back(p);
  p = base_plan();
  p.dp = 2;
  p.zero = 3;
  plans.push_back(p);
  p = base_plan();
  p.pp = 2;
  p.schedule = Schedule::kGpipe;
  plans.push_back(p);
  for (Reshard r : {Reshard::kAfterBackward, Reshard::kAfterStep}) {
    p = base_plan();
    p.dp = 2;
    p.zero = 3;
    p.reshard = r;
    plans.push_back(p);
  }
  p = base_plan();
  p.dp = 4;
  p.shard_degree = 2;
  p.zero = 3;
  p.pp = 2;
  p.stage_layers = {1, 3};
  plans.push_back(p);
  for (const Plan& plan : plans) {
    SCOPED_TRACE(describe(plan));
    expect_memory_of_every_rank(m, plan, train(m, plan, 1, ""));
  }
  // Latent attention, windows, shared experts and an expert grid (without ep, whose routed
  // regions vary with the routing).
  std::vector<std::pair<Model, Plan>> more;
  p = base_plan();
  p.tp = 2;
  p.sequence_parallel = true;
  more.emplace_back(mla4(), p);
  more.emplace_back(windowed4(), p);
  more.emplace_back(shared_moe4(), p);
  // Selective recompute's modules: the recomputed buffers allocated and freed as predicted.
  p.recompute = Recompute::kSelective;
  p.recompute_modules = (1u << static_cast<int>(RecomputeModule::kMoe)) |
                        (1u << static_cast<int>(RecomputeModule::kLayernorm)) |
                        (1u << static_cast<int>(RecomputeModule::kMlp));
  more.emplace_back(shared_moe4(), p);
  p.recompute_modules = 1u << static_cast<int>(RecomputeModule::kMlaUpProj);
  more.emplace_back(mla4(), p);
  p = base_plan();
  p.tp = 2;
  p.dp = 2;
  p.etp = 1;
  more.emplace_back(moe4(), p);
  for (const auto& [model, plan] : more) {
    SCOPED_TRACE(model.name + " " + describe(plan));
    expect_memory_of_every_rank(model, plan, train(model, plan, 1, ""));
  }
}

TEST_F(Runtime, LatentAttention) {
  Plan p = base_plan();
  p.tp = 2;
  expect_matches_serial(mla4(), p);
  expect_matches_serial(mla4(false), p);
  p.sequence_parallel = true;
  p.dp = 2;
  p.zero = 1;
  expect_matches_serial(mla4(), p);
  p = base_plan();
  p.cp = 2;
  p.tp = 2;
  expect_matches_serial(mla4(), p);
  p.cp = 1;
  p.recompute = Recompute::kSelective;
  p.flash_attention = false;
  expect_matches_serial(mla4(), p);
  p = base_plan();
  p.pp = 2;
  p.dp = 2;
  p.zero = 3;
  p.recompute = Recompute::kFull;
  expect_matches_serial(mla4(), p);
}

TEST_F(Runtime, SlidingWindows) {
  Plan p = base_plan();
  p.tp = 2;
  p.sequence_parallel = true;
  expect_matches_serial(windowed4(), p);
  p = base_plan();
  p.cp = 4;  // chunks of 8 tokens: the window reaches into the previous chunk
  expect_matches_serial(windowed4(), p);
  p = base_plan();
  p.tp = 2;
  p.pp = 2;
  p.flash_attention = false;  // materialised (the probabilities saved)
  expect_matches_serial(windowed_gpt4(), p);
}

TEST_F(Runtime, SharedExpertsAfterDenseLayers) {
  Plan p = base_plan();
  p.tp = 2;
  expect_matches_serial(shared_moe4(), p);
  p = base_plan();
  p.dp = 4;
  p.ep = 2;
  p.zero = 1;
  expect_matches_serial(shared_moe4(), p);
  p = base_plan();
  p.tp = 2;
  p.dp = 2;
  p.pp = 2;
  p.sequence_parallel = true;
  p.stage_layers = {1, 2};
  expect_matches_serial(shared_moe4(), p);
}

TEST_F(Runtime, ExpertGridOfItsOwn) {
  // tp 2, etp 1, ep 4 on 8 ranks: the ep groups span the tensor-parallel ranks; edp 2.
  Plan p = base_plan();
  p.tp = 2;
  p.dp = 4;
  p.ep = 4;
  p.etp = 1;
  p.sequence_parallel = true;
  expect_matches_serial(moe4(), p);
  p.sequence_parallel = false;  // each TP rank routes its slice of the replicated rows
  p.zero = 1;
  expect_matches_serial(shared_moe4(), p);
  p = base_plan();
  p.tp = 2;
  p.pp = 2;
  p.dp = 2;
  p.ep = 2;
  p.etp = 1;
  p.zero = 2;
  p.stage_layers = {1, 2};
  expect_matches_serial(shared_moe4(), p);
  // tp 1, etp 2: each expert split over two data-parallel ranks, whose routed rows are gathered.
  p = base_plan();
  p.dp = 4;
  p.etp = 2;
  expect_matches_serial(moe4(), p);
  // Checkpoints stay plan-independent: saved under the grid, resumed with experts inside dp.
  const Reference& ref = serial(shared_moe4(), 8);
  Plan a = base_plan();
  a.tp = 2;
  a.dp = 4;
  a.ep = 4;
  a.etp = 1;
  a.zero = 1;
  const std::string dir = scratch() + "/resume-grid";
  train(shared_moe4(), a, 2, dir);
  Plan b = base_plan();
  b.dp = 2;
  b.ep = 2;
  Outcome got = train(shared_moe4(), b, 1, "", dir);
  if (world_rank() == 0) {
    ASSERT_EQ(got.losses.size(), 1u);
    EXPECT_NEAR(got.losses[0], ref.losses[2],
                std::max(tolerance(shared_moe4(), a).loss, tolerance(shared_moe4(), b).loss) *
                    ref.losses[2]);
  }
}

// The serial run's gradients (what every plan above is compared with) against central finite
// differences of its loss, for the new layers' weights: MLA's projections and latent norms (with
// and without query compression; q_norm's gradient is too small at initialisation to tell from
// the loss's rounding), a windowed layer's QKV, the shared experts. One rank, fp32;
// each tensor moved along its gradient g by eps g / |g| (the loss changes by about eps |g|, far
// above fp32's rounding of the loss); AdamW with lr 0 leaves the weights in place.
TEST_F(Runtime, SerialGradientsMatchFiniteDifferences) {
  if (world_rank() == 0) {
    struct Check {
      Model m;
      std::vector<std::string> tensors;
    };
    const std::vector<Check> checks = {
        {mla4(), {"L1.q_down", "L1.q_up", "L1.kv_down", "L1.kv_norm", "L1.kv_up", "L1.out"}},
        {mla4(false), {"L0.q", "L2.kv_down", "L2.kv_up"}},
        {windowed4(), {"L0.qkv", "L1.qkv"}},
        {shared_moe4(), {"L2.shared_fc1", "L2.shared_fc2", "L0.fc1"}},
    };
    for (const Check& c : checks) {
      SCOPED_TRACE(c.m.name);
      Plan p = base_plan(2);
      p.precision = Dtype::kFp32;  // the weights are moved in their fp32 host copies
      auto comms = make_mpi_comm_set(p, MPI_COMM_SELF);
      auto backend_ptr = testing::make_test_backend(1);
      Backend& backend = *backend_ptr;
      const Program prog = lower_stage(c.m, p, 0);
      Executor ex(c.m, p, prog, backend, *comms);
      {
        HostStaging staging(ex, backend, /*load=*/false);
        init_buckets(c.m, p, comms->groups().coord, prog.buckets, staging.access(), 7);
        staging.store();
      }
      auto data = open_token_source("", c.m.vocab, c.m.seq_len, 7);
      StepConfig cfg;
      cfg.adamw.lr = 0;
      cfg.adamw.weight_decay = 0;
      cfg.clip_norm = 0;
      cfg.tokens_per_step = int64_t{p.global_batch} * c.m.seq_len;
      cfg.batch = [&](int mb, int32_t* tokens, int32_t* labels) {
        data->fill(mb, 0, c.m.seq_len, tokens, labels);
      };
      auto loss = [&] {
        const StepResult r = ex.step(cfg);
        return r.loss_sum / static_cast<double>(cfg.tokens_per_step);
      };
      loss();  // the gradients of the initial weights
      int checked = 0;
      for (const ParamBucket& b : prog.buckets)
        for (size_t s = 0; s < b.specs.size(); ++s) {
          const std::string& name = b.specs[s].name;
          if (std::find(c.tensors.begin(), c.tensors.end(), name) == c.tensors.end()) continue;
          ++checked;
          const int64_t n = b.specs[s].elements();
          // Gradients and weights through host copies (the host cannot touch device memory).
          HostStaging host(ex, backend, /*load=*/true);
          const std::vector<float> g(host(b.grads[s]), host(b.grads[s]) + n);
          float* w = host(b.params[s]);
          const std::vector<float> keep(w, w + n);
          auto store_weights = [&] { backend.copy(ex.fdata(b.params[s]), w, n * sizeof(float)); };
          double norm = 0, wnorm = 0;
          for (int64_t i = 0; i < n; ++i) {
            norm += double(g[i]) * g[i];
            wnorm += double(keep[i]) * keep[i];
          }
          norm = std::sqrt(norm);
          const double eps = 0.02 * std::sqrt(wnorm);
          auto moved = [&](double by) {
            for (int64_t i = 0; i < n; ++i) w[i] = static_cast<float>(keep[i] + by * g[i] / norm);
            store_weights();
            return loss();
          };
          const double fd = (moved(eps) - moved(-eps)) / (2 * eps);
          std::copy(keep.begin(), keep.end(), w);
          store_weights();
          loss();  // the gradients at the initial weights again
          EXPECT_GT(norm, 1e-4) << name;
          EXPECT_NEAR(fd, norm, 0.02 * norm) << name;
        }
      EXPECT_EQ(checked, static_cast<int>(c.tensors.size()));
    }
  }
  quiet_barrier(MPI_COMM_WORLD);
}

}  // namespace
}  // namespace parasol::runtime

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
  ::testing::InitGoogleTest(&argc, argv);
  const int any = parasol::runtime::testing::run_all_ranks();
  if (parasol::runtime::testing::world_rank() == 0)
    std::filesystem::remove_all(parasol::runtime::scratch());
  MPI_Finalize();
  return any;
}
