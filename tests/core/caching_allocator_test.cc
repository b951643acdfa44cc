// Tests of the caching allocator's replay (core/caching_allocator.h) against the rules of
// PyTorch's c10/cuda/CUDACachingAllocator.cpp worked by hand: rounding, the two pools' segment
// sizes, the split rules, per-stream reuse, merging, release on a failed cudaMalloc, expandable
// segments, and a Program's allocations and frees over two steps.
#include "core/caching_allocator.h"

#include <gtest/gtest.h>

#include "core/liveness.h"

namespace parasol {
namespace {

constexpr double MiB = 1024.0 * 1024.0;

TEST(CachingAllocator, SmallRequestsRoundTo512BytesAndShareA2MiBSegment) {
  CachingAllocator a({});
  a.malloc(100, 0);  // one 512-byte block of a 2 MiB segment
  EXPECT_EQ(a.allocated(), 512);
  EXPECT_EQ(a.reserved(), 2 * MiB);
  a.malloc(0.5 * MiB, 0);  // the segment's rest holds it
  a.malloc(513, 0);        // 1024 bytes
  EXPECT_EQ(a.allocated(), 512 + 0.5 * MiB + 1024);
  EXPECT_EQ(a.reserved(), 2 * MiB);
}

TEST(CachingAllocator, LargeRequestsTake20MiBSegmentsBelow10MiBAndRoundTo2MiBAbove) {
  CachingAllocator a({});
  a.malloc(5 * MiB, 0);  // a 20 MiB segment, split: 15 MiB left free
  EXPECT_EQ(a.reserved(), 20 * MiB);
  a.malloc(5 * MiB, 0);  // from the free rest
  EXPECT_EQ(a.reserved(), 20 * MiB);
  a.malloc(12 * MiB + 1, 0);  // 12 MiB + 512 bytes: a segment of 14 MiB
  EXPECT_EQ(a.reserved(), 34 * MiB);
  EXPECT_EQ(a.allocated(), 22 * MiB + 512);
}

TEST(CachingAllocator, ALargeBlockIsSplitOnlyWhenMoreThan1MiBRemains) {
  CachingAllocator a({});
  const int h = a.malloc(30 * MiB, 0);
  a.free(h);
  a.malloc(29.5 * MiB, 0);  // 0.5 MiB would remain: the whole 30 MiB block is taken
  EXPECT_EQ(a.allocated(), 30 * MiB);
  CachingAllocator b({});
  b.free(b.malloc(30 * MiB, 0));
  b.malloc(28 * MiB, 0);  // 2 MiB remain: split
  EXPECT_EQ(b.allocated(), 28 * MiB);
  b.malloc(1.5 * MiB, 0);  // the 2 MiB rest holds it (no new segment)
  EXPECT_EQ(b.reserved(), 30 * MiB);
}

TEST(CachingAllocator, AFreeBlockServesOnlyItsOwnStream) {
  CachingAllocator a({});
  a.free(a.malloc(100 * MiB, 0));
  a.malloc(100 * MiB, 1);  // stream 0's cached block cannot serve stream 1
  EXPECT_EQ(a.reserved(), 200 * MiB);
  a.malloc(100 * MiB, 0);  // but serves stream 0
  EXPECT_EQ(a.reserved(), 200 * MiB);
}

TEST(CachingAllocator, FreedSegmentsTooSmallForALargerRequestStayReserved) {
  CachingAllocator a({});
  const int x = a.malloc(40 * MiB, 0), y = a.malloc(40 * MiB, 0);
  a.free(x);
  a.free(y);
  a.malloc(60 * MiB, 0);  // two free 40 MiB segments, neither holds 60 MiB
  EXPECT_EQ(a.reserved(), 140 * MiB);
  EXPECT_EQ(a.peak_reserved(), 140 * MiB);
  EXPECT_EQ(a.allocated(), 60 * MiB);
}

TEST(CachingAllocator, FreeNeighboursOfASegmentMerge) {
  CachingAllocator a({});
  const int big = a.malloc(60 * MiB, 0);
  a.free(big);
  const int x = a.malloc(20 * MiB, 0), y = a.malloc(20 * MiB, 0);  // splits of the 60 MiB
  a.malloc(20 * MiB, 0);
  EXPECT_EQ(a.reserved(), 60 * MiB);
  a.free(x);
  a.free(y);              // merged with x: 40 MiB free in one block
  a.malloc(40 * MiB, 0);  // fits it
  EXPECT_EQ(a.reserved(), 60 * MiB);
}

TEST(CachingAllocator, AFailedCudaMallocReleasesTheCachedSegmentsFirst) {
  CachingAllocatorOptions o;
  o.capacity_bytes = 100 * MiB;
  CachingAllocator a(o);
  a.free(a.malloc(60 * MiB, 0));
  a.malloc(80 * MiB, 0);  // 60 + 80 > 100: the free 60 MiB segment goes back first
  EXPECT_EQ(a.reserved(), 80 * MiB);
  EXPECT_EQ(a.peak_reserved(), 80 * MiB);
  EXPECT_FALSE(a.out_of_memory());
  EXPECT_TRUE(a.released());
  a.malloc(30 * MiB, 0);  // 110 MiB live: out of memory
  EXPECT_TRUE(a.out_of_memory());
}

TEST(CachingAllocator, ExpandableSegmentsMapPagesAtTheEndAndDoNotStrand) {
  CachingAllocatorOptions o;
  o.expandable_segments = true;
  CachingAllocator a(o);
  const int x = a.malloc(30 * MiB, 0);  // two 20 MiB pages
  EXPECT_EQ(a.reserved(), 40 * MiB);
  const int y = a.malloc(5 * MiB, 0);  // from the mapped rest
  EXPECT_EQ(a.reserved(), 40 * MiB);
  a.free(x);
  a.free(y);              // one free 40 MiB range
  a.malloc(60 * MiB, 0);  // takes it and maps one more page (fixed segments: a new 60 MiB one)
  EXPECT_EQ(a.reserved(), 60 * MiB);
  a.malloc(1000, 0);  // small pool: its own segment of 2 MiB pages
  EXPECT_EQ(a.reserved(), 62 * MiB);
}

TEST(CachingAllocator, AProgramsBuffersReplayedOverTwoStepsOnTheirStreams) {
  Program p;
  Buffer w{0, "w", {10 * 1024 * 1024}, Dtype::kFp32, BufferClass::kParam, false, true};  // 40 MiB
  Buffer a{0, "a", {20 * 1024 * 1024}, Dtype::kBf16, BufferClass::kActivation};          // 40 MiB
  Buffer b{0, "b", {20 * 1024 * 1024}, Dtype::kBf16, BufferClass::kActivation};          // 40 MiB
  Buffer c{0, "c", {30 * 1024 * 1024}, Dtype::kBf16, BufferClass::kActivation};          // 60 MiB
  Buffer g{0, "g", {10 * 1024 * 1024}, Dtype::kBf16, BufferClass::kParam};  // 20 MiB, gathered
  const int iw = p.add_buffer(w), ia = p.add_buffer(a), ib = p.add_buffer(b);
  const int ic = p.add_buffer(c), ig = p.add_buffer(g);
  Op o0, o1, o2, o3;
  o0.writes = {ia};  // a
  o1.reads = {ia, iw};
  o1.writes = {ib};  // a, b
  o2.reads = {ib};
  o2.writes = {ic};  // b, c (a freed after op 1)
  o3.stream = 1;
  o3.writes = {ig};  // g on another stream
  p.add_op(o0);
  p.add_op(o1);
  p.add_op(o2);
  p.add_op(o3);
  // Step 1: w 40; a 40; b 40; a freed; c 60 finds no free 60 MiB block (a's 40): a new segment;
  // g 20 on stream 1: its own 20 MiB segment. 40 + 40 + 40 + 60 + 20 = 200 MiB. Step 2: a, b
  // and c each left a free segment of its own size, which the same requests reuse.
  const AllocatorPeaks peaks = replay_caching_allocator(p, {});
  EXPECT_EQ(peaks.reserved, 200 * MiB);
  EXPECT_EQ(peaks.allocated, 40 * MiB + 40 * MiB + 60 * MiB);  // w, b, c while op 2 runs
  EXPECT_FALSE(peaks.out_of_memory);
  EXPECT_FALSE(peaks.released);
  // The live bytes the replay counts are liveness()'s peak.
  EXPECT_EQ(peaks.live, liveness(p).peak_bytes);
  // Under a 150 MiB capacity the cached segments go back: a's 40 MiB one before g's.
  CachingAllocatorOptions capped;
  capped.capacity_bytes = 150 * MiB;
  const AllocatorPeaks tight = replay_caching_allocator(p, capped);
  EXPECT_TRUE(tight.released);
  EXPECT_LE(tight.reserved, 150 * MiB);
  CachingAllocatorOptions expandable;
  expandable.expandable_segments = true;
  // One growing range per stream: w 40, a 40, b 40 (120 mapped); a freed leaves a 40 MiB hole
  // that c (60) cannot use: 60 more mapped (180), g's stream 20: 200; step 2 reuses it all.
  EXPECT_EQ(replay_caching_allocator(p, expandable).reserved, 200 * MiB);
}

}  // namespace
}  // namespace parasol
