// Trace summaries: step assignment of events, per-category totals, and a per-rank sweep that
// splits each step into compute, exposed communication, exposed copies and bubble.
#include "traces/summary.h"

#include <algorithm>
#include <set>
#include <utility>

namespace parasol::traces {

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

bool is_communication_kind(const std::string& k) {
  return k == "all-reduce" || k == "all-gather" || k == "reduce-scatter" || k == "all-to-all" ||
         k == "broadcast" || k == "send" || k == "recv" || k == "collective";
}

bool is_copy_kind(const std::string& k) { return k == "offload" || k == "prefetch"; }

namespace {

enum Category { kCompute = 0, kComm = 1, kCopy = 2, kWait = 3 };

Category category(const std::string& kind) {
  // A recv waits for its data; the host's own events (a sync, the host row's issue spans) are
  // not device work.
  if (kind == "recv" || kind == "sync" || kind == kHostIssueKind) return kWait;
  if (is_communication_kind(kind)) return kComm;
  if (is_copy_kind(kind)) return kCopy;
  return kCompute;  // compute kinds, and events of unknown kind
}

// The split of [begin, end] for the events (indices into `events`) of one rank.
RankTime sweep(const std::vector<TraceEvent>& events, const std::vector<size_t>& mine, double begin,
               double end) {
  struct Edge {
    double t;
    int delta;
    Category cat;
  };
  std::vector<Edge> edges;
  edges.reserve(2 * mine.size());
  for (size_t i : mine) {
    const TraceEvent& e = events[i];
    const Category c = category(e.kind);
    if (c == kWait || e.dur_s <= 0) continue;
    edges.push_back({std::max(begin, e.start_s), +1, c});
    edges.push_back({std::min(end, e.end_s()), -1, c});
  }
  std::sort(edges.begin(), edges.end(), [](const Edge& a, const Edge& b) {
    return a.t != b.t ? a.t < b.t : a.delta < b.delta;
  });
  RankTime r;
  int active[3] = {0, 0, 0};
  double t = begin;
  for (const Edge& e : edges) {
    const double seg = std::max(0.0, e.t - t);
    if (seg > 0) {
      if (active[kCompute] > 0)
        r.compute_s += seg;
      else if (active[kComm] > 0)
        r.exposed_comm_s += seg;
      else if (active[kCopy] > 0)
        r.exposed_copy_s += seg;
      if (active[kComm] > 0) r.comm_s += seg;
    }
    t = std::max(t, e.t);
    active[e.cat] += e.delta;
  }
  r.bubble_s = std::max(0.0, (end - begin) - r.compute_s - r.exposed_comm_s - r.exposed_copy_s);
  return r;
}

void add(RankTime& a, const RankTime& b, double w) {
  a.compute_s += w * b.compute_s;
  a.exposed_comm_s += w * b.exposed_comm_s;
  a.exposed_copy_s += w * b.exposed_copy_s;
  a.bubble_s += w * b.bubble_s;
  a.comm_s += w * b.comm_s;
}

}  // namespace

TraceSummary summarize(const Trace& trace) {
  TraceSummary s;
  const std::vector<TraceEvent>& ev = trace.events;
  if (ev.empty()) return s;

  // Steps: the k-th event of an op id on a rank is in step k.
  std::vector<int> step(ev.size(), -1);
  {
    std::vector<size_t> order(ev.size());
    for (size_t i = 0; i < ev.size(); ++i) order[i] = i;
    // The simulator's host row repeats each op id (its issue span): numbered apart from the ops.
    auto host_row = [&](size_t i) { return ev[i].kind == kHostIssueKind; };
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      if (ev[a].rank != ev[b].rank) return ev[a].rank < ev[b].rank;
      if (host_row(a) != host_row(b)) return host_row(b);
      if (ev[a].op_id != ev[b].op_id) return ev[a].op_id < ev[b].op_id;
      return ev[a].start_s < ev[b].start_s;
    });
    int k = 0;
    for (size_t j = 0; j < order.size(); ++j) {
      const TraceEvent& e = ev[order[j]];
      if (e.op_id < 0) continue;
      const bool same = j > 0 && ev[order[j - 1]].rank == e.rank &&
                        ev[order[j - 1]].op_id == e.op_id &&
                        host_row(order[j - 1]) == host_row(order[j]);
      k = same ? k + 1 : 0;
      step[order[j]] = k;
      s.steps = std::max(s.steps, k + 1);
    }
  }
  if (s.steps == 0) s.steps = 1;
  std::vector<double> first(s.steps, 1e300), last(s.steps, -1e300);
  for (size_t i = 0; i < ev.size(); ++i)
    if (step[i] >= 0) first[step[i]] = std::min(first[step[i]], ev[i].start_s);
  for (size_t i = 0; i < ev.size(); ++i) {
    if (step[i] >= 0) continue;
    int k = 0;  // the last step that started at or before the event
    for (int j = 0; j < s.steps; ++j)
      if (first[j] <= ev[i].start_s) k = j;
    step[i] = k;
  }
  std::fill(first.begin(), first.end(), 1e300);
  for (size_t i = 0; i < ev.size(); ++i) {
    first[step[i]] = std::min(first[step[i]], ev[i].start_s);
    last[step[i]] = std::max(last[step[i]], ev[i].end_s());
  }
  for (int k = 0; k < s.steps; ++k)
    s.step_times_s.push_back(last[k] >= first[k] ? last[k] - first[k] : 0);
  s.step_time_s = median(s.step_times_s);

  // Totals per category.
  std::map<std::pair<int, int>, std::string> stream_names;
  for (const TraceStream& st : trace.streams) stream_names[{st.rank, st.stream}] = st.name;
  const double per_step = 1.0 / s.steps;
  auto count = [&](Totals& t, const std::string& key, const TraceEvent& e) {
    t.seconds[key] += e.dur_s * per_step;
    ++t.events[key];
  };
  for (const TraceEvent& e : ev) {
    count(s.by_kind, e.kind, e);
    count(s.by_phase, e.phase, e);
    if (is_communication_kind(e.kind)) count(s.by_group, e.group, e);
    auto it = stream_names.find({e.rank, e.stream});
    count(s.by_stream, it != stream_names.end() ? it->second : "stream " + std::to_string(e.stream),
          e);
  }

  // Per rank and step.
  std::map<int, std::vector<std::vector<size_t>>> by_rank;  // rank -> step -> events
  for (size_t i = 0; i < ev.size(); ++i) {
    auto& steps = by_rank[ev[i].rank];
    steps.resize(s.steps);
    steps[step[i]].push_back(i);
  }
  s.ranks = static_cast<int>(by_rank.size());
  for (const auto& [rank, steps] : by_rank) {
    RankTime r;
    r.rank = rank;
    for (int k = 0; k < s.steps; ++k) add(r, sweep(ev, steps[k], first[k], last[k]), per_step);
    s.rank_time.push_back(r);
  }
  s.worst = s.rank_time.front();
  for (const RankTime& r : s.rank_time) {
    add(s.mean, r, 1.0 / s.ranks);
    if (r.compute_s > s.worst.compute_s) s.worst = r;
  }
  return s;
}

Json summary_to_json(const TraceSummary& s) {
  auto totals = [](const Totals& t) {
    Json j = Json::object();
    for (const auto& [k, v] : t.seconds) j[k] = {{"seconds", v}, {"events", t.events.at(k)}};
    return j;
  };
  auto rank = [](const RankTime& r) {
    return Json{{"rank", r.rank},
                {"compute_s", r.compute_s},
                {"exposed_comm_s", r.exposed_comm_s},
                {"exposed_copy_s", r.exposed_copy_s},
                {"bubble_s", r.bubble_s},
                {"comm_s", r.comm_s},
                {"compute_idle_s", r.compute_idle_s()}};
  };
  Json ranks = Json::array();
  for (const RankTime& r : s.rank_time) ranks.push_back(rank(r));
  return {{"ranks", s.ranks},
          {"steps", s.steps},
          {"step_time_s", s.step_time_s},
          {"step_times_s", s.step_times_s},
          {"by_kind", totals(s.by_kind)},
          {"by_phase", totals(s.by_phase)},
          {"by_group", totals(s.by_group)},
          {"by_stream", totals(s.by_stream)},
          {"mean", rank(s.mean)},
          {"worst", rank(s.worst)},
          {"rank_time", ranks}};
}

}  // namespace parasol::traces
