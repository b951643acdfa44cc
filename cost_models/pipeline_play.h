// The step's pipeline played at the level of units (stage x micro-batch x virtual stage): each
// stage runs its units in the schedule's order (core/pipeline_schedule.h, the order the lowering
// emits), each unit for its priced seconds, and exchanges activations with its neighbours as the
// lowering's Program does (core/lower_schedule.cc's exchange): after each step the step's outputs
// are sent and then the next step's inputs received, in that order, on the stage's one pipeline
// stream; a send leaves once the step's units are done and holds the stream for `transfer`
// seconds; a receive holds the stream until its send has arrived, and a unit starts once its
// input is received. Meant to replace the closed form's bubble arithmetic (issue 46's first item);
// not yet read by cost_models/estimate.cc: wired there, it agrees with sim/engine's bubble, but
// the grid's remaining gaps (the host's lead, the data-parallel reductions that slow each
// chunk's last backward in the cool-down) stop being masked, and the search runs 3x slower.
#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "core/pipeline_schedule.h"
#include "core/plan.h"

namespace parasol::cost {

// Seconds of a stage's units: forward[s * chunks + c] and backward[s * chunks + c] are the
// forward and backward of chunk c on stage s for one micro-batch (every micro-batch alike).
struct PipelineUnitTimes {
  std::vector<double> forward, backward;
  double transfer = 0;  // seconds of one send of activations or gradients to a neighbour
};

// Plays a step's pipeline. Keeps each schedule's event list (per schedule, pp, vpp and
// micro-batches) and the plays of recent unit times: the search plays millions of plans.
// Not thread-safe (one per Estimator).
class PipelinePlayer {
 public:
  // Each stage's end (the end of its last unit or its last send) from the step's start, into
  // `stage_end` (pp entries). Beyond a few pipeline depths of micro-batches, plays that many and
  // extends the steady state's period to the plan's micro-batches (the play is periodic there;
  // tests/cost_models/pipeline_play_test.cc holds the extension to the whole play).
  // REQUIRES: times hold pp x chunks entries each, all >= 0.
  void play(const Plan& p, const PipelineUnitTimes& times, std::vector<double>& stage_end);
  // The whole play of `micro_batches` micro-batches, without the extension.
  void play_all(const Plan& p, int micro_batches, const PipelineUnitTimes& times,
                std::vector<double>& stage_end);

 private:
  // A stage's events in order: a unit on its compute, a send or a receive on its pipeline
  // stream. `index`: the unit's entry in the times (a unit), the send's entry in the table of
  // send ends (a send, or the send a receive waits for); `slot`: the receive a unit's input
  // comes from, or the slot a receive fills (0 or 1: a step has at most two units).
  struct Event {
    enum Kind : int8_t { kUnit, kSend, kRecv } kind;
    bool forward;
    int8_t slot;  // -1: a unit with no input from a neighbour
    int32_t index;
  };
  struct Schedule {
    std::vector<std::vector<Event>> stages;
    int sends = 0;  // entries of the table of send ends
  };
  const Schedule& schedule(const Plan& p, int micro_batches);

  std::unordered_map<uint64_t, Schedule> schedules_;
  // Recent plays by a hash of their key (the plan's shape and the unit times, compared whole).
  struct Played {
    std::vector<double> key, stage_end;
  };
  std::unordered_map<uint64_t, Played> plays_;
  std::vector<double> key_;
  std::vector<double> send_end_, other_;
  std::vector<size_t> cursor_;
  std::vector<double> compute_free_, stream_free_, received_;
};

}  // namespace parasol::cost
