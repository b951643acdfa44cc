// defines: CpuBackend's typed bf16 entries of the element-wise kernels (backend.h, "Typed bf16
// entries"): norm_backward_bf16, activation_forward_bf16, activation_backward_bf16,
// residual_forward_bf16, residual_backward_bf16, rope_bf16, embedding_forward_bf16,
// embedding_backward_bf16. Storage is bf16; each kernel widens one block of rows of its operands
// at a time into fp32 scratch of the kernel (as runtime/cpu/bf16_ops.cc's tiles: never a whole
// buffer, not counted as device memory), runs this backend's fp32 kernel on the block and rounds
// each bf16 output once; the parameters' gradients (dweight, dbias, dtable, dpos) are fp32 and
// accumulate across blocks. Blocks of the kernels that index positions (RoPE, embedding) are
// whole sequences, so that a block's row t is at position t % seq as in the full call.
#include <algorithm>
#include <cstring>
#include <vector>

#include "runtime/cpu/bf16_tile.h"
#include "runtime/cpu/cpu_backend.h"
#include "runtime/tensor.h"

namespace parasol::runtime {

namespace {

constexpr int64_t kBlockRows = 64;

// n dense elements widened / rounded (one row of n).
void widen(float* dst, const uint16_t* src, int64_t n) { bf16_tile::widen(dst, src, n, 1, n); }
void narrow(uint16_t* dst, const float* src, int64_t n) { bf16_tile::narrow(dst, n, src, 1, n); }

// fp32 scratch of n floats (0 for nullptr sources) holding src widened; nullptr when src is.
struct Wide {
  std::vector<float> v;
  float* get(const uint16_t* src, int64_t n) {
    if (src == nullptr) return nullptr;
    v.resize(static_cast<size_t>(n));
    widen(v.data(), src, n);
    return v.data();
  }
};

// Rows per block for kernels indexed by position: whole sequences, at least kBlockRows rows.
int64_t sequence_block(int64_t seq) { return std::max<int64_t>(1, kBlockRows / seq) * seq; }

}  // namespace

void CpuBackend::norm_backward_bf16(Norm kind, uint16_t* dx, float* dweight, float* dbias,
                                    const uint16_t* dout, const uint16_t* x, const uint16_t* weight,
                                    const uint16_t* dresidual, int64_t rows, int64_t cols,
                                    float eps) {
  Wide w, wd, wx, wr;
  const float* wf = w.get(weight, cols);
  std::vector<float> out;
  for (int64_t r0 = 0; r0 < rows; r0 += kBlockRows) {
    const int64_t n = std::min(kBlockRows, rows - r0) * cols, off = r0 * cols;
    const float* d = wd.get(dout + off, n);
    const float* xf = wx.get(x + off, n);
    const float* res = dresidual ? wr.get(dresidual + off, n) : nullptr;
    out.resize(static_cast<size_t>(n));
    norm_backward(kind, out.data(), dweight, dbias, d, xf, wf, res, n / cols, cols, eps);
    narrow(dx + off, out.data(), n);
  }
}

void CpuBackend::activation_forward_bf16(Activation kind, uint16_t* out, const uint16_t* in,
                                         int64_t rows, int64_t cols) {
  const int64_t in_cols = kind == Activation::kSwiglu ? 2 * cols : cols;
  Wide wi;
  std::vector<float> o;
  for (int64_t r0 = 0; r0 < rows; r0 += kBlockRows) {
    const int64_t nr = std::min(kBlockRows, rows - r0);
    const float* xf = wi.get(in + r0 * in_cols, nr * in_cols);
    o.resize(static_cast<size_t>(nr * cols));
    activation_forward(kind, o.data(), xf, nr, cols);
    narrow(out + r0 * cols, o.data(), nr * cols);
  }
}

void CpuBackend::activation_backward_bf16(Activation kind, uint16_t* din, const uint16_t* dout,
                                          const uint16_t* in, int64_t rows, int64_t cols) {
  const int64_t in_cols = kind == Activation::kSwiglu ? 2 * cols : cols;
  Wide wd, wi;
  std::vector<float> g;
  for (int64_t r0 = 0; r0 < rows; r0 += kBlockRows) {
    const int64_t nr = std::min(kBlockRows, rows - r0);
    const float* d = wd.get(dout + r0 * cols, nr * cols);
    const float* xf = wi.get(in + r0 * in_cols, nr * in_cols);
    g.resize(static_cast<size_t>(nr * in_cols));
    activation_backward(kind, g.data(), d, xf, nr, cols);
    narrow(din + r0 * in_cols, g.data(), nr * in_cols);
  }
}

void CpuBackend::residual_forward_bf16(uint16_t* out, const uint16_t* x, const uint16_t* y,
                                       const uint16_t* bias, int64_t rows, int64_t cols) {
  Wide wx, wy, wb;
  const float* bf = wb.get(bias, cols);
  std::vector<float> o;
  for (int64_t r0 = 0; r0 < rows; r0 += kBlockRows) {
    const int64_t n = std::min(kBlockRows, rows - r0) * cols, off = r0 * cols;
    const float* xf = x ? wx.get(x + off, n) : nullptr;
    const float* yf = wy.get(y + off, n);
    o.resize(static_cast<size_t>(n));
    residual_forward(o.data(), nullptr, xf, yf, bf, n / cols, cols, 0.0f, 0);
    narrow(out + off, o.data(), n);
  }
}

void CpuBackend::residual_backward_bf16(uint16_t* dy, float* dbias, const uint16_t* dout,
                                        int64_t rows, int64_t cols) {
  Wide wd;
  for (int64_t r0 = 0; r0 < rows; r0 += kBlockRows) {
    const int64_t n = std::min(kBlockRows, rows - r0) * cols, off = r0 * cols;
    if (dbias != nullptr) bias_backward(dbias, wd.get(dout + off, n), n / cols, cols);
    if (dy != dout) std::memcpy(dy + off, dout + off, static_cast<size_t>(n) * sizeof(uint16_t));
  }
}

void CpuBackend::rope_bf16(uint16_t* x, int64_t ld, int64_t rows, int64_t seq, int64_t pos_offset,
                           int64_t heads, int64_t head_dim, double theta, bool inverse) {
  const int64_t block = sequence_block(seq);
  const int64_t width = heads * head_dim;  // the rotated columns of each row
  std::vector<float> v;
  for (int64_t r0 = 0; r0 < rows; r0 += block) {
    const int64_t nr = std::min(block, rows - r0);
    v.resize(static_cast<size_t>(nr * width));
    bf16_tile::widen(v.data(), x + r0 * ld, ld, nr, width);
    rope(v.data(), width, nr, seq, pos_offset, heads, head_dim, theta, inverse);
    bf16_tile::narrow(x + r0 * ld, ld, v.data(), nr, width);
  }
}

void CpuBackend::embedding_forward_bf16(uint16_t* out, const int32_t* tokens, const uint16_t* table,
                                        int64_t vocab_start, int64_t vocab_rows,
                                        const uint16_t* pos, int64_t pos_offset, int64_t rows,
                                        int64_t seq, int64_t cols) {
  // Each output row is one table row plus one position row: widened row by row (the table is
  // never widened whole), added in fp32 as embedding_forward does, rounded once.
  std::vector<float> o(static_cast<size_t>(cols));
  for (int64_t t = 0; t < rows; ++t) {
    const int64_t id = static_cast<int64_t>(tokens[t]) - vocab_start;
    if (id >= 0 && id < vocab_rows)
      widen(o.data(), table + id * cols, cols);
    else
      std::fill(o.begin(), o.end(), 0.0f);
    if (pos != nullptr) {
      const uint16_t* p = pos + (t % seq + pos_offset) * cols;
      for (int64_t c = 0; c < cols; ++c) o[c] += bf16_to_fp32(p[c]);
    }
    narrow(out + t * cols, o.data(), cols);
  }
}

void CpuBackend::embedding_backward_bf16(float* dtable, float* dpos, const uint16_t* dout,
                                         const int32_t* tokens, int64_t vocab_start,
                                         int64_t vocab_rows, int64_t pos_offset, int64_t rows,
                                         int64_t seq, int64_t cols) {
  const int64_t block = sequence_block(seq);
  Wide wd;
  for (int64_t r0 = 0; r0 < rows; r0 += block) {
    const int64_t nr = std::min(block, rows - r0);
    embedding_backward(dtable, dpos, wd.get(dout + r0 * cols, nr * cols), tokens + r0, vocab_start,
                       vocab_rows, pos_offset, nr, seq, cols);
  }
}

}  // namespace parasol::runtime
