// Trace annotation (see trace_annotate.h): process names, dependency flows and liveness memory
// counters, keyed by the (rank, op id) of the trace's events.
#include "sim/trace_annotate.h"

#include <algorithm>
#include <map>
#include <string>
#include <utility>

#include "core/rank_layout.h"
#include "cost_models/op_cost.h"

namespace parasol::sim {

namespace {

bool is_collective(OpKind k) {
  return k == OpKind::kAllReduce || k == OpKind::kReduceScatter || k == OpKind::kAllGather ||
         k == OpKind::kAllToAll || k == OpKind::kBroadcast;
}

// The events of each (rank, op id), in time order (one per recorded step).
using EventIndex = std::map<std::pair<int, int>, std::vector<size_t>>;

EventIndex index_events(const traces::Trace& trace) {
  EventIndex idx;
  for (size_t i = 0; i < trace.events.size(); ++i) {
    const traces::TraceEvent& e = trace.events[i];
    if (e.op_id >= 0) idx[{e.rank, e.op_id}].push_back(i);
  }
  for (auto& [key, list] : idx)
    std::stable_sort(list.begin(), list.end(), [&](size_t a, size_t b) {
      return trace.events[a].start_s < trace.events[b].start_s;
    });
  return idx;
}

}  // namespace

void annotate_trace(traces::Trace& trace, const Plan& plan, const std::vector<Program>& programs) {
  const RankLayout layout(plan);
  const EventIndex idx = index_events(trace);
  // Ranks present and their stages.
  std::map<int, int> stage_of;
  for (const traces::TraceEvent& e : trace.events)
    if (e.rank >= 0 && e.rank < layout.world()) stage_of.emplace(e.rank, layout.coord(e.rank).pp);
  trace.processes.clear();
  for (auto [rank, stage] : stage_of)
    trace.processes.push_back(
        {rank, "rank " + std::to_string(rank) + " (stage " + std::to_string(stage) + ")"});
  // Per stage: the recv op of each (peer stage, tag) on Group::kPp.
  std::vector<std::map<std::pair<int, int64_t>, int>> recv_of(programs.size());
  for (size_t s = 0; s < programs.size(); ++s)
    for (const Op& op : programs[s].ops)
      if (op.kind == OpKind::kRecv && op.group == Group::kPp && op.tag >= 0)
        recv_of[s][{op.peer_stage, op.tag}] = op.id;
  auto flow = [&](const char* name, size_t from, size_t to) {
    trace.flows.push_back({name, from, to});
  };
  for (auto [rank, stage] : stage_of) {
    if (stage < 0 || stage >= static_cast<int>(programs.size())) continue;
    const Program& prog = programs[stage];
    const RankCoord me = layout.coord(rank);
    for (const Op& op : prog.ops) {
      auto mine = idx.find({rank, op.id});
      if (mine == idx.end()) continue;
      const std::vector<size_t>& events = mine->second;
      if (op.kind == OpKind::kSend && op.group == Group::kPp && op.tag >= 0 && op.peer_stage >= 0 &&
          op.peer_stage < static_cast<int>(programs.size())) {
        auto r = recv_of[op.peer_stage].find({stage, op.tag});
        if (r == recv_of[op.peer_stage].end()) continue;
        RankCoord peer = me;
        peer.pp = op.peer_stage;
        auto theirs = idx.find({layout.rank(peer), r->second});
        if (theirs == idx.end()) continue;
        const size_t n = std::min(events.size(), theirs->second.size());
        for (size_t k = 0; k < n; ++k) flow("pipeline", events[k], theirs->second[k]);
      } else if (is_collective(op.kind)) {
        for (int d : op.deps) {
          if (d < 0 || d >= static_cast<int>(prog.ops.size())) continue;
          const Op& dep = prog.ops[d];
          if (dep.stream == op.stream || !cost::is_compute_kind(dep.kind)) continue;
          auto src = idx.find({rank, d});
          if (src == idx.end()) continue;
          const size_t n = std::min(events.size(), src->second.size());
          for (size_t k = 0; k < n; ++k) flow("dependency", src->second[k], events[k]);
        }
      }
    }
  }
}

void add_liveness_counter(traces::Trace& trace, int rank, const Liveness& lv) {
  std::vector<const traces::TraceEvent*> first(lv.live_during_op.size(), nullptr);
  for (const traces::TraceEvent& e : trace.events)
    if (e.rank == rank && e.op_id >= 0 && e.op_id < static_cast<int>(first.size()) &&
        (first[e.op_id] == nullptr || e.start_s < first[e.op_id]->start_s))
      first[e.op_id] = &e;
  double t = -1e300, last_value = -1, end = 0;
  int last_op = -1;
  auto sample = [&](double at, double value) {
    t = std::max(t, at);
    if (value == last_value) return;
    trace.counters.push_back({rank, kMemoryCounter, kMemoryKey, t, value});
    last_value = value;
  };
  for (size_t i = 0; i < first.size(); ++i) {
    if (first[i] == nullptr) continue;
    sample(first[i]->start_s, lv.live_during_op[i]);
    end = std::max(end, first[i]->end_s());
    last_op = static_cast<int>(i);
  }
  if (last_op >= 0) sample(end, lv.live_after_op[last_op]);
}

}  // namespace parasol::sim
