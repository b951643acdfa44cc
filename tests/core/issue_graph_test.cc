// Tests core/issue_graph.h: the execution rules on a hand-made Program, a property test (on random
// small valid Programs every order the issue state allows respects every edge of the rules, read
// from the Program by an independent loop, and always runs to the end), malformed Programs as
// internal errors, and the lowering's Programs as valid ones that play to the end.
#include "core/issue_graph.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "core/cluster.h"
#include "core/error.h"
#include "core/lower.h"
#include "core/model.h"
#include "test_models.h"

namespace parasol {
namespace {

constexpr int kCompute = 0, kComm = 1, kCopy = 2, kHostStream = 3;

Program empty_program() {
  Program p;
  p.streams = {StreamKind::kCompute, StreamKind::kComm, StreamKind::kCopy, StreamKind::kHost};
  return p;
}

int add(Program& p, OpKind kind, int stream, std::vector<int> deps = {}) {
  Op op;
  op.kind = kind;
  op.stream = stream;
  op.deps = std::move(deps);
  op.name = std::string(op_kind_name(kind)) + std::to_string(p.ops.size());
  return p.add_op(op);
}

int add_p2p(Program& p, OpKind kind, Group g, int64_t tag, int group, std::vector<int> deps = {}) {
  const int id = add(p, kind, kComm, std::move(deps));
  Op& op = p.ops[id];
  op.group = g;
  op.tag = tag;
  op.p2p_group = group;
  op.peer_stage = g == Group::kPp ? 1 : -1;
  return id;
}

template <typename Fn>
void ExpectInternal(Fn fn, const std::string& substring) {
  try {
    fn();
    ADD_FAILURE() << "expected an internal error with '" << substring << "'";
  } catch (const InternalError& e) {
    EXPECT_NE(std::string(e.what()).find(substring), std::string::npos)
        << "'" << e.what() << "' lacks '" << substring << "'";
  }
}

TEST(IssueGraph, StreamOrderGroupsAndPairs) {
  Program p = empty_program();
  const int a = add(p, OpKind::kLinear, kCompute);                 // 0
  const int b = add(p, OpKind::kAllReduce, kComm, {a});            // 1
  const int c = add(p, OpKind::kLinear, kCompute);                 // 2
  const int s = add_p2p(p, OpKind::kSend, Group::kCp, 7, 0, {a});  // 3
  const int r = add_p2p(p, OpKind::kRecv, Group::kCp, 7, 0);       // 4
  const int q = add_p2p(p, OpKind::kRecv, Group::kPp, 3, -1);      // 5
  const int y = add(p, OpKind::kSync, kHostStream, {c});           // 6
  const IssueGraph g(p);
  EXPECT_EQ(g.stream_prev(c), a);
  EXPECT_EQ(g.stream_next(a), c);
  EXPECT_EQ(g.stream_prev(s), b);
  EXPECT_EQ(g.stream_prev(q), r);
  EXPECT_EQ(g.stream_prev(y), -1);
  EXPECT_EQ(g.stream_first(kCompute), a);
  EXPECT_EQ(g.stream_first(kComm), b);
  EXPECT_EQ(g.stream_first(kCopy), -1);
  EXPECT_EQ(g.stream_first(kHostStream), y);
  EXPECT_EQ(g.issue_begin(r), s);
  EXPECT_EQ(g.issue_end(s), r + 1);
  EXPECT_EQ(g.issue_begin(q), q);
  EXPECT_EQ(g.issue_end(q), q + 1);
  EXPECT_EQ(g.partner(r), s);
  EXPECT_EQ(g.partner(s), r);
  EXPECT_EQ(g.partner(q), -1);  // a pipeline receive: its send is another stage's
  ASSERT_EQ(g.dependents(a).size(), 2u);
  EXPECT_EQ(g.dependents(a)[0], b);
  EXPECT_EQ(g.dependents(a)[1], s);
  // Built op by op (as the engine does, in its own pass over the Ops): the same graph.
  IssueGraph h;
  h.begin(p);
  for (int i = 0; i < static_cast<int>(p.ops.size()); ++i) {
    h.add(i);
    EXPECT_EQ(h.stream_prev(i), g.stream_prev(i));
    EXPECT_EQ(h.issue_begin(i), g.issue_begin(i));
  }
  h.end();
  for (int i = 0; i < static_cast<int>(p.ops.size()); ++i) {
    EXPECT_EQ(h.stream_next(i), g.stream_next(i));
    EXPECT_EQ(h.issue_end(i), g.issue_end(i));
    EXPECT_EQ(h.partner(i), g.partner(i));
    EXPECT_TRUE(std::ranges::equal(h.dependents(i), g.dependents(i)));
  }

  IssueState st(g);
  EXPECT_FALSE(st.ready(a));  // not reached by the host
  st.reach();
  EXPECT_TRUE(st.ready(a));
  st.issued(a);
  while (st.can_reach()) st.reach();
  EXPECT_EQ(st.cursor(), p.ops.size());
  EXPECT_FALSE(st.ready(b));  // its dependency runs
  EXPECT_FALSE(st.ready(c));  // the op before it on its stream runs
  st.completed(a);
  EXPECT_EQ(st.ready_groups(), (std::vector<int>{b, c}));
  st.issued(b);
  EXPECT_FALSE(st.ready(s));  // the stream's all-reduce runs
  st.completed(b);
  EXPECT_TRUE(st.ready(r));  // the group is ready as one
  st.issued(r);
  EXPECT_TRUE(st.is_issued(s));
  EXPECT_FALSE(st.can_complete(r));  // with its send
  EXPECT_FALSE(st.can_complete(s));  // the group completes as a whole
  st.landed(s);
  EXPECT_FALSE(st.can_complete(s));
  st.landed(r);
  st.completed(s);
  EXPECT_FALSE(st.ready(q));  // the op after the group on its stream waits for every member
  st.completed(r);
  EXPECT_TRUE(st.ready(q));
}

TEST(IssueState, HostStopsAtASyncUntilItCompletes) {
  Program p = empty_program();
  const int a = add(p, OpKind::kLinear, kCompute);
  const int y = add(p, OpKind::kSync, kHostStream, {a});
  const int b = add(p, OpKind::kLinear, kCompute);
  const IssueGraph g(p);
  IssueState st(g);
  st.reach();
  st.reach();
  EXPECT_FALSE(st.can_reach());  // at the sync
  st.issued(a);
  st.completed(a);
  st.issued(y);
  EXPECT_FALSE(st.can_reach());
  st.completed(y);
  ASSERT_TRUE(st.can_reach());
  st.reach();
  st.issued(b);
  st.completed(b);
  EXPECT_TRUE(st.done());
}

TEST(IssueState, EagerSendsFreeTheirStreamAtIssue) {
  Program p = empty_program();
  const int snd = add_p2p(p, OpKind::kSend, Group::kPp, 1, -1);
  const int after = add(p, OpKind::kAllGather, kComm);
  const int user = add(p, OpKind::kLinear, kCompute, {snd});
  const IssueGraph g(p);
  for (bool eager : {false, true}) {
    IssueState st(g, {eager});
    for (int i = 0; i < 3; ++i) st.reach();
    st.issued(snd);
    EXPECT_EQ(st.ready(after), eager);
    EXPECT_EQ(st.ready(user), eager);
    EXPECT_THROW(eager ? st.completed(after) : st.issued(after), InternalError);
  }
}

// A random small valid Program: compute and copies, collectives, host syncs, ring exchanges (a
// send and its receive in one p2p group) and pipeline transfers, each with random dependencies on
// earlier ops outside its own group.
Program random_program(std::mt19937& rng) {
  Program p = empty_program();
  std::uniform_int_distribution<int> len(1, 24), pick(0, 9);
  const int target = len(rng);
  int groups = 0;
  int64_t tag = 0;
  auto deps = [&](int upto) {
    std::vector<int> d;
    for (int j = 0; j < upto; ++j)
      if (std::uniform_int_distribution<int>(0, 3)(rng) == 0) d.push_back(j);
    return d;
  };
  while (static_cast<int>(p.ops.size()) < target) {
    const int n = static_cast<int>(p.ops.size());
    switch (pick(rng)) {
      case 0:
      case 1:
      case 2:
        add(p, OpKind::kLinear, kCompute, deps(n));
        break;
      case 3:
        add(p, OpKind::kOffload, kCopy, deps(n));
        break;
      case 4:
        add(p, OpKind::kAllReduce, kComm, deps(n));
        break;
      case 5:
        add(p, OpKind::kSync, kHostStream, deps(n));
        break;
      case 6:
      case 7: {  // a ring exchange: one p2p group
        const int grp = groups++;
        add_p2p(p, OpKind::kSend, Group::kCp, tag, grp, deps(n));
        add_p2p(p, OpKind::kRecv, Group::kCp, tag++, grp, deps(n));
        break;
      }
      case 8: {  // a pipeline send and receive, grouped or not
        const int grp = pick(rng) < 5 ? groups++ : -1;
        add_p2p(p, OpKind::kSend, Group::kPp, tag++, grp, deps(n));
        add_p2p(p, OpKind::kRecv, Group::kPp, tag++, grp, deps(n));
        break;
      }
      default:
        add_p2p(p, OpKind::kRecv, Group::kPp, tag++, -1, deps(n));
    }
  }
  return p;
}

// Plays `p` under the state, each step a random choice among what it allows; checks every edge of
// the rules as the Program states them (an independent reading, not the graph's) in the order,
// and that the groups the state reports as they become ready are the ones ready_groups() finds.
void play_randomly(const Program& p, bool eager, std::mt19937& rng) {
  const IssueGraph g(p);
  IssueState st(g, {eager});
  const int n = static_cast<int>(p.ops.size());
  std::vector<int> reached(n, -1), issued(n, -1), landed(n, -1), completed(n, -1);
  std::vector<int> reported, became;  // ready groups as reported, not yet issued
  auto take = [&] {
    for (int b : became) {
      EXPECT_EQ(std::count(reported.begin(), reported.end(), b), 0) << "group " << b << " twice";
      reported.push_back(b);
    }
    became.clear();
  };
  int clock = 0;
  while (!st.done()) {
    std::vector<int> sorted = reported;
    std::sort(sorted.begin(), sorted.end());
    ASSERT_EQ(sorted, st.ready_groups()) << "at clock " << clock;
    // {0, -}: reach; {1, i}: issue group i; {2, i}: op i lands; {3, i}: complete op i.
    std::vector<std::pair<int, int>> actions;
    if (st.can_reach()) actions.push_back({0, 0});
    for (int i : st.ready_groups()) actions.push_back({1, i});
    for (int i = 0; i < n; ++i) {
      if (st.is_issued(i) && !st.is_landed(i)) actions.push_back({2, i});
      if (st.can_complete(i)) actions.push_back({3, i});
    }
    ASSERT_FALSE(actions.empty()) << "stuck at clock " << clock;
    const auto [what, i] =
        actions[std::uniform_int_distribution<size_t>(0, actions.size() - 1)(rng)];
    ++clock;
    if (what == 0) {
      reached[st.cursor()] = clock;
      st.reach(&became);
    } else if (what == 1) {
      st.issued(i, &became);
      reported.erase(std::find(reported.begin(), reported.end(), i));
      for (int j = 0; j < n; ++j)
        if (st.is_issued(j) && issued[j] < 0) issued[j] = clock;
    } else if (what == 2) {
      st.landed(i);
      landed[i] = clock;
    } else {
      st.completed(i, &became);
      completed[i] = clock;
    }
    take();
  }
  // The rules, read from the Program.
  auto released = [&](int j) {
    return eager && p.ops[j].kind == OpKind::kSend ? issued[j] : completed[j];
  };
  auto landed_at = [&](int j) { return landed[j] >= 0 ? landed[j] : completed[j]; };
  // The ops of op j's p2p group (consecutive, one p2p_group), or j alone.
  auto group_of = [&](int j) {
    int b = j, e = j + 1;
    if (p.ops[j].p2p_group >= 0) {
      while (b > 0 && p.ops[b - 1].p2p_group == p.ops[j].p2p_group) --b;
      while (e < n && p.ops[e].p2p_group == p.ops[j].p2p_group) ++e;
    }
    return std::pair<int, int>{b, e};
  };
  std::vector<int> last(p.streams.size(), -1);
  for (int i = 0; i < n; ++i) {
    const Op& op = p.ops[i];
    SCOPED_TRACE("op " + std::to_string(i) + " " + op.name);
    // Issued together with its p2p group's other members, completed once all have landed.
    const bool with_before = i > 0 && op.p2p_group >= 0 && p.ops[i - 1].p2p_group == op.p2p_group;
    if (with_before) {
      EXPECT_EQ(issued[i], issued[i - 1]);
    }
    const auto [gb, ge] = group_of(i);
    if (ge - gb > 1)
      for (int j = gb; j < ge; ++j)
        if (j != i) EXPECT_LT(landed_at(j), completed[i]) << "group member " << j;
    EXPECT_LT(reached[i], issued[i]);
    EXPECT_LT(issued[i], completed[i]);
    if (i > 0) {
      EXPECT_LT(reached[i - 1], reached[i]);
    }
    if (i > 0 && p.ops[i - 1].kind == OpKind::kSync) {
      EXPECT_LT(completed[i - 1], reached[i]);
    }
    for (int d : op.deps) EXPECT_LT(released(d), issued[i]) << "dep " << d;
    const int prev = last[op.stream];
    if (prev >= 0 && !with_before) {
      const auto [pb, pe] = group_of(prev);
      for (int j = pb; j < pe; ++j) EXPECT_LT(released(j), issued[i]) << "stream after " << j;
    }
    last[op.stream] = i;
    if (op.kind == OpKind::kRecv && op.group != Group::kPp) {
      int snd = -1;
      for (int j = 0; j < n; ++j)
        if (p.ops[j].kind == OpKind::kSend && p.ops[j].tag == op.tag && p.ops[j].group == op.group)
          snd = j;
      ASSERT_GE(snd, 0);
      EXPECT_LT(landed_at(snd), completed[i]);
    }
  }
}

TEST(IssueState, EveryOrderItAllowsRespectsEveryEdgeOfRandomPrograms) {
  std::mt19937 rng(46);
  for (int trial = 0; trial < 400; ++trial) {
    const Program p = random_program(rng);
    for (bool eager : {false, true}) {
      SCOPED_TRACE("trial " + std::to_string(trial) + (eager ? " eager" : " held"));
      for (int order = 0; order < 3; ++order) play_randomly(p, eager, rng);
      if (HasFatalFailure() || HasFailure()) return;
    }
  }
}

TEST(IssueGraph, MalformedProgramsAreInternalErrors) {
  auto base = [] {
    Program p = empty_program();
    add(p, OpKind::kLinear, kCompute);
    add_p2p(p, OpKind::kSend, Group::kCp, 1, 0, {0});
    add_p2p(p, OpKind::kRecv, Group::kCp, 1, 0);
    add(p, OpKind::kLinear, kCompute, {2});
    return p;
  };
  EXPECT_NO_THROW(IssueGraph{base()});
  {
    Program p = base();
    p.ops[3].stream = 9;
    ExpectInternal([&] { IssueGraph g(p); }, "bad stream 9");
  }
  {
    Program p = base();
    p.ops[0].deps = {3};
    ExpectInternal([&] { IssueGraph g(p); }, "not an earlier op");
  }
  {
    Program p = base();
    p.ops[3].deps = {3};
    ExpectInternal([&] { IssueGraph g(p); }, "not an earlier op");
  }
  {
    Program p = base();
    p.ops[3].deps = {-1};
    ExpectInternal([&] { IssueGraph g(p); }, "not an earlier op");
  }
  {
    Program p = base();
    p.ops[2].deps = {1};  // the receive waits for the send it is issued with
    ExpectInternal([&] { IssueGraph g(p); }, "of its own p2p group");
  }
  {
    Program p = base();
    p.ops[0].p2p_group = 0;  // a GEMM in a p2p group
    ExpectInternal([&] { IssueGraph g(p); }, "in p2p group 0");
  }
  {
    Program p = base();
    p.ops[2].stream = kCopy;
    ExpectInternal([&] { IssueGraph g(p); }, "spans streams");
  }
  {
    Program p = base();
    add_p2p(p, OpKind::kSend, Group::kCp, 2, 0);  // group 0 again, after a GEMM
    add_p2p(p, OpKind::kRecv, Group::kCp, 2, 0);
    ExpectInternal([&] { IssueGraph g(p); }, "not consecutive");
  }
  {
    Program p = base();
    p.ops[2].tag = 5;  // a ring receive without its send
    ExpectInternal([&] { IssueGraph g(p); }, "no matching");
  }
  {
    Program p = base();
    p.ops[1].tag = 5;  // a ring send without its receive
    ExpectInternal([&] { IssueGraph g(p); }, "no matching");
  }
  {
    Program p = base();
    add_p2p(p, OpKind::kSend, Group::kPp, 9, -1);
    p.ops.back().peer_stage = p.stage;  // to itself
    ExpectInternal([&] { IssueGraph g(p); }, "bad peer stage");
  }
  {
    Program p = base();
    p.ops[1].id = 7;
    ExpectInternal([&] { IssueGraph g(p); }, "is 7");
  }
  // A p2p group's members are counted in a byte of the graph's per-op record: the largest group
  // is accepted, with its offsets right, and one more member is refused.
  auto ring_group = [](int pairs) {
    Program p = empty_program();
    for (int k = 0; k < pairs; ++k) {
      add_p2p(p, OpKind::kSend, Group::kCp, k, 0);
      add_p2p(p, OpKind::kRecv, Group::kCp, k, 0);
    }
    return p;
  };
  {
    Program p = ring_group(IssueGraph::kMaxIssueGroup / 2);  // 254 ops
    add_p2p(p, OpKind::kSend, Group::kCp, 999, 0);           // the 255th
    add_p2p(p, OpKind::kRecv, Group::kCp, 999, 1);           // a group of its own
    IssueGraph g(p);
    EXPECT_EQ(g.issue_begin(254), 0);
    EXPECT_EQ(g.issue_end(0), IssueGraph::kMaxIssueGroup);
    EXPECT_EQ(g.issue_begin(255), 255);
    EXPECT_EQ(g.partner(254), 255);
  }
  {
    Program p = ring_group(IssueGraph::kMaxIssueGroup / 2 + 1);  // 256 ops
    ExpectInternal([&] { IssueGraph g(p); }, "has more than 255 ops");
  }
}

// The lowering's Programs follow the rules, and a greedy play (host ahead, everything issued as
// soon as it may be, completed in issue order) runs each to the end (a pipeline receive completes
// on its own here: its send is another Program's).
TEST(IssueGraph, LoweredProgramsFollowTheRules) {
  struct Case {
    const char* what;
    Model m;
    Plan p;
  };
  std::vector<Case> cases;
  auto plan = [](int tp, int pp, int dp, int cp, int gbs) {
    Plan p;
    p.tp = tp, p.pp = pp, p.dp = dp, p.cp = cp, p.global_batch = gbs, p.micro_batch = 1;
    return p;
  };
  cases.push_back({"1f1b", test_models::tiny_gpt(4), plan(2, 2, 2, 1, 8)});
  Plan inter = plan(1, 2, 1, 1, 8);
  inter.schedule = Schedule::kInterleaved;
  inter.vpp = 2;
  cases.push_back({"interleaved", test_models::tiny_gpt(4), inter});
  Plan sync = plan(1, 2, 1, 1, 4);
  sync.p2p_sync = true;
  cases.push_back({"p2p_sync", test_models::tiny_gpt(4), sync});
  cases.push_back({"ring", test_models::tiny_gpt(2), plan(1, 1, 1, 2, 2)});
  Plan gpipe = plan(1, 2, 2, 1, 8);
  gpipe.schedule = Schedule::kGpipe;
  gpipe.zero = 3;
  cases.push_back({"gpipe zero3", test_models::tiny_gpt(4), gpipe});
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    const Cluster cl = cluster_preset("dgx-h100", c.p.gpus());
    validate(c.p, c.m, cl);
    const LoweredPlan lp = lower(c.m, cl, c.p);
    for (const Program& prog : lp.programs) {
      const IssueGraph g(prog);
      for (bool eager : {false, true}) {
        IssueState st(g, {eager});
        std::vector<int> flying;
        while (!st.done()) {
          bool moved = false;
          while (st.can_reach()) st.reach(), moved = true;
          for (int i : st.ready_groups()) {
            st.issued(i);
            for (int j = g.issue_begin(i); j < g.issue_end(i); ++j) flying.push_back(j);
            moved = true;
          }
          for (int j : flying)
            if (!st.is_landed(j)) st.landed(j), moved = true;
          for (size_t k = 0; k < flying.size();)
            if (st.can_complete(flying[k])) {
              st.completed(flying[k]);
              flying.erase(flying.begin() + static_cast<long>(k));
              moved = true;
            } else {
              ++k;
            }
          ASSERT_TRUE(moved) << "stuck at stage " << prog.stage;
        }
      }
    }
  }
}

}  // namespace
}  // namespace parasol
