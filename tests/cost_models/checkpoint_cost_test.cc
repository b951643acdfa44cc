// Tests cost_models/checkpoint_cost.h: a checkpoint holds one copy of every parameter's weights,
// master weights and AdamW moments whatever the plan's degrees; a rank writes its share of its
// replica; the storage default and the transfer time.
#include "cost_models/checkpoint_cost.h"

#include <gtest/gtest.h>

namespace parasol::cost {
namespace {

Plan plan(int tp, int pp, int dp) {
  Plan p;
  p.tp = tp;
  p.pp = pp;
  p.dp = dp;
  p.micro_batch = 1;
  p.global_batch = dp * 8;
  return p;
}

TEST(CheckpointCost, OneCopyOfTheStateWhateverThePlan) {
  const Model m = model_preset("llama3-8b");
  const double params = param_counts(m).total;
  // bf16 weights 2 + fp32 master 4 + two fp32 moments 8 = 14 bytes a parameter.
  for (const Plan& p : {plan(1, 1, 8), plan(8, 1, 1), plan(2, 2, 4), plan(4, 4, 16)}) {
    const CheckpointSize s = checkpoint_size(m, p);
    EXPECT_NEAR(s.total_bytes, 14 * params, 1e-9 * s.total_bytes) << p.tp << p.pp << p.dp;
    EXPECT_NEAR(s.weights_bytes, 2 * params, 1e-9 * s.total_bytes);
    EXPECT_NEAR(s.master_bytes, 4 * params, 1e-9 * s.total_bytes);
    EXPECT_NEAR(s.optimizer_bytes, 8 * params, 1e-9 * s.total_bytes);
  }
  // Data parallelism alone: every rank writes an eighth.
  EXPECT_NEAR(checkpoint_size(m, plan(1, 1, 8)).max_rank_bytes, 14 * params / 8, 1);
  // fp32: 4 + 8 bytes; a bf16 optimizer (the bf16 weights are the master): 2 + 4.
  Plan fp32 = plan(1, 1, 8);
  fp32.precision = Dtype::kFp32;
  EXPECT_NEAR(checkpoint_size(m, fp32).total_bytes, 12 * params, 1e-6 * params);
  Plan bf16 = plan(1, 1, 8);
  bf16.optimizer_dtype = Dtype::kBf16;
  EXPECT_NEAR(checkpoint_size(m, bf16).total_bytes, 6 * params, 1e-6 * params);
}

TEST(CheckpointCost, ExpertsCountOnce) {
  const Model m = model_preset("mixtral-8x7b");
  Plan p = plan(1, 1, 8);
  p.ep = 8;
  EXPECT_NEAR(checkpoint_size(m, p).total_bytes, 14.0 * param_counts(m).total,
              1e-9 * 14 * param_counts(m).total);
}

TEST(CheckpointCost, StorageDefaultAndTransfer) {
  Cluster c = cluster_preset("dgx-h100", 16384);
  EXPECT_NEAR(storage_bandwidth(c), 2e12, 1);  // Llama 3's Tectonic: 2 TB/s for 16,384 GPUs
  c.storage_bw = 5e11;
  EXPECT_DOUBLE_EQ(storage_bandwidth(c), 5e11);
  CheckpointSize s;
  s.total_bytes = 1e12;
  EXPECT_DOUBLE_EQ(checkpoint_transfer_s(s, 5e11), 2);
}

}  // namespace
}  // namespace parasol::cost
