// What the framework measures: one rank's peak device memory split the way PyTorch and
// nvidia-smi report it. `allocated` is torch.cuda.max_memory_allocated (Megatron's
// "max allocated", mem-max-allocated-bytes): tensors, persistent buffers, buckets and the
// libraries' workspaces, all from the caching allocator. `reserved` is
// torch.cuda.max_memory_reserved (torchtitan's logged "memory"): allocated plus the caching
// allocator's block rounding and the blocks stranded between live ones. `outside` is what the
// process holds outside the allocator (CUDA context, NCCL's buffers); nvidia-smi shows
// reserved + outside, which is what must fit in DeviceSpec::hbm_bytes.
#pragma once

#include <string>
#include <utility>

#include "core/cluster.h"
#include "core/json_reader.h"
#include "core/model.h"
#include "core/plan.h"
#include "cost_models/memory.h"
#include "cost_models/profile.h"

namespace parasol::cost {

// The bytes PyTorch's CUDA caching allocator reserves for one request of `bytes`
// (c10/cuda/CUDACachingAllocator.cpp, documented in PyTorch's "CUDA semantics: memory
// management"): sizes round up to 512-byte blocks; requests of at most 1 MiB come from 2 MiB
// segments (the small pool), larger ones below 10 MiB from 20 MiB segments, and from 10 MiB on
// a segment of the request rounded up to 2 MiB. Returns the block's size (`segment` false) or
// the segment's (`segment` true). With expandable segments a large block maps 2 MiB pages, so
// its segment is the block rounded up to 2 MiB.
// REQUIRES: bytes >= 0.
double allocator_block_bytes(double bytes);
double allocator_segment_bytes(double bytes, bool expandable_segments);

// Bytes NCCL's buffers hold on one rank of `stage` under plan `p`: each collective
// communicator (data parallel, and tensor and context parallel where > 1) connects
// profile.nccl_channels ring channels, one connection's buffers each (the receive FIFO of every
// protocol); point-to-point peers (the neighbouring pipeline stages, the other ep - 1 ranks of
// an expert all-to-all) 2 channels each (NCCL_NCHANNELS_PER_NET_PEER's default). `stage` -1:
// a stage with both pipeline neighbours (the most peers).
double nccl_buffer_bytes(const Plan& p, int stage, const Profile& profile);

struct FrameworkMemory {
  double allocated = 0;      // max_memory_allocated
  double reserved = 0;       // max_memory_reserved (allocated + rounding + fragmentation)
  double reserved_low = 0;   // reserved with allocator_fragmentation at its range's ends
  double reserved_high = 0;  //   (profile_ranges.cc)
  double rounding = 0;       // of reserved: the persistent buffers' block rounding
  double fragmentation = 0;  // of reserved: blocks stranded between live ones
  double outside = 0;        // outside the allocator: cuda_context + nccl
  double cuda_context = 0;
  double nccl = 0;
  double device_used() const { return reserved + outside; }  // as nvidia-smi shows it
  double device_used_high() const { return reserved_high + outside; }
};

// Whether one rank fits a device of `device_bytes` with `margin_bytes` to spare, as the search
// decides it: by what nvidia-smi would show with the reserved bytes at the top of their band
// (reserved_high + outside, FrameworkMemory::device_used_high). When that does not fit, whether
// the allocated bytes with what is outside the allocator would: a plan the allocated figure says
// fits and the reserved figure says does not (kNotByReserved) is dropped all the same.
enum class MemoryFit { kFits, kNotByReserved, kNotByAllocated };
MemoryFit memory_fit(const FrameworkMemory& f, double device_bytes, double margin_bytes = 0);
// "fits" | "not_by_reserved" | "not_by_allocated" (estimate --json's memory_fit).
const char* memory_fit_name(MemoryFit m);

// The split of one rank of `stage` whose tensors are `tensors` (memory_per_rank's breakdown of
// that stage; its `buffers` are replaced by the profile's figures). The fragmentation is
// allocator_fragmentation of the step's transient bytes (activations and working set) with
// fixed segments, none with plan.expandable_segments; the band takes the fragmentation at its
// range's ends (`fragmentation_low`, `fragmentation_high`).
FrameworkMemory framework_memory(const MemoryBreakdown& tensors, const Plan& p, int stage,
                                 const Profile& profile, double fragmentation_low,
                                 double fragmentation_high);
// How a predictor prices each stage's reserved bytes: by replaying the caching allocator over
// the stage's Program (kReplay: what torch.cuda.max_memory_reserved reports; it lowers every
// stage, milliseconds to a second on large plans), or by the profile's fragmentation share of
// the transient bytes (kBand: band_reserve_bytes, no lowering, for callers that read the step
// time and the fit only). Either reserve goes through apply_allocator_reserve, which keeps the
// reserved bytes within what the device leaves unless the tensors alone exceed it: the fit is
// the same either way.
enum class Reserved { kReplay, kBand };

// The caching allocator's reserve beyond the tensors of one rank of `stage`: PyTorch's
// CUDACachingAllocator replayed over the allocations and frees of the stage's Program
// (core/caching_allocator.h, two steps, with plan.expandable_segments), its peak reserved bytes
// less the Program's liveness peak. The Program is lowered from allocator_replay_plan(p), so that
// the closed form can afford it:
//  - 1F1B and interleaving: the same step with at most 2 x pp micro-batches (the warm-up's
//    micro-batches in flight, then more than pp of the steady state's forward-backward pairs,
//    whose allocations repeat micro-batch after micro-batch);
//  - a step of several pipeline flushes (plan.pipeline_flushes) is replayed as one flush: each
//    fills and drains the pipeline, so the peak of one is the peak of every one;
//  - GPipe holds every micro-batch's activations at its peak: with more than
//    kGpipeReplayedMicroBatches micro-batches, the step is replayed with that many and with half
//    as many, and the reserve extended by the slope between the two (each further forward
//    allocates as the ones before it). tests/cost_models/framework_memory_test.cc states how
//    far that is from the whole step's replay.
// The allocator's segments may take what the device's hbm_bytes leaves beside the
// outside-the-allocator bytes and the libraries' workspaces of that stage: when a cudaMalloc
// fails it releases its cached segments and retries, as PyTorch does (replayed for 1F1B and
// interleaving; GPipe's extension is capped by apply_allocator_reserve). Both predictors price
// reserved memory through it. The replay is remembered process-wide by the model, the replay
// plan and the stage (and the capacity, only where the replay reaches it), the last
// kReplayMemoEntries of them.
constexpr int kGpipeReplayedMicroBatches = 8;
constexpr int kReplayMemoEntries = 512;
Plan allocator_replay_plan(const Plan& p);
double allocator_reserve_bytes(const Model& m, const Plan& p, int stage, const DeviceSpec& d,
                               const Profile& profile);
// `f` with its reserved figure from the replay: allocated + rounding + fragmentation, the
// fragmentation `reserve` less the persistent buffers' rounding (not below 0), and the whole no
// more than what `device_bytes` leaves beside f.outside (the allocator releases its cached
// segments rather than exceed it) unless allocated + rounding already is; reserved_low that
// figure, reserved_high not below it.
void apply_allocator_reserve(FrameworkMemory& f, double reserve, double device_bytes);
// The reserve of framework_memory()'s figure `f` (Reserved::kBand): its rounding and the
// profile's fragmentation share of the transient bytes.
inline double band_reserve_bytes(const FrameworkMemory& f) { return f.rounding + f.fragmentation; }

// The published range of allocator_fragmentation for device `d` (profile_ranges.cc), widened to
// take in the profile's own figure: {low, high}.
std::pair<double, double> fragmentation_band(const DeviceSpec& d, const Profile& profile);
// The same with the band of the device's published range of allocator_fragmentation.
FrameworkMemory framework_memory(const MemoryBreakdown& tensors, const Cluster& c, const Plan& p,
                                 int stage, const Profile& profile);

// The metrics a published peak can name, and what each reads of a FrameworkMemory.
enum class MemoryMetric { kMaxAllocated, kMaxReserved, kNvidiaSmi };
const char* memory_metric_name(MemoryMetric m);
// "max_allocated" | "max_reserved" | "nvidia-smi"; throws parasol::Error naming `field`.
MemoryMetric parse_memory_metric(const std::string& s, const std::string& field);
double memory_metric_bytes(const FrameworkMemory& f, MemoryMetric m);

// {"allocated_bytes", "reserved_bytes", "reserved_low_bytes", "reserved_high_bytes",
//  "rounding_bytes", "fragmentation_bytes", "outside_bytes", "cuda_context_bytes",
//  "nccl_bytes", "device_used_bytes"}.
Json framework_memory_to_json(const FrameworkMemory& f);

// The global rank that stands for pipeline stage `stage` (its grid coordinate pp = stage, every
// other 0; RankLayout::stage_representative): the rank a framework's per-rank log names.
int stage_rank(const Plan& p, int stage);

}  // namespace parasol::cost
