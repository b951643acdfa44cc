// The representative rank of each pipeline stage: the rank at grid coordinate pp = s with every
// other dimension 0. The predictors (sim/engine.cc, cost_models/estimate.cc), the calibration
// (traces/calibrate.cc) and the Chakra export price stage s's Program on it
// (cost_models/op_cost.h's OpPricer takes these as its reps).
#pragma once

#include <vector>

#include "core/rank_layout.h"

namespace parasol {

inline std::vector<int> stage_representatives(const RankLayout& layout, int pp) {
  std::vector<int> reps(pp);
  for (int s = 0; s < pp; ++s) {
    RankCoord c{};
    c.pp = s;
    reps[s] = layout.rank(c);
  }
  return reps;
}

}  // namespace parasol
