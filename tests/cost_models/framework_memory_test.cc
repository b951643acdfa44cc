// Tests what the framework measures (cost_models/framework_memory.h): the caching allocator's
// block and segment sizes against PyTorch's documented rules, NCCL's buffers against their
// count of connections, the allocated / reserved / outside split, the metric names and the rank
// that stands for a stage.
#include "cost_models/framework_memory.h"

#include <gtest/gtest.h>

#include "core/caching_allocator.h"
#include "core/cluster.h"
#include "core/error.h"
#include "core/liveness.h"
#include "core/lower.h"
#include "core/model.h"
#include "core/plan.h"
#include "cost_models/estimate.h"
#include "cost_models/memory.h"
#include "cost_models/profile.h"
#include "cost_models/profile_ranges.h"

namespace parasol::cost {
namespace {

constexpr double MiB = 1024.0 * 1024.0;

// PyTorch "CUDA semantics: memory management" and CUDACachingAllocator.cpp: every request is a
// multiple of 512 bytes.
TEST(AllocatorBlock, RoundsUpTo512Bytes) {
  EXPECT_EQ(allocator_block_bytes(0), 512);
  EXPECT_EQ(allocator_block_bytes(1), 512);
  EXPECT_EQ(allocator_block_bytes(512), 512);
  EXPECT_EQ(allocator_block_bytes(513), 1024);
  EXPECT_EQ(allocator_block_bytes(3 * MiB + 1), 3 * MiB + 512);
}

// Small requests (<= 1 MiB) share 2 MiB segments, medium ones (< 10 MiB) 20 MiB segments, large
// ones get a segment of their size rounded up to 2 MiB; expandable segments map 2 MiB pages.
TEST(AllocatorSegment, SmallMediumAndLargePools) {
  EXPECT_EQ(allocator_segment_bytes(100, false), 2 * MiB);
  EXPECT_EQ(allocator_segment_bytes(1 * MiB, false), 2 * MiB);
  EXPECT_EQ(allocator_segment_bytes(1 * MiB + 1, false), 20 * MiB);
  EXPECT_EQ(allocator_segment_bytes(9 * MiB, false), 20 * MiB);
  EXPECT_EQ(allocator_segment_bytes(10 * MiB, false), 10 * MiB);
  EXPECT_EQ(allocator_segment_bytes(10 * MiB + 1, false), 12 * MiB);
  EXPECT_EQ(allocator_segment_bytes(1 * MiB + 1, true), 2 * MiB);
  EXPECT_EQ(allocator_segment_bytes(9 * MiB, true), 10 * MiB);
}

// One connection's buffers per channel of each collective communicator (dp always, tp and cp
// when > 1) and two channels per point-to-point peer (pipeline neighbours, expert peers).
TEST(NcclBuffers, CountConnectionsByCommunicatorAndPeer) {
  Profile prof = default_profile(device_spec("H100-SXM"));
  const double conn = prof.nccl_connection_bytes, ch = prof.nccl_channels;
  Plan p;
  p.tp = 2;
  p.pp = 4;
  p.dp = 8;
  p.ep = 4;
  // dp + tp collectives; a middle stage has two pipeline neighbours and 3 expert peers.
  EXPECT_DOUBLE_EQ(nccl_buffer_bytes(p, 1, prof), conn * (2 * ch + (2 + 3) * 2));
  // The first stage has one pipeline neighbour; -1 takes the most (two).
  EXPECT_DOUBLE_EQ(nccl_buffer_bytes(p, 0, prof), conn * (2 * ch + (1 + 3) * 2));
  EXPECT_DOUBLE_EQ(nccl_buffer_bytes(p, -1, prof), nccl_buffer_bytes(p, 1, prof));
  Plan single;
  EXPECT_DOUBLE_EQ(nccl_buffer_bytes(single, 0, prof), conn * ch);
  // The default connection is NCCL's Simple + LL128 + LL buffers (src/include/device.h).
  EXPECT_DOUBLE_EQ(conn, 4 * MiB + 120.0 * 640 * 8 * 8 + 8.0 * 512 * 8 * 16);
}

MemoryBreakdown some_tensors() {
  MemoryBreakdown t;
  t.weights = 2e9;
  t.gradients = 4e9;
  t.optimizer = 12e9;
  t.activations = 30e9;
  t.transient = 3e9;
  t.buffers = 1.2e9;  // memory_per_rank's default runtime overhead: replaced, not added
  return t;
}

TEST(FrameworkMemory, SplitsAllocatedReservedAndOutside) {
  Profile prof = default_profile(device_spec("H100-SXM"));
  prof.allocator_fragmentation = 0.1;  // a calibrated figure (the default profile has none)
  Plan p;
  p.tp = 8;
  p.dp = 4;
  const MemoryBreakdown t = some_tensors();
  const FrameworkMemory f = framework_memory(t, p, 0, prof, 0.0, 0.25);
  EXPECT_DOUBLE_EQ(f.allocated, 2e9 + 4e9 + 12e9 + 30e9 + 3e9 + prof.library_workspace_bytes);
  EXPECT_DOUBLE_EQ(f.fragmentation, 0.1 * (30e9 + 3e9));
  EXPECT_GE(f.rounding, 0);
  EXPECT_LT(f.rounding, 3 * 2 * MiB);  // three contiguous buffers, each rounded to 2 MiB
  EXPECT_DOUBLE_EQ(f.reserved, f.allocated + f.rounding + f.fragmentation);
  EXPECT_DOUBLE_EQ(f.reserved_low, f.allocated + f.rounding);
  EXPECT_DOUBLE_EQ(f.reserved_high, f.allocated + f.rounding + 0.25 * (30e9 + 3e9));
  EXPECT_DOUBLE_EQ(f.cuda_context, prof.cuda_context_bytes);
  EXPECT_DOUBLE_EQ(f.nccl, nccl_buffer_bytes(p, 0, prof));
  EXPECT_DOUBLE_EQ(f.outside, f.cuda_context + f.nccl);
  EXPECT_DOUBLE_EQ(f.device_used(), f.reserved + f.outside);
  EXPECT_DOUBLE_EQ(memory_metric_bytes(f, MemoryMetric::kMaxAllocated), f.allocated);
  EXPECT_DOUBLE_EQ(memory_metric_bytes(f, MemoryMetric::kMaxReserved), f.reserved);
  EXPECT_DOUBLE_EQ(memory_metric_bytes(f, MemoryMetric::kNvidiaSmi), f.device_used());
}

// Expandable segments leave no blocks stranded between fixed segments.
TEST(FrameworkMemory, ExpandableSegmentsRemoveFragmentation) {
  const Profile prof = default_profile(device_spec("H100-SXM"));
  Plan p;
  p.expandable_segments = true;
  const FrameworkMemory f = framework_memory(some_tensors(), p, 0, prof, 0.0, 0.25);
  EXPECT_EQ(f.fragmentation, 0);
  EXPECT_DOUBLE_EQ(f.reserved_high, f.reserved);
  Plan fixed;
  EXPECT_GT(framework_memory(some_tensors(), fixed, 0, prof, 0.0, 0.25).reserved_high,
            f.reserved_high);
}

// The cluster overload takes the band from the device's published range of the fragmentation.
TEST(FrameworkMemory, BandIsTheProfileRange) {
  const Cluster c = cluster_preset("dgx-h100", 8);
  const Profile prof = default_profile(c.gpu_device(0));
  double low = -1, high = -1;
  for (const ProfileRange& r : profile_ranges(c.gpu_device(0)))
    if (r.key == "allocator_fragmentation") low = r.low, high = r.high;
  ASSERT_GE(low, 0);
  Plan p;
  p.dp = 8;
  const FrameworkMemory f = framework_memory(some_tensors(), c, p, 0, prof);
  const FrameworkMemory g = framework_memory(some_tensors(), p, 0, prof, low, high);
  EXPECT_DOUBLE_EQ(f.reserved_low, g.reserved_low);
  EXPECT_DOUBLE_EQ(f.reserved_high, g.reserved_high);
  EXPECT_LE(f.reserved_low, f.reserved);
  EXPECT_LE(f.reserved, f.reserved_high);
}

// The CPU runtime has no CUDA context, NCCL or workspaces: allocated is the tensors.
TEST(FrameworkMemory, CpuRuntimeHasNothingOutside) {
  const Profile prof = default_profile(device_spec(kHostCpuDevice));
  Plan p;
  const FrameworkMemory f = framework_memory(some_tensors(), p, 0, prof, 0, 0);
  EXPECT_EQ(f.outside, 0);
  EXPECT_DOUBLE_EQ(f.allocated, some_tensors().total() - some_tensors().buffers);
}

TEST(MemoryMetric, NamesRoundTripAndBadNamesAreUserErrors) {
  for (MemoryMetric m :
       {MemoryMetric::kMaxAllocated, MemoryMetric::kMaxReserved, MemoryMetric::kNvidiaSmi})
    EXPECT_EQ(parse_memory_metric(memory_metric_name(m), "metric"), m);
  try {
    parse_memory_metric("max_active", "suite.points[0].memory.metric");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("suite.points[0].memory.metric"), std::string::npos);
  }
}

// Megatron's default order tp-cp-ep-dp-pp: pp varies slowest, so stage s starts at rank
// s x tp x cp x dp.
TEST(StageRank, PipelineStageStartsAtItsBlockOfRanks) {
  Plan p;
  p.tp = 2;
  p.dp = 4;
  p.pp = 4;
  for (int s = 0; s < 4; ++s) EXPECT_EQ(stage_rank(p, s), s * 8) << s;
}

// Datasheet capacities in one unit, as nvidia-smi reports them: a published GB200 run of 180 GiB
// (the 176-186 GiB) fits, and H200's 141 "GB" is GiB.
TEST(DeviceMemory, OneUnitAsNvidiaSmiReportsIt) {
  constexpr double GiB = 1024.0 * MiB;
  EXPECT_DOUBLE_EQ(device_spec("GB200").hbm_bytes, 189471 * MiB);
  EXPECT_LT(180 * GiB, device_spec("GB200").hbm_bytes);
  EXPECT_DOUBLE_EQ(device_spec("B200").hbm_bytes, 183359 * MiB);
  EXPECT_DOUBLE_EQ(device_spec("H200").hbm_bytes, 143771 * MiB);
  EXPECT_GT(device_spec("H200").hbm_bytes, 140 * GiB);
  EXPECT_DOUBLE_EQ(device_spec("H100-SXM").hbm_bytes, 81559 * MiB);
}

// The replay's reserve is added to allocated and its rounding, but the allocator releases cached
// segments rather than take more than the device leaves beside what is outside it.
TEST(FrameworkMemory, TheAllocatorsReserveIsCappedByWhatTheDeviceLeaves) {
  FrameworkMemory f;
  f.allocated = 50 * 1024 * MiB;
  f.rounding = 10 * MiB;
  f.outside = 1024 * MiB;
  f.reserved_high = f.allocated;
  FrameworkMemory g = f;
  apply_allocator_reserve(g, 4 * 1024 * MiB, 80 * 1024 * MiB);  // room for it all
  EXPECT_DOUBLE_EQ(g.reserved, f.allocated + 4 * 1024 * MiB);
  EXPECT_DOUBLE_EQ(g.fragmentation, 4 * 1024 * MiB - 10 * MiB);
  EXPECT_DOUBLE_EQ(g.reserved_low, g.reserved);
  EXPECT_DOUBLE_EQ(g.reserved_high, g.reserved);
  g = f;
  apply_allocator_reserve(g, 4 * 1024 * MiB, 53 * 1024 * MiB);  // 52 GiB beside the outside
  EXPECT_DOUBLE_EQ(g.reserved, 52 * 1024 * MiB);
  EXPECT_DOUBLE_EQ(g.device_used(), 53 * 1024 * MiB);
  g = f;
  apply_allocator_reserve(g, 4 * 1024 * MiB, 40 * 1024 * MiB);  // the tensors alone do not fit
  EXPECT_DOUBLE_EQ(g.reserved, f.allocated + f.rounding);
  EXPECT_EQ(g.fragmentation, 0);
}

// The replay's Program keeps a 1F1B or interleaved step's in-flight micro-batches and more than pp
// of its steady state; GPipe's is kGpipeReplayedMicroBatches long (its reserve extended from it).
TEST(FrameworkMemory, TheReplayPlanKeepsTwicePpMicroBatches) {
  Plan p;
  p.pp = 4;
  p.dp = 2;
  p.micro_batch = 2;
  p.global_batch = 2 * 2 * 64;  // 64 micro-batches
  const Plan r = allocator_replay_plan(p);
  EXPECT_EQ(r.micro_batches(), 8);
  EXPECT_EQ(r.micro_batch, 2);
  p.schedule = Schedule::kGpipe;
  EXPECT_EQ(allocator_replay_plan(p).micro_batches(), kGpipeReplayedMicroBatches);
  p.schedule = Schedule::k1F1B;
  p.global_batch = 2 * 2 * 6;  // fewer than 2 x pp: as it is
  EXPECT_EQ(allocator_replay_plan(p).micro_batches(), 6);
}

// A step of several pipeline flushes is replayed as one flush (each fills and drains the
// pipeline): an interleaved step of 4 flushes of 8 micro-batches at pp 4 is replayed as one of 8,
// not as 8 micro-batches split over 4 flushes (2 a flush, fewer than pp: no interleaved schedule).
TEST(FrameworkMemory, TheReplayPlanOfSeveralFlushesIsOneFlush) {
  Plan p;
  p.pp = 4;
  p.vpp = 2;
  p.schedule = Schedule::kInterleaved;
  p.dp = 2;
  p.micro_batch = 1;
  p.global_batch = 2 * 32;  // 32 micro-batches
  p.pipeline_flushes = 4;
  const Plan r = allocator_replay_plan(p);
  EXPECT_EQ(r.pipeline_flushes, 1);
  EXPECT_EQ(r.micro_batches(), 8);
  p.pipeline_flushes = 8;  // 4 a flush: all of them
  EXPECT_EQ(allocator_replay_plan(p).micro_batches(), 4);
  EXPECT_EQ(allocator_replay_plan(p).pipeline_flushes, 1);
}

// A lowered step reserves at least what its tensors hold, and the 1F1B replay of 2 x pp
// micro-batches reserves what the replay of the whole step does (its allocations repeat).
TEST(FrameworkMemory, TheReserveOfAShortenedStepIsTheWholeSteps) {
  Model m = model_preset("llama3-8b");
  m.layers = 4;
  const Cluster c = cluster_preset("dgx-h100", 8);
  const Profile prof = default_profile(c.gpu_device(0));
  Plan p;
  p.pp = 2;
  p.dp = 4;
  p.micro_batch = 1;
  p.global_batch = 4 * 12;  // 12 micro-batches, replayed as 4
  for (int s = 0; s < p.pp; ++s) {
    const double reserve = allocator_reserve_bytes(m, p, s, c.gpu_device(0), prof);
    EXPECT_GE(reserve, 0);
    // The whole step's replay, with the same capacity: what allocator_reserve_bytes would give
    // were the plan not shortened.
    const Program program = lower_stage(m, p, s);
    CachingAllocatorOptions o;
    o.capacity_bytes = c.gpu_device(0).hbm_bytes;
    const double whole_reserve =
        replay_caching_allocator(program, o).reserved - liveness(program).peak_bytes;
    EXPECT_NEAR(reserve, whole_reserve, 0.05 * whole_reserve + 64 * MiB) << "stage " << s;
  }
}

// GPipe's reserve, replayed over kGpipeReplayedMicroBatches micro-batches and half as many and
// extended by the slope between them, against the whole step's replay: within 5 % of the
// stage's reserved bytes. Measured: exact where each forward strands the same blocks (no
// recompute, the first stage); within 1 % on Llama 3 8B whole (32 layers, pp 2 and 4, every
// recompute policy, 12 to 32 micro-batches); up to 4.9 % here on 4 layers, on the last stage
// under full recompute, whose reserve rises and falls from one micro-batch count to the next
// (a request that stops or starts fitting a stranded block), which no extension foresees.
TEST(FrameworkMemory, GpipesReserveIsExtendedFromAShortStep) {
  Model m = model_preset("llama3-8b");
  m.layers = 4;
  const Cluster c = cluster_preset("dgx-h100", 8);
  const Profile prof = default_profile(c.gpu_device(0));
  Plan p;
  p.tp = 2;
  p.pp = 2;
  p.dp = 2;
  p.sequence_parallel = true;
  p.micro_batch = 1;
  p.schedule = Schedule::kGpipe;
  for (Recompute r : {Recompute::kNone, Recompute::kFull}) {
    p.recompute = r;
    for (int mbs : {12, 24}) {
      p.global_batch = mbs * p.dp;
      for (int s = 0; s < p.pp; ++s) {
        const double reserve = allocator_reserve_bytes(m, p, s, c.gpu_device(0), prof);
        const AllocatorPeaks whole = replay_caching_allocator(lower_stage(m, p, s), {});
        EXPECT_NEAR(reserve, whole.reserved - whole.live, 0.05 * whole.reserved)
            << "recompute " << static_cast<int>(r) << ", " << mbs << " micro-batches, stage " << s;
      }
    }
  }
}

// The fit, the step time and the allocated bytes do not depend on how the reserved bytes are
// priced; the replay's reserved bytes are what the allocator holds, the band's the profile's
// share of the transient bytes.
TEST(FrameworkMemory, TheBandAndTheReplayDifferOnlyInTheReservedBytes) {
  Model m = model_preset("llama3-8b");
  m.layers = 4;
  const Cluster c = cluster_preset("dgx-h100", 8);
  const Profile prof = default_profile(c.gpu_device(0));
  Plan p;
  p.pp = 2;
  p.dp = 4;
  p.micro_batch = 1;
  p.global_batch = 4 * 8;
  const Estimate replay = estimate(m, c, p, prof, Reserved::kReplay);
  const Estimate band = estimate(m, c, p, prof, Reserved::kBand);
  EXPECT_EQ(replay.step_time_s, band.step_time_s);
  EXPECT_EQ(replay.fits, band.fits);
  ASSERT_EQ(replay.stage_memory.size(), band.stage_memory.size());
  for (int s = 0; s < p.pp; ++s) {
    const FrameworkMemory &a = replay.stage_memory[s], &b = band.stage_memory[s];
    EXPECT_EQ(a.allocated, b.allocated);
    EXPECT_EQ(a.outside, b.outside);
    EXPECT_EQ(
        a.reserved,
        a.allocated + a.rounding +
            std::max(0.0, allocator_reserve_bytes(m, p, s, c.gpu_device(0), prof) - a.rounding));
    const MemoryBreakdown tensors = memory_per_stage(m, c, p)[s];
    EXPECT_DOUBLE_EQ(b.reserved,
                     b.allocated + b.rounding +
                         prof.allocator_fragmentation * (tensors.activations + tensors.transient));
  }
}

}  // namespace
}  // namespace parasol::cost
