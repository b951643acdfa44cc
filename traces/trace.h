// Trace: one schema for predicted (sim/engine) and measured (runtime) timelines of a training
// step, so that the two can be compared op by op. Stored as Chrome trace JSON, which Perfetto
// and chrome://tracing open: one complete event ("ph": "X") per op, "pid" = rank, "tid" =
// stream, times in microseconds, and the op's identity in "args"; "M" metadata events name the
// processes ("rank N", or a name the writer gives) and the threads (the stream names of the
// Program) and order them; "C" counter events carry per-rank counters (device memory) and "s"/"f"
// flow events draw dependencies between ops (pipeline send -> recv, producer -> collective).
#pragma once

#include <iosfwd>
#include <string>
#include <vector>

#include "core/json_reader.h"

namespace parasol::traces {

// The kind of the simulator's host-row events: the span in which the host issued an op (its op
// id is the op's). They are not device work and match no measured op.
inline constexpr const char* kHostIssueKind = "host-issue";

struct TraceEvent {
  int rank = 0;          // global rank (Chrome "pid")
  int stream = 0;        // stream index of the rank's Program (Chrome "tid")
  std::string name;      // op name, e.g. "L3.fc1"
  double start_s = 0;    // seconds from the start of the step
  double dur_s = 0;      // seconds
  int op_id = -1;        // Op::id in the rank's Program; -1 when unknown
  std::string kind;      // op_kind_name(), e.g. "linear", "all-reduce"
  double bytes = 0;      // payload bytes (communication, copies)
  double flops = 0;      // executed FLOPs
  int layer = -1;        // model layer; -1 outside layers
  int micro_batch = -1;  // -1 for per-step ops
  std::string phase;     // phase_name(): "fwd", "bwd", "recompute", "optimizer"; or ""
  std::string group;     // communication group (group_name(): "tp", "dp", ...) or ""
  double end_s() const { return start_s + dur_s; }
};

// The name of one stream of one rank (written as a "thread_name" metadata event).
struct TraceStream {
  int rank = 0;
  int stream = 0;
  std::string name;  // e.g. "compute", "comm", "copy"
};

// The name of one rank's process (a "process_name" metadata event), e.g. "rank 4 (stage 1)".
struct TraceProcess {
  int rank = 0;
  std::string name;
};

// One sample of a counter track of a rank (a Chrome "C" event): from t_s on, the counter `name`
// of `rank` is `value`. Written as {"ph":"C","name":name,"pid":rank,"args":{key:value}}; Perfetto
// names the track "<name> <key>", e.g. "device memory bytes".
struct TraceCounter {
  int rank = 0;
  std::string name;           // e.g. "device memory"
  std::string key = "value";  // the args key, e.g. "bytes"
  double t_s = 0;
  double value = 0;
};

// A dependency arrow from one op event to another. Written as Chrome flow events v1: an "s" event
// right after the source's "X" event and an "f" event with "bp":"e" right after the target's;
// Perfetto binds each to the slice open on its thread at its time and drops an "f" that comes
// before its "s" in time, so the "s" is at the source's midpoint and the "f" at the target's
// midpoint, or later (up to the target's end) to be no earlier than the "s"; where the target
// ends before that, the "s" moves back towards the source's start.
struct TraceFlow {
  std::string name;  // the flow's "name" and "cat": "pipeline" (send -> recv) or "dependency"
  size_t from = 0;   // index of the source event in Trace::events
  size_t to = 0;     // index of the target event in Trace::events
};

struct Trace {
  std::vector<TraceEvent> events;
  std::vector<TraceStream> streams;     // optional names of (rank, stream) pairs
  std::vector<TraceProcess> processes;  // optional process names (default "rank N")
  std::vector<TraceCounter> counters;   // counter samples (any order)
  std::vector<TraceFlow> flows;         // dependency arrows
  std::string source;                   // "predicted" or "measured"
  // The plan the trace is of (core/plan.h's plan_to_json, with its "model", "cluster" and
  // "gpus" references) when the writer knows it; null otherwise. Lets compare map ranks to
  // pipeline stages and calibrate lower the Programs the trace ran.
  Json plan;
  // The training steps the trace holds, where its writer stated them (`parasol run --trace`
  // records --trace-steps steps); 0 unstated (summary.h counts them by op id). A trace whose op
  // ids are gone (compare --measured) is divided by it.
  int steps = 0;
};

// Chrome trace JSON: {"traceEvents": [...], "displayTimeUnit": "ms",
//  "otherData": {"source": ..., "generator": "parasol", "plan": {...} (when known), "steps": N
//  (when stated)}}; an event's
// "args" carry op_id, kind, bytes, flops, layer, micro_batch, phase and (when not empty) group.
// Process-name and process_sort_index (= rank) metadata is written for every rank that has
// events, streams, processes or counters (the name from `processes`, else "rank N");
// thread-name and thread_sort_index (= stream) metadata for every entry of `streams`; then the
// events, each followed by the "s" and "f" events of the flows that start and end at it (flow
// ids 1, 2, ... in the order of trace.flows; a flow naming an event out of range is left out),
// then the counters ("C"). Output is deterministic.
void write_trace(const Trace& trace, std::ostream& out);
// Writes to a file; an unwritable path is a parasol::Error naming the path.
void write_trace_file(const Trace& trace, const std::string& path);

// Parses Chrome trace JSON (the object form above or a bare array of events). Complete events
// ("ph": "X") must carry ph, name, ts, dur, pid and tid (numbers; dur >= 0); a missing or
// malformed field is a parasol::Error naming it ("<what>.traceEvents[12].dur: missing").
// Metadata events ("ph": "M") named "thread_name" fill `streams`, "process_name" `processes`;
// counter events ("C": name, ts, pid and an args object) fill `counters` (one per numeric arg);
// flow events "s" and "f" (pid, tid, ts, integer id) fill `flows`, each end bound as Perfetto
// binds it: to the last complete event read before it on its (pid, tid) when that event's interval
// holds ts, else to the latest-starting one that does (paired by cat and id, in any order; an end
// that binds to
// no event, an "f" without its "s" and an "s" without its "f" are ignored); other phases are
// ignored.
// `what` names the source (a file path) in errors.
Trace trace_from_json(const Json& j, const std::string& what = "trace");
// Reads and parses a file (Error naming the path when it is missing or not JSON).
Trace read_trace_file(const std::string& path);

// The events of a Chrome trace document `j`: its "traceEvents" array, or `j` itself when it is
// an array; nullptr when `j` is neither an object nor an array. An object without a
// "traceEvents" array is a parasol::Error at "<what>.traceEvents" ("missing", "must be an
// array"). Parasol's traces and PyTorch profiler traces are read through it.
const Json* trace_events(const Json& j, const std::string& what);

// Merges per-rank traces (e.g. one file per rank of a measured run) into one: events and
// stream names concatenated and sorted by (rank, stream, start); processes, counters and flows
// concatenated (flows follow their events). The sources must agree (or be
// empty), so must the plans (or be null) and the stated steps (or be 0), and a rank may appear
// in one input only: violations
// are parasol::Error naming "traces[i]".
Trace merge_traces(const std::vector<Trace>& traces);
// The same, naming input i as names[i] (e.g. its file) in errors.
// REQUIRES: names.size() == traces.size().
Trace merge_traces(const std::vector<Trace>& traces, const std::vector<std::string>& names);
// Reads every file and merges them; errors name the offending file.
Trace read_trace_files(const std::vector<std::string>& paths);

}  // namespace parasol::traces
