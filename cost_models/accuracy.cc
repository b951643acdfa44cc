// Accuracy suites: parasol's predictions against published step times, per family.
#include "cost_models/accuracy.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "core/error.h"
#include "core/rank_layout.h"
#include "cost_models/estimate.h"

namespace parasol::cost {

namespace {
// An object field's value; anything else is an Error naming the field (a run's model or plan
// and the suite's defaults are merged key by key, which only an object has).
const Json& object_field(const JsonReader& r, const std::string& key) {
  const Json& v = r.raw(key);
  if (!v.is_object())
    throw Error(r.field(key), std::string("must be a JSON object, got ") + v.type_name());
  return v;
}

// Shallow merge: fields of `over` replace those of `base`. REQUIRES: both are objects.
Json merged(const Json& base, const Json& over) {
  PARASOL_CHECK(base.is_object() && over.is_object(), "merged objects");
  Json out = base;
  for (auto it = over.begin(); it != over.end(); ++it) out[it.key()] = it.value();
  return out;
}

}  // namespace

Cluster cluster_of(const PublishedRun& r) {
  if (r.cluster.is_string()) return cluster_preset(r.cluster.get<std::string>(), r.gpus);
  return cluster_from_json(r.cluster, r.gpus, r.id + ".cluster");
}

Prediction estimate_prediction(const Model& m, const Cluster& c, const Plan& p,
                               const Profile& profile, Reserved reserved) {
  Estimate e = estimate(m, c, p, profile, reserved);
  return {e.step_time_s, e.mfu,        e.memory_per_gpu_bytes, e.device_memory_bytes,
          e.fits,        e.memory_fit, e.stage_memory};
}

double predicted_memory(const Prediction& pred, const Plan& p, MemoryMetric metric, int rank) {
  PARASOL_CHECK(static_cast<int>(pred.stage_memory.size()) == p.pp, "a prediction per stage");
  if (rank < 0) {
    double most = 0;
    for (const FrameworkMemory& f : pred.stage_memory)
      most = std::max(most, memory_metric_bytes(f, metric));
    return most;
  }
  PARASOL_CHECK(rank < p.gpus(), "rank " + std::to_string(rank));
  return memory_metric_bytes(pred.stage_memory[RankLayout(p).coord(rank).pp], metric);
}

ErrorStats error_stats(const std::vector<AccuracyRow>& all) {
  ErrorStats s;
  std::vector<AccuracyRow> rows;
  for (const AccuracyRow& row : all)
    if (row.judged) rows.push_back(row);
  s.runs = static_cast<int>(rows.size());
  if (rows.empty()) return s;
  for (const AccuracyRow& row : rows) {
    s.mean_abs_error += std::fabs(row.error) / s.runs;
    s.mean_error += row.error / s.runs;
    s.rms_error += row.error * row.error / s.runs;
    s.max_abs_error = std::max(s.max_abs_error, std::fabs(row.error));
    s.not_fitting += row.fits ? 0 : 1;
    s.dropped_by_search += row.memory_fit == MemoryFit::kFits ? 0 : 1;
  }
  s.rms_error = std::sqrt(s.rms_error);
  return s;
}

std::vector<PublishedRun> read_accuracy_suite(const Json& suite, const std::string& path) {
  JsonReader r(suite, path);
  r.allow_only({"_about", "about", "source", "fields", "defaults", "defaults_note", "family",
                "runs", "points"});
  Json model_defaults = Json::object(), plan_defaults = Json::object();
  if (r.has("defaults")) {
    JsonReader d = r.object("defaults");
    d.allow_only({"model", "plan"});
    if (d.has("model")) model_defaults = object_field(d, "model");
    if (d.has("plan")) plan_defaults = object_field(d, "plan");
  }
  const std::string suite_family = r.string_or("family", "unnamed");
  if (r.has("runs") && r.has("points"))
    throw Error(r.field("points"), "give either runs or points, not both");
  const char* key = r.has("points") ? "points" : "runs";
  std::vector<PublishedRun> runs;
  for (const auto& [rpath, run] : r.array(key)) {
    JsonReader rr(*run, rpath);
    rr.allow_only({"id",           "src",        "source", "family",   "framework",  "cluster",
                   "cluster_note", "gpus",       "model",  "preset",   "plan",       "time_s",
                   "derived",      "derivation", "raw",    "inferred", "confidence", "note",
                   "visible",      "precision",  "mfu",    "judged",   "judged_why", "memory"});
    PublishedRun p;
    p.id = rr.string_or("id", rpath);
    p.source = rr.string_or("src", rr.string_or("source", ""));
    p.family = rr.string_or("family", suite_family);
    if (rr.has("memory") && rr.has("time_s"))
      throw Error(rr.field("memory"), "give either time_s or memory, not both (one point each)");
    if (rr.has("memory")) {
      JsonReader mr = rr.object("memory");
      mr.allow_only({"peak_GiB", "metric", "rank", "note"});
      p.memory_bytes = mr.number("peak_GiB", 1e-6, 1e6) * 1024.0 * 1024.0 * 1024.0;
      p.metric = parse_memory_metric(mr.string("metric"), mr.field("metric"));
      if (!mr.has("rank")) throw Error(mr.field("rank"), "is required (a rank, or \"max\")");
      if (mr.raw("rank").is_string()) {
        if (mr.string("rank") != "max")
          throw Error(mr.field("rank"), "must be a rank number or \"max\"");
        p.rank = -1;
      } else {
        p.rank = static_cast<int>(mr.integer("rank", 0, 1 << 20));
      }
    } else {
      p.time_s = rr.number("time_s", 1e-9, 1e9);
    }
    p.judged = rr.boolean_or("judged", true);
    if (!p.judged && rr.string_or("judged_why", "").empty())
      throw Error(rr.field("judged_why"), "is required when judged is false (say why)");
    if (rr.has("preset") && rr.has("model"))
      throw Error(rr.field("preset"), "give either preset or model, not both");
    if (rr.has("preset")) {
      p.model = model_preset(rr.string("preset"));
    } else if (rr.has("model") && rr.raw("model").is_string()) {
      p.model = model_preset(rr.string("model"));
    } else if (!rr.has("model")) {
      throw Error(rr.field("model"), "is required (a model object or preset name, or give preset)");
    } else {
      p.model =
          model_from_json(merged(model_defaults, object_field(rr, "model")), rr.field("model"));
    }
    p.gpus = static_cast<int>(rr.integer("gpus", 1, 1 << 20));
    if (!rr.has("cluster")) throw Error(rr.field("cluster"), "is required");
    p.cluster = rr.raw("cluster");
    if (!p.cluster.is_string() && !p.cluster.is_object())
      throw Error(rr.field("cluster"), "must be a preset name or a cluster object");
    if (!rr.has("plan")) throw Error(rr.field("plan"), "is required");
    p.plan = plan_from_json(merged(plan_defaults, object_field(rr, "plan")), rr.field("plan"));
    Cluster c = cluster_of(p);
    validate(p.plan, p.model, c);
    if (p.rank >= p.plan.gpus())
      throw Error(rr.field("memory.rank"), std::to_string(p.rank) + " is not below the plan's " +
                                               std::to_string(p.plan.gpus()) + " ranks");
    runs.push_back(std::move(p));
  }
  if (runs.empty()) throw Error(r.field(key), "has no run");
  return runs;
}

namespace {

// Predicts `run` on `c` (its cluster_of) and fills its row.
AccuracyRow accuracy_row(const PublishedRun& run, const Cluster& c, const Predictor& predict) {
  // The allocator's replay only where the point judges the reserved bytes.
  const bool reads_reserved = run.is_memory() && run.metric != MemoryMetric::kMaxAllocated;
  const Reserved reserved = reads_reserved ? Reserved::kReplay : Reserved::kBand;
  Prediction pr = predict ? predict(run.model, c, run.plan, reserved)
                          : estimate_prediction(run.model, c, run.plan,
                                                default_profile(c.gpu_device(0)), reserved);
  AccuracyRow row;
  row.id = run.id;
  row.source = run.source;
  row.family = run.family;
  row.published_s = run.time_s;
  row.predicted_s = pr.step_time_s;
  if (run.is_memory()) {
    row.metric = memory_metric_name(run.metric);
    row.rank = run.rank;
    row.published_bytes = run.memory_bytes;
    row.predicted_bytes = predicted_memory(pr, run.plan, run.metric, run.rank);
    row.error = (row.predicted_bytes - row.published_bytes) / row.published_bytes;
  } else {
    row.error = (row.predicted_s - row.published_s) / row.published_s;
  }
  row.mfu = pr.mfu;
  row.memory_per_gpu_bytes = pr.memory_per_gpu_bytes;
  row.device_memory_bytes = pr.device_memory_bytes;
  row.fits = pr.fits;
  row.memory_fit = pr.memory_fit;
  row.judged = run.judged;
  return row;
}

}  // namespace

AccuracyReport accuracy_report(std::vector<AccuracyRow> rows) {
  AccuracyReport rep;
  std::map<std::string, std::vector<AccuracyRow>> by_family;
  for (AccuracyRow& row : rows) {
    if (by_family.find(row.family) == by_family.end()) rep.families.push_back({row.family, {}});
    by_family[row.family].push_back(row);
    rep.rows.push_back(std::move(row));
  }
  for (FamilyStats& f : rep.families) {
    f.stats = error_stats(by_family[f.family]);
    f.memory = !by_family[f.family].front().metric.empty();
  }
  std::vector<AccuracyRow> time_rows;
  for (const AccuracyRow& row : rep.rows)
    if (row.metric.empty()) time_rows.push_back(row);
  rep.overall = error_stats(time_rows);
  rep.mean_abs_error = rep.overall.mean_abs_error;
  rep.max_abs_error = rep.overall.max_abs_error;
  return rep;
}

AccuracyReport run_accuracy(const std::vector<PublishedRun>& runs, const Predictor& predict) {
  std::vector<AccuracyRow> rows;
  rows.reserve(runs.size());
  // One cluster at a time: a suite's clusters may be large.
  for (const PublishedRun& run : runs) rows.push_back(accuracy_row(run, cluster_of(run), predict));
  return accuracy_report(std::move(rows));
}

AccuracyReport run_accuracy_on(const std::vector<PublishedRun>& runs,
                               const std::vector<Cluster>& clusters, const Predictor& predict) {
  PARASOL_CHECK(clusters.size() == runs.size(), "a cluster per run");
  std::vector<AccuracyRow> rows;
  rows.reserve(runs.size());
  for (size_t i = 0; i < runs.size(); ++i)
    rows.push_back(accuracy_row(runs[i], clusters[i], predict));
  return accuracy_report(std::move(rows));
}

AccuracyReport run_accuracy_suite(const Json& suite, const std::string& path,
                                  const Predictor& predict) {
  return run_accuracy(read_accuracy_suite(suite, path), predict);
}

namespace {
Json stats_to_json(const ErrorStats& s) {
  return {{"runs", s.runs},
          {"mean_abs_error", s.mean_abs_error},
          {"mean_error", s.mean_error},
          {"max_abs_error", s.max_abs_error},
          {"rms_error", s.rms_error},
          {"not_fitting", s.not_fitting},
          {"dropped_by_search", s.dropped_by_search}};
}
}  // namespace

Json accuracy_to_json(const AccuracyReport& r) {
  Json rows = Json::array();
  for (const AccuracyRow& row : r.rows)
    rows.push_back({{"id", row.id},
                    {"src", row.source},
                    {"family", row.family},
                    {"published_s", row.published_s},
                    {"predicted_s", row.predicted_s},
                    {"error", row.error},
                    {"mfu", row.mfu},
                    {"memory_per_gpu_bytes", row.memory_per_gpu_bytes},
                    {"device_memory_bytes", row.device_memory_bytes},
                    {"fits", row.fits},
                    {"memory_fit", memory_fit_name(row.memory_fit)},
                    {"judged", row.judged}});
  for (size_t i = 0; i < r.rows.size(); ++i)
    if (!r.rows[i].metric.empty()) {
      Json& row = rows[i];
      row["metric"] = r.rows[i].metric;
      row["rank"] = r.rows[i].rank;
      row["published_bytes"] = r.rows[i].published_bytes;
      row["predicted_bytes"] = r.rows[i].predicted_bytes;
    }
  Json families = Json::object();
  for (const FamilyStats& f : r.families) families[f.family] = stats_to_json(f.stats);
  Json j = {{"runs", rows}, {"families", families}, {"overall", stats_to_json(r.overall)}};
  j["mean_abs_error"] = r.mean_abs_error;
  j["max_abs_error"] = r.max_abs_error;
  return j;
}

}  // namespace parasol::cost
