// core/device_family.h: every datasheet parasol knows has a family; the families are the
// architectures the profile's defaults branch on; only B200 and GB200 are one silicon.
#include "core/device_family.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

namespace parasol {
namespace {

TEST(DeviceFamily, EveryKnownDeviceHasOne) {
  std::set<std::string> names;
  for (const std::string& n : known_devices()) {
    const DeviceFamily f = device_family(device_spec(n));
    EXPECT_NE(f, DeviceFamily::kOther) << n;
    names.insert(device_family_name(f));
  }
  // Every family is some known device's.
  EXPECT_EQ(names,
            (std::set<std::string>{"volta", "ampere", "hopper", "blackwell", "cdna3", "cpu-host"}));
}

TEST(DeviceFamily, ArchitecturesAsTheDatasheetsSayThem) {
  auto family = [](const char* n) { return device_family(device_spec(n)); };
  EXPECT_EQ(family("A100-40G"), DeviceFamily::kAmpere);
  EXPECT_EQ(family("A100-80G"), DeviceFamily::kAmpere);
  for (const char* n : {"H100-SXM", "H100-SXM-96G-500W", "H800-SXM", "H200"}) {
    EXPECT_EQ(family(n), DeviceFamily::kHopper) << n;
    EXPECT_EQ(device_spec(n).compute_capability, 90) << n;  // sm90: Hopper
  }
  for (const char* n : {"B200", "GB200"}) {
    EXPECT_EQ(family(n), DeviceFamily::kBlackwell) << n;
    EXPECT_EQ(device_spec(n).compute_capability, 100) << n;
  }
  EXPECT_EQ(family("MI300X"), DeviceFamily::kCdna3);
  EXPECT_EQ(family("MI325X"), DeviceFamily::kCdna3);
  EXPECT_EQ(family("V100-32G"), DeviceFamily::kVolta);
  EXPECT_EQ(family(kHostCpuDevice), DeviceFamily::kHostCpu);
  EXPECT_TRUE(hopper_or_later(device_spec("H200")));
  EXPECT_TRUE(hopper_or_later(device_spec("GB200")));
  EXPECT_FALSE(hopper_or_later(device_spec("A100-80G")));
  EXPECT_FALSE(hopper_or_later(device_spec("MI300X")));
  // A datasheet given as JSON under a new name is of no family: the profile's generic defaults.
  DeviceSpec custom = device_spec("H100-SXM");
  custom.name = "X1";
  EXPECT_EQ(device_family(custom), DeviceFamily::kOther);
  EXPECT_STREQ(device_family_name(DeviceFamily::kOther), "other");
}

TEST(DeviceFamily, SiliconSiblings) {
  EXPECT_TRUE(silicon_siblings("B200", "GB200"));
  EXPECT_TRUE(silicon_siblings("GB200", "B200"));
  EXPECT_FALSE(silicon_siblings("B200", "B200"));  // another box of one product is no sibling
  EXPECT_FALSE(silicon_siblings("H200", "H200"));
  EXPECT_FALSE(silicon_siblings("H100-SXM", "H200"));
  EXPECT_FALSE(silicon_siblings("H200", "GB200"));
}

}  // namespace
}  // namespace parasol
