// CpuBackend memory: live and peak bytes per BufferClass and in total, device and host apart,
// peaks that survive frees and reset, alignment, errors for foreign or double frees; copy and
// zero; the sgemm helper's transposes and leading dimensions against a double reference.
#include "runtime/cpu/cpu_backend.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "kernel_test_util.h"

namespace parasol::runtime {
namespace {

using test::near_normwise;

TEST(CpuMemory, LiveAndPeakPerClass) {
  CpuBackend b;
  void* p1 = b.alloc(1000, BufferClass::kParam);
  void* g1 = b.alloc(400, BufferClass::kGrad);
  void* a1 = b.alloc(3000, BufferClass::kActivation);
  MemoryStats s = b.device_memory();
  EXPECT_EQ(s.live_of(BufferClass::kParam), 1000);
  EXPECT_EQ(s.live_of(BufferClass::kGrad), 400);
  EXPECT_EQ(s.live_of(BufferClass::kActivation), 3000);
  EXPECT_EQ(s.live_of(BufferClass::kOptimizer), 0);
  EXPECT_EQ(s.live_of(BufferClass::kWorkspace), 0);
  EXPECT_EQ(s.live_total, 4400);
  EXPECT_EQ(s.peak_total, 4400);
  EXPECT_EQ(s.allocations, 3);

  b.free(a1);  // activations drop; their peak stays
  void* w1 = b.alloc(500, BufferClass::kWorkspace);
  void* a2 = b.alloc(1000, BufferClass::kActivation);
  s = b.device_memory();
  EXPECT_EQ(s.live_of(BufferClass::kActivation), 1000);
  EXPECT_EQ(s.peak_of(BufferClass::kActivation), 3000);
  EXPECT_EQ(s.peak_of(BufferClass::kWorkspace), 500);
  EXPECT_EQ(s.live_total, 2900);
  EXPECT_EQ(s.peak_total, 4400);  // the total peak was with the first activation live

  // The total peak is of the sum at one time, not the sum of per-class peaks.
  void* a3 = b.alloc(2000, BufferClass::kActivation);
  s = b.device_memory();
  EXPECT_EQ(s.live_total, 4900);
  EXPECT_EQ(s.peak_total, 4900);
  EXPECT_EQ(s.peak_of(BufferClass::kActivation), 3000);
  int64_t class_peaks = 0;
  for (int64_t p : s.peak) class_peaks += p;
  EXPECT_EQ(class_peaks, 1000 + 400 + 3000 + 500);

  b.reset_peaks();
  s = b.device_memory();
  EXPECT_EQ(s.peak_of(BufferClass::kActivation), 1000 + 2000);  // peaks := live
  EXPECT_EQ(s.peak_of(BufferClass::kWorkspace), 500);
  EXPECT_EQ(s.peak_total, s.live_total);
  for (void* p : {p1, g1, w1, a2, a3}) b.free(p);
  s = b.device_memory();
  EXPECT_EQ(s.live_total, 0);
  EXPECT_EQ(s.allocations, 0);
  for (int64_t l : s.live) EXPECT_EQ(l, 0);
  EXPECT_EQ(s.peak_total, 4900);
}

TEST(CpuMemory, HostCountedApart) {
  CpuBackend b;
  void* d = b.alloc(256, BufferClass::kOptimizer);
  void* h = b.alloc_host(1024, BufferClass::kOptimizer);
  void* h2 = b.alloc_host(64, BufferClass::kActivation);
  EXPECT_EQ(b.device_memory().live_of(BufferClass::kOptimizer), 256);
  EXPECT_EQ(b.host_memory().live_of(BufferClass::kOptimizer), 1024);
  EXPECT_EQ(b.host_memory().live_total, 1088);
  EXPECT_EQ(b.device_memory().live_total, 256);
  // A host pointer is not a device allocation and vice versa.
  EXPECT_THROW(b.free(h), Error);
  EXPECT_THROW(b.free_host(d), Error);
  b.free_host(h);
  b.free_host(h2);
  b.free(d);
  EXPECT_EQ(b.host_memory().live_total, 0);
  EXPECT_EQ(b.host_memory().peak_total, 1088);
  EXPECT_EQ(b.device_memory().peak_total, 256);
}

// The fp32 views of 16-bit operands (mixed precision) are counted apart from the device memory
// the Program's buffers use, and reset with the other peaks.
TEST(CpuMemory, WidenedCountedApart) {
  CpuBackend b;
  void* d = b.alloc(200, BufferClass::kActivation);
  void* w = b.alloc_widened(800);
  EXPECT_EQ(b.device_memory().live_total, 200);
  EXPECT_EQ(b.widened_memory().live_total, 800);
  EXPECT_THROW(b.free(w), Error);  // not a device allocation
  EXPECT_THROW(b.free_widened(d), Error);
  b.free_widened(w);
  EXPECT_EQ(b.widened_memory().live_total, 0);
  EXPECT_EQ(b.widened_memory().peak_total, 800);
  b.reset_peaks();
  EXPECT_EQ(b.widened_memory().peak_total, 0);
  EXPECT_EQ(b.device_memory().peak_total, 200);
  b.free(d);
}

TEST(CpuMemory, ErrorsAndEdgeCases) {
  CpuBackend b;
  EXPECT_EQ(b.alloc(0, BufferClass::kParam), nullptr);
  EXPECT_EQ(b.device_memory().allocations, 0);
  b.free(nullptr);  // ignored
  void* p = b.alloc(10, BufferClass::kParam);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u);
  b.free(p);
  EXPECT_THROW(b.free(p), Error);  // double free
  int local = 0;
  EXPECT_THROW(b.free(&local), Error);
  EXPECT_EQ(b.device_memory().live_total, 0);
}

TEST(CpuMemory, DestructorReleasesLiveBlocks) {
  // Leak checkers (ASan) would flag this if the destructor did not free the blocks.
  CpuBackend b;
  b.alloc(1 << 20, BufferClass::kActivation);
  b.alloc_host(1 << 20, BufferClass::kActivation);
  EXPECT_EQ(b.device_memory().allocations, 1);
}

TEST(CpuMemory, CopyAndZero) {
  CpuBackend b;
  auto* d = static_cast<float*>(b.alloc(64 * sizeof(float), BufferClass::kActivation));
  auto* h = static_cast<float*>(b.alloc_host(64 * sizeof(float), BufferClass::kActivation));
  std::vector<float> src = test::random_floats(64, 1);
  b.copy(d, src.data(), 64 * sizeof(float));
  b.copy(h, d, 64 * sizeof(float));  // "offload"
  EXPECT_EQ(std::memcmp(h, src.data(), 64 * sizeof(float)), 0);
  b.zero(d + 8, 16 * sizeof(float));
  for (int i = 0; i < 64; ++i) EXPECT_EQ(d[i], (i >= 8 && i < 24) ? 0.0f : src[i]) << i;
  b.synchronize();
  b.free(d);
  b.free_host(h);
}

// cpu::sgemm against a double reference for all four transpose combinations, with leading
// dimensions wider than the matrices and beta = 0 and 1. Tolerance: 1e-5 of the largest result.
TEST(CpuSgemm, TransposesLeadingDimensionsBeta) {
  const int64_t m = 13, n = 17, k = 29, pad = 3;
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (float beta : {0.0f, 1.0f}) {
        // Stored shapes: A is [m x k] or [k x m]; B is [k x n] or [n x k].
        const int64_t ar = ta ? k : m, ac = ta ? m : k, br = tb ? n : k, bc = tb ? k : n;
        const int64_t lda = ac + pad, ldb = bc + pad, ldc = n + pad;
        std::vector<float> a = test::random_floats(ar * lda, 2),
                           bm = test::random_floats(br * ldb, 3),
                           c = test::random_floats(m * ldc, 4);
        std::vector<double> ref(m * n);
        for (int64_t i = 0; i < m; ++i)
          for (int64_t j = 0; j < n; ++j) {
            double s = 0;
            for (int64_t p = 0; p < k; ++p) {
              const double av = ta ? a[p * lda + i] : a[i * lda + p];
              const double bv = tb ? bm[j * ldb + p] : bm[p * ldb + j];
              s += av * bv;
            }
            ref[i * n + j] = 0.5 * s + beta * c[i * ldc + j];
          }
        cpu::sgemm(ta, tb, m, n, k, 0.5f, a.data(), lda, bm.data(), ldb, beta, c.data(), ldc);
        std::vector<float> got(m * n);
        for (int64_t i = 0; i < m; ++i)
          for (int64_t j = 0; j < n; ++j) got[i * n + j] = c[i * ldc + j];
        EXPECT_TRUE(near_normwise(got, ref, 1e-5, "sgemm")) << ta << tb << beta;
      }
}

}  // namespace
}  // namespace parasol::runtime

namespace parasol::runtime {
namespace {

TEST(CpuBackendMarks, HostClockMarksFromTheFirst) {
  CpuBackend b(1);
  b.clear_marks();
  EXPECT_EQ(b.mark(), 0);
  std::vector<float> x(1 << 16, 1.0f);
  b.zero(x.data(), x.size() * sizeof(float));
  EXPECT_EQ(b.mark(), 1);
  EXPECT_EQ(b.mark_seconds(0), 0.0);
  EXPECT_GE(b.mark_seconds(1), 0.0);
  EXPECT_THROW(b.mark_seconds(2), Error);
  b.clear_marks();
  EXPECT_EQ(b.mark(), 0);
}

}  // namespace
}  // namespace parasol::runtime
