// What a trace import returns, whichever tool wrote the trace (PyTorch profiler:
// kineto_import.h; Nsight Systems: nsys_import.h): the device activities as a parasol Trace of
// "measured" events without op ids, each event's shape where the trace said it, the events per
// kind, the kernels no rule classified (named and counted), and each rank's launch gaps.
//
// Launch gaps. Per rank, an interval in which no device activity runs between its first and
// last one is idle time; the part of it until the next activity's launch call returned (the
// device waited for the host to launch it) is the host's launch gap.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/json_reader.h"
#include "traces/trace.h"

namespace parasol::traces {

// What one imported event was shaped as, where the trace said (parallel to Trace::events).
struct KernelShape {
  int64_t m = 0, n = 0, k = 0, batch = 1;  // GEMMs
  // Attention: [batch, heads, seq_q, head_dim] of the query, kv_heads and seq_kv of the key.
  int64_t attn_batch = 0, heads = 0, kv_heads = 0, seq_q = 0, seq_kv = 0, head_dim = 0;
  double elements = 0;    // compute ops: elements of the first input; collectives: the payload's
  std::string dtype;      // parasol's dtype name ("fp32", "bf16", ...) or "" when unknown
  int group_size = 0;     // collectives: ranks of the communicator (0: unknown)
  std::string group;      // collectives: the process group's name or description, when given
  std::string size_from;  // collectives: "kernel", "record_param_comms", "c10d" or "" (unknown)
};

struct KernelCount {
  std::string name;
  int count = 0;
  double seconds = 0;  // summed over the occurrences
};

struct RankGaps {
  int rank = 0;
  double busy_s = 0;    // the union of the rank's device activities
  double idle_s = 0;    // between its first and last activity, nothing ran
  double launch_s = 0;  // the part of idle_s that waited for the host's launch
  int launch_gaps = 0;  // idle intervals with a launch wait
};

struct ImportedTrace {
  Trace trace;                      // source "measured", no op ids, no plan
  std::vector<KernelShape> shapes;  // one per trace.events entry
  std::vector<std::string> files;
  int kernels = 0;  // kernel events (not memcpy or memset)
  // Training steps the trace holds: the most "ProfilerStep#N" annotations of a file (at least 1).
  int steps = 1;
  std::map<std::string, int> by_kind;     // events per kind, "unclassified" included
  std::vector<KernelCount> unclassified;  // by name, most time first
  std::vector<RankGaps> gaps;             // per rank, ascending
};

// One device activity of a rank, in microseconds of the trace's clock: its interval and when the
// host call that launched it returned (< 0: unknown).
struct DeviceSpan {
  double start = 0, end = 0, launch_end = -1;
};

// Completes a rank's import whose trace.events (all of `rank`) are filled: by_kind,
// unclassified (events of kind "unclassified", by name), gaps from `spans`, the streams named by
// what they ran ("compute", "comm" or "copy (cuda stream N)") and the process "rank N".
void finish_rank(ImportedTrace& imp, int rank, const std::vector<DeviceSpan>& spans);

// Merges per-rank imports (parts[i] read from files[i]): times from the earliest activity of all,
// events (with their shapes) by (rank, stream, start); two parts of one rank are a
// parasol::Error naming the file. REQUIRES: parts.size() == files.size().
ImportedTrace merge_imported(std::vector<ImportedTrace> parts,
                             const std::vector<std::string>& files);

// {"files", "ranks", "events", "steps", "kernels", "by_kind": {kind: {"events", "seconds"}},
//  "unclassified": [{"name", "count", "seconds"}], "gaps": [{"rank", "busy_s", "idle_s",
//  "launch_s", "launch_gaps"}], "collectives": [{"kind", "events", "bytes", "sized"}]}.
Json import_summary_to_json(const ImportedTrace& imp);

}  // namespace parasol::traces
