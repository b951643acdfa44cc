// defines: cuda::xent_row_max, xent_sum_exp, xent_target, xent_loss, loss_accumulate, xent_softmax,
// xent_backward
// (runtime/cpu/cross_entropy.cc's kernels on the GPU): one block per row for the reductions (the
// sum of exponentials in double, as the CPU), one thread per element or row otherwise.
#include "runtime/cuda/cuda_common.cuh"

namespace parasol::runtime::cuda {

namespace {

__global__ void row_max_kernel(float* row_max, const float* logits, int64_t vocab) {
  __shared__ float red[32];
  const float* l = logits + static_cast<int64_t>(blockIdx.x) * vocab;
  float m = -INFINITY;
  for (int64_t v = threadIdx.x; v < vocab; v += blockDim.x) m = fmaxf(m, l[v]);
  m = block_max(m, red);
  if (threadIdx.x == 0) row_max[blockIdx.x] = m;
}

__global__ void sum_exp_kernel(float* sum_exp, const float* logits, const float* row_max,
                               int64_t vocab) {
  __shared__ double red[32];
  const float* l = logits + static_cast<int64_t>(blockIdx.x) * vocab;
  const float mx = row_max[blockIdx.x];
  double s = 0.0;
  for (int64_t v = threadIdx.x; v < vocab; v += blockDim.x) s += expf(l[v] - mx);
  s = block_sum(s, red);
  if (threadIdx.x == 0) sum_exp[blockIdx.x] = static_cast<float>(s);
}

__global__ void target_kernel(float* target, const float* logits, const int32_t* labels,
                              int64_t rows, int64_t vocab, int64_t vocab_start) {
  PARASOL_GRID_STRIDE(r, rows) {
    const int64_t id = static_cast<int64_t>(labels[r]) - vocab_start;
    target[r] = labels[r] >= 0 && id >= 0 && id < vocab ? logits[r * vocab + id] : 0.0f;
  }
}

// One thread, rows in order: the sum the host formed before (a few thousand rows a micro-batch).
__global__ void loss_accumulate_kernel(double* acc, const float* loss, const int32_t* labels,
                                       int64_t rows) {
  double sum = acc[0], n = acc[1];
  for (int64_t r = 0; r < rows; ++r)
    if (labels[r] >= 0) {
      sum += static_cast<double>(loss[r]);
      n += 1.0;
    }
  acc[0] = sum;
  acc[1] = n;
}

__global__ void loss_kernel(float* loss, const float* row_max, const float* sum_exp,
                            const float* target, const int32_t* labels, int64_t rows) {
  PARASOL_GRID_STRIDE(r, rows) {
    loss[r] = labels[r] < 0 ? 0.0f : logf(sum_exp[r]) + row_max[r] - target[r];
  }
}

__global__ void softmax_kernel(float* probs, const float* logits, const float* row_max,
                               const float* sum_exp, int64_t rows, int64_t vocab) {
  PARASOL_GRID_STRIDE(i, rows * vocab) {
    const int64_t r = i / vocab;
    probs[i] = expf(logits[i] - row_max[r]) * (1.0f / sum_exp[r]);
  }
}

__global__ void xent_backward_kernel(float* dlogits, const float* probs, const int32_t* labels,
                                     int64_t rows, int64_t vocab, int64_t vocab_start,
                                     float dloss) {
  PARASOL_GRID_STRIDE(i, rows * vocab) {
    const int64_t r = i / vocab, v = i % vocab;
    if (labels[r] < 0) {
      dlogits[i] = 0.0f;
    } else {
      float d = dloss * probs[i];
      if (static_cast<int64_t>(labels[r]) - vocab_start == v) d -= dloss;
      dlogits[i] = d;
    }
  }
}

}  // namespace

void xent_row_max(float* row_max, const float* logits, int64_t rows, int64_t vocab,
                  cudaStream_t s) {
  if (rows <= 0) return;
  row_max_kernel<<<static_cast<unsigned>(rows), kThreads, 0, s>>>(row_max, logits, vocab);
  PARASOL_CUDA_LAUNCHED();
}

void xent_sum_exp(float* sum_exp, const float* logits, const float* row_max, int64_t rows,
                  int64_t vocab, cudaStream_t s) {
  if (rows <= 0) return;
  sum_exp_kernel<<<static_cast<unsigned>(rows), kThreads, 0, s>>>(sum_exp, logits, row_max, vocab);
  PARASOL_CUDA_LAUNCHED();
}

void xent_target(float* target, const float* logits, const int32_t* labels, int64_t rows,
                 int64_t vocab, int64_t vocab_start, cudaStream_t s) {
  if (rows <= 0) return;
  target_kernel<<<grid_for(rows), kThreads, 0, s>>>(target, logits, labels, rows, vocab,
                                                    vocab_start);
  PARASOL_CUDA_LAUNCHED();
}

void xent_loss(float* loss, const float* row_max, const float* sum_exp, const float* target,
               const int32_t* labels, int64_t rows, cudaStream_t s) {
  if (rows <= 0) return;
  loss_kernel<<<grid_for(rows), kThreads, 0, s>>>(loss, row_max, sum_exp, target, labels, rows);
  PARASOL_CUDA_LAUNCHED();
}

void loss_accumulate(double* acc, const float* loss, const int32_t* labels, int64_t rows,
                     cudaStream_t s) {
  if (rows <= 0) return;
  loss_accumulate_kernel<<<1, 1, 0, s>>>(acc, loss, labels, rows);
  PARASOL_CUDA_LAUNCHED();
}

void xent_softmax(float* probs, const float* logits, const float* row_max, const float* sum_exp,
                  int64_t rows, int64_t vocab, cudaStream_t s) {
  if (rows <= 0 || vocab <= 0) return;
  softmax_kernel<<<grid_for(rows * vocab), kThreads, 0, s>>>(probs, logits, row_max, sum_exp, rows,
                                                             vocab);
  PARASOL_CUDA_LAUNCHED();
}

void xent_backward(float* dlogits, const float* probs, const int32_t* labels, int64_t rows,
                   int64_t vocab, int64_t vocab_start, float dloss, cudaStream_t s) {
  if (rows <= 0 || vocab <= 0) return;
  xent_backward_kernel<<<grid_for(rows * vocab), kThreads, 0, s>>>(dlogits, probs, labels, rows,
                                                                   vocab, vocab_start, dloss);
  PARASOL_CUDA_LAUNCHED();
}

}  // namespace parasol::runtime::cuda
