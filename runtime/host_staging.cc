// HostStaging: host copies of device buffers, loaded and stored with Backend::copy.
#include "runtime/host_staging.h"

#include "core/error.h"

namespace parasol::runtime {

HostStaging::HostStaging(const Executor& executor, Backend& backend, bool load)
    : executor_(executor), backend_(backend), load_(load) {}

float* HostStaging::operator()(int id) {
  auto it = copies_.find(id);
  if (it != copies_.end()) return it->second.data();
  const Program& prog = executor_.program();
  if (id < 0 || id >= static_cast<int>(prog.buffers.size()))
    throw Error("runtime.staging", "no buffer " + std::to_string(id));
  void* device = executor_.data(id);
  if (device == nullptr)
    throw Error("runtime.staging", prog.buffers[id].name + " is not allocated");
  std::vector<float> copy(static_cast<size_t>(prog.buffers[id].elements()), 0.0f);
  if (load_) backend_.copy(copy.data(), device, copy.size() * sizeof(float));
  return copies_.emplace(id, std::move(copy)).first->second.data();
}

BufferAccess HostStaging::access() {
  return [this](int id) { return (*this)(id); };
}

void HostStaging::store() {
  for (const auto& [id, copy] : copies_)
    backend_.copy(executor_.data(id), copy.data(), copy.size() * sizeof(float));
}

}  // namespace parasol::runtime
