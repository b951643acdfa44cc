// Profile sensitivity: the accuracy suites predicted with each profile figure at each end of its
// public range.
#include "cost_models/profile_sensitivity.h"

#include <cmath>
#include <cstdio>
#include <map>
#include <set>

#include "cost_models/profile_ranges.h"

namespace parasol::cost {

ProfileSensitivity profile_sensitivity(const std::vector<PublishedRun>& runs,
                                       const ProfilePredictor& predict) {
  ProfileSensitivity out;
  // Each run's cluster, built once for the 2 passes of every figure (run_accuracy_on).
  std::vector<Cluster> clusters;
  clusters.reserve(runs.size());
  for (const PublishedRun& run : runs) clusters.push_back(cluster_of(run));
  out.base = run_accuracy_on(
      runs, clusters, [&](const Model& m, const Cluster& c, const Plan& p, Reserved reserved) {
        return predict(m, c, p, default_profile(c.gpu_device(0)), reserved);
      });
  // The figures of the runs' devices, in the order the first device lists them.
  std::vector<std::string> keys;
  std::set<std::string> seen;
  for (const Cluster& c : clusters) {
    for (const ProfileRange& r : profile_ranges(c.gpu_device(0)))
      if (seen.insert(r.key).second) keys.push_back(r.key);
  }
  for (const std::string& key : keys) {
    for (bool high : {false, true}) {
      SensitivityRow row;
      row.key = key;
      row.high = high;
      std::map<std::string, double> values;
      row.report = run_accuracy_on(
          runs, clusters, [&](const Model& m, const Cluster& c, const Plan& p, Reserved reserved) {
            Profile prof = default_profile(c.gpu_device(0));
            for (const ProfileRange& r : profile_ranges(c.gpu_device(0)))
              if (r.key == key) {
                const double v = high ? r.high : r.low;
                prof = with_profile_figure(prof, key, v);
                values[c.gpu_device(0).name] = v;
              }
            return predict(m, c, p, prof, reserved);
          });
      for (const auto& [device, v] : values) {
        char buf[64];
        std::snprintf(buf, sizeof buf, "%s%s=%.4g", row.values.empty() ? "" : " ", device.c_str(),
                      v);
        row.values += buf;
      }
      for (size_t i = 0; i < row.report.rows.size(); ++i) {
        const double a = out.base.rows[i].predicted_s, b = row.report.rows[i].predicted_s;
        if (row.report.rows[i].judged && std::fabs(a - b) > 1e-9 * a) ++row.runs_moved;
      }
      out.rows.push_back(std::move(row));
    }
  }
  return out;
}

}  // namespace parasol::cost
