// Default profiles per device, with the public figure behind each number, and profile JSON I/O.
#include "cost_models/profile.h"

#include "core/error.h"

namespace parasol::cost {

Profile default_profile(const DeviceSpec& d) {
  Profile p;
  p.device = d.name;
  p.source = "parasol defaults (datasheets and public micro-benchmarks)";
  if (d.name.rfind("A100", 0) == 0) {
    // cuBLAS fp16/bf16 GEMMs of size >= 4096^3 reach 250-270 of 312 TFLOP/s on A100-SXM
    // (NVIDIA Deep Learning Performance guide, "GEMM" chapter; Megatron-LM reports 80-85%).
    p.gemm_efficiency = 0.83;
    // STREAM-like copies reach ~1.7 of 2.0 TB/s on A100-80G (~0.85); fused element-wise
    // kernels of Megatron (bias-gelu, bias-dropout-add, layernorm) reach about 0.75-0.8.
    p.memory_efficiency = 0.78;
    // FlashAttention-2 paper (Dao 2023), Fig. 4-5: A100, head dim 128, causal: ~70% forward,
    // ~55% backward of peak at long sequences (the kernel's own FLOP count).
    p.flash_forward_efficiency = 0.65;
    p.flash_backward_efficiency = 0.5;
    // nccl-tests all_reduce_perf on DGX A100: ~230 GB/s bus bandwidth over 300 GB/s NVLink3 per
    // direction (0.77); HDR inter-node ~ 23 of 25 GB/s per NIC (0.92); PCIe Gen4 ~ 25 of 32 GB/s.
    p.link_efficiency = {0.77, 0.77, 0.78, 0.92, 0.8, 0.5};
  } else if (d.name == "H100-SXM" || d.name == "H200") {
    // cuBLASLt bf16 on H100-SXM: ~700-750 of 989 TFLOP/s for large GEMMs (~0.72).
    p.gemm_efficiency = 0.72;
    // HBM3 STREAM ~ 2.9-3.0 of 3.35 TB/s; fused kernels reach ~0.75-0.8.
    p.memory_efficiency = 0.78;
    // FlashAttention-2 on H100: ~335-350 TFLOP/s forward, ~250-300 backward of 989 (FA2 paper and
    // FlashAttention-3 paper baselines).
    p.flash_forward_efficiency = 0.35;
    p.flash_backward_efficiency = 0.28;
    // nccl-tests on DGX H100 without NVLS: ~360 GB/s of 450 (0.8); NDR ~ 46 of 50 GB/s (0.92).
    p.link_efficiency = {0.8, 0.8, 0.8, 0.92, 0.8, 0.5};
  } else if (d.name == "B200") {
    // Early public B200 figures: cuBLASLt bf16 ~1.5-1.7 of 2.25 PF (~0.7); NVLink5 ~ 0.8.
    p.gemm_efficiency = 0.7;
    p.memory_efficiency = 0.78;
    p.flash_forward_efficiency = 0.5;
    p.flash_backward_efficiency = 0.4;
    p.link_efficiency = {0.8, 0.8, 0.8, 0.92, 0.8, 0.5};
  } else if (d.name == "MI300X") {
    // Public MI300X measurements (e.g. SemiAnalysis, AMD ROCm blogs): bf16 GEMM ~ 600-700 of
    // 1307 TFLOP/s (~0.5); RCCL all-reduce ~ 300 of 448 GB/s (~0.7).
    p.gemm_efficiency = 0.5;
    p.memory_efficiency = 0.7;
    p.flash_forward_efficiency = 0.3;
    p.flash_backward_efficiency = 0.22;
    p.link_efficiency = {0.7, 0.7, 0.8, 0.92, 0.8, 0.5};
  } else if (d.name == kHostCpuDevice) {
    // One rank of the CPU runtime (device.cc: the peak is the one-core cblas_sgemm rate and the
    // bandwidth a one-thread STREAM triad). OpenBLAS reaches ~0.9 of its large-sgemm rate on
    // the transposed shapes of a backward pass; the plainly written element-wise kernels and
    // the unfused attention reach ~0.5-0.6 of triad bandwidth; a kernel is a function call
    // (~1 us with its loop set-up). MPI over shared memory: ~2 us per message step (Open MPI
    // vader latency), shm efficiency 0.5 (double copies for small and medium messages);
    // offload copies are memcpys (0.9 of the link's figure); the host's Adam is the
    // optimizer kernel itself (~25 GB/s over ~28 bytes per parameter).
    p.gemm_efficiency = 0.9;
    p.gemm_k_half = 16;
    p.memory_efficiency = 0.55;
    p.flash_forward_efficiency = 0.3;
    p.flash_backward_efficiency = 0.2;
    p.kernel_overhead_s = 1e-6;
    p.link_efficiency = {0.8, 0.8, 0.8, 0.9, 0.8, 0.5};
    p.collective_step_latency_s = 2e-6;
    p.host_copy_efficiency = 0.9;
    p.host_adam_params_per_s = 0.5e9;
  }
  return p;
}

Profile profile_from_json(const Json& j, const std::string& path) {
  JsonReader r(j, path);
  r.allow_only({"device", "source", "gemm_efficiency", "gemm_efficiency_by_dtype", "gemm_k_half",
                "memory_efficiency", "flash_forward_efficiency", "flash_backward_efficiency",
                "kernel_overhead_us", "link_efficiency", "collective_step_latency_us",
                "host_copy_efficiency", "host_adam_params_per_s", "traces", "device_spec"});
  Profile p = default_profile(device_spec(r.string("device"), r.field("device")));
  p.source = r.string_or("source", "file");
  p.gemm_efficiency = r.number_or("gemm_efficiency", p.gemm_efficiency, 1e-3, 1);
  if (r.has("gemm_efficiency_by_dtype")) {
    JsonReader g = r.object("gemm_efficiency_by_dtype");
    g.allow_only({"fp32", "tf32", "bf16", "fp16", "fp8"});
    for (Dtype d : {Dtype::kFp32, Dtype::kTf32, Dtype::kBf16, Dtype::kFp16, Dtype::kFp8})
      p.gemm_efficiency_by_dtype[static_cast<int>(d)] =
          g.number_or(dtype_name(d), p.gemm_efficiency_by_dtype[static_cast<int>(d)], 1e-3, 1);
  }
  p.gemm_k_half = r.number_or("gemm_k_half", p.gemm_k_half, 0, 1e6);
  p.memory_efficiency = r.number_or("memory_efficiency", p.memory_efficiency, 1e-3, 1);
  p.flash_forward_efficiency =
      r.number_or("flash_forward_efficiency", p.flash_forward_efficiency, 1e-3, 1);
  p.flash_backward_efficiency =
      r.number_or("flash_backward_efficiency", p.flash_backward_efficiency, 1e-3, 1);
  p.kernel_overhead_s = r.number_or("kernel_overhead_us", p.kernel_overhead_s * 1e6, 0, 1e6) * 1e-6;
  if (r.has("link_efficiency")) {
    JsonReader l = r.object("link_efficiency");
    for (LinkKind k : kAllLinkKinds)
      p.link_efficiency[static_cast<int>(k)] =
          l.number_or(link_kind_name(k), p.link_eff(k), 1e-3, 1);
    l.allow_only({"nvlink", "nvswitch", "pcie", "infiniband", "ethernet", "shm"});
  }
  p.collective_step_latency_s =
      r.number_or("collective_step_latency_us", p.collective_step_latency_s * 1e6, 0, 1e6) * 1e-6;
  p.host_copy_efficiency = r.number_or("host_copy_efficiency", p.host_copy_efficiency, 1e-3, 1);
  p.host_adam_params_per_s =
      r.number_or("host_adam_params_per_s", p.host_adam_params_per_s, 1, 1e15);
  if (r.has("traces"))
    for (const auto& [ipath, t] : r.array("traces")) {
      if (!t->is_string()) throw Error(ipath, "must be a string");
      p.traces.push_back(t->get<std::string>());
    }
  if (r.has("device_spec")) {
    p.measured_device = device_spec_from_json(r.raw("device_spec"), r.field("device_spec"));
    if (device_spec(p.measured_device->name, r.field("device_spec.name")).name != p.device)
      throw Error(
          r.field("device_spec.name"),
          "'" + p.measured_device->name + "' differs from the profile's device " + p.device);
    p.measured_device->name = p.device;
  }
  return p;
}

Json profile_to_json(const Profile& p) {
  Json links;
  for (LinkKind k : kAllLinkKinds) links[link_kind_name(k)] = p.link_eff(k);
  Json j = {{"device", p.device},
            {"source", p.source},
            {"gemm_efficiency", p.gemm_efficiency},
            {"gemm_k_half", p.gemm_k_half},
            {"memory_efficiency", p.memory_efficiency},
            {"flash_forward_efficiency", p.flash_forward_efficiency},
            {"flash_backward_efficiency", p.flash_backward_efficiency},
            {"kernel_overhead_us", p.kernel_overhead_s * 1e6},
            {"link_efficiency", links},
            {"collective_step_latency_us", p.collective_step_latency_s * 1e6},
            {"host_copy_efficiency", p.host_copy_efficiency},
            {"host_adam_params_per_s", p.host_adam_params_per_s},
            {"traces", p.traces}};
  Json by_dtype = Json::object();
  for (Dtype d : {Dtype::kFp32, Dtype::kTf32, Dtype::kBf16, Dtype::kFp16, Dtype::kFp8})
    if (p.gemm_efficiency_by_dtype[static_cast<int>(d)] > 0)
      by_dtype[dtype_name(d)] = p.gemm_efficiency_by_dtype[static_cast<int>(d)];
  if (!by_dtype.empty()) j["gemm_efficiency_by_dtype"] = by_dtype;
  if (p.measured_device) j["device_spec"] = device_spec_to_json(*p.measured_device);
  return j;
}

Profile load_profile(const std::string& path, const DeviceSpec& device) {
  Profile p = profile_from_json(read_json_file(path));
  if (p.device != device.name)
    throw Error("profile.device",
                "'" + p.device + "' describes another device than the cluster's " + device.name);
  return p;
}

}  // namespace parasol::cost
