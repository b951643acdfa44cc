// `parasol show model|cluster|plan|program [NAME]`: readable summaries of the vocabulary, and
// the lowered Program of one rank (one line per op).
#include <iostream>

#include "core/error.h"
#include "core/format.h"
#include "core/liveness.h"
#include "core/lower.h"
#include "cost_models/estimate.h"
#include "tools/commands.h"
#include "tools/flag_checks.h"
#include "tools/spec.h"

namespace parasol::tools {

namespace {

void print_model(const Model& m) {
  ParamCounts pc = param_counts(m);
  FlopsPerToken f = flops_per_token(m);
  std::cout << "model " << m.name << ": " << m.layers << " layers, hidden " << m.hidden << ", "
            << m.heads << " heads (" << m.kv_heads << " KV, head dim " << m.head_dim << "), ffn "
            << m.ffn << ", vocab " << m.vocab << ", seq " << m.seq_len << ", "
            << (m.norm == Norm::kRmsNorm ? "rmsnorm" : "layernorm") << ", "
            << (m.activation == Activation::kSwiglu ? "swiglu" : "gelu") << "\n";
  if (m.is_moe())
    std::cout << "  MoE: " << m.moe.experts << " experts, top-" << m.moe.top_k << ", expert ffn "
              << m.moe.expert_ffn << ", every " << m.moe.every << " layer(s)\n";
  std::cout << "  parameters: " << count(pc.total) << " total";
  if (m.is_moe()) std::cout << ", " << count(pc.active) << " active";
  std::cout << "\n  FLOPs per token: " << count(f.forward) << " forward, " << count(f.model)
            << " training (3x), " << count(f.with_full_recompute) << " with full recompute\n";
}

void print_cluster(const Cluster& c) {
  const DeviceSpec& d = c.gpu_device(0);
  std::cout << "cluster " << c.name << ": " << c.num_gpus() << " x " << d.name << " on "
            << c.num_servers() << " server(s), " << c.gpus_per_server() << " GPUs per server\n";
  const std::string peak = d.peak_bf16_flops >= 1e12
                               ? fmt("%.0f", d.peak_bf16_flops / 1e12) + " TFLOP/s"
                               : fmt("%.0f", d.peak_bf16_flops / 1e9) + " GFLOP/s";
  std::cout << "  device: " << peak << " bf16 dense, " << gib(d.hbm_bytes) << " HBM at "
            << fmt("%.0f", d.hbm_bw / 1e9) << " GB/s\n";
  std::cout << "  links:";
  for (LinkKind k : c.link_kinds()) std::cout << " " << link_kind_name(k);
  std::cout << "\n  graph: " << boost::num_vertices(c.graph) << " vertices, "
            << boost::num_edges(c.graph) << " links\n";
  if (c.num_gpus() > 1)
    std::cout << "  GPU 0 -> 1 bottleneck " << fmt("%.0f", c.bottleneck_bw(0, 1) / 1e9) << " GB/s";
  if (c.num_servers() > 1) {
    int other = c.gpus_per_server();
    std::cout << "; GPU 0 -> " << other << " (next server) "
              << fmt("%.0f", c.bottleneck_bw(0, other) / 1e9) << " GB/s";
  }
  std::cout << "\n";
}

void print_plan(const Spec& s) {
  const Plan& p = s.plan;
  std::cout << "plan: tp " << p.tp << ", pp " << p.pp << ", dp " << p.dp << ", cp " << p.cp
            << ", ep " << p.ep << ", sp " << (p.sequence_parallel ? "on" : "off") << ", vpp "
            << p.vpp << ", ZeRO " << p.zero << ", " << schedule_name(p.schedule) << ", recompute "
            << recompute_name(p.recompute) << ", offload " << offload_name(p.offload) << ", "
            << dtype_name(p.precision) << ", rank order " << rank_order_name(p.rank_order) << "\n";
  std::cout << "  batch: micro " << p.micro_batch << ", global " << p.global_batch << " ("
            << p.global_batch / std::max(1, p.dp * p.micro_batch)
            << " micro-batches per step), seq " << p.seq(s.model) << "\n";
  std::cout << "  GPUs: " << p.gpus() << " (cluster has " << s.cluster->num_gpus() << ")\n";
}

// The model presets, one line each (`show model` without a name).
void list_models(bool json) {
  Json rows = Json::array();
  Table t({"model", "parameters", "layers", "hidden", "heads (KV)", "seq", "kind"});
  for (const std::string& name : model_preset_names()) {
    const Model m = model_preset(name);
    const ParamCounts pc = param_counts(m);
    std::string kind = m.is_moe() ? "MoE " + std::to_string(m.moe.experts) + " experts, top-" +
                                        std::to_string(m.moe.top_k)
                                  : "dense";
    if (m.mla.enabled()) kind += ", MLA";
    if (m.sliding_window > 0) kind += ", sliding window";
    rows.push_back({{"name", name},
                    {"parameters", pc.total},
                    {"active_parameters", pc.active},
                    {"layers", m.layers},
                    {"hidden", m.hidden},
                    {"heads", m.heads},
                    {"kv_heads", m.kv_heads},
                    {"seq", m.seq_len},
                    {"moe_experts", m.is_moe() ? m.moe.experts : 0}});
    t.add({name, count(pc.total) + (m.is_moe() ? " (" + count(pc.active) + " active)" : ""),
           std::to_string(m.layers), std::to_string(m.hidden),
           std::to_string(m.heads) + " (" + std::to_string(m.kv_heads) + ")",
           std::to_string(m.seq_len), kind});
  }
  if (json) {
    std::cout << Json{{"models", rows}}.dump(1) << "\n";
    return;
  }
  std::cout << t.render()
            << "show model NAME (or --model NAME) for one; a parasol model JSON or "
               "an HF config.json also works\n";
}

// Two servers of a cluster preset (its server's size from cluster_preset_spec), so that both the
// in-server and the between-server bandwidth can be read; a one-GPU preset's one GPU; localhost
// with one rank.
Cluster two_servers_of(const std::string& name) {
  if (name == "localhost") return cluster_preset(name, 1);  // any count of CPU ranks
  const int per_server = cluster_preset_spec(name).server.gpus;
  return cluster_preset(name, per_server > 1 ? 2 * per_server : 1);
}

// The cluster presets, one line each (`show cluster` without a name).
void list_clusters(bool json) {
  Json rows = Json::array();
  Table t({"cluster", "device", "GPUs per server", "in-server GB/s", "between servers GB/s"});
  for (const std::string& name : cluster_preset_names()) {
    const Cluster c = two_servers_of(name);
    const int per_server = c.gpus_per_server();
    const double intra = per_server > 1 ? c.bottleneck_bw(0, 1) : 0;
    const double inter = c.num_servers() > 1 ? c.bottleneck_bw(0, per_server) : 0;
    rows.push_back({{"name", name},
                    {"device", c.gpu_device(0).name},
                    {"gpus_per_server", per_server},
                    {"intra_server_GBps", intra / 1e9},
                    {"inter_server_GBps", inter / 1e9}});
    t.add({name, c.gpu_device(0).name, std::to_string(per_server),
           intra > 0 ? fmt("%.0f", intra / 1e9) : "-", inter > 0 ? fmt("%.0f", inter / 1e9) : "-"});
  }
  if (json) {
    std::cout << Json{{"clusters", rows}}.dump(1) << "\n";
    return;
  }
  std::cout << t.render() << "show cluster NAME --gpus N for one (a cluster JSON also works)\n";
}

// The device datasheets, one line each (`show device` without a name), or one device.
void show_devices(const std::string& only, bool json) {
  Json rows = Json::array();
  Table t({"device", "vendor", "bf16 TFLOP/s", "fp8 TFLOP/s", "memory", "memory GB/s", "TDP W"});
  const std::vector<std::string> names =
      only.empty() ? known_devices() : std::vector<std::string>{device_spec(only, "device").name};
  for (const std::string& name : names) {
    const DeviceSpec& d = device_spec(name);
    rows.push_back(device_spec_to_json(d));
    t.add({d.name, d.vendor, fmt("%.0f", d.peak_bf16_flops / 1e12),
           d.peak_fp8_flops > 0 ? fmt("%.0f", d.peak_fp8_flops / 1e12) : "-", gib(d.hbm_bytes),
           fmt("%.0f", d.hbm_bw / 1e9), fmt("%.0f", d.tdp_watts)});
  }
  if (json) {
    std::cout << (only.empty() ? Json{{"devices", rows}} : rows[0]).dump(1) << "\n";
    return;
  }
  std::cout << t.render();
}

std::string mem(double bytes) {
  return bytes >= 1 << 30 ? gib(bytes) : fmt("%.1f MiB", bytes / (1 << 20));
}

// Shape of an op for the listing: GEMM dims, attention shape, elements or bytes.
std::string op_shape(const Op& o) {
  char buf[160];
  if (o.kind == OpKind::kAttention) {
    std::snprintf(buf, sizeof buf, "b=%lld sq=%lld skv=%lld h=%lld/%lld d=%lld%s",
                  (long long)o.attn.batch, (long long)o.attn.seq_q, (long long)o.attn.seq_kv,
                  (long long)o.attn.heads, (long long)o.attn.kv_heads, (long long)o.attn.head_dim,
                  o.attn.flash ? " flash" : "");
  } else if (o.m || o.n || o.k) {
    std::snprintf(buf, sizeof buf, "m=%lld n=%lld k=%lld", (long long)o.m, (long long)o.n,
                  (long long)o.k);
    std::string s = buf;
    if (o.batch > 1) s += " x" + std::to_string(o.batch);
    if (o.backward_data) s += " dgrad";
    return s;
  } else if (is_communication(o.kind) || o.kind == OpKind::kOffload ||
             o.kind == OpKind::kPrefetch) {
    std::snprintf(buf, sizeof buf, "bytes=%.0f", o.bytes);
  } else {
    std::snprintf(buf, sizeof buf, "elements=%.0f", o.elements);
  }
  return buf;
}

void print_program(const Spec& s, int rank, bool json) {
  validate(s.plan, s.model, *s.cluster);
  RankLayout layout(s.plan);
  if (rank < 0 || rank >= layout.world())
    throw Error("--rank",
                std::to_string(rank) + " is not in [0, " + std::to_string(layout.world()) + ")");
  const int stage = layout.coord(rank).pp;
  Program p = lower_stage(s.model, s.plan, stage, s.cluster->gpu_device(0));
  Liveness lv = liveness(p);
  if (json) {
    Json j = program_to_json(p);
    j["rank"] = rank;
    j["peak_bytes"] = lv.peak_bytes;
    j["host_bytes"] = lv.host_bytes;
    std::cout << j.dump(1) << "\n";
    return;
  }
  std::cout << "program of rank " << rank << ": stage " << stage << " of " << s.plan.pp << ", "
            << p.ranks.size() << " rank(s) share it, " << p.ops.size() << " ops, "
            << p.buffers.size() << " buffers; peak " << mem(lv.peak_bytes) << " on the device";
  if (lv.host_bytes > 0) std::cout << ", " << mem(lv.host_bytes) << " in host memory";
  std::cout << "\n";
  std::cout << "    id stream  kind           shape                               group      "
               "layer mb  ch phase     name\n";
  for (const Op& o : p.ops) {
    std::string group = o.peer_stage >= 0          ? "pp>s" + std::to_string(o.peer_stage)
                        : is_communication(o.kind) ? group_name(o.group)
                                                   : "";
    char line[320];
    std::snprintf(line, sizeof line, "%6d %-7s %-14s %-35s %-10s %5d %3d %2d %-9s %s", o.id,
                  p.stream_name(o.stream).c_str(), op_kind_name(o.kind), op_shape(o).c_str(),
                  group.c_str(), o.tags.layer, o.tags.micro_batch, o.tags.chunk,
                  phase_name(o.tags.phase), o.name.c_str());
    std::cout << line << "\n";
  }
}

}  // namespace

Runner add_show(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "show", "print a model, cluster, plan or the Program of one rank (default: the first three)");
  auto o = std::make_shared<SpecOptions>();
  auto what = std::make_shared<std::string>();
  auto name = std::make_shared<std::string>();
  auto json = std::make_shared<bool>(false);
  auto rank = std::make_shared<int>(0);
  cmd->add_option("what", *what,
                  "model | cluster | device | plan | program (model, cluster and device without "
                  "a name list the presets)")
      ->check(CLI::IsMember({"model", "cluster", "device", "plan", "program"}));
  cmd->add_option("name", *name, "preset name or file");
  add_target_flags(cmd, *o);
  add_plan_flags(cmd, *o);
  cmd->add_flag("--json", *json, "print JSON");
  cmd->add_option("--rank", *rank, "show program: the rank whose Program to list")
      ->capture_default_str()
      ->check(count_in(0));
  return [=]() {
    // A listing: `show model`, `show cluster` without a name (or --model / --cluster), `show
    // device` without a name.
    if (*what == "device") {
      show_devices(*name, *json);
      return 0;
    }
    if (*what == "model" && name->empty() && cmd->count("--model") == 0) {
      list_models(*json);
      return 0;
    }
    if (*what == "cluster" && name->empty() && cmd->count("--cluster") == 0) {
      list_clusters(*json);
      return 0;
    }
    SpecOptions opts = *o;
    if (opts.gpus == 0) opts.gpus = 1024;
    if (*what == "model" && !name->empty()) opts.model = *name;
    if (*what == "cluster" && !name->empty()) opts.cluster = *name;
    if ((*what == "plan" || *what == "program") && !name->empty()) opts.plan_file = *name;
    // The model and the cluster alone need no plan (a plan the cluster cannot hold is no error
    // of `show cluster`).
    const bool need_plan = what->empty() || *what == "plan" || *what == "program";
    if (need_plan && opts.plan_file.empty() && !opts.tp && !opts.pp && !opts.gbs) {
      // The default plan of the main command: Megatron's GPT-3 175B layout.
      opts.tp = 8;
      opts.pp = 8;
      opts.gbs = 1536;
      opts.sp = true;
      opts.recompute = "selective";
    }
    Spec s = load_spec(opts, cmd, need_plan);
    if (*what == "program") {
      print_program(s, *rank, *json);
      return 0;
    }
    if (*json) {
      Json j;
      if (what->empty() || *what == "model") {
        // The model as parasol reads it (a valid model file), and beside it its derived figures.
        j["model"] = model_to_json(s.model);
        const ParamCounts pc = param_counts(s.model);
        const FlopsPerToken f = flops_per_token(s.model);
        j["parameters"] = {{"total", pc.total}, {"active", pc.active}};
        j["flops_per_token"] = {{"forward", f.forward},
                                {"training", f.model},
                                {"with_full_recompute", f.with_full_recompute}};
      }
      if (what->empty() || *what == "cluster")
        j["cluster"] = {{"name", s.cluster->name},
                        {"gpus", s.cluster->num_gpus()},
                        {"servers", s.cluster->num_servers()},
                        {"device", s.cluster->gpu_device(0).name}};
      if (what->empty() || *what == "plan") j["plan"] = plan_to_json(s.plan);
      std::cout << j.dump(1) << "\n";
      return 0;
    }
    if (what->empty() || *what == "model") print_model(s.model);
    if (what->empty() || *what == "cluster") print_cluster(*s.cluster);
    if (what->empty() || *what == "plan") print_plan(s);
    return 0;
  };
}

}  // namespace parasol::tools
