// What the framework measures: allocated, reserved and outside-the-allocator bytes of one rank.
#include "cost_models/framework_memory.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>
#include <string>

#include "core/caching_allocator.h"
#include "core/error.h"
#include "core/liveness.h"
#include "core/lower.h"
#include "core/model.h"
#include "core/plan.h"
#include "core/rank_layout.h"
#include "cost_models/profile_ranges.h"

namespace parasol::cost {

namespace {
constexpr double MiB = 1024.0 * 1024.0;
// c10/cuda/CUDACachingAllocator.cpp: kMinBlockSize, kSmallSize, kSmallBuffer, kLargeBuffer,
// kMinLargeAlloc, kRoundLarge.
constexpr double kMinBlock = 512;
constexpr double kSmallSize = 1 * MiB;
constexpr double kSmallBuffer = 2 * MiB;
constexpr double kLargeBuffer = 20 * MiB;
constexpr double kMinLargeAlloc = 10 * MiB;
constexpr double kRoundLarge = 2 * MiB;

double round_up(double bytes, double unit) { return std::ceil(bytes / unit) * unit; }
}  // namespace

double allocator_block_bytes(double bytes) {
  PARASOL_CHECK(bytes >= 0, "allocation of negative bytes");
  return bytes < kMinBlock ? kMinBlock : round_up(bytes, kMinBlock);
}

double allocator_segment_bytes(double bytes, bool expandable_segments) {
  const double block = allocator_block_bytes(bytes);
  if (expandable_segments) return round_up(block, kRoundLarge);
  if (block <= kSmallSize) return kSmallBuffer;
  if (block < kMinLargeAlloc) return kLargeBuffer;
  return round_up(block, kRoundLarge);
}

double nccl_buffer_bytes(const Plan& p, int stage, const Profile& profile) {
  // Collective communicators: data parallel (or the world's grad-norm reduction) always; tensor
  // and context parallel when they have more than one rank.
  int collectives = 1;
  for (int degree : {p.tp, p.cp}) collectives += degree > 1 ? 1 : 0;
  // Point-to-point peers: the neighbouring pipeline stages, and the expert all-to-all's peers.
  int peers = 0;
  if (p.pp > 1)
    peers += stage < 0 ? std::min(2, p.pp - 1) : (stage > 0 ? 1 : 0) + (stage < p.pp - 1 ? 1 : 0);
  if (p.ep > 1) peers += p.ep - 1;
  constexpr int kChannelsPerPeer = 2;  // NCCL_NCHANNELS_PER_NET_PEER's default
  return profile.nccl_connection_bytes *
         (collectives * profile.nccl_channels + peers * kChannelsPerPeer);
}

FrameworkMemory framework_memory(const MemoryBreakdown& t, const Plan& p, int stage,
                                 const Profile& profile, double fragmentation_low,
                                 double fragmentation_high) {
  FrameworkMemory f;
  // Tensors (the breakdown without its `buffers`, which memory_per_rank fills with the defaults'
  // runtime overhead) plus the libraries' workspaces, allocated through the caching allocator.
  f.allocated = t.total() - t.buffers + profile.library_workspace_bytes;
  // The persistent buffers (weights, gradients, optimizer state) as contiguous allocations
  // (Megatron's parameter and gradient buffers, the optimizer's flat shards): their segments'
  // rounding.
  for (double bytes : {t.weights, t.gradients, t.optimizer})
    if (bytes > 0) f.rounding += allocator_segment_bytes(bytes, p.expandable_segments) - bytes;
  // The step's transient bytes are freed and allocated again in a different order every
  // micro-batch; with fixed segments part of them stays stranded between live blocks.
  const double transient = t.activations + t.transient;
  auto frag = [&](double fraction) { return p.expandable_segments ? 0.0 : fraction * transient; };
  f.fragmentation = frag(profile.allocator_fragmentation);
  f.reserved = f.allocated + f.rounding + f.fragmentation;
  f.reserved_low = f.allocated + f.rounding + frag(fragmentation_low);
  f.reserved_high = f.allocated + f.rounding + frag(fragmentation_high);
  f.cuda_context = profile.cuda_context_bytes;
  f.nccl = nccl_buffer_bytes(p, stage, profile);
  f.outside = f.cuda_context + f.nccl;
  return f;
}

Plan allocator_replay_plan(const Plan& p) {
  Plan r = p;
  const int most = 2 * p.pp;
  if (p.schedule != Schedule::kGpipe && p.micro_batches() > most)
    r.global_batch = most * p.dp * p.micro_batch;
  return r;
}

double allocator_reserve_bytes(const Model& m, const Plan& p, int stage, const DeviceSpec& d,
                               const Profile& profile) {
  CachingAllocatorOptions o;
  o.expandable_segments = p.expandable_segments;
  // What the CUDA context, NCCL and the libraries' workspaces leave the segments.
  o.capacity_bytes =
      std::max(0.0, d.hbm_bytes - profile.cuda_context_bytes -
                        nccl_buffer_bytes(p, stage, profile) - profile.library_workspace_bytes);
  // The replay reads only the stage's Program (the model and the plan) and the capacity: the
  // same figure for every profile that leaves the capacity alone (the accuracy suites' profile
  // sensitivity, both predictors of one plan), so it is remembered by those inputs, process-wide
  // (lowering and replaying a stage costs milliseconds; the key's JSON, microseconds).
  static std::mutex mutex;
  static std::map<std::string, double> replayed;
  std::string key = model_to_json(m).dump() + '\n' + plan_to_json(p).dump() + '\n' +
                    std::to_string(stage) + ' ' + std::to_string(o.capacity_bytes) +
                    (o.expandable_segments ? " e" : "");
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (auto it = replayed.find(key); it != replayed.end()) return it->second;
  }
  const Program program = lower_stage(m, allocator_replay_plan(p), stage);
  const double reserve =
      replay_caching_allocator(program, o).reserved - liveness(program).peak_bytes;
  std::lock_guard<std::mutex> lock(mutex);
  if (replayed.size() >= 4096) replayed.clear();  // a bound for long-lived processes
  replayed.emplace(std::move(key), reserve);
  return reserve;
}

void apply_allocator_reserve(FrameworkMemory& f, double reserve, double device_bytes) {
  const double held = f.allocated + f.rounding;
  const double capacity = device_bytes - f.outside;
  f.reserved = std::max(held, std::min(held + std::max(0.0, reserve - f.rounding), capacity));
  f.fragmentation = f.reserved - held;
  f.reserved_low = f.reserved;
  f.reserved_high = std::max(f.reserved_high, f.reserved);
}

std::pair<double, double> fragmentation_band(const DeviceSpec& d, const Profile& profile) {
  double low = profile.allocator_fragmentation, high = profile.allocator_fragmentation;
  for (const ProfileRange& r : profile_ranges(d))
    if (r.key == "allocator_fragmentation") {
      low = std::min(low, r.low);
      high = std::max(high, r.high);
    }
  return {low, high};
}

FrameworkMemory framework_memory(const MemoryBreakdown& t, const Cluster& c, const Plan& p,
                                 int stage, const Profile& profile) {
  const auto [low, high] = fragmentation_band(c.gpu_device(0), profile);
  return framework_memory(t, p, stage, profile, low, high);
}

const char* memory_metric_name(MemoryMetric m) {
  switch (m) {
    case MemoryMetric::kMaxAllocated:
      return "max_allocated";
    case MemoryMetric::kMaxReserved:
      return "max_reserved";
    case MemoryMetric::kNvidiaSmi:
      return "nvidia-smi";
  }
  return "?";
}

MemoryMetric parse_memory_metric(const std::string& s, const std::string& field) {
  for (MemoryMetric m :
       {MemoryMetric::kMaxAllocated, MemoryMetric::kMaxReserved, MemoryMetric::kNvidiaSmi})
    if (s == memory_metric_name(m)) return m;
  throw Error(field, "'" + s + "' is not one of max_allocated|max_reserved|nvidia-smi");
}

double memory_metric_bytes(const FrameworkMemory& f, MemoryMetric m) {
  switch (m) {
    case MemoryMetric::kMaxAllocated:
      return f.allocated;
    case MemoryMetric::kMaxReserved:
      return f.reserved;
    case MemoryMetric::kNvidiaSmi:
      return f.device_used();
  }
  return f.device_used();
}

Json framework_memory_to_json(const FrameworkMemory& f) {
  return {{"allocated_bytes", f.allocated},
          {"reserved_bytes", f.reserved},
          {"reserved_low_bytes", f.reserved_low},
          {"reserved_high_bytes", f.reserved_high},
          {"rounding_bytes", f.rounding},
          {"fragmentation_bytes", f.fragmentation},
          {"outside_bytes", f.outside},
          {"cuda_context_bytes", f.cuda_context},
          {"nccl_bytes", f.nccl},
          {"device_used_bytes", f.device_used()}};
}

int stage_rank(const Plan& p, int stage) {
  PARASOL_CHECK(0 <= stage && stage < p.pp, "stage " + std::to_string(stage));
  return RankLayout(p).stage_representative(stage);
}

}  // namespace parasol::cost
