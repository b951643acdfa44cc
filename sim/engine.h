// The discrete-event engine: plays the per-stage Programs of a lowered plan on a simulated
// cluster and predicts one training step as a timeline (a traces::Trace with "predicted"
// source), its step time and where the time went.
//
// What is modelled:
//  - Streams. Each stream of a Program runs its ops one at a time in Program order; an op starts
//    when the previous op of its stream and all its deps have finished.
//  - Symmetry. All ranks of a pipeline stage run the same Program in lock step, so one
//    representative rank per stage is played (the stage's rank whose other coordinates are
//    all 0): a plan on 16,384 GPUs plays at most pp Programs. A collective on a group inside
//    the stage starts when the representative reaches it (every member reaches it at the same
//    time). A collective on Group::kPp (the global gradient-norm all-reduce, a tied-embedding
//    all-reduce) is a rendezvous: the k-th kPp collective of every stage whose Program has one
//    starts when the last of them arrives.
//  - Prices (cost::OpPricer of cost_models/op_cost.h, which calibration fits too). Compute ops
//    run on the representative's device in plan.precision: GEMMs by
//    cost::gemm_time, the attention core (Op::attn) by cost::attention_{forward,backward}_time,
//    memory-bound ops by cost::memory_time of Op::bytes (HBM bytes read plus written), AdamW
//    likewise (or cost::optimizer_time of Op::elements parameters when it has no bytes). An
//    optimizer-step op (AdamW, cast, grad norm) whose buffers all live in host memory runs on
//    the host: AdamW at the profile's CPU-Adam rate per server shared by its GPUs, the others
//    at device rates. Collectives by the cost::GroupModel of the op's group placed on the
//    topology, with the same-kind groups of the stage running concurrently (as
//    cost::Estimator does), priced once per distinct placement (stages that repeat one
//    placement shifted by whole servers share it). Pipeline sends by the bottleneck bandwidth
//    of all ranks of the stage sending to their peers at once, plus path and software
//    latency. Offload and prefetch by the GPU's host link bandwidth times the profile's copy
//    efficiency. Each distinct op shape is priced once.
//  - Point-to-point. A send occupies its stream for the transfer (eager, buffered send); the
//    matching recv completes when both it has started and the send has finished. On Group::kPp
//    a recv matches the send of its peer stage to this stage with the same Op::tag; sends and
//    recvs of another group (the context-parallel K/V ring) match within the stage by tag (by
//    symmetry the ring neighbour sends when the representative does) and are priced as one
//    ring step of that group (bytes / GroupModel::ring_bw + ring_step_latency, as the estimate
//    does). Untagged ops (tag < 0) match by direction (backward or not) and micro-batch, in
//    issue order.
//  - Link sharing. Communication ops of one rank that overlap in time on different streams and
//    use the same link class share its bandwidth equally (processor sharing: each of n active
//    ops progresses at 1/n of its standalone rate; latencies are shared too). Classes: NVLink
//    (a group or peer inside the server), NIC (a group or peer on another server; collectives
//    that span servers are limited by the NIC), host link device->host (offload) and
//    host->device (prefetch). Recvs take no bandwidth of their own (the sender's op carries
//    the transfer); Group::kPp rendezvous collectives are not shared.
//
//  - Overlap is not free. While a collective or send of a stage runs (an NVLink or NIC class op:
//    NCCL kernels that hold SMs), that stage's device compute progresses at
//    1 - cost::compute_slowdown() of its standalone rate for the kinds running (data-parallel or
//    other: cost_models/compute_overlap.h), the rule the estimate's TimeBreakdown::overlap
//    integrates.
//    Copies (offload) use copy engines and slow nothing.
//
//  - The host (core/host_issue.h). Each stage's representative has a host thread that issues
//    the Program's ops in order, each after its host cost (cost_models/host_cost.h: launches and
//    framework dispatch, CUDA graph replays, compiled regions); an op starts no earlier than its
//    issue. A sync (OpKind::kSync) blocks the host until its deps finish, then costs its wake-up
//    (Profile::host_sync_s). The trace shows the host's issue spans on the host stream's row.
//
// Not modelled: contention between stages (each stage's representative sees only its own
// ops). Stragglers are played as a slowdown of a whole stage's compute (Simulator::simulate's
// stage_slowdown; sim/stragglers.h draws them per rank).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/cluster.h"
#include "core/lower.h"
#include "core/model.h"
#include "core/plan.h"
#include "core/program.h"
#include "cost_models/framework_memory.h"
#include "cost_models/profile.h"
#include "traces/trace.h"

namespace parasol::sim {

inline constexpr int kGroupCount = kGroupKindCount;  // values of parasol::Group

// Where one rank's step time went. Every instant of [0, step_time] is attributed to exactly one
// category, so the parts sum to the step time: compute when a compute op runs on any stream;
// else exposed communication of the groups whose ops run (split equally when several do;
// pipeline sends/recvs count under Group::kPp, a recv only while its data is in flight);
// else exposed offload when a host copy (or host-side optimizer) runs; else bubble (the rank
// waits for another stage or has finished the step).
struct SimBreakdown {
  double compute = 0;                        // seconds with a device compute op running
  std::array<double, 4> compute_by_phase{};  // of which in each Phase (forward, backward, ...)
  std::array<double, kGroupCount> exposed_comm{};  // indexed by Group
  double exposed_offload = 0;
  // Host-bound: no device op runs and the device waits for the host, which is issuing the op
  // that starts next (its deps were done before the host issued it) or waking from a sync
  // (core/host_issue.h).
  double host = 0;
  double bubble = 0;  // idle: no op of this rank runs
  double exposed_comm_total() const;
  double total() const;
};

struct SimResult {
  double step_time_s = 0;  // when the last op of any stage finishes
  SimBreakdown breakdown;  // of the critical stage (the one whose compute stream is busiest)
  int critical_stage = 0;
  std::vector<SimBreakdown> stage_breakdown;  // one per pipeline stage
  std::vector<int> stage_rank;                // the representative rank of each stage
  // Peak device bytes of a rank of each stage: the buffer liveness of its Program in issue
  // order (core/liveness.h; no allocator fragmentation or CUDA context).
  std::vector<double> peak_memory_per_stage;
  // The same peaks by buffer class (core/liveness.h's peak_by_class), and as the framework
  // measures them (cost_models/framework_memory.h: allocated, reserved, outside the allocator),
  // with the stage whose rank holds the largest device_used() and that rank.
  std::vector<std::array<double, 5>> peak_by_class_per_stage;
  std::vector<cost::FrameworkMemory> memory_per_stage;
  int peak_stage = -1;
  int peak_rank = -1;
  traces::Trace trace;        // the played ops of every representative (when recorded)
  int64_t ops_simulated = 0;  // ops played (all stages)
};

// Plays `programs` (one per pipeline stage: programs[s].stage == s, s in [0, plan.pp)) of
// `plan` for `model` on `cluster` priced with `profile`, and returns the predicted step.
// record_trace: also fill result.trace (one event per op of every representative rank; the
// only per-op allocation happens then), with the annotations of sim/trace_annotate.h: process
// names with the stage, pipeline and dependency flows, and each rank's liveness memory counter.
// REQUIRES: validate(plan, model, cluster) passed. Throws parasol::Error naming the op
// ("programs[1].ops[42]: ...") for a malformed Program: a bad stream, dep id or peer stage, a
// send or recv without its match, or ops that can never run (a dependency cycle or a collective
// that some stage never reaches).
SimResult simulate(const Model& model, const Cluster& cluster, const Plan& plan,
                   const std::vector<Program>& programs, const cost::Profile& profile,
                   bool record_trace);

// The same for a lowered plan (lowered.programs, one per stage).
SimResult simulate(const Model& model, const Cluster& cluster, const LoweredPlan& lowered,
                   const cost::Profile& profile, bool record_trace);

// Plays many plans of one model on one cluster with one profile (e.g. re-ranking the top
// candidates of a search), keeping the prices of group placements and pipeline links between
// plans: after the first plan on a cluster, simulate() costs only the ops. Not thread-safe; use
// one per thread. `model` and `cluster` must outlive it.
class Simulator {
 public:
  Simulator(const Model& model, const Cluster& cluster, cost::Profile profile);
  ~Simulator();
  // As the free functions simulate() above, for this model, cluster and profile.
  // stage_slowdown: empty, or one factor > 0 per pipeline stage that multiplies the device
  // compute time of that stage's ops (the stage runs at the pace of its slowest rank: its ranks
  // meet in collectives every step; sim/stragglers.h). Throws parasol::Error("stage_slowdown")
  // for a wrong size or a factor <= 0.
  SimResult simulate(const Plan& plan, const std::vector<Program>& programs, bool record_trace,
                     const std::vector<double>& stage_slowdown = {});
  SimResult simulate(const LoweredPlan& lowered, bool record_trace,
                     const std::vector<double>& stage_slowdown = {});
  // How each stage's reserved bytes are priced (cost_models/framework_memory.h; the default
  // replays the caching allocator).
  void set_reserved(cost::Reserved reserved) { reserved_ = reserved; }

  struct Placements;  // cached prices of placed groups and links (engine.cc)
  struct Workspace;   // per-op arrays reused from plan to plan (engine.cc)

 private:
  const Model& model_;
  const Cluster& cluster_;
  cost::Profile profile_;
  std::unique_ptr<Placements> places_;
  std::unique_ptr<Workspace> work_;
  cost::Reserved reserved_ = cost::Reserved::kReplay;
};

// {"step_time_s", "breakdown_s": B, "critical_stage", "stages": [B + {"stage", "rank"}],
//  "peak_memory_per_stage_bytes": [...], "memory_per_stage": [framework_memory_to_json],
//  "peak_stage", "peak_rank", "ops_simulated"}, where a breakdown B is
//  {"compute", "compute_by_phase": {phase: s}, "exposed_comm": {group: s},
//   "exposed_comm_total", "exposed_offload", "host_bound", "bubble"} in seconds.
Json sim_result_to_json(const SimResult& r);

}  // namespace parasol::sim
