// The step's pipeline played at the level of units (cost_models/pipeline_play.h).
#include "cost_models/pipeline_play.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "core/error.h"

namespace parasol::cost {

namespace {
// Plays of at most this many pipeline depths of micro-batches; more are extended by the steady
// state's period (measured over one pipeline depth).
constexpr int kPlayedDepths = 4;
// Plays kept for reuse before the cache starts over (bounds the search's memory).
constexpr size_t kMaxPlays = 1 << 14;

uint64_t mix(uint64_t h, uint64_t v) {
  h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
  return h;
}
}  // namespace

const PipelinePlayer::Schedule& PipelinePlayer::schedule(const Plan& p, int M) {
  const uint64_t key = (((static_cast<uint64_t>(p.schedule) * 4096 + p.pp) * 4096 + p.chunks()) *
                        (uint64_t{1} << 32)) +
                       static_cast<uint64_t>(M);
  auto it = schedules_.find(key);
  if (it != schedules_.end()) return it->second;
  Schedule sch;
  const int chunks = p.chunks(), pp = p.pp;
  // A send's entry: its sender's virtual stage, direction and micro-batch (the lowering's tag).
  auto send_of = [&](int v, bool backward, int mb) {
    return (v * 2 + (backward ? 1 : 0)) * M + mb;
  };
  sch.sends = pp * chunks * 2 * M;
  sch.stages.resize(pp);
  for (int s = 0; s < pp; ++s) {
    const std::vector<std::vector<PipelineUnit>> steps = pipeline_steps(p, s, M);
    std::vector<Event>& ev = sch.stages[s];
    ev.reserve(4 * steps.size() + 2);
    auto receives = [&](const std::vector<PipelineUnit>& step) {
      for (size_t j = 0; j < step.size(); ++j) {
        const PipelineUnit& u = step[j];
        if (!receives_input(p, s, u)) continue;
        const int v = virtual_stage(p, s, u);
        ev.push_back({Event::kRecv, u.forward, static_cast<int8_t>(j),
                      send_of(u.forward ? v - 1 : v + 1, !u.forward, u.mb)});
      }
    };
    receives(steps.front());
    for (size_t i = 0; i < steps.size(); ++i) {
      const std::vector<PipelineUnit>& step = steps[i];
      PARASOL_CHECK(step.size() <= 2, "a pipeline step of " + std::to_string(step.size()));
      for (size_t j = 0; j < step.size(); ++j) {
        const PipelineUnit& u = step[j];
        ev.push_back({Event::kUnit, u.forward,
                      static_cast<int8_t>(receives_input(p, s, u) ? static_cast<int>(j) : -1),
                      s * chunks + u.chunk});
      }
      for (const PipelineUnit& u : step)
        if (sends_output(p, s, u))
          ev.push_back(
              {Event::kSend, u.forward, -1, send_of(virtual_stage(p, s, u), !u.forward, u.mb)});
      if (i + 1 < steps.size()) receives(steps[i + 1]);
    }
  }
  return schedules_.emplace(key, std::move(sch)).first->second;
}

void PipelinePlayer::play_all(const Plan& p, int M, const PipelineUnitTimes& t,
                              std::vector<double>& stage_end) {
  const int pp = p.pp;
  const size_t units = static_cast<size_t>(pp) * p.chunks();
  PARASOL_CHECK(t.forward.size() == units && t.backward.size() == units,
                "unit times for " + std::to_string(units) + " units");
  const Schedule& sch = schedule(p, M);
  send_end_.assign(sch.sends, -1.0);
  cursor_.assign(pp, 0);
  compute_free_.assign(pp, 0.0);
  stream_free_.assign(pp, 0.0);
  received_.assign(2 * static_cast<size_t>(pp), 0.0);
  size_t left = 0;
  for (const auto& ev : sch.stages) left += ev.size();
  // Round robin over the stages, each run until a receive waits for a send not yet played.
  while (left > 0) {
    size_t progressed = 0;
    for (int s = 0; s < pp; ++s) {
      const std::vector<Event>& ev = sch.stages[s];
      size_t& i = cursor_[s];
      double &compute = compute_free_[s], &stream = stream_free_[s];
      for (; i < ev.size(); ++i, ++progressed) {
        const Event& e = ev[i];
        if (e.kind == Event::kRecv) {
          const double sent = send_end_[e.index];
          if (sent < 0) break;
          stream = std::max(stream, sent);
          received_[2 * s + e.slot] = stream;
        } else if (e.kind == Event::kUnit) {
          const double start = e.slot >= 0 ? std::max(compute, received_[2 * s + e.slot]) : compute;
          compute = start + (e.forward ? t.forward[e.index] : t.backward[e.index]);
        } else {
          stream = std::max(stream, compute) + t.transfer;
          send_end_[e.index] = stream;
        }
      }
    }
    PARASOL_CHECK(progressed > 0, "the pipeline play is stuck: a receive without its send");
    left -= progressed;
  }
  stage_end.resize(pp);
  for (int s = 0; s < pp; ++s) stage_end[s] = std::max(compute_free_[s], stream_free_[s]);
}

void PipelinePlayer::play(const Plan& p, const PipelineUnitTimes& t,
                          std::vector<double>& stage_end) {
  const int M = p.micro_batches();
  const int depth = p.pp;  // a multiple of the interleaved schedule's groups of pp micro-batches
  const int played = kPlayedDepths * depth;
  // The key: the shape, then the times.
  key_.clear();
  key_.push_back(static_cast<double>(p.schedule));
  key_.push_back(p.pp);
  key_.push_back(p.chunks());
  key_.push_back(M);
  key_.push_back(t.transfer);
  key_.insert(key_.end(), t.forward.begin(), t.forward.end());
  key_.insert(key_.end(), t.backward.begin(), t.backward.end());
  uint64_t h = 0;
  for (double x : key_) {
    uint64_t bits;
    std::memcpy(&bits, &x, sizeof bits);
    h = mix(h, bits);
  }
  auto it = plays_.find(h);
  if (it != plays_.end() && it->second.key == key_) {
    stage_end = it->second.stage_end;
    return;
  }
  if (p.pp == 1 || M <= played + depth) {
    play_all(p, M, t, stage_end);
  } else {
    // The steady state repeats every pipeline depth of micro-batches: each stage's end grows by
    // the same seconds per depth beyond the first few.
    play_all(p, played - depth, t, other_);
    play_all(p, played, t, stage_end);
    const double depths = static_cast<double>(M - played) / depth;
    for (int s = 0; s < p.pp; ++s) stage_end[s] += depths * (stage_end[s] - other_[s]);
  }
  if (plays_.size() >= kMaxPlays) plays_.clear();
  Played& slot = plays_[h];
  slot.key = key_;
  slot.stage_end = stage_end;
}

}  // namespace parasol::cost
