// interop: see interop/interop.h.
#include "interop/interop.h"

#include <algorithm>
#include <string>

#include "core/error.h"
#include "interop/deepspeed.h"
#include "interop/megatron.h"
#include "interop/torchtitan.h"

namespace parasol::interop {

ServerLayout server_layout(const Cluster& cluster, int gpus) {
  const int per_node = std::min(gpus, cluster.gpus_per_server());
  if (per_node <= 0 || gpus % per_node != 0)
    throw Error("plan", "the job's " + std::to_string(gpus) +
                            " GPUs do not fill whole servers of " +
                            std::to_string(cluster.gpus_per_server()) + " GPUs");
  return {gpus / per_node, per_node};
}

const std::vector<std::string>& framework_names() {
  static const std::vector<std::string> names = {"megatron", "deepspeed", "torchtitan"};
  return names;
}

Export export_plan(const std::string& framework, const Model& model, const Cluster& cluster,
                   const Plan& plan, const std::string& field) {
  if (framework == "megatron") return export_megatron(model, cluster, plan);
  if (framework == "deepspeed") return export_deepspeed(model, cluster, plan);
  if (framework == "torchtitan") return export_torchtitan(model, cluster, plan);
  throw Error(field, "'" + framework + "' is not one of megatron|deepspeed|torchtitan");
}

bool can_export(const std::string& framework, const Model& model, const Cluster& cluster,
                const Plan& plan) {
  try {
    export_plan(framework, model, cluster, plan);
    return true;
  } catch (const Error&) {
    return false;
  }
}

}  // namespace parasol::interop
