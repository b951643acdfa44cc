// HostStaging: host copies of an Executor's device buffers, for the host code that fills or reads
// parameters and optimizer state (initialisation, checkpoints, tests). On a GPU the host cannot
// dereference device memory; this code works on the host copies and Backend::copy moves them
// across, on every backend alike (the strict CPU backend, runtime/cpu/strict_backend.h, crashes
// on any other way).
#pragma once

#include <map>
#include <vector>

#include "runtime/backend.h"
#include "runtime/executor.h"
#include "runtime/param_init.h"

namespace parasol::runtime {

class HostStaging {
 public:
  // `load`: each buffer's host copy starts as the device's contents (for reading, or for writing
  // part of it); otherwise it starts zeroed.
  HostStaging(const Executor& executor, Backend& backend, bool load);

  // The host copy of buffer `id` (fp32, the buffer's elements; bf16 / fp16 buffers widened on
  // load and rounded to nearest even on store), made on first use.
  float* operator()(int id);
  // This staging as the BufferAccess of param_init.h and checkpoint.h.
  BufferAccess access();
  // Copies every host copy made so far to its device buffer.
  void store();

 private:
  const Executor& executor_;
  Backend& backend_;
  bool load_;
  std::map<int, std::vector<float>> copies_;
};

}  // namespace parasol::runtime
