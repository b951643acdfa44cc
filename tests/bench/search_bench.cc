// Benchmarks of the predictor: closed-form plan evaluations per second per core (memory model
// plus time estimate, as the search runs them), and the wall time of full plan searches.
// Run: build/tests/bench/search_bench   (figures are reported as counters, not asserted; the
// target is >= 1,000,000 plans per second per core: plans_per_s of BM_PlanEvaluation and
// plans_per_s_per_thread of BM_Search).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <thread>
#include <vector>

#include "core/cluster.h"
#include "core/model.h"
#include "core/plan.h"
#include "cost_models/estimate.h"
#include "cost_models/memory.h"
#include "sim/search.h"

using namespace parasol;

namespace {

// A fixed mix of valid plans of gpt3-175b on 1,024 A100s that differ where the search varies
// them most (micro-batch, schedule, ZeRO, recompute, offload). With `framework`, the choices the
// search added with the frameworks' features: ZeRO-3 with pp in its three reshard modes, HSDP,
// TP comm overlap and uneven first/last stages.
std::vector<Plan> plan_mix(const Model& m, const Cluster& c, bool framework) {
  std::vector<Plan> plans;
  struct Sharding {
    int zero;
    Reshard reshard;
    int shard_degree;
  };
  std::vector<Sharding> shardings{{0, Reshard::kAfterForward, 0}, {1, Reshard::kAfterForward, 0}};
  if (framework)
    shardings = {{1, Reshard::kAfterForward, 8},
                 {3, Reshard::kAfterForward, 0},
                 {3, Reshard::kAfterBackward, 0},
                 {3, Reshard::kAfterStep, 8}};
  for (int mbs : {1, 2})
    for (const Sharding& z : shardings)
      for (Recompute r : {Recompute::kNone, Recompute::kSelective, Recompute::kFull})
        for (int v : {1, 3}) {
          Plan p;
          p.tp = 8;
          p.pp = 8;
          p.dp = 16;
          p.micro_batch = mbs;
          p.global_batch = 1536;
          p.zero = z.zero;
          p.reshard = z.reshard;
          p.shard_degree = z.shard_degree;
          p.recompute = r;
          p.sequence_parallel = true;
          p.vpp = v;
          p.schedule = v > 1 ? Schedule::kInterleaved : Schedule::k1F1B;
          if (framework) {
            p.tp_comm_overlap = mbs == 1;
            if (v == 1 && r != Recompute::kSelective) {
              p.first_stage_layers = 9;  // 9 + 6 x 13 + 9 = 96
              p.last_stage_layers = 9;
            }
          }
          validate(p, m, c);
          plans.push_back(p);
        }
  return plans;
}

void BM_PlanEvaluation(benchmark::State& state, bool framework) {
  Model m = model_preset("gpt3-175b");
  Cluster c = cluster_preset("dgx-a100-80g", 1024);
  cost::Estimator est(m, c, cost::default_profile(c.gpu_device(0)));
  std::vector<Plan> plans = plan_mix(m, c, framework);
  size_t i = 0;
  for (auto _ : state) {
    const Plan& p = plans[i++ % plans.size()];
    cost::MemoryBreakdown mem = cost::memory_per_rank(m, c, p);
    benchmark::DoNotOptimize(est.estimate(p, mem));
  }
  state.counters["plans_per_s"] =
      benchmark::Counter(state.iterations(), benchmark::Counter::kIsRate);
}
BENCHMARK_CAPTURE(BM_PlanEvaluation, classic, false);
BENCHMARK_CAPTURE(BM_PlanEvaluation, framework, true);

void BM_Search(benchmark::State& state, const char* model, const char* cluster, int gpus, int gbs) {
  Model m = model_preset(model);
  Cluster c = cluster_preset(cluster, gpus);
  cost::Profile prof = cost::default_profile(c.gpu_device(0));
  sim::SearchOptions opt;
  opt.global_batch = gbs;
  int64_t enumerated = 0, fitting = 0;
  double seconds = 0;
  for (auto _ : state) {
    sim::SearchResult r = sim::search(m, c, prof, opt);
    enumerated = r.enumerated;
    fitting = r.fitting;
    seconds = r.seconds;
    benchmark::DoNotOptimize(r.top.data());
  }
  // Per core: the search runs on every hardware thread.
  const double threads = std::max(1u, std::thread::hardware_concurrency());
  state.counters["plans"] = static_cast<double>(enumerated);
  state.counters["estimated"] = static_cast<double>(fitting);
  state.counters["plans_per_s"] = enumerated / seconds;
  state.counters["plans_per_s_per_thread"] = enumerated / seconds / threads;
}
// The README's default search; Megatron-1T style on 3,072 and 16,384 GPUs; Turing-NLG 530B on
// 5,128 GPUs (global batch 2,564 = 4 x 641, since 5,128 = 8 x 641).
BENCHMARK_CAPTURE(BM_Search, gpt3_175b_1024, "gpt3-175b", "dgx-a100-80g", 1024, 1536)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->Iterations(3);
BENCHMARK_CAPTURE(BM_Search, megatron_1t_3072, "megatron-1t", "dgx-a100-80g", 3072, 3072)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->Iterations(2);
BENCHMARK_CAPTURE(BM_Search, megatron_1t_16384, "megatron-1t", "dgx-a100-80g", 16384, 16384)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->Iterations(1);
BENCHMARK_CAPTURE(BM_Search, tnlg_530b_5128, "tnlg-530b", "dgx-a100-80g", 5128, 2564)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->Iterations(3);
// MoE: expert tensor parallelism and the all-to-all overlap.
BENCHMARK_CAPTURE(BM_Search, mixtral_8x7b_64, "mixtral-8x7b", "dgx-h100", 64, 256)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->Iterations(2);

}  // namespace

BENCHMARK_MAIN();
