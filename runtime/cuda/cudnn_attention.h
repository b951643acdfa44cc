// CudnnAttention: attention through cuDNN's fused scaled-dot-product attention (flash attention,
// forward and backward), built with the cuDNN frontend's C++ graph API (header-only: the
// `nvidia-cudnn-frontend` package; cuDNN 9 from the CUDA toolkit). The CUDA backend sends the
// calls runtime/fused_attention.h routes to a fused kernel here, with the band mask that routing
// computed; where this build has no cuDNN, or cuDNN's support check refuses a shape, a call
// returns the reason and the backend runs parasol's own kernel instead (counted and logged).
//
// Numerics: Q, K, V (and in the backward O and dO) are rounded to bf16 (nearest even) into
// packed copies, cuDNN computes in fp32 with bf16 inputs and writes bf16 outputs and the fp32
// log-sum-exp per query ("Stats": max + log sum exp of the scaled, masked scores, natural log:
// the runtime's lse), which are widened into the runtime's fp32 buffers. A ring step's partial
// output merges into the earlier steps' by log-sum-exp (cuda::attention_merge_bf16).
// Graphs are built once per shape and cached; their operands and cuDNN's workspace live in the
// backend's scratch (outside the memory accounting, as the other kernels' scratch).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "runtime/backend.h"
#include "runtime/fused_attention.h"

namespace parasol::runtime {

class CudaBackend;

class CudnnAttention {
 public:
  explicit CudnnAttention(CudaBackend& backend);
  ~CudnnAttention();
  CudnnAttention(const CudnnAttention&) = delete;
  CudnnAttention& operator=(const CudnnAttention&) = delete;

  // Whether this build has cuDNN and its frontend (PARASOL_HAVE_CUDNN).
  static bool built();

  // backend.h's attention_forward (probs not written) with `mask` (fused_attention_route's for
  // d). Returns "" when cuDNN ran it; otherwise nothing was written and the reason is returned.
  std::string forward(const AttentionDims& d, const SdpaMask& mask, float* out, float* lse,
                      const float* q, const float* k, const float* v, bool accumulate);
  // backend.h's attention_backward from lse (never probs), as forward().
  std::string backward(const AttentionDims& d, const SdpaMask& mask, float* dq, float* dk,
                       float* dv, const float* dout, const float* q, const float* k, const float* v,
                       const float* out, const float* lse, bool accumulate_dq, bool accumulate_dkv);
  // The typed entries (backend.h's attention_*_bf16): cuDNN reads and writes the runtime's bf16
  // buffers in place through their row strides (no packed copies); only a ring step's partial
  // output and gradients that add to stored ones pass through bf16 scratch (merged or added in
  // fp32, each element rounded once). Returns as forward().
  std::string forward_bf16(const AttentionDims& d, const SdpaMask& mask, uint16_t* out, float* lse,
                           const uint16_t* q, const uint16_t* k, const uint16_t* v,
                           bool accumulate);
  std::string backward_bf16(const AttentionDims& d, const SdpaMask& mask, uint16_t* dq,
                            uint16_t* dk, uint16_t* dv, const uint16_t* dout, const uint16_t* q,
                            const uint16_t* k, const uint16_t* v, const uint16_t* out,
                            const float* lse, bool accumulate_dq, bool accumulate_dkv);

 private:
  struct Graphs;  // the cuDNN handle and the cached graphs (cudnn_attention.cc)
  CudaBackend& backend_;
  std::unique_ptr<Graphs> graphs_;
};

}  // namespace parasol::runtime
