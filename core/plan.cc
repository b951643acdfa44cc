// Plan: names, parsing and JSON I/O. Validation lives in plan_validate.cc.
#include "core/plan.h"

#include <sstream>

#include "core/error.h"

namespace parasol {

const char* schedule_name(Schedule s) {
  switch (s) {
    case Schedule::kGpipe:
      return "gpipe";
    case Schedule::k1F1B:
      return "1f1b";
    case Schedule::kInterleaved:
      return "interleaved";
  }
  return "?";
}

const char* recompute_name(Recompute r) {
  switch (r) {
    case Recompute::kNone:
      return "none";
    case Recompute::kSelective:
      return "selective";
    case Recompute::kFull:
      return "full";
  }
  return "?";
}

Schedule parse_schedule(const std::string& s, const std::string& field) {
  for (Schedule v : {Schedule::kGpipe, Schedule::k1F1B, Schedule::kInterleaved})
    if (s == schedule_name(v)) return v;
  throw Error(field, "'" + s + "' is not one of gpipe|1f1b|interleaved");
}

Recompute parse_recompute(const std::string& s, const std::string& field) {
  for (Recompute v : {Recompute::kNone, Recompute::kSelective, Recompute::kFull})
    if (s == recompute_name(v)) return v;
  throw Error(field, "'" + s + "' is not one of none|selective|full");
}

namespace {
// A list separated by `sep` with no empty item ("a,,b", "a," and ",a" are malformed).
bool has_empty_item(const std::string& s, char sep) {
  return s.empty() || s.front() == sep || s.back() == sep ||
         s.find(std::string(2, sep)) != std::string::npos;
}
}  // namespace

Offload parse_offload(const std::string& s, const std::string& field) {
  Offload o;
  if (s.empty() || s == "none") return o;
  if (has_empty_item(s, ',')) throw Error(field, "'" + s + "' has an empty item");
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item == "optimizer")
      o.optimizer = true;
    else if (item == "params")
      o.params = true;
    else if (item == "activations")
      o.activations = true;
    else
      throw Error(field, "'" + item + "' is not one of none|optimizer|params|activations");
  }
  return o;
}

std::string offload_name(const Offload& o) {
  std::string s;
  auto add = [&](bool on, const char* n) {
    if (on) s += (s.empty() ? "" : ",") + std::string(n);
  };
  add(o.optimizer, "optimizer");
  add(o.params, "params");
  add(o.activations, "activations");
  return s.empty() ? "none" : s;
}

const char* dim_name(Dim d) {
  switch (d) {
    case Dim::kTp:
      return "tp";
    case Dim::kCp:
      return "cp";
    case Dim::kEp:
      return "ep";
    case Dim::kDp:
      return "dp";
    case Dim::kPp:
      return "pp";
  }
  return "?";
}

std::string rank_order_name(const std::array<Dim, 5>& order) {
  std::string s;
  for (Dim d : order) s += (s.empty() ? "" : "-") + std::string(dim_name(d));
  return s;
}

std::array<Dim, 5> parse_rank_order(const std::string& s, const std::string& field) {
  std::array<Dim, 5> order{};
  if (has_empty_item(s, '-'))
    throw Error(field, "'" + s + "' must order each of tp, cp, ep, dp, pp once");
  std::stringstream ss(s);
  std::string item;
  int n = 0, seen = 0;
  while (std::getline(ss, item, '-')) {
    bool ok = false;
    for (Dim d : {Dim::kTp, Dim::kCp, Dim::kEp, Dim::kDp, Dim::kPp}) {
      if (item != dim_name(d)) continue;
      int bit = 1 << static_cast<int>(d);
      if (seen & bit) throw Error(field, "'" + item + "' appears twice in '" + s + "'");
      if (n >= 5) break;
      seen |= bit;
      order[n++] = d;
      ok = true;
    }
    if (!ok) throw Error(field, "'" + s + "' must order each of tp, cp, ep, dp, pp once");
  }
  if (n != 5) throw Error(field, "'" + s + "' must order each of tp, cp, ep, dp, pp once");
  return order;
}

int Plan::full_recompute_layers(int layers_per_stage) const {
  if (recompute != Recompute::kFull) return 0;
  return recompute_layers < 0 ? layers_per_stage : std::min(recompute_layers, layers_per_stage);
}

Plan plan_from_json(const Json& j, const std::string& path) {
  JsonReader r(j, path);
  r.allow_only({"tp",
                "pp",
                "dp",
                "cp",
                "ep",
                "sp",
                "vpp",
                "zero",
                "mbs",
                "gbs",
                "seq",
                "schedule",
                "recompute",
                "recompute_layers",
                "offload",
                "precision",
                "flash_attention",
                "overlap_grad_reduce",
                "overlap_param_gather",
                "rank_order",
                "model",
                "cluster",
                "gpus"});
  constexpr int64_t kMaxDegree = 1 << 20;
  Plan p;
  p.tp = static_cast<int>(r.integer_or("tp", 1, 1, kMaxDegree));
  p.pp = static_cast<int>(r.integer_or("pp", 1, 1, kMaxDegree));
  p.dp = static_cast<int>(r.integer_or("dp", 1, 1, kMaxDegree));
  p.cp = static_cast<int>(r.integer_or("cp", 1, 1, kMaxDegree));
  p.ep = static_cast<int>(r.integer_or("ep", 1, 1, kMaxDegree));
  p.sequence_parallel = r.boolean_or("sp", false);
  p.vpp = static_cast<int>(r.integer_or("vpp", 1, 1, 4096));
  p.zero = static_cast<int>(r.integer_or("zero", 0, 0, 3));
  p.micro_batch = static_cast<int>(r.integer_or("mbs", 1, 1, 1 << 24));
  const int64_t default_gbs = int64_t{p.micro_batch} * p.dp;  // int would overflow
  if (!r.has("gbs") && default_gbs > (1 << 30))
    throw Error(r.field("gbs"),
                "is required when mbs x dp (" + std::to_string(default_gbs) + ") exceeds 2^30");
  p.global_batch = static_cast<int>(r.integer_or("gbs", default_gbs, 1, 1 << 30));
  p.seq_len = r.integer_or("seq", 0, 1, int64_t{1} << 24);
  p.schedule = parse_schedule(r.string_or("schedule", p.vpp > 1 ? "interleaved" : "1f1b"),
                              r.field("schedule"));
  p.recompute = parse_recompute(r.string_or("recompute", "none"), r.field("recompute"));
  p.recompute_layers = static_cast<int>(r.integer_or("recompute_layers", -1, -1, 100000));
  if (r.has("offload")) {
    const Json& o = r.raw("offload");
    if (o.is_string()) {
      p.offload = parse_offload(o.get<std::string>(), r.field("offload"));
    } else if (o.is_array()) {
      std::string joined;
      for (const auto& [ipath, item] : r.array("offload")) {
        if (!item->is_string()) throw Error(ipath, "must be a string");
        joined += (joined.empty() ? "" : ",") + item->get<std::string>();
      }
      p.offload = parse_offload(joined, r.field("offload"));
    } else {
      throw Error(r.field("offload"), "must be a string or an array of strings");
    }
  }
  p.precision = parse_dtype(r.string_or("precision", "bf16"), r.field("precision"));
  p.flash_attention = r.boolean_or("flash_attention", true);
  p.overlap_grad_reduce = r.boolean_or("overlap_grad_reduce", true);
  p.overlap_param_gather = r.boolean_or("overlap_param_gather", true);
  if (r.has("rank_order"))
    p.rank_order = parse_rank_order(r.string("rank_order"), r.field("rank_order"));
  p.model_ref = r.string_or("model", "");
  p.cluster_ref = r.string_or("cluster", "");
  p.gpus_ref = static_cast<int>(r.integer_or("gpus", 0, 1, kMaxDegree));
  return p;
}

Json plan_to_json(const Plan& p) {
  Json j = {{"tp", p.tp},
            {"pp", p.pp},
            {"dp", p.dp},
            {"cp", p.cp},
            {"ep", p.ep},
            {"sp", p.sequence_parallel},
            {"vpp", p.vpp},
            {"zero", p.zero},
            {"mbs", p.micro_batch},
            {"gbs", p.global_batch},
            {"schedule", schedule_name(p.schedule)},
            {"recompute", recompute_name(p.recompute)},
            {"offload", offload_name(p.offload)},
            {"precision", dtype_name(p.precision)},
            {"flash_attention", p.flash_attention},
            {"overlap_grad_reduce", p.overlap_grad_reduce},
            {"overlap_param_gather", p.overlap_param_gather},
            {"rank_order", rank_order_name(p.rank_order)}};
  if (p.seq_len > 0) j["seq"] = p.seq_len;
  if (p.recompute_layers >= 0) j["recompute_layers"] = p.recompute_layers;
  if (!p.model_ref.empty()) j["model"] = p.model_ref;
  if (!p.cluster_ref.empty()) j["cluster"] = p.cluster_ref;
  if (p.gpus_ref > 0) j["gpus"] = p.gpus_ref;
  return j;
}

}  // namespace parasol
