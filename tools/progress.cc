// The terminal progress bar of long commands: "\r<label> [#####     ]  50%" redrawn in place.
#include "tools/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>

namespace parasol::tools {

namespace {
constexpr int kWidth = 30;  // characters of the bar between its brackets
}  // namespace

ProgressBar::ProgressBar(std::FILE* out, bool enabled, std::string label, double delay_s)
    : out_(out),
      enabled_(enabled && out != nullptr),
      label_(std::move(label)),
      delay_s_(delay_s),
      start_(std::chrono::steady_clock::now()) {}

ProgressBar::~ProgressBar() { finish(); }

void ProgressBar::update(double fraction) {
  if (!enabled_ || finished_) return;
  if (!(fraction >= 0)) fraction = 0;  // NaN too
  fraction = std::min(1.0, fraction);
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  if (elapsed < delay_s_) return;
  const int percent = static_cast<int>(std::floor(fraction * 100));
  if (percent == last_percent_) return;
  last_percent_ = percent;
  const int filled = static_cast<int>(std::floor(fraction * kWidth));
  std::fprintf(out_, "\r%s [%s%s] %3d%%", label_.c_str(), std::string(filled, '#').c_str(),
               std::string(kWidth - filled, ' ').c_str(), percent);
  std::fflush(out_);
  drawn_ = true;
}

void ProgressBar::finish() {
  if (finished_) return;
  finished_ = true;
  if (!drawn_) return;
  // Blank the line and return to its start, so the command's own output begins clean.
  std::fprintf(out_, "\r%*s\r", static_cast<int>(label_.size()) + kWidth + 8, "");
  std::fflush(out_);
}

bool stream_is_terminal(std::FILE* f) { return f != nullptr && isatty(fileno(f)) == 1; }

}  // namespace parasol::tools
