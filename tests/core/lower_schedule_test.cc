// Tests of the pipeline exchanges of lower() under NCCL's semantics: a send completes only once
// its receive is posted, and a communicator runs its calls in order, those of one p2p group
// (Op::p2p_group) together. Every schedule (GPipe, 1F1B, interleaved) must play to completion so,
// on every stage, and the interleaved schedule's exchanges are Megatron's per-iteration batches
// (forward_backward_pipelining_with_interleaving: one batch_isend_irecv per iteration with the
// iteration's sends and the next iteration's receives), whose transfers between two stages come
// in the same order on both sides (NCCL matches them by order, not by tag).
#include <gtest/gtest.h>

#include <deque>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/lower.h"
#include "core/pipeline_schedule.h"
#include "tests/core/test_models.h"

namespace parasol {
namespace {

using test_models::tiny_gpt;

Plan make_plan(int tp, int pp, int cp, int gbs) {
  Plan p;
  p.tp = tp;
  p.pp = pp;
  p.cp = cp;
  p.global_batch = gbs;
  p.micro_batch = 1;
  return p;
}

LoweredPlan lowered(const Model& m, const Plan& p) {
  Cluster c = cluster_preset("dgx-h100", p.gpus());
  validate(p, m, c);
  return lower(m, c, p);
}

bool is_p2p(const Op& o) { return o.kind == OpKind::kSend || o.kind == OpKind::kRecv; }

// Plays all Programs as NCCL runs them (the MPI communicator's strict mode): each stream issues
// its ops in order once their deps have run; a p2p group is issued whole once every member is
// ready; each stage's communicator of a group kind posts its issued groups one at a time, in
// order; a posted send and receive with the same tag that name each other complete together
// (the cp ring's neighbour runs the same Program, so a cp transfer's partner is on its own
// stage); a group completes when all its transfers have. Sends release their stream at once
// (eager), receives hold it until they complete. Returns the ops that never ran.
class NcclPlayer {
 public:
  explicit NcclPlayer(const LoweredPlan& lp) : progs_(lp.programs) {
    for (const Program& p : progs_) {
      Stage st;
      st.queue.assign(p.streams.size(), {});
      st.next.assign(p.streams.size(), 0);
      st.waiting.assign(p.streams.size(), 0);
      st.done.assign(p.ops.size(), 0);
      st.matched.assign(p.ops.size(), 0);
      for (const Op& o : p.ops) st.queue[o.stream].push_back(o.id);
      stages_.push_back(std::move(st));
    }
  }

  int unfinished() {
    bool progress = true;
    while (progress) {
      progress = false;
      for (int s = 0; s < static_cast<int>(stages_.size()); ++s)
        for (size_t st = 0; st < stages_[s].queue.size(); ++st) progress |= issue(s, st);
      progress |= match();
      progress |= complete();
    }
    int left = 0;
    for (const Stage& st : stages_)
      for (char d : st.done) left += d ? 0 : 1;
    return left;
  }

 private:
  struct Stage {
    std::vector<std::vector<int>> queue;  // per stream: op ids in issue order
    std::vector<size_t> next;             // per stream: the next op to issue
    std::vector<int> waiting;             // per stream: receives in flight
    std::vector<char> done, matched;
    std::map<Group, std::deque<std::vector<int>>> comm;  // issued p2p groups, per group kind
  };

  bool ready(int s, const Op& o) const {
    for (int d : o.deps)
      if (!stages_[s].done[d]) return false;
    return true;
  }

  // Issues stream st's ops in order while they are ready; returns whether any was.
  bool issue(int s, size_t st) {
    Stage& g = stages_[s];
    const Program& p = progs_[s];
    bool progress = false;
    while (g.waiting[st] == 0 && g.next[st] < g.queue[st].size()) {
      const Op& o = p.ops[g.queue[st][g.next[st]]];
      size_t end = g.next[st] + 1;
      if (is_p2p(o) && o.p2p_group >= 0)
        while (end < g.queue[st].size()) {
          const Op& m = p.ops[g.queue[st][end]];
          if (!is_p2p(m) || m.p2p_group != o.p2p_group || m.group != o.group) break;
          ++end;
        }
      std::vector<int> members(g.queue[st].begin() + static_cast<long>(g.next[st]),
                               g.queue[st].begin() + static_cast<long>(end));
      for (int id : members)
        if (!ready(s, p.ops[id])) return progress;
      g.next[st] = end;
      progress = true;
      if (!is_p2p(o)) {
        g.done[o.id] = 1;
        continue;
      }
      for (int id : members) {
        if (p.ops[id].kind == OpKind::kSend)
          g.done[id] = 1;
        else
          ++g.waiting[st];
      }
      g.comm[o.group].push_back(std::move(members));
    }
    return progress;
  }

  // The posted (head) group of stage s's communicator of kind g, or null.
  const std::vector<int>* posted(int s, Group g) const {
    auto it = stages_[s].comm.find(g);
    return it == stages_[s].comm.end() || it->second.empty() ? nullptr : &it->second.front();
  }

  // Matches the posted transfers with their posted partners; returns whether any matched.
  bool match() {
    bool progress = false;
    for (int s = 0; s < static_cast<int>(stages_.size()); ++s)
      for (auto& [g, groups] : stages_[s].comm) {
        if (groups.empty()) continue;
        for (int id : groups.front()) {
          const Op& o = progs_[s].ops[id];
          if (o.kind != OpKind::kSend || stages_[s].matched[id]) continue;
          const int peer = g == Group::kPp ? o.peer_stage : s;
          const std::vector<int>* there = posted(peer, g);
          if (there == nullptr) continue;
          for (int r : *there) {
            const Op& q = progs_[peer].ops[r];
            const bool names_us = g != Group::kPp || q.peer_stage == s;
            if (q.kind == OpKind::kRecv && q.tag == o.tag && names_us &&
                !stages_[peer].matched[r]) {
              stages_[s].matched[id] = stages_[peer].matched[r] = 1;
              progress = true;
              break;
            }
          }
        }
      }
    return progress;
  }

  // Retires the posted groups whose transfers have all matched; returns whether any did.
  bool complete() {
    bool progress = false;
    for (int s = 0; s < static_cast<int>(stages_.size()); ++s)
      for (auto& [g, groups] : stages_[s].comm)
        while (!groups.empty()) {
          bool all = true;
          for (int id : groups.front()) all = all && stages_[s].matched[id];
          if (!all) break;
          for (int id : groups.front()) {
            const Op& o = progs_[s].ops[id];
            if (o.kind != OpKind::kRecv) continue;
            stages_[s].done[id] = 1;
            --stages_[s].waiting[o.stream];
          }
          groups.pop_front();
          progress = true;
        }
    return progress;
  }

  const std::vector<Program>& progs_;
  std::vector<Stage> stages_;
};

// NCCL has no tags: between two stages, sends and receives match in issue order. Every stage's
// pipeline sends to a peer must carry the tags, in order, that the peer's receives from it
// expect, in order.
void expect_pipeline_transfers_pair_in_issue_order(const LoweredPlan& lp) {
  std::map<std::pair<int, int>, std::vector<int64_t>> sent, received;  // (from, to) -> tags
  for (const Program& p : lp.programs)
    for (const Op& o : p.ops) {
      if (!is_p2p(o) || o.group != Group::kPp) continue;
      if (o.kind == OpKind::kSend)
        sent[{p.stage, o.peer_stage}].push_back(o.tag);
      else
        received[{o.peer_stage, p.stage}].push_back(o.tag);
    }
  EXPECT_EQ(sent, received);
}

std::string describe(const Plan& p) {
  return std::string(schedule_name(p.schedule)) + " tp" + std::to_string(p.tp) + " pp" +
         std::to_string(p.pp) + " vpp" + std::to_string(p.vpp) + " cp" + std::to_string(p.cp) +
         " m" + std::to_string(p.micro_batches());
}

TEST(LowerSchedule, EverySchedulePlaysToCompletionUnderNcclSemantics) {
  for (Schedule sched : {Schedule::kGpipe, Schedule::k1F1B, Schedule::kInterleaved})
    for (int pp : {2, 3, 4})
      for (int vpp : {1, 2, 3}) {
        if ((sched == Schedule::kInterleaved) != (vpp > 1)) continue;
        for (int mult : {1, 2, 3}) {
          Plan p = make_plan(1, pp, 1, pp * mult);
          p.schedule = sched;
          p.vpp = vpp;
          SCOPED_TRACE(describe(p));
          LoweredPlan lp = lowered(tiny_gpt(pp * vpp), p);
          NcclPlayer player(lp);
          EXPECT_EQ(player.unfinished(), 0);
          expect_pipeline_transfers_pair_in_issue_order(lp);
        }
      }
}

// Megatron's scatter/gather (tp > 1 without SP: each TP rank receives a slice), the cp ring's
// exchanges, and uneven virtual stages.
TEST(LowerSchedule, InterleavedWithTpSlicesCpRingAndUnevenStagesPlaysToCompletion) {
  std::vector<std::pair<Model, Plan>> cases;
  Plan p = make_plan(2, 2, 1, 8);
  p.schedule = Schedule::kInterleaved;
  p.vpp = 2;
  cases.push_back({tiny_gpt(4), p});
  p = make_plan(1, 4, 2, 8);
  p.schedule = Schedule::kInterleaved;
  p.vpp = 2;
  cases.push_back({tiny_gpt(8), p});
  p = make_plan(1, 2, 1, 6);
  p.schedule = Schedule::kInterleaved;
  p.vpp = 2;
  p.stage_layers = {2, 1, 1, 2};
  cases.push_back({tiny_gpt(6), p});
  for (const auto& [m, plan] : cases) {
    SCOPED_TRACE(describe(plan));
    LoweredPlan lp = lowered(m, plan);
    NcclPlayer player(lp);
    EXPECT_EQ(player.unfinished(), 0);
    expect_pipeline_transfers_pair_in_issue_order(lp);
  }
}

// The pipeline p2p groups of a Program in order, each as "s|r" + "F|B" + chunk.mb per transfer.
std::vector<std::string> exchanges(const Program& p) {
  std::vector<std::string> out;
  int group = -2;
  for (const Op& o : p.ops) {
    if (!is_p2p(o) || o.group != Group::kPp) continue;
    std::string t = std::string(o.kind == OpKind::kSend ? "s" : "r") +
                    (o.tags.phase == Phase::kForward ? "F" : "B") + std::to_string(o.tags.chunk) +
                    "." + std::to_string(o.tags.micro_batch);
    if (o.p2p_group >= 0 && o.p2p_group == group) {
      out.back() += " " + t;
    } else {
      out.push_back(t);
    }
    group = o.p2p_group;
  }
  return out;
}

TEST(LowerSchedule, InterleavedExchangesAreMegatronsPerIterationBatches) {
  // pp 2, vpp 2, 4 micro-batches; stage 1 (virtual stages 1 and 3: chunk 1 is the last, whose
  // forward sends nothing and whose backward receives nothing). Its iterations: warm-up F0.0,
  // F0.1; steady (F1.0 B1.0) (F1.1 B1.1) (F0.2 B0.0) (F0.3 B0.1) (F1.2 B1.2) (F1.3 B1.3);
  // cool-down B0.2, B0.3. Worked by hand from forward_backward_pipelining_with_interleaving:
  // recv_forward first, then after each iteration one batch of its sends (send_next, send_prev)
  // and the next iteration's receives (recv_prev, recv_next).
  Plan p = make_plan(1, 2, 1, 4);
  p.schedule = Schedule::kInterleaved;
  p.vpp = 2;
  LoweredPlan lp = lowered(tiny_gpt(4), p);
  const std::vector<std::string> stage1 = {
      "rF0.0",                    // recv_forward
      "sF0.0 rF0.1",              // warm-up: send_forward_recv_forward
      "sF0.1 rF1.0",              // last warm-up: send_forward_backward_recv_forward_backward
      "sB1.0 rF1.1",              // steady: send_forward_backward_recv_forward_backward
      "sB1.1 rF0.2 rB0.0",        //
      "sF0.2 sB0.0 rF0.3 rB0.1",  //
      "sF0.3 sB0.1 rF1.2",        //
      "sB1.2 rF1.3",              //
      "sB1.3 rB0.2",              // last steady: no recv_prev
      "sB0.2 rB0.3",              // cool-down: send_backward_recv_backward
      "sB0.3"};                   //
  EXPECT_EQ(exchanges(lp.programs[1]), stage1);
  // Stage 0 (virtual stages 0 and 2: chunk 0 is the first, whose forward receives nothing and
  // whose backward sends nothing); warm-up F0.0 F0.1 F1.0 F1.1.
  const std::vector<std::string> stage0 = {
      "sF0.0",                    // recv_prev false: F0.1 is chunk 0
      "sF0.1 rF1.0",              //
      "sF1.0 rF1.1",              //
      "sF1.1 rB1.0",              // last warm-up: the first backward's receive too
      "sF0.2 sB1.0 rB1.1",        // steady
      "sF0.3 sB1.1 rF1.2 rB0.0",  //
      "sF1.2 rF1.3 rB0.1",        //
      "sF1.3 rB1.2",              // last steady
      "sB1.2 rB1.3",              // cool-down
      "sB1.3 rB0.2",              //
      "rB0.3"};
  EXPECT_EQ(exchanges(lp.programs[0]), stage0);
  // Two micro-batches: every forward of stage 0 is in its warm-up, and the first backward's
  // receive is a batch of its own (Megatron's recv_backward when all micro-batches are in the
  // warm-up).
  p.global_batch = 2;
  LoweredPlan all_warm = lowered(tiny_gpt(4), p);
  const std::vector<std::string> warm0 = {"sF0.0", "sF0.1 rF1.0", "sF1.0 rF1.1", "sF1.1",
                                          "rB1.0", "sB1.0 rB1.1", "sB1.1 rB0.0", "rB0.1"};
  EXPECT_EQ(exchanges(all_warm.programs[0]), warm0);
}

// 1F1B and GPipe: each unit's send with the next unit's receive (Megatron's
// send_forward_recv_backward and send_backward_recv_forward in 1F1B's steady state).
TEST(LowerSchedule, OneFOneBExchangesPairEachSendWithTheNextReceive) {
  Plan p = make_plan(1, 2, 1, 4);
  p.schedule = Schedule::k1F1B;
  LoweredPlan lp = lowered(tiny_gpt(4), p);
  // Stage 0: warm-up F0, steady (F1 B0) (F2 B1) (F3 B2), cool-down B3; it receives gradients
  // only and sends activations only.
  const std::vector<std::string> stage0 = {"sF0.0", "sF0.1 rB0.0", "sF0.2 rB0.1", "sF0.3 rB0.2",
                                           "rB0.3"};
  EXPECT_EQ(exchanges(lp.programs[0]), stage0);
  const std::vector<std::string> stage1 = {"rF0.0", "sB0.0 rF0.1", "sB0.1 rF0.2", "sB0.2 rF0.3",
                                           "sB0.3"};
  EXPECT_EQ(exchanges(lp.programs[1]), stage1);
}

// Megatron's combined 1F1B (Plan::ep_comm_overlap) runs one more forward in the interleaved
// warm-up (schedules.py get_pp_rank_microbatches L964-970 at d98e8a6) so that every steady step
// pairs a forward with a backward of another micro-batch or chunk: without it the last stage's
// steady steps of the last chunk pair a micro-batch's forward with its own backward, which
// depends on it.
TEST(LowerSchedule, CombinedOneFOneBWarmsUpOneMoreSoNoSteadyStepPairsAUnitWithItself) {
  Plan p = make_plan(1, 4, 1, 16);
  p.schedule = Schedule::kInterleaved;
  p.vpp = 2;
  auto self_pairs = [](const Plan& plan, int s) {
    int n = 0;
    for (const std::vector<PipelineUnit>& step : pipeline_steps(plan, s))
      if (step.size() == 2 && step[0].chunk == step[1].chunk && step[0].mb == step[1].mb) ++n;
    return n;
  };
  EXPECT_GT(self_pairs(p, p.pp - 1), 0);  // Megatron's plain interleaved order
  Plan combined = p;
  combined.ep_comm_overlap = true;
  for (int s = 0; s < p.pp; ++s) {
    EXPECT_EQ(pipeline_warmup_units(combined, s, p.micro_batches()),
              pipeline_warmup_units(p, s, p.micro_batches()) + 1)
        << "stage " << s;
    EXPECT_EQ(self_pairs(combined, s), 0) << "stage " << s;
    EXPECT_EQ(pipeline_units_in_flight(combined, s, p.micro_batches()),
              pipeline_units_in_flight(p, s, p.micro_batches()) + 1)
        << "stage " << s;
  }
  // Every micro-batch in the warm-up: at most the units there are.
  combined.global_batch = 4;
  EXPECT_EQ(pipeline_warmup_units(combined, 0, combined.micro_batches()),
            combined.micro_batches() * combined.vpp);
}

}  // namespace
}  // namespace parasol
