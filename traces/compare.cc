// Op-by-op comparison of a predicted and a measured trace (see compare.h for the matching
// rule and what is rejected).
#include "traces/compare.h"

#include <algorithm>
#include <optional>
#include <set>

#include "core/error.h"
#include "core/plan.h"
#include "core/program.h"
#include "core/rank_layout.h"

namespace parasol::traces {

namespace {

// One op id of one rank: its identity and its duration in each step.
struct OpRecord {
  const TraceEvent* first = nullptr;
  std::vector<double> durations;
  double median() const {
    std::vector<double> v = durations;
    std::sort(v.begin(), v.end());
    const size_t n = v.size();
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
  }
};
using RankOps = std::map<int, OpRecord>;  // op id -> record

std::map<int, RankOps> index_ops(const Trace& t, const std::string& name) {
  std::map<int, RankOps> out;
  for (const TraceEvent& e : t.events) {
    // The simulator's host row repeats each op id: its issue span, not the op.
    if (e.op_id < 0 || e.kind == kHostIssueKind) continue;
    OpRecord& r = out[e.rank][e.op_id];
    if (!r.first) r.first = &e;
    r.durations.push_back(e.dur_s);
  }
  if (out.empty())
    throw Error(name, "has no events with op ids (args.op_id): not a trace of a parasol Program");
  return out;
}

// Op ids of `a` and `b` with equal name and kind, and whether any shared op id differs.
std::pair<int, bool> agreement(const RankOps& a, const RankOps& b) {
  int same = 0;
  bool conflict = false;
  for (const auto& [id, rec] : a) {
    auto it = b.find(id);
    if (it == b.end()) continue;
    if (rec.first->name == it->second.first->name && rec.first->kind == it->second.first->kind)
      ++same;
    else
      conflict = true;
  }
  return {same, conflict};
}

// The plan recorded by either trace (the predicted one first), if any.
std::optional<Plan> recorded_plan(const Trace& predicted, const Trace& measured,
                                  const std::string& pname, const std::string& mname) {
  if (!predicted.plan.is_null()) return plan_from_json(predicted.plan, pname + ".plan");
  if (!measured.plan.is_null()) return plan_from_json(measured.plan, mname + ".plan");
  return std::nullopt;
}

}  // namespace

std::string phase_key(const std::string& p) { return p.empty() ? "(none)" : p; }

std::vector<CompareRow> phase_rows(std::map<std::string, CompareRow> phases) {
  std::vector<CompareRow> rows;
  std::vector<std::string> order;
  for (Phase ph : {Phase::kForward, Phase::kBackward, Phase::kRecompute, Phase::kOptimizer})
    order.push_back(phase_name(ph));
  order.push_back(phase_key(""));
  for (const std::string& ph : order) {
    auto it = phases.find(ph);
    if (it == phases.end()) continue;
    it->second.key = ph;
    rows.push_back(it->second);
    phases.erase(it);
  }
  for (auto& [k, row] : phases) {  // phases of other names, alphabetically
    row.key = k;
    rows.push_back(row);
  }
  return rows;
}

Comparison compare_traces(const Trace& predicted, const Trace& measured, const std::string& pname,
                          const std::string& mname) {
  const std::map<int, RankOps> pred = index_ops(predicted, pname);
  const std::map<int, RankOps> meas = index_ops(measured, mname);
  const std::optional<Plan> plan = recorded_plan(predicted, measured, pname, mname);
  std::optional<RankLayout> layout;
  if (plan) layout.emplace(*plan);

  Comparison c;
  std::map<std::string, CompareRow> kinds, phases;
  std::map<int, std::set<int>> seen;  // predicted rank -> op ids matched
  for (const auto& [rank, ops] : meas) {
    const std::string where = mname + ".ranks[" + std::to_string(rank) + "]";
    // The predicted rank that plays this rank's Program (compare.h's rule).
    int p = -1;
    if (pred.count(rank)) {
      p = rank;
    } else if (layout) {
      if (rank >= layout->world())
        throw Error(where, "rank " + std::to_string(rank) + " is outside the plan's " +
                               std::to_string(layout->world()) + " ranks");
      const int stage = layout->coord(rank).pp;
      p = layout->stage_representative(stage);
      if (!pred.count(p))
        throw Error(where, "the prediction has no events of rank " + std::to_string(p) +
                               ", the representative of pipeline stage " + std::to_string(stage));
    } else {
      std::pair<int, int> best{-1, -1};  // (no conflicting op id, op ids that agree)
      for (const auto& [q, qops] : pred) {
        auto [same, conflict] = agreement(ops, qops);
        const std::pair<int, int> score{conflict ? 0 : 1, same};
        if (score > best) {
          best = score;
          p = q;
        }
      }
    }
    c.rank_map[rank] = p;
    const RankOps& pops = pred.at(p);
    int shared = 0;
    for (const auto& [id, rec] : ops) {
      const std::string op_where = where + ".ops[" + std::to_string(id) + "]";
      auto it = pops.find(id);
      if (it == pops.end())
        throw Error(op_where, "'" + rec.first->name + "' is not in " + pname + " (rank " +
                                  std::to_string(p) + " has " + std::to_string(pops.size()) +
                                  " ops): a trace of another program");
      const TraceEvent& pe = *it->second.first;
      if (pe.name != rec.first->name || pe.kind != rec.first->kind)
        throw Error(op_where, "'" + rec.first->name + "' (" + rec.first->kind + ") here but '" +
                                  pe.name + "' (" + pe.kind + ") in " + pname + " (rank " +
                                  std::to_string(p) + "): a trace of another program");
      ++shared;
      seen[p].insert(id);
      const double ps = it->second.median(), ms = rec.median();
      for (CompareRow* row : {&kinds[pe.kind], &phases[phase_key(pe.phase)], &c.total}) {
        row->predicted_s += ps;
        row->measured_s += ms;
        ++row->events;
      }
    }
    if (shared == 0) throw Error(where, "shares no op id with " + pname);
    c.matched += shared;
    c.unmatched_predicted += static_cast<int>(pops.size()) - shared;
  }

  for (auto& [k, row] : kinds) {
    row.key = k;
    c.by_kind.push_back(row);
  }
  std::stable_sort(
      c.by_kind.begin(), c.by_kind.end(),
      [](const CompareRow& a, const CompareRow& b) { return a.measured_s > b.measured_s; });
  c.by_phase = phase_rows(std::move(phases));
  c.total.key = "all matched ops";

  c.predicted = summarize(predicted);
  c.measured = summarize(measured);
  c.step = {"step time", c.predicted.step_time_s, c.measured.step_time_s, 0};
  c.exposed_comm = {"exposed communication (mean per rank)", c.predicted.mean.exposed_comm_s,
                    c.measured.mean.exposed_comm_s, 0};
  c.bubble = {"bubble (mean per rank)", c.predicted.mean.bubble_s, c.measured.mean.bubble_s, 0};
  return c;
}

Json compare_row_to_json(const CompareRow& r) {
  return Json{{"key", r.key},
              {"predicted_s", r.predicted_s},
              {"measured_s", r.measured_s},
              {"events", r.events},
              {"error", r.error()}};
}

Json comparison_to_json(const Comparison& c) {
  const auto row = compare_row_to_json;
  Json kinds = Json::array(), phases = Json::array(), ranks = Json::object();
  for (const CompareRow& r : c.by_kind) kinds.push_back(row(r));
  for (const CompareRow& r : c.by_phase) phases.push_back(row(r));
  for (const auto& [m, p] : c.rank_map) ranks[std::to_string(m)] = p;
  return {{"matched", c.matched},   {"unmatched_predicted", c.unmatched_predicted},
          {"rank_map", ranks},      {"by_kind", kinds},
          {"by_phase", phases},     {"total", row(c.total)},
          {"step", row(c.step)},    {"exposed_comm", row(c.exposed_comm)},
          {"bubble", row(c.bubble)}};
}

}  // namespace parasol::traces
