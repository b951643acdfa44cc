// sim/what_if_cluster.h: axes and their ranges, presets as generators, the numbering of a grid's
// points, and a model's training state as the memory model holds it.
#include "sim/what_if_cluster.h"

#include <gtest/gtest.h>

#include "core/cluster.h"
#include "core/model.h"
#include "cost_models/memory.h"

namespace parasol::sim {
namespace {

TEST(SweepAxis, ListsRangesAndGeometricRanges) {
  SweepAxis a = parse_sweep_axis("gpus=8,16:64:16,128:512:x2");
  ASSERT_EQ(a.key, "gpus");
  std::vector<int64_t> got;
  for (const Json& v : a.values) got.push_back(v.get<int64_t>());
  EXPECT_EQ(got, (std::vector<int64_t>{8, 16, 32, 48, 64, 128, 256, 512}));
  SweepAxis nic = parse_sweep_axis("nic_GBps=12.5:50:12.5");
  ASSERT_EQ(nic.values.size(), 4u);
  EXPECT_DOUBLE_EQ(nic.values[3].get<double>(), 50.0);
  SweepAxis dev = parse_sweep_axis("device=A100-80G,B200");
  EXPECT_EQ(dev.values[1].get<std::string>(), "B200");
}

TEST(SweepCluster, APresetAsAGeneratorIsThePreset) {
  for (const std::string name : {"dgx-a100-80g", "dgx-h100", "dgx-b200", "mi300x-8"}) {
    Json g = cluster_preset_generator(name);
    EXPECT_EQ(cluster_to_json(cluster_from_json(g, 64)), cluster_to_json(cluster_preset(name, 64)))
        << name;
  }
}

// Every index is one point: the positions count up with the last axis fastest, and grid_index
// is their inverse.
TEST(WhatIfGrid, PointsAreNumberedFirstAxisSlowest) {
  const std::vector<int64_t> sizes = {2, 3, 4};
  ASSERT_EQ(grid_point_count(sizes), 24);
  std::vector<int64_t> expected = {0, 0, 0};
  for (int64_t i = 0; i < 24; ++i) {
    EXPECT_EQ(grid_positions(sizes, i), expected) << i;
    EXPECT_EQ(grid_index(sizes, expected), i);
    // The next point as an odometer counts: the last axis turns first.
    for (size_t k = sizes.size(); k-- > 0;) {
      if (++expected[k] < sizes[k]) break;
      expected[k] = 0;
    }
  }
  EXPECT_EQ(grid_point_count({}), 1);
  EXPECT_TRUE(grid_positions({}, 0).empty());

  WhatIfGrid g;
  g.axes.push_back(parse_sweep_axis("device=A100-80G,H100-SXM"));
  g.axes.push_back(parse_sweep_axis("gpus=8,16,32"));
  ASSERT_EQ(sweep_point_count(g), 6);
  EXPECT_EQ(sweep_point_values(g, 4), (Json{{"device", "H100-SXM"}, {"gpus", 16}}));
}

// Mixed-precision Adam holds bf16 weights, fp32 gradients (Megatron's main_grad), fp32 master
// weights and two fp32 moments: 2 + 4 + 4 + 8 = 18 bytes per parameter; fp32 training 4 + 4 + 8.
TEST(WhatIfGrid, TrainingStateIsTheMemoryModelsReplica) {
  const Model m = load_model("llama3-8b");
  const Cluster c = cluster_preset("dgx-h100", 8);
  const double params = param_counts(m).total;
  EXPECT_NEAR(training_state_bytes(m, c, Dtype::kBf16), 18 * params, 1e-9 * 18 * params);
  EXPECT_NEAR(training_state_bytes(m, c, Dtype::kFp32), 16 * params, 1e-9 * 16 * params);
  // 8 H100s (640 GB) hold Llama 3 8B's 144 GB; one does not, nor with its host memory share.
  EXPECT_TRUE(can_hold(c, m, Dtype::kBf16, false));
  const Cluster one = cluster_preset("dgx-h100", 1);
  EXPECT_FALSE(can_hold(one, m, Dtype::kBf16, false));
  EXPECT_DOUBLE_EQ(memory_capacity(one, true),
                   one.gpu_device(0).hbm_bytes + one.host_memory_per_gpu(0));
}

}  // namespace
}  // namespace parasol::sim
