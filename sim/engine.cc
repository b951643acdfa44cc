// The discrete-event engine (see engine.h for what it models). The execution rules
// (dependencies, stream order, the host cursor, p2p groups, a ring receive's send) are each stage
// Program's issue graph (core/issue_graph.h), built and checked once per run, and the stage's
// IssueState, advanced as ops are issued and complete. Layout for speed: the ops of all stage
// Programs are numbered globally; their run state is a flat array of 32-byte records (duration,
// stage, partner, link-sharing set, ...), kept in a Simulator's workspace and reused from plan to
// plan, beside the issue graph's 16-byte and the issue state's 8-byte records per op. The only
// dynamic structure is a small binary heap of finish events (about one per busy stream). Durations
// are priced in one pass over the Ops before the run, once per distinct op shape (a hash map behind
// a direct-mapped memo); group placements are priced once per Simulator.
#include "sim/engine.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <future>
#include <limits>
#include <map>
#include <memory>
#include <queue>
#include <tuple>
#include <unordered_map>

#include "core/error.h"
#include "core/host_issue.h"
#include "core/issue_graph.h"
#include "core/liveness.h"
#include "core/rank_layout.h"
#include "cost_models/compute_overlap.h"
#include "cost_models/host_cost.h"
#include "cost_models/op_cost.h"
#include "sim/trace_annotate.h"

namespace parasol::sim {

double SimBreakdown::exposed_comm_total() const {
  double s = 0;
  for (double v : exposed_comm) s += v;
  return s;
}

double SimBreakdown::total() const {
  return compute + exposed_comm_total() + exposed_offload + host + bubble;
}

namespace {

// How the engine plays an op.
enum class Type : uint8_t {
  kCompute,       // device compute: fixed duration
  kHostCompute,   // optimizer compute on the host CPU (offloaded optimizer): fixed duration
  kComm,          // collective inside the stage, or a copy: may share a link class
  kPpCollective,  // collective on Group::kPp: rendezvous across stages
  kSend,          // pipeline send: may share a link class
  kRecv,          // pipeline recv: completes with its send
  kSync,          // a device-to-host sync: the host waits for its deps, then wakes up
};

// Link classes whose bandwidth concurrent ops of one rank share.
enum LinkClass : int8_t { kNoClass = -1, kNvlinkClass = 0, kNicClass = 1, kD2H = 2, kH2D = 3 };
constexpr int kClasses = 4;

// Breakdown categories: compute phases, then groups, then offload, then the host (a sync's
// wake-up).
constexpr int kCatComm0 = 4;
constexpr int kCatOffload = kCatComm0 + kGroupCount;
constexpr int kCatHost = kCatOffload + 1;
constexpr int kCategories = kCatHost + 1;
// Whether category `cat` is a collective whose SMs the GEMMs beside it were not sized for (a
// data-parallel group's: gradient reduction, ZeRO-3 gathers, HSDP replicas; the expert
// all-to-all): cost_models/compute_overlap.h's rule tells it from the others.
bool is_dp_category(int cat) {
  return cat >= kCatComm0 && cat < kCatOffload &&
         cost::holds_gemm_sms(static_cast<Group>(cat - kCatComm0));
}

using cost::is_compute_kind;
using cost::runs_on_host;

// The engine's link class of an op (kNoClass when it moves no data).
int8_t link_class(cost::LinkUse u) {
  switch (u) {
    case cost::LinkUse::kIntraServer:
      return kNvlinkClass;
    case cost::LinkUse::kInterServer:
      return kNicClass;
    case cost::LinkUse::kDeviceToHost:
      return kD2H;
    case cost::LinkUse::kHostToDevice:
      return kH2D;
    case cost::LinkUse::kNone:
      break;
  }
  return kNoClass;
}

}  // namespace

// Prices of placed groups and pipeline links, kept by a Simulator across plans: they depend
// only on where the GPUs sit (see cost::OpPricer), not on the plan.
struct Simulator::Placements : cost::PlacementCache {
  using cost::PlacementCache::PlacementCache;
};

namespace {

// Per op (global id): the run state, half a cache line.
struct alignas(32) SimOp {
  double dur = 0;        // seconds alone (standalone price)
  int partner = -1;      // send <-> recv; rendezvous index of a kPp collective
  int share = -1;        // processor-sharing set (stage * kClasses + link class); -1: none
  uint32_t version = 0;  // bumped when a shared op's finish time is rescheduled
  int stage = 0;         // its pipeline stage (whose Program holds it)
  Type type = Type::kCompute;
  uint8_t cat = 0;      // breakdown category
  uint8_t done = 0;     // its own work is done (core/issue_graph.h: landed)
  uint8_t waiting = 0;  // a recv posted before its send finished
  uint8_t grouped = 0;  // a member of a p2p group of several ops
};
static_assert(sizeof(SimOp) == 32);
// When an op ran: start (a recv: when it was posted), xfer (when its data started to move:
// recv, rendezvous; else = start) and end.
// ready: when its deps and stream let it start; issue: when the host issued it (core/host_issue.h).
struct Times {
  double start = 0, xfer = 0, end = 0;
  double ready = 0, issue = 0;
};

}  // namespace

// The per-op arrays of a run, kept by a Simulator so that plan after plan reuses the memory.
struct Simulator::Workspace {
  std::vector<SimOp> ops;
  std::vector<Times> times;
  std::vector<double> remaining;
  std::vector<double> host_cost;   // seconds the host spends issuing each op
  std::vector<IssueGraph> graphs;  // per stage
  std::vector<IssueState> states;  // per stage
  std::vector<std::vector<std::vector<int>>> stream_ops;
};

namespace {

struct Event {
  double t;
  int op;
  uint32_t version;
  bool operator>(const Event& o) const { return t != o.t ? t > o.t : op > o.op; }
};

std::string op_path(int stage, int id) {
  return "programs[" + std::to_string(stage) + "].ops[" + std::to_string(id) + "]";
}

// Pipeline send/recv matching across the stages' Programs (core/issue_graph.h's p2p_key: sender
// stage, receiver stage and tag; untagged ops by direction and micro-batch, in issue order). A
// ring step's receive pairs with its own stage's send: its issue graph pairs them.
using P2pLists = std::map<P2pKey, std::vector<int>>;  // the ops of a key in issue order

// The run state of all ops of all stages.
class Engine {
 public:
  Engine(const Model& model, const Cluster& cluster, const Plan& plan,
         const std::vector<Program>& programs, const cost::Profile& profile,
         Simulator::Placements& places, Simulator::Workspace& work,
         const std::vector<double>& compute_scale)
      : plan_(plan),
        programs_(programs),
        profile_(profile),
        layout_(plan),
        ops_(work.ops),
        times_(work.times),
        remaining_(work.remaining),
        host_cost_(work.host_cost),
        graphs_(work.graphs),
        states_(work.states),
        stream_ops_(work.stream_ops),
        slowdown_{{0, cost::compute_slowdown(profile, false, true)},
                  {cost::compute_slowdown(profile, true, false),
                   cost::compute_slowdown(profile, true, true)}},
        slows_(slowdown_[1][1] > 0) {
    const int pp = plan.pp;
    // The Programs come from the lowering: a malformed one is parasol's bug, not the user's.
    PARASOL_CHECK(static_cast<int>(programs.size()) == pp,
                  std::to_string(programs.size()) + " Programs for " + std::to_string(pp) +
                      " pipeline stages");
    for (int s = 0; s < pp; ++s) {
      PARASOL_CHECK(programs[s].stage == s, "programs[" + std::to_string(s) + "].stage is " +
                                                std::to_string(programs[s].stage));
    }
    reps_ = layout_.stage_representatives();
    compute_scale_.assign(pp, 1.0);
    if (!compute_scale.empty()) {
      if (static_cast<int>(compute_scale.size()) != pp)
        throw Error("stage_slowdown", std::to_string(compute_scale.size()) + " slowdowns for " +
                                          std::to_string(pp) + " stages");
      for (int s = 0; s < pp; ++s) {
        if (!(compute_scale[s] > 0) || !std::isfinite(compute_scale[s]))
          throw Error("stage_slowdown[" + std::to_string(s) + "]", "must be > 0");
        compute_scale_[s] = compute_scale[s];
      }
    }
    pricer_ =
        std::make_unique<cost::OpPricer>(model, cluster, plan, profile, layout_, reps_, places);
    build();
  }

  void run();
  SimResult result(bool record_trace) const;
  int64_t ops() const { return n_; }

 private:
  // The event graph of the Programs: build() and its steps, in order.
  void build();
  void start_peak_memory();
  void reset_state();
  void add_stage(int stage, P2pLists& sends, P2pLists& recvs, std::vector<int>& pp_colls);
  void add_op(int stage, int i, P2pLists& sends, P2pLists& recvs, std::vector<int>& pp_colls);
  void pair_sends_and_recvs(const P2pLists& sends, const P2pLists& recvs);
  void build_rendezvous(const std::vector<std::vector<int>>& pp_colls);

  // An issue group (its first op, global id) that the rules (core/issue_graph.h: dependencies,
  // stream order, the host has reached it) let go at time t starts once the host has spent its
  // issue time on it (core/host_issue.h).
  void gate(int head, double t);
  // The ops issued together with `head` start at t (IssueState::issued).
  void start_group(int head, double t);
  void start(int i, double t);
  // Op i's own work is done at t (IssueState::landed); it completes then, or with the last
  // member of its p2p group to land (complete).
  void finish(int i, double t);
  void complete(int stage, int i, double t);
  // The groups that the stage's state reported ready (local ids in became_) go to ready_.
  void take_ready(int stage);
  // The host reaches its stage's ops in Program order (IssueState::reach) up to the next sync,
  // where it waits, each after its host cost (HostCursor): the op's issue time.
  void host_advance(int stage, double t);
  void share_update(int cls, double t);
  void share_reschedule(int cls, double t);
  // Overlap is not free: a stage's device compute progresses at 1 - cost::compute_slowdown() of
  // the kinds of collectives and sends of the stage running beside it (cost_models/
  // compute_overlap.h: the rule the closed form integrates).
  double compute_rate(int stage) const {
    const int dp = dp_comm_active_[stage];
    return 1 - slowdown_[comm_active_[stage] > dp ? 1 : 0][dp > 0 ? 1 : 0];
  }
  void compute_update(int stage, double t);
  // A collective or send of `stage` starts (+1) or ends (-1); `dp`: of a data-parallel group.
  void comm_active_change(int stage, int delta, bool dp, double t);
  static bool is_nccl_share(int share) { return share >= 0 && share % kClasses <= kNicClass; }
  void push(double t, int i) { heap_.push({t, i, ops_[i].version}); }
  SimBreakdown sweep(int stage, double step_time) const;

  const Plan& plan_;
  const std::vector<Program>& programs_;
  const cost::Profile& profile_;
  RankLayout layout_;
  std::vector<int> reps_;
  std::vector<double> compute_scale_;  // per stage: device compute time x this (stragglers)
  std::unique_ptr<cost::OpPricer> pricer_;

  int n_ = 0;
  std::vector<int> base_;                                      // first global id of each stage
  std::shared_future<std::vector<Liveness>> liveness_future_;  // per stage (core/liveness.h)
  // Per-op state, in the Simulator's workspace (reused from plan to plan).
  std::vector<SimOp>& ops_;
  std::vector<Times>& times_;
  std::vector<double>& remaining_;  // shared ops: standalone seconds still to go
  std::vector<double>& host_cost_;
  // Each stage Program's execution rules (core/issue_graph.h): its ops' dependents and stream
  // successors, its ring receives' sends, its p2p groups; and the stage's place under them (what
  // the host has reached, which ops are ready, issued, landed and completed), in the Simulator's
  // workspace.
  std::vector<IssueGraph>& graphs_;
  std::vector<IssueState>& states_;
  std::vector<int> became_;  // scratch: the groups an IssueState call made ready (local ids)
  std::vector<int> ring_;    // add_stage: the stage's ring sends and receives, to pair at its end
  // Per stage: the host's clock (the op it reaches next is its IssueState's cursor).
  std::vector<HostCursor> host_;
  // Per stage and stream: the ops in issue order (for the breakdown sweep).
  std::vector<std::vector<std::vector<int>>>& stream_ops_;
  // Processor-sharing sets: stage * kClasses + class.
  struct Share {
    std::vector<int> active;
    double last = 0;
  };
  std::vector<Share> shares_;
  // Group::kPp rendezvous: the ops taking part and how many have arrived.
  struct Rendezvous {
    std::vector<int> ops;
    int arrived = 0;
    double dur = 0;
  };
  std::vector<Rendezvous> rendezvous_;

  std::priority_queue<Event, std::vector<Event>, std::greater<Event>> heap_;
  std::vector<int> ready_;     // ops to start at the current time
  std::vector<int> batch_;     // the ready ops being started (swapped with ready_)
  std::vector<int> now_done_;  // ops that finish at the current time
  // Per stage: communication ops running, the device compute ops running and when their
  // remaining work was last brought up to date.
  // compute_slowdown() by [other kinds running][data-parallel running]; whether any slows.
  double slowdown_[2][2] = {{0, 0}, {0, 0}};
  bool slows_ = false;
  std::vector<int> comm_active_;  // all of them; dp_comm_active_: those of data-parallel groups
  std::vector<int> dp_comm_active_;
  std::vector<std::vector<int>> running_compute_;
  std::vector<double> compute_last_;
};

void Engine::build() {
  start_peak_memory();
  reset_state();
  graphs_.resize(plan_.pp);
  P2pLists sends, recvs;
  // Group::kPp collectives: the k-th of each stage meet.
  std::vector<std::vector<int>> pp_colls(plan_.pp);
  for (int s = 0; s < plan_.pp; ++s) add_stage(s, sends, recvs, pp_colls[s]);
  pair_sends_and_recvs(sends, recvs);
  build_rendezvous(pp_colls);
}

// Peak memory of each stage from its buffers' liveness (core/liveness.h), on another core
// while this one builds and plays the event graph (the Programs are read-only meanwhile).
void Engine::start_peak_memory() {
  liveness_future_ = std::async(std::launch::async, [this] {
    std::vector<Liveness> lv;
    for (const Program& prog : programs_) lv.push_back(liveness(prog));
    return lv;
  });
}

// Numbers the ops of all stages and sizes the per-op and per-stage state for them.
void Engine::reset_state() {
  const int pp = plan_.pp;
  base_.resize(pp + 1);
  for (int s = 0; s < pp; ++s) base_[s + 1] = base_[s] + static_cast<int>(programs_[s].ops.size());
  n_ = base_[pp];
  ops_.assign(n_, SimOp{});
  times_.assign(n_, Times{});
  remaining_.assign(n_, 0);
  host_cost_.assign(n_, 0);
  host_.assign(pp, HostCursor{});
  shares_.resize(static_cast<size_t>(pp) * kClasses);
  stream_ops_.resize(pp);
  comm_active_.assign(pp, 0);
  dp_comm_active_.assign(pp, 0);
  running_compute_.assign(pp, {});
  compute_last_.assign(pp, 0);
}

// One pass over the Ops of stage s: the stage's issue graph is built and checked op by op (a
// malformed Program is an internal error); an op waits for its deps and the op before it on its
// stream (the graph's edges), is typed and priced (add_op), and its sends, recvs and kPp
// collectives are filed for matching. A ring step's pair is the graph's, known at its end.
void Engine::add_stage(int s, P2pLists& sends, P2pLists& recvs, std::vector<int>& pp_colls) {
  const Program& prog = programs_[s];
  IssueGraph& graph = graphs_[s];
  graph.begin(prog);
  const int nops = static_cast<int>(prog.ops.size());
  const int nstreams = static_cast<int>(prog.streams.size());
  stream_ops_[s].resize(nstreams);
  for (auto& v : stream_ops_[s]) {
    v.clear();
    v.reserve(nops / std::max(1, nstreams) + 1);
  }
  for (int i = 0; i < nops; ++i) {
    // The Ops are large: fetch ahead.
    if (i + 8 < nops) __builtin_prefetch(&prog.ops[i + 8]);
    graph.add(i);
    const Op& op = prog.ops[i];
    const int g = base_[s] + i;
    ops_[g].stage = s;
    if (graph.issue_begin(i) < i) ops_[g].grouped = ops_[g - 1].grouped = 1;
    stream_ops_[s][op.stream].push_back(g);
    add_op(s, i, sends, recvs, pp_colls);
  }
  graph.end();
  if (static_cast<int>(states_.size()) <= s) states_.resize(s + 1);
  states_[s].reset(graph);  // non-eager sends: a send kernel holds its stream until done
  for (int g : ring_) ops_[g].partner = base_[s] + graph.partner(g - base_[s]);
  ring_.clear();
}

// How the engine plays op i of stage s (global id g): its type and breakdown category, its
// standalone duration and processor-sharing set; sends, recvs and kPp collectives are filed
// for matching.
void Engine::add_op(int s, int i, P2pLists& sends, P2pLists& recvs, std::vector<int>& pp_colls) {
  const Program& prog = programs_[s];
  const Op& op = prog.ops[i];
  const int g = base_[s] + i;
  const int pp = plan_.pp;
  const bool host = is_compute_kind(op.kind) && runs_on_host(prog, op);
  host_cost_[g] = cost::host_issue_seconds(op, plan_, profile_);
  if (op.kind == OpKind::kSync) {
    ops_[g].type = Type::kSync;
    ops_[g].cat = kCatHost;
  } else if (is_compute_kind(op.kind)) {
    ops_[g].type = host ? Type::kHostCompute : Type::kCompute;
    ops_[g].cat = host ? kCatOffload : static_cast<uint8_t>(op.tags.phase);
  } else if (op.kind == OpKind::kOffload || op.kind == OpKind::kPrefetch) {
    ops_[g].type = Type::kComm;
    ops_[g].cat = kCatOffload;
  } else {
    const bool pipeline = op.group == Group::kPp;
    PARASOL_CHECK(!((op.kind == OpKind::kSend || op.kind == OpKind::kRecv) && pipeline &&
                    (op.peer_stage < 0 || op.peer_stage >= pp || op.peer_stage == s)),
                  op_path(s, i) + ".peer_stage: bad peer stage " + std::to_string(op.peer_stage));
    ops_[g].cat = kCatComm0 + static_cast<int>(op.group);
    if (op.kind == OpKind::kSend || op.kind == OpKind::kRecv) {
      const bool send = op.kind == OpKind::kSend;
      ops_[g].type = send ? Type::kSend : Type::kRecv;
      if (pipeline)
        (send ? sends[p2p_key(s, op.peer_stage, op)] : recvs[p2p_key(op.peer_stage, s, op)])
            .push_back(g);
      else  // a ring step: its pair on this stage (the issue graph's, once built)
        ring_.push_back(g);
    } else if (op.group == Group::kPp) {
      ops_[g].type = Type::kPpCollective;
      pp_colls.push_back(g);
    } else {
      ops_[g].type = Type::kComm;
    }
  }
  if (ops_[g].type != Type::kPpCollective) {
    ops_[g].dur = pricer_->time(op, s, host);
    if (ops_[g].type == Type::kCompute) ops_[g].dur *= compute_scale_[s];
    const int8_t cls = link_class(pricer_->link_use(op, s));
    const Type ty = ops_[g].type;
    if (cls != kNoClass && ops_[g].dur > 0 && (ty == Type::kComm || ty == Type::kSend))
      ops_[g].share = s * kClasses + cls;
  }
}

// Pairs each pipeline recv with the send of the same key (in issue order); either without its
// match is a malformed Program (InternalError: the lowering's bug).
void Engine::pair_sends_and_recvs(const P2pLists& sends, const P2pLists& recvs) {
  for (auto& [key, list] : recvs) {
    auto it = sends.find(key);
    size_t have = it == sends.end() ? 0 : it->second.size();
    for (size_t j = 0; j < list.size(); ++j) {
      const int r = list[j];
      if (j >= have) {
        const int s = ops_[r].stage;
        const Op& op = programs_[s].ops[r - base_[s]];
        throw InternalError(op_path(s, r - base_[s]),
                            "recv '" + op.name + "' from stage " + std::to_string(op.peer_stage) +
                                " (tag " + std::to_string(op.tag) + ", micro-batch " +
                                std::to_string(op.tags.micro_batch) + ", " +
                                phase_name(op.tags.phase) + ") has no matching send");
      }
      ops_[r].partner = it->second[j];
      ops_[it->second[j]].partner = r;
    }
  }
  for (auto& [key, list] : sends)
    for (int snd : list)
      if (ops_[snd].partner < 0) {
        const int s = ops_[snd].stage;
        const Op& op = programs_[s].ops[snd - base_[s]];
        throw InternalError(op_path(s, snd - base_[s]),
                            "send '" + op.name + "' to stage " + std::to_string(op.peer_stage) +
                                " (tag " + std::to_string(op.tag) + ", micro-batch " +
                                std::to_string(op.tags.micro_batch) + ", " +
                                phase_name(op.tags.phase) + ") has no matching recv");
      }
}

// Group::kPp rendezvous: the k-th kPp collective of every stage that has one meet, priced once.
void Engine::build_rendezvous(const std::vector<std::vector<int>>& pp_colls) {
  const int pp = plan_.pp;
  size_t most = 0;
  for (auto& v : pp_colls) most = std::max(most, v.size());
  for (size_t k = 0; k < most; ++k) {
    Rendezvous rv;
    std::vector<int> stages;
    for (int s = 0; s < pp; ++s)
      if (k < pp_colls[s].size()) {
        rv.ops.push_back(pp_colls[s][k]);
        stages.push_back(s);
      }
    const int first = rv.ops[0];
    const Op& op = programs_[ops_[first].stage].ops[first - base_[ops_[first].stage]];
    rv.dur = pricer_->pp_collective_time(op, stages);
    for (int g : rv.ops) {
      ops_[g].partner = static_cast<int>(rendezvous_.size());
      ops_[g].dur = rv.dur;
    }
    rendezvous_.push_back(std::move(rv));
  }
}

void Engine::share_update(int c, double t) {
  Share& sh = shares_[c];
  const size_t n = sh.active.size();
  if (n > 0) {
    const double progressed = (t - sh.last) / static_cast<double>(n);
    for (int i : sh.active) remaining_[i] = std::max(0.0, remaining_[i] - progressed);
  }
  sh.last = t;
}

void Engine::share_reschedule(int c, double t) {
  Share& sh = shares_[c];
  const double n = static_cast<double>(sh.active.size());
  for (int i : sh.active) {
    ++ops_[i].version;
    push(t + remaining_[i] * n, i);
  }
}

void Engine::compute_update(int s, double t) {
  const double progressed = (t - compute_last_[s]) * compute_rate(s);
  for (int i : running_compute_[s]) remaining_[i] = std::max(0.0, remaining_[i] - progressed);
  compute_last_[s] = t;
}

void Engine::comm_active_change(int s, int delta, bool dp, double t) {
  if (!slows_) return;
  const double was = compute_rate(s);
  compute_update(s, t);
  comm_active_[s] += delta;
  if (dp) dp_comm_active_[s] += delta;
  if (was == compute_rate(s)) return;
  for (int i : running_compute_[s]) {
    ++ops_[i].version;
    push(t + remaining_[i] / compute_rate(s), i);
  }
}

void Engine::start(int i, double t) {
  times_[i].start = t;
  times_[i].xfer = t;
  switch (ops_[i].type) {
    case Type::kCompute: {
      if (!slows_) {
        push(t + ops_[i].dur, i);
        return;
      }
      const int s = ops_[i].stage;
      compute_update(s, t);
      running_compute_[s].push_back(i);
      remaining_[i] = ops_[i].dur;
      push(t + remaining_[i] / compute_rate(s), i);
      return;
    }
    case Type::kHostCompute:
      push(t + ops_[i].dur, i);
      return;
    case Type::kSync:
      // Its device work is done now: the host wakes up (it has waited since it issued the sync).
      push(host_[ops_[i].stage].sync(t, ops_[i].dur), i);
      return;
    case Type::kComm:
    case Type::kSend:
      if (is_nccl_share(ops_[i].share))
        comm_active_change(ops_[i].stage, +1, is_dp_category(ops_[i].cat), t);
      if (ops_[i].share >= 0) {
        const int c = ops_[i].share;
        share_update(c, t);
        shares_[c].active.push_back(i);
        remaining_[i] = ops_[i].dur;
        share_reschedule(c, t);
      } else {
        push(t + ops_[i].dur, i);
      }
      return;
    case Type::kRecv: {
      const int snd = ops_[i].partner;
      if (ops_[snd].done) {
        now_done_.push_back(i);  // the data is already here
      } else {
        ops_[i].waiting = 1;
      }
      return;
    }
    case Type::kPpCollective: {
      Rendezvous& rv = rendezvous_[ops_[i].partner];
      if (++rv.arrived == static_cast<int>(rv.ops.size()))
        for (int j : rv.ops) {
          times_[j].xfer = t;
          push(t + rv.dur, j);
        }
      return;
    }
  }
}

void Engine::finish(int i, double t) {
  ops_[i].done = 1;
  times_[i].end = t;
  if (ops_[i].type == Type::kCompute && slows_) {
    const int s = ops_[i].stage;
    compute_update(s, t);
    auto& run = running_compute_[s];
    run.erase(std::find(run.begin(), run.end(), i));
  }
  if (is_nccl_share(ops_[i].share))
    comm_active_change(ops_[i].stage, -1, is_dp_category(ops_[i].cat), t);
  if (ops_[i].share >= 0) {
    const int c = ops_[i].share;
    share_update(c, t);
    auto& act = shares_[c].active;
    act.erase(std::find(act.begin(), act.end(), i));
    share_reschedule(c, t);
  }
  if (ops_[i].type == Type::kSend) {
    const int r = ops_[i].partner;
    if (ops_[r].waiting) {
      ops_[r].waiting = 0;
      times_[r].xfer = std::max(times_[r].start, times_[i].start);
      now_done_.push_back(r);
    }
  }
  const int s = ops_[i].stage;
  if (!ops_[i].grouped) {
    complete(s, i, t);
    return;
  }
  // One NCCL group completes as a whole: with the last of its members to land.
  const int base = base_[s], l = i - base;
  const int b = graphs_[s].issue_begin(l), e = graphs_[s].issue_end(l);
  IssueState& st = states_[s];
  st.landed(l);
  for (int j = b; j < e; ++j)
    if (!st.is_landed(j)) return;
  for (int j = b; j < e; ++j) complete(s, base + j, t);
}

void Engine::complete(int s, int i, double t) {
  states_[s].completed(i - base_[s], &became_);
  take_ready(s);
  if (ops_[i].type == Type::kSync) host_advance(s, t);
}

void Engine::take_ready(int s) {
  for (int b : became_) ready_.push_back(base_[s] + b);
  became_.clear();
}

void Engine::gate(int head, double t) {
  int end = head + 1;
  if (ops_[head].grouped) {
    const int s = ops_[head].stage, base = base_[s];
    end = base + graphs_[s].issue_end(head - base);
  }
  for (int j = head; j < end; ++j) times_[j].ready = t;
  // Issued together once the host has issued the group's last op.
  const double issue = times_[end - 1].issue;
  if (issue <= t)
    start_group(head, t);
  else
    heap_.push({issue, ~head, 0});  // a start at its issue
}

void Engine::start_group(int head, double t) {
  const int s = ops_[head].stage, base = base_[s];
  states_[s].issued(head - base);
  if (!ops_[head].grouped) {
    start(head, t);
    return;
  }
  const int end = base + graphs_[s].issue_end(head - base);
  for (int j = head; j < end; ++j) start(j, t);
}

void Engine::host_advance(int s, double t) {
  IssueState& st = states_[s];
  while (st.can_reach()) {
    const int g = base_[s] + st.cursor();
    times_[g].issue = host_[s].issue(host_cost_[g]);
    st.reach(&became_);
  }
  for (int b : became_) gate(base_[s] + b, t);
  became_.clear();
}

void Engine::run() {
  for (int s = 0; s < plan_.pp; ++s) host_advance(s, 0);
  double now = 0;
  auto drain = [&]() {
    // Start what became ready and finish what completes now, until nothing changes at `now`.
    while (!ready_.empty() || !now_done_.empty()) {
      while (!now_done_.empty()) {
        int i = now_done_.back();
        now_done_.pop_back();
        finish(i, now);
      }
      batch_.swap(ready_);
      for (int i : batch_) gate(i, now);
      batch_.clear();
    }
  };
  drain();
  while (!heap_.empty()) {
    Event ev = heap_.top();
    heap_.pop();
    if (ev.op < 0) {  // an issue group the host has just issued starts
      now = ev.t;
      start_group(~ev.op, now);
      drain();
      continue;
    }
    if (ops_[ev.op].done || ev.version != ops_[ev.op].version) continue;  // stale (rescheduled)
    now = ev.t;
    finish(ev.op, now);
    drain();
  }
  for (int s = 0; s < plan_.pp; ++s) {
    if (states_[s].done()) continue;
    for (int j = 0; j < static_cast<int>(programs_[s].ops.size()); ++j)
      if (!states_[s].is_completed(j)) {
        const std::string why =
            "never ran: a dependency cycle, a collective some stage never reaches, or a "
            "recv whose send never ran";
        throw InternalError(op_path(s, j), "'" + programs_[s].ops[j].name + "' " + why);
      }
  }
}

SimBreakdown Engine::sweep(int s, double step_time) const {
  SimBreakdown b;
  const auto& streams = stream_ops_[s];
  const size_t ns = streams.size();
  std::vector<size_t> cur(ns, 0);
  std::array<int, kCategories> active{};
  double t = 0;
  auto iv_start = [&](int i) { return times_[i].xfer; };
  while (true) {
    double next = std::numeric_limits<double>::infinity();
    bool next_host = false;  // the op that starts at `next` waited for the host to issue it
    active.fill(0);
    bool any_left = false;
    for (size_t k = 0; k < ns; ++k) {
      const auto& ops = streams[k];
      size_t& c = cur[k];
      while (c < ops.size() && times_[ops[c]].end <= t) ++c;
      if (c == ops.size()) continue;
      any_left = true;
      const int i = ops[c];
      const double st = iv_start(i);
      if (st <= t) {
        ++active[ops_[i].cat];
        if (times_[i].end < next) {
          next = times_[i].end;
          next_host = false;
        }
      } else if (st <= next) {
        const bool host = times_[i].issue > times_[i].ready && times_[i].start == times_[i].issue;
        next_host = st < next ? host : next_host || host;
        next = st;
      }
    }
    if (!any_left) break;
    const double seg = next - t;
    int compute_phase = -1;
    for (int p = 0; p < kCatComm0; ++p)
      if (active[p]) {
        compute_phase = p;
        break;
      }
    if (compute_phase >= 0) {
      b.compute += seg;
      b.compute_by_phase[compute_phase] += seg;
    } else {
      int comms = 0;
      for (int g = 0; g < kGroupCount; ++g) comms += active[kCatComm0 + g] > 0;
      if (comms > 0) {
        for (int g = 0; g < kGroupCount; ++g)
          if (active[kCatComm0 + g]) b.exposed_comm[g] += seg / comms;
      } else if (active[kCatOffload]) {
        b.exposed_offload += seg;
      } else if (active[kCatHost] || next_host) {
        b.host += seg;
      } else {
        b.bubble += seg;
      }
    }
    t = next;
  }
  b.bubble += std::max(0.0, step_time - t);
  return b;
}

SimResult Engine::result(bool record_trace) const {
  SimResult r;
  r.ops_simulated = n_;
  for (int i = 0; i < n_; ++i) r.step_time_s = std::max(r.step_time_s, times_[i].end);
  r.stage_rank = reps_;
  double most = -1;
  for (int s = 0; s < plan_.pp; ++s) {
    r.stage_breakdown.push_back(sweep(s, r.step_time_s));
    if (r.stage_breakdown.back().compute > most) {
      most = r.stage_breakdown.back().compute;
      r.critical_stage = s;
    }
  }
  r.breakdown = r.stage_breakdown[r.critical_stage];
  const std::vector<Liveness>& lv = liveness_future_.get();
  for (const Liveness& l : lv) {
    r.peak_memory_per_stage.push_back(l.peak_bytes);
    r.peak_by_class_per_stage.push_back(l.peak_by_class);
  }
  if (record_trace) {
    traces::Trace& tr = r.trace;
    tr.source = "predicted";
    tr.plan = plan_to_json(plan_);
    tr.events.reserve(n_);
    for (int s = 0; s < plan_.pp; ++s) {
      const Program& prog = programs_[s];
      for (int k = 0; k < static_cast<int>(prog.streams.size()); ++k)
        tr.streams.push_back({reps_[s], k, prog.stream_name(k)});
      const IssueGraph& graph = graphs_[s];
      for (int j = 0; j < static_cast<int>(prog.ops.size()); ++j) {
        const Op& op = prog.ops[j];
        const int g = base_[s] + j;
        traces::TraceEvent e;
        e.rank = reps_[s];
        e.stream = op.stream;
        e.name = op.name;
        e.start_s = times_[g].start;
        e.dur_s = times_[g].end - times_[g].start;
        // A p2p group's members run together on one stream (one NCCL kernel): on the stream's
        // row each is shown from where the one before it ends, so that the row's events do not
        // overlap.
        if (graph.issue_begin(j) < j) {
          const traces::TraceEvent& before = tr.events.back();
          e.start_s = std::max(e.start_s, before.start_s + before.dur_s);
          e.dur_s = std::max(0.0, times_[g].end - e.start_s);
        }
        e.op_id = op.id;
        e.kind = op_kind_name(op.kind);
        e.bytes = op.bytes;
        e.flops = op.flops;
        if (e.flops == 0 && (op.kind == OpKind::kLinear || op.kind == OpKind::kExpertLinear))
          e.flops = 2.0 * op.m * op.n * op.k * std::max<int64_t>(1, op.batch);
        e.layer = op.tags.layer;
        e.micro_batch = op.tags.micro_batch;
        e.phase = phase_name(op.tags.phase);
        if (is_communication(op.kind)) e.group = group_name(op.group);
        tr.events.push_back(std::move(e));
      }
    }
    // The host row: what each representative's host spent issuing each op, ending when the op
    // was issued (on the Program's host stream; core/host_issue.h).
    for (int s = 0; s < plan_.pp; ++s) {
      const Program& prog = programs_[s];
      int row = -1;
      for (int k = 0; k < static_cast<int>(prog.streams.size()); ++k)
        if (prog.streams[k] == StreamKind::kHost) row = k;
      for (int j = 0; j < static_cast<int>(prog.ops.size()); ++j) {
        const int g = base_[s] + j;
        if (host_cost_[g] <= 0) continue;
        if (row < 0) {  // a Program without a host stream: a row of its own
          row = static_cast<int>(prog.streams.size());
          tr.streams.push_back({reps_[s], row, "host"});
        }
        const Op& op = prog.ops[j];
        traces::TraceEvent e;
        e.rank = reps_[s];
        e.stream = row;
        e.name = op.name;
        e.start_s = times_[g].issue - host_cost_[g];
        e.dur_s = host_cost_[g];
        e.kind = traces::kHostIssueKind;
        e.layer = op.tags.layer;
        e.micro_batch = op.tags.micro_batch;
        e.phase = phase_name(op.tags.phase);
        tr.events.push_back(std::move(e));
      }
    }
    // Perfetto's extras: stage names, dependency flows, the liveness memory counter per rank.
    annotate_trace(tr, plan_, programs_);
    for (int s = 0; s < plan_.pp; ++s) add_liveness_counter(tr, reps_[s], lv[s]);
  }
  return r;
}

}  // namespace

Simulator::Simulator(const Model& model, const Cluster& cluster, cost::Profile profile)
    : model_(model),
      cluster_(cluster),
      profile_(std::move(profile)),
      places_(std::make_unique<Placements>(cluster)),
      work_(std::make_unique<Workspace>()) {}

Simulator::~Simulator() = default;

SimResult Simulator::simulate(const Plan& plan, const std::vector<Program>& programs,
                              bool record_trace, const std::vector<double>& stage_slowdown) {
  Engine engine(model_, cluster_, plan, programs, profile_, *places_, *work_, stage_slowdown);
  engine.run();
  SimResult r = engine.result(record_trace);
  // What the framework measures of each stage's liveness peak.
  for (int s = 0; s < static_cast<int>(r.peak_by_class_per_stage.size()); ++s) {
    const std::array<double, 5>& c = r.peak_by_class_per_stage[s];
    cost::MemoryBreakdown tensors;
    tensors.weights = c[static_cast<int>(BufferClass::kParam)];
    tensors.gradients = c[static_cast<int>(BufferClass::kGrad)];
    tensors.optimizer = c[static_cast<int>(BufferClass::kOptimizer)];
    tensors.activations = c[static_cast<int>(BufferClass::kActivation)];
    tensors.transient = c[static_cast<int>(BufferClass::kWorkspace)];
    cost::FrameworkMemory f = cost::framework_memory(tensors, cluster_, plan, s, profile_);
    const DeviceSpec& d = cluster_.gpu_device(0);
    cost::apply_allocator_reserve(f,
                                  reserved_ == cost::Reserved::kReplay
                                      ? cost::allocator_reserve_bytes(model_, plan, s, d, profile_)
                                      : cost::band_reserve_bytes(f),
                                  d.hbm_bytes);
    r.memory_per_stage.push_back(f);
    if (r.peak_stage < 0 ||
        r.memory_per_stage[s].device_used() > r.memory_per_stage[r.peak_stage].device_used())
      r.peak_stage = s;
  }
  if (r.peak_stage >= 0) r.peak_rank = cost::stage_rank(plan, r.peak_stage);
  return r;
}

SimResult simulate(const Model& model, const Cluster& cluster, const Plan& plan,
                   const std::vector<Program>& programs, const cost::Profile& profile,
                   bool record_trace) {
  return Simulator(model, cluster, profile).simulate(plan, programs, record_trace);
}

SimResult Simulator::simulate(const LoweredPlan& lowered, bool record_trace,
                              const std::vector<double>& stage_slowdown) {
  return simulate(lowered.plan, lowered.programs, record_trace, stage_slowdown);
}

SimResult simulate(const Model& model, const Cluster& cluster, const LoweredPlan& lowered,
                   const cost::Profile& profile, bool record_trace) {
  return simulate(model, cluster, lowered.plan, lowered.programs, profile, record_trace);
}

Json sim_result_to_json(const SimResult& r) {
  auto breakdown = [](const SimBreakdown& b) {
    Json comm = Json::object();
    for (int g = 0; g < kGroupCount; ++g)
      if (b.exposed_comm[g] > 0) comm[group_name(static_cast<Group>(g))] = b.exposed_comm[g];
    Json phases = Json::object();
    for (int p = 0; p < 4; ++p) phases[phase_name(static_cast<Phase>(p))] = b.compute_by_phase[p];
    return Json{{"compute", b.compute},
                {"compute_by_phase", phases},
                {"exposed_comm", comm},
                {"exposed_comm_total", b.exposed_comm_total()},
                {"exposed_offload", b.exposed_offload},
                {"host_bound", b.host},
                {"bubble", b.bubble}};
  };
  Json stages = Json::array();
  for (size_t s = 0; s < r.stage_breakdown.size(); ++s) {
    Json st = breakdown(r.stage_breakdown[s]);
    st["stage"] = s;
    st["rank"] = s < r.stage_rank.size() ? r.stage_rank[s] : -1;
    stages.push_back(st);
  }
  Json memory = Json::array();
  for (const cost::FrameworkMemory& f : r.memory_per_stage)
    memory.push_back(cost::framework_memory_to_json(f));
  return {{"step_time_s", r.step_time_s},
          {"breakdown_s", breakdown(r.breakdown)},
          {"critical_stage", r.critical_stage},
          {"stages", stages},
          {"peak_memory_per_stage_bytes", r.peak_memory_per_stage},
          {"memory_per_stage", memory},
          {"peak_stage", r.peak_stage},
          {"peak_rank", r.peak_rank},
          {"ops_simulated", r.ops_simulated}};
}

}  // namespace parasol::sim
