// Tests of the trace schema: Chrome trace JSON round trip (events, stream names, source),
// the fields Perfetto needs on every event, rejection of broken files naming the field, and
// merging of per-rank traces.
#include "traces/trace.h"

#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <sstream>

#include "core/error.h"

namespace parasol::traces {
namespace {

Trace sample() {
  Trace t;
  t.source = "predicted";
  t.streams = {{0, 0, "compute"}, {0, 1, "comm"}, {3, 0, "compute"}};
  TraceEvent a;
  a.rank = 0;
  a.stream = 0;
  a.name = "L0.qkv";
  a.start_s = 0.00125;
  a.dur_s = 3.5e-4;
  a.op_id = 7;
  a.kind = "linear";
  a.flops = 1.5e12;
  a.layer = 0;
  a.micro_batch = 2;
  a.phase = "forward";
  TraceEvent b = a;
  b.stream = 1;
  b.name = "L0.tp \"all-reduce\"\n";  // needs escaping
  b.kind = "all-reduce";
  b.bytes = 6.0e7;
  b.flops = 0;
  b.op_id = 8;
  TraceEvent c = a;
  c.rank = 3;
  c.start_s = 1.0 / 3.0;
  c.dur_s = 0;
  c.layer = -1;
  c.micro_batch = -1;
  c.phase = "optimizer";
  c.name = "adamw";
  t.events = {a, b, c};
  return t;
}

TraceEvent event(int rank, int stream, const std::string& name, double start) {
  TraceEvent e;
  e.rank = rank;
  e.stream = stream;
  e.name = name;
  e.start_s = start;
  e.dur_s = 1.0;
  return e;
}

std::string to_text(const Trace& t) {
  std::ostringstream os;
  write_trace(t, os);
  return os.str();
}

std::string temp_path(const std::string& name) {
  return (testing::TempDir().empty() ? std::string("/tmp/") : testing::TempDir()) + name;
}

// The Error raised by reading `text`, or an empty field when none is raised.
std::string error_field(const std::string& text) {
  try {
    trace_from_json(parse_json(text, "t.json"), "t.json");
  } catch (const Error& e) {
    return e.field();
  }
  return "";
}

TEST(Trace, RoundTripKeepsEveryField) {
  Trace t = sample();
  Trace u = trace_from_json(parse_json(to_text(t), "mem"), "mem");
  EXPECT_EQ(u.source, "predicted");
  ASSERT_EQ(u.events.size(), t.events.size());
  for (size_t i = 0; i < t.events.size(); ++i) {
    const TraceEvent &a = t.events[i], &b = u.events[i];
    EXPECT_EQ(a.rank, b.rank);
    EXPECT_EQ(a.stream, b.stream);
    EXPECT_EQ(a.name, b.name);
    EXPECT_NEAR(a.start_s, b.start_s, 1e-15);
    EXPECT_NEAR(a.dur_s, b.dur_s, 1e-15);
    EXPECT_EQ(a.op_id, b.op_id);
    EXPECT_EQ(a.kind, b.kind);
    EXPECT_DOUBLE_EQ(a.bytes, b.bytes);
    EXPECT_DOUBLE_EQ(a.flops, b.flops);
    EXPECT_EQ(a.layer, b.layer);
    EXPECT_EQ(a.micro_batch, b.micro_batch);
    EXPECT_EQ(a.phase, b.phase);
  }
  ASSERT_EQ(u.streams.size(), 3u);
  EXPECT_EQ(u.streams[1].rank, 0);
  EXPECT_EQ(u.streams[1].stream, 1);
  EXPECT_EQ(u.streams[1].name, "comm");
}

TEST(Trace, RoundTripKeepsGroupAndPlan) {
  Trace t = sample();
  t.events[1].group = "tp";
  t.plan = Json{{"tp", 2}, {"pp", 1}, {"model", "tiny"}};
  Trace u = trace_from_json(parse_json(to_text(t), "mem"), "mem");
  EXPECT_EQ(u.events[0].group, "");  // written only when set
  EXPECT_EQ(u.events[1].group, "tp");
  EXPECT_EQ(u.plan, t.plan);
  EXPECT_TRUE(trace_from_json(parse_json(to_text(sample()), "mem"), "mem").plan.is_null());
  EXPECT_EQ(error_field(R"({"traceEvents":[],"otherData":{"plan":3}})"), "t.json.otherData.plan");
}

TEST(Trace, WrittenFileIsChromeTraceJson) {
  Json j = parse_json(to_text(sample()), "mem");
  ASSERT_TRUE(j.contains("traceEvents"));
  int complete = 0, process_names = 0, thread_names = 0;
  for (const Json& e : j["traceEvents"]) {
    ASSERT_TRUE(e.contains("ph"));
    ASSERT_TRUE(e.contains("pid"));
    ASSERT_TRUE(e.contains("name"));
    if (e["ph"] == "X") {
      ++complete;
      for (const char* k : {"ts", "dur", "tid", "args"}) EXPECT_TRUE(e.contains(k)) << k;
      for (const char* k : {"op_id", "kind", "bytes", "flops", "layer", "micro_batch", "phase"})
        EXPECT_TRUE(e["args"].contains(k)) << k;
    } else if (e["ph"] == "M" && e["name"] == "process_name") {
      ++process_names;
      EXPECT_EQ(e["args"]["name"], "rank " + std::to_string(e["pid"].get<int>()));
    } else if (e["ph"] == "M" && e["name"] == "thread_name") {
      ++thread_names;
    }
  }
  EXPECT_EQ(complete, 3);
  EXPECT_EQ(process_names, 2);  // ranks 0 and 3
  EXPECT_EQ(thread_names, 3);
  // Microseconds.
  for (const Json& e : j["traceEvents"])
    if (e["ph"] == "X" && e["name"] == "L0.qkv") {
      EXPECT_NEAR(e["ts"].get<double>(), 1250.0, 1e-9);
      EXPECT_NEAR(e["dur"].get<double>(), 350.0, 1e-9);
    }
}

TEST(Trace, FileRoundTrip) {
  std::string path = temp_path("trace_roundtrip.json");
  write_trace_file(sample(), path);
  Trace u = read_trace_file(path);
  EXPECT_EQ(u.events.size(), 3u);
  EXPECT_EQ(u.events[1].name, "L0.tp \"all-reduce\"\n");
}

TEST(Trace, ReadsBareArrayAndIgnoresOtherPhases) {
  Trace t = trace_from_json(parse_json(R"([{"ph":"X","name":"a","ts":1,"dur":2,"pid":0,"tid":0},
                     {"ph":"i","name":"marker","ts":5,"pid":0,"tid":0},
                     {"ph":"C","name":"mem","ts":5,"pid":0,"args":{"bytes":3}}])",
                                       "mem"),
                            "mem");
  ASSERT_EQ(t.events.size(), 1u);
  EXPECT_EQ(t.events[0].op_id, -1);  // args absent: defaults
  EXPECT_NEAR(t.events[0].dur_s, 2e-6, 1e-18);
  EXPECT_EQ(t.source, "");
}

// Process names, counters and flows: written as Perfetto reads them ("C" with the value under
// its key, "s"/"f" pairs with one id and "bp":"e" at the target, sort indices) and read back.
TEST(Trace, CountersFlowsAndProcessNamesRoundTrip) {
  Trace t = sample();
  t.processes = {{3, "rank 3 (stage 1)"}};
  t.counters = {{0, "device memory", "bytes", 0.001, 1024},
                {3, "device memory", "bytes", 0.002, 4096}};
  // Events: 0 = rank 0 stream 0, 1 = rank 0 stream 1, 2 = rank 3 stream 0 (zero length).
  t.flows = {{"pipeline", 0, 2}, {"dependency", 0, 1}, {"pipeline", 2, 7}};  // the last: no event
  const std::string text = to_text(t);
  const Json j = parse_json(text, "mem");
  std::map<std::string, int> seen;
  std::map<int64_t, std::vector<Json>> flow_events;
  for (const Json& e : j["traceEvents"]) {
    const std::string ph = e["ph"];
    if (ph == "M") {
      ++seen[e["name"].get<std::string>()];
      if (e["name"] == "process_name") {
        EXPECT_EQ(e["args"]["name"], e["pid"] == 3 ? "rank 3 (stage 1)" : "rank 0");
      }
      if (e["name"] == "thread_sort_index") {
        EXPECT_EQ(e["args"]["sort_index"], e["tid"]);
      }
    } else if (ph == "C") {
      ++seen["C"];
      EXPECT_EQ(e["name"], "device memory");
      EXPECT_TRUE(e["args"]["bytes"].is_number());
    } else if (ph == "s" || ph == "f") {
      flow_events[e["id"].get<int64_t>()].push_back(e);
    }
  }
  EXPECT_EQ(seen["process_name"], 2);
  EXPECT_EQ(seen["process_sort_index"], 2);
  EXPECT_EQ(seen["thread_name"], 3);
  EXPECT_EQ(seen["thread_sort_index"], 3);
  EXPECT_EQ(seen["C"], 2);
  ASSERT_EQ(flow_events.size(), 2u);
  for (auto& [id, pair] : flow_events) {
    ASSERT_EQ(pair.size(), 2u) << id;
    EXPECT_EQ(pair[0]["ph"], "s");
    EXPECT_EQ(pair[1]["ph"], "f");
    EXPECT_EQ(pair[1]["bp"], "e");
    EXPECT_EQ(pair[0]["cat"], pair[1]["cat"]);
  }
  const Trace u = trace_from_json(j, "mem");
  ASSERT_EQ(u.processes.size(), 2u);  // both ranks' names are written, so both come back
  ASSERT_EQ(u.counters.size(), 2u);
  EXPECT_EQ(u.counters[1].rank, 3);
  EXPECT_EQ(u.counters[1].key, "bytes");
  EXPECT_EQ(u.counters[1].value, 4096);
  EXPECT_NEAR(u.counters[1].t_s, 0.002, 1e-15);
  ASSERT_EQ(u.flows.size(), 2u);  // the one naming no event is not written
  EXPECT_EQ(u.flows[0].name, "pipeline");
  EXPECT_EQ(u.flows[0].from, 0u);
  EXPECT_EQ(u.flows[0].to, 2u);  // bound to the zero-length event it follows
  EXPECT_EQ(u.flows[1].name, "dependency");
  EXPECT_EQ(u.flows[1].from, 0u);
  EXPECT_EQ(u.flows[1].to, 1u);
  EXPECT_EQ(to_text(u), text);  // a second write is the same file
  // Merging keeps them.
  Trace r0 = u, r3 = u;
  std::erase_if(r0.events, [](const TraceEvent& e) { return e.rank != 0; });
  std::erase_if(r0.streams, [](const TraceStream& e) { return e.rank != 0; });
  std::erase_if(r0.processes, [](const TraceProcess& e) { return e.rank != 0; });
  std::erase_if(r0.counters, [](const TraceCounter& e) { return e.rank != 0; });
  r0.flows = {{"dependency", 1, 0}};  // its second event to its first
  std::erase_if(r3.events, [](const TraceEvent& e) { return e.rank != 3; });
  std::erase_if(r3.streams, [](const TraceStream& e) { return e.rank != 3; });
  std::erase_if(r3.processes, [](const TraceProcess& e) { return e.rank != 3; });
  std::erase_if(r3.counters, [](const TraceCounter& e) { return e.rank != 3; });
  r3.flows.clear();
  const Trace m = merge_traces({r3, r0});  // rank 3's event goes after rank 0's two
  EXPECT_EQ(m.counters.size(), 2u);
  EXPECT_EQ(m.processes.size(), 2u);
  ASSERT_EQ(m.flows.size(), 1u);
  EXPECT_EQ(m.events[m.flows[0].from].stream, 1);
  EXPECT_EQ(m.events[m.flows[0].from].rank, 0);
  EXPECT_EQ(m.events[m.flows[0].to].stream, 0);
  EXPECT_EQ(m.events[m.flows[0].to].rank, 0);
  // A rank's counters in two inputs is a rank in two inputs.
  Trace c3;
  c3.counters = {{3, "device memory", "bytes", 0, 1}};
  EXPECT_THROW(merge_traces({r3, c3}), Error);
}

// Counters and flows that other tools write differently (string ids, no pid, a flow end without
// its start) are ignored, not errors.
TEST(Trace, IgnoresCountersAndFlowsItCannotUse) {
  const Trace t =
      trace_from_json(parse_json(R"([{"ph":"X","name":"a","ts":1,"dur":2,"pid":0,"tid":0},
      {"ph":"C","name":"mem","ts":5,"args":{"bytes":3}},
      {"ph":"C","name":"mem","ts":5,"pid":0,"args":{"bytes":"3","other":7}},
      {"ph":"s","id":"0x1f","cat":"c","name":"c","ts":1,"pid":0,"tid":0},
      {"ph":"f","id":"0x1f","cat":"c","name":"c","ts":2,"pid":0,"tid":0,"bp":"e"},
      {"ph":"f","id":5,"cat":"c","name":"c","ts":2,"pid":0,"tid":0,"bp":"e"},
      {"ph":"s","id":6,"cat":"c","name":"c","ts":2,"pid":0,"tid":0}])",
                                 "mem"),
                      "mem");
  EXPECT_EQ(t.events.size(), 1u);
  ASSERT_EQ(t.counters.size(), 1u);  // the numeric arg of the event with a pid
  EXPECT_EQ(t.counters[0].key, "other");
  EXPECT_EQ(t.flows.size(), 0u);
}

TEST(Trace, RejectsBrokenFilesNamingTheField) {
  const std::string ok = R"("ph":"X","name":"a","ts":1,"dur":2,"pid":0,"tid":1)";
  EXPECT_EQ(error_field("{\"traceEvents\":[{" + ok + "}]}"), "");
  EXPECT_EQ(error_field(R"({"traceEvents":[{"name":"a","ts":1,"dur":2,"pid":0,"tid":1}]})"),
            "t.json.traceEvents[0].ph");
  EXPECT_EQ(error_field(R"({"traceEvents":[{"ph":"X","name":"a","dur":2,"pid":0,"tid":1}]})"),
            "t.json.traceEvents[0].ts");
  EXPECT_EQ(error_field(R"({"traceEvents":[{"ph":"X","name":"a","ts":1,"pid":0,"tid":1}]})"),
            "t.json.traceEvents[0].dur");
  EXPECT_EQ(error_field("{\"traceEvents\":[{" + ok +
                        "},{\"ph\":\"X\",\"name\":\"b\",\"ts\":1,"
                        "\"dur\":2,\"tid\":1}]}"),
            "t.json.traceEvents[1].pid");
  EXPECT_EQ(error_field(R"({"traceEvents":[{"ph":"X","name":"a","ts":1,"dur":2,"pid":0}]})"),
            "t.json.traceEvents[0].tid");
  EXPECT_EQ(
      error_field(R"({"traceEvents":[{"ph":"X","name":"a","ts":"1","dur":2,"pid":0,"tid":0}]})"),
      "t.json.traceEvents[0].ts");
  EXPECT_EQ(
      error_field(R"({"traceEvents":[{"ph":"X","name":"a","ts":1,"dur":-2,"pid":0,"tid":0}]})"),
      "t.json.traceEvents[0].dur");
  EXPECT_EQ(error_field("{\"traceEvents\":[{" + ok + ",\"args\":{\"op_id\":\"seven\"}}]}"),
            "t.json.traceEvents[0].args.op_id");
  EXPECT_EQ(error_field(R"({"events":[]})"), "t.json.traceEvents");
  EXPECT_EQ(error_field(R"({"traceEvents":[3]})"), "t.json.traceEvents[0]");
  EXPECT_EQ(error_field("42"), "t.json");
  // Not JSON at all, and a truncated file.
  EXPECT_THROW(parse_json("{\"traceEvents\":[{", "t.json"), Error);
  std::string path = temp_path("trace_broken.json");
  std::ofstream(path) << "{\"traceEvents\":[{\"ph\":\"X\",";
  EXPECT_THROW(read_trace_file(path), Error);
  EXPECT_THROW(read_trace_file(temp_path("no_such_trace.json")), Error);
}

TEST(Trace, MergesPerRankTraces) {
  Trace r0, r1;
  r0.source = r1.source = "measured";
  r1.events = {event(1, 0, "b2", 2.0), event(1, 0, "b1", 0.5)};
  r0.events = {event(0, 1, "a2", 1.0), event(0, 0, "a1", 0.0)};
  r0.streams = {{0, 1, "comm"}, {0, 0, "compute"}};
  Trace m = merge_traces({r1, r0});
  EXPECT_EQ(m.source, "measured");
  ASSERT_EQ(m.events.size(), 4u);
  EXPECT_EQ(m.events[0].name, "a1");
  EXPECT_EQ(m.events[1].name, "a2");
  EXPECT_EQ(m.events[2].name, "b1");
  EXPECT_EQ(m.events[3].name, "b2");
  EXPECT_EQ(m.streams[0].name, "compute");

  // A rank in two inputs, and disagreeing sources, are errors naming the input.
  try {
    merge_traces({r0, r0});
    FAIL() << "duplicate rank accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "traces[1]");
  }
  Trace p = r1;
  p.source = "predicted";
  EXPECT_THROW(merge_traces({r0, p}), Error);
  // Plans must agree (or be absent); the merge keeps the plan.
  Trace q0 = r0, q1 = r1;
  q0.plan = Json{{"tp", 1}};
  EXPECT_EQ(merge_traces({q0, r1}).plan, q0.plan);
  q1.plan = Json{{"tp", 2}};
  try {
    merge_traces({q0, q1}, {"a.json", "b.json"});
    FAIL() << "traces of two plans merged";
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "b.json.plan");
  }

  // From files: errors name the file.
  std::string f0 = temp_path("merge_r0.json"), f1 = temp_path("merge_r1.json");
  write_trace_file(r0, f0);
  write_trace_file(r1, f1);
  EXPECT_EQ(read_trace_files({f0, f1}).events.size(), 4u);
  try {
    read_trace_files({f0, f0});
    FAIL() << "duplicate rank accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), f0);
  }
}

}  // namespace
}  // namespace parasol::traces
