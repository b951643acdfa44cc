// ZeRO-3 collective granularity (see gather_units.h).
#include "core/gather_units.h"

#include "core/layer_shapes.h"

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

std::vector<double> reduce_calls(const std::vector<double>& weights, double bucket) {
  std::vector<double> out;
  double open = 0;
  bool any = false;
  for (double w : weights) {
    if (bucket > 0 && any && open + w > bucket) {
      out.push_back(open);
      open = 0;
      any = false;
    }
    open += w;
    any = true;
  }
  if (any) out.push_back(open);
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
  return fractions(gather_calls(weights, kDeepSpeedPrefetchBucketElements));
}

std::vector<double> reduce_fractions(const Plan& p, const std::vector<double>& weights) {
  if (p.zero3_unit == GatherUnit::kLayer) return {1.0};
  const std::vector<double> backward(weights.rbegin(), weights.rend());
  return fractions(reduce_calls(backward, kDeepSpeedReduceBucketElements));
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

}  // namespace parasol
