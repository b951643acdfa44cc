// Transformer Engine's cached fp8 weight copies: see te_weight_cache.h.
#include "core/te_weight_cache.h"

namespace parasol {

double te_cached_fp8_weight_bytes(const Plan& p, bool transpose_kept) {
  if (p.precision != Dtype::kFp8 || p.transformer_impl != TransformerImpl::kTransformerEngine ||
      p.fp8_param_gather || p.zero >= 3 || p.offload.params)
    return 0;
  if (p.fp8_recipe != Fp8Recipe::kDelayed && p.fp8_recipe != Fp8Recipe::kTensorwise) return 0;
  return transpose_kept ? 2 : 1;
}

}  // namespace parasol
