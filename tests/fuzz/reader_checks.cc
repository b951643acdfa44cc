// Invariants of what parasol's readers return (see reader_checks.h).
#include "tests/fuzz/reader_checks.h"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <stdexcept>

#include "core/json_reader.h"

namespace parasol::fuzz {

void check_model(const Model& m) {
  validate_model(m);  // a model that was read is a valid model
  ParamCounts c = param_counts(m);
  if (c.total <= 0 || c.active <= 0 || c.active > c.total)
    throw std::logic_error("bad parameter counts for " + m.name);
  FlopsPerToken f = flops_per_token(m);
  if (!(f.forward > 0) || !std::isfinite(f.forward)) throw std::logic_error("bad FLOPs");
}

void check_cluster(const Cluster& c) {
  if (c.num_gpus() < 1 || c.num_servers() < 1 || c.gpus_per_server() < 1)
    throw std::logic_error("bad cluster counts");
  const int n = std::min(c.num_gpus(), 16);
  for (int a = 0; a < n; ++a)
    for (int b = 0; b < n; ++b)
      if (a != b && !(c.bottleneck_bw(a, b) > 0 && std::isfinite(c.bottleneck_bw(a, b))))
        throw std::logic_error("no usable path between GPUs");
  // What was read can be written and read back.
  if (cluster_from_json(cluster_to_json(c)).num_gpus() != c.num_gpus())
    throw std::logic_error("cluster round trip changed the GPU count");
}

void check_plan(const Plan& p) {
  if (p.tp < 1 || p.pp < 1 || p.dp < 1 || p.cp < 1 || p.ep < 1 || p.vpp < 1 || p.zero < 0 ||
      p.zero > 3 || p.micro_batch < 1 || p.global_batch < 1 || p.seq_len < 0 ||
      p.recompute_layers < -1)
    throw std::logic_error("plan fields out of range: " + plan_to_json(p).dump());
  Json j = plan_to_json(p);
  if (plan_to_json(plan_from_json(j)) != j) throw std::logic_error("plan round trip differs");
  // validate() on whatever was read: it may reject, but only with a parasol::Error.
  static const Model model = model_from_json(Json::parse(
      R"({"layers": 8, "hidden": 128, "heads": 8, "kv_heads": 4, "ffn": 256, "vocab": 512,
          "seq_len": 64, "norm": "rmsnorm", "activation": "swiglu",
          "moe": {"experts": 4, "top_k": 2}})"));
  static const Cluster cluster = cluster_preset("dgx-h100", 8);
  validate(p, model, cluster);
}

void check_trace(const traces::Trace& t) {
  for (const traces::TraceEvent& e : t.events) {
    if (!(e.dur_s >= 0) || !std::isfinite(e.dur_s) || !std::isfinite(e.start_s))
      throw std::logic_error("trace event " + e.name + " has a bad time");
    if (e.rank < 0 || e.stream < 0) throw std::logic_error("trace event " + e.name + " bad ids");
  }
  // What was read can be written and read back, event for event.
  std::ostringstream out;
  traces::write_trace(t, out);
  const traces::Trace back = traces::trace_from_json(Json::parse(out.str()), "written trace");
  if (back.events.size() != t.events.size())
    throw std::logic_error("trace round trip changed the event count");
  for (size_t i = 0; i < t.events.size(); ++i)
    if (back.events[i].name != t.events[i].name || back.events[i].rank != t.events[i].rank ||
        back.events[i].stream != t.events[i].stream)
      throw std::logic_error("trace round trip changed event " + std::to_string(i));
  if (back.counters.size() != t.counters.size() || back.flows.size() != t.flows.size())
    throw std::logic_error("trace round trip changed the counters or flows");
}

void check_kineto_import(const traces::ImportedTrace& imp) {
  if (imp.shapes.size() != imp.trace.events.size())
    throw std::logic_error("kineto import: shapes and events differ in number");
  int sum = 0, unclassified = 0;
  for (const auto& [kind, n] : imp.by_kind) sum += n;
  if (sum != static_cast<int>(imp.trace.events.size()))
    throw std::logic_error("kineto import: kinds do not count every event");
  for (const traces::KernelCount& k : imp.unclassified) {
    if (k.count <= 0) throw std::logic_error("kineto import: an unclassified name without events");
    unclassified += k.count;
  }
  const auto it = imp.by_kind.find("unclassified");
  if (unclassified != (it == imp.by_kind.end() ? 0 : it->second))
    throw std::logic_error("kineto import: unclassified kernels miscounted");
  for (const traces::RankGaps& g : imp.gaps)
    if (!(g.launch_s <= g.idle_s + 1e-9) || !(g.busy_s >= 0) || !std::isfinite(g.idle_s))
      throw std::logic_error("kineto import: bad gaps");
  for (const traces::TraceEvent& e : imp.trace.events)
    if (!std::isfinite(e.bytes) || !std::isfinite(e.flops) || e.bytes < 0 || e.flops < 0)
      throw std::logic_error("kineto import: bad bytes or FLOPs of " + e.name);
  check_trace(imp.trace);
}

void check_profile(const cost::Profile& p) {
  if (!(p.gemm_efficiency > 0 && p.gemm_efficiency <= 1) ||
      !(p.memory_efficiency > 0 && p.memory_efficiency <= 1) || !(p.kernel_overhead_s >= 0) ||
      !std::isfinite(p.kernel_overhead_s))
    throw std::logic_error("profile figure out of range");
  const Json j = cost::profile_to_json(p);
  if (cost::profile_to_json(cost::profile_from_json(j)) != j)
    throw std::logic_error("profile round trip differs");
}

}  // namespace parasol::fuzz
