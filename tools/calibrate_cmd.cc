// `parasol calibrate MEASURED... -o profile.json [--base PROFILE] [--model/--cluster/plan flags]`
// fits a Profile to measured traces (traces/calibrate.h), and `parasol calibrate --probe [-o
// FILE]` measures this host's CPU as a device (tools/host_probe.h).
//
// Which run a trace is of: a trace that records its plan (Trace::plan, with its model, cluster
// and GPU count) is of that plan; the flags give the plan of traces that record none. Traces
// of one plan are per-rank parts of one run and are merged; traces of different plans are
// different runs, fitted together.
// `parasol calibrate --measured TRACE... -o profile.json` (with the model, cluster and plan
// flags) fits from PyTorch profiler (Kineto) traces or Nsight Systems SQLite exports, one per
// rank, of a job parasol did not run:
// their kernels matched by kind and shape (traces/calibrate.h's calibrate_imported); it prints
// the traced kernels' time replayed with the base and the fitted profile.
#include <fstream>
#include <iostream>
#include <map>
#include <memory>

#include "core/error.h"
#include "core/format.h"
#include "core/lower.h"
#include "sim/engine.h"
#include "tools/commands.h"
#include "tools/flag_checks.h"
#include "tools/host_probe.h"
#include "tools/spec.h"
#include "traces/calibrate.h"
#include "traces/framework_traces.h"
#include "traces/summary.h"
#include "traces/trace.h"

namespace parasol::tools {

namespace {

struct CalibrateOptions {
  std::vector<std::string> traces;
  std::vector<std::string> kineto;  // --measured
  std::string out;
  std::string base;
  bool json = false;
  bool probe = false;
  bool allow_mismatch = false;  // --allow-mismatch
  bool allow_worse = false;     // --allow-worse
  int threads = 1;
};

void write_json(const Json& j, const std::string& path) {
  std::ofstream f(path);
  if (!f) throw Error(path, "cannot open for writing");
  f << j.dump(2) << "\n";
  if (!f) throw SystemError(path, "write failed");
}

int run_probe(const CalibrateOptions& c, const PeerProbe& probe) {
  HostProbe p;
  if (probe) {
    if (!probe(c.threads, p)) return 0;  // another rank reports
  } else {
    p = probe_host(c.threads);
  }
  const cost::Profile fitted = host_profile(p);
  const Json profile = cost::profile_to_json(fitted);
  const double shm = fitted.link_eff(LinkKind::kShm);
  if (c.out.empty()) {
    std::cout << profile.dump(2) << "\n";
    return 0;
  }
  write_json(profile, c.out);
  if (c.json) {
    Json j{{"sgemm_GFLOPs", p.sgemm_flops / 1e9},
           {"sgemm_n", p.sgemm_n},
           {"triad_GBps", p.triad_bw / 1e9},
           {"memcpy_GBps", p.copy_bw / 1e9},
           {"threads", p.threads},
           {"wall_s", p.wall_s},
           {"profile", c.out}};
    if (p.link_ranks >= 2) {
      Json times = Json::array();
      for (const auto& [bytes, seconds] : p.all_reduce)
        times.push_back({{"bytes", bytes}, {"seconds", seconds}});
      j["link"] = {{"ranks", p.link_ranks},
                   {"all_reduce", times},
                   {"shm_link_efficiency", shm},
                   {"collective_step_latency_us", fitted.collective_step_latency_s * 1e6}};
    }
    std::cout << j.dump(1) << "\n";
    return 0;
  }
  std::cout << "host CPU (" << p.threads << " thread(s)): cblas_sgemm "
            << fmt("%.1f", p.sgemm_flops / 1e9) << " GFLOP/s (n = " << p.sgemm_n << "), triad "
            << fmt("%.1f", p.triad_bw / 1e9) << " GB/s, memcpy " << fmt("%.1f", p.copy_bw / 1e9)
            << " GB/s; probed in " << secs(p.wall_s) << "\n";
  if (p.link_ranks >= 2) {
    std::cout << "MPI all-reduce over " << p.link_ranks << " ranks:";
    for (const auto& [bytes, seconds] : p.all_reduce)
      std::cout << " " << fmt("%.0f", bytes / 1024) << " KiB " << secs(seconds) << ";";
    std::cout << " shm link efficiency " << fmt("%.3f", shm) << ", step latency "
              << secs(fitted.collective_step_latency_s) << "\n";
  }
  std::cout << "profile of device " << kHostCpuDevice << " written to " << c.out << "\n";
  return 0;
}

// The measured runs of `paths`: traces grouped by the plan they record.
std::vector<traces::MeasuredRun> load_runs(const std::vector<std::string>& paths,
                                           const SpecOptions& o, CLI::App* cmd) {
  std::map<std::string, std::pair<std::vector<traces::Trace>, std::vector<std::string>>> groups;
  std::vector<std::string> order;
  for (const std::string& path : paths) {
    traces::Trace t = traces::read_trace_file(path);
    const std::string key = t.plan.is_null() ? "" : t.plan.dump();
    if (!groups.count(key)) order.push_back(key);
    groups[key].first.push_back(std::move(t));
    groups[key].second.push_back(path);
  }
  std::vector<traces::MeasuredRun> runs;
  for (const std::string& key : order) {
    auto& [ts, names] = groups[key];
    traces::MeasuredRun run;
    run.trace = traces::merge_traces(ts, names);
    for (const std::string& n : names) run.name += (run.name.empty() ? "" : "+") + n;
    if (key.empty()) {
      Spec s = load_spec(o, cmd, true);
      run.model = s.model;
      run.cluster = *s.cluster;
      run.plan = s.plan;
    } else {
      run.plan = plan_from_json(run.trace.plan, names[0] + ".plan");
      const std::string model = run.plan.model_ref.empty() ? o.model : run.plan.model_ref;
      const std::string cluster = run.plan.cluster_ref.empty() ? o.cluster : run.plan.cluster_ref;
      run.model = load_model(model);
      run.cluster =
          load_cluster(cluster, run.plan.gpus_ref > 0 ? run.plan.gpus_ref : run.plan.gpus());
    }
    runs.push_back(std::move(run));
  }
  return runs;
}

double simulated_step(const traces::MeasuredRun& r, const cost::Profile& p) {
  return sim::simulate(r.model, r.cluster, lower(r.model, r.cluster, r.plan), p, false).step_time_s;
}

// The fitted parameters as a table.
void print_params(const traces::Calibration& cal) {
  std::cout << "  parameter                        base        fitted      ops\n";
  for (const traces::FittedParam& p : cal.params) {
    std::string name = p.name;
    name.resize(std::max<size_t>(name.size(), 30), ' ');
    std::cout << "  " << name << " " << fmt("%-11.4g", p.base) << " "
              << (p.samples > 0 ? fmt("%-11.4g", p.fitted) : std::string("(kept)     ")) << " "
              << p.samples
              << (p.at_bound ? "  at its bound (" + fmt("%.4g", p.lower) + ", " +
                                   fmt("%.4g", p.upper) + "): the traces ask for more"
                             : std::string())
              << "\n";
  }
}

// calibrate --measured: the fit to imported traces.
int run_imported(const CalibrateOptions& c, const SpecOptions& o, CLI::App* cmd) {
  traces::ImportedRun run;
  run.imported = traces::import_framework_traces(c.kineto);
  for (const std::string& f : c.kineto) run.name += (run.name.empty() ? "" : "+") + f;
  Spec s = load_spec(o, cmd, true);
  run.model = s.model;
  run.cluster = *s.cluster;
  run.plan = s.plan;
  traces::label_copies_by_plan(run.imported, run.plan.offload.any());
  const DeviceSpec& dev = run.cluster.gpu_device(0);
  for (const std::string& m :
       traces::check_against_plan(run.imported, dev.name, run.plan.gpus(),
                                  dtype_name(run.plan.precision), c.allow_mismatch))
    std::cerr << "warning: " << m << "\n";
  const cost::Profile base =
      c.base.empty() ? cost::default_profile(dev) : cost::load_profile(c.base, dev);
  if (base.measured_device) run.cluster.set_device_spec(*base.measured_device);
  const traces::Calibration cal = traces::calibrate_imported({run}, base);
  const double m = cal.replay_measured_s;
  const std::string replay = secs(m) + "; " + secs(cal.replay_base_s) + " (" +
                             fmt("%+.1f%%", 100 * (cal.replay_base_s / m - 1)) + ") -> " +
                             secs(cal.replay_fitted_s) + " (" +
                             fmt("%+.1f%%", 100 * (cal.replay_fitted_s / m - 1)) + ")";
  // A fit that replays the traced kernels further from the trace is not written unless asked.
  if (cal.replay_worse() && !c.allow_worse)
    throw Error("measured",
                "the fitted profile replays the traced kernels further from the trace than the "
                "base profile (measured; base -> fitted: " +
                    replay + "): not written (--allow-worse writes it)");
  write_json(cost::profile_to_json(cal.profile), c.out);
  if (c.json) {
    Json j = traces::calibration_to_json(cal);
    j["profile"] = c.out;
    j["measured"] = c.kineto;
    std::cout << j.dump(1) << "\n";
    return 0;
  }
  std::cout << "fitted " << cal.samples << " kernel shapes of " << c.kineto.size()
            << " PyTorch profiler trace(s) (" << cal.skipped
            << " kernels not fitted: no shape or size, another dtype, a communicator no group of "
               "the plan has, sends, copies, unclassified) in "
            << cal.iterations << " iterations; time-weighted RMS log error of kernel times "
            << fmt("%.3f", cal.rms_log_error_before) << " -> "
            << fmt("%.3f", cal.rms_log_error_after) << "\n";
  print_params(cal);
  std::cout << "the fitted kernels replayed per rank and step (measured; base -> fitted profile): "
            << replay << (cal.replay_worse() ? "  (further from the trace: --allow-worse)" : "")
            << "\n";
  std::cout << "profile written to " << c.out << "\n";
  return 0;
}

}  // namespace

Runner add_calibrate(CLI::App& app, PeerProbe probe) {
  auto* cmd = app.add_subcommand(
      "calibrate", "fit a cost-model profile to measured traces, or probe this host's CPU");
  auto c = std::make_shared<CalibrateOptions>();
  auto o = std::make_shared<SpecOptions>();
  cmd->add_option("measured", c->traces,
                  "measured traces (parasol run --trace); a trace that records its plan is of "
                  "that plan, the flags give the plan of the others");
  cmd->add_option("--measured", c->kineto,
                  "PyTorch profiler (Kineto) traces (.json or .json.gz) or Nsight Systems SQLite "
                  "exports, one per rank, of the job "
                  "the plan flags describe: fit from their kernels");
  cmd->add_flag("--allow-mismatch", c->allow_mismatch,
                "--measured: fit even where the traces contradict the plan (another GPU, world "
                "size, rank count or precision), with a warning for each");
  cmd->add_flag("--allow-worse", c->allow_worse,
                "--measured: write the fitted profile even when it replays the traced kernels "
                "further from the trace than the base profile (else an error)");
  cmd->add_option("-o,--out", c->out, "write the profile JSON here (--probe: default stdout)");
  cmd->add_option("--base", c->base,
                  "profile whose values the parameters the traces do not cover keep (default: "
                  "the device's); a probed host profile brings its measured device");
  cmd->add_flag("--probe", c->probe,
                "measure this host's CPU (cblas_sgemm, memory bandwidth; < 2 s) and write its "
                "profile");
  cmd->add_option("--threads", c->threads, "--probe: threads per rank")
      ->capture_default_str()
      ->check(count_in(1, 4096));
  cmd->add_flag("--json", c->json, "print JSON");
  add_target_flags(cmd, *o);
  add_plan_flags(cmd, *o);
  return [=]() {
    if (c->probe) {
      if (!c->traces.empty())
        throw Error("measured", "--probe measures the host and takes no traces");
      if (c->threads < 1) throw Error("threads", "must be >= 1");
      return run_probe(*c, probe);
    }
    if (!c->kineto.empty()) {
      if (!c->traces.empty())
        throw Error("measured", "give parasol's traces or --measured imported traces, not both");
      if (c->out.empty()) throw Error("out", "-o FILE is required to write the fitted profile");
      return run_imported(*c, *o, cmd);
    }
    if (c->traces.empty()) throw Error("measured", "no trace given (or --probe)");
    if (c->out.empty()) throw Error("out", "-o FILE is required to write the fitted profile");
    std::vector<traces::MeasuredRun> runs = load_runs(c->traces, *o, cmd);
    const DeviceSpec& dev = runs.front().cluster.gpu_device(0);
    const cost::Profile base =
        c->base.empty() ? cost::default_profile(dev) : cost::load_profile(c->base, dev);
    if (base.measured_device)
      for (traces::MeasuredRun& r : runs) r.cluster.set_device_spec(*base.measured_device);
    const traces::Calibration cal = traces::calibrate(runs, base);
    write_json(cost::profile_to_json(cal.profile), c->out);

    Json steps = Json::array();
    for (const traces::MeasuredRun& r : runs) {
      const double measured = traces::summarize(r.trace).step_time_s;
      steps.push_back({{"run", r.name},
                       {"measured_s", measured},
                       {"predicted_base_s", simulated_step(r, base)},
                       {"predicted_fitted_s", simulated_step(r, cal.profile)}});
    }
    if (c->json) {
      Json j = traces::calibration_to_json(cal);
      j["profile"] = c->out;
      j["step_times"] = steps;
      std::cout << j.dump(1) << "\n";
      return 0;
    }
    std::cout
        << "fitted " << cal.samples << " ops of " << runs.size() << " run(s) (" << cal.skipped
        << " not fitted: receives, rendezvous, transfers beside other transfers or compute) in "
        << cal.iterations << " iterations; time-weighted RMS log error of op times "
        << fmt("%.3f", cal.rms_log_error_before) << " -> " << fmt("%.3f", cal.rms_log_error_after)
        << "\n";
    print_params(cal);
    std::cout << "step time (measured; simulated with the base -> the fitted profile):\n";
    for (const Json& s : steps) {
      const double m = s["measured_s"].get<double>();
      const double b = s["predicted_base_s"].get<double>();
      const double f = s["predicted_fitted_s"].get<double>();
      std::cout << "  " << s["run"].get<std::string>() << ": " << secs(m) << "; " << secs(b) << " ("
                << fmt("%+.1f%%", 100 * (b / m - 1)) << ") -> " << secs(f) << " ("
                << fmt("%+.1f%%", 100 * (f / m - 1)) << ")\n";
    }
    std::cout << "profile written to " << c->out << "\n";
    return 0;
  };
}

}  // namespace parasol::tools
