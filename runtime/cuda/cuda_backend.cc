// defines: CudaBackend construction, the caching allocator (raw_alloc/raw_free), pinned host
// memory, copy/zero/synchronize, stream events, scratch, and CudaBackend::gemm, the one GEMM entry
// of the CUDA kernels (cuBLASLt, fp32 storage, bf16 tensor-core math, fp32 accumulation).
#include "runtime/cuda/cuda_backend.h"

#include <cublasLt.h>

#include <algorithm>
#include <cstdio>
#include <string>

#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/kernels.h"

namespace parasol::runtime {

namespace {

#define PARASOL_LT_CHECK(expr)                                                                   \
  do {                                                                                           \
    const cublasStatus_t parasol_st_ = (expr);                                                   \
    if (parasol_st_ != CUBLAS_STATUS_SUCCESS)                                                    \
      throw SystemError("runtime.cuda.gemm", std::string(#expr) + ": cuBLAS status " +           \
                                                 std::to_string(static_cast<int>(parasol_st_))); \
  } while (0)

constexpr size_t kWorkspaceBytes = size_t{32} << 20;

// The size class of a request: 512-byte steps below 8 KiB, then four classes per power of two.
size_t size_class(size_t bytes) {
  if (bytes <= 8192) return (bytes + 511) / 512 * 512;
  size_t p = 8192;
  while (p * 2 < bytes) p *= 2;  // p < bytes <= 2p
  const size_t step = p / 4;
  return (bytes + step - 1) / step * step;
}

size_t alignment_of(const void* p, int64_t ld) {
  auto a = reinterpret_cast<uintptr_t>(p) | static_cast<uintptr_t>(ld * 4) | uintptr_t{256};
  return static_cast<size_t>(a & (~a + 1));  // the lowest set bit, at most 256
}

}  // namespace

bool cuda_device_available() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky "no driver" error
    return false;
  }
  return n > 0;
}

CudaBackend::CudaBackend(int device) : device_(device) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || device < 0 || device >= n)
    throw Error("runtime.cuda", "no CUDA device " + std::to_string(device) + " (" +
                                    std::to_string(n) + " visible)");
  PARASOL_CUDA_CHECK(cudaSetDevice(device));
  PARASOL_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  cublasLtHandle_t lt = nullptr;
  PARASOL_LT_CHECK(cublasLtCreate(&lt));
  lt_ = lt;
  PARASOL_CUDA_CHECK(cudaMalloc(&workspace_, kWorkspaceBytes));
  workspace_bytes_ = kWorkspaceBytes;
}

struct CudaBackend::GemmPlan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool fp32_fallback = false;  // no bf16 algorithm: CUBLAS_COMPUTE_32F
  ~GemmPlan() {
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (desc) cublasLtMatmulDescDestroy(desc);
  }
};

CudaBackend::~CudaBackend() {
  if (capturing_) {
    cudaGraph_t g = nullptr;
    cudaStreamEndCapture(stream_, &g);
    if (g) cudaGraphDestroy(g);
  }
  cudaStreamSynchronize(stream_);
  destroy_graphs();
  release_all();  // back into the free lists
  empty_cache();
  gemm_plans_.clear();
  bf16_plans_.clear();
  cudnn_.reset();  // its cuDNN handle, before the stream it runs on
  for (cudaEvent_t e : mark_events_) cudaEventDestroy(e);
  if (scratch_) cudaFreeAsync(scratch_, stream_);
  cudaStreamSynchronize(stream_);
  if (workspace_) cudaFree(workspace_);
  if (lt_) cublasLtDestroy(static_cast<cublasLtHandle_t>(lt_));
  if (stream_) cudaStreamDestroy(stream_);
}

// ---- Trace timing.

int CudaBackend::mark() {
  if (marks_used_ == static_cast<int>(mark_events_.size())) {
    cudaEvent_t e;
    PARASOL_CUDA_CHECK(cudaEventCreate(&e));
    mark_events_.push_back(e);
  }
  PARASOL_CUDA_CHECK(cudaEventRecord(mark_events_[marks_used_], stream_));
  return marks_used_++;
}

void* CudaBackend::record_fence() {
  cudaEvent_t e;
  PARASOL_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  PARASOL_CUDA_CHECK(cudaEventRecord(e, stream_));
  return e;
}

// Destroying an event whose wait is enqueued is allowed: CUDA frees it once it has completed.
void CudaBackend::release_fence(void* fence) {
  if (fence) cudaEventDestroy(static_cast<cudaEvent_t>(fence));
}

void CudaBackend::wait_fence(void* fence) {
  if (fence) PARASOL_CUDA_CHECK(cudaStreamWaitEvent(stream_, static_cast<cudaEvent_t>(fence), 0));
}

double CudaBackend::mark_seconds(int i) {
  if (i < 0 || i >= marks_used_) throw Error("runtime.mark", "no mark " + std::to_string(i));
  float ms = 0;
  PARASOL_CUDA_CHECK(cudaEventElapsedTime(&ms, mark_events_[0], mark_events_[i]));
  return ms / 1e3;
}

// ---- Memory.

void* CudaBackend::raw_alloc(size_t bytes) {
  const size_t cls = size_class(bytes);
  std::lock_guard<std::mutex> lock(alloc_mu_);
  auto& list = free_lists_[cls];
  if (!list.empty()) {
    void* p = list.back();
    list.pop_back();
    cached_bytes_ -= static_cast<int64_t>(cls);
    return p;
  }
  if (capturing_) refuse_in_capture("an allocation the cache cannot serve (cudaMalloc)");
  void* p = nullptr;
  if (cudaMalloc(&p, cls) != cudaSuccess) {
    (void)cudaGetLastError();
    // Return the cache to the driver and try once more (a device-wide synchronisation: the
    // GPU test counts it, and a step after warm-up must not get here).
    cudaStreamSynchronize(stream_);
    ++synchronizing_calls_;
    for (auto& [c, blocks] : free_lists_) {
      for (void* q : blocks) {
        cudaFree(q);
        block_class_.erase(q);
      }
      blocks.clear();
    }
    cached_bytes_ = 0;
    if (cudaMalloc(&p, cls) != cudaSuccess) {
      (void)cudaGetLastError();
      return nullptr;  // the base class throws parasol::Error
    }
  }
  ++malloc_calls_;
  ++synchronizing_calls_;
  block_class_[p] = cls;
  return p;
}

void CudaBackend::raw_free(void* p) {
  std::lock_guard<std::mutex> lock(alloc_mu_);
  const size_t cls = block_class_.at(p);
  free_lists_[cls].push_back(p);
  cached_bytes_ += static_cast<int64_t>(cls);
}

void CudaBackend::empty_cache() {
  std::lock_guard<std::mutex> lock(alloc_mu_);
  cudaStreamSynchronize(stream_);
  ++synchronizing_calls_;
  for (auto& [cls, blocks] : host_free_lists_) {
    for (void* p : blocks) {
      cudaFreeHost(p);
      host_block_class_.erase(p);
    }
    blocks.clear();
  }
  for (auto& [cls, blocks] : free_lists_) {
    for (void* p : blocks) {
      cudaFree(p);
      block_class_.erase(p);
    }
    blocks.clear();
  }
  cached_bytes_ = 0;
}

int64_t CudaBackend::cuda_malloc_calls() const {
  std::lock_guard<std::mutex> lock(alloc_mu_);
  return malloc_calls_;
}

int64_t CudaBackend::synchronizing_calls() const {
  std::lock_guard<std::mutex> lock(alloc_mu_);
  return synchronizing_calls_;
}

int64_t CudaBackend::cached_bytes() const {
  std::lock_guard<std::mutex> lock(alloc_mu_);
  return cached_bytes_;
}

// Pinned host blocks are cached by size class like device blocks: cudaMallocHost and
// cudaFreeHost synchronise the whole device, so after the first step offloading calls neither.
void* CudaBackend::raw_alloc_host(size_t bytes) {
  const size_t cls = size_class(bytes);
  std::lock_guard<std::mutex> lock(alloc_mu_);
  auto& list = host_free_lists_[cls];
  if (!list.empty()) {
    void* p = list.back();
    list.pop_back();
    return p;
  }
  void* p = nullptr;
  if (cudaMallocHost(&p, cls) != cudaSuccess) {
    (void)cudaGetLastError();
    return nullptr;
  }
  ++synchronizing_calls_;
  host_block_class_[p] = cls;
  return p;
}

void CudaBackend::raw_free_host(void* p) {
  std::lock_guard<std::mutex> lock(alloc_mu_);
  host_free_lists_[host_block_class_.at(p)].push_back(p);
}

void* CudaBackend::scratch(size_t bytes) {
  if (bytes <= scratch_bytes_) return scratch_;
  if (capturing_) refuse_in_capture("a growing scratch");
  if (scratch_) PARASOL_CUDA_CHECK(cudaFreeAsync(scratch_, stream_));
  scratch_ = nullptr;
  scratch_bytes_ = 0;
  const size_t want = std::max(bytes, size_t{1} << 20);
  PARASOL_CUDA_CHECK(cudaMallocAsync(&scratch_, want, stream_));
  scratch_bytes_ = want;
  return scratch_;
}

namespace {
bool is_host(const void* p) {
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    (void)cudaGetLastError();
    return true;
  }
  return a.type != cudaMemoryTypeDevice && a.type != cudaMemoryTypeManaged;
}
}  // namespace

// Only a copy into host memory waits (the caller reads the result at once). A copy from pageable
// host memory is staged by the driver before cudaMemcpyAsync returns; pinned host blocks are only
// read and written by copies on this stream, in order. So the per-micro-batch token copies do not
// stall the host while a communication kernel may wait for its next call.
void CudaBackend::copy(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  const bool host_dst = is_host(dst), host_src = is_host(src);
  if (capturing_ && (host_dst || host_src)) refuse_in_capture("copy() to or from host memory");
  if (host_dst && !host_src) ++traffic_.reads;
  if (host_src && !host_dst) ++traffic_.writes;
  PARASOL_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream_));
  if (host_dst) PARASOL_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaBackend::zero(void* dst, size_t bytes) {
  if (bytes > 0) PARASOL_CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, stream_));
}

void CudaBackend::synchronize() {
  if (capturing_) refuse_in_capture("synchronize()");
  PARASOL_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaBackend::record(cudaEvent_t event) { PARASOL_CUDA_CHECK(cudaEventRecord(event, stream_)); }

void CudaBackend::wait(cudaEvent_t event) {
  PARASOL_CUDA_CHECK(cudaStreamWaitEvent(stream_, event, 0));
}

// ---- GEMM.

void CudaBackend::gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                       const float* a, int64_t lda, const float* b, int64_t ldb, float beta,
                       float* c, int64_t ldc) {
  if (m <= 0 || n <= 0) return;
  if (k <= 0) {  // C = beta C
    cuda::scale_matrix(c, m, n, ldc, beta, stream_);
    return;
  }
  // Row-major C[m x n] = op(A) op(B) is column-major C^T[n x m] = op(B)^T op(A)^T: the
  // column-major view of a row-major matrix is its transpose, so cuBLASLt's "A" is b (n x k after
  // its op) and its "B" is a (k x m after its op).
  const size_t al_a = alignment_of(b, ldb), al_b = alignment_of(a, lda),
               al_c = alignment_of(c, ldc);
  const std::string key = std::to_string(trans_a) + std::to_string(trans_b) + ":" +
                          std::to_string(m) + "," + std::to_string(n) + "," + std::to_string(k) +
                          ":" + std::to_string(lda) + "," + std::to_string(ldb) + "," +
                          std::to_string(ldc) + ":" + std::to_string(al_a) + "," +
                          std::to_string(al_b) + "," + std::to_string(al_c);
  std::lock_guard<std::mutex> lock(gemm_mu_);
  auto it = gemm_plans_.find(key);
  if (it == gemm_plans_.end()) {
    auto plan = std::make_unique<GemmPlan>();
    const cublasOperation_t op_a = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t op_b = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    // Stored (pre-op) column-major shapes.
    PARASOL_LT_CHECK(
        cublasLtMatrixLayoutCreate(&plan->a, CUDA_R_32F, trans_b ? k : n, trans_b ? n : k, ldb));
    PARASOL_LT_CHECK(
        cublasLtMatrixLayoutCreate(&plan->b, CUDA_R_32F, trans_a ? m : k, trans_a ? k : m, lda));
    PARASOL_LT_CHECK(cublasLtMatrixLayoutCreate(&plan->c, CUDA_R_32F, n, m, ldc));
    cublasLtMatmulPreference_t pref = nullptr;
    PARASOL_LT_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    const uint64_t ws = workspace_bytes_;
    const uint32_t aa = static_cast<uint32_t>(al_a), ab = static_cast<uint32_t>(al_b),
                   ac = static_cast<uint32_t>(al_c);
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                         sizeof(ws));
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &aa,
                                         sizeof(aa));
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &ab,
                                         sizeof(ab));
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &ac,
                                         sizeof(ac));
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &ac,
                                         sizeof(ac));
    int found = 0;
    cublasLtMatmulHeuristicResult_t result{};
    for (cublasComputeType_t compute : {CUBLAS_COMPUTE_32F_FAST_16BF, CUBLAS_COMPUTE_32F}) {
      if (plan->desc) cublasLtMatmulDescDestroy(plan->desc);
      plan->desc = nullptr;
      PARASOL_LT_CHECK(cublasLtMatmulDescCreate(&plan->desc, compute, CUDA_R_32F));
      PARASOL_LT_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA,
                                                      &op_a, sizeof(op_a)));
      PARASOL_LT_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB,
                                                      &op_b, sizeof(op_b)));
      found = 0;
      const cublasStatus_t st =
          cublasLtMatmulAlgoGetHeuristic(static_cast<cublasLtHandle_t>(lt_), plan->desc, plan->a,
                                         plan->b, plan->c, plan->c, pref, 1, &result, &found);
      if (st == CUBLAS_STATUS_SUCCESS && found > 0) {
        plan->fp32_fallback = compute == CUBLAS_COMPUTE_32F;
        break;
      }
    }
    cublasLtMatmulPreferenceDestroy(pref);
    if (found == 0) throw Error("runtime.cuda.gemm", "cuBLASLt has no algorithm for " + key);
    plan->algo = result.algo;
    it = gemm_plans_.emplace(key, std::move(plan)).first;
  }
  const GemmPlan& p = *it->second;
  if (p.fp32_fallback)
    note_fallback("gemm", key,
                  "cuBLASLt has no bf16 (CUBLAS_COMPUTE_32F_FAST_16BF) algorithm: fp32");
  else
    count_gemm_bf16();
  PARASOL_LT_CHECK(cublasLtMatmul(static_cast<cublasLtHandle_t>(lt_), p.desc, &alpha, b, p.a, a,
                                  p.b, &beta, c, p.c, c, p.c, &p.algo, workspace_, workspace_bytes_,
                                  stream_));
}

// ---- The libraries' paths and their fallbacks.

CudaBackend::LibraryCounts CudaBackend::library_counts() const {
  std::lock_guard<std::mutex> lock(counts_mu_);
  return counts_;
}

bool CudaBackend::cudnn_built() { return CudnnAttention::built(); }

void CudaBackend::count_fused_attention() {
  std::lock_guard<std::mutex> lock(counts_mu_);
  ++counts_.attention_fused;
}

void CudaBackend::count_gemm_bf16() {
  std::lock_guard<std::mutex> lock(counts_mu_);
  ++counts_.gemm_bf16;
}

void CudaBackend::count_bf16_storage_gemm(bool epilogue_fused) {
  std::lock_guard<std::mutex> lock(counts_mu_);
  ++counts_.gemm_bf16_storage;
  if (epilogue_fused) ++counts_.epilogue_fused;
}

void CudaBackend::note_fallback(const std::string& what, const std::string& shape,
                                const std::string& why) {
  std::lock_guard<std::mutex> lock(counts_mu_);
  if (what == "gemm")
    ++counts_.gemm_fp32_fallbacks;
  else if (what == "epilogue")
    ++counts_.epilogue_fallbacks;
  else if (what == "moe")
    ++counts_.moe_host_fallbacks;
  else
    ++counts_.attention_fallbacks;
  const char* to = what == "gemm"       ? "an fp32 GEMM"
                   : what == "epilogue" ? "separate bf16 kernels"
                   : what == "moe"      ? "the counts on the host (a synchronisation)"
                                        : "parasol's kernel";
  if (logged_.insert(what + "|" + shape + "|" + why).second)
    std::fprintf(stderr, "parasol cuda: %s %s falls back to %s: %s\n", what.c_str(), shape.c_str(),
                 to, why.c_str());
}

}  // namespace parasol::runtime
