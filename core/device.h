// Accelerator datasheets: peak dense FLOP/s per dtype, HBM capacity and bandwidth, SM count.
// Figures are vendor datasheet values (dense, no sparsity); each entry in device.cc cites its
// source. One entry, "cpu-host", is a rank of the CPU runtime on this host: its nominal figures
// are replaced by measured ones where a profile carries them (`parasol calibrate --probe`).
#pragma once

#include <string>
#include <vector>

#include "core/json_reader.h"

namespace parasol {

enum class Dtype { kFp32, kTf32, kBf16, kFp16, kFp8 };

const char* dtype_name(Dtype d);
// Bytes per element (tf32 is stored as fp32).
double dtype_bytes(Dtype d);
// Parses "fp32", "tf32", "bf16", "fp16", "fp8"; throws parasol::Error naming `field`.
Dtype parse_dtype(const std::string& s, const std::string& field);

struct DeviceSpec {
  std::string name;        // "A100-80G", "H100-SXM", ...
  std::string vendor;      // "nvidia", "amd"
  double peak_fp32_flops;  // FLOP/s, non-tensor-core fp32
  double peak_tf32_flops;  // FLOP/s, dense
  double peak_bf16_flops;  // FLOP/s, dense
  double peak_fp16_flops;  // FLOP/s, dense
  double peak_fp8_flops;   // FLOP/s, dense; 0 when unsupported
  // Device memory a process can use, in bytes: the total nvidia-smi (memory.total) and
  // torch.cuda.mem_get_info report, what a framework's CUDA context, NCCL and caching allocator
  // share. Datasheets' "GB" of HBM are GiB-scale (H200 "141 GB" = 143771 MiB).
  double hbm_bytes;
  double hbm_bw;      // device memory bandwidth in bytes/s
  int compute_units;  // SMs (NVIDIA) or CUs (AMD): the unit of GEMM wave quantization
  double tdp_watts;   // board power
  // NVIDIA's compute capability, major x 10 + minor as CUDA's sm_arch (90 Hopper, 100 the
  // datacenter Blackwell GPUs), what torch.cuda.get_device_capability() reports; 0 where the
  // device has none (AMD, the host CPU). The hardware features the frameworks branch on read it
  // (core/fp8_params.h fp8_weight_transpose_kept).
  int compute_capability = 0;

  // Peak dense FLOP/s for math in `d` (fp8 falls back to fp16 where unsupported).
  double peak_flops(Dtype d) const;
};

// The datasheet of a known device. Names are case-insensitive; throws parasol::Error
// ("<field>: unknown device 'X' (known: ...)") for an unknown name.
const DeviceSpec& device_spec(const std::string& name, const std::string& field = "device");
std::vector<std::string> known_devices();

// The name of the host-CPU device (one rank of the CPU runtime; see device.cc).
inline constexpr const char* kHostCpuDevice = "cpu-host";

// JSON form of a datasheet, units in the keys: {"name", "vendor", "peak_fp32_TFLOPs",
// "peak_tf32_TFLOPs", "peak_bf16_TFLOPs", "peak_fp16_TFLOPs", "peak_fp8_TFLOPs", "memory_GiB",
// "memory_bw_GBps", "compute_units", "tdp_W", "compute_capability"} (the last as major.minor,
// 10.0). Reading checks every field (Error naming "<path>.<field>"); peaks and bandwidth must be
// > 0 (fp8 may be 0); an absent compute_capability is the named device's datasheet value (0 for
// a name parasol does not know).
Json device_spec_to_json(const DeviceSpec& d);
DeviceSpec device_spec_from_json(const Json& j, const std::string& path = "device_spec");

}  // namespace parasol
