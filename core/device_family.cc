// Device families (device_family.h).
#include "core/device_family.h"

#include <algorithm>
#include <vector>

namespace parasol {

const char* device_family_name(DeviceFamily f) {
  switch (f) {
    case DeviceFamily::kVolta:
      return "volta";
    case DeviceFamily::kAmpere:
      return "ampere";
    case DeviceFamily::kHopper:
      return "hopper";
    case DeviceFamily::kBlackwell:
      return "blackwell";
    case DeviceFamily::kCdna3:
      return "cdna3";
    case DeviceFamily::kHostCpu:
      return "cpu-host";
    case DeviceFamily::kOther:
      break;
  }
  return "other";
}

DeviceFamily device_family(const DeviceSpec& d) {
  const std::string& n = d.name;
  if (n.rfind("A100", 0) == 0) return DeviceFamily::kAmpere;
  // H800: the H100 SXM5 silicon and clocks; only its NVLink is narrower (its preset's).
  if (n == "H100-SXM" || n == "H200" || n == "H100-SXM-96G-500W" || n == "H800-SXM")
    return DeviceFamily::kHopper;
  if (n == "B200" || n == "GB200") return DeviceFamily::kBlackwell;
  if (n == "MI300X" || n == "MI325X") return DeviceFamily::kCdna3;
  if (n == "V100-32G") return DeviceFamily::kVolta;
  if (n == kHostCpuDevice) return DeviceFamily::kHostCpu;
  return DeviceFamily::kOther;
}

bool hopper_or_later(const DeviceSpec& d) {
  const DeviceFamily f = device_family(d);
  return f == DeviceFamily::kHopper || f == DeviceFamily::kBlackwell;
}

bool silicon_siblings(const std::string& a, const std::string& b) {
  // Products of one silicon sold in servers of different sizes: the B200 of DGX B200 and the
  // GB200 of the GB200 NVL72 rack (NVIDIA's GB200 NVL72 datasheet: "Blackwell GPUs", the same
  // die pair as B200, joined to Grace CPUs).
  static const std::vector<std::vector<std::string>> kSiblings = {{"B200", "GB200"}};
  if (a == b) return false;
  for (const auto& s : kSiblings)
    if (std::find(s.begin(), s.end(), a) != s.end() && std::find(s.begin(), s.end(), b) != s.end())
      return true;
  return false;
}

}  // namespace parasol
