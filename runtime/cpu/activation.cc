// defines: CpuBackend::activation_forward, activation_backward: gelu (the tanh approximation of
// GPT-2, as llm.c) and swiglu (silu(gate) * up over an input whose columns are gate | up).
// gelu's 0.5 (1 + tanh(u)) is evaluated as sigmoid(2u), the same function without the
// cancellation of 1 + tanh(u) for negative inputs (and one exp instead of a tanh). The loops
// vectorise (cpu::sigmoid has no libm call) and are compiled for AVX2 too (PARASOL_CPU_CLONES).
#include "runtime/cpu/cpu_backend.h"
#include "runtime/cpu/vec.h"

namespace parasol::runtime {

namespace {

constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluCube = 0.044715f;

// No __restrict: in place is allowed.
PARASOL_CPU_CLONES void gelu_forward(float* out, const float* in, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float x = in[i];
    out[i] = x * cpu::sigmoid(2.0f * kGeluScale * (x + kGeluCube * x * x * x));
  }
}

PARASOL_CPU_CLONES void gelu_backward(float* din, const float* dout, const float* in, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    // With s = sigmoid(2u) = (1 + tanh u) / 2 and 1 - tanh^2 u = 4 s (1 - s):
    // d/dx [x s] = s + 2 x s (1 - s) u'(x).
    const float x = in[i];
    const float s = cpu::sigmoid(2.0f * kGeluScale * (x + kGeluCube * x * x * x));
    const float du = kGeluScale * (1.0f + 3.0f * kGeluCube * x * x);
    din[i] = (s + 2.0f * x * s * (1.0f - s) * du) * dout[i];
  }
}

PARASOL_CPU_CLONES void swiglu_forward(float* __restrict out, const float* __restrict in,
                                       int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* gate = in + r * 2 * cols;
    const float* up = gate + cols;
    float* o = out + r * cols;
    for (int64_t c = 0; c < cols; ++c) o[c] = gate[c] * cpu::sigmoid(gate[c]) * up[c];
  }
}

PARASOL_CPU_CLONES void swiglu_backward(float* __restrict din, const float* __restrict dout,
                                        const float* __restrict in, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* gate = in + r * 2 * cols;
    const float* up = gate + cols;
    const float* d = dout + r * cols;
    float* dgate = din + r * 2 * cols;
    float* dup = dgate + cols;
    for (int64_t c = 0; c < cols; ++c) {
      // silu(g) = g s, silu'(g) = s (1 + g (1 - s)).
      const float s = cpu::sigmoid(gate[c]);
      dgate[c] = d[c] * up[c] * s * (1.0f + gate[c] * (1.0f - s));
      dup[c] = d[c] * gate[c] * s;
    }
  }
}

}  // namespace

void CpuBackend::activation_forward(Activation kind, float* out, const float* in, int64_t rows,
                                    int64_t cols) {
  if (kind == Activation::kGelu)
    gelu_forward(out, in, rows * cols);
  else
    swiglu_forward(out, in, rows, cols);
}

void CpuBackend::activation_backward(Activation kind, float* din, const float* dout,
                                     const float* in, int64_t rows, int64_t cols) {
  if (kind == Activation::kGelu)
    gelu_backward(din, dout, in, rows * cols);
  else
    swiglu_backward(din, dout, in, rows, cols);
}

}  // namespace parasol::runtime
