// `parasol sweep`'s points (tools/sweep.h): the search at each point of the what-if grid
// (sim/what_if_cluster.h) and its row, run by sim/sweep.h; the sweep's JSON file and CSV.
#include "tools/sweep.h"

#include <algorithm>
#include <chrono>
#include <sstream>

#include "core/cluster.h"
#include "core/device.h"
#include "core/error.h"
#include "core/format.h"
#include "core/model.h"
#include "cost_models/energy.h"

namespace parasol::tools {

namespace {

constexpr double kSteadyTokens = 1e9;  // the basis of a row's train figures without --tokens

double price_of(const SweepSpec& spec, const std::string& device) {
  auto it = spec.device_price.find(device);
  return it != spec.device_price.end() ? it->second : spec.search.job.price_per_gpu_hour;
}

}  // namespace

void prepare_sweep(SweepSpec& spec) {
  sim::prepare_what_if(spec, parse_dtype(spec.search.precision, "search.precision"),
                       !spec.search.no_offload);
}

Json sweep_point_request(const SweepSpec& spec, int64_t index) {
  const Json values = sweep_point_values(spec, index);
  Json r = Json::object();
  r["model"] = sim::point_model(spec, values);
  r["cluster"] = sim::point_cluster(spec, values);
  r["gpus"] = sim::point_gpus(spec, values);
  r["gbs"] = values.contains("gbs") ? values["gbs"].get<int>() : spec.search.gbs;
  const int64_t seq = values.contains("seq") ? values["seq"].get<int64_t>() : spec.search.seq;
  if (seq > 0) r["seq"] = seq;
  if (!spec.profile.empty()) r["profile"] = spec.profile;
  r["precision"] = spec.search.precision;
  if (spec.search.no_offload) r["no_offload"] = true;
  if (spec.search.robust) r["robust"] = true;
  if (spec.search.simulate_top > 0) r["simulate_top"] = spec.search.simulate_top;
  if (!spec.search.framework.empty()) r["framework"] = spec.search.framework;
  const JobFlags& j = spec.search.job;
  if (j.tokens) r["tokens"] = *j.tokens;
  if (j.checkpoint_interval_s > 0) r["checkpoint_interval"] = j.checkpoint_interval_s;
  if (j.storage_GBps) r["storage_GBps"] = *j.storage_GBps;
  if (j.restart_s) r["restart_s"] = *j.restart_s;
  if (j.planned_per_day > 0) r["planned_per_day"] = j.planned_per_day;
  const double price = price_of(spec, r["cluster"].value("device", ""));
  if (price > 0 && j.tokens) r["price_per_gpu_hour"] = price;
  return r;
}

Json run_sweep_point(const SweepSpec& spec, int64_t index, int threads) {
  const auto t0 = std::chrono::steady_clock::now();
  const Json values = sweep_point_values(spec, index);
  const Json request = sweep_point_request(spec, index);
  Json row = {{"index", index},
              {"point", values},
              {"model", request["model"]},
              {"device", request["cluster"].value("device", "")},
              {"gpus", request["gpus"]},
              {"gbs", request["gbs"]},
              {"cluster", request["cluster"]}};
  const int gps = std::max(1, request["cluster"].value("gpus_per_server", 8));
  row["servers"] = (request["gpus"].get<int>() + gps - 1) / gps;
  auto seconds = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  try {
    // As search_request loads it: the spec with a placeholder plan, then the search.
    Json spec_request = {{"model", request["model"]},
                         {"cluster", request["cluster"]},
                         {"gpus", request["gpus"]},
                         {"tp", 1}};
    if (request.contains("profile")) spec_request["profile"] = request["profile"];
    Spec s = load_request(spec_request, false);
    row["seq"] = request.contains("seq") ? request["seq"].get<int64_t>() : s.model.seq_len;
    SearchSettings f = spec.search;
    f.gbs = request["gbs"].get<int>();
    f.seq = request.value("seq", int64_t{0});
    f.threads = threads;
    f.top = std::max(1, f.simulate_top);
    f.job.price_per_gpu_hour = request.value("price_per_gpu_hour", 0.0);
    const Dtype precision = parse_dtype(f.precision, "search.precision");
    if (!sim::can_hold(*s.cluster, s.model, precision, !f.no_offload))
      throw Error("search", "the cluster cannot hold " + s.model.name + "'s training state (" +
                                gib(sim::training_state_bytes(s.model, *s.cluster, precision)) +
                                " of weights, gradients and Adam state)");
    SearchRun run = run_search(s, f, request["model"].get<std::string>(), "", {});
    const sim::Candidate& best = run.result.top.front();
    const cost::Estimate& e = best.estimate;
    const cost::ErrorBand band = cost::error_band(s.profile, s.model, *s.cluster, best.plan);
    row["status"] = "ok";
    row["plan"] = plan_compact(best.plan);
    row["best_plan"] = plan_to_json(run.best);
    row["step_time_s"] = e.step_time_s;
    row["band"] = cost::band_to_json(band, e.step_time_s);
    row["tokens_per_s"] = e.tokens_per_s;
    row["mfu"] = e.mfu;
    row["memory_per_gpu_bytes"] = e.memory_per_gpu_bytes;
    if (best.simulated_step_s > 0) row["simulated_step_time_s"] = best.simulated_step_s;
    const double price = price_of(spec, s.cluster->gpu_device(0).name);
    Json train;
    if (run.train_of) {
      const cost::TimeToTrain t =
          best.simulated_step_s > 0
              ? run.train_of_step(best.plan, {best.simulated_step_s, best.simulated_compute_s})
              : run.train_of(best.plan, e);
      train = {{"basis", "tokens"},
               {"tokens", t.tokens},
               {"time_s", t.time_s},
               {"gpu_hours", t.gpu_hours},
               {"energy_MWh", t.energy_j / 3.6e9},
               {"goodput", t.goodput.fraction()}};
    } else {
      // The steady step alone: 1e9 tokens at the step's rate, the GPUs busy its compute share.
      const cost::StepFigures st = estimate_step(e);
      const double step_s = best.simulated_step_s > 0 ? best.simulated_step_s : st.step_s;
      const double tokens_per_s = e.tokens_per_s * e.step_time_s / step_s;
      const double time_s = kSteadyTokens / tokens_per_s;
      const double energy_j =
          cost::cluster_energy_j(*s.cluster, cost::default_power(*s.cluster),
                                 cost::busy_fraction(st.compute_s, st.step_s), time_s);
      train = {{"basis", "steady"},
               {"tokens", kSteadyTokens},
               {"time_s", time_s},
               {"gpu_hours", time_s * s.cluster->num_gpus() / 3600},
               {"energy_MWh", energy_j / 3.6e9}};
    }
    train["price_per_gpu_hour"] = price;
    train["cost"] = price > 0 ? Json(train["gpu_hours"].get<double>() * price) : Json(nullptr);
    row["train"] = train;
    row["enumerated"] = run.result.enumerated;
    row["fitting"] = run.result.fitting;
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::kUser) throw;
    row["status"] = "no_plan";
    row["reason"] = e.what();
  }
  row["search_s"] = seconds();
  return row;
}

Json sweep_header(const SweepSpec& spec) {
  Json axes = Json::array();
  for (const SweepAxis& a : spec.axes) axes.push_back({{"key", a.key}, {"values", a.values}});
  const JobFlags& j = spec.search.job;
  Json h = {{"model", spec.model},
            {"cluster", spec.cluster},
            {"gpus", spec.gpus},
            {"gbs", spec.search.gbs},
            {"seq", spec.search.seq},
            {"precision", spec.search.precision},
            {"framework", spec.search.framework},
            {"robust", spec.search.robust},
            {"simulate_top", spec.search.simulate_top},
            {"no_offload", spec.search.no_offload},
            {"tokens", j.tokens ? Json(*j.tokens) : Json(nullptr)},
            {"price_per_gpu_hour", j.price_per_gpu_hour},
            {"checkpoint_interval", j.checkpoint_interval_s},
            {"storage_GBps", j.storage_GBps ? Json(*j.storage_GBps) : Json(nullptr)},
            {"restart_s", j.restart_s ? Json(*j.restart_s) : Json(nullptr)},
            {"planned_per_day", j.planned_per_day},
            {"device_price", spec.device_price},
            {"profile", spec.profile},
            {"axes", axes},
            {"points", sweep_point_count(spec)}};
  return h;
}

std::vector<Json> run_sweep(const SweepSpec& spec, const SweepRunOptions& o, int64_t* resumed) {
  return sim::run_sweep_points(
      sweep_header(spec), sweep_point_count(spec),
      [&spec](int64_t i) { return sim::point_gpus(spec, sweep_point_values(spec, i)); },
      [&spec](int64_t i, int threads) { return run_sweep_point(spec, i, threads); }, o, resumed);
}

Json sweep_document(const SweepSpec& spec, std::vector<Json> rows) {
  std::sort(rows.begin(), rows.end(), [](const Json& a, const Json& b) {
    return a["index"].get<int64_t>() < b["index"].get<int64_t>();
  });
  return Json{{"sweep", sweep_header(spec)}, {"rows", rows}};
}

std::string sweep_csv(const Json& doc) {
  std::vector<std::string> keys;
  for (const Json& a : doc["sweep"]["axes"]) keys.push_back(a["key"].get<std::string>());
  auto quote = [](const std::string& s) {
    if (s.find_first_of(",\"\n") == std::string::npos) return s;
    std::string q = "\"";
    for (char c : s) q += c == '"' ? std::string("\"\"") : std::string(1, c);
    return q + "\"";
  };
  auto num = [](const Json& row, std::initializer_list<const char*> path) -> std::string {
    const Json* j = &row;
    for (const char* p : path) {
      if (!j->is_object() || !j->contains(p) || (*j)[p].is_null()) return "";
      j = &(*j)[p];
    }
    return j->is_number() ? fmt("%.6g", j->get<double>()) : "";
  };
  std::ostringstream out;
  out << "index";
  for (const auto& k : keys) out << "," << k;
  out << ",status,plan,step_time_s,band_low_s,band_high_s,tokens_per_s,mfu,memory_per_gpu_GiB,"
         "train_basis,train_tokens,time_s,gpu_hours,cost,energy_MWh,reason\n";
  for (const Json& r : doc["rows"]) {
    out << r["index"].get<int64_t>();
    for (const auto& k : keys) out << "," << quote(sim::sweep_value_text(r["point"][k]));
    const bool ok = r.value("status", "") == "ok";
    out << "," << r.value("status", "") << "," << quote(ok ? r.value("plan", "") : "") << ","
        << num(r, {"step_time_s"}) << "," << num(r, {"band", "low_s"}) << ","
        << num(r, {"band", "high_s"}) << "," << num(r, {"tokens_per_s"}) << "," << num(r, {"mfu"})
        << ","
        << (ok ? fmt("%.3f", r["memory_per_gpu_bytes"].get<double>() / (1024.0 * 1024 * 1024)) : "")
        << "," << (ok ? r["train"].value("basis", "") : "") << "," << num(r, {"train", "tokens"})
        << "," << num(r, {"train", "time_s"}) << "," << num(r, {"train", "gpu_hours"}) << ","
        << num(r, {"train", "cost"}) << "," << num(r, {"train", "energy_MWh"}) << ","
        << quote(r.value("reason", "")) << "\n";
  }
  return out.str();
}

SweepSpec sweep_from_json(const Json& j, const std::string& path) {
  JsonReader r(j, path);
  r.allow_only({"model", "cluster", "gpus", "gbs", "seq", "precision", "framework", "robust",
                "simulate_top", "no_offload", "tokens", "price_per_gpu_hour", "device_price",
                "profile", "vary", "checkpoint_interval", "storage_GBps", "restart_s",
                "planned_per_day"});
  SweepSpec s;
  s.model = r.string_or("model", s.model);
  s.cluster = r.string_or("cluster", s.cluster);
  s.gpus = static_cast<int>(r.integer_or("gpus", s.gpus, 1, 1 << 20));
  s.search.gbs = static_cast<int>(r.integer_or("gbs", s.search.gbs, 1, 1 << 30));
  s.search.seq = r.integer_or("seq", 0, 0, int64_t{1} << 40);
  s.search.precision = r.choice("precision", {"fp32", "bf16", "fp16", "fp8"}, "bf16");
  s.search.framework = r.choice("framework", {"", "megatron", "deepspeed", "torchtitan"}, "");
  s.search.robust = r.boolean_or("robust", false);
  s.search.simulate_top = static_cast<int>(r.integer_or("simulate_top", 0, 0, 1 << 20));
  s.search.no_offload = r.boolean_or("no_offload", false);
  s.profile = r.string_or("profile", "");
  if (r.has("tokens")) s.search.job.tokens = r.number("tokens", 1, 1e30);
  s.search.job.price_per_gpu_hour = r.number_or("price_per_gpu_hour", 0, 0, 1e9);
  s.search.job.checkpoint_interval_s = r.number_or("checkpoint_interval", 0, 0, 1e12);
  if (r.has("storage_GBps")) s.search.job.storage_GBps = r.number("storage_GBps", 1e-9, 1e12);
  if (r.has("restart_s")) s.search.job.restart_s = r.number("restart_s", 0, 1e9);
  s.search.job.planned_per_day = r.number_or("planned_per_day", 0, 0, 1e6);
  if (r.has("device_price")) {
    JsonReader prices = r.object("device_price");
    for (auto it = j["device_price"].begin(); it != j["device_price"].end(); ++it) {
      device_spec(it.key(), prices.field(it.key()));
      s.device_price[it.key()] = prices.number(it.key(), 0, 1e9);
    }
  }
  if (r.has("vary")) {
    // An object's axes come in key order (JSON objects are unordered); an array of
    // {"key", "values"} keeps its order (the first varies slowest).
    const Json& v = r.raw("vary");
    if (v.is_object()) {
      for (auto it = v.begin(); it != v.end(); ++it)
        s.axes.push_back(
            sim::sweep_axis_from_json(it.key(), it.value(), r.field("vary") + "." + it.key()));
    } else if (v.is_array()) {
      for (const auto& [path, axis] : r.array("vary")) {
        JsonReader a(*axis, path);
        a.allow_only({"key", "values"});
        if (!a.has("values")) throw Error(a.field("values"), "is required");
        s.axes.push_back(
            sim::sweep_axis_from_json(a.string("key"), a.raw("values"), a.field("values")));
      }
    } else {
      throw Error(r.field("vary"),
                  "must be an object {KEY: [values]} or an array [{\"key\", \"values\"}]");
    }
  }
  return s;
}

Json sweep_request(const Json& request) {
  if (!request.is_object()) throw Error("sweep", "must be an object");
  Json j = request;
  int threads = 0;
  if (j.contains("threads")) {
    JsonReader r(j, "sweep");
    threads = static_cast<int>(r.integer("threads", 1, 4096));
    j.erase("threads");
  }
  SweepSpec spec = sweep_from_json(j, "sweep");
  prepare_sweep(spec);
  SweepRunOptions o;
  o.threads = threads;
  return sweep_document(spec, run_sweep(spec, o));
}

}  // namespace parasol::tools
