// The result of a trace import: per-rank assembly (kinds, unclassified names, launch gaps,
// stream names), merging of per-rank parts and the summary JSON (see imported_trace.h).
#include "traces/imported_trace.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>

#include "core/error.h"
#include "traces/summary.h"

namespace parasol::traces {

namespace {

RankGaps gaps_of(int rank, std::vector<DeviceSpan> acts) {
  RankGaps g;
  g.rank = rank;
  std::sort(acts.begin(), acts.end(),
            [](const DeviceSpan& a, const DeviceSpan& b) { return a.start < b.start; });
  double reach = -std::numeric_limits<double>::infinity();
  for (const DeviceSpan& a : acts) {
    if (a.start > reach && std::isfinite(reach)) {
      g.idle_s += (a.start - reach) * 1e-6;
      const double wait = std::min(a.start, a.launch_end) - reach;
      if (a.launch_end >= 0 && wait > 0) {
        g.launch_s += wait * 1e-6;
        ++g.launch_gaps;
      }
    }
    if (a.end > reach) {
      g.busy_s += (a.end - std::max(a.start, std::isfinite(reach) ? reach : a.start)) * 1e-6;
      reach = a.end;
    }
  }
  return g;
}

}  // namespace

void finish_rank(ImportedTrace& imp, int rank, const std::vector<DeviceSpan>& spans) {
  std::map<std::string, KernelCount> unclassified;
  std::set<int> streams;
  for (const TraceEvent& t : imp.trace.events) {
    ++imp.by_kind[t.kind];
    streams.insert(t.stream);
    if (t.kind != "unclassified") continue;
    KernelCount& k = unclassified[t.name];
    k.name = t.name;
    ++k.count;
    k.seconds += t.dur_s;
  }
  for (auto& [n, k] : unclassified) imp.unclassified.push_back(k);
  std::sort(imp.unclassified.begin(), imp.unclassified.end(),
            [](const KernelCount& a, const KernelCount& b) {
              return a.seconds != b.seconds ? a.seconds > b.seconds : a.name < b.name;
            });
  if (!imp.trace.events.empty()) imp.gaps.push_back(gaps_of(rank, spans));
  // Streams by what they ran.
  for (int s : streams) {
    bool comm = true, copy = true;
    for (const TraceEvent& t : imp.trace.events) {
      if (t.stream != s) continue;
      comm = comm && is_communication_kind(t.kind);
      copy = copy && (is_copy_kind(t.kind) || t.kind == "memcpy" || t.kind == "memset");
    }
    imp.trace.streams.push_back({rank, s,
                                 std::string(comm   ? "comm"
                                             : copy ? "copy"
                                                    : "compute") +
                                     " (cuda stream " + std::to_string(s) + ")"});
  }
  imp.trace.processes.push_back({rank, "rank " + std::to_string(rank)});
}

ImportedTrace merge_imported(std::vector<ImportedTrace> parts,
                             const std::vector<std::string>& files) {
  PARASOL_CHECK(parts.size() == files.size(), "one file per part");
  const std::vector<std::string>& paths = files;
  ImportedTrace all;
  all.trace.source = "measured";
  std::map<int, std::string> rank_file;
  std::map<std::string, KernelCount> unclassified;
  for (size_t f = 0; f < paths.size(); ++f) {
    const ImportedTrace& imp = parts[f];
    const int rank = imp.trace.processes.front().rank;
    if (rank_file.count(rank))
      throw Error(paths[f], "rank " + std::to_string(rank) + " is also the rank of " +
                                rank_file[rank] + ": give one file per rank");
    rank_file[rank] = paths[f];
    all.files.push_back(paths[f]);
    all.kernels += imp.kernels;
    all.steps = f == 0 ? imp.steps : std::max(all.steps, imp.steps);
    for (const auto& [k, n] : imp.by_kind) all.by_kind[k] += n;
    for (const KernelCount& k : imp.unclassified) {
      KernelCount& a = unclassified[k.name];
      a.name = k.name;
      a.count += k.count;
      a.seconds += k.seconds;
    }
    all.gaps.insert(all.gaps.end(), imp.gaps.begin(), imp.gaps.end());
    all.trace.events.insert(all.trace.events.end(), imp.trace.events.begin(),
                            imp.trace.events.end());
    all.shapes.insert(all.shapes.end(), imp.shapes.begin(), imp.shapes.end());
    all.trace.streams.insert(all.trace.streams.end(), imp.trace.streams.begin(),
                             imp.trace.streams.end());
    all.trace.processes.insert(all.trace.processes.end(), imp.trace.processes.begin(),
                               imp.trace.processes.end());
  }
  for (auto& [n, k] : unclassified) all.unclassified.push_back(k);
  std::sort(all.unclassified.begin(), all.unclassified.end(),
            [](const KernelCount& a, const KernelCount& b) {
              return a.seconds != b.seconds ? a.seconds > b.seconds : a.name < b.name;
            });
  std::sort(all.gaps.begin(), all.gaps.end(),
            [](const RankGaps& a, const RankGaps& b) { return a.rank < b.rank; });
  // Times from the earliest activity; events (with their shapes) by (rank, stream, start).
  double t0 = std::numeric_limits<double>::infinity();
  for (const TraceEvent& e : all.trace.events) t0 = std::min(t0, e.start_s);
  std::vector<size_t> order(all.trace.events.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  const auto& ev = all.trace.events;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (ev[a].rank != ev[b].rank) return ev[a].rank < ev[b].rank;
    if (ev[a].stream != ev[b].stream) return ev[a].stream < ev[b].stream;
    return ev[a].start_s < ev[b].start_s;
  });
  std::vector<TraceEvent> events;
  std::vector<KernelShape> shapes;
  for (size_t i : order) {
    events.push_back(ev[i]);
    events.back().start_s -= t0;
    shapes.push_back(all.shapes[i]);
  }
  all.trace.events = std::move(events);
  all.shapes = std::move(shapes);
  std::sort(all.trace.processes.begin(), all.trace.processes.end(),
            [](const TraceProcess& a, const TraceProcess& b) { return a.rank < b.rank; });
  return all;
}

Json import_summary_to_json(const ImportedTrace& imp) {
  std::map<std::string, double> seconds;
  std::set<int> ranks;
  struct Comm {
    int events = 0, sized = 0;
    double bytes = 0;
  };
  std::map<std::string, Comm> comms;
  for (size_t i = 0; i < imp.trace.events.size(); ++i) {
    const TraceEvent& e = imp.trace.events[i];
    seconds[e.kind] += e.dur_s;
    ranks.insert(e.rank);
    if (is_communication_kind(e.kind)) {
      Comm& c = comms[e.kind];
      ++c.events;
      c.bytes += e.bytes;
      c.sized += !imp.shapes[i].size_from.empty();
    }
  }
  Json by_kind = Json::object();
  for (const auto& [k, n] : imp.by_kind) by_kind[k] = {{"events", n}, {"seconds", seconds[k]}};
  Json unc = Json::array();
  for (const KernelCount& k : imp.unclassified)
    unc.push_back({{"name", k.name}, {"count", k.count}, {"seconds", k.seconds}});
  Json gaps = Json::array();
  for (const RankGaps& g : imp.gaps)
    gaps.push_back({{"rank", g.rank},
                    {"busy_s", g.busy_s},
                    {"idle_s", g.idle_s},
                    {"launch_s", g.launch_s},
                    {"launch_gaps", g.launch_gaps}});
  Json coll = Json::array();
  for (const auto& [k, c] : comms)
    coll.push_back({{"kind", k}, {"events", c.events}, {"bytes", c.bytes}, {"sized", c.sized}});
  return {{"files", imp.files},  {"ranks", ranks.size()},  {"events", imp.trace.events.size()},
          {"steps", imp.steps},  {"kernels", imp.kernels}, {"by_kind", by_kind},
          {"unclassified", unc}, {"gaps", gaps},           {"collectives", coll}};
}

}  // namespace parasol::traces
