// Error bands: how far a predicted step time may be from a measured one, from the residuals of
// the accuracy suites (tests/data/published/*.json, `parasol accuracy`) per family. The figures
// travel with the Profile (Profile::error_bands); parasol's defaults are cost_models/
// error_bands.json, written by tools/update-error-bands.sh and compiled into the library.
//
// Rules (error_band()):
//  - Families a plan draws on: "moe" when the model has routed experts, "long-seq-cp" when
//    plan.cp > 1, "zero3-fsdp" when plan.zero == 3; when none of these applies, the dense family
//    of its device: "h100-dense" on H100-SXM (and its 96 GiB 500 W variant) and H200,
//    "dense-3d-a100" on A100-80G and A100-40G.
//  - Unvalidated: a device other than A100-80G, A100-40G, H100-SXM(-96G-500W) and H200; any
//  offload; a
//    family it draws on with no runs in the bands.
//  - Half-width (a fraction of the step time): the largest rms_error among the families the
//    plan draws on; for an unvalidated plan, the largest rms_error of all families.
//  - The band is [step x (1 - fraction), step x (1 + fraction)] (the low end at least 0); the
//    pessimistic step time is step x (1 + fraction).
#pragma once

#include <string>
#include <vector>

#include "core/cluster.h"
#include "core/json_reader.h"
#include "core/model.h"
#include "core/plan.h"

namespace parasol::cost {

struct Profile;
struct AccuracyReport;

// The validation residuals of one family of accuracy suites: error = (predicted - published) /
// published per run.
struct FamilyBand {
  std::string family;
  int runs = 0;
  double mean_error = 0;     // signed mean (bias): < 0 means predictions are too fast
  double rms_error = 0;      // root mean square
  double max_abs_error = 0;  // largest |error|
};
using ErrorBands = std::vector<FamilyBand>;

struct ErrorBand {
  double fraction = 0;     // half-width, a fraction of the step time
  bool validated = false;  // every family the plan draws on has runs, on a covered device
  std::vector<std::string> families;  // the families the plan draws on (may be empty)
  std::string unvalidated_reason;     // why not validated ("" when validated)
};

// The families `plan` draws on (the rules above), in the order moe, long-seq-cp, zero3-fsdp,
// dense; empty when none applies (a dense plan on a device no suite covers).
std::vector<std::string> band_families(const Model& model, const Cluster& cluster,
                                       const Plan& plan);

// The band of a prediction of `plan`, by the rules above.
ErrorBand error_band(const ErrorBands& bands, const Model& model, const Cluster& cluster,
                     const Plan& plan);
ErrorBand error_band(const Profile& profile, const Model& model, const Cluster& cluster,
                     const Plan& plan);

// step_s x (1 + the band's fraction): the step time to rank by when a plan must not disappoint
// (unvalidated plans carry the largest rms error of all families).
double pessimistic_step_time(const ErrorBands& bands, const Model& model, const Cluster& cluster,
                             const Plan& plan, double step_s);
double pessimistic_step_time(const Profile& profile, const Model& model, const Cluster& cluster,
                             const Plan& plan, double step_s);

// {"fraction", "low_s", "high_s", "validated", "families", "unvalidated_reason" (when not)}.
Json band_to_json(const ErrorBand& band, double step_s);
// "± 9%", or "± 36% unvalidated".
std::string band_label(const ErrorBand& band);
// Where the fraction comes from: "the largest rms error of the suites it draws on: h100-dense",
// or "<why unvalidated>; the largest rms error of any suite".
std::string band_description(const ErrorBand& band);

// The line the estimate and simulate commands print for a step of step_s seconds: "error band
// <low> - <high> (<label>: <description>)".
std::string band_line(const ErrorBand& band, double step_s);

// The per-family statistics of an accuracy report as bands.
ErrorBands error_bands_from_report(const AccuracyReport& report);

// JSON: an array of {"family", "runs", "mean_error", "rms_error", "max_abs_error"}. Throws
// parasol::Error naming the entry and field.
ErrorBands error_bands_from_json(const Json& j, const std::string& path = "error_bands");
Json error_bands_to_json(const ErrorBands& bands);

// The bands file (cost_models/error_bands.json, `parasol accuracy --write-bands`):
// {"about", "suites": [paths], "error_bands": [...]}.
Json error_bands_file_json(const ErrorBands& bands, const std::vector<std::string>& suites);
ErrorBands error_bands_from_file_json(const Json& j, const std::string& path);

// cost_models/error_bands.json as compiled into the library (parsed once).
const ErrorBands& embedded_error_bands();

}  // namespace parasol::cost
