// Tests interop/interop.h: the server layout of a launch, the export by framework name, the
// search's predicate (can_export) against the per-framework writers, the refusal collector, the
// export tag, and the import of a --plan file by its content (import_file).
#include "interop/interop.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <set>
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
  // All three run it, each with its own tensor-parallel layers (framework_tp_impl).
  Plan p = plan_of(R"({"tp": 2, "dp": 4, "zero": 3, "gbs": 32, "sp": true})");
  ASSERT_EQ(framework_names().size(), 3u);
  for (const std::string& name : framework_names()) {
    SCOPED_TRACE(name);
    p.tp_impl = framework_tp_impl(name);
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

// runs_selective_op (what the search enumerates for `search --framework F`) is what each
// framework's export does with a plan that differs from one it runs only in the op-level policy.
TEST(CanExport, OpLevelRecomputeRunsWhereRunsSelectiveOpSaysSo) {
  const Model m = model_preset("llama3-8b");
  const Cluster c = load_cluster("dgx-h100", 16);
  int running = 0;
  for (const std::string& f : framework_names()) {
    SCOPED_TRACE(f);
    Plan p = plan_of(R"({"tp": 2, "dp": 8, "zero": 3, "gbs": 64, "sp": true})");
    p.tp_impl = framework_tp_impl(f);
    Plan op_level = p;
    op_level.recompute = Recompute::kSelectiveOp;
    validate(op_level, m, c);
    if (!can_export(f, m, c, p)) continue;
    ++running;
    EXPECT_EQ(can_export(f, m, c, op_level), runs_selective_op(f));
  }
  EXPECT_EQ(running, 3);
  EXPECT_TRUE(runs_selective_op("torchtitan"));
  EXPECT_FALSE(runs_selective_op("megatron"));
  EXPECT_FALSE(runs_selective_op("deepspeed"));
}

// framework_tp_impl (what `search --framework F` gives its tp > 1 plans) is the tensor
// parallelism each framework's export accepts: torchtitan runs PyTorch's DTensor TP, Megatron-LM
// and Megatron-DeepSpeed Megatron's layers; each refuses the other by name (plan.tp_impl), and
// at tp 1 the switch says nothing.
TEST(CanExport, EachFrameworkRunsItsOwnTensorParallelLayers) {
  const Model m = model_preset("llama3-8b");
  const Cluster c = load_cluster("dgx-h100", 8);
  EXPECT_EQ(framework_tp_impl("torchtitan"), TpImpl::kPytorch);
  EXPECT_EQ(framework_tp_impl("megatron"), TpImpl::kMegatron);
  EXPECT_EQ(framework_tp_impl("deepspeed"), TpImpl::kMegatron);
  for (const std::string& f : framework_names()) {
    SCOPED_TRACE(f);
    Plan p = plan_of(R"({"tp": 2, "dp": 4, "zero": 3, "gbs": 32, "sp": true})");
    p.tp_impl = framework_tp_impl(f);
    EXPECT_TRUE(export_refusals(f, m, c, p).empty());
    p.tp_impl = p.tp_impl == TpImpl::kPytorch ? TpImpl::kMegatron : TpImpl::kPytorch;
    const auto reasons = export_refusals(f, m, c, p);
    ASSERT_EQ(reasons.size(), 1u);
    EXPECT_EQ(reasons[0].first, "plan.tp_impl");
    Plan one = plan_of(R"({"dp": 8, "zero": 3, "gbs": 32})");
    for (TpImpl t : {TpImpl::kMegatron, TpImpl::kPytorch}) {
      one.tp_impl = t;
      EXPECT_TRUE(export_refusals(f, m, c, one).empty()) << tp_impl_name(t);
    }
  }
}

// framework_cp_impl likewise: torchtitan runs PyTorch's context_parallel and Megatron-LM
// Transformer Engine's ring; each refuses the other's by name (plan.cp_impl).
TEST(CanExport, TorchtitanAndMegatronRunTheirOwnContextParallelism) {
  const Model m = model_preset("llama3-8b");
  const Cluster c = load_cluster("dgx-h100", 8);
  EXPECT_EQ(framework_cp_impl("torchtitan"), CpImpl::kPytorch);
  EXPECT_EQ(framework_cp_impl("megatron"), CpImpl::kTransformerEngine);
  EXPECT_EQ(framework_cp_impl("deepspeed"), CpImpl::kTransformerEngine);
  for (const std::string f : {"torchtitan", "megatron"}) {
    SCOPED_TRACE(f);
    Plan p = plan_of(R"({"cp": 2, "dp": 4, "zero": 3, "gbs": 32})");
    p.cp_impl = framework_cp_impl(f);
    EXPECT_TRUE(export_refusals(f, m, c, p).empty());
    p.cp_impl = p.cp_impl == CpImpl::kPytorch ? CpImpl::kTransformerEngine : CpImpl::kPytorch;
    const auto reasons = export_refusals(f, m, c, p);
    ASSERT_EQ(reasons.size(), 1u);
    EXPECT_EQ(reasons[0].first, "plan.cp_impl");
  }
}

TEST(Refusals, OneReasonIsItselfAndSeveralAreJoined) {
  Refusals none;
  EXPECT_NO_THROW(none.raise());
  Refusals one;
  one.add("plan.zero", "no ZeRO-2");
  try {
    one.raise();
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "plan.zero");
    EXPECT_EQ(e.reason(), "no ZeRO-2");
    EXPECT_TRUE(e.is_user_error());
  }
  Refusals three;
  three.add("plan.zero", "no ZeRO-2");
  three.add("plan.offload", "no parameter offload");
  three.add("plan.zero", "and not with pp");
  try {
    three.raise();
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "plan.zero, plan.offload");  // each field once, in order
    EXPECT_EQ(e.reason(),
              "3 reasons: plan.zero: no ZeRO-2; plan.offload: no parameter offload; plan.zero: "
              "and not with pp");
    EXPECT_EQ(exit_code(e.kind()), 2);
  }
}

// export_refusals lists what the export throws; can_export is whether it is empty.
TEST(CanExport, RefusalsListEveryReasonOfEachFramework) {
  const Model m = model_preset("llama3-8b");
  const Cluster c = load_cluster("dgx-h100", 16);
  const Plan p = plan_of(R"({"tp": 2, "pp": 2, "dp": 4, "vpp": 2, "schedule": "interleaved",
                             "zero": 1, "gbs": 64, "sp": true, "precision": "fp16"})");
  for (const std::string& f : framework_names()) {
    SCOPED_TRACE(f);
    const auto reasons = export_refusals(f, m, c, p);
    EXPECT_EQ(can_export(f, m, c, p), reasons.empty());
    if (reasons.empty()) continue;
    try {
      export_plan(f, m, c, p);
      FAIL() << "exported";
    } catch (const Error& e) {
      for (const auto& [field, reason] : reasons) {
        EXPECT_NE(e.field().find(field), std::string::npos) << field;
        EXPECT_NE(std::string(e.what()).find(reason), std::string::npos) << reason;
      }
    }
  }
  // torchtitan: no ZeRO-1, no fp16: both named.
  std::set<std::string> fields;
  for (const auto& [field, reason] : export_refusals("torchtitan", m, c, p)) fields.insert(field);
  EXPECT_TRUE(fields.count("plan.zero"));
  EXPECT_TRUE(fields.count("plan.precision"));
}

TEST(ExportTag, WritesAndReadsTheTarget) {
  Model m = model_preset("llama3-8b");
  const Cluster c = load_cluster("dgx-h100", 16);
  const std::string line = export_tag_line(m, c, 16);
  EXPECT_EQ(line, "# parasol-export: model=llama3-8b cluster=dgx-h100 gpus=16\n");
  const std::optional<ExportTag> tag = read_export_tag("#!/bin/bash\n# x\n" + line + "X=1\n");
  ASSERT_TRUE(tag);
  EXPECT_EQ(tag->model, "llama3-8b");
  EXPECT_EQ(tag->cluster, "dgx-h100");
  EXPECT_EQ(tag->gpus, 16);
  m.name = "my model";  // a name with a space is left out
  const std::optional<ExportTag> no_model = read_export_tag(export_tag_line(m, c, 16));
  ASSERT_TRUE(no_model);
  EXPECT_EQ(no_model->model, "");
  EXPECT_EQ(no_model->cluster, "dgx-h100");
  EXPECT_FALSE(read_export_tag("# llama3-8b on 16 GPUs of dgx-h100\n"));
}

// The launch script names its cluster in the export tag: an import without --cluster takes it
// (not the default cluster); a script without the tag needs --cluster.
TEST(ImportFile, TheClusterComesFromTheTagOrMustBeGiven) {
  const Model m = model_preset("llama3-70b");
  const Cluster c = load_cluster("dgx-h100", 64);
  const Plan p = plan_of(R"({"tp": 4, "pp": 2, "cp": 2, "dp": 4, "zero": 3, "seq": 16384,
                             "gbs": 64, "sp": true})");
  const Export e = export_plan("megatron", m, c, p);
  const auto dir = write_export(e, "import_cluster");
  const std::string path = (dir / "launch_megatron.sh").string();
  const std::string text = read_file_text(path);
  const std::optional<ImportedJob> job = import_file(path, text, {});
  ASSERT_TRUE(job);
  EXPECT_EQ(job->plan["cluster"], "dgx-h100");
  EXPECT_EQ(job->gpus, 64);
  ImportOptions given;
  given.cluster_given = true;  // --cluster wins: the plan does not name one
  EXPECT_FALSE(import_file(path, text, given)->plan.contains("cluster"));
  std::string untagged = text;
  const size_t at = untagged.find("# parasol-export:");
  untagged.erase(at, untagged.find('\n', at) - at + 1);
  ASSERT_FALSE(read_export_tag(untagged));
  try {
    import_file(path, untagged, {});
    FAIL() << "no error";
  } catch (const Error& err) {
    EXPECT_EQ(err.field(), "--cluster");
  }
  EXPECT_TRUE(import_file(path, untagged, given));
}

// An argument file (no torchrun line) with --num-distributed-optimizer-instances reads with the
// GPU count of --gpus.
TEST(ImportFile, AnArgumentFileTakesTheGpuCountOfGpus) {
  const Model m = model_preset("llama3-8b");
  const Cluster c = load_cluster("dgx-h100", 16);
  const Plan p = plan_of(R"({"tp": 2, "dp": 8, "zero": 1, "shard_degree": 4, "gbs": 64})");
  const Export e = export_plan("megatron", m, c, p);
  const auto dir = write_export(e, "import_instances");
  const std::string path = (dir / "megatron_args.txt").string();
  ImportOptions o;
  try {
    import_file(path, read_file_text(path), o);
    FAIL() << "no error";
  } catch (const Error& err) {
    EXPECT_EQ(err.field(), "--num-distributed-optimizer-instances");
  }
  o.gpus = 16;
  const std::optional<ImportedJob> job = import_file(path, read_file_text(path), o);
  ASSERT_TRUE(job);
  EXPECT_EQ(job->plan["shard_degree"], 4);
  EXPECT_EQ(job->plan["dp"], 8);
}

// A parasol plan JSON (or anything that is no other framework's file) is the caller's to parse.
TEST(ImportFile, APlanJsonIsNotImported) {
  EXPECT_FALSE(import_file("plan.json", R"({"tp": 2, "gbs": 8})", {}));
  EXPECT_FALSE(import_file("plan.json", "{ not json", {}));
  EXPECT_FALSE(import_file("plan.json", "", {}));
}

}  // namespace
}  // namespace parasol::interop
