// Command-line settings of JSON documents (tools/json_settings.h).
#include "tools/json_settings.h"

#include <sstream>

#include "core/error.h"

namespace parasol::tools {

namespace {
// Splits "a/b/c" into its keys; an empty key anywhere is an error.
std::vector<std::string> split_path(const std::string& key, const std::string& field,
                                    const std::string& setting) {
  std::vector<std::string> parts;
  std::stringstream s(key);
  std::string part;
  while (std::getline(s, part, '/')) parts.push_back(part);
  if (parts.empty() || key.back() == '/') throw Error(field, "'" + setting + "': empty key");
  for (const std::string& p : parts)
    if (p.empty()) throw Error(field, "'" + setting + "': empty key");
  return parts;
}

bool is_index(const std::string& s) {
  return !s.empty() && s.find_first_not_of("0123456789") == std::string::npos;
}

// The node at path; with create, missing object keys are made (null) on the way.
Json* walk(Json& doc, const std::vector<std::string>& path, bool create, const std::string& field,
           const std::string& setting) {
  Json* node = &doc;
  for (const std::string& key : path) {
    if (node->is_array()) {
      if (!is_index(key) || std::stoul(key) >= node->size())
        throw Error(field, "'" + setting + "': '" + key + "' is not an index of an array of " +
                               std::to_string(node->size()));
      node = &(*node)[std::stoul(key)];
    } else if (node->is_object() || (create && node->is_null())) {
      if (!create && !node->contains(key))
        throw Error(field, "'" + setting + "': no key '" + key + "'");
      node = &(*node)[key];
    } else {
      throw Error(field, "'" + setting + "': '" + key + "' is below a " +
                             std::string(node->type_name()) + ", not an object or array");
    }
  }
  return node;
}

void scale_numbers(Json& node, double factor) {
  if (node.is_number()) {
    node = node.get<double>() * factor;
  } else if (node.is_structured()) {
    for (Json& child : node) scale_numbers(child, factor);
  }
}
}  // namespace

Json with_settings(Json doc, const std::vector<std::string>& settings, const std::string& field) {
  for (const std::string& setting : settings) {
    const auto eq = setting.find('=');
    if (eq == std::string::npos)
      throw Error(field, "'" + setting + "': expected KEY=VALUE or KEY*=FACTOR");
    const bool scale = eq > 0 && setting[eq - 1] == '*';
    const std::string key = setting.substr(0, scale ? eq - 1 : eq);
    const std::string value = setting.substr(eq + 1);
    const auto path = split_path(key, field, setting);
    if (scale) {
      Json factor = Json::parse(value, nullptr, false);
      if (factor.is_discarded() || !factor.is_number())
        throw Error(field, "'" + setting + "': factor '" + value + "' is not a number");
      scale_numbers(*walk(doc, path, false, field, setting), factor.get<double>());
    } else {
      Json parsed = Json::parse(value, nullptr, false);
      *walk(doc, path, true, field, setting) = parsed.is_discarded() ? Json(value) : parsed;
    }
  }
  return doc;
}

}  // namespace parasol::tools
