// What the framework measures: allocated, reserved and outside-the-allocator bytes of one rank.
#include "cost_models/framework_memory.h"

#include <algorithm>
#include <cmath>
#include <list>
#include <mutex>
#include <string>
#include <unordered_map>

#include "core/caching_allocator.h"
#include "core/error.h"
#include "core/fp8_params.h"
#include "core/liveness.h"
#include "core/lower.h"
#include "core/model.h"
#include "core/plan.h"
#include "core/rank_layout.h"
#include "core/units.h"
#include "cost_models/profile_ranges.h"

namespace parasol::cost {

namespace {
using units::MiB;
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

MemoryFit memory_fit(const FrameworkMemory& f, double device_bytes, double margin_bytes) {
  if (f.device_used_high() + margin_bytes <= device_bytes) return MemoryFit::kFits;
  return f.allocated + f.outside + margin_bytes <= device_bytes ? MemoryFit::kNotByReserved
                                                                : MemoryFit::kNotByAllocated;
}

const char* memory_fit_name(MemoryFit m) {
  switch (m) {
    case MemoryFit::kFits:
      return "fits";
    case MemoryFit::kNotByReserved:
      return "not_by_reserved";
    case MemoryFit::kNotByAllocated:
      return "not_by_allocated";
  }
  return "?";
}

Plan allocator_replay_plan(const Plan& p) {
  Plan r = p;
  const int most = p.schedule == Schedule::kGpipe ? kGpipeReplayedMicroBatches : 2 * p.pp;
  const int flush = p.flush_micro_batches();
  r.pipeline_flushes = 1;
  r.global_batch = std::min(flush, most) * p.dp * p.micro_batch;
  return r;
}

namespace {
// One replay of a stage: its reserve beyond the liveness peak, and its peak reserved bytes (the
// replay is the same under any capacity at least that large: no cudaMalloc failed).
struct Replayed {
  double reserve = 0;
  double peak_reserved = 0;
  bool released = false;  // a cudaMalloc failed at the capacity and the cache was released
};

Replayed replay_stage(const Model& m, const Plan& p, int stage, const DeviceSpec& d,
                      CachingAllocatorOptions o) {
  const Program program = lower_stage(m, p, stage, d);
  const AllocatorPeaks peaks = replay_caching_allocator(program, o);
  return {peaks.reserved - peaks.live, peaks.reserved, peaks.released};
}

// The last kReplayMemoEntries replays, most recent first (a bounded LRU).
class ReplayMemo {
 public:
  bool find(const std::string& key, Replayed& out) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = index_.find(key);
    if (it == index_.end()) return false;
    order_.splice(order_.begin(), order_, it->second);
    out = it->second->second;
    return true;
  }
  void put(const std::string& key, const Replayed& r) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (index_.count(key) > 0) return;
    order_.emplace_front(key, r);
    index_[key] = order_.begin();
    if (static_cast<int>(order_.size()) > kReplayMemoEntries) {
      index_.erase(order_.back().first);
      order_.pop_back();
    }
  }

 private:
  std::mutex mutex_;
  std::list<std::pair<std::string, Replayed>> order_;
  std::unordered_map<std::string, std::list<std::pair<std::string, Replayed>>::iterator> index_;
};

ReplayMemo& replay_memo() {
  static ReplayMemo memo;
  return memo;
}

// The replay of `p` (a replay plan) under `capacity` (0: none). A replay that never reached its
// capacity is the replay under any capacity at least its peak: remembered under `key` alone;
// one that released its cache, under `key` and the capacity.
Replayed replayed(const std::string& key, const Model& m, const Plan& p, int stage,
                  const DeviceSpec& d, double capacity) {
  Replayed r;
  if (replay_memo().find(key, r) && (capacity <= 0 || r.peak_reserved <= capacity)) return r;
  const std::string capped = key + ' ' + std::to_string(capacity);
  if (replay_memo().find(capped, r)) return r;
  CachingAllocatorOptions o;
  o.expandable_segments = p.expandable_segments;
  o.capacity_bytes = capacity;
  r = replay_stage(m, p, stage, d, o);
  replay_memo().put(r.released ? capped : key, r);
  return r;
}
}  // namespace

double allocator_reserve_bytes(const Model& m, const Plan& p, int stage, const DeviceSpec& d,
                               const Profile& profile) {
  // What the CUDA context, NCCL and the libraries' workspaces leave the segments.
  const double capacity =
      std::max(0.0, d.hbm_bytes - profile.cuda_context_bytes -
                        nccl_buffer_bytes(p, stage, profile) - profile.library_workspace_bytes);
  // The replay reads only the stage's Program (the model, the replay plan and the device's facts
  // the lowering reads) and, where its segments reach it, the capacity: the same figure for every
  // profile that leaves the replay under its capacity (the accuracy suites' profile sensitivity,
  // both predictors of one plan), so it is remembered by those inputs.
  const Plan rp = allocator_replay_plan(p);
  const std::string key = model_to_json(m).dump() + '\n' + plan_to_json(rp).dump() + '\n' +
                          std::to_string(stage) + (rp.expandable_segments ? " e" : "") +
                          (fp8_weight_transpose_kept(d) ? "" : " nt");
  if (p.schedule == Schedule::kGpipe && p.flush_micro_batches() > rp.micro_batches()) {
    // Extended past the replayed micro-batches at unlimited capacity; apply_allocator_reserve
    // caps the whole.
    Plan half = rp;
    half.global_batch = rp.global_batch / 2;
    const Replayed whole = replayed(key, m, rp, stage, d, 0);
    const Replayed fewer = replayed(key + " half", m, half, stage, d, 0);
    const double slope =
        (whole.reserve - fewer.reserve) / (rp.micro_batches() - half.micro_batches());
    return std::max(0.0, whole.reserve + slope * (p.flush_micro_batches() - rp.micro_batches()));
  }
  return replayed(key, m, rp, stage, d, capacity).reserve;
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
