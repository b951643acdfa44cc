// Benchmarks of `parasol sweep` (tools/sweep.h): points per second for GPT-3 175B on DGX A100
// and Llama 3 70B on DGX H100 clusters of 1,024, 4,096 and 16,384 GPUs (a full plan search at
// each point), on 1 and 2 threads. The baseline, run in the same process, is the same points
// searched one after the other with every thread inside each search (what `parasol search`
// does per cluster); the sweep instead runs points side by side, one search thread each.
// Run: build/tests/bench/sweep_bench --benchmark_counters_tabular=true
// (about 3 minutes on two cores; figures are counters, not asserted).
#include <benchmark/benchmark.h>

#include "tools/sweep.h"

using namespace parasol;
using namespace parasol::tools;

namespace {

SweepSpec spec_of(const std::string& model, const std::string& cluster, int gbs) {
  SweepSpec s;
  s.model = model;
  s.cluster = cluster;
  s.search.gbs = gbs;
  s.axes.push_back(parse_sweep_axis("gpus=1024,4096,16384"));
  prepare_sweep(s);
  return s;
}

// The sweep's runner: points side by side, `threads` workers.
void BM_Sweep(benchmark::State& state, const std::string& model, const std::string& cluster,
              int gbs) {
  const SweepSpec s = spec_of(model, cluster, gbs);
  SweepRunOptions o;
  o.threads = static_cast<int>(state.range(0));
  int64_t points = 0;
  for (auto _ : state) {
    std::vector<Json> rows = run_sweep(s, o);
    points += static_cast<int64_t>(rows.size());
    benchmark::DoNotOptimize(rows);
  }
  state.counters["points_per_s"] =
      benchmark::Counter(static_cast<double>(points), benchmark::Counter::kIsRate);
}

// The baseline: each point's search on all `threads`, one point after the other.
void BM_SearchEachPoint(benchmark::State& state, const std::string& model,
                        const std::string& cluster, int gbs) {
  const SweepSpec s = spec_of(model, cluster, gbs);
  const int threads = static_cast<int>(state.range(0));
  int64_t points = 0;
  for (auto _ : state) {
    for (int64_t i = 0; i < sweep_point_count(s); ++i) {
      benchmark::DoNotOptimize(run_sweep_point(s, i, threads));
      ++points;
    }
  }
  state.counters["points_per_s"] =
      benchmark::Counter(static_cast<double>(points), benchmark::Counter::kIsRate);
}

}  // namespace

BENCHMARK_CAPTURE(BM_SearchEachPoint, gpt3_175b_a100, "gpt3-175b", "dgx-a100-80g", 1536)
    ->Arg(1)
    ->Arg(2)
    ->Iterations(1)
    ->Unit(benchmark::kSecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_Sweep, gpt3_175b_a100, "gpt3-175b", "dgx-a100-80g", 1536)
    ->Arg(1)
    ->Arg(2)
    ->Iterations(1)
    ->Unit(benchmark::kSecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_SearchEachPoint, llama3_70b_h100, "llama3-70b", "dgx-h100", 1024)
    ->Arg(1)
    ->Arg(2)
    ->Iterations(1)
    ->Unit(benchmark::kSecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_Sweep, llama3_70b_h100, "llama3-70b", "dgx-h100", 1024)
    ->Arg(1)
    ->Arg(2)
    ->Iterations(1)
    ->Unit(benchmark::kSecond)
    ->UseRealTime();

BENCHMARK_MAIN();
