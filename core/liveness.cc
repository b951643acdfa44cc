// Liveness: buffer lifetimes over the issue order, swept with difference arrays.
#include "core/liveness.h"

#include <algorithm>

namespace parasol {

std::vector<Allocation> allocations(const Program& prog) {
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
  std::vector<double> bytes(n_bufs);
  std::vector<bool> member(n_bufs, false);  // a block's member other than its first
  for (int b = 0; b < n_bufs; ++b) bytes[b] = prog.buffers[b].bytes();
  // A block is one allocation: its first member carries the block's lifetime and bytes.
  for (const BufferBlock& blk : prog.blocks) {
    if (blk.buffers.empty()) continue;
    int f = -1, l = -1;
    for (int b : blk.buffers) {
      if (first[b] >= 0 && (f < 0 || first[b] < f)) f = first[b];
      l = std::max(l, last[b]);
      bytes[b] = 0;
      first[b] = last[b] = -1;
      member[b] = true;
    }
    const int head = blk.buffers[0];
    first[head] = f;
    last[head] = l;
    bytes[head] = blk.bytes(prog.buffers);
    member[head] = false;
  }
  std::vector<Allocation> out;
  out.reserve(n_bufs);
  for (int b = 0; b < n_bufs; ++b) {
    if (member[b]) continue;
    const Buffer& buf = prog.buffers[b];
    out.push_back({b, bytes[b], first[b], last[b], buf.persistent, buf.host});
  }
  return out;
}

Liveness liveness(const Program& prog) {
  Liveness out;
  const int n_ops = static_cast<int>(prog.ops.size());
  const int n_bufs = static_cast<int>(prog.buffers.size());
  // Difference arrays over the issue order: device bytes in use while op i runs (`during`), once
  // it has finished (`after`), and host bytes. The split by class is taken at the peak only.
  std::vector<double> during(n_ops + 1, 0.0), after(n_ops + 1, 0.0), host(n_ops + 1, 0.0);
  std::vector<double> bytes(n_bufs, 0.0);
  std::vector<int> first(n_bufs, -1), last(n_bufs, -1);
  for (const Allocation& a : allocations(prog)) {
    bytes[a.buffer] = a.bytes;
    first[a.buffer] = a.first;
    last[a.buffer] = a.last;
  }
  for (int b = 0; b < n_bufs; ++b) {
    const Buffer& buf = prog.buffers[b];
    if (buf.persistent) {
      if (!buf.host) out.persistent_bytes += bytes[b];
      if (n_ops == 0) continue;
      (buf.host ? host : during)[0] += bytes[b];
      if (!buf.host) after[0] += bytes[b];
      continue;
    }
    if (first[b] < 0) continue;
    if (buf.host) {
      host[first[b]] += bytes[b];
      host[last[b] + 1] -= bytes[b];
      continue;
    }
    during[first[b]] += bytes[b];
    during[last[b] + 1] -= bytes[b];
    if (last[b] > first[b]) {
      after[first[b]] += bytes[b];
      after[last[b]] -= bytes[b];
    }
  }
  out.live_after_op.resize(n_ops);
  out.live_during_op.resize(n_ops);
  double d = 0, a = 0, h = 0;
  for (int i = 0; i < n_ops; ++i) {
    d += during[i];
    a += after[i];
    h += host[i];
    out.live_after_op[i] = a;
    out.live_during_op[i] = d;
    if (out.peak_op < 0 || d > out.peak_bytes) {
      out.peak_bytes = d;
      out.peak_op = i;
    }
    if (h > out.host_bytes) out.host_bytes = h;
  }
  if (n_ops == 0) {
    out.peak_bytes = out.persistent_bytes;
    return out;
  }
  // The peak's split by class: device buffers live while the peak op runs.
  const int at = out.peak_op;
  for (int b = 0; b < n_bufs; ++b) {
    const Buffer& buf = prog.buffers[b];
    if (buf.host) continue;
    if ((buf.persistent && bytes[b] > 0) || (first[b] >= 0 && first[b] <= at && at <= last[b]))
      out.peak_by_class[static_cast<int>(buf.cls)] += bytes[b];
  }
  return out;
}

}  // namespace parasol
