// Tests of the Perfetto annotations of simulated traces (sim/trace_annotate.h, as the engine
// records them) on an interleaved 1F1B plan with tensor and data parallelism: process and thread
// names with sort indices, slices of one (rank, stream) that never partially overlap, flows
// whose two ends exist and are ordered, the liveness memory counter whose maximum is the peak
// the simulation reports, and a round trip through the file that compare still reads.
#include "sim/trace_annotate.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <sstream>

#include "core/lower.h"
#include "core/rank_layout.h"
#include "cost_models/profile.h"
#include "sim/engine.h"
#include "traces/compare.h"

namespace parasol::sim {
namespace {

Plan interleaved_plan() {
  Plan p;
  p.tp = 2, p.pp = 2, p.dp = 2, p.vpp = 2, p.schedule = Schedule::kInterleaved;
  p.micro_batch = 1, p.global_batch = 8;
  return p;
}

struct Played {
  LoweredPlan lowered;
  SimResult sim;
};

const Played& played() {
  static const Played p = [] {
    const Plan plan = interleaved_plan();
    const Model model = model_preset("llama3-8b");
    const Cluster cluster = cluster_preset("dgx-h100", plan.gpus());
    validate(plan, model, cluster);
    LoweredPlan lowered = lower(model, cluster, plan);
    SimResult sim =
        simulate(model, cluster, lowered, cost::default_profile(cluster.gpu_device(0)), true);
    return Played{std::move(lowered), std::move(sim)};
  }();
  return p;
}

// Slack for times that went through a subtraction (dur = end - start) or a microsecond scale.
double slack(double t) { return 1e-12 * std::max(1.0, std::abs(t)); }

TEST(TraceAnnotate, NamesEveryRankWithItsStageAndEveryStream) {
  const Played& p = played();
  std::ostringstream os;
  traces::write_trace(p.sim.trace, os);
  const Json j = parse_json(os.str(), "trace");
  std::map<int, std::string> process_name;
  std::map<int, int> process_sort;
  std::map<std::pair<int, int>, std::string> thread_name;
  std::map<std::pair<int, int>, int> thread_sort;
  for (const Json& e : j["traceEvents"]) {
    if (e["ph"] != "M") continue;
    const int pid = e["pid"], tid = e["tid"];
    if (e["name"] == "process_name") process_name[pid] = e["args"]["name"];
    if (e["name"] == "process_sort_index") process_sort[pid] = e["args"]["sort_index"];
    if (e["name"] == "thread_name") thread_name[{pid, tid}] = e["args"]["name"];
    if (e["name"] == "thread_sort_index") thread_sort[{pid, tid}] = e["args"]["sort_index"];
  }
  ASSERT_EQ(p.sim.stage_rank.size(), 2u);
  EXPECT_EQ(process_name.size(), 2u);
  for (int s = 0; s < 2; ++s) {
    const int r = p.sim.stage_rank[s];
    EXPECT_EQ(process_name[r], "rank " + std::to_string(r) + " (stage " + std::to_string(s) + ")");
    EXPECT_EQ(process_sort[r], r);
    const Program& prog = p.lowered.programs[s];
    for (int k = 0; k < static_cast<int>(prog.streams.size()); ++k) {
      EXPECT_EQ(thread_name[std::make_pair(r, k)], prog.stream_name(k));
      EXPECT_EQ(thread_sort[std::make_pair(r, k)], k);
    }
  }
  // Every op event sits on a named thread.
  for (const traces::TraceEvent& e : p.sim.trace.events)
    EXPECT_TRUE(thread_name.count({e.rank, e.stream})) << e.name;
}

// Perfetto draws the slices of one (pid, tid) as a stack: they must nest. The engine runs a
// stream's ops one at a time, so they must not overlap at all.
TEST(TraceAnnotate, SlicesOfOneStreamNeverOverlap) {
  const Played& p = played();
  std::map<std::pair<int, int>, std::vector<const traces::TraceEvent*>> lanes;
  for (const traces::TraceEvent& e : p.sim.trace.events) lanes[{e.rank, e.stream}].push_back(&e);
  EXPECT_GE(lanes.size(), 6u);  // compute, comm and pipeline streams of two ranks at least
  for (auto& [lane, events] : lanes) {
    std::stable_sort(events.begin(), events.end(),
                     [](auto* a, auto* b) { return a->start_s < b->start_s; });
    for (size_t i = 1; i < events.size(); ++i)
      EXPECT_GE(events[i]->start_s, events[i - 1]->end_s() - slack(events[i]->start_s))
          << "rank " << lane.first << " stream " << lane.second << ": " << events[i - 1]->name
          << " overlaps " << events[i]->name;
  }
}

TEST(TraceAnnotate, FlowsJoinExistingOpsInOrder) {
  const Played& p = played();
  const traces::Trace& t = p.sim.trace;
  int pipeline = 0, dependency = 0;
  for (const traces::TraceFlow& f : t.flows) {
    ASSERT_LT(f.from, t.events.size()) << f.name;
    ASSERT_LT(f.to, t.events.size()) << f.name;
    const traces::TraceEvent* a = &t.events[f.from];
    const traces::TraceEvent* b = &t.events[f.to];
    if (f.name == "pipeline") {
      ++pipeline;
      EXPECT_EQ(a->kind, "send");
      EXPECT_EQ(b->kind, "recv");
      EXPECT_NE(a->rank, b->rank);
      EXPECT_EQ(a->micro_batch, b->micro_batch);
      // The simulated recv completes once the send's data has arrived: no earlier than its end.
      EXPECT_GE(b->end_s(), a->end_s() - slack(a->end_s())) << a->name << " -> " << b->name;
    } else {
      ASSERT_EQ(f.name, "dependency");
      ++dependency;
      EXPECT_EQ(a->rank, b->rank);
      EXPECT_NE(a->stream, b->stream);
      EXPECT_EQ(b->group.empty(), false) << b->name;  // a collective of a group
      // The collective starts no earlier than its producer ends.
      EXPECT_GE(b->start_s, a->end_s() - slack(a->end_s())) << a->name << " -> " << b->name;
    }
  }
  // One pipeline flow per send of the two representatives (their peers are each other).
  int sends = 0;
  for (const traces::TraceEvent& e : t.events) sends += e.kind == "send" && e.group == "pp";
  EXPECT_GT(sends, 0);
  EXPECT_EQ(pipeline, sends);
  EXPECT_GT(dependency, 0);
  // Bounded: at most one flow per op dependency.
  size_t deps = 0;
  for (const Program& prog : p.lowered.programs)
    for (const Op& op : prog.ops) deps += op.deps.size() + 1;
  EXPECT_LE(t.flows.size(), deps);
}

TEST(TraceAnnotate, MemoryCounterPeaksAtTheLivenessPeak) {
  const Played& p = played();
  for (int s = 0; s < 2; ++s) {
    const int r = p.sim.stage_rank[s];
    double most = -1, last_t = -1e300, last_value = -1;
    int samples = 0;
    for (const traces::TraceCounter& c : p.sim.trace.counters) {
      if (c.rank != r) continue;
      EXPECT_EQ(c.name, kMemoryCounter);
      EXPECT_EQ(c.key, kMemoryKey);
      EXPECT_GE(c.t_s, last_t);  // samples go forward in time
      last_t = c.t_s;
      most = std::max(most, c.value);
      last_value = c.value;
      ++samples;
    }
    EXPECT_GT(samples, 10) << "rank " << r;
    EXPECT_EQ(most, p.sim.peak_memory_per_stage[s]) << "stage " << s;
    // The last sample is what stays allocated after the last op.
    EXPECT_EQ(last_value, liveness(p.lowered.programs[s]).live_after_op.back());
  }
}

TEST(TraceAnnotate, RoundTripsThroughTheFileAndCompareReadsIt) {
  const Played& p = played();
  std::ostringstream os;
  traces::write_trace(p.sim.trace, os);
  // Perfetto drops a flow whose "f" comes before its "s" in time.
  std::map<int64_t, std::map<std::string, double>> flow_ts;
  const Json file = parse_json(os.str(), "t.json");
  for (const Json& e : file["traceEvents"])
    if (e["ph"] == "s" || e["ph"] == "f") flow_ts[e["id"].get<int64_t>()][e["ph"]] = e["ts"];
  EXPECT_EQ(flow_ts.size(), p.sim.trace.flows.size());
  for (auto& [id, ends] : flow_ts) {
    ASSERT_EQ(ends.size(), 2u) << id;
    EXPECT_LE(ends["s"], ends["f"]) << id;
  }
  const traces::Trace u = traces::trace_from_json(parse_json(os.str(), "t.json"), "t.json");
  ASSERT_EQ(u.events.size(), p.sim.trace.events.size());
  ASSERT_EQ(u.counters.size(), p.sim.trace.counters.size());
  ASSERT_EQ(u.flows.size(), p.sim.trace.flows.size());
  ASSERT_EQ(u.processes.size(), p.sim.trace.processes.size());
  for (size_t i = 0; i < u.counters.size(); ++i) {
    EXPECT_EQ(u.counters[i].rank, p.sim.trace.counters[i].rank);
    EXPECT_EQ(u.counters[i].value, p.sim.trace.counters[i].value);
    EXPECT_DOUBLE_EQ(u.counters[i].t_s, p.sim.trace.counters[i].t_s);
  }
  // Each flow binds back to its own two events (the file's flow ends follow their events, so
  // that zero-length recvs at one time are told apart), in the order of their starts in the file.
  std::map<std::pair<size_t, size_t>, std::string> written, read;
  for (const traces::TraceFlow& f : p.sim.trace.flows) written[{f.from, f.to}] = f.name;
  for (const traces::TraceFlow& f : u.flows) read[{f.from, f.to}] = f.name;
  EXPECT_EQ(read, written);
  const traces::Comparison c = traces::compare_traces(u, u);
  EXPECT_NEAR(c.step.measured_s, c.step.predicted_s, 1e-12);
}

}  // namespace
}  // namespace parasol::sim
