// Fused attention: which of the runtime's attention calls (backend.h's AttentionDims) a library's
// fused scaled-dot-product-attention kernel can take, and the mask it takes them with. The CUDA
// backend routes attention through cuDNN's fused SDPA (the cuDNN frontend's graph API) where this
// says so and through parasol's own kernels otherwise, counting and logging each fallback with
// the reason given here. The rules are plain C++ so that they are tested on CPUs.
//
// cuDNN's SDPA mask (cudnn_frontend utils/attn_score_modifiers.h, sliding_window_mask, and
// node/diagonal_band_mask.h, with the diagonal aligned top-left): a diagonal band keeps the score
// of query row i and key column j iff i + right_bound >= j (CMP_GE) and, with a left bound,
// j + left_bound > i (CMP_GT); every other score is -inf before the softmax.
#pragma once

#include <cstdint>
#include <string>

#include "runtime/backend.h"

namespace parasol::runtime {

// The mask a fused SDPA call applies (top-left aligned diagonal band).
struct SdpaMask {
  bool band = false;        // false: every key is visible to every query (no mask)
  int64_t right_bound = 0;  // band: key j kept iff j <= i + right_bound
  int64_t left_bound = 0;   // band, when > 0: key j kept iff j + left_bound > i; 0: no left bound
  // Whether the mask keeps key j for query i.
  bool keeps(int64_t i, int64_t j) const {
    if (!band) return true;
    return j <= i + right_bound && (left_bound <= 0 || j + left_bound > i);
  }
};

// The route of one attention call: fused with `mask` when `refusal` is empty, else parasol's own
// kernels, for the reason `refusal` names.
struct SdpaRoute {
  std::string refusal;
  SdpaMask mask;
};

// REQUIRES: d is a valid AttentionDims (heads a multiple of kv_heads, dims > 0). probs_wanted: the
// caller asks for the probabilities (fused kernels never write them). The route is fused only
// when its mask keeps exactly the keys d.first_key(i) <= j < d.last_key(i) of every query i, no
// query is left without a visible key (its log-sum-exp would be -inf, which fused kernels do not
// produce), there is no dropout (fused kernels draw their own masks; the runtime's must be
// runtime/tensor.h's on every backend), and both head dims are multiples of 8 (16-byte aligned
// bf16 rows) of at most 256 (cuDNN's largest).
SdpaRoute fused_attention_route(const AttentionDims& d, bool probs_wanted);

}  // namespace parasol::runtime
