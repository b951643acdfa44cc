// import_framework_traces: each file by its format, then merged (see framework_traces.h).
#include "traces/framework_traces.h"

#include <filesystem>

#include "core/error.h"
#include "traces/kineto_import.h"
#include "traces/nsys_import.h"

namespace parasol::traces {

namespace {

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// Refuses, naming it for what it is, a path that is no trace file of a framework: a directory,
// an empty file (an Nsight export that was never written), a Chakra execution trace (Chakra's
// varint-framed protobuf; `parasol export --to chakra` writes them, traces/chakra_import.h reads
// them).
void refuse_what_is_not_a_trace(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_directory(path, ec))
    throw Error(path, "is a directory, not a trace file: give the per-rank files in it");
  if (!fs::exists(path, ec)) throw Error(path, "cannot open file: no such file");
  if (fs::is_regular_file(path, ec) && fs::file_size(path, ec) == 0 && !ec)
    throw Error(path, ends_with(path, ".sqlite")
                          ? "is empty (0 bytes): not an Nsight Systems SQLite export (nsys export "
                            "--type sqlite did not finish?)"
                          : "is empty (0 bytes): not a trace");
  if (ends_with(path, ".et"))
    throw Error(path,
                "is a Chakra execution trace (.et): --measured reads PyTorch profiler (Kineto) "
                "and Nsight Systems traces, not Chakra's");
}

}  // namespace

ImportedTrace import_framework_traces(const std::vector<std::string>& paths) {
  if (paths.empty()) throw Error("traces", "no trace file given");
  std::vector<ImportedTrace> parts;
  std::vector<std::string> names;  // the file of each part
  for (size_t f = 0; f < paths.size(); ++f) {
    const int rank = static_cast<int>(parts.size());
    refuse_what_is_not_a_trace(paths[f]);
    if (is_sqlite_file(paths[f])) {
      for (ImportedTrace& p : import_nsys_ranks(paths[f], rank)) {
        parts.push_back(std::move(p));
        names.push_back(paths[f]);
      }
    } else {
      // Streamed: a rank's trace of gigabytes is never held whole (kineto_import.h).
      bool parasol = false;
      ImportedTrace imp = import_kineto_file(paths[f], rank, /*require_kineto=*/true, &parasol);
      if (!parasol) {
        parts.push_back(std::move(imp));
        names.push_back(paths[f]);
        continue;
      }
      // parasol's own trace (parasol run --trace), read as a measurement without op ids.
      std::vector<ImportedTrace> ranks = import_parasol_trace(read_trace_file(paths[f]));
      if (ranks.empty()) throw Error(paths[f], "is a trace parasol wrote, without events");
      for (ImportedTrace& p : ranks) {
        parts.push_back(std::move(p));
        names.push_back(paths[f]);
      }
    }
  }
  return merge_imported(std::move(parts), names);
}

}  // namespace parasol::traces
