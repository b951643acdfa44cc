// A program built against an installed parasol: builds a Model preset, a Cluster preset and a
// Plan, validates the plan and prints the closed-form estimate's step time in seconds (all
// significant digits), which install_test.sh compares with `parasol estimate --json`'s.
// Usage: consumer MODEL CLUSTER GPUS TP PP GBS
#include <cstdio>
#include <cstdlib>
#include <exception>

#include "core/cluster.h"
#include "core/error.h"
#include "core/model.h"
#include "core/plan.h"
#include "cost_models/estimate.h"
#include "cost_models/profile.h"

int main(int argc, char** argv) {
  if (argc != 7) {
    std::fprintf(stderr, "usage: consumer MODEL CLUSTER GPUS TP PP GBS\n");
    return 2;
  }
  try {
    const parasol::Model model = parasol::model_preset(argv[1]);
    const parasol::Cluster cluster = parasol::cluster_preset(argv[2], std::atoi(argv[3]));
    parasol::Plan plan;
    plan.tp = std::atoi(argv[4]);
    plan.pp = std::atoi(argv[5]);
    plan.dp = cluster.num_gpus() / (plan.tp * plan.pp);
    plan.global_batch = std::atoi(argv[6]);
    parasol::validate(plan, model, cluster);
    const parasol::cost::Profile profile = parasol::cost::default_profile(cluster.gpu_device(0));
    const parasol::cost::Estimate e = parasol::cost::estimate(model, cluster, plan, profile);
    std::printf("%.17g\n", e.step_time_s);
  } catch (const parasol::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "internal error: %s\n", e.what());
    return 1;
  }
  return 0;
}
