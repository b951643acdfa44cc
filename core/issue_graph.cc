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
  size_ = static_cast<int>(n);
  nodes_.assign(n + 1, Node{});
  prev_.assign(n, -1);
  waits_.assign(n, 0);
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
  Node& node = nodes_[i];
  if (op.id != i) malformed(program, i, ".id", "is " + std::to_string(op.id));
  node.kind = op.kind == OpKind::kSend   ? kSendOp
              : op.kind == OpKind::kRecv ? kRecvOp
              : op.kind == OpKind::kSync ? kSyncOp
                                         : kOtherOp;
  if (op.stream < 0 || op.stream >= nstreams)
    malformed(program, i, ".stream",
              "bad stream " + std::to_string(op.stream) + " (the Program has " +
                  std::to_string(nstreams) + ")");
  int& l = last_[op.stream];
  prev_[i] = l;
  (l >= 0 ? nodes_[l].next : first_[op.stream]) = i;
  l = i;
  // Issue groups: a p2p group's run of consecutive transfers.
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
      if (nodes_[i - 1].back + 1 >= kMaxIssueGroup)
        malformed(program, i, ".p2p_group",
                  std::to_string(op.p2p_group) + " has more than " +
                      std::to_string(kMaxIssueGroup) + " ops");
      node.back = static_cast<uint8_t>(nodes_[i - 1].back + 1);
    } else {
      if (static_cast<int>(closed_.size()) <= op.p2p_group) closed_.resize(op.p2p_group + 1, 0);
      if (closed_[op.p2p_group])
        malformed(program, i, ".p2p_group",
                  std::to_string(op.p2p_group) + " is not consecutive in the Program");
      closed_[op.p2p_group] = 1;
    }
  }
  const int begin = i - node.back;
  // The group waits for its members' dependencies and the whole group before it on the stream
  // (whose last member is the op before this one on it: a group's members are consecutive).
  waits_[begin] += static_cast<int>(op.deps.size());
  if (begin == i && prev_[i] >= 0) waits_[i] += nodes_[prev_[i]].back + 1;
  for (int d : op.deps) {
    if (d < 0 || d >= i)
      malformed(program, i, ".deps", "bad op id " + std::to_string(d) + " (not an earlier op)");
    if (d >= begin)
      malformed(program, i, ".deps",
                "op " + std::to_string(d) + " is of its own p2p group, issued with it");
    ++nodes_[d + 1].out;  // counted here, made offsets by end()
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
  for (int i = n - 2; i >= 0; --i)
    if (nodes_[i + 1].back > 0) nodes_[i].ahead = static_cast<uint8_t>(nodes_[i + 1].ahead + 1);
  // The dependents (CSR), each list ascending.
  for (int i = 0; i < n; ++i) nodes_[i + 1].out += nodes_[i].out;
  dependents_.resize(nodes_[n].out);
  // Each list filled from its start, its offset moved to its end (the edges, not the Ops again).
  for (const auto& [d, i] : edges_) dependents_[nodes_[d].out++] = i;
  for (int i = n; i > 0; --i) nodes_[i].out = nodes_[i - 1].out;
  nodes_[0].out = 0;
  // The k-th receive of a key with the k-th send.
  for (const auto& [key, list] : recvs_) {
    auto it = sends_.find(key);
    const size_t have = it == sends_.end() ? 0 : it->second.size();
    if (list.size() > have)
      malformed(program, list[have], "",
                "recv (tag " + std::to_string(ops[list[have]].tag) + ") has no matching send");
    for (size_t k = 0; k < list.size(); ++k) {
      nodes_[list[k]].partner = it->second[k];
      nodes_[it->second[k]].partner = list[k];
    }
  }
  for (const auto& [key, list] : sends_)
    for (int i : list)
      if (nodes_[i].partner < 0)
        malformed(program, i, "",
                  "send (tag " + std::to_string(ops[i].tag) + ") has no matching recv");
}

void IssueState::reset(const IssueGraph& graph, IssueRules rules) {
  graph_ = &graph;
  rules_ = rules;
  const std::vector<int>& waits = graph.waits();
  slots_.resize(waits.size());
  for (size_t i = 0; i < waits.size(); ++i) slots_[i] = Slot{waits[i], kWaiting};
  cursor_ = 0;
  completed_ = 0;
}

std::vector<int> IssueState::ready_groups() const {
  std::vector<int> out;
  for (int i = 0; i < cursor_; i = graph_->issue_end(i))
    if (ready(i)) out.push_back(i);
  return out;
}

void IssueState::broken(Broken what, int i) const {
  const std::string op = "op " + std::to_string(i);
  switch (what) {
    case Broken::kReach:
      check_failed("can_reach()", "the host reaches " + op + " too early", __FILE__, __LINE__);
    case Broken::kIssued:
      check_failed("ready(i)", op + " issued before the rules allow", __FILE__, __LINE__);
    case Broken::kLanded:
      check_failed("is_issued(i) && !is_landed(i)", op + " landed twice or unissued", __FILE__,
                   __LINE__);
    case Broken::kCompleted:
      check_failed("can_complete(i)", op + " completed before the rules allow", __FILE__, __LINE__);
  }
  check_failed("false", "unknown broken rule", __FILE__, __LINE__);
}

}  // namespace parasol
