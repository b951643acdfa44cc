// DeepSpeed ZeRO-3's coordinator schedule (see zero3_live.h).
#include "core/zero3_live.h"

#include <algorithm>
#include <cstddef>

#include "core/gather_units.h"

namespace parasol {

DsSchedule deepspeed_schedule(const std::vector<double>& trace, const std::vector<int>& module,
                              double prefetch_bucket, double max_live, double max_reuse) {
  const size_t n = std::min(trace.size(), module.size());
  DsSchedule out;
  out.fetch_step.assign(n, -1);
  out.source.assign(n, -1);
  out.live.assign(n, 0);
  int ids = 0;
  for (size_t i = 0; i < n; ++i) ids = std::max(ids, module[i] + 1);
  const size_t nid = static_cast<size_t>(ids);
  std::vector<char> live(nid, 0);
  std::vector<double> size(nid, 0);
  std::vector<int> copy(nid, -1);        // the live copy's source use
  std::vector<int> copy_fetch(nid, -1);  // the use at which it was fetched
  std::vector<size_t> stamp(nid, 0);     // prefetch set membership (step + 1)
  for (size_t i = 0; i < n; ++i) size[static_cast<size_t>(module[i])] = trace[i];
  double avail = 0;
  size_t queue = 0;  // the next trace entry the prefetch queue holds
  auto fetch = [&](size_t id, size_t first_use, size_t step) {
    live[id] = 1;
    avail += size[id];
    copy[id] = static_cast<int>(first_use);
    copy_fetch[id] = static_cast<int>(step);
  };
  for (size_t i = 0; i < n; ++i) {
    const size_t id = static_cast<size_t>(module[i]);
    if (!live[id]) fetch(id, i, i);
    queue = std::max(queue, i + 1);
    // Prefetch while fewer than max_live elements are live (v0.6.2 counts every parameter it
    // takes off the queue, gathering those not live).
    if (prefetch_bucket > 0) {
      const double budget = std::min(max_live - avail, prefetch_bucket);
      double taken = 0;
      while (queue < n && taken < budget) {
        const size_t qi = queue++;
        const size_t q = static_cast<size_t>(module[qi]);
        if (stamp[q] == i + 1) continue;
        stamp[q] = i + 1;
        taken += size[q];
        if (!live[q]) fetch(q, qi, i);
      }
    }
    out.source[i] = copy[id];
    out.fetch_step[i] = copy_fetch[id];
    out.live[i] = avail;
    out.peak = std::max(out.peak, avail);
    // Release after the use unless the module recurs within max_reuse elements.
    bool keep = false;
    double walked = 0;
    for (size_t j = i + 1; j < n && walked <= max_reuse; ++j) {
      if (static_cast<size_t>(module[j]) == id) {
        keep = true;
        break;
      }
      walked += trace[j];
    }
    if (!keep) {
      live[id] = 0;
      avail -= size[id];
    }
  }
  return out;
}

bool ds_lazy_gathers(const Model& m, const Plan& p) {
  return p.zero >= 3 && p.zero3_unit == GatherUnit::kModule &&
         p.reshard == Reshard::kAfterForward && !p.offload.params && p.pp == 1 && p.chunks() == 1 &&
         !m.is_moe() && p.dp * p.cp > 1 && p.tp == 1 && p.fsdp_impl == FsdpImpl::kNone &&
         (p.schedule != Schedule::kGpipe || p.micro_batches() == 1);
}

DsTrace ds_stage_trace(const Model& m, const Plan& p, int first, int count) {
  DsTrace t;
  std::vector<std::vector<double>> layers;
  layers.reserve(static_cast<size_t>(count));
  for (int l = first; l < first + count; ++l) layers.push_back(dense_layer_weights(m, p.tp, l));
  for (const auto& w : layers) t.per_layer = std::max(t.per_layer, static_cast<int>(w.size()));
  auto use = [&](int j, size_t k, DsTrace::Use pass) {
    t.elements.push_back(layers[static_cast<size_t>(j)][k]);
    t.module.push_back(j * t.per_layer + static_cast<int>(k));
    t.use.push_back(pass);
  };
  for (int j = 0; j < count; ++j)
    for (size_t k = 0; k < layers[static_cast<size_t>(j)].size(); ++k) use(j, k, DsTrace::kForward);
  const int full = p.recompute == Recompute::kFull ? p.full_recompute_layers(count) : 0;
  for (int j = count - 1; j >= 0; --j) {
    const size_t nk = layers[static_cast<size_t>(j)].size();
    if (j < full)
      for (size_t k = 0; k < nk; ++k) use(j, k, DsTrace::kRecompute);
    if (j == count - 1) t.first_backward = static_cast<int>(t.elements.size());
    for (size_t k = nk; k-- > 0;) use(j, k, DsTrace::kBackward);
  }
  return t;
}

DsSchedule ds_stage_schedule(const Model& m, const Plan& p, int first, int count,
                             int micro_batches) {
  const DsTrace one = ds_stage_trace(m, p, first, count);
  std::vector<double> elements;
  std::vector<int> module;
  const size_t total = one.elements.size() * static_cast<size_t>(std::max(1, micro_batches));
  elements.reserve(total);
  module.reserve(total);
  for (int mb = 0; mb < std::max(1, micro_batches); ++mb) {
    elements.insert(elements.end(), one.elements.begin(), one.elements.end());
    module.insert(module.end(), one.module.begin(), one.module.end());
  }
  DsSchedule s = deepspeed_schedule(elements, module, static_cast<double>(p.zero3_prefetch_bucket),
                                    static_cast<double>(p.zero3_max_live_parameters),
                                    static_cast<double>(p.zero3_max_reuse_distance));
  for (int mb = 0; mb < std::max(1, micro_batches) && count > 0; ++mb)
    s.first_backward.push_back(mb * static_cast<int>(one.elements.size()) + one.first_backward);
  return s;
}

}  // namespace parasol
