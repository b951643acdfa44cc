// Chrome trace JSON writing (streamed by hand: traces of a large plan hold millions of events),
// reading (nlohmann, with a field-naming check of every event) and merging of per-rank traces.
#include "traces/trace.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <map>
#include <ostream>
#include <set>

#include "core/error.h"
#include "core/json_reader.h"

namespace parasol::traces {

namespace {

// JSON string literal of `s` (quotes included).
void append_string(std::string& out, const std::string& s) {
  out.push_back('"');
  for (char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\r':
        out += "\\r";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
          out += buf;
        } else {
          out.push_back(c);
        }
    }
  }
  out.push_back('"');
}

// Shortest representation that reads back to the same double; non-finite values become 0.
void append_number(std::string& out, double v) {
  if (!std::isfinite(v)) v = 0;
  char buf[32];
  auto r = std::to_chars(buf, buf + sizeof buf, v);
  out.append(buf, r.ptr);
}

void append_int(std::string& out, long long v) {
  char buf[24];
  auto r = std::to_chars(buf, buf + sizeof buf, v);
  out.append(buf, r.ptr);
}

void append_metadata(std::string& out, const char* what, int pid, int tid,
                     const std::string& name) {
  out += "{\"ph\":\"M\",\"name\":\"";
  out += what;
  out += "\",\"pid\":";
  append_int(out, pid);
  out += ",\"tid\":";
  append_int(out, tid);
  out += ",\"args\":{\"name\":";
  append_string(out, name);
  out += "}}";
}

void append_sort_index(std::string& out, const char* what, int pid, int tid, int index) {
  out += "{\"ph\":\"M\",\"name\":\"";
  out += what;
  out += "\",\"pid\":";
  append_int(out, pid);
  out += ",\"tid\":";
  append_int(out, tid);
  out += ",\"args\":{\"sort_index\":";
  append_int(out, index);
  out += "}}";
}

// A flow event ("s" or "f") of flow `id`.
void append_flow(std::string& out, char ph, const std::string& name, long long id, int pid, int tid,
                 double ts_us) {
  out += "{\"ph\":\"";
  out.push_back(ph);
  out += "\",\"name\":";
  append_string(out, name);
  out += ",\"cat\":";
  append_string(out, name);
  out += ",\"id\":";
  append_int(out, id);
  out += ",\"pid\":";
  append_int(out, pid);
  out += ",\"tid\":";
  append_int(out, tid);
  out += ",\"ts\":";
  append_number(out, ts_us);
  if (ph == 'f') out += ",\"bp\":\"e\"";
  out += "}";
}

}  // namespace

void write_trace(const Trace& trace, std::ostream& out) {
  std::string buf;
  buf.reserve(1 << 20);
  auto flush = [&](bool force) {
    if (force || buf.size() > (1 << 20) - 4096) {
      out.write(buf.data(), static_cast<std::streamsize>(buf.size()));
      buf.clear();
    }
  };
  buf += "{\"traceEvents\":[\n";
  bool first = true;
  auto sep = [&]() {
    if (!first) buf += ",\n";
    first = false;
  };
  // Process names and order for every rank seen, then thread names and order.
  std::set<int> ranks;
  for (const TraceStream& s : trace.streams) ranks.insert(s.rank);
  for (const TraceEvent& e : trace.events) ranks.insert(e.rank);
  for (const TraceCounter& c : trace.counters) ranks.insert(c.rank);
  std::map<int, std::string> names;
  for (const TraceProcess& p : trace.processes) {
    ranks.insert(p.rank);
    names[p.rank] = p.name;
  }
  for (int r : ranks) {
    sep();
    auto it = names.find(r);
    append_metadata(buf, "process_name", r, 0,
                    it != names.end() ? it->second : "rank " + std::to_string(r));
    sep();
    append_sort_index(buf, "process_sort_index", r, 0, r);
  }
  for (const TraceStream& s : trace.streams) {
    sep();
    append_metadata(buf, "thread_name", s.rank, s.stream, s.name);
    sep();
    append_sort_index(buf, "thread_sort_index", s.rank, s.stream, s.stream);
  }
  // The flow ends at each event: (event, 2 * flow + (0 for "s", 1 for "f")), by event.
  std::vector<std::pair<size_t, size_t>> ends;
  ends.reserve(2 * trace.flows.size());
  for (size_t k = 0; k < trace.flows.size(); ++k) {
    const TraceFlow& f = trace.flows[k];
    if (f.from >= trace.events.size() || f.to >= trace.events.size()) continue;
    ends.push_back({f.from, 2 * k});
    ends.push_back({f.to, 2 * k + 1});
  }
  std::sort(ends.begin(), ends.end());
  // The times of each flow's two ends (trace.h): inside their events, the "f" not before the "s".
  std::vector<std::pair<double, double>> flow_ts(trace.flows.size());
  for (size_t k = 0; k < trace.flows.size(); ++k) {
    const TraceFlow& f = trace.flows[k];
    if (f.from >= trace.events.size() || f.to >= trace.events.size()) continue;
    const TraceEvent& a = trace.events[f.from];
    const TraceEvent& b = trace.events[f.to];
    const double a0 = a.start_s * 1e6;
    const double b0 = b.start_s * 1e6, b1 = b0 + b.dur_s * 1e6;
    double s_ts = a0 + a.dur_s * 1e6 / 2;
    const double f_ts = std::min(std::max(b0 + b.dur_s * 1e6 / 2, s_ts), b1);
    if (f_ts < s_ts) s_ts = std::max(a0, f_ts);
    flow_ts[k] = {s_ts, f_ts};
  }
  size_t next_end = 0;
  for (size_t i = 0; i < trace.events.size(); ++i) {
    const TraceEvent& e = trace.events[i];
    sep();
    buf += "{\"ph\":\"X\",\"name\":";
    append_string(buf, e.name);
    buf += ",\"ts\":";
    append_number(buf, e.start_s * 1e6);
    buf += ",\"dur\":";
    append_number(buf, e.dur_s * 1e6);
    buf += ",\"pid\":";
    append_int(buf, e.rank);
    buf += ",\"tid\":";
    append_int(buf, e.stream);
    buf += ",\"args\":{\"op_id\":";
    append_int(buf, e.op_id);
    buf += ",\"kind\":";
    append_string(buf, e.kind);
    buf += ",\"bytes\":";
    append_number(buf, e.bytes);
    buf += ",\"flops\":";
    append_number(buf, e.flops);
    buf += ",\"layer\":";
    append_int(buf, e.layer);
    buf += ",\"micro_batch\":";
    append_int(buf, e.micro_batch);
    buf += ",\"phase\":";
    append_string(buf, e.phase);
    if (!e.group.empty()) {
      buf += ",\"group\":";
      append_string(buf, e.group);
    }
    buf += "}}";
    // The ends of its flows (times from the written ts and dur, as a reader sees them).
    for (; next_end < ends.size() && ends[next_end].first == i; ++next_end) {
      const size_t k = ends[next_end].second / 2;
      const bool to = ends[next_end].second % 2 == 1;
      sep();
      append_flow(buf, to ? 'f' : 's', trace.flows[k].name, static_cast<long long>(k) + 1, e.rank,
                  e.stream, to ? flow_ts[k].second : flow_ts[k].first);
    }
    flush(false);
  }
  for (const TraceCounter& c : trace.counters) {
    sep();
    buf += "{\"ph\":\"C\",\"name\":";
    append_string(buf, c.name);
    buf += ",\"ts\":";
    append_number(buf, c.t_s * 1e6);
    buf += ",\"pid\":";
    append_int(buf, c.rank);
    buf += ",\"tid\":0,\"args\":{";
    append_string(buf, c.key);
    buf += ":";
    append_number(buf, c.value);
    buf += "}}";
    flush(false);
  }
  buf += "\n],\"displayTimeUnit\":\"ms\",\"otherData\":{\"generator\":\"parasol\",\"source\":";
  append_string(buf, trace.source);
  if (!trace.plan.is_null()) {
    buf += ",\"plan\":";
    buf += trace.plan.dump();
  }
  if (trace.steps > 0) {
    buf += ",\"steps\":";
    append_int(buf, trace.steps);
  }
  buf += "}}\n";
  flush(true);
}

void write_trace_file(const Trace& trace, const std::string& path) {
  std::ofstream f(path, std::ios::binary);
  if (!f) throw Error(path, "cannot open for writing");
  write_trace(trace, f);
  f.flush();
  if (!f) throw SystemError(path, "write failed");
}

namespace {

// Whether j[key] is a finite number in [lo, hi] (and a whole number when `whole`).
bool number_in(const Json& j, const char* key, double lo, double hi, bool whole = false) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_number()) return false;
  const double v = it->get<double>();
  return std::isfinite(v) && v >= lo && v <= hi && (!whole || v == std::floor(v));
}

}  // namespace

const Json* trace_events(const Json& j, const std::string& what) {
  if (j.is_array()) return &j;
  if (!j.is_object()) return nullptr;
  auto it = j.find("traceEvents");
  if (it == j.end()) throw Error(what + ".traceEvents", "missing");
  if (!it->is_array()) throw Error(what + ".traceEvents", "must be an array");
  return &*it;
}

Trace trace_from_json(const Json& j, const std::string& what) {
  Trace t;
  const Json* events = trace_events(j, what);
  if (!events)
    throw Error(what, "a trace must be a JSON object with traceEvents or an array of events");
  std::string base = what;
  if (j.is_object()) {
    base = what + ".traceEvents";
    auto other = j.find("otherData");
    if (other != j.end() && other->is_object()) {
      auto src = other->find("source");
      if (src != other->end() && src->is_string()) t.source = src->get<std::string>();
      auto plan = other->find("plan");
      if (plan != other->end() && !plan->is_null()) {
        if (!plan->is_object()) throw Error(what + ".otherData.plan", "must be a JSON object");
        t.plan = *plan;
      }
      if (other->contains("steps")) {
        if (!number_in(*other, "steps", 1, 1e9, true))
          throw Error(what + ".otherData.steps", "must be a whole number >= 1");
        t.steps = static_cast<int>((*other)["steps"].get<double>());
      }
    }
  }
  t.events.reserve(events->size());
  // Flow events: the starts in file order, keyed by (cat, id), and the end of each; each end
  // with the last complete event read before it on its (pid, tid). Events' times as written (us).
  constexpr size_t kNone = std::numeric_limits<size_t>::max();
  struct FlowEnd {
    std::string name;
    int64_t id = 0;
    int rank = 0, stream = 0;
    double ts_us = 0;
    size_t last = kNone;
  };
  std::map<std::pair<int, int>, size_t> lane_last;
  std::vector<double> ts_us, dur_us;
  std::map<std::pair<std::string, int64_t>, size_t> flow_starts;  // the first "s" of each key
  std::vector<FlowEnd> flow_order;                                // the starts, in file order
  std::map<std::pair<std::string, int64_t>, FlowEnd> flow_ends;   // the first "f" of each key
  for (size_t i = 0; i < events->size(); ++i) {
    const Json& e = (*events)[i];
    const std::string path = base + "[" + std::to_string(i) + "]";
    if (!e.is_object()) throw Error(path, "an event must be a JSON object");
    const JsonReader r(e, path);  // checks types and ranges, naming "<path>.<field>"
    constexpr int64_t kMaxId = std::numeric_limits<int>::max();
    constexpr double kMaxUs = 1e18;
    const std::string ph = r.string("ph");
    if (ph == "M") {
      const std::string what_meta = r.string_or("name", "");
      if (what_meta == "thread_name") {
        TraceStream st;
        st.rank = static_cast<int>(r.integer("pid", 0, kMaxId));
        st.stream = static_cast<int>(r.integer("tid", 0, kMaxId));
        st.name = r.object("args").string("name");
        t.streams.push_back(std::move(st));
      } else if (what_meta == "process_name") {
        TraceProcess pr;
        pr.rank = static_cast<int>(r.integer("pid", 0, kMaxId));
        pr.name = r.object("args").string("name");
        t.processes.push_back(std::move(pr));
      }
      continue;
    }
    // Counters and flows are read when well formed and ignored otherwise (other tools write
    // them in forms this schema has no use for, e.g. string ids).
    if (ph == "C") {
      if (!(number_in(e, "ts", -kMaxUs, kMaxUs) && number_in(e, "pid", 0, kMaxId, true) &&
            e.contains("name") && e["name"].is_string() && e.contains("args") &&
            e["args"].is_object()))
        continue;
      const std::string name = e["name"].get<std::string>();
      const double ts = e["ts"].get<double>() * 1e-6;
      const int rank = static_cast<int>(e["pid"].get<double>());
      for (auto it = e["args"].begin(); it != e["args"].end(); ++it) {
        if (!it->is_number()) continue;  // Perfetto skips what is not a number too
        const double v = it->get<double>();
        if (!std::isfinite(v)) continue;
        t.counters.push_back({rank, name, it.key(), ts, v});
      }
      continue;
    }
    if (ph == "s" || ph == "f") {
      if (!(number_in(e, "ts", -kMaxUs, kMaxUs) && number_in(e, "pid", 0, kMaxId, true) &&
            number_in(e, "tid", 0, kMaxId, true) && e.contains("id") &&
            e["id"].is_number_integer()))
        continue;
      FlowEnd end;
      if (e.contains("cat") && e["cat"].is_string()) end.name = e["cat"].get<std::string>();
      end.id = e["id"].get<int64_t>();
      end.rank = static_cast<int>(e["pid"].get<double>());
      end.stream = static_cast<int>(e["tid"].get<double>());
      end.ts_us = e["ts"].get<double>();
      auto last = lane_last.find({end.rank, end.stream});
      if (last != lane_last.end()) end.last = last->second;
      const std::pair<std::string, int64_t> key{end.name, end.id};
      if (ph == "s") {
        if (flow_starts.emplace(key, flow_order.size()).second) flow_order.push_back(end);
      } else {
        flow_ends.emplace(key, end);
      }
      continue;
    }
    if (ph != "X") continue;  // instant, async ... events carry no op
    TraceEvent ev;
    ev.name = r.string("name");
    ev.start_s = r.number("ts", -kMaxUs, kMaxUs) * 1e-6;
    ev.dur_s = r.number("dur", 0, kMaxUs) * 1e-6;
    ev.rank = static_cast<int>(r.integer("pid", 0, kMaxId));
    ev.stream = static_cast<int>(r.integer("tid", 0, kMaxId));
    if (r.has("args")) {
      const JsonReader a = r.object("args");
      ev.op_id = static_cast<int>(a.integer_or("op_id", ev.op_id, -1, kMaxId));
      ev.kind = a.string_or("kind", ev.kind);
      ev.bytes = a.number_or("bytes", ev.bytes, 0, 1e300);
      ev.flops = a.number_or("flops", ev.flops, 0, 1e300);
      ev.layer = static_cast<int>(a.integer_or("layer", ev.layer, -1, kMaxId));
      ev.micro_batch = static_cast<int>(a.integer_or("micro_batch", ev.micro_batch, -1, kMaxId));
      ev.phase = a.string_or("phase", ev.phase);
      ev.group = a.string_or("group", ev.group);
    }
    lane_last[{ev.rank, ev.stream}] = t.events.size();
    ts_us.push_back(r.number("ts", -kMaxUs, kMaxUs));
    dur_us.push_back(r.number("dur", 0, kMaxUs));
    t.events.push_back(std::move(ev));
  }
  // Binds flow ends to events as Perfetto does (see trace.h): the last event read before the end
  // on its lane when it holds the time, else the latest-starting event of the lane that does.
  auto holds = [&](size_t i, double at) {
    const double slack = 1e-9 * std::max(1.0, std::abs(at));
    return ts_us[i] - slack <= at && at <= ts_us[i] + dur_us[i] + slack;
  };
  std::map<std::pair<int, int>, std::vector<size_t>> lanes;  // by start, built when needed
  auto bind = [&](const FlowEnd& f) -> size_t {
    if (f.last != kNone && holds(f.last, f.ts_us)) return f.last;
    if (lanes.empty()) {
      for (size_t i = 0; i < t.events.size(); ++i)
        lanes[{t.events[i].rank, t.events[i].stream}].push_back(i);
      for (auto& [lane, v] : lanes)
        std::stable_sort(v.begin(), v.end(),
                         [&](size_t a, size_t b) { return ts_us[a] < ts_us[b]; });
    }
    auto lane = lanes.find({f.rank, f.stream});
    if (lane == lanes.end()) return kNone;
    const std::vector<size_t>& v = lane->second;
    auto it = std::upper_bound(v.begin(), v.end(), f.ts_us,
                               [&](double at, size_t i) { return at < ts_us[i]; });
    if (it == v.begin()) return kNone;
    const size_t i = *std::prev(it);
    return holds(i, f.ts_us) ? i : kNone;
  };
  for (const FlowEnd& start : flow_order) {
    auto end = flow_ends.find({start.name, start.id});
    if (end == flow_ends.end()) continue;
    const size_t from = bind(start), to = bind(end->second);
    if (from != kNone && to != kNone) t.flows.push_back({start.name, from, to});
  }
  return t;
}

Trace read_trace_file(const std::string& path) {
  return trace_from_json(read_json_file(path), path);
}

namespace {

// Merges `traces`, naming input i as names[i] in errors.
Trace merge(const std::vector<Trace>& traces, const std::vector<std::string>& names) {
  Trace out;
  std::map<int, size_t> owner;  // rank -> input index
  size_t n_events = 0;
  for (size_t i = 0; i < traces.size(); ++i) {
    const Trace& t = traces[i];
    if (!t.source.empty()) {
      if (!out.source.empty() && out.source != t.source)
        throw Error(names[i] + ".source", "'" + t.source + "' differs from '" + out.source + "'");
      out.source = t.source;
    }
    if (!t.plan.is_null()) {
      if (!out.plan.is_null() && out.plan != t.plan)
        throw Error(names[i] + ".plan", "differs from the plan of the other traces");
      out.plan = t.plan;
    }
    if (t.steps > 0) {
      if (out.steps > 0 && out.steps != t.steps)
        throw Error(names[i] + ".steps", std::to_string(t.steps) + " differs from " +
                                             std::to_string(out.steps) + " of the other traces");
      out.steps = t.steps;
    }
    std::set<int> ranks;
    for (const TraceEvent& e : t.events) ranks.insert(e.rank);
    for (const TraceStream& s : t.streams) ranks.insert(s.rank);
    for (const TraceProcess& p : t.processes) ranks.insert(p.rank);
    for (const TraceCounter& c : t.counters) ranks.insert(c.rank);
    for (int r : ranks) {
      auto [it, fresh] = owner.emplace(r, i);
      if (!fresh)
        throw Error(names[i],
                    "rank " + std::to_string(r) + " also appears in " + names[it->second]);
    }
    n_events += t.events.size();
  }
  // Events in (rank, stream, start) order; flows follow their events.
  std::vector<const TraceEvent*> all;
  all.reserve(n_events);
  for (const Trace& t : traces) {
    for (const TraceEvent& e : t.events) all.push_back(&e);
    out.streams.insert(out.streams.end(), t.streams.begin(), t.streams.end());
    out.processes.insert(out.processes.end(), t.processes.begin(), t.processes.end());
    out.counters.insert(out.counters.end(), t.counters.begin(), t.counters.end());
  }
  std::vector<size_t> order(all.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) {
    const TraceEvent& a = *all[x];
    const TraceEvent& b = *all[y];
    if (a.rank != b.rank) return a.rank < b.rank;
    if (a.stream != b.stream) return a.stream < b.stream;
    return a.start_s < b.start_s;
  });
  std::vector<size_t> moved_to(all.size());
  out.events.reserve(all.size());
  for (size_t k = 0; k < order.size(); ++k) {
    moved_to[order[k]] = k;
    out.events.push_back(*all[order[k]]);
  }
  size_t base = 0;
  for (const Trace& t : traces) {
    for (const TraceFlow& f : t.flows)
      if (f.from < t.events.size() && f.to < t.events.size())
        out.flows.push_back({f.name, moved_to[base + f.from], moved_to[base + f.to]});
    base += t.events.size();
  }
  std::stable_sort(out.streams.begin(), out.streams.end(),
                   [](const TraceStream& a, const TraceStream& b) {
                     return a.rank != b.rank ? a.rank < b.rank : a.stream < b.stream;
                   });
  return out;
}

}  // namespace

Trace merge_traces(const std::vector<Trace>& traces) {
  std::vector<std::string> names;
  for (size_t i = 0; i < traces.size(); ++i) names.push_back("traces[" + std::to_string(i) + "]");
  return merge(traces, names);
}

Trace merge_traces(const std::vector<Trace>& traces, const std::vector<std::string>& names) {
  PARASOL_CHECK(names.size() == traces.size(), "a name per trace");
  return merge(traces, names);
}

Trace read_trace_files(const std::vector<std::string>& paths) {
  std::vector<Trace> traces;
  traces.reserve(paths.size());
  for (const std::string& p : paths) traces.push_back(read_trace_file(p));
  return merge(traces, paths);
}

}  // namespace parasol::traces
