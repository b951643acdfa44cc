// Range checks of the command line's numeric flags, as CLI11 validators: a value out of range is
// a parse error that names the flag and the range (exit 2), before any command runs. The plan's
// own fields (--tp, --mbs, ...) are checked by plan_from_json with the same ranges as a plan file.
#pragma once

#include <CLI/CLI.hpp>
#include <cmath>
#include <string>

namespace parasol::tools {

// The largest count a flag takes: GPUs, plans listed, threads, steps, samples.
inline constexpr int kMaxCount = 1 << 24;

// An integer in [min, max].
inline CLI::Validator count_in(int min, int max = kMaxCount) { return CLI::Range(min, max); }

// A finite real number > 0 (positive) or >= 0 (otherwise); rejects nan and inf, which
// CLI::PositiveNumber lets through.
inline CLI::Validator finite_number(bool positive) {
  return CLI::Validator(
      [positive](std::string& text) -> std::string {
        double v = 0;
        if (!CLI::detail::lexical_cast(text, v) || !std::isfinite(v))
          return "'" + text + "' is not a finite number";
        if (positive ? !(v > 0) : !(v >= 0))
          return "'" + text + "' must be " + (positive ? "> 0" : ">= 0");
        return {};
      },
      positive ? "POSITIVE" : "NONNEGATIVE");
}

}  // namespace parasol::tools
