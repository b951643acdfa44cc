// Plan search: enumeration of the plan space per outer (tp, cp, pp) shape, memory pruning
// (device and host), ranking by the closed-form estimate (or a caller's key), on all cores.
//
// What is enumerated, and what is pruned because it cannot win or cannot run:
//  - tp_comm_overlap only with tp > 1 and sequence parallelism (Megatron-Core requires SP);
//  - expert tensor parallelism etp = 1 only with tp > 1 on MoE models; ep then ranges over the
//    divisors of tp x cp x dp (Megatron's expert grid), else over those of dp;
//  - ep_comm_overlap only with ep > 1, two or more micro-batches (another micro-batch's compute
//    hides the all-to-all), no full recompute, and, with pp > 1, the interleaved schedule
//    (Megatron-Core's prerequisites);
//  - ZeRO only when dp x cp > 1; ZeRO-3 with any pp, in the three reshard modes;
//  - HSDP (shard_degree = GPUs per server) only with ZeRO >= 1 when the data-parallel group
//    spans servers and the server's GPUs divide it (for MoE, the expert groups too);
//  - uneven pipeline stages (Megatron's first/last stage layer counts): where pp does not divide
//    the layers, the two splits that balance the stages best by FLOPs (the output layer counted
//    on the last stage; one split per virtual-stage count, those that divide a near-even stage);
//    where pp divides them, only after the even plan was estimated and an edge stage paced it,
//    the two splits its stage slots predict to be faster;
//  - selective recompute by Megatron's module sets (for_each_recompute): core_attn only where
//    the attention is materialised (with a fused kernel it keeps nothing);
//  - offload only for plans that do not fit in device memory without it, smallest sets first,
//    never a superset of a set that fits; plans whose offload exceeds the host memory a server
//    can pin are rejected.
#include "sim/search.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <cmath>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <tuple>

#include "core/error.h"
#include "core/lower.h"
#include "cost_models/framework_memory.h"
#include "cost_models/memory.h"
#include "sim/engine.h"
#include "sim/pareto.h"

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

// Megatron's --decoder-first/last-pipeline-num-layers: layers of the first and last stages
// (0 = as many as a middle stage) and of each middle stage.
struct StageSplit {
  int first = 0, last = 0;                    // as Plan::first_stage_layers / last_stage_layers
  int first_n = 0, middle_n = 0, last_n = 0;  // resolved layer counts
  double flop_score = 0;  // the largest stage in layer units, the output layer counted
};

// A pipeline layout: schedule, virtual stages, and the stage split (even unless `uneven`).
struct Layout {
  Schedule schedule = Schedule::k1F1B;
  int vpp = 1;
  bool uneven = false;
  StageSplit split;
  int max_stage_layers = 0;
  std::vector<int> partial;  // partial full-recompute layer counts for this layout
  // Even layouts: the uneven splits to try when an edge stage paces the even plan.
  const std::vector<StageSplit>* edge_splits = nullptr;
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

// The uneven splits of `layers` layers over `pp` >= 2 stages of `chunks` virtual stages each
// (every stage a multiple of chunks) whose largest stage is at most ceil(layers / pp) + chunks,
// the even split excluded, best balanced first. `w_last` is the output layer's work in layers.
std::vector<StageSplit> uneven_splits(int layers, int pp, int chunks, double w_last) {
  std::vector<StageSplit> out;
  const int bound = (layers + pp - 1) / pp + chunks;
  auto add = [&](int f, int m, int l) {
    if (f < 1 || l < 1 || f % chunks || l % chunks || std::max({f, m, l}) > bound) return;
    if (pp > 2 && (m < 1 || m % chunks)) return;
    if (pp > 2 && f == m && l == m) return;
    if (pp == 2 && f == l) return;
    StageSplit s;
    s.first_n = f;
    s.middle_n = pp > 2 ? m : 0;
    s.last_n = l;
    s.first = (pp == 2 || f != m) ? f : 0;
    s.last = (pp == 2 || l != m) ? l : 0;
    s.flop_score = std::max({static_cast<double>(f), static_cast<double>(s.middle_n), l + w_last});
    out.push_back(s);
  };
  if (pp == 2) {
    for (int f = chunks; f < layers; f += chunks) add(f, 0, layers - f);
  } else {
    for (int m = chunks; m <= bound; m += chunks) {
      const int rest = layers - (pp - 2) * m;
      for (int f = chunks; f < rest; f += chunks) add(f, m, rest - f);
    }
  }
  std::stable_sort(out.begin(), out.end(), [](const StageSplit& a, const StageSplit& b) {
    return a.flop_score < b.flop_score;
  });
  return out;
}

// The pipeline layouts of one pp, shared by the workers.
struct PipelineLayouts {
  std::vector<Layout> layouts;
  std::vector<std::unique_ptr<std::vector<StageSplit>>> edge_splits;  // owned, per chunks
};

PipelineLayouts make_layouts(const Model& model, int pp) {
  PipelineLayouts pl;
  const int L = model.layers;
  if (pp == 1) {
    Layout l;
    l.max_stage_layers = L;
    l.partial = partial_counts(L);
    pl.layouts.push_back(l);
    return pl;
  }
  // The output layer's forward FLOPs in units of an average layer's (the embedding is a
  // lookup: not counted).
  const FlopsPerToken fpt = flops_per_token(model);
  const double logits = 2.0 * model.hidden * model.vocab;
  const double per_layer = std::max(1.0, (fpt.forward - logits) / L);
  const double w_last = logits / per_layer;
  auto add_layouts = [&](int chunks, const std::vector<Schedule>& schedules) {
    if (L % pp == 0 && L % (pp * chunks) != 0) return;  // even stages that chunks do not split
    std::vector<StageSplit> splits = uneven_splits(L, pp, chunks, w_last);
    if (L % (pp * chunks) == 0) {
      pl.edge_splits.push_back(std::make_unique<std::vector<StageSplit>>(std::move(splits)));
      for (Schedule s : schedules) {
        Layout l;
        l.schedule = s;
        l.vpp = chunks > 1 ? chunks : 1;
        l.max_stage_layers = L / pp;
        l.partial = partial_counts(L / pp);
        l.edge_splits = pl.edge_splits.back().get();
        pl.layouts.push_back(l);
      }
    } else {
      // No even split: the two best balanced (one with virtual stages).
      const size_t keep = chunks > 1 ? 1 : 2;
      for (size_t i = 0; i < splits.size() && i < keep; ++i)
        for (Schedule s : schedules) {
          Layout l;
          l.schedule = s;
          l.vpp = chunks > 1 ? chunks : 1;
          l.uneven = true;
          l.split = splits[i];
          l.max_stage_layers = std::max({splits[i].first_n, splits[i].middle_n, splits[i].last_n});
          l.partial = partial_counts(l.max_stage_layers);
          pl.layouts.push_back(l);
        }
    }
  };
  add_layouts(1, {Schedule::k1F1B, Schedule::kGpipe});
  // Virtual stages: those that split a stage of the even (or nearly even) size.
  for (int v = 2; v <= (L + pp - 1) / pp; ++v)
    if ((L / pp) % v == 0 || ((L + pp - 1) / pp) % v == 0) add_layouts(v, {Schedule::kInterleaved});
  return pl;
}

// A candidate's rank: its score, offloaded bytes, memory per GPU and position in the enumeration
// (shape index, then order within the shape), compared in that order.
struct Rank {
  double score = 0, host = 0, memory = 0;
  uint64_t seq = 0;
  bool operator<(const Rank& o) const {
    if (score != o.score) return score < o.score;
    if (host != o.host) return host < o.host;
    if (memory != o.memory) return memory < o.memory;
    return seq < o.seq;
  }
};

struct Entry {
  Rank rank;
  Candidate c;
};

bool better(const Entry& a, const Entry& b) { return a.rank < b.rank; }

// The offload sets, smallest first.
const std::vector<Offload>& offload_sets() {
  static const std::vector<Offload> sets = [] {
    std::vector<Offload> s;
    for (int size = 1; size <= 3; ++size)
      for (int bits = 1; bits < 8; ++bits)
        if (std::popcount(static_cast<unsigned>(bits)) == size)
          s.push_back({bool(bits & 1), bool(bits & 2), bool(bits & 4)});
    return s;
  }();
  return sets;
}

bool superset(const Offload& a, const Offload& b) {  // a contains b
  return (a.optimizer || !b.optimizer) && (a.params || !b.params) &&
         (a.activations || !b.activations);
}

class Worker {
 public:
  Worker(const Model& m, const Cluster& c, const cost::Profile& p, const SearchOptions& o,
         const std::map<int, PipelineLayouts>& layouts,
         std::shared_ptr<cost::FragmentCache> fragments)
      : model_(m),
        cluster_(c),
        opt_(o),
        layouts_(layouts),
        est_(m, c, p),
        hbm_(c.gpu_device(0).hbm_bytes),
        host_capacity_(cost::host_memory_pinnable_bytes(c)),
        gps_(std::max(1, c.gpus_per_server())) {
    est_.share_fragments(std::move(fragments));
    // The band of the allocator's fragmentation (its published range), read once.
    std::tie(frag_low_, frag_high_) = cost::fragmentation_band(c.gpu_device(0), p);
  }

  void run_shape(const Shape& s, int shape_index) {
    seq_ = static_cast<uint64_t>(shape_index) << 32;
    const int n = cluster_.num_gpus();
    const int dp = n / (s.tp * s.cp * s.pp);
    const int gbs = opt_.global_batch;
    if (gbs % dp != 0) return;
    Plan p;
    p.tp = s.tp;
    if (s.tp > 1) p.tp_impl = opt_.tp_impl;
    p.cp = s.cp;
    if (s.cp > 1) p.cp_impl = opt_.cp_impl;
    p.pp = s.pp;
    p.dp = dp;
    p.global_batch = gbs;
    p.seq_len = opt_.seq_len;
    p.precision = opt_.precision;
    p.flash_attention = opt_.flash_attention;
    // Expert grids: (etp, ep), etp = 0 meaning tp.
    std::vector<std::pair<int, int>> grids{{0, 1}};
    if (model_.is_moe()) {
      grids.clear();
      if (model_.moe.expert_ffn % s.tp == 0)
        for (int e : divisors(dp))
          if (model_.moe.experts % e == 0) grids.push_back({0, e});
      if (s.tp > 1)
        for (int e : divisors(int64_t{s.tp} * s.cp * dp))
          if (model_.moe.experts % e == 0) grids.push_back({1, e});
    }
    const std::vector<Layout>& layouts = layouts_.at(s.pp).layouts;
    for (auto [etp, ep] : grids) {
      p.etp = etp;
      p.ep = ep;
      for (int mbs : divisors(gbs / dp)) {
        p.micro_batch = mbs;
        const int m = gbs / (dp * mbs);
        for (const Layout& layout : layouts) {
          if (layout.schedule == Schedule::kInterleaved && m % s.pp != 0) continue;
          p.schedule = layout.schedule;
          p.vpp = layout.vpp;
          p.first_stage_layers = layout.uneven ? layout.split.first : 0;
          p.last_stage_layers = layout.uneven ? layout.split.last : 0;
          for (int sp = 0; sp <= (s.tp > 1 ? 1 : 0); ++sp) {
            p.sequence_parallel = sp;
            if (sp && (p.seq(model_) / s.cp) % s.tp != 0) continue;
            for (int tpo = 0; tpo <= sp; ++tpo) {
              p.tp_comm_overlap = tpo;
              for_each_sharding(p, layout);
            }
          }
        }
      }
    }
  }

  // ZeRO stages, ZeRO-3's reshard modes and HSDP.
  void for_each_sharding(Plan& p, const Layout& layout) {
    const int group = p.dp * p.cp;
    const int max_zero = group > 1 ? 3 : 0;
    // HSDP: the data-parallel group spans servers and a server's GPUs divide it.
    bool hsdp = gps_ > 1 && int64_t{p.tp} * group > gps_ && group > gps_ && group % gps_ == 0;
    if (hsdp && p.ep > 1) hsdp = gps_ % p.ep == 0 && p.expert_dp() % (gps_ / p.ep) == 0;
    for (int zero = 0; zero <= max_zero; ++zero) {
      p.zero = zero;
      for (int r = 0; r < (zero == 3 ? 3 : 1); ++r) {
        p.reshard = static_cast<Reshard>(r);
        for (int h = 0; h <= (zero >= 1 && hsdp ? 1 : 0); ++h) {
          p.shard_degree = h ? gps_ : 0;
          for_each_recompute(p, layout);
        }
      }
    }
    p.reshard = Reshard::kAfterForward;
    p.shard_degree = 0;
  }

  void for_each_recompute(Plan& p, const Layout& layout) {
    // Megatron's expert all-to-all overlap: ep > 1, another micro-batch in flight, no full
    // recompute, interleaved when pipelined, 16-bit precision.
    const bool ep_overlap_ok = p.ep > 1 && p.micro_batches() >= 2 &&
                               (p.pp == 1 || p.schedule == Schedule::kInterleaved) &&
                               (p.precision == Dtype::kBf16 || p.precision == Dtype::kFp16);
    auto visit = [&](Recompute r, int layers) {
      p.recompute = r;
      p.recompute_layers = layers;
      for (int epo = 0; epo <= (ep_overlap_ok && r != Recompute::kFull ? 1 : 0); ++epo) {
        p.ep_comm_overlap = epo;
        consider_layout(p, layout);
      }
      p.ep_comm_overlap = false;
    };
    visit(Recompute::kNone, -1);
    // Selective recompute by Megatron's modules (Plan::recompute_modules), the sets its recipes
    // use: the attention core where the scores are materialised (with a fused kernel it keeps
    // nothing and only costs time: never better than no recompute); the dense MLP; for MoE the
    // experts' activation with the pre-MLP norm, or the whole MoE block; MLA's up-projections
    // with either.
    using M = RecomputeModule;
    auto bit = [](M m) { return 1u << static_cast<int>(m); };
    std::vector<unsigned> sets;
    if (!p.flash_attention) sets.push_back(bit(M::kCoreAttn));
    const unsigned mla = model_.mla.enabled() ? bit(M::kMlaUpProj) : 0u;
    if (model_.is_moe()) {
      sets.push_back(mla | bit(M::kMoeAct) | bit(M::kLayernorm));
      sets.push_back(mla | bit(M::kMoe));
    } else {
      sets.push_back(mla | bit(M::kMlp));
    }
    for (unsigned modules : sets) {
      p.recompute_modules = modules;
      visit(Recompute::kSelective, -1);
    }
    p.recompute_modules = Plan{}.recompute_modules;
    // torchtitan's op-level policy (keep every other matmul's output, SDPA's and the
    // reduce-scatters'), where it is modelled.
    if (opt_.selective_op && selective_op_refusal(p, model_).empty())
      visit(Recompute::kSelectiveOp, -1);
    visit(Recompute::kFull, -1);
    for (int k : layout.partial) visit(Recompute::kFull, k);
  }

  // The plan as laid out, then (even layouts whose plan an edge stage paces) the uneven splits
  // predicted to be faster.
  void consider_layout(Plan& p, const Layout& layout) {
    const Result r = consider_with_offload(p);
    if (!layout.edge_splits || layout.edge_splits->empty() || !r.fits_without_offload) return;
    const std::vector<double>& slots = estimate_.stage_slot_s;
    const int pp = p.pp, crit = estimate_.critical_stage;
    if (static_cast<int>(slots.size()) != pp || (crit != 0 && crit != pp - 1)) return;
    const int m = model_.layers / pp;
    // Seconds per layer: a middle stage's slot (the first stage's, embedding and all, at pp 2).
    const double mid = pp > 2 ? slots[1] : slots[0];
    const double u = mid / m;
    const double slot_max = slots[crit];
    struct Pick {
      double predicted;
      const StageSplit* split;
    };
    Pick best[2] = {{slot_max, nullptr}, {slot_max, nullptr}};
    for (const StageSplit& s : *layout.edge_splits) {
      double predicted =
          std::max(slots[0] + (s.first_n - m) * u, slots[pp - 1] + (s.last_n - m) * u);
      if (pp > 2) predicted = std::max(predicted, mid + (s.middle_n - m) * u);
      if (!(predicted < slot_max * (1 - 1e-9))) continue;
      if (predicted < best[0].predicted) {
        best[1] = best[0];
        best[0] = {predicted, &s};
      } else if (predicted < best[1].predicted) {
        best[1] = {predicted, &s};
      }
    }
    const int recompute_layers = p.recompute_layers;
    for (const Pick& pick : best) {
      if (!pick.split) continue;
      p.first_stage_layers = pick.split->first;
      p.last_stage_layers = pick.split->last;
      consider(p);
    }
    p.first_stage_layers = p.last_stage_layers = 0;
    p.recompute_layers = recompute_layers;
  }

  struct Result {
    bool fits_without_offload = false;
  };

  // The plan without offload; when it does not fit in device memory, the smallest offload sets
  // that make it fit.
  Result consider_with_offload(Plan& p) {
    p.offload = Offload{};
    Result r;
    const Fit f = consider(p);
    r.fits_without_offload = f.fits;
    if (f.device || !opt_.search_offload) return r;
    // A set cannot make the plan fit unless it can move the excess off the largest stage (it
    // moves at most all of each class it offloads).
    const cost::MemoryBreakdown mem = last_memory_;
    const double excess = last_device_high_ - hbm_;
    Offload fitted[8];
    int n_fitted = 0;
    for (const Offload& o : offload_sets()) {
      bool covered = false;
      for (int i = 0; i < n_fitted && !covered; ++i) covered = superset(o, fitted[i]);
      if (covered) continue;
      const double movable = (o.optimizer ? mem.optimizer : 0) + (o.params ? mem.weights : 0) +
                             (o.activations ? mem.activations : 0);
      if (movable < excess) continue;
      p.offload = o;
      if (consider(p).device) fitted[n_fitted++] = o;
    }
    p.offload = Offload{};
    return r;
  }

  struct Fit {
    bool device = false;  // fits in device memory
    bool fits = false;    // and in host memory: estimated and ranked (estimate_ holds it)
  };

  Fit consider(const Plan& p) {
    ++enumerated_;
    ++seq_;
    // Memory first: it is cheaper than the time estimate and prunes most of the space.
    last_memory_ = cost::memory_per_rank(model_, cluster_, p);
    const cost::MemoryBreakdown& mem = last_memory_;
    Fit f;
    // Headroom against the reserved figure at the top of its band, as nvidia-smi would show it
    // (a plan whose allocated bytes fit but whose reserved bytes do not is dropped).
    const cost::FrameworkMemory fm =
        cost::framework_memory(mem, p, -1, est_.profile(), frag_low_, frag_high_);
    last_device_high_ = fm.device_used_high() + opt_.memory_margin_bytes;
    const cost::MemoryFit fit = cost::memory_fit(fm, hbm_, opt_.memory_margin_bytes);
    f.device = fit == cost::MemoryFit::kFits;
    not_by_reserved_ += fit == cost::MemoryFit::kNotByReserved ? 1 : 0;
    f.fits = f.device && mem.host * gps_ <= host_capacity_;
    if (opt_.on_plan) opt_.on_plan(p, f.fits);
    if (!f.fits) return f;
    ++evaluated_;
    estimate_ = est_.estimate(p, mem);
    ++fitting_;
    const Rank rank{opt_.rank_key ? opt_.rank_key(p, estimate_) : estimate_.step_time_s,
                    estimate_.memory.host, estimate_.memory_per_gpu_bytes, seq_};
    // opt_.accept runs once, and only for a plan that would enter a list.
    int accepted = opt_.accept ? -1 : 1;  // -1: not asked yet
    auto accept = [&] {
      if (accepted < 0) accepted = opt_.accept(p) ? 1 : 0;
      return accepted == 1;
    };
    add_top(p, rank, accept);
    add_pareto(p, rank, accept);
    return f;
  }

  template <class Accept>
  void add_top(const Plan& p, const Rank& rank, Accept& accept) {
    if (static_cast<int>(top_.size()) >= opt_.top_k && !(rank < top_.back().rank)) return;
    if (!accept()) return;
    auto at = std::upper_bound(top_.begin(), top_.end(), rank,
                               [](const Rank& r, const Entry& e) { return r < e.rank; });
    top_.insert(at, Entry{rank, {p, estimate_, rank.score}});
    if (static_cast<int>(top_.size()) > opt_.top_k) top_.pop_back();
  }

  template <class Accept>
  void add_pareto(const Plan& p, const Rank& rank, Accept& accept) {
    // Of equal plans the first found stays: a plan enters when none on the front is no worse.
    const Objectives o{rank.score, rank.memory};
    for (const Entry& e : pareto_)
      if (no_worse({e.rank.score, e.rank.memory}, o)) return;
    if (!accept()) return;
    std::erase_if(pareto_, [&](const Entry& e) {
      return dominates(o, {e.rank.score, e.rank.memory});
    });
    pareto_.push_back(Entry{rank, {p, estimate_, rank.score}});
  }

  const Model& model_;
  const Cluster& cluster_;
  const SearchOptions& opt_;
  const std::map<int, PipelineLayouts>& layouts_;
  cost::Estimator est_;
  double hbm_, host_capacity_;
  int gps_;
  cost::MemoryBreakdown last_memory_;  // of the last plan considered
  double last_device_high_ = 0;        // and its device memory at the top of its band
  double frag_low_ = 0, frag_high_ = 0;
  cost::Estimate estimate_;  // of the last plan that fit
  uint64_t seq_ = 0;
  std::vector<Entry> top_, pareto_;
  int64_t enumerated_ = 0, evaluated_ = 0, fitting_ = 0, not_by_reserved_ = 0;
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
  std::map<int, PipelineLayouts> layouts;
  for (int tp : divisors(n)) {
    if (tp > max_tp || model.heads % tp || model.kv_heads % tp || model.ffn % tp) continue;
    // (MoE: a tp that does not divide the expert MLP is left to expert tensor parallelism.)
    for (int cp : divisors(n / tp)) {
      if (cp > 1 && seq % (2 * cp) != 0) continue;
      for (int pp : divisors(n / tp / cp)) {
        if (pp > model.layers) continue;
        auto it = layouts.find(pp);
        if (it == layouts.end()) it = layouts.emplace(pp, make_layouts(model, pp)).first;
        if (!it->second.layouts.empty()) shapes.push_back({tp, cp, pp});
      }
    }
  }
  int threads =
      opt.threads > 0 ? opt.threads : static_cast<int>(std::thread::hardware_concurrency());
  threads = std::max(1, std::min<int>(threads, static_cast<int>(shapes.size())));
  std::vector<std::unique_ptr<Worker>> workers;
  auto fragments = std::make_shared<cost::FragmentCache>();  // layer fragments, lowered once
  for (int i = 0; i < threads; ++i)
    workers.push_back(std::make_unique<Worker>(model, cluster, profile, opt, layouts, fragments));
  std::atomic<size_t> next{0};
  size_t done = 0;  // shapes finished, under progress_mutex
  std::mutex progress_mutex;
  auto work = [&](Worker* w) {
    for (size_t i; (i = next.fetch_add(1)) < shapes.size();) {
      w->run_shape(shapes[i], static_cast<int>(i));
      if (opt.progress) {
        // Counted under the lock, so the fractions reported never go back.
        std::lock_guard<std::mutex> lock(progress_mutex);
        opt.progress(static_cast<double>(++done) / shapes.size());
      }
    }
  };
  std::vector<std::thread> pool;
  for (int i = 1; i < threads; ++i) pool.emplace_back(work, workers[i].get());
  work(workers[0].get());
  for (auto& t : pool) t.join();
  if (opt.progress && shapes.empty()) opt.progress(1.0);  // nothing to do: done at once

  SearchResult r;
  std::vector<Entry> top, pareto;
  for (auto& w : workers) {
    r.enumerated += w->enumerated_;
    r.evaluated += w->evaluated_;
    r.fitting += w->fitting_;
    r.not_by_reserved += w->not_by_reserved_;
    top.insert(top.end(), w->top_.begin(), w->top_.end());
    pareto.insert(pareto.end(), w->pareto_.begin(), w->pareto_.end());
  }
  std::sort(top.begin(), top.end(), better);
  if (static_cast<int>(top.size()) > opt.top_k) top.resize(opt.top_k);
  for (Entry& e : top) r.top.push_back(std::move(e.c));
  // Merge the per-thread fronts into one, by score (then memory, then enumeration order), the
  // first found of equal plans kept.
  std::sort(pareto.begin(), pareto.end(),
            [](const Entry& a, const Entry& b) { return a.rank.seq < b.rank.seq; });
  std::vector<Objectives> objectives;
  for (const Entry& e : pareto) objectives.push_back({e.rank.score, e.rank.memory});
  const Objectives* last = nullptr;
  for (size_t k : pareto_front(objectives)) {
    const Objectives& o = objectives[k];
    if (last && no_worse(*last, o)) continue;  // equal to the one before
    last = &o;
    r.pareto.push_back(std::move(pareto[k].c));
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return r;
}

void resimulate_top(const Model& model, const Cluster& cluster, const cost::Profile& profile,
                    int count, SearchResult& result, const SimulatedKey& key) {
  const int n = std::min<int>(count, static_cast<int>(result.top.size()));
  if (n <= 0) return;
  Simulator simulator(model, cluster, profile);
  simulator.set_reserved(cost::Reserved::kBand);  // only the step is read
  std::vector<double> score(n, 0);                // the key of each simulated plan
  for (int i = 0; i < n; ++i) {
    Candidate& c = result.top[i];
    try {
      const SimResult r = simulator.simulate(lower(model, cluster, c.plan), false);
      c.simulated_step_s = r.step_time_s;
      c.simulated_compute_s = r.breakdown.compute;
      score[i] = key ? key(c) : c.simulated_step_s;
    } catch (const Error& e) {
      if (!e.is_user_error()) throw;  // a parasol bug or a system fault fails loudly
      c.simulated_step_s = c.simulated_compute_s = 0;  // a plan the lowering does not emit yet
    }
  }
  // Simulated plans by their key, then those the lowering refused, in closed-form order.
  std::vector<int> order(n);
  for (int i = 0; i < n; ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    const bool sa = result.top[a].simulated_step_s > 0, sb = result.top[b].simulated_step_s > 0;
    if (sa != sb) return sa;
    return sa && score[a] < score[b];
  });
  std::vector<Candidate> sorted;
  sorted.reserve(n);
  for (int i : order) sorted.push_back(std::move(result.top[i]));
  std::move(sorted.begin(), sorted.end(), result.top.begin());
}

}  // namespace parasol::sim
