// The vocab-tiled cross-entropy: the loss and its gradient read straight from the logits in their
// storage dtype (bf16 or fp32), in tiles of the vocabulary, never holding fp32 logits or
// probabilities. The same algorithm as runtime/cuda/xent_tiled.cu (whose kernels are tested
// against these functions in tests/runtime/cuda/cuda_kernels_test.cc); tested here against the
// untiled formula in double (tests/runtime/cpu/tiled_xent_test.cc).
//
// Forward, one pass over a row (an online log-sum-exp, as flash attention's softmax): for each
// tile of `tile` columns its maximum m_t and, in fp32, s_t = sum exp(l - m_t) over the tile; the
// running pair (M, S) takes a tile by M' = max(M, m_t), S' = S exp(M - M') + s_t exp(m_t - M').
// The result is this shard's (row_max, sum_exp) = (M, S) and the target logit; under tensor
// parallelism the row maxima are all-reduced (max), each shard rescales its sum to the global
// maximum (xent_rescale) and the sums are all-reduced (sum), as Megatron's vocab-parallel loss.
// Backward, a second pass: dlogits = dloss (exp(l - row_max) / sum_exp - onehot(label)), written
// in the logits' dtype (in place over the logits allowed).
//
// Rounding (the tests' tolerance): S is a sum of positive fp32 terms, each exp correct to
// some ulps, added along a chain of roundings (within a tile tile - 1 adds, then per tile merged
// a rescale exp, a product and an add); its relative error
// is at most gamma(chain) + (exps in the chain) * ulps * 2u (u = 2^-24). xent_sum_rel_bound
// states it; the loss's absolute error is that relative error plus log's and the subtraction's.
#pragma once

#include <cstdint>

#include "core/device.h"

namespace parasol::runtime::cpu {

inline constexpr int64_t kXentTile = 2048;  // default vocab tile (columns): 8 KiB of fp32 exps

// row_max[r], sum_exp[r] (relative to row_max[r]) and target[r] (the label's logit when the label
// is in this shard, vocab_start <= label < vocab_start + vocab, else 0) of rows x vocab logits
// of dtype kFp32 or kBf16 (throws parasol::Error for another). Ignored rows (label < 0) get their
// statistics all the same.
void xent_tiled_forward(float* row_max, float* sum_exp, float* target, const void* logits,
                        Dtype dtype, const int32_t* labels, int64_t rows, int64_t vocab,
                        int64_t vocab_start, int64_t tile = kXentTile);

// row_max[r] = the maximum of row r's logits (fp32 or bf16).
void xent_tiled_max(float* row_max, const void* logits, Dtype dtype, int64_t rows, int64_t vocab);

// sum_exp[r] relative to a given row_max[r] >= every logit of the row (the global maximum under
// tensor parallelism) and target[r] as xent_tiled_forward's: xent_tiled_forward's pass, then its
// sum rescaled from the row's own maximum to row_max (xent_rescale; one more exp and product).
void xent_tiled_sums(float* sum_exp, float* target, const void* logits, Dtype dtype,
                     const float* row_max, const int32_t* labels, int64_t rows, int64_t vocab,
                     int64_t vocab_start, int64_t tile = kXentTile);

// A shard's sum relative to its own maximum made relative to the global one (after the max
// all-reduce): sum_exp[r] *= exp(local_max[r] - global_max[r]); 0 stays 0.
void xent_rescale(float* sum_exp, const float* local_max, const float* global_max, int64_t rows);

// dlogits = dloss * (exp(l - row_max[r]) / sum_exp[r] - onehot) per row (0 for ignored rows),
// from the logits of `dtype`, written in that dtype. dlogits may alias logits.
void xent_tiled_backward(void* dlogits, const void* logits, Dtype dtype, const float* row_max,
                         const float* sum_exp, const int32_t* labels, int64_t rows, int64_t vocab,
                         int64_t vocab_start, float dloss);

// The roundings behind one row's sum_exp: `roundings` fp32 adds and products along the longest
// chain a term goes through, and `exps` exponentials multiplied into it (its own and the
// rescales of the merges).
struct XentChain {
  int64_t roundings = 0;
  int64_t exps = 0;
};
// With tiles of `tile` columns (this file's functions).
XentChain xent_tiled_chain(int64_t vocab, int64_t tile);
// With one block of `threads` threads per row, each sweeping `vec` consecutive columns at a time
// with its own running pair, then the pairs merged by a warp tree and the warps in order
// (runtime/cuda/xent_tiled.cu).
XentChain xent_block_chain(int64_t vocab, int threads, int vec);
// The relative error bound of sum_exp along `c` with exps correct to `exp_ulps` ulps (an ulp of
// an fp32 is at most 2u): gamma(roundings) + exps * exp_ulps * 2u, to first order in u.
double xent_sum_rel_bound(const XentChain& c, double exp_ulps);

}  // namespace parasol::runtime::cpu
