// Plan::fp8_param_gather's fp8 parameters: see fp8_params.h.
#include "core/fp8_params.h"

#include <string_view>

namespace parasol {

bool fp8_param_linear(const LinearShape& s) { return std::string_view(s.name) != "router"; }

bool fp8_weight_transpose_kept(const DeviceSpec& d) {
  const int cc = d.compute_capability;
  const bool any_layout = (cc >= 100 && cc < 120) || cc >= 130;
  return !any_layout;
}

double linear_weight_elements(const LinearShape& s, int64_t parts) {
  const double in = static_cast<double>(s.split == Split::kRow ? s.in / parts : s.in);
  const double out = static_cast<double>(s.split == Split::kColumn ? s.out / parts : s.out);
  return in * out;
}

double fp8_dense_layer_elements(const Model& m, int64_t tp, int layer) {
  double n = 0;
  for (const LinearShape& s : attention_linears(m))
    if (fp8_param_linear(s)) n += linear_weight_elements(s, tp);
  for (const LinearShape& s : mlp_linears(m, layer))
    if (fp8_param_linear(s)) n += linear_weight_elements(s, tp);
  return n;
}

double fp8_expert_layer_elements(const Model& m, int64_t expert_tp, int64_t local_experts) {
  if (!m.is_moe()) return 0;
  double n = 0;
  for (const LinearShape& s : expert_linears(m))
    if (fp8_param_linear(s)) n += linear_weight_elements(s, expert_tp);
  return n * static_cast<double>(local_experts);
}

}  // namespace parasol
