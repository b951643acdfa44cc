// Tests cost_models/profile_ranges.h: every figure of every default profile has a public range
// (or is a switched-off term, or is not a calibratable figure), the default lies inside it, and
// one figure of a profile can be set by its key.
#include "cost_models/profile_ranges.h"

#include <gtest/gtest.h>

#include <functional>
#include <map>

#include "core/error.h"

namespace parasol::cost {
namespace {

// Every numeric leaf of `j` with its '/'-path.
void leaves(const Json& j, const std::string& path, std::map<std::string, double>& out) {
  if (j.is_number()) {
    out[path] = j.get<double>();
  } else if (j.is_object()) {
    for (auto it = j.begin(); it != j.end(); ++it)
      leaves(it.value(), path.empty() ? it.key() : path + "/" + it.key(), out);
  } else if (j.is_array()) {
    for (size_t i = 0; i < j.size(); ++i) leaves(j[i], path + "/" + std::to_string(i), out);
  }
}

TEST(ProfileRanges, EveryDefaultFigureHasARangeThatHoldsIt) {
  // Every device parasol has a datasheet of (GB200, H800, MI325X and V100 included).
  for (const std::string& name : known_devices()) {
    const DeviceSpec d = device_spec(name);
    const Profile p = default_profile(d);
    std::map<std::string, const ProfileRange*> ranges;
    const auto rs = profile_ranges(d);
    for (const ProfileRange& r : rs) {
      EXPECT_TRUE(ranges.emplace(r.key, &r).second) << name << ": " << r.key << " twice";
      EXPECT_LE(r.low, r.high) << name << ": " << r.key;
      EXPECT_FALSE(r.source.empty()) << name << ": " << r.key;
    }
    std::map<std::string, double> figures;
    const Json j = profile_to_json(p);
    for (auto it = j.begin(); it != j.end(); ++it)
      if (!profile_key_needs_no_range(it.key())) leaves(it.value(), it.key(), figures);
    ASSERT_GT(figures.size(), 10u) << name;
    for (const auto& [key, value] : figures) {
      auto it = ranges.find(key);
      if (value == 0 && it == ranges.end()) continue;  // a switched-off term
      ASSERT_NE(it, ranges.end()) << name << ": figure " << key << " = " << value
                                  << " has no public range (cost_models/profile_ranges.cc)";
      EXPECT_GE(value, it->second->low - 1e-12) << name << ": " << key;
      EXPECT_LE(value, it->second->high + 1e-12) << name << ": " << key;
    }
    // No range for a figure the profile does not have.
    for (const ProfileRange& r : rs)
      EXPECT_TRUE(figures.count(r.key) || r.key.rfind("gemm_efficiency_by_dtype/", 0) == 0)
          << name << ": range for unknown figure " << r.key;
  }
}

TEST(ProfileRanges, RangesOnlyForDevicesWithDefaults) {
  EXPECT_FALSE(profile_ranges(device_spec("H100-SXM")).empty());
  DeviceSpec unknown = device_spec("H100-SXM");
  unknown.name = "no-such-device";
  EXPECT_TRUE(profile_ranges(unknown).empty());
}

TEST(ProfileRanges, SetsOneFigureByKey) {
  const Profile p = default_profile(device_spec("A100-80G"));
  const Profile q = with_profile_figure(p, "link_efficiency/infiniband", 0.5);
  EXPECT_DOUBLE_EQ(q.link_eff(LinkKind::kInfiniband), 0.5);
  EXPECT_DOUBLE_EQ(q.link_eff(LinkKind::kNvswitch), p.link_eff(LinkKind::kNvswitch));
  EXPECT_DOUBLE_EQ(profile_figure(q, "link_efficiency/infiniband"), 0.5);
  const Profile r = with_profile_figure(p, "kernel_overhead_us", 4);
  EXPECT_DOUBLE_EQ(r.kernel_overhead_s, 4e-6);
  const Profile f = with_profile_figure(p, "gemm_efficiency_by_dtype/fp8", 0.6);
  EXPECT_DOUBLE_EQ(f.gemm_eff(Dtype::kFp8), 0.6 * p.sustained_clock);
  EXPECT_DOUBLE_EQ(f.gemm_eff(Dtype::kBf16), p.gemm_eff(Dtype::kBf16));
}

TEST(ProfileRanges, UnknownFigureIsAnErrorNamingIt) {
  const Profile p = default_profile(device_spec("A100-80G"));
  try {
    with_profile_figure(p, "no_such_efficiency", 0.5);
    ADD_FAILURE() << "no Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no_such_efficiency"), std::string::npos) << e.what();
  }
  EXPECT_THROW(profile_figure(p, "link_efficiency/warp_drive"), Error);
  EXPECT_THROW(with_profile_figure(p, "traces", 1), Error);  // not a number
}

}  // namespace
}  // namespace parasol::cost
