// Shared by the Megatron-LM writer (megatron.cc) and reader (megatron_import.cc): the release the
// flags were checked against and Megatron's two rank orders.
#pragma once

#include <array>

#include "core/plan.h"

namespace parasol::interop {

inline constexpr const char* kMegatronVersion =
    "Megatron-Core 0.20.0 (NVIDIA/Megatron-LM d98e8a64ddf3, 2026-08-22)";
// Megatron's default rank order (megatron/core/parallel_state.py) and the one of
// --use-tp-pp-dp-mapping (megatron/training/config/common_config.py), first-fastest.
inline constexpr std::array<Dim, 5> kMegatronDefaultOrder = {Dim::kTp, Dim::kCp, Dim::kEp, Dim::kDp,
                                                             Dim::kPp};
inline constexpr std::array<Dim, 5> kMegatronTpPpDpOrder = {Dim::kTp, Dim::kCp, Dim::kEp, Dim::kPp,
                                                            Dim::kDp};

}  // namespace parasol::interop
