// The execution rules of a Program, stated once: which of a rank's ops may be issued (handed to
// their stream) when, and when they complete. Every player of a Program reads them here: the
// Chakra export writes the graph's edges (traces/chakra_export.cc), the closed form's fragment
// player plays a layer's ops by them (cost_models/layer_fragment.cc), and the event engine
// (sim/engine.cc) and the executor (runtime/executor.cc) each advance an IssueState: the engine
// adds time (the host's clock, prices, link sharing), the executor backend calls.
//
// The rules (core/lower.h states what the lowering guarantees; core/host_issue.h prices the host):
//  * an op is issued once its dependencies (Op::deps, earlier ops of the Program) have completed
//    and the op before it on its stream has completed: a stream runs its ops in Program order;
//  * the host reaches the ops in Program order; an op is issued no earlier than the host has
//    reached it, and a device-to-host sync (OpKind::kSync) stops the host until it has completed;
//  * the sends and receives of one p2p group (Op::p2p_group >= 0) are consecutive in the Program,
//    on one stream and one communication group, and are issued together once every one of them
//    may be (one NCCL group: Megatron's batch_isend_irecv, a ring attention step);
//  * a receive completes no earlier than the send it pairs with: a pipeline receive's send is on
//    the peer stage's Program (p2p_key pairs them across Programs); a receive of another group
//    (the context-parallel ring) pairs with this Program's send of the same key (by symmetry the
//    ring neighbour sends when this rank does);
//  * the members of a p2p group complete together, once every one has landed, and the op after
//    the group on its stream waits for all of them: NCCL runs a group (ncclGroupStart/End,
//    torch's batch_isend_irecv) as one kernel on one stream, and its work object completes as a
//    whole (Megatron waits on every request of the call);
//  * a send holds its stream and the ops that depend on it until it has completed (an NCCL send
//    is a kernel on its stream that ends once its data has left: the engine and the fragment
//    player, which play device time); under IssueRules::eager_sends it frees them once issued
//    (the executor's host: a launch returns at once, and the MPI backend's sends are buffered;
//    the data is on its way, its buffer is kept until it completes).
// A Program that breaks a rule is the lowering's bug: IssueGraph's constructor throws an
// InternalError (exit 1) whose field names the op ("programs[2].ops[17].deps"), as PARASOL_CHECK
// does for the state's contracts.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <tuple>
#include <utility>
#include <vector>

#include "core/program.h"

namespace parasol {

// Which send a receive pairs with: a send of stage `from` to stage `to` and a receive of `to`
// from `from` pair when their keys are equal (the k-th receive of a key with the k-th send).
// Tagged transfers (Op::tag >= 0) by their group and tag; untagged ones by their group,
// direction (forward or backward phase) and micro-batch. A pipeline transfer (Group::kPp) names
// its peer stage; any other (a ring step) has from == to: the rank's own stage.
using P2pKey = std::tuple<int, int, int, int64_t, int, int>;
P2pKey p2p_key(int from, int to, const Op& op);

// The rules' graph of one Program, built and checked once.
class IssueGraph {
 public:
  // Checks `program` against the rules (InternalError: a malformed Program is parasol's bug).
  // REQUIRES: `program` outlives the graph and does not change.
  explicit IssueGraph(const Program& program) { assign(program); }
  // An empty graph, to assign() later (a player that keeps its graphs' memory from run to run).
  IssueGraph() = default;
  // Makes this the graph of `program` (as the constructor), reusing its memory.
  void assign(const Program& program);
  // The same op by op, for a player that reads each Op once (the engine): begin(program), then
  // add(i) for i = 0, 1, ... in Program order, then end(). Once add(i) has returned, op i is
  // checked and deps(i), stream_prev(i) and issue_begin(i) are known; the rest (stream_next,
  // issue_end, partner, dependents) once end() has.
  void begin(const Program& program);
  void add(int i);
  void end();

  const Program& program() const { return *program_; }
  int size() const { return size_; }
  int streams() const { return static_cast<int>(program_->streams.size()); }

  // Op i's dependencies (earlier ops) and the ops that depend on it (later ops, ascending).
  std::span<const int> deps(int i) const { return program_->ops[i].deps; }
  std::span<const int> dependents(int i) const {
    return {dependents_.data() + nodes_[i].out, dependents_.data() + nodes_[i + 1].out};
  }
  // The op before and after op i on its stream (-1: none); stream s's first op (-1: none).
  int stream_prev(int i) const { return prev_[i]; }
  int stream_next(int i) const { return nodes_[i].next; }
  int stream_first(int s) const { return first_[s]; }
  // The ops issued together with op i: [issue_begin(i), issue_end(i)) in Program order (its p2p
  // group, or the op alone).
  int issue_begin(int i) const { return i - nodes_[i].back; }
  int issue_end(int i) const { return i + nodes_[i].ahead; }
  // A receive: the send of this Program it completes with (-1: a pipeline receive, whose send is
  // another stage's). A send: the receive of this Program that pairs with it (-1: none here).
  int partner(int i) const { return nodes_[i].partner; }
  bool is_send(int i) const { return nodes_[i].kind == kSendOp; }
  bool is_recv(int i) const { return nodes_[i].kind == kRecvOp; }
  // A device-to-host sync: the host stops at it until it has completed.
  bool is_sync(int i) const { return nodes_[i].kind == kSyncOp; }
  // What the first op of each issue group waits for before it may be issued (0 elsewhere): its
  // members' dependencies and every member of the group before it on its stream (IssueState).
  const std::vector<int>& waits() const { return waits_; }
  // The most ops one p2p group may have (a Program with a larger one is malformed; the lowering's
  // groups have two to four: Megatron's batched exchange, a ring attention step).
  static constexpr int kMaxIssueGroup = 255;

 private:
  const Program* program_ = nullptr;
  int size_ = 0;
  // Each op's kind as the rules see it.
  enum : uint8_t { kOtherOp = 0, kSendOp, kRecvOp, kSyncOp };
  // What an IssueState reads of op i as it advances, in one record (a quarter of a cache line:
  // the players walk hundreds of thousands of ops, and the Ops are large).
  struct Node {
    int32_t next = -1;     // the op after it on its stream (-1: none)
    int32_t out = 0;       // its dependents: dependents_[out, nodes_[i + 1].out)
    int32_t partner = -1;  // partner(i)
    uint8_t back = 0;      // i - issue_begin(i)
    uint8_t ahead = 1;     // issue_end(i) - i
    uint8_t kind = kOtherOp;
    uint8_t unused = 0;
  };
  static_assert(sizeof(Node) == 16);
  std::vector<Node> nodes_;  // size() + 1: the last one ends the last op's dependents
  std::vector<int> prev_, first_;
  std::vector<int> waits_;
  std::vector<int> dependents_;
  // Scratch of the build: the edges (dependency, op) op after op, each stream's last op, the p2p
  // groups whose run of ops has ended, the sends and receives that pair in this Program by key.
  std::vector<std::pair<int, int>> edges_;
  std::vector<int> last_;
  std::vector<char> closed_;
  std::map<P2pKey, std::vector<int>> sends_, recvs_;
};

// Rules that the players of a Program do not yet share.
struct IssueRules {
  bool eager_sends = false;  // a send frees its stream and dependents once issued
};

// Where one rank is in a step under the rules: the host's cursor, the ops issued, landed (their
// own work done: a transfer's data has left or arrived) and completed. Advanced by reach() (the
// host reaches the next op), issued(op), landed(op) and completed(op). Readiness is counted, not
// searched: each issue group keeps how many of its dependencies and of the ops before it on its
// stream have not released it, so a player that passes `became_ready` learns each group once, in
// O(1) per edge, when it becomes ready (the engine); ready(i) answers the same question on demand
// (the executor). An op releases those after it (its dependents; the first op after its issue
// group on its stream, which waits for every member of the group: one NCCL group is one kernel on
// its stream) once completed, or, under eager sends, a send once issued. The members of a p2p
// group of several ops complete together, once every one has landed (one NCCL group completes
// as a whole); a ring receive completes no earlier than its send has landed. Not thread-safe.
class IssueState {
 public:
  IssueState() = default;
  explicit IssueState(const IssueGraph& graph, IssueRules rules = {}) { reset(graph, rules); }
  // Starts a step of `graph` afresh (reusing this state's memory).
  // REQUIRES: `graph` outlives the state (or the next reset) and does not change.
  void reset(const IssueGraph& graph, IssueRules rules = {});

  // The ops the host has reached: [0, cursor()).
  int cursor() const { return cursor_; }
  // Whether the host may reach the next op: not at the end, not stopped at a sync that has not
  // completed.
  bool can_reach() const;
  // The host reaches op cursor(); appends to became_ready the issue group it completes, if that
  // group is now ready. REQUIRES: can_reach().
  void reach(std::vector<int>* became_ready = nullptr);
  // Whether the ops issued together with op i (IssueGraph::issue_begin(i)) may be issued now:
  // each reached by the host, not issued, its dependencies and the ops before it on its stream
  // released.
  bool ready(int i) const {
    const int b = graph_->issue_begin(i);
    return slots_[b].state == kWaiting && slots_[b].pending == 0 && graph_->issue_end(b) <= cursor_;
  }
  // The first op of each issue group ready now, in Program order (a fresh list on each call).
  std::vector<int> ready_groups() const;
  // Issues the ops issued together with op i; under eager sends appends the groups its sends
  // make ready to became_ready. REQUIRES: ready(i).
  void issued(int i, std::vector<int>* became_ready = nullptr);
  // Op i's own work is done (a send's data has left, a receive's has arrived).
  // REQUIRES: issued, not landed.
  void landed(int i);
  // Whether issued op i may complete: a member of a p2p group once every other member has landed;
  // a ring receive once its send has landed.
  bool can_complete(int i) const;
  // Op i has completed; appends the groups that it makes ready to became_ready.
  // REQUIRES: can_complete(i).
  void completed(int i, std::vector<int>* became_ready = nullptr);
  bool is_issued(int i) const { return slots_[i].state >= kIssued; }
  bool is_landed(int i) const { return slots_[i].state >= kLanded; }
  bool is_completed(int i) const { return slots_[i].state == kCompleted; }
  bool done() const { return completed_ == graph_->size(); }

 private:
  enum : uint8_t { kWaiting = 0, kIssued = 1, kLanded = 2, kCompleted = 3 };
  // Op j releases those after it.
  void release(int j, std::vector<int>* became_ready);
  // A broken REQUIRES of reach (op: the cursor), issued, landed or completed: the InternalError
  // of PARASOL_CHECK, raised out of line (the calls are the players' inner loop).
  enum class Broken : uint8_t { kReach, kIssued, kLanded, kCompleted };
  [[noreturn]] void broken(Broken what, int op) const;
  const IssueGraph* graph_ = nullptr;
  IssueRules rules_;
  // Per op, in one record: its state and, at the first op of an issue group, how many releases
  // the group still waits for.
  struct Slot {
    int32_t pending = 0;
    uint8_t state = kWaiting;
  };
  static_assert(sizeof(Slot) == 8);
  std::vector<Slot> slots_;
  int cursor_ = 0;
  int completed_ = 0;
};

// The state's inner loop, inline: the engine calls it a few times per op of a step.
inline bool IssueState::can_reach() const {
  const int c = cursor_;
  if (c >= graph_->size()) return false;
  return !(c > 0 && graph_->is_sync(c - 1) && slots_[c - 1].state != kCompleted);
}

inline void IssueState::reach(std::vector<int>* became_ready) {
  if (!can_reach()) [[unlikely]]
    broken(Broken::kReach, cursor_);
  const int c = cursor_++;
  if (became_ready && graph_->issue_end(c) == cursor_ && ready(c))
    became_ready->push_back(graph_->issue_begin(c));
}

inline void IssueState::release(int j, std::vector<int>* became_ready) {
  auto one_less = [&](int b) {
    Slot& slot = slots_[b];
    if (--slot.pending == 0 && became_ready && graph_->issue_end(b) <= cursor_ &&
        slot.state == kWaiting)
      became_ready->push_back(b);
  };
  for (int d : graph_->dependents(j)) one_less(graph_->issue_begin(d));
  const int nx = graph_->stream_next(graph_->issue_end(j) - 1);
  if (nx >= 0) one_less(nx);  // the first op of the next group on the stream
}

inline void IssueState::issued(int i, std::vector<int>* became_ready) {
  if (!ready(i)) [[unlikely]]
    broken(Broken::kIssued, i);
  const int b = graph_->issue_begin(i), e = graph_->issue_end(i);
  for (int j = b; j < e; ++j) slots_[j].state = kIssued;
  if (rules_.eager_sends)
    for (int j = b; j < e; ++j)
      if (graph_->is_send(j)) release(j, became_ready);
}

inline void IssueState::landed(int i) {
  if (slots_[i].state != kIssued) [[unlikely]]
    broken(Broken::kLanded, i);
  slots_[i].state = kLanded;
}

inline bool IssueState::can_complete(int i) const {
  const uint8_t st = slots_[i].state;
  if (st != kIssued && st != kLanded) return false;
  if (!graph_->is_send(i) && !graph_->is_recv(i)) return true;  // a group of one, no partner
  const int b = graph_->issue_begin(i), e = graph_->issue_end(i);
  if (e - b > 1)
    for (int j = b; j < e; ++j)
      if (j != i && slots_[j].state < kLanded) return false;
  const int p = graph_->partner(i);
  return !(graph_->is_recv(i) && p >= 0 && slots_[p].state < kLanded);
}

inline void IssueState::completed(int i, std::vector<int>* became_ready) {
  if (!can_complete(i)) [[unlikely]]
    broken(Broken::kCompleted, i);
  slots_[i].state = kCompleted;
  ++completed_;
  if (!(rules_.eager_sends && graph_->is_send(i))) release(i, became_ready);
}

}  // namespace parasol
