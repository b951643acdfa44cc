// Profile ranges: for every figure of a device's default Profile (cost_models/profile.cc), the
// range its public sources span and where the range comes from, so that a test can check that no
// figure goes without a source and `parasol accuracy --sensitivity` can move each figure across
// its range and show how each accuracy family's error moves.
#pragma once

#include <string>
#include <vector>

#include "core/device.h"
#include "core/json_reader.h"
#include "cost_models/profile.h"

namespace parasol::cost {

// How the two ends of a range were found.
enum class RangeKind {
  kCited,        // both ends are published measurements (or derived from them as stated)
  kUncertainty,  // one published point (or none on this device); the ends are the stated
                 // uncertainty around it, the reason given in `source`
};
const char* range_kind_name(RangeKind k);

struct ProfileRange {
  // A '/'-separated path into the profile JSON (profile_to_json): "gemm_efficiency",
  // "link_efficiency/infiniband", "gemm_efficiency_by_dtype/fp8".
  std::string key;
  double low = 0, high = 0;  // in the JSON's units (microseconds for *_us keys)
  RangeKind kind = RangeKind::kCited;
  std::string source;
};

// The ranges of `device`'s default profile; empty for a device without a default profile.
std::vector<ProfileRange> profile_ranges(const DeviceSpec& device);

// The profile JSON keys that are not calibratable figures with a range: names and provenance
// ("device", "source", "traces"), the error bands (the suites' residuals), the measured device,
// and NCCL's tuning tables (copied from NCCL's source, tuning.cc, not estimated).
bool profile_key_needs_no_range(const std::string& top_level_key);

// The profile `p` with the figure at `key` (a ProfileRange key) set to `value`. Throws Error
// naming the key when the profile has no such figure.
Profile with_profile_figure(const Profile& p, const std::string& key, double value);

// The value of the figure at `key` in `p`.
double profile_figure(const Profile& p, const std::string& key);

}  // namespace parasol::cost
