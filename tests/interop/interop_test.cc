// Tests interop/interop.h: the server layout of a launch, the export by framework name and the
// search's predicate (can_export), against the per-framework writers.
#include "interop/interop.h"

#include <gtest/gtest.h>

#include <string>

#include "core/error.h"
#include "interop/deepspeed.h"
#include "interop/megatron.h"
#include "interop/torchtitan.h"
#include "tests/interop/golden.h"

namespace parasol::interop {
namespace {

TEST(ServerLayout, FillsWholeServersOrNamesThePlan) {
  const Cluster c = load_cluster("dgx-h100", 64);  // 8 GPUs per server
  EXPECT_EQ(server_layout(c, 64).nodes, 8);
  EXPECT_EQ(server_layout(c, 64).per_node, 8);
  EXPECT_EQ(server_layout(c, 4).nodes, 1);  // part of one server
  EXPECT_EQ(server_layout(c, 4).per_node, 4);
  try {
    server_layout(c, 12);  // one and a half servers: a launcher starts as many on every node
    FAIL() << "12 GPUs on 8-GPU servers";
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "plan");
  }
}

TEST(ExportPlan, DispatchesByNameAndRefusesOtherNames) {
  const Model m = model_preset("llama3-8b");
  const Cluster c = load_cluster("dgx-h100", 8);
  const Plan p =
      plan_of(R"({"tp": 2, "dp": 4, "zero": 3, "gbs": 32, "sp": true})");  // all three run it
  ASSERT_EQ(framework_names().size(), 3u);
  for (const std::string& name : framework_names()) {
    SCOPED_TRACE(name);
    const Export want = name == "megatron"    ? export_megatron(m, c, p)
                        : name == "deepspeed" ? export_deepspeed(m, c, p)
                                              : export_torchtitan(m, c, p);
    const Export got = export_plan(name, m, c, p);
    EXPECT_EQ(got.framework, want.framework);
    ASSERT_EQ(got.files.size(), want.files.size());
    for (size_t i = 0; i < got.files.size(); ++i) EXPECT_EQ(got.files[i].text, want.files[i].text);
  }
  try {
    export_plan("nemo", m, c, p, "search.framework");
    FAIL() << "nemo";
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "search.framework");
    EXPECT_NE(std::string(e.what()).find("megatron|deepspeed|torchtitan"), std::string::npos);
  }
}

TEST(CanExport, IsWhetherTheExportSucceeds) {
  const Model m = model_preset("llama3-8b");
  const Cluster c = load_cluster("dgx-h100", 16);
  // Interleaved 1F1B with the distributed optimizer: Megatron runs it; DeepSpeed's pipeline has
  // no virtual stages; torchtitan has no ZeRO-1.
  const Plan p = plan_of(
      R"({"tp": 2, "pp": 2, "dp": 4, "vpp": 2, "schedule": "interleaved", "zero": 1, "gbs": 64,
          "sp": true})");
  EXPECT_TRUE(can_export("megatron", m, c, p));
  EXPECT_FALSE(can_export("deepspeed", m, c, p));
  EXPECT_FALSE(can_export("torchtitan", m, c, p));
  EXPECT_THROW(export_deepspeed(m, c, p), Error);
  EXPECT_THROW(export_torchtitan(m, c, p), Error);
}

}  // namespace
}  // namespace parasol::interop
