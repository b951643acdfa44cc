// defines: CpuBackend construction, raw memory (64-byte aligned host allocations for both
// spaces), copy/zero, the graphs' dry run, and cpu::sgemm, the one GEMM entry of the CPU kernels
// (OpenBLAS).
#include "runtime/cpu/cpu_backend.h"

#include <cblas.h>

#include <climits>
#include <cstdlib>
#include <cstring>
#include <string>

#include "core/error.h"

namespace parasol::runtime {

CpuBackend::CpuBackend(int gemm_threads) {
  if (gemm_threads > 0) openblas_set_num_threads(gemm_threads);
}

CpuBackend::~CpuBackend() { release_all(); }

int CpuBackend::gemm_threads() const { return openblas_get_num_threads(); }

namespace {
void* aligned(size_t bytes) {
  constexpr size_t kAlign = 64;
  return std::aligned_alloc(kAlign, (bytes + kAlign - 1) / kAlign * kAlign);
}
}  // namespace

void* CpuBackend::raw_alloc(size_t bytes) { return aligned(bytes); }
void CpuBackend::raw_free(void* p) { std::free(p); }
void* CpuBackend::raw_alloc_host(size_t bytes) { return aligned(bytes); }
void CpuBackend::raw_free_host(void* p) { std::free(p); }

void CpuBackend::copy(void* dst, const void* src, size_t bytes) {
  if (bytes > 0) std::memcpy(dst, src, bytes);
}

void CpuBackend::zero(void* dst, size_t bytes) {
  if (bytes > 0) std::memset(dst, 0, bytes);
}

void CpuBackend::begin_capture() {
  if (!graph_dry_run_ || capturing_)
    throw Error("runtime.backend", "cpu records no graphs (begin_capture)");
  capturing_ = true;
}

int CpuBackend::end_capture() {
  if (!capturing_) throw Error("runtime.backend", "end_capture() without begin_capture()");
  capturing_ = false;
  return static_cast<int>(graph_captures_++);
}

void CpuBackend::replay(int graph) {
  if (graph < 0 || graph >= graph_captures_ || capturing_)
    throw Error("runtime.backend", "no graph " + std::to_string(graph) + " to replay");
  ++graph_replays_;
}

namespace cpu {

void sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
           int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (m <= 0 || n <= 0) return;
  for (int64_t v : {m, n, k, lda, ldb, ldc})
    if (v > INT_MAX)
      throw Error("runtime.cpu.sgemm", "dimension " + std::to_string(v) + " exceeds the BLAS int");
  if (k <= 0) {  // C = beta * C (BLAS would do the same; spelled out for clarity)
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) c[i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[i * ldc + j];
    return;
  }
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, static_cast<int>(m), static_cast<int>(n),
              static_cast<int>(k), alpha, a, static_cast<int>(lda), b, static_cast<int>(ldb), beta,
              c, static_cast<int>(ldc));
}

}  // namespace cpu

}  // namespace parasol::runtime
