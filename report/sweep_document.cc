// A sweep's document (sweep_document.h): its checks, the cost the front reads, the front and
// the grid of its points.
#include "report/sweep_document.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "core/error.h"
#include "sim/pareto.h"
#include "sim/what_if_cluster.h"

namespace parasol::report {

double sweep_train_number(const Json& row, const char* key) {
  return row["train"][key].get<double>();
}

bool sweep_row_has_plan(const Json& row) { return row.value("status", "") == "ok"; }

void check_sweep_document(const Json& doc, const std::string& field) {
  if (!doc.is_object() || !doc.contains("sweep") || !doc["sweep"].is_object())
    throw Error(field, "is not a sweep document (no \"sweep\" object)");
  if (!doc.contains("rows") || !doc["rows"].is_array())
    throw Error(field, "is not a sweep document (no \"rows\" array)");
  const Json& h = doc["sweep"];
  if (!h.contains("axes") || !h["axes"].is_array())
    throw Error(field + ".sweep.axes", "must be an array of {\"key\", \"values\"}");
  for (size_t k = 0; k < h["axes"].size(); ++k) {
    const Json& a = h["axes"][k];
    const std::string p = field + ".sweep.axes[" + std::to_string(k) + "]";
    if (!a.is_object() || !a.contains("key") || !a["key"].is_string())
      throw Error(p + ".key", "must be a string");
    if (!a.contains("values") || !a["values"].is_array() || a["values"].empty())
      throw Error(p + ".values", "must be a non-empty array");
  }
  double points = 1;
  for (const Json& a : h["axes"]) points *= static_cast<double>(a["values"].size());
  if (points > 1e6) throw Error(field + ".sweep.axes", "have more than 1,000,000 points");
  const Json& rows = doc["rows"];
  for (size_t i = 0; i < rows.size(); ++i) {
    const Json& r = rows[i];
    const std::string p = field + ".rows[" + std::to_string(i) + "]";
    if (!r.is_object()) throw Error(p, "must be an object");
    if (!r.contains("index") || !r["index"].is_number_integer())
      throw Error(p + ".index", "must be an integer");
    if (!r.contains("point") || !r["point"].is_object())
      throw Error(p + ".point", "must be an object");
    if (!r.contains("status") || !r["status"].is_string())
      throw Error(p + ".status", "must be \"ok\" or \"no_plan\"");
    if (!sweep_row_has_plan(r)) continue;
    for (const char* k : {"step_time_s", "tokens_per_s", "mfu", "memory_per_gpu_bytes"})
      if (!r.contains(k) || !r[k].is_number()) throw Error(p + "." + k, "must be a number");
    if (!r.contains("plan") || !r["plan"].is_string()) throw Error(p + ".plan", "must be a string");
    if (!r.contains("band") || !r["band"].is_object())
      throw Error(p + ".band", "must be an object");
    if (!r.contains("train") || !r["train"].is_object())
      throw Error(p + ".train", "must be an object");
    const Json& t = r["train"];
    for (const char* k : {"time_s", "gpu_hours", "energy_MWh", "tokens"})
      if (!t.contains(k) || !t[k].is_number() || !std::isfinite(t[k].get<double>()))
        throw Error(p + ".train." + k, "must be a finite number");
    if (t.contains("cost") && !t["cost"].is_null() &&
        (!t["cost"].is_number() || !std::isfinite(t["cost"].get<double>())))
      throw Error(p + ".train.cost", "must be a finite number or null");
  }
}

std::string sweep_cost_key(const Json& doc) {
  bool any = false;
  for (const Json& r : doc["rows"]) {
    if (!sweep_row_has_plan(r)) continue;
    any = true;
    const Json& t = r["train"];
    if (!t.contains("cost") || !t["cost"].is_number()) return "gpu_hours";
  }
  return any ? "cost" : "gpu_hours";
}

std::vector<int64_t> sweep_pareto_front(const Json& doc) {
  const std::string key = sweep_cost_key(doc);
  std::vector<sim::Objectives> points;
  std::vector<int64_t> index;
  for (const Json& r : doc["rows"])
    if (sweep_row_has_plan(r)) {
      points.push_back({sweep_train_number(r, "time_s"), sweep_train_number(r, key.c_str())});
      index.push_back(r["index"].get<int64_t>());
    }
  // By time, then cost, then index (rows come in index order).
  std::vector<std::pair<sim::Objectives, int64_t>> front;
  for (size_t k : sim::pareto_front(points)) front.push_back({points[k], index[k]});
  std::sort(front.begin(), front.end(), [](const auto& a, const auto& b) {
    if (a.first.first != b.first.first) return a.first.first < b.first.first;
    if (a.first.second != b.first.second) return a.first.second < b.first.second;
    return a.second < b.second;
  });
  std::vector<int64_t> out;
  for (const auto& [_, i] : front) out.push_back(i);
  return out;
}

std::vector<int64_t> sweep_grid(const Json& doc) {
  const Json& axes = doc["sweep"]["axes"];
  std::vector<int64_t> sizes;
  for (const Json& a : axes) sizes.push_back(static_cast<int64_t>(a["values"].size()));
  std::vector<int64_t> grid(static_cast<size_t>(sim::grid_point_count(sizes)), -1);
  const Json& rows = doc["rows"];
  for (size_t k = 0; k < rows.size(); ++k) {
    const Json& point = rows[k]["point"];
    std::vector<int64_t> positions;
    for (const Json& a : axes) {
      const std::string key = a["key"].get<std::string>();
      const Json& values = a["values"];
      size_t pos = values.size();
      if (point.contains(key))
        for (size_t v = 0; v < values.size(); ++v)
          if (values[v] == point[key]) {  // 25 == 25.0: nlohmann compares numbers by value
            pos = v;
            break;
          }
      if (pos == values.size()) break;
      positions.push_back(static_cast<int64_t>(pos));
    }
    if (positions.size() != sizes.size()) continue;
    const size_t flat = static_cast<size_t>(sim::grid_index(sizes, positions));
    if (grid[flat] < 0) grid[flat] = static_cast<int64_t>(k);
  }
  return grid;
}

}  // namespace parasol::report
