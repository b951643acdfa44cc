// Implementation of the strict JSON reader: type and range checks with field paths.
#include "core/json_reader.h"

#include <sys/stat.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "core/error.h"

namespace parasol {

Json parse_json(const std::string& text, const std::string& what) {
  try {
    return Json::parse(text);
  } catch (const Json::exception& e) {  // parse_error, and out_of_range for numbers like 1e400
    std::string msg = e.what();
    auto pos = msg.find("parse error");
    if (pos == std::string::npos) pos = msg.find("number overflow");
    throw Error(what,
                "malformed JSON (" + (pos == std::string::npos ? msg : msg.substr(pos)) + ")");
  }
}

double in_json_unit(double value, double unit) {
  const double v = value / unit;
  if (!std::isfinite(v) || v == 0) return v;
  char text[32];
  std::snprintf(text, sizeof text, "%.12g", v);
  return std::strtod(text, nullptr);
}

bool is_existing_file(const std::string& arg) {
  struct stat st;
  return stat(arg.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

Json read_json_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw Error(path, "cannot open file");
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_json(ss.str(), path);
}

JsonReader::JsonReader(const Json& j, std::string path) : j_(j), path_(std::move(path)) {
  if (!j_.is_object())
    throw Error(path_, std::string("must be a JSON object, got ") + j_.type_name());
}

std::string JsonReader::field(const std::string& key) const {
  return path_.empty() ? key : path_ + "." + key;
}

bool JsonReader::has(const std::string& key) const {
  auto it = j_.find(key);
  return it != j_.end() && !it->is_null();
}

const Json& JsonReader::raw(const std::string& key) const {
  PARASOL_CHECK(has(key), field(key));
  return j_.at(key);
}

int64_t JsonReader::integer(const std::string& key, int64_t min, int64_t max) const {
  if (!has(key)) throw Error(field(key), "is required");
  const Json& v = j_.at(key);
  std::string range = " in [" + std::to_string(min) + ", " + std::to_string(max) + "]";
  if (v.is_number_unsigned()) {
    uint64_t u = v.get<uint64_t>();
    // JSON text reads non-negative integers (0 included) as unsigned: check min here too.
    if (u > static_cast<uint64_t>(max) || static_cast<int64_t>(u) < min)
      throw Error(field(key), std::to_string(u) + " is out of range" + range);
    return static_cast<int64_t>(u);
  }
  if (v.is_number_integer()) {
    int64_t i = v.get<int64_t>();
    if (i < min || i > max) throw Error(field(key), std::to_string(i) + " is out of range" + range);
    return i;
  }
  if (v.is_number_float()) {
    double d = v.get<double>();
    if (std::isfinite(d) && d == std::floor(d) && d >= static_cast<double>(min) &&
        d <= static_cast<double>(max))
      return static_cast<int64_t>(d);
    throw Error(field(key), "must be an integer" + range + ", got " + v.dump());
  }
  throw Error(field(key), std::string("must be an integer, got ") + v.type_name());
}

int64_t JsonReader::integer_or(const std::string& key, int64_t fallback, int64_t min,
                               int64_t max) const {
  return has(key) ? integer(key, min, max) : fallback;
}

double JsonReader::number(const std::string& key, double min, double max) const {
  if (!has(key)) throw Error(field(key), "is required");
  const Json& v = j_.at(key);
  if (!v.is_number())
    throw Error(field(key), std::string("must be a number, got ") + v.type_name());
  double d = v.get<double>();
  if (!std::isfinite(d) || d < min || d > max) {
    std::ostringstream os;
    os << v.dump() << " is out of range [" << min << ", " << max << "]";
    throw Error(field(key), os.str());
  }
  return d;
}

double JsonReader::number_or(const std::string& key, double fallback, double min,
                             double max) const {
  return has(key) ? number(key, min, max) : fallback;
}

bool JsonReader::boolean(const std::string& key) const {
  if (!has(key)) throw Error(field(key), "is required");
  const Json& v = j_.at(key);
  if (!v.is_boolean())
    throw Error(field(key), std::string("must be true or false, got ") + v.type_name());
  return v.get<bool>();
}

bool JsonReader::boolean_or(const std::string& key, bool fallback) const {
  return has(key) ? boolean(key) : fallback;
}

std::string JsonReader::string(const std::string& key) const {
  if (!has(key)) throw Error(field(key), "is required");
  const Json& v = j_.at(key);
  if (!v.is_string())
    throw Error(field(key), std::string("must be a string, got ") + v.type_name());
  return v.get<std::string>();
}

std::string JsonReader::string_or(const std::string& key, const std::string& fallback) const {
  return has(key) ? string(key) : fallback;
}

std::string JsonReader::choice(const std::string& key, std::initializer_list<const char*> choices,
                               const std::string& fallback) const {
  std::string s = has(key) ? string(key) : fallback;
  std::string list;
  for (const char* c : choices) {
    if (s == c) return s;
    list += (list.empty() ? "" : "|") + std::string(c);
  }
  throw Error(field(key), "'" + s + "' is not one of " + list);
}

JsonReader JsonReader::object(const std::string& key) const {
  if (!has(key)) throw Error(field(key), "is required");
  return JsonReader(j_.at(key), field(key));
}

std::vector<std::pair<std::string, const Json*>> JsonReader::array(const std::string& key) const {
  if (!has(key)) throw Error(field(key), "is required");
  const Json& v = j_.at(key);
  if (!v.is_array()) throw Error(field(key), std::string("must be an array, got ") + v.type_name());
  std::vector<std::pair<std::string, const Json*>> out;
  for (size_t i = 0; i < v.size(); ++i)
    out.emplace_back(field(key) + "[" + std::to_string(i) + "]", &v[i]);
  return out;
}

void JsonReader::allow_only(std::initializer_list<const char*> allowed) const {
  for (auto it = j_.begin(); it != j_.end(); ++it) {
    bool ok = false;
    for (const char* a : allowed) ok = ok || it.key() == a;
    if (!ok) throw Error(field(it.key()), "unknown field");
  }
}

}  // namespace parasol
