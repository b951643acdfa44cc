// Fuzzes core/ JSON readers: malformed input must give a valid object or parasol::Error only.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/cluster.h"
#include "core/error.h"
#include "core/json_reader.h"
#include "core/model.h"
#include "core/plan.h"
#include "tests/fuzz/reader_checks.h"

namespace parasol {
namespace {

const std::string kDataDir = PARASOL_TEST_DATA_DIR;

// --- The documents and their readers -------------------------------------------------------------

// A reader parses a document and, when it succeeds, checks the invariants of the result.
struct Reader {
  std::string name;
  std::function<void(const Json&)> read;
};

using fuzz::check_cluster;
using fuzz::check_model;
using fuzz::check_plan;

const std::vector<Reader>& readers() {
  static const std::vector<Reader> r = {
      {"model", [](const Json& j) { check_model(model_from_json(j)); }},
      {"hf", [](const Json& j) { check_model(model_from_hf_config(j)); }},
      {"cluster", [](const Json& j) { check_cluster(cluster_from_json(j)); }},
      {"plan", [](const Json& j) { check_plan(plan_from_json(j)); }},
  };
  return r;
}

const Reader& reader(const std::string& name) {
  for (const Reader& r : readers())
    if (r.name == name) return r;
  throw std::logic_error("no reader " + name);
}

struct Doc {
  std::string name;
  std::string reader;
  Json json;
};

// The explicit-graph seed of the cluster fuzz target (one document, two uses).
Json explicit_cluster() {
  return read_json_file(kDataDir + "/../fuzz/corpus/cluster_json/explicit.json");
}

// Valid documents covering every field each reader accepts.
const std::vector<Doc>& docs() {
  static const std::vector<Doc> d = [] {
    std::vector<Doc> v;
    v.push_back({"model-llama", "model", model_to_json(model_preset("llama3-8b"))});
    v.push_back({"model-gpt2", "model", model_to_json(model_preset("gpt2-124m"))});
    v.push_back({"model-moe", "model", model_to_json(model_preset("tiny-moe"))});
    v.push_back({"model-minimal", "model",
                 Json::parse(R"({"layers": 2, "hidden": 64, "heads": 4, "vocab": 512,
                                 "seq": 64})")});
    v.push_back({"hf-llama3", "hf", read_json_file(kDataDir + "/hf/llama3_8b_config.json")});
    v.push_back({"hf-gpt2", "hf", read_json_file(kDataDir + "/hf/gpt2_config.json")});
    v.push_back({"hf-mixtral", "hf", read_json_file(kDataDir + "/hf/mixtral_config.json")});
    v.push_back(
        {"cluster-preset", "cluster", Json::parse(R"({"preset": "dgx-a100-80g", "gpus": 16})")});
    v.push_back({"cluster-rail", "cluster", Json::parse(R"({
        "generator": "rail", "name": "r", "gpus": 16, "device": "A100-80G",
        "gpus_per_server": 8, "nvlink_GBps": 300, "pcie_GBps": 32, "nics_per_server": 4,
        "nic_GBps": 25, "host_memory_GiB": 1024, "servers_per_leaf": 1,
        "oversubscription": 2})")});
    v.push_back({"cluster-fat-tree", "cluster", Json::parse(R"({
        "generator": "fat-tree", "gpus": 8, "gpus_per_server": 4, "nic_GBps": 50})")});
    v.push_back({"cluster-torus", "cluster", Json::parse(R"({
        "generator": "torus", "name": "t", "dims": [2, 2, 2], "gpus": 8,
        "device": "H100-SXM", "link_GBps": 100, "latency_us": 1})")});
    v.push_back({"cluster-explicit", "cluster", explicit_cluster()});
    v.push_back({"plan-full", "plan", Json::parse(R"({
        "tp": 2, "pp": 2, "dp": 2, "cp": 1, "ep": 2, "sp": true, "vpp": 1, "zero": 1,
        "mbs": 1, "gbs": 16, "seq": 64, "schedule": "1f1b", "recompute": "full",
        "recompute_layers": 1, "offload": ["optimizer", "activations"], "precision": "bf16",
        "flash_attention": true, "overlap_grad_reduce": false, "overlap_param_gather": true,
        "rank_order": "tp-cp-ep-dp-pp", "model": "tiny-moe", "cluster": "dgx-h100",
        "gpus": 8})")});
    v.push_back({"plan-interleaved", "plan", Json::parse(R"({
        "tp": 4, "pp": 2, "vpp": 2, "schedule": "interleaved", "gbs": 4, "offload": "params",
        "recompute": "selective"})")});
    return v;
  }();
  return d;
}

// Fields of the HF configs that the importer reads (the others are ignored by design).
const std::set<std::string> kHfReadFields = {"hidden_size",
                                             "num_hidden_layers",
                                             "num_attention_heads",
                                             "num_key_value_heads",
                                             "intermediate_size",
                                             "vocab_size",
                                             "max_position_embeddings",
                                             "hidden_act",
                                             "tie_word_embeddings",
                                             "attention_bias",
                                             "num_local_experts",
                                             "num_experts_per_tok",
                                             "model_type",
                                             "n_embd",
                                             "n_layer",
                                             "n_head",
                                             "n_positions"};

// --- Outcome checks ------------------------------------------------------------------------------

// Printable form of a document for failure messages (nlohmann's dump recurses: deep documents
// are not printed).
std::string show(const Json& j, bool printable) {
  return printable ? j.dump(-1, ' ', false, Json::error_handler_t::replace) : "(deeply nested)";
}

// Runs the reader: true when it parsed, false on parasol::Error; anything else fails the test.
bool ParsesOrThrowsError(const Reader& r, const Json& j, const std::string& what,
                         bool printable = true) {
  try {
    r.read(j);
    return true;
  } catch (const Error&) {
    return false;
  } catch (const std::exception& e) {
    ADD_FAILURE() << r.name << " threw a non-parasol exception on " << what << ": " << e.what()
                  << "\n  doc: " << show(j, printable);
    return false;
  } catch (...) {
    ADD_FAILURE() << r.name << " threw a non-exception on " << what;
    return false;
  }
}

// Rejects `j`, and its text form too (text reads non-negative integers as unsigned, which a
// document built in code does not).
// `printable`: false for deeply nested documents, which are neither printed nor dumped.
void ExpectRejected(const Reader& r, const Json& j, const std::string& what,
                    bool printable = true) {
  EXPECT_FALSE(ParsesOrThrowsError(r, j, what, printable))
      << r.name << " accepted " << what << "\n  doc: " << show(j, printable);
  if (!printable) return;
  const std::string text = j.dump();
  Json reparsed;
  try {
    reparsed = parse_json(text, r.name);
  } catch (const Error& e) {
    ADD_FAILURE() << "parse_json rejected the dump of a JSON value: " << e.what();
    return;
  }
  EXPECT_FALSE(ParsesOrThrowsError(r, reparsed, what + " as text"))
      << r.name << " accepted " << what << " as text\n  doc: " << text;
}

TEST(JsonFuzz, ValidDocumentsParse) {
  for (const Doc& d : docs()) {
    SCOPED_TRACE(d.name);
    EXPECT_TRUE(ParsesOrThrowsError(reader(d.reader), d.json, "the valid document"));
    EXPECT_TRUE(ParsesOrThrowsError(reader(d.reader), parse_json(d.json.dump(2), d.name),
                                    "the valid document as text"));
  }
}

// --- Text ----------------------------------------------------------------------------------------

TEST(JsonFuzz, EveryPrefixOfAValidDocumentIsAnError) {
  for (const Doc& d : docs()) {
    SCOPED_TRACE(d.name);
    for (const std::string& text : {d.json.dump(), d.json.dump(2)}) {
      for (size_t n = 0; n < text.size(); ++n)
        EXPECT_THROW(parse_json(text.substr(0, n), d.name), Error) << text.substr(0, n);
    }
  }
}

// A string literal with embedded NULs, all of it.
template <size_t N>
std::string with_nul(const char (&s)[N]) {
  return std::string(s, N - 1);
}

TEST(JsonFuzz, MalformedTextIsAnError) {
  const std::vector<std::string> texts = {
      "",
      " ",
      "{",
      "}",
      "{\"layers\": }",
      "{\"layers\": 2,}",
      "{\"layers\": 2 \"hidden\": 3}",
      "{'layers': 2}",
      "{layers: 2}",
      "{\"layers\": NaN}",
      "{\"layers\": nan}",
      "{\"layers\": Infinity}",
      "{\"layers\": -Infinity}",
      "{\"layers\": inf}",
      "{\"layers\": 0x10}",
      "{\"layers\": 01}",
      "{\"layers\": 1.}",
      "{\"layers\": .5}",
      "{\"layers\": +1}",
      "{\"layers\": 1e}",
      "{\"layers\": --1}",
      "{\"layers\": 1e400}",
      "{\"layers\": -1e400}",
      "{\"layers\": 1e99999999999999999999}",
      "[1e309]",
      "{\"layers\": 2} // comment",
      "{\"layers\": 2} {\"layers\": 3}",
      "{\"layers\": \"\\x41\"}",
      "{\"layers\": \"\\ud800\"}",
      "{\"layers\": \"\xff\xfe\"}",
      "{\"layers\": \"\xc0\xaf\"}",
      with_nul("{\"layers\": \"a\0b\"}"),
      with_nul("{\"layers\"\0: 2}"),
      "{\"layers\": tru}",
      "{\"layers\": nul}",
      "{\"layers\": True}",
      "\"unterminated",
      "{\"a\": [1, 2}",
      "{\"a\": {\"b\": 1]}",
      std::string(100000, '['),
      std::string(100000, '{'),
      "{\"a\":" + std::string(50000, '[') + std::string(49999, ']') + "}",
  };
  for (const std::string& t : texts) {
    EXPECT_THROW(parse_json(t, "model"), Error) << t.substr(0, 80);
    try {
      parse_json(t, "model");
    } catch (const Error& e) {
      EXPECT_EQ(e.field(), "model");
    } catch (...) {
    }
  }
}

TEST(JsonFuzz, HugeNumbersInTextReachTheReadersAsErrors) {
  // Numbers that parse (as uint64, int64 or double) but fit no field.
  for (const char* v :
       {"1e308", "-1e308", "18446744073709551615", "18446744073709551616", "-9223372036854775808",
        "-9223372036854775809", "4.9e-324", "2147483648", "4294967297"}) {
    SCOPED_TRACE(v);
    const std::string model = std::string(R"({"layers": )") + v +
                              R"(, "hidden": 64, "heads": 4, "vocab": 512, "seq": 64})";
    EXPECT_THROW(model_from_json(parse_json(model, "model")), Error);
    EXPECT_THROW(plan_from_json(parse_json(std::string(R"({"tp": )") + v + "}", "plan")), Error);
    EXPECT_THROW(cluster_from_json(parse_json(
                     std::string(R"({"preset": "dgx-h100", "gpus": )") + v + "}", "cluster")),
                 Error);
  }
}

// [[[...]]] or {"a": {"a": ...}}, built without recursion (nlohmann's copy is recursive, its
// destructor is not).
Json deep(bool array, int depth) {
  Json j = array ? Json::array() : Json::object();
  for (int i = 0; i < depth; ++i) {
    Json outer = array ? Json::array() : Json::object();
    if (array) {
      outer.push_back(std::move(j));
    } else {
      outer["a"] = std::move(j);
    }
    j = std::move(outer);
  }
  return j;
}

TEST(JsonFuzz, DeeplyNestedValuesAreErrors) {
  for (const Reader& r : readers()) {
    SCOPED_TRACE(r.name);
    EXPECT_THROW(r.read(deep(true, 100000)), Error);
    EXPECT_THROW(r.read(deep(false, 100000)), Error);  // "a" is no field of any reader
  }
  for (const Doc& d : docs()) {
    for (auto it = d.json.begin(); it != d.json.end(); ++it) {
      if (d.reader == "hf" && !kHfReadFields.count(it.key())) continue;
      for (bool array : {true, false}) {
        Json j = d.json;
        j[it.key()] = deep(array, 10000);
        ExpectRejected(reader(d.reader), j, d.name + "." + it.key() + " = deep nesting", false);
      }
    }
  }
  // As text, too: parse_json must not blow the stack either.
  std::string text = "{\"layers\": " + std::string(100000, '[') + std::string(100000, ']') + "}";
  EXPECT_THROW(model_from_json(parse_json(text, "model")), Error);
}

// --- Every field, every wrong value
// ---------------------------------------------------------------

enum class Kind { kNull, kBool, kNumber, kString, kArray, kObject };

Kind kind_of(const Json& j) {
  if (j.is_null()) return Kind::kNull;
  if (j.is_boolean()) return Kind::kBool;
  if (j.is_number()) return Kind::kNumber;
  if (j.is_string()) return Kind::kString;
  if (j.is_array()) return Kind::kArray;
  return Kind::kObject;
}

// Every JSON pointer below the root of `j`.
void collect_pointers(const Json& j, const Json::json_pointer& at,
                      std::vector<Json::json_pointer>& out) {
  if (j.is_object()) {
    for (auto it = j.begin(); it != j.end(); ++it) {
      out.push_back(at / it.key());
      collect_pointers(it.value(), at / it.key(), out);
    }
  } else if (j.is_array()) {
    for (size_t i = 0; i < j.size(); ++i) {
      out.push_back(at / i);
      collect_pointers(j[i], at / i, out);
    }
  }
}

// The pointers whose values a reader checks.
std::vector<Json::json_pointer> checked_pointers(const Doc& d) {
  std::vector<Json::json_pointer> all;
  collect_pointers(d.json, Json::json_pointer(), all);
  if (d.reader != "hf") return all;
  std::vector<Json::json_pointer> read;
  for (const auto& p : all)
    if (kHfReadFields.count(p.to_string().substr(1))) read.push_back(p);
  return read;
}

// Values of each kind, none of them valid where a value of another kind is expected.
const std::vector<Json>& wrong_values() {
  static const std::vector<Json> v = {
      true,
      false,
      1.5,
      -0.5,
      "",
      "NaN",
      "nan",
      "Infinity",
      "-inf",
      "1e999",
      "0x10",
      "8",
      Json::array({1, "x"}),
      Json::array({Json::array({nullptr})}),
      Json::object({{"x", 1}}),
      Json::object({{"", Json::array()}}),
  };
  return v;
}

// The kinds a field accepts: its valid value's kind, and both forms of plan.offload.
bool accepts(const Json::json_pointer& ptr, Kind original, Kind k) {
  if (ptr.to_string() == "/offload") return k == Kind::kString || k == Kind::kArray;
  return k == original;
}

TEST(JsonFuzz, WrongTypeForEveryField) {
  int cases = 0;
  for (const Doc& d : docs()) {
    for (const auto& ptr : checked_pointers(d)) {
      const Kind original = kind_of(d.json.at(ptr));
      for (const Json& bad : wrong_values()) {
        if (accepts(ptr, original, kind_of(bad))) continue;
        Json j = d.json;
        j[ptr] = bad;
        ExpectRejected(reader(d.reader), j, d.name + ptr.to_string() + " = " + bad.dump());
        ++cases;
      }
    }
  }
  EXPECT_GT(cases, 1000);
}

// Fields whose value is a real number rather than an integer count.
bool real_valued(const std::string& key) {
  for (const char* suffix : {"_GBps", "_us", "_GiB"})
    if (key.ends_with(suffix)) return true;
  return key == "oversubscription";
}

TEST(JsonFuzz, HugeFractionalAndNegativeNumbersInEveryNumericField) {
  const std::vector<Json> huge = {1e308,
                                  -1e308,
                                  std::numeric_limits<uint64_t>::max(),
                                  std::numeric_limits<int64_t>::min(),
                                  std::numeric_limits<int64_t>::max(),
                                  9.3e18,
                                  std::numeric_limits<double>::lowest(),
                                  -1};
  int cases = 0;
  for (const Doc& d : docs()) {
    for (const auto& ptr : checked_pointers(d)) {
      if (!d.json.at(ptr).is_number()) continue;
      const std::string key = ptr.back();
      std::vector<Json> values = huge;
      // -1 is the documented "unset" of these two fields (server: a fabric switch); -2 is never
      // valid.
      if (key == "recompute_layers" || key == "server") values.back() = -2;
      // Counts must be integers.
      if (!real_valued(key) && d.json.at(ptr).is_number_integer()) values.push_back(2.5);
      for (const Json& bad : values) {
        Json j = d.json;
        j[ptr] = bad;
        ExpectRejected(reader(d.reader), j, d.name + ptr.to_string() + " = " + bad.dump());
        ++cases;
      }
    }
  }
  EXPECT_GT(cases, 300);
}

TEST(JsonFuzz, NegativeSizes) {
  // The size fields of each reader, one at a time, set to -1 and to 0.
  struct Case {
    const char* doc;
    std::vector<std::string> keys;
  };
  const std::vector<Case> cases = {
      {"model-llama",
       {"/layers", "/hidden", "/heads", "/kv_heads", "/head_dim", "/ffn", "/vocab", "/seq_len"}},
      {"model-moe", {"/moe/top_k", "/moe/expert_ffn", "/moe/every"}},
      {"hf-llama3",
       {"/hidden_size", "/num_hidden_layers", "/num_attention_heads", "/num_key_value_heads",
        "/intermediate_size", "/vocab_size", "/max_position_embeddings"}},
      {"hf-gpt2", {"/n_embd", "/n_layer", "/n_head", "/n_positions", "/vocab_size"}},
      {"hf-mixtral", {"/num_local_experts", "/num_experts_per_tok"}},
      {"cluster-preset", {"/gpus"}},
      {"cluster-rail",
       {"/gpus", "/gpus_per_server", "/pcie_GBps", "/nics_per_server", "/nic_GBps",
        "/servers_per_leaf", "/oversubscription"}},
      {"cluster-torus", {"/dims/0", "/dims/2", "/link_GBps", "/gpus"}},
      {"cluster-explicit", {"/links/0/bw_GBps", "/links/11/bw_GBps"}},
      {"plan-full", {"/tp", "/pp", "/dp", "/cp", "/ep", "/vpp", "/mbs", "/gbs", "/seq", "/gpus"}},
  };
  for (const Case& c : cases) {
    const Doc* doc = nullptr;
    for (const Doc& d : docs())
      if (d.name == c.doc) doc = &d;
    ASSERT_NE(doc, nullptr) << c.doc;
    for (const std::string& key : c.keys) {
      for (int v : {-1, 0, -1000000}) {
        Json j = doc->json;
        Json::json_pointer ptr(key);
        ASSERT_TRUE(j.contains(ptr)) << c.doc << key;
        j[ptr] = v;
        ExpectRejected(reader(doc->reader), j, c.doc + key + " = " + std::to_string(v));
      }
    }
  }
  // Negative memory and latency (0 is allowed for both).
  Json j = explicit_cluster();
  j["nodes"][4]["memory_GiB"] = -1;
  ExpectRejected(reader("cluster"), j, "memory_GiB = -1");
  j = explicit_cluster();
  j["links"][0]["latency_us"] = -1e-9;
  ExpectRejected(reader("cluster"), j, "latency_us = -1e-9");
}

TEST(JsonFuzz, NonObjectDocuments) {
  for (const Json& j : {Json(nullptr), Json(1), Json("model"), Json::array(), Json(true),
                        Json::array({Json::object()})}) {
    for (const Reader& r : readers()) EXPECT_THROW(r.read(j), Error) << r.name << j.dump();
  }
}

// --- Seeded random mutations
// -----------------------------------------------------------------------

class Mutator {
 public:
  explicit Mutator(uint32_t seed) : rng_(seed) {}

  int uniform(int n) { return std::uniform_int_distribution<int>(0, n - 1)(rng_); }

  // A random JSON value of any kind (depth-limited).
  Json random_value(int depth = 0) {
    switch (uniform(depth < 3 ? 6 : 4)) {
      case 0:
        return nullptr;
      case 1:
        return uniform(2) == 1;
      case 2:
        return random_number();
      case 3:
        return random_string();
      case 4: {
        Json a = Json::array();
        for (int i = uniform(4); i > 0; --i) a.push_back(random_value(depth + 1));
        return a;
      }
      default: {
        Json o = Json::object();
        for (int i = uniform(4); i > 0; --i) o[random_string()] = random_value(depth + 1);
        return o;
      }
    }
  }

  // A random value whose kind differs from `original`'s (null counts as a kind: absent).
  Json random_value_of_other_kind(const Json& original) {
    for (;;) {
      Json v = random_value();
      if (kind_of(v) != kind_of(original)) return v;
    }
  }

  // Applies one random mutation somewhere in `doc`.
  void mutate(Json& doc) {
    std::vector<Json::json_pointer> ptrs;
    collect_pointers(doc, Json::json_pointer(), ptrs);
    if (ptrs.empty()) {
      doc = random_value();
      return;
    }
    const Json::json_pointer ptr = ptrs[uniform(static_cast<int>(ptrs.size()))];
    Json& parent = doc[ptr.parent_pointer()];
    switch (uniform(5)) {
      case 0:
      case 1:  // replace the value with one of another kind
        doc[ptr] = random_value_of_other_kind(doc[ptr]);
        break;
      case 2:  // delete the key or the array element
        if (parent.is_object()) {
          parent.erase(ptr.back());
        } else {
          parent.erase(static_cast<size_t>(std::stoul(ptr.back())));
        }
        break;
      case 3:  // duplicate an array element, or add an unknown key
        if (parent.is_array()) {
          Json copy = doc[ptr];
          parent.push_back(std::move(copy));
        } else {
          parent[random_string()] = random_value();
        }
        break;
      default:  // swap with the value of another pointer
      {
        const Json::json_pointer other = ptrs[uniform(static_cast<int>(ptrs.size()))];
        if (other.to_string().starts_with(ptr.to_string()) ||
            ptr.to_string().starts_with(other.to_string()))
          break;  // one contains the other
        std::swap(doc[ptr], doc[other]);
        break;
      }
    }
  }

 private:
  Json random_number() {
    static const std::vector<Json> numbers = {0,
                                              1,
                                              2,
                                              3,
                                              4,
                                              7,
                                              8,
                                              16,
                                              -1,
                                              -2,
                                              0.0,
                                              0.5,
                                              2.0,
                                              -0.0,
                                              1e-300,
                                              1e308,
                                              -1e308,
                                              std::numeric_limits<uint64_t>::max(),
                                              std::numeric_limits<int64_t>::min(),
                                              std::numeric_limits<int64_t>::max(),
                                              2147483648.0,
                                              9.3e18};
    return numbers[uniform(static_cast<int>(numbers.size()))];
  }

  std::string random_string() {
    static const std::vector<std::string> strings = {
        "",      "NaN",           "-inf",   "gpu",     "switch",      "nvlink", "A100-80G",
        "tp",    "layers",        "hidden", "rmsnorm", "none",        "full",   "g0",
        "ib",    "dgx-h100",      "torus",  "rail",    "interleaved", "x",      "\u00e9",
        "1e999", "tp-cp-ep-dp-pp"};
    return strings[uniform(static_cast<int>(strings.size()))];
  }

  std::mt19937 rng_;
};

TEST(JsonFuzz, SeededRandomMutations) {
  constexpr int kMutationsPerDoc = 2000;
  int parsed = 0, rejected = 0;
  // Deterministic by default; PARASOL_FUZZ_SEED=N explores other sequences.
  const char* seed = std::getenv("PARASOL_FUZZ_SEED");
  Mutator m(seed ? static_cast<uint32_t>(std::stoul(seed)) : 20240531u);
  for (const Doc& d : docs()) {
    const Reader& r = reader(d.reader);
    for (int i = 0; i < kMutationsPerDoc; ++i) {
      Json j = d.json;
      const int rounds = 1 + m.uniform(3);
      for (int k = 0; k < rounds; ++k) m.mutate(j);
      const std::string what = d.name + " mutation " + std::to_string(i);
      if (ParsesOrThrowsError(r, j, what)) {
        ++parsed;
      } else {
        ++rejected;
      }
      // The text form of the mutant goes through parse_json the same way.
      const std::string text = j.dump();
      try {
        ParsesOrThrowsError(r, parse_json(text, d.name), what + " as text");
      } catch (const Error&) {
        ADD_FAILURE() << "parse_json rejected the text of a JSON value: " << text;
      }
      if (::testing::Test::HasFailure()) return;  // one reported failure is enough
    }
  }
  // Both outcomes are common: the mutations neither always nor never break a document.
  const int total = parsed + rejected;
  EXPECT_GT(parsed, total / 20);
  EXPECT_GT(rejected, total / 20);
  std::cout << "[ mutants  ] " << parsed << " parsed, " << rejected << " rejected\n";
}

}  // namespace
}  // namespace parasol
