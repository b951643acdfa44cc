// interop: see interop/interop.h.
#include "interop/interop.h"

#include <algorithm>
#include <string>

#include "core/error.h"

namespace parasol::interop {

ServerLayout server_layout(const Cluster& cluster, int gpus) {
  const int per_node = std::min(gpus, cluster.gpus_per_server());
  if (per_node <= 0 || gpus % per_node != 0)
    throw Error("plan", "the job's " + std::to_string(gpus) +
                            " GPUs do not fill whole servers of " +
                            std::to_string(cluster.gpus_per_server()) + " GPUs");
  return {gpus / per_node, per_node};
}

}  // namespace parasol::interop
