// defines: cuda::router_softmax, router_topk, router_backward, dispatch_forward/backward,
// combine_forward/backward (runtime/cpu/moe.cc's kernels on the GPU), and dispatch and combine
// on bf16 rows (the same kernels templated on the storage type: fp32 sums, one rounding). The
// router works one thread per token (experts and top_k are small), with the CPU's repeated
// selection for the top-k (ties: the lower index). moe_permutation is built on the host
// (backend_ops.cc).
#include "runtime/cuda/cuda_common.cuh"

namespace parasol::runtime::cuda {

namespace {

__global__ void router_softmax_kernel(float* probs, const float* logits, int64_t tokens,
                                      int64_t experts) {
  PARASOL_GRID_STRIDE(t, tokens) {
    const float* l = logits + t * experts;
    float* p = probs + t * experts;
    float mx = l[0];
    for (int64_t e = 1; e < experts; ++e) mx = fmaxf(mx, l[e]);
    double sum = 0.0;
    for (int64_t e = 0; e < experts; ++e) {
      p[e] = expf(l[e] - mx);
      sum += p[e];
    }
    const float inv = static_cast<float>(1.0 / sum);
    for (int64_t e = 0; e < experts; ++e) p[e] *= inv;
  }
}

__global__ void router_topk_kernel(int32_t* topk_idx, float* topk_w, const float* probs,
                                   int64_t tokens, int64_t experts, int64_t top_k,
                                   bool renormalize) {
  PARASOL_GRID_STRIDE(t, tokens) {
    const float* p = probs + t * experts;
    int32_t* idx = topk_idx + t * top_k;
    float* w = topk_w + t * top_k;
    float total = 0.0f;
    for (int64_t s = 0; s < top_k; ++s) {
      int64_t best = -1;
      for (int64_t e = 0; e < experts; ++e) {
        bool taken = false;
        for (int64_t u = 0; u < s; ++u) taken |= idx[u] == e;
        if (taken) continue;
        if (best < 0 || p[e] > p[best]) best = e;
      }
      idx[s] = static_cast<int32_t>(best);
      w[s] = p[best];
      total += p[best];
    }
    if (renormalize)
      for (int64_t s = 0; s < top_k; ++s) w[s] /= total;
  }
}

__global__ void router_backward_kernel(float* dlogits, const float* dtopk_w, const float* probs,
                                       const int32_t* topk_idx, int64_t tokens, int64_t experts,
                                       int64_t top_k, bool renormalize) {
  PARASOL_GRID_STRIDE(t, tokens) {
    const float* p = probs + t * experts;
    const int32_t* idx = topk_idx + t * top_k;
    const float* dw = dtopk_w + t * top_k;
    float z = 0.0f, dot = 0.0f;
    if (renormalize) {
      for (int64_t s = 0; s < top_k; ++s) z += p[idx[s]];
      for (int64_t s = 0; s < top_k; ++s) dot += dw[s] * p[idx[s]] / z;
    }
    // dp is nonzero only at the selected experts: contribution c_s of slot s.
    float dpp = 0.0f;  // sum_e dp_e p_e
    for (int64_t s = 0; s < top_k; ++s) {
      const float c = renormalize ? (dw[s] - dot) / z : dw[s];
      dpp += c * p[idx[s]];
    }
    float* dl = dlogits + t * experts;
    for (int64_t e = 0; e < experts; ++e) {
      float dpe = 0.0f;
      for (int64_t s = 0; s < top_k; ++s)
        if (idx[s] == e) dpe += renormalize ? (dw[s] - dot) / z : dw[s];
      dl[e] = p[e] * (dpe - dpp);
    }
  }
}

// Rows of T: float (the fp32 entries) or uint16_t (bf16 storage: the same fp32 arithmetic on the
// widened values, each output rounded once).
__device__ inline float ld(const float* p) { return *p; }
__device__ inline float ld(const uint16_t* p) { return bf16_to_fp32(*p); }
__device__ inline void st(float* p, float v) { *p = v; }
__device__ inline void st(uint16_t* p, float v) { *p = fp32_to_bf16(v); }

template <typename T>
__global__ void dispatch_forward_kernel(T* out, const T* x, const int32_t* row_of, int64_t tokens,
                                        int64_t top_k, int64_t cols) {
  PARASOL_GRID_STRIDE(i, tokens * top_k * cols) {
    const int64_t ts = i / cols, c = i % cols;
    out[static_cast<int64_t>(row_of[ts]) * cols + c] = x[(ts / top_k) * cols + c];
  }
}

template <typename T>
__global__ void dispatch_backward_kernel(T* dx, const T* dout, const int32_t* row_of,
                                         int64_t tokens, int64_t top_k, int64_t cols) {
  PARASOL_GRID_STRIDE(i, tokens * cols) {
    const int64_t t = i / cols, c = i % cols;
    float s = ld(dout + static_cast<int64_t>(row_of[t * top_k]) * cols + c);
    for (int64_t u = 1; u < top_k; ++u)
      s += ld(dout + static_cast<int64_t>(row_of[t * top_k + u]) * cols + c);
    st(dx + i, s);
  }
}

template <typename T>
__global__ void combine_forward_kernel(T* out, const T* expert_out, const float* w,
                                       const int32_t* row_of, int64_t tokens, int64_t top_k,
                                       int64_t cols) {
  PARASOL_GRID_STRIDE(i, tokens * cols) {
    const int64_t t = i / cols, c = i % cols;
    float o = 0.0f;
    for (int64_t s = 0; s < top_k; ++s)
      o += w[t * top_k + s] *
           ld(expert_out + static_cast<int64_t>(row_of[t * top_k + s]) * cols + c);
    st(out + i, o);
  }
}

template <typename T>
__global__ void combine_dexpert_kernel(T* dexpert_out, const T* dout, const float* w,
                                       const int32_t* row_of, int64_t tokens, int64_t top_k,
                                       int64_t cols) {
  PARASOL_GRID_STRIDE(i, tokens * top_k * cols) {
    const int64_t ts = i / cols, c = i % cols;
    st(dexpert_out + static_cast<int64_t>(row_of[ts]) * cols + c,
       w[ts] * ld(dout + (ts / top_k) * cols + c));
  }
}

// One block per (token, slot): dw = dot(dout[t], expert_out[row]).
template <typename T>
__global__ void combine_dw_kernel(float* dw, const T* dout, const T* expert_out,
                                  const int32_t* row_of, int64_t top_k, int64_t cols) {
  __shared__ float red[32];
  const int64_t ts = blockIdx.x;
  const T* g = dout + (ts / top_k) * cols;
  const T* e = expert_out + static_cast<int64_t>(row_of[ts]) * cols;
  float s = 0.0f;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) s += ld(g + c) * ld(e + c);
  s = block_sum(s, red);
  if (threadIdx.x == 0) dw[ts] = s;
}

}  // namespace

void router_softmax(float* probs, const float* logits, int64_t tokens, int64_t experts,
                    cudaStream_t s) {
  if (tokens <= 0) return;
  router_softmax_kernel<<<grid_for(tokens, 128), 128, 0, s>>>(probs, logits, tokens, experts);
  PARASOL_CUDA_LAUNCHED();
}

void router_topk(int32_t* topk_idx, float* topk_w, const float* probs, int64_t tokens,
                 int64_t experts, int64_t top_k, bool renormalize, cudaStream_t s) {
  if (tokens <= 0) return;
  router_topk_kernel<<<grid_for(tokens, 128), 128, 0, s>>>(topk_idx, topk_w, probs, tokens, experts,
                                                           top_k, renormalize);
  PARASOL_CUDA_LAUNCHED();
}

void router_backward(float* dlogits, const float* dtopk_w, const float* probs,
                     const int32_t* topk_idx, int64_t tokens, int64_t experts, int64_t top_k,
                     bool renormalize, cudaStream_t s) {
  if (tokens <= 0) return;
  router_backward_kernel<<<grid_for(tokens, 128), 128, 0, s>>>(dlogits, dtopk_w, probs, topk_idx,
                                                               tokens, experts, top_k, renormalize);
  PARASOL_CUDA_LAUNCHED();
}

namespace {

template <typename T>
void dispatch_forward_t(T* out, const T* x, const int32_t* row_of, int64_t tokens, int64_t top_k,
                        int64_t cols, cudaStream_t s) {
  if (tokens * top_k * cols <= 0) return;
  dispatch_forward_kernel<T>
      <<<grid_for(tokens * top_k * cols), kThreads, 0, s>>>(out, x, row_of, tokens, top_k, cols);
  PARASOL_CUDA_LAUNCHED();
}

template <typename T>
void dispatch_backward_t(T* dx, const T* dout, const int32_t* row_of, int64_t tokens, int64_t top_k,
                         int64_t cols, cudaStream_t s) {
  if (tokens * top_k * cols <= 0) return;
  dispatch_backward_kernel<T>
      <<<grid_for(tokens * cols), kThreads, 0, s>>>(dx, dout, row_of, tokens, top_k, cols);
  PARASOL_CUDA_LAUNCHED();
}

template <typename T>
void combine_forward_t(T* out, const T* expert_out, const float* w, const int32_t* row_of,
                       int64_t tokens, int64_t top_k, int64_t cols, cudaStream_t s) {
  if (tokens * cols <= 0) return;
  combine_forward_kernel<T><<<grid_for(tokens * cols), kThreads, 0, s>>>(out, expert_out, w, row_of,
                                                                         tokens, top_k, cols);
  PARASOL_CUDA_LAUNCHED();
}

template <typename T>
void combine_backward_t(T* dexpert_out, float* dw, const T* dout, const T* expert_out,
                        const float* w, const int32_t* row_of, int64_t tokens, int64_t top_k,
                        int64_t cols, cudaStream_t s) {
  if (tokens * top_k <= 0) return;
  if (cols > 0) {
    combine_dexpert_kernel<T><<<grid_for(tokens * top_k * cols), kThreads, 0, s>>>(
        dexpert_out, dout, w, row_of, tokens, top_k, cols);
    PARASOL_CUDA_LAUNCHED();
  }
  combine_dw_kernel<T><<<static_cast<unsigned>(tokens * top_k), 128, 0, s>>>(dw, dout, expert_out,
                                                                             row_of, top_k, cols);
  PARASOL_CUDA_LAUNCHED();
}

}  // namespace

void dispatch_forward(float* out, const float* x, const int32_t* row_of, int64_t tokens,
                      int64_t top_k, int64_t cols, cudaStream_t s) {
  dispatch_forward_t(out, x, row_of, tokens, top_k, cols, s);
}
void dispatch_backward(float* dx, const float* dout, const int32_t* row_of, int64_t tokens,
                       int64_t top_k, int64_t cols, cudaStream_t s) {
  dispatch_backward_t(dx, dout, row_of, tokens, top_k, cols, s);
}
void combine_forward(float* out, const float* expert_out, const float* w, const int32_t* row_of,
                     int64_t tokens, int64_t top_k, int64_t cols, cudaStream_t s) {
  combine_forward_t(out, expert_out, w, row_of, tokens, top_k, cols, s);
}
void combine_backward(float* dexpert_out, float* dw, const float* dout, const float* expert_out,
                      const float* w, const int32_t* row_of, int64_t tokens, int64_t top_k,
                      int64_t cols, cudaStream_t s) {
  combine_backward_t(dexpert_out, dw, dout, expert_out, w, row_of, tokens, top_k, cols, s);
}

void dispatch_forward_bf16(uint16_t* out, const uint16_t* x, const int32_t* row_of, int64_t tokens,
                           int64_t top_k, int64_t cols, cudaStream_t s) {
  dispatch_forward_t(out, x, row_of, tokens, top_k, cols, s);
}
void dispatch_backward_bf16(uint16_t* dx, const uint16_t* dout, const int32_t* row_of,
                            int64_t tokens, int64_t top_k, int64_t cols, cudaStream_t s) {
  dispatch_backward_t(dx, dout, row_of, tokens, top_k, cols, s);
}
void combine_forward_bf16(uint16_t* out, const uint16_t* expert_out, const float* w,
                          const int32_t* row_of, int64_t tokens, int64_t top_k, int64_t cols,
                          cudaStream_t s) {
  combine_forward_t(out, expert_out, w, row_of, tokens, top_k, cols, s);
}
void combine_backward_bf16(uint16_t* dexpert_out, float* dw, const uint16_t* dout,
                           const uint16_t* expert_out, const float* w, const int32_t* row_of,
                           int64_t tokens, int64_t top_k, int64_t cols, cudaStream_t s) {
  combine_backward_t(dexpert_out, dw, dout, expert_out, w, row_of, tokens, top_k, cols, s);
}

}  // namespace parasol::runtime::cuda
