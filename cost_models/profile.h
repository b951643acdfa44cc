// Profile: the calibratable efficiencies that turn datasheet peaks into predicted times, one
// Profile per device. default_profile() gives parasol's defaults, each figure justified in
// profile.cc by a datasheet or a public micro-benchmark; `parasol calibrate` fits new ones.
#pragma once

#include <array>
#include <optional>
#include <string>
#include <vector>

#include "core/cluster.h"
#include "core/device.h"
#include "core/json_reader.h"

namespace parasol::cost {

struct Profile {
  std::string device;  // the DeviceSpec name this profile describes
  std::string source;  // where the figures come from (defaults, or the calibration traces)

  // GEMM: time = flops / (peak x gemm_eff(dtype) x tile/wave factor x k factor) + overhead.
  double gemm_efficiency = 0.8;  // fraction of dense peak that large, well-shaped GEMMs reach
  // Per Dtype (indexed by it): a calibrated efficiency for GEMMs in that dtype; 0 = use
  // gemm_efficiency.
  std::array<double, 5> gemm_efficiency_by_dtype{};
  double gemm_k_half = 32;  // k at which the reduction-depth factor k/(k+k_half) is 1/2

  // Memory-bound kernels (norms, activations, dropout, residuals, softmax, optimizer).
  double memory_efficiency = 0.8;  // fraction of HBM bandwidth reached

  // Fused (flash) attention: fraction of dense peak reached in forward and backward.
  double flash_forward_efficiency = 0.6;
  double flash_backward_efficiency = 0.45;

  double kernel_overhead_s = 3e-6;  // per kernel: launch and tail, seconds

  // Communication: fraction of a link's bandwidth that collectives reach, per link kind
  // (indexed by LinkKind), and the software latency of one algorithm step.
  std::array<double, kLinkKinds> link_efficiency = {0.8, 0.8, 0.8, 0.9, 0.8, 0.5};
  double collective_step_latency_s = 5e-6;

  // Host <-> device copies (offload): fraction of the host link's bandwidth.
  double host_copy_efficiency = 0.8;
  // CPU Adam throughput of one server's host (parameters/s), shared by its GPUs. ZeRO-Offload
  // (Ren et al. 2021, Table 3): DeepSpeed CPU-Adam updates 1B parameters in ~0.55 s.
  double host_adam_params_per_s = 1.8e9;

  std::vector<std::string> traces;  // the measured traces a calibrated profile came from

  // Measured figures of the device (`parasol calibrate --probe` of the host CPU) that replace
  // its datasheet where this profile is used (Cluster::set_device_spec); none for datasheets.
  std::optional<DeviceSpec> measured_device;

  double link_eff(LinkKind k) const { return link_efficiency[static_cast<int>(k)]; }
  double gemm_eff(Dtype d) const {
    const double e = gemm_efficiency_by_dtype[static_cast<int>(d)];
    return e > 0 ? e : gemm_efficiency;
  }
};

// parasol's default profile for a device (see profile.cc for the source of each figure).
Profile default_profile(const DeviceSpec& device);

// JSON: the fields above with units in the keys ("kernel_overhead_us", ...), "link_efficiency"
// and "gemm_efficiency_by_dtype" as objects keyed by link kind and dtype name, and the measured
// device as "device_spec" (core/device.h's JSON form).
Profile profile_from_json(const Json& j, const std::string& path = "profile");
Json profile_to_json(const Profile& p);
// Reads a profile file and checks that it describes `device` (Error naming "profile.device").
Profile load_profile(const std::string& path, const DeviceSpec& device);

}  // namespace parasol::cost
