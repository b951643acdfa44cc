// Nsight Systems SQLite import: the CUPTI activity tables read with SQLite's C API (see
// nsys_import.h).
#include "traces/nsys_import.h"

#include <sqlite3.h>

#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <unordered_map>

#include "core/error.h"
#include "traces/kernel_kinds.h"

namespace parasol::traces {

namespace {

struct DbCloser {
  void operator()(sqlite3* db) const { sqlite3_close(db); }
};
struct StmtFinalizer {
  void operator()(sqlite3_stmt* s) const { sqlite3_finalize(s); }
};
using Db = std::unique_ptr<sqlite3, DbCloser>;
using Stmt = std::unique_ptr<sqlite3_stmt, StmtFinalizer>;

// One report's tables.
class Report {
 public:
  explicit Report(const std::string& path) : path_(path) {
    sqlite3* db = nullptr;
    const int rc = sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READONLY, nullptr);
    db_.reset(db);
    if (rc != SQLITE_OK)
      throw Error(path, std::string("cannot open as SQLite: ") + sqlite3_errstr(rc));
  }

  bool has_table(const std::string& table) {
    Stmt s = prepare("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", "");
    sqlite3_bind_text(s.get(), 1, table.c_str(), -1, SQLITE_TRANSIENT);
    return step(s.get(), "") == SQLITE_ROW;
  }

  bool has_column(const std::string& table, const std::string& column) {
    Stmt s = prepare("SELECT 1 FROM pragma_table_info(?) WHERE name = ?", "");
    sqlite3_bind_text(s.get(), 1, table.c_str(), -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(s.get(), 2, column.c_str(), -1, SQLITE_TRANSIENT);
    return step(s.get(), "") == SQLITE_ROW;
  }

  // A statement over `table` (named in errors).
  Stmt prepare(const std::string& sql, const std::string& table) {
    sqlite3_stmt* s = nullptr;
    if (sqlite3_prepare_v2(db_.get(), sql.c_str(), -1, &s, nullptr) != SQLITE_OK) {
      const std::string msg = sqlite3_errmsg(db_.get());
      sqlite3_finalize(s);
      // "file is not a database", "no such column: shortName", ...
      throw Error(table.empty() ? path_ : path_ + "." + table, msg);
    }
    return Stmt(s);
  }

  int step(sqlite3_stmt* s, const std::string& table) {
    const int rc = sqlite3_step(s);
    if (rc != SQLITE_ROW && rc != SQLITE_DONE)
      throw Error(table.empty() ? path_ : path_ + "." + table, sqlite3_errmsg(db_.get()));
    return rc;
  }

  const std::string& path() const { return path_; }

 private:
  std::string path_;
  Db db_;
};

// Column `c` of the current row as a time in nanoseconds (an integer >= 0); else an Error
// naming the table, row and column.
double time_ns(sqlite3_stmt* s, int c, const std::string& where, const char* column) {
  if (sqlite3_column_type(s, c) != SQLITE_INTEGER)
    throw Error(where + "." + column, "missing or not an integer");
  const int64_t v = sqlite3_column_int64(s, c);
  if (v < 0) throw Error(where + "." + column, "negative");
  return static_cast<double>(v);
}

// An integer column, or `fallback` when NULL.
int64_t integer_or(sqlite3_stmt* s, int c, int64_t fallback) {
  return sqlite3_column_type(s, c) == SQLITE_INTEGER ? sqlite3_column_int64(s, c) : fallback;
}

}  // namespace

bool is_sqlite_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  char head[16] = {};
  f.read(head, sizeof head);
  return f.gcount() == 16 && std::string(head, 15) == "SQLite format 3";
}

std::vector<ImportedTrace> import_nsys_ranks(const std::string& path, int first_rank) {
  if (!is_sqlite_file(path)) throw Error(path, "not an SQLite file (nsys export --type sqlite)");
  Report db(path);
  const std::string kKernels = "CUPTI_ACTIVITY_KIND_KERNEL";
  if (!db.has_table(kKernels))
    throw Error(path + "." + kKernels,
                "missing: the report has no CUDA kernels (profile with nsys --trace=cuda)");
  if (!db.has_table("StringIds")) throw Error(path + ".StringIds", "missing");
  std::unordered_map<int64_t, std::string> strings;
  {
    Stmt s = db.prepare("SELECT id, value FROM StringIds", "StringIds");
    while (db.step(s.get(), "StringIds") == SQLITE_ROW) {
      const unsigned char* v = sqlite3_column_text(s.get(), 1);
      strings[sqlite3_column_int64(s.get(), 0)] = v ? reinterpret_cast<const char*>(v) : "";
    }
  }
  // Launch calls by correlation id: when each returned (ns).
  std::unordered_map<int64_t, double> launch_end;
  if (db.has_table("CUPTI_ACTIVITY_KIND_RUNTIME")) {
    const std::string t = "CUPTI_ACTIVITY_KIND_RUNTIME";
    Stmt s = db.prepare("SELECT end, correlationId FROM " + t, t);
    for (int row = 0; db.step(s.get(), t) == SQLITE_ROW; ++row) {
      const std::string where = path + "." + t + "[" + std::to_string(row) + "]";
      launch_end[integer_or(s.get(), 1, -1)] = time_ns(s.get(), 0, where, "end");
    }
  }
  ImportedTrace imp;
  imp.trace.source = "measured";
  std::vector<DeviceSpan> spans;
  // The (process, GPU) of each activity, where the tables say: a report of several processes
  // or GPUs holds several ranks.
  std::vector<std::pair<int64_t, int64_t>> where_ran;
  auto who = [&](const std::string& table) {
    return std::string(db.has_column(table, "globalPid") ? ", globalPid" : ", 0") +
           (db.has_column(table, "deviceId") ? ", deviceId" : ", 0");
  };
  // Adds one activity; returns its event.
  auto add = [&](sqlite3_stmt* s, const std::string& table, int row, const std::string& name,
                 const std::string& kind) -> TraceEvent& {
    const std::string where = path + "." + table + "[" + std::to_string(row) + "]";
    const double start = time_ns(s, 0, where, "start"), end = time_ns(s, 1, where, "end");
    if (end < start) throw Error(where + ".end", "before its start");
    const int64_t stream = integer_or(s, 2, 0);
    if (stream < 0 || stream > (int64_t{1} << 31) - 1)
      throw Error(where + ".streamId", "must be a stream number >= 0");
    TraceEvent e;
    e.rank = first_rank;
    e.stream = static_cast<int>(stream);
    e.name = name;
    e.kind = kind;
    e.start_s = start * 1e-9;
    e.dur_s = (end - start) * 1e-9;
    auto l = launch_end.find(integer_or(s, 3, -1));
    where_ran.push_back({integer_or(s, 6, 0), integer_or(s, 7, 0)});
    spans.push_back({start * 1e-3, end * 1e-3, l == launch_end.end() ? -1 : l->second * 1e-3});
    imp.trace.events.push_back(e);
    imp.shapes.emplace_back();
    return imp.trace.events.back();
  };
  {
    Stmt s = db.prepare("SELECT start, end, streamId, correlationId, demangledName, shortName" +
                            who(kKernels) + " FROM " + kKernels,
                        kKernels);
    for (int row = 0; db.step(s.get(), kKernels) == SQLITE_ROW; ++row) {
      std::string name;
      for (int c : {4, 5}) {
        auto it = strings.find(integer_or(s.get(), c, -1));
        if (name.empty() && it != strings.end()) name = it->second;
      }
      if (name.empty())
        throw Error(path + "." + kKernels + "[" + std::to_string(row) + "].demangledName",
                    "names no string of StringIds");
      const std::string kind = classify_kernel(name);
      add(s.get(), kKernels, row, name, kind.empty() ? "unclassified" : kind);
      ++imp.kernels;
    }
  }
  if (db.has_table("CUPTI_ACTIVITY_KIND_MEMCPY")) {
    const std::string t = "CUPTI_ACTIVITY_KIND_MEMCPY";
    Stmt s = db.prepare(
        "SELECT start, end, streamId, correlationId, bytes, copyKind" + who(t) + " FROM " + t, t);
    for (int row = 0; db.step(s.get(), t) == SQLITE_ROW; ++row) {
      const int64_t kind = integer_or(s.get(), 5, 0);
      TraceEvent& e = add(s.get(), t, row,
                          kind == 1   ? "Memcpy HtoD"
                          : kind == 2 ? "Memcpy DtoH"
                                      : "Memcpy (copyKind " + std::to_string(kind) + ")",
                          "memcpy");
      e.bytes = static_cast<double>(std::max<int64_t>(0, integer_or(s.get(), 4, 0)));
    }
  }
  if (db.has_table("CUPTI_ACTIVITY_KIND_MEMSET")) {
    const std::string t = "CUPTI_ACTIVITY_KIND_MEMSET";
    Stmt s = db.prepare(
        "SELECT start, end, streamId, correlationId, bytes, NULL" + who(t) + " FROM " + t, t);
    for (int row = 0; db.step(s.get(), t) == SQLITE_ROW; ++row) {
      TraceEvent& e = add(s.get(), t, row, "Memset", "memset");
      e.bytes = static_cast<double>(std::max<int64_t>(0, integer_or(s.get(), 4, 0)));
    }
  }
  std::set<std::string> steps;
  // The ProfilerStep ranges (start, end in us, as spans are) by the process that opened them
  // (Nsight's globalTid with its thread bits cleared is its globalPid; -1: not said).
  std::map<int64_t, std::vector<std::pair<double, double>>> step_ranges;
  if (db.has_table("NVTX_EVENTS")) {
    const std::string t = "NVTX_EVENTS";
    const bool by_thread = db.has_column(t, "globalTid");
    Stmt s = db.prepare("SELECT text, textId, start, end" +
                            std::string(by_thread ? ", globalTid" : ", NULL") + " FROM " + t,
                        t);
    while (db.step(s.get(), t) == SQLITE_ROW) {
      std::string text;
      if (const unsigned char* v = sqlite3_column_text(s.get(), 0))
        text = reinterpret_cast<const char*>(v);
      else if (auto it = strings.find(integer_or(s.get(), 1, -1)); it != strings.end())
        text = it->second;
      if (text.rfind("ProfilerStep#", 0) != 0) continue;
      steps.insert(text);
      const int64_t start = integer_or(s.get(), 2, -1), end = integer_or(s.get(), 3, -1);
      const int64_t tid = integer_or(s.get(), 4, -1);
      if (start >= 0 && end >= start)
        step_ranges[tid < 0 ? -1 : tid & ~int64_t{0xFFFFFF}].push_back(
            {static_cast<double>(start) * 1e-3, static_cast<double>(end) * 1e-3});
    }
  }
  imp.steps = std::max<int>(1, steps.size());
  // One rank per (process, GPU), in their order, numbered from first_rank.
  std::map<std::pair<int64_t, int64_t>, int> rank_of;
  for (const auto& w : where_ran) rank_of.emplace(w, 0);
  if (rank_of.empty()) rank_of.emplace(std::pair<int64_t, int64_t>{0, 0}, 0);
  int next = first_rank;
  for (auto& [w, r] : rank_of) r = next++;
  std::vector<ImportedTrace> parts(rank_of.size());
  std::vector<std::vector<DeviceSpan>> part_spans(rank_of.size());
  for (size_t i = 0; i < imp.trace.events.size(); ++i) {
    const int r = rank_of.at(where_ran[i]);
    ImportedTrace& p = parts[r - first_rank];
    TraceEvent e = imp.trace.events[i];
    e.rank = r;
    if (e.kind != "memcpy" && e.kind != "memset") ++p.kernels;
    p.trace.events.push_back(std::move(e));
    p.shapes.push_back(imp.shapes[i]);
    part_spans[r - first_rank].push_back(spans[i]);
  }
  std::vector<std::pair<int64_t, int64_t>> where_of(rank_of.size());
  for (const auto& [w, r] : rank_of) where_of[r - first_rank] = w;
  for (size_t k = 0; k < parts.size(); ++k) {
    parts[k].trace.source = "measured";
    parts[k].steps = imp.steps;
    // A rank's steps are the ranges its process opened (profiler_step_seconds); where the report
    // does not say which process opened a range, all of its ranges.
    auto own = step_ranges.find(where_of[k].first);
    std::vector<std::pair<double, double>> ranges;
    if (own != step_ranges.end()) {
      ranges = own->second;
    } else {
      for (const auto& [pid, v] : step_ranges) ranges.insert(ranges.end(), v.begin(), v.end());
    }
    if (!ranges.empty())
      parts[k].step_s[first_rank + static_cast<int>(k)] =
          profiler_step_seconds(std::move(ranges), part_spans[k]);
    finish_rank(parts[k], first_rank + static_cast<int>(k), part_spans[k]);
  }
  return parts;
}

ImportedTrace import_nsys(const std::string& path, int rank) {
  std::vector<ImportedTrace> parts = import_nsys_ranks(path, rank);
  if (parts.size() == 1) return std::move(parts.front());
  const std::vector<std::string> names(parts.size(), path);
  return merge_imported(std::move(parts), names);
}

}  // namespace parasol::traces
