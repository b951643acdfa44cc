// Tests of calibration (traces/calibrate.h), the honest way: a plan simulated with a known
// Profile A gives the "measured" trace; calibrating the default Profile on it must recover A's
// parameters and, re-simulated, the measured step time. On an H100 cluster and on the CPU
// runtime's localhost preset, exactly and with noisy measurements of every rank; and the
// rejection of traces of another program, of another device, and of traces with nothing to fit.
#include "traces/calibrate.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "core/error.h"
#include "core/lower.h"
#include "core/rank_layout.h"
#include "sim/engine.h"
#include "traces/summary.h"

namespace parasol::traces {
namespace {

MeasuredRun measured_run(const std::string& model, const std::string& cluster, int gpus,
                         const Plan& plan, const cost::Profile& truth) {
  MeasuredRun r{"measured.json", model_preset(model), cluster_preset(cluster, gpus), plan, {}};
  validate(plan, r.model, r.cluster);
  r.trace = sim::simulate(r.model, r.cluster, lower(r.model, r.cluster, plan), truth, true).trace;
  r.trace.source = "measured";
  return r;
}

Plan plan_of(int tp, int pp, int dp, int mbs, int gbs) {
  Plan p;
  p.tp = tp;
  p.pp = pp;
  p.dp = dp;
  p.micro_batch = mbs;
  p.global_batch = gbs;
  return p;
}

const FittedParam& param(const Calibration& c, const std::string& name) {
  for (const FittedParam& p : c.params)
    if (p.name == name) return p;
  throw std::runtime_error("no parameter " + name);
}

double step_time(const MeasuredRun& r, const cost::Profile& p) {
  return sim::simulate(r.model, r.cluster, lower(r.model, r.cluster, r.plan), p, false).step_time_s;
}

// Every rank of the run's plan with its stage representative's events, each duration times a
// lognormal factor of `sigma` (the start times keep their order).
Trace noisy_every_rank(const MeasuredRun& run, double sigma, unsigned seed) {
  RankLayout layout(run.plan);
  std::mt19937 rng(seed);
  std::normal_distribution<double> n(0, sigma);
  Trace m;
  m.source = "measured";
  for (int r = 0; r < layout.world(); ++r) {
    RankCoord rep{};
    rep.pp = layout.coord(r).pp;
    for (const TraceEvent& e : run.trace.events)
      if (e.rank == layout.rank(rep)) {
        TraceEvent x = e;
        x.rank = r;
        x.dur_s *= std::exp(n(rng));
        m.events.push_back(x);
      }
  }
  return m;
}

// The H100 defaults (NCCL latencies, the sustained clock, the overlap slowdown) with other
// fitted figures. gemm_eff() is the burst efficiency at the sustained clock.
cost::Profile h100_truth() {
  cost::Profile a = cost::default_profile(device_spec("H100-SXM"));
  a.gemm_efficiency = 0.55;
  a.memory_efficiency = 0.4;
  a.link_efficiency[static_cast<int>(LinkKind::kNvswitch)] = 0.6;
  a.kernel_overhead_s = 5e-6;
  a.collective_step_latency_s = 8e-6;
  // The reduction-depth factor k / (k + k_half): 4x the default's 32, so that a short-k GEMM
  // (gpt2's 384-column row-parallel input under tp 2) runs at 0.75 of its long-k rate instead
  // of 0.92.
  a.gemm_k_half = 128;
  return a;
}

TEST(Calibrate, RecoversTheProfileOfASimulatedRun) {
  const cost::Profile truth = h100_truth();
  const MeasuredRun run = measured_run("gpt2-124m", "dgx-h100", 8, plan_of(2, 2, 2, 2, 16), truth);
  const cost::Profile base = cost::default_profile(device_spec("H100-SXM"));
  Calibration c = calibrate({run}, base);
  EXPECT_GT(c.samples, 1000);
  EXPECT_GT(c.skipped, 0);  // receives at least
  EXPECT_GT(c.rms_log_error_before, 0.1);
  EXPECT_LT(c.rms_log_error_after, 1e-3);
  const cost::Profile& f = c.profile;
  EXPECT_NEAR(f.gemm_eff(Dtype::kBf16), truth.gemm_eff(Dtype::kBf16), 0.01 * 0.55);
  EXPECT_NEAR(f.memory_efficiency, 0.4, 0.01 * 0.4);
  EXPECT_NEAR(f.link_eff(LinkKind::kNvswitch), 0.6, 0.01 * 0.6);
  EXPECT_NEAR(f.kernel_overhead_s, 5e-6, 0.02 * 5e-6);
  EXPECT_NEAR(f.collective_step_latency_s, 8e-6, 0.02 * 8e-6);
  ASSERT_GT(truth.gemm_k_half, 2 * base.gemm_k_half);  // a parameter the fit must move
  EXPECT_NEAR(f.gemm_k_half, truth.gemm_k_half, 0.02 * truth.gemm_k_half);
  // The fit went into bf16's own entry; the scalar stays the base's.
  EXPECT_DOUBLE_EQ(f.gemm_efficiency, base.gemm_efficiency);
  // What the traces do not cover keeps the base value.
  EXPECT_EQ(param(c, "host_copy_efficiency").samples, 0);
  EXPECT_DOUBLE_EQ(f.host_copy_efficiency, base.host_copy_efficiency);
  EXPECT_EQ(param(c, "link_efficiency.pcie").samples, 0);
  EXPECT_DOUBLE_EQ(f.link_eff(LinkKind::kPcie), base.link_eff(LinkKind::kPcie));
  EXPECT_DOUBLE_EQ(f.host_adam_params_per_s, base.host_adam_params_per_s);
  EXPECT_EQ(f.device, "H100-SXM");
  EXPECT_EQ(f.traces, std::vector<std::string>{"measured.json"});
  // Re-simulated with the fitted profile, the plan takes the measured step time.
  const double measured = summarize(run.trace).step_time_s;
  EXPECT_NEAR(step_time(run, f), measured, 0.005 * measured);
  EXPECT_GT(std::abs(step_time(run, base) / measured - 1), 0.1);  // and the base did not
  // The report's JSON.
  Json j = calibration_to_json(c);
  EXPECT_EQ(j["samples"].get<int>(), c.samples);
  EXPECT_EQ(j["params"].size(), c.params.size());
}

TEST(Calibrate, RecoversTheHostCpuProfileOnLocalhost) {
  cost::Profile truth = cost::default_profile(device_spec(kHostCpuDevice));
  truth.gemm_efficiency = 0.5;
  truth.memory_efficiency = 0.35;
  truth.link_efficiency[static_cast<int>(LinkKind::kShm)] = 0.7;
  truth.kernel_overhead_s = 2e-6;
  truth.collective_step_latency_s = 3e-6;
  const MeasuredRun run = measured_run("tiny", "localhost", 4, plan_of(2, 1, 2, 2, 8), truth);
  Calibration c = calibrate({run}, cost::default_profile(device_spec(kHostCpuDevice)));
  const cost::Profile& f = c.profile;
  EXPECT_NEAR(f.gemm_eff(Dtype::kBf16), 0.5, 0.01 * 0.5);
  EXPECT_NEAR(f.memory_efficiency, 0.35, 0.01 * 0.35);
  EXPECT_NEAR(f.link_eff(LinkKind::kShm), 0.7, 0.01 * 0.7);
  EXPECT_NEAR(f.collective_step_latency_s, 3e-6, 0.02 * 3e-6);
  const double measured = summarize(run.trace).step_time_s;
  EXPECT_NEAR(step_time(run, f), measured, 0.005 * measured);
}

// A transfer that runs beside compute is seen complete only when the runtime next polls it,
// after the compute op: its measured duration is the compute's. Such transfers are not fitted,
// so stretching them (as the CPU runtime measures them) leaves the fitted link as it was.
TEST(Calibrate, TransfersBesideComputeAreNotFitted) {
  cost::Profile truth = cost::default_profile(device_spec(kHostCpuDevice));
  truth.link_efficiency[static_cast<int>(LinkKind::kShm)] = 0.7;
  truth.collective_step_latency_s = 3e-6;
  MeasuredRun run = measured_run("tiny", "localhost", 4, plan_of(2, 1, 2, 2, 8), truth);
  const cost::Profile base = cost::default_profile(device_spec(kHostCpuDevice));
  int stretched = 0;
  for (TraceEvent& e : run.trace.events) {
    if (e.group.empty()) continue;  // communication only
    bool beside_compute = false;
    for (const TraceEvent& o : run.trace.events)
      if (o.rank == e.rank && o.group.empty() && o.kind != "offload" && o.kind != "prefetch" &&
          o.start_s < e.end_s() && o.end_s() > e.start_s)
        beside_compute = true;
    if (beside_compute) {
      e.dur_s *= 10;
      ++stretched;
    }
  }
  ASSERT_GT(stretched, 0);  // the plan's data-parallel buckets overlap its backward pass
  const Calibration c = calibrate({run}, base);
  EXPECT_NEAR(c.profile.link_eff(LinkKind::kShm), 0.7, 0.01 * 0.7);
  EXPECT_NEAR(c.profile.collective_step_latency_s, 3e-6, 0.02 * 3e-6);
}

TEST(Calibrate, NoisyMeasurementsOfEveryRank) {
  // 5% noise on every op of every rank: the fit lands near the truth and predicts the step.
  const cost::Profile truth = h100_truth();
  MeasuredRun run = measured_run("gpt2-124m", "dgx-h100", 8, plan_of(2, 2, 2, 2, 16), truth);
  const double measured = summarize(run.trace).step_time_s;
  run.trace = noisy_every_rank(run, 0.05, 11);
  Calibration c = calibrate({run}, cost::default_profile(device_spec("H100-SXM")));
  const cost::Profile& f = c.profile;
  EXPECT_NEAR(f.gemm_eff(Dtype::kBf16), truth.gemm_eff(Dtype::kBf16), 0.05 * 0.55);
  EXPECT_NEAR(f.memory_efficiency, 0.4, 0.05 * 0.4);
  EXPECT_NEAR(f.link_eff(LinkKind::kNvswitch), 0.6, 0.1 * 0.6);
  EXPECT_NEAR(step_time(run, f), measured, 0.05 * measured);
}

TEST(Calibrate, FitsSeveralRunsTogether) {
  // Two plans of one model: together they pin the same parameters.
  const cost::Profile truth = h100_truth();
  std::vector<MeasuredRun> runs = {
      measured_run("gpt2-124m", "dgx-h100", 8, plan_of(2, 2, 2, 2, 16), truth),
      measured_run("gpt2-124m", "dgx-h100", 8, plan_of(4, 1, 2, 1, 4), truth)};
  runs[1].name = "second.json";
  Calibration c = calibrate(runs, cost::default_profile(device_spec("H100-SXM")));
  EXPECT_NEAR(c.profile.gemm_eff(Dtype::kBf16), truth.gemm_eff(Dtype::kBf16), 0.01 * 0.55);
  EXPECT_EQ(c.profile.traces.size(), 2u);
  for (const MeasuredRun& r : runs) {
    const double m = summarize(r.trace).step_time_s;
    EXPECT_NEAR(step_time(r, c.profile), m, 0.005 * m) << r.name;
  }
}

std::string error_field(const std::vector<MeasuredRun>& runs, const cost::Profile& base) {
  try {
    calibrate(runs, base);
  } catch (const Error& e) {
    return e.field();
  }
  return "";
}

TEST(Calibrate, RejectsTracesOfAnotherProgramOrDevice) {
  const cost::Profile truth = h100_truth();
  const cost::Profile base = cost::default_profile(device_spec("H100-SXM"));
  const Plan plan = plan_of(2, 2, 2, 2, 16);
  // A trace of another model, said to be of this plan.
  MeasuredRun run = measured_run("gpt2-124m", "dgx-h100", 8, plan, truth);
  MeasuredRun other = measured_run("tiny-gpt", "dgx-h100", 8, plan, truth);
  MeasuredRun wrong = run;
  wrong.trace = other.trace;
  EXPECT_NE(error_field({wrong}, base).find("measured.json.ranks["), std::string::npos);
  // Op ids beyond the Program.
  MeasuredRun shifted = run;
  for (TraceEvent& e : shifted.trace.events) e.op_id += 1000000;
  EXPECT_NE(error_field({shifted}, base).find("measured.json.ranks["), std::string::npos);
  // Ranks outside the plan.
  MeasuredRun far = run;
  for (TraceEvent& e : far.trace.events) e.rank += 64;
  EXPECT_NE(error_field({far}, base).find("measured.json.ranks["), std::string::npos);
  // No op ids at all.
  MeasuredRun bare = run;
  for (TraceEvent& e : bare.trace.events) e.op_id = -1;
  EXPECT_EQ(error_field({bare}, base), "measured.json");
  // Nothing to fit: only receives.
  MeasuredRun recvs = run;
  std::erase_if(recvs.trace.events, [](const TraceEvent& e) { return e.kind != "recv"; });
  EXPECT_EQ(error_field({recvs}, base), "traces");
  // A base profile of another device; no runs.
  EXPECT_EQ(error_field({run}, cost::default_profile(device_spec("A100-80G"))), "profile.device");
  EXPECT_EQ(error_field({}, base), "traces");
}

}  // namespace
}  // namespace parasol::traces
