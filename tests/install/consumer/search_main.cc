// A second program against an installed parasol, through parasol::parasol_sim (the search, and
// with it the traces library and threads): prints the best plan's estimated step time in
// seconds for a model, a cluster preset and a global batch, which install_test.sh compares with
// `parasol search --json`'s.
// Usage: consumer_search MODEL CLUSTER GPUS GBS
#include <cstdio>
#include <cstdlib>
#include <exception>

#include "core/cluster.h"
#include "core/error.h"
#include "core/model.h"
#include "cost_models/profile.h"
#include "sim/search.h"

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: consumer_search MODEL CLUSTER GPUS GBS\n");
    return 2;
  }
  try {
    const parasol::Model model = parasol::model_preset(argv[1]);
    const parasol::Cluster cluster = parasol::cluster_preset(argv[2], std::atoi(argv[3]));
    const parasol::cost::Profile profile = parasol::cost::default_profile(cluster.gpu_device(0));
    parasol::sim::SearchOptions options;
    options.global_batch = std::atoi(argv[4]);
    const parasol::sim::SearchResult r = parasol::sim::search(model, cluster, profile, options);
    if (r.top.empty()) {
      std::fprintf(stderr, "no plan fits\n");
      return 1;
    }
    std::printf("%.17g\n", r.top.front().estimate.step_time_s);
  } catch (const parasol::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "internal error: %s\n", e.what());
    return 1;
  }
  return 0;
}
