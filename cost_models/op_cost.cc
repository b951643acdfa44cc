// Op prices of a lowered plan (see op_cost.h): the per-kind formulas, a memo of op shapes, and
// the placement caches of groups and pipeline links.
#include "cost_models/op_cost.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/error.h"
#include "core/layer_shapes.h"
#include "cost_models/compute.h"
#include "cost_models/host_cost.h"
#include "cost_models/host_link.h"
#include "cost_models/host_optimizer.h"
#include "cost_models/moe_dispatch.h"

namespace parasol::cost {

Collective collective_of(OpKind k) {
  switch (k) {
    case OpKind::kAllReduce:
      return Collective::kAllReduce;
    case OpKind::kAllGather:
      return Collective::kAllGather;
    case OpKind::kReduceScatter:
      return Collective::kReduceScatter;
    case OpKind::kAllToAll:
      return Collective::kAllToAll;
    case OpKind::kBroadcast:
      return Collective::kBroadcast;
    default:
      return Collective::kAllReduce;
  }
}

bool is_compute_kind(OpKind k) {
  return !is_communication(k) && k != OpKind::kOffload && k != OpKind::kPrefetch &&
         k != OpKind::kSync;
}

bool runs_on_host(const Program& p, const Op& op) {
  if (op.kind != OpKind::kAdamW && op.kind != OpKind::kCast && op.kind != OpKind::kGradNorm)
    return false;
  bool any = false;
  for (const std::vector<int>* list : {&op.reads, &op.writes})
    for (int b : *list) {
      if (b < 0 || b >= static_cast<int>(p.buffers.size()) || !p.buffers[b].host) return false;
      any = true;
    }
  return any;
}

PlacementCache::PlacementCache(const Cluster& cluster) {
  first_gpu_of_server.assign(cluster.num_servers(), -1);
  for (int gpu = cluster.num_gpus() - 1; gpu >= 0; --gpu) {
    const int srv = cluster.server_of(gpu);
    if (srv >= 0 && srv < cluster.num_servers()) first_gpu_of_server[srv] = gpu;
  }
}

namespace {

// What an op's price depends on besides its shape: a linear's pass (a data gradient quantises
// its operand under fp8, a weight gradient does not), whether it is the router and whether it is
// the output layer; an expert all-to-all's role (DeepEP's forward dispatch moves fp8 rows); the
// kernels of the experts' bias loops (which loop: fc1's has no probabilities) and of the router's
// route op (Op::tensors).
bool is_router(const Op& op) {
  return op.kind == OpKind::kRouter || op.role == OpRole::kRouter || op.role == OpRole::kRouterDw;
}
int price_flags(const Op& op) {
  return (op.backward_data ? 1 : 0) | (is_router(op) ? 2 : 0) | (op.tags.layer < 0 ? 4 : 0) |
         (op.role == OpRole::kDispatchA2a ? 8 : 0) |
         (is_expert_bias_loop(op.role) || op.kind == OpKind::kRouter || is_fp8_amax(op.role)
              ? 16 | (op.role == OpRole::kExpertFc1Bias ? 32 : 0) | (std::max(1, op.tensors) << 6)
              : 0);
}

bool stage_dependent(const Op& op) {
  return is_communication(op.kind) || op.kind == OpKind::kOffload || op.kind == OpKind::kPrefetch;
}

}  // namespace

// Prices per op shape: a hash map behind a direct-mapped memo (most lookups hit the memo).
struct OpPricer::ShapeCache {
  std::unordered_map<OpShape, double, OpShapeHash> map;
  struct Memo {
    OpShape key;
    size_t hash = 0;
    double seconds = 0;
    bool used = false;
  };
  // Allocated once the map holds kMemoAfter shapes or the pricer has priced kMemoAfterOps ops
  // (a whole Program's ops of few shapes): a pricer of a few ops (a layer fragment of the closed
  // form) does without it.
  static constexpr size_t kMemoSlots = 1024, kMemoAfter = 64, kMemoAfterOps = 4096;
  std::vector<Memo> memo;
  size_t priced = 0;  // calls of time()
};

OpPricer::OpPricer(const Model& model, const Cluster& cluster, const Plan& plan,
                   const Profile& profile, const RankLayout& layout, const std::vector<int>& reps,
                   PlacementCache& places)
    : model_(model),
      cluster_(cluster),
      plan_(plan),
      prof_(profile),
      layout_(layout),
      reps_(reps),
      places_(places),
      shapes_(std::make_unique<ShapeCache>()),
      // What RankLayout reads of the plan (core/rank_layout.cc): its degrees, expert grid,
      // HSDP shard groups, hierarchical context-parallel groups and rank order.
      layout_signature_{plan.tp,
                        plan.cp,
                        plan.ep,
                        plan.dp,
                        plan.pp,
                        plan.expert_tp(),
                        plan.shard_degree,
                        plan.dense_shard_ranks(),
                        plan.expert_shard_ranks(),
                        cp_a2a_ranks(plan)} {
  for (Dim d : plan.rank_order) layout_signature_.push_back(static_cast<int64_t>(d));
}

OpPricer::~OpPricer() = default;

size_t OpShapeHash::operator()(const OpShape& s) const {
  // One multiply per word (a bijection of h for each word: two shapes that differ in one word
  // differ in h), then MurmurHash3's 64-bit finaliser, so that every bit reaches the low bits
  // that pick the memo slot and the bucket. Priced for every op of a simulated step.
  uint64_t h = 1469598103934665603ull;
  auto mix = [&](uint64_t v) { h = (h ^ v) * 0x9e3779b97f4a7c15ull; };
  auto bits = [](double d) {
    uint64_t u;
    std::memcpy(&u, &d, sizeof u);
    return u;
  };
  mix(static_cast<uint64_t>(s.kind) | static_cast<uint64_t>(s.phase) << 8 |
      static_cast<uint64_t>(s.group) << 16 | static_cast<uint64_t>(s.host) << 24 |
      static_cast<uint64_t>(static_cast<uint32_t>(s.stage)) << 32);
  mix(static_cast<uint64_t>(s.peer) ^ static_cast<uint64_t>(s.flags) << 40);
  mix(static_cast<uint64_t>(s.m));
  mix(static_cast<uint64_t>(s.n));
  mix(static_cast<uint64_t>(s.k));
  mix(static_cast<uint64_t>(s.batch));
  mix(bits(s.elements));
  mix(bits(s.bytes));
  mix(bits(s.flops));
  mix(bits(s.epilogue));
  mix(bits(s.load));
  if (s.kind == static_cast<int>(OpKind::kAttention)) {
    mix(static_cast<uint64_t>(s.ab) ^ static_cast<uint64_t>(s.aq) << 20 ^
        static_cast<uint64_t>(s.akv) << 40);
    mix(static_cast<uint64_t>(s.ah) ^ static_cast<uint64_t>(s.akvh) << 20 ^
        static_cast<uint64_t>(s.ad) << 40 ^ static_cast<uint64_t>(s.aflags) << 60);
  }
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  h *= 0xc4ceb9fe1a85ec53ull;
  h ^= h >> 33;
  return static_cast<size_t>(h);
}

OpShape OpPricer::shape(const Op& op, int stage, bool host) const {
  return OpShape{static_cast<int>(op.kind),
                 static_cast<int>(op.tags.phase),
                 is_communication(op.kind) ? static_cast<int>(op.group) : -1,
                 stage_dependent(op) || !cluster_.homogeneous() ? stage : -1,
                 op.peer_stage,
                 host ? 1 : 0,
                 price_flags(op),
                 op.m,
                 op.n,
                 op.k,
                 op.batch,
                 op.elements,
                 op.bytes,
                 op.flops,
                 op.epilogue_bytes,
                 op.load,
                 op.attn.batch,
                 op.attn.seq_q,
                 op.attn.seq_kv,
                 op.attn.heads,
                 op.attn.kv_heads,
                 op.attn.head_dim,
                 (op.attn.causal ? 1 : 0) | (op.attn.flash ? 2 : 0) | (op.attn.dropout ? 4 : 0)};
}

double OpPricer::time(const Op& op, int stage, bool host) {
  const OpShape key = shape(op, stage, host);
  const size_t h = OpShapeHash()(key);
  std::vector<ShapeCache::Memo>& memo = shapes_->memo;
  if (memo.empty() && ++shapes_->priced >= ShapeCache::kMemoAfterOps)
    memo.resize(ShapeCache::kMemoSlots);
  if (!memo.empty()) {
    const ShapeCache::Memo& slot = memo[h % ShapeCache::kMemoSlots];
    if (slot.used && slot.hash == h && slot.key == key) return slot.seconds;
  }
  auto it = shapes_->map.find(key);
  double t;
  if (it != shapes_->map.end()) {
    t = it->second;
  } else {
    t = price(op, stage, host);
    shapes_->map.emplace(key, t);
    if (memo.empty() && shapes_->map.size() >= ShapeCache::kMemoAfter)
      memo.resize(ShapeCache::kMemoSlots);
  }
  if (!memo.empty()) memo[h % ShapeCache::kMemoSlots] = {key, h, t, true};
  return t;
}

LinkUse OpPricer::link_use(const Op& op, int stage) {
  switch (op.kind) {
    case OpKind::kOffload:
      return LinkUse::kDeviceToHost;
    case OpKind::kPrefetch:
      return LinkUse::kHostToDevice;
    case OpKind::kSend: {
      if (op.group != Group::kPp) break;  // a ring step of a group: priced as the group
      const int peer = peer_rank(stage, op.peer_stage);
      return cluster_.server_of(reps_[stage]) == cluster_.server_of(peer) ? LinkUse::kIntraServer
                                                                          : LinkUse::kInterServer;
    }
    case OpKind::kRecv:
      return LinkUse::kNone;
    default:
      break;
  }
  if (!is_communication(op.kind)) return LinkUse::kNone;
  const std::vector<int>& g = group_ranks(stage, op.group);
  if (g.size() < 2) return LinkUse::kNone;
  for (int r : g)
    if (cluster_.server_of(r) != cluster_.server_of(g[0])) return LinkUse::kInterServer;
  return LinkUse::kIntraServer;
}

double OpPricer::pp_collective_time(const Op& op, const std::vector<int>& stages) {
  std::vector<int> group;
  for (int s : stages) group.push_back(reps_[s]);
  if (group.size() < 2) return 0;
  GroupModel gm(cluster_, prof_, group);
  return gm.cost(collective_of(op.kind), op.bytes).time_s;
}

int OpPricer::peer_rank(int stage, int peer_stage) const {
  RankCoord c = layout_.coord(reps_[stage]);
  c.pp = peer_stage;
  return layout_.rank(c);
}

const std::vector<int>& OpPricer::group_ranks(int stage, Group g) {
  auto key = std::make_pair(stage, static_cast<int>(g));
  auto it = ranks_.find(key);
  if (it != ranks_.end()) return it->second;
  return ranks_.emplace(key, layout_.group(g, reps_[stage])).first->second;
}

// Where a GPU sits: (server relative to `base_server`, index inside its server).
void OpPricer::append_place(std::vector<int64_t>& sig, int gpu, int base_server) const {
  const int srv = cluster_.server_of(gpu);
  if (srv < 0 || srv >= static_cast<int>(places_.first_gpu_of_server.size())) {
    sig.push_back(std::numeric_limits<int>::min());  // no server: the absolute GPU
    sig.push_back(gpu);
    return;
  }
  sig.push_back(srv - base_server);
  sig.push_back(gpu - places_.first_gpu_of_server[srv]);
}

const GroupModel& OpPricer::group_model(int stage, Group g) {
  auto key = std::make_pair(stage, static_cast<int>(g));
  auto it = groups_.find(key);
  if (it != groups_.end()) return *it->second;
  // Another pricer of a plan with the same rank layout found it already.
  // All-to-alls run in the expert-parallel groups, in the all-to-all groups of hierarchical
  // context parallelism and, under cp_comm_type a2a (Ulysses), in the context-parallel ones: only
  // those price the pairwise exchange (it samples several steps).
  const bool a2a = g == Group::kEp || g == Group::kCpA2a ||
                   (g == Group::kCp && plan_.cp_comm_type == CpCommType::kA2a);
  std::vector<int64_t> layout_key = layout_signature_;
  layout_key.push_back(stage);
  layout_key.push_back(static_cast<int64_t>(g));
  if (g == Group::kCp && a2a) layout_key.push_back(-3);
  if (auto lit = places_.by_layout.find(layout_key); lit != places_.by_layout.end())
    return *groups_.emplace(key, lit->second).first->second;
  const std::vector<int>& group = group_ranks(stage, g);
  // The same-kind groups of this stage run the same collective at the same time.
  std::vector<std::vector<int>> concurrent;
  if (group.size() >= 2) {
    for (auto& other : layout_.groups(g)) {
      if (other == group) continue;
      bool same_stage = true;
      for (int r : other) same_stage = same_stage && layout_.coord(r).pp == stage;
      if (same_stage) concurrent.push_back(std::move(other));
      if (concurrent.size() >= 64) break;
    }
  }
  // Stages usually repeat one placement shifted by whole servers: price each distinct
  // placement once. The signature holds every member's relative server, index in its server
  // and hop count from the first member (which tells fabric boundaries apart), and the
  // relative places of the concurrent groups.
  std::vector<int64_t> sig = {static_cast<int64_t>(g), static_cast<int64_t>(group.size())};
  if (g == Group::kCp && a2a) sig.push_back(-3);
  const int base = group.empty() ? 0 : cluster_.server_of(group[0]);
  int last_server = group.empty() ? 0 : cluster_.server_of(group[0]);
  for (int r : group) {
    append_place(sig, r, base);
    const int srv = cluster_.server_of(r);
    if (srv != last_server) {  // hops to the first member on each further server
      sig.push_back(-2);
      sig.push_back(static_cast<int64_t>(cluster_.path(group[0], r).size()));
      last_server = srv;
    }
  }
  for (const auto& other : concurrent) {
    sig.push_back(-1);
    for (int r : other) append_place(sig, r, base);
  }
  auto pit = places_.groups.find(sig);
  if (pit == places_.groups.end()) {
    auto gm = std::make_unique<GroupModel>(cluster_, prof_, group, concurrent,
                                           /*price_all_to_all=*/a2a);
    pit = places_.groups.emplace(std::move(sig), std::move(gm)).first;
  }
  places_.by_layout.emplace(std::move(layout_key), pit->second.get());
  return *groups_.emplace(key, pit->second.get()).first->second;
}

// (bandwidth, latency) of every rank of `from` sending to its peer in `to` at once; priced once
// per distinct placement of those flows (as group_model() does).
std::pair<double, double> OpPricer::p2p_link(int from, int to) {
  auto key = std::make_pair(from, to);
  auto it = links_.find(key);
  if (it != links_.end()) return it->second;
  std::vector<Flow> flows;
  flows.push_back({reps_[from], peer_rank(from, to)});
  for (int r = 0; r < layout_.world() && flows.size() < GroupModel::kMaxPricedFlows; ++r) {
    RankCoord c = layout_.coord(r);
    if (c.pp != from || r == reps_[from]) continue;
    c.pp = to;
    flows.push_back({r, layout_.rank(c)});
  }
  const int base = cluster_.server_of(flows[0].src);
  std::vector<int64_t> sig;
  for (const Flow& f : flows) {
    append_place(sig, f.src, base);
    append_place(sig, f.dst, base);
  }
  sig.push_back(static_cast<int64_t>(cluster_.path(flows[0].src, flows[0].dst).size()));
  auto pit = places_.links.find(sig);
  if (pit == places_.links.end()) {
    const HopRate hop = pipeline_hop(cluster_, prof_, flows);  // the closed form's price too
    pit = places_.links.emplace(std::move(sig), std::make_pair(hop.bw, hop.latency)).first;
  }
  return links_.emplace(key, pit->second).first->second;
}

double OpPricer::host_bw(int stage) {
  auto it = places_.host_bw.find(reps_[stage]);
  if (it == places_.host_bw.end())
    it = places_.host_bw.emplace(reps_[stage], host_copy_bandwidth(cluster_, prof_, reps_[stage]))
             .first;
  return it->second;
}

double OpPricer::host_time(const Op& op) const { return host_issue_seconds(op, plan_, prof_); }

double OpPricer::elementwise_bytes(const Op& op) const {
  if (op.bytes > 0) return op.bytes;
  return 2.0 * op.elements * dtype_bytes(plan_.precision);  // read + write
}

double OpPricer::price(const Op& op, int stage, bool host) {
  const DeviceSpec& dev = cluster_.gpu_device(reps_[stage]);
  // RoPE's epilogue is a kernel of its own; GELU's (its pre-activation written or read) runs in
  // the GEMM's epilogue: its bytes only, no launch.
  const bool in_gemm = op.role == OpRole::kGeluFc1 || op.role == OpRole::kGeluFc2Dx;
  const double epilogue = op.epilogue_bytes <= 0 ? 0
                          : in_gemm ? op.epilogue_bytes / (dev.hbm_bw * prof_.memory_efficiency)
                                    : memory_time(dev, prof_, op.epilogue_bytes);
  // The deterministic fills of the outputs the op's framework allocates (host_cost.h).
  const AddedKernels fills = deterministic_fills(op, plan_);
  const double filled =
      fills.launches > 0 ? small_kernels_time(dev, prof_, fills.bytes, fills.launches) : 0;
  return (epilogue + filled + body_price(op, stage, host)) * op.load;
}

double OpPricer::body_price(const Op& op, int stage, bool host) {
  const DeviceSpec& dev = cluster_.gpu_device(reps_[stage]);
  const Dtype math = plan_.precision;
  switch (op.kind) {
    case OpKind::kLinear:
    case OpKind::kExpertLinear:
    case OpKind::kRouter:
      if (op.m > 0 && op.n > 0 && op.k > 0) {
        const GemmPass pass = op.tags.phase != Phase::kBackward ? GemmPass::kForward
                              : op.backward_data                ? GemmPass::kDataGrad
                                                                : GemmPass::kWeightGrad;
        // A linear outside the layers is the output layer (core/lower.h).
        // A LoRA adapter's GEMMs run in bf16 outside fp8 autocast (core/lower_lora.cc).
        const Dtype dtype = op.tags.layer < 0 ? output_layer_dtype(math)
                            : op.role == OpRole::kLora && math == Dtype::kFp8 ? Dtype::kBf16
                                                                              : math;
        if (multi_stream_expert_gemm(op, plan_))
          return multi_stream_expert_gemm_time(dev, prof_, dtype, op.m, op.n, op.k,
                                               std::max<int64_t>(1, op.batch), pass);
        return linear_gemm_time(dev, prof_, dtype, op.m, op.n, op.k, op.batch, pass, is_router(op));
      }
      if (op.flops > 0)
        return op.flops / (dev.peak_flops(math) * prof_.gemm_eff(math)) + prof_.kernel_overhead_s;
      // The router's score, top-k and aux-loss kernels (core/moe_load.h router_kernels).
      if (op.kind == OpKind::kRouter)
        return small_kernels_time(dev, prof_, elementwise_bytes(op), kernel_launches(op, plan_));
      return memory_time(dev, prof_, elementwise_bytes(op));
    case OpKind::kAttention: {
      const AttnShape a = attention_shape(op);
      const Dtype dt = math == Dtype::kFp8 ? Dtype::kBf16 : math;
      // Under a context-parallel ring every attention op is a step of the ring
      // (core/lower_layer.cc), priced as the frameworks lay the causal sequence out over it
      // (compute.h). Transformer Engine's all_gather and a2a exchanges run whole kernels (their
      // shapes in the op).
      const bool ring_steps = plan_.cp_impl == CpImpl::kPytorch ||
                              plan_.cp_comm_type == CpCommType::kP2p ||
                              plan_.cp_comm_type == CpCommType::kA2aP2p;
      // Hierarchical (a2a+p2p): the ring runs over the cp / cp_a2a_size all-to-all groups.
      const int ring = plan_.cp > 1 && a.causal && ring_steps
                           ? context_ring_steps(plan_.cp / cp_a2a_ranks(plan_), a.seq_q, a.window)
                           : 1;
      return op.tags.phase == Phase::kBackward
                 ? attention_backward_time(dev, prof_, dt, a, ring, plan_.cp_impl)
                 : attention_forward_time(dev, prof_, dt, a, ring, plan_.cp_impl);
    }
    case OpKind::kAdamW: {
      double params =
          op.elements > 0 ? op.elements : op.bytes / adam_bytes_per_param(plan_.precision);
      if (host) return host_optimizer_seconds(cluster_, prof_, plan_, params);
      if (op.bytes > 0) return memory_time(dev, prof_, op.bytes);
      return optimizer_time(dev, prof_, plan_.precision, params);
    }
    case OpKind::kBias:
      // The experts' bias loop: each of its kernels pays the GPU's gap between kernels.
      if (is_expert_bias_loop(op.role))
        return memory_time(dev, prof_, elementwise_bytes(op)) +
               static_cast<double>(kernel_launches(op, plan_) - 1) * prof_.kernel_overhead_s;
      return memory_time(dev, prof_, elementwise_bytes(op));
    case OpKind::kEmbedding:
    case OpKind::kNorm:
    case OpKind::kActivation:
    case OpKind::kResidualAdd:
    case OpKind::kCrossEntropy:
    case OpKind::kDispatch:
    case OpKind::kCast:
      // fp8 current scaling's amax and scale kernels (OpRole::kFp8Amax): a read of the operand,
      // two launches per quantised tensor.
      if (is_fp8_amax(op.role))
        return small_kernels_time(dev, prof_, op.bytes, kernel_launches(op, plan_));
      return memory_time(dev, prof_, elementwise_bytes(op));
    case OpKind::kCombine:
    case OpKind::kGradNorm:
      return memory_time(dev, prof_, elementwise_bytes(op));
    case OpKind::kAllToAll: {
      // Expert all-to-alls move what the plan's dispatcher puts on the wire (DeepEP: one copy
      // per remote node; its forward dispatch in fp8 when the plan trains in fp8).
      const GroupModel& gm = group_model(stage, op.group);
      if (op.group == Group::kEp && plan_.moe_dispatcher == MoeDispatcher::kAllGather)
        return allgather_dispatcher_time(gm, model_, plan_, op.bytes,
                                         op.role == OpRole::kDispatchA2a,
                                         op.tags.phase == Phase::kBackward);
      const double bytes = op.group == Group::kEp
                               ? expert_all_to_all_wire_bytes(model_, plan_, gm.nodes(), op.bytes,
                                                              op.tags.phase != Phase::kBackward &&
                                                                  op.role == OpRole::kDispatchA2a)
                               : op.bytes;
      return op.group == Group::kEp ? expert_exchange_time(gm, prof_, bytes, plan_.moe_dispatcher)
                                    : gm.cost(Collective::kAllToAll, bytes).time_s;
    }
    case OpKind::kAllReduce:
    case OpKind::kAllGather:
    case OpKind::kReduceScatter:
    case OpKind::kBroadcast: {
      const GroupModel& gm = group_model(stage, op.group);
      if (op.calls.empty()) return gm.cost(collective_of(op.kind), op.bytes).time_s;
      // Issued as several calls (DeepSpeed ZeRO-3's per-module gathers): each pays its latency.
      double t = 0;
      for (double c : op.calls) t += gm.cost(collective_of(op.kind), c).time_s;
      return t;
    }
    case OpKind::kSend: {
      if (op.bytes <= 0) return 0;
      if (op.group != Group::kPp) {
        // One step of a ring over the group (context-parallel K/V exchange): every rank sends
        // to its ring neighbour at once.
        const GroupModel& gm = group_model(stage, op.group);
        if (gm.size() < 2) return 0;
        return op.bytes / gm.ring_bw() + gm.ring_step_latency();
      }
      auto [bw, lat] = p2p_link(stage, op.peer_stage);
      return std::isfinite(bw) ? op.bytes / bw + lat : 0;
    }
    case OpKind::kRecv:
      return 0;  // the matching send carries the transfer
    case OpKind::kCountZeros:
    case OpKind::kParamNorm:
      return small_kernels_time(dev, prof_, op.bytes, kernel_launches(op, plan_));
    case OpKind::kSync:
      return prof_.host_sync_s;  // the round trip and wake-up once its device work is done
    case OpKind::kOffload:
    case OpKind::kPrefetch: {
      double bw = host_bw(stage);
      if (op.bytes <= 0) return 0;
      if (bw <= 0)
        throw Error("cluster", "offload needs a host link for GPU " + std::to_string(reps_[stage]));
      return op.bytes / bw;
    }
  }
  return 0;
}

// The attention core of an op: its `attn` shape when given, else one whole layer of the plan
// on this rank with the plan's kernel choice.
AttnShape OpPricer::attention_shape(const Op& op) const {
  if (op.attn.batch > 0 && op.attn.seq_q > 0) {
    AttnShape a = op.attn;
    a.kernel = plan_.attention_kernel;  // the plan's kernel choice
    return a;
  }
  AttnShape a;
  a.flash = plan_.flash_attention;
  const int64_t seq = plan_.seq(model_);
  a.batch = plan_.micro_batch;
  a.seq_q = seq / plan_.cp;
  a.seq_kv = seq;
  a.heads = model_.heads / plan_.tp;
  a.kv_heads = std::max<int64_t>(1, model_.kv_heads / plan_.tp);
  a.head_dim = model_.head_dim;
  a.causal = true;
  a.dropout = model_.dropout;
  a.kernel = plan_.attention_kernel;
  return a;
}

}  // namespace parasol::cost
