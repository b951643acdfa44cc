// Datasheet figures for the devices parasol knows. Dense (non-sparse) tensor-core peaks.
#include "core/device.h"

#include <algorithm>
#include <cctype>
#include <cmath>

#include "core/error.h"
#include "core/units.h"

namespace parasol {

namespace {
constexpr double T = 1e12;
using units::GB;
using units::GiB;
using units::MiB;

const std::vector<DeviceSpec>& table() {
  // Compute capabilities: NVIDIA's "CUDA GPU Compute Capability" table
  // (developer.nvidia.com/cuda-gpus: 10.0 GB200 and B200; 9.0 H200 and H100, the H800 and the
  // 96 GB board being H100 silicon; 8.0 A100) and its legacy table (developer.nvidia.com/
  // cuda-legacy-gpus: 7.0 V100). AMD's and the host CPU's are 0 (no CUDA compute capability).
  static const std::vector<DeviceSpec> devices = {
      // NVIDIA A100 Tensor Core GPU datasheet (2021): SXM4, 19.5 TF fp32, 156 TF tf32,
      // 312 TF bf16/fp16, 40 GB HBM2 at 1,555 GB/s, 108 SMs, 400 W. Memory: nvidia-smi's
      // memory.total of an A100-SXM4-40GB, 40960 MiB (modal-labs/modal-client PR 2797 lists the
      // totals nvidia-smi reports: A100 40GB 40960MiB, A100 80GB 81920MiB, H100 81559MiB).
      {"A100-40G", "nvidia", 19.5 * T, 156 * T, 312 * T, 312 * T, 0, 40960 * MiB, 1555 * GB, 108,
       400, 80},
      // Same datasheet, 80 GB HBM2e SXM4 at 2,039 GB/s; nvidia-smi 81920 MiB (same PR).
      {"A100-80G", "nvidia", 19.5 * T, 156 * T, 312 * T, 312 * T, 0, 81920 * MiB, 2039 * GB, 108,
       400, 80},
      // NVIDIA H100 Tensor Core GPU datasheet: SXM5, 67 TF fp32, 494.7 TF tf32, 989.4 TF
      // bf16/fp16, 1,978.9 TF fp8 (dense), 80 GB HBM3 at 3.35 TB/s, 132 SMs, 700 W. Memory:
      // nvidia-smi's total of an "H100 80GB HBM3", 81559 MiB (modal-labs/modal-client PR 2797).
      {"H100-SXM", "nvidia", 67 * T, 494.7 * T, 989.4 * T, 989.4 * T, 1978.9 * T, 81559 * MiB,
       3350 * GB, 132, 700, 90},
      // Meta's Grand Teton H100: the SXM5 silicon (132 SMs, the SXM5 peaks at the same boost
      // clock) with 96 GB HBM2e at 2.4 TB/s and a 500 W power limit (pytorch/torchtitan
      // benchmarks/llama3_h100_202412_torchtitan.md: "actual peak between SXM and NVL"); the lower
      // sustained clock of the 500 W limit is in its profile (cost_models/profile.cc). Memory: no
      // nvidia-smi reading of this board is published; the Hopper parts with 96 GB (GH200 96GB,
      // H20) report 97871 MiB (nvidia-smi tables quoted in public issues), taken here.
      {"H100-SXM-96G-500W", "nvidia", 67 * T, 494.7 * T, 989.4 * T, 989.4 * T, 1978.9 * T,
       97871 * MiB, 2400 * GB, 132, 500, 90},
      // NVIDIA H200 datasheet: H100's compute with 141 GB HBM3e at 4.8 TB/s, 700 W. Memory:
      // nvidia-smi's total of an "NVIDIA H200", 143771 MiB (= 140.4 GiB; the datasheet's "141 GB"
      // is this capacity in GiB, not 141e9 bytes).
      {"H200", "nvidia", 67 * T, 494.7 * T, 989.4 * T, 989.4 * T, 1978.9 * T, 143771 * MiB,
       4800 * GB, 132, 700, 90},
      // NVIDIA DGX B200 datasheet (72 PF fp8 training, 1,440 GB for 8 GPUs): per GPU 2.25 PF
      // bf16/fp16 dense, 4.5 PF fp8 dense, 1.1 PF tf32 dense, 180 GB HBM3e at 8 TB/s, 148 SMs, 1000
      // W. Memory: nvidia-smi's total of an "NVIDIA B200", 183359 MiB = 179.1 GiB
      // (NVIDIA/TensorRT-LLM issue 10278; pytorch/ao PR 4002 reads 178.35 "GB", GiB in fact, from
      // cudaGetDeviceProperties); the datasheet's 180 GB is GiB, not 180e9 bytes.
      {"B200", "nvidia", 75 * T, 1100 * T, 2250 * T, 2250 * T, 4500 * T, 183359 * MiB, 8000 * GB,
       148, 1000, 100},
      // The Blackwell GPU of a GB200 Grace Blackwell Superchip (NVIDIA GB200 NVL72 datasheet,
      // per superchip of two GPUs, sparse peaks halved for dense): per GPU 2.5 PF bf16/fp16,
      // 5 PF fp8, 1.25 PF tf32, 80 TF fp32 (160 per superchip), 186 GB HBM3e (372 per
      // superchip; 13.4 TB for 72 GPUs) at 8 TB/s (16 per superchip); the B200 die pair, 148 SMs;
      // 1,200 W per GPU (the superchip's 2,700 W with the Grace CPU's 300 W). Memory: nvidia-smi's
      // total of an "NVIDIA GB200", 189471 MiB = 185.0 GiB (nvidia-smi tables of GB200 NVL72
      // trays quoted in public repositories); the datasheet's 186 GB is GiB, not 186e9 bytes.
      {"GB200", "nvidia", 80 * T, 1250 * T, 2500 * T, 2500 * T, 5000 * T, 189471 * MiB, 8000 * GB,
       148, 1200, 100},
      // NVIDIA H800 SXM5 datasheet: the H100 SXM5's tensor-core peaks (989.4 TF bf16/fp16,
      // 1,978.9 TF fp8 dense, 494.7 TF tf32, 67 TF fp32), 80 GB HBM3 at 3.35 TB/s, 132 SMs,
      // 700 W; NVLink cut to 400 GB/s per GPU (the dgx-h800 preset, core/cluster_generators.cc).
      // Memory: the H100's 80 GB HBM3 stacks, 81559 MiB as nvidia-smi reports an H100.
      {"H800-SXM", "nvidia", 67 * T, 494.7 * T, 989.4 * T, 989.4 * T, 1978.9 * T, 81559 * MiB,
       3350 * GB, 132, 700, 90},
      // NVIDIA Tesla V100 SXM datasheet: 15.7 TF fp32, 125 TF fp16 tensor cores, 32 GB HBM2 at
      // 900 GB/s, 80 SMs; 350 W as the V100-SXM3-32GB of the DGX-2 (DGX-2 datasheet: 2 PF fp16
      // tensor for 16 GPUs = 125 TF each). Volta has no tf32 or bf16 tensor cores: tf32 and bf16
      // math run at the fp32 rate (train V100s in fp16); no fp8. Memory: nvidia-smi's total of a
      // Tesla V100-SXM2-32GB, 32768 MiB (Wan-Video/Wan2.1 issue 5).
      {"V100-32G", "nvidia", 15.7 * T, 15.7 * T, 15.7 * T, 125 * T, 0, 32768 * MiB, 900 * GB, 80,
       350, 70},
      // AMD Instinct MI325X datasheet: the MI300X's CDNA 3 compute (163.4 TF fp32, 653.7 TF tf32,
      // 1,307.4 TF bf16/fp16, 2,614.9 TF fp8 dense, 304 CUs) with 256 GB HBM3E at 6 TB/s, 1,000 W.
      // Memory: no rocminfo reading is cited; AMD's "GB" of HBM is GiB (the MI300X's "192 GB"
      // reads 191.98 GiB, below), so 256 GiB less the MI300X's 16 MiB reserve.
      {"MI325X", "amd", 163.4 * T, 653.7 * T, 1307.4 * T, 1307.4 * T, 2614.9 * T,
       256 * GiB - 16 * MiB, 6000 * GB, 304, 1000, 0},
      // AMD Instinct MI300X datasheet: 163.4 TF fp32, 653.7 TF tf32, 1,307.4 TF bf16/fp16,
      // 2,614.9 TF fp8 (dense), 192 GB HBM3 at 5.3 TB/s, 304 CUs, 750 W. Memory: rocminfo's
      // allocatable global pool of an MI300X, 201310208 KiB = 191.98 GiB (ROCm issue 4414).
      {"MI300X", "amd", 163.4 * T, 653.7 * T, 1307.4 * T, 1307.4 * T, 2614.9 * T,
       201310208.0 * 1024, 5300 * GB, 304, 750, 0},
      // "cpu-host": one rank of the CPU runtime (fp32 math, OpenBLAS GEMMs on one core), with
      // nominal figures of one core of a current x86 server: an AVX-512 / dual-FMA core reaches
      // ~100 GFLOP/s in cblas_sgemm (measured on this project's 2-core AMD EPYC CI host: 100
      // GFLOP/s at n = 1024) and ~25 GB/s in a one-thread STREAM triad; the CPU backend computes
      // every dtype in fp32, so all peaks are the sgemm rate (no fp8). 16 GiB of host memory per
      // rank. compute_units = 1: GEMMs are not split into waves of thread blocks. `parasol
      // calibrate --probe` measures the real figures of a host and writes them into a profile,
      // which replaces these (Cluster::set_device_spec).
      {kHostCpuDevice, "cpu", 0.1 * T, 0.1 * T, 0.1 * T, 0.1 * T, 0, 16 * GiB, 25 * GB, 1, 0, 0},
  };
  return devices;
}

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}
}  // namespace

const char* dtype_name(Dtype d) {
  switch (d) {
    case Dtype::kFp32:
      return "fp32";
    case Dtype::kTf32:
      return "tf32";
    case Dtype::kBf16:
      return "bf16";
    case Dtype::kFp16:
      return "fp16";
    case Dtype::kFp8:
      return "fp8";
  }
  return "?";
}

double dtype_bytes(Dtype d) {
  switch (d) {
    case Dtype::kFp32:
    case Dtype::kTf32:
      return 4;
    case Dtype::kBf16:
    case Dtype::kFp16:
      return 2;
    case Dtype::kFp8:
      return 1;
  }
  return 4;
}

Dtype parse_dtype(const std::string& s, const std::string& field) {
  for (Dtype d : {Dtype::kFp32, Dtype::kTf32, Dtype::kBf16, Dtype::kFp16, Dtype::kFp8})
    if (s == dtype_name(d)) return d;
  throw Error(field, "'" + s + "' is not one of fp32|tf32|bf16|fp16|fp8");
}

double DeviceSpec::peak_flops(Dtype d) const {
  switch (d) {
    case Dtype::kFp32:
      return peak_fp32_flops;
    case Dtype::kTf32:
      return peak_tf32_flops;
    case Dtype::kBf16:
      return peak_bf16_flops;
    case Dtype::kFp16:
      return peak_fp16_flops;
    case Dtype::kFp8:
      return peak_fp8_flops > 0 ? peak_fp8_flops : peak_fp16_flops;
  }
  return peak_fp32_flops;
}

const DeviceSpec& device_spec(const std::string& name, const std::string& field) {
  std::string want = lower(name);
  for (const DeviceSpec& d : table())
    if (lower(d.name) == want) return d;
  std::string known;
  for (const DeviceSpec& d : table()) known += (known.empty() ? "" : ", ") + d.name;
  throw Error(field, "unknown device '" + name + "' (known: " + known + ")");
}

Json device_spec_to_json(const DeviceSpec& d) {
  return {{"name", d.name},
          {"vendor", d.vendor},
          {"peak_fp32_TFLOPs", in_json_unit(d.peak_fp32_flops, T)},
          {"peak_tf32_TFLOPs", in_json_unit(d.peak_tf32_flops, T)},
          {"peak_bf16_TFLOPs", in_json_unit(d.peak_bf16_flops, T)},
          {"peak_fp16_TFLOPs", in_json_unit(d.peak_fp16_flops, T)},
          {"peak_fp8_TFLOPs", in_json_unit(d.peak_fp8_flops, T)},
          {"memory_GiB", in_json_unit(d.hbm_bytes, GiB)},
          {"memory_bw_GBps", in_json_unit(d.hbm_bw, GB)},
          {"compute_units", d.compute_units},
          {"tdp_W", d.tdp_watts},
          {"compute_capability", d.compute_capability / 10.0}};
}

DeviceSpec device_spec_from_json(const Json& j, const std::string& path) {
  JsonReader r(j, path);
  r.allow_only({"name", "vendor", "peak_fp32_TFLOPs", "peak_tf32_TFLOPs", "peak_bf16_TFLOPs",
                "peak_fp16_TFLOPs", "peak_fp8_TFLOPs", "memory_GiB", "memory_bw_GBps",
                "compute_units", "tdp_W", "compute_capability"});
  auto positive = [&](const char* key) {
    double v = r.number(key, 0, 1e9);
    if (!(v > 0)) throw Error(r.field(key), "must be > 0");
    return v;
  };
  DeviceSpec d;
  d.name = r.string("name");
  d.vendor = r.string_or("vendor", "");
  d.peak_fp32_flops = positive("peak_fp32_TFLOPs") * T;
  d.peak_tf32_flops = positive("peak_tf32_TFLOPs") * T;
  d.peak_bf16_flops = positive("peak_bf16_TFLOPs") * T;
  d.peak_fp16_flops = positive("peak_fp16_TFLOPs") * T;
  d.peak_fp8_flops = r.number_or("peak_fp8_TFLOPs", 0, 0, 1e9) * T;
  d.hbm_bytes = positive("memory_GiB") * GiB;
  d.hbm_bw = positive("memory_bw_GBps") * GB;
  d.compute_units = static_cast<int>(r.integer_or("compute_units", 1, 1, 1 << 20));
  d.tdp_watts = r.number_or("tdp_W", 0, 0, 1e9);
  // A silicon fact a measured profile need not repeat: the named device's where absent.
  int datasheet_cc = 0;
  for (const DeviceSpec& known : table())
    if (lower(known.name) == lower(d.name)) datasheet_cc = known.compute_capability;
  d.compute_capability = static_cast<int>(
      std::lround(r.number_or("compute_capability", datasheet_cc / 10.0, 0, 100) * 10));
  return d;
}

std::vector<std::string> known_devices() {
  std::vector<std::string> names;
  for (const DeviceSpec& d : table()) names.push_back(d.name);
  return names;
}

}  // namespace parasol
