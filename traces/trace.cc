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
  // Process names for every rank seen, then thread names.
  std::set<int> ranks;
  for (const TraceStream& s : trace.streams) ranks.insert(s.rank);
  for (const TraceEvent& e : trace.events) ranks.insert(e.rank);
  for (int r : ranks) {
    sep();
    append_metadata(buf, "process_name", r, 0, "rank " + std::to_string(r));
    sep();
    buf += "{\"ph\":\"M\",\"name\":\"process_sort_index\",\"pid\":";
    append_int(buf, r);
    buf += ",\"tid\":0,\"args\":{\"sort_index\":";
    append_int(buf, r);
    buf += "}}";
  }
  for (const TraceStream& s : trace.streams) {
    sep();
    append_metadata(buf, "thread_name", s.rank, s.stream, s.name);
  }
  for (const TraceEvent& e : trace.events) {
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
    flush(false);
  }
  buf += "\n],\"displayTimeUnit\":\"ms\",\"otherData\":{\"generator\":\"parasol\",\"source\":";
  append_string(buf, trace.source);
  if (!trace.plan.is_null()) {
    buf += ",\"plan\":";
    buf += trace.plan.dump();
  }
  buf += "}}\n";
  flush(true);
}

void write_trace_file(const Trace& trace, const std::string& path) {
  std::ofstream f(path, std::ios::binary);
  if (!f) throw Error(path, "cannot open for writing");
  write_trace(trace, f);
  f.flush();
  if (!f) throw Error(path, "write failed");
}

Trace trace_from_json(const Json& j, const std::string& what) {
  Trace t;
  const Json* events = nullptr;
  std::string base = what;
  if (j.is_array()) {
    events = &j;
  } else if (j.is_object()) {
    auto it = j.find("traceEvents");
    if (it == j.end()) throw Error(what + ".traceEvents", "missing");
    if (!it->is_array()) throw Error(what + ".traceEvents", "must be an array");
    events = &*it;
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
    }
  } else {
    throw Error(what, "a trace must be a JSON object with traceEvents or an array of events");
  }
  t.events.reserve(events->size());
  for (size_t i = 0; i < events->size(); ++i) {
    const Json& e = (*events)[i];
    const std::string path = base + "[" + std::to_string(i) + "]";
    if (!e.is_object()) throw Error(path, "an event must be a JSON object");
    const JsonReader r(e, path);  // checks types and ranges, naming "<path>.<field>"
    constexpr int64_t kMaxId = std::numeric_limits<int>::max();
    constexpr double kMaxUs = 1e18;
    const std::string ph = r.string("ph");
    if (ph == "M") {
      if (r.string_or("name", "") != "thread_name") continue;
      TraceStream st;
      st.rank = static_cast<int>(r.integer("pid", 0, kMaxId));
      st.stream = static_cast<int>(r.integer("tid", 0, kMaxId));
      st.name = r.object("args").string("name");
      t.streams.push_back(std::move(st));
      continue;
    }
    if (ph != "X") continue;  // instant, counter, flow ... events carry no op
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
    t.events.push_back(std::move(ev));
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
    std::set<int> ranks;
    for (const TraceEvent& e : t.events) ranks.insert(e.rank);
    for (const TraceStream& s : t.streams) ranks.insert(s.rank);
    for (int r : ranks) {
      auto [it, fresh] = owner.emplace(r, i);
      if (!fresh)
        throw Error(names[i],
                    "rank " + std::to_string(r) + " also appears in " + names[it->second]);
    }
    n_events += t.events.size();
  }
  out.events.reserve(n_events);
  for (const Trace& t : traces) {
    out.events.insert(out.events.end(), t.events.begin(), t.events.end());
    out.streams.insert(out.streams.end(), t.streams.begin(), t.streams.end());
  }
  std::stable_sort(out.events.begin(), out.events.end(),
                   [](const TraceEvent& a, const TraceEvent& b) {
                     if (a.rank != b.rank) return a.rank < b.rank;
                     if (a.stream != b.stream) return a.stream < b.stream;
                     return a.start_s < b.start_s;
                   });
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
  return merge(traces, names);
}

Trace read_trace_files(const std::vector<std::string>& paths) {
  std::vector<Trace> traces;
  traces.reserve(paths.size());
  for (const std::string& p : paths) traces.push_back(read_trace_file(p));
  return merge(traces, paths);
}

}  // namespace parasol::traces
