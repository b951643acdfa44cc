// Calibration: samples from measured traces matched to the lowered Programs, and the bounded
// least-squares fit of the Profile's parameters (see calibrate.h).
#include "traces/calibrate.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <tuple>

#include "core/error.h"
#include "core/lower.h"
#include "core/rank_layout.h"
#include "cost_models/compute_overlap.h"
#include "cost_models/op_cost.h"
#include "traces/least_squares.h"
#include "traces/summary.h"

namespace parasol::traces {

namespace {

// One op of one run to fit: its Program op and its measured seconds.
struct Sample {
  int run = 0;
  int stage = 0;
  const Op* op = nullptr;
  bool host = false;
  double measured_s = 0;
  double weight = 1;  // w_i (calibrate.h)
  int count = 1;      // occurrences per step that the sample stands for (replayed time)
};

// A run lowered once.
struct Lowered {
  const MeasuredRun* run;
  LoweredPlan lowered;
  std::vector<int> reps;  // representative rank of each stage
};

// A fitted parameter of the Profile: how to read and write it, its bounds and its scale (the
// solver works on value / scale).
struct Param {
  std::string name;
  std::function<double(const cost::Profile&)> get;
  std::function<void(cost::Profile&, double)> set;
  double lower, upper, scale;
};

// The parameters of the runs' lowered plans: a GEMM efficiency per precision they price in.
std::vector<Param> parameters(const std::vector<Lowered>& lws) {
  std::vector<Param> ps;
  auto field = [&](const std::string& name, double cost::Profile::*member, double lo, double hi,
                   double scale) {
    ps.push_back({name, [member](const cost::Profile& p) { return p.*member; },
                  [member](cost::Profile& p, double v) { p.*member = v; }, lo, hi, scale});
  };
  std::set<int> dtypes;
  std::set<int> links;
  for (const Lowered& lw : lws) {
    dtypes.insert(static_cast<int>(lw.lowered.plan.precision));
    for (LinkKind k : lw.run->cluster.link_kinds()) links.insert(static_cast<int>(k));
  }
  for (int d : dtypes)
    ps.push_back({std::string("gemm_efficiency.") + dtype_name(static_cast<Dtype>(d)),
                  [d](const cost::Profile& p) {
                    // The burst efficiency (gemm_eff also applies the sustained clock).
                    const double e = p.gemm_efficiency_by_dtype[d];
                    return e > 0 ? e : p.gemm_efficiency;
                  },
                  [d](cost::Profile& p, double v) { p.gemm_efficiency_by_dtype[d] = v; }, 0.01, 1,
                  1});
  field("gemm_k_half", &cost::Profile::gemm_k_half, 0, 8192, 32);
  field("memory_efficiency", &cost::Profile::memory_efficiency, 0.01, 1, 1);
  field("flash_forward_efficiency", &cost::Profile::flash_forward_efficiency, 0.01, 1, 1);
  field("flash_backward_efficiency", &cost::Profile::flash_backward_efficiency, 0.01, 1, 1);
  field("kernel_overhead_s", &cost::Profile::kernel_overhead_s, 0, 1e-3, 1e-6);
  for (int k : links)
    ps.push_back({std::string("link_efficiency.") + link_kind_name(static_cast<LinkKind>(k)),
                  [k](const cost::Profile& p) { return p.link_efficiency[k]; },
                  [k](cost::Profile& p, double v) { p.link_efficiency[k] = v; }, 0.01, 1, 1});
  field("collective_step_latency_s", &cost::Profile::collective_step_latency_s, 0, 1e-3, 1e-6);
  field("host_copy_efficiency", &cost::Profile::host_copy_efficiency, 0.01, 1, 1);
  field("host_adam_params_per_s", &cost::Profile::host_adam_params_per_s, 1e6, 1e13, 1e9);
  return ps;
}

// Whether [s, e) of event `i` overlaps another communication or copy event of its rank.
// `comm` holds the rank's communication and copy events (not receives) sorted by start.
bool overlaps_other(const std::vector<const TraceEvent*>& comm, const TraceEvent* e) {
  for (const TraceEvent* o : comm) {
    if (o == e) continue;
    if (o->start_s >= e->end_s()) break;
    if (o->end_s() > e->start_s && o->start_s < e->end_s()) return true;
  }
  return false;
}

// A collective of a rank's trace, and whether it is of the data-parallel kind
// (cost_models/compute_overlap.h).
struct Collective {
  const TraceEvent* event;
  bool data_parallel;
};

// Seconds compute event `e` lost to the collectives beside it (sorted by start): at each instant
// cost::compute_slowdown() of the kinds running, the rule the simulator plays, so that the
// measured duration less these is the standalone one (compute at rate 1 - x for c seconds takes
// x c longer).
double slowed_seconds(const std::vector<Collective>& collectives, const TraceEvent& e,
                      const cost::Profile& f) {
  // The instants where the kinds running change, inside [e.start, e.end).
  std::vector<double> at = {e.start_s, e.end_s()};
  for (const Collective& c : collectives) {
    if (c.event->start_s >= e.end_s()) break;
    if (c.event->end_s() <= e.start_s) continue;
    at.push_back(std::max(e.start_s, c.event->start_s));
    at.push_back(std::min(e.end_s(), c.event->end_s()));
  }
  std::sort(at.begin(), at.end());
  double lost = 0;
  for (size_t k = 0; k + 1 < at.size(); ++k) {
    if (at[k + 1] <= at[k]) continue;
    const double mid = 0.5 * (at[k] + at[k + 1]);
    bool other = false, dp = false;
    for (const Collective& c : collectives) {
      if (c.event->start_s > mid) break;
      if (c.event->end_s() > mid) (c.data_parallel ? dp : other) = true;
    }
    lost += cost::compute_slowdown(f, other, dp) * (at[k + 1] - at[k]);
  }
  return lost;
}

// The samples of run `ri`; counts the pairs not fitted in `skipped`. A compute op that ran
// beside communication was slowed by it (cost::compute_slowdown() under `base`): its standalone
// duration is the measured one less the seconds that cost it (slowed_seconds).
void collect(const Lowered& lw, int ri, const cost::Profile& base, std::vector<Sample>& samples,
             int& skipped) {
  const MeasuredRun& run = *lw.run;
  const RankLayout& layout = lw.lowered.layout;
  // Per rank: its communication and copy events by start (for the overlap test).
  std::map<int, std::vector<const TraceEvent*>> comm;
  for (const TraceEvent& e : run.trace.events)
    if ((is_communication_kind(e.kind) && e.kind != "recv") || is_copy_kind(e.kind))
      comm[e.rank].push_back(&e);
  std::map<int, std::vector<Collective>> collectives;  // what slows compute
  for (const TraceEvent& e : run.trace.events)
    if (is_communication_kind(e.kind) && e.kind != "recv") {
      // The op's group, from the Program (an event the Program lacks is refused below).
      const int stage = e.rank < layout.world() ? layout.coord(e.rank).pp : -1;
      const bool known = stage >= 0 && e.op_id >= 0 &&
                         e.op_id < static_cast<int>(lw.lowered.programs[stage].ops.size());
      collectives[e.rank].push_back(
          {&e, known && cost::is_data_parallel(lw.lowered.programs[stage].ops[e.op_id].group)});
    }
  // Per rank: its compute events (a transfer beside one measured the poll, not the transfer).
  std::map<int, std::vector<const TraceEvent*>> compute;
  for (const TraceEvent& e : run.trace.events)
    if (e.op_id >= 0 && !is_communication_kind(e.kind) && !is_copy_kind(e.kind))
      compute[e.rank].push_back(&e);
  auto by_start = [](const TraceEvent* a, const TraceEvent* b) { return a->start_s < b->start_s; };
  for (auto& [r, v] : comm) std::sort(v.begin(), v.end(), by_start);
  for (auto& [r, v] : collectives)
    std::sort(v.begin(), v.end(), [](const Collective& a, const Collective& b) {
      return a.event->start_s < b.event->start_s;
    });
  for (auto& [r, v] : compute) std::sort(v.begin(), v.end(), by_start);

  // (stage, op id) -> rank -> durations over steps.
  std::map<std::pair<int, int>, std::map<int, std::vector<double>>> durations;
  bool any = false;
  for (const TraceEvent& e : run.trace.events) {
    if (e.op_id < 0) continue;
    any = true;
    const std::string where =
        run.name + ".ranks[" + std::to_string(e.rank) + "].ops[" + std::to_string(e.op_id) + "]";
    if (e.rank >= layout.world())
      throw Error(run.name + ".ranks[" + std::to_string(e.rank) + "]",
                  "rank " + std::to_string(e.rank) + " is outside the plan's " +
                      std::to_string(layout.world()) + " ranks");
    const int stage = layout.coord(e.rank).pp;
    const Program& prog = lw.lowered.programs[stage];
    if (e.op_id >= static_cast<int>(prog.ops.size()))
      throw Error(where, "'" + e.name + "' is not an op of the plan's stage " +
                             std::to_string(stage) + " (it has " + std::to_string(prog.ops.size()) +
                             " ops): a trace of another program");
    const Op& op = prog.ops[e.op_id];
    if (op.name != e.name || op_kind_name(op.kind) != e.kind)
      throw Error(where, "'" + e.name + "' (" + e.kind + ") here but '" + op.name + "' (" +
                             op_kind_name(op.kind) +
                             ") in the plan's Program: a trace of another "
                             "program");
    const bool comm_or_copy = !cost::is_compute_kind(op.kind);
    if (op.kind == OpKind::kRecv || op.kind == OpKind::kSync ||
        (is_communication(op.kind) && op.group == Group::kPp) || e.dur_s <= 0 ||
        (comm_or_copy && overlaps_other(comm[e.rank], &e)) ||
        (is_communication(op.kind) && overlaps_other(compute[e.rank], &e))) {
      ++skipped;
      continue;
    }
    double standalone = e.dur_s;
    if (!comm_or_copy) standalone -= slowed_seconds(collectives[e.rank], e, base);
    durations[{stage, e.op_id}][e.rank].push_back(standalone);
  }
  if (!any) throw Error(run.name, "has no events with op ids (args.op_id)");
  for (const auto& [key, by_rank] : durations) {
    const auto [stage, id] = key;
    const Program& prog = lw.lowered.programs[stage];
    const Op& op = prog.ops[id];
    std::vector<double> per_rank;
    for (const auto& [r, d] : by_rank) per_rank.push_back(median(d));
    const double m = cost::is_compute_kind(op.kind)
                         ? median(per_rank)
                         : *std::min_element(per_rank.begin(), per_rank.end());
    samples.push_back({ri, stage, &op, cost::runs_on_host(prog, op), m, 1});
  }
}

// Predicted seconds of every sample under `profile` (one pricer per run).
void predict(const std::vector<Lowered>& lws, const std::vector<Sample>& samples,
             const cost::Profile& profile, std::vector<double>& out) {
  out.resize(samples.size());
  std::vector<std::unique_ptr<cost::PlacementCache>> places;
  std::vector<std::unique_ptr<cost::OpPricer>> pricers;
  for (const Lowered& lw : lws) {
    const MeasuredRun& r = *lw.run;
    places.push_back(std::make_unique<cost::PlacementCache>(r.cluster));
    pricers.push_back(std::make_unique<cost::OpPricer>(r.model, r.cluster, lw.lowered.plan, profile,
                                                       lw.lowered.layout, lw.reps, *places.back()));
  }
  for (size_t i = 0; i < samples.size(); ++i) {
    const Sample& s = samples[i];
    out[i] = pricers[s.run]->time(*s.op, s.stage, s.host);
  }
}

void residuals(const std::vector<Sample>& samples, const std::vector<double>& predicted,
               std::vector<double>& r) {
  r.resize(samples.size());
  for (size_t i = 0; i < samples.size(); ++i) {
    const double p = std::max(predicted[i], 1e-300);
    r[i] = samples[i].weight * std::log(p / samples[i].measured_s);
  }
}

// Lowers each run (checking its device against the base Profile's and its plan).
std::vector<Lowered> lower_runs(const std::vector<MeasuredRun>& runs, const cost::Profile& base) {
  if (runs.empty()) throw Error("traces", "no measured trace to calibrate from");
  std::vector<Lowered> lws;
  lws.reserve(runs.size());
  for (const MeasuredRun& r : runs) {
    if (r.cluster.gpu_device(0).name != base.device)
      throw Error("profile.device", "'" + base.device + "' is not the device of " + r.name +
                                        "'s cluster (" + r.cluster.gpu_device(0).name + ")");
    validate(r.plan, r.model, r.cluster);
    Lowered lw{&r, lower(r.model, r.cluster, r.plan), {}};
    lw.reps = lw.lowered.layout.stage_representatives();
    lws.push_back(std::move(lw));
  }
  return lws;
}

// Fits the parameters to `all` (the samples of every run), counting in out.skipped the ones
// priced at 0; fills the rest of `out`.
void fit(const std::vector<MeasuredRun>& runs, const std::vector<Lowered>& lws,
         const std::vector<Sample>& all, const cost::Profile& base, Calibration& out) {
  // Drop the ops the model prices at 0 (nothing to fit them with).
  std::vector<double> at_base;
  predict(lws, all, base, at_base);
  std::vector<Sample> samples;
  for (size_t i = 0; i < all.size(); ++i) {
    if (at_base[i] > 0 && std::isfinite(at_base[i]))
      samples.push_back(all[i]);
    else
      ++out.skipped;
  }
  if (samples.empty())
    throw Error("traces",
                "no op of the traces can be fitted (every matched op is a receive, a "
                "pipeline rendezvous, overlapped or priced at 0)");
  double mean = 0;
  // Time-weighted: an op's measured seconds times the occurrences it stands for (1 for an op of a
  // parasol trace).
  for (const Sample& s : samples) mean += s.count * s.measured_s / samples.size();
  for (Sample& s : samples) s.weight = std::sqrt(s.count * s.measured_s / mean);
  out.samples = static_cast<int>(samples.size());

  const std::vector<Param> params = parameters(lws);
  const size_t n = params.size();
  auto profile_at = [&](const std::vector<double>& u) {
    cost::Profile p = base;
    for (size_t j = 0; j < n; ++j) params[j].set(p, u[j] * params[j].scale);
    return p;
  };
  LsqProblem pb;
  std::vector<double> u0(n);
  for (size_t j = 0; j < n; ++j) {
    const Param& p = params[j];
    u0[j] = std::clamp(p.get(base), p.lower, p.upper) / p.scale;
    pb.lower.push_back(p.lower / p.scale);
    pb.upper.push_back(p.upper / p.scale);
    pb.step.push_back(1e-6);
  }
  std::vector<double> pred;
  pb.residuals = [&](const std::vector<double>& u, std::vector<double>& r) {
    predict(lws, samples, profile_at(u), pred);
    residuals(samples, pred, r);
  };
  LsqResult res = solve_bounded_least_squares(pb, u0);

  // Which samples depend on each parameter (at the solution).
  std::vector<double> r0, r1;
  pb.residuals(res.x, r0);
  cost::Profile fitted = base;
  for (size_t j = 0; j < n; ++j) {
    const Param& p = params[j];
    std::vector<double> u = res.x;
    u[j] += (u[j] + 1e-4 <= pb.upper[j]) ? 1e-4 : -1e-4;
    pb.residuals(u, r1);
    int dependent = 0;
    for (size_t i = 0; i < r0.size(); ++i) dependent += r1[i] != r0[i];
    const double value = dependent > 0 ? res.x[j] * p.scale : p.get(base);
    if (dependent > 0) p.set(fitted, value);  // else the base Profile's value stays as it was
    const double span = p.upper - p.lower;
    const bool at_bound =
        dependent > 0 && (value <= p.lower + 1e-6 * span || value >= p.upper - 1e-6 * span);
    out.params.push_back({p.name, p.get(base), value, p.lower, p.upper, dependent, at_bound});
  }
  fitted.device = base.device;
  fitted.measured_device = base.measured_device;
  fitted.traces.clear();
  for (const MeasuredRun& r : runs) fitted.traces.push_back(r.name);
  fitted.source = "parasol calibrate: " + std::to_string(out.samples) + " ops of " +
                  std::to_string(runs.size()) + " measured run(s), from the base profile (" +
                  base.source + ")";
  out.profile = fitted;
  out.iterations = res.iterations;
  out.rms_log_error_before = std::sqrt(res.initial_cost / samples.size());
  out.rms_log_error_after = std::sqrt(res.cost / samples.size());
  // The fitted ops replayed: measured against priced, each as often as it ran.
  std::vector<double> after;
  predict(lws, samples, fitted, after);
  predict(lws, samples, base, pred);
  for (size_t i = 0; i < samples.size(); ++i) {
    out.replay_measured_s += samples[i].count * samples[i].measured_s;
    out.replay_base_s += samples[i].count * pred[i];
    out.replay_fitted_s += samples[i].count * after[i];
  }
}

// The plan's group that a collective of `s` ran on, or nullopt. When the trace states the
// communicator's ranks, the group (calibrate.h's order) that holds exactly those ranks; else the
// groups with as many ranks as the communicator, which must all be the same ranks (tp = dp = 8
// are two groups of 8 that a size cannot tell apart: such a collective is not matched).
std::optional<Group> group_of(const Lowered& lw, const KernelShape& s) {
  constexpr Group kOrder[] = {Group::kTp, Group::kDpCp, Group::kDp,
                              Group::kCp, Group::kEp,   Group::kPp};
  const RankLayout& layout = lw.lowered.layout;
  if (!s.group_ranks.empty()) {
    std::vector<int> want = s.group_ranks;
    std::sort(want.begin(), want.end());
    if (want.front() < 0 || want.back() >= layout.world()) return std::nullopt;
    for (Group g : kOrder) {
      std::vector<int> have = layout.group(g, want.front());
      std::sort(have.begin(), have.end());
      if (have == want) return g;
    }
    return std::nullopt;
  }
  std::optional<Group> found;
  std::vector<int> found_ranks;
  for (Group g : kOrder) {
    std::vector<int> have = layout.group(g, lw.reps[0]);
    if (static_cast<int>(have.size()) != s.group_size) continue;
    std::sort(have.begin(), have.end());
    if (!found) {
      found = g;
      found_ranks = have;
    } else if (have != found_ranks) {
      return std::nullopt;  // two groups of that size: the size alone cannot tell which
    }
  }
  return found;
}

// The op an imported kernel stands for, or nullopt when it cannot be priced (calibrate.h).
// `tf32`: set when the op is a GEMM of tf32 math under an fp32 plan (priced in tf32); `why`: the
// reason it cannot be priced, when it cannot.
std::optional<Op> imported_op(const Lowered& lw, const TraceEvent& e, const KernelShape& s,
                              bool& tf32, std::string& why) {
  auto skip = [&why](std::string reason) {
    why = std::move(reason);
    return std::optional<Op>();
  };
  const Plan& plan = lw.lowered.plan;
  tf32 = false;
  if (e.kind == "linear" || e.kind == "attention") {  // math in the kernel's dtype
    tf32 = s.dtype == "tf32" && plan.precision == Dtype::kFp32;
    // A kernel without a shape has no dtype either (both come from its op's "Input Dims" and
    // "Input type"): it says it has no shape (HTA's df_index_resolver trace, recorded without
    // record_shapes, was 3,535 GEMMs of "no dtype").
    const bool shaped = e.kind == "linear" ? s.m > 0 : s.seq_q > 0;
    if (!shaped) return skip("no shape or size");
    if (s.dtype.empty()) return skip("no dtype");
    if (s.dtype != dtype_name(plan.precision) && !tf32)
      return skip("another dtype than the plan's");
  }
  Op op;
  op.tags.layer = 0;
  op.tags.phase = Phase::kForward;
  op.name = e.kind;
  if (e.kind == "linear") {
    if (s.m <= 0) return skip("no shape or size");
    op.kind = OpKind::kLinear;
    op.m = s.m, op.n = s.n, op.k = s.k, op.batch = s.batch;
    op.flops = e.flops;
    return op;
  }
  if (e.kind == "attention") {
    if (s.seq_q <= 0 || s.heads <= 0 || s.kv_heads <= 0) return skip("no shape or size");
    op.kind = OpKind::kAttention;
    // The pass and the mask as the import read them (kineto_import.h); an unstated mask is the
    // plan's: parasol lowers every attention as causal (core/layer_shapes.cc).
    if (s.backward) op.tags.phase = Phase::kBackward;
    op.attn.batch = s.attn_batch, op.attn.seq_q = s.seq_q, op.attn.seq_kv = s.seq_kv;
    op.attn.heads = s.heads, op.attn.kv_heads = s.kv_heads, op.attn.head_dim = s.head_dim;
    op.attn.causal = s.causal != 0;
    op.attn.flash = true;
    op.flops = attention_kernel_flops(s, op.attn.causal);
    return op;
  }
  const std::map<std::string, OpKind> memory_bound = {{"norm", OpKind::kNorm},
                                                      {"activation", OpKind::kActivation},
                                                      {"elementwise", OpKind::kResidualAdd},
                                                      {"adamw", OpKind::kAdamW}};
  if (auto it = memory_bound.find(e.kind); it != memory_bound.end()) {
    if (e.bytes <= 0) return skip("no shape or size");
    op.kind = it->second;
    op.bytes = e.bytes;
    return op;
  }
  const std::map<std::string, OpKind> collectives = {{"all-reduce", OpKind::kAllReduce},
                                                     {"all-gather", OpKind::kAllGather},
                                                     {"reduce-scatter", OpKind::kReduceScatter},
                                                     {"all-to-all", OpKind::kAllToAll},
                                                     {"broadcast", OpKind::kBroadcast}};
  if (auto it = collectives.find(e.kind); it != collectives.end()) {
    if (e.bytes <= 0 || s.group_size < 2) return skip("no shape or size");
    const std::optional<Group> g = group_of(lw, s);
    if (!g) return skip("a communicator no group of the plan is");
    op.kind = it->second;
    op.bytes = e.bytes;
    op.group = *g;
    op.stream = 1;
    return op;
  }
  return skip(e.kind == "unclassified" ? "unclassified" : "of a kind not fitted (" + e.kind + ")");
}

// The samples of imported run `ri` (calibrate_imported); their ops are appended to `ops`.
// `ri_tf32`: the index of the run's copy lowered in tf32 (its fp32 plan's tf32 GEMMs), or -1.
void collect_imported(const Lowered& lw, const ImportedTrace& imp, int ri, int ri_tf32, int steps,
                      std::deque<Op>& ops, std::vector<Sample>& samples, int& skipped,
                      std::map<std::string, int>& skipped_why) {
  // What a price depends on: kind, pass, group and shape.
  using Key = std::tuple<int, int, int, int64_t, int64_t, int64_t, int64_t, double, double, int64_t,
                         int64_t, int64_t, int64_t, int64_t, int64_t>;
  std::map<Key, std::vector<double>> groups;
  std::map<Key, Op> first;
  std::map<Key, bool> in_tf32;
  for (size_t i = 0; i < imp.trace.events.size(); ++i) {
    const TraceEvent& e = imp.trace.events[i];
    bool tf32 = false;
    std::string why = "no duration";
    std::optional<Op> op =
        e.dur_s > 0 ? imported_op(lw, e, imp.shapes[i], tf32, why) : std::nullopt;
    if (!op || (tf32 && ri_tf32 < 0)) {
      ++skipped;
      ++skipped_why[why];
      continue;
    }
    const Key key{static_cast<int>(op->kind) + (tf32 ? 1000 : 0),
                  static_cast<int>(op->tags.phase),
                  static_cast<int>(op->group),
                  op->m,
                  op->n,
                  op->k,
                  op->batch,
                  op->bytes,
                  op->flops,
                  op->attn.batch,
                  op->attn.seq_q,
                  op->attn.seq_kv,
                  op->attn.heads,
                  op->attn.kv_heads,
                  op->attn.head_dim};
    first.emplace(key, *op);
    in_tf32[key] = tf32;
    groups[key].push_back(e.dur_s);
  }
  for (const auto& [key, durations] : groups) {
    ops.push_back(first.at(key));
    Sample s{in_tf32.at(key) ? ri_tf32 : ri, 0, &ops.back(), false, median(durations), 1, 1};
    s.count = std::max(1, static_cast<int>(durations.size()) / std::max(1, steps));
    samples.push_back(s);
  }
}

}  // namespace

Calibration calibrate_imported(const std::vector<ImportedRun>& runs, const cost::Profile& base) {
  std::vector<MeasuredRun> mruns;
  for (const ImportedRun& r : runs)
    mruns.push_back({r.name, r.model, r.cluster, r.plan, r.imported.trace});
  std::vector<Lowered> lws = lower_runs(mruns, base);
  // An fp32 run's GEMMs that ran on tensor cores (tf32 math) are priced by a copy of it in tf32.
  std::vector<int> tf32_copy(lws.size(), -1);
  for (size_t i = 0; i < runs.size(); ++i) {
    if (lws[i].lowered.plan.precision != Dtype::kFp32) continue;
    tf32_copy[i] = static_cast<int>(lws.size());
    Lowered copy = lws[i];
    copy.lowered.plan.precision = Dtype::kTf32;
    lws.push_back(std::move(copy));
  }
  Calibration out;
  std::deque<Op> ops;
  std::vector<Sample> all;
  std::map<std::string, int> skipped_why;
  for (size_t i = 0; i < runs.size(); ++i) {
    std::set<int> ranks;
    for (const TraceEvent& e : runs[i].imported.trace.events) ranks.insert(e.rank);
    collect_imported(lws[i], runs[i].imported, static_cast<int>(i), tf32_copy[i],
                     std::max<int>(1, ranks.size()) * std::max(1, runs[i].imported.steps), ops, all,
                     out.skipped, skipped_why);
  }
  // Nothing to fit: say why each kernel was left out (an Nsight Systems report has no shapes).
  if (all.empty()) {
    std::string why;
    for (const auto& [reason, n] : skipped_why)
      why += (why.empty() ? "" : ", ") + std::to_string(n) + " " + reason;
    throw Error("traces", "no kernel of the traces can be priced by the plan (" +
                              (why.empty() ? std::string("no kernels") : why) +
                              "); shapes and sizes come from a PyTorch profiler trace recorded "
                              "with record_shapes=True (an Nsight Systems report has none)");
  }
  fit(mruns, lws, all, base, out);
  return out;
}

Calibration calibrate(const std::vector<MeasuredRun>& runs, const cost::Profile& base) {
  const std::vector<Lowered> lws = lower_runs(runs, base);
  Calibration out;
  std::vector<Sample> all;
  for (size_t i = 0; i < lws.size(); ++i)
    collect(lws[i], static_cast<int>(i), base, all, out.skipped);
  fit(runs, lws, all, base, out);
  return out;
}

bool Calibration::replay_worse() const {
  return std::fabs(replay_fitted_s - replay_measured_s) >
         std::fabs(replay_base_s - replay_measured_s);
}

Json calibration_to_json(const Calibration& c) {
  Json params = Json::array();
  for (const FittedParam& p : c.params)
    params.push_back({{"name", p.name},
                      {"base", p.base},
                      {"fitted", p.fitted},
                      {"lower", p.lower},
                      {"upper", p.upper},
                      {"samples", p.samples},
                      {"at_bound", p.at_bound}});
  return {{"samples", c.samples},
          {"skipped", c.skipped},
          {"iterations", c.iterations},
          {"rms_log_error_before", c.rms_log_error_before},
          {"rms_log_error_after", c.rms_log_error_after},
          {"replay_measured_s", c.replay_measured_s},
          {"replay_base_s", c.replay_base_s},
          {"replay_fitted_s", c.replay_fitted_s},
          {"replay_worse", c.replay_worse()},
          {"params", params}};
}

}  // namespace parasol::traces
