// The step's staged host traffic (StepConfig::stage_host_traffic, runtime/executor.h): every
// micro-batch's tokens and labels uploaded in one copy before the step's first op, the per-token
// losses summed on the device (Backend::loss_accumulate) and read once after its last op. Against
// the former path (each micro-batch's tokens uploaded when its buffer is allocated, its losses
// read when the loss op has run):
//  * the losses and gradient norms are equal bit for bit (the same fp32 per-token losses summed
//    in double in the same order, on the device instead of the host);
//  * no copy between host and device memory happens while the step's ops run, where the former
//    path makes one upload per token and label buffer and two reads (losses, labels) per
//    micro-batch on the last stage. The copies are counted by the strict CPU backend from where
//    the pointers lie (StrictCpuBackend::host_traffic: its device memory is an arena), not by
//    the executor;
//  * the Program's buffers peak at the same bytes (the staging is counted apart; without pp,
//    where the peak does not depend on when transfers land).
// Serial, pipeline-parallel (pp 2: tokens on the first stage, labels and losses on the last) and
// tensor-parallel (tp 2) plans, fp32 and bf16 with the vocab-tiled loss. Two ranks. Then the
// executor's walk of a captured and a replayed step, on the CPU backend's dry run of graphs.
#include <gtest/gtest.h>
#include <mpi.h>

#include <string>
#include <vector>

#include "core/model.h"
#include "core/plan.h"
#include "runtime/comm/mpi_communicator.h"
#include "runtime/cpu/cpu_backend.h"
#include "runtime/cpu/strict_backend.h"
#include "runtime/trainer.h"
#include "tests/runtime/mpi_test_util.h"

namespace parasol::runtime {
namespace {

using testing::quiet_barrier;
using testing::world_rank;
using testing::world_size;

constexpr int kSteps = 2;

Model tiny() { return gpt_model("gpt-tiny", 2, 64, 4, 256, 32, false); }  // untied: pp 2

Plan plan_of(int tp, int pp, Dtype precision = Dtype::kFp32) {
  Plan p;
  p.tp = tp;
  p.pp = pp;
  p.global_batch = 4;
  p.micro_batch = 1;  // 4 micro-batches a step
  p.precision = precision;
  p.tiled_loss = precision == Dtype::kBf16;
  return p;
}

// Each rank's steps on `comm`, staged or not, on the strict backend (one at a time per process).
std::vector<StepStats> train(const Plan& plan, bool staged, MPI_Comm comm) {
  const Model m = tiny();  // outlives the trainer, which keeps a reference
  auto comms = make_mpi_comm_set(plan, comm);
  StrictCpuBackend backend(1, size_t{1} << 30);
  TrainerOptions o;
  o.adamw.lr = 1e-3;
  o.stage_host_traffic = staged;
  Trainer t(m, plan, backend, *comms, o);
  std::vector<StepStats> out;
  for (int i = 0; i < kSteps; ++i) out.push_back(t.step());
  return out;
}

// Runs `plan` both ways on the first plan.world_size() ranks (the others wait) and compares.
// first / last: this rank holds the first / last pipeline stage (tokens / labels and losses).
void expect_staged_equal(const Plan& plan) {
  const int ranks = plan.tp * plan.pp * plan.dp * plan.cp;
  const int rank = world_rank();
  MPI_Comm comm = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, rank < ranks ? 0 : MPI_UNDEFINED, rank, &comm);
  if (comm != MPI_COMM_NULL) {
    const std::vector<StepStats> staged = train(plan, true, comm), old = train(plan, false, comm);
    const int stage = (rank / (plan.tp * plan.cp * plan.dp)) % plan.pp;
    const bool first = stage == 0, last = stage == plan.pp - 1;
    const int64_t mbs = plan.global_batch / (plan.micro_batch * plan.dp);
    for (int i = 0; i < kSteps; ++i) {
      SCOPED_TRACE(::testing::Message() << "rank " << rank << " step " << i + 1);
      EXPECT_EQ(staged[i].loss, old[i].loss);
      EXPECT_EQ(staged[i].grad_norm, old[i].grad_norm);
      EXPECT_GT(staged[i].loss, 0);
      EXPECT_EQ(staged[i].step_host_reads, 0);
      EXPECT_EQ(staged[i].step_host_writes, 0);
      EXPECT_EQ(old[i].step_host_reads, last ? 2 * mbs : 0);
      EXPECT_EQ(old[i].step_host_writes, (first ? mbs : 0) + (last ? mbs : 0));
      // (Under pp the peak depends on when transfers land, run to run: not compared there.)
      if (plan.pp == 1) EXPECT_EQ(staged[i].peak_bytes, old[i].peak_bytes);
      EXPECT_EQ(staged[i].graph_action, "eager");
    }
    MPI_Comm_free(&comm);
  }
  quiet_barrier();
}

TEST(StepStaging, SerialLossesBitIdenticalWithNoHostCopyInTheStep) {
  expect_staged_equal(plan_of(1, 1));
}

TEST(StepStaging, PipelineStagesStageWhatTheyHold) {
  if (world_size() < 2) GTEST_SKIP() << "needs 2 ranks";
  expect_staged_equal(plan_of(1, 2));
}

TEST(StepStaging, TensorParallelAndBf16TiledLoss) {
  if (world_size() < 2) GTEST_SKIP() << "needs 2 ranks";
  expect_staged_equal(plan_of(2, 1));
  expect_staged_equal(plan_of(1, 1, Dtype::kBf16));
}

// The executor's capture and replay walk (Scheduler::run_body), on the CPU backend's dry run of
// graphs (CpuBackend::set_graph_dry_run: a capture records nothing and the kernels run as they
// are called; a replay runs nothing). A full_iteration plan without dropout and without the
// loss's NaN check warms up, captures, then replays. The warm-up and the capture step train as
// the same plan without graphs, bit for bit (the capture's walk runs the same ops in the same
// order). A replayed step runs none of the body's ops: no token is trained (loss 0) and the
// optimizer, which still runs, sees no gradient (norm 0); it reports the captured step's peak.
// A traced step runs eagerly with its reason and leaves the graph to the next step.
TEST(StepGraphWalk, WarmupCaptureThenReplaysOnTheCpusDryRun) {
  if (world_rank() == 0) {
    const Model m = llama_model("llama2-tiny", 2, 64, 4, 2, 128, 256, 32);  // no dropout
    auto run = [&](bool graphs, std::vector<StepStats>& out, int64_t* replays) {
      Plan p = plan_of(1, 1);
      p.global_batch = 4;
      p.micro_batch = 2;
      p.nan_check = false;  // a host sync inside the step
      if (graphs) p.cuda_graphs = CudaGraphs::kFullIteration;
      auto comms = make_mpi_comm_set(p, MPI_COMM_SELF);
      CpuBackend backend(1);
      backend.set_graph_dry_run(graphs);
      TrainerOptions o;
      o.adamw.lr = 1e-3;
      Trainer t(m, p, backend, *comms, o);
      for (int i = 0; i < 4; ++i) out.push_back(t.step());
      if (graphs) {
        out.push_back(t.step(/*trace=*/true));
        out.push_back(t.step());
        EXPECT_EQ(backend.graph_captures(), 1);
        *replays = backend.graph_replays();
      }
    };
    std::vector<StepStats> ref, g;
    int64_t replays = 0;
    run(false, ref, nullptr);
    run(true, g, &replays);
    ASSERT_EQ(g.size(), 6u);
    const std::vector<std::string> acts = {"warmup", "capture", "replay",
                                           "replay", "eager",   "replay"};
    for (size_t i = 0; i < acts.size(); ++i) EXPECT_EQ(g[i].graph_action, acts[i]) << i;
    EXPECT_NE(g[4].graph_reason.find("traced"), std::string::npos) << g[4].graph_reason;
    EXPECT_EQ(replays, 4);  // the capture's launch and three replays
    for (int i = 0; i < 2; ++i) {
      EXPECT_EQ(g[i].loss, ref[i].loss) << i;
      EXPECT_EQ(g[i].grad_norm, ref[i].grad_norm) << i;
      EXPECT_GT(g[i].loss, 0);
    }
    for (int i : {2, 3, 5}) {
      EXPECT_EQ(g[i].loss, 0) << i;
      EXPECT_EQ(g[i].grad_norm, 0) << i;
      EXPECT_EQ(g[i].peak_bytes, g[1].peak_bytes) << i;
    }
    EXPECT_EQ(ref[0].graph_action, "eager");
  }
  quiet_barrier();
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
