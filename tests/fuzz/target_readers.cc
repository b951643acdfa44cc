// The fuzz targets' readers (target_readers.h): each reads its input as the command line does
// and checks what it read (reader_checks.h).
#include "tests/fuzz/target_readers.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <optional>
#include <stdexcept>
#include <vector>

#include "core/error.h"
#include "core/json_reader.h"
#include "core/model.h"
#include "cost_models/accuracy.h"
#include "cost_models/profile.h"
#include "interop/interop.h"
#include "runtime/checkpoint.h"
#include "runtime/data.h"
#include "tests/fuzz/reader_checks.h"
#include "traces/kineto_import.h"
#include "traces/trace.h"

namespace parasol::fuzz {

namespace {

namespace fs = std::filesystem;

void write_file(const fs::path& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// A scratch folder of this process: <tmp>/parasol-fuzz-<what>-<pid>.
fs::path scratch(const std::string& what) {
  fs::path p =
      fs::temp_directory_path() / ("parasol-fuzz-" + what + "-" + std::to_string(getpid()));
  fs::create_directories(p);
  return p;
}

void read_model_json(const std::string& text) {
  check_model(model_from_json(parse_json(text, "model")));
}

void read_hf_config(const std::string& text) {
  check_model(model_from_hf_config(parse_json(text, "config.json")));
}

void read_cluster_json(const std::string& text) {
  check_cluster(cluster_from_json(parse_json(text, "cluster")));
}

void read_plan_json(const std::string& text) {
  check_plan(plan_from_json(parse_json(text, "plan")));
}

void read_trace_json(const std::string& text) {
  check_trace(traces::trace_from_json(parse_json(text, "trace"), "trace"));
}

void read_profile_json(const std::string& text) {
  check_profile(cost::profile_from_json(parse_json(text, "profile")));
}

// An accuracy suite of published runs, as `parasol accuracy FILE` reads it: every run's model
// must be valid, its published figure (a step time, or a memory point's peak) positive and its
// cluster buildable.
void read_accuracy_suite(const std::string& text) {
  for (const cost::PublishedRun& run : cost::read_accuracy_suite(parse_json(text, "suite"))) {
    check_model(run.model);
    if (run.is_memory() ? run.time_s != 0 : !(run.time_s > 0))
      throw std::logic_error("run " + run.id + " is neither a timed run nor a memory point");
    // Built, not round-tripped: published clusters have thousands of GPUs, and
    // cluster_json_fuzz checks the cluster reader itself.
    if (cost::cluster_of(run).num_gpus() < 1) throw std::logic_error("run " + run.id + ": no GPUs");
  }
}

// A checkpoint's manifest.json and its root's `latest` file, as `parasol run --resume DIR` reads
// them (resolve_checkpoint, read_checkpoint_manifest, verify_checkpoint), against the `tiny`
// model. The input is written to both files of a scratch folder of this process
// ({latest, step-1/manifest.json, manifest.json}); `latest` must never resolve outside the
// checkpoint root.
void read_checkpoint_manifest(const std::string& text) {
  static const Model model = model_preset("tiny");
  static const fs::path root = [] {
    fs::path p = scratch("ckpt");
    fs::create_directories(p / "step-1");
    return p;
  }();
  write_file(root / "latest", text);
  write_file(root / "step-1" / "manifest.json", text);
  write_file(root / "manifest.json", text);
  try {
    const fs::path dir = fs::path(runtime::resolve_checkpoint(root)).lexically_normal();
    const std::string r = root.lexically_normal().string();
    if (dir.string().compare(0, r.size(), r) != 0)
      throw std::logic_error("latest resolved outside the checkpoint root: " + dir.string());
    runtime::read_checkpoint_manifest(dir.string(), model);  // as --resume goes on to do
  } catch (const Error&) {
  }
  runtime::read_checkpoint_manifest(root / "step-1", model);
  runtime::verify_checkpoint(root / "step-1", model);
}

// An llm.c .bin token file (runtime::TokenFile), as `parasol run --data FILE` reads it: the
// header is validated on opening, and every token filled must lie in [0, vocab).
void read_token_file(const std::string& bytes) {
  static const std::string path = (scratch("tokens") / "tokens.bin").string();
  write_file(path, bytes);
  constexpr int64_t kSeq = 8, kVocab = 512;
  const runtime::TokenFile file(path, kSeq, kVocab);
  std::vector<int32_t> tokens(kSeq), labels(kSeq);
  for (int64_t s = 0; s < 3; ++s) {
    file.fill(s, 0, kSeq, tokens.data(), labels.data());
    for (int64_t i = 0; i < kSeq; ++i)
      if (tokens[i] < 0 || tokens[i] >= kVocab || labels[i] < 0 || labels[i] >= kVocab)
        throw std::logic_error("a token outside the vocabulary was filled");
  }
}

// Another framework's job given as `--plan FILE` (interop::import_file: Megatron-LM arguments or
// launch script, a DeepSpeed launcher or ds_config.json, a torchtitan job TOML), with --gpus 8
// --model tiny --cluster given, as `parasol estimate --plan FILE ...` reads it; the plan an
// import returns must read as a plan. The input is the file `plan` of a scratch folder of this
// process (a launcher's config is looked up beside it).
void read_plan_import(const std::string& text) {
  static const fs::path path = scratch("import") / "plan";
  write_file(path, text);
  interop::ImportOptions o;
  o.gpus = 8;
  o.model = "tiny";
  o.cluster_given = true;
  if (std::optional<interop::ImportedJob> job = interop::import_file(path.string(), text, o)) {
    if (job->gpus < 0) throw std::logic_error("an import gave a negative GPU count");
    check_plan(plan_from_json(job->plan, "plan"));
    if (job->model) check_model(*job->model);
  }
}

// A PyTorch profiler (Kineto) Chrome JSON trace (traces::import_kineto), as `parasol trace
// import`, `compare --measured` and `calibrate --measured` read it.
void read_kineto_json(const std::string& text) {
  check_kineto_import(traces::import_kineto(parse_json(text, "kineto"), "kineto", 0));
}

}  // namespace

const std::vector<TargetReader>& target_readers() {
  static const std::vector<TargetReader> r = {
      {"model_json", true, read_model_json},
      {"hf_config", true, read_hf_config},
      {"cluster_json", true, read_cluster_json},
      {"plan_json", true, read_plan_json},
      {"trace_json", true, read_trace_json},
      {"profile_json", true, read_profile_json},
      {"accuracy_suite", true, read_accuracy_suite},
      {"checkpoint_manifest", true, read_checkpoint_manifest},
      {"token_file", false, read_token_file},
      {"plan_import", true, read_plan_import},
      {"kineto_json", true, read_kineto_json},
  };
  return r;
}

const TargetReader& target_reader(const std::string& target) {
  for (const TargetReader& r : target_readers())
    if (target == r.target) return r;
  throw std::logic_error("no fuzz target " + target);
}

}  // namespace parasol::fuzz
