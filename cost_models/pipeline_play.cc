// The step's pipeline played at the level of units (cost_models/pipeline_play.h).
#include "cost_models/pipeline_play.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "core/error.h"

namespace parasol::cost {

namespace {
// Plays of at most this many pipeline depths of micro-batches are played whole; beyond them the
// steady state's period is extended (measured in a play of kMeasuredDepths depths for 1F1B,
// kPlayedDepths interleaved, or the difference of plays of kPlayedDepths and one depth less).
constexpr int kPlayedDepths = 4;
constexpr int kMeasuredDepths = 3;
// Plays kept for reuse (direct-mapped by their key's hash; bounds the search's memory).
constexpr size_t kPlays = size_t{1} << 12;

uint64_t mix(uint64_t h, uint64_t v) {
  h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
  return h;
}

// The forward units a stage's period spans: one micro-batch's under 1F1B, a group of pp
// micro-batches through every chunk interleaved (Megatron's order repeats per group).
int period_units(const Plan& p) {
  return p.schedule == parasol::Schedule::kInterleaved ? p.pp * p.vpp : 1;
}
}  // namespace

const PipelinePlayer::Schedule& PipelinePlayer::schedule(const Plan& p, int M, int period) {
  const std::pair<uint64_t, int> key{
      ((((static_cast<uint64_t>(p.schedule) * 4096 + p.pp) * 4096 + p.chunks()) *
        (uint64_t{1} << 32)) +
       static_cast<uint64_t>(M)) ^
          (period > 0 ? uint64_t{1} << 63 : 0),
      p.pipeline_flushes};
  auto it = schedules_.find(key);
  if (it != schedules_.end()) return it->second;
  Schedule sch;
  const int chunks = p.chunks(), pp = p.pp;
  // A send's entry: its sender's virtual stage, direction and micro-batch (the lowering's tag).
  auto send_of = [&](int v, bool backward, int mb) {
    return (v * 2 + (backward ? 1 : 0)) * M + mb;
  };
  sch.sends = pp * chunks * 2 * M;
  std::vector<std::vector<Event>> stages(pp);
  bool marked = period > 0;
  for (int s = 0; s < pp; ++s) {
    const std::vector<std::vector<PipelineUnit>> steps = pipeline_steps(p, s, M);
    std::vector<Event>& ev = stages[s];
    ev.reserve(4 * steps.size() + 5);
    // The marks: after the forward units k, k - period and k - 2 period, k the last forward
    // before the step's first reduction (a backward of the last micro-batch), all in the steady
    // state (past the warm-up).
    int mark_at = -1;
    if (period > 0) {
      const int total = M * chunks, warm = pipeline_warmup_units(p, s, M);
      int last = total - 1;
      if (p.schedule == parasol::Schedule::kInterleaved)
        last = std::min(last, warm + total - pp * chunks + pp - 1);
      mark_at = last - 2 * period;
      if (mark_at < warm) marked = false;
    }
    int forwards = 0;
    const int16_t stage = static_cast<int16_t>(s);
    // The unit before, while no exchange has come since (its event, chunk and micro-batch).
    int paired_with = -1;
    PipelineUnit before{true, -1, -1};
    auto receives = [&](const std::vector<PipelineUnit>& step) {
      for (size_t j = 0; j < step.size(); ++j) {
        const PipelineUnit& u = step[j];
        if (!receives_input(p, s, u)) continue;
        const int v = virtual_stage(p, s, u);
        ev.push_back({Event::kRecv, u.forward, static_cast<int8_t>(j), false, false, stage,
                      send_of(u.forward ? v - 1 : v + 1, !u.forward, u.mb)});
      }
    };
    receives(steps.front());
    for (size_t i = 0; i < steps.size(); ++i) {
      const std::vector<PipelineUnit>& step = steps[i];
      PARASOL_CHECK(step.size() <= 2, "a pipeline step of " + std::to_string(step.size()));
      for (size_t j = 0; j < step.size(); ++j) {
        const PipelineUnit& u = step[j];
        // Paired: a forward and a backward back to back, not one micro-batch's chunk (the
        // lowering's combined 1F1B), the one before not already paired.
        const bool pairs = paired_with >= 0 && before.forward != u.forward &&
                           (before.chunk != u.chunk || before.mb != u.mb);
        if (pairs) ev[paired_with].alone = false;
        paired_with = pairs ? -1 : static_cast<int>(ev.size());
        before = u;
        ev.push_back({Event::kUnit, u.forward,
                      static_cast<int8_t>(receives_input(p, s, u) ? static_cast<int>(j) : -1),
                      u.forward ? u.mb == 0 : u.mb == M - 1, !pairs, stage, s * chunks + u.chunk});
        if (!u.forward) continue;
        const int k = forwards++;
        if (mark_at >= 0 && k >= mark_at && (k - mark_at) % period == 0 &&
            k <= mark_at + 2 * period)
          ev.push_back(
              {Event::kMark, true, -1, false, false, stage, 3 * s + 2 - (k - mark_at) / period});
      }
      for (const PipelineUnit& u : step)
        if (sends_output(p, s, u))
          ev.push_back({Event::kSend, u.forward, -1, false, false, stage,
                        send_of(virtual_stage(p, s, u), !u.forward, u.mb)});
      if (i + 1 < steps.size()) receives(steps[i + 1]);
      if (ev.back().kind != Event::kUnit && ev.back().kind != Event::kMark) paired_with = -1;
    }
  }
  if (!marked)
    for (std::vector<Event>& ev : stages)
      ev.erase(std::remove_if(ev.begin(), ev.end(),
                              [](const Event& e) { return e.kind == Event::kMark; }),
               ev.end());
  sch.marks = marked ? 3 * pp : 0;
  // One order for every play: the round robin over the stages, each run until a receive waits
  // for a send not yet in the order.
  std::vector<char> sent(sch.sends, 0);
  std::vector<size_t> cursor(pp, 0);
  size_t left = 0;
  for (const std::vector<Event>& ev : stages) left += ev.size();
  sch.events.reserve(left);
  while (left > 0) {
    size_t progressed = 0;
    for (int s = 0; s < pp; ++s) {
      const std::vector<Event>& ev = stages[s];
      for (size_t& i = cursor[s]; i < ev.size(); ++i, ++progressed) {
        const Event& e = ev[i];
        if (e.kind == Event::kRecv && !sent[e.index]) break;
        if (e.kind == Event::kSend) sent[e.index] = 1;
        sch.events.push_back(e);
      }
    }
    PARASOL_CHECK(progressed > 0, "the pipeline play is stuck: a receive without its send");
    left -= progressed;
  }
  return schedules_.emplace(key, std::move(sch)).first->second;
}

void PipelinePlayer::play_events(const Plan& p, const Schedule& sch, const PipelineUnitTimes& t,
                                 std::vector<PipelineStageEnd>& stages) {
  const int pp = p.pp;
  const size_t units = static_cast<size_t>(pp) * p.chunks();
  PARASOL_CHECK(t.forward.size() == units && t.backward.size() == units,
                "unit times for " + std::to_string(units) + " units");
  PARASOL_CHECK((t.gather.empty() || t.gather.size() == units) &&
                    (t.reduce.empty() || t.reduce.size() == units) &&
                    (t.forward_compute.empty() || t.forward_compute.size() == units) &&
                    (t.backward_compute.empty() || t.backward_compute.size() == units) &&
                    (t.forward_alone.empty() || t.forward_alone.size() == units) &&
                    (t.backward_alone.empty() || t.backward_alone.size() == units),
                "data-parallel traffic and compute for " + std::to_string(units) + " units");
  // Every send end is written before it is read (the events' order): no clearing.
  if (send_end_.size() < static_cast<size_t>(sch.sends)) send_end_.resize(sch.sends);
  if (marks_.size() < static_cast<size_t>(sch.marks)) marks_.resize(sch.marks);
  compute_free_.assign(pp, 0.0);
  stream_free_.assign(pp, 0.0);
  dp_free_.assign(pp, 0.0);
  slowed_.assign(pp, 0.0);
  waited_.assign(pp, 0.0);
  received_.assign(2 * static_cast<size_t>(pp), 0.0);
  double* const send_end = send_end_.data();
  double* const compute_free = compute_free_.data();
  double* const stream_free = stream_free_.data();
  double* const dp_free = dp_free_.data();
  double* const received = received_.data();
  const double transfer = t.transfer;
  const double s_dp = std::clamp(t.dp_slowdown, 0.0, 0.99);
  const double* const forward = t.forward.data();
  const double* const backward = t.backward.data();
  const double* const forward_alone = t.forward_alone.empty() ? forward : t.forward_alone.data();
  const double* const backward_alone =
      t.backward_alone.empty() ? backward : t.backward_alone.data();
  // The seconds traffic slows: the compute's, or the whole unit's.
  const double* const forward_compute =
      t.forward_compute.empty() ? forward : t.forward_compute.data();
  const double* const backward_compute =
      t.backward_compute.empty() ? backward : t.backward_compute.data();
  const PipelineUnitTimes::Queued* const gather = t.gather.empty() ? nullptr : t.gather.data();
  const PipelineUnitTimes::Queued* const reduce = t.reduce.empty() ? nullptr : t.reduce.data();
  for (const Event& e : sch.events) {
    const int s = e.stage;
    double &compute = compute_free[s], &stream = stream_free[s];
    switch (e.kind) {
      case Event::kRecv:
        stream = std::max(stream, send_end[e.index]);
        received[2 * s + e.slot] = stream;
        break;
      case Event::kSend:
        stream = std::max(stream, compute) + transfer;
        send_end[e.index] = stream;
        break;
      case Event::kMark:
        marks_[e.index] = compute;
        break;
      case Event::kUnit: {
        double& dp = dp_free[s];
        double start = e.slot >= 0 ? std::max(compute, received[2 * s + e.slot]) : compute;
        double run = e.alone ? (e.forward ? forward_alone : backward_alone)[e.index]
                             : (e.forward ? forward : backward)[e.index];
        if (!e.edge || (e.forward ? gather : reduce) == nullptr) {
          // No traffic of its own: compute beside what the stream still runs is slowed (below).
          const double busy = dp - start;
          if (s_dp > 0 && busy > 0) {
            const double window = (e.forward ? forward_compute : backward_compute)[e.index];
            const double slowed = s_dp * std::min(busy, window / (1 - s_dp));
            run += slowed;
            slowed_[s] += slowed;
          }
          compute = start + run;
          break;
        }
        const double window = (e.forward ? forward_compute : backward_compute)[e.index];
        const PipelineUnitTimes::Queued& q = (e.forward ? gather : reduce)[e.index];
        // The data-parallel stream: the earlier traffic, then this unit's. Gathers: the ones
        // issued ahead from when the stream is free, the compute from the first's end, the
        // rest beside it; reductions beside the compute, the last as it ends.
        double own = 0;              // seconds of traffic queued from the compute's start
        const double ready = start;  // when the unit could start but for its gathers
        if (q.comm > 0 && e.forward) {
          const double ahead = std::min(q.ahead, q.comm);
          start = std::max(start, dp + std::min(q.edge, ahead));
          dp += ahead;
          if (q.edge > ahead) {  // the rest of the first issued at the unit's start
            dp = std::max(dp, start) + (q.edge - ahead);
            start = dp;
          }
          own = q.comm - std::max(ahead, q.edge);
        } else if (q.comm > 0) {
          own = q.comm - q.edge;
        }
        // Compute beside the stream's traffic (busy from the compute's start for `busy`
        // seconds) runs at 1 - s_dp of its rate: it loses s_dp of the overlap, at most its
        // own compute's seconds stretched (compute_overlap.h's rule, played).
        const double busy = std::max(0.0, dp - start) + own;
        const double slowed =
            s_dp > 0 && busy > 0 ? s_dp * std::min(busy, window / (1 - s_dp)) : 0.0;
        run += slowed;
        slowed_[s] += slowed;
        compute = start + run;
        if (q.comm > 0 && e.forward) {
          dp = std::max(dp, start) + own;
          // The last layer waits for its gather.
          waited_[s] += start - ready + std::max(0.0, dp - compute);
          compute = std::max(compute, dp);
        } else if (q.comm > 0) {
          dp = std::max(std::max(dp, start) + own, compute) + q.edge;
        }
        break;
      }
    }
  }
  stages.resize(pp);
  for (int s = 0; s < pp; ++s) {
    const double units_end = std::max(compute_free[s], stream_free[s]);
    const double end = std::max(units_end, dp_free[s]);
    stages[s] = {end, end - units_end + waited_[s], slowed_[s]};
  }
}

void PipelinePlayer::play_all(const Plan& p, int M, const PipelineUnitTimes& t,
                              std::vector<PipelineStageEnd>& stages) {
  play_events(p, schedule(p, M, 0), t, stages);
}

void PipelinePlayer::play_all(const Plan& p, int M, const PipelineUnitTimes& t,
                              std::vector<double>& stage_end) {
  play_all(p, M, t, ends_);
  stage_end.resize(ends_.size());
  for (size_t s = 0; s < ends_.size(); ++s) stage_end[s] = ends_[s].end;
}

void PipelinePlayer::play(const Plan& p, const PipelineUnitTimes& t,
                          std::vector<double>& stage_end) {
  play(p, t, ends_);
  stage_end.resize(ends_.size());
  for (size_t s = 0; s < ends_.size(); ++s) stage_end[s] = ends_[s].end;
}

void PipelinePlayer::play(const Plan& p, const PipelineUnitTimes& t,
                          std::vector<PipelineStageEnd>& stages) {
  const int M = p.micro_batches();
  const int depth = p.pp;  // a multiple of the interleaved schedule's groups of pp micro-batches
  const int played = kPlayedDepths * depth;
  // The key: the shape, then the times.
  key_.clear();
  key_.push_back(static_cast<double>(p.schedule));
  key_.push_back(p.pp);
  key_.push_back(p.chunks());
  key_.push_back(M);
  key_.push_back(p.pipeline_flushes);
  key_.push_back(t.transfer);
  key_.push_back(t.dp_slowdown);
  for (const std::vector<double>* v : {&t.forward, &t.backward, &t.forward_compute,
                                       &t.backward_compute, &t.forward_alone, &t.backward_alone}) {
    key_.push_back(static_cast<double>(v->size()));
    key_.insert(key_.end(), v->begin(), v->end());
  }
  for (const std::vector<PipelineUnitTimes::Queued>* v : {&t.gather, &t.reduce}) {
    key_.push_back(static_cast<double>(v->size()));
    for (const PipelineUnitTimes::Queued& q : *v) {
      key_.push_back(q.comm);
      key_.push_back(q.edge);
      key_.push_back(q.ahead);
    }
  }
  uint64_t h = 0;
  for (double x : key_) {
    uint64_t bits;
    std::memcpy(&bits, &x, sizeof bits);
    h = mix(h, bits);
  }
  if (plays_.empty()) plays_.resize(kPlays);
  Played& slot = plays_[h & (kPlays - 1)];
  if (slot.used && slot.key == key_) {
    stages = slot.stages;
    return;
  }
  // GPipe's forwards and backwards each run as a pipeline of their own, uncoupled: a stage's end
  // is the latest of lines in the micro-batches, and which one leads can change far beyond a few
  // depths (an early gather's delay against a slightly slower stage): played whole.
  // Several flushes (Plan::pipeline_flushes): each its own fill and drain, played whole.
  if (M <= played + depth || p.schedule == parasol::Schedule::kGpipe || p.pipeline_flushes > 1) {
    play_all(p, M, t, stages);
  } else {
    // The steady state repeats every period (a micro-batch under 1F1B, a group of pp
    // micro-batches interleaved): each stage's end grows by the same seconds per period beyond
    // the first few depths (the step's data-parallel traffic is at its edges: the same in every
    // play). Measured in one play where each stage's last two periods before the step's
    // reductions agree; else the difference of two plays a depth apart.
    const int period = period_units(p);
    const int period_mbs = period / p.chunks();
    const int measured =
        (p.schedule == parasol::Schedule::kInterleaved ? kPlayedDepths : kMeasuredDepths) * depth;
    const Schedule& sch = schedule(p, measured, period);
    bool periodic = sch.marks > 0;
    if (periodic) {
      play_events(p, sch, t, stages);
      for (int s = 0; s < p.pp && periodic; ++s) {
        const double* m = &marks_[3 * static_cast<size_t>(s)];
        const double d1 = m[0] - m[1], d2 = m[1] - m[2];
        periodic = std::abs(d1 - d2) <= 1e-12 * (std::abs(d1) + std::abs(m[0]));
      }
    }
    if (periodic) {
      ++measured_;
      const double periods = static_cast<double>(M - measured) / period_mbs;
      for (int s = 0; s < p.pp; ++s)
        stages[s].end += periods * (marks_[3 * static_cast<size_t>(s)] - marks_[3 * s + 1]);
    } else {
      ++two_plays_;
      play_all(p, played - depth, t, other_ends_);
      play_all(p, played, t, stages);
      const double depths = static_cast<double>(M - played) / depth;
      for (int s = 0; s < p.pp; ++s) stages[s].end += depths * (stages[s].end - other_ends_[s].end);
    }
  }
  slot.used = true;
  slot.key = key_;
  slot.stages = stages;
}

}  // namespace parasol::cost
