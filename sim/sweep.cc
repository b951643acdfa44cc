// The runner of a sweep's points (sim/sweep.h): this process's share on threads, the journal
// that lets a sweep resume, and the reading of a journal or document back.
#include "sim/sweep.h"

#include <algorithm>
#include <atomic>
#include <fstream>
#include <map>
#include <mutex>
#include <numeric>
#include <sstream>
#include <thread>

#include "core/error.h"

namespace parasol::sim {

std::vector<Json> run_sweep_points(const Json& header, int64_t n,
                                   const std::function<int64_t(int64_t)>& size_of,
                                   const std::function<Json(int64_t, int)>& run_point,
                                   const SweepRunOptions& o, int64_t* resumed) {
  std::map<int64_t, Json> done;
  bool journal_has_header = false;
  if (o.resume) {
    if (o.journal.empty()) throw Error("--resume", "needs --out, the journal to resume");
    std::ifstream in(o.journal);
    if (in) {
      std::string line;
      std::vector<std::string> kept;
      while (std::getline(in, line)) {
        Json j;
        try {
          j = Json::parse(line);
        } catch (const Json::parse_error&) {
          break;  // a torn last line: that point runs again
        }
        if (kept.empty()) {
          if (!j.is_object() || !j.contains("sweep") || j["sweep"] != header)
            throw Error("--resume", "'" + o.journal + "' is the journal of another sweep");
        } else if (j.is_object() && j.contains("index") && j["index"].is_number_integer() &&
                   j["index"] >= 0 && j["index"] < n &&
                   j["index"].get<int64_t>() % o.ranks == o.rank) {
          done[j["index"].get<int64_t>()] = j;
        }
        kept.push_back(line);
      }
      in.close();
      // Rewritten without a torn tail, so that appended rows start on a line of their own.
      std::ofstream rewrite(o.journal, std::ios::trunc);
      for (const std::string& l : kept) rewrite << l << "\n";
      if (!rewrite) throw SystemError("write", "cannot write '" + o.journal + "'");
      journal_has_header = !kept.empty();
    }
  }
  if (resumed) *resumed = static_cast<int64_t>(done.size());
  std::ofstream journal;
  if (!o.journal.empty()) {
    journal.open(o.journal, journal_has_header ? std::ios::app : std::ios::trunc);
    if (!journal) throw Error("--out", "cannot write '" + o.journal + "'");
    if (!journal_has_header) journal << Json{{"sweep", header}}.dump() << "\n" << std::flush;
  }
  std::vector<int64_t> todo;
  int64_t share = 0;
  for (int64_t i = o.rank; i < n; i += o.ranks) {
    ++share;
    if (!done.count(i)) todo.push_back(i);
  }
  // Largest clusters first: a search's cost grows with the GPU count, and starting the longest
  // points first keeps the last worker from running one long point alone at the end.
  std::vector<int64_t> todo_gpus;
  for (int64_t i : todo) todo_gpus.push_back(size_of(i));
  std::vector<size_t> order(todo.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return todo_gpus[a] > todo_gpus[b]; });
  std::vector<int64_t> by_size;
  for (size_t k : order) by_size.push_back(todo[k]);
  todo = std::move(by_size);
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int threads = o.threads > 0 ? o.threads : cores;
  const int workers =
      static_cast<int>(std::min<int64_t>(threads, std::max<int64_t>(1, todo.size())));
  const int per_search = std::max(1, threads / workers);
  std::mutex mu;
  std::atomic<size_t> next{0};
  int64_t finished = static_cast<int64_t>(done.size());
  std::exception_ptr failure;
  auto work = [&] {
    for (;;) {
      const size_t k = next.fetch_add(1);
      if (k >= todo.size()) return;
      {
        std::lock_guard<std::mutex> lock(mu);
        if (failure) return;
      }
      Json row;
      try {
        row = run_point(todo[k], per_search);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu);
        if (!failure) failure = std::current_exception();
        return;
      }
      std::lock_guard<std::mutex> lock(mu);
      if (journal.is_open()) {
        journal << row.dump() << "\n" << std::flush;
        if (!journal)
          failure =
              std::make_exception_ptr(SystemError("write", "cannot write '" + o.journal + "'"));
      }
      done[todo[k]] = std::move(row);
      ++finished;
      if (o.progress) o.progress(finished, share);
    }
  };
  std::vector<std::thread> pool;
  for (int w = 1; w < workers; ++w) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
  if (failure) std::rethrow_exception(failure);
  std::vector<Json> rows;
  for (auto& [_, r] : done) rows.push_back(std::move(r));
  return rows;
}

Json read_sweep_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw Error("sweep", "cannot read '" + path + "'");
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  // A document is one JSON value; a journal is one per line.
  try {
    Json j = Json::parse(text);
    if (j.is_object() && j.contains("sweep") && j.contains("rows") && j["rows"].is_array())
      return j;
    if (!(j.is_object() && j.contains("sweep")))
      throw Error(path, "is not a sweep (no \"sweep\" and \"rows\")");
  } catch (const Json::parse_error&) {
  }
  std::istringstream lines(text);
  std::string line;
  Json doc = Json::object();
  std::map<int64_t, Json> rows;
  int number = 0;
  std::vector<std::string> all;
  while (std::getline(lines, line)) all.push_back(line);
  // A journal being written may end in a torn line (no newline yet): that point is not done.
  const bool torn_tail = !text.empty() && text.back() != '\n';
  for (size_t k = 0; k < all.size(); ++k) {
    line = all[k];
    ++number;
    if (line.empty()) continue;
    Json j;
    try {
      j = Json::parse(line);
    } catch (const Json::parse_error&) {
      if (torn_tail && k + 1 == all.size() && number > 1) break;
      throw Error(path + ":" + std::to_string(number), "is not a JSON line of a sweep journal");
    }
    if (number == 1) {
      if (!j.is_object() || !j.contains("sweep"))
        throw Error(path, "is not a sweep (its first line has no \"sweep\")");
      doc["sweep"] = j["sweep"];
    } else if (j.is_object() && j.contains("index") && j["index"].is_number_integer()) {
      rows[j["index"].get<int64_t>()] = j;
    } else {
      throw Error(path + ":" + std::to_string(number), "is not a row (no \"index\")");
    }
  }
  if (!doc.contains("sweep")) throw Error(path, "is empty");
  doc["rows"] = Json::array();
  for (auto& [_, r] : rows) doc["rows"].push_back(r);
  return doc;
}

}  // namespace parasol::sim
