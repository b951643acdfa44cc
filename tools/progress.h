// A progress bar for long commands (`parasol search`): drawn on one line of a stream (stderr),
// only when that stream is a terminal and only once the work has run longer than a delay, so
// that quick runs, pipes, files and --json output never see it.
#pragma once

#include <chrono>
#include <cstdio>
#include <string>

namespace parasol::tools {

class ProgressBar {
 public:
  // Draws to `out` when `enabled` (callers pass stream_is_terminal(out)), with `label` before
  // the bar, once `delay_s` seconds have passed since construction.
  ProgressBar(std::FILE* out, bool enabled, std::string label, double delay_s = 1.0);
  ~ProgressBar();  // finish()
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  // The fraction done, in [0, 1] (clamped). Redraws the line when enabled, past the delay, and
  // the shown percentage changed. Not thread-safe: call from one thread at a time.
  void update(double fraction);
  // Erases the line if anything was drawn; later updates draw nothing.
  void finish();
  // Whether anything has been drawn.
  bool drawn() const { return drawn_; }

 private:
  std::FILE* out_;
  bool enabled_;
  std::string label_;
  double delay_s_;
  std::chrono::steady_clock::time_point start_;
  bool drawn_ = false;
  bool finished_ = false;
  int last_percent_ = -1;
};

// Whether `f` is a terminal (isatty of its descriptor).
bool stream_is_terminal(std::FILE* f);

}  // namespace parasol::tools
