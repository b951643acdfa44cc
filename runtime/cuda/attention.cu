// defines: cuda::attention_forward, attention_backward (runtime/cpu/attention.cc's kernels on the
// GPU): causal GQA attention with causal_offset, sliding windows, value heads of their own width,
// the ring-step merge (`accumulate`) and dropout on the probabilities (masks re-drawn from the seed
// with dropout_keep, so they equal the CPU's). A straightforward, correctness-first design, not
// FlashAttention:
//   forward: one block per (sequence b, head h, query row i); keys in tiles of blockDim, one
//     thread per key for the score, an online softmax (running max and sum) across tiles, the
//     output row accumulated in shared memory; any seq_kv.
//   backward: (1) one block per query row: delta = dout . out and dq (over the keys it sees);
//     (2) one block per (sequence, kv head g, key row j): dk and dv summed over every query head
//     of g's group and every query that sees j, so each output row has one writer (no atomics,
//     deterministic).
#include <cmath>

#include "runtime/cuda/cuda_common.cuh"
#include "runtime/cuda/kernels.h"

namespace parasol::runtime::cuda {

namespace {

constexpr int kAttnThreads = 128;

__device__ inline int64_t clamp_kv(const AttnShape& d, int64_t j) {
  return j < 0 ? 0 : (j > d.seq_kv ? d.seq_kv : j);
}
// The keys query i sees: [first_key, last_key) (backend.h's AttentionDims).
__device__ inline int64_t first_key(const AttnShape& d, int64_t i) {
  if (!d.causal || d.window <= 0) return 0;
  return clamp_kv(d, i + d.causal_offset - d.window + 1);
}
__device__ inline int64_t last_key(const AttnShape& d, int64_t i) {
  return d.causal ? clamp_kv(d, i + d.causal_offset + 1) : d.seq_kv;
}

__device__ inline float dot_sh(const float* sh, const float* g, int64_t n) {
  float s = 0.0f;
  for (int64_t t = 0; t < n; ++t) s += sh[t] * g[t];
  return s;
}

__global__ void attention_forward_kernel(AttnShape d, float* out, float* lse, float* probs,
                                         const float* q, const float* k, const float* v,
                                         bool accumulate, uint32_t threshold, float keep_scale) {
  extern __shared__ float sh[];
  const int64_t D = d.head_dim, Dv = d.v_head_dim;
  float* qs = sh;
  float* acc = qs + D;
  float* ps = acc + Dv;
  float* red = ps + blockDim.x;
  int64_t idx = blockIdx.x;
  const int64_t i = idx % d.seq_q;
  idx /= d.seq_q;
  const int64_t h = idx % d.heads, b = idx / d.heads;
  const int64_t g = h / (d.heads / d.kv_heads);
  const float* qr = q + (b * d.seq_q + i) * d.ld_q + h * D;
  const float* kb = k + b * d.seq_kv * d.ld_kv + g * D;
  const float* vb = v + b * d.seq_kv * d.ld_kv + g * Dv;
  const int64_t row = (b * d.heads + h) * d.seq_q + i;  // lse index; mask row base row * seq_kv
  const int tid = threadIdx.x, bd = blockDim.x;
  for (int64_t t = tid; t < D; t += bd) qs[t] = qr[t];
  for (int64_t t = tid; t < Dv; t += bd) acc[t] = 0.0f;
  __syncthreads();
  const int64_t j_first = first_key(d, i), j_last = last_key(d, i);
  const bool any = j_last > j_first;
  const bool drop = d.dropout_p > 0.0f;
  float m = -INFINITY, l = 0.0f;
  for (int64_t j0 = j_first; j0 < j_last; j0 += bd) {
    const int64_t j = j0 + tid;
    const float s = j < j_last ? dot_sh(qs, kb + j * d.ld_kv, D) * d.scale : -INFINITY;
    const float m_new = fmaxf(m, block_max(s, red));
    const float p = j < j_last ? expf(s - m_new) : 0.0f;
    const float corr = expf(m - m_new);  // 0 on the first tile (m = -inf)
    l = l * corr + block_sum(p, red);
    float pv = p;
    if (drop && j < j_last)
      pv = dropout_keep(d.dropout_seed, static_cast<uint64_t>(row * d.seq_kv + j), threshold)
               ? p * keep_scale
               : 0.0f;
    ps[tid] = pv;
    __syncthreads();
    const int64_t nt = j_last - j0 < bd ? j_last - j0 : bd;
    for (int64_t t = tid; t < Dv; t += bd) {
      float a = acc[t] * corr;
      for (int64_t jj = 0; jj < nt; ++jj) a += ps[jj] * vb[(j0 + jj) * d.ld_kv + t];
      acc[t] = a;
    }
    m = m_new;
    __syncthreads();
  }
  const float lc = any ? m + logf(l) : -INFINITY;
  const float inv_l = any ? 1.0f / l : 0.0f;
  float* orow = out + (b * d.seq_q + i) * d.ld_o + h * Dv;
  if (!accumulate) {
    for (int64_t t = tid; t < Dv; t += bd) orow[t] = acc[t] * inv_l;
    if (lse != nullptr && tid == 0) lse[row] = lc;
  } else if (lc != -INFINITY) {
    const float lo = lse[row];
    if (lo == -INFINITY) {
      for (int64_t t = tid; t < Dv; t += bd) orow[t] = acc[t] * inv_l;
    } else {
      const float mx = fmaxf(lo, lc);
      const float wo = expf(lo - mx), wc = expf(lc - mx);
      const float inv = 1.0f / (wo + wc);
      for (int64_t t = tid; t < Dv; t += bd) orow[t] = (orow[t] * wo + acc[t] * inv_l * wc) * inv;
    }
    __syncthreads();  // every thread has read lse[row]
    if (tid == 0)
      lse[row] = lo == -INFINITY
                     ? lc
                     : fmaxf(lo, lc) + logf(expf(lo - fmaxf(lo, lc)) + expf(lc - fmaxf(lo, lc)));
  }
  if (probs != nullptr) {
    float* pr = probs + row * d.seq_kv;
    for (int64_t j = tid; j < d.seq_kv; j += bd)
      pr[j] =
          j >= j_first && j < j_last ? expf(dot_sh(qs, kb + j * d.ld_kv, D) * d.scale - lc) : 0.0f;
  }
}

// The probability of (row, j) for a visible key: from probs, or recomputed from the score and lse.
__device__ inline float prob_of(const AttnShape& d, const float* probs, const float* lse,
                                int64_t row, int64_t j, float score_unscaled) {
  if (probs != nullptr) return probs[row * d.seq_kv + j];
  const float l = lse[row];
  return l == -INFINITY ? 0.0f : expf(score_unscaled * d.scale - l);
}

__global__ void attention_dq_kernel(AttnShape d, float* dq, float* delta_out, const float* dout,
                                    const float* q, const float* k, const float* v,
                                    const float* out, const float* lse, const float* probs,
                                    bool accumulate_dq, uint32_t threshold, float keep_scale) {
  extern __shared__ float sh[];
  const int64_t D = d.head_dim, Dv = d.v_head_dim;
  float* qs = sh;
  float* dos = qs + D;
  float* acc = dos + Dv;
  float* ps = acc + D;
  float* red = ps + blockDim.x;
  int64_t idx = blockIdx.x;
  const int64_t i = idx % d.seq_q;
  idx /= d.seq_q;
  const int64_t h = idx % d.heads, b = idx / d.heads;
  const int64_t g = h / (d.heads / d.kv_heads);
  const float* qr = q + (b * d.seq_q + i) * d.ld_q + h * D;
  const float* dor = dout + (b * d.seq_q + i) * d.ld_o + h * Dv;
  const float* orow = out + (b * d.seq_q + i) * d.ld_o + h * Dv;
  const float* kb = k + b * d.seq_kv * d.ld_kv + g * D;
  const float* vb = v + b * d.seq_kv * d.ld_kv + g * Dv;
  const int64_t row = (b * d.heads + h) * d.seq_q + i;
  const int tid = threadIdx.x, bd = blockDim.x;
  float part = 0.0f;
  for (int64_t t = tid; t < D; t += bd) {
    qs[t] = qr[t];
    acc[t] = 0.0f;
  }
  for (int64_t t = tid; t < Dv; t += bd) {
    dos[t] = dor[t];
    part += dor[t] * orow[t];
  }
  const float delta = block_sum(part, red);  // also makes qs/dos visible
  if (tid == 0) delta_out[row] = delta;
  const int64_t j_first = first_key(d, i), j_last = last_key(d, i);
  const bool drop = d.dropout_p > 0.0f;
  for (int64_t j0 = j_first; j0 < j_last; j0 += bd) {
    const int64_t j = j0 + tid;
    float ds = 0.0f;
    if (j < j_last) {
      const float* kr = kb + j * d.ld_kv;
      const float p = prob_of(d, probs, lse, row, j, probs ? 0.0f : dot_sh(qs, kr, D));
      float dp = dot_sh(dos, vb + j * d.ld_kv, Dv);
      if (drop)
        dp = dropout_keep(d.dropout_seed, static_cast<uint64_t>(row * d.seq_kv + j), threshold)
                 ? dp * keep_scale
                 : 0.0f;
      ds = p * (dp - delta);
    }
    ps[tid] = ds;
    __syncthreads();
    const int64_t nt = j_last - j0 < bd ? j_last - j0 : bd;
    for (int64_t t = tid; t < D; t += bd) {
      float a = acc[t];
      for (int64_t jj = 0; jj < nt; ++jj) a += ps[jj] * kb[(j0 + jj) * d.ld_kv + t];
      acc[t] = a;
    }
    __syncthreads();
  }
  float* dqr = dq + (b * d.seq_q + i) * d.ld_q + h * D;
  for (int64_t t = tid; t < D; t += bd)
    dqr[t] = accumulate_dq ? dqr[t] + d.scale * acc[t] : d.scale * acc[t];
}

__global__ void attention_dkv_kernel(AttnShape d, float* dk, float* dv, const float* dout,
                                     const float* q, const float* k, const float* v,
                                     const float* lse, const float* probs, const float* delta,
                                     bool accumulate_dkv, uint32_t threshold, float keep_scale) {
  extern __shared__ float sh[];
  const int64_t D = d.head_dim, Dv = d.v_head_dim;
  float* ks = sh;
  float* vs = ks + D;
  float* dk_acc = vs + Dv;
  float* dv_acc = dk_acc + D;
  float* pds = dv_acc + Dv;
  float* dss = pds + blockDim.x;
  int64_t idx = blockIdx.x;
  const int64_t j = idx % d.seq_kv;
  idx /= d.seq_kv;
  const int64_t g = idx % d.kv_heads, b = idx / d.kv_heads;
  const int64_t group = d.heads / d.kv_heads;
  const int tid = threadIdx.x, bd = blockDim.x;
  const float* kr = k + (b * d.seq_kv + j) * d.ld_kv + g * D;
  const float* vr = v + (b * d.seq_kv + j) * d.ld_kv + g * Dv;
  for (int64_t t = tid; t < D; t += bd) {
    ks[t] = kr[t];
    dk_acc[t] = 0.0f;
  }
  for (int64_t t = tid; t < Dv; t += bd) {
    vs[t] = vr[t];
    dv_acc[t] = 0.0f;
  }
  __syncthreads();
  // Queries that see key j: j <= i + causal_offset and, with a window, j > i + causal_offset -
  // window: i in [j - causal_offset, j - causal_offset + window).
  int64_t i_min = d.causal ? j - d.causal_offset : 0;
  if (i_min < 0) i_min = 0;
  int64_t i_end = d.seq_q;
  if (d.causal && d.window > 0 && j - d.causal_offset + d.window < i_end)
    i_end = j - d.causal_offset + d.window;
  const bool drop = d.dropout_p > 0.0f;
  for (int64_t hh = 0; hh < group; ++hh) {
    const int64_t h = g * group + hh;
    for (int64_t i0 = i_min; i0 < i_end; i0 += bd) {
      const int64_t i = i0 + tid;
      float pd = 0.0f, ds = 0.0f;
      if (i < i_end) {
        const int64_t row = (b * d.heads + h) * d.seq_q + i;
        const float* qr = q + (b * d.seq_q + i) * d.ld_q + h * D;
        const float* dor = dout + (b * d.seq_q + i) * d.ld_o + h * Dv;
        const float p = prob_of(d, probs, lse, row, j, probs ? 0.0f : dot_sh(ks, qr, D));
        float dp = dot_sh(vs, dor, Dv);
        pd = p;
        if (drop) {
          const bool keep =
              dropout_keep(d.dropout_seed, static_cast<uint64_t>(row * d.seq_kv + j), threshold);
          pd = keep ? p * keep_scale : 0.0f;
          dp = keep ? dp * keep_scale : 0.0f;
        }
        ds = p * (dp - delta[row]);
      }
      pds[tid] = pd;
      dss[tid] = ds;
      __syncthreads();
      const int64_t nt = i_end - i0 < bd ? i_end - i0 : bd;
      for (int64_t t = tid; t < Dv; t += bd) {
        float a_v = dv_acc[t];
        for (int64_t ii = 0; ii < nt; ++ii)
          a_v += pds[ii] * dout[(b * d.seq_q + i0 + ii) * d.ld_o + h * Dv + t];
        dv_acc[t] = a_v;
      }
      for (int64_t t = tid; t < D; t += bd) {
        float a_k = dk_acc[t];
        for (int64_t ii = 0; ii < nt; ++ii)
          a_k += dss[ii] * q[(b * d.seq_q + i0 + ii) * d.ld_q + h * D + t];
        dk_acc[t] = a_k;
      }
      __syncthreads();
    }
  }
  float* dkr = dk + (b * d.seq_kv + j) * d.ld_kv + g * D;
  float* dvr = dv + (b * d.seq_kv + j) * d.ld_kv + g * Dv;
  for (int64_t t = tid; t < D; t += bd)
    dkr[t] = accumulate_dkv ? dkr[t] + d.scale * dk_acc[t] : d.scale * dk_acc[t];
  for (int64_t t = tid; t < Dv; t += bd) dvr[t] = accumulate_dkv ? dvr[t] + dv_acc[t] : dv_acc[t];
}

uint32_t threshold_of(float p) {  // runtime/tensor.h's dropout_threshold
  if (p <= 0.0f) return 0;
  const double t = static_cast<double>(p) * 4294967296.0;
  return t >= 4294967295.0 ? 0xFFFFFFFFu : static_cast<uint32_t>(t);
}

// Shared memory of `qk` vectors of head_dim, `vo` of v_head_dim and `tiles` per-thread tiles.
size_t shared_bytes(const AttnShape& d, int64_t qk, int64_t vo, int64_t tiles) {
  return sizeof(float) *
         static_cast<size_t>(qk * d.head_dim + vo * d.v_head_dim + tiles * kAttnThreads + 32);
}

}  // namespace

void attention_forward(const AttnShape& d, float* out, float* lse, float* probs, const float* q,
                       const float* k, const float* v, bool accumulate, cudaStream_t s) {
  const int64_t blocks = d.batch * d.heads * d.seq_q;
  if (blocks <= 0) return;
  attention_forward_kernel<<<static_cast<unsigned>(blocks), kAttnThreads, shared_bytes(d, 1, 1, 1),
                             s>>>(d, out, lse, probs, q, k, v, accumulate,
                                  threshold_of(d.dropout_p), 1.0f / (1.0f - d.dropout_p));
  PARASOL_CUDA_LAUNCHED();
}

int64_t attention_backward_scratch(const AttnShape& d) { return d.batch * d.heads * d.seq_q; }

void attention_backward(const AttnShape& d, float* dq, float* dk, float* dv, const float* dout,
                        const float* q, const float* k, const float* v, const float* out,
                        const float* lse, const float* probs, bool accumulate_dq,
                        bool accumulate_dkv, float* scratch, cudaStream_t s) {
  const uint32_t threshold = threshold_of(d.dropout_p);
  const float keep_scale = 1.0f / (1.0f - d.dropout_p);
  const int64_t q_blocks = d.batch * d.heads * d.seq_q;
  if (q_blocks > 0) {
    attention_dq_kernel<<<static_cast<unsigned>(q_blocks), kAttnThreads, shared_bytes(d, 2, 1, 1),
                          s>>>(d, dq, scratch, dout, q, k, v, out, lse, probs, accumulate_dq,
                               threshold, keep_scale);
    PARASOL_CUDA_LAUNCHED();
  }
  const int64_t kv_blocks = d.batch * d.kv_heads * d.seq_kv;
  if (kv_blocks > 0) {
    attention_dkv_kernel<<<static_cast<unsigned>(kv_blocks), kAttnThreads, shared_bytes(d, 2, 2, 2),
                           s>>>(d, dk, dv, dout, q, k, v, lse, probs, scratch, accumulate_dkv,
                                threshold, keep_scale);
    PARASOL_CUDA_LAUNCHED();
  }
}

}  // namespace parasol::runtime::cuda
