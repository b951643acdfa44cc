// Human-readable formatting for the command line and the report: bytes, seconds, counts,
// percentages, and a text table with aligned columns.
#pragma once

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

namespace parasol {

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

// The strings with `sep` between them.
inline std::string join(const std::vector<std::string>& parts, const std::string& sep) {
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) out += (i ? sep : "") + parts[i];
  return out;
}

// A table of text cells, rendered with each column as wide as its widest cell, a header line and
// a rule under it.
class Table {
 public:
  explicit Table(std::vector<std::string> header) : rows_{std::move(header)} {}
  void add(std::vector<std::string> row) {
    row.resize(rows_[0].size());
    rows_.push_back(std::move(row));
  }
  // Display columns of UTF-8 text: its bytes that do not continue a character ("±" is one).
  static size_t display_width(const std::string& s) {
    size_t n = 0;
    for (unsigned char c : s) n += (c & 0xC0) != 0x80;
    return n;
  }
  std::string render() const {
    std::vector<size_t> width(rows_[0].size(), 0);
    for (const auto& r : rows_)
      for (size_t i = 0; i < r.size(); ++i) width[i] = std::max(width[i], display_width(r[i]));
    std::string out;
    for (size_t r = 0; r < rows_.size(); ++r) {
      std::string line;
      for (size_t i = 0; i < width.size(); ++i)
        line += rows_[r][i] + (i + 1 < width.size()
                                   ? std::string(width[i] - display_width(rows_[r][i]) + 2, ' ')
                                   : "");
      out += line + "\n";
      if (r == 0) {
        size_t total = 0;
        for (size_t w : width) total += w + 2;
        out += std::string(total - 2, '-') + "\n";
      }
    }
    return out;
  }

 private:
  std::vector<std::vector<std::string>> rows_;
};

}  // namespace parasol
