// `parasol accuracy SUITE.json...`: published vs predicted step times, per run, per family and
// overall (mean |error|, signed bias, max), and whether every published run is predicted to fit;
// --write-bands FILE writes the per-family statistics as error bands (cost_models/error_bands.h);
// --profile-set and --plan-set change one term of the model or one switch of every published plan
// (tools/json_settings.h) to measure what it does to each family (tools/term-effects.sh).
#include "cost_models/accuracy.h"

#include <fstream>
#include <iostream>

#include "core/error.h"
#include "core/format.h"
#include "cost_models/error_bands.h"
#include "cost_models/profile_sensitivity.h"
#include "sim/predict.h"
#include "tools/commands.h"
#include "tools/json_settings.h"

namespace parasol::tools {

namespace {
// The predictor with the settings applied: the device's default profile with --profile-set, the
// published plan with --plan-set (kept as published where the setting makes it invalid for the
// run, e.g. a dispatcher on a dense model).
cost::Predictor set_predictor(bool simulate, std::vector<std::string> profile_set,
                              std::vector<std::string> plan_set) {
  return [=](const Model& m, const Cluster& c, const Plan& published, cost::Reserved reserved) {
    cost::Profile prof = cost::default_profile(c.gpu_device(0));
    if (!profile_set.empty())
      prof = cost::profile_from_json(
          with_settings(cost::profile_to_json(prof), profile_set, "accuracy.profile_set"),
          "accuracy.profile_set");
    Plan p = published;
    if (!plan_set.empty()) {
      Json j = with_settings(plan_to_json(published), plan_set, "accuracy.plan_set");
      try {
        Plan changed = plan_from_json(j, "accuracy.plan_set");
        validate(changed, m, c);
        p = changed;
      } catch (const Error& e) {
        if (!e.is_user_error()) throw;  // a plan_set the plan cannot take keeps the published plan
      }
    }
    return simulate ? sim::simulate_prediction(m, c, p, prof, reserved)
                    : cost::estimate_prediction(m, c, p, prof, reserved);
  };
}

// --sensitivity: one line per figure and end of its range, each family's mean |error| and bias.
void print_sensitivity(const cost::ProfileSensitivity& s) {
  std::printf("%-34s %-5s %5s", "figure (cost_models/profile_ranges.cc)", "end", "moved");
  for (const auto& f : s.base.families) std::printf(" %16s", f.family.c_str());
  std::printf(" %16s   values\n", "overall");
  auto cells = [](const cost::AccuracyReport& r) {
    for (const auto& f : r.families)
      std::printf("  %6.2f%% %+6.2f%%", f.stats.mean_abs_error * 100, f.stats.mean_error * 100);
    std::printf("  %6.2f%% %+6.2f%%", r.overall.mean_abs_error * 100, r.overall.mean_error * 100);
  };
  std::printf("%-34s %-5s %5s", "(defaults)", "", "");
  cells(s.base);
  std::printf("\n");
  for (const auto& row : s.rows) {
    std::printf("%-34s %-5s %5d", row.key.c_str(), row.high ? "high" : "low", row.runs_moved);
    cells(row.report);
    std::printf("   %s\n", row.values.c_str());
  }
  std::printf("\ncells: mean |error| and bias (signed mean error) per family\n");
}

void print_stats(const std::string& name, const cost::ErrorStats& s) {
  std::string notes;
  if (s.not_fitting) notes += "  (" + std::to_string(s.not_fitting) + " predicted not to fit)";
  if (s.dropped_by_search)
    notes += "  (" + std::to_string(s.dropped_by_search) + " the search would drop)";
  std::printf("%-16s %4d runs  mean |error| %5.2f%%  bias %+6.2f%%  max |error| %6.2f%%%s\n",
              name.c_str(), s.runs, s.mean_abs_error * 100, s.mean_error * 100,
              s.max_abs_error * 100, notes.c_str());
}
}  // namespace

Runner add_accuracy(CLI::App& app) {
  auto* cmd = app.add_subcommand("accuracy", "compare predictions with published training runs");
  auto suites = std::make_shared<std::vector<std::string>>();
  auto json = std::make_shared<bool>(false);
  auto simulate = std::make_shared<bool>(false);
  auto write_bands = std::make_shared<std::string>();
  cmd->add_option("suites", *suites, "suite JSON files (e.g. tests/data/published/*.json)")
      ->required();
  cmd->add_flag("--json", *json, "print JSON");
  cmd->add_flag("--simulate", *simulate,
                "predict with the event simulator (lowered Programs) instead of the estimate");
  auto profile_set = std::make_shared<std::vector<std::string>>();
  auto plan_set = std::make_shared<std::vector<std::string>>();
  cmd->add_option("--profile-set", *profile_set,
                  "change the device profile of every run: KEY=VALUE or KEY*=FACTOR, KEY a "
                  "'/'-path into the profile JSON (`parasol show profile`); repeatable");
  cmd->add_option("--plan-set", *plan_set,
                  "change every published plan: KEY=VALUE, KEY a plan JSON field; plans the "
                  "change makes invalid stay as published; repeatable");
  auto sensitivity = std::make_shared<bool>(false);
  cmd->add_flag("--sensitivity", *sensitivity,
                "move every profile figure to each end of its public range "
                "(cost_models/profile_ranges.cc) and show each family's error");
  cmd->add_option("--write-bands", *write_bands,
                  "write the per-family error bands of these suites to this JSON file "
                  "(tools/update-error-bands.sh: cost_models/error_bands.json)");
  return [=]() {
    std::vector<cost::PublishedRun> runs;
    for (const std::string& path : *suites) {
      auto more = cost::read_accuracy_suite(read_json_file(path), path);
      runs.insert(runs.end(), more.begin(), more.end());
    }
    if (*sensitivity) {
      if (!profile_set->empty() || !plan_set->empty() || !write_bands->empty())
        throw Error("accuracy.sensitivity",
                    "does not combine with --profile-set, --plan-set or --write-bands");
      print_sensitivity(cost::profile_sensitivity(
          runs, *simulate ? cost::ProfilePredictor(sim::simulate_prediction)
                          : cost::ProfilePredictor(cost::estimate_prediction)));
      return 0;
    }
    cost::Predictor predictor;
    if (*simulate || !profile_set->empty() || !plan_set->empty())
      predictor = set_predictor(*simulate, *profile_set, *plan_set);
    cost::AccuracyReport r = cost::run_accuracy(runs, predictor);
    if (!write_bands->empty()) {
      std::ofstream f(*write_bands);
      if (!f) throw Error("accuracy.write_bands", "cannot write '" + *write_bands + "'");
      f << cost::error_bands_file_json(cost::error_bands_from_report(r), *suites).dump(1) << "\n";
    }
    if (*json) {
      std::cout << cost::accuracy_to_json(r).dump(1) << "\n";
      return 0;
    }
    std::printf("%-34s %-14s %11s %11s %8s %6s %10s\n", "run", "family", "published", "predicted",
                "error", "MFU", "mem/GPU");
    for (const auto& row : r.rows) {
      if (!row.metric.empty()) {  // a memory point: published and predicted peaks
        const std::string where = row.rank < 0 ? "max rank" : "rank " + std::to_string(row.rank);
        std::printf("%-34s %-14s %9s %11s %+7.2f%% %6s %10s  %s of %s%s%s\n", row.id.c_str(),
                    row.family.c_str(), gib(row.published_bytes).c_str(),
                    gib(row.predicted_bytes).c_str(), row.error * 100, pct(row.mfu).c_str(),
                    gib(row.memory_per_gpu_bytes).c_str(), row.metric.c_str(), where.c_str(),
                    row.fits ? "" : "  does not fit", row.judged ? "" : "  (not judged)");
        continue;
      }
      std::printf("%-34s %-14s %9.2f s %9.2f s %+7.2f%% %6s %10s%s%s\n", row.id.c_str(),
                  row.family.c_str(), row.published_s, row.predicted_s, row.error * 100,
                  pct(row.mfu).c_str(), gib(row.memory_per_gpu_bytes).c_str(),
                  row.fits ? "" : "  does not fit", row.judged ? "" : "  (not judged)");
    }
    std::printf("\n");
    for (const auto& f : r.families) print_stats(f.family, f.stats);
    print_stats("overall", r.overall);
    return 0;
  };
}

}  // namespace parasol::tools
