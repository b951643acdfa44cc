// sim/sweep.h: the runner on points whose rows a test function computes (tests/tools/sweep_test.cc
// runs it through the searches): each share of ranks, largest points first, a journal resumed
// after a torn line without recomputing its rows, a journal of another sweep refused, a failing
// point's error passed on.
#include "sim/sweep.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <mutex>
#include <stdexcept>

#include "tests/core/expect_error.h"

namespace parasol::sim {
namespace {

// Points 0..n-1 whose size is (index * 7) % n and whose row says which call computed it.
struct FakePoints {
  int64_t n;
  std::mutex mu;
  std::vector<int64_t> calls;
  std::function<int64_t(int64_t)> size_of() {
    return [this](int64_t i) { return (i * 7) % n; };
  }
  std::function<Json(int64_t, int)> run_point() {
    return [this](int64_t i, int) {
      std::lock_guard<std::mutex> lock(mu);
      calls.push_back(i);
      return Json{{"index", i}, {"square", i * i}};
    };
  }
};

std::vector<int64_t> indices(const std::vector<Json>& rows) {
  std::vector<int64_t> out;
  for (const Json& r : rows) out.push_back(r["index"].get<int64_t>());
  return out;
}

TEST(SweepRunner, OneThreadRunsTheLargestPointsFirstAndReturnsRowsInIndexOrder) {
  FakePoints p{5};
  SweepRunOptions o;
  o.threads = 1;
  const std::vector<Json> rows =
      run_sweep_points(Json{{"name", "t"}}, p.n, p.size_of(), p.run_point(), o);
  EXPECT_EQ(indices(rows), (std::vector<int64_t>{0, 1, 2, 3, 4}));
  for (const Json& r : rows)
    EXPECT_EQ(r["square"], r["index"].get<int64_t>() * r["index"].get<int64_t>());
  // Sizes (i * 7) % 5: 0, 2, 4, 1, 3: point 2 (4) first, then 4 (3), 1 (2), 3 (1), 0 (0).
  EXPECT_EQ(p.calls, (std::vector<int64_t>{2, 4, 1, 3, 0}));
}

TEST(SweepRunner, SharesOfRanksTogetherAreTheWhole) {
  std::vector<int64_t> all;
  for (int r = 0; r < 3; ++r) {
    FakePoints p{8};
    SweepRunOptions o;
    o.threads = 2;
    o.rank = r;
    o.ranks = 3;
    for (int64_t i :
         indices(run_sweep_points(Json{{"name", "t"}}, p.n, p.size_of(), p.run_point(), o))) {
      EXPECT_EQ(i % 3, r);
      all.push_back(i);
    }
  }
  std::sort(all.begin(), all.end());
  EXPECT_EQ(all, (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7}));
}

TEST(SweepRunner, ResumesAfterATornLineWithoutRecomputingItsRows) {
  const std::string journal = testing::TempDir() + "/sweep_runner_resume.jsonl";
  const Json header = {{"name", "resume"}};
  SweepRunOptions o;
  o.threads = 1;
  o.journal = journal;
  FakePoints first{4};
  const std::vector<Json> full =
      run_sweep_points(header, first.n, first.size_of(), first.run_point(), o);
  std::vector<std::string> lines;
  {
    std::ifstream in(journal);
    for (std::string l; std::getline(in, l);) lines.push_back(l);
  }
  ASSERT_EQ(lines.size(), 5u);  // the header and four rows
  EXPECT_EQ(Json::parse(lines[0]), (Json{{"sweep", header}}));
  // Interrupted after two rows, in the middle of writing the third.
  {
    std::ofstream out(journal, std::ios::trunc);
    out << lines[0] << "\n" << lines[1] << "\n" << lines[2] << "\n" << lines[3].substr(0, 5);
  }
  EXPECT_EQ(read_sweep_file(journal)["rows"].size(), 2u);
  o.resume = true;
  FakePoints again{4};
  int64_t resumed = -1;
  const std::vector<Json> rows =
      run_sweep_points(header, again.n, again.size_of(), again.run_point(), o, &resumed);
  EXPECT_EQ(resumed, 2);
  EXPECT_EQ(rows, full);
  // Only the two points the journal lacked were computed again.
  std::vector<int64_t> kept = {Json::parse(lines[1])["index"].get<int64_t>(),
                               Json::parse(lines[2])["index"].get<int64_t>()};
  ASSERT_EQ(again.calls.size(), 2u);
  for (int64_t i : again.calls) EXPECT_EQ(std::count(kept.begin(), kept.end(), i), 0) << i;
  EXPECT_EQ(read_sweep_file(journal)["rows"].size(), 4u);
  // A journal of another sweep is refused, naming --resume.
  FakePoints other{4};
  ExpectError(
      [&] {
        run_sweep_points(Json{{"name", "other"}}, other.n, other.size_of(), other.run_point(), o);
      },
      "--resume", "another sweep");
  std::remove(journal.c_str());
}

TEST(SweepRunner, AFailingPointsErrorIsPassedOn) {
  SweepRunOptions o;
  o.threads = 2;
  auto fail = [](int64_t i, int) -> Json {
    if (i == 3) throw std::runtime_error("point 3 failed");
    return Json{{"index", i}};
  };
  EXPECT_THROW(run_sweep_points(
                   Json::object(), 6, [](int64_t) { return int64_t{1}; }, fail, o),
               std::runtime_error);
}

}  // namespace
}  // namespace parasol::sim
