// What-if clusters (sim/what_if_cluster.h): a sweep's axes and their values, the numbering of its
// points, the cluster of a point, and whether a point's GPUs can hold the model's training state.
#include "sim/what_if_cluster.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "core/error.h"
#include "core/format.h"
#include "core/plan.h"
#include "core/sibling_presets.h"
#include "cost_models/memory.h"

namespace parasol::sim {

namespace {

constexpr int64_t kMaxPoints = 100000;

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

bool is_axis(const WhatIfGrid& grid, const std::string& key) {
  return std::any_of(grid.axes.begin(), grid.axes.end(),
                     [&](const SweepAxis& a) { return a.key == key; });
}

}  // namespace

std::string sweep_value_text(const Json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_number_integer()) return std::to_string(v.get<int64_t>());
  if (v.is_number()) return fmt("%g", v.get<double>());
  return v.dump();
}

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

SweepAxis sweep_axis_from_json(const std::string& key, const Json& v, const std::string& path) {
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

int64_t grid_point_count(const std::vector<int64_t>& sizes) {
  int64_t n = 1;
  for (int64_t s : sizes) n *= s;
  return n;
}

std::vector<int64_t> grid_positions(const std::vector<int64_t>& sizes, int64_t index) {
  std::vector<int64_t> positions(sizes.size());
  for (size_t k = sizes.size(); k-- > 0;) {
    positions[k] = index % sizes[k];
    index /= sizes[k];
  }
  return positions;
}

int64_t grid_index(const std::vector<int64_t>& sizes, const std::vector<int64_t>& positions) {
  int64_t index = 0;
  for (size_t k = 0; k < sizes.size(); ++k) index = index * sizes[k] + positions[k];
  return index;
}

namespace {
std::vector<int64_t> axis_sizes(const WhatIfGrid& grid) {
  std::vector<int64_t> sizes;
  for (const SweepAxis& a : grid.axes) sizes.push_back(static_cast<int64_t>(a.values.size()));
  return sizes;
}
}  // namespace

int64_t sweep_point_count(const WhatIfGrid& grid) { return grid_point_count(axis_sizes(grid)); }

Json sweep_point_values(const WhatIfGrid& grid, int64_t index) {
  const std::vector<int64_t> positions = grid_positions(axis_sizes(grid), index);
  Json values = Json::object();
  for (size_t k = 0; k < grid.axes.size(); ++k)
    values[grid.axes[k].key] = grid.axes[k].values[static_cast<size_t>(positions[k])];
  return values;
}

Json point_cluster(const WhatIfGrid& grid, const Json& values) {
  Json base = grid.base_cluster;
  bool from_preset = grid.base_is_preset;
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
      if (is_axis(grid, k) || !base.contains(k)) continue;
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

int point_gpus(const WhatIfGrid& grid, const Json& values) {
  const Json* g = point_value(values, "gpus");
  return g ? g->get<int>() : grid.gpus;
}

std::string point_model(const WhatIfGrid& grid, const Json& values) {
  const Json* m = point_value(values, "model");
  return m ? m->get<std::string>() : grid.model;
}

double memory_capacity(const Cluster& c, bool offload) {
  double capacity = c.num_gpus() * c.gpu_device(0).hbm_bytes;
  if (offload)
    for (int g = 0; g < c.num_gpus(); ++g) capacity += c.host_memory_per_gpu(g);
  return capacity;
}

double training_state_bytes(const Model& m, const Cluster& c, Dtype precision) {
  Plan p;  // every degree 1: one rank holds the whole replica
  p.precision = precision;
  const cost::MemoryBreakdown b = cost::memory_per_rank(m, c, p);
  return b.weights + b.gradients + b.optimizer;
}

bool can_hold(const Cluster& c, const Model& m, Dtype precision, bool offload) {
  return memory_capacity(c, offload) >= training_state_bytes(m, c, precision);
}

void prepare_what_if(WhatIfGrid& grid, Dtype precision, bool offload) {
  grid.base_cluster = base_generator(grid.cluster, &grid.base_is_preset);
  std::set<std::string> seen;
  int64_t points = 1;
  for (const SweepAxis& a : grid.axes) {
    if (!seen.insert(a.key).second) throw axis_error(a.key, "is given twice");
    if (a.values.empty()) throw axis_error(a.key, "has no values");
    points *= static_cast<int64_t>(a.values.size());
    if (points > kMaxPoints)
      throw axis_error(a.key, "the sweep has more than " + std::to_string(kMaxPoints) + " points");
  }
  if (is_axis(grid, "cluster") && !grid.base_is_preset)
    throw axis_error("cluster", "varies the preset, but the base cluster is a file");
  // Each value on its own, through the checks of the field it sets.
  for (const SweepAxis& a : grid.axes) {
    for (const Json& v : a.values) {
      const std::string what = "'" + sweep_value_text(v) + "'";
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
          Json g = point_cluster(grid, values);
          cluster_from_json(g, g.value("gpus_per_server", 8), "cluster");
        }
      } catch (const Error& e) {
        if (e.kind() != ErrorKind::kUser) throw;
        throw axis_error(a.key, what + ": " + e.what());
      }
    }
  }
  const int64_t n = sweep_point_count(grid);
  // Every axis value must leave some point able to hold the model's training state.
  std::map<std::pair<std::string, std::string>, bool> holds;    // (key, value) -> some point holds
  std::map<std::pair<std::string, std::string>, double> state;  // (key, value) -> its state bytes
  std::map<std::string, Model> models;
  for (int64_t i = 0; i < n; ++i) {
    const Json values = sweep_point_values(grid, i);
    const std::string model_ref = point_model(grid, values);
    if (!models.count(model_ref)) models.emplace(model_ref, load_model(model_ref));
    bool ok = false;
    double bytes = 0;
    try {
      Json g = point_cluster(grid, values);
      const Cluster c = cluster_from_json(g, point_gpus(grid, values), "cluster");
      bytes = training_state_bytes(models.at(model_ref), c, precision);
      ok = memory_capacity(c, offload) >= bytes;
    } catch (const Error& e) {
      if (e.kind() != ErrorKind::kUser) throw;
      ok = true;  // a combination that cannot be built is a row that says so
    }
    for (auto it = values.begin(); it != values.end(); ++it) {
      bool& h = holds[{it.key(), sweep_value_text(it.value())}];
      h = h || ok;
      if (!ok) state[{it.key(), sweep_value_text(it.value())}] = bytes;
    }
    if (grid.axes.empty() && !ok)
      throw Error("cluster", std::to_string(grid.gpus) + " GPUs of " + grid.cluster +
                                 " cannot hold " + model_ref + "'s training state");
  }
  for (const SweepAxis& a : grid.axes)
    for (const Json& v : a.values)
      if (!holds[{a.key, sweep_value_text(v)}]) {
        throw axis_error(a.key, "'" + sweep_value_text(v) + "': no cluster of the sweep with " +
                                    a.key + "=" + sweep_value_text(v) +
                                    " can hold the model's training state (" +
                                    gib(state[{a.key, sweep_value_text(v)}]) +
                                    " of weights, gradients and Adam state, GPU" +
                                    (offload ? " and host" : "") + " memory together)");
      }
}

}  // namespace parasol::sim
