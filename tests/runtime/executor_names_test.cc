// The executor runs what the Program says, not what its names suggest: every op and buffer of
// each rank's lowered Program renamed ("x<id>", nothing left of "L3.qkv.m0") trains bit for bit
// as the Trainer trains the Program as lowered: the same loss and gradient norm every step and
// the same parameters after the last. Dense (GPT-style with dropout, learned positions and tied
// embeddings; Llama-style with rotary embeddings), MoE (shared experts), latent attention and
// sliding windows; serially and under tensor, sequence, context and expert parallelism,
// materialised attention, recompute and activation offload.
//
// One binary with its own main, run under mpirun with 4 ranks: a plan of N ranks runs on world
// ranks 0..N-1 while the others wait.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "core/lower.h"
#include "runtime/comm/mpi_communicator.h"
#include "runtime/cpu/cpu_backend.h"
#include "runtime/data.h"
#include "runtime/executor.h"
#include "runtime/host_staging.h"
#include "runtime/param_init.h"
#include "runtime/trainer.h"
#include "tests/runtime/mpi_test_util.h"
#include "tests/runtime/test_backend.h"

namespace parasol::runtime {
namespace {

constexpr int kSteps = 3;
constexpr uint64_t kSeed = 42;

using testing::world_rank;
using testing::world_size;

// Every op, buffer and bucket renamed after its id: no layer, micro-batch or role left in a name.
void rename_all(Program& p) {
  for (Buffer& b : p.buffers) b.name = "x" + std::to_string(b.id);
  for (Op& op : p.ops) op.name = "x" + std::to_string(op.id);
  for (size_t i = 0; i < p.buckets.size(); ++i) p.buckets[i].name = "x" + std::to_string(i);
}

// One rank's record of a run: loss and gradient norm per step, parameters after the last.
struct Record {
  std::vector<double> losses, norms;
  std::vector<std::vector<float>> params;  // per parameter buffer of every bucket
};

std::vector<std::vector<float>> params_of(const Program& p, const Executor& ex, Backend& be) {
  HostStaging host(ex, be, /*load=*/true);
  std::vector<std::vector<float>> out;
  for (const ParamBucket& b : p.buckets) {
    std::vector<int> ids = b.params;
    if (b.param_shard >= 0) ids.push_back(b.param_shard);
    if (b.opt >= 0) ids.push_back(b.opt);
    for (int id : ids) {
      const float* f = host(id);
      const auto n = static_cast<size_t>(p.buffers[id].elements());
      out.emplace_back(f, f + n);
    }
  }
  return out;
}

TrainerOptions options() {
  TrainerOptions o;
  o.seed = kSeed;
  o.adamw.lr = 1e-3;
  return o;
}

// The reference: the Trainer on the Program as lowered.
Record train_as_lowered(const Model& m, const Plan& plan, CommSet& comms) {
  auto backend_ptr = testing::make_test_backend(1);
  Backend& backend = *backend_ptr;
  Trainer t(m, plan, backend, comms, options());
  Record r;
  for (int i = 0; i < kSteps; ++i) {
    const StepStats s = t.step();
    r.losses.push_back(s.loss);
    r.norms.push_back(s.grad_norm);
  }
  r.params = params_of(t.program(), t.executor(), backend);
  return r;
}

// The Trainer's step (runtime/trainer.cc) on the renamed Program: the same initialisation, data
// and loss reduction, through the Executor.
Record train_renamed(const Model& m, const Plan& plan, CommSet& comms) {
  auto backend_ptr = testing::make_test_backend(1);
  Backend& backend = *backend_ptr;
  const TrainerOptions opt = options();
  Program prog = lower_stage(m, plan, comms.stage());
  rename_all(prog);
  Executor ex(m, plan, prog, backend, comms);
  const RankCoord& c = comms.groups().coord;
  HostStaging staging(ex, backend, /*load=*/false);
  init_buckets(m, plan, c, prog.buckets, staging.access(), opt.seed);
  staging.store();
  auto data = open_token_source(opt.data, m.vocab, plan.seq(m), opt.seed);
  const int64_t per_replica = plan.global_batch / plan.dp;
  const int64_t Sl = plan.seq(m) / plan.cp;
  int64_t position = 0;
  Record r;
  for (int i = 0; i < kSteps; ++i) {
    StepConfig cfg;
    cfg.step = i + 1;
    cfg.adamw = opt.adamw;
    cfg.clip_norm = opt.clip_norm;
    cfg.dropout_p = opt.dropout_p;
    cfg.seed = opt.seed;
    cfg.tokens_per_step = int64_t{plan.global_batch} * plan.seq(m);
    cfg.batch = [&](int mb, int32_t* tokens, int32_t* labels) {
      for (int64_t b = 0; b < plan.micro_batch; ++b) {
        const int64_t sequence =
            position + c.dp(grid_ep(plan)) * per_replica + int64_t{mb} * plan.micro_batch + b;
        data->fill(sequence, int64_t{c.cp} * Sl, Sl, tokens + b * Sl, labels + b * Sl);
      }
    };
    comms.world().barrier();
    const StepResult s = ex.step(cfg);
    const RankGroups& g = comms.groups();
    const bool reports = g.last_stage() && g[Group::kTp].index == 0;
    std::vector<float> sums = {reports ? static_cast<float>(s.loss_sum) : 0.0f,
                               reports ? static_cast<float>(s.loss_tokens) : 0.0f};
    all_reduce_host(comms.world(), backend, sums);
    r.losses.push_back(sums[1] > 0 ? sums[0] / sums[1] : 0.0);
    r.norms.push_back(s.grad_norm);
    position += plan.global_batch;
  }
  r.params = params_of(prog, ex, backend);
  return r;
}

bool same_bits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

// Runs both on world ranks 0..plan.gpus()-1 and compares each rank's records bit for bit;
// a failure on any rank fails the test on rank 0.
void expect_names_ignored(const Model& m, const Plan& plan) {
  SCOPED_TRACE(m.name);
  const int n = plan.gpus();
  if (n > world_size()) GTEST_SKIP() << "needs " << n << " ranks";
  MPI_Comm sub;
  MPI_Comm_split(MPI_COMM_WORLD, world_rank() < n ? 0 : MPI_UNDEFINED, world_rank(), &sub);
  int bad = 0;
  if (sub != MPI_COMM_NULL) {
    try {
      Record want, got;
      {
        auto comms = make_mpi_comm_set(plan, sub);
        want = train_as_lowered(m, plan, *comms);
      }
      {
        auto comms = make_mpi_comm_set(plan, sub);
        got = train_renamed(m, plan, *comms);
      }
      for (int i = 0; i < kSteps; ++i) {
        EXPECT_TRUE(same_bits(got.losses[i], want.losses[i]))
            << "step " << i + 1 << " loss " << got.losses[i] << " vs " << want.losses[i];
        EXPECT_TRUE(same_bits(got.norms[i], want.norms[i]))
            << "step " << i + 1 << " grad norm " << got.norms[i] << " vs " << want.norms[i];
      }
      EXPECT_GT(want.losses.front(), 0.0);
      EXPECT_LT(want.losses.back(), want.losses.front());  // it trains
      ASSERT_EQ(got.params.size(), want.params.size());
      for (size_t i = 0; i < got.params.size(); ++i)
        EXPECT_TRUE(got.params[i] == want.params[i]) << "parameter buffer " << i << " differs";
    } catch (const std::exception& e) {
      ADD_FAILURE() << "rank " << world_rank() << ": " << e.what();
    }
    bad = ::testing::Test::HasFailure() ? 1 : 0;
    MPI_Comm_free(&sub);
  }
  int any = 0;
  MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (any && !bad && world_rank() == 0) ADD_FAILURE() << "failed on another rank";
}

Plan base_plan() {
  Plan p;
  p.global_batch = 4;
  p.micro_batch = 1;
  p.precision = Dtype::kFp32;
  return p;
}

// GPT-style: layernorm, gelu, biases, learned positions, dropout, tied embeddings.
Model gpt() {
  Model m = gpt_model("gpt", 2, 64, 4, 256, 32, true);
  m.dropout = true;
  return m;
}
// Llama-style: rmsnorm, swiglu, GQA, rotary embeddings.
Model llama() { return llama_model("llama", 2, 64, 8, 4, 128, 256, 32); }
// MoE (top-2 of 4 experts) after a dense layer, with two shared experts.
Model moe() {
  Model m = llama_model("moe", 3, 64, 4, 2, 128, 256, 32);
  m.moe = {4, 2, 64, 1, 1, 2, 32};
  return m;
}
Model mla() {
  Model m = llama_model("mla", 2, 64, 4, 4, 128, 256, 32);
  m.mla = {32, 16, 8, 4, 6};
  m.head_dim = m.mla.qk_head_dim();
  return m;
}
Model windowed() {
  Model m = llama();
  m.name = "windowed";
  m.sliding_window = 8;
  m.full_attention_every = 2;
  return m;
}

TEST(ExecutorNames, Dense) {
  Plan p = base_plan();
  expect_names_ignored(gpt(), p);
  expect_names_ignored(llama(), p);
  p.flash_attention = false;  // materialised: the probabilities, attention dropout
  expect_names_ignored(gpt(), p);
}

TEST(ExecutorNames, DenseParallel) {
  Plan p = base_plan();
  p.tp = 2;
  p.sequence_parallel = true;
  expect_names_ignored(gpt(), p);
  p = base_plan();
  p.cp = 2;  // ring attention: K/V chunks, their gradients, the fold into dQKV
  p.tp = 2;
  expect_names_ignored(llama(), p);
}

TEST(ExecutorNames, RecomputeAndOffload) {
  Plan p = base_plan();
  p.flash_attention = false;
  p.recompute = Recompute::kSelective;  // the attention core again (its dropout mask)
  expect_names_ignored(gpt(), p);
  p.flash_attention = true;
  p.recompute = Recompute::kFull;
  expect_names_ignored(llama(), p);
  p = base_plan();
  p.dp = 2;
  p.offload.activations = true;  // saved activations back from host copies
  expect_names_ignored(llama(), p);
}

TEST(ExecutorNames, MixtureOfExperts) {
  Plan p = base_plan();
  expect_names_ignored(moe(), p);
  p.tp = 2;
  p.sequence_parallel = true;  // the routed rows gathered over tp (their counts first)
  expect_names_ignored(moe(), p);
  p = base_plan();
  p.dp = 4;
  p.ep = 2;  // token exchange: dispatch and combine all-to-alls, routed expert regions
  expect_names_ignored(moe(), p);
  p = base_plan();
  p.tp = 2;
  p.dp = 2;
  p.ep = 2;
  p.etp = 1;  // an expert grid of its own: each TP rank routes its slice of the replicated rows
  expect_names_ignored(moe(), p);
}

TEST(ExecutorNames, LatentAttentionAndWindows) {
  Plan p = base_plan();
  expect_names_ignored(mla(), p);
  expect_names_ignored(windowed(), p);
  p.cp = 4;  // windows reaching into the previous chunk
  expect_names_ignored(windowed(), p);
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
