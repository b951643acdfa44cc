// Liveness: the memory a Program needs, from the lifetimes of its buffers in issue order. The
// prediction of peak memory per rank that the runtime's allocator will see (minus fragmentation
// and the CUDA context), broken down by buffer class.
#pragma once

#include <array>
#include <vector>

#include "core/program.h"

namespace parasol {

struct Liveness {
  // Device bytes in use while the peak op runs (its inputs and outputs all allocated).
  double peak_bytes = 0;
  int peak_op = -1;  // the op at the peak (-1 for an empty Program)
  // The device bytes of peak_bytes by BufferClass (indexed by the enum); they sum to it.
  std::array<double, 5> peak_by_class{};
  // Device bytes live once op i has finished (buffers whose last use was op i are freed).
  std::vector<double> live_after_op;
  // Device bytes in use while op i runs (its inputs and outputs all allocated); peak_bytes is
  // their maximum (the first op that reaches it is peak_op).
  std::vector<double> live_during_op;
  double persistent_bytes = 0;  // device buffers allocated for the whole step
  double host_bytes = 0;        // peak bytes of host-memory buffers (offload)
};

// Persistent buffers are live for the whole step; any other buffer from the first op that
// touches it (normally its writer) to the last op that reads or writes it. A block
// (Program::blocks) is one allocation of its padded size, from the first touch of any member to
// the last touch of any. Buffers no op touches are not counted. Host buffers count only towards
// host_bytes.
Liveness liveness(const Program& program);

// One allocation of a Program's buffers as liveness() counts them: a buffer on its own, or a
// block (Program::blocks) as one allocation of its padded size under its first member's id.
struct Allocation {
  int buffer = 0;    // the buffer's id (a block's first member)
  double bytes = 0;  // bytes allocated
  int first = -1;    // first op that touches it (-1: no op does; persistent: allocated anyway)
  int last = -1;     // last op that touches it
  bool persistent = false;
  bool host = false;
};
// The allocations of `program` in buffer order (members of a block other than its first are left
// out); liveness() is their sum over the issue order.
std::vector<Allocation> allocations(const Program& program);

}  // namespace parasol
