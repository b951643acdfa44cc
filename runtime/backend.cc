// Backend: the memory accounting shared by every backend (live and peak bytes per BufferClass,
// device and host apart). The kernels live in the backends (runtime/cpu/, runtime/cuda/).
#include "runtime/backend.h"

#include <algorithm>
#include <string>

#include "core/error.h"

namespace parasol::runtime {

void* Backend::alloc_in(Space& s, size_t bytes, BufferClass cls, bool host) {
  if (bytes == 0) return nullptr;
  void* p = host ? raw_alloc_host(bytes) : raw_alloc(bytes);
  if (p == nullptr)
    throw Error(host ? "runtime.alloc_host" : "runtime.alloc",
                "out of memory allocating " + std::to_string(bytes) + " bytes of " +
                    buffer_class_name(cls) + " on " + name());
  std::lock_guard<std::mutex> lock(mu_);
  s.blocks.emplace(p, std::make_pair(bytes, cls));
  MemoryStats& st = s.stats;
  const int c = static_cast<int>(cls);
  const auto b = static_cast<int64_t>(bytes);
  st.live[c] += b;
  st.peak[c] = std::max(st.peak[c], st.live[c]);
  st.live_total += b;
  st.peak_total = std::max(st.peak_total, st.live_total);
  ++st.allocations;
  return p;
}

void Backend::free_in(Space& s, void* p, bool host) {
  if (p == nullptr) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = s.blocks.find(p);
    if (it == s.blocks.end())
      throw Error(host ? "runtime.free_host" : "runtime.free",
                  "pointer not allocated by this backend (or freed twice)");
    MemoryStats& st = s.stats;
    const auto b = static_cast<int64_t>(it->second.first);
    st.live[static_cast<int>(it->second.second)] -= b;
    st.live_total -= b;
    --st.allocations;
    s.blocks.erase(it);
  }
  if (host)
    raw_free_host(p);
  else
    raw_free(p);
}

int Backend::mark() {
  marks_.push_back(std::chrono::steady_clock::now());
  return static_cast<int>(marks_.size()) - 1;
}

double Backend::mark_seconds(int i) {
  if (i < 0 || i >= static_cast<int>(marks_.size()))
    throw Error("runtime.mark", "no mark " + std::to_string(i));
  return std::chrono::duration<double>(marks_[i] - marks_[0]).count();
}

void Backend::clear_marks() { marks_.clear(); }

void* Backend::alloc(size_t bytes, BufferClass cls) { return alloc_in(device_, bytes, cls, false); }
void Backend::free(void* p) { free_in(device_, p, false); }
void* Backend::alloc_host(size_t bytes, BufferClass cls) {
  return alloc_in(host_, bytes, cls, true);
}
void Backend::free_host(void* p) { free_in(host_, p, true); }

MemoryStats Backend::device_memory() const {
  std::lock_guard<std::mutex> lock(mu_);
  return device_.stats;
}

void* Backend::alloc_widened(size_t bytes) {
  return alloc_in(widened_, bytes, BufferClass::kWorkspace, false);
}
void Backend::free_widened(void* p) { free_in(widened_, p, false); }

MemoryStats Backend::widened_memory() const {
  std::lock_guard<std::mutex> lock(mu_);
  return widened_.stats;
}

void* Backend::alloc_routing(size_t bytes) {
  return alloc_in(routing_, bytes, BufferClass::kWorkspace, false);
}
void Backend::free_routing(void* p) { free_in(routing_, p, false); }

MemoryStats Backend::routing_memory() const {
  std::lock_guard<std::mutex> lock(mu_);
  return routing_.stats;
}

void* Backend::alloc_staging(size_t bytes) {
  return alloc_in(staging_, bytes, BufferClass::kWorkspace, false);
}
void Backend::free_staging(void* p) { free_in(staging_, p, false); }

MemoryStats Backend::staging_memory() const {
  std::lock_guard<std::mutex> lock(mu_);
  return staging_.stats;
}

void Backend::begin_capture() {
  throw Error("runtime.backend", name() + " records no graphs (begin_capture)");
}
int Backend::end_capture() {
  throw Error("runtime.backend", name() + " records no graphs (end_capture)");
}
void Backend::replay(int) {
  throw Error("runtime.backend", name() + " records no graphs (replay)");
}

namespace {
[[noreturn]] void no_bf16(const std::string& backend, const char* entry) {
  throw Error("runtime.backend", backend + " has no bf16 kernel " + entry +
                                     " (bf16_kernels() is false: the executor widens instead)");
}
}  // namespace

void Backend::linear_forward_bf16(uint16_t*, const uint16_t*, const uint16_t*, WeightLayout,
                                  const uint16_t*, uint16_t*, int64_t, int64_t, int64_t) {
  no_bf16(name(), "linear_forward_bf16");
}
void Backend::linear_backward_data_bf16(uint16_t*, const uint16_t*, const uint16_t*, WeightLayout,
                                        const uint16_t*, float*, int64_t, int64_t, int64_t, bool) {
  no_bf16(name(), "linear_backward_data_bf16");
}
void Backend::linear_backward_weight_bf16(void*, Dtype, float*, const uint16_t*, const uint16_t*,
                                          WeightLayout, int64_t, int64_t, int64_t) {
  no_bf16(name(), "linear_backward_weight_bf16");
}
void Backend::norm_forward_bf16(Norm, uint16_t*, const uint16_t*, const uint16_t*, const uint16_t*,
                                int64_t, int64_t, float) {
  no_bf16(name(), "norm_forward_bf16");
}
void Backend::norm_backward_bf16(Norm, uint16_t*, float*, float*, const uint16_t*, const uint16_t*,
                                 const uint16_t*, const uint16_t*, int64_t, int64_t, float) {
  no_bf16(name(), "norm_backward_bf16");
}
void Backend::activation_forward_bf16(Activation, uint16_t*, const uint16_t*, int64_t, int64_t) {
  no_bf16(name(), "activation_forward_bf16");
}
void Backend::activation_backward_bf16(Activation, uint16_t*, const uint16_t*, const uint16_t*,
                                       int64_t, int64_t) {
  no_bf16(name(), "activation_backward_bf16");
}
void Backend::residual_forward_bf16(uint16_t*, const uint16_t*, const uint16_t*, const uint16_t*,
                                    int64_t, int64_t) {
  no_bf16(name(), "residual_forward_bf16");
}
void Backend::residual_backward_bf16(uint16_t*, float*, const uint16_t*, int64_t, int64_t) {
  no_bf16(name(), "residual_backward_bf16");
}
void Backend::rope_bf16(uint16_t*, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, double,
                        bool) {
  no_bf16(name(), "rope_bf16");
}
void Backend::embedding_forward_bf16(uint16_t*, const int32_t*, const uint16_t*, int64_t, int64_t,
                                     const uint16_t*, int64_t, int64_t, int64_t, int64_t) {
  no_bf16(name(), "embedding_forward_bf16");
}
void Backend::embedding_backward_bf16(float*, float*, const uint16_t*, const int32_t*, int64_t,
                                      int64_t, int64_t, int64_t, int64_t, int64_t) {
  no_bf16(name(), "embedding_backward_bf16");
}
void Backend::attention_forward_bf16(const AttentionDims&, uint16_t*, float*, const uint16_t*,
                                     const uint16_t*, const uint16_t*, bool) {
  no_bf16(name(), "attention_forward_bf16");
}
void Backend::attention_backward_bf16(const AttentionDims&, uint16_t*, uint16_t*, uint16_t*,
                                      const uint16_t*, const uint16_t*, const uint16_t*,
                                      const uint16_t*, const uint16_t*, const float*, bool, bool) {
  no_bf16(name(), "attention_backward_bf16");
}
void Backend::dispatch_forward_bf16(uint16_t*, const uint16_t*, const int32_t*, int64_t, int64_t,
                                    int64_t) {
  no_bf16(name(), "dispatch_forward_bf16");
}
void Backend::dispatch_backward_bf16(uint16_t*, const uint16_t*, const int32_t*, int64_t, int64_t,
                                     int64_t) {
  no_bf16(name(), "dispatch_backward_bf16");
}
void Backend::combine_forward_bf16(uint16_t*, const uint16_t*, const float*, const int32_t*,
                                   int64_t, int64_t, int64_t) {
  no_bf16(name(), "combine_forward_bf16");
}
void Backend::combine_backward_bf16(uint16_t*, float*, const uint16_t*, const uint16_t*,
                                    const float*, const int32_t*, int64_t, int64_t, int64_t) {
  no_bf16(name(), "combine_backward_bf16");
}

// The grouped expert GEMMs as one linear entry per expert with rows.
void Backend::expert_linear_forward_bf16(uint16_t* out, const uint16_t* in, const uint16_t* w,
                                         const uint16_t* bias, const int64_t* counts_host,
                                         int64_t experts, int64_t n, int64_t k) {
  int64_t row = 0;
  for (int64_t e = 0; e < experts; ++e) {
    const int64_t rows = counts_host[e];
    if (rows > 0)
      linear_forward_bf16(out + row * n, in + row * k, w + e * k * n, WeightLayout::kInOut,
                          bias != nullptr ? bias + e * n : nullptr, nullptr, rows, n, k);
    row += rows;
  }
}
void Backend::expert_linear_backward_data_bf16(uint16_t* din, const uint16_t* dout,
                                               const uint16_t* w, const int64_t* counts_host,
                                               int64_t experts, int64_t n, int64_t k,
                                               bool accumulate) {
  int64_t row = 0;
  for (int64_t e = 0; e < experts; ++e) {
    const int64_t rows = counts_host[e];
    if (rows > 0)
      linear_backward_data_bf16(din + row * k, dout + row * n, w + e * k * n, WeightLayout::kInOut,
                                nullptr, nullptr, rows, n, k, accumulate);
    row += rows;
  }
}
void Backend::expert_linear_backward_weight_bf16(void* dw, Dtype dw_type, float* dbias,
                                                 const uint16_t* in, const uint16_t* dout,
                                                 const int64_t* counts_host, int64_t experts,
                                                 int64_t n, int64_t k) {
  if (dw_type != Dtype::kFp32 && dw_type != Dtype::kBf16)
    throw Error("runtime.backend", "expert weight gradients are fp32 or bf16");
  const int64_t eb = dw_type == Dtype::kFp32 ? 4 : 2;
  int64_t row = 0;
  for (int64_t e = 0; e < experts; ++e) {
    const int64_t rows = counts_host[e];
    if (rows > 0)
      linear_backward_weight_bf16(static_cast<char*>(dw) + e * k * n * eb, dw_type,
                                  dbias != nullptr ? dbias + e * n : nullptr, in + row * k,
                                  dout + row * n, WeightLayout::kInOut, rows, n, k);
    row += rows;
  }
}

void Backend::moe_permutation_device(int32_t*, int32_t*, int32_t*, int32_t*, const int32_t*,
                                     int64_t, int64_t, int64_t) {
  throw Error("runtime.backend", name() + " keeps no MoE routing on the device");
}
void Backend::expert_linear_forward_bf16_dev(uint16_t*, const uint16_t*, const uint16_t*,
                                             const uint16_t*, const int32_t*, int64_t, int64_t,
                                             int64_t, int64_t) {
  throw Error("runtime.backend", name() + " has no grouped expert GEMM from device offsets");
}
void Backend::expert_linear_backward_data_bf16_dev(uint16_t*, const uint16_t*, const uint16_t*,
                                                   const int32_t*, int64_t, int64_t, int64_t,
                                                   int64_t) {
  throw Error("runtime.backend", name() + " has no grouped expert GEMM from device offsets");
}
void Backend::expert_linear_backward_weight_bf16_dev(void*, Dtype, float*, const uint16_t*,
                                                     const uint16_t*, const int32_t*, int64_t,
                                                     int64_t, int64_t, int64_t) {
  throw Error("runtime.backend", name() + " has no grouped expert GEMM from device offsets");
}

MemoryStats Backend::host_memory() const {
  std::lock_guard<std::mutex> lock(mu_);
  return host_.stats;
}

void Backend::reset_peaks() {
  std::lock_guard<std::mutex> lock(mu_);
  for (Space* s : {&device_, &host_, &widened_, &routing_, &staging_}) {
    s->stats.peak = s->stats.live;
    s->stats.peak_total = s->stats.live_total;
  }
}

void Backend::release_all() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [p, info] : device_.blocks) raw_free(p);
  for (auto& [p, info] : host_.blocks) raw_free_host(p);
  for (auto& [p, info] : widened_.blocks) raw_free(p);
  for (auto& [p, info] : routing_.blocks) raw_free(p);
  for (auto& [p, info] : staging_.blocks) raw_free(p);
  device_ = Space{};
  host_ = Space{};
  widened_ = Space{};
  routing_ = Space{};
  staging_ = Space{};
}

}  // namespace parasol::runtime
