// The measured traces of other tools, whichever wrote them: `parasol trace import`, `compare
// --measured` and `calibrate --measured` read their files through this one function.
#pragma once

#include <string>
#include <vector>

#include "traces/imported_trace.h"

namespace parasol::traces {

// Imports per-rank files and merges them (merge_imported): an SQLite file (by its header) is an
// Nsight Systems export (nsys_import.h: one rank per process and GPU of the report, numbered on
// from the ranks of the files before it), anything else a PyTorch
// profiler (Kineto) JSON trace, plain or gzip (kineto_import.h), or parasol's own trace
// (otherData.generator "parasol": imported_trace.h's import_parasol_trace, its op ids dropped);
// another JSON file is an Error. Errors name the file.
ImportedTrace import_framework_traces(const std::vector<std::string>& paths);

}  // namespace parasol::traces
