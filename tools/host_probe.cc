// The host probe: timed cblas_sgemm, triad and memcpy loops (best of repeats within a budget).
#include "tools/host_probe.h"

#include <cblas.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "core/cluster.h"
#include "core/format.h"
#include "cost_models/collective.h"
#include "traces/least_squares.h"

namespace parasol::tools {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Runs `fn` (which returns the work it did, in FLOPs or bytes) repeatedly for about `budget_s`
// seconds after one warm-up call; returns the best rate.
template <typename Fn>
double best_rate(double budget_s, Fn fn) {
  fn();
  double best = 0;
  const auto t0 = Clock::now();
  do {
    const auto s = Clock::now();
    const double work = fn();
    const double dt = seconds_since(s);
    if (dt > 0) best = std::max(best, work / dt);
  } while (seconds_since(t0) < budget_s);
  return best;
}

// Splits [0, n) over `threads` threads running body(begin, end).
template <typename Body>
void parallel_for(size_t n, int threads, Body body) {
  if (threads <= 1) {
    body(size_t{0}, n);
    return;
  }
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) pool.emplace_back(body, n * t / threads, n * (t + 1) / threads);
  for (std::thread& th : pool) th.join();
}

}  // namespace

HostProbe probe_host(int threads) {
  HostProbe p;
  p.threads = std::max(1, threads);
  const auto t0 = Clock::now();
  openblas_set_num_threads(p.threads);
  for (int n : {256, 512, 1024}) {
    std::vector<float> a(static_cast<size_t>(n) * n, 1.0f), b(a.size(), 0.5f), c(a.size());
    const double rate = best_rate(n == 1024 ? 0.3 : 0.15, [&] {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, b.data(),
                  n, 0.0f, c.data(), n);
      return 2.0 * n * n * n;
    });
    if (rate > p.sgemm_flops) {
      p.sgemm_flops = rate;
      p.sgemm_n = n;
    }
  }
  const size_t n = (32u << 20) / sizeof(float);
  std::vector<float> x(n, 1.0f), y(n, 2.0f), z(n, 0.0f);
  p.triad_bw = best_rate(0.4, [&] {
    parallel_for(n, p.threads, [&](size_t b, size_t e) {
      for (size_t i = b; i < e; ++i) z[i] = x[i] + 1.5f * y[i];
    });
    return 3.0 * sizeof(float) * n;
  });
  p.copy_bw = best_rate(0.2, [&] {
    parallel_for(n, p.threads, [&](size_t b, size_t e) {
      std::memcpy(z.data() + b, x.data() + b, (e - b) * sizeof(float));
    });
    return 2.0 * sizeof(float) * n;
  });
  p.memory_bytes =
      static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGESIZE));
  p.wall_s = seconds_since(t0);
  return p;
}

cost::Profile host_profile(const HostProbe& probe) {
  DeviceSpec d = device_spec(kHostCpuDevice);
  d.peak_fp32_flops = d.peak_tf32_flops = d.peak_bf16_flops = d.peak_fp16_flops = probe.sgemm_flops;
  d.peak_fp8_flops = 0;
  d.hbm_bw = probe.triad_bw;
  if (probe.memory_bytes > 0) d.hbm_bytes = probe.memory_bytes;
  cost::Profile p = cost::default_profile(d);
  p.measured_device = d;
  constexpr double kNominalLinkBw = 12e9;    // the localhost preset's shm and host-copy links
  const double payload = probe.copy_bw / 2;  // memcpy bytes moved per second
  p.host_copy_efficiency = std::clamp(payload / kNominalLinkBw, 0.01, 1.0);
  p.link_efficiency[static_cast<int>(LinkKind::kShm)] =
      std::clamp(0.5 * payload / kNominalLinkBw, 0.01, 1.0);
  std::string link = "";
  if (probe.link_ranks >= 2 && !probe.all_reduce.empty()) {
    const auto [eff, latency] = fit_shm_link(probe, p);
    p.link_efficiency[static_cast<int>(LinkKind::kShm)] = eff;
    p.collective_step_latency_s = latency;
    link = ", MPI all-reduce over " + std::to_string(probe.link_ranks) +
           " ranks (shm link efficiency and step latency fitted)";
  }
  char host[256] = "this host";
  gethostname(host, sizeof host - 1);
  p.source =
      std::string("parasol calibrate --probe on ") + host + ": cblas_sgemm " +
      fmt("%.1f", probe.sgemm_flops / 1e9) + " GFLOP/s (n = " + std::to_string(probe.sgemm_n) +
      ", " + std::to_string(probe.threads) + " thread(s)), triad " +
      fmt("%.1f", probe.triad_bw / 1e9) + " GB/s, memcpy " + fmt("%.1f", probe.copy_bw / 1e9) +
      " GB/s" + link + "; other figures: parasol's cpu-host defaults";
  return p;
}

std::pair<double, double> fit_shm_link(const HostProbe& probe, const cost::Profile& base) {
  const Cluster cluster = cluster_preset("localhost", probe.link_ranks);
  std::vector<int> group(probe.link_ranks);
  for (int i = 0; i < probe.link_ranks; ++i) group[i] = i;
  constexpr int kShm = static_cast<int>(LinkKind::kShm);
  traces::LsqProblem problem;
  // x = (link efficiency, step latency in microseconds): residuals log(predicted / measured).
  problem.residuals = [&](const std::vector<double>& x, std::vector<double>& r) {
    cost::Profile p = base;
    p.link_efficiency[kShm] = x[0];
    p.collective_step_latency_s = x[1] * 1e-6;
    const cost::GroupModel g(cluster, p, group);
    r.clear();
    for (const auto& [bytes, seconds] : probe.all_reduce)
      r.push_back(std::log(g.cost(cost::Collective::kAllReduce, bytes).time_s / seconds));
  };
  problem.lower = {0.01, 0};
  problem.upper = {1, 1000};
  problem.step = {1e-4, 1e-3};
  const traces::LsqResult fit = traces::solve_bounded_least_squares(
      problem, {base.link_efficiency[kShm], base.collective_step_latency_s * 1e6});
  return {fit.x[0], fit.x[1] * 1e-6};
}

}  // namespace parasol::tools
