// defines: CpuBackend::attention_forward_bf16, attention_backward_bf16 (backend.h's typed bf16
// attention): the fp32 per-head body of attention.cc (runtime/cpu/attention_head.h) run on fp32
// tiles of one head at a time, widened inside the kernel from the bf16 buffers (the CPU's stand-in
// for the tiles a GPU's flash kernel holds in shared memory and registers: never a whole buffer,
// and not counted as device memory). Per (sequence, kv head): its K | V rows [seq_kv x (D + Dv)]
// (and in the backward its dK | dV accumulators, rounded once when every query head of the group
// has added to them); per query head: its Q rows [seq_q x D], its output [seq_q x Dv] (and dO). The
// log-sum-exp is fp32 throughout. Scratch: O(seq (D + Dv)) beside the per-block scores, so
// O(sequence) per call as the fp32 entries (counted in attention_scratch_peak()).
#include <algorithm>
#include <vector>

#include "core/error.h"
#include "runtime/cpu/attention_head.h"
#include "runtime/cpu/bf16_tile.h"
#include "runtime/cpu/cpu_backend.h"

namespace parasol::runtime {

namespace {

using namespace cpu_attention;
using bf16_tile::narrow;
using bf16_tile::widen;

// The dims of the tiles: one sequence's rows, dense: Q [seq_q x D], K | V [seq_kv x (D + Dv)],
// out [seq_q x Dv]. Everything else (masks, window, offsets, dropout) as d.
AttentionDims tile_dims(const AttentionDims& d) {
  AttentionDims t = d;
  t.ld_q = d.head_dim;
  t.ld_kv = d.head_dim + d.vd();
  t.ld_o = d.vd();
  return t;
}

// The K | V tile of (sequence b, kv head g): K rows at column 0, V rows at column D.
void widen_kv(std::vector<float>& kv, const AttentionDims& d, const uint16_t* k, const uint16_t* v,
              int64_t b, int64_t g) {
  const int64_t D = d.head_dim, Dv = d.vd(), W = D + Dv;
  for (int64_t j = 0; j < d.seq_kv; ++j) {
    const int64_t row = (b * d.seq_kv + j) * d.ld_kv;
    widen(kv.data() + j * W, k + row + g * D, D, 1, D);
    widen(kv.data() + j * W + D, v + row + g * Dv, Dv, 1, Dv);
  }
}

}  // namespace

void CpuBackend::attention_forward_bf16(const AttentionDims& d, uint16_t* out, float* lse,
                                        const uint16_t* q, const uint16_t* k, const uint16_t* v,
                                        bool accumulate) {
  check(d);
  if (accumulate && lse == nullptr)
    throw Error("runtime.attention", "accumulate needs the lse of the earlier steps");
  const int64_t D = d.head_dim, Dv = d.vd(), Sq = d.seq_q, group = d.heads / d.kv_heads;
  const AttentionDims t = tile_dims(d);
  Scratch sc = forward_scratch(t);
  std::vector<float> kv(static_cast<size_t>(d.seq_kv * (D + Dv))), qt(static_cast<size_t>(Sq * D)),
      ot(static_cast<size_t>(Sq * Dv));
  note_scratch(static_cast<int64_t>(
      (sc.s.size() + sc.o.size() + sc.row_lse.size() + kv.size() + qt.size() + ot.size()) *
      sizeof(float)));
  for (int64_t b = 0; b < d.batch; ++b)
    for (int64_t g = 0; g < d.kv_heads; ++g) {
      widen_kv(kv, d, k, v, b, g);
      for (int64_t h = g * group; h < (g + 1) * group; ++h) {
        uint16_t* out_h = out + b * Sq * d.ld_o + h * Dv;
        widen(qt.data(), q + b * Sq * d.ld_q + h * D, d.ld_q, Sq, D);
        if (accumulate) widen(ot.data(), out_h, d.ld_o, Sq, Dv);
        const Head hd{qt.data(), kv.data(), kv.data() + D, (b * d.heads + h) * Sq * d.seq_kv};
        forward_head(t, hd, ot.data(), lse != nullptr ? lse + (b * d.heads + h) * Sq : nullptr,
                     nullptr, accumulate, sc);
        narrow(out_h, d.ld_o, ot.data(), Sq, Dv);
      }
    }
}

void CpuBackend::attention_backward_bf16(const AttentionDims& d, uint16_t* dq, uint16_t* dk,
                                         uint16_t* dv, const uint16_t* dout, const uint16_t* q,
                                         const uint16_t* k, const uint16_t* v, const uint16_t* out,
                                         const float* lse, bool accumulate_dq,
                                         bool accumulate_dkv) {
  check(d);
  if (lse == nullptr) throw Error("runtime.attention", "the bf16 backward needs lse");
  const int64_t D = d.head_dim, Dv = d.vd(), W = D + Dv, Sq = d.seq_q, Skv = d.seq_kv,
                group = d.heads / d.kv_heads;
  const AttentionDims t = tile_dims(d);
  Scratch sc = backward_scratch(t);
  std::vector<float> kv(static_cast<size_t>(Skv * W)), dkv(kv.size()),
      qt(static_cast<size_t>(Sq * D)), dqt(qt.size()), ot(static_cast<size_t>(Sq * Dv)),
      dot(ot.size());
  note_scratch(static_cast<int64_t>((sc.p.size() + sc.pd.size() + sc.dp.size() + sc.delta.size() +
                                     2 * kv.size() + 2 * qt.size() + 2 * ot.size()) *
                                    sizeof(float)));
  for (int64_t b = 0; b < d.batch; ++b)
    for (int64_t g = 0; g < d.kv_heads; ++g) {
      widen_kv(kv, d, k, v, b, g);
      // dK | dV of this kv head: the stored ones when accumulating, else 0; every query head of
      // the group adds to them in fp32, then they are rounded once.
      if (accumulate_dkv)
        widen_kv(dkv, d, dk, dv, b, g);
      else
        std::fill(dkv.begin(), dkv.end(), 0.0f);
      for (int64_t h = g * group; h < (g + 1) * group; ++h) {
        const int64_t orow = b * Sq * d.ld_o + h * Dv, qrow = b * Sq * d.ld_q + h * D;
        widen(qt.data(), q + qrow, d.ld_q, Sq, D);
        widen(ot.data(), out + orow, d.ld_o, Sq, Dv);
        widen(dot.data(), dout + orow, d.ld_o, Sq, Dv);
        if (accumulate_dq) widen(dqt.data(), dq + qrow, d.ld_q, Sq, D);
        const Head hd{qt.data(), kv.data(), kv.data() + D, (b * d.heads + h) * Sq * Skv};
        backward_head(t, hd, dqt.data(), dkv.data(), dkv.data() + D, dot.data(), ot.data(),
                      lse + (b * d.heads + h) * Sq, nullptr, accumulate_dq, sc);
        narrow(dq + qrow, d.ld_q, dqt.data(), Sq, D);
      }
      for (int64_t j = 0; j < Skv; ++j) {
        const int64_t row = (b * Skv + j) * d.ld_kv;
        narrow(dk + row + g * D, D, dkv.data() + j * W, 1, D);
        narrow(dv + row + g * Dv, Dv, dkv.data() + j * W + D, 1, Dv);
      }
    }
}

}  // namespace parasol::runtime
