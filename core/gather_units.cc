// ZeRO-3 collective granularity (see gather_units.h).
#include "core/gather_units.h"

#include <algorithm>
#include <cstddef>

#include "core/layer_shapes.h"
#include "core/zero3_live.h"

namespace parasol {

std::vector<double> gather_calls(const std::vector<double>& weights, double bucket) {
  std::vector<double> out;
  double open = 0;
  bool any = false;
  for (double w : weights) {
    open += w;
    any = true;
    if (bucket > 0 && open >= bucket) {
      out.push_back(open);
      open = 0;
      any = false;
    }
  }
  if (any) out.push_back(open);
  return out;
}

std::vector<size_t> reduce_call_ends(const std::vector<double>& weights, double bucket) {
  std::vector<size_t> out;
  double open = 0;
  bool any = false;
  for (size_t i = 0; i < weights.size(); ++i) {
    if (bucket > 0 && any && open + weights[i] > bucket) {
      out.push_back(i - 1);
      open = 0;
      any = false;
    }
    open += weights[i];
    any = true;
  }
  if (any) out.push_back(weights.size() - 1);
  return out;
}

std::vector<double> reduce_calls(const std::vector<double>& weights, double bucket) {
  std::vector<double> out;
  size_t begin = 0;
  for (size_t end : reduce_call_ends(weights, bucket)) {
    double n = 0;
    for (size_t i = begin; i <= end; ++i) n += weights[i];
    out.push_back(n);
    begin = end + 1;
  }
  return out;
}

namespace {
std::vector<double> fractions(std::vector<double> calls) {
  double sum = 0;
  for (double c : calls) sum += c;
  if (sum <= 0) return {1.0};
  for (double& c : calls) c /= sum;
  return calls;
}
}  // namespace

std::vector<double> gather_fractions(const Plan& p, const std::vector<double>& weights) {
  if (p.zero3_unit == GatherUnit::kLayer) return {1.0};
  return fractions(gather_calls(weights, static_cast<double>(p.zero3_prefetch_bucket)));
}

std::vector<double> reduce_fractions(const Plan& p, const std::vector<double>& weights) {
  if (p.zero3_unit == GatherUnit::kLayer) return {1.0};
  const std::vector<double> backward(weights.rbegin(), weights.rend());
  return fractions(reduce_calls(backward, static_cast<double>(p.zero3_reduce_bucket)));
}

double deepspeed_live_peak(const std::vector<double>& trace, const std::vector<int>& module,
                           double prefetch_bucket, double max_live, double max_reuse) {
  return deepspeed_schedule(trace, module, prefetch_bucket, max_live, max_reuse).peak;
}

std::vector<double> regathered_weights(const Plan& p, const std::vector<double>& weights) {
  std::vector<double> out;
  if (p.zero3_unit != GatherUnit::kModule) return out;
  const double reuse = static_cast<double>(p.zero3_max_reuse_distance);
  // Module m is used in the recompute, then the modules after it, then the backward of those
  // (last first), then its own backward.
  for (size_t k = weights.size(); k-- > 0;) {
    double between = 0;
    for (size_t j = k + 1; j < weights.size(); ++j) between += 2 * weights[j];
    if (between > reuse) out.push_back(weights[k]);
  }
  return out;
}

std::vector<double> dense_layer_weights(const Model& m, int64_t tp, int layer) {
  std::vector<double> out;
  const double h = static_cast<double>(m.hidden);
  const double norm = m.norm == Norm::kLayerNorm ? 2 * h : h;
  auto linear = [&](const LinearShape& s) {
    const double in = static_cast<double>(s.split == Split::kRow ? s.in / tp : s.in);
    const double o = static_cast<double>(s.split == Split::kColumn ? s.out / tp : s.out);
    out.push_back(in * o + (s.bias ? o : 0));  // weight and bias: one module
  };
  out.push_back(norm);
  for (const LinearShape& s : attention_linears(m)) linear(s);
  for (const NormShape& n : attention_norms(m)) out.push_back(static_cast<double>(n.params(m)));
  out.push_back(norm);
  for (const LinearShape& s : mlp_linears(m, layer)) linear(s);
  return out;
}

std::vector<PersistentParam> persistent_params(const Model& m, const Plan& p, int layer) {
  std::vector<PersistentParam> out;
  if (p.zero < 3 || p.zero3_unit != GatherUnit::kModule) return out;
  const double threshold = static_cast<double>(p.zero3_param_persistence_threshold);
  int module = 0;
  auto param = [&](double n) {
    if (n < threshold) out.push_back({module, n});
  };
  // A norm module: its weight, and its bias under LayerNorm.
  auto norm = [&](double width) {
    param(width);
    if (m.norm == Norm::kLayerNorm) param(width);
    ++module;
  };
  auto linear = [&](const LinearShape& s) {
    const double in = static_cast<double>(s.split == Split::kRow ? s.in / p.tp : s.in);
    const double o = static_cast<double>(s.split == Split::kColumn ? s.out / p.tp : s.out);
    param(in * o);
    if (s.bias) param(o);
    ++module;
  };
  // The modules in dense_layer_weights' order.
  norm(static_cast<double>(m.hidden));
  for (const LinearShape& s : attention_linears(m)) linear(s);
  for (const NormShape& n : attention_norms(m)) norm(static_cast<double>(n.width));
  norm(static_cast<double>(m.hidden));
  for (const LinearShape& s : mlp_linears(m, layer)) linear(s);
  return out;
}

std::vector<PersistentParam> stage_persistent_params(const Model& m, const Plan& p, int stage) {
  std::vector<PersistentParam> out;
  for (int c = 0; c < p.chunks(); ++c) {
    const int first = p.first_layer(m.layers, stage, c);
    for (int l = first; l < first + p.layers_in_chunk(m.layers, stage, c); ++l) {
      const std::vector<PersistentParam> layer = persistent_params(m, p, l);
      out.insert(out.end(), layer.begin(), layer.end());
    }
  }
  return out;
}

std::vector<double> gathered_layer_weights(const Model& m, const Plan& p, int layer) {
  std::vector<double> out = dense_layer_weights(m, p.tp, layer);
  for (const PersistentParam& x : persistent_params(m, p, layer))
    out[static_cast<size_t>(x.module)] -= x.elements;
  return out;
}

}  // namespace parasol
