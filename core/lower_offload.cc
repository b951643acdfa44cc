// Activation offload: a layer's saved activations copied to host memory after its forward and
// prefetched back before their first use in the backward (the recompute under full recompute).
#include "core/lower_internal.h"

namespace parasol::lowering {

Saved Lowerer::offload_saved(int layer, const Saved& sv) {
  Saved host = no_saved();
  std::vector<int> from, to;
  double bytes = 0;
  for (int i = 0; i < sSlots; ++i) {
    if (sv[i] < 0) continue;
    const Buffer& b = buf_at(sv[i]);
    std::string nm = b.name + ".h";
    std::vector<int64_t> shape = b.shape;
    Dtype dt = b.dtype;
    bytes += b.bytes();
    const BufferRole r = b.role;
    host[i] = role(r, buffer(std::move(nm), std::move(shape), dt, BufferClass::kActivation, true));
    from.push_back(sv[i]);
    to.push_back(host[i]);
  }
  copy(OpKind::kOffload, layer, "act.offload", bytes, from, to);
  return host;
}

Saved Lowerer::prefetch_saved(int layer, const Saved& host, int dep) {
  Saved dev = no_saved();
  std::vector<int> from, to;
  double bytes = 0;
  for (int i = 0; i < sSlots; ++i) {
    if (host[i] < 0) continue;
    const Buffer& b = buf_at(host[i]);
    std::string nm = b.name.substr(0, b.name.size() - 2);
    std::vector<int64_t> shape = b.shape;
    Dtype dt = b.dtype;
    bytes += b.bytes();
    const BufferRole r = b.role;
    dev[i] = role(r, buffer(std::move(nm), std::move(shape), dt, BufferClass::kActivation));
    from.push_back(host[i]);
    to.push_back(dev[i]);
  }
  copy(OpKind::kPrefetch, layer, "act.prefetch", bytes, from, to, {dep});
  return dev;
}

}  // namespace parasol::lowering
