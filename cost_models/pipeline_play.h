// The step's pipeline played at the level of units (stage x micro-batch x virtual stage): each
// stage runs its units in the schedule's order (core/pipeline_schedule.h, the order the lowering
// emits), each unit for its priced seconds, and exchanges activations with its neighbours as the
// lowering's Program does (core/lower_schedule.cc's exchange): after each step the step's outputs
// are sent and then the next step's inputs received, in that order, on the stage's one pipeline
// stream; a send leaves once the step's units are done and holds the stream for `transfer`
// seconds; a receive holds the stream until its send has arrived, and a unit starts once its
// input is received. The step's data-parallel traffic queues on the stage's data-parallel stream
// beside the units the lowering emits it in (core/lower_buckets.cc: the gathers of the step's
// parameters beside each chunk's first forward, the gradient reductions beside its last
// backward), and compute beside it runs slower by cost_models/compute_overlap.h's rule, played.
// Meant to replace the closed form's bubble arithmetic (issue 46's first item): wired into
// cost_models/estimate.cc by docs/wip/issue46-played-step.patch, where it agrees with sim/engine
// within 2% but still leaves the 1,024-GPU search about 2x slower than today's.
#pragma once

#include <cstdint>
#include <map>
#include <utility>
#include <vector>

#include "core/pipeline_schedule.h"
#include "core/plan.h"

namespace parasol::cost {

// Seconds of a stage's units: forward[s * chunks + c] and backward[s * chunks + c] are the
// forward and backward of chunk c on stage s for one micro-batch (every micro-batch alike).
struct PipelineUnitTimes {
  std::vector<double> forward, backward;
  double transfer = 0;  // seconds of one send of activations or gradients to a neighbour
  // The data-parallel traffic of the step the lowering emits beside a chunk's units, on the
  // stage's data-parallel stream (first in, first out; empty: none): `comm` seconds.
  // `gather[i]`: beside the first forward of chunk i, the parameters gathered for the step: the
  // first `ahead` seconds of them wait for nothing but the stream (issued ahead of the unit),
  // the compute waits for the first `edge` of them to start (those not issued ahead, issued at
  // its start) and for all of them to end, and the rest is issued as the compute goes. `reduce[i]`:
  // beside the last backward, the step's gradient reductions, issued as its compute goes but the
  // last `edge` seconds of them, issued as it ends; nothing waits for them but the stage's end.
  struct Queued {
    double comm = 0, edge = 0, ahead = 0;
  };
  std::vector<Queued> gather, reduce;
  // The compute seconds of each unit that data-parallel traffic beside it slows (forward and
  // backward, indexed as above; empty: the whole unit), and the fraction of its rate compute
  // loses while it runs (cost_models/compute_overlap.h's compute_slowdown).
  std::vector<double> forward_compute, backward_compute;
  double dp_slowdown = 0;
  // Seconds of a unit that runs alone where the plan pairs a forward with a backward
  // (Megatron's combined 1F1B under Plan::ep_comm_overlap: the warm-up's and cool-down's units,
  // whose expert all-to-alls no other micro-batch's compute hides), indexed as above (empty: as
  // paired).
  std::vector<double> forward_alone, backward_alone;
};

// A stage's end in a play: `end` (the last of its units, sends and data-parallel traffic), and of
// it `dp_exposed`, what the data-parallel stream adds after the units and sends and what its
// units waited for gathers, and `dp_slowed`, what the traffic beside the units added to them
// (compute_slowdown).
struct PipelineStageEnd {
  double end = 0, dp_exposed = 0, dp_slowed = 0;
};

// Plays a step's pipeline. Keeps each schedule's events, compiled once per schedule, pp, vpp and
// micro-batches into one order every play follows, and the plays of recent unit times: the search
// plays millions of plans, and a play allocates nothing once its buffers have grown.
// Not thread-safe (one per Estimator).
class PipelinePlayer {
 public:
  // Each stage's end (the end of its last unit or its last send) from the step's start, into
  // `stage_end` (pp entries). Beyond a few pipeline depths of micro-batches, 1F1B and interleaved
  // plays play a few depths and extend the steady state's period, measured in the play, to the
  // plan's micro-batches (the play is periodic there; where the measure finds it not yet
  // periodic, the period is the difference of two plays a depth apart;
  // tests/cost_models/pipeline_play_test.cc holds the extension to the whole play); GPipe's are
  // played whole.
  // REQUIRES: times hold pp x chunks entries each, all >= 0.
  void play(const Plan& p, const PipelineUnitTimes& times, std::vector<double>& stage_end);
  void play(const Plan& p, const PipelineUnitTimes& times, std::vector<PipelineStageEnd>& stages);
  // The whole play of `micro_batches` micro-batches, without the extension.
  void play_all(const Plan& p, int micro_batches, const PipelineUnitTimes& times,
                std::vector<double>& stage_end);
  void play_all(const Plan& p, int micro_batches, const PipelineUnitTimes& times,
                std::vector<PipelineStageEnd>& stages);
  // Plays that measured the steady state's period and those that fell back to two plays (for
  // tests and benchmarks).
  int64_t measured_plays() const { return measured_; }
  int64_t two_plays() const { return two_plays_; }

 private:
  // One event of one stage: a unit on its compute, a send or a receive on its pipeline stream, or
  // a mark (the stage's compute at that point recorded for the period). `index`: the unit's entry
  // in the times (a unit), the send's entry in the table of send ends (a send, or the send a
  // receive waits for), the mark's entry; `slot`: the receive a unit's input comes from, or the
  // slot a receive fills (0 or 1: a step has at most two units); `edge`: a unit that is its
  // chunk's first forward or last backward (the step's data-parallel traffic); `alone`: a unit
  // the lowering does not pair with the unit before or after it (core/lower_schedule.cc's
  // run_steps: a forward and a backward back to back, of different micro-batches or chunks).
  struct Event {
    enum Kind : int8_t { kUnit, kSend, kRecv, kMark } kind;
    bool forward;
    int8_t slot;  // -1: a unit with no input from a neighbour
    bool edge;
    bool alone;
    int16_t stage;
    int32_t index;
  };
  // Every stage's events in one order that plays each stage's in its own order and each receive
  // after its send, whatever the times (the round robin over the stages, each run until a
  // receive waits for a send not yet played): a play is one pass.
  struct Schedule {
    std::vector<Event> events;
    int sends = 0;  // entries of the table of send ends
    int marks = 0;  // 3 per stage when the play measures the period, else 0
  };
  // `period`: forward units between marks (0: none), each stage's three marks after its forward
  // units k, k - period and k - 2 period, k the last before the step's reductions begin.
  const Schedule& schedule(const Plan& p, int micro_batches, int period);
  void play_events(const Plan& p, const Schedule& sch, const PipelineUnitTimes& times,
                   std::vector<PipelineStageEnd>& stages);

  std::map<std::pair<uint64_t, int>, Schedule> schedules_;  // (shape, pipeline flushes)
  // Recent plays, direct-mapped by a hash of their key (the plan's shape and the unit times,
  // compared whole); a slot's buffers are reused.
  struct Played {
    bool used = false;
    std::vector<double> key;
    std::vector<PipelineStageEnd> stages;
  };
  std::vector<Played> plays_;
  std::vector<PipelineStageEnd> ends_, other_ends_;
  std::vector<double> key_;
  std::vector<double> send_end_, marks_;
  std::vector<double> compute_free_, stream_free_, dp_free_, slowed_, waited_, received_;
  int64_t measured_ = 0, two_plays_ = 0;
};

}  // namespace parasol::cost
