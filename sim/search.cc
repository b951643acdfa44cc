// Plan search: enumeration of the plan space per outer (tp, cp, pp) shape, memory pruning,
// ranking by the closed-form estimate, on all cores.
#include "sim/search.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>

#include "core/error.h"
#include "cost_models/memory.h"
#include "sim/engine.h"

namespace parasol::sim {

namespace {

std::vector<int> divisors(int64_t n) {
  std::vector<int> d;
  for (int64_t i = 1; i * i <= n; ++i)
    if (n % i == 0) {
      d.push_back(static_cast<int>(i));
      if (i != n / i) d.push_back(static_cast<int>(n / i));
    }
  std::sort(d.begin(), d.end());
  return d;
}

struct Shape {
  int tp, cp, pp;
};

// Partial full-recompute layer counts for a stage of `layers` layers: a quarter, a half and
// three quarters of the stage (all layers is recompute_layers = -1).
std::vector<int> partial_counts(int layers) {
  std::vector<int> k;
  for (int q : {1, 2, 3}) {
    int v = layers * q / 4;
    if (v >= 1 && v < layers && (k.empty() || k.back() != v)) k.push_back(v);
  }
  return k;
}

class Worker {
 public:
  Worker(const Model& m, const Cluster& c, const cost::Profile& p, const SearchOptions& o)
      : model_(m), cluster_(c), opt_(o), est_(m, c, p), hbm_(c.gpu_device(0).hbm_bytes) {}

  void run_shape(const Shape& s) {
    const int n = cluster_.num_gpus();
    const int dp = n / (s.tp * s.cp * s.pp);
    const int gbs = opt_.global_batch;
    if (gbs % dp != 0) return;
    const int per_stage = model_.layers / s.pp;
    const std::vector<int> partial = partial_counts(per_stage);  // once per shape
    Plan p;
    p.tp = s.tp;
    p.cp = s.cp;
    p.pp = s.pp;
    p.dp = dp;
    p.global_batch = gbs;
    p.seq_len = opt_.seq_len;
    p.precision = opt_.precision;
    p.flash_attention = opt_.flash_attention;
    std::vector<int> eps{1};
    if (model_.is_moe()) {
      eps.clear();
      for (int e : divisors(dp))
        if (model_.moe.experts % e == 0) eps.push_back(e);
    }
    std::vector<Offload> offloads{Offload{}};
    if (opt_.search_offload)
      for (int bits = 1; bits < 8; ++bits)
        offloads.push_back({bool(bits & 1), bool(bits & 2), bool(bits & 4)});
    for (int ep : eps) {
      p.ep = ep;
      for (int mbs : divisors(gbs / dp)) {
        p.micro_batch = mbs;
        const int m = gbs / (dp * mbs);
        // Schedules: GPipe and 1F1B, and interleaved with every vpp that divides the stage.
        std::vector<std::pair<Schedule, int>> schedules{{Schedule::k1F1B, 1}};
        if (s.pp > 1) {
          schedules.push_back({Schedule::kGpipe, 1});
          if (m % s.pp == 0)
            for (int v : divisors(per_stage))
              if (v >= 2) schedules.push_back({Schedule::kInterleaved, v});
        }
        for (auto [sched, vpp] : schedules) {
          p.schedule = sched;
          p.vpp = vpp;
          for (int sp = 0; sp <= (s.tp > 1 ? 1 : 0); ++sp) {
            p.sequence_parallel = sp;
            if (sp && (p.seq(model_) / s.cp) % s.tp != 0) continue;
            const int max_zero = (dp * s.cp > 1) ? (s.pp > 1 ? 2 : 3) : 0;
            for (int zero = 0; zero <= max_zero; ++zero) {
              p.zero = zero;
              for_each_recompute(p, partial, offloads);
            }
          }
        }
      }
    }
  }

  void for_each_recompute(Plan& p, const std::vector<int>& partial,
                          const std::vector<Offload>& offloads) {
    auto visit = [&](Recompute r, int layers) {
      p.recompute = r;
      p.recompute_layers = layers;
      for (const Offload& o : offloads) {
        p.offload = o;
        consider(p);
      }
    };
    visit(Recompute::kNone, -1);
    visit(Recompute::kSelective, -1);
    visit(Recompute::kFull, -1);
    for (int k : partial) visit(Recompute::kFull, k);
  }

  void consider(const Plan& p) {
    ++enumerated_;
    // Memory first: it is cheaper than the time estimate and prunes most of the space.
    const cost::MemoryBreakdown mem = cost::memory_per_rank(model_, cluster_, p);
    if (mem.total() > hbm_) return;
    ++evaluated_;
    cost::Estimate e = est_.estimate(p, mem);
    ++fitting_;
    add_top(p, e);
    add_pareto(p, e);
  }

  void add_top(const Plan& p, const cost::Estimate& e) {
    if (static_cast<int>(top_.size()) >= opt_.top_k &&
        e.tokens_per_s <= top_.back().estimate.tokens_per_s)
      return;
    Candidate c{p, e};
    auto at =
        std::upper_bound(top_.begin(), top_.end(), c, [](const Candidate& a, const Candidate& b) {
          return a.estimate.tokens_per_s > b.estimate.tokens_per_s;
        });
    top_.insert(at, std::move(c));
    if (static_cast<int>(top_.size()) > opt_.top_k) top_.pop_back();
  }

  void add_pareto(const Plan& p, const cost::Estimate& e) {
    for (const Candidate& c : pareto_)
      if (c.estimate.tokens_per_s >= e.tokens_per_s &&
          c.estimate.memory_per_gpu_bytes <= e.memory_per_gpu_bytes)
        return;
    std::erase_if(pareto_, [&](const Candidate& c) {
      return e.tokens_per_s >= c.estimate.tokens_per_s &&
             e.memory_per_gpu_bytes <= c.estimate.memory_per_gpu_bytes;
    });
    pareto_.push_back({p, e});
  }

  const Model& model_;
  const Cluster& cluster_;
  const SearchOptions& opt_;
  cost::Estimator est_;
  double hbm_;
  std::vector<Candidate> top_, pareto_;
  int64_t enumerated_ = 0, evaluated_ = 0, fitting_ = 0;
};

}  // namespace

SearchResult search(const Model& model, const Cluster& cluster, const cost::Profile& profile,
                    const SearchOptions& opt) {
  auto start = std::chrono::steady_clock::now();
  if (opt.global_batch < 1) throw Error("search.gbs", "a global batch >= 1 is required");
  if (opt.top_k < 1) throw Error("search.top", "must be >= 1");
  const int n = cluster.num_gpus();
  const int64_t seq = opt.seq_len > 0 ? opt.seq_len : model.seq_len;
  const int max_tp = opt.max_tp > 0 ? opt.max_tp : std::max(1, cluster.gpus_per_server());
  std::vector<Shape> shapes;
  for (int tp : divisors(n)) {
    if (tp > max_tp || model.heads % tp || model.kv_heads % tp || model.ffn % tp) continue;
    if (model.is_moe() && model.moe.expert_ffn % tp) continue;
    for (int cp : divisors(n / tp)) {
      if (cp > 1 && seq % (2 * cp) != 0) continue;
      for (int pp : divisors(n / tp / cp))
        if (model.layers % pp == 0) shapes.push_back({tp, cp, pp});
    }
  }
  int threads =
      opt.threads > 0 ? opt.threads : static_cast<int>(std::thread::hardware_concurrency());
  threads = std::max(1, std::min<int>(threads, static_cast<int>(shapes.size())));
  std::vector<std::unique_ptr<Worker>> workers;
  for (int i = 0; i < threads; ++i)
    workers.push_back(std::make_unique<Worker>(model, cluster, profile, opt));
  std::atomic<size_t> next{0}, done{0};
  std::mutex progress_mutex;
  auto work = [&](Worker* w) {
    for (size_t i; (i = next.fetch_add(1)) < shapes.size();) {
      w->run_shape(shapes[i]);
      size_t d = done.fetch_add(1) + 1;
      if (opt.progress) {
        std::lock_guard<std::mutex> lock(progress_mutex);
        opt.progress(static_cast<double>(d) / shapes.size());
      }
    }
  };
  std::vector<std::thread> pool;
  for (int i = 1; i < threads; ++i) pool.emplace_back(work, workers[i].get());
  work(workers[0].get());
  for (auto& t : pool) t.join();

  SearchResult r;
  for (auto& w : workers) {
    r.enumerated += w->enumerated_;
    r.evaluated += w->evaluated_;
    r.fitting += w->fitting_;
    r.top.insert(r.top.end(), w->top_.begin(), w->top_.end());
    r.pareto.insert(r.pareto.end(), w->pareto_.begin(), w->pareto_.end());
  }
  auto by_speed = [](const Candidate& a, const Candidate& b) {
    return a.estimate.tokens_per_s > b.estimate.tokens_per_s;
  };
  std::stable_sort(r.top.begin(), r.top.end(), by_speed);
  if (static_cast<int>(r.top.size()) > opt.top_k) r.top.resize(opt.top_k);
  // Merge the per-thread fronts.
  std::vector<Candidate> front;
  std::stable_sort(r.pareto.begin(), r.pareto.end(), by_speed);
  double best_mem = 1e300;
  for (const Candidate& c : r.pareto)
    if (c.estimate.memory_per_gpu_bytes < best_mem) {
      best_mem = c.estimate.memory_per_gpu_bytes;
      front.push_back(c);
    }
  r.pareto = std::move(front);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return r;
}

void resimulate_top(const Model& model, const Cluster& cluster, const cost::Profile& profile,
                    int count, SearchResult& result) {
  const int n = std::min<int>(count, static_cast<int>(result.top.size()));
  if (n <= 0) return;
  Simulator simulator(model, cluster, profile);
  for (int i = 0; i < n; ++i)
    result.top[i].simulated_step_s =
        simulator.simulate(lower(model, cluster, result.top[i].plan), false).step_time_s;
  std::stable_sort(result.top.begin(), result.top.begin() + n,
                   [](const Candidate& a, const Candidate& b) {
                     return a.simulated_step_s < b.simulated_step_s;
                   });
}

}  // namespace parasol::sim
