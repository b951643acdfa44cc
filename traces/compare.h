// Compare a predicted and a measured trace of one plan op by op (`parasol compare`): total time
// per op kind and per phase, predicted against measured, then the step time, exposed
// communication and bubble.
//
// Matching. Events match by (rank, op id). The simulator plays one representative rank per
// pipeline stage (the stage's rank whose other coordinates are all 0; sim/engine.h), while a
// measured trace has every rank. All ranks of a stage run the same Program, so a measured rank
// r is matched to the predicted rank
//   1. r itself, when the prediction has events of rank r;
//   2. else, when either trace records its plan (Trace::plan), the representative of r's
//      pipeline stage under that plan's rank layout;
//   3. else the predicted rank with which r shares the most op ids of equal name and kind.
// Several steps: an op's duration is the median over the steps (the k-th event of an op id on
// a rank is in step k). Totals are per step, summed over the measured ranks: every measured
// (rank, op id) contributes its measured and its matched predicted duration once.
//
// Rejection (parasol::Error naming the offending trace and rank or op): a trace without op
// ids, a measured rank whose op ids the prediction lacks or that shares none with it, and an
// op id whose name or kind differ between the traces: those are traces of another program.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "core/json_reader.h"
#include "traces/summary.h"
#include "traces/trace.h"

namespace parasol::traces {

struct CompareRow {
  std::string key;         // op kind, phase, or the figure's name
  double predicted_s = 0;  // seconds per step
  double measured_s = 0;   // seconds per step
  int events = 0;          // matched (measured rank, op id) pairs; 0 for whole-step figures
  // (predicted - measured) / measured; 0 when nothing was measured.
  double error() const { return measured_s > 0 ? (predicted_s - measured_s) / measured_s : 0; }
};

struct Comparison {
  std::map<int, int> rank_map;       // measured rank -> predicted rank
  int matched = 0;                   // matched (measured rank, op id) pairs
  int unmatched_predicted = 0;       // predicted op ids that a measured rank mapped to it lacks
  std::vector<CompareRow> by_kind;   // sorted by measured time, largest first
  std::vector<CompareRow> by_phase;  // in Phase order ("fwd", "bwd", "recompute", "optimizer"),
                                     // then "(none)" and other names
  CompareRow total;                  // all matched events
  CompareRow step;                   // step time (median over steps)
  CompareRow exposed_comm;           // mean over ranks (summary.h's RankTime)
  CompareRow bubble;                 // mean over ranks
  TraceSummary predicted, measured;
};

// Compares two traces; the names (file paths) appear in errors.
Comparison compare_traces(const Trace& predicted, const Trace& measured,
                          const std::string& predicted_name = "predicted",
                          const std::string& measured_name = "measured");

// {"key", "predicted_s", "measured_s", "events", "error"}.
Json compare_row_to_json(const CompareRow& r);

// The row key of an event's phase: the phase, or "(none)" for "".
std::string phase_key(const std::string& phase);
// Rows keyed by phase, in Phase order ("fwd", "bwd", "recompute", "optimizer"), then "(none)",
// then other names alphabetically; each row's key set to its phase.
std::vector<CompareRow> phase_rows(std::map<std::string, CompareRow> by_phase);

// {"matched", "unmatched_predicted", "rank_map": {"<measured>": predicted},
//  "by_kind": [Row], "by_phase": [Row], "total": Row, "step": Row, "exposed_comm": Row,
//  "bubble": Row}, Row = {"key", "predicted_s", "measured_s", "events", "error"}.
Json comparison_to_json(const Comparison& c);

}  // namespace parasol::traces
