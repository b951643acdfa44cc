// The execution rules of a Program, checked once, and a rank's place under them (issue_graph.h).
#include "core/issue_graph.h"

#include <algorithm>
#include <string>

#include "core/error.h"

namespace parasol {

P2pKey p2p_key(int from, int to, const Op& op) {
  const int dir = op.tags.phase == Phase::kBackward ? 1 : 0;
  return op.tag >= 0 ? P2pKey{static_cast<int>(op.group), from, to, op.tag, 0, 0}
                     : P2pKey{static_cast<int>(op.group), from, to, -1, dir, op.tags.micro_batch};
}

namespace {

// A malformed Program: an internal error naming the op ("programs[<stage>].ops[<i>]<field>").
[[noreturn]] void malformed(const Program& p, int i, const std::string& field,
                            const std::string& reason) {
  throw InternalError(
      "programs[" + std::to_string(p.stage) + "].ops[" + std::to_string(i) + "]" + field,
      reason + " ('" + p.ops[i].name + "')");
}

bool p2p(OpKind k) { return k == OpKind::kSend || k == OpKind::kRecv; }

}  // namespace

void IssueGraph::assign(const Program& program) {
  begin(program);
  for (int i = 0; i < size(); ++i) add(i);
  end();
}

void IssueGraph::begin(const Program& program) {
  program_ = &program;
  const auto n = program.ops.size();
  prev_.assign(n, -1);
  next_.assign(n, -1);
  group_begin_.resize(n);
  group_end_.resize(n);
  partner_.assign(n, -1);
  waits_.assign(n, 0);
  kind_.assign(n, kOtherOp);
  dependents_off_.assign(n + 1, 0);
  edges_.clear();
  first_.assign(program.streams.size(), -1);
  last_.assign(program.streams.size(), -1);
  closed_.clear();
  sends_.clear();
  recvs_.clear();
}

void IssueGraph::add(int i) {
  const Program& program = *program_;
  const std::vector<Op>& ops = program.ops;
  const int n = size(), nstreams = streams();
  // The Ops are large and their deps live elsewhere on the heap: fetch ahead.
  if (i + 8 < n) __builtin_prefetch(&ops[i + 8]);
  if (i + 4 < n && !ops[i + 4].deps.empty()) __builtin_prefetch(ops[i + 4].deps.data());
  const Op& op = ops[i];
  if (op.id != i) malformed(program, i, ".id", "is " + std::to_string(op.id));
  kind_[i] = op.kind == OpKind::kSend   ? kSendOp
             : op.kind == OpKind::kRecv ? kRecvOp
             : op.kind == OpKind::kSync ? kSyncOp
                                        : kOtherOp;
  if (op.stream < 0 || op.stream >= nstreams)
    malformed(program, i, ".stream",
              "bad stream " + std::to_string(op.stream) + " (the Program has " +
                  std::to_string(nstreams) + ")");
  int& l = last_[op.stream];
  prev_[i] = l;
  (l >= 0 ? next_[l] : first_[op.stream]) = i;
  l = i;
  // Issue groups: a p2p group's run of consecutive transfers.
  group_begin_[i] = i;
  if (op.p2p_group >= 0) {
    if (!p2p(op.kind))
      malformed(program, i, ".p2p_group",
                std::string("a ") + op_kind_name(op.kind) + " in p2p group " +
                    std::to_string(op.p2p_group));
    const Op* before = i > 0 ? &ops[i - 1] : nullptr;
    if (before && before->p2p_group == op.p2p_group) {
      if (before->stream != op.stream || before->group != op.group)
        malformed(program, i, ".p2p_group",
                  std::to_string(op.p2p_group) + " spans streams or communication groups");
      group_begin_[i] = group_begin_[i - 1];
    } else {
      if (static_cast<int>(closed_.size()) <= op.p2p_group) closed_.resize(op.p2p_group + 1, 0);
      if (closed_[op.p2p_group])
        malformed(program, i, ".p2p_group",
                  std::to_string(op.p2p_group) + " is not consecutive in the Program");
      closed_[op.p2p_group] = 1;
    }
  }
  // The group waits for its members' dependencies and the whole group before it on the stream
  // (whose last member is the op before this one on it: a group's members are consecutive).
  waits_[group_begin_[i]] += static_cast<int>(op.deps.size());
  if (group_begin_[i] == i && prev_[i] >= 0) waits_[i] += prev_[i] + 1 - group_begin_[prev_[i]];
  for (int d : op.deps) {
    if (d < 0 || d >= i)
      malformed(program, i, ".deps", "bad op id " + std::to_string(d) + " (not an earlier op)");
    if (d >= group_begin_[i])
      malformed(program, i, ".deps",
                "op " + std::to_string(d) + " is of its own p2p group, issued with it");
    ++dependents_off_[d + 1];
    edges_.push_back({d, i});
  }
  if (p2p(op.kind)) {
    if (op.group == Group::kPp) {
      if (op.peer_stage < 0 || op.peer_stage == program.stage)
        malformed(program, i, ".peer_stage", "bad peer stage " + std::to_string(op.peer_stage));
    } else {
      const P2pKey key = p2p_key(program.stage, program.stage, op);
      (op.kind == OpKind::kSend ? sends_ : recvs_)[key].push_back(i);
    }
  }
}

void IssueGraph::end() {
  const Program& program = *program_;
  const std::vector<Op>& ops = program.ops;
  const int n = size();
  for (int i = n - 1; i >= 0; --i)
    group_end_[i] = i + 1 < n && group_begin_[i + 1] == group_begin_[i] ? group_end_[i + 1] : i + 1;
  // The dependents (CSR), each list ascending.
  for (int i = 0; i < n; ++i) dependents_off_[i + 1] += dependents_off_[i];
  dependents_.resize(dependents_off_[n]);
  // Each list filled from its start, its offset moved to its end (the edges, not the Ops again).
  for (const auto& [d, i] : edges_) dependents_[dependents_off_[d]++] = i;
  for (int i = n; i > 0; --i) dependents_off_[i] = dependents_off_[i - 1];
  dependents_off_[0] = 0;
  // The k-th receive of a key with the k-th send.
  for (const auto& [key, list] : recvs_) {
    auto it = sends_.find(key);
    const size_t have = it == sends_.end() ? 0 : it->second.size();
    if (list.size() > have)
      malformed(program, list[have], "",
                "recv (tag " + std::to_string(ops[list[have]].tag) + ") has no matching send");
    for (size_t k = 0; k < list.size(); ++k) {
      partner_[list[k]] = it->second[k];
      partner_[it->second[k]] = list[k];
    }
  }
  for (const auto& [key, list] : sends_)
    for (int i : list)
      if (partner_[i] < 0)
        malformed(program, i, "",
                  "send (tag " + std::to_string(ops[i].tag) + ") has no matching recv");
}

void IssueState::reset(const IssueGraph& graph, IssueRules rules) {
  graph_ = &graph;
  rules_ = rules;
  state_.assign(graph.size(), kWaiting);
  pending_ = graph.waits();
  cursor_ = 0;
  completed_ = 0;
}

bool IssueState::can_reach() const {
  if (cursor_ >= graph_->size()) return false;
  return !(cursor_ > 0 && graph_->is_sync(cursor_ - 1) && state_[cursor_ - 1] != kCompleted);
}

void IssueState::reach(std::vector<int>* became_ready) {
  PARASOL_CHECK(can_reach(), "the host reaches op " + std::to_string(cursor_) + " too early");
  const int c = cursor_++;
  if (became_ready && graph_->issue_end(c) == cursor_ && ready(c))
    became_ready->push_back(graph_->issue_begin(c));
}

void IssueState::release(int j, std::vector<int>* became_ready) {
  auto one_less = [&](int b) {
    if (--pending_[b] == 0 && became_ready && graph_->issue_end(b) <= cursor_ &&
        state_[b] == kWaiting)
      became_ready->push_back(b);
  };
  for (int d : graph_->dependents(j)) one_less(graph_->issue_begin(d));
  const int nx = graph_->stream_next(graph_->issue_end(j) - 1);
  if (nx >= 0) one_less(nx);  // the first op of the next group on the stream
}

std::vector<int> IssueState::ready_groups() const {
  std::vector<int> out;
  for (int i = 0; i < cursor_; i = graph_->issue_end(i))
    if (ready(i)) out.push_back(i);
  return out;
}

void IssueState::issued(int i, std::vector<int>* became_ready) {
  PARASOL_CHECK(ready(i), "op " + std::to_string(i) + " issued before the rules allow");
  const int b = graph_->issue_begin(i), e = graph_->issue_end(i);
  for (int j = b; j < e; ++j) state_[j] = kIssued;
  if (rules_.eager_sends)
    for (int j = b; j < e; ++j)
      if (graph_->is_send(j)) release(j, became_ready);
}

void IssueState::landed(int i) {
  PARASOL_CHECK(state_[i] == kIssued, "op " + std::to_string(i) + " landed twice or unissued");
  state_[i] = kLanded;
}

bool IssueState::can_complete(int i) const {
  if (state_[i] != kIssued && state_[i] != kLanded) return false;
  if (!graph_->is_send(i) && !graph_->is_recv(i)) return true;  // a group of one, no partner
  const int b = graph_->issue_begin(i), e = graph_->issue_end(i);
  if (e - b > 1)
    for (int j = b; j < e; ++j)
      if (j != i && state_[j] < kLanded) return false;
  const int p = graph_->partner(i);
  return !(graph_->is_recv(i) && p >= 0 && state_[p] < kLanded);
}

void IssueState::completed(int i, std::vector<int>* became_ready) {
  PARASOL_CHECK(can_complete(i), "op " + std::to_string(i) + " completed before the rules allow");
  state_[i] = kCompleted;
  ++completed_;
  if (!(rules_.eager_sends && graph_->is_send(i))) release(i, became_ready);
}

}  // namespace parasol
