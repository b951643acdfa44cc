// Tests calibration profiles (cost_models/profile.h): defaults, JSON round trip, loading.
#include "cost_models/profile.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "core/device.h"
#include "core/error.h"

namespace parasol::cost {
namespace {

void expect_fraction(double v, const std::string& what) {
  EXPECT_GT(v, 0) << what;
  EXPECT_LE(v, 1) << what;
}

TEST(DefaultProfile, EveryKnownDeviceHasEfficienciesInUnitInterval) {
  ASSERT_FALSE(known_devices().empty());
  for (const std::string& name : known_devices()) {
    const DeviceSpec& d = device_spec(name);
    Profile p = default_profile(d);
    EXPECT_EQ(p.device, d.name);
    EXPECT_FALSE(p.source.empty());
    expect_fraction(p.gemm_efficiency, name + " gemm");
    expect_fraction(p.memory_efficiency, name + " memory");
    expect_fraction(p.flash_forward_efficiency, name + " flash fwd");
    expect_fraction(p.flash_backward_efficiency, name + " flash bwd");
    expect_fraction(p.host_copy_efficiency, name + " host copy");
    for (double e : p.link_efficiency) expect_fraction(e, name + " link");
    EXPECT_GE(p.gemm_k_half, 0) << name;  // 0: no reduction-depth factor (profile.h)
    EXPECT_GE(p.kernel_overhead_s, 0) << name;
    EXPECT_LT(p.kernel_overhead_s, 1e-4) << name;
    EXPECT_GE(p.collective_step_latency_s, 0) << name;
    EXPECT_GT(p.host_adam_params_per_s, 0) << name;
    // FlashAttention's backward reaches a smaller fraction of peak than its forward.
    EXPECT_LE(p.flash_backward_efficiency, p.flash_forward_efficiency) << name;
  }
}

// DeepSpeed's CPU-Adam per host core: the ZeRO-Offload tutorial's log (10.3e9 parameters in a
// 6217-6479 ms optimizer_step on a DGX-2's 48 Xeon 8168 cores, AVX-512) prices the V100 server;
// DGX A100's 128 EPYC 7742 cores have AVX2 only, where the kernel takes 8 floats a vector
// instruction instead of 16 (DeepSpeed csrc/includes/simd.h).
TEST(DefaultProfile, CpuAdamPerCoreFollowsTheHostsVectorWidth) {
  const double tutorial_per_core = 10.3e9 / ((6.217 + 6.479) / 2) / 48;
  const Profile v100 = default_profile(device_spec("V100-32G"));
  const Profile a100 = default_profile(device_spec("A100-80G"));
  EXPECT_NEAR(v100.host_adam_params_per_s / 48, tutorial_per_core, 0.01 * tutorial_per_core);
  EXPECT_NEAR(a100.host_adam_params_per_s / 128, tutorial_per_core * 8 / 16,
              0.01 * tutorial_per_core);
  // H100 servers' Xeon 8480C cores have AVX-512: the tutorial's rate, 112 of them.
  const Profile h100 = default_profile(device_spec("H100-SXM"));
  EXPECT_NEAR(h100.host_adam_params_per_s / 112, tutorial_per_core, 0.01 * tutorial_per_core);
}

// Data-parallel collectives beside compute: Hopper's persistent cuBLAS GEMMs take 2x as long
// beside NCCL (pytorch/pytorch#143988), compute at half speed; elsewhere the general figure.
TEST(DefaultProfile, DataParallelOverlapSlowdownIsHoppersWaveQuantization) {
  for (const char* hopper : {"H100-SXM", "H200", "H800-SXM"})
    EXPECT_DOUBLE_EQ(default_profile(device_spec(hopper)).dp_overlap_compute_slowdown, 1 - 1 / 2.0)
        << hopper;
  for (const char* other : {"A100-80G", "B200", "V100-32G"}) {
    const Profile p = default_profile(device_spec(other));
    EXPECT_DOUBLE_EQ(p.dp_overlap_compute_slowdown, p.overlap_compute_slowdown) << other;
  }
}

TEST(DefaultProfile, LinkEffIndexesByKind) {
  Profile p = default_profile(device_spec("H100-SXM"));
  p.link_efficiency = {0.1, 0.2, 0.3, 0.4, 0.5, 0.6};
  EXPECT_DOUBLE_EQ(p.link_eff(LinkKind::kNvlink), 0.1);
  EXPECT_DOUBLE_EQ(p.link_eff(LinkKind::kNvswitch), 0.2);
  EXPECT_DOUBLE_EQ(p.link_eff(LinkKind::kPcie), 0.3);
  EXPECT_DOUBLE_EQ(p.link_eff(LinkKind::kInfiniband), 0.4);
  EXPECT_DOUBLE_EQ(p.link_eff(LinkKind::kEthernet), 0.5);
  EXPECT_DOUBLE_EQ(p.link_eff(LinkKind::kShm), 0.6);
}

TEST(DefaultProfile, GemmEfficiencyPerDtypeFallsBackToTheScalar) {
  Profile p = default_profile(device_spec("H100-SXM"));
  p.gemm_efficiency = 0.7;
  p.gemm_efficiency_by_dtype[static_cast<int>(Dtype::kFp8)] = 0.5;
  p.sustained_clock = 0.8;
  // The burst efficiency at the sustained clock.
  EXPECT_DOUBLE_EQ(p.gemm_eff(Dtype::kBf16), 0.7 * 0.8);
  EXPECT_DOUBLE_EQ(p.gemm_eff(Dtype::kFp8), 0.5 * 0.8);
}

Profile odd_profile() {
  Profile p = default_profile(device_spec("A100-80G"));
  p.source = "calibrated from two traces";
  p.gemm_efficiency = 0.71;
  p.gemm_k_half = 48;
  p.memory_efficiency = 0.66;
  p.flash_forward_efficiency = 0.55;
  p.flash_backward_efficiency = 0.41;
  p.kernel_overhead_s = 4.5e-6;
  p.link_efficiency = {0.61, 0.62, 0.63, 0.64, 0.65, 0.66};
  p.gemm_efficiency_by_dtype[static_cast<int>(Dtype::kFp8)] = 0.52;
  p.collective_step_latency_s = 7e-6;
  p.host_copy_efficiency = 0.7;
  p.host_adam_params_per_s = 2.5e9;
  p.traces = {"a.json", "b.json"};
  p.sustained_clock = 0.81;
  p.overlap_compute_slowdown = 0.13;
  p.dp_overlap_compute_slowdown = 0.41;
  p.expert_exchange_nvlink_efficiency = 0.57;
  p.cudnn_forward_efficiency = 0.58;
  p.cudnn_backward_efficiency = 0.44;
  p.attention_shape[static_cast<int>(AttentionKernel::kCudnn)][1] = {310, 650, 0.97, 0.8, 1.05};
  p.fa3_forward_efficiency = 0.66;
  p.fa3_backward_efficiency = 0.57;
  p.attention_shape[Profile::attention_slot(AttentionKernel::kFa3)][0] = {190, 560, 0.96, 0.75,
                                                                          1.15};
  p.nccl->net_overhead_s = 3e-6;
  p.nccl->hw_latency_s[NcclTuning::kNet][NcclTuning::kRing][NcclTuning::kSimple] = 17e-6;
  p.nccl->ll_max_bw[2] = 21e9;
  return p;
}

void expect_same(const Profile& a, const Profile& b) {
  EXPECT_EQ(a.device, b.device);
  EXPECT_EQ(a.source, b.source);
  EXPECT_DOUBLE_EQ(a.gemm_efficiency, b.gemm_efficiency);
  EXPECT_DOUBLE_EQ(a.gemm_k_half, b.gemm_k_half);
  EXPECT_DOUBLE_EQ(a.memory_efficiency, b.memory_efficiency);
  EXPECT_DOUBLE_EQ(a.flash_forward_efficiency, b.flash_forward_efficiency);
  EXPECT_DOUBLE_EQ(a.flash_backward_efficiency, b.flash_backward_efficiency);
  EXPECT_DOUBLE_EQ(a.kernel_overhead_s, b.kernel_overhead_s);
  for (int i = 0; i < kLinkKinds; ++i) EXPECT_DOUBLE_EQ(a.link_efficiency[i], b.link_efficiency[i]);
  for (int i = 0; i < 5; ++i)
    EXPECT_DOUBLE_EQ(a.gemm_efficiency_by_dtype[i], b.gemm_efficiency_by_dtype[i]);
  ASSERT_EQ(a.measured_device.has_value(), b.measured_device.has_value());
  if (a.measured_device) {
    EXPECT_EQ(a.measured_device->name, b.measured_device->name);
    EXPECT_DOUBLE_EQ(a.measured_device->peak_fp32_flops, b.measured_device->peak_fp32_flops);
    EXPECT_DOUBLE_EQ(a.measured_device->hbm_bw, b.measured_device->hbm_bw);
    EXPECT_DOUBLE_EQ(a.measured_device->hbm_bytes, b.measured_device->hbm_bytes);
  }
  EXPECT_DOUBLE_EQ(a.collective_step_latency_s, b.collective_step_latency_s);
  EXPECT_DOUBLE_EQ(a.host_copy_efficiency, b.host_copy_efficiency);
  EXPECT_DOUBLE_EQ(a.host_adam_params_per_s, b.host_adam_params_per_s);
  EXPECT_EQ(a.traces, b.traces);
  EXPECT_DOUBLE_EQ(a.sustained_clock, b.sustained_clock);
  EXPECT_DOUBLE_EQ(a.overlap_compute_slowdown, b.overlap_compute_slowdown);
  EXPECT_DOUBLE_EQ(a.dp_overlap_compute_slowdown, b.dp_overlap_compute_slowdown);
  EXPECT_DOUBLE_EQ(a.expert_exchange_nvlink_efficiency, b.expert_exchange_nvlink_efficiency);
  EXPECT_DOUBLE_EQ(a.cudnn_forward_efficiency, b.cudnn_forward_efficiency);
  EXPECT_DOUBLE_EQ(a.cudnn_backward_efficiency, b.cudnn_backward_efficiency);
  EXPECT_DOUBLE_EQ(a.fa3_forward_efficiency, b.fa3_forward_efficiency);
  EXPECT_DOUBLE_EQ(a.fa3_backward_efficiency, b.fa3_backward_efficiency);
  for (int k = 0; k < 3; ++k)
    for (int pass = 0; pass < 2; ++pass) {
      const Profile::AttentionShape &x = a.attention_shape[k][pass],
                                    &y = b.attention_shape[k][pass];
      EXPECT_DOUBLE_EQ(x.s_half, y.s_half);
      EXPECT_DOUBLE_EQ(x.causal_s_half, y.causal_s_half);
      EXPECT_DOUBLE_EQ(x.causal_plateau, y.causal_plateau);
      EXPECT_DOUBLE_EQ(x.head_dim_64, y.head_dim_64);
      EXPECT_DOUBLE_EQ(x.head_dim_256, y.head_dim_256);
    }
  ASSERT_EQ(a.nccl.has_value(), b.nccl.has_value());
  if (a.nccl) {
    EXPECT_NEAR(a.nccl->net_overhead_s, b.nccl->net_overhead_s, 1e-15);
    for (int t = 0; t < 3; ++t)
      for (int al = 0; al < 3; ++al)
        for (int pr = 0; pr < 3; ++pr) {
          EXPECT_NEAR(a.nccl->hw_latency_s[t][al][pr], b.nccl->hw_latency_s[t][al][pr], 1e-15);
          if (t == 0) {
            EXPECT_NEAR(a.nccl->base_latency_s[al][pr], b.nccl->base_latency_s[al][pr], 1e-15);
          }
        }
    for (int i = 0; i < 3; ++i) EXPECT_DOUBLE_EQ(a.nccl->ll_max_bw[i], b.nccl->ll_max_bw[i]);
  }
}

TEST(DefaultProfile, NcclTuningIsNcclsOwnOnGpusAndAbsentForMpi) {
  // NVIDIA/nccl src/graph/tuning.cc: Simple ring base latency 8.4 us, 3.4 us per NVLink step,
  // 14 us per network step; DGX A100 hosts are AMD (2 us network overhead), DGX H100 Intel (1).
  Profile a = default_profile(device_spec("A100-80G"));
  ASSERT_TRUE(a.nccl.has_value());
  EXPECT_NEAR(a.nccl->base_latency_s[NcclTuning::kRing][NcclTuning::kSimple], 8.4e-6, 1e-12);
  EXPECT_NEAR(a.nccl->hw_latency_s[NcclTuning::kNvlink][NcclTuning::kRing][NcclTuning::kSimple],
              3.4e-6, 1e-12);
  EXPECT_NEAR(a.nccl->hw_latency_s[NcclTuning::kNet][NcclTuning::kRing][NcclTuning::kSimple], 14e-6,
              1e-12);
  EXPECT_NEAR(a.nccl->net_overhead_s, 2e-6, 1e-12);
  EXPECT_NEAR(default_profile(device_spec("H100-SXM")).nccl->net_overhead_s, 1e-6, 1e-12);
  EXPECT_FALSE(default_profile(device_spec(kHostCpuDevice)).nccl.has_value());
  // "nccl": false turns it off; an object overrides fields.
  Json j = profile_to_json(a);
  j["nccl"] = false;
  EXPECT_FALSE(profile_from_json(j).nccl.has_value());
  j["nccl"] = {{"net_overhead_us", 5}};
  EXPECT_NEAR(profile_from_json(j).nccl->net_overhead_s, 5e-6, 1e-12);
  j["nccl"] = {{"hw_latency_us", Json::array({1, 2})}};
  EXPECT_THROW(profile_from_json(j), Error);
}

TEST(ProfileJson, RoundTrip) {
  const Profile p = odd_profile();
  Json j = profile_to_json(p);
  EXPECT_DOUBLE_EQ(j["kernel_overhead_us"].get<double>(), 4.5);  // units in the key
  EXPECT_DOUBLE_EQ(j["link_efficiency"]["infiniband"].get<double>(), 0.64);
  expect_same(profile_from_json(j), p);
  // Through text as well.
  expect_same(profile_from_json(Json::parse(j.dump())), p);
  // And the defaults of every device.
  for (const std::string& name : known_devices()) {
    Profile d = default_profile(device_spec(name));
    expect_same(profile_from_json(profile_to_json(d)), d);
  }
}

// The document a profile writes reads back to one that writes the same document, for every
// device's defaults, with a measured datasheet, and for a CPU device given NCCL tuning (which the
// structure sweep found drifting by an ulp per round trip: 6.8 us written as 6.799999999999998).
TEST(ProfileJson, WritingWhatWasReadWritesTheSameDocument) {
  for (const std::string& name : known_devices()) {
    SCOPED_TRACE(name);
    Profile d = default_profile(device_spec(name));
    d.measured_device = device_spec(name);
    const Json j = profile_to_json(d);
    EXPECT_EQ(profile_to_json(profile_from_json(j)), j);
    EXPECT_EQ(profile_to_json(profile_from_json(Json::parse(j.dump()))), j);
    Json with_nccl = j;
    with_nccl["nccl"] = Json::object();
    const Json once = profile_to_json(profile_from_json(with_nccl));
    EXPECT_EQ(profile_to_json(profile_from_json(once)), once);
  }
}

TEST(ProfileJson, CarriesAMeasuredDevice) {
  // The host CPU's profile from `parasol calibrate --probe`: measured peak and bandwidth.
  Profile p = default_profile(device_spec(kHostCpuDevice));
  DeviceSpec measured = device_spec(kHostCpuDevice);
  measured.peak_fp32_flops = measured.peak_tf32_flops = 87e9;
  measured.peak_bf16_flops = measured.peak_fp16_flops = 87e9;
  measured.hbm_bw = 19.5e9;
  p.measured_device = measured;
  Json j = profile_to_json(p);
  EXPECT_DOUBLE_EQ(j["device_spec"]["memory_bw_GBps"].get<double>(), 19.5);
  expect_same(profile_from_json(Json::parse(j.dump())), p);
  // A device_spec of another device than the profile's is an error naming it.
  j["device_spec"]["name"] = "H100-SXM";
  try {
    profile_from_json(j);
    ADD_FAILURE() << "no Error";
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "profile.device_spec.name");
  }
  j["device_spec"]["name"] = kHostCpuDevice;
  j["device_spec"]["memory_bw_GBps"] = 0;
  EXPECT_THROW(profile_from_json(j), Error);
}

TEST(ProfileJson, MissingFieldsTakeTheDeviceDefaults) {
  Profile p = profile_from_json(Json::parse(R"({"device": "H100-SXM", "gemm_efficiency": 0.5})"));
  Profile d = default_profile(device_spec("H100-SXM"));
  EXPECT_DOUBLE_EQ(p.gemm_efficiency, 0.5);
  EXPECT_DOUBLE_EQ(p.memory_efficiency, d.memory_efficiency);
  EXPECT_DOUBLE_EQ(p.link_eff(LinkKind::kInfiniband), d.link_eff(LinkKind::kInfiniband));
}

TEST(ProfileJson, RejectsBadInput) {
  EXPECT_THROW(profile_from_json(Json::parse(R"({"gemm_efficiency": 0.5})")), Error);
  EXPECT_THROW(profile_from_json(Json::parse(R"({"device": "Z80"})")), Error);
  EXPECT_THROW(profile_from_json(Json::parse(R"({"device": "A100-80G", "gemm_eff": 0.5})")), Error);
  EXPECT_THROW(profile_from_json(Json::parse(R"({"device": "A100-80G", "gemm_efficiency": 1.5})")),
               Error);
  EXPECT_THROW(
      profile_from_json(Json::parse(R"({"device": "A100-80G", "memory_efficiency": "high"})")),
      Error);
  EXPECT_THROW(profile_from_json(Json::parse(
                   R"({"device": "A100-80G", "link_efficiency": {"token-ring": 0.5}})")),
               Error);
  EXPECT_THROW(profile_from_json(Json::parse(R"({"device": "A100-80G", "traces": [1]})")), Error);
  try {
    profile_from_json(Json::parse(
        R"({"device": "H100-SXM", "attention_shape": {"cudnn_forward": {"s_half": -1}}})"));
    ADD_FAILURE() << "no Error";
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "profile.attention_shape.cudnn_forward.s_half");
  }
  EXPECT_THROW(profile_from_json(Json::parse(
                   R"({"device": "H100-SXM", "attention_shape": {"fa9_forward": {}}})")),
               Error);
  try {
    profile_from_json(Json::parse(R"({"device": "A100-80G", "gemm_efficiency": 0})"));
    ADD_FAILURE() << "no Error";
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "profile.gemm_efficiency");
  }
}

class ProfileFile : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = (std::filesystem::temp_directory_path() /
             ("parasol_profile_test_" + std::to_string(::getpid()) + ".json"))
                .string();
  }
  void TearDown() override { std::remove(path_.c_str()); }
  void write(const Json& j) { std::ofstream(path_) << j.dump(2); }
  std::string path_;
};

TEST_F(ProfileFile, LoadsAProfileOfTheSameDevice) {
  write(profile_to_json(odd_profile()));
  expect_same(load_profile(path_, device_spec("A100-80G")), odd_profile());
}

TEST_F(ProfileFile, RejectsAProfileOfAnotherDevice) {
  write(profile_to_json(odd_profile()));  // an A100 profile
  try {
    load_profile(path_, device_spec("H100-SXM"));
    ADD_FAILURE() << "an A100 profile was accepted for an H100 cluster";
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "profile.device");
  }
}

TEST_F(ProfileFile, MissingFileIsAnError) {
  EXPECT_THROW(load_profile(path_ + ".missing", device_spec("A100-80G")), Error);
}

}  // namespace
}  // namespace parasol::cost
