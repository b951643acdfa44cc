// The result of a trace import: per-rank assembly (kinds, unclassified names, launch gaps,
// stream names), merging of per-rank parts and the summary JSON (see imported_trace.h).
#include "traces/imported_trace.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>
#include <set>

#include "core/error.h"
#include "core/program.h"
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

double attention_kernel_flops(const KernelShape& s, bool causal_if_unstated) {
  AttnShape a;
  a.batch = s.attn_batch, a.seq_q = s.seq_q, a.seq_kv = s.seq_kv;
  a.heads = s.heads, a.kv_heads = s.kv_heads, a.head_dim = s.head_dim;
  a.causal = s.causal < 0 ? causal_if_unstated : s.causal == 1;
  a.flash = true;
  return attention_flops(a) * (s.backward ? kFlashBackwardFlopRatio : 1.0);
}

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

double profiler_step_seconds(std::vector<std::pair<double, double>> ranges,
                             const std::vector<DeviceSpan>& spans) {
  if (ranges.empty()) return 0;
  std::sort(ranges.begin(), ranges.end());
  double sum = 0;
  for (const auto& r : ranges) sum += r.second - r.first;
  const double mean_us = sum / ranges.size();
  // Per range: the first start and the last end of the device work it launched (lo > hi: none).
  std::vector<std::pair<double, double>> work(ranges.size(), {1e300, -1e300});
  for (const DeviceSpan& d : spans) {
    if (d.launch_end < 0) continue;
    auto it = std::upper_bound(ranges.begin(), ranges.end(), std::make_pair(d.launch_end, 1e300));
    if (it == ranges.begin()) continue;
    const size_t k = static_cast<size_t>(it - ranges.begin()) - 1;
    if (d.launch_end > ranges[k].second) continue;
    work[k].first = std::min(work[k].first, d.start);
    work[k].second = std::max(work[k].second, d.end);
  }
  long first = -1, last = -1;
  for (size_t k = 0; k < work.size(); ++k)
    if (work[k].second >= work[k].first) {
      if (first < 0) first = static_cast<long>(k);
      last = static_cast<long>(k);
    }
  if (first >= 0 && last > first)
    return (work[last].second - work[first].second) / static_cast<double>(last - first) * 1e-6;
  if (first >= 0) return std::max(mean_us, work[first].second - work[first].first) * 1e-6;
  return mean_us * 1e-6;
}

std::vector<ImportedTrace> import_parasol_trace(const Trace& trace) {
  const int steps = trace.steps > 0 ? trace.steps : std::max(1, summarize(trace).steps);
  std::map<int, ImportedTrace> by_rank;
  std::map<int, std::vector<DeviceSpan>> spans;
  for (const TraceEvent& e : trace.events) {
    ImportedTrace& imp = by_rank[e.rank];
    TraceEvent t = e;
    t.op_id = -1;
    imp.trace.events.push_back(std::move(t));
    imp.shapes.emplace_back();
    ++imp.kernels;
    spans[e.rank].push_back({e.start_s * 1e6, (e.start_s + e.dur_s) * 1e6, -1});
  }
  std::vector<ImportedTrace> parts;
  for (auto& [rank, imp] : by_rank) {
    imp.trace.source = "measured";
    imp.steps = steps;
    finish_rank(imp, rank, spans[rank]);
    // The streams as parasol named them.
    for (TraceStream& s : imp.trace.streams)
      for (const TraceStream& w : trace.streams)
        if (w.rank == s.rank && w.stream == s.stream && !w.name.empty()) s.name = w.name;
    parts.push_back(std::move(imp));
  }
  return parts;
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
    if (std::find(all.files.begin(), all.files.end(), paths[f]) == all.files.end())
      all.files.push_back(paths[f]);
    all.kernels += imp.kernels;
    all.world_size = std::max(all.world_size, imp.world_size);
    all.step_s.insert(imp.step_s.begin(), imp.step_s.end());
    for (const std::string& d : imp.devices)
      if (std::find(all.devices.begin(), all.devices.end(), d) == all.devices.end())
        all.devices.push_back(d);
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

namespace {

// The GPU family a device name says ("NVIDIA A100-PG509-200" -> "A100", "H100-SXM" -> "H100",
// "AMD Instinct MI300X" -> "MI300X"), or "" when it names none: a letter among A, B, H, L, T, V
// (NVIDIA) followed by 2-3 digits, or MI and 2-3 digits with an optional X or A (AMD), as a
// word of its own.
std::string gpu_family(const std::string& name) {
  std::string s;
  for (char c : name) s.push_back(static_cast<char>(std::toupper(static_cast<unsigned char>(c))));
  auto word_start = [&](size_t i) {
    return i == 0 || !std::isalnum(static_cast<unsigned char>(s[i - 1]));
  };
  for (size_t i = 0; i < s.size(); ++i) {
    if (!word_start(i)) continue;
    size_t j = i;
    if (s.compare(i, 2, "MI") == 0) {
      j = i + 2;
    } else if (std::string("ABHLTV").find(s[i]) != std::string::npos) {
      j = i + 1;
    } else {
      continue;
    }
    size_t k = j;
    while (k < s.size() && std::isdigit(static_cast<unsigned char>(s[k]))) ++k;
    if (k - j < 2 || k - j > 3) continue;
    if (j == i + 2 && k < s.size() && (s[k] == 'X' || s[k] == 'A')) ++k;
    if (k < s.size() && std::isalnum(static_cast<unsigned char>(s[k]))) continue;
    return s.substr(i, k - i);
  }
  return "";
}

}  // namespace

void label_copies_by_plan(ImportedTrace& imp, bool plan_offloads) {
  if (!plan_offloads) return;
  for (TraceEvent& e : imp.trace.events) {
    if (e.kind != "memcpy") continue;
    const bool h2d = e.name.find("HtoD") != std::string::npos;
    const bool d2h = e.name.find("DtoH") != std::string::npos;
    if (!h2d && !d2h) continue;
    --imp.by_kind[e.kind];
    if (imp.by_kind[e.kind] == 0) imp.by_kind.erase(e.kind);
    e.kind = h2d ? "prefetch" : "offload";
    ++imp.by_kind[e.kind];
  }
}

double step_time_s(const ImportedTrace& imp) {
  std::vector<double> v;
  for (const auto& [rank, s] : imp.step_s) v.push_back(s);
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

std::vector<std::string> plan_mismatches(const ImportedTrace& imp, const std::string& device_name,
                                         int plan_world, const std::string& plan_dtype) {
  std::vector<std::string> out;
  const std::string family = gpu_family(device_name);
  for (const std::string& d : imp.devices) {
    const std::string f = gpu_family(d);
    if (!f.empty() && !family.empty() && f != family) {
      out.push_back("device: the trace ran on " + d + ", the plan's cluster has " + device_name);
      break;
    }
  }
  if (imp.world_size > 0 && imp.world_size != plan_world)
    out.push_back("world size: the trace's job had " + std::to_string(imp.world_size) +
                  " ranks (distributedInfo.world_size), the plan has " +
                  std::to_string(plan_world));
  std::set<int> ranks;
  for (const TraceEvent& e : imp.trace.events) ranks.insert(e.rank);
  if (!ranks.empty() &&
      (*ranks.rbegin() >= plan_world || static_cast<int>(ranks.size()) > plan_world))
    out.push_back("ranks: the trace has " + std::to_string(ranks.size()) + " rank(s) up to rank " +
                  std::to_string(*ranks.rbegin()) + ", the plan has " + std::to_string(plan_world));
  std::map<std::string, double> gemm_s;
  for (size_t i = 0; i < imp.trace.events.size() && i < imp.shapes.size(); ++i) {
    const TraceEvent& e = imp.trace.events[i];
    if ((e.kind == "linear" || e.kind == "attention") && !imp.shapes[i].dtype.empty())
      gemm_s[imp.shapes[i].dtype == "tf32" ? "fp32" : imp.shapes[i].dtype] += e.dur_s;
  }
  int forward = 0, trains = 0;  // kernels by the phase their launching ops say
  for (const TraceEvent& e : imp.trace.events) {
    forward += e.phase == "fwd";
    trains += e.phase == "bwd" || e.phase == "optimizer";
  }
  if (forward > 0 && trains == 0)
    out.push_back("step: the trace's ops launched " + std::to_string(forward) +
                  " kernel(s) in the forward and none in a backward or an optimizer step (an "
                  "inference or forward-only trace), the plan's step trains");
  if (!gemm_s.empty() && !plan_dtype.empty()) {
    auto most = std::max_element(gemm_s.begin(), gemm_s.end(),
                                 [](const auto& a, const auto& b) { return a.second < b.second; });
    if (most->first != plan_dtype && !(plan_dtype == "tf32" && most->first == "fp32"))
      out.push_back("dtype: most of the trace's GEMM time ran " + most->first +
                    ", the plan's precision is " + plan_dtype);
  }
  return out;
}

std::vector<std::string> check_against_plan(const ImportedTrace& imp,
                                            const std::string& device_name, int plan_world,
                                            const std::string& plan_dtype, bool allow) {
  std::vector<std::string> m = plan_mismatches(imp, device_name, plan_world, plan_dtype);
  if (!m.empty() && !allow) {
    std::string msg = "the trace is not of the plan's job: ";
    for (size_t i = 0; i < m.size(); ++i) msg += (i ? "; " : "") + m[i];
    throw Error("traces", msg + " (--allow-mismatch prices it with the plan anyway)");
  }
  return m;
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
  return {{"files", imp.files},
          {"ranks", ranks.size()},
          {"events", imp.trace.events.size()},
          {"steps", imp.steps},
          {"kernels", imp.kernels},
          {"by_kind", by_kind},
          {"unclassified", unc},
          {"gaps", gaps},
          {"collectives", coll},
          {"step_time_s", step_time_s(imp)},
          {"world_size", imp.world_size},
          {"devices", imp.devices}};
}

}  // namespace parasol::traces
