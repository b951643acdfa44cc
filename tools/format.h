// Human-readable formatting for the command line: bytes, seconds, counts, percentages.
#pragma once

#include <cstdio>
#include <string>

namespace parasol::tools {

inline std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}
inline std::string gib(double bytes) { return fmt("%.1f GiB", bytes / (1024.0 * 1024 * 1024)); }
inline std::string secs(double s) {
  return s >= 1 ? fmt("%.3f s", s) : s >= 1e-3 ? fmt("%.2f ms", s * 1e3) : fmt("%.1f us", s * 1e6);
}
inline std::string pct(double f) { return fmt("%.1f%%", f * 100); }
inline std::string count(double n) {
  return n >= 1e12  ? fmt("%.2fT", n / 1e12)
         : n >= 1e9 ? fmt("%.2fB", n / 1e9)
         : n >= 1e6 ? fmt("%.2fM", n / 1e6)
                    : fmt("%.0f", n);
}

}  // namespace parasol::tools
