// The deterministic half of fuzzing every JSON reader: each seed and regression of each fuzz
// target (the folders named on the command line), mutated where readers go wrong when they use a
// value before checking its type. Every value is replaced by a value of every JSON kind, every
// key seen at a position in any of the target's documents is inserted where it is missing, and
// every key is removed; a value that reads as every kind is one the reader does not look into,
// and is not swept below. Each mutant must read, or be refused with parasol::Error
// (target_readers.h); anything else fails with the mutation's path. libFuzzer finds what this
// sweep cannot reach; this sweep finds, every run and the same way, what libFuzzer reaches by
// chance (a "plan" key of the wrong kind in one run of an accuracy suite, issue 39).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/json_reader.h"
#include "tests/fuzz/target_readers.h"

namespace parasol::fuzz {
namespace {

namespace fs = std::filesystem;

// target -> folders of its seeds and regressions, from the command line (target=folder ...).
std::map<std::string, std::vector<fs::path>>& input_folders() {
  static std::map<std::string, std::vector<fs::path>> f;
  return f;
}

std::string read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

struct Document {
  std::string name;  // file, and the run it was cut to
  Json json;
};

// The documents of a target: its files that parse as JSON, an accuracy suite cut into one suite
// per run (a mutant then reads one run, not fifty).
std::vector<Document> documents(const std::string& target) {
  std::vector<Document> docs;
  std::vector<fs::path> files;
  for (const fs::path& dir : input_folders()[target])
    for (const auto& e : fs::recursive_directory_iterator(dir))
      if (e.is_regular_file() && e.path().extension() != ".md") files.push_back(e.path());
  std::sort(files.begin(), files.end());
  for (const fs::path& f : files) {
    Json j;
    try {
      j = parse_json(read_bytes(f), f.string());
    } catch (const Error&) {
      continue;  // not JSON: the replay runs it as it is
    }
    const std::string name = f.filename().string();
    const char* runs = j.is_object() && j.contains("points") ? "points" : "runs";
    if (target == "accuracy_suite" && j.is_object() && j.contains(runs) && j[runs].is_array()) {
      for (size_t i = 0; i < j[runs].size(); ++i) {
        Json one = j;
        one[runs] = Json::array({j[runs][i]});
        docs.push_back({name + "/" + runs + "/" + std::to_string(i), std::move(one)});
      }
    } else {
      docs.push_back({name, std::move(j)});
    }
  }
  return docs;
}

// A pointer's position: its array indices as "*" (/points/3/plan -> /points/*/plan).
std::string position(const Json::json_pointer& p) {
  std::string out;
  Json::json_pointer rest = p;
  std::vector<std::string> tokens;
  while (!rest.empty()) {
    tokens.push_back(rest.back());
    rest.pop_back();
  }
  for (auto it = tokens.rbegin(); it != tokens.rend(); ++it) {
    const bool index = !it->empty() && it->find_first_not_of("0123456789") == std::string::npos;
    out += "/" + (index ? std::string("*") : *it);
  }
  return out;
}

// Every pointer below (and not including) the root.
void pointers(const Json& j, const Json::json_pointer& at, std::vector<Json::json_pointer>& out) {
  if (j.is_object()) {
    for (auto it = j.begin(); it != j.end(); ++it) {
      out.push_back(at / it.key());
      pointers(it.value(), at / it.key(), out);
    }
  } else if (j.is_array()) {
    for (size_t i = 0; i < j.size(); ++i) {
      out.push_back(at / i);
      pointers(j[i], at / i, out);
    }
  }
}

// One value of each JSON kind, and the numbers and strings readers get wrong.
const std::vector<Json>& kinds() {
  static const std::vector<Json> v = {nullptr,
                                      false,
                                      0,
                                      -1,
                                      0.5,
                                      1e300,
                                      -1e300,
                                      "",
                                      "x",
                                      Json::array(),
                                      Json::array({nullptr}),
                                      Json::object(),
                                      Json::object({{"x", 1}})};
  return v;
}

// A smaller set for inserted keys (each key at each position it was seen at): one of each kind.
const std::vector<Json>& inserted_kinds() {
  static const std::vector<Json> v = {nullptr, -1, "x", Json::array({nullptr}),
                                      Json::object({{"x", 1}})};
  return v;
}

enum class Outcome { kRead, kRefused, kBug };

// Reads `j` with the target's reader: kRead, kRefused (parasol::Error), or kBug (any other
// exception: the test fails with `what`).
Outcome read(const TargetReader& reader, const Json& j, const std::string& what) {
  try {
    reader.read(j.dump());
  } catch (const Error&) {
    return Outcome::kRefused;
  } catch (const std::exception& e) {
    ADD_FAILURE() << reader.target << ": " << what
                  << ": threw a non-parasol exception: " << e.what();
    return Outcome::kBug;
  }
  return Outcome::kRead;
}

// Whether `p` lies below one of `ignored` (or is one).
bool below(const std::string& pos, const std::set<std::string>& ignored) {
  for (const std::string& i : ignored)
    if (pos.compare(0, i.size(), i) == 0 && (pos.size() == i.size() || pos[i.size()] == '/'))
      return true;
  return false;
}

class StructureSweep : public ::testing::TestWithParam<std::string> {};

TEST_P(StructureSweep, EveryMutantReadsOrIsRefused) {
  const TargetReader& reader = target_reader(GetParam());
  ASSERT_TRUE(reader.json);
  const std::vector<Document> docs = documents(GetParam());
  ASSERT_FALSE(docs.empty()) << "no JSON seed for " << GetParam();
  // The keys each object position holds in any document of the target.
  std::map<std::string, std::set<std::string>> keys_at;
  for (const Document& d : docs) {
    std::vector<Json::json_pointer> ps{Json::json_pointer()};
    pointers(d.json, Json::json_pointer(), ps);
    for (const auto& p : ps)
      if (d.json.at(p).is_object())
        for (auto it = d.json.at(p).begin(); it != d.json.at(p).end(); ++it)
          keys_at[position(p)].insert(it.key());
  }
  // Each (position, key, kind) is tried on the first document that has it. A position whose
  // value reads as every kind (an annotation such as a published run's "raw" figures) is one the
  // reader does not look into: what lies below it is not swept.
  std::set<std::string> tried, ignored;
  auto first = [&](const std::string& what) { return tried.insert(what).second; };
  int mutants = 0, failures = 0;
  auto run = [&](const Json& j, const std::string& what) {
    ++mutants;
    const Outcome o = read(reader, j, what);
    if (o == Outcome::kBug && ++failures >= 20) ADD_FAILURE() << "stopped after 20 failures";
    return o;
  };
  for (const Document& d : docs) {
    for (size_t k = 0; k < kinds().size(); ++k)
      if (first("root " + std::to_string(k)))
        run(kinds()[k], d.name + ": root = " + kinds()[k].dump());
    std::vector<Json::json_pointer> ps;
    pointers(d.json, Json::json_pointer(), ps);
    std::vector<Json::json_pointer> objects{Json::json_pointer()};
    for (const auto& p : ps) {
      if (failures >= 20) return;
      const std::string pos = position(p);
      if (below(pos, ignored)) continue;
      int read_as = 0, tries = 0;
      for (size_t k = 0; k < kinds().size(); ++k) {
        if (!first("set " + pos + " " + std::to_string(k))) continue;
        Json j = d.json;
        j[p] = kinds()[k];
        ++tries;
        if (run(j, d.name + ": " + p.to_string() + " = " + kinds()[k].dump()) == Outcome::kRead)
          ++read_as;
      }
      if (tries == static_cast<int>(kinds().size()) && read_as == tries) ignored.insert(pos);
      if (d.json.at(p.parent_pointer()).is_object() && first("erase " + pos)) {
        Json j = d.json;
        j.at(p.parent_pointer()).erase(p.back());
        run(j, d.name + ": " + p.to_string() + " removed");
      }
      if (d.json.at(p).is_object() && !below(pos, ignored)) objects.push_back(p);
    }
    for (const auto& o : objects) {
      const std::string pos = position(o);
      for (const std::string& key : keys_at[pos]) {
        if (d.json.at(o).contains(key) || below(pos + "/" + key, ignored)) continue;
        for (size_t k = 0; k < inserted_kinds().size(); ++k) {
          if (!first("insert " + pos + "/" + key + " " + std::to_string(k))) continue;
          Json j = d.json;
          j.at(o)[key] = inserted_kinds()[k];
          run(j, d.name + ": " + (o / key).to_string() + " = " + inserted_kinds()[k].dump() +
                     " (inserted)");
        }
      }
    }
  }
  // Every document has at least one field: each position was tried with every kind.
  EXPECT_GE(mutants, static_cast<int>(kinds().size()) * 2) << "too few mutants to mean anything";
  std::printf("%s: %d mutants of %zu documents\n", reader.target, mutants, docs.size());
}

std::vector<std::string> json_targets() {
  std::vector<std::string> t;
  for (const TargetReader& r : target_readers())
    if (r.json) t.push_back(r.target);
  return t;
}

INSTANTIATE_TEST_SUITE_P(Targets, StructureSweep, ::testing::ValuesIn(json_targets()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace parasol::fuzz

// Arguments after gtest's own: target=folder, once per seed or regression folder.
int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const size_t eq = arg.find('=');
    if (eq == std::string::npos) {
      std::fprintf(stderr, "structure_sweep_test: expected target=folder, got %s\n", argv[i]);
      return 2;
    }
    parasol::fuzz::input_folders()[arg.substr(0, eq)].push_back(arg.substr(eq + 1));
  }
  return RUN_ALL_TESTS();
}
