// The Pareto front of two lower-better objectives (sim/pareto.h).
#include "sim/pareto.h"

#include <algorithm>
#include <limits>
#include <numeric>

namespace parasol::sim {

std::vector<size_t> pareto_front(const std::vector<Objectives>& points) {
  std::vector<size_t> order(points.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (points[a].first != points[b].first) return points[a].first < points[b].first;
    if (points[a].second != points[b].second) return points[a].second < points[b].second;
    return a < b;
  });
  // In that order a point is dominated by an earlier one that is better on the first objective
  // and no worse on the second, or by one as good on the first and better on the second: of each
  // group equal on the first only the points with its least second can be on the front, and they
  // are when every point better on the first is worse on the second.
  std::vector<size_t> front;
  double least_second_before = std::numeric_limits<double>::infinity();
  for (size_t a = 0; a < order.size();) {
    size_t b = a;
    while (b < order.size() && points[order[b]].first == points[order[a]].first) ++b;
    const double group_least = points[order[a]].second;
    if (group_least < least_second_before)
      for (size_t k = a; k < b && points[order[k]].second == group_least; ++k)
        front.push_back(order[k]);
    least_second_before = std::min(least_second_before, group_least);
    a = b;
  }
  return front;
}

}  // namespace parasol::sim
