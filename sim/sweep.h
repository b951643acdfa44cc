// The runner of a what-if sweep (tools/sweep.h searches each point of a sim/what_if_cluster.h
// grid): this process's share of the points (rank of ranks), run on threads, largest first, each
// finished row appended to a journal (JSON Lines: the sweep's header line, then one row per line)
// so that an interrupted sweep resumes without recomputing finished points; and the reading of a
// journal or a sweep document back. What a point computes is the caller's; MPI is the command
// line's (tools/sweep_cmd.cc).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/json_reader.h"

namespace parasol::sim {

struct SweepRunOptions {
  int threads = 0;          // 0: all cores
  int rank = 0, ranks = 1;  // this process's share: points with index % ranks == rank
  std::string journal;      // JSON Lines file written as points finish; "" = none
  bool resume = false;      // read the journal and skip its finished points
  // Called (under a lock, from the workers) after each point: points done, points in this share.
  std::function<void(int64_t, int64_t)> progress;
};

// Runs this process's share of points 0 .. points - 1 and returns its rows, in index order:
// run_point(index, threads) computes a point's row (with "index") on `threads` threads, the
// points of largest size_of(index) (its GPU count) starting first. With a journal: a fresh one
// starts with the line {"sweep": header}; with resume, the journal must hold the same sweep (its
// header), its finished rows are kept, a torn last line is dropped, and the rest appended.
// Returns the resumed count through `resumed` when given. Throws parasol::Error naming
// "--resume" for a journal of another sweep, and what run_point throws.
std::vector<Json> run_sweep_points(const Json& header, int64_t points,
                                   const std::function<int64_t(int64_t)>& size_of,
                                   const std::function<Json(int64_t, int)>& run_point,
                                   const SweepRunOptions& options, int64_t* resumed = nullptr);

// Reads a sweep document ({"sweep": header, "rows": [...]}) or a journal (header line, then rows)
// into a document, rows in index order. Throws parasol::Error naming the path.
Json read_sweep_file(const std::string& path);

}  // namespace parasol::sim
