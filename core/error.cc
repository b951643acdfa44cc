// parasol's three error kinds: formatting, exit codes, and the PARASOL_CHECK failure path.
#include "core/error.h"

namespace parasol {

namespace {
std::string format(const std::string& field, const std::string& reason) {
  return field.empty() ? reason : field + ": " + reason;
}

// The path from the source root: "core/lower.cc" rather than the build machine's absolute path
// (PARASOL_SOURCE_ROOT, the checkout's absolute path, is defined for this file by CMake); a file
// outside the checkout keeps its path.
std::string source_path(const char* file) {
  const std::string f = file;
#ifdef PARASOL_SOURCE_ROOT
  const std::string root = PARASOL_SOURCE_ROOT "/";
  if (f.compare(0, root.size(), root) == 0) return f.substr(root.size());
#endif
  return f;
}
}  // namespace

Error::Error(std::string field, std::string reason, ErrorKind kind)
    : std::runtime_error(format(field, reason)),
      field_(std::move(field)),
      reason_(std::move(reason)),
      kind_(kind) {}

InternalError::InternalError(std::string where, std::string reason)
    : Error(std::move(where), std::move(reason), ErrorKind::kInternal) {}

SystemError::SystemError(std::string call, std::string reason)
    : Error(std::move(call), std::move(reason), ErrorKind::kSystem) {}

int exit_code(ErrorKind kind) { return kind == ErrorKind::kUser ? 2 : 1; }

std::string error_line(const Error& e) {
  switch (e.kind()) {
    case ErrorKind::kUser:
      return std::string("error: ") + e.what();
    case ErrorKind::kInternal:
      return std::string("internal error (this is a parasol bug; please report it): ") + e.what();
    case ErrorKind::kSystem:
      return std::string("system error: ") + e.what();
  }
  return e.what();
}

void check_failed(const char* condition, const std::string& message, const char* file, int line) {
  throw InternalError(
      source_path(file) + ":" + std::to_string(line),
      std::string("check `") + condition + "` failed" + (message.empty() ? "" : ": " + message));
}

}  // namespace parasol
