// The Monte Carlo check of the goodput closed form (cost_models/goodput.h): plays jobs of
// checkpointed segments under random interruptions (exponential times between them, seeded and
// deterministic) and averages where their wall time went.
#pragma once

#include <cstdint>

#include "cost_models/goodput.h"

namespace parasol::sim {

struct JobMonteCarloOptions {
  double work_s = 0;      // work of one job (> 0)
  double interval_s = 0;  // work between checkpoints (> 0)
  double delta_s = 0;     // checkpoint write
  double restart_s = 0;   // restart after an interruption (interruptible itself)
  double mtbi_s = 0;      // mean time between interruptions (> 0)
  int jobs = 1000;        // jobs played
  uint64_t seed = 1;
};

// The mean over `jobs` played jobs of each part of cost::Goodput (planned stops: none).
// REQUIRES: the positive fields above are > 0 and jobs >= 1.
cost::Goodput job_monte_carlo(const JobMonteCarloOptions& options);

}  // namespace parasol::sim
