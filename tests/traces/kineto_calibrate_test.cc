// Tests of calibration from imported PyTorch profiler traces (traces/calibrate.h's
// calibrate_imported) on the real GPU traces of tests/data/traces: the fit moves the figures its
// kernels depend on, lowers the kernels' weighted log error and brings the multi-rank trace's
// summed replay closer to it, collectives fit the link of the group
// that holds their ranks, by the margins stated below. GEMMs of another
// dtype than the plan's are not fitted; an fp32 job's tensor-core GEMMs fit the tf32 efficiency.
#include <gtest/gtest.h>

#include <cmath>

#include "core/error.h"
#include "cost_models/profile.h"
#include "traces/calibrate.h"
#include "traces/kineto_import.h"

namespace parasol::traces {
namespace {

const std::string kData = std::string(PARASOL_TEST_DATA_DIR) + "/traces/";

// The traced job as parasol must be told it: A100s, data parallel over the traced ranks, in the
// traces' precision (their GEMMs and elementwise kernels are fp32).
ImportedRun run_of(const std::vector<std::string>& files, int gpus, Dtype precision) {
  ImportedRun r;
  r.name = files.front();
  r.imported = import_kineto_files(files);
  r.model = model_preset("tiny");
  r.cluster = cluster_preset("dgx-a100-80g", gpus);
  r.plan.dp = gpus;
  r.plan.micro_batch = 1;
  r.plan.global_batch = gpus;
  r.plan.precision = precision;
  return r;
}

const FittedParam& param(const Calibration& c, const std::string& name) {
  for (const FittedParam& p : c.params)
    if (p.name == name) return p;
  throw std::runtime_error("no parameter " + name);
}

double rel_error(double predicted, double measured) {
  return std::fabs(predicted - measured) / measured;
}

TEST(KinetoCalibrate, FitOfTheMultiRankTraceLowersKernelErrorsAndReplaysCloser) {
  const ImportedRun run =
      run_of({kData + "hta_sampled_rank-0.json.gz", kData + "hta_sampled_rank-1.json.gz"}, 2,
             Dtype::kFp32);
  const cost::Profile base = cost::default_profile(run.cluster.gpu_device(0));
  const Calibration cal = calibrate_imported({run}, base);
  // GEMM shapes and memory-bound kernels with sizes: tens of distinct shapes.
  EXPECT_GE(cal.samples, 20);
  EXPECT_GT(cal.skipped, 0);  // unclassified kernels, copies, unsized collectives
  // The traced GEMMs are CUTLASS/cuBLAS tensor-core kernels on fp32 inputs: tf32 math.
  const FittedParam& gemm = param(cal, "gemm_efficiency.tf32");
  const FittedParam& mem = param(cal, "memory_efficiency");
  EXPECT_GT(gemm.samples, 0);
  EXPECT_GT(mem.samples, 0);
  // The fit moved what it fitted (by more than 1% of the base value).
  EXPECT_GT(std::fabs(gemm.fitted - gemm.base), 0.01 * gemm.base);
  EXPECT_GT(std::fabs(mem.fitted - mem.base), 0.01 * mem.base);
  // The figures that no imported kernel depends on are kept.
  EXPECT_EQ(param(cal, "host_adam_params_per_s").samples, 0);
  EXPECT_EQ(param(cal, "host_adam_params_per_s").fitted, param(cal, "host_adam_params_per_s").base);

  // The traced kernels re-predicted: their time-weighted RMS log error (calibrate.h) at least
  // 40% lower with the fitted profile than with the default one.
  EXPECT_LT(cal.rms_log_error_after, 0.6 * cal.rms_log_error_before)
      << cal.rms_log_error_before << " -> " << cal.rms_log_error_after;
  // Summed, the replayed kernel time is brought closer to the trace: the fitted profile's error
  // at most 3/4 of the default one's. The trace's skinny GEMMs (10-20 x 72-606 outputs, k =
  // 327,680) split their reduction across the SMs (cost_models/compute.cc's split-K); priced
  // without it they were 3x slower than measured even at efficiency 1, the fit stopped at that
  // bound and the summed replay moved away from the trace (+32% -> +53%).
  EXPECT_FALSE(gemm.at_bound);
  EXPECT_FALSE(mem.at_bound);
  ASSERT_GT(cal.replay_measured_s, 0);
  const double before = rel_error(cal.replay_base_s, cal.replay_measured_s);
  const double after = rel_error(cal.replay_fitted_s, cal.replay_measured_s);
  EXPECT_LT(after, 0.75 * before) << "replay error " << before << " -> " << after;
  EXPECT_FALSE(cal.replay_worse());
}

// The attention step that record_sdpa.py recorded with PyTorch on a CPU (tests/data/traces), set
// beside a bf16 job on the CPU runtime's host (localhost): the fit of its two attention shapes
// (forward, backward) brings the replay of the traced step's kernels at least 5x closer to the
// trace than the default profile (whose attention efficiencies are estimates for this host).
TEST(KinetoCalibrate, RecordedCpuSdpaTraceReplaysCloser) {
  ImportedRun r;
  r.name = kData + "sdpa_cpu_bf16.json.gz";
  r.imported = import_kineto_files({r.name});
  r.model = model_preset("tiny");
  r.cluster = cluster_preset("localhost", 1);
  r.plan.micro_batch = 1;
  r.plan.global_batch = 1;
  r.plan.precision = Dtype::kBf16;
  const cost::Profile base = cost::default_profile(r.cluster.gpu_device(0));
  const Calibration cal = calibrate_imported({r}, base);
  EXPECT_EQ(cal.samples, 2);
  EXPECT_EQ(param(cal, "flash_forward_efficiency").samples, 1);
  EXPECT_EQ(param(cal, "flash_backward_efficiency").samples, 1);
  ASSERT_GT(cal.replay_measured_s, 0);
  const double before = rel_error(cal.replay_base_s, cal.replay_measured_s);
  const double after = rel_error(cal.replay_fitted_s, cal.replay_measured_s);
  EXPECT_LT(after, 0.2 * before) << "replay error " << before << " -> " << after;
  EXPECT_FALSE(cal.replay_worse());
}

TEST(KinetoCalibrate, CollectivesOfTheTracedCommunicatorFitTheLink) {
  // Rank 0 of a 2-GPU job whose NCCL kernels carry their sizes and communicator (2 ranks): the
  // all-reduces and broadcasts are priced on the plan's 2-rank data-parallel group.
  const ImportedRun run = run_of({kData + "hta_nccl_step5_rank-0.json.gz"}, 2, Dtype::kFp32);
  const cost::Profile base = cost::default_profile(run.cluster.gpu_device(0));
  const Calibration cal = calibrate_imported({run}, base);
  int link_samples = 0;
  for (const FittedParam& p : cal.params)
    if (p.name.rfind("link_efficiency.", 0) == 0) link_samples += p.samples;
  EXPECT_GT(link_samples, 0);
  EXPECT_LT(cal.rms_log_error_after, cal.rms_log_error_before);
  // The traced collectives replayed: the fitted profile's error of their summed time at most a
  // quarter of the default profile's (an all-reduce kernel's time includes waiting for its peer,
  // which the default link figures do not price).
  const double before = rel_error(cal.replay_base_s, cal.replay_measured_s);
  const double after = rel_error(cal.replay_fitted_s, cal.replay_measured_s);
  EXPECT_LT(after, 0.25 * before) << "replay error " << before << " -> " << after;
}

// An imported trace of rank 0 of a tp = dp = 8 job on 8 DGX H100 nodes: three all-reduces of
// 64 MiB on a communicator of 8 whose ranks are `ranks` (empty: not stated), and one norm kernel
// with its bytes (so that there is something to fit whatever the collectives match).
ImportedRun tp8_dp8_run(const std::vector<int>& ranks) {
  ImportedRun r;
  r.name = "synthetic";
  r.model = model_preset("llama3-8b");
  r.cluster = cluster_preset("dgx-h100", 64);
  r.plan.tp = 8;
  r.plan.dp = 8;
  r.plan.micro_batch = 1;
  r.plan.global_batch = 8;
  r.plan.precision = Dtype::kBf16;
  for (int i = 0; i < 4; ++i) {
    TraceEvent e;
    e.rank = 0;
    e.start_s = i * 0.01;
    KernelShape s;
    if (i < 3) {
      e.kind = "all-reduce";
      e.name = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL";
      e.stream = 20;
      e.bytes = 64.0 * (1 << 20);
      e.dur_s = 2e-3;
      s.group_size = 8;
      s.group_ranks = ranks;
      s.dtype = "bf16";
      s.elements = e.bytes / 2;
    } else {
      e.kind = "norm";
      e.name = "vectorized_layer_norm_kernel";
      e.stream = 7;
      e.bytes = 3e8;
      e.dur_s = 2e-4;
    }
    r.imported.trace.events.push_back(e);
    r.imported.shapes.push_back(s);
  }
  return r;
}

int link_samples(const Calibration& c, const std::string& kind) {
  for (const FittedParam& p : c.params)
    if (p.name == "link_efficiency." + kind) return p.samples;
  return 0;
}

TEST(KinetoCalibrate, CollectivesMatchThePlanGroupOfTheirStatedRanks) {
  // Megatron's order (tp fastest): rank 0's tensor-parallel group is ranks 0-7 in its node
  // (NVLink), its data-parallel group 0, 8, ..., 56 across the nodes (InfiniBand). Both have 8
  // ranks: the trace's rank list tells them apart.
  const cost::Profile base = cost::default_profile(cluster_preset("dgx-h100", 8).gpu_device(0));
  const Calibration dp = calibrate_imported({tp8_dp8_run({0, 8, 16, 24, 32, 40, 48, 56})}, base);
  EXPECT_GT(link_samples(dp, "infiniband"), 0);
  const Calibration tp = calibrate_imported({tp8_dp8_run({0, 1, 2, 3, 4, 5, 6, 7})}, base);
  EXPECT_EQ(link_samples(tp, "infiniband"), 0);
  EXPECT_GT(link_samples(tp, "nvlink") + link_samples(tp, "nvswitch"), 0);
  // Without ranks, a communicator of 8 could be either group: it is not fitted to one by its size.
  const Calibration unknown = calibrate_imported({tp8_dp8_run({})}, base);
  for (const FittedParam& p : unknown.params) {
    if (p.name.rfind("link_efficiency.", 0) == 0) {
      EXPECT_EQ(p.samples, 0) << p.name;
    }
  }
  EXPECT_EQ(unknown.samples, 1);  // the norm
  // Ranks that no group of the plan holds are not fitted either.
  const Calibration none = calibrate_imported({tp8_dp8_run({0, 3, 9, 12, 17, 30, 33, 60})}, base);
  EXPECT_EQ(none.samples, 1);
}

// Imported attention is priced with its mask as the trace states it: a causal forward of
// S = 4096 does half the (query, key) pairs of a non-causal one, so the default profile replays
// it in about half the time (831d25e priced every imported attention non-causal, and a causal
// model's flash efficiency fitted about 2x high).
TEST(KinetoCalibrate, AttentionIsPricedWithTheMaskTheTraceStates) {
  auto run_with = [](int causal) {
    ImportedRun r = tp8_dp8_run({});
    r.imported.trace.events.resize(1);
    r.imported.shapes.resize(1);
    TraceEvent& e = r.imported.trace.events[0];
    e.kind = "attention";
    e.name = "void flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false>>";
    e.stream = 7;
    e.dur_s = 1e-3;
    KernelShape& s = r.imported.shapes[0];
    s = KernelShape();
    s.attn_batch = 1, s.heads = 32, s.kv_heads = 8, s.seq_q = 4096, s.seq_kv = 4096;
    s.head_dim = 128, s.causal = causal, s.dtype = "bf16";
    e.flops = attention_kernel_flops(s);
    return r;
  };
  const cost::Profile base = cost::default_profile(cluster_preset("dgx-h100", 64).gpu_device(0));
  const Calibration causal = calibrate_imported({run_with(1)}, base);
  const Calibration full = calibrate_imported({run_with(0)}, base);
  ASSERT_GT(causal.replay_base_s, 0);
  const double ratio = causal.replay_base_s / full.replay_base_s;
  EXPECT_GT(ratio, 0.45) << ratio;
  EXPECT_LT(ratio, 0.6) << ratio;
  // The same measured time asks a causal kernel for about half the efficiency.
  EXPECT_LT(param(causal, "flash_forward_efficiency").fitted,
            0.7 * param(full, "flash_forward_efficiency").fitted);
}

TEST(KinetoCalibrate, NothingToFitSaysWhyEachKernelWasLeftOut) {
  // The tp = dp = 8 run with no ranks on its all-reduces and no bytes on its norm (as an Nsight
  // Systems report gives them): nothing can be priced, and the error says why, kernel by kernel.
  ImportedRun r = tp8_dp8_run({});
  r.imported.trace.events.back().bytes = 0;
  const cost::Profile base = cost::default_profile(r.cluster.gpu_device(0));
  std::string msg;
  try {
    calibrate_imported({r}, base);
  } catch (const Error& e) {
    msg = e.what();
  }
  EXPECT_NE(msg.find("no kernel of the traces can be priced by the plan (3 a communicator no "
                     "group of the plan is, 1 no shape or size)"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("record_shapes=True"), std::string::npos) << msg;
  // A GEMM recorded without shapes has no dtype either: it is left out for its missing shape
  // (HTA's df_index_resolver trace, recorded without record_shapes, said "3535 no dtype").
  TraceEvent gemm = r.imported.trace.events.back();
  gemm.kind = "linear";
  gemm.name = "volta_sgemm_128x32_nt";
  r.imported.trace.events.back() = gemm;
  msg.clear();
  try {
    calibrate_imported({r}, base);
  } catch (const Error& e) {
    msg = e.what();
  }
  EXPECT_NE(msg.find("1 no shape or size)"), std::string::npos) << msg;
  EXPECT_EQ(msg.find("no dtype"), std::string::npos) << msg;
}

TEST(KinetoCalibrate, GemmsOfAnotherPrecisionAreNotFitted) {
  // The traces' GEMMs ran fp32 inputs (tf32 math): a bf16 plan prices none of them, while the
  // memory-bound kernels, priced by their bytes, still fit.
  const ImportedRun run =
      run_of({kData + "hta_sampled_rank-0.json.gz", kData + "hta_sampled_rank-1.json.gz"}, 2,
             Dtype::kBf16);
  const cost::Profile base = cost::default_profile(run.cluster.gpu_device(0));
  const Calibration cal = calibrate_imported({run}, base);
  EXPECT_EQ(param(cal, "gemm_efficiency.bf16").samples, 0);
  for (const FittedParam& p : cal.params) EXPECT_NE(p.name, "gemm_efficiency.tf32");
  EXPECT_GT(param(cal, "memory_efficiency").samples, 0);
}

}  // namespace
}  // namespace parasol::traces
