// PyTorch's CUDA caching allocator (c10/cuda/CUDACachingAllocator.cpp), played over a Program's
// allocations and frees: what torch.cuda.max_memory_reserved reports for one rank, the segments
// the allocator holds from the device beside the bytes its tensors hold (core/liveness.h), its
// rounding and the free blocks stranded between live ones.
//
// The rules, as the allocator's source has them (PyTorch 2.x):
//  - a request rounds up to a multiple of 512 bytes (kMinBlockSize; round_size), with
//    roundup_power2_divisions off (its default);
//  - blocks of at most 1 MiB (kSmallSize) come from the small pool, larger ones from the large
//    pool; a free block is reused only by a request on the stream it was allocated on, the
//    smallest free block of that stream and pool that holds the request (best fit, lowest address
//    first: BlockPool's set ordered by stream, size, address; get_free_block);
//  - with no such block, a new segment (cudaMalloc) of 2 MiB for a small request (kSmallBuffer),
//    20 MiB below 10 MiB (kLargeBuffer, kMinLargeAlloc) and the request rounded up to 2 MiB from
//    10 MiB on (kRoundLarge; get_allocation_size);
//  - a block larger than the request is split when what remains is at least 512 bytes (small
//    pool, or any pool with expandable segments) or more than 1 MiB (large pool; should_split),
//    max_split_size being unlimited by default;
//  - a freed block merges with free neighbours of its segment (free_block, try_merge_blocks);
//  - segments go back to the device only when a cudaMalloc fails: every wholly free segment is
//    released and the cudaMalloc retried (release_cached_blocks); it fails again: out of memory;
//  - with expandable_segments, one growing segment per stream and pool maps pages of 2 MiB
//    (small pool) or 20 MiB (large pool) at its end, taking in a free block that ends it
//    (find_expandable_block, map_block); on a failed map the free pages at a segment's end are
//    unmapped (release_blocks' unmap_block, here only the segment's free tail).
// Events from other streams' uses (record_stream) and CUDA graph pools are not modelled.
#pragma once

#include <cstdint>
#include <map>
#include <memory_resource>
#include <set>
#include <tuple>
#include <vector>

#include "core/program.h"

namespace parasol {

struct CachingAllocatorOptions {
  bool expandable_segments = false;
  // Bytes the allocator's segments may take from the device (what the CUDA context, NCCL and
  // the rest leave); 0: no limit.
  double capacity_bytes = 0;
};

class CachingAllocator {
 public:
  explicit CachingAllocator(CachingAllocatorOptions options);
  // Allocates `bytes` (>= 0) on `stream`; returns a handle for free().
  int malloc(double bytes, int stream);
  // REQUIRES: `handle` came from malloc() and is not freed yet.
  void free(int handle);

  double allocated() const { return allocated_; }  // bytes of live blocks (rounded)
  double reserved() const { return reserved_; }    // bytes of segments held (mapped)
  double peak_allocated() const { return peak_allocated_; }
  double peak_reserved() const { return peak_reserved_; }
  // Whether a request found no room even after the cached segments were released.
  bool out_of_memory() const { return out_of_memory_; }
  // Whether a request reached the capacity and the cached segments were released.
  bool released() const { return released_; }

 private:
  struct Block {
    int64_t size = 0;
    int64_t addr = 0;
    int stream = 0;
    bool small = false;
    bool free = true;
    int segment = 0;
    int prev = -1, next = -1;  // neighbours in the segment (block indices)
  };
  using Key = std::tuple<int, int64_t, int64_t, int>;  // stream, size, address, block
  std::pmr::set<Key>& pool(bool small) { return small ? small_free_ : large_free_; }
  Key key(int b) const;
  void insert_free(int b);
  void erase_free(int b);
  int new_block(int64_t size, int64_t addr, int stream, bool small, int segment);
  bool grow_segment(int64_t amount);  // false: over the capacity
  int fresh_segment(int64_t size, int stream, bool small);
  int expand(int64_t size, int stream, bool small);
  void release_cached();
  void merge(int b, int other);

  CachingAllocatorOptions options_;
  std::vector<Block> blocks_;
  std::vector<int> free_slots_;
  // The free blocks' nodes come from a pool: the replay inserts and erases one per malloc and free.
  std::pmr::unsynchronized_pool_resource nodes_;
  std::pmr::set<Key> small_free_{&nodes_}, large_free_{&nodes_};
  std::map<std::pair<int, bool>, int> expandable_tail_;  // (stream, small) -> last block
  int segments_ = 0;
  int64_t next_addr_ = 0;
  double allocated_ = 0, reserved_ = 0, peak_allocated_ = 0, peak_reserved_ = 0;
  bool out_of_memory_ = false;
  bool released_ = false;
};

// The allocator's peaks over `steps` training steps of `program` (its persistent buffers
// allocated once, before the first step; every other allocation made before the first op that
// touches it runs, on that op's stream, and freed after the last op that touches it, in issue
// order). The cache persists from step to step, as in training, so a later step can reserve
// more than the first.
struct AllocatorPeaks {
  double allocated = 0;  // the largest bytes of live blocks (as max_memory_allocated)
  double reserved = 0;   // the largest bytes of segments (as max_memory_reserved)
  bool out_of_memory = false;
  bool released = false;  // the cache was released at the capacity (the replay depends on it)
  // The Program's liveness peak (liveness(program).peak_bytes, unrounded): the largest bytes of
  // live allocations while an op runs.
  double live = 0;
};
AllocatorPeaks replay_caching_allocator(const Program& program, CachingAllocatorOptions options,
                                        int steps = 2);

}  // namespace parasol
