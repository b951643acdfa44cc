// Trace annotation: what makes a predicted or measured timeline read well in Perfetto beyond
// its op events. Process names that say each rank's pipeline stage, flow arrows for the
// dependencies worth seeing (pipeline send -> matching recv across ranks, producer -> the
// collective that consumes it within a rank), and the device-memory counter of a rank from the
// liveness of its Program (core/liveness.h).
#pragma once

#include <vector>

#include "core/liveness.h"
#include "core/plan.h"
#include "core/program.h"
#include "traces/trace.h"

namespace parasol::sim {

// The counter name and args key of the device-memory tracks ("device memory bytes" in Perfetto).
inline constexpr const char* kMemoryCounter = "device memory";
inline constexpr const char* kMemoryKey = "bytes";

// Sets trace.processes to "rank R (stage S)" for every rank of trace.events and adds to
// trace.flows, for the ranks and ops present in trace.events:
//  - "pipeline": each pipeline send (Group::kPp, tag >= 0) to the recv of the same tag on the
//    peer stage's rank with the same other coordinates (RankLayout); the recv completes only
//    once the send has started and its data arrived, so the recv ends no earlier than the send
//    starts (in the simulator: no earlier than the send ends);
//  - "dependency": each compute op (cost::is_compute_kind) on another stream that a collective
//    (all-reduce, reduce-scatter, all-gather, all-to-all, broadcast) depends on, to that
//    collective (e.g. a weight-gradient GEMM -> its bucket's reduce-scatter); the collective
//    starts no earlier than its producer ends.
// An op recorded k times (several steps) is matched occurrence by occurrence in time order.
// Flows are at most one per send plus one per collective dependency: O(ops).
// REQUIRES: programs[s] is stage s's Program of `plan` (op ids as in the trace's op_id).
void annotate_trace(traces::Trace& trace, const Plan& plan, const std::vector<Program>& programs);

// Adds the "device memory" counter of `rank` (key "bytes") from `lv`, the liveness of the
// Program whose ops the rank's events are (their op_id): in issue order, op i contributes the
// sample lv.live_during_op[i] at its event's start (clamped so that samples never go back in
// time), and the last op the sample lv.live_after_op at its end; a sample equal to the one
// before it is left out. The track's maximum is therefore lv.peak_bytes. Ops without an event
// of the rank are skipped; an op recorded several times uses its first event.
void add_liveness_counter(traces::Trace& trace, int rank, const Liveness& lv);

}  // namespace parasol::sim
