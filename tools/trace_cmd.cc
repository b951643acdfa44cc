// `parasol trace import FILE... [-o OUT] [--json]`: reads PyTorch profiler (Kineto) traces or
// Nsight Systems SQLite exports, one file per rank (traces/framework_traces.h), writes them in
// parasol's trace schema (-o) and prints what they hold: events per op kind, the kernels no rule
// classifies (named and counted), the collectives' counts and bytes, and each rank's idle time and
// launch gaps.
#include <iostream>
#include <memory>

#include "core/error.h"
#include "core/format.h"
#include "tools/commands.h"
#include "traces/framework_traces.h"
#include "traces/trace.h"

namespace parasol::tools {

namespace {

int run_import(const std::vector<std::string>& files, const std::string& out, bool json) {
  const traces::ImportedTrace imp = traces::import_framework_traces(files);
  if (!out.empty()) traces::write_trace_file(imp.trace, out);
  Json s = traces::import_summary_to_json(imp);
  if (json) {
    s["out"] = out.empty() ? Json() : Json(out);
    std::cout << s.dump(1) << "\n";
    return 0;
  }
  std::cout << "imported " << s["events"].get<int>() << " device events (" << imp.kernels
            << " kernels) of " << s["ranks"].get<int>() << " rank(s) from " << files.size()
            << " file(s)\n";
  std::cout << "by kind (events, time summed over ranks and steps):\n";
  for (const auto& [kind, v] : s["by_kind"].items())
    std::cout << "  " << kind << std::string(kind.size() < 16 ? 16 - kind.size() : 1, ' ')
              << fmt("%8.0f", v["events"].get<double>()) << "  " << secs(v["seconds"].get<double>())
              << "\n";
  if (!imp.unclassified.empty()) {
    std::cout << "unclassified kernels (" << imp.unclassified.size() << " names, "
              << imp.by_kind.at("unclassified") << " events):\n";
    constexpr size_t kShown = 20;  // --json lists them all
    for (size_t i = 0; i < imp.unclassified.size() && i < kShown; ++i) {
      const traces::KernelCount& k = imp.unclassified[i];
      std::string n = k.name.size() > 100 ? k.name.substr(0, 97) + "..." : k.name;
      std::cout << "  " << fmt("%6.0f", k.count) << "  " << secs(k.seconds) << "  " << n << "\n";
    }
    if (imp.unclassified.size() > kShown)
      std::cout << "  ... and " << imp.unclassified.size() - kShown << " more names (--json)\n";
  }
  if (!s["collectives"].empty()) {
    std::cout << "collectives (events, with a known size, bytes):\n";
    for (const Json& c : s["collectives"])
      std::cout << "  " << c["kind"].get<std::string>() << ": " << c["events"].get<int>() << ", "
                << c["sized"].get<int>() << ", " << fmt("%.0f", c["bytes"].get<double>()) << "\n";
  }
  std::cout << "per rank (device busy, idle between activities, of it waiting for the host's "
               "launches):\n";
  for (const traces::RankGaps& g : imp.gaps)
    std::cout << "  rank " << g.rank << ": " << secs(g.busy_s) << " busy, " << secs(g.idle_s)
              << " idle, " << secs(g.launch_s) << " in " << g.launch_gaps << " launch gaps\n";
  if (!out.empty()) std::cout << "trace written to " << out << "\n";
  return 0;
}

}  // namespace

Runner add_trace(CLI::App& app) {
  auto* cmd = app.add_subcommand("trace", "import the traces of other tools");
  cmd->require_subcommand(1);
  auto* imp = cmd->add_subcommand(
      "import",
      "read PyTorch profiler (Kineto) traces or Nsight Systems SQLite exports, one per rank, "
      "into parasol's schema");
  auto files = std::make_shared<std::vector<std::string>>();
  auto out = std::make_shared<std::string>();
  auto json = std::make_shared<bool>(false);
  imp->add_option(
         "files", *files,
         "PyTorch profiler (Kineto) Chrome JSON traces (.json or .json.gz) or Nsight Systems "
         "SQLite exports (nsys export --type sqlite), one per rank")
      ->required();
  imp->add_option("-o,--out", *out, "write the imported trace (parasol's schema) here");
  imp->add_flag("--json", *json, "print JSON");
  return [=]() { return run_import(*files, *out, *json); };
}

}  // namespace parasol::tools
