// Which server preset holds another product of a device's silicon: what `parasol sweep` uses when
// a point varies the GPUs per server (core/cluster.h has the presets; defined in
// core/cluster_generators.cc beside them).
#pragma once

#include <cstdint>
#include <string>

namespace parasol {

// The preset whose servers hold `gpus_per_server` GPUs of another product of `device`'s silicon
// (B200 in DGX B200's 8-GPU servers, GB200 in the GB200 NVL72's 72-GPU racks: one Blackwell die
// pair sold as two products); "" when none. A preset of `device` itself never is: another server
// size of the same product is a different box (h200-1's one H200 has not DGX H200's host, PCIe
// and NICs), not that product's servers at another size.
std::string cluster_preset_of_sibling(const std::string& device, int64_t gpus_per_server);

}  // namespace parasol
