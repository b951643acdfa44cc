// defines: fused_attention_route (runtime/fused_attention.h).
#include "runtime/fused_attention.h"

namespace parasol::runtime {

namespace {
constexpr int64_t kMaxFusedHeadDim = 256;  // cuDNN 9's fused SDPA: head dims up to 256
constexpr int64_t kHeadDimMultiple = 8;    // bf16 rows aligned to 16 bytes
}  // namespace

SdpaRoute fused_attention_route(const AttentionDims& d, bool probs_wanted) {
  SdpaRoute r;
  if (probs_wanted) {
    r.refusal =
        "the probabilities are wanted (attention without flash): fused kernels never "
        "write them";
    return r;
  }
  if (d.dropout_p > 0.0f) {
    r.refusal =
        "dropout: fused kernels draw their own masks, the runtime's masks are "
        "runtime/tensor.h's on every backend";
    return r;
  }
  for (int64_t dim : {d.head_dim, d.vd()}) {
    if (dim % kHeadDimMultiple != 0 || dim > kMaxFusedHeadDim) {
      r.refusal = "head dim " + std::to_string(dim) + " is not a multiple of 8 up to 256";
      return r;
    }
  }
  if (d.seq_q <= 0 || d.seq_kv <= 0) {
    r.refusal = "an empty sequence";
    return r;
  }
  // The visible keys [first_key(i), last_key(i)) both grow with i, so the first and last queries
  // bound every row: a row is empty iff one of them is.
  const int64_t last_q = d.seq_q - 1;
  if (d.last_key(0) <= d.first_key(0) || d.last_key(last_q) <= d.first_key(last_q)) {
    r.refusal = "a query sees no key (causal_offset " + std::to_string(d.causal_offset) +
                ", window " + std::to_string(d.window) + ")";
    return r;
  }
  if (d.first_key(last_q) == 0 && d.last_key(0) == d.seq_kv) return r;  // every key visible
  // Causal (a non-causal call sees every key, above): j <= i + causal_offset, and with a window
  // j > i + causal_offset - window, i.e. j + (window - causal_offset) > i.
  r.mask.band = true;
  r.mask.right_bound = d.causal_offset;
  if (d.window > 0) {
    r.mask.left_bound = d.window - d.causal_offset;
    if (r.mask.left_bound <= 0) {
      r.refusal = "the window's left edge (window " + std::to_string(d.window) +
                  ") lies past the diagonal (causal_offset " + std::to_string(d.causal_offset) +
                  "): no left bound of cuDNN's band";
      r.mask = SdpaMask{};
    }
  }
  return r;
}

}  // namespace parasol::runtime
