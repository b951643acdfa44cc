// Dynamic loss scaling in the trainer (runtime/loss_scaler.h, StepConfig::loss_scale): an
// injected gradient overflow skips the step (no update, optimizer state included) and halves the
// scale, and the run then equals a reference without loss scaling that skips the same step's
// batch (Trainer::skip_step), loss for loss and bit for bit: with power-of-two scales, scaling
// the loss gradient and unscaling before clipping and AdamW are exact in fp32. A run that does
// not skip differs from the step after. Under dp 2 an overflow on one rank skips the step on
// both; a checkpoint keeps the scaler's state and the optimizer's step count, so a resumed run
// equals the uninterrupted one. Run with 2 ranks (the serial cases on rank 0).
#include <gtest/gtest.h>
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "core/model.h"
#include "core/plan.h"
#include "runtime/comm/mpi_communicator.h"
#include "runtime/trainer.h"
#include "tests/runtime/mpi_test_util.h"
#include "tests/runtime/test_backend.h"

namespace parasol::runtime {
namespace {

using testing::quiet_barrier;
using testing::world_rank;

Model tiny() { return llama_model("llama2-tiny", 2, 64, 4, 2, 128, 256, 32); }

Plan plan_of(int dp) {
  Plan p;
  p.global_batch = 4;
  p.micro_batch = 1;
  p.dp = dp;
  p.precision = Dtype::kFp32;
  return p;
}

TrainerOptions options(bool scaling) {
  TrainerOptions o;
  o.adamw.lr = 1e-3;
  o.adamw.eps = 1e-6;
  o.loss_scaling.enabled = scaling;
  o.loss_scaling.initial_scale = 1024;  // 2^10
  return o;
}

// Trains on `comm` and calls drive(trainer, stats) to run the steps.
std::vector<StepStats> train(const Plan& plan, TrainerOptions o, MPI_Comm comm,
                             const std::function<void(Trainer&, std::vector<StepStats>&)>& drive,
                             const std::string& resume = "") {
  const Model m = tiny();
  auto comms = make_mpi_comm_set(plan, comm);
  auto backend = testing::make_test_backend(1);
  Trainer t(m, plan, *backend, *comms, std::move(o));
  if (!resume.empty()) t.load(resume);
  std::vector<StepStats> out;
  drive(t, out);
  return out;
}
void steps(Trainer& t, std::vector<StepStats>& out, int n) {
  for (int i = 0; i < n; ++i) out.push_back(t.step());
}

std::string scratch_dir(const std::string& name) {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("parasol-loss-scaling-" + std::to_string(::getpid()) + "-" + name);
  std::filesystem::remove_all(dir);
  return dir.string();
}

void overflow_case() {
  TrainerOptions o = options(true);
  o.inject_overflow_steps = {3};
  int64_t updates = 0;
  const auto scaled = train(plan_of(1), o, MPI_COMM_SELF, [&](Trainer& t, auto& out) {
    steps(t, out, 6);
    updates = t.updates_done();
  });
  ASSERT_EQ(scaled.size(), 6u);
  for (size_t i = 0; i < scaled.size(); ++i) {
    EXPECT_EQ(scaled[i].skipped, i == 2) << "step " << i + 1;
    EXPECT_EQ(scaled[i].loss_scale, i <= 2 ? 1024.0 : 512.0) << "step " << i + 1;
    EXPECT_TRUE(std::isfinite(scaled[i].loss));
  }
  EXPECT_FALSE(std::isfinite(scaled[2].grad_norm));
  EXPECT_EQ(updates, 5);

  // The reference: no loss scaling, step 3's batch consumed without training.
  const auto reference =
      train(plan_of(1), options(false), MPI_COMM_SELF, [](Trainer& t, auto& out) {
        steps(t, out, 2);
        t.skip_step();
        steps(t, out, 3);
      });
  ASSERT_EQ(reference.size(), 5u);
  const std::vector<size_t> same_step = {0, 1, 3, 4, 5};
  for (size_t k = 0; k < reference.size(); ++k) {
    EXPECT_EQ(scaled[same_step[k]].loss, reference[k].loss) << "step " << same_step[k] + 1;
    EXPECT_EQ(scaled[same_step[k]].grad_norm, reference[k].grad_norm)
        << "step " << same_step[k] + 1;
  }
  // A plain run trains on step 3: from step 4 on it is another run.
  const auto plain = train(plan_of(1), options(false), MPI_COMM_SELF,
                           [](Trainer& t, auto& out) { steps(t, out, 4); });
  EXPECT_EQ(plain[2].loss, scaled[2].loss);  // step 3's forward pass saw the same parameters
  EXPECT_NE(plain[3].loss, scaled[3].loss);
}
TEST(LossScaling, AnOverflowSkipsTheStepAndHalvesTheScale) {
  if (world_rank() == 0) overflow_case();
  quiet_barrier();
}

TEST(LossScaling, AnOverflowOnOneRankSkipsTheStepOnEveryRank) {
  TrainerOptions o = options(true);
  if (world_rank() == 1) o.inject_overflow_steps = {2};
  const auto got =
      train(plan_of(2), o, MPI_COMM_WORLD, [](Trainer& t, auto& out) { steps(t, out, 4); });
  EXPECT_EQ(got.size(), 4u);
  for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i].skipped, i == 1) << "step " << i + 1;
  if (got.size() == 4) {
    EXPECT_EQ(got[3].loss_scale, 512.0);
  }
  // The serial run with the same overflow: the same losses (dp 2 sums in another order).
  if (world_rank() == 0) {
    TrainerOptions serial = options(true);
    serial.inject_overflow_steps = {2};
    const auto ref =
        train(plan_of(1), serial, MPI_COMM_SELF, [](Trainer& t, auto& out) { steps(t, out, 4); });
    for (size_t i = 0; i < std::min(got.size(), ref.size()); ++i)
      EXPECT_NEAR(got[i].loss, ref[i].loss, 1e-5 * std::fabs(ref[i].loss)) << "step " << i + 1;
  }
  quiet_barrier();
}

void checkpoint_case() {
  TrainerOptions o = options(true);
  o.inject_overflow_steps = {2};
  o.loss_scaling.growth_interval = 3;  // grows at step 5 (3 finite steps after the overflow)
  const auto whole =
      train(plan_of(1), o, MPI_COMM_SELF, [](Trainer& t, auto& out) { steps(t, out, 6); });
  const std::string dir = scratch_dir("resume");
  train(plan_of(1), o, MPI_COMM_SELF, [&](Trainer& t, auto& out) {
    steps(t, out, 4);
    t.save(dir);
  });
  int64_t updates = 0;
  const auto resumed = train(
      plan_of(1), o, MPI_COMM_SELF,
      [&](Trainer& t, auto& out) {
        EXPECT_EQ(t.loss_scaler().state().scale, 512.0);
        EXPECT_EQ(t.loss_scaler().state().growth_tracker, 2);
        steps(t, out, 2);
        updates = t.updates_done();
      },
      dir);
  ASSERT_EQ(resumed.size(), 2u);
  EXPECT_EQ(whole[4].loss_scale, 512.0);
  EXPECT_EQ(whole[5].loss_scale, 1024.0);  // grown after steps 3, 4, 5
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(resumed[i].loss, whole[4 + i].loss) << "step " << i + 5;
    EXPECT_EQ(resumed[i].loss_scale, whole[4 + i].loss_scale) << "step " << i + 5;
  }
  EXPECT_EQ(updates, 5);
  std::filesystem::remove_all(dir);
}
TEST(LossScaling, ACheckpointKeepsTheScalerAndTheOptimizerStep) {
  if (world_rank() == 0) checkpoint_case();
  quiet_barrier();
}

// fp16 plans (16-bit storage, fp32 masters) scale the loss by themselves, with the options'
// scaler config even where it says disabled (Megatron's --fp16 without --loss-scale): the scale
// starts at the configured 2^10, an overflow injected on one rank of dp 2 skips the step on both
// and halves it, and the losses of the steps that trained stay within fp16's reach of the fp32
// run of the same batches: 2 % (fp16 keeps 11 significant bits, u = 2^-11; the runs differ only
// by rounding and share data and initialisation).
TEST(LossScaling, Fp16PlansScaleTheLossByThemselves) {
  TrainerOptions o = options(false);
  if (world_rank() == 1) o.inject_overflow_steps = {3};
  Plan half = plan_of(2);
  half.precision = Dtype::kFp16;
  const auto got = train(half, o, MPI_COMM_WORLD, [](Trainer& t, auto& out) { steps(t, out, 5); });
  TrainerOptions plain = options(false);
  const auto ref = train(plan_of(2), plain, MPI_COMM_WORLD, [](Trainer& t, auto& out) {
    steps(t, out, 2);
    t.skip_step();
    steps(t, out, 2);
  });
  if (world_rank() == 0) {
    ASSERT_EQ(got.size(), 5u);
    ASSERT_EQ(ref.size(), 4u);
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(got[i].skipped, i == 2) << "step " << i + 1;
      EXPECT_EQ(got[i].loss_scale, i <= 2 ? 1024.0 : 512.0) << "step " << i + 1;
      EXPECT_TRUE(std::isfinite(got[i].loss));
    }
    const std::vector<size_t> same_step = {0, 1, 3, 4};
    for (size_t k = 0; k < ref.size(); ++k)
      EXPECT_NEAR(got[same_step[k]].loss, ref[k].loss, 0.02 * ref[k].loss)
          << "step " << same_step[k] + 1;
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
