// DeepSpeed ZeRO-3's lazy gathers played against the compute (see zero3_play.h).
#include "cost_models/zero3_play.h"

#include <algorithm>
#include <cstddef>
#include <limits>
#include <string>
#include <utility>

#include "core/error.h"

namespace parasol::cost {

namespace {

// The data-parallel stream's busy intervals, in order, and the compute that runs beside them.
class Streams {
 public:
  explicit Streams(double slowdown) : rate_(1 - slowdown) {}

  // A collective of `seconds` that may start at `ready`: it starts once the stream is free.
  double comm(double seconds, double ready) {
    const double start = std::max(comm_free_, ready);
    comm_free_ = start + seconds;
    if (seconds > 0) busy_.emplace_back(start, comm_free_);
    comm_ += seconds;
    return comm_free_;
  }

  // Compute of `work` seconds that may start at `ready`, after the compute before it: it runs at
  // rate_ while a collective runs beside it. REQUIRES: every collective that starts before it
  // ends was added.
  double compute(double work, double ready) {
    double t = std::max(comp_free_, ready);
    work_ += work;
    double left = work;
    while (left > 0) {
      while (next_ < busy_.size() && busy_[next_].second <= t) ++next_;
      const bool in_busy = next_ < busy_.size() && busy_[next_].first <= t;
      if (in_busy) {
        const double span = busy_[next_].second - t;
        if (span * rate_ >= left) {
          slowed_ += left / rate_ - left;
          t += left / rate_;
          left = 0;
        } else {
          slowed_ += span - span * rate_;
          left -= span * rate_;
          t = busy_[next_].second;
        }
      } else {
        const double free =
            next_ < busy_.size() ? busy_[next_].first - t : std::numeric_limits<double>::infinity();
        if (free >= left) {
          t += left;
          left = 0;
        } else {
          left -= free;
          t = busy_[next_].first;
        }
      }
    }
    comp_free_ = t;
    return t;
  }

  void wait(double until) { comp_free_ = std::max(comp_free_, until); }

  Zero3Play result() const {
    Zero3Play out;
    out.comm = comm_;
    out.slowed = slowed_;
    out.exposed = std::max(0.0, std::max(comp_free_, comm_free_) - work_ - slowed_);
    return out;
  }

 private:
  double rate_;
  double comm_free_ = 0, comp_free_ = 0;
  double comm_ = 0, work_ = 0, slowed_ = 0;
  std::vector<std::pair<double, double>> busy_;
  size_t next_ = 0;  // the first busy interval that may still overlap the compute
};

}  // namespace

Zero3Play play_zero3_uses(const Zero3Uses& u, double slowdown) {
  const size_t n = u.compute.size();
  PARASOL_CHECK(u.gathers.size() == n && u.reduces.size() == n && u.gather_use.size() == n &&
                    u.gather_index.size() == n && 0 <= slowdown && slowdown < 1,
                "a ZeRO-3 play's uses disagree in length");
  Streams s(slowdown);
  // The end of each gather, by the use that issued it.
  std::vector<std::vector<double>> done(n);
  // Computes issued but not yet played: their end depends on the collectives issued after them,
  // up to the next reduce-scatter (which waits for them; the gathers behind it start later).
  std::vector<std::pair<double, double>> pending;  // (work, ready)
  double last_end = 0;
  auto flush = [&]() {
    for (const auto& [work, ready] : pending) last_end = s.compute(work, ready);
    pending.clear();
  };
  if (u.before > 0) pending.emplace_back(u.before, 0.0);
  for (size_t i = 0; i < n; ++i) {
    if (static_cast<int>(i) == u.middle_at && u.middle > 0) pending.emplace_back(u.middle, 0.0);
    // A gather of nothing (persistent parameters only) is not issued: its use waits for none.
    for (double g : u.gathers[i]) done[i].push_back(g > 0 ? s.comm(g, 0) : 0.0);
    const int gu = u.gather_use[i], gi = u.gather_index[i];
    PARASOL_CHECK(0 <= gu && static_cast<size_t>(gu) <= i && 0 <= gi &&
                      static_cast<size_t>(gi) < done[static_cast<size_t>(gu)].size(),
                  "use " + std::to_string(i) + " reads gather " + std::to_string(gi) + " of use " +
                      std::to_string(gu) + ", not yet issued");
    pending.emplace_back(u.compute[i], done[static_cast<size_t>(gu)][static_cast<size_t>(gi)]);
    if (!u.reduces[i].empty()) {
      flush();
      for (double r : u.reduces[i]) {
        const double end = s.comm(r, last_end);
        if (u.blocking) s.wait(end);
      }
    }
  }
  if (u.after > 0) pending.emplace_back(u.after, 0.0);
  flush();
  return s.result();
}

}  // namespace parasol::cost
