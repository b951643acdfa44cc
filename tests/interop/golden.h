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

}  // namespace parasol::interop
