// Device access scopes: where host code may touch "device" memory. On a GPU only kernels,
// copies and the communicator (NCCL) read or write device memory; host code that dereferences a
// device pointer crashes there, and nowhere on the CPU runtime, whose device memory is host
// memory. The strict CPU backend (runtime/cpu/strict_backend.h) keeps its device memory
// inaccessible (PROT_NONE) except inside a DeviceAccess scope, which its kernels and copies open
// and so does the MPI communicator around every call that may move a buffer's bytes (standing
// for NCCL's device-side access). Without a strict backend a scope costs one branch.
#pragma once

namespace parasol::runtime {

class DeviceAccess {
 public:
  // `open` makes the strict device memory accessible, `close` inaccessible again; both run on
  // the outermost scope only. install(nullptr, nullptr) uninstalls.
  using Hook = void (*)();
  static void install(Hook open, Hook close) {
    open_ = open;
    close_ = close;
  }
  static bool installed() { return open_ != nullptr; }
  static bool inside() { return depth_ > 0; }  // a scope is open

  DeviceAccess() {
    if (open_ != nullptr && depth_++ == 0) open_();
  }
  ~DeviceAccess() {
    if (open_ != nullptr && --depth_ == 0) close_();
  }
  DeviceAccess(const DeviceAccess&) = delete;
  DeviceAccess& operator=(const DeviceAccess&) = delete;

 private:
  // One process-wide state: the runtime drives its backend and communicator from one thread.
  static inline Hook open_ = nullptr;
  static inline Hook close_ = nullptr;
  static inline int depth_ = 0;
};

}  // namespace parasol::runtime
