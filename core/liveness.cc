// Liveness: buffer lifetimes over the issue order, swept with difference arrays.
#include "core/liveness.h"

namespace parasol {

Liveness liveness(const Program& prog) {
  Liveness out;
  const int n_ops = static_cast<int>(prog.ops.size());
  const int n_bufs = static_cast<int>(prog.buffers.size());
  std::vector<int> first(n_bufs, -1), last(n_bufs, -1);
  for (const Op& op : prog.ops) {
    auto touch = [&](int b) {
      if (first[b] < 0) first[b] = op.id;
      last[b] = op.id;
    };
    for (int b : op.reads) touch(b);
    for (int b : op.writes) touch(b);
  }
  // during[i]: bytes in use while op i runs; after[i]: once it has finished (per class for
  // device buffers, one more row for host buffers).
  std::vector<std::array<double, 6>> during(n_ops + 1), after(n_ops + 1);
  for (int b = 0; b < n_bufs; ++b) {
    const Buffer& buf = prog.buffers[b];
    const double bytes = buf.bytes();
    const int row = buf.host ? 5 : static_cast<int>(buf.cls);
    if (buf.persistent) {
      if (!buf.host) out.persistent_bytes += bytes;
      if (n_ops == 0) continue;
      during[0][row] += bytes;
      after[0][row] += bytes;
      continue;
    }
    if (first[b] < 0) continue;
    during[first[b]][row] += bytes;
    during[last[b] + 1][row] -= bytes;
    if (last[b] > first[b]) {
      after[first[b]][row] += bytes;
      after[last[b]][row] -= bytes;
    }
  }
  out.live_after_op.resize(n_ops);
  std::array<double, 6> d{}, a{};
  for (int i = 0; i < n_ops; ++i) {
    double dev_during = 0, dev_after = 0;
    for (int c = 0; c < 6; ++c) {
      d[c] += during[i][c];
      a[c] += after[i][c];
      if (c < 5) {
        dev_during += d[c];
        dev_after += a[c];
      }
    }
    out.live_after_op[i] = dev_after;
    if (out.peak_op < 0 || dev_during > out.peak_bytes) {
      out.peak_bytes = dev_during;
      out.peak_op = i;
      for (int c = 0; c < 5; ++c) out.peak_by_class[c] = d[c];
    }
    if (d[5] > out.host_bytes) out.host_bytes = d[5];
  }
  if (n_ops == 0) out.peak_bytes = out.persistent_bytes;
  return out;
}

}  // namespace parasol
