// Accuracy suites: parasol's estimate against published iteration times.
#include "cost_models/accuracy.h"

#include <cmath>

#include "core/cluster.h"
#include "core/error.h"
#include "core/model.h"
#include "core/plan.h"
#include "cost_models/estimate.h"

namespace parasol::cost {

namespace {
// Shallow merge: fields of `over` replace those of `base`.
Json merged(const Json& base, const Json& over) {
  Json out = base.is_object() ? base : Json::object();
  for (auto it = over.begin(); it != over.end(); ++it) out[it.key()] = it.value();
  return out;
}
}  // namespace

AccuracyReport run_accuracy_suite(const Json& suite, const std::string& path) {
  JsonReader r(suite, path);
  Json model_defaults = Json::object(), plan_defaults = Json::object();
  if (r.has("defaults")) {
    JsonReader d = r.object("defaults");
    d.allow_only({"model", "plan"});
    if (d.has("model")) model_defaults = d.raw("model");
    if (d.has("plan")) plan_defaults = d.raw("plan");
  }
  AccuracyReport rep;
  for (const auto& [rpath, run] : r.array("runs")) {
    JsonReader rr(*run, rpath);
    AccuracyRow row;
    row.id = rr.string_or("id", rpath);
    row.source = rr.string_or("src", "");
    row.published_s = rr.number("time_s", 1e-9, 1e9);
    Model m = rr.has("preset")
                  ? model_preset(rr.string("preset"))
                  : model_from_json(merged(model_defaults, rr.raw("model")), rpath + ".model");
    int gpus = static_cast<int>(rr.integer("gpus", 1, 1 << 20));
    Cluster c = cluster_preset(rr.string("cluster"), gpus);
    Json pj = merged(plan_defaults, rr.raw("plan"));
    Plan p = plan_from_json(pj, rpath + ".plan");
    validate(p, m, c);
    Estimate e = estimate(m, c, p, default_profile(c.gpu_device(0)));
    row.predicted_s = e.step_time_s;
    row.error = (row.predicted_s - row.published_s) / row.published_s;
    row.mfu = e.mfu;
    rep.rows.push_back(row);
  }
  if (rep.rows.empty()) throw Error(path + ".runs", "has no run");
  for (const AccuracyRow& row : rep.rows) {
    rep.mean_abs_error += std::fabs(row.error) / rep.rows.size();
    rep.max_abs_error = std::max(rep.max_abs_error, std::fabs(row.error));
  }
  return rep;
}

Json accuracy_to_json(const AccuracyReport& r) {
  Json rows = Json::array();
  for (const AccuracyRow& row : r.rows)
    rows.push_back({{"id", row.id},
                    {"src", row.source},
                    {"published_s", row.published_s},
                    {"predicted_s", row.predicted_s},
                    {"error", row.error},
                    {"mfu", row.mfu}});
  return {{"runs", rows}, {"mean_abs_error", r.mean_abs_error}, {"max_abs_error", r.max_abs_error}};
}

}  // namespace parasol::cost
