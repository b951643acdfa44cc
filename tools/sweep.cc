// `parasol sweep`'s grid, points and runner (tools/sweep.h): axes, the cluster of a point, the
// search at each point and its row, the journal that lets a sweep resume.
#include "tools/sweep.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <fstream>
#include <mutex>
#include <numeric>
#include <set>
#include <sstream>
#include <thread>

#include "core/cluster.h"
#include "core/device.h"
#include "core/error.h"
#include "core/format.h"
#include "core/model.h"
#include "core/sibling_presets.h"
#include "cost_models/energy.h"

namespace parasol::tools {

namespace {

constexpr int64_t kMaxPoints = 100000;
constexpr double kSteadyTokens = 1e9;  // the basis of a row's train figures without --tokens

// The generator fields a sweep may vary, with whether each is an integer and its string-ness.
enum class AxisType { kInteger, kNumber, kString };
const std::map<std::string, AxisType>& axis_types() {
  static const std::map<std::string, AxisType> t = {
      {"cluster", AxisType::kString},
      {"model", AxisType::kString},
      {"gpus", AxisType::kInteger},
      {"gbs", AxisType::kInteger},
      {"seq", AxisType::kInteger},
      {"device", AxisType::kString},
      {"generator", AxisType::kString},
      {"gpus_per_server", AxisType::kInteger},
      {"nvlink_GBps", AxisType::kNumber},
      {"pcie_GBps", AxisType::kNumber},
      {"nics_per_server", AxisType::kInteger},
      {"nic_GBps", AxisType::kNumber},
      {"host_memory_GiB", AxisType::kNumber},
      {"servers_per_leaf", AxisType::kInteger},
      {"gpus_per_pcie_switch", AxisType::kInteger},
      {"pcie_uplink_GBps", AxisType::kNumber},
      {"sockets", AxisType::kInteger},
      {"host_memory_bw_GBps", AxisType::kNumber},
      {"oversubscription", AxisType::kNumber},
      {"switch_latency_us", AxisType::kNumber},
      {"storage_GBps", AxisType::kNumber},
      {"restart_s", AxisType::kNumber},
  };
  return t;
}
// Keys that are the job's, not the cluster's.
bool is_job_key(const std::string& k) {
  return k == "cluster" || k == "model" || k == "gpus" || k == "gbs" || k == "seq";
}
// The server figures a device's own preset brings (when the base is a preset).
const char* const kServerFigures[] = {
    "gpus_per_server",      "nvlink_GBps",      "pcie_GBps",
    "nics_per_server",      "nic_GBps",         "host_memory_GiB",
    "gpus_per_pcie_switch", "pcie_uplink_GBps", "sockets",
    "host_memory_bw_GBps",  "servers_per_leaf", "oversubscription",
    "switch_latency_us",    "generator"};
// Figures kept per GPU when gpus_per_server varies.
const char* const kPerGpuFigures[] = {"nics_per_server", "host_memory_GiB", "sockets"};

// A value as the user wrote it: "B200", "8", "12.5".
std::string value_text(const Json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_number_integer()) return std::to_string(v.get<int64_t>());
  return fmt("%g", v.get<double>());
}

Error axis_error(const std::string& key, const std::string& reason) {
  return Error("--vary " + key, reason);
}

// One numeric item: a number, "START:STOP:STEP" or "START:STOP:xFACTOR".
void parse_numeric_item(const std::string& key, const std::string& item, bool integer,
                        std::vector<Json>& out) {
  auto number = [&](const std::string& t) {
    size_t used = 0;
    double v = 0;
    try {
      v = std::stod(t, &used);
    } catch (...) {
      used = 0;
    }
    if (t.empty() || used != t.size() || !std::isfinite(v))
      throw axis_error(key, "'" + t + "' is not a number");
    if (integer && v != std::floor(v)) throw axis_error(key, "'" + t + "' is not an integer");
    return v;
  };
  auto push = [&](double v) {
    if (integer)
      out.push_back(static_cast<int64_t>(std::llround(v)));
    else
      out.push_back(v);
  };
  const size_t c1 = item.find(':');
  if (c1 == std::string::npos) return push(number(item));
  const size_t c2 = item.find(':', c1 + 1);
  if (c2 == std::string::npos || item.find(':', c2 + 1) != std::string::npos)
    throw axis_error(key, "'" + item + "' is not a range START:STOP:STEP or START:STOP:xFACTOR");
  const double start = number(item.substr(0, c1)), stop = number(item.substr(c1 + 1, c2 - c1 - 1));
  std::string step_text = item.substr(c2 + 1);
  const bool geometric = !step_text.empty() && (step_text[0] == 'x' || step_text[0] == '*');
  if (geometric) step_text = step_text.substr(1);
  double step = 0;
  {
    size_t used = 0;
    try {
      step = std::stod(step_text, &used);
    } catch (...) {
      used = 0;
    }
    if (step_text.empty() || used != step_text.size() || !std::isfinite(step))
      throw axis_error(key,
                       "'" + item + "': the step '" + item.substr(c2 + 1) + "' is not a number");
  }
  if (stop < start) throw axis_error(key, "'" + item + "': STOP is below START");
  if (geometric ? step <= 1 : step <= 0)
    throw axis_error(
        key, "'" + item + "': the " + (geometric ? "factor must be > 1" : "step must be > 0"));
  if (geometric && start <= 0)
    throw axis_error(key, "'" + item + "': a geometric range starts > 0");
  const double eps = 1e-9 * std::max(1.0, std::abs(stop));
  for (int64_t i = 0;; ++i) {
    const double v = geometric ? start * std::pow(step, static_cast<double>(i)) : start + i * step;
    if (v > stop + eps) break;
    if (static_cast<int64_t>(out.size()) >= kMaxPoints)
      throw axis_error(key,
                       "'" + item + "' has more than " + std::to_string(kMaxPoints) + " values");
    if (integer && std::abs(v - std::round(v)) > 1e-9 * std::max(1.0, v))
      throw axis_error(key, "'" + item + "' reaches " + fmt("%g", v) + ", not an integer");
    push(v);
  }
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> parts;
  std::string cur;
  for (char c : s) {
    if (c == sep) {
      parts.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  parts.push_back(cur);
  return parts;
}

// The axis from its key and a JSON value: an array of values, or range text.
SweepAxis axis_from_json(const std::string& key, const Json& v, const std::string& path) {
  if (v.is_string()) return parse_sweep_axis(key + "=" + v.get<std::string>());
  if (!v.is_array()) throw Error(path, "must be an array of values or a range text");
  std::string text = key + "=";
  SweepAxis a;
  a.key = key;
  auto it = axis_types().find(key);
  if (it == axis_types().end()) return parse_sweep_axis(key + "=x");  // names the unknown key
  for (size_t i = 0; i < v.size(); ++i) {
    const Json& e = v[i];
    const std::string p = path + "[" + std::to_string(i) + "]";
    if (it->second == AxisType::kString) {
      if (!e.is_string() || e.get<std::string>().empty())
        throw Error(p, "must be a non-empty string");
    } else if (it->second == AxisType::kInteger) {
      if (!e.is_number_integer()) throw Error(p, "must be an integer");
    } else if (!e.is_number() || !std::isfinite(e.get<double>())) {
      throw Error(p, "must be a number");
    }
    a.values.push_back(e);
  }
  if (a.values.empty()) throw axis_error(key, "has no values");
  return a;
}

// The generator JSON of a server preset, or the generator file's object (checked).
Json base_generator(const std::string& ref, bool* is_preset) {
  if (is_existing_file(ref) || ref.ends_with(".json") || ref.find('/') != std::string::npos) {
    Json j = read_json_file(ref);
    JsonReader r(j, ref);
    if (!r.has("generator") || (j["generator"] != "rail" && j["generator"] != "fat-tree"))
      throw Error(ref + ".generator",
                  "a sweep's cluster file is a rail or fat-tree generator (\"generator\": "
                  "\"rail\"), whose fields the axes vary");
    *is_preset = false;
    Json g = j;
    g.erase("gpus");
    // Read once as a cluster of one server, so that a field of the wrong kind or range is an
    // Error naming it here, before the points compute with the fields.
    const int per_server = g.contains("gpus_per_server") && g["gpus_per_server"].is_number_integer()
                               ? g["gpus_per_server"].get<int>()
                               : 8;
    cluster_from_json(g, std::max(1, per_server), ref);
    return g;
  }
  *is_preset = true;
  if (ref == "localhost") throw Error("cluster", "localhost is not a server preset to sweep");
  return cluster_preset_generator(ref);
}

// The sweep's values at a point, by key (axes only).
const Json* point_value(const Json& values, const std::string& key) {
  return values.contains(key) ? &values[key] : nullptr;
}

bool is_axis(const SweepSpec& spec, const std::string& key) {
  return std::any_of(spec.axes.begin(), spec.axes.end(),
                     [&](const SweepAxis& a) { return a.key == key; });
}

// The generator JSON of a point (without its GPU count).
Json point_cluster(const SweepSpec& spec, const Json& values) {
  Json base = spec.base_cluster;
  bool from_preset = spec.base_is_preset;
  if (const Json* c = point_value(values, "cluster")) {
    base = cluster_preset_generator(c->get<std::string>());
    from_preset = true;
  }
  const Json* device = point_value(values, "device");
  if (device && from_preset) {
    // The servers that hold this device, unless the base's server is what the user fixed.
    const std::string preset = cluster_preset_for_device(device->get<std::string>());
    if (!preset.empty() && preset != base.value("name", "")) {
      const Json own = cluster_preset_generator(preset);
      for (const char* k : kServerFigures)
        if (own.contains(k)) base[k] = own[k];
      base["name"] = preset;
    }
  }
  const Json* gps = point_value(values, "gpus_per_server");
  if (gps && from_preset) {
    // A server size that another product of this silicon has: that product's servers, not the
    // base's scaled (gpus_per_server=72 on a B200 base is a GB200 NVL72 rack). A device axis
    // keeps its device.
    const std::string preset = cluster_preset_of_sibling(
        device ? device->get<std::string>() : base.value("device", ""), gps->get<int64_t>());
    if (!preset.empty() && preset != base.value("name", "")) {
      const Json own = cluster_preset_generator(preset);
      for (const char* k : kServerFigures)
        if (own.contains(k)) base[k] = own[k];
      base["device"] = own["device"];
      base["name"] = preset;
    }
  }
  const int base_gpus_per_server = base.value("gpus_per_server", 8);
  for (auto it = values.begin(); it != values.end(); ++it)
    if (!is_job_key(it.key())) base[it.key()] = it.value();
  if (gps) {
    const double ratio = gps->get<double>() / std::max(1, base_gpus_per_server);
    for (const char* k : kPerGpuFigures) {
      if (is_axis(spec, k) || !base.contains(k)) continue;
      const double scaled = base[k].get<double>() * ratio;
      if (std::string(k) == "host_memory_GiB")
        base[k] = scaled;
      else
        base[k] = std::max<int64_t>(1, std::llround(scaled));
    }
  }
  base["partial_last_server"] = true;
  if (!base.contains("name")) base["name"] = "sweep";
  return base;
}

int point_gpus(const SweepSpec& spec, const Json& values) {
  const Json* g = point_value(values, "gpus");
  return g ? g->get<int>() : spec.gpus;
}
std::string point_model(const SweepSpec& spec, const Json& values) {
  const Json* m = point_value(values, "model");
  return m ? m->get<std::string>() : spec.model;
}

// A model's training state with mixed-precision Adam: bf16 weights and gradients, fp32 master
// weights and two moments (16 bytes per parameter; Rajbhandari et al. 2020, ZeRO, section 3.1).
double training_state_bytes(const Model& m) { return 16.0 * param_counts(m).total; }

// Whether the cluster's GPU memory, with host memory when offload is searched, is at least the
// training state: below it no plan can fit, whatever its sharding.
bool can_hold(const Cluster& c, const Model& m, bool offload) {
  double capacity = c.num_gpus() * c.gpu_device(0).hbm_bytes;
  if (offload)
    for (int g = 0; g < c.num_gpus(); ++g) capacity += c.host_memory_per_gpu(g);
  return capacity >= training_state_bytes(m);
}

double price_of(const SweepSpec& spec, const std::string& device) {
  auto it = spec.device_price.find(device);
  return it != spec.device_price.end() ? it->second : spec.search.job.price_per_gpu_hour;
}

}  // namespace

const std::vector<std::string>& sweep_axis_keys() {
  static const std::vector<std::string> keys = [] {
    std::vector<std::string> k;
    for (const auto& [name, _] : axis_types()) k.push_back(name);
    return k;
  }();
  return keys;
}

SweepAxis parse_sweep_axis(const std::string& text) {
  const size_t eq = text.find('=');
  if (eq == std::string::npos || eq == 0)
    throw Error("--vary", "'" + text + "' is not KEY=V1,V2,... (keys: " +
                              join(sweep_axis_keys(), ", ") + ")");
  SweepAxis a;
  a.key = text.substr(0, eq);
  auto it = axis_types().find(a.key);
  if (it == axis_types().end())
    throw Error("--vary " + a.key, "unknown key (keys: " + join(sweep_axis_keys(), ", ") + ")");
  const std::string list = text.substr(eq + 1);
  if (list.empty()) throw axis_error(a.key, "has no values");
  for (const std::string& item : split(list, ',')) {
    if (item.empty()) throw axis_error(a.key, "'" + list + "' has an empty value");
    if (it->second == AxisType::kString)
      a.values.push_back(item);
    else
      parse_numeric_item(a.key, item, it->second == AxisType::kInteger, a.values);
  }
  return a;
}

void prepare_sweep(SweepSpec& spec) {
  spec.base_cluster = base_generator(spec.cluster, &spec.base_is_preset);
  std::set<std::string> seen;
  int64_t points = 1;
  for (const SweepAxis& a : spec.axes) {
    if (!seen.insert(a.key).second) throw axis_error(a.key, "is given twice");
    if (a.values.empty()) throw axis_error(a.key, "has no values");
    points *= static_cast<int64_t>(a.values.size());
    if (points > kMaxPoints)
      throw axis_error(a.key, "the sweep has more than " + std::to_string(kMaxPoints) + " points");
  }
  if (is_axis(spec, "cluster") && !spec.base_is_preset)
    throw axis_error("cluster", "varies the preset, but the base cluster is a file");
  // Each value on its own, through the checks of the field it sets.
  for (const SweepAxis& a : spec.axes) {
    for (const Json& v : a.values) {
      const std::string what = "'" + value_text(v) + "'";
      try {
        if (a.key == "model") {
          load_model(v.get<std::string>());
        } else if (a.key == "gpus") {
          if (v.get<int64_t>() < 1 || v.get<int64_t>() > (1 << 20))
            throw Error("gpus", "must be in [1, 1048576]");
        } else if (a.key == "gbs") {
          if (v.get<int64_t>() < 1 || v.get<int64_t>() > (1 << 30))
            throw Error("gbs", "must be in [1, 1073741824]");
        } else if (a.key == "seq") {
          if (v.get<int64_t>() < 1 || v.get<int64_t>() > (int64_t{1} << 40))
            throw Error("seq", "must be >= 1");
        } else {
          Json values = Json::object();
          values[a.key] = v;
          Json g = point_cluster(spec, values);
          cluster_from_json(g, g.value("gpus_per_server", 8), "cluster");
        }
      } catch (const Error& e) {
        if (e.kind() != ErrorKind::kUser) throw;
        throw axis_error(a.key, what + ": " + e.what());
      }
    }
  }
  const int64_t n = sweep_point_count(spec);
  // Every axis value must leave some point able to hold the model's training state.
  std::map<std::pair<std::string, std::string>, bool> holds;  // (key, value) -> some point holds
  std::map<std::string, Model> models;
  for (int64_t i = 0; i < n; ++i) {
    const Json values = sweep_point_values(spec, i);
    const std::string model_ref = point_model(spec, values);
    if (!models.count(model_ref)) models.emplace(model_ref, load_model(model_ref));
    bool ok = false;
    try {
      Json g = point_cluster(spec, values);
      ok = can_hold(cluster_from_json(g, point_gpus(spec, values), "cluster"), models.at(model_ref),
                    !spec.search.no_offload);
    } catch (const Error& e) {
      if (e.kind() != ErrorKind::kUser) throw;
      ok = true;  // a combination that cannot be built is a row that says so
    }
    for (auto it = values.begin(); it != values.end(); ++it) {
      bool& h = holds[{it.key(), value_text(it.value())}];
      h = h || ok;
    }
    if (spec.axes.empty() && !ok)
      throw Error("cluster", std::to_string(spec.gpus) + " GPUs of " + spec.cluster +
                                 " cannot hold " + model_ref + "'s training state");
  }
  for (const SweepAxis& a : spec.axes)
    for (const Json& v : a.values)
      if (!holds[{a.key, value_text(v)}]) {
        const std::string model_ref = a.key == "model"
                                          ? v.get<std::string>()
                                          : point_model(spec, sweep_point_values(spec, 0));
        throw axis_error(a.key, "'" + value_text(v) + "': no cluster of the sweep with " + a.key +
                                    "=" + value_text(v) + " can hold the model's training state (" +
                                    gib(training_state_bytes(models.at(model_ref))) +
                                    " of weights, gradients and Adam state, GPU" +
                                    (spec.search.no_offload ? "" : " and host") +
                                    " memory together)");
      }
}

int64_t sweep_point_count(const SweepSpec& spec) {
  int64_t n = 1;
  for (const SweepAxis& a : spec.axes) n *= static_cast<int64_t>(a.values.size());
  return n;
}

Json sweep_point_values(const SweepSpec& spec, int64_t index) {
  Json values = Json::object();
  for (size_t k = spec.axes.size(); k-- > 0;) {
    const SweepAxis& a = spec.axes[k];
    const int64_t size = static_cast<int64_t>(a.values.size());
    values[a.key] = a.values[static_cast<size_t>(index % size)];
    index /= size;
  }
  return values;
}

Json sweep_point_request(const SweepSpec& spec, int64_t index) {
  const Json values = sweep_point_values(spec, index);
  Json r = Json::object();
  r["model"] = point_model(spec, values);
  r["cluster"] = point_cluster(spec, values);
  r["gpus"] = point_gpus(spec, values);
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
    if (!can_hold(*s.cluster, s.model, !f.no_offload))
      throw Error("search", "the cluster cannot hold " + s.model.name + "'s training state (" +
                                gib(training_state_bytes(s.model)) +
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
      const cost::PowerFigures power = cost::default_power(*s.cluster);
      const double busy = std::clamp(st.compute_s / std::max(1e-30, st.step_s), 0.0, 1.0);
      const double energy_j =
          cost::cluster_it_power_w(*s.cluster, power, busy) * power.pue * time_s;
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
  const int64_t n = sweep_point_count(spec);
  const Json header = sweep_header(spec);
  std::map<int64_t, Json> done;
  bool journal_has_header = false;
  if (o.resume) {
    if (o.journal.empty()) throw Error("--resume", "needs --out, the journal to resume");
    std::ifstream in(o.journal);
    if (in) {
      std::string line;
      std::vector<std::string> kept;
      while (std::getline(in, line)) {
        Json j;
        try {
          j = Json::parse(line);
        } catch (const Json::parse_error&) {
          break;  // a torn last line: that point runs again
        }
        if (kept.empty()) {
          if (!j.is_object() || !j.contains("sweep") || j["sweep"] != header)
            throw Error("--resume", "'" + o.journal + "' is the journal of another sweep");
        } else if (j.is_object() && j.contains("index") && j["index"].is_number_integer() &&
                   j["index"] >= 0 && j["index"] < n &&
                   j["index"].get<int64_t>() % o.ranks == o.rank) {
          done[j["index"].get<int64_t>()] = j;
        }
        kept.push_back(line);
      }
      in.close();
      // Rewritten without a torn tail, so that appended rows start on a line of their own.
      std::ofstream rewrite(o.journal, std::ios::trunc);
      for (const std::string& l : kept) rewrite << l << "\n";
      if (!rewrite) throw SystemError("write", "cannot write '" + o.journal + "'");
      journal_has_header = !kept.empty();
    }
  }
  if (resumed) *resumed = static_cast<int64_t>(done.size());
  std::ofstream journal;
  if (!o.journal.empty()) {
    journal.open(o.journal, journal_has_header ? std::ios::app : std::ios::trunc);
    if (!journal) throw Error("--out", "cannot write '" + o.journal + "'");
    if (!journal_has_header) journal << Json{{"sweep", header}}.dump() << "\n" << std::flush;
  }
  std::vector<int64_t> todo;
  int64_t share = 0;
  for (int64_t i = o.rank; i < n; i += o.ranks) {
    ++share;
    if (!done.count(i)) todo.push_back(i);
  }
  // Largest clusters first: a search's cost grows with the GPU count, and starting the longest
  // points first keeps the last worker from running one long point alone at the end.
  std::vector<int> todo_gpus;
  for (int64_t i : todo) todo_gpus.push_back(point_gpus(spec, sweep_point_values(spec, i)));
  std::vector<size_t> order(todo.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return todo_gpus[a] > todo_gpus[b]; });
  std::vector<int64_t> by_size;
  for (size_t k : order) by_size.push_back(todo[k]);
  todo = std::move(by_size);
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int threads = o.threads > 0 ? o.threads : cores;
  const int workers =
      static_cast<int>(std::min<int64_t>(threads, std::max<int64_t>(1, todo.size())));
  const int per_search = std::max(1, threads / workers);
  std::mutex mu;
  std::atomic<size_t> next{0};
  int64_t finished = static_cast<int64_t>(done.size());
  std::exception_ptr failure;
  auto work = [&] {
    for (;;) {
      const size_t k = next.fetch_add(1);
      if (k >= todo.size()) return;
      {
        std::lock_guard<std::mutex> lock(mu);
        if (failure) return;
      }
      Json row;
      try {
        row = run_sweep_point(spec, todo[k], per_search);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu);
        if (!failure) failure = std::current_exception();
        return;
      }
      std::lock_guard<std::mutex> lock(mu);
      if (journal.is_open()) {
        journal << row.dump() << "\n" << std::flush;
        if (!journal)
          failure =
              std::make_exception_ptr(SystemError("write", "cannot write '" + o.journal + "'"));
      }
      done[todo[k]] = std::move(row);
      ++finished;
      if (o.progress) o.progress(finished, share);
    }
  };
  std::vector<std::thread> pool;
  for (int w = 1; w < workers; ++w) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
  if (failure) std::rethrow_exception(failure);
  std::vector<Json> rows;
  for (auto& [_, r] : done) rows.push_back(std::move(r));
  return rows;
}

Json sweep_document(const SweepSpec& spec, std::vector<Json> rows) {
  std::sort(rows.begin(), rows.end(), [](const Json& a, const Json& b) {
    return a["index"].get<int64_t>() < b["index"].get<int64_t>();
  });
  return Json{{"sweep", sweep_header(spec)}, {"rows", rows}};
}

Json read_sweep_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw Error("sweep", "cannot read '" + path + "'");
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  // A document is one JSON value; a journal is one per line.
  try {
    Json j = Json::parse(text);
    if (j.is_object() && j.contains("sweep") && j.contains("rows") && j["rows"].is_array())
      return j;
    if (!(j.is_object() && j.contains("sweep")))
      throw Error(path, "is not a sweep (no \"sweep\" and \"rows\")");
  } catch (const Json::parse_error&) {
  }
  std::istringstream lines(text);
  std::string line;
  Json doc = Json::object();
  std::map<int64_t, Json> rows;
  int number = 0;
  std::vector<std::string> all;
  while (std::getline(lines, line)) all.push_back(line);
  // A journal being written may end in a torn line (no newline yet): that point is not done.
  const bool torn_tail = !text.empty() && text.back() != '\n';
  for (size_t k = 0; k < all.size(); ++k) {
    line = all[k];
    ++number;
    if (line.empty()) continue;
    Json j;
    try {
      j = Json::parse(line);
    } catch (const Json::parse_error&) {
      if (torn_tail && k + 1 == all.size() && number > 1) break;
      throw Error(path + ":" + std::to_string(number), "is not a JSON line of a sweep journal");
    }
    if (number == 1) {
      if (!j.is_object() || !j.contains("sweep"))
        throw Error(path, "is not a sweep (its first line has no \"sweep\")");
      doc["sweep"] = j["sweep"];
    } else if (j.is_object() && j.contains("index") && j["index"].is_number_integer()) {
      rows[j["index"].get<int64_t>()] = j;
    } else {
      throw Error(path + ":" + std::to_string(number), "is not a row (no \"index\")");
    }
  }
  if (!doc.contains("sweep")) throw Error(path, "is empty");
  doc["rows"] = Json::array();
  for (auto& [_, r] : rows) doc["rows"].push_back(r);
  return doc;
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
    for (const auto& k : keys) out << "," << quote(value_text(r["point"][k]));
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
        s.axes.push_back(axis_from_json(it.key(), it.value(), r.field("vary") + "." + it.key()));
    } else if (v.is_array()) {
      for (const auto& [path, axis] : r.array("vary")) {
        JsonReader a(*axis, path);
        a.allow_only({"key", "values"});
        if (!a.has("values")) throw Error(a.field("values"), "is required");
        s.axes.push_back(axis_from_json(a.string("key"), a.raw("values"), a.field("values")));
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
