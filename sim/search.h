// Plan search: enumerates the valid plans for a model, a cluster and a global batch (all
// factorisations into tp x cp x pp x dp with ep inside dp, or beside it under expert tensor
// parallelism; sequence parallelism and TP communication overlap; virtual stages, schedules and
// Megatron's uneven first/last pipeline stages; ZeRO 0-3 with ZeRO-3's reshard modes and HSDP;
// micro-batch sizes; recompute policies including partial full recompute; the expert all-to-all
// overlap; offload where a plan needs it to fit), prunes those that do not fit in device or host
// memory, ranks the rest with the closed-form estimate (by step time, or by a caller's key), and
// returns the top K and the Pareto front of that key against memory. Runs on every core.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "core/cluster.h"
#include "core/model.h"
#include "core/plan.h"
#include "cost_models/estimate.h"
#include "cost_models/profile.h"

namespace parasol::sim {

// A ranking key: lower ranks first. Called from the worker threads concurrently; it must be
// thread-safe and a pure function of its arguments (the top list is then deterministic).
using RankKey = std::function<double(const Plan&, const cost::Estimate&)>;

struct SearchOptions {
  int global_batch = 0;  // required
  int64_t seq_len = 0;   // 0 = model.seq_len
  int top_k = 10;
  int threads = 0;  // 0 = all hardware threads
  Dtype precision = Dtype::kBf16;
  bool flash_attention = true;
  int max_tp = 0;  // 0 = GPUs per server (TP groups stay inside a server)
  // Offload is tried only for plans that do not fit in device memory without it, and only the
  // smallest sets that make a plan fit (a superset of a set that fits is never tried).
  bool search_offload = true;
  // A plan fits when the device memory it needs as nvidia-smi would show it, at the high end of
  // its reserved band (cost_models/framework_memory.h: the caching allocator's fragmentation at
  // the top of its range), plus this margin is at most the device's memory (`search
  // --memory-margin`, bytes).
  double memory_margin_bytes = 0;
  // torchtitan's op-level selective recompute (Recompute::kSelectiveOp) among the recompute
  // policies, on the plans validate() accepts it for (dense Llama blocks, flash attention, cp 1,
  // sequence-parallel tp). `search --framework` turns it off for a framework that cannot run it
  // (Megatron and DeepSpeed: their exports refuse it).
  bool selective_op = true;
  // Whose tensor-parallel layers the tp > 1 plans run (Plan::tp_impl). `search --framework` sets
  // the framework's (interop::framework_tp_impl: PyTorch's for torchtitan).
  TpImpl tp_impl = TpImpl::kMegatron;
  // Whose context parallelism the cp > 1 plans run (Plan::cp_impl). `search --framework` sets the
  // framework's (interop::framework_cp_impl: PyTorch's for torchtitan).
  CpImpl cp_impl = CpImpl::kTransformerEngine;
  // The ranking key; empty = the estimated step time (seconds). `search --robust` passes the
  // pessimistic end of the plan's error band.
  RankKey rank_key;
  // Which plans may be listed; empty = all. A rejected plan is neither in the top list nor on the
  // Pareto front (`search --framework`: the plans a framework can run). Called from the worker
  // threads concurrently (thread-safe, pure), and only for plans that would enter a list, so it
  // may cost microseconds.
  std::function<bool(const Plan&)> accept;
  // Called now and then with the fraction of the space done (from one thread at a time).
  std::function<void(double)> progress;
  // Testing and tools: called with every plan the search enumerates and whether it fit in
  // device and host memory, from the worker threads concurrently (use threads = 1 to observe
  // the enumeration order).
  std::function<void(const Plan&, bool fits)> on_plan;
};

struct Candidate {
  Plan plan;
  cost::Estimate estimate;
  double score = 0;             // the ranking key's value (lower is better; step time by default)
  double simulated_step_s = 0;  // set by resimulate_top(); 0 when not simulated
  double simulated_compute_s = 0;  // and the simulation's compute on its critical stage
};

struct SearchResult {
  // Best first: by score, then by offloaded bytes (less first), then by memory per GPU, then in
  // enumeration order (so the list does not depend on the thread count).
  std::vector<Candidate> top;
  std::vector<Candidate> pareto;  // fitting plans no other beats in both score and memory
  int64_t enumerated = 0;         // valid plans considered
  int64_t evaluated = 0;          // plans whose time was estimated (they fit)
  int64_t fitting = 0;
  // Plans dropped because their reserved memory at the top of its band does not fit the device
  // (with the margin) although their allocated bytes with what is outside the allocator would
  // (cost::MemoryFit::kNotByReserved), offload sets tried for them included.
  int64_t not_by_reserved = 0;
  double seconds = 0;  // wall time
};

// REQUIRES: options.global_batch >= 1 and options.top_k >= 1 (else throws parasol::Error).
// Every returned plan passes validate(plan, model, cluster) and fits (Estimate::fits).
SearchResult search(const Model& model, const Cluster& cluster, const cost::Profile& profile,
                    const SearchOptions& options);

// What a simulated plan is ranked by (lower is better), from its simulated_step_s and
// simulated_compute_s: the search's key on the simulated step (the time to train with --tokens,
// the band's pessimistic end with --robust). Empty: the simulated step time.
using SimulatedKey = std::function<double(const Candidate&)>;

// DESIGN's second pass: lowers the first `count` plans of `result.top` to Programs, plays them
// with the event simulator, and re-orders those plans by `key` (the rest keep their
// closed-form order after them, as do plans the lowering refuses).
void resimulate_top(const Model& model, const Cluster& cluster, const cost::Profile& profile,
                    int count, SearchResult& result, const SimulatedKey& key = {});

}  // namespace parasol::sim
