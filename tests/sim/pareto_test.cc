// sim/pareto.h: the front of random point sets (with ties) against the pairwise definition.
#include "sim/pareto.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>

namespace parasol::sim {
namespace {

TEST(Pareto, DominanceIsNoWorseOnBothAndBetterOnOne) {
  EXPECT_TRUE(dominates({1, 2}, {2, 2}));
  EXPECT_TRUE(dominates({1, 1}, {2, 2}));
  EXPECT_FALSE(dominates({1, 2}, {1, 2}));
  EXPECT_TRUE(no_worse({1, 2}, {1, 2}));
  EXPECT_FALSE(dominates({1, 3}, {2, 2}));
  EXPECT_FALSE(no_worse({1, 3}, {2, 2}));
}

// The front is the set of points no other point dominates, whatever the ties.
TEST(Pareto, FrontIsTheSetNoPointDominates) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    std::uniform_int_distribution<int> size(0, 30), value(0, 6);  // few values: many ties
    std::vector<Objectives> points(size(rng));
    for (Objectives& p : points) p = {double(value(rng)), double(value(rng))};
    std::vector<size_t> expected;
    for (size_t i = 0; i < points.size(); ++i)
      if (std::none_of(points.begin(), points.end(),
                       [&](const Objectives& o) { return dominates(o, points[i]); }))
        expected.push_back(i);
    std::vector<size_t> got = pareto_front(points);
    // Ordered by first, then second, then position.
    EXPECT_TRUE(std::is_sorted(got.begin(), got.end(), [&](size_t a, size_t b) {
      if (points[a].first != points[b].first) return points[a].first < points[b].first;
      if (points[a].second != points[b].second) return points[a].second < points[b].second;
      return a < b;
    }));
    std::sort(got.begin(), got.end());
    EXPECT_EQ(got, expected) << trial;
  }
}

}  // namespace
}  // namespace parasol::sim
