// The execution rules of a Program, stated once: which of a rank's ops may be issued (handed to
// their stream) when. Every player of a Program reads them here: the Chakra export writes the
// graph's edges (traces/chakra_export.cc), the closed form's fragment player plays a layer's ops
// by them (cost_models/layer_fragment.cc), the event engine takes its dependents, stream order
// and ring pairs from the graph (sim/engine.cc; it still keeps its own host cursor and holds a
// stream for a send), and the executor issues and completes ops through an IssueState
// (runtime/executor.cc).
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
//  * sends are eager (core/lower.h): under IssueRules::eager_sends a send frees its stream and
//    the ops that depend on it once issued (the executor's rule: the data is on its way, its
//    buffer is kept until it completes); without it a send holds them until it has completed
//    (the engine's and the fragment player's rule today: the two still differ).
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
  int size() const { return static_cast<int>(prev_.size()); }
  int streams() const { return static_cast<int>(program_->streams.size()); }

  // Op i's dependencies (earlier ops) and the ops that depend on it (later ops, ascending).
  std::span<const int> deps(int i) const { return program_->ops[i].deps; }
  std::span<const int> dependents(int i) const {
    return {dependents_.data() + dependents_off_[i], dependents_.data() + dependents_off_[i + 1]};
  }
  // The op before and after op i on its stream (-1: none); stream s's first op (-1: none).
  int stream_prev(int i) const { return prev_[i]; }
  int stream_next(int i) const { return next_[i]; }
  int stream_first(int s) const { return first_[s]; }
  // The ops issued together with op i: [issue_begin(i), issue_end(i)) in Program order (its p2p
  // group, or the op alone).
  int issue_begin(int i) const { return group_begin_[i]; }
  int issue_end(int i) const { return group_end_[i]; }
  // A receive: the send of this Program it completes with (-1: a pipeline receive, whose send is
  // another stage's). A send: the receive of this Program that pairs with it (-1: none here).
  int partner(int i) const { return partner_[i]; }
  bool is_send(int i) const { return program_->ops[i].kind == OpKind::kSend; }
  bool is_recv(int i) const { return program_->ops[i].kind == OpKind::kRecv; }
  // A device-to-host sync: the host stops at it until it has completed.
  bool is_sync(int i) const { return program_->ops[i].kind == OpKind::kSync; }

 private:
  const Program* program_ = nullptr;
  std::vector<int> prev_, next_, first_;
  std::vector<int> group_begin_, group_end_;
  std::vector<int> partner_;
  std::vector<int> dependents_off_, dependents_;
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

// Where one rank is in a step under the rules: the host's cursor, the ops issued and completed.
// Advanced by reach() (the host reaches the next op), issued(op) and completed(op); answers which
// ops are ready to issue. Not thread-safe.
class IssueState {
 public:
  explicit IssueState(const IssueGraph& graph, IssueRules rules = {});

  // The ops the host has reached: [0, cursor()).
  int cursor() const { return cursor_; }
  // Whether the host may reach the next op: not at the end, not stopped at a sync that has not
  // completed.
  bool can_reach() const;
  // The host reaches op cursor(). REQUIRES: can_reach().
  void reach();
  // Whether the ops issued together with op i (IssueGraph::issue_begin(i)) may be issued now:
  // each reached by the host, not issued, its dependencies and the op before it on its stream
  // completed (or, under eager sends, issued sends).
  bool ready(int i) const;
  // The first op of each issue group ready now, in Program order (a fresh list on each call).
  std::vector<int> ready_groups() const;
  // Issues the ops issued together with op i. REQUIRES: ready(i).
  void issued(int i);
  // Whether issued op i may complete: a receive paired in this Program once its send has.
  bool can_complete(int i) const;
  // Op i has completed. REQUIRES: issued, not completed, can_complete(i).
  void completed(int i);
  bool is_issued(int i) const { return state_[i] >= kIssued; }
  bool is_completed(int i) const { return state_[i] == kCompleted; }
  bool done() const { return completed_ == graph_.size(); }

 private:
  enum : uint8_t { kWaiting = 0, kIssued = 1, kCompleted = 2 };
  // Whether op j releases those after it (its dependents, its stream's next op).
  bool releases(int j) const;
  const IssueGraph& graph_;
  IssueRules rules_;
  std::vector<uint8_t> state_;
  int cursor_ = 0;
  int completed_ = 0;
};

}  // namespace parasol
