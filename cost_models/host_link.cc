// Host <-> device copy bandwidth under concurrency (see host_link.h).
#include "cost_models/host_link.h"

#include <algorithm>
#include <limits>
#include <map>

namespace parasol::cost {

double host_copy_bandwidth(const Cluster& cluster, const Profile& profile, int gpu) {
  const int server = cluster.server_of(gpu);
  // Every GPU of the server copies to its nearest host memory at once: count the copies on
  // each link direction and into each socket.
  std::map<std::pair<size_t, bool>, int> load;
  std::map<VertexId, int> into_socket;
  std::vector<std::pair<Path, VertexId>> paths;
  auto key = [](const Hop& h) {
    return std::make_pair(reinterpret_cast<size_t>(h.edge.get_property()), h.forward);
  };
  int mine = -1;
  for (int g : cluster.gpus_on_server(server)) {
    auto hp = cluster.host_path(g);
    if (hp.first.empty()) continue;
    for (const Hop& h : hp.first) ++load[key(h)];
    ++into_socket[hp.second];
    if (g == gpu) mine = static_cast<int>(paths.size());
    paths.push_back(std::move(hp));
  }
  if (mine < 0) return 0;
  double bw = std::numeric_limits<double>::infinity();
  for (const Hop& h : paths[mine].first) {
    const TopoLink& l = cluster.graph[h.edge];
    bw = std::min(bw, l.bw / load[key(h)]);
  }
  const TopoNode& socket = cluster.graph[paths[mine].second];
  if (socket.memory_bw > 0)
    bw = std::min(
        bw, socket.memory_bw * profile.host_memory_efficiency / into_socket[paths[mine].second]);
  return bw * profile.host_copy_efficiency;
}

}  // namespace parasol::cost
