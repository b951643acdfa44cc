// Byte units the sources write sizes in, one definition for every file: binary (KiB, MiB, GiB), as
// allocators and nvidia-smi count, and decimal (GB), as datasheets quote memory and bandwidth.
// A file takes the ones it uses with `using units::GiB;`.
#pragma once

namespace parasol::units {

inline constexpr double KiB = 1024.0;
inline constexpr double MiB = 1024.0 * KiB;
inline constexpr double GiB = 1024.0 * MiB;
inline constexpr double GB = 1e9;

}  // namespace parasol::units
