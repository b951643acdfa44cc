// Device families: which of the datasheets (core/device.h) are one GPU architecture, and which
// are one silicon sold as several products. The one statement of both: the profile's defaults
// and their public ranges (cost_models/profile.cc, profile_ranges.cc), the energy model's host
// power, plan validation (FlashAttention-3 on Hopper) and the sweep's server sizes
// (core/sibling_presets.h) read a device's family here.
#pragma once

#include <string>

#include "core/device.h"

namespace parasol {

enum class DeviceFamily {
  kOther,      // a device of no family parasol knows (a datasheet given as JSON, under a new name)
  kVolta,      // V100
  kAmpere,     // A100 (every A100-named datasheet)
  kHopper,     // H100 SXM (and its 96 GB 500 W part), H800 SXM, H200
  kBlackwell,  // B200, GB200
  kCdna3,      // MI300X, MI325X
  kHostCpu,    // cpu-host: one rank of the CPU runtime
};

// "other", "volta", "ampere", "hopper", "blackwell", "cdna3", "cpu-host".
const char* device_family_name(DeviceFamily f);

// The family of the datasheet named `d.name` (exact names, as device_spec() spells them; any
// name that begins with "A100" is Ampere).
DeviceFamily device_family(const DeviceSpec& d);

// Hopper or later (Hopper, Blackwell): the GPUs whose libraries take Hopper's defaults (cuBLAS's
// 32 MiB workspaces).
bool hopper_or_later(const DeviceSpec& d);

// Whether devices `a` and `b` are two products of one silicon (B200 and GB200: one Blackwell die
// pair; NVIDIA's GB200 NVL72 datasheet). A device is not its own sibling.
bool silicon_siblings(const std::string& a, const std::string& b);

}  // namespace parasol
