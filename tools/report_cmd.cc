// `parasol report`: writes one self-contained HTML file (report/report.h) about a plan (--plan
// FILE or the plan flags) or, with --search, about the plans a search finds and its best plan;
// with --sweep FILE, the page of a `parasol sweep` document or journal (report/sweep_page.h).
// It calls the same functions as `estimate` and `search` (tools/api.h run_estimate and
// run_search, so --tokens gives the time to train of `estimate --tokens` and ranks a search as
// `search --tokens` does), then lowers the plan and plays it in the event simulator with the
// trace recorded and takes the liveness of each stage's Program, and hands the results to the
// report library.
#include <fstream>
#include <iostream>

#include "core/error.h"
#include "core/format.h"
#include "core/liveness.h"
#include "core/lower.h"
#include "cost_models/error_bands.h"
#include "cost_models/estimate.h"
#include "interop/interop.h"
#include "report/report.h"
#include "report/sweep_page.h"
#include "sim/engine.h"
#include "sim/search.h"
#include "tools/api.h"
#include "tools/commands.h"
#include "tools/flag_checks.h"
#include "tools/job_flags.h"
#include "tools/spec.h"
#include "tools/sweep.h"

namespace parasol::tools {

namespace {

// The lower floors' results for `plan` of the spec: its estimate, band and time to train as
// given, and the simulation (with its trace) and the liveness of every stage's Program.
// REQUIRES: validate(plan, s.model, *s.cluster) passed.
report::PlanResults plan_results(const Spec& s, const Plan& plan, const cost::Estimate& estimate,
                                 const cost::ErrorBand& band,
                                 std::optional<cost::TimeToTrain> job) {
  report::PlanResults p;
  p.model_name = s.model.name;
  p.cluster_name = s.cluster->name;
  p.device_name = s.cluster->gpu_device(0).name;
  p.gpus = s.cluster->num_gpus();
  p.plan = plan;
  p.estimate = estimate;
  p.band = band;
  p.job = std::move(job);
  const LoweredPlan lowered = lower(s.model, *s.cluster, plan);
  sim::Simulator simulator(s.model, *s.cluster, s.profile);
  p.simulation = simulator.simulate(lowered, true);
  for (const Program& program : lowered.programs) p.stage_memory.push_back(liveness(program));
  return p;
}

}  // namespace

Runner add_report(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "report", "write a self-contained HTML report of a plan (or, with --search, of a search)");
  auto o = std::make_shared<SpecOptions>();
  auto out = std::make_shared<std::string>();
  auto search = std::make_shared<bool>(false);
  auto top = std::make_shared<int>(10);
  auto threads = std::make_shared<int>(0);
  auto max_events = std::make_shared<int>(20000);
  auto job = std::make_shared<JobFlags>();
  add_target_flags(cmd, *o);
  add_plan_flags(cmd, *o);
  add_profile_flag(cmd, *o);
  add_job_flags(cmd, *job);
  cmd->add_option("-o,--out", *out, "the HTML file to write")->required();
  cmd->add_flag("--search", *search,
                "search the plans (--gbs, --seq and --precision set the search; no other plan "
                "flag) and report the Pareto front, the top plans and the best plan");
  cmd->add_option("--top", *top, "with --search: how many plans to list")
      ->capture_default_str()
      ->check(count_in(1));
  cmd->add_option("--threads", *threads, "with --search: worker threads (default: all cores)")
      ->check(count_in(1, 4096));
  auto framework = std::make_shared<std::string>();
  cmd->add_option("--framework", *framework,
                  "with --search: list only plans this framework can run (as `parasol search "
                  "--framework`): megatron|deepspeed|torchtitan")
      ->check(CLI::IsMember(interop::framework_names()));
  cmd->add_option("--max-events", *max_events,
                  "the most ops the timeline draws one by one while in view (coarser views merge "
                  "ops into spans per stream; every op of the step is in the page)")
      ->capture_default_str()
      ->check(count_in(1));
  auto sweep = std::make_shared<std::string>();
  CLI::Option* sweep_opt = cmd->add_option(
      "--sweep", *sweep,
      "the page of a sweep instead: `parasol sweep --json`'s document or its --out journal "
      "(a heatmap over its axes, the cost-time Pareto front, every point's best plan)");
  CLI::Option* out_opt = cmd->get_option("--out");
  return [=]() {
    if (sweep_opt->count() > 0) {
      // The document holds the sweep's settings: any other flag would be ignored, so none is.
      std::vector<std::string> given;
      for (const CLI::Option* opt : cmd->get_options())
        if (opt != sweep_opt && opt != out_opt && opt != cmd->get_help_ptr() && opt->count() > 0)
          given.push_back(opt->get_name());
      if (!given.empty())
        throw Error("report.sweep",
                    "takes only -o/--out: the sweep's document holds its settings (remove " +
                        join(given, ", ") + ")");
      const std::string html = report::sweep_html(read_sweep_file(*sweep));
      std::ofstream f(*out, std::ios::binary);
      if (!f || !(f << html) || !f.flush())
        throw Error("report.out", "cannot write '" + *out + "'");
      std::cout << "report written to " << *out << " (" << html.size() / 1024 << " KiB)\n";
      return 0;
    }
    if (*max_events < 1) throw Error("report.max_events", "must be >= 1");
    report::ReportInput in;
    in.max_timeline_events = *max_events;
    if (!framework->empty() && !*search)
      throw Error("report.framework", "lists the plans of a search: give --search");
    if (*search) {
      if (!o->plan_file.empty() || o->tp || o->pp || o->dp || o->cp || o->ep || o->sp || o->vpp ||
          o->mbs || o->zero || o->schedule || o->recompute || o->recompute_layers || o->offload ||
          o->stage_layers)
        throw Error("report.search",
                    "takes no plan (--plan, --tp, --pp, --dp, --cp, --ep, --sp, --vpp, --mbs, "
                    "--zero, --schedule, --recompute, --recompute-layers, --offload, "
                    "--stage-layers): the search makes its own");
      if (*top < 1) throw Error("report.top", "must be >= 1");
      SpecOptions so = *o;
      so.tp = 1;  // placeholder plan; the search makes its own (as `parasol search`)
      Spec s = load_spec(so, cmd, false);
      SearchSettings settings;  // `parasol search`'s defaults
      settings.top = *top;
      settings.gbs = o->gbs.value_or(settings.gbs);
      settings.seq = o->seq.value_or(0);
      settings.threads = *threads;
      settings.precision = o->precision.value_or(settings.precision);
      settings.job = *job;
      settings.framework = *framework;
      const SearchRun run = run_search(s, settings, so.model, so.cluster, {});
      report::SearchResults sr;
      sr.result = run.result;
      sr.global_batch = settings.gbs;
      for (const auto& c : sr.result.top) {
        sr.top_bands.push_back(cost::error_band(s.profile, s.model, *s.cluster, c.plan));
        if (run.train_of) sr.top_jobs.push_back(run.train_of(c.plan, c.estimate));
      }
      // The best plan: the first of the search's ranking (by the time to train with --tokens).
      const Plan& best = sr.result.top.front().plan;
      validate(best, s.model, *s.cluster);
      in.plan =
          plan_results(s, best, sr.result.top.front().estimate, sr.top_bands.front(),
                       sr.top_jobs.empty() ? std::nullopt : std::optional(sr.top_jobs.front()));
      in.search = std::move(sr);
    } else {
      Spec s = load_spec(*o, cmd, true);
      const EstimateRun r = run_estimate(s, *job);  // validates the plan
      in.plan = plan_results(s, s.plan, r.estimate, r.band, r.job);
    }
    const std::string html = report::report_html(in);
    std::ofstream f(*out, std::ios::binary);
    if (!f || !(f << html) || !f.flush()) throw Error("report.out", "cannot write '" + *out + "'");
    std::cout << "report written to " << *out << " (" << html.size() / 1024 << " KiB)\n";
    return 0;
  };
}

}  // namespace parasol::tools
