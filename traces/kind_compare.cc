// compare_by_kind: a prediction and an imported measurement side by side per op kind, stream
// role and step (see kind_compare.h).
#include "traces/kind_compare.h"

#include <algorithm>
#include <map>

#include "core/error.h"
#include "traces/summary.h"

namespace parasol::traces {

namespace {

// "comm1" -> "comm", "compute (cuda stream 7)" -> "compute", "stream 3" -> "stream".
std::string role(const std::string& stream) {
  std::string r = stream.substr(0, stream.find(' '));
  while (!r.empty() && r.back() >= '0' && r.back() <= '9') r.pop_back();
  return r.empty() ? stream : r;
}

}  // namespace

KindComparison compare_by_kind(const Trace& predicted, const Trace& measured, int measured_steps,
                               double measured_step_s) {
  PARASOL_CHECK(measured_steps >= 1, "measured_steps >= 1");
  const TraceSummary p = summarize(predicted), m = summarize(measured);
  if (m.ranks == 0) throw Error("measured", "the measured trace has no events");
  if (p.ranks == 0) throw Error("predicted", "the prediction has no events");
  KindComparison c;
  c.predicted_ranks = p.ranks;
  c.measured_ranks = m.ranks;
  c.measured_steps = measured_steps;
  const double pn = p.ranks, mn = static_cast<double>(m.ranks) * measured_steps;
  std::map<std::string, CompareRow> kinds, streams, phases;
  for (const auto& [k, s] : p.by_kind.seconds) kinds[k].predicted_s += s / pn;
  for (const auto& [k, s] : m.by_kind.seconds) kinds[k].measured_s += s / mn;
  for (const auto& [k, n] : m.by_kind.events) kinds[k].events += n;
  for (const auto& [k, s] : p.by_phase.seconds) phases[phase_key(k)].predicted_s += s / pn;
  for (const auto& [k, s] : m.by_phase.seconds) phases[phase_key(k)].measured_s += s / mn;
  for (const auto& [k, n] : m.by_phase.events) phases[phase_key(k)].events += n;
  c.by_phase = phase_rows(std::move(phases));
  for (const auto& [k, s] : p.by_stream.seconds) streams[role(k)].predicted_s += s / pn;
  for (const auto& [k, s] : m.by_stream.seconds) streams[role(k)].measured_s += s / mn;
  for (const auto& [k, n] : m.by_stream.events) streams[role(k)].events += n;
  for (auto& [k, r] : kinds) {
    r.key = k;
    c.by_kind.push_back(r);
    c.busy.predicted_s += r.predicted_s;
    c.busy.measured_s += r.measured_s;
    c.busy.events += r.events;
  }
  std::stable_sort(c.by_kind.begin(), c.by_kind.end(),
                   [](const CompareRow& a, const CompareRow& b) {
                     return a.measured_s != b.measured_s ? a.measured_s > b.measured_s
                                                         : a.predicted_s > b.predicted_s;
                   });
  for (auto& [k, r] : streams) {
    r.key = k;
    c.by_stream.push_back(r);
  }
  c.busy.key = "busy (all ops, per rank)";
  c.step = {"step time", p.step_time_s,
            measured_step_s > 0 ? measured_step_s : m.step_time_s / measured_steps, 0};
  return c;
}

Json kind_comparison_to_json(const KindComparison& c) {
  Json kinds = Json::array(), streams = Json::array(), phases = Json::array();
  for (const CompareRow& r : c.by_phase) phases.push_back(compare_row_to_json(r));
  for (const CompareRow& r : c.by_kind) kinds.push_back(compare_row_to_json(r));
  for (const CompareRow& r : c.by_stream) streams.push_back(compare_row_to_json(r));
  return {{"predicted_ranks", c.predicted_ranks},
          {"measured_ranks", c.measured_ranks},
          {"measured_steps", c.measured_steps},
          {"by_kind", kinds},
          {"by_phase", phases},
          {"by_stream", streams},
          {"busy", compare_row_to_json(c.busy)},
          {"step", compare_row_to_json(c.step)}};
}

}  // namespace parasol::traces
