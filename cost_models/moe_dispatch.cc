// The MoE dispatcher's bytes on the wire (cost_models/moe_dispatch.h).
#include "cost_models/moe_dispatch.h"

#include <algorithm>

namespace parasol::cost {

double dispatcher_bytes_factor(const Model& m, const Plan& p, int ep_nodes) {
  if (p.moe_dispatcher != MoeDispatcher::kDeepEp || ep_nodes < 2 || !m.is_moe()) return 1.0;
  const double n = ep_nodes, e = m.moe.experts, k = m.moe.top_k;
  double none = 1;
  for (int i = 0; i < m.moe.top_k; ++i) none *= std::max(0.0, (e - e / n - i) / (e - i));
  return (n - 1) * (1 - none) / (k * (n - 1) / n);
}

}  // namespace parasol::cost
