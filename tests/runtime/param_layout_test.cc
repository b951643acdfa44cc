// Tests of runtime/param_layout: full tensor shapes against the model's figures and the
// Programs lower() emits; every rank's slice runs against a reference written element by element
// from Megatron's definitions; the slices of all ranks tiling each full tensor; ZeRO shard runs
// tiling each bucket; group indices against RankLayout; the gradient-norm runs counting every
// element of the model exactly once in the reduction lower() emits.
#include "runtime/param_layout.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>

#include "core/error.h"
#include "state_test_util.h"
#include "tests/core/expect_error.h"

namespace parasol::runtime {
namespace {

using testing::all_cases;
using testing::Case;
using testing::flat_to_spec;
using testing::make_plan;
using testing::product;
using testing::ref_full_index;
using testing::shard_begin;
using testing::SimRun;

using Shape = std::vector<int64_t>;

TEST(TensorInfo, FullShapesOfTheTinyModels) {
  const Model tiny = model_preset("tiny");  // h 64, heads 4, kv 2, ffn 256 swiglu, vocab 512
  EXPECT_EQ(tensor_info(tiny, "L1.qkv").shape, (Shape{64, 64 + 2 * 32}));
  EXPECT_EQ(tensor_info(tiny, "L0.out").shape, (Shape{64, 64}));
  EXPECT_EQ(tensor_info(tiny, "L0.fc1").shape, (Shape{64, 512}));
  EXPECT_EQ(tensor_info(tiny, "L0.fc2").shape, (Shape{256, 64}));
  EXPECT_EQ(tensor_info(tiny, "L0.ln1").shape, (Shape{64}));
  EXPECT_EQ(tensor_info(tiny, "head.lnf").shape, (Shape{64}));
  EXPECT_EQ(tensor_info(tiny, "emb.table").shape, (Shape{512, 64}));
  EXPECT_EQ(tensor_info(tiny, "head.head").shape, (Shape{64, 512}));
  EXPECT_FALSE(tensor_info(tiny, "head.head").tied_copy);
  EXPECT_EQ(tensor_info(tiny, "L1.qkv").layer, 1);

  const Model gpt = model_preset("tiny-gpt");  // layernorm, gelu ffn 256, biases, positions
  EXPECT_EQ(tensor_info(gpt, "L0.ln2").shape, (Shape{2, 64}));
  EXPECT_EQ(tensor_info(gpt, "L0.qkv.b").shape, (Shape{192}));
  EXPECT_EQ(tensor_info(gpt, "L0.fc1").shape, (Shape{64, 256}));
  EXPECT_EQ(tensor_info(gpt, "L0.fc1.b").shape, (Shape{256}));
  EXPECT_EQ(tensor_info(gpt, "L0.fc2.b").shape, (Shape{64}));
  EXPECT_EQ(tensor_info(gpt, "emb.pos").shape, (Shape{64, 64}));
  EXPECT_TRUE(tensor_info(gpt, "head.head").tied_copy);

  const Model moe = testing::gpt_moe();  // 4 experts, expert_ffn 128, layer 1 MoE
  EXPECT_EQ(tensor_info(moe, "L1.router").shape, (Shape{64, 4}));
  EXPECT_EQ(tensor_info(moe, "L1.efc1").shape, (Shape{4, 64, 128}));
  EXPECT_EQ(tensor_info(moe, "L1.efc1.b").shape, (Shape{4, 128}));
  EXPECT_EQ(tensor_info(moe, "L1.efc2").shape, (Shape{4, 128, 64}));
  EXPECT_EQ(tensor_info(moe, "L1.efc2.b").shape, (Shape{4, 64}));
  EXPECT_TRUE(tensor_info(moe, "L1.efc2").expert);
  EXPECT_FALSE(tensor_info(moe, "L1.router").expert);
  const Model smoe = model_preset("tiny-moe");  // swiglu experts: gate | up
  EXPECT_EQ(tensor_info(smoe, "L0.efc1").shape, (Shape{4, 64, 256}));

  // Replicated over tp: norms, row-parallel biases, router, positions.
  for (const char* n : {"L0.ln1", "L0.ln2", "head.lnf", "L0.out.b", "L0.fc2.b", "emb.pos"})
    EXPECT_TRUE(tensor_info(gpt, n).tp_replicated) << n;
  EXPECT_TRUE(tensor_info(moe, "L1.router").tp_replicated);
  EXPECT_TRUE(tensor_info(moe, "L1.efc2.b").tp_replicated);
  for (const char* n :
       {"L0.qkv", "L0.qkv.b", "L0.out", "L0.fc1", "L0.fc1.b", "L0.fc2", "emb.table", "head.head"})
    EXPECT_FALSE(tensor_info(gpt, n).tp_replicated) << n;
  for (const char* n : {"L1.efc1", "L1.efc1.b", "L1.efc2"})
    EXPECT_FALSE(tensor_info(moe, n).tp_replicated) << n;
}

TEST(TensorInfo, ModelTensorsCountTheModelsParameters) {
  for (const Model& m : {model_preset("tiny"), model_preset("tiny-gpt"), model_preset("tiny-moe"),
                         testing::gpt_untied(), testing::gpt_moe(), model_preset("gpt2-124m")}) {
    int64_t n = 0;
    for (const TensorInfo& t : model_tensors(m)) n += t.elements();
    EXPECT_EQ(n, param_counts(m).total) << m.name;
    if (m.tied_embeddings) {
      const std::vector<TensorInfo> with_copy = model_tensors(m, true);
      EXPECT_EQ(with_copy.back().name, "head.head");
      EXPECT_EQ(with_copy.size(), model_tensors(m).size() + 1);
    }
  }
}

// The tensors of model_tensors() are exactly the specs lower() emits over all stages.
TEST(TensorInfo, ModelTensorsAreTheProgramsSpecs) {
  for (const Case& c : all_cases()) {
    SCOPED_TRACE(c.name);
    std::vector<std::string> specs;
    for (int s = 0; s < c.plan.pp; ++s)
      for (const ParamBucket& b : lower_stage(c.model, c.plan, s).buckets)
        for (const ParamSpec& sp : b.specs) specs.push_back(sp.name);
    std::vector<std::string> names;
    for (const TensorInfo& t : model_tensors(c.model, has_tied_head_copy(c.model, c.plan)))
      names.push_back(t.name);
    std::sort(specs.begin(), specs.end());
    std::sort(names.begin(), names.end());
    EXPECT_EQ(specs, names);
  }
}

TEST(TensorInfo, RejectsTensorsTheModelLacks) {
  const Model tiny = model_preset("tiny"), moe = model_preset("tiny-moe");
  ExpectError([&] { tensor_info(tiny, "L2.qkv"); }, "param.L2.qkv", "not in [0, 2)");
  ExpectError([&] { tensor_info(tiny, "L0.qkv.b"); }, "param.L0.qkv.b", "no linear biases");
  ExpectError([&] { tensor_info(tiny, "emb.pos"); }, "param.emb.pos", "no learned positions");
  ExpectError([&] { tensor_info(tiny, "L0.router"); }, "param.L0.router", "is not MoE");
  ExpectError([&] { tensor_info(moe, "L0.fc1"); }, "param.L0.fc1", "is an MoE layer");
  ExpectError([&] { tensor_info(tiny, "L0.wq"); }, "param.L0.wq", "unknown weight");
  ExpectError([&] { tensor_info(tiny, "Lx.qkv"); }, "param.Lx.qkv", "unknown parameter");
  ExpectError([&] { tensor_info(tiny, "table"); }, "param.table", "unknown parameter");
}

// Every local element of every rank's every spec maps to the full element the reference says
// (padding to none), and the runs are ordered, disjoint and within the slice and the tensor.
TEST(SliceRuns, MatchTheReferenceOnEveryRank) {
  for (const Case& c : all_cases()) {
    SCOPED_TRACE(c.name);
    SimRun run(c.model, c.plan);
    for (const testing::SimRank& r : run.ranks)
      for (const ParamBucket& b : r.program->buckets)
        for (const ParamSpec& spec : b.specs) {
          SCOPED_TRACE(spec.name + " on rank " + std::to_string(r.rank));
          ASSERT_EQ(local_shape(c.model, c.plan, r.coord, spec.name), spec.shape);
          const std::vector<SliceRun> runs = slice_runs(c.model, c.plan, r.coord, spec);
          const int64_t n = spec.elements(), full = tensor_info(c.model, spec.name).elements();
          std::vector<int64_t> got(static_cast<size_t>(n), -1);
          int64_t last_end = 0;
          for (const SliceRun& s : runs) {
            ASSERT_GT(s.count, 0);
            ASSERT_GE(s.local_offset, last_end);
            ASSERT_LE(s.local_offset + s.count, n);
            ASSERT_GE(s.full_offset, 0);
            ASSERT_LE(s.full_offset + s.count, full);
            last_end = s.local_offset + s.count;
            for (int64_t k = 0; k < s.count; ++k) got[s.local_offset + k] = s.full_offset + k;
          }
          int64_t mismatches = 0;
          for (int64_t i = 0; i < n; ++i)
            mismatches += got[i] != ref_full_index(c.model, c.plan, r.coord, spec.name, i);
          EXPECT_EQ(mismatches, 0);
        }
  }
}

// The slices of the ranks of one model replica (dp = cp = 0; for the experts the ranks of
// expert data-parallel index 0: each ep rank) tile every full tensor: each element held by
// exactly one tp rank (expert tp rank), or by all of them for tensors replicated over it.
TEST(SliceRuns, SlicesOfAllRanksTileTheFullTensors) {
  for (const Case& c : all_cases()) {
    SCOPED_TRACE(c.name);
    SimRun run(c.model, c.plan);
    std::map<std::string, std::vector<int>> hits;
    for (const TensorInfo& t : model_tensors(c.model, has_tied_head_copy(c.model, c.plan)))
      hits[t.name].assign(static_cast<size_t>(t.elements()), 0);
    for (const testing::SimRank& r : run.ranks) {
      for (const ParamBucket& b : r.program->buckets) {
        if (b.expert ? r.coord.edp != 0 : r.coord.cp != 0 || r.coord.dpx != 0 || r.coord.ep != 0)
          continue;
        for (const ParamSpec& spec : b.specs)
          for (const SliceRun& s : slice_runs(c.model, c.plan, r.coord, spec))
            for (int64_t k = 0; k < s.count; ++k) ++hits.at(spec.name)[s.full_offset + k];
      }
    }
    for (const auto& [name, h] : hits) {
      const TensorInfo t = tensor_info(c.model, name);
      const int want = !t.tp_replicated ? 1 : t.expert ? c.plan.expert_tp() : c.plan.tp;
      const int64_t wrong = std::count_if(h.begin(), h.end(), [&](int x) { return x != want; });
      EXPECT_EQ(wrong, 0) << name << " (each element should be held " << want << " times)";
    }
  }
}

TEST(SliceRuns, PaddingRowsOfTheVocabularyAreInNoRun) {
  const Model m = testing::gpt_untied();  // vocab 510, tp 4: 128 rows per rank, 126 on the last
  const Plan p = make_plan({.tp = 4});
  const RankCoord last{3, 0, 0, 0, 0};
  const std::vector<SliceRun> table = slice_runs(m, p, last, {"emb.table", {128, 64}});
  ASSERT_EQ(table.size(), 1u);
  EXPECT_EQ(table[0], (SliceRun{0, 384 * 64, 126 * 64}));
  const std::vector<SliceRun> head = slice_runs(m, p, last, {"head.head", {64, 128}});
  ASSERT_EQ(head.size(), 64u);  // one run per row of [h, vocab]
  EXPECT_EQ(head[5], (SliceRun{5 * 128, 5 * 510 + 384, 126}));
}

TEST(SliceRuns, RejectASpecOfAnotherShape) {
  const Model m = model_preset("tiny");
  const Plan p = make_plan({.tp = 2});
  ExpectError(
      [&] {
        slice_runs(m, p, RankCoord{}, {"L0.qkv", {64, 128}});
      },
      "param.L0.qkv", "should be [64, 64], got [64, 128]");
}

TEST(ClipRuns, CutsRunsToARange) {
  const std::vector<SliceRun> runs = {{0, 100, 4}, {4, 200, 4}, {10, 300, 2}};
  EXPECT_EQ(clip_runs(runs, 2, 4), (std::vector<SliceRun>{{2, 102, 2}, {4, 200, 2}}));
  EXPECT_EQ(clip_runs(runs, 7, 5), (std::vector<SliceRun>{{7, 203, 1}, {10, 300, 2}}));
  EXPECT_TRUE(clip_runs(runs, 8, 2).empty());  // the gap
  EXPECT_EQ(clip_runs(runs, 0, 100).size(), 3u);
}

TEST(GroupIndex, IsThePositionInRankLayoutsGroup) {
  for (const Case& c : all_cases()) {
    SCOPED_TRACE(c.name);
    RankLayout layout(c.plan);
    for (int r = 0; r < layout.world(); ++r)
      for (Group g : {Group::kDpCp, Group::kExpertDp, Group::kDpShard, Group::kDpReplicate,
                      Group::kExpertShard, Group::kExpertReplicate}) {
        const std::vector<int> members = layout.group(g, r);
        const auto it = std::find(members.begin(), members.end(), r);
        EXPECT_EQ(group_index(c.plan, layout.coord(r), g), it - members.begin())
            << group_name(g) << " of rank " << r;
      }
  }
  ExpectError([] { group_index(Plan{}, RankCoord{}, Group::kTp); }, "group", "'tp'");
}

// For every bucket and every index of its group: the runs lie at the flat positions of the
// shard, name the spec element the flat bucket has there, and the ranges of all indices cover
// the bucket exactly once (ZeRO >= 1) or each the whole bucket (ZeRO 0).
TEST(ShardRuns, TileEachBucket) {
  int sharded = 0, padded = 0;
  for (const Case& c : all_cases()) {
    SCOPED_TRACE(c.name);
    for (int s = 0; s < c.plan.pp; ++s)
      for (const ParamBucket& b : lower_stage(c.model, c.plan, s).buckets) {
        SCOPED_TRACE(b.name);
        std::vector<int> cover(static_cast<size_t>(b.elements), 0);
        for (int index = 0; index < b.ways; ++index) {
          const int64_t begin = shard_begin(b, index);
          int64_t next = 0;  // shard offsets are consecutive from 0
          for (const ShardRun& r : shard_runs(b, index)) {
            ASSERT_EQ(r.shard_offset, next);
            ASSERT_GT(r.count, 0);
            for (int64_t k = 0; k < r.count; ++k) {
              const auto [spec, off] = flat_to_spec(b, begin + r.shard_offset + k);
              ASSERT_EQ(spec, r.spec);
              ASSERT_EQ(off, r.spec_offset + k);
              ++cover[begin + r.shard_offset + k];
            }
            next += r.count;
          }
          const int64_t want = b.zero == 0
                                   ? b.elements
                                   : std::max<int64_t>(0, std::min(b.shard, b.elements - begin));
          EXPECT_EQ(next, want) << "index " << index;
          const FlatRange fr = shard_range(b, index);
          EXPECT_EQ(fr.end - fr.begin, want);
        }
        const int times = b.zero == 0 ? b.ways : 1;
        EXPECT_EQ(std::count(cover.begin(), cover.end(), times), b.elements);
        sharded += b.zero >= 1;
        padded += b.zero >= 1 && b.shard * b.ways > b.elements;
      }
  }
  EXPECT_GT(sharded, 0);
  EXPECT_GT(padded, 0);  // dp 3 leaves shard padding: the tiling is tested with it
  const ParamBucket b =
      lower_stage(model_preset("tiny"), make_plan({.dp = 2, .zero = 1}), 0).buckets[0];
  ExpectError([&] { shard_range(b, 2); }, "bucket." + b.name, "not in [0, 2)");
}

TEST(GradNorm, ReplicatedTensorsCountOnTpRankZero) {
  const Model m = model_preset("tiny-gpt");
  RankCoord tp0, tp1;
  tp1.tp = 1;
  EXPECT_TRUE(counts_in_grad_norm(m, tp0, "L0.ln1"));
  EXPECT_FALSE(counts_in_grad_norm(m, tp1, "L0.ln1"));
  EXPECT_FALSE(counts_in_grad_norm(m, tp1, "L0.fc2.b"));
  EXPECT_TRUE(counts_in_grad_norm(m, tp1, "L0.qkv"));
  EXPECT_TRUE(counts_in_grad_norm(m, tp1, "emb.table"));
}

// The partial norms summed the way lower() emits (over tp and pp, and over dp-cp when the
// gradients are sharded there) count every element of every full tensor exactly once, on every
// rank.
TEST(GradNorm, RunsCountEveryElementOnceInTheReduction) {
  for (const Case& c : all_cases()) {
    SCOPED_TRACE(c.name);
    SimRun run(c.model, c.plan);
    const Plan& p = c.plan;
    const bool over_dpcp = grad_norm_over_dp_cp(p);
    EXPECT_EQ(over_dpcp, (p.zero >= 1 || p.ep > 1 || p.expert_tp() != p.tp) && p.dp * p.cp > 1);
    // Each rank's counted full elements.
    std::vector<std::map<std::string, std::vector<int64_t>>> counted(run.ranks.size());
    for (testing::SimRank& r : run.ranks)
      for (const ParamBucket& b : r.program->buckets) {
        const int index = r.index(p, b);
        for (const ShardRun& g : grad_norm_runs(c.model, p, r.coord, b, index)) {
          const ParamSpec& spec = b.specs[g.spec];
          // shard_offset addresses the same element as spec_offset.
          const auto [s, off] = flat_to_spec(b, shard_begin(b, index) + g.shard_offset);
          ASSERT_EQ(s, g.spec);
          ASSERT_EQ(off, g.spec_offset);
          for (int64_t k = 0; k < g.count; ++k) {
            const int64_t f = ref_full_index(c.model, p, r.coord, spec.name, g.spec_offset + k);
            ASSERT_GE(f, 0) << "padding counted in " << spec.name;
            counted[r.rank][spec.name].push_back(f);
          }
        }
      }
    for (const testing::SimRank& r : run.ranks) {
      std::map<std::string, std::vector<int>> hits;
      for (const TensorInfo& t : model_tensors(c.model, has_tied_head_copy(c.model, p)))
        hits[t.name].assign(static_cast<size_t>(t.elements()), 0);
      for (const testing::SimRank& o : run.ranks) {  // the ranks r's norm sums over
        const bool same_dpcp =
            o.coord.cp == r.coord.cp && o.coord.ep == r.coord.ep && o.coord.dpx == r.coord.dpx;
        if (!over_dpcp && !same_dpcp) continue;
        for (const auto& [name, fulls] : counted[o.rank])
          for (int64_t f : fulls) ++hits.at(name)[f];
      }
      for (const auto& [name, h] : hits) {
        const int64_t wrong = std::count_if(h.begin(), h.end(), [](int x) { return x != 1; });
        EXPECT_EQ(wrong, 0) << name << " in the norm of rank " << r.rank;
      }
    }
  }
}

}  // namespace
}  // namespace parasol::runtime
