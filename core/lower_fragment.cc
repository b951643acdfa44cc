// A layer fragment: one decoder layer of a plan for one micro-batch on one rank, lowered by the
// same Lowerer members that lower a stage (core/lower.h's conventions), without the pipeline,
// data-parallel, ZeRO, offload and optimizer ops around it. The closed-form estimate prices a
// plan's layers from it (cost_models/layer_fragment.h), so that a layer is described once.
#include "core/host_issue.h"
#include "core/lower.h"
#include "core/lower_internal.h"

namespace parasol {
namespace {

// The plan the fragment is lowered with: one stage of one chunk, the micro-batches the fragment
// needs, no ZeRO, offload or full recompute (the closed form adds those by its own arithmetic);
// every switch that shapes a layer's ops (degrees, SP, precision, kernels, selective recompute,
// overlaps, dispatcher, expert grid) is the plan's.
Plan fragment_plan(const Plan& plan, int micro_batches) {
  Plan q = plan;
  q.pp = 1;
  q.vpp = 1;
  q.schedule = Schedule::k1F1B;
  q.stage_layers.clear();
  q.first_stage_layers = q.last_stage_layers = 0;
  q.zero = 0;
  q.shard_degree = 0;
  q.offload = Offload{};
  if (q.recompute == Recompute::kFull) q.recompute = Recompute::kNone;
  q.global_batch = micro_batches * q.micro_batch * q.dp;
  return q;
}

}  // namespace

namespace lowering {

LayerFragment Lowerer::layer_fragment(int layer) {
  // The stage holds this one layer.
  first_layer_.assign(1, layer);
  layers_in_chunk_.assign(1, 1);
  chunk_base_ = {0, 1};
  per_stage_ = 1;
  full_k_ = 0;
  // A layer's ops, a ring exchange and attention step per CP rank each way, for up to two
  // micro-batches.
  begin_program(static_cast<size_t>(M_) * (80 + 12 * p_.cp));
  // A fragment's layer gathers its bucket whole (DeepSpeed's schedule is the stage's).
  ds_lazy_ = false;

  std::vector<std::vector<int>> modules;
  auto forward = [&](int mb) {
    set_unit_tags({true, 0, mb});
    const int x = act(-1, "x", {Tn_, h_});  // the layer's input, ready when the fragment starts
    at(layer, Phase::kForward);
    const WSet w = layer_weights(0, -1);
    if (mb == 0 && layer_buckets_[0][0] >= 0) {
      for (const Spec& s : buckets_[static_cast<size_t>(layer_buckets_[0][0])].specs) {
        const int id = w[s.slot];
        if (is_bias_slot(s.slot) && !modules.empty()) {
          if (id >= 0) modules.back().push_back(id);
        } else {
          modules.push_back(id >= 0 ? std::vector<int>{id} : std::vector<int>{});
        }
      }
    }
    Saved sv;
    layer_forward(layer, x, w, sv);
    Saved keep = sv;
    drop_recomputed(layer, keep);
    saved_[mb] = keep;
  };
  auto backward = [&](int mb) {
    set_unit_tags({false, 0, mb});
    const int dy = act(-1, "dy", {Tn_, h_});  // the output's gradient, ready at the start
    at(layer, Phase::kBackward);
    const WSet w = layer_weights(0, -1);
    Saved sv = saved_[mb];
    recompute_modules(layer, w, sv);
    at(layer, Phase::kBackward);
    const WSet g = layer_grads(0);
    layer_backward(layer, sv, dy, w, g);
  };
  auto size = [&] { return static_cast<int>(P_.ops.size()); };

  LayerFragment out;
  forward(0);
  const int backward_begin = size();
  backward(0);
  bool interleaved = false;
  if (p_.ep_comm_overlap) {
    // Megatron's combined 1F1B: the backward of micro-batch 0 beside the forward of micro-batch
    // 1, reissued interleaved at their expert all-to-alls (as lower() interleaves units).
    const int next_forward = size();
    forward(1);
    interleaved = interleave_units(backward_begin, next_forward, size(), false);
    if (interleaved) {
      out.passes.push_back({backward_begin, size()});
    } else {
      P_.ops.resize(next_forward);  // nothing to interleave: the plain passes below
    }
  }
  if (!interleaved) {
    out.passes.push_back({0, backward_begin});
    out.passes.push_back({backward_begin, size()});
  }
  mark_host_issue(m_, p_, P_);
  out.program = std::move(P_);
  out.modules = std::move(modules);
  return out;
}

}  // namespace lowering

LayerFragment lower_layer_fragment(const Model& model, const Plan& plan, int layer) {
  PARASOL_CHECK(0 <= layer && layer < model.layers, "layer " + std::to_string(layer));
  const Plan q = fragment_plan(plan, plan.ep_comm_overlap ? 2 : 1);
  lowering::Lowerer l(model, q, 0, true);
  return l.layer_fragment(layer);
}

}  // namespace parasol
