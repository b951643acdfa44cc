// `parasol search`: the best plans for a model on a cluster, a ranked table with each step
// time's error band (cost_models/error_bands.h), the Pareto front, and the best plan written as
// a plan file. With --tokens the plans are ranked by their time to train those tokens
// (cost_models/time_to_train.h: stragglers, checkpoints, interruptions and restarts around the
// step), shown in a "train" column.
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>

#include "core/error.h"
#include "core/format.h"
#include "cost_models/error_bands.h"
#include "cost_models/time_to_train.h"
#include "interop/interop.h"
#include "sim/search.h"
#include "tools/api.h"
#include "tools/commands.h"
#include "tools/flag_checks.h"
#include "tools/job_flags.h"
#include "tools/progress.h"
#include "tools/spec.h"

namespace parasol::tools {

namespace {
// The band column: "± 9%" or "unvalidated", padded to 11 display columns ("±" is two bytes).
std::string band_cell(const cost::ErrorBand& b) {
  std::string cell = b.validated ? cost::band_label(b) : "unvalidated";
  const size_t width = cell.size() - (b.validated ? 1 : 0);
  return cell + std::string(width < 11 ? 11 - width : 0, ' ');
}
// The sharding cell: the ZeRO stage, with ZeRO-3's reshard point (fwd: FSDP's per-layer
// regather; bwd: kept to the backward; step: gathered once a step) and HSDP's shard group.
std::string zero_cell(const Plan& p) {
  std::string cell = std::to_string(p.zero);
  if (p.zero >= 3)
    cell += p.reshard == Reshard::kAfterForward    ? " fwd"
            : p.reshard == Reshard::kAfterBackward ? " bwd"
                                                   : " step";
  if (p.zero >= 1 && p.shard_degree > 0) cell += " h" + std::to_string(p.shard_degree);
  return cell;
}

// The "train" cell: days to train the tokens, and the goodput ("41.2 d 91.9%"); empty without
// --tokens.
std::string train_cell(const std::optional<cost::TimeToTrain>& t) {
  if (!t) return "";
  return fmt("%.1f d", t->time_s / 86400) + " " + pct(t->goodput.fraction());
}

void print_row(const sim::Candidate& c, int rank, const cost::ErrorBand& band,
               const std::string& train = "") {
  const Plan& p = c.plan;
  const cost::Estimate& e = c.estimate;
  // Selective recompute's modules as "sel:moe_act,layernorm" (Megatron's names).
  std::string recompute = recompute_label(p);
  if (recompute.rfind("selective:", 0) == 0) recompute = "sel:" + recompute.substr(10);
  if (p.recompute_layers >= 0) recompute += ":" + std::to_string(p.recompute_layers);
  std::printf(
      "%4d  %3d %3d %5d %3d %3d %-3s %-3s %-12s %4d %4d %-21s %-14s %-10s %9s %s %10s %6s %9s%s\n",
      rank, p.tp, p.pp, p.dp, p.cp, p.ep, p.sequence_parallel ? "on" : "off",
      p.tp_comm_overlap ? "on" : "off",
      p.schedule == Schedule::kInterleaved
          ? (std::string("interleaved") + std::to_string(p.vpp)).c_str()
          : schedule_name(p.schedule),
      p.micro_batch, p.micro_batches(), recompute.c_str(), offload_name(p.offload).c_str(),
      zero_cell(p).c_str(), secs(e.step_time_s).c_str(), band_cell(band).c_str(),
      count(e.tokens_per_s).c_str(), pct(e.mfu).c_str(), gib(e.memory_per_gpu_bytes).c_str(),
      train.empty() ? "" : ("  " + train).c_str());
}
void print_header(bool train) {
  std::printf(
      "%4s  %3s %3s %5s %3s %3s %-3s %-3s %-12s %4s %4s %-21s %-14s %-10s %9s %-11s %10s %6s "
      "%9s%s\n",
      "#", "tp", "pp", "dp", "cp", "ep", "sp", "tpo", "schedule", "mbs", "mb", "recompute",
      "offload", "zero", "step", "band", "tokens/s", "MFU", "mem/GPU",
      train ? "  train (days, goodput)" : "");
}
}  // namespace

Runner add_search(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "search", "find the fastest plans (default: gpt3-175b on 1,024 A100s, gbs 1,536)");
  auto o = std::make_shared<SpecOptions>();
  auto top = std::make_shared<int>(10);
  auto gbs = std::make_shared<int>(1536);
  auto seq = std::make_shared<int64_t>(0);
  auto out = std::make_shared<std::string>();
  auto json = std::make_shared<bool>(false);
  auto threads = std::make_shared<int>(0);
  auto precision = std::make_shared<std::string>("bf16");
  auto no_offload = std::make_shared<bool>(false);
  auto simulate_top = std::make_shared<int>(0);
  auto robust = std::make_shared<bool>(false);
  auto job = std::make_shared<JobFlags>();
  o->gpus = 1024;
  add_target_flags(cmd, *o);
  add_profile_flag(cmd, *o);
  add_job_flags(cmd, *job);
  cmd->add_option("--gbs", *gbs, "global batch size (sequences)")
      ->capture_default_str()
      ->check(count_in(1, 1 << 30));
  cmd->add_option("--seq", *seq, "sequence length (default: the model's)")->check(count_in(1));
  cmd->add_option("--top", *top, "how many plans to list")
      ->capture_default_str()
      ->check(count_in(1));
  cmd->add_option("--out", *out, "write the best plan to this file");
  cmd->add_option("--threads", *threads, "worker threads (default: all cores)")
      ->check(count_in(1, 4096));
  cmd->add_option("--precision", *precision, "fp32|bf16|fp16|fp8")->capture_default_str();
  cmd->add_flag("--no-offload", *no_offload, "do not consider offloading");
  cmd->add_flag("--robust", *robust,
                "rank by the pessimistic end of each plan's error band instead of its step time");
  cmd->add_option("--simulate-top", *simulate_top,
                  "re-rank the best N plans by the event simulator (lowers and plays each)")
      ->check(count_in(0));
  auto framework = std::make_shared<std::string>();
  cmd->add_option("--framework", *framework,
                  "list only plans this framework can run (parasol export --to succeeds): "
                  "megatron|deepspeed|torchtitan")
      ->check(CLI::IsMember(interop::framework_names()));
  auto memory_margin = std::make_shared<double>(0);
  cmd->add_option("--memory-margin", *memory_margin,
                  "GiB of device memory every listed plan leaves free beyond its reserved memory "
                  "at the top of its band (the caching allocator's fragmentation at the high end "
                  "of its range), as nvidia-smi would show it")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->add_flag("--json", *json, "print JSON");
  return [=]() {
    SpecOptions so = *o;
    so.tp = 1;  // placeholder plan; the search makes its own
    Spec s = load_spec(so, cmd, false);
    const SearchSettings settings{*top,       *gbs,        *seq,          *threads,
                                  *precision, *no_offload, *simulate_top, *robust,
                                  *job,       *framework,  *memory_margin};
    // A bar on stderr when it is a terminal and the search runs past a second (tools/progress.h).
    auto bar = std::make_shared<ProgressBar>(stderr, stream_is_terminal(stderr), "searching");
    SearchRun run;
    try {
      run = run_search(s, settings, so.model, so.cluster, [bar](double x) { bar->update(x); });
    } catch (...) {
      bar->finish();
      throw;
    }
    bar->finish();
    const sim::SearchResult& r = run.result;
    const Plan& best = run.best;
    auto band_of = [&](const Plan& p) {
      return cost::error_band(s.profile, s.model, *s.cluster, p);
    };
    if (!out->empty()) {
      std::ofstream f(*out);
      if (!f) throw Error("search.out", "cannot write '" + *out + "'");
      f << plan_to_json(best).dump(1) << "\n";
    }
    if (*json) {
      std::cout << search_document(s, run).dump(1) << "\n";
      return 0;
    }
    std::cout << "search: " << s.model.name << " on " << s.cluster->num_gpus() << " x "
              << s.cluster->gpu_device(0).name << " (" << s.cluster->name << "), global batch "
              << *gbs << ", seq " << (*seq ? *seq : s.model.seq_len) << "\n";
    std::cout << count(r.enumerated) << " plans enumerated, " << count(r.fitting)
              << " fit in memory, " << fmt("%.2f", r.seconds) << " s ("
              << count(r.enumerated / std::max(1e-9, r.seconds)) << " plans/s)\n";
    if (r.not_by_reserved > 0)
      std::cout << count(r.not_by_reserved)
                << " dropped by the reserved figure: allocated fits, reserved at the top of its "
                   "band does not\n";
    if (!framework->empty())
      std::cout << "listed: only plans " << *framework << " can run (parasol export --to "
                << *framework << " succeeds)\n";
    std::cout << "\n";
    const bool tokens = job->tokens.has_value();
    auto train_of_candidate = [&](const sim::Candidate& c) {
      std::optional<cost::TimeToTrain> t;
      if (tokens) t = run.train_of(c.plan, c.estimate);
      return t;
    };
    if (tokens)
      std::cout << "ranked by the time to train " << count(*job->tokens)
                << " tokens (checkpoints, interruptions, restarts and stragglers around each "
                   "step)\n";
    print_header(tokens);
    for (size_t i = 0; i < r.top.size(); ++i)
      print_row(r.top[i], static_cast<int>(i + 1), band_of(r.top[i].plan),
                train_cell(train_of_candidate(r.top[i])));
    if (!r.top.empty()) {
      const cost::Estimate& e = r.top.front().estimate;
      std::cout << "\nthe best plan's memory per GPU " << gib(e.memory_per_gpu_bytes) << " of "
                << gib(e.device_memory_bytes);
      if (*memory_margin > 0) std::cout << " (margin " << fmt("%.1f", *memory_margin) << " GiB)";
      std::cout << "\n";
      print_framework_memory(e.stage_memory.empty() ? e.framework : e.stage_memory[e.peak_stage],
                             e.peak_stage, e.peak_rank);
      print_stage_memory(e.stage_memory, e.peak_stage);
    }
    if (tokens && !r.top.empty()) {
      std::cout << "\nthe best plan's time to train:\n";
      print_time_to_train(*train_of_candidate(r.top.front()));
    }
    if (*simulate_top > 0) {
      std::cout << "\nre-ranked by the event simulator (lowered Programs):\n";
      for (size_t i = 0; i < r.top.size() && r.top[i].simulated_step_s > 0; ++i) {
        const sim::Candidate& c = r.top[i];
        std::printf("%4zu  simulated step %s %s (closed form %s)", i + 1,
                    secs(c.simulated_step_s).c_str(), cost::band_label(band_of(c.plan)).c_str(),
                    secs(c.estimate.step_time_s).c_str());
        if (tokens)
          std::printf(
              ", time to train %s",
              train_cell(run.train_of_step(c.plan, {c.simulated_step_s, c.simulated_compute_s}))
                  .c_str());
        std::printf("\n");
      }
    }
    std::cout << (tokens ? "\nPareto front (time to train vs memory):\n"
                         : "\nPareto front (tokens/s vs memory):\n");
    print_header(tokens);
    for (size_t i = 0; i < r.pareto.size() && i < 12; ++i)
      print_row(r.pareto[i], static_cast<int>(i + 1), band_of(r.pareto[i].plan),
                train_cell(train_of_candidate(r.pareto[i])));
    if (!out->empty()) std::cout << "\nbest plan written to " << *out << "\n";
    return 0;
  };
}

}  // namespace parasol::tools
