// Plan search: enumerates every valid plan for a model, a cluster and a global batch (all
// factorisations into tp x cp x pp x dp with ep inside dp, sequence parallelism, virtual stages
// and schedules, ZeRO 0-3, micro-batch sizes, recompute policies including partial full
// recompute, offload choices), prunes those that do not fit in memory, ranks the rest by
// predicted throughput with the closed-form estimate, and returns the top K and the Pareto
// front of throughput against memory. Runs on every core.
#pragma once

#include <functional>
#include <vector>

#include "core/cluster.h"
#include "core/model.h"
#include "core/plan.h"
#include "cost_models/estimate.h"
#include "cost_models/profile.h"

namespace parasol::sim {

struct SearchOptions {
  int global_batch = 0;  // required
  int64_t seq_len = 0;   // 0 = model.seq_len
  int top_k = 10;
  int threads = 0;  // 0 = all hardware threads
  Dtype precision = Dtype::kBf16;
  bool flash_attention = true;
  int max_tp = 0;  // 0 = GPUs per server (TP groups stay inside a server)
  bool search_offload = true;
  // Called now and then with the fraction of the space done (from one thread at a time).
  std::function<void(double)> progress;
};

struct Candidate {
  Plan plan;
  cost::Estimate estimate;
  double simulated_step_s = 0;  // set by resimulate_top(); 0 when not simulated
};

struct SearchResult {
  std::vector<Candidate> top;     // best first, by tokens/s
  std::vector<Candidate> pareto;  // fitting plans no other beats in both tokens/s and memory
  int64_t enumerated = 0;         // valid plans considered
  int64_t evaluated = 0;          // plans whose time was estimated (they fit)
  int64_t fitting = 0;
  double seconds = 0;  // wall time
};

SearchResult search(const Model& model, const Cluster& cluster, const cost::Profile& profile,
                    const SearchOptions& options);

// DESIGN's second pass: lowers the first `count` plans of `result.top` to Programs, plays them
// with the event simulator, and re-orders those plans by simulated step time (the rest keep
// their closed-form order after them).
void resimulate_top(const Model& model, const Cluster& cluster, const cost::Profile& profile,
                    int count, SearchResult& result);

}  // namespace parasol::sim
