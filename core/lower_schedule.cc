// The pipeline: a stage's forward and backward units in the schedule's order
// (core/pipeline_schedule.h), the exchanges of activations with the neighbouring
// stages between them (Megatron's batched isend/irecv: one p2p group per exchange), each unit's
// layers with their weights and saved activations acquired one use ahead, and the stage's whole
// Program (Lowerer::run).
#include <algorithm>

#include "core/host_issue.h"
#include "core/lower_internal.h"

namespace parasol::lowering {

void Lowerer::set_unit_tags(const Unit& u) {
  tags_.chunk = u.chunk;
  tags_.micro_batch = u.mb;
  at(-1, u.forward ? Phase::kForward : Phase::kBackward);
}

int Lowerer::post_receive(const Unit& u) {
  if (!receives_input(p_, s_, u)) return -1;
  const int v = virtual_stage(p_, s_, u);
  const bool backward = !u.forward;
  set_unit_tags(u);
  const int peer = backward ? (s_ + 1) % pp_ : (s_ - 1 + pp_) % pp_;
  const int64_t tag = pp_tag(backward ? v + 1 : v - 1, backward, u.mb);
  if (t_ > 1 && !sp_) {
    // Megatron's scatter/gather: each TP rank receives 1/tp and the TP group all-gathers.
    int part = ws(-1, "recv", {ceil_div(T_, t_), h_});
    p2p(OpKind::kRecv, Group::kPp, peer, tag, -1, "recv", eb_ * T_ * h_ / t_, part);
    return part;
  }
  int x = act(-1, backward ? "dy" : "x", {Tn_, h_});
  p2p(OpKind::kRecv, Group::kPp, peer, tag, -1, "recv", eb_ * Tn_ * h_, x);
  return x;
}

int Lowerer::received_input(bool backward, int received) {
  if (t_ == 1 || sp_) return received;
  int x = act(-1, backward ? "dy" : "x", {T_, h_});
  collective(OpKind::kAllGather, Group::kTp, -1, "recv.ag", eb_ * T_ * h_, received, x);
  return x;
}

// `extra`: the producers of the other outputs of its exchange (NCCL issues a group's sends
// together, so none leaves before the step's last unit is done).
void Lowerer::send_output(const Unit& u, int x, std::initializer_list<int> extra) {
  const int v = u.chunk * pp_ + s_;
  const bool backward = !u.forward;
  set_unit_tags(u);
  const int peer = backward ? (s_ - 1 + pp_) % pp_ : (s_ + 1) % pp_;
  const double bytes = t_ > 1 && !sp_ ? eb_ * T_ * h_ / t_ : eb_ * Tn_ * h_;
  p2p(OpKind::kSend, Group::kPp, peer, pp_tag(v, backward, u.mb), -1, "send", bytes, x, extra);
}

// Under Plan::p2p_sync each batched call ends with torch.cuda.synchronize() (Megatron-Core's
// _communicate, p2p_communication.py L421-424 @d98e8a6): a host sync on the last op of every
// device stream, after the call's transfers. Megatron's non-interleaved schedule sends and
// receives in one call only where they go opposite ways (send_forward_recv_backward,
// send_backward_recv_forward); a send and a receive the same way (the warm-up's send_forward,
// then recv_forward; the cool-down's send_backward, then recv_backward) are two calls, each with
// its sync (schedules.py forward_backward_pipelining_without_interleaving).
void Lowerer::p2p_synchronize(size_t first_op) {
  bool any = false;
  for (size_t i = first_op; i < P_.ops.size(); ++i)
    any = any || P_.ops[i].kind == OpKind::kSend || P_.ops[i].kind == OpKind::kRecv;
  if (!any) return;
  std::vector<int> last(P_.streams.size(), -1);
  for (const Op& op : P_.ops) last[op.stream] = op.id;
  last[kHost] = -1;
  // Issued from the schedule's Python, outside autograd's engine, after a forward or a backward.
  P_.ops[host_sync("p2p.sync", last)].tags.phase = Phase::kForward;
}

void Lowerer::exchange(const std::vector<Unit>& step, const std::vector<int>& outputs,
                       const std::vector<Unit>& next, bool split, std::vector<int>& received) {
  const bool sync = p_.p2p_sync && pp_ > 1;
  if (sync && !step.empty() && !next.empty() && step.back().forward == next.front().forward)
    split = true;
  // After a chunk's held-back gradient reductions (chunk_reductions) the compute stream waits
  // for them, and NCCL's point-to-point calls wait for the compute stream (ProcessGroupNCCL
  // syncs its stream with the current one): this exchange's sends and receives go after them.
  const int order_after = order_after_;
  if (reductions_wait_ >= 0) order_after_ = reductions_wait_;
  reductions_wait_ = -1;
  size_t first = P_.ops.size();
  begin_p2p_group();
  for (size_t i = 0; i < step.size(); ++i) {
    if (outputs[i] < 0) continue;
    int other = -1;  // a step has at most two units: at most one other output
    for (size_t j = 0; j < step.size(); ++j)
      if (j != i && outputs[j] >= 0) other = last_writer_[outputs[j]];
    send_output(step[i], outputs[i], {other});
  }
  if (split) {
    end_p2p_group();
    if (sync) p2p_synchronize(first);
    first = P_.ops.size();
    begin_p2p_group();
  }
  received.clear();
  for (const Unit& u : next) received.push_back(post_receive(u));
  end_p2p_group();
  if (sync) p2p_synchronize(first);
  order_after_ = order_after;
}

int Lowerer::forward_unit(int c, int mb, int received) {
  set_unit_tags({true, c, mb});
  const int v = c * pp_ + s_;
  int x = v == 0 ? embedding_forward(mb) : received_input(false, received);
  // Layers, each use's weights acquired one layer ahead.
  const int n = layers_in_chunk_[c];
  std::vector<WSet> w(n);
  auto acquire_use = [&](int j, int dep) {
    at(layer_of(c, j), Phase::kForward);
    w[j] = layer_weights(local_of(c, j), dep);
  };
  const bool ahead = p_.overlap_param_gather;
  if (n > 0 && ahead) acquire_use(0, -1);
  int prev_last = -1;
  for (int j = 0; j < n; ++j) {
    if (!ahead) acquire_use(j, -1);
    if (ahead && j + 1 < n) acquire_use(j + 1, prev_last);
    const int layer = layer_of(c, j);
    at(layer, Phase::kForward);
    fsdp_copy_out(w[j]);
    Saved sv;
    int out = layer_forward(layer, x, w[j], sv);
    prev_last = static_cast<int>(P_.ops.size()) - 1;
    Saved keep = no_saved();
    if (local_of(c, j) < full_k_) {
      keep[sX] = sv[sX];
    } else {
      keep = sv;
      drop_recomputed(layer, keep);
    }
    if (p_.offload.activations) keep = offload_saved(layer, keep);
    saved_[saved_index(c, mb, j)] = keep;
    x = out;
  }
  if (v != V_ - 1) return x;
  head_forward(x, mb);
  return -1;
}

// The layers of chunk `c` backward for micro-batch `mb`, last first, each preceded by its
// recompute (the whole layer under full recompute, else the plan's modules), with weights and
// saved activations acquired one use ahead.
void Lowerer::backward_layers(int c, int mb, bool last, int& dy) {
  struct Use {
    int j;
    bool recompute;
  };
  std::vector<Use> uses;
  uses.reserve(2 * layers_in_chunk_[c]);
  for (int j = layers_in_chunk_[c] - 1; j >= 0; --j) {
    if (local_of(c, j) < full_k_) uses.push_back({j, true});
    uses.push_back({j, false});
  }
  struct Acquired {
    WSet w;
    Saved acts;
    bool reuse = false;  // the weights its full recompute gathered
  };
  std::vector<Acquired> acq(uses.size());
  auto acquire_use = [&](size_t u, int dep) {
    const Use& use = uses[u];
    const int layer = layer_of(c, use.j);
    at(layer, use.recompute ? Phase::kRecompute : Phase::kBackward);
    // A layer's backward after its full recompute reads the weights the recompute gathered (or
    // brought in from host memory): the frameworks unshard a unit once for both. FSDP2's
    // pre-backward hook unshards the unit, and the recompute's forward inside it skips its own
    // (pytorch/pytorch torch/distributed/fsdp/_fully_shard/_fsdp_state.py _pre_forward: "When
    // composing with module-hook-based activation checkpointing, the pre-backward hook is
    // responsible for the unshard"); DeepSpeed ZeRO-3 keeps parameters reused within
    // stage3_max_reuse_distance (Plan::zero3_max_reuse_distance) gathered and gathers the rest
    // again (regather_layer; the lowering keeps the layer's buffers). The closed form counts the
    // same (cost_models/estimate.cc, DataParallelSync::by_layers).
    // Under DeepSpeed's coordinator (ds_lazy_) each use acquires its own, and the schedule
    // says which of its modules' copies the recompute's are.
    const bool reuse = !use.recompute && u > 0 && uses[u - 1].recompute && uses[u - 1].j == use.j &&
                       (p_.zero >= 3 || p_.offload.params) && !ds_lazy_;
    acq[u].w = reuse ? acq[u - 1].w : layer_weights(local_of(c, use.j), dep);
    acq[u].reuse = reuse;
    Saved& stored = saved_[saved_index(c, mb, use.j)];
    const bool full = local_of(c, use.j) < full_k_;
    acq[u].acts = stored;
    // Offloaded activations come back before their first use (the recompute under full).
    if (p_.offload.activations && (use.recompute || !full))
      acq[u].acts = prefetch_saved(layer, stored, dep);
  };
  const bool ahead = p_.overlap_param_gather;
  if (!uses.empty() && ahead) acquire_use(0, -1);
  int prev_last = -1;
  Saved recomputed = no_saved();
  for (size_t u = 0; u < uses.size(); ++u) {
    if (!ahead) acquire_use(u, -1);
    if (ahead && u + 1 < uses.size()) acquire_use(u + 1, prev_last);
    const Use& use = uses[u];
    const int local = local_of(c, use.j);
    const int layer = layer_of(c, use.j);
    if (use.recompute) {
      at(layer, Phase::kRecompute);
      fsdp_copy_out(acq[u].w);
      layer_forward(layer, acq[u].acts[sX], acq[u].w, recomputed);
    } else {
      Saved sv = local < full_k_ ? recomputed : acq[u].acts;
      at(layer, Phase::kBackward);
      // DeepSpeed released the modules its reuse distance does not reach after their
      // recompute: gathered again as the backward starts, beside its last modules' backward.
      if (acq[u].reuse) regather_layer(local, acq[u].w, -1);
      fsdp_copy_out(acq[u].w);
      if (local >= full_k_) recompute_modules(layer, acq[u].w, sv);
      at(layer, Phase::kBackward);
      WSet g = layer_grads(local);
      dy = layer_backward(layer, sv, dy, acq[u].w, g);
      for (int bi : layer_buckets_[local])
        if (bi >= 0) after_backward(buckets_[bi], last);
    }
    prev_last = static_cast<int>(P_.ops.size()) - 1;
  }
}

int Lowerer::backward_unit(int c, int mb, int received) {
  set_unit_tags({false, c, mb});
  std::fill(unit_grads_valid_.begin(), unit_grads_valid_.end(), 0);
  const int v = c * pp_ + s_;
  const bool last = ++backward_done_[c] == M_;
  int dy;
  if (v == V_ - 1) {
    dy = head_backward(mb);
    Bucket& hb = buckets_[head_bucket_];
    at(-1, Phase::kBackward);
    after_backward(hb, last);
  } else {
    dy = received_input(true, received);
  }
  backward_layers(c, mb, last, dy);
  if (v != 0) {
    if (v == V_ - 1) loss_metrics(mb);
    chunk_reductions();
    return dy;
  }
  embedding_backward(mb, dy);
  at(-1, Phase::kBackward);
  after_backward(buckets_[emb_bucket_], last);
  if (v == V_ - 1) loss_metrics(mb);
  chunk_reductions();
  return -1;
}

// Each step's units, then its exchange with the neighbouring stages: its outputs sent and the
// next step's inputs received. The first step's inputs are received in an exchange of their own
// (Megatron's recv_forward before the warm-up); interleaved, when every forward is in the
// warm-up, so are the first backward's (Megatron's recv_backward before the cool-down).
void Lowerer::run_steps() {
  const std::vector<std::vector<Unit>> steps = pipeline_steps(p_, s_);
  const std::vector<Unit> none;
  std::vector<int> received;
  exchange({}, {}, steps.front(), false, received);
  // The last unit emitted: its first op and whether it was a forward, and whether any op was
  // emitted since it ended (an exchange with another stage).
  int unit_begin = -1, unit_end = -1;
  bool unit_forward = false;
  for (size_t i = 0; i < steps.size(); ++i) {
    const std::vector<Unit>& step = steps[i];
    std::vector<int> outputs;
    for (size_t j = 0; j < step.size(); ++j) {
      const Unit& u = step[j];
      const int begin = static_cast<int>(P_.ops.size());
      outputs.push_back(u.forward ? forward_unit(u.chunk, u.mb, received[j])
                                  : backward_unit(u.chunk, u.mb, received[j]));
      const int end = static_cast<int>(P_.ops.size());
      // Combined 1F1B: a forward and a backward unit back to back (an interleaved step's pair;
      // without a pipeline, a backward and the next forward) run as one.
      if (p_.ep_comm_overlap && unit_end == begin && unit_forward != u.forward &&
          interleave_units(unit_begin, begin, end, unit_forward)) {
        unit_end = -1;
      } else {
        unit_begin = begin, unit_end = end, unit_forward = u.forward;
      }
    }
    const std::vector<Unit>& next = i + 1 < steps.size() ? steps[i + 1] : none;
    const bool split = p_.schedule == Schedule::kInterleaved && step.size() == 1 &&
                       step[0].forward && !next.empty() && !next[0].forward;
    exchange(step, outputs, next, split, received);
  }
}

void Lowerer::begin_program(size_t ops_expected) {
  P_.stage = s_;
  P_.streams = {StreamKind::kCompute, StreamKind::kComm, StreamKind::kCopy,
                StreamKind::kComm,    StreamKind::kComm, StreamKind::kHost};
  if (p_.ep_comm_overlap) P_.streams.push_back(StreamKind::kComm);  // kEpComm
  const size_t est = ops_expected;
  P_.ops.reserve(est);
  P_.buffers.reserve(est);
  last_writer_.reserve(est);
  last_reader_.reserve(est);
  build_buckets();
  unit_grads_.assign(buckets_.size(), no_weights());
  unit_grads_valid_.assign(buckets_.size(), 0);
  held_.assign(buckets_.size() * static_cast<size_t>(M_), no_weights());
  held_valid_.assign(held_.size(), 0);
  gathered_in_forward_.assign(buckets_.size(), 0);
  pending_copy_out_.clear();
  chunk_reductions_.clear();
  reductions_wait_ = -1;
  ds_lazy_ = ds_lazy_gathers(m_, p_);
  ds_ = ds_lazy_ ? ds_stage_schedule(m_, p_, first_layer_[0], per_stage_, M_) : DsSchedule{};
  ds_next_ = 0;
  ds_reached_ = -1;
  ds_copies_.clear();
  ds_copy_of_source_.assign(ds_.source.size(), -1);
  ds_pending_.clear();
  ds_uses_of_buffer_.clear();
  ds_reduces_.clear();
  ds_reduce_of_buffer_.clear();
  backward_done_.assign(vpp_, 0);
  saved_.assign(static_cast<size_t>(per_stage_) * M_, no_saved());
  emb_saved_.assign(M_, {});
  head_saved_.assign(M_, {});
}

Program Lowerer::run() {
  begin_program(static_cast<size_t>(M_) * per_stage_ * 60 + 1024);
  run_steps();
  optimizer();
  // The step ends with the host reading a scalar the step computed (Megatron's per-iteration
  // get_loss_scale().item() in training.py's train_step, which drains the iteration's GPU queue;
  // the loss read for logging elsewhere): one sync on the last op of every device stream.
  std::vector<int> last(P_.streams.size(), -1);
  for (const Op& op : P_.ops) last[op.stream] = op.id;
  last[kHost] = -1;
  host_sync("step.sync", last);
  if (p_.log_params_norm) params_norm();
  export_buckets();
  mark_host_issue(m_, p_, P_);
  return std::move(P_);
}

bool Lowerer::interleave_units(int a, int b, int c, bool forward_first) {
  // Each unit's ops cut after its expert all-to-alls.
  auto segments = [&](int from, int to) {
    std::vector<std::pair<int, int>> out;
    int start = from;
    for (int i = from; i < to; ++i) {
      const Op& o = P_.ops[i];
      if (o.kind == OpKind::kAllToAll && o.group == Group::kEp) {
        out.push_back({start, i + 1});
        start = i + 1;
      }
    }
    if (start < to) out.push_back({start, to});
    return out;
  };
  const auto fwd = forward_first ? segments(a, b) : segments(b, c);
  const auto bwd = forward_first ? segments(b, c) : segments(a, b);
  if (fwd.size() < 2 || bwd.size() < 2) return false;  // no expert all-to-all to overlap
  std::vector<int> order;                              // old ids in their new order
  order.reserve(static_cast<size_t>(c - a));
  for (size_t k = 0; k < std::max(fwd.size(), bwd.size()); ++k)
    for (const auto* segs : {&bwd, &fwd})
      if (k < segs->size())
        for (int i = (*segs)[k].first; i < (*segs)[k].second; ++i) order.push_back(i);
  std::vector<int> moved(static_cast<size_t>(c - a));  // old id - a -> new id
  for (size_t k = 0; k < order.size(); ++k) moved[order[k] - a] = a + static_cast<int>(k);
  auto renumber = [&](int id) { return id >= a && id < c ? moved[id - a] : id; };
  for (int i = a; i < c; ++i)
    for (int d : P_.ops[i].deps)
      if (renumber(d) >= renumber(i)) return false;  // a dependency would point forward
  std::vector<Op> ops;
  ops.reserve(order.size());
  for (int old : order) ops.push_back(std::move(P_.ops[old]));
  for (size_t k = 0; k < ops.size(); ++k) {
    Op& o = ops[k];
    o.id = a + static_cast<int>(k);
    for (int& d : o.deps) d = renumber(d);
    std::sort(o.deps.begin(), o.deps.end());
    P_.ops[o.id] = std::move(o);
  }
  for (int& w : last_writer_) w = renumber(w);
  for (auto& readers : last_reader_)
    for (int& r : readers) r = renumber(r);
  order_after_ = renumber(order_after_);
  reductions_wait_ = renumber(reductions_wait_);
  for (ChunkedGather& g : chunked_gathers_) g.head = renumber(g.head), g.rest = renumber(g.rest);
  for (int& d : next_compute_waits_) d = renumber(d);
  for (int i = c - 1; i >= a; --i)
    if (P_.ops[i].stream == kCompute) {
      last_compute_ = i;
      break;
    }
  return true;
}

}  // namespace parasol::lowering
