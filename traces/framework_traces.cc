// import_framework_traces: each file by its format, then merged (see framework_traces.h).
#include "traces/framework_traces.h"

#include "core/error.h"
#include "traces/kineto_import.h"
#include "traces/nsys_import.h"
#include "traces/text_file.h"

namespace parasol::traces {

ImportedTrace import_framework_traces(const std::vector<std::string>& paths) {
  if (paths.empty()) throw Error("traces", "no trace file given");
  std::vector<ImportedTrace> parts;
  for (size_t f = 0; f < paths.size(); ++f) {
    const int rank = static_cast<int>(f);
    if (is_sqlite_file(paths[f]))
      parts.push_back(import_nsys(paths[f], rank));
    else {
      const Json j = parse_json(read_text_file(paths[f]), paths[f]);
      if (!looks_like_kineto(j))
        throw Error(
            paths[f],
            "not a PyTorch profiler trace (no schemaVersion, distributedInfo or device "
            "activity); compare and calibrate read parasol's own traces without --measured");
      parts.push_back(import_kineto(j, paths[f], rank));
    }
  }
  return merge_imported(std::move(parts), paths);
}

}  // namespace parasol::traces
