// Megatron-LM training log reader: the elapsed-time-per-iteration lines as step times.
#include "interop/megatron_log.h"

#include <algorithm>
#include <cstdlib>
#include <sstream>

#include "core/error.h"

namespace parasol::interop {

namespace {
constexpr const char* kField = "elapsed time per iteration (ms):";
}

MegatronLog read_megatron_log(const std::string& text, const std::string& what) {
  MegatronLog log;
  std::istringstream in(text);
  int line_no = 0;
  for (std::string line; std::getline(in, line);) {
    ++line_no;
    const size_t at = line.find(kField);
    if (at == std::string::npos) continue;
    const char* start = line.c_str() + at + std::string(kField).size();
    char* end = nullptr;
    const double ms = std::strtod(start, &end);
    if (end == start || !(ms > 0))
      throw Error(what + ":" + std::to_string(line_no),
                  "elapsed time per iteration is not a positive number");
    int iteration = 0;
    const size_t it = line.find(" iteration ");
    if (it != std::string::npos && it < at) iteration = std::atoi(line.c_str() + it + 11);
    log.iterations.push_back(iteration);
    log.step_s.push_back(ms / 1000.0);
  }
  if (log.step_s.size() < 2)
    throw Error(what,
                "needs at least two `elapsed time per iteration (ms)` lines (the first is "
                "warm-up), found " +
                    std::to_string(log.step_s.size()));
  log.skipped = 1;
  std::vector<double> kept(log.step_s.begin() + log.skipped, log.step_s.end());
  std::sort(kept.begin(), kept.end());
  const size_t n = kept.size();
  log.step_time_s = n % 2 ? kept[n / 2] : (kept[n / 2 - 1] + kept[n / 2]) / 2;
  return log;
}

bool looks_like_megatron_log(const std::string& text) {
  return text.find(kField) != std::string::npos;
}

}  // namespace parasol::interop
