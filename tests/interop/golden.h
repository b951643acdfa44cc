// Golden files of the exports: tests/data/export/<framework>/<case>/<file>. After an intended
// change of an export, PARASOL_UPDATE_GOLDEN=1 rewrites them (then review the diff before
// committing).
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/cluster.h"
#include "core/error.h"
#include "core/plan.h"
#include "interop/interop.h"

namespace parasol::interop {

// The file of `e` called `name`. Throws std::runtime_error when there is none.
inline const ExportedFile& file_named(const Export& e, const std::string& name) {
  for (const auto& f : e.files)
    if (f.name == name) return f;
  throw std::runtime_error("no file " + name);
}

// Compares every file of `e` with tests/data/export/<framework>/<name>/, or rewrites them when
// PARASOL_UPDATE_GOLDEN=1.
inline void expect_golden(const Export& e, const std::string& framework, const std::string& name) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(PARASOL_TEST_DATA_DIR) / "export" / framework / name;
  const char* update = std::getenv("PARASOL_UPDATE_GOLDEN");
  for (const auto& f : e.files) {
    const fs::path path = dir / f.name;
    if (update && std::string(update) == "1") {
      fs::create_directories(dir);
      std::ofstream(path, std::ios::binary) << f.text;
      continue;
    }
    std::ifstream in(path, std::ios::binary);
    ASSERT_TRUE(in) << path << " is missing; run with PARASOL_UPDATE_GOLDEN=1";
    std::stringstream want;
    want << in.rdbuf();
    EXPECT_EQ(f.text, want.str()) << "golden file " << path;
  }
}

// Writes `e`'s files into a fresh folder under the system's temporary directory named `name`
// (as `parasol export -o` does) and returns the folder.
inline std::filesystem::path write_export(const Export& e, const std::string& name) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("parasol_interop_test_" + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  for (const auto& f : e.files) std::ofstream(dir / f.name, std::ios::binary) << f.text;
  return dir;
}

// The text of a file.
inline std::string read_file_text(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// A plan from its JSON text.
inline Plan plan_of(const std::string& json) { return plan_from_json(parse_json(json, "plan")); }

// A plan (on `gpus` GPUs of dgx-h100) that parasol runs and the framework refuses, naming `field`.
struct Refusal {
  const char* model;
  int gpus;
  const char* plan;
  const char* field;
};

// Each refusal's plan validates, and `export_fn(model, cluster, plan)` throws an Error naming its
// field.
template <class ExportFn>
void expect_refusals(ExportFn export_fn, const std::vector<Refusal>& refusals) {
  for (const Refusal& r : refusals) {
    SCOPED_TRACE(r.plan);
    const Model m = model_preset(r.model);
    const Cluster cl = cluster_preset("dgx-h100", r.gpus);
    const Plan p = plan_of(r.plan);
    ASSERT_NO_THROW(validate(p, m, cl));  // parasol runs it; only the framework cannot
    try {
      export_fn(m, cl, p);
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.field(), r.field) << e.what();
    }
  }
}

}  // namespace parasol::interop
