// defines: CudaBackend::linear_forward_bf16, linear_backward_data_bf16,
// linear_backward_weight_bf16 and run_lt (cuda_backend.h): the linear layers on bf16 storage as
// cuBLASLt GEMMs with bf16 operands, fp32 accumulation (CUBLAS_COMPUTE_32F with bf16 inputs runs
// the tensor cores' bf16 MMA) and cuBLASLt's fused epilogues, as Transformer Engine's
// cublaslt_gemm.cu composes them (bias, GELU with its input kept as the aux matrix, the GELU
// gradient from that aux, bias gradients). Row-major operands use the transpose trick of
// CudaBackend::gemm (cuBLASLt's A is our B): a bias over our output columns is cuBLASLt's bias
// over D's rows; the weight gradient's bias gradient reduces our dout, which is cuBLASLt's A for
// kInOut (BGRADA) and its B for kOutIn (BGRADB). An epilogue cuBLASLt has no algorithm for runs
// as separate bf16 kernels (bf16_elementwise.cu), logged and counted; no bf16 algorithm at all
// throws (there is no fp32 copy to fall back to).
#include <cublasLt.h>

#include <memory>
#include <string>

#include "core/error.h"
#include "runtime/cuda/cuda_backend.h"
#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/kernels.h"

namespace parasol::runtime {

namespace {

#define PARASOL_LT_CALL(expr)                                               \
  do {                                                                      \
    const cublasStatus_t parasol_st_ = (expr);                              \
    if (parasol_st_ != CUBLAS_STATUS_SUCCESS)                               \
      throw SystemError("runtime.cuda.gemm_bf16",                           \
                        std::string(#expr) + ": cuBLAS status " +           \
                            std::to_string(static_cast<int>(parasol_st_))); \
  } while (0)

// The lowest set bit of the address and of the row stride in bytes, at most 256.
uint32_t alignment_of(const void* p, int64_t ld, int64_t elem_bytes) {
  auto a =
      reinterpret_cast<uintptr_t>(p) | static_cast<uintptr_t>(ld * elem_bytes) | uintptr_t{256};
  return static_cast<uint32_t>(a & (~a + 1));
}

struct Bf16Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool fused = true;  // the epilogue is cuBLASLt's (else DEFAULT and separate kernels)
  ~Bf16Plan() {
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (desc) cublasLtMatmulDescDestroy(desc);
  }
};

const char* epilogue_name(cublasLtEpilogue_t e) {
  switch (e) {
    case CUBLASLT_EPILOGUE_DEFAULT:
      return "none";
    case CUBLASLT_EPILOGUE_BIAS:
      return "bias";
    case CUBLASLT_EPILOGUE_GELU_AUX:
      return "gelu_aux";
    case CUBLASLT_EPILOGUE_GELU_AUX_BIAS:
      return "gelu_aux_bias";
    case CUBLASLT_EPILOGUE_DGELU:
      return "dgelu";
    case CUBLASLT_EPILOGUE_DGELU_BGRAD:
      return "dgelu_bgrad";
    case CUBLASLT_EPILOGUE_BGRADA:
      return "bgrada";
    case CUBLASLT_EPILOGUE_BGRADB:
      return "bgradb";
    default:
      return "other";
  }
}

}  // namespace

// One GEMM on bf16 operands: row-major C[m x n] = alpha op(A) op(B) + beta C, C (= D) bf16 or
// fp32, with a cuBLASLt epilogue.
struct CudaBackend::LtCall {
  bool trans_a = false, trans_b = false;
  int64_t m = 0, n = 0, k = 0;
  const uint16_t* a = nullptr;
  int64_t lda = 0;
  const uint16_t* b = nullptr;
  int64_t ldb = 0;
  void* c = nullptr;
  bool c_fp32 = false;
  int64_t ldc = 0;
  float alpha = 1.0f, beta = 0.0f;
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  const void* bias = nullptr;  // BIAS*: bf16 [n] input; BGRAD*: fp32 output
  bool bias_fp32 = false;
  void* aux = nullptr;        // GELU_AUX*: bf16 [m x n] output (ld n); DGELU*: input
  mutable bool fused = true;  // set by run_lt: whether cuBLASLt ran the epilogue
};

void CudaBackend::run_lt(const LtCall& call) {
  const size_t esz_c = call.c_fp32 ? 4 : 2;
  // cuBLASLt's A is our b (n x k after its op), its B our a (k x m), D^T = C (n x m).
  const uint32_t al_a = alignment_of(call.b, call.ldb, 2), al_b = alignment_of(call.a, call.lda, 2),
                 al_c = alignment_of(call.c, call.ldc, static_cast<int64_t>(esz_c));
  const std::string key = "bf16:" + std::to_string(call.trans_a) + std::to_string(call.trans_b) +
                          ":" + std::to_string(call.m) + "," + std::to_string(call.n) + "," +
                          std::to_string(call.k) + ":" + std::to_string(call.lda) + "," +
                          std::to_string(call.ldb) + "," + std::to_string(call.ldc) + ":" +
                          std::to_string(al_a) + "," + std::to_string(al_b) + "," +
                          std::to_string(al_c) + ":" + (call.c_fp32 ? "f32" : "bf16") + ":" +
                          epilogue_name(call.epilogue) + (call.bias_fp32 ? "/f32" : "");
  std::lock_guard<std::mutex> lock(gemm_mu_);
  auto it = bf16_plans_.find(key);
  if (it == bf16_plans_.end()) {
    auto plan = std::make_shared<Bf16Plan>();
    const cublasOperation_t op_a = call.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t op_b = call.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    const int64_t m = call.m, n = call.n, k = call.k;
    PARASOL_LT_CALL(cublasLtMatrixLayoutCreate(&plan->a, CUDA_R_16BF, call.trans_b ? k : n,
                                               call.trans_b ? n : k, call.ldb));
    PARASOL_LT_CALL(cublasLtMatrixLayoutCreate(&plan->b, CUDA_R_16BF, call.trans_a ? m : k,
                                               call.trans_a ? k : m, call.lda));
    PARASOL_LT_CALL(cublasLtMatrixLayoutCreate(&plan->c, call.c_fp32 ? CUDA_R_32F : CUDA_R_16BF, n,
                                               m, call.ldc));
    cublasLtMatmulPreference_t pref = nullptr;
    PARASOL_LT_CALL(cublasLtMatmulPreferenceCreate(&pref));
    const uint64_t ws = workspace_bytes_;
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                         sizeof(ws));
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a,
                                         sizeof(al_a));
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b,
                                         sizeof(al_b));
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_c,
                                         sizeof(al_c));
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_c,
                                         sizeof(al_c));
    int found = 0;
    cublasLtMatmulHeuristicResult_t result{};
    // The epilogue asked for, then (when cuBLASLt has none for it) the plain GEMM.
    for (cublasLtEpilogue_t epi : {call.epilogue, CUBLASLT_EPILOGUE_DEFAULT}) {
      if (plan->desc) cublasLtMatmulDescDestroy(plan->desc);
      plan->desc = nullptr;
      PARASOL_LT_CALL(cublasLtMatmulDescCreate(&plan->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
      PARASOL_LT_CALL(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a,
                                                     sizeof(op_a)));
      PARASOL_LT_CALL(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b,
                                                     sizeof(op_b)));
      PARASOL_LT_CALL(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE,
                                                     &epi, sizeof(epi)));
      if (epi != CUBLASLT_EPILOGUE_DEFAULT) {
        if (call.bias != nullptr) {
          const cudaDataType_t bt = call.bias_fp32 ? CUDA_R_32F : CUDA_R_16BF;
          PARASOL_LT_CALL(cublasLtMatmulDescSetAttribute(
              plan->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof(bt)));
        }
        if (call.aux != nullptr) {
          const int64_t ld_aux = n;  // the aux matrix is D's shape, dense
          PARASOL_LT_CALL(cublasLtMatmulDescSetAttribute(
              plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld_aux, sizeof(ld_aux)));
        }
      }
      found = 0;
      const cublasStatus_t st =
          cublasLtMatmulAlgoGetHeuristic(static_cast<cublasLtHandle_t>(lt_), plan->desc, plan->a,
                                         plan->b, plan->c, plan->c, pref, 1, &result, &found);
      if (st == CUBLAS_STATUS_SUCCESS && found > 0) {
        plan->fused = epi == call.epilogue;
        break;
      }
      if (call.epilogue == CUBLASLT_EPILOGUE_DEFAULT) break;
    }
    cublasLtMatmulPreferenceDestroy(pref);
    if (found == 0)
      throw Error("runtime.cuda.gemm_bf16",
                  "cuBLASLt has no bf16 algorithm (CUBLAS_COMPUTE_32F, bf16 operands) for " + key);
    plan->algo = result.algo;
    it = bf16_plans_.emplace(key, std::shared_ptr<void>(plan, plan.get())).first;
  }
  const auto* p = static_cast<const Bf16Plan*>(it->second.get());
  call.fused = p->fused || call.epilogue == CUBLASLT_EPILOGUE_DEFAULT;
  if (p->fused && call.epilogue != CUBLASLT_EPILOGUE_DEFAULT) {
    // The pointers are per call: set on the cached descriptor (under gemm_mu_).
    if (call.bias != nullptr)
      PARASOL_LT_CALL(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                     &call.bias, sizeof(call.bias)));
    if (call.aux != nullptr)
      PARASOL_LT_CALL(cublasLtMatmulDescSetAttribute(
          p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &call.aux, sizeof(call.aux)));
  }
  PARASOL_LT_CALL(cublasLtMatmul(static_cast<cublasLtHandle_t>(lt_), p->desc, &call.alpha, call.b,
                                 p->a, call.a, p->b, &call.beta, call.c, p->c, call.c, p->c,
                                 &p->algo, workspace_, workspace_bytes_, stream_));
  // counts_mu_ is taken inside gemm_mu_, as gemm() does.
  count_bf16_storage_gemm(p->fused && call.epilogue != CUBLASLT_EPILOGUE_DEFAULT);
  if (!call.fused)
    note_fallback("epilogue", key,
                  std::string("cuBLASLt has no algorithm with the ") +
                      epilogue_name(call.epilogue) + " epilogue");
}

void CudaBackend::linear_forward_bf16(uint16_t* out, const uint16_t* in, const uint16_t* w,
                                      WeightLayout layout, const uint16_t* bias, uint16_t* gelu_pre,
                                      int64_t m, int64_t n, int64_t k) {
  if (m <= 0 || n <= 0) return;
  const bool out_in = layout == WeightLayout::kOutIn, gelu = gelu_pre != nullptr;
  if (k <= 0) {  // in W is 0: only the epilogue
    zero(out, static_cast<size_t>(m * n) * 2);
    cuda::bias_act_bf16(out, n, gelu_pre, bias, gelu, m, n, stream_);
    return;
  }
  LtCall c;
  c.trans_b = out_in;
  c.m = m;
  c.n = n;
  c.k = k;
  c.a = in;
  c.lda = k;
  c.b = w;
  c.ldb = out_in ? k : n;
  c.c = out;
  c.ldc = n;
  c.epilogue = gelu ? (bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX)
                    : (bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT);
  c.bias = bias;
  c.aux = gelu_pre;
  run_lt(c);
  if (!c.fused) cuda::bias_act_bf16(out, n, gelu_pre, bias, gelu, m, n, stream_);
}

void CudaBackend::linear_backward_data_bf16(uint16_t* din, const uint16_t* dout, const uint16_t* w,
                                            WeightLayout layout, const uint16_t* gelu_pre,
                                            float* dbias_of_din, int64_t m, int64_t n, int64_t k,
                                            bool accumulate) {
  if (gelu_pre != nullptr && accumulate)
    throw Error("runtime.cuda",
                "linear_backward_data_bf16: the GELU gradient epilogue applies to "
                "the product alone (accumulate must be false with gelu_pre)");
  if (dbias_of_din != nullptr && gelu_pre == nullptr)
    throw Error("runtime.cuda",
                "linear_backward_data_bf16: dbias_of_din needs gelu_pre (the "
                "DGELU_BGRAD epilogue)");
  if (m <= 0 || k <= 0) return;
  const bool out_in = layout == WeightLayout::kOutIn;
  if (n <= 0) {
    if (!accumulate) zero(din, static_cast<size_t>(m * k) * 2);
    return;
  }
  float* db = nullptr;
  if (dbias_of_din != nullptr) db = static_cast<float*>(scratch(sizeof(float) * k));
  LtCall c;
  c.trans_b = !out_in;
  c.m = m;
  c.n = k;
  c.k = n;
  c.a = dout;
  c.lda = n;
  c.b = w;
  c.ldb = out_in ? k : n;
  c.c = din;
  c.ldc = k;
  c.beta = accumulate ? 1.0f : 0.0f;
  if (gelu_pre != nullptr) {
    c.epilogue = db ? CUBLASLT_EPILOGUE_DGELU_BGRAD : CUBLASLT_EPILOGUE_DGELU;
    c.aux = const_cast<uint16_t*>(gelu_pre);  // an input of DGELU
    c.bias = db;
    c.bias_fp32 = true;
  }
  run_lt(c);
  if (gelu_pre == nullptr) return;
  if (c.fused) {
    if (db != nullptr) cuda::add_f32(dbias_of_din, db, k, stream_);
    return;
  }
  cuda::gelu_backward_bf16(din, din, gelu_pre, m * k, stream_);
  if (dbias_of_din != nullptr) {
    auto* s = static_cast<float*>(scratch(sizeof(float) * cuda::column_sums_scratch(m, k)));
    cuda::add_column_sums_bf16(dbias_of_din, din, m, k, s, stream_);
  }
}

void CudaBackend::linear_backward_weight_bf16(void* dw, Dtype dw_type, float* dbias,
                                              const uint16_t* in, const uint16_t* dout,
                                              WeightLayout layout, int64_t m, int64_t n,
                                              int64_t k) {
  if (dw_type != Dtype::kFp32 && dw_type != Dtype::kBf16)
    throw Error("runtime.cuda", std::string("linear_backward_weight_bf16: dw of dtype ") +
                                    dtype_name(dw_type) + " (fp32 or bf16)");
  if (n <= 0 || m <= 0) return;
  const bool out_in = layout == WeightLayout::kOutIn;
  float* db = nullptr;
  if (dbias != nullptr) db = static_cast<float*>(scratch(sizeof(float) * n));
  if (dw != nullptr && k > 0) {
    LtCall c;
    c.trans_a = true;
    c.k = m;
    if (out_in) {  // dw[n x k] += dout^T in
      c.m = n;
      c.n = k;
      c.a = dout;
      c.lda = n;
      c.b = in;
      c.ldb = k;
      c.ldc = k;
      c.epilogue = db ? CUBLASLT_EPILOGUE_BGRADB : CUBLASLT_EPILOGUE_DEFAULT;
    } else {  // dw[k x n] += in^T dout
      c.m = k;
      c.n = n;
      c.a = in;
      c.lda = k;
      c.b = dout;
      c.ldb = n;
      c.ldc = n;
      c.epilogue = db ? CUBLASLT_EPILOGUE_BGRADA : CUBLASLT_EPILOGUE_DEFAULT;
    }
    c.c = dw;
    c.c_fp32 = dw_type == Dtype::kFp32;
    c.beta = 1.0f;
    c.bias = db;
    c.bias_fp32 = true;
    run_lt(c);
    if (db != nullptr && c.fused) {
      cuda::add_f32(dbias, db, n, stream_);
      return;
    }
  }
  if (dbias != nullptr) {
    auto* s = static_cast<float*>(scratch(sizeof(float) * cuda::column_sums_scratch(m, n)));
    cuda::add_column_sums_bf16(dbias, dout, m, n, s, stream_);
  }
}

}  // namespace parasol::runtime
