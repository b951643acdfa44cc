// Strict, path-aware reading of JSON specs. Every accessor checks the type and the range of a
// field and throws parasol::Error naming the full path ("plan.tp: must be an integer >= 1").
#pragma once

#include <cstdint>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace parasol {

using Json = nlohmann::json;

// Parses JSON text; `what` names the source in errors (a file path or "model").
Json parse_json(const std::string& text, const std::string& what);
// Reads and parses a file; a missing file or malformed JSON is an Error naming the path.
Json read_json_file(const std::string& path);
// True when `arg` names an existing file (rather than a preset name).
bool is_existing_file(const std::string& arg);

// `value` (SI) in the unit a JSON key names (`unit`: 1e-6 for "_us", 1e9 for "_GBps"), rounded to
// 12 significant digits. What a writer writes with it reads back (times the unit) and writes
// again to the same number, so that a document's round trip is stable: a bare value / unit
// can drift by an ulp each time. (Not `si_value`: signal.h defines that name as a macro.)
double in_json_unit(double value, double unit);

// A view of one JSON object at a path. REQUIRES: the referenced Json outlives the reader.
class JsonReader {
 public:
  // Throws when `j` is not an object.
  JsonReader(const Json& j, std::string path);

  const std::string& path() const { return path_; }
  std::string field(const std::string& key) const;  // "path.key"
  bool has(const std::string& key) const;           // present and not null
  const Json& raw(const std::string& key) const;    // REQUIRES: has(key)

  // Integer in [min, max]; a fractional, string or out-of-range value is an Error.
  int64_t integer(const std::string& key, int64_t min, int64_t max) const;
  int64_t integer_or(const std::string& key, int64_t fallback, int64_t min, int64_t max) const;
  // Finite number in [min, max].
  double number(const std::string& key, double min, double max) const;
  double number_or(const std::string& key, double fallback, double min, double max) const;
  bool boolean(const std::string& key) const;
  bool boolean_or(const std::string& key, bool fallback) const;
  std::string string(const std::string& key) const;
  std::string string_or(const std::string& key, const std::string& fallback) const;
  // A string that must be one of `choices`.
  std::string choice(const std::string& key, std::initializer_list<const char*> choices,
                     const std::string& fallback) const;
  JsonReader object(const std::string& key) const;
  // Elements of an array field; each element's path is "path.key[i]".
  std::vector<std::pair<std::string, const Json*>> array(const std::string& key) const;
  // Rejects keys not in `allowed` (catches typos such as "tensor_parallel").
  void allow_only(std::initializer_list<const char*> allowed) const;

 private:
  const Json& j_;
  std::string path_;
};

}  // namespace parasol
