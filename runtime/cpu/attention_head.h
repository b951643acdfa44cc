// The per-head body of CpuBackend's attention (attention.cc), shared by its fp32 entries and its
// typed bf16 ones (attention_bf16.cc): one (sequence b, query head h) pair, in blocks of kBlock
// query rows, on fp32 operands whose row strides are the AttentionDims' (ld_q, ld_kv, ld_o). The
// bf16 entries call it on fp32 tiles of one head widened inside the kernel, with the strides of
// those tiles. Internal to runtime/cpu.
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/backend.h"

namespace parasol::runtime::cpu_attention {

// One (sequence, query head): row 0 of its queries, of its kv head's keys and values, and the
// dropout index of its (b, h, 0, 0) score (runtime/tensor.h's mask index).
struct Head {
  const float* q = nullptr;
  const float* k = nullptr;
  const float* v = nullptr;
  int64_t mask_base = 0;
};

// Head (b, h) of the operands q, k, v laid out as d says.
Head head_at(const AttentionDims& d, const float* q, const float* k, const float* v, int64_t b,
             int64_t h);

// Throws parasol::Error for heads that are not a positive multiple of kv_heads or a dropout
// probability outside [0, 1).
void check(const AttentionDims& d);

// The scratch of one call (a block's scores and its partial output; O(seq_kv), never seq^2).
struct Scratch {
  std::vector<float> s, o, row_lse;     // forward
  std::vector<float> p, pd, dp, delta;  // backward
};
Scratch forward_scratch(const AttentionDims& d);
Scratch backward_scratch(const AttentionDims& d);
// Notes a call's scratch bytes for CpuBackend::attention_scratch_peak().
void note_scratch(int64_t bytes);

// The forward of one head: out_h (row 0 of its output, rows d.ld_o apart) written, or merged with
// the earlier steps' by log-sum-exp when accumulate (lse_h required then); lse_h (row 0 of its
// seq_q log-sum-exps, nullable) and probs_h (its [seq_q x seq_kv] probabilities, nullable)
// written.
void forward_head(const AttentionDims& d, const Head& hd, float* out_h, float* lse_h,
                  float* probs_h, bool accumulate, Scratch& sc);

// The backward of one head: dq_h (row 0 of its query gradient, rows d.ld_q apart) written (added
// when accumulate_dq); dk_g, dv_g (row 0 of its kv head's gradients, rows d.ld_kv apart) added
// to. The probabilities from probs_h when not null, else from lse_h.
void backward_head(const AttentionDims& d, const Head& hd, float* dq_h, float* dk_g, float* dv_g,
                   const float* dout_h, const float* out_h, const float* lse_h,
                   const float* probs_h, bool accumulate_dq, Scratch& sc);

}  // namespace parasol::runtime::cpu_attention
