// parasol::Error: formats "field: reason".
#include "core/error.h"

namespace parasol {

namespace {
std::string format(const std::string& field, const std::string& reason) {
  return field.empty() ? reason : field + ": " + reason;
}
}  // namespace

Error::Error(std::string field, std::string reason)
    : std::runtime_error(format(field, reason)),
      field_(std::move(field)),
      reason_(std::move(reason)) {}

}  // namespace parasol
