// HostStaging: host copies of device buffers, loaded and stored with Backend::copy.
#include "runtime/host_staging.h"

#include <cstdint>

#include "core/error.h"
#include "runtime/tensor.h"

namespace parasol::runtime {

namespace {

float widen(Dtype dt, uint16_t h, const std::string& name) {
  if (dt == Dtype::kBf16) return bf16_to_fp32(h);
  if (dt == Dtype::kFp16) return fp16_to_fp32(h);
  throw Error("runtime.staging", name + ": no host copy of " + dtype_name(dt) + " buffers");
}

uint16_t narrow(Dtype dt, float f, const std::string& name) {
  if (dt == Dtype::kBf16) return fp32_to_bf16(f);
  if (dt == Dtype::kFp16) return fp32_to_fp16(f);
  throw Error("runtime.staging", name + ": no host copy of " + dtype_name(dt) + " buffers");
}

}  // namespace

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
  if (load_) {
    const Dtype dt = prog.buffers[id].dtype;
    if (dt == Dtype::kFp32) {
      backend_.copy(copy.data(), device, copy.size() * sizeof(float));
    } else {
      std::vector<uint16_t> raw(copy.size());
      backend_.copy(raw.data(), device, raw.size() * sizeof(uint16_t));
      for (size_t i = 0; i < raw.size(); ++i) copy[i] = widen(dt, raw[i], prog.buffers[id].name);
    }
  }
  return copies_.emplace(id, std::move(copy)).first->second.data();
}

BufferAccess HostStaging::access() {
  return [this](int id) { return (*this)(id); };
}

void HostStaging::store() {
  const Program& prog = executor_.program();
  for (const auto& [id, copy] : copies_) {
    const Dtype dt = prog.buffers[id].dtype;
    if (dt == Dtype::kFp32) {
      backend_.copy(executor_.data(id), copy.data(), copy.size() * sizeof(float));
      continue;
    }
    // 16-bit storage: rounded to nearest even, as the executor's cast of the master weights.
    std::vector<uint16_t> raw(copy.size());
    for (size_t i = 0; i < raw.size(); ++i) raw[i] = narrow(dt, copy[i], prog.buffers[id].name);
    backend_.copy(executor_.data(id), raw.data(), raw.size() * sizeof(uint16_t));
  }
}

}  // namespace parasol::runtime
