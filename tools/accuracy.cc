// `parasol accuracy SUITE.json`: published vs predicted iteration times, and the errors.
#include "cost_models/accuracy.h"

#include <iostream>

#include "tools/commands.h"
#include "tools/format.h"

namespace parasol::tools {

Runner add_accuracy(CLI::App& app) {
  auto* cmd = app.add_subcommand("accuracy", "compare estimates with published training runs");
  auto suite = std::make_shared<std::string>();
  auto json = std::make_shared<bool>(false);
  cmd->add_option("suite", *suite, "suite JSON (e.g. tests/data/published/korthikanti2022.json)")
      ->required();
  cmd->add_flag("--json", *json, "print JSON");
  return [=]() {
    cost::AccuracyReport r = cost::run_accuracy_suite(read_json_file(*suite), *suite);
    if (*json) {
      std::cout << cost::accuracy_to_json(r).dump(1) << "\n";
      return 0;
    }
    std::printf("%-26s %12s %12s %8s %6s\n", "run", "published", "predicted", "error", "MFU");
    for (const auto& row : r.rows)
      std::printf("%-26s %10.2f s %10.2f s %+7.2f%% %6s\n", row.id.c_str(), row.published_s,
                  row.predicted_s, row.error * 100, pct(row.mfu).c_str());
    std::printf("mean |error| %.2f%%, max |error| %.2f%% over %zu runs\n", r.mean_abs_error * 100,
                r.max_abs_error * 100, r.rows.size());
    return 0;
  };
}

}  // namespace parasol::tools
