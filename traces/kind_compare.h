// Compare a plan's prediction with a measured trace that has no op ids (an imported framework
// trace, traces/kineto_import.h; `parasol compare --measured`): the two cannot be matched op by
// op, so they are set side by side per op kind, per phase, per stream and in step time.
//
// Figures are seconds per rank and step: a trace's per-step totals (summary.h) divided by its
// ranks (the prediction plays one representative rank per pipeline stage, the measurement has
// the ranks it traced). A measured trace without op ids is one step in summary.h's terms; when it
// holds `measured_steps` profiler steps its figures are divided by them. Streams are compared by
// role, the first word of the stream's name: "compute", "comm" (comm0, comm1, ... and the
// imported "comm (cuda stream N)"), "copy". Kinds only one side has get a row with 0 on the other
// (an imported trace's "elementwise", "memcpy" or "unclassified"; a prediction's "bias"). Phases
// are the events' ("fwd", "bwd", "recompute", "optimizer"; an import infers them from the launching
// CPU ops, "(none)" where it could not).
#pragma once

#include <string>
#include <vector>

#include "core/json_reader.h"
#include "traces/compare.h"
#include "traces/trace.h"

namespace parasol::traces {

struct KindComparison {
  int predicted_ranks = 0;
  int measured_ranks = 0;
  int measured_steps = 1;
  std::vector<CompareRow> by_kind;    // by measured time, largest first; events: measured events
  std::vector<CompareRow> by_phase;   // fwd, bwd, recompute, optimizer, then (none) and others
  std::vector<CompareRow> by_stream;  // "compute", "comm", "copy" (and other roles), by name
  CompareRow busy;                    // all ops of a rank per step, summed over its streams
  // The step time. Predicted: summary's. Measured: `measured_step_s` where the trace timed its
  // steps (ImportedTrace::step_time_s: ProfilerStep ranges, each on its rank's own clock), else
  // the span of all ranks' events / measured_steps.
  CompareRow step;
};

// REQUIRES: measured_steps >= 1. Throws parasol::Error ("measured") when the measured trace has
// no events, ("predicted") when the prediction has none.
KindComparison compare_by_kind(const Trace& predicted, const Trace& measured, int measured_steps,
                               double measured_step_s = 0);

// {"predicted_ranks", "measured_ranks", "measured_steps", "by_kind": [Row], "by_phase": [Row],
//  "by_stream": [Row],
//  "busy": Row, "step": Row}, Row as compare.h's comparison_to_json.
Json kind_comparison_to_json(const KindComparison& c);

}  // namespace parasol::traces
