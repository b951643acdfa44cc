// Profile sensitivity: every figure of the default profiles moved to each end of its public range
// (cost_models/profile_ranges.h), one at a time, and the accuracy suites predicted again, so that
// the effect of each figure's uncertainty on each family's error (mean |error| and bias) is a
// table anyone can rerun (`parasol accuracy --sensitivity`).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "cost_models/accuracy.h"
#include "cost_models/profile.h"

namespace parasol::cost {

// Predicts a run under a given profile (estimate_prediction, or the event simulator).
using ProfilePredictor =
    std::function<Prediction(const Model&, const Cluster&, const Plan&, const Profile&, Reserved)>;

struct SensitivityRow {
  std::string key;     // the figure (a ProfileRange key)
  bool high = false;   // moved to the high end of its range (else the low end)
  std::string values;  // the value set on each device that has the figure: "A100-80G=0.801 ..."
  int runs_moved = 0;  // judged runs whose predicted step time changed
  AccuracyReport report;
};

struct ProfileSensitivity {
  AccuracyReport base;  // every figure at its default
  std::vector<SensitivityRow> rows;
};

// Moves each figure that a device of `runs` has a range for to its low and to its high end on
// every device with that range (other devices keep their defaults), and predicts every run.
ProfileSensitivity profile_sensitivity(const std::vector<PublishedRun>& runs,
                                       const ProfilePredictor& predict = estimate_prediction);

}  // namespace parasol::cost
