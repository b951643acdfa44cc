// The closed-form plan estimate. A pipeline stage's micro-batch is the sum of its layers' prices,
// each layer kind's price its lowered fragment (core/lower.h's lower_layer_fragment: the ops the
// stage's Program runs for the layer, priced by the op pricer and played by the Program's rules,
// cost_models/layer_fragment.h), so that the closed form and the simulator read one description
// of a layer; plus the embedding and the output layer on their stages. The pipeline schedule
// turns the stages' micro-batch slots into a step (uneven stages: the slowest sets the pace, the
// others add to fill and drain); data-parallel synchronisation follows the framework semantics
// the plan names (DDP, Megatron's distributed optimizer, DeepSpeed ZeRO-2, ZeRO-3/FSDP reshard
// modes, HSDP); then the optimizer and offload. Communication that overlaps compute slows it by
// the rule the simulator plays (cost_models/compute_overlap.h's overlap_seconds).
#include "cost_models/estimate.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <numeric>
#include <set>
#include <string_view>
#include <tuple>

#include "core/error.h"
#include "core/fp8_params.h"
#include "core/fsdp_copies.h"
#include "core/fsdp_pipeline_reduce.h"
#include "core/gather_units.h"
#include "core/host_issue.h"
#include "core/layer_shapes.h"
#include "core/lower.h"
#include "core/offload_rules.h"
#include "core/optimizer_traffic.h"
#include "core/rank_layout.h"
#include "core/unfused_xent.h"
#include "core/vocab_shard.h"
#include "core/zero3_live.h"
#include "cost_models/compute.h"
#include "cost_models/compute_overlap.h"
#include "cost_models/host_cost.h"
#include "cost_models/host_link.h"
#include "cost_models/host_optimizer.h"
#include "cost_models/layer_fragment.h"
#include "cost_models/moe_dispatch.h"
#include "cost_models/zero3_play.h"

namespace parasol::cost {

namespace {
int order_code(const Plan& p) {
  int code = 0;
  for (Dim d : p.rank_order) code = code * 5 + static_cast<int>(d);
  return code;
}

// The plan RankLayout places the dense grid of: with Megatron's expert grid (etp != tp) expert
// parallelism is not carved out of dp, so the dense layout has no ep dimension.
Plan dense_layout_plan(const Plan& p) {
  if (p.expert_tp() == p.tp) return p;
  Plan q = p;
  q.ep = 1;
  q.etp = 0;
  return q;
}

// What of `comm` seconds hides behind `window` seconds of compute when it is issued in
// `pieces` equal parts, each overlapping the compute that follows it: the last piece (or the
// first, for a prefetch) has nothing to hide behind. Returns {exposed, hidden}.
std::pair<double, double> overlap(double comm, double window, int pieces) {
  if (comm <= 0) return {0, 0};
  const double first = comm / std::max(1, pieces);
  const double rest = comm - first;
  const double exposed = first + std::max(0.0, rest - window);
  return {exposed, comm - exposed};
}

}  // namespace

namespace {
// Seconds the host spends issuing an op of `kind` in `phase` outside the layers, eagerly.
double edge_op_host(const Plan& p, const Profile& f, OpKind kind, Phase phase,
                    OpRole role = OpRole::kNone) {
  Op op;
  op.kind = kind;
  op.role = role;
  op.tags.phase = phase;
  return host_issue_seconds(op, p, f);
}

// Kernels of Megatron's unfused loss in `phase` that are ops of their own in the lowering
// (core/unfused_xent.h: those that stand for none of the fused loss's ops).
double unfused_xent_own_kernels(Phase phase, double eb) {
  double n = 0;
  for (const XentKernel& k : unfused_xent_kernels(phase, eb))
    n += k.stands_for == XentStandsFor::kNone;
  return n;
}
}  // namespace

// The edges' device seconds (stage_price): the embedding on the first stage; the head's GEMMs
// and the loss on the last; a pipeline stage's exposed transfers each way.
struct Estimator::EdgeDevice {
  double embedding_forward = 0, embedding_backward = 0;
  double head_forward = 0, loss_forward = 0, loss_backward = 0, head_backward = 0;
  double metrics = 0;  // Plan::loss_metric_passes, after the backward
  double pp_each_way = 0;
};

// The host's share of a micro-batch outside the layers, as the lowering issues it
// (core/lower_edges.cc, lower_schedule.cc): the embedding (and its dropout) on the first virtual
// stage, the final norm, head, loss (and their TP all-reduces) on the last, and a pipeline
// stage's sends and receives. Under a full-iteration CUDA graph they are replayed with the rest.
// Each is added to the host's seconds and to the micro-batch's paces around the layers' (set
// before): the embedding first, then the layers, the head and the loss, the stage's sends.
void Estimator::edge_host(const Plan& p, int stage, const EdgeDevice& dev,
                          StagePrice& price) const {
  const Profile& f = profile_;
  const bool graphed = p.cuda_graphs == CudaGraphs::kFullIteration;
  const Phase fwd = Phase::kForward, bwd = Phase::kBackward;
  auto host = [&](OpKind k, Phase ph, double times = 1) {
    const double h = graphed ? 0 : times * edge_op_host(p, f, k, ph);
    (ph == fwd ? price.host_forward : price.host_backward) += h;
    return h;
  };
  HostPace before_fwd, after_fwd, before_bwd, after_bwd;
  if (graphed) price.host_forward = price.host_backward = 0;
  if (stage == 0) {
    double h = host(OpKind::kEmbedding, fwd);
    if (model_.dropout) h += host(OpKind::kResidualAdd, fwd);
    before_fwd = HostPace::op(h, dev.embedding_forward);
    // Under LoRA the frozen embedding runs no backward (core/lower_edges.cc).
    if (!p.lora()) after_bwd = HostPace::op(host(OpKind::kEmbedding, bwd), dev.embedding_backward);
  }
  if (stage == p.pp - 1) {
    const double head = host(OpKind::kNorm, fwd) + host(OpKind::kLinear, fwd);
    double loss = host(OpKind::kCrossEntropy, fwd, 2);
    double loss_bwd = host(OpKind::kCrossEntropy, bwd);
    // The head's data and weight gradients (the frozen head's data gradient only under LoRA).
    const double head_bwd = host(OpKind::kLinear, bwd, p.lora() ? 1 : 2) + host(OpKind::kNorm, bwd);
    if (p.tp > 1) loss += host(OpKind::kAllReduce, fwd, 2);
    if (p.eager_loss) {  // the upcast; the NLL gradient and the cast back (TP: exp and sum)
      loss += host(OpKind::kCrossEntropy, fwd);
      loss_bwd += host(OpKind::kCrossEntropy, bwd, p.tp > 1 ? 4 : 2);
    }
    if (p.unfused_loss()) {  // Megatron's unfused loss: its kernels issued from Python
      const double eb = p.precision == Dtype::kFp32 ? 4 : 2;
      auto unfused = [&](Phase ph) {
        const double h =
            graphed ? 0
                    : unfused_xent_own_kernels(ph, eb) *
                          edge_op_host(p, f, OpKind::kCrossEntropy, ph, OpRole::kXentUnfused);
        (ph == fwd ? price.host_forward : price.host_backward) += h;
        return h;
      };
      loss += unfused(fwd);
      loss_bwd += unfused(bwd);
    }
    after_fwd = HostPace::op(head, dev.head_forward).then(HostPace::op(loss, dev.loss_forward));
    before_bwd =
        HostPace::op(loss_bwd, dev.loss_backward).then(HostPace::op(head_bwd, dev.head_backward));
  }
  HostPace send_fwd, send_bwd;
  if (p.pp > 1) {
    // A send and a receive each way per chunk boundary; none before the first or after the last
    // virtual stage.
    const double ends = p.chunks() > 1 ? 0 : (stage == 0) + (stage == p.pp - 1);
    const double each = 2.0 * p.chunks() - ends;
    send_fwd = HostPace::op(host(OpKind::kSend, fwd, each), dev.pp_each_way);
    send_bwd = HostPace::op(host(OpKind::kSend, bwd, each), dev.pp_each_way);
  }
  if (stage == 0) price.pace_forward = before_fwd.then(price.pace_forward);
  if (stage == p.pp - 1) {
    price.pace_forward = price.pace_forward.then(after_fwd);
    price.pace_backward = before_bwd.then(price.pace_backward);
  }
  if (stage == 0) price.pace_backward = price.pace_backward.then(after_bwd);
  if (stage == p.pp - 1 && p.loss_metric_passes > 0) {
    // The metric passes' kernels (core/lower_edges.cc loss_metrics), issued from Python after
    // the backward: three each.
    const double h =
        graphed ? 0 : 3.0 * p.loss_metric_passes * edge_op_host(p, f, OpKind::kCrossEntropy, fwd);
    price.host_backward += h;
    price.pace_backward = price.pace_backward.then(HostPace::op(h, dev.metrics));
  }
  if (p.pp > 1) {
    if (p.p2p_sync) {
      // Megatron-Core's batched exchange ends with torch.cuda.synchronize() (Plan::p2p_sync;
      // core/lower_schedule.cc): in the steady state a call after each unit that sends (the
      // last stage's forwards and the first stage's backwards send nothing: no call), the host
      // waking once the device has finished. Each issued from the schedule's Python (the
      // lowering tags it forward).
      const double issue = graphed ? 0 : edge_op_host(p, f, OpKind::kSync, fwd);
      if (p.chunks() > 1 || stage != p.pp - 1) {
        price.host_forward += issue;
        send_fwd = send_fwd.then(HostPace::sync(issue, f.host_sync_s));
      }
      if (p.chunks() > 1 || stage != 0) {
        price.host_backward += issue;
        send_bwd = send_bwd.then(HostPace::sync(issue, f.host_sync_s));
      }
    }
    price.pace_forward = price.pace_forward.then(send_fwd);
    price.pace_backward = price.pace_backward.then(send_bwd);
  }
}

// What the host adds to a micro-batch of a stage (core/host_issue.h): in the steady state, a
// micro-batch's forward and backward repeat as the host paces them op by op; each takes the
// cycle's max-plus mean (the longer of the host's issue and the device's run where nothing
// syncs; from a sync to the next where the NaN/Inf check or the layers sync).
double Estimator::host_excess(const Plan& p, int stage, StagePrice& price) const {
  const double device = price.slot();
  // What of the slot the paces do not hold (the data-parallel traffic inside a micro-batch): on
  // the device after the backward.
  const double rest =
      std::max(0.0, device - (price.paced_device - price.syncs * profile_.host_sync_s));
  HostPace fwd = price.pace_forward;
  // The last stage's NaN/Inf check syncs twice on the loss after each forward.
  if (stage == p.pp - 1 && p.nan_check) {
    Op sync;
    sync.kind = OpKind::kSync;
    const HostPace check =
        HostPace::sync(host_issue_seconds(sync, p, profile_), profile_.host_sync_s);
    fwd = fwd.then(check.then(check));
  }
  HostPace bwd = price.pace_backward;  // then `rest` on the device alone
  bwd.dh = std::max(bwd.dh, bwd.hh) + rest;
  bwd.dd = std::max(bwd.dd, bwd.hd) + rest;
  const HostPace& c = price.cycle = fwd.then(bwd);
  const double cycle = std::max({c.hh, c.dd, 0.5 * (c.hd + c.dh)});
  return std::max(0.0, cycle - device);
}

// The step's micro-batches played from the step's start: what they take beyond the steady
// state's `micro_batches` x (slot + host excess): the first forward's lead and the last
// backward's, and the device's backlog when the host has issued the last.
double Estimator::host_edges(const StagePrice& price, int mb, double& backlog) const {
  double host_end = 0, device_end = 0;
  price.cycle.play(mb, host_end, device_end);
  backlog = device_end - host_end;
  return device_end - mb * (price.slot() + price.host);
}

double Estimator::StagePrice::slot() const {
  return forward + backward + recompute + tp + cp + ep + pp + dp;
}

namespace {
// Seconds that `dp_hidden` seconds of data-parallel traffic and the stage's other hidden
// communication add to a micro-batch on the stage by slowing its compute (compute_overlap.h's
// rule), less the `dp_excess` seconds by which the data-parallel traffic outlasts the compute
// it hides behind: until the slowed compute outlasts them, the step waits for the traffic
// anyway (the simulator plays this; the closed form takes it over the micro-batch as a whole).
double hidden_overlap(const Profile& f, const Estimator::StagePrice& s, double dp_hidden,
                      double dp_excess) {
  // The expert all-to-alls slow compute as the data-parallel traffic does (holds_gemm_sms).
  return std::max(0.0, overlap_seconds(f, s.hidden - s.ep_hidden, dp_hidden + s.ep_hidden,
                                       s.forward + s.backward + s.recompute) -
                           dp_excess);
}
}  // namespace

Estimator::~Estimator() = default;
Estimator::Estimator(Estimator&&) noexcept = default;

Estimator::Estimator(const Model& model, const Cluster& cluster, Profile profile)
    : model_(model),
      param_counts_(param_counts(model)),
      cluster_(cluster),
      profile_(std::move(profile)),
      device_(cluster.gpu_device(0)),
      host_bw_(host_copy_bandwidth(cluster, profile_, 0)),
      places_(std::make_unique<PlacementCache>(cluster)) {
  std::tie(fragmentation_low_, fragmentation_high_) = fragmentation_band(device_, profile_);
  // A GPU's PCIe link to its switch also carries its NIC's GPUDirect RDMA traffic: the share of
  // the link a busy NIC takes from host copies.
  auto hp = cluster.host_path(0);
  const double gpu_link = hp.first.empty() ? 0 : cluster.graph[hp.first.front().edge].bw;
  if (cluster.num_servers() > 1 && gpu_link > 0) {
    const int other = cluster.gpus_on_server(1).front();
    nic_share_of_pcie_ = std::min(1.0, cluster.bottleneck_bw(0, other) / gpu_link);
  }
  for (int l = 0; l < model_.layers; ++l) {
    const int kind = (model_.is_moe_layer(l) ? 2 : 0) + (model_.is_windowed_layer(l) ? 1 : 0);
    if (kind_layer_[kind] < 0) kind_layer_[kind] = l;
    layer_tensors_.push_back(layer_weight_tensors(model_, l, false));
  }
  const int moe_layer = kind_layer_[2] >= 0 ? kind_layer_[2] : kind_layer_[3];
  if (moe_layer >= 0) expert_tensors_ = layer_weight_tensors(model_, moe_layer, true);
}

Estimate Estimator::estimate(const Plan& plan, Reserved reserved) {
  // Every stage's rank, the largest peak (as nvidia-smi shows it) named.
  const std::vector<MemoryBreakdown> stages = memory_per_stage(model_, cluster_, plan);
  std::vector<FrameworkMemory> framework;
  int peak = 0;
  for (int s = 0; s < plan.pp; ++s) {
    framework.push_back(
        framework_memory(stages[s], plan, s, profile_, fragmentation_low_, fragmentation_high_));
    // The caching allocator's reserve, replayed over the stage's Program as the simulator does
    // (framework_memory.h): one figure for both predictors.
    apply_allocator_reserve(framework[s],
                            reserved == Reserved::kReplay
                                ? allocator_reserve_bytes(model_, plan, s, device_, profile_)
                                : band_reserve_bytes(framework[s]),
                            device_.hbm_bytes);
    if (framework[s].device_used() > framework[peak].device_used()) peak = s;
  }
  Estimate e = estimate(plan, stages[peak]);
  fill_memory(plan, stages[peak], peak, e);
  e.framework = framework[peak];
  e.memory_per_gpu_bytes = e.framework.device_used();
  e.memory_fit = memory_fit(e.framework, e.device_memory_bytes);
  e.fits = e.memory_per_gpu_bytes <= e.device_memory_bytes &&
           e.host_memory_per_server_bytes <= e.host_memory_capacity_bytes;
  e.stage_memory = std::move(framework);
  e.peak_stage = peak;
  e.peak_rank = stage_rank(plan, peak);
  return e;
}

// The `what` of a placement key: a Group (0 ..), an ExtraGroup (kExtraGroupTag + its index) or
// the pipeline link between stages 0 and 1; distinct ranges so that the cached prices of
// different groups of one placement never share a key.
constexpr int kExtraGroupTag = 100;
constexpr int kPipelineLinkTag = 200;
// A context-parallel group that runs all-to-alls (cp_comm_type a2a, Ulysses): priced with the
// pairwise exchange, which the ring-only groups skip.
constexpr int kCpAllToAllTag = 300;
static_assert(kGroupKindCount < kExtraGroupTag,
              "Group values must stay below the extra groups' tags");

Estimator::PlacementKey Estimator::placement(const Plan& p, int what) const {
  return {what, p.tp, p.cp, p.ep, p.dp, p.pp, order_code(p), p.expert_tp(), p.shard_degree};
}

const GroupModel& Estimator::group_model(const Plan& plan, Group g) {
  const bool a2a = g == Group::kEp || (g == Group::kCp && plan.cp_comm_type == CpCommType::kA2a);
  auto key = placement(plan, g == Group::kCp && a2a ? kCpAllToAllTag : static_cast<int>(g));
  auto it = groups_.find(key);
  if (it != groups_.end()) return *it->second;
  RankLayout layout(dense_layout_plan(plan));
  std::vector<int> group = layout.group(g, 0);
  // Concurrent groups: those of pipeline stage 0 (the other stages sit on other servers).
  std::vector<std::vector<int>> concurrent;
  for (auto& other : layout.groups(g)) {
    if (other == group) continue;
    bool in_stage0 = true;
    for (int r : other) in_stage0 = in_stage0 && layout.coord(r).pp == 0;
    if (in_stage0) concurrent.push_back(std::move(other));
    if (concurrent.size() >= GroupModel::kMaxPricedFlows) break;
  }
  auto model = std::make_unique<GroupModel>(cluster_, profile_, group, concurrent,
                                            /*price_all_to_all=*/a2a);
  return *groups_.emplace(key, std::move(model)).first->second;
}

const GroupModel& Estimator::extra_group_model(const Plan& plan, ExtraGroup g) {
  auto key = placement(plan, kExtraGroupTag + static_cast<int>(g));
  auto it = groups_.find(key);
  if (it != groups_.end()) return *it->second;
  RankLayout layout(dense_layout_plan(plan));
  // `stage` lists the ranks of pipeline stage 0 in the order a group's members are taken.
  std::vector<std::vector<int>> all;
  auto split = [&](const std::vector<int>& ranks, int inner, int size) {
    // Groups of `size` members `inner` apart: member j of group (outer, i) is
    // ranks[outer * inner * size + j * inner + i].
    for (size_t outer = 0; outer * inner * size < ranks.size(); ++outer)
      for (int i = 0; i < inner; ++i) {
        std::vector<int> grp;
        for (int j = 0; j < size; ++j) {
          const size_t at = outer * inner * size + static_cast<size_t>(j) * inner + i;
          if (at < ranks.size()) grp.push_back(ranks[at]);
        }
        all.push_back(std::move(grp));
      }
  };
  if (g == ExtraGroup::kExpertParallel || g == ExtraGroup::kExpertData ||
      (plan.expert_tp() != plan.tp &&
       (g == ExtraGroup::kExpertShard || g == ExtraGroup::kExpertReplica))) {
    // Megatron's expert grid over the stage's ranks in rank order: etp fastest, then ep, edp.
    std::vector<int> stage;
    for (int r = 0; r < layout.world(); ++r)
      if (layout.coord(r).pp == 0) stage.push_back(r);
    const int etp = plan.expert_tp(), ep = plan.ep, edp = plan.expert_dp();
    if (g == ExtraGroup::kExpertParallel) {
      split(stage, etp, ep);
    } else {
      std::vector<std::vector<int>> data;
      all.clear();
      split(stage, etp * ep, edp);
      if (g != ExtraGroup::kExpertData) {
        data = std::move(all);
        all.clear();
        const int shard = plan.expert_shard_ranks();
        for (const auto& d : data) {
          if (g == ExtraGroup::kExpertShard) {
            split(d, 1, shard);
          } else {
            split(d, shard, static_cast<int>(d.size()) / shard);
          }
        }
      }
    }
  } else {
    // HSDP over the dense (or, with etp = tp, expert) data-parallel groups of stage 0: shards of
    // consecutive members, replicas across them.
    const bool expert = g == ExtraGroup::kExpertShard || g == ExtraGroup::kExpertReplica;
    const Group base = expert ? Group::kExpertDp : Group::kDpCp;
    const int shard = expert ? plan.expert_shard_ranks() : plan.dense_shard_ranks();
    for (const auto& d : layout.groups(base)) {
      if (layout.coord(d[0]).pp != 0) continue;
      const bool shard_group = g == ExtraGroup::kDenseShard || g == ExtraGroup::kExpertShard;
      if (shard_group)
        split(d, 1, shard);
      else
        split(d, shard, static_cast<int>(d.size()) / shard);
    }
  }
  // The group holding rank 0 (or the first), and the others as concurrent.
  std::vector<int> group = all.empty() ? std::vector<int>{0} : all.front();
  for (const auto& grp : all)
    if (std::find(grp.begin(), grp.end(), 0) != grp.end()) group = grp;
  std::vector<std::vector<int>> concurrent;
  for (auto& grp : all) {
    if (grp == group) continue;
    concurrent.push_back(grp);
    if (concurrent.size() >= GroupModel::kMaxPricedFlows) break;
  }
  auto model = std::make_unique<GroupModel>(cluster_, profile_, group, concurrent,
                                            g == ExtraGroup::kExpertParallel);
  return *groups_.emplace(key, std::move(model)).first->second;
}

double Estimator::pp_transfer_time(const Plan& plan, double bytes) {
  if (plan.pp < 2 || bytes <= 0) return 0;
  auto key = placement(plan, kPipelineLinkTag);
  auto it = pp_links_.find(key);
  if (it == pp_links_.end()) {
    RankLayout layout(dense_layout_plan(plan));
    std::vector<Flow> flows;
    for (int r = 0; r < layout.world() && flows.size() < GroupModel::kMaxPricedFlows; ++r) {
      RankCoord c = layout.coord(r);
      if (c.pp != 0) continue;
      RankCoord next = c;
      next.pp = 1;
      flows.push_back({r, layout.rank(next)});
    }
    const HopRate hop = pipeline_hop(cluster_, profile_, flows);
    it = pp_links_.emplace(key, std::make_pair(hop.bw, hop.latency)).first;
  }
  return bytes / it->second.first + it->second.second;
}

namespace {
// The plan's switches a layer's price depends on, as bits 0-31, 35 and 36 on of the price
// caches' keys (bits 20-21 are left for fragment()'s layer kind; stage_price adds its own at
// 32-34; bits 12-18 are the selective modules, 19 torchtitan's op-level recompute, 35 the Triton
// attention kernel, 47-48 deterministic mode and the TE era, 49-50 the MoE router's kernels,
// 51 MPT's unpadded attention, 52 Megatron's gradient-accumulation fusion off, 53 the pipeline
// exchanges' device sync, 54 fp8 current scaling, 56 NeMo AutoModel's experts, 58 what the MoE
// combine keeps, 60 the FlashAttention-3 kernel, 61 PyTorch's DTensor TP).
int64_t price_flags(const Plan& p) {
  const int64_t modules =
      p.recompute == Recompute::kSelective ? static_cast<int>(p.recompute_modules) : 0;
  return (p.sequence_parallel ? 1 : 0) | (p.tp_comm_overlap ? 2 : 0) | (p.ep_comm_overlap ? 4 : 0) |
         (p.flash_attention ? 8 : 0) | (p.attention_kernel == AttentionKernel::kCudnn ? 16 : 0) |
         (p.fused_kernels ? 32 : 0) | (p.moe_dispatcher == MoeDispatcher::kDeepEp ? 64 : 0) |
         (static_cast<int>(p.cuda_graphs) << 7) | (p.torch_compile ? 1 << 9 : 0) |
         (p.expert_bias_loop ? 1 << 10 : 0) | (p.expert_fp8_padding ? 1 << 11 : 0) |
         (modules << 12) | (p.recompute == Recompute::kSelectiveOp ? 1 << 19 : 0) |
         (p.host_framework == HostFramework::kNative ? 1 << 22 : 0) | (p.nan_check ? 1 << 23 : 0) |
         (p.cp_impl == CpImpl::kPytorch ? 1 << 24 : 0) |
         (p.moe_force_balance == MoeForceBalance::kRoundRobin ? 1 << 25 : 0) |
         (p.cp_rotate == CpRotate::kAllGather ? 1 << 26 : 0) | (p.repeat_kv ? 1 << 27 : 0) |
         (p.transformer_impl == TransformerImpl::kTransformerEngine ? int64_t{1} << 28 : 0) |
         (p.transformer_impl == TransformerImpl::kLocal ? int64_t{1} << 29 : 0) |
         (int64_t{static_cast<int>(p.cp_comm_type)} << 30) |
         (p.attention_kernel == AttentionKernel::kTriton ? int64_t{1} << 35 : 0) |
         (int64_t{cp_a2a_ranks(p)} << 36) |  // the hierarchical all-to-all groups' size
         (p.attention_unpad ? int64_t{1} << 51 : 0) | (p.deterministic ? int64_t{1} << 47 : 0) |
         (p.te_version > 0 && p.te_version < 210 ? int64_t{1} << 48 : 0) |  // host_cost.h's era
         (p.moe_router_fusion ? int64_t{1} << 49 : 0) |  // the router's kernels (moe_load.h)
         (p.moe_force_balance == MoeForceBalance::kRandom ? int64_t{1} << 50 : 0) |
         // fp8 current scaling's amax ops (core/plan.h Fp8Recipe; the lowering's only fp8 recipe)
         (p.precision == Dtype::kFp8 && p.fp8_recipe == Fp8Recipe::kTensorwise ? int64_t{1} << 54
                                                                               : 0) |
         (p.moe_probs_in_experts ? int64_t{1} << 58 : 0) |  // what the combine keeps
         (p.moe_gmm_experts ? int64_t{1} << 56 : 0) |       // bias loops, compiled clamps
         (p.attention_kernel == AttentionKernel::kFa3 ? int64_t{1} << 60 : 0) |  // FA3's figures
         (p.tp_impl == TpImpl::kPytorch ? int64_t{1} << 61 : 0) |  // where the dgrad reductions run
         (p.gradient_accumulation_fusion ? 0 : int64_t{1} << 52) |  // main_grad adds
         (p.p2p_sync ? int64_t{1} << 53 : 0);  // edge_host's syncs after each exchange
}

// The price caches' second word of plan switches: a switch added once price_flags' word is full
// (bits 55, 57, 59 and 63 are its last free ones) takes a bit here. Bit 0: issue 42's; bits
// 40-47: issue 49's; bits 32-39: LoRA's (issue 48).
int64_t lora_price_bits(const Plan& p) {
  if (!p.lora()) return 0;
  // The target mask (bits 32-35, never 0 under LoRA), the adapters' dropout (36) and log2 of the
  // rank (37-39: validate() holds ranks to 1, 2, 4, ..., 128).
  int64_t log2_rank = 0;
  while ((1 << (log2_rank + 1)) <= p.lora_rank) ++log2_rank;
  return (static_cast<int64_t>(p.lora_targets & 0xFu) << 32) |
         (p.lora_dropout > 0 ? int64_t{1} << 36 : 0) | (log2_rank << 37);
}

// The price caches' precision field: the math dtype, and (bit 9) Megatron's fp8 copy of the
// SwiGLU input (Plan::activation_fp8_input_store), which changes a layer's activation kernels.
int precision_key(const Plan& p) {
  return static_cast<int>(p.precision) | (p.activation_fp8_input_store ? 1 << 9 : 0);
}

int64_t price_flags_more(const Plan& p) {
  // Megatron's unfused loss (core/unfused_xent.h); its allgather MoE dispatcher and fp32 router
  // (moe_dispatch.h); FC1's GELU in its GEMM's epilogue.
  return (p.unfused_loss() ? int64_t{1} << 0 : 0) |
         (p.moe_dispatcher == MoeDispatcher::kAllGather ? int64_t{1} << 1 : 0) |
         (p.moe_router_fp32 ? int64_t{1} << 2 : 0) | (p.gemm_gelu_epilogue ? int64_t{1} << 40 : 0) |
         lora_price_bits(p);
}

}  // namespace

// The lowered fragment of a layer of kind (moe_layer, windowed), playable, its compute priced,
// cached by everything that shapes its ops and their compute prices (not by where the ranks
// sit: its communication is priced per placement by layer_price).
const PlayableFragment& Estimator::fragment(const Plan& p, bool moe_layer, bool windowed) {
  const FragmentCache::Key key{
      p.tp,
      p.cp,
      p.ep,
      p.expert_tp(),
      p.micro_batch,
      p.seq(model_),
      precision_key(p),
      price_flags(p) | (moe_layer ? 1 << 20 : 0) | (windowed ? 1 << 21 : 0),
      price_flags_more(p)};
  auto it = fragments_.find(key);
  if (it != fragments_.end()) return *it->second;
  std::shared_ptr<const PlayableFragment> f =
      shared_fragments_ ? shared_fragments_->find(key) : nullptr;
  if (!f) {
    const int layer = kind_layer_[(moe_layer ? 2 : 0) + (windowed ? 1 : 0)];
    PARASOL_CHECK(layer >= 0, "the model has no layer of this kind");
    const RankLayout layout(p);
    const std::vector<int> reps(p.pp, 0);  // compute prices read no rank
    OpPricer pricer(model_, cluster_, p, profile_, layout, reps, *places_);
    PlayableFragment made = make_playable(lower_layer_fragment(model_, p, layer), pricer);
    f = shared_fragments_ ? shared_fragments_->insert(key, std::move(made))
                          : std::make_shared<const PlayableFragment>(std::move(made));
  }
  return *fragments_.emplace(key, std::move(f)).first->second;
}

// One layer of kind (moe_layer, windowed) for one micro-batch on one rank: its fragment's
// communication priced on the plan's placed groups (stage 0's) and the fragment played
// (cost_models/layer_fragment.h), cached by everything the price depends on.
const LayerPrice& Estimator::layer_price(const Plan& p, bool moe_layer, bool windowed) {
  auto key =
      std::make_tuple(placement(p, 300), p.micro_batch, p.seq(model_), p.flash_attention, moe_layer,
                      precision_key(p), price_flags(p), windowed, 0, price_flags_more(p));
  auto it = layers_.find(key);
  if (it != layers_.end()) return it->second;

  const PlayableFragment& f = fragment(p, moe_layer, windowed);
  const RankLayout layout(p);
  const std::vector<int> reps = layout.stage_representatives();
  OpPricer pricer(model_, cluster_, p, profile_, layout, reps, *places_);
  return layers_.emplace(key, play_layer_fragment(f, communication_seconds(f, pricer, 0)))
      .first->second;
}

Estimator::StagePrice Estimator::stage_price(const Plan& p, int stage) {
  const Model& m = model_;
  const DeviceSpec& d = device_;
  const Profile& f = profile_;
  StagePrice price;
  const int64_t seq = p.seq(m);
  const int64_t T = static_cast<int64_t>(p.micro_batch) * seq / p.cp;
  const double eb = p.precision == Dtype::kFp32 ? 4 : 2;
  const Dtype math = p.precision;
  const int layers = p.layers_in_stage(m.layers, stage);
  // Layers of each kind in this stage (its chunks' ranges).
  std::array<int, 4> count{};
  if (!m.is_moe() && m.sliding_window <= 0) {
    count[0] = layers;
  } else {
    for (int c = 0; c < p.chunks(); ++c) {
      const int first = p.first_layer(m.layers, stage, c);
      const int n = p.layers_in_chunk(m.layers, stage, c);
      for (int l = first; l < first + n; ++l)
        ++count[(m.is_moe_layer(l) ? 2 : 0) + (m.is_windowed_layer(l) ? 1 : 0)];
    }
  }
  const int full = p.full_recompute_layers(layers);
  // Plans of a search share stages: look the price up by everything it depends on (the layers'
  // switches, price_flags' bits 0-28, then the stage's edges and the eager loss above them).
  const int64_t flags = price_flags(p) | (stage == 0 ? int64_t{1} << 32 : 0) |
                        (stage == p.pp - 1 ? int64_t{1} << 33 : 0) |
                        (p.eager_loss ? int64_t{1} << 34 : 0) |
                        (p.tiled_loss && !p.eager_loss ? int64_t{1} << 62 : 0);
  const int64_t counts =
      (int64_t{count[0]} << 48) | (int64_t{count[1]} << 32) | (int64_t{count[2]} << 16) | count[3];
  const StageKey key{placement(p, 400),
                     p.micro_batch,
                     seq,
                     precision_key(p),
                     flags,
                     counts,
                     full,
                     static_cast<int>(p.recompute) | (p.loss_metric_passes << 8),
                     p.chunks(),
                     price_flags_more(p)};
  if (auto it = stage_prices_.find(key); it != stage_prices_.end()) return it->second;
  const double full_share = layers ? static_cast<double>(full) / layers : 0;
  double fwd_layers = 0, recompute_comm = 0;
  for (int kind = 0; kind < 4; ++kind) {
    if (count[kind] == 0) continue;
    const LayerPrice& lp = layer_price(p, kind >= 2, kind % 2 == 1);
    const double n = count[kind];
    fwd_layers += n * lp.forward;
    price.forward += n * lp.forward;
    price.backward += n * lp.backward;
    price.tp += n * (lp.tp_forward + lp.tp_backward);
    price.cp += n * (lp.cp_forward + lp.cp_backward);
    price.ep += n * (lp.ep_forward + lp.ep_backward);
    price.moe.add(lp.moe, n);
    price.hidden += n * (lp.tp_hidden + lp.cp_hidden + lp.ep_hidden);
    // Only Megatron's --overlap-moe-expert-parallel-comm runs the exchanges beside the other
    // micro-batch's GEMMs (compute_overlap.h holds_gemm_sms); otherwise what the fragment hides of
    // them hides behind other communication, and keeps the other collectives' rate.
    if (p.ep_comm_overlap) price.ep_hidden += n * lp.ep_hidden;
    price.host_forward += n * lp.host_forward;
    price.host_backward += n * (lp.host_backward + (1 - full_share) * lp.host_recompute +
                                full_share * lp.host_forward);
    price.syncs += n * (lp.syncs_forward + (1 - full_share) * lp.syncs_recompute +
                        full_share * lp.syncs_forward);
    recompute_comm += n * (lp.tp_forward + lp.cp_forward + lp.ep_forward);
    // The host-paced passes, layer after layer (kind after kind): the first full-recompute
    // layers' backward after their forward again.
    const int n_full = static_cast<int>(std::lround(full_share * n));
    price.pace_forward = price.pace_forward.then(lp.pace_forward.repeat(count[kind]));
    price.pace_backward = price.pace_backward.then(lp.pace_backward.repeat(count[kind] - n_full));
    if (n_full > 0)
      price.pace_backward =
          price.pace_backward.then(lp.pace_forward.then(lp.pace_backward).repeat(n_full));
    // Recompute: the whole layer (with its forward communication) for the first `full` layers,
    // the attention core (selective) for the rest when selected.
    price.recompute_flops += full_share * n * lp.forward_flops;
    price.recompute += (1 - full_share) * n * lp.selective_recompute;
    price.recompute_flops += (1 - full_share) * n * lp.selective_recompute_flops;
  }
  price.recompute += full_share * (fwd_layers + recompute_comm);
  // The embedding on the first stage, the output layer and loss on the last.
  // This rank's vocabulary slice, padded as lowered (core/vocab_shard.h).
  const int64_t vocab_t = vocab_shard(m, p.tp);
  EdgeDevice edge;
  if (stage == 0) {
    edge.embedding_forward = memory_time(d, f, 2 * eb * static_cast<double>(T) * m.hidden);
    // None under LoRA: the frozen embedding runs no backward (core/lower_edges.cc).
    edge.embedding_backward =
        p.lora() ? 0 : memory_time(d, f, 3 * eb * static_cast<double>(T) * m.hidden);
    price.forward += edge.embedding_forward;
    price.backward += edge.embedding_backward;
  }
  if (stage == p.pp - 1) {
    const Dtype head = output_layer_dtype(math);
    const double fwd0 = price.forward, bwd0 = price.backward;
    edge.head_forward = gemm_time(d, f, head, T, vocab_t, m.hidden);
    // The data gradient, and the weight gradient unless the head is frozen (LoRA).
    edge.head_backward = gemm_time(d, f, head, T, m.hidden, vocab_t) +
                         (p.lora() ? 0 : gemm_time(d, f, head, m.hidden, vocab_t, T));
    // The vocab-tiled loss (plan.tiled_loss, core/lower_edges.cc) writes no fp32 softmax in the
    // forward (4 bytes a logit fewer) and reads the logits (eb) instead of it in the backward.
    const bool tiled = p.tiled_loss && !p.eager_loss;
    if (p.unfused_loss()) {
      // Megatron's unfused loss (core/unfused_xent.h): each of its kernels, as lowered.
      const double logits = static_cast<double>(T) * vocab_t;
      price.forward += edge.head_forward;
      price.backward += edge.head_backward;
      for (const Phase ph : {Phase::kForward, Phase::kBackward})
        for (const XentKernel& k : unfused_xent_kernels(ph, eb))
          (ph == Phase::kForward ? price.forward : price.backward) +=
              memory_time(d, f, k.logit_bytes * logits + k.token_bytes * static_cast<double>(T));
    } else {
      price.forward +=
          edge.head_forward +
          memory_time(d, f, (eb + 4 * (tiled ? 1 : 2)) * static_cast<double>(T) * vocab_t);
      price.backward +=
          edge.head_backward +
          memory_time(d, f, ((tiled ? eb : 4) + eb) * static_cast<double>(T) * vocab_t);
    }
    if (p.eager_loss) {
      // The eager loss's ops (core/lower_edges.cc): in the forward the fp32 upcast, a kernel of
      // its own ((eb + 4) bytes a logit), and the max and the log-softmax reading fp32 (4 - eb
      // more bytes each); in the backward the NLL gradient (4) and the cast back (4 + eb),
      // kernels of their own, and the log-softmax gradient reading and writing fp32 (12 bytes
      // where the fused kernel's gradient above moves 4 + eb).
      const double logits = static_cast<double>(T) * vocab_t;
      auto more_bytes = [&](double bytes) {  // bytes added to a kernel priced above
        return bytes > 0 ? memory_time(d, f, bytes) - f.kernel_overhead_s : 0.0;
      };
      price.forward += memory_time(d, f, (eb + 4) * logits) + more_bytes(2 * (4 - eb) * logits);
      // Under TP (loss_parallel) the log-softmax gradient is three kernels: exp (8 bytes), the
      // sum with the NLL gradient (12) and the product (8).
      price.backward += memory_time(d, f, 4 * logits) + memory_time(d, f, (4 + eb) * logits);
      if (p.tp > 1) {
        price.backward += memory_time(d, f, 8 * logits) + memory_time(d, f, 12 * logits) +
                          more_bytes((4 - eb) * logits);
      } else {
        price.backward += more_bytes((8 - eb) * logits);
      }
    }
    edge.loss_forward = price.forward - fwd0 - edge.head_forward;
    edge.loss_backward = price.backward - bwd0 - edge.head_backward;
    // Composer's train metrics (core/lower_edges.cc loss_metrics): per pass the fp32 upcast of
    // the logits, the log-softmax reading and writing fp32, the NLL sum.
    const double logits = static_cast<double>(T) * vocab_t;
    for (int i = 0; i < p.loss_metric_passes; ++i)
      edge.metrics += memory_time(d, f, (eb + 4) * logits) + memory_time(d, f, 8 * logits) +
                      memory_time(d, f, 12.0 * static_cast<double>(T));
    price.backward += edge.metrics;
  }
  // Pipeline: per micro-batch, every chunk boundary sends activations forward and gradients
  // backward (1/tp of them per TP rank: Megatron's scatter/gather, or the SP shard).
  if (p.pp > 1)
    price.pp =
        2.0 * p.chunks() * pp_transfer_time(p, eb * static_cast<double>(T) * m.hidden / p.tp);
  edge.pp_each_way = price.pp / 2;
  edge_host(p, stage, edge, price);
  price.paced_device = price.pace_forward.then(price.pace_backward).dd;
  return stage_prices_.emplace(key, price).first->second;
}

// The data-parallel stream of a stage beside a micro-batch: the collectives of every
// data-parallel group, dense and expert, queue on one stream (core/lower_emit.cc, comm_stream),
// in the forward and the backward of every micro-batch, and once a step beside the first
// micro-batch's forward (parameters gathered for the step) and the last one's backward
// (gradients reduced for the step).
struct Estimator::DataParallelQueues {
  QueuedComm forward, backward, step_forward, step_backward;
  // Seconds per micro-batch of collectives the host waits for before it issues more of the
  // backward (DeepSpeed ZeRO-3's blocking gradient copy, core/offload_rules.h): exposed whole.
  double blocking = 0;
  // Seconds per step of collectives the compute stream waits for, each issued after the one
  // before it completed (FSDP2's reductions under a pipeline, core/fsdp_pipeline_reduce.h):
  // DataParallel::held.
  double held = 0;
  // DeepSpeed ZeRO-3's lazily gathered modules, played use by use beside the compute
  // (cost_models/zero3_play.h): their exposed and hidden seconds per micro-batch.
  double played_exposed = 0, played_hidden = 0;
  // Exposed, hidden and excess seconds per micro-batch, and what the step's traffic adds to
  // them, beside forward and backward windows of `fwd` and `bwd` seconds of compute (0: not
  // overlapped).
  DataParallel price(double fwd, double bwd) const {
    DataParallel out;
    QueuedComm f = forward, b = backward;
    const double queued = f.exposed(fwd) + b.exposed(bwd);
    out.per_micro_batch_hidden = f.comm + b.comm - queued + played_hidden;
    out.per_micro_batch = queued + blocking + played_exposed;
    out.per_micro_batch_excess = f.excess(fwd) + b.excess(bwd);
    f.add(step_forward.comm, step_forward.edge);
    b.add(step_backward.comm, step_backward.edge);
    // What the step's traffic adds to the queues' exposure (the blocking and played seconds are
    // the micro-batch's, not the queues': subtracted, they made a step with any of them
    // negative, and estimate() dropped the tail whose sum it then was).
    out.per_step = f.exposed(fwd) + b.exposed(bwd) - queued;
    out.per_step_hidden = step_forward.comm + step_backward.comm - out.per_step;
    out.held = held;
    out.per_step_excess = f.excess(fwd) + b.excess(bwd) - out.per_micro_batch_excess;
    return out;
  }
};

// data_parallel's synchronisation of one parameter class (dense or expert): its parameters
// sharded over `shard` of its `whole` data-parallel ranks (HSDP when shard < whole: reduce-
// scatter and gather on the shard groups, all-reduce across the replica groups), their
// collectives priced per bucket (ZeRO 0-2) or per layer (ZeRO-3) and queued beside the compute
// windows of a micro-batch (DataParallelQueues: both classes queue on one stream).
struct Estimator::DataParallelSync {
  // A parameter class's gradient buckets on one stage as the lowering emits them
  // (StageParams): runs of equal layer buckets, the head's (reduced first in the backward) and
  // the embedding's; `last` is the one reduced last (the embedding's on the first stage, else
  // the stage's first layer's).
  struct Buckets {
    int n[2] = {0, 0};
    double size[2] = {0, 0};
    double fp8[2] = {0, 0};  // Plan::fp8_param_gather: fp8 weights in one bucket of run k
    double head = 0, embedding = 0, last = 0;
    int count() const { return n[0] + n[1] + (head > 0) + (embedding > 0); }
    // The sum of `f` over the buckets.
    template <typename F>
    double sum(F f) const {
      double t = 0;
      for (int k = 0; k < 2; ++k)
        if (n[k] > 0) t += n[k] * f(size[k]);
      if (head > 0) t += f(head);
      if (embedding > 0) t += f(embedding);
      return t;
    }
  };
  const Plan& p;
  const int layers;
  const double w_bytes, g_bytes;  // bytes of a weight gathered, of a gradient reduced
  DataParallelQueues& out;

  // Adds `count` parameters' traffic to `out` (in `buckets` under ZeRO 0-2); the groups'
  // collectives price it. ZeRO-3: a layer's gather and reduce-scatter are issued as calls
  // carrying `ag` and `rs` of their bytes (core/gather_units.h; {1}: one call each).
  // `again`: the calls (fractions of a layer's bytes) of DeepSpeed's gather, for the backward,
  // of the modules a full recompute released (core/gather_units.h regathered_weights), in
  // `again_layers` layers.
  void add(double count, const Buckets& buckets, int whole, int shard, const GroupModel* whole_g,
           const GroupModel* shard_g, const GroupModel* replica_g,
           const std::vector<double>& ag = {1.0}, const std::vector<double>& rs = {1.0},
           const std::vector<double>& again = {}, int again_layers = 0) const;

 private:
  // The groups of one parameter class.
  struct Groups {
    int shard;
    bool hsdp;
    const GroupModel *whole_g, *shard_g, *replica_g;
    // The collectives of one bucket: gradient reduce(-scatter) (on the shard group under HSDP),
    // the HSDP replicas' all-reduce of its shard, and the parameter gather.
    double reduce(double params_in_bucket, bool sharded, double g_bytes) const;
    double replica(double params_in_bucket, double g_bytes) const;
    double gather(double params_in_bucket, double w_bytes) const;
  };
  void by_buckets(const Buckets& b, const Groups& g) const;
  void by_layers(double count, const Groups& g, const std::vector<double>& ag,
                 const std::vector<double>& rs, const std::vector<double>& again,
                 int again_layers) const;
};

double Estimator::DataParallelSync::Groups::reduce(double params_in_bucket, bool sharded,
                                                   double g_bytes) const {
  const double bytes = params_in_bucket * g_bytes;
  if (!sharded) return whole_g->cost(Collective::kAllReduce, bytes).time_s;
  return (hsdp ? shard_g : whole_g)->cost(Collective::kReduceScatter, bytes).time_s;
}

double Estimator::DataParallelSync::Groups::replica(double params_in_bucket, double g_bytes) const {
  if (!hsdp) return 0;
  return replica_g->cost(Collective::kAllReduce, params_in_bucket * g_bytes / shard).time_s;
}

double Estimator::DataParallelSync::Groups::gather(double params_in_bucket, double w_bytes) const {
  return (hsdp ? shard_g : whole_g)
      ->cost(Collective::kAllGather, params_in_bucket * w_bytes)
      .time_s;
}

void Estimator::DataParallelSync::add(double count, const Buckets& buckets, int whole, int shard,
                                      const GroupModel* whole_g, const GroupModel* shard_g,
                                      const GroupModel* replica_g, const std::vector<double>& ag,
                                      const std::vector<double>& rs,
                                      const std::vector<double>& again, int again_layers) const {
  if (count <= 0 || whole < 2) return;
  const Groups g{shard, shard < whole, whole_g, shard_g, replica_g};
  if (p.zero <= 2)
    by_buckets(buckets, g);
  else
    by_layers(count, g, ag, rs, again, again_layers);
}

// DDP, the distributed optimizer and ZeRO-2: gradients reduced bucket by bucket as the lowering
// emits them (core/lower_buckets.cc: each as its layer's backward ends under
// overlap_grad_reduce, all after the backward without), and (sharded) the updated parameters
// gathered after the optimizer. HSDP's replicas sum each bucket's shard after its reduction,
// once per step (after the last micro-batch's).
void Estimator::DataParallelSync::by_buckets(const Buckets& b, const Groups& g) const {
  const bool sharded = p.zero >= 1;
  const double red = b.sum([&](double n) { return g.reduce(n, sharded, g_bytes); });
  const double last = g.reduce(b.last, sharded, g_bytes);
  const double rep = sharded ? b.sum([&](double n) { return g.replica(n, g_bytes); }) : 0;
  const double rep_last = sharded ? g.replica(b.last, g_bytes) : 0;
  if (p.zero == 2) {
    // DeepSpeed ZeRO-2: gradients are partitioned, reduced every micro-batch.
    out.backward.add(red, last);
    out.step_backward.add(rep, rep_last);
  } else {
    // Once per step, beside the last micro-batch's backward.
    out.step_backward.add(red + rep, last + rep_last);
  }
  if (sharded) {
    // Updated parameters gathered after the optimizer (beside the next forward when
    // overlap_param_gather).
    // Under fp8_param_gather a layer bucket's fp8 weights move one byte each
    // (core/lower_buckets.cc updated_gather_bytes).
    double gat = 0;
    for (int k = 0; k < 2; ++k)
      if (b.n[k] > 0) gat += b.n[k] * g.gather(b.size[k] * w_bytes - b.fp8[k] * (w_bytes - 1), 1);
    if (b.head > 0) gat += g.gather(b.head, w_bytes);
    if (b.embedding > 0) gat += g.gather(b.embedding, w_bytes);
    out.step_forward.add(gat, gat / std::max(1, b.count()));
  }
}

// ZeRO-3 / FSDP: one unit per layer (FSDP wraps each block; DeepSpeed fetches a layer's
// parameters together), prefetched one unit ahead; under HSDP each layer's gradient shard summed
// over the replicas once per step, after the last micro-batch's reduce-scatter.
void Estimator::DataParallelSync::by_layers(double count, const Groups& g,
                                            const std::vector<double>& ag_calls,
                                            const std::vector<double>& rs_calls,
                                            const std::vector<double>& again,
                                            int again_layers) const {
  const double per_layer = count / layers;
  double ag = 0, rs = 0, re = 0;
  for (double f : ag_calls) ag += layers * g.gather(f * per_layer, w_bytes);
  for (double f : rs_calls) rs += layers * g.reduce(f * per_layer, true, g_bytes);
  for (double f : again) re += again_layers * g.gather(f * per_layer, w_bytes);
  const double rep = layers * g.replica(per_layer, g_bytes);
  // DeepSpeed ZeRO-3 with optimizer offload: the host waits for each bucket's reduce-scatter
  // (core/offload_rules.h gradient_copies_block_host): exposed, not queued beside the backward.
  const bool blocking = gradient_copies_block_host(p);
  switch (p.reshard) {
    case Reshard::kAfterForward:
      // Gathered in forward, freed, gathered again for backward (and the recompute inside
      // it; DeepSpeed gathers again for the backward what its recompute released); gradients
      // reduce-scattered as each layer's backward ends.
      out.forward.add(ag, ag / layers);
      if (blocking) {
        out.backward.add(ag + re, (ag + re) / layers);
        out.blocking += rs;
      } else {
        out.backward.add(ag + re + rs, (ag + rs) / layers);
      }
      out.step_backward.add(rep, rep / layers);
      break;
    case Reshard::kAfterBackward:
      out.forward.add(ag, ag / layers);
      out.backward.add(rs, rs / layers);
      out.step_backward.add(rep, rep / layers);
      break;
    case Reshard::kAfterStep:
      // Gathered at the first use of the step, reduce-scattered after the last backward: beside
      // it, or under a pipeline after each chunk's last backward with the compute stream waiting,
      // and the stage's gradient sends after them (core/lower_schedule.cc exchange): held, what
      // of every stage's the step waits for (Estimator::held_reductions_exposed).
      out.step_forward.add(ag, ag / layers);
      if (chunk_reductions_block_compute(p))
        out.held += rs + rep;
      else
        out.step_backward.add(rs + rep, (rs + rep) / layers);
      break;
  }
}

namespace {
// PyTorch FSDP's own kernels on the compute stream (core/fsdp_copies.h, Plan::fsdp_impl), as
// core/lower_buckets.cc emits them for a stage's units: seconds per micro-batch in the forward
// and the backward, and once per step (ZeRO-3 resharded after the step: one gather and one
// reduction a step).
struct FsdpCopyTime {
  double forward = 0, backward = 0, step = 0;
};

// Seconds of `copies` for a unit of `n` parameters sharded `ways` ways.
double fsdp_copies_seconds(const DeviceSpec& d, const Profile& f,
                           const std::vector<FsdpCopy>& copies, double n, int ways) {
  const double shard = std::ceil(n / ways);
  double t = 0;
  for (const FsdpCopy& c : copies) t += memory_time(d, f, c.bytes(shard * ways, shard));
  return t;
}

// The units of one parameter class: `layer_units` runs of (count, size) and the edge units
// (embedding, head: gathered without FSDP2's copy-out, which the lowering issues at a layer's
// use), sharded `ways` ways.
FsdpCopyTime fsdp_copy_time(const DeviceSpec& d, const Profile& f, const Plan& p,
                            const std::vector<std::pair<int, double>>& layer_units,
                            const std::vector<double>& edge_units, int ways) {
  FsdpCopyTime out;
  if (p.zero < 3 || p.fsdp_impl == FsdpImpl::kNone || ways < 2) return out;
  const std::vector<FsdpCopy> before_ag = fsdp_gather_copies(p, false),
                              after_ag = fsdp_gather_copies(p, true),
                              before_rs = fsdp_reduce_copies(p, ways, false),
                              after_rs = fsdp_reduce_copies(p, ways, true);
  double gather = 0, reduce = 0;
  // `count` units of `n` parameters each (identical units cost alike).
  auto units = [&](int count, double n, bool layer) {
    if (n <= 0 || count <= 0) return;
    gather += count * fsdp_copies_seconds(d, f, before_ag, n, ways);
    if (layer) gather += count * fsdp_copies_seconds(d, f, after_ag, n, ways);
    reduce += count * (fsdp_copies_seconds(d, f, before_rs, n, ways) +
                       fsdp_copies_seconds(d, f, after_rs, n, ways));
  };
  for (const auto& [count, n] : layer_units) units(count, n, true);
  for (double n : edge_units) units(1, n, false);
  switch (p.reshard) {
    case Reshard::kAfterForward:
      out.forward = gather;
      out.backward = gather + reduce;
      break;
    case Reshard::kAfterBackward:
      out.forward = gather;
      out.backward = reduce;
      break;
    case Reshard::kAfterStep:
      out.step = gather + reduce;
      break;
  }
  return out;
}
}  // namespace

namespace {
// DeepSpeed ZeRO-3's lazily gathered modules of one micro-batch on a stage of `layers` dense
// layers from `first` (core/zero3_live.h ds_lazy_gathers), played use by use
// (cost_models/zero3_play.h): the coordinator's schedule (ds_stage_schedule) says which module
// copies each use fetches, gathered per layer in one all-gather as the lowering issues them
// (core/lower_buckets.cc ds_reach); each layer's gradients are reduce-scattered in its reduce
// buckets (reduce_call_ends) after the backward use of the bucket's last module. Each use's
// compute is the layer's (lp) split by its fragment's uses (module_use_seconds), a recompute use
// priced as the forward's; the stage's other compute (`edge`: embedding, head and loss) runs
// between the forward and the backward.
Zero3Play ds_lazy_play(const Model& m, const Plan& p, int first, int layers, const LayerPrice& lp,
                       const ModuleUseSeconds& uses, double edge, const GroupModel& gather_g,
                       const GroupModel& reduce_g, double w_bytes, double g_bytes,
                       double slowdown) {
  const DsTrace t = ds_stage_trace(m, p, first, layers);
  const DsSchedule s = ds_stage_schedule(m, p, first, layers, 1);
  // A layer's calls repeat in every layer: each size priced once.
  std::vector<std::tuple<Collective, double, double>> priced;  // (collective, bytes, seconds)
  auto cost = [&](const GroupModel& g, Collective c, double bytes) {
    for (const auto& [pc, pb, ps] : priced)
      if (pc == c && pb == bytes) return ps;
    const double seconds = g.cost(c, bytes).time_s;
    priced.emplace_back(c, bytes, seconds);
    return seconds;
  };
  const size_t n = t.module.size();
  Zero3Uses u;
  u.compute.assign(n, 0.0);
  u.gathers.assign(n, {});
  u.reduces.assign(n, {});
  u.gather_use.assign(n, 0);
  u.gather_index.assign(n, 0);
  u.blocking = gradient_copies_block_host(p);
  const size_t per = static_cast<size_t>(std::max(1, t.per_layer));
  double fsum = 0, bsum = 0;
  for (double x : uses.forward) fsum += x;
  for (double x : uses.backward) bsum += x;
  // The copies fetched at each step, one all-gather per layer in layer order: (layer, elements).
  std::vector<std::vector<std::pair<int, double>>> fetched(n);
  std::vector<int> last_use(n * per + per, -1);
  // The elements each module's gather moves (its persistent parameters are whole already).
  std::vector<std::vector<double>> gathered(static_cast<size_t>(std::max(0, layers)));
  u.middle_at = static_cast<int>(n);
  std::set<std::pair<int, int>> copy_counted;  // (source use, fetch step): one gather each
  for (size_t i = 0; i < n; ++i) {
    const size_t k = static_cast<size_t>(t.module[i]) % per;
    const bool backward = t.use[i] == DsTrace::kBackward;
    const std::vector<double>& share = backward ? uses.backward : uses.forward;
    const double sum = backward ? bsum : fsum;
    if (k < share.size() && sum > 0)
      u.compute[i] = share[k] / sum * (backward ? lp.backward : lp.forward);
    if (t.use[i] != DsTrace::kForward && u.middle_at == static_cast<int>(n))
      u.middle_at = static_cast<int>(i);
    last_use[static_cast<size_t>(t.module[i])] = static_cast<int>(i);
    // Each copy is gathered once at each step the schedule names for it (a copy the coordinator
    // prefetched for a later use of the module can be read first by an earlier one, whose source
    // is then that later use, and a released copy is fetched again under the same source).
    const size_t src = static_cast<size_t>(s.source[i]);
    if (!copy_counted.insert({s.source[i], s.fetch_step[i]}).second) continue;
    auto& at = fetched[static_cast<size_t>(s.fetch_step[i])];
    const int layer = t.module[src] / static_cast<int>(per);
    const size_t ks = static_cast<size_t>(t.module[src]) % per;
    std::vector<double>& g = gathered[static_cast<size_t>(layer)];
    if (g.empty()) g = gathered_layer_weights(m, p, first + layer);
    const double elements = ks < g.size() ? g[ks] : t.elements[src];
    auto it = std::find_if(at.begin(), at.end(), [&](const auto& c) { return c.first == layer; });
    if (it == at.end())
      at.emplace_back(layer, elements);
    else
      it->second += elements;
  }
  u.middle = edge;
  for (size_t i = 0; i < n; ++i) {
    auto& at = fetched[i];
    std::sort(at.begin(), at.end());
    for (const auto& [layer, elements] : at)
      u.gathers[i].push_back(
          elements > 0 ? cost(gather_g, Collective::kAllGather, elements * w_bytes) : 0.0);
  }
  for (size_t i = 0; i < n; ++i) {
    const int step = s.fetch_step[i];
    const int layer = t.module[static_cast<size_t>(s.source[i])] / static_cast<int>(per);
    const auto& at = fetched[static_cast<size_t>(step)];
    u.gather_use[i] = step;
    for (size_t c = 0; c < at.size(); ++c)
      if (at[c].first == layer) u.gather_index[i] = static_cast<int>(c);
  }
  // Each layer's reduce buckets, its modules in backward order.
  const double bucket = static_cast<double>(p.zero3_reduce_bucket);
  for (int j = 0; j < layers; ++j) {
    std::vector<double> backward;
    for (size_t k = per; k-- > 0;) {
      const int use = last_use[static_cast<size_t>(j) * per + k];
      if (use >= 0) backward.push_back(t.elements[static_cast<size_t>(use)]);
    }
    const size_t modules = backward.size();
    size_t begin = 0;
    for (size_t end : reduce_call_ends(backward, bucket)) {
      double elements = 0;
      for (size_t x = begin; x <= end; ++x) elements += backward[x];
      begin = end + 1;
      const int use = last_use[static_cast<size_t>(j) * per + (modules - 1 - end)];
      u.reduces[static_cast<size_t>(use)].push_back(
          cost(reduce_g, Collective::kReduceScatter, elements * g_bytes));
    }
  }
  return play_zero3_uses(u, slowdown);
}
}  // namespace

Estimator::DataParallel Estimator::data_parallel(const Plan& p, int stage,
                                                 const StagePrice& price) {
  const StageParams params = stage_params(model_, param_counts_, p, stage);
  const int layers = std::max(1, p.layers_in_stage(model_.layers, stage));
  const int mb = p.micro_batches();
  // Compute windows of one micro-batch: forward, and backward with recompute.
  double fwd = price.forward, bwd = price.backward + price.recompute;
  const bool ds = p.zero >= 3 && p.zero3_unit == GatherUnit::kModule;
  // DeepSpeed's layers gathered again after their full recompute (not with the parameters
  // offloaded, as the lowering: core/lower_schedule.cc backward_layers).
  const int again_layers = ds && p.reshard == Reshard::kAfterForward && !p.offload.params
                               ? p.full_recompute_layers(layers)
                               : 0;
  const DataParallelKey key{
      placement(p, 500),
      p.zero,
      static_cast<int>(p.reshard) * 2 + (p.zero3_unit == GatherUnit::kModule) +
          (static_cast<int>(p.fsdp_impl) << 8) + (gradient_copies_block_host(p) ? 1 << 12 : 0) +
          (again_layers << 13),
      (p.overlap_grad_reduce ? 1 : 0) | (p.overlap_param_gather ? 2 : 0),
      static_cast<int>(p.grad_reduce_dtype),
      static_cast<int>(p.precision) | (p.fp8_param_gather ? 1 << 8 : 0),
      mb,
      params.dense,
      params.expert,
      layers,
      params.moe_layers,
      (stage == 0 ? 1 : 0) | (stage == p.pp - 1 ? 2 : 0) | (params.first_layer_moe ? 4 : 0),
      fwd,
      bwd,
      ds ? p.zero3_prefetch_bucket : 0,
      ds ? p.zero3_reduce_bucket : 0,
      ds ? p.zero3_max_reuse_distance : 0,
      ds ? p.zero3_param_persistence_threshold : 0};
  auto cached = data_parallel_.find(key);
  if (cached != data_parallel_.end()) return cached->second;
  DataParallelQueues queues;
  const DataParallelSync sync{p, layers, p.precision == Dtype::kFp32 ? 4.0 : 2.0,
                              dtype_bytes(p.grad_reduce_dtype), queues};
  const GroupModel* dense = p.dp * p.cp > 1 ? &group_model(p, Group::kDpCp) : nullptr;
  const bool hsdp_dense = p.dense_shard_ranks() < p.dp * p.cp && p.zero >= 1;
  // ZeRO-3's calls per layer (core/gather_units.h), from the stage's first layer.
  std::vector<double> ag{1.0}, rs{1.0}, again;
  if (ds) {
    const std::vector<double> w =
        dense_layer_weights(model_, p.tp, p.first_layer(model_.layers, stage, 0));
    ag = gather_fractions(p, w);
    rs = reduce_fractions(p, w);
    // The modules gathered again for the backward after the full recompute.
    if (again_layers > 0) {
      double all = 0;
      for (double x : w) all += x;
      again = regathered_weights(p, w);
      double part = 0;
      for (double x : again) part += x;
      if (part > 0 && all > 0) {
        again = gather_calls(again, static_cast<double>(p.zero3_prefetch_bucket));
        for (double& x : again) x /= all;
      } else {
        again.clear();
      }
    }
  }
  // The stage's buckets (StageParams): the dense ones and the expert ones.
  DataParallelSync::Buckets dense_buckets, expert_buckets;
  dense_buckets.n[0] = params.dense_layers;
  dense_buckets.size[0] = params.dense_layer;
  dense_buckets.n[1] = params.moe_layers;
  dense_buckets.size[1] = params.moe_layer;
  dense_buckets.head = params.head;
  dense_buckets.embedding = params.embedding;
  dense_buckets.last = params.embedding > 0      ? params.embedding
                       : params.first_layer_moe  ? params.moe_layer
                       : params.dense_layers > 0 ? params.dense_layer
                                                 : params.head;
  expert_buckets.n[0] = params.moe_layers;
  expert_buckets.size[0] = expert_buckets.last = params.expert_layer;
  // (Under LoRA the buckets are the bf16 adapters; the fp8 weights are frozen.)
  if (p.fp8_param_gather && !p.lora()) {
    int dense_at = -1, moe_at = -1;  // a dense layer and an MoE layer of the model
    for (int l = 0; l < model_.layers && (dense_at < 0 || moe_at < 0); ++l) {
      int& at = model_.is_moe_layer(l) ? moe_at : dense_at;
      if (at < 0) at = l;
    }
    if (dense_at >= 0) dense_buckets.fp8[0] = fp8_dense_layer_elements(model_, p.tp, dense_at);
    if (moe_at >= 0) {
      dense_buckets.fp8[1] = fp8_dense_layer_elements(model_, p.tp, moe_at);
      expert_buckets.fp8[0] =
          fp8_expert_layer_elements(model_, p.expert_tp(), model_.moe.experts / p.ep);
    }
  }
  // DeepSpeed's lazily gathered modules (core/zero3_live.h ds_lazy_gathers): the layers' gathers
  // and reduce-scatters played use by use beside the compute (ds_lazy_play), the embedding's and
  // head's buckets (one call each, as the lowering issues them) queued beside the passes.
  const bool lazy = ds && dense != nullptr && ds_lazy_gathers(model_, p) &&
                    model_.sliding_window <= 0 && params.dense_layers == layers;
  if (lazy) {
    const GroupModel& gg = hsdp_dense ? extra_group_model(p, ExtraGroup::kDenseShard) : *dense;
    const LayerPrice& lp = layer_price(p, false, false);
    const int full = p.recompute == Recompute::kFull ? p.full_recompute_layers(layers) : 0;
    const double edge =
        std::max(0.0, fwd + bwd - layers * (lp.forward + lp.backward) - full * lp.forward);
    const Zero3Play play =
        ds_lazy_play(model_, p, p.first_layer(model_.layers, stage, 0), layers, lp,
                     module_use_seconds(fragment(p, false, false)), edge, gg, gg, sync.w_bytes,
                     sync.g_bytes, compute_slowdown(profile_, false, true));
    queues.played_exposed += play.exposed;
    queues.played_hidden += play.comm - play.exposed;
    for (const double e : {params.embedding, params.head}) {
      if (e <= 0) continue;
      const double ag_e = gg.cost(Collective::kAllGather, e * sync.w_bytes).time_s;
      const double rs_e = gg.cost(Collective::kReduceScatter, e * sync.g_bytes).time_s;
      queues.forward.add(ag_e, 0);
      queues.backward.add(ag_e + rs_e, 0);
    }
  }
  const std::vector<double> none;
  sync.add(params.dense, dense_buckets, p.dp * p.cp,
           p.zero >= 1 ? p.dense_shard_ranks() : p.dp * p.cp, dense,
           hsdp_dense ? &extra_group_model(p, ExtraGroup::kDenseShard) : nullptr,
           hsdp_dense ? &extra_group_model(p, ExtraGroup::kDenseReplica) : nullptr,
           lazy ? none : ag, lazy ? none : rs, lazy ? none : again, again_layers);
  if (params.expert > 0 && p.expert_dp() > 1) {
    const bool grid = p.expert_tp() != p.tp;
    const GroupModel* expert =
        grid ? &extra_group_model(p, ExtraGroup::kExpertData) : &group_model(p, Group::kExpertDp);
    const bool hsdp_expert = p.expert_shard_ranks() < p.expert_dp() && p.zero >= 1;
    sync.add(params.expert, expert_buckets, p.expert_dp(),
             p.zero >= 1 ? p.expert_shard_ranks() : p.expert_dp(), expert,
             hsdp_expert ? &extra_group_model(p, ExtraGroup::kExpertShard) : nullptr,
             hsdp_expert ? &extra_group_model(p, ExtraGroup::kExpertReplica) : nullptr);
  }
  // PyTorch FSDP's own kernels: compute-stream time of the micro-batch (the windows the
  // collectives hide behind grow by it) and of the step.
  FsdpCopyTime copies = fsdp_copy_time(
      device_, profile_, p,
      {{params.dense_layers, params.dense_layer}, {params.moe_layers, params.moe_layer}},
      {params.embedding, params.head}, p.dense_shard_ranks());
  if (params.expert > 0 && p.expert_dp() > 1) {
    const FsdpCopyTime e =
        fsdp_copy_time(device_, profile_, p, {{params.moe_layers, params.expert_layer}}, {},
                       p.expert_shard_ranks());
    copies.forward += e.forward;
    copies.backward += e.backward;
    copies.step += e.step;
  }
  fwd += copies.forward;
  bwd += copies.backward;
  DataParallel out =
      queues.price(p.overlap_param_gather ? fwd : 0, p.overlap_grad_reduce ? bwd : 0);
  // DeepSpeed ZeRO-3's persistent parameters gathered again after the step, one all-gather each
  // on the dense shard group, the host waiting for them (core/gather_units.h persistent_params,
  // the lowering's persistent_gathers): exposed whole.
  if (ds && dense != nullptr && !p.offload.params && p.dense_shard_ranks() > 1) {
    const GroupModel& gg = hsdp_dense ? extra_group_model(p, ExtraGroup::kDenseShard) : *dense;
    const double ways = p.dense_shard_ranks();
    std::vector<std::pair<double, double>> priced;  // (elements, seconds) already priced
    for (const PersistentParam& x : stage_persistent_params(model_, p, stage)) {
      auto it = std::find_if(priced.begin(), priced.end(),
                             [&](const auto& e) { return e.first == x.elements; });
      if (it == priced.end()) {
        const double bytes = std::ceil(x.elements / ways) * ways * sync.w_bytes;
        priced.emplace_back(x.elements, gg.cost(Collective::kAllGather, bytes).time_s);
        it = priced.end() - 1;
      }
      out.per_step += it->second;
    }
  }
  out.per_micro_batch += copies.forward + copies.backward;
  out.per_step += copies.step;
  data_parallel_.emplace(key, out);
  return out;
}

// estimate()'s parts are inline: the search runs it millions of times a second, and out of line
// they cost it about 3% more instructions (search_bench's BM_PlanEvaluation).

// Stage s prices as stage s - 1 does: two middle stages of a model of identical layers with the
// same layer count in every virtual stage (all of them in an even plan; the middle ones when
// only the first and last stages' counts are set).
inline bool Estimator::repeats_previous(const Plan& p, int s) const {
  const Model& m = model_;
  if (s < 2 || s >= p.pp - 1 || m.is_moe() || m.sliding_window > 0) return false;
  if (!p.uneven_stages()) return true;
  for (int c = 0; c < p.chunks(); ++c)
    if (p.layers_in_chunk(m.layers, s, c) != p.layers_in_chunk(m.layers, s - 1, c)) return false;
  return true;
}

// Every distinct stage: uneven plans price each; even plans have at most three kinds (the first
// with the embedding, the last with the head, the middle ones). Fills scratch_stages_ and
// scratch_dps_ (kept between evaluations: the search calls this millions of times) and each
// stage's micro-batch slot into `slots`.
inline void Estimator::price_stages(const Plan& p, std::vector<double>& slots) {
  std::vector<StagePrice>& stages = scratch_stages_;
  std::vector<DataParallel>& dps = scratch_dps_;
  stages.assign(p.pp, StagePrice{});
  dps.assign(p.pp, DataParallel{});
  slots.assign(p.pp, 0.0);
  for (int s = 0; s < p.pp; ++s) {
    if (repeats_previous(p, s)) {
      stages[s] = stages[s - 1];
      dps[s] = dps[s - 1];
    } else {
      stages[s] = stage_price(p, s);
      dps[s] = data_parallel(p, s, stages[s]);
      stages[s].dp = dps[s].per_micro_batch;
      stages[s].dp_hidden = dps[s].per_micro_batch_hidden;
    }
    stages[s].host = host_excess(p, s, stages[s]);
    slots[s] =
        stages[s].slot() +
        hidden_overlap(profile_, stages[s], stages[s].dp_hidden, dps[s].per_micro_batch_excess) +
        stages[s].host;
  }
}

// The host-link bandwidth left to offload copies. Host copies share the GPU's PCIe link with
// its NIC: while inter-server communication runs (the data-parallel traffic of a group that
// spans servers, exposed or hidden), copies get what the NIC leaves, and at least the half that
// two flows wanting the whole link each get (the processor sharing by which the simulator's
// links serve concurrent transfers: sim/engine.cc share_update). Without that floor a NIC busy
// the whole step on a link it fills left the copies no bandwidth, and the tail's seconds (the
// optimizer's, the offload's, the step's data-parallel traffic) came out NaN and were dropped.
inline double Estimator::offload_bandwidth(const Plan& p, int crit, int mb, double pipeline) {
  double nic_busy = 0;
  if (p.offload.any() && p.dp * p.cp > 1 && nic_share_of_pcie_ > 0) {
    if (group_model(p, Group::kDpCp).nodes() > 1) {
      const DataParallel& dp0 = scratch_dps_[crit];
      const double comm = mb * (dp0.per_micro_batch + dp0.per_micro_batch_hidden) + dp0.per_step +
                          dp0.per_step_hidden;
      nic_busy = std::min(1.0, comm / std::max(pipeline, 1e-12));
    }
  }
  return host_bw_ * std::max(0.5, 1 - nic_busy * nic_share_of_pcie_);
}

namespace {
// Exposed seconds per step of streaming a stage's weights (`params` of them) in from host
// memory, per layer for the forward, the backward and any recompute.
double param_offload_time(const Plan& p, const Estimator::StagePrice& stage, double params,
                          double host_bw, int mb) {
  const double w_bytes = p.precision == Dtype::kFp32 ? 4 : 2;
  const double bwd = stage.backward + stage.recompute;
  const double bytes = params * w_bytes / (p.zero >= 3 ? p.dense_shard_ranks() : 1);
  const double copy = bytes / host_bw;
  // Under ZeRO-3 the shard comes in when the reshard policy gathers: every forward and
  // backward (after_forward), every forward (after_backward), once per step (after_step).
  // A full recompute reads the weights its layer's backward then uses: one copy in the backward
  // (core/lower_schedule.cc, backward_layers).
  const double fwd_copy = std::max(0.0, copy - stage.forward);
  const double bwd_copy = std::max(0.0, copy - bwd);
  if (p.zero < 3 || p.reshard == Reshard::kAfterForward) return mb * (fwd_copy + bwd_copy);
  if (p.reshard == Reshard::kAfterBackward) return mb * fwd_copy;
  return fwd_copy;
}

// Exposed seconds per step of copying a stage's activations to host memory in the forward and
// back in the backward.
double activation_offload_time(const Model& m, const Plan& p, const Estimator::StagePrice& stage,
                               int layers, double host_bw, int mb) {
  const double bwd = stage.backward + stage.recompute;
  double act = 0;
  const int full = p.full_recompute_layers(layers);
  const Recompute rest = p.recompute == Recompute::kFull ? Recompute::kNone : p.recompute;
  act = full * layer_activation_bytes(m, p, Recompute::kFull, false) +
        (layers - full) * layer_activation_bytes(m, p, rest, false);
  const double copy = act / host_bw;
  return mb * (std::max(0.0, copy - stage.forward) + std::max(0.0, copy - bwd));
}
}  // namespace

// What the step waits for of every stage's reductions held back to its chunks' last backwards
// (DataParallel::held; core/fsdp_pipeline_reduce.h exposed_chunk_reductions): each stage's
// chunk-0 share by its layers, and how far ahead a stage that feeds the longest stage's backward
// (a later stage: the backward flows from the last stage to the first) runs in a cool-down round
// of pp micro-batches.
inline double Estimator::held_reductions_exposed(const Plan& p) const {
  if (!chunk_reductions_block_compute(p)) return 0;
  int slowest = 0;  // the last of the longest
  double longest = 0;
  for (int s = 0; s < p.pp; ++s) {
    const double bwd = scratch_stages_[s].backward + scratch_stages_[s].recompute;
    if (bwd >= longest) longest = bwd, slowest = s;
  }
  double exposed = 0;
  for (int s = 0; s < p.pp; ++s) {
    const double held = scratch_dps_[s].held;
    const int layers = p.layers_in_stage(model_.layers, s);
    if (held <= 0 || layers <= 0) continue;
    const double first = held * p.layers_in_chunk(model_.layers, s, 0) / layers;
    const StagePrice& st = scratch_stages_[s];
    const double ahead = s > slowest ? (longest - st.backward - st.recompute) * p.pp : 0.0;
    exposed += exposed_chunk_reductions(held, first, ahead);
  }
  return exposed;
}

// What stage s adds after the pipeline: its per-step data-parallel traffic (with what the step
// waits for of the held reductions, scratch_held_), the optimizer step and offload (dp_comm,
// overlap, optimizer and offload of the breakdown).
inline TimeBreakdown Estimator::stage_tail(const Plan& p, int s, int mb, double host_bw) const {
  const Model& m = model_;
  const Profile& f = profile_;
  const StagePrice& stage = scratch_stages_[s];
  const DataParallel& dp = scratch_dps_[s];
  const StageParams sp_params = stage_params(m, param_counts_, p, s);
  const double shard_params = p.zero >= 1 ? sp_params.dense / p.dense_shard_ranks() +
                                                sp_params.expert / p.expert_shard_ranks()
                                          : sp_params.total();
  TimeBreakdown t;
  t.dp_comm = dp.per_step + scratch_held_;
  // The step's data-parallel traffic hides behind a micro-batch's compute beside its own.
  t.overlap = hidden_overlap(f, stage, stage.dp_hidden + dp.per_step_hidden,
                             dp.per_micro_batch_excess + dp.per_step_excess) -
              hidden_overlap(f, stage, stage.dp_hidden, dp.per_micro_batch_excess);
  const double grad_bytes = offloaded_gradient_bytes(p),
               w_bytes = p.precision == Dtype::kFp32 ? 4 : 2;
  const double bwd = stage.backward + stage.recompute;
  const int layers = std::max(1, p.layers_in_stage(m.layers, s));
  if (p.offload.optimizer) {
    // Gradients down (beside the backward, or in its stream: core/offload_rules.h), CPU Adam
    // (the server's host shared by its GPUs: cost_models/host_optimizer.h), weights back up,
    // unless the weights live in host memory too and no all-gather of the update needs them on
    // the device: parameter offload under ZeRO-3 (FSDP's CPUOffloadPolicy and DeepSpeed's
    // offload_param step the host shard in place; the next gather copies it in) or without a
    // sharded update (core/lower_optimizer.cc publish_update copies nothing then).
    const double down = shard_params * grad_bytes / host_bw;
    const bool update_stays_on_host =
        p.offload.params && (p.zero >= 3 || p.zero == 0 || p.dense_shard_ranks() == 1);
    const double up = update_stays_on_host ? 0 : shard_params * w_bytes / host_bw;
    // Exposed whole when the backward's stream copies them or the host waits for each
    // (DeepSpeed ZeRO-3's blocking copy_).
    const double down_exposed = gradient_copies_serialized(p) || gradient_copies_block_host(p)
                                    ? down
                                    : overlap(down, bwd, layers).first;
    t.offload += down_exposed + host_optimizer_seconds(cluster_, f, p, shard_params) + up;
  } else {
    t.optimizer = optimizer_time(device_, f, p.precision, shard_params, p.optimizer_dtype);
  }
  const double step_device = t.optimizer;
  // The global gradient norm reads this rank's gradient shard on the device first (the
  // lowering's grad.norm op).
  t.optimizer += memory_time(device_, f, kGradNormBytesPerParam * shard_params);
  // The optimizer's ops follow the last micro-batch's backward with no sync between: the host
  // issues them while the device still runs the backlog it left (the backward's device time
  // beyond the host's issue) and the step's data-parallel tail.
  double backlog = 0;
  const double edges = host_edges(stage, mb, backlog);
  double statistics = 0;
  t.host = optimizer_host(p, s, t.optimizer - step_device + t.dp_comm + std::max(0.0, backlog),
                          step_device, statistics) +
           edges;
  t.optimizer += statistics;
  if (p.offload.params) t.offload += param_offload_time(p, stage, sp_params.total(), host_bw, mb);
  if (p.offload.activations) t.offload += activation_offload_time(m, p, stage, layers, host_bw, mb);
  return t;
}

// What the host adds to the step after the pipeline (core/host_issue.h): the optimizer step's
// ops take the longer of the host's issue (per parameter bucket AdamW and, with an fp32 master,
// the cast; the gradient norm and its all-reduces: cost_models/host_cost.h) and the device's
// (`device_before` the step: the backlog, the data-parallel tail and the gradient norm;
// `device_step`: AdamW and the cast); then the step's closing sync wakes the host; a
// full-iteration graph's replay. Megatron's logged statistics (core/lower_optimizer.cc) split
// the stretch: the zero count and its .item() between the norm and the step, the parameter norm
// and its .item() after the closing sync; `statistics_device` returns their device seconds.
double Estimator::optimizer_host(const Plan& p, int s, double device_before, double device_step,
                                 double& statistics_device) const {
  const Model& m = model_;
  const Profile& f = profile_;
  const StageParams sp = stage_params(m, param_counts_, p, s);
  const int layers = std::max(1, p.layers_in_stage(m.layers, s));
  Op op;
  op.tags.phase = Phase::kOptimizer;
  double host = 0;
  double tensors_all = 0;
  const bool cast = p.optimizer_dtype == Dtype::kFp32 && p.precision != Dtype::kFp32;
  // `count` buckets of `tensors` tensors and `elements` elements each.
  auto bucket = [&](int tensors, double elements, int count = 1) {
    op.tensors = tensors;
    op.elements = elements;
    op.kind = OpKind::kAdamW;
    host += count * host_issue_seconds(op, p, f);
    if (cast) {
      op.kind = OpKind::kCast;
      host += count * host_issue_seconds(op, p, f);
    }
    tensors_all += static_cast<double>(count) * tensors;
  };
  const double dense_ways = p.zero >= 1 ? p.dense_shard_ranks() : 1;
  const double expert_ways = p.zero >= 1 ? p.expert_shard_ranks() : 1;
  // One bucket per layer; a run of consecutive layers of equal tensor counts is priced once,
  // times its length (no allocation: this runs for every plan the search weighs).
  const double per_layer = sp.dense / layers / dense_ways;
  int moe_layers = 0, run_tensors = -1, run = 0;
  for (int c = 0; c < p.chunks(); ++c) {
    const int first = p.first_layer(m.layers, s, c);
    const int end = first + p.layers_in_chunk(m.layers, s, c);
    for (int l = first; l < end; ++l) {
      // Under LoRA a layer's bucket holds its adapters' A and B (core/lower_lora.cc).
      const int tensors = p.lora() ? 2 * std::popcount(p.lora_targets) : layer_tensors_[l];
      if (tensors != run_tensors) {
        if (run > 0) bucket(run_tensors, per_layer, run);
        run_tensors = tensors;
        run = 0;
      }
      ++run;
      if (m.is_moe() && m.is_moe_layer(l)) ++moe_layers;
    }
  }
  if (run > 0) bucket(run_tensors, per_layer, run);
  if (moe_layers > 0) bucket(expert_tensors_, sp.expert / moe_layers / expert_ways, moe_layers);
  // The embedding's and head's buckets (frozen under LoRA: not in the optimizer).
  const double table = static_cast<double>(vocab_shard(m, p.tp)) * m.hidden;  // as lowered
  if (s == 0 && !p.lora()) bucket(1, table / dense_ways);
  if (s == p.pp - 1 && !p.lora()) bucket(2, table / dense_ways);
  const double step_host = host;
  op.kind = OpKind::kGradNorm;
  op.tensors = static_cast<int>(tensors_all);
  op.elements = sp.total();
  const double norm_host = host_issue_seconds(op, p, f);
  // The all-reduces of a gradient statistic (the lowering's grad_stats_all_reduce).
  const bool sharded = p.zero >= 1 || p.ep > 1 || (p.etp > 0 && p.etp != p.tp);
  Op ar;
  ar.kind = OpKind::kAllReduce;
  ar.tags.phase = Phase::kOptimizer;
  const double stat_ar =
      ((p.tp > 1) + (p.pp > 1) + (sharded && p.dp * p.cp > 1)) * host_issue_seconds(ar, p, f);
  Op sync;
  sync.kind = OpKind::kSync;
  sync.tags.phase = Phase::kOptimizer;
  const double sync_host = f.host_sync_s + host_issue_seconds(sync, p, f);
  // A logged statistic's ops over this rank's optimizer shard (the lowering's elements).
  const double shard = sp.dense / dense_ways + sp.expert / expert_ways;
  auto statistic = [&](OpKind kind, double bytes_per_param, double& device) {
    Op st;
    st.kind = kind;
    st.tags.phase = Phase::kOptimizer;
    st.tensors = static_cast<int>(tensors_all);
    st.elements = shard;
    device = small_kernels_time(device_, f, bytes_per_param * shard, kernel_launches(st, p));
    statistics_device += device;
    return host_issue_seconds(st, p, f) + stat_ar;
  };
  statistics_device = 0;
  double excess = 0;
  const double before_host = norm_host + ((p.tp > 1) + (p.pp > 1)) * host_issue_seconds(ar, p, f);
  if (p.log_num_zeros_in_grad) {
    double zeros_device = 0;
    const double zeros_host =
        statistic(OpKind::kCountZeros, kCountZerosBytesPerParam, zeros_device);
    const double dev = device_before + zeros_device;
    excess += std::max(0.0, host_paced(before_host + zeros_host, dev) - dev) + sync_host;
    excess += std::max(0.0, host_paced(step_host, device_step) - device_step);
  } else {
    const double dev = device_before + device_step;
    excess += std::max(0.0, host_paced(before_host + step_host, dev) - dev);
  }
  excess += sync_host;
  if (p.log_params_norm) {
    double norm_device = 0;
    const double pnorm_host = statistic(OpKind::kParamNorm, kParamNormBytesPerParam, norm_device);
    // One op after the host has waited for the step: its Python (the filter over the
    // parameters, then the calls) before its kernels run.
    excess += pnorm_host + sync_host;
  }
  if (p.cuda_graphs == CudaGraphs::kFullIteration) excess += f.host_graph_launch_s;
  return excess;
}

// After the pipeline: per-step data-parallel traffic, the optimizer and offload, on the stage
// that takes longest.
inline TimeBreakdown Estimator::slowest_tail(const Plan& p, int crit, int mb, double pipeline) {
  const double host_bw = offload_bandwidth(p, crit, mb, pipeline);
  double tail = 0;
  TimeBreakdown tail_parts;
  for (int s = 0; s < p.pp; ++s) {
    if (repeats_previous(p, s)) continue;  // the same tail as the stage before
    const TimeBreakdown t = stage_tail(p, s, mb, host_bw);
    const double total = t.dp_comm + t.overlap + t.optimizer + t.offload + t.host;
    if (total > tail) {
      tail = total;
      tail_parts = t;
    }
  }
  return tail_parts;
}

// Throughput, model and hardware FLOPs and MFU/HFU of the step e.step_time_s.
inline void Estimator::fill_throughput(const Plan& p, int mb, Estimate& e) const {
  const int64_t seq = p.seq(model_);
  const double tokens = static_cast<double>(p.global_batch) * seq;
  e.tokens_per_s = tokens / e.step_time_s;
  e.samples_per_s = p.global_batch / e.step_time_s;
  const FlopsPerToken fpt = flops_per_token(model_, seq);
  e.model_flops_per_step = fpt.model * tokens;
  // Executed FLOPs: the model's plus what recompute re-runs, summed over the stages and scaled
  // to the ranks of a stage (each stage's ranks share its work).
  double recompute_flops = 0;
  for (const StagePrice& s : scratch_stages_) recompute_flops += s.recompute_flops;
  const double ranks_per_stage = static_cast<double>(p.tp) * p.cp * p.dp;
  e.hardware_flops_per_step = e.model_flops_per_step + recompute_flops * mb * ranks_per_stage;
  const double peak = device_.peak_flops(p.precision) * cluster_.num_gpus() * e.step_time_s;
  e.mfu = e.model_flops_per_step / peak;
  e.hfu = e.hardware_flops_per_step / peak;
}

// The memory of the rank with the largest peak against the GPU's and its server's host memory.
inline void Estimator::fill_memory(const Plan& p, const MemoryBreakdown& memory, int stage,
                                   Estimate& e) const {
  const DeviceSpec& d = device_;
  e.memory = memory;
  e.framework =
      framework_memory(memory, p, stage, profile_, fragmentation_low_, fragmentation_high_);
  e.memory_per_gpu_bytes = e.framework.device_used();
  e.device_memory_bytes = d.hbm_bytes;
  e.host_memory_per_server_bytes = memory.host * std::max(1, cluster_.gpus_per_server());
  e.host_memory_capacity_bytes = host_memory_pinnable_bytes(cluster_);
  e.memory_fit = memory_fit(e.framework, d.hbm_bytes);
  e.fits = e.memory_per_gpu_bytes <= d.hbm_bytes &&
           e.host_memory_per_server_bytes <= e.host_memory_capacity_bytes;
}

Estimate Estimator::estimate(const Plan& p, const MemoryBreakdown& memory) {
  Estimate e;
  const int mb = p.micro_batches();
  price_stages(p, e.stage_slot_s);
  scratch_held_ = held_reductions_exposed(p);
  const std::vector<double>& slots = e.stage_slot_s;
  const int crit = static_cast<int>(std::max_element(slots.begin(), slots.end()) - slots.begin());
  const double slot_max = slots[crit];
  const double slot_sum = std::accumulate(slots.begin(), slots.end(), 0.0);
  // Pipeline: the slowest stage paces the steady state; the others add to fill and drain
  // (interleaving divides the fill by the virtual stages per rank), once per flush
  // (Plan::pipeline_flushes: schedules run one after another, each filled and drained).
  double pipeline = mb * slot_max;
  if (p.pp > 1) pipeline += p.pipeline_flushes * (slot_sum - slot_max) / p.chunks();
  const TimeBreakdown tail_parts = slowest_tail(p, crit, mb, pipeline);

  // The step: the critical stage's micro-batches, the fill and drain, then the tail.
  e.critical_stage = crit;
  const StagePrice& c = scratch_stages_[crit];
  TimeBreakdown& tb = e.time;
  tb.forward = mb * c.forward;
  tb.backward = mb * c.backward;
  tb.recompute = mb * c.recompute;
  tb.tp_comm = mb * c.tp;
  tb.cp_comm = mb * c.cp;
  tb.ep_comm = mb * c.ep;
  tb.pp_comm = mb * c.pp;
  tb.dp_comm = mb * c.dp + tail_parts.dp_comm;
  tb.overlap =
      mb * hidden_overlap(profile_, c, c.dp_hidden, scratch_dps_[crit].per_micro_batch_excess) +
      tail_parts.overlap;
  tb.bubble = pipeline - mb * slot_max;
  tb.optimizer = tail_parts.optimizer;
  tb.offload = tail_parts.offload;
  tb.host = mb * c.host + tail_parts.host;
  e.step_time_s = tb.total();
  e.moe.add(c.moe, mb);

  fill_throughput(p, mb, e);
  fill_memory(p, memory, -1, e);
  return e;
}

Estimate estimate(const Model& model, const Cluster& cluster, const Plan& plan,
                  const Profile& profile, Reserved reserved) {
  Estimator est(model, cluster, profile);
  return est.estimate(plan, reserved);
}

Json estimate_to_json(const Estimate& e) {
  const TimeBreakdown& t = e.time;
  const MemoryBreakdown& m = e.memory;
  Json j = {{"step_time_s", e.step_time_s},
            {"tokens_per_s", e.tokens_per_s},
            {"samples_per_s", e.samples_per_s},
            {"mfu", e.mfu},
            {"hfu", e.hfu},
            {"model_flops_per_step", e.model_flops_per_step},
            {"hardware_flops_per_step", e.hardware_flops_per_step},
            {"memory_per_gpu_bytes", e.memory_per_gpu_bytes},
            {"device_memory_bytes", e.device_memory_bytes},
            {"memory", framework_memory_to_json(e.framework)},
            {"host_memory_per_server_bytes", e.host_memory_per_server_bytes},
            {"host_memory_capacity_bytes", e.host_memory_capacity_bytes},
            {"memory_fit", memory_fit_name(e.memory_fit)},
            {"fits", e.fits},
            {"stage_slot_s", e.stage_slot_s},
            {"critical_stage", e.critical_stage},
            {"time_breakdown_s",
             {{"forward", t.forward},
              {"backward", t.backward},
              {"recompute", t.recompute},
              {"tp_comm", t.tp_comm},
              {"cp_comm", t.cp_comm},
              {"ep_comm", t.ep_comm},
              {"pp_comm", t.pp_comm},
              {"bubble", t.bubble},
              {"dp_comm", t.dp_comm},
              {"optimizer", t.optimizer},
              {"offload", t.offload},
              {"overlap_slowdown", t.overlap},
              {"host_bound", t.host}}},
            {"moe_breakdown_s",
             {{"expert_gemm", e.moe.expert_gemm},
              {"permutation", e.moe.permutation},
              {"routing", e.moe.routing},
              {"expert_activation", e.moe.activation},
              {"expert_bias", e.moe.expert_bias},
              {"imbalance", e.moe.imbalance},
              {"dispatch", t.ep_comm}}},
            {"memory_breakdown_bytes",
             {{"weights", m.weights},
              {"gradients", m.gradients},
              {"optimizer", m.optimizer},
              {"activations", m.activations},
              {"transient", m.transient},
              {"buffers", m.buffers},
              {"host", m.host}}}};
  if (e.peak_stage >= 0) {
    j["peak_stage"] = e.peak_stage;
    j["peak_rank"] = e.peak_rank;
    Json stages = Json::array();
    for (const FrameworkMemory& f : e.stage_memory) stages.push_back(framework_memory_to_json(f));
    j["memory_per_stage"] = stages;
  }
  return j;
}

CommBytes Estimator::layer_comm_bytes(const Plan& p, int layer) {
  PARASOL_CHECK(0 <= layer && layer < model_.layers, "layer " + std::to_string(layer));
  const LayerPrice& lp =
      layer_price(p, model_.is_moe_layer(layer), model_.is_windowed_layer(layer));
  CommBytes b;
  b.tp = lp.tp_bytes_forward + lp.tp_bytes_backward;
  b.cp = lp.cp_bytes_forward + lp.cp_bytes_backward;
  b.ep = lp.ep_bytes_forward + lp.ep_bytes_backward;
  if (p.recompute == Recompute::kFull) {  // the forward again, with its communication
    b.tp += lp.tp_bytes_forward;
    b.cp += lp.cp_bytes_forward;
    b.ep += lp.ep_bytes_forward;
  }
  return b;
}

}  // namespace parasol::cost
