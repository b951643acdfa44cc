// defines: CpuBackend's typed bf16 entries (backend.h, "Typed bf16 entries"): linear_forward_bf16,
// linear_backward_data_bf16, linear_backward_weight_bf16, norm_forward_bf16. Storage is bf16; each
// kernel widens one tile of its operands at a time into fp32 scratch of the kernel (the CPU's
// stand-in for a GPU kernel's registers and shared memory: never a whole buffer, and not counted as
// device memory), runs the fp32 kernel of this backend on the tile (OpenBLAS for the GEMMs: fp32
// accumulation over the whole reduction dimension, which is never tiled) and rounds each output to
// bf16 once.
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"
#include "runtime/cpu/bf16_tile.h"
#include "runtime/cpu/cpu_backend.h"
#include "runtime/cpu/vec.h"
#include "runtime/tensor.h"

namespace parasol::runtime {

namespace {

using bf16_tile::narrow;
using bf16_tile::widen;

// Output tiles: kRows rows by kCols columns (a few hundred KiB of fp32 scratch at k = 4096).
constexpr int64_t kRows = 64, kCols = 256;

}  // namespace

void CpuBackend::linear_forward_bf16(uint16_t* out, const uint16_t* in, const uint16_t* w,
                                     WeightLayout layout, const uint16_t* bias, uint16_t* gelu_pre,
                                     int64_t m, int64_t n, int64_t k) {
  const bool out_in = layout == WeightLayout::kOutIn;
  std::vector<float> wt(static_cast<size_t>(k * std::min(n, kCols)));
  std::vector<float> it(static_cast<size_t>(std::min(m, kRows) * k));
  std::vector<float> ot(static_cast<size_t>(std::min(m, kRows) * std::min(n, kCols)));
  std::vector<float> bt(static_cast<size_t>(std::min(n, kCols)));
  for (int64_t j0 = 0; j0 < n; j0 += kCols) {
    const int64_t nb = std::min(kCols, n - j0);
    // W's columns j0 .. j0 + nb: [k x nb] (kInOut), or rows of the [n x k] table (kOutIn).
    if (out_in)
      widen(wt.data(), w + j0 * k, k, nb, k);
    else
      widen(wt.data(), w + j0, n, k, nb);
    if (bias != nullptr) widen(bt.data(), bias + j0, nb, 1, nb);
    for (int64_t i0 = 0; i0 < m; i0 += kRows) {
      const int64_t mb = std::min(kRows, m - i0);
      widen(it.data(), in + i0 * k, k, mb, k);
      if (bias != nullptr)
        for (int64_t r = 0; r < mb; ++r) std::memcpy(ot.data() + r * nb, bt.data(), nb * 4);
      cpu::sgemm(false, out_in, mb, nb, k, 1.0f, it.data(), k, wt.data(), out_in ? k : nb,
                 bias != nullptr ? 1.0f : 0.0f, ot.data(), nb);
      if (gelu_pre != nullptr) {
        narrow(gelu_pre + i0 * n + j0, n, ot.data(), mb, nb);
        activation_forward(Activation::kGelu, ot.data(), ot.data(), mb, nb);  // in place
      }
      narrow(out + i0 * n + j0, n, ot.data(), mb, nb);
    }
  }
}

void CpuBackend::linear_backward_data_bf16(uint16_t* din, const uint16_t* dout, const uint16_t* w,
                                           WeightLayout layout, const uint16_t* gelu_pre,
                                           float* dbias_of_din, int64_t m, int64_t n, int64_t k,
                                           bool accumulate) {
  const bool out_in = layout == WeightLayout::kOutIn;
  const bool acc = accumulate && gelu_pre == nullptr;
  const int64_t kc = std::min(k, kCols), mr = std::min(m, kRows);
  std::vector<float> wt(static_cast<size_t>(n * kc)), dt(static_cast<size_t>(mr * n));
  std::vector<float> it(static_cast<size_t>(mr * kc)), pt(static_cast<size_t>(mr * kc));
  for (int64_t j0 = 0; j0 < k; j0 += kCols) {
    const int64_t kb = std::min(kCols, k - j0);
    // W's rows j0 .. j0 + kb of [k x n] (kInOut: din = dout W^T), or its columns of [n x k].
    if (out_in)
      widen(wt.data(), w + j0, k, n, kb);
    else
      widen(wt.data(), w + j0 * n, n, kb, n);
    for (int64_t i0 = 0; i0 < m; i0 += kRows) {
      const int64_t mb = std::min(kRows, m - i0);
      widen(dt.data(), dout + i0 * n, n, mb, n);
      if (acc) widen(it.data(), din + i0 * k + j0, k, mb, kb);
      cpu::sgemm(false, !out_in, mb, kb, n, 1.0f, dt.data(), n, wt.data(), out_in ? kb : n,
                 acc ? 1.0f : 0.0f, it.data(), kb);
      if (gelu_pre != nullptr) {
        widen(pt.data(), gelu_pre + i0 * k + j0, k, mb, kb);
        activation_backward(Activation::kGelu, it.data(), it.data(), pt.data(), mb, kb);
        if (dbias_of_din != nullptr)
          for (int64_t r = 0; r < mb; ++r)
            for (int64_t c = 0; c < kb; ++c) dbias_of_din[j0 + c] += it[r * kb + c];
      }
      narrow(din + i0 * k + j0, k, it.data(), mb, kb);
    }
  }
}

void CpuBackend::linear_backward_weight_bf16(void* dw, Dtype dw_type, float* dbias,
                                             const uint16_t* in, const uint16_t* dout,
                                             WeightLayout layout, int64_t m, int64_t n, int64_t k) {
  if (dw_type != Dtype::kFp32 && dw_type != Dtype::kBf16)
    throw Error("runtime.cpu", std::string("linear_backward_weight_bf16: dw dtype ") +
                                   dtype_name(dw_type) + " (fp32 or bf16)");
  const bool out_in = layout == WeightLayout::kOutIn, wide = dw_type == Dtype::kFp32;
  // Output tiles of the logical dW[k x n] = in^T dout: kb of k by nb of n, each the whole
  // reduction over the m rows.
  const int64_t kc = std::min(k, kCols), nc = std::min(n, kCols);
  std::vector<float> it(static_cast<size_t>(m * kc)), dt(static_cast<size_t>(m * nc));
  std::vector<float> wt(wide ? 0 : static_cast<size_t>(kc * nc));
  for (int64_t j0 = 0; j0 < n; j0 += kCols) {
    const int64_t nb = std::min(kCols, n - j0);
    widen(dt.data(), dout + j0, n, m, nb);
    if (dbias != nullptr) cpu::add_column_sums(dbias + j0, dt.data(), m, nb);
    for (int64_t p0 = 0; p0 < k; p0 += kCols) {
      const int64_t kb = std::min(kCols, k - p0);
      widen(it.data(), in + p0, k, m, kb);
      // kInOut: dw[p0.., j0..] ([k x n], row stride n) += it^T dt; kOutIn: dw[j0.., p0..]
      // ([n x k], row stride k) += dt^T it.
      const int64_t at = out_in ? j0 * k + p0 : p0 * n + j0, ld = out_in ? k : n;
      const int64_t rows = out_in ? nb : kb, cols = out_in ? kb : nb;
      float* c = wide ? static_cast<float*>(dw) + at : wt.data();
      const int64_t ldc = wide ? ld : cols;
      if (!wide) widen(wt.data(), static_cast<const uint16_t*>(dw) + at, ld, rows, cols);
      if (out_in)
        cpu::sgemm(true, false, nb, kb, m, 1.0f, dt.data(), nb, it.data(), kb, 1.0f, c, ldc);
      else
        cpu::sgemm(true, false, kb, nb, m, 1.0f, it.data(), kb, dt.data(), nb, 1.0f, c, ldc);
      if (!wide) narrow(static_cast<uint16_t*>(dw) + at, ld, wt.data(), rows, cols);
    }
  }
}

void CpuBackend::norm_forward_bf16(Norm kind, uint16_t* out, const uint16_t* x,
                                   const uint16_t* weight, const uint16_t* bias, int64_t rows,
                                   int64_t cols, float eps) {
  // The parameters widened once (cols each); rows in tiles of kRows.
  std::vector<float> wb(static_cast<size_t>(2 * cols));
  widen(wb.data(), weight, cols, 1, cols);
  if (bias != nullptr) widen(wb.data() + cols, bias, cols, 1, cols);
  const int64_t rr = std::min(rows, kRows);
  std::vector<float> xt(static_cast<size_t>(rr * cols)), ot(static_cast<size_t>(rr * cols));
  for (int64_t i0 = 0; i0 < rows; i0 += kRows) {
    const int64_t mb = std::min(kRows, rows - i0);
    widen(xt.data(), x + i0 * cols, cols, mb, cols);
    norm_forward(kind, ot.data(), xt.data(), wb.data(),
                 bias != nullptr ? wb.data() + cols : nullptr, mb, cols, eps);
    narrow(out + i0 * cols, cols, ot.data(), mb, cols);
  }
}

}  // namespace parasol::runtime
