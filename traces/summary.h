// Summaries of a Trace: step time, time per op kind, phase, group and stream, and where each
// rank's step went (compute, exposed communication, exposed copies, bubble). The same figures
// for a predicted and a measured trace are what `parasol compare` sets side by side.
//
// Steps. A trace may hold several training steps (a measured run records every step): the k-th
// event of an op id on a rank belongs to step k; events without an op id belong to the last
// step that started at or before them. A step lasts from its first event's start to its last
// event's end over all ranks. Figures below are per step: medians for the step time, means
// over steps for the rest.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "core/json_reader.h"
#include "traces/trace.h"

namespace parasol::traces {

// The op kinds that communicate (collectives, send, recv; core/program.h's is_communication;
// "collective": an NCCL kernel that does not say which, kernel_kinds.h) and the copies between
// device and host, by their trace names ("all-reduce", "offload", ...).
bool is_communication_kind(const std::string& kind);
bool is_copy_kind(const std::string& kind);

// The median of `values` (the mean of the middle two for an even count; 0 for none).
double median(std::vector<double> values);

// Where one rank's step went. Every instant of the step (the window of all ranks) is in
// exactly one category, so the four parts sum to the step time (as sim::SimBreakdown):
//  compute        a compute op runs on any stream of the rank;
//  exposed_comm   no compute runs, a collective or a send does (communication not overlapped
//                 by compute on the same rank);
//  exposed_copy   neither runs, an offload or prefetch does;
//  bubble         nothing runs: the rank waits for another rank or stage, or has finished.
// Receives are waits for the sender (whose send carries the transfer), so their time is
// bubble. A collective counts from its start, including any wait for its last member (a trace
// does not tell waiting from transfer; the simulator's breakdown counts a pipeline-group
// rendezvous's wait as bubble). comm is all communication time (the union of collectives
// and sends, overlapped or not), and compute_idle() the time the rank's compute is idle
// (exposed + bubble).
struct RankTime {
  int rank = -1;
  double compute_s = 0;
  double exposed_comm_s = 0;
  double exposed_copy_s = 0;
  double bubble_s = 0;
  double comm_s = 0;
  double compute_idle_s() const { return exposed_comm_s + exposed_copy_s + bubble_s; }
  double total_s() const { return compute_s + compute_idle_s(); }
};

// Per category: seconds (the sum of event durations over all ranks, per step) and events
// (counted over the whole trace).
struct Totals {
  std::map<std::string, double> seconds;
  std::map<std::string, int> events;
};

struct TraceSummary {
  int ranks = 0;                     // distinct ranks with events
  int steps = 0;                     // 0 for a trace without events
  double step_time_s = 0;            // median over steps
  std::vector<double> step_times_s;  // each step, in order
  Totals by_kind;                    // "linear", "all-reduce", ...
  Totals by_phase;                   // "forward", "backward", "recompute", "optimizer", "" (none)
  Totals by_group;                   // communication events only: "tp", "dp", ... ("" unknown)
  Totals by_stream;                  // stream names ("compute", "comm", ...; "stream N" unnamed)
  std::vector<RankTime> rank_time;   // per rank (ascending), mean over steps
  RankTime mean;                     // mean over ranks (rank = -1)
  RankTime worst;                    // the rank with the most compute (as the simulator's
                                     // critical stage)
};

// Summarises `trace`. Events must have dur_s >= 0 (as read_trace_file ensures).
TraceSummary summarize(const Trace& trace);

// {"ranks", "steps", "step_time_s", "step_times_s", "by_kind": {k: {"seconds", "events"}},
//  "by_phase", "by_group", "by_stream", "mean": R, "worst": R, "rank_time": [R]}, where R is
//  {"rank", "compute_s", "exposed_comm_s", "exposed_copy_s", "bubble_s", "comm_s",
//   "compute_idle_s"}.
Json summary_to_json(const TraceSummary& s);

}  // namespace parasol::traces
