// The CPU optimizer step of an offloaded optimizer (see host_optimizer.h).
#include "cost_models/host_optimizer.h"

#include <algorithm>

#include "core/device.h"

namespace parasol::cost {

double server_host_memory_bandwidth(const Cluster& cluster, int gpu) {
  const int server = cluster.server_of(gpu);
  double bw = 0;
  for (VertexId v : boost::make_iterator_range(boost::vertices(cluster.graph))) {
    const TopoNode& n = cluster.graph[v];
    if (n.kind == NodeKind::kCpu && n.server == server) bw += n.memory_bw;
  }
  return bw;
}

double torch_cpu_adam_accesses(OptimizerImpl impl) {
  return impl == OptimizerImpl::kFused ? kTorchFusedAdamAccesses : kTorchUnfusedAdamAccesses;
}

double host_optimizer_seconds(const Cluster& cluster, const Profile& profile, const Plan& plan,
                              double params, int gpu) {
  const double sharing = std::max(1, cluster.gpus_per_server());
  if (plan.cpu_optimizer == CpuOptimizer::kTorch) {
    const double bw = server_host_memory_bandwidth(cluster, gpu) * profile.host_memory_efficiency;
    if (bw > 0)
      return params * torch_cpu_adam_accesses(plan.optimizer_impl) *
             dtype_bytes(plan.optimizer_dtype) / (bw / sharing);
  }
  return params / (profile.host_adam_params_per_s / sharing);
}

}  // namespace parasol::cost
