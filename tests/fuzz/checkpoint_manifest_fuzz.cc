// Fuzz target: a checkpoint's manifest.json and its root's `latest` file, as `parasol run
// --resume DIR` reads them (resolve_checkpoint, read_checkpoint_manifest, verify_checkpoint),
// against the `tiny` model. The input is written to both files of a scratch directory of this
// process; `latest` must never resolve outside the checkpoint root.
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "core/model.h"
#include "runtime/checkpoint.h"
#include "tests/fuzz/fuzz_target.h"

namespace {

namespace fs = std::filesystem;

void write_file(const fs::path& path, const std::string& text) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
}

// <tmp>/parasol-fuzz-<pid>/{latest, step-1/manifest.json, manifest.json}
const fs::path& root() {
  static const fs::path r = [] {
    fs::path p = fs::temp_directory_path() / ("parasol-fuzz-ckpt-" + std::to_string(getpid()));
    fs::create_directories(p / "step-1");
    return p;
  }();
  return r;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace parasol;
  static const Model model = model_preset("tiny");
  return fuzz::run_reader(data, size, [](const std::string& text) {
    write_file(root() / "latest", text);
    write_file(root() / "step-1" / "manifest.json", text);
    write_file(root() / "manifest.json", text);
    try {
      const fs::path dir = fs::path(runtime::resolve_checkpoint(root())).lexically_normal();
      const std::string r = root().lexically_normal().string();
      if (dir.string().compare(0, r.size(), r) != 0)
        throw std::logic_error("latest resolved outside the checkpoint root: " + dir.string());
      runtime::read_checkpoint_manifest(dir.string(), model);  // as --resume goes on to do
    } catch (const Error&) {
    }
    runtime::read_checkpoint_manifest(root() / "step-1", model);
    runtime::verify_checkpoint(root() / "step-1", model);
  });
}
