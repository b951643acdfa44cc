// Pareto fronts of two lower-better objectives: the rule by which one point dominates another,
// read by the plan search's front (sim/search.h: the ranking key against memory per GPU) and by
// the sweep page's (report/sweep_page.h: cost against time to train).
#pragma once

#include <cstddef>
#include <vector>

namespace parasol::sim {

// Two objectives, both lower-better.
struct Objectives {
  double first = 0, second = 0;
};

// Whether `a` is no worse than `b` on both objectives (equal points are no worse than each other).
inline bool no_worse(const Objectives& a, const Objectives& b) {
  return a.first <= b.first && a.second <= b.second;
}
// Whether `a` dominates `b`: no worse on both and better on one.
inline bool dominates(const Objectives& a, const Objectives& b) {
  return no_worse(a, b) && (a.first < b.first || a.second < b.second);
}

// The positions in `points` of those no other point dominates (equal points are all on it),
// ordered by first, then second, then position. O(n log n).
std::vector<size_t> pareto_front(const std::vector<Objectives>& points);

}  // namespace parasol::sim
