// PyTorch's CUDA caching allocator played over a Program (see caching_allocator.h).
#include "core/caching_allocator.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/liveness.h"

namespace parasol {

namespace {
// c10/cuda/CUDACachingAllocator.cpp.
constexpr int64_t kMiB = 1024 * 1024;
constexpr int64_t kMinBlockSize = 512;       // every block is a multiple of 512 bytes
constexpr int64_t kSmallSize = 1 * kMiB;     // largest "small" request
constexpr int64_t kSmallBuffer = 2 * kMiB;   // small pool's segments (and expandable pages)
constexpr int64_t kLargeBuffer = 20 * kMiB;  // large segments below kMinLargeAlloc (and pages)
constexpr int64_t kMinLargeAlloc = 10 * kMiB;
constexpr int64_t kRoundLarge = 2 * kMiB;

int64_t round_up(int64_t n, int64_t unit) { return (n + unit - 1) / unit * unit; }

int64_t round_size(double bytes) {
  const auto n = static_cast<int64_t>(std::ceil(bytes));
  return n < kMinBlockSize ? kMinBlockSize : round_up(n, kMinBlockSize);
}

int64_t allocation_size(int64_t size) {
  if (size <= kSmallSize) return kSmallBuffer;
  if (size < kMinLargeAlloc) return kLargeBuffer;
  return round_up(size, kRoundLarge);
}
}  // namespace

CachingAllocator::CachingAllocator(CachingAllocatorOptions options) : options_(options) {}

CachingAllocator::Key CachingAllocator::key(int b) const {
  const Block& k = blocks_[b];
  return {k.stream, k.size, k.addr, b};
}

void CachingAllocator::insert_free(int b) {
  blocks_[b].free = true;
  pool(blocks_[b].small).insert(key(b));
}

void CachingAllocator::erase_free(int b) { pool(blocks_[b].small).erase(key(b)); }

int CachingAllocator::new_block(int64_t size, int64_t addr, int stream, bool small, int segment) {
  Block k;
  k.size = size;
  k.addr = addr;
  k.stream = stream;
  k.small = small;
  k.segment = segment;
  if (!free_slots_.empty()) {
    const int b = free_slots_.back();
    free_slots_.pop_back();
    blocks_[b] = k;
    return b;
  }
  blocks_.push_back(k);
  return static_cast<int>(blocks_.size()) - 1;
}

bool CachingAllocator::grow_segment(int64_t amount) {
  const auto fits = [&] {
    return options_.capacity_bytes <= 0 ||
           reserved_ + static_cast<double>(amount) <= options_.capacity_bytes;
  };
  if (!fits()) {
    release_cached();  // the allocator frees its cached segments and tries again
    released_ = true;
    if (!fits()) out_of_memory_ = true;  // PyTorch raises; the replay goes on to count the peak
  }
  reserved_ += static_cast<double>(amount);
  peak_reserved_ = std::max(peak_reserved_, reserved_);
  return !out_of_memory_;
}

int CachingAllocator::fresh_segment(int64_t size, int stream, bool small) {
  grow_segment(size);
  const int b = new_block(size, next_addr_, stream, small, segments_++);
  next_addr_ += size;
  return b;
}

// Expandable segments: the segment of (stream, pool) maps what the request lacks beyond the free
// block that ends it, in whole pages, and that block grows by it.
int CachingAllocator::expand(int64_t size, int stream, bool small) {
  const int64_t page = small ? kSmallBuffer : kLargeBuffer;
  auto it = expandable_tail_.find({stream, small});
  if (it == expandable_tail_.end()) {
    const int b = fresh_segment(round_up(size, page), stream, small);
    expandable_tail_[{stream, small}] = b;
    return b;
  }
  const int tail = it->second;
  if (blocks_[tail].free) {
    const int64_t more = round_up(size - blocks_[tail].size, page);
    erase_free(tail);
    grow_segment(more);
    blocks_[tail].size += more;
    return tail;
  }
  const int64_t more = round_up(size, page);
  grow_segment(more);
  const Block t = blocks_[tail];  // a copy: new_block may grow blocks_ and move it
  const int b = new_block(more, t.addr + t.size, stream, small, t.segment);
  blocks_[b].prev = tail;
  blocks_[tail].next = b;
  it->second = b;
  return b;
}

// release_cached_blocks: every cached block that is a whole segment goes back to the device;
// with expandable segments, the free pages that end a segment are unmapped.
void CachingAllocator::release_cached() {
  for (bool small : {true, false}) {
    std::vector<int> gone;
    for (const Key& k : pool(small)) {
      const int b = std::get<3>(k);
      if (options_.expandable_segments) {
        if (blocks_[b].next < 0) gone.push_back(b);
      } else if (blocks_[b].prev < 0 && blocks_[b].next < 0) {
        gone.push_back(b);
      }
    }
    for (int b : gone) {
      erase_free(b);
      reserved_ -= static_cast<double>(blocks_[b].size);
      if (options_.expandable_segments) {
        const std::pair<int, bool> seg{blocks_[b].stream, small};
        if (blocks_[b].prev >= 0) {
          blocks_[blocks_[b].prev].next = -1;
          expandable_tail_[seg] = blocks_[b].prev;
        } else {
          expandable_tail_.erase(seg);
        }
      }
      free_slots_.push_back(b);
    }
  }
}

int CachingAllocator::malloc(double bytes, int stream) {
  PARASOL_CHECK(bytes >= 0, "allocation of negative bytes");
  const int64_t size = round_size(bytes);
  const bool small = size <= kSmallSize;
  // get_free_block: the smallest free block of this stream and pool that holds the request.
  std::pmr::set<Key>& free_blocks = pool(small);
  auto it = free_blocks.lower_bound({stream, size, INT64_MIN, -1});
  int b = -1;
  if (it != free_blocks.end() && std::get<0>(*it) == stream) {
    b = std::get<3>(*it);
    free_blocks.erase(it);
  } else if (options_.expandable_segments) {
    b = expand(size, stream, small);
  } else {
    b = fresh_segment(allocation_size(size), stream, small);
  }
  // should_split: the rest becomes a free block of its own.
  const int64_t remaining = blocks_[b].size - size;
  const bool split =
      small || options_.expandable_segments ? remaining >= kMinBlockSize : remaining > kSmallSize;
  if (split) {
    const Block k = blocks_[b];  // a copy: new_block may grow blocks_ and move it
    const int rest = new_block(remaining, k.addr + size, k.stream, k.small, k.segment);
    blocks_[rest].prev = b;
    blocks_[rest].next = blocks_[b].next;
    if (blocks_[b].next >= 0) blocks_[blocks_[b].next].prev = rest;
    blocks_[b].next = rest;
    blocks_[b].size = size;
    if (options_.expandable_segments) {
      auto tail = expandable_tail_.find({k.stream, k.small});
      if (tail != expandable_tail_.end() && tail->second == b) tail->second = rest;
    }
    insert_free(rest);
  }
  blocks_[b].free = false;
  allocated_ += static_cast<double>(blocks_[b].size);
  peak_allocated_ = std::max(peak_allocated_, allocated_);
  return b;
}

// try_merge_blocks: `other` (a free neighbour of b) is taken into b.
void CachingAllocator::merge(int b, int other) {
  erase_free(other);
  Block& k = blocks_[b];
  const Block& o = blocks_[other];
  if (o.addr < k.addr) {
    k.addr = o.addr;
    k.prev = o.prev;
    if (k.prev >= 0) blocks_[k.prev].next = b;
  } else {
    k.next = o.next;
    if (k.next >= 0) blocks_[k.next].prev = b;
    if (options_.expandable_segments) {
      auto tail = expandable_tail_.find({k.stream, k.small});
      if (tail != expandable_tail_.end() && tail->second == other) tail->second = b;
    }
  }
  k.size += o.size;
  free_slots_.push_back(other);
}

void CachingAllocator::free(int b) {
  PARASOL_CHECK(0 <= b && b < static_cast<int>(blocks_.size()) && !blocks_[b].free,
                "free of a block not allocated");
  allocated_ -= static_cast<double>(blocks_[b].size);
  if (blocks_[b].prev >= 0 && blocks_[blocks_[b].prev].free) merge(b, blocks_[b].prev);
  if (blocks_[b].next >= 0 && blocks_[blocks_[b].next].free) merge(b, blocks_[b].next);
  insert_free(b);
}

AllocatorPeaks replay_caching_allocator(const Program& program, CachingAllocatorOptions options,
                                        int steps) {
  PARASOL_CHECK(steps >= 1, "steps " + std::to_string(steps));
  const int n_ops = static_cast<int>(program.ops.size());
  // Allocations starting and ending at each op, in buffer order (offsets into one array per
  // kind, op by op); each on the stream of the op that first touches it (the stream current when
  // the framework allocates it).
  const std::vector<Allocation> all = allocations(program);
  CachingAllocator alloc(options);
  std::vector<int> handle(all.size(), -1);
  std::vector<int> start_at(n_ops + 1, 0), end_at(n_ops + 1, 0);
  double persistent = 0;
  for (size_t i = 0; i < all.size(); ++i) {
    const Allocation& a = all[i];
    if (a.host || a.bytes <= 0) continue;
    if (a.persistent) {
      handle[i] = alloc.malloc(a.bytes, 0);
      persistent += a.bytes;
    } else if (a.first >= 0) {
      ++start_at[a.first + 1];
      ++end_at[a.last + 1];
    }
  }
  for (int op = 0; op < n_ops; ++op) {
    start_at[op + 1] += start_at[op];
    end_at[op + 1] += end_at[op];
  }
  std::vector<int> starts(start_at[n_ops]), ends(end_at[n_ops]);
  {
    std::vector<int> s(start_at.begin(), start_at.end() - 1), e(end_at.begin(), end_at.end() - 1);
    for (size_t i = 0; i < all.size(); ++i) {
      const Allocation& a = all[i];
      if (a.host || a.bytes <= 0 || a.persistent || a.first < 0) continue;
      starts[s[a.first]++] = static_cast<int>(i);
      ends[e[a.last]++] = static_cast<int>(i);
    }
  }
  // The liveness peak (liveness(program).peak_bytes): the bytes live while an op runs, its
  // allocations made and its frees not yet.
  double live = persistent, live_peak = persistent;
  for (int step = 0; step < steps; ++step)
    for (int op = 0; op < n_ops; ++op) {
      const int stream = program.ops[op].stream;
      for (int k = start_at[op]; k < start_at[op + 1]; ++k) {
        const int i = starts[k];
        handle[i] = alloc.malloc(all[i].bytes, stream);
        live += all[i].bytes;
      }
      live_peak = std::max(live_peak, live);
      for (int k = end_at[op]; k < end_at[op + 1]; ++k) {
        const int i = ends[k];
        alloc.free(handle[i]);
        live -= all[i].bytes;
      }
    }
  return {alloc.peak_allocated(), alloc.peak_reserved(), alloc.out_of_memory(), alloc.released(),
          live_peak};
}

}  // namespace parasol
