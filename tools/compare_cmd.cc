// `parasol compare PREDICTED MEASURED... [--json]`: a predicted trace (parasol simulate --trace)
// against a measured one (parasol run --trace; several files are per-rank parts of one run, as
// merge_traces joins them): per op kind and per phase the predicted and measured time per step
// and the error, then the step time, exposed communication and bubble. traces/compare.h has the
// matching rule and what is rejected (exit 2).
// MEASURED may instead be a Megatron-LM training log (recognised by its `elapsed time per
// iteration (ms)` lines, interop/megatron_log.h): then the predicted trace's step time (median
// over its steps) is compared with the log's (median of its lines after the first, warm-up).
// `parasol compare --measured TRACE... --plan P` (with the model, cluster and plan flags) sets
// PyTorch profiler (Kineto) traces or Nsight Systems SQLite exports, one per rank
// (traces/framework_traces.h), beside the plan's
// simulated step: per op kind, per stream and the step time (traces/kind_compare.h).
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>

#include "core/error.h"
#include "core/format.h"
#include "core/lower.h"
#include "interop/megatron_log.h"
#include "sim/engine.h"
#include "tools/commands.h"
#include "tools/spec.h"
#include "traces/compare.h"
#include "traces/framework_traces.h"
#include "traces/kind_compare.h"
#include "traces/summary.h"
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

// The text of `path` when it is a Megatron-LM training log, else "".
std::string megatron_log_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return "";
  std::stringstream s;
  s << in.rdbuf();
  return interop::looks_like_megatron_log(s.str()) ? s.str() : "";
}

// The step time of the predicted trace against a Megatron-LM log's.
int compare_with_megatron_log(const std::string& predicted, const std::string& log_path,
                              const std::string& text, bool json) {
  const traces::TraceSummary p = traces::summarize(traces::read_trace_file(predicted));
  if (p.steps == 0) throw Error(predicted, "the predicted trace has no events");
  const interop::MegatronLog log = interop::read_megatron_log(text, log_path);
  traces::CompareRow step{"step time", p.step_time_s, log.step_time_s, 0};
  if (json) {
    Json j = {{"predicted", predicted},
              {"measured", log_path},
              {"measured_kind", "megatron-log"},
              {"log_lines", log.step_s.size()},
              {"log_lines_skipped", log.skipped},
              {"measured_step_times_s", log.step_s},
              {"step",
               {{"key", step.key},
                {"predicted_s", step.predicted_s},
                {"measured_s", step.measured_s},
                {"events", 0},
                {"error", step.error()}}}};
    std::cout << j.dump(1) << "\n";
    return 0;
  }
  std::cout << "Megatron-LM log " << log_path << ": " << log.step_s.size()
            << " elapsed-time lines, the first " << log.skipped
            << " left out as warm-up, median of the rest\n";
  std::cout << "time per step (predicted, measured, error):\n";
  print_row(step, 38);
  std::cout << "step time error " << fmt("%+.1f%%", 100 * step.error()) << "\n";
  return 0;
}

// The plan's simulated step against imported traces.
int compare_with_imported(const std::vector<std::string>& files, const SpecOptions& o,
                          CLI::App* cmd, bool json, bool allow_mismatch) {
  traces::ImportedTrace imp = traces::import_framework_traces(files);
  const Spec s = load_spec(o, cmd, true);
  traces::label_copies_by_plan(imp, s.plan.offload.any());
  for (const std::string& m :
       traces::check_against_plan(imp, s.cluster->gpu_device(0).name, s.plan.gpus(),
                                  dtype_name(s.plan.precision), allow_mismatch))
    std::cerr << "warning: " << m << "\n";
  validate(s.plan, s.model, *s.cluster);
  const sim::SimResult r =
      sim::simulate(s.model, *s.cluster, lower(s.model, *s.cluster, s.plan), s.profile, true);
  const traces::KindComparison c =
      traces::compare_by_kind(r.trace, imp.trace, imp.steps, traces::step_time_s(imp));
  if (json) {
    Json j = traces::kind_comparison_to_json(c);
    j["measured"] = files;
    j["measured_kind"] = "imported";
    j["unclassified_kernels"] =
        imp.by_kind.count("unclassified") ? imp.by_kind.at("unclassified") : 0;
    std::cout << j.dump(1) << "\n";
    return 0;
  }
  std::cout << "the plan's simulated step (" << c.predicted_ranks
            << " representative rank(s)) against " << files.size() << " PyTorch profiler trace(s) ("
            << c.measured_ranks << " rank(s), " << c.measured_steps << " step(s))\n";
  std::cout << "time per rank and step (predicted, measured, error, measured events):\n";
  constexpr int kWidth = 38;
  std::cout << "by op kind:\n";
  for (const auto& row : c.by_kind) print_row(row, kWidth);
  std::cout << "by phase:\n";
  for (const auto& row : c.by_phase) print_row(row, kWidth);
  std::cout << "by stream:\n";
  for (const auto& row : c.by_stream) print_row(row, kWidth);
  print_row(c.busy, kWidth);
  std::cout << "per step:\n";
  print_row(c.step, kWidth);
  std::cout << "step time error " << fmt("%+.1f%%", 100 * c.step.error()) << "\n";
  return 0;
}

}  // namespace

Runner add_compare(CLI::App& app) {
  auto* cmd = app.add_subcommand("compare", "compare a predicted trace with a measured one");
  auto predicted = std::make_shared<std::string>();
  auto measured = std::make_shared<std::vector<std::string>>();
  auto json = std::make_shared<bool>(false);
  auto kineto = std::make_shared<std::vector<std::string>>();
  auto allow_mismatch = std::make_shared<bool>(false);
  auto o = std::make_shared<SpecOptions>();
  cmd->add_option("predicted", *predicted, "predicted trace (parasol simulate --trace)");
  cmd->add_option("measured", *measured,
                  "measured trace (parasol run --trace; several files: per-rank parts of one "
                  "run), or a Megatron-LM training log");
  cmd->add_option("--measured", *kineto,
                  "PyTorch profiler (Kineto) traces (.json or .json.gz) or Nsight Systems SQLite "
                  "exports, one per rank, compared "
                  "with the plan that the plan flags give (instead of PREDICTED MEASURED)");
  cmd->add_flag("--allow-mismatch", *allow_mismatch,
                "--measured: compare even where the traces contradict the plan (another GPU, "
                "world size, rank count or precision), with a warning for each");
  cmd->add_flag("--json", *json, "print JSON");
  add_target_flags(cmd, *o);
  add_plan_flags(cmd, *o);
  add_profile_flag(cmd, *o);
  return [=]() {
    if (!kineto->empty()) {
      if (!predicted->empty())
        throw Error("predicted", "--measured compares with the plan: give no trace files besides");
      return compare_with_imported(*kineto, *o, cmd, *json, *allow_mismatch);
    }
    if (predicted->empty()) throw Error("predicted", "required (or --measured TRACE... --plan P)");
    if (measured->empty()) throw Error("measured", "required: the measured trace(s) or log");
    if (measured->size() == 1) {
      const std::string log = megatron_log_text(measured->front());
      if (!log.empty()) return compare_with_megatron_log(*predicted, measured->front(), log, *json);
    }
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
