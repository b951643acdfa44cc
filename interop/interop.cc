// interop: see interop/interop.h. The refusal collector, the export tag, the export by name, the
// search's framework filter (can_export) and the import of a --plan file by its content.
#include "interop/interop.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "core/error.h"
#include "interop/deepspeed.h"
#include "interop/megatron.h"
#include "interop/torchtitan.h"

namespace parasol::interop {

void Refusals::add(std::string field, std::string reason) {
  items_.emplace_back(std::move(field), std::move(reason));
}

void Refusals::raise() const {
  if (items_.empty()) return;
  if (items_.size() == 1) throw Error(items_[0].first, items_[0].second);
  std::vector<std::string> fields;
  std::string reasons;
  for (const auto& [field, reason] : items_) {
    if (std::find(fields.begin(), fields.end(), field) == fields.end()) fields.push_back(field);
    reasons += (reasons.empty() ? "" : "; ") + field + ": " + reason;
  }
  std::string joined;
  for (const std::string& f : fields) joined += (joined.empty() ? "" : ", ") + f;
  throw Error(joined, std::to_string(items_.size()) + " reasons: " + reasons);
}

namespace {

bool tag_safe(const std::string& s) {
  return !s.empty() && std::none_of(s.begin(), s.end(), [](unsigned char c) {
    return std::isspace(c) || c == '=' || c == '#';
  });
}

constexpr const char* kTagPrefix = "# parasol-export:";

}  // namespace

std::string export_tag_line(const Model& model, const Cluster& cluster, int gpus) {
  std::string s = kTagPrefix;
  if (tag_safe(model.name)) s += " model=" + model.name;
  if (tag_safe(cluster.name)) s += " cluster=" + cluster.name;
  return s + " gpus=" + std::to_string(gpus) + "\n";
}

std::optional<ExportTag> read_export_tag(const std::string& text) {
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(kTagPrefix, 0) != 0) continue;
    ExportTag tag;
    std::istringstream words(line.substr(std::string(kTagPrefix).size()));
    for (std::string w; words >> w;) {
      const size_t eq = w.find('=');
      if (eq == std::string::npos) continue;
      const std::string key = w.substr(0, eq), value = w.substr(eq + 1);
      if (key == "model") tag.model = value;
      if (key == "cluster") tag.cluster = value;
      if (key == "gpus") {
        try {
          const int n = std::stoi(value);
          if (n > 0) tag.gpus = n;
        } catch (const std::exception&) {
        }
      }
    }
    return tag;
  }
  return std::nullopt;
}

ServerLayout server_layout(const Cluster& cluster, int gpus) {
  const int per_node = std::min(gpus, cluster.gpus_per_server());
  if (per_node <= 0 || gpus % per_node != 0)
    throw Error("plan", "the job's " + std::to_string(gpus) +
                            " GPUs do not fill whole servers of " +
                            std::to_string(cluster.gpus_per_server()) + " GPUs");
  return {gpus / per_node, per_node};
}

const std::vector<std::string>& framework_names() {
  static const std::vector<std::string> names = {"megatron", "deepspeed", "torchtitan"};
  return names;
}

Export export_plan(const std::string& framework, const Model& model, const Cluster& cluster,
                   const Plan& plan, const std::string& field) {
  if (framework == "megatron") return export_megatron(model, cluster, plan);
  if (framework == "deepspeed") return export_deepspeed(model, cluster, plan);
  if (framework == "torchtitan") return export_torchtitan(model, cluster, plan);
  throw Error(field, "'" + framework + "' is not one of megatron|deepspeed|torchtitan");
}

bool can_export(const std::string& framework, const Model& model, const Cluster& cluster,
                const Plan& plan) {
  try {
    export_plan(framework, model, cluster, plan);
    return true;
  } catch (const Error& e) {
    if (!e.is_user_error()) throw;  // a parasol bug is not a refusal
    return false;
  }
}

bool runs_selective_op(const std::string& framework) {
  PARASOL_CHECK(std::find(framework_names().begin(), framework_names().end(), framework) !=
                    framework_names().end(),
                "framework " + framework);
  return framework == "torchtitan";
}

TpImpl framework_tp_impl(const std::string& framework) {
  PARASOL_CHECK(std::find(framework_names().begin(), framework_names().end(), framework) !=
                    framework_names().end(),
                "framework " + framework);
  return framework == "torchtitan" ? TpImpl::kPytorch : TpImpl::kMegatron;
}

CpImpl framework_cp_impl(const std::string& framework) {
  PARASOL_CHECK(std::find(framework_names().begin(), framework_names().end(), framework) !=
                    framework_names().end(),
                "framework " + framework);
  return framework == "torchtitan" ? CpImpl::kPytorch : CpImpl::kTransformerEngine;
}

std::vector<std::pair<std::string, std::string>> export_refusals(const std::string& framework,
                                                                 const Model& model,
                                                                 const Cluster& cluster,
                                                                 const Plan& plan) {
  const Refusals r = framework == "megatron"    ? megatron_refusals(model, cluster, plan)
                     : framework == "deepspeed" ? deepspeed_refusals(model, cluster, plan)
                                                : torchtitan_refusals(model, cluster, plan);
  return r.items();
}

// ---- Import of a --plan file by its content.

namespace {

namespace fs = std::filesystem;

std::optional<std::string> read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::stringstream buf;
  buf << in.rdbuf();
  return buf.str();
}

bool is_preset(const std::vector<std::string>& names, const std::string& name) {
  return !name.empty() && std::find(names.begin(), names.end(), name) != names.end();
}

// Sets the plan's cluster from the export tag of `text` when it names a cluster preset, else
// requires --cluster.
void set_cluster(ImportedJob& job, const std::string& text, const std::string& path,
                 const ImportOptions& o) {
  if (o.cluster_given) return;
  const std::optional<ExportTag> tag = read_export_tag(text);
  if (tag && is_preset(cluster_preset_names(), tag->cluster)) {
    job.plan["cluster"] = tag->cluster;
    return;
  }
  throw Error("--cluster", "is required to read " + path +
                               ": it does not name its cluster (parasol's exports name it in "
                               "their '# parasol-export:' line)");
}

// The model preset the export tag of `text` names, or "".
std::string tagged_model(const std::string& text) {
  const std::optional<ExportTag> tag = read_export_tag(text);
  return tag && is_preset(model_preset_names(), tag->model) ? tag->model : "";
}

// The value of `flag` in the words of a launcher line ("--flag v" or "--flag=v"), or "".
std::string flag_value(const std::string& text, const std::string& flag) {
  std::istringstream in(text);
  std::string prev;
  for (std::string w; in >> w; prev = w) {
    if (w.rfind(flag + "=", 0) == 0) return w.substr(flag.size() + 1);
    if (prev == flag) return w;
  }
  return "";
}

bool is_deepspeed_launcher(const std::string& text) {
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    const size_t first = line.find_first_not_of(" \t");
    if (first != std::string::npos && line.compare(first, 10, "deepspeed ") == 0) return true;
  }
  return false;
}

// The file a launcher's --deepspeed_config names, looked up by its file name in the launcher's
// folder (the export writes "$HERE/ds_config.json").
fs::path named_config(const std::string& text, const fs::path& launcher) {
  std::string value = flag_value(text, "--deepspeed_config");
  value.erase(std::remove(value.begin(), value.end(), '"'), value.end());
  if (value.empty())
    throw Error("--deepspeed_config",
                "the DeepSpeed launcher " + launcher.string() + " names no DeepSpeed config");
  return launcher.parent_path() / fs::path(value).filename();
}

Json read_config(const fs::path& config, const std::string& launcher) {
  const std::optional<std::string> text = read_text(config);
  if (!text)
    throw Error("--deepspeed_config", launcher + " names " + config.filename().string() +
                                          ", which is not beside it: the ZeRO, precision and "
                                          "batch settings are in it");
  return parse_json(*text, config.string());
}

// A launch_deepspeed.sh: Megatron-DeepSpeed's arguments (import_megatron with its config) or a
// plain DeepSpeed launcher (the config, the GPU count of --num_nodes x --num_gpus, the model of
// the export tag).
ImportedJob import_deepspeed_launcher(const fs::path& path, const std::string& text,
                                      const ImportOptions& o) {
  const Json config = read_config(named_config(text, path), path.string());
  if (looks_like_megatron_args(text))
    return import_megatron(text, path.stem().string(), o.gpus, &config);
  const std::string nodes = flag_value(text, "--num_nodes"), per = flag_value(text, "--num_gpus");
  int gpus = o.gpus;
  if (gpus == 0 && !nodes.empty() && !per.empty()) {
    try {
      gpus = std::stoi(nodes) * std::stoi(per);
    } catch (const std::exception&) {
      gpus = 0;
    }
  }
  if (gpus <= 0)
    throw Error("--gpus", "is required to read " + path.string() +
                              " (its --num_nodes and --num_gpus are not numbers)");
  ImportedJob job = import_deepspeed(config, gpus);
  const std::string model = tagged_model(text);
  if (!model.empty()) {
    job.plan["model"] = model;
  } else if (o.model.empty()) {
    throw Error("--model", "is required to read " + path.string() +
                               ": a DeepSpeed launcher of the user's script does not describe "
                               "the model");
  }
  return job;
}

// A ds_config.json: the launch_deepspeed.sh beside it gives the model-parallel arguments, the
// GPU count and the model when it is parasol's export and names this config.
ImportedJob import_ds_config(const fs::path& path, const Json& config, const ImportOptions& o,
                             std::string& tag_text) {
  const fs::path launcher = path.parent_path() / "launch_deepspeed.sh";
  if (const std::optional<std::string> text = read_text(launcher);
      text && read_export_tag(*text) && is_deepspeed_launcher(*text) &&
      named_config(*text, launcher).filename() == path.filename()) {
    tag_text = *text;
    return import_deepspeed_launcher(launcher, *text, o);
  }
  if (o.gpus <= 0)
    throw Error("--gpus", "is required to read the DeepSpeed config " + path.string() +
                              " (its batch keys count data-parallel ranks)");
  if (o.model.empty())
    throw Error("--model", "is required to read the DeepSpeed config " + path.string() +
                               ": a ds_config.json does not describe the model");
  return import_deepspeed(config, o.gpus, {o.tp, o.pp, o.sequence_parallel});
}

}  // namespace

std::optional<ImportedJob> import_file(const std::string& path, const std::string& text,
                                       const ImportOptions& o) {
  const fs::path p(path);
  std::string tag_text = text;  // the text whose export tag names the cluster
  ImportedJob job;
  if (is_deepspeed_launcher(text)) {
    job = import_deepspeed_launcher(p, text, o);
  } else if (looks_like_megatron_args(text)) {
    job = import_megatron(text, p.stem().string(), o.gpus);
  } else if (looks_like_toml(text)) {
    if (!looks_like_torchtitan_toml(text))
      throw Error("--plan", path +
                                " is a TOML file but not a torchtitan job config (no "
                                "[parallelism] or [training] table); --plan reads a parasol plan "
                                "JSON, Megatron-LM arguments, a DeepSpeed config or launcher, or "
                                "a torchtitan job TOML");
    {
      std::optional<Model> given;
      if (!o.model.empty()) given = load_model(o.model);
      job = import_torchtitan(text, o.gpus, given ? &*given : nullptr);
    }
  } else {
    const size_t first = text.find_first_not_of(" \t\r\n");
    if (first == std::string::npos || text[first] != '{') return std::nullopt;
    Json j;
    try {
      j = Json::parse(text);
    } catch (const Json::exception&) {  // parse_error, or out_of_range for a number like 1e400
      return std::nullopt;              // the caller's parse names the file and the error
    }
    if (!looks_like_deepspeed_config(j)) return std::nullopt;
    job = import_ds_config(p, j, o, tag_text);
  }
  set_cluster(job, tag_text, path, o);
  return job;
}

}  // namespace parasol::interop
