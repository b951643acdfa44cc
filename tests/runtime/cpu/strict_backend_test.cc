// Tests runtime/cpu/strict_backend.h: device memory the host cannot touch outside a DeviceAccess
// scope (a read or a write dies), while copies, zeroing and kernels reach it; allocation reuse
// and coalescing in the arena; the same results as CpuBackend's kernels.
#include "runtime/cpu/strict_backend.h"

#include <gtest/gtest.h>

#include <vector>

#include "core/error.h"
#include "runtime/device_access.h"

namespace parasol::runtime {
namespace {

TEST(StrictCpuBackendDeathTest, HostWriteToDeviceMemoryDies) {
  ::testing::GTEST_FLAG(death_test_style) = "threadsafe";
  EXPECT_DEATH(
      {
        StrictCpuBackend be(1);
        auto* p = static_cast<float*>(be.alloc(1024 * sizeof(float), BufferClass::kParam));
        p[3] = 1.0f;  // what std::fill on a parameter did in the trainer
      },
      "");
}

TEST(StrictCpuBackendDeathTest, HostReadOfDeviceMemoryDies) {
  ::testing::GTEST_FLAG(death_test_style) = "threadsafe";
  EXPECT_DEATH(
      {
        StrictCpuBackend be(1);
        auto* p = static_cast<float*>(be.alloc(64, BufferClass::kGrad));
        volatile float x = p[0];
        (void)x;
      },
      "");
}

TEST(StrictCpuBackend, CopiesZeroingAndKernelsReachDeviceMemory) {
  StrictCpuBackend be(1);
  EXPECT_TRUE(DeviceAccess::installed());
  const std::vector<float> a = {1, 2, 3, 4, 5, 6};  // 2 x 3
  const std::vector<float> w = {1, 0, 0, 1, 1, 1};  // 3 x 2 (k x n: kInOut)
  auto* da = static_cast<float*>(be.alloc(a.size() * 4, BufferClass::kActivation));
  auto* dw = static_cast<float*>(be.alloc(w.size() * 4, BufferClass::kParam));
  auto* dy = static_cast<float*>(be.alloc(4 * 4, BufferClass::kActivation));
  be.copy(da, a.data(), a.size() * 4);
  be.copy(dw, w.data(), w.size() * 4);
  be.zero(dy, 4 * 4);
  be.linear_forward(dy, da, dw, WeightLayout::kInOut, nullptr, 2, 2, 3);
  std::vector<float> y(4);
  be.copy(y.data(), dy, 4 * 4);
  EXPECT_EQ(y, (std::vector<float>{4, 5, 10, 11}));  // [1 2 3; 4 5 6] x [1 0; 0 1; 1 1]
  {
    DeviceAccess access;  // what the MPI communicator opens around its transfers
    EXPECT_EQ(dy[0], 4.0f);
  }
  be.free(da);
  be.free(dw);
  be.free(dy);
}

TEST(StrictCpuBackend, FreedRangesAreReusedAndCoalesced) {
  StrictCpuBackend be(1);
  void* a = be.alloc(1000, BufferClass::kActivation);
  void* b = be.alloc(1000, BufferClass::kActivation);
  void* c = be.alloc(1000, BufferClass::kActivation);
  be.free(a);
  be.free(b);
  // a and b coalesced: 2,000 bytes fit where a was.
  void* d = be.alloc(2000, BufferClass::kActivation);
  EXPECT_EQ(d, a);
  be.free(c);
  be.free(d);
  EXPECT_EQ(be.device_memory().live_total, 0);
}

TEST(StrictCpuBackend, OnePerProcess) {
  StrictCpuBackend be(1);
  EXPECT_THROW(StrictCpuBackend second(1), Error);
}

TEST(StrictCpuBackend, ExhaustedArenaIsAClearError) {
  StrictCpuBackend be(1, size_t{4} << 20);
  EXPECT_THROW(be.alloc(size_t{64} << 20, BufferClass::kParam), Error);
}

}  // namespace
}  // namespace parasol::runtime
