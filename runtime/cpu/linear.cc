// defines: CpuBackend::linear_forward, linear_backward_data, linear_backward_weight (one GEMM
// each through cpu::sgemm), bias_forward, bias_backward, and the grouped expert GEMMs
// expert_linear_forward / _backward_data / _backward_weight (one GEMM per expert). W is
// [in x out] as in core/lower.h, so out = in * W (or [out x in] for a tied embedding head).
#include <cstring>

#include "runtime/cpu/cpu_backend.h"
#include "runtime/cpu/vec.h"

namespace parasol::runtime {

namespace {

// out[m x n] = in[m x k] * W (+ bias): the bias is broadcast into out first and the GEMM
// accumulates onto it. W = w[k x n], or w[n x k] transposed when out_in.
void gemm_forward(float* out, const float* in, const float* w, bool out_in, const float* bias,
                  int64_t m, int64_t n, int64_t k) {
  if (bias != nullptr)
    for (int64_t r = 0; r < m; ++r) std::memcpy(out + r * n, bias, sizeof(float) * n);
  cpu::sgemm(false, out_in, m, n, k, 1.0f, in, k, w, out_in ? k : n, bias != nullptr ? 1.0f : 0.0f,
             out, n);
}

// din[m x k] (+)= dout[m x n] * W^T.
void gemm_backward_data(float* din, const float* dout, const float* w, bool out_in, int64_t m,
                        int64_t n, int64_t k, bool accumulate) {
  cpu::sgemm(false, !out_in, m, k, n, 1.0f, dout, n, w, out_in ? k : n, accumulate ? 1.0f : 0.0f,
             din, k);
}

// dW += in^T * dout ([k x n]; out_in: dw[n x k] += dout^T * in); dbias += column sums of dout.
void gemm_backward_weight(float* dw, float* dbias, const float* in, const float* dout, bool out_in,
                          int64_t m, int64_t n, int64_t k) {
  if (dw != nullptr) {
    if (out_in)
      cpu::sgemm(true, false, n, k, m, 1.0f, dout, n, in, k, 1.0f, dw, k);
    else
      cpu::sgemm(true, false, k, n, m, 1.0f, in, k, dout, n, 1.0f, dw, n);
  }
  if (dbias != nullptr) cpu::add_column_sums(dbias, dout, m, n);
}

}  // namespace

void CpuBackend::linear_forward(float* out, const float* in, const float* w, WeightLayout layout,
                                const float* bias, int64_t m, int64_t n, int64_t k) {
  gemm_forward(out, in, w, layout == WeightLayout::kOutIn, bias, m, n, k);
}

void CpuBackend::linear_backward_data(float* din, const float* dout, const float* w,
                                      WeightLayout layout, int64_t m, int64_t n, int64_t k,
                                      bool accumulate) {
  gemm_backward_data(din, dout, w, layout == WeightLayout::kOutIn, m, n, k, accumulate);
}

void CpuBackend::linear_backward_weight(float* dw, float* dbias, const float* in, const float* dout,
                                        WeightLayout layout, int64_t m, int64_t n, int64_t k) {
  gemm_backward_weight(dw, dbias, in, dout, layout == WeightLayout::kOutIn, m, n, k);
}

void CpuBackend::bias_forward(float* out, const float* bias, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) {
    float* o = out + r * cols;
    for (int64_t c = 0; c < cols; ++c) o[c] += bias[c];
  }
}

void CpuBackend::bias_backward(float* dbias, const float* dout, int64_t rows, int64_t cols) {
  cpu::add_column_sums(dbias, dout, rows, cols);
}

// ---- Grouped GEMMs over the local experts: expert e owns counts_host[e] consecutive rows.

void CpuBackend::expert_linear_forward(float* out, const float* in, const float* w,
                                       const float* bias, const int64_t* counts_host,
                                       int64_t experts, int64_t n, int64_t k) {
  int64_t row = 0;
  for (int64_t e = 0; e < experts; ++e) {
    const int64_t rows = counts_host[e];
    gemm_forward(out + row * n, in + row * k, w + e * k * n, false, bias ? bias + e * n : nullptr,
                 rows, n, k);
    row += rows;
  }
}

void CpuBackend::expert_linear_backward_data(float* din, const float* dout, const float* w,
                                             const int64_t* counts_host, int64_t experts, int64_t n,
                                             int64_t k, bool accumulate) {
  int64_t row = 0;
  for (int64_t e = 0; e < experts; ++e) {
    const int64_t rows = counts_host[e];
    gemm_backward_data(din + row * k, dout + row * n, w + e * k * n, false, rows, n, k, accumulate);
    row += rows;
  }
}

void CpuBackend::expert_linear_backward_weight(float* dw, float* dbias, const float* in,
                                               const float* dout, const int64_t* counts_host,
                                               int64_t experts, int64_t n, int64_t k) {
  int64_t row = 0;
  for (int64_t e = 0; e < experts; ++e) {
    const int64_t rows = counts_host[e];
    gemm_backward_weight(dw ? dw + e * k * n : nullptr, dbias ? dbias + e * n : nullptr,
                         in + row * k, dout + row * n, false, rows, n, k);
    row += rows;
  }
}

}  // namespace parasol::runtime
