// `parasol compare PREDICTED MEASURED... [--json]`: a predicted trace (parasol simulate --trace)
// against a measured one (parasol run --trace; several files are per-rank parts of one run, as
// merge_traces joins them): per op kind and per phase the predicted and measured time per step
// and the error, then the step time, exposed communication and bubble. traces/compare.h has the
// matching rule and what is rejected (exit 2).
#include <iostream>
#include <memory>

#include "tools/commands.h"
#include "tools/format.h"
#include "traces/compare.h"
#include "traces/trace.h"

namespace parasol::tools {

namespace {

// `s` padded with spaces on the left (right: on the right) to `width` characters.
std::string pad(std::string s, size_t width, bool right = false) {
  if (s.size() < width) s.insert(right ? s.end() : s.begin(), width - s.size(), ' ');
  return s;
}

void print_row(const traces::CompareRow& r, int width) {
  std::cout << "  " << pad(r.key, width, true) << "  " << pad(secs(r.predicted_s), 12) << "  "
            << pad(secs(r.measured_s), 12) << "  "
            << (r.measured_s > 0 ? fmt("%+8.1f%%", 100 * r.error()) : std::string("       -"));
  if (r.events > 0) std::cout << "  " << r.events;
  std::cout << "\n";
}

}  // namespace

Runner add_compare(CLI::App& app) {
  auto* cmd = app.add_subcommand("compare", "compare a predicted trace with a measured one");
  auto predicted = std::make_shared<std::string>();
  auto measured = std::make_shared<std::vector<std::string>>();
  auto json = std::make_shared<bool>(false);
  cmd->add_option("predicted", *predicted, "predicted trace (parasol simulate --trace)")
      ->required();
  cmd->add_option("measured", *measured,
                  "measured trace (parasol run --trace); several files: per-rank parts of one run")
      ->required();
  cmd->add_flag("--json", *json, "print JSON");
  return [=]() {
    const traces::Trace p = traces::read_trace_file(*predicted);
    const traces::Trace m = traces::read_trace_files(*measured);
    const std::string mname = measured->size() == 1 ? measured->front() : "measured";
    const traces::Comparison c = traces::compare_traces(p, m, *predicted, mname);
    if (*json) {
      Json j = traces::comparison_to_json(c);
      j["predicted"] = *predicted;
      j["measured"] = *measured;
      std::cout << j.dump(1) << "\n";
      return 0;
    }
    std::cout << "matched " << c.matched << " ops of " << c.rank_map.size()
              << " measured rank(s) to " << *predicted << " (";
    bool first = true;
    for (const auto& [mr, pr] : c.rank_map) {
      std::cout << (first ? "" : ", ") << mr << "->" << pr;
      first = false;
    }
    std::cout << ")";
    if (c.unmatched_predicted > 0)
      std::cout << "; " << c.unmatched_predicted << " predicted ops not measured";
    std::cout
        << "\ntime per step, summed over the measured ranks (predicted, measured, error, ops):\n";
    constexpr int kWidth = 38;
    std::cout << "by op kind:\n";
    for (const auto& r : c.by_kind) print_row(r, kWidth);
    std::cout << "by phase:\n";
    for (const auto& r : c.by_phase) print_row(r, kWidth);
    print_row(c.total, kWidth);
    std::cout << "per step:\n";
    print_row(c.exposed_comm, kWidth);
    print_row(c.bubble, kWidth);
    print_row(c.step, kWidth);
    std::cout << "step time error " << fmt("%+.1f%%", 100 * c.step.error()) << "\n";
    return 0;
  };
}

}  // namespace parasol::tools
