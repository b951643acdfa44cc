// core/sibling_presets.h: a server size of another product of one silicon brings that product's
// preset; a server size of the device's own product, or of a device with no sibling, brings none.
#include "core/sibling_presets.h"

#include <gtest/gtest.h>

#include "core/cluster.h"

namespace parasol {
namespace {

TEST(SiblingPresets, AnotherProductOfTheSiliconBringsItsServers) {
  // 72 per server of B200's silicon: the GB200 NVL72 rack; 8 per server of GB200's: DGX B200.
  EXPECT_EQ(cluster_preset_of_sibling("B200", 72), "gb200-nvl72");
  EXPECT_EQ(cluster_preset_spec("gb200-nvl72").server.device, "GB200");
  EXPECT_EQ(cluster_preset_of_sibling("GB200", 8), "dgx-b200");
  EXPECT_EQ(cluster_preset_spec("dgx-b200").server.device, "B200");
}

TEST(SiblingPresets, TheDevicesOwnProductIsNoSibling) {
  // h200-1 holds one H200 and DGX H200 eight: two boxes of one product, not two products.
  EXPECT_EQ(cluster_preset_spec("h200-1").server.device, "H200");
  EXPECT_EQ(cluster_preset_spec("h200-1").server.gpus, 1);
  EXPECT_EQ(cluster_preset_of_sibling("H200", 1), "");
  EXPECT_EQ(cluster_preset_of_sibling("H200", 8), "");
  EXPECT_EQ(cluster_preset_of_sibling("B200", 8), "");
  EXPECT_EQ(cluster_preset_of_sibling("GB200", 72), "");
  // A size no sibling is sold in, and a device without siblings.
  EXPECT_EQ(cluster_preset_of_sibling("B200", 16), "");
  EXPECT_EQ(cluster_preset_of_sibling("H100-SXM", 72), "");
  EXPECT_EQ(cluster_preset_of_sibling("A100-80G", 8), "");
}

}  // namespace
}  // namespace parasol
