// Benchmarks of the event simulator: simulated ops per second (the engine alone, on lowered
// Programs), and the wall time to lower and simulate one step of GPT-3 175B on 1,024 A100s
// (TP8 PP8 DP16, 1F1B, 128 micro-batches: gbs 2048, mbs 1).
// Run: build/tests/bench/sim_bench   (figures are reported as counters, not asserted).
#include <benchmark/benchmark.h>

#include "core/cluster.h"
#include "core/liveness.h"
#include "core/lower.h"
#include "core/model.h"
#include "core/plan.h"
#include "cost_models/profile.h"
#include "sim/engine.h"

using namespace parasol;

namespace {

Plan gpt3_plan(const Model& m, const Cluster& c) {
  Plan p;
  p.tp = 8;
  p.pp = 8;
  p.dp = 16;
  p.micro_batch = 1;
  p.global_batch = 2048;
  p.schedule = Schedule::k1F1B;
  p.sequence_parallel = true;
  validate(p, m, c);
  return p;
}

// The engine alone: the Programs are lowered once. Arg 0: a fresh simulate() per step (group
// placements priced each time); 1: one Simulator kept across steps. Both include the liveness
// pass for peak memory (BM_LivenessGpt3_1024 alone).
void BM_SimulateGpt3_1024(benchmark::State& state) {
  Model m = model_preset("gpt3-175b");
  Cluster c = cluster_preset("dgx-a100-80g", 1024);
  cost::Profile prof = cost::default_profile(c.gpu_device(0));
  LoweredPlan lp = lower(m, c, gpt3_plan(m, c));
  sim::Simulator warm(m, c, prof);
  const bool keep = state.range(0) != 0;
  int64_t ops = 0;
  for (auto _ : state) {
    sim::SimResult r = keep ? warm.simulate(lp, false) : sim::simulate(m, c, lp, prof, false);
    ops += r.ops_simulated;
    benchmark::DoNotOptimize(r.step_time_s);
  }
  state.counters["ops_per_step"] =
      static_cast<double>(ops / std::max<int64_t>(1, state.iterations()));
  state.counters["ops_per_s"] =
      benchmark::Counter(static_cast<double>(ops), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_SimulateGpt3_1024)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond);

// The liveness pass (core/liveness.h) over the 8 Programs: part of every simulate().
void BM_LivenessGpt3_1024(benchmark::State& state) {
  Model m = model_preset("gpt3-175b");
  Cluster c = cluster_preset("dgx-a100-80g", 1024);
  LoweredPlan lp = lower(m, c, gpt3_plan(m, c));
  for (auto _ : state)
    for (const Program& p : lp.programs) benchmark::DoNotOptimize(liveness(p).peak_bytes);
}
BENCHMARK(BM_LivenessGpt3_1024)->Unit(benchmark::kMillisecond);

// What `parasol simulate` pays for a plan: lowering plus simulation.
void BM_LowerAndSimulateGpt3_1024(benchmark::State& state) {
  Model m = model_preset("gpt3-175b");
  Cluster c = cluster_preset("dgx-a100-80g", 1024);
  cost::Profile prof = cost::default_profile(c.gpu_device(0));
  Plan p = gpt3_plan(m, c);
  int64_t ops = 0;
  for (auto _ : state) {
    LoweredPlan lp = lower(m, c, p);
    sim::SimResult r = sim::simulate(m, c, lp, prof, false);
    ops += r.ops_simulated;
    benchmark::DoNotOptimize(r.step_time_s);
  }
  state.counters["ops_per_s"] =
      benchmark::Counter(static_cast<double>(ops), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_LowerAndSimulateGpt3_1024)->Unit(benchmark::kMillisecond);

// Lowering alone, to split the figure above.
void BM_LowerGpt3_1024(benchmark::State& state) {
  Model m = model_preset("gpt3-175b");
  Cluster c = cluster_preset("dgx-a100-80g", 1024);
  Plan p = gpt3_plan(m, c);
  for (auto _ : state) benchmark::DoNotOptimize(lower(m, c, p).programs.size());
}
BENCHMARK(BM_LowerGpt3_1024)->Unit(benchmark::kMillisecond);

// The engine with a recorded trace (one event per op).
void BM_SimulateWithTraceGpt3_1024(benchmark::State& state) {
  Model m = model_preset("gpt3-175b");
  Cluster c = cluster_preset("dgx-a100-80g", 1024);
  cost::Profile prof = cost::default_profile(c.gpu_device(0));
  LoweredPlan lp = lower(m, c, gpt3_plan(m, c));
  int64_t ops = 0;
  for (auto _ : state) {
    sim::SimResult r = sim::simulate(m, c, lp, prof, true);
    ops += r.ops_simulated;
    benchmark::DoNotOptimize(r.trace.events.data());
  }
  state.counters["ops_per_s"] =
      benchmark::Counter(static_cast<double>(ops), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_SimulateWithTraceGpt3_1024)->Unit(benchmark::kMillisecond);

// The engine on hand-built GPipe Programs (no lowering): 8 stages x 128 micro-batches x 12
// layers, each layer forward and backward a few GEMMs, element-wise ops and TP collectives on
// the comm stream, sends and recvs between stages, then a DP all-reduce and AdamW.
std::vector<Program> synthetic(int pp, int mbs, int layers) {
  std::vector<Program> progs(pp);
  for (int s = 0; s < pp; ++s) {
    Program& p = progs[s];
    p.stage = s;
    auto add = [&](OpKind kind, int stream, std::vector<int> deps, int mb, Phase ph) {
      Op op;
      op.kind = kind;
      op.name = op_kind_name(kind);
      op.stream = stream;
      op.deps = std::move(deps);
      op.tags.micro_batch = mb;
      op.tags.phase = ph;
      if (kind == OpKind::kLinear) op.m = 2048, op.n = 4608, op.k = 12288;
      if (kind == OpKind::kNorm) op.bytes = 2.0 * 2 * 2048 * 12288;
      if (is_communication(kind)) op.bytes = 2.0 * 2048 * 12288;
      if (kind == OpKind::kSend || kind == OpKind::kRecv) {
        op.group = Group::kPp;
        op.bytes /= 8;
      }
      return p.add_op(std::move(op));
    };
    for (int dir = 0; dir < 2; ++dir)
      for (int mb = 0; mb < mbs; ++mb) {
        Phase ph = dir ? Phase::kBackward : Phase::kForward;
        int prev = -1;
        int from = dir ? s + 1 : s - 1, to = dir ? s - 1 : s + 1;
        if (from >= 0 && from < pp) {
          prev = add(OpKind::kRecv, 1, {}, mb, ph);
          p.ops[prev].peer_stage = from;
        }
        for (int l = 0; l < layers; ++l) {
          int a = add(OpKind::kNorm, 0, prev >= 0 ? std::vector<int>{prev} : std::vector<int>{}, mb,
                      ph);
          int b = add(OpKind::kLinear, 0, {a}, mb, ph);
          int c = add(OpKind::kAllReduce, 1, {b}, mb, ph);
          int d = add(OpKind::kLinear, 0, {c}, mb, ph);
          int e = add(OpKind::kAllReduce, 1, {d}, mb, ph);
          prev = add(OpKind::kResidualAdd, 0, {e}, mb, ph);
          p.ops[prev].bytes = 3.0 * 2 * 2048 * 12288;
        }
        if (to >= 0 && to < pp) {
          int snd = add(OpKind::kSend, 1, {prev}, mb, ph);
          p.ops[snd].peer_stage = to;
        }
      }
    int ar = add(OpKind::kAllReduce, 1, {}, -1, Phase::kBackward);
    p.ops[ar].group = Group::kDpCp;
    p.ops[ar].bytes = 4.0 * 1.8e9;
    int adam = add(OpKind::kAdamW, 0, {ar}, -1, Phase::kOptimizer);
    p.ops[adam].elements = 1.8e9;
  }
  return progs;
}

void BM_EngineSynthetic(benchmark::State& state) {
  Model m = model_preset("gpt3-175b");
  Cluster c = cluster_preset("dgx-a100-80g", 1024);
  cost::Profile prof = cost::default_profile(c.gpu_device(0));
  Plan p;
  p.tp = 8;
  p.pp = 8;
  p.dp = 16;
  p.global_batch = 2048;
  std::vector<Program> progs = synthetic(8, 128, 12);
  sim::Simulator warm(m, c, prof);
  const bool keep = state.range(0) != 0;
  int64_t ops = 0;
  for (auto _ : state) {
    sim::SimResult r =
        keep ? warm.simulate(p, progs, false) : sim::simulate(m, c, p, progs, prof, false);
    ops += r.ops_simulated;
    benchmark::DoNotOptimize(r.step_time_s);
  }
  state.counters["ops_per_step"] =
      static_cast<double>(ops / std::max<int64_t>(1, state.iterations()));
  state.counters["ops_per_s"] =
      benchmark::Counter(static_cast<double>(ops), benchmark::Counter::kIsRate);
}
// Arg 0: a fresh simulate() per step (prices the group placements each time); 1: one Simulator
// kept across steps (placements priced once, as when re-ranking plans).
BENCHMARK(BM_EngineSynthetic)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
