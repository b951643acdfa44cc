// The commands as functions (tools/api.h): the computations behind estimate, simulate, search and
// validate, their --json documents, and the request form the Python module calls.
#include "tools/api.h"

#include <algorithm>
#include <chrono>
#include <limits>

#include "core/error.h"
#include "core/format.h"
#include "core/lower.h"
#include "interop/interop.h"
#include "traces/trace.h"

namespace parasol::tools {

namespace {

constexpr double kHuge = std::numeric_limits<double>::max();

// The job flags of a request: "tokens", "price_per_gpu_hour", "checkpoint_interval",
// "storage_GBps", "restart_s", "planned_per_day" (errors "job.<key>"; job_options checks ranges).
JobFlags job_flags(const Json& request) {
  JsonReader r(request, "job");
  JobFlags f;
  if (r.has("tokens")) f.tokens = r.number("tokens", -kHuge, kHuge);
  f.price_per_gpu_hour = r.number_or("price_per_gpu_hour", 0, -kHuge, kHuge);
  f.checkpoint_interval_s = r.number_or("checkpoint_interval", 0, -kHuge, kHuge);
  if (r.has("storage_GBps")) f.storage_GBps = r.number("storage_GBps", -kHuge, kHuge);
  if (r.has("restart_s")) f.restart_s = r.number("restart_s", -kHuge, kHuge);
  f.planned_per_day = r.number_or("planned_per_day", 0, -kHuge, kHuge);
  return f;
}

constexpr std::initializer_list<const char*> kJobKeys = {
    "tokens",       "price_per_gpu_hour", "checkpoint_interval",
    "storage_GBps", "restart_s",          "planned_per_day"};

// The request less the command's own options: what load_request reads.
Json without(const Json& request, std::initializer_list<const char*> a,
             std::initializer_list<const char*> b = {}) {
  Json j = request;
  if (!j.is_object()) return j;  // load_request rejects it
  for (auto keys : {a, b})
    for (const char* k : keys) j.erase(k);
  return j;
}

}  // namespace

// --- estimate ---------------------------------------------------------------------------------

EstimateRun run_estimate(Spec& s, const JobFlags& job) {
  const cost::JobOptions job_opts = job_options(job, *s.cluster);
  validate(s.plan, s.model, *s.cluster);
  EstimateRun r;
  r.estimate = cost::estimate(s.model, *s.cluster, s.plan, s.profile);
  r.band = cost::error_band(s.profile, s.model, *s.cluster, s.plan);
  if (job.tokens)
    r.job = cost::time_to_train(s.model, *s.cluster, s.plan, estimate_step(r.estimate), s.profile,
                                job_opts);
  return r;
}

Json estimate_document(const Spec& s, const EstimateRun& r) {
  Json j = cost::estimate_to_json(r.estimate);
  j["band"] = cost::band_to_json(r.band, r.estimate.step_time_s);
  Json stages = Json::array();
  for (const cost::FrameworkMemory& m : r.estimate.stage_memory) stages.push_back(m.device_used());
  j["memory_per_stage_bytes"] = stages;
  j["plan"] = plan_to_json(s.plan);
  if (r.job) j["job"] = cost::time_to_train_to_json(*r.job);
  return j;
}

// --- simulate ---------------------------------------------------------------------------------

SimulateRun run_simulate(Spec& s, const SimulateSettings& f) {
  const cost::JobOptions job_opts = job_options(f.job, *s.cluster);
  validate(s.plan, s.model, *s.cluster);
  const sim::StragglerOptions& strag = f.stragglers;
  const bool stragglers =
      strag.slow_rank >= 0 || strag.cv > 0 || f.samples > 0 || strag.slow_factor != 1;
  if (strag.slow_factor != 1 && strag.slow_rank < 0)
    throw Error("stragglers.slow_rank", "is required with --slow-factor");
  SimulateRun run;
  using clock = std::chrono::steady_clock;
  auto t0 = clock::now();
  LoweredPlan lowered = lower(s.model, *s.cluster, s.plan);
  auto t1 = clock::now();
  sim::Simulator simulator(s.model, *s.cluster, s.profile);
  run.result = simulator.simulate(lowered, !f.trace.empty());
  auto t2 = clock::now();
  if (stragglers) {
    sim::StragglerOptions so = strag;
    so.samples = f.samples > 0 ? f.samples : so.cv > 0 ? 100 : 1;
    run.stragglers = sim::simulate_stragglers(simulator, lowered, so);
  }
  if (f.job.tokens) {
    // The step of the simulation (the sampled mean when stragglers are played: they are in it
    // then) and the critical stage's compute.
    cost::JobOptions jo = job_opts;
    jo.stragglers_included = run.stragglers.has_value();
    run.job = cost::time_to_train(s.model, *s.cluster, s.plan,
                                  {run.stragglers ? run.stragglers->mean_s : run.result.step_time_s,
                                   run.result.breakdown.compute},
                                  s.profile, jo);
  }
  run.lower_wall_s = std::chrono::duration<double>(t1 - t0).count();
  run.simulate_wall_s = std::chrono::duration<double>(t2 - t1).count();
  if (!f.trace.empty()) traces::write_trace_file(run.result.trace, f.trace);
  run.estimate = cost::estimate(s.model, *s.cluster, s.plan, s.profile);
  run.band = cost::error_band(s.profile, s.model, *s.cluster, s.plan);
  return run;
}

Json simulate_document(const Spec& s, const SimulateSettings& f, const SimulateRun& r) {
  Json j = sim::sim_result_to_json(r.result);
  j["band"] = cost::band_to_json(r.band, r.result.step_time_s);
  j["estimate_step_time_s"] = r.estimate.step_time_s;
  j["host_memory_per_server_bytes"] = r.estimate.host_memory_per_server_bytes;
  j["host_memory_capacity_bytes"] = r.estimate.host_memory_capacity_bytes;
  j["lower_wall_s"] = r.lower_wall_s;
  j["simulate_wall_s"] = r.simulate_wall_s;
  j["plan"] = plan_to_json(s.plan);
  if (!f.trace.empty()) j["trace"] = f.trace;
  if (r.stragglers) j["stragglers"] = sim::step_distribution_to_json(*r.stragglers);
  if (r.job) j["job"] = cost::time_to_train_to_json(*r.job);
  return j;
}

// --- search -----------------------------------------------------------------------------------

SearchRun run_search(Spec& s, const SearchSettings& f, const std::string& model_ref,
                     const std::string& cluster_ref, std::function<void(double)> progress) {
  Cluster& cluster = *s.cluster;  // job_options sets the job's storage and restart figures on it
  cost::JobOptions job_opts = job_options(f.job, cluster);
  // One cluster for every plan: count its components once.
  if (f.job.tokens) job_opts.reliability = cost::job_reliability(cluster, job_opts.failure_rates);
  sim::SearchOptions opt;
  opt.global_batch = f.gbs;
  opt.seq_len = f.seq;
  opt.top_k = f.top;
  opt.threads = f.threads;
  opt.precision = parse_dtype(f.precision, "search.precision");
  opt.search_offload = !f.no_offload;
  constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
  const double device_bytes = cluster.gpu_device(0).hbm_bytes;
  if (!(f.memory_margin_gib >= 0) || f.memory_margin_gib * kGiB >= device_bytes)
    throw Error("search.memory_margin",
                "must be >= 0 GiB and below the device's memory (" + gib(device_bytes) + ")");
  opt.memory_margin_bytes = f.memory_margin_gib * kGiB;
  // The step a plan is ranked by, from its estimate's or its simulation's step: that step, or
  // the pessimistic end of its band.
  const bool is_robust = f.robust;
  auto ranked_step = [&s, is_robust](const Plan& p, cost::StepFigures st) {
    if (is_robust) {
      const double pessimistic =
          cost::pessimistic_step_time(s.profile, s.model, *s.cluster, p, st.step_s);
      st.compute_s *= pessimistic / st.step_s;
      st.step_s = pessimistic;
    }
    return st;
  };
  SearchRun run;
  // With tokens: the time to train them (a pure function of the plan and its step).
  if (f.job.tokens) {
    run.train_of_step = [&s, job_opts, ranked_step](const Plan& p, const cost::StepFigures& st) {
      return cost::time_to_train(s.model, *s.cluster, p, ranked_step(p, st), s.profile, job_opts);
    };
    run.train_of = [train_of_step = run.train_of_step](const Plan& p, const cost::Estimate& e) {
      return train_of_step(p, estimate_step(e));
    };
    opt.rank_key = [train_of = run.train_of](const Plan& p, const cost::Estimate& e) {
      return train_of(p, e).time_s;
    };
  } else if (f.robust) {
    opt.rank_key = [ranked_step](const Plan& p, const cost::Estimate& e) {
      return ranked_step(p, estimate_step(e)).step_s;
    };
  }
  // The simulated plans are ranked by the same key on their simulated step.
  const sim::SimulatedKey simulated_key = [&run, ranked_step](const sim::Candidate& c) {
    const cost::StepFigures st{c.simulated_step_s, c.simulated_compute_s};
    return run.train_of_step ? run.train_of_step(c.plan, st).time_s
                             : ranked_step(c.plan, st).step_s;
  };
  if (f.gbs < 1) throw Error("search.gbs", "must be >= 1");
  if (f.seq < 0) throw Error("search.seq", "must be >= 1");
  if (f.top < 1) throw Error("search.top", "must be >= 1");
  if (f.simulate_top < 0) throw Error("search.simulate_top", "must be >= 0");
  if (!f.framework.empty()) {
    const auto& names = interop::framework_names();
    if (std::find(names.begin(), names.end(), f.framework) == names.end())
      throw Error("search.framework",
                  "'" + f.framework + "' is not one of megatron|deepspeed|torchtitan");
    opt.accept = [&s, &cluster, framework = f.framework](const Plan& p) {
      return interop::can_export(framework, s.model, cluster, p);
    };
    opt.selective_op = interop::runs_selective_op(f.framework);
    opt.tp_impl = interop::framework_tp_impl(f.framework);
    opt.cp_impl = interop::framework_cp_impl(f.framework);
  }
  opt.progress = std::move(progress);
  run.result = sim::search(s.model, cluster, s.profile, opt);
  // The listed plans' memory of every stage, and the rank that holds the largest peak (the
  // search prices memory per plan, not per stage). Their reserved bytes are the fragmentation
  // band's, as the search's own fit (Reserved::kBand): replaying the caching allocator over every
  // stage of every listed plan costs more than the search (`estimate` and `simulate` replay it).
  {
    cost::Estimator est(s.model, cluster, s.profile);
    for (auto* list : {&run.result.top, &run.result.pareto})
      for (sim::Candidate& c : *list) {
        const cost::Estimate full = est.estimate(c.plan, cost::Reserved::kBand);
        c.estimate.stage_memory = full.stage_memory;
        c.estimate.peak_stage = full.peak_stage;
        c.estimate.peak_rank = full.peak_rank;
      }
  }
  sim::resimulate_top(s.model, cluster, s.profile, f.simulate_top, run.result, simulated_key);
  if (run.result.top.empty())
    throw Error(f.framework.empty() ? "search" : "search.framework",
                "no plan " + (f.framework.empty() ? "" : "that " + f.framework + " can run ") +
                    "fits in memory for " + s.model.name + " on " +
                    std::to_string(cluster.num_gpus()) + " GPUs with global batch " +
                    std::to_string(f.gbs));
  run.best = run.result.top.front().plan;
  run.best.model_ref = model_ref;
  run.best.cluster_ref = cluster_ref;
  run.best.gpus_ref = cluster.num_gpus();
  return run;
}

Json search_document(const Spec& s, const SearchRun& r) {
  auto band_of = [&](const Plan& p) { return cost::error_band(s.profile, s.model, *s.cluster, p); };
  Json top_j = Json::array(), front = Json::array();
  for (const auto& c : r.result.top) {
    Json row = {{"plan", plan_to_json(c.plan)},
                {"estimate", cost::estimate_to_json(c.estimate)},
                {"band", cost::band_to_json(band_of(c.plan), c.estimate.step_time_s)}};
    if (r.train_of) row["job"] = cost::time_to_train_to_json(r.train_of(c.plan, c.estimate));
    if (c.simulated_step_s > 0) {
      row["simulated_step_time_s"] = c.simulated_step_s;
      row["simulated_band"] = cost::band_to_json(band_of(c.plan), c.simulated_step_s);
      if (r.train_of_step)
        row["simulated_job"] = cost::time_to_train_to_json(
            r.train_of_step(c.plan, {c.simulated_step_s, c.simulated_compute_s}));
    }
    top_j.push_back(row);
  }
  for (const auto& c : r.result.pareto) {
    Json row = {{"plan", plan_to_json(c.plan)},
                {"tokens_per_s", c.estimate.tokens_per_s},
                {"memory_per_gpu_bytes", c.estimate.memory_per_gpu_bytes},
                {"peak_stage", c.estimate.peak_stage},
                {"peak_rank", c.estimate.peak_rank}};
    if (r.train_of) row["job"] = cost::time_to_train_to_json(r.train_of(c.plan, c.estimate));
    front.push_back(row);
  }
  return Json{{"top", top_j},
              {"pareto", front},
              {"enumerated", r.result.enumerated},
              {"fitting", r.result.fitting},
              {"not_by_reserved", r.result.not_by_reserved},
              {"seconds", r.result.seconds},
              {"best_plan", plan_to_json(r.best)}};
}

// --- validate ---------------------------------------------------------------------------------

Json validate_document(const Spec& s) {
  validate(s.plan, s.model, *s.cluster);
  return Json{{"valid", true}, {"plan", plan_to_json(s.plan)}};
}

// --- requests ---------------------------------------------------------------------------------

Json estimate_request(const Json& request) {
  Spec s = load_request(without(request, kJobKeys), true);
  return estimate_document(s, run_estimate(s, job_flags(request)));
}

Json simulate_request(const Json& request) {
  Spec s =
      load_request(without(request, kJobKeys,
                           {"trace", "slow_rank", "slow_factor", "rank_cv", "samples", "seed"}),
                   true);
  SimulateSettings f;
  JsonReader r(request, "stragglers");
  f.trace = JsonReader(request, "simulate").string_or("trace", "");
  f.stragglers.slow_rank = static_cast<int>(r.integer_or("slow_rank", -1, -1, 1 << 30));
  f.stragglers.slow_factor = r.number_or("slow_factor", 1, -kHuge, kHuge);
  f.stragglers.cv = r.number_or("rank_cv", 0, -kHuge, kHuge);
  f.samples = static_cast<int>(r.integer_or("samples", 0, 0, 1 << 30));
  f.stragglers.seed =
      static_cast<uint64_t>(r.integer_or("seed", 1, 0, std::numeric_limits<int64_t>::max()));
  f.job = job_flags(request);
  return simulate_document(s, f, run_simulate(s, f));
}

Json search_request(const Json& request) {
  JsonReader r(request, "search");
  r.allow_only({"model",
                "cluster",
                "gpus",
                "profile",
                "gbs",
                "seq",
                "top",
                "threads",
                "precision",
                "no_offload",
                "simulate_top",
                "robust",
                "framework",
                "tokens",
                "price_per_gpu_hour",
                "checkpoint_interval",
                "storage_GBps",
                "restart_s",
                "planned_per_day",
                "memory_margin_GiB"});
  // The search makes its own plans: the spec is loaded with a placeholder one (as the command).
  Json spec_request = Json::object();
  for (const char* k : {"model", "cluster", "profile"})
    if (request.contains(k)) spec_request[k] = request[k];
  spec_request["gpus"] = request.value("gpus", Json(1024));
  spec_request["tp"] = 1;
  Spec s = load_request(spec_request, false);
  SearchSettings f;
  f.top = static_cast<int>(
      r.integer_or("top", 10, std::numeric_limits<int>::min(), std::numeric_limits<int>::max()));
  f.gbs = static_cast<int>(
      r.integer_or("gbs", 1536, std::numeric_limits<int>::min(), std::numeric_limits<int>::max()));
  f.seq = r.integer_or("seq", 0, std::numeric_limits<int64_t>::min(),
                       std::numeric_limits<int64_t>::max());
  f.threads = static_cast<int>(r.integer_or("threads", 0, 0, 1 << 16));
  f.precision = r.string_or("precision", "bf16");
  f.no_offload = r.boolean_or("no_offload", false);
  f.simulate_top = static_cast<int>(r.integer_or("simulate_top", 0, std::numeric_limits<int>::min(),
                                                 std::numeric_limits<int>::max()));
  f.robust = r.boolean_or("robust", false);
  f.framework = r.string_or("framework", "");
  f.memory_margin_gib = r.number_or("memory_margin_GiB", 0, -1e12, 1e12);
  f.job = job_flags(request);
  const std::string model_ref = request.value("model", Json(SpecOptions{}.model)).is_string()
                                    ? request.value("model", SpecOptions{}.model)
                                    : "";
  const std::string cluster_ref = request.value("cluster", Json(SpecOptions{}.cluster)).is_string()
                                      ? request.value("cluster", SpecOptions{}.cluster)
                                      : "";
  return search_document(s, run_search(s, f, model_ref, cluster_ref, {}));
}

Json validate_request(const Json& request) {
  return validate_document(load_request(request, true));
}

}  // namespace parasol::tools
