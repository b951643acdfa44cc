// tools/host_probe.h and tools/link_probe.h: the cpu-host profile from the probe's figures (the
// memcpy rule for the shm link without a peer; the fit to measured all-reduces with one), and
// when a process counts as started by an MPI launcher.
#include "tools/host_probe.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "core/cluster.h"
#include "cost_models/collective.h"
#include "tools/link_probe.h"

namespace parasol::tools {
namespace {

constexpr int kShm = static_cast<int>(LinkKind::kShm);
constexpr double kNominalShmBw = 12e9;  // the localhost preset's shm link (cluster_generators.cc)

HostProbe cpu_figures() {
  HostProbe p;
  p.sgemm_flops = 100e9;
  p.sgemm_n = 512;
  p.triad_bw = 24e9;
  p.copy_bw = 20e9;  // bytes read and written: a 10 GB/s payload
  p.memory_bytes = 16e9;
  return p;
}

TEST(HostProbe, WithoutAPeerTheShmLinkIsHalfTheMemcpyRate) {
  const cost::Profile p = host_profile(cpu_figures());
  EXPECT_NEAR(p.link_efficiency[kShm], 0.5 * 10e9 / kNominalShmBw, 1e-12);
  EXPECT_NEAR(p.host_copy_efficiency, 10e9 / kNominalShmBw, 1e-12);
  ASSERT_TRUE(p.measured_device.has_value());
  EXPECT_DOUBLE_EQ(p.measured_device->peak_fp32_flops, 100e9);
  EXPECT_EQ(p.source.find("MPI"), std::string::npos);
}

// Two ranks' all-reduce of S bytes measured as t = a + S / B: the localhost preset's ring over
// two ranks prices 2 steps of (1 us of path latency + the step latency) and S bytes over the
// 12 GB/s link at the link efficiency, so the fit is B / 12 GB/s and a / 2 - 1 us.
TEST(HostProbe, TheShmLinkFitsMeasuredAllReduces) {
  HostProbe probe = cpu_figures();
  probe.link_ranks = 2;
  const double a = 12e-6, bw = 1.3e9;
  for (double bytes : {4096.0, 65536.0, 262144.0, 1048576.0, 4194304.0})
    probe.all_reduce.emplace_back(bytes, a + bytes / bw);
  const cost::Profile p = host_profile(probe);
  EXPECT_NEAR(p.link_efficiency[kShm], bw / kNominalShmBw, 0.01 * bw / kNominalShmBw);
  EXPECT_NEAR(p.collective_step_latency_s, a / 2 - 1e-6, 0.02 * (a / 2 - 1e-6));
  EXPECT_NE(p.source.find("MPI all-reduce over 2 ranks"), std::string::npos) << p.source;
  // And the fitted profile prices those all-reduces as measured.
  const cost::GroupModel g(cluster_preset("localhost", 2), p, {0, 1});
  for (const auto& [bytes, seconds] : probe.all_reduce)
    EXPECT_NEAR(g.cost(cost::Collective::kAllReduce, bytes).time_s, seconds, 0.02 * seconds)
        << bytes << " bytes";
}

// A link slower than the bounds allow stays at the bound (calibrate's: efficiency >= 0.01).
TEST(HostProbe, TheShmFitKeepsCalibratesBounds) {
  HostProbe probe = cpu_figures();
  probe.link_ranks = 4;
  for (double bytes : {65536.0, 4194304.0}) probe.all_reduce.emplace_back(bytes, bytes / 1e6);
  const auto [eff, latency] = fit_shm_link(probe, host_profile(cpu_figures()));
  EXPECT_DOUBLE_EQ(eff, 0.01);
  EXPECT_GE(latency, 0);
  EXPECT_LE(latency, 1e-3);
}

TEST(LinkProbe, LaunchedByMpiReadsTheLaunchersEnvironment) {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"}) unsetenv(v);
  EXPECT_FALSE(launched_by_mpi());
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"}) {
    setenv(v, "2", 1);
    EXPECT_TRUE(launched_by_mpi()) << v;
    unsetenv(v);
  }
  // A process on its own probes the CPU without MPI and reports.
  HostProbe out;
  EXPECT_TRUE(probe_host_and_link(1, out));
  EXPECT_GT(out.sgemm_flops, 0);
  EXPECT_EQ(out.link_ranks, 0);
  EXPECT_TRUE(out.all_reduce.empty());
}

}  // namespace
}  // namespace parasol::tools
