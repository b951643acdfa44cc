// The closed-form plan estimate. One layer is decomposed into the ops of a Megatron-style
// decoder layer (norms, QKV/out/MLP GEMMs, attention core, residuals, TP/SP collectives, MoE
// routing and all-to-all); their prices make the per-micro-batch stage time, which the
// pipeline schedule, data-parallel synchronisation, optimizer and offload turn into a step.
#include "cost_models/estimate.h"

#include <algorithm>
#include <cmath>

#include "cost_models/compute.h"

namespace parasol::cost {

namespace {
int order_code(const Plan& p) {
  int code = 0;
  for (Dim d : p.rank_order) code = code * 5 + static_cast<int>(d);
  return code;
}
// The exposed part of communication that can hide behind `window` seconds of compute; at
// least one bucket in `buckets` stays exposed.
double exposed(double comm, double window, int buckets) {
  if (comm <= 0) return 0;
  return std::max(comm - window, comm / std::max(1, buckets));
}
}  // namespace

Estimator::Estimator(const Model& model, const Cluster& cluster, Profile profile)
    : model_(model),
      cluster_(cluster),
      profile_(std::move(profile)),
      device_(cluster.gpu_device(0)),
      host_bw_(cluster.host_link_bw(0) * profile_.host_copy_efficiency) {}

Estimate Estimator::estimate(const Plan& plan) {
  return estimate(plan, memory_per_rank(model_, cluster_, plan));
}

Estimator::PlacementKey Estimator::placement(const Plan& p, int what) const {
  return {what, p.tp, p.cp, p.ep, p.dp, p.pp, order_code(p)};
}

const GroupModel& Estimator::group_model(const Plan& plan, Group g) {
  auto key = placement(plan, static_cast<int>(g));
  auto it = groups_.find(key);
  if (it != groups_.end()) return *it->second;
  RankLayout layout(plan);
  std::vector<int> group = layout.group(g, 0);
  // Concurrent groups: those of pipeline stage 0 (the other stages sit on other servers).
  std::vector<std::vector<int>> concurrent;
  for (auto& other : layout.groups(g)) {
    if (other == group) continue;
    bool in_stage0 = true;
    for (int r : other) in_stage0 = in_stage0 && layout.coord(r).pp == 0;
    if (in_stage0) concurrent.push_back(std::move(other));
    if (concurrent.size() >= 64) break;
  }
  auto model = std::make_unique<GroupModel>(cluster_, profile_, group, concurrent,
                                            /*price_all_to_all=*/g == Group::kEp);
  return *groups_.emplace(key, std::move(model)).first->second;
}

double Estimator::pp_transfer_time(const Plan& plan, double bytes) {
  if (plan.pp < 2 || bytes <= 0) return 0;
  auto key = placement(plan, 100);
  auto it = pp_links_.find(key);
  if (it == pp_links_.end()) {
    RankLayout layout(plan);
    std::vector<Flow> flows;
    for (int r = 0; r < layout.world() && flows.size() < GroupModel::kMaxPricedFlows; ++r) {
      RankCoord c = layout.coord(r);
      if (c.pp != 0) continue;
      RankCoord next = c;
      next.pp = 1;
      flows.push_back({r, layout.rank(next)});
    }
    double bw = 1e300, lat = 0;
    for (const FlowRate& f : concurrent_flow_rates(cluster_, profile_, flows)) {
      bw = std::min(bw, f.bw);
      lat = std::max(lat, f.latency);
    }
    it = pp_links_.emplace(key, std::make_pair(bw, lat + profile_.collective_step_latency_s)).first;
  }
  return bytes / it->second.first + it->second.second;
}

const LayerPrice& Estimator::layer_price(const Plan& p, bool moe_layer) {
  auto key = std::make_tuple(placement(p, 200), p.micro_batch, p.seq(model_), p.sequence_parallel,
                             p.flash_attention, static_cast<int>(p.precision), moe_layer);
  auto it = layers_.find(key);
  if (it != layers_.end()) return it->second;

  const Model& m = model_;
  const DeviceSpec& d = device_;
  const Profile& f = profile_;
  const Dtype math = p.precision;
  const Dtype attn_dtype = p.precision == Dtype::kFp8 ? Dtype::kBf16 : p.precision;
  const double eb = p.precision == Dtype::kFp32 ? 4 : 2;
  const int64_t t = p.tp;
  const int64_t seq = p.seq(m);
  const int64_t T = static_cast<int64_t>(p.micro_batch) * seq / p.cp;  // tokens on this rank
  const double Tn = p.sequence_parallel ? static_cast<double>(T) / t : static_cast<double>(T);
  const int64_t h = m.hidden;
  const double drop = m.dropout ? 1 : 0;

  LayerPrice lp;
  // A GEMM (m x k)(k x n): forward, and the two backward GEMMs (data and weight gradients).
  double fwd_flops = 0;
  auto linear = [&](int64_t rows, int64_t n, int64_t k) {
    lp.forward += gemm_time(d, f, math, rows, n, k);
    lp.backward += gemm_time(d, f, math, rows, k, n) + gemm_time(d, f, math, k, n, rows);
    fwd_flops += 2.0 * rows * n * k;
  };
  auto elementwise = [&](double bytes) {
    lp.forward += memory_time(d, f, bytes);
    lp.backward += memory_time(d, f, 2 * bytes);
  };
  // Norms: read x, write y (+ stats); residual add with optional dropout mask.
  auto norm = [&]() { elementwise(2 * eb * Tn * h); };
  auto residual = [&]() { elementwise((3 * eb + drop) * Tn * h); };

  // TP/SP collectives of one layer: two (all-reduce) or four (all-gather + reduce-scatter).
  const GroupModel* tp = t > 1 ? &group_model(p, Group::kTp) : nullptr;
  const double act_bytes = eb * static_cast<double>(T) * h;
  auto tp_pair = [&]() {  // the g operator (after row-parallel) and the f operator (before column)
    if (!tp) return std::make_pair(0.0, 0.0);
    if (p.sequence_parallel)
      return std::make_pair(tp->cost(Collective::kReduceScatter, act_bytes).time_s,
                            tp->cost(Collective::kAllGather, act_bytes).time_s);
    return std::make_pair(tp->cost(Collective::kAllReduce, act_bytes).time_s, 0.0);
  };
  auto [g_op, f_op] = tp_pair();

  // --- attention block
  norm();
  linear(T, (m.q_dim() + 2 * m.kv_dim()) / t, h);
  AttnShape a;
  a.batch = p.micro_batch;
  a.seq_q = seq / p.cp;
  a.seq_kv = seq;
  a.heads = m.heads / t;
  a.kv_heads = m.kv_heads / t;
  a.head_dim = m.head_dim;
  a.causal = true;
  a.flash = p.flash_attention;
  a.dropout = m.dropout;
  lp.attention_forward = attention_forward_time(d, f, attn_dtype, a);
  double attn_bwd = attention_backward_time(d, f, attn_dtype, a);
  lp.forward += lp.attention_forward;
  lp.backward += attn_bwd;
  lp.attention_flops = attention_flops(a);
  fwd_flops += lp.attention_flops;
  linear(T, h, m.q_dim() / t);
  residual();
  // Forward: f is the identity (no SP) or an all-gather (SP); g is an all-reduce or a
  // reduce-scatter. Backward runs the conjugates: f's backward is g's collective and g's
  // backward is f's; under SP the backward also all-gathers the saved sequence shard again for
  // the weight gradient. All of it is priced as exposed: Megatron-LM issues these collectives
  // on the compute path, and treating its async all-reduce as hidden behind the weight-gradient
  // GEMM makes the Korthikanti suite worse (mean 7.5% instead of 3.2%).
  lp.tp_forward += g_op + f_op;
  lp.tp_backward += g_op + 2 * f_op;

  // Context parallelism: ring exchange of K/V chunks (cp - 1 steps), overlapped with the
  // attention of the chunk in hand; backward sends K/V and their gradients (cp hops).
  if (p.cp > 1) {
    const GroupModel& cp = group_model(p, Group::kCp);
    double kv_bytes = 2.0 * eb * T * m.kv_dim() / t;
    double step = kv_bytes / cp.ring_bw() + cp.ring_step_latency();
    double steps = p.cp - 1;
    lp.cp_forward = std::max(0.0, steps * (step - lp.attention_forward / p.cp));
    // Plus the K/V gradients' final hop home, after the last step (exposed).
    lp.cp_backward = std::max(0.0, steps * (2 * step - attn_bwd / p.cp)) + step;
  }

  // --- MLP block
  norm();
  const int64_t up_cols = (m.activation == Activation::kSwiglu ? 2 : 1);
  if (!moe_layer) {
    linear(T, up_cols * m.ffn / t, h);
    elementwise((up_cols + 1) * eb * static_cast<double>(T) * m.ffn / t);
    linear(T, h, m.ffn / t);
  } else {
    // Router, then dispatch tokens to experts (all-to-all over ep), expert MLPs on the tokens
    // routed here (balanced load), and combine.
    linear(T, m.moe.experts, h);
    elementwise(4.0 * T * m.moe.experts * 2);
    const int64_t routed = T * m.moe.top_k;
    linear(routed, up_cols * m.moe.expert_ffn / t, h);
    elementwise((up_cols + 1) * eb * static_cast<double>(routed) * m.moe.expert_ffn / t);
    linear(routed, h, m.moe.expert_ffn / t);
    elementwise(2 * eb * static_cast<double>(routed) * h);  // permute and un-permute
    if (p.ep > 1) {
      const GroupModel& ep = group_model(p, Group::kEp);
      double bytes = eb * (static_cast<double>(routed) / (p.sequence_parallel ? t : 1)) * h;
      double a2a = ep.cost(Collective::kAllToAll, bytes).time_s;
      lp.ep = 2 * a2a /*fwd*/ + 2 * a2a /*bwd*/;
    }
  }
  residual();
  lp.tp_forward += g_op + f_op;
  lp.tp_backward += g_op + 2 * f_op;
  lp.forward_flops = fwd_flops;
  return layers_.emplace(key, lp).first->second;
}

Estimate Estimator::estimate(const Plan& p, const MemoryBreakdown& memory) {
  const Model& m = model_;
  const DeviceSpec& d = device_;
  const Profile& f = profile_;
  Estimate e;
  const int per_stage = m.layers / p.pp;
  const int mb = p.micro_batches();
  const int64_t seq = p.seq(m);
  const int64_t T = static_cast<int64_t>(p.micro_batch) * seq / p.cp;
  const double eb = p.precision == Dtype::kFp32 ? 4 : 2;
  const Dtype math = p.precision;

  // Layers of the slowest stage (MoE layers are spread evenly over stages).
  const int moe_total = m.moe_layer_count();
  const double moe_per_stage = static_cast<double>(moe_total) / p.pp;
  const double dense_per_stage = per_stage - moe_per_stage;
  const LayerPrice& dense = layer_price(p, false);
  const LayerPrice zero_price{};
  const LayerPrice& moe = moe_total > 0 ? layer_price(p, true) : zero_price;
  auto per_layers = [&](auto field) {
    return dense_per_stage * (dense.*field) + moe_per_stage * (moe.*field);
  };
  double F = per_layers(&LayerPrice::forward);
  double B = per_layers(&LayerPrice::backward);
  double tp_f = per_layers(&LayerPrice::tp_forward), tp_b = per_layers(&LayerPrice::tp_backward);
  double cp_c = per_layers(&LayerPrice::cp_forward) + per_layers(&LayerPrice::cp_backward);
  double ep_c = per_layers(&LayerPrice::ep);
  // Recompute of the forward: full (whole layer incl. its TP communication) for the first
  // k layers, selective (attention core) for the others when selected.
  const int full = p.full_recompute_layers(per_stage);
  const double full_share = per_stage ? static_cast<double>(full) / per_stage : 0;
  double R = full_share * (F + tp_f);
  double recompute_flops = full_share * per_layers(&LayerPrice::forward_flops);
  if (p.recompute == Recompute::kSelective) {
    R += per_layers(&LayerPrice::attention_forward);
    recompute_flops += per_layers(&LayerPrice::attention_flops);
  }

  // Edge stages: embedding on the first, output layer and loss on the last; the slowest stage
  // sets the pace, so add the larger of the two (both when pp == 1).
  const int64_t t = p.tp;
  double head_f = gemm_time(d, f, math, T, m.vocab / t, m.hidden) +
                  memory_time(d, f, (eb + 4 * 2) * static_cast<double>(T) * m.vocab / t);
  double head_b = gemm_time(d, f, math, T, m.hidden, m.vocab / t) +
                  gemm_time(d, f, math, m.hidden, m.vocab / t, T) +
                  memory_time(d, f, (4 + eb) * static_cast<double>(T) * m.vocab / t);
  double emb_f = memory_time(d, f, 2 * eb * static_cast<double>(T) * m.hidden);
  double emb_b = memory_time(d, f, 3 * eb * static_cast<double>(T) * m.hidden);
  double edge_f = p.pp == 1 ? head_f + emb_f : std::max(head_f, emb_f);
  double edge_b = p.pp == 1 ? head_b + emb_b : std::max(head_b, emb_b);
  // The output layer's TP reduction of the loss is negligible; its input all-gather under SP is
  // one more f-operator.
  F += edge_f;
  B += edge_b;

  // Pipeline: per micro-batch, every chunk boundary sends activations forward and gradients
  // backward (Megatron scatters them over the TP ranks: 1/tp each).
  double p2p = 0;
  if (p.pp > 1) p2p = 2.0 * p.vpp * pp_transfer_time(p, eb * static_cast<double>(T) * m.hidden / t);
  const double slot = F + B + R + tp_f + tp_b + cp_c + ep_c + p2p;
  double fill = 0;
  if (p.pp > 1)
    fill = (p.schedule == Schedule::kInterleaved ? (p.pp - 1.0) / p.vpp : p.pp - 1.0) * slot;

  TimeBreakdown& tb = e.time;
  tb.forward = mb * F;
  tb.backward = mb * B;
  tb.recompute = mb * R;
  tb.tp_comm = mb * (tp_f + tp_b);
  tb.cp_comm = mb * cp_c;
  tb.ep_comm = mb * ep_c;
  tb.pp_comm = mb * p2p;
  tb.bubble = fill;

  // Data parallelism and ZeRO over the dp x cp group (experts over (dp / ep) x cp).
  const StageParams sp0 = stage_params(m, p, 0), spl = stage_params(m, p, p.pp - 1);
  const StageParams& sp = sp0.total() >= spl.total() ? sp0 : spl;
  const double grad_bytes = 4;  // fp32 main gradients are reduced (Megatron's default)
  const double w_bytes = eb;
  const double stage_b = B + R;  // backward of one micro-batch: the window for overlap
  auto dp_sync = [&](Group g, double params, int shard) {
    if (shard < 2 || params <= 0) return 0.0;
    const GroupModel& grp = group_model(p, g);
    double rs = grp.cost(Collective::kReduceScatter, params * grad_bytes).time_s;
    double ag = grp.cost(Collective::kAllGather, params * w_bytes).time_s;
    double ar = grp.cost(Collective::kAllReduce, params * grad_bytes).time_s;
    double win_b = p.overlap_grad_reduce ? stage_b : 0;
    double win_f = p.overlap_param_gather ? F : 0;
    switch (p.zero) {
      case 0:
        return exposed(ar, win_b, per_stage);
      case 1:
        return exposed(rs, win_b, per_stage) + exposed(ag, win_f, per_stage);
      case 2:
        return mb * exposed(rs, win_b, per_stage) + exposed(ag, win_f, per_stage);
      default: {
        double gathers_b = ag * (1 + full_share);  // backward (and recompute) re-gathers
        return mb * (exposed(ag, win_f, per_stage) + exposed(gathers_b + rs, win_b, per_stage));
      }
    }
  };
  tb.dp_comm = dp_sync(Group::kDpCp, sp.dense, p.dp * p.cp) +
               dp_sync(Group::kExpertDp, sp.expert, p.dp / p.ep * p.cp);

  // Optimizer step over the rank's (sharded) parameters.
  const double shard_params =
      p.zero >= 1 ? sp.dense / (p.dp * p.cp) + sp.expert / (p.dp / p.ep * p.cp) : sp.total();
  const double host_bw = host_bw_;
  if (p.offload.optimizer) {
    // Gradients down, CPU Adam (the server's host shared by its GPUs), weights back up.
    double cpu_rate = f.host_adam_params_per_s / std::max(1, cluster_.gpus_per_server());
    double down = shard_params * grad_bytes / host_bw, up = shard_params * w_bytes / host_bw;
    tb.offload += exposed(down, stage_b, per_stage) + shard_params / cpu_rate + up;
  } else {
    tb.optimizer = optimizer_time(d, f, p.precision, shard_params);
  }
  if (p.offload.params) {
    // Weights streamed in per layer for the forward, the backward and any recompute.
    double bytes = sp.total() * w_bytes / (p.zero >= 3 ? p.dp * p.cp : 1);
    double copy = bytes / host_bw;
    tb.offload += mb * (std::max(0.0, copy - F) + std::max(0.0, copy * (1 + full_share) - B - R));
  }
  if (p.offload.activations) {
    double act = 0;
    for (int i = 0; i < per_stage; ++i)
      act += layer_activation_bytes(
          m, p,
          i < full ? Recompute::kFull
                   : (p.recompute == Recompute::kFull ? Recompute::kNone : p.recompute),
          false);
    double copy = act / host_bw;
    tb.offload += mb * (std::max(0.0, copy - F) + std::max(0.0, copy - B - R));
  }

  e.step_time_s = tb.total();
  const double tokens = static_cast<double>(p.global_batch) * seq;
  e.tokens_per_s = tokens / e.step_time_s;
  e.samples_per_s = p.global_batch / e.step_time_s;
  const FlopsPerToken fpt = flops_per_token(m, seq);
  e.model_flops_per_step = fpt.model * tokens;
  // Executed FLOPs: the model's plus what recompute re-runs (scaled to all ranks).
  const double ranks_per_replica = static_cast<double>(p.tp) * p.cp * p.pp;
  e.hardware_flops_per_step =
      e.model_flops_per_step + recompute_flops * mb * p.dp * ranks_per_replica;
  const double peak = d.peak_flops(p.precision) * cluster_.num_gpus() * e.step_time_s;
  e.mfu = e.model_flops_per_step / peak;
  e.hfu = e.hardware_flops_per_step / peak;

  e.memory = memory;
  e.memory_per_gpu_bytes = e.memory.total();
  e.device_memory_bytes = d.hbm_bytes;
  e.fits = e.memory_per_gpu_bytes <= d.hbm_bytes;
  return e;
}

Estimate estimate(const Model& model, const Cluster& cluster, const Plan& plan,
                  const Profile& profile) {
  Estimator est(model, cluster, profile);
  return est.estimate(plan);
}

Json estimate_to_json(const Estimate& e) {
  const TimeBreakdown& t = e.time;
  const MemoryBreakdown& m = e.memory;
  return {{"step_time_s", e.step_time_s},
          {"tokens_per_s", e.tokens_per_s},
          {"samples_per_s", e.samples_per_s},
          {"mfu", e.mfu},
          {"hfu", e.hfu},
          {"model_flops_per_step", e.model_flops_per_step},
          {"hardware_flops_per_step", e.hardware_flops_per_step},
          {"memory_per_gpu_bytes", e.memory_per_gpu_bytes},
          {"device_memory_bytes", e.device_memory_bytes},
          {"fits", e.fits},
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
            {"offload", t.offload}}},
          {"memory_breakdown_bytes",
           {{"weights", m.weights},
            {"gradients", m.gradients},
            {"optimizer", m.optimizer},
            {"activations", m.activations},
            {"transient", m.transient},
            {"buffers", m.buffers},
            {"host", m.host}}}};
}

}  // namespace parasol::cost
