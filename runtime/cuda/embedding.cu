// defines: cuda::embedding_forward, embedding_backward (runtime/cpu/embedding.cc's kernels on the
// GPU): the vocab-parallel lookup plus learned positions, one thread per output element; the
// backward scatter-adds the table gradient with atomicAdd (order-dependent in the last bits) and
// sums the position gradient deterministically (one thread per (position, column), sequences in
// order).
#include "runtime/cuda/cuda_common.cuh"

namespace parasol::runtime::cuda {

namespace {

__global__ void embedding_forward_kernel(float* out, const int32_t* tokens, const float* table,
                                         int64_t vocab_start, int64_t vocab_rows, const float* pos,
                                         int64_t pos_offset, int64_t rows, int64_t seq,
                                         int64_t cols) {
  PARASOL_GRID_STRIDE(i, rows * cols) {
    const int64_t t = i / cols, c = i % cols;
    const int64_t id = static_cast<int64_t>(tokens[t]) - vocab_start;
    float o = id >= 0 && id < vocab_rows ? table[id * cols + c] : 0.0f;
    if (pos != nullptr) o += pos[(t % seq + pos_offset) * cols + c];
    out[i] = o;
  }
}

__global__ void embedding_table_grad_kernel(float* dtable, const float* dout, const int32_t* tokens,
                                            int64_t vocab_start, int64_t vocab_rows, int64_t rows,
                                            int64_t cols) {
  PARASOL_GRID_STRIDE(i, rows * cols) {
    const int64_t t = i / cols, c = i % cols;
    const int64_t id = static_cast<int64_t>(tokens[t]) - vocab_start;
    if (id >= 0 && id < vocab_rows) atomicAdd(dtable + id * cols + c, dout[i]);
  }
}

__global__ void embedding_pos_grad_kernel(float* dpos, const float* dout, int64_t pos_offset,
                                          int64_t rows, int64_t seq, int64_t cols) {
  const int64_t positions = seq < rows ? seq : rows;
  PARASOL_GRID_STRIDE(i, positions * cols) {
    const int64_t p = i / cols, c = i % cols;
    float s = 0.0f;
    for (int64_t t = p; t < rows; t += seq) s += dout[t * cols + c];
    dpos[(p + pos_offset) * cols + c] += s;
  }
}

}  // namespace

void embedding_forward(float* out, const int32_t* tokens, const float* table, int64_t vocab_start,
                       int64_t vocab_rows, const float* pos, int64_t pos_offset, int64_t rows,
                       int64_t seq, int64_t cols, cudaStream_t s) {
  if (rows <= 0 || cols <= 0) return;
  embedding_forward_kernel<<<grid_for(rows * cols), kThreads, 0, s>>>(
      out, tokens, table, vocab_start, vocab_rows, pos, pos_offset, rows, seq, cols);
  PARASOL_CUDA_LAUNCHED();
}

void embedding_backward(float* dtable, float* dpos, const float* dout, const int32_t* tokens,
                        int64_t vocab_start, int64_t vocab_rows, int64_t pos_offset, int64_t rows,
                        int64_t seq, int64_t cols, cudaStream_t s) {
  if (rows <= 0 || cols <= 0) return;
  if (dtable != nullptr) {
    embedding_table_grad_kernel<<<grid_for(rows * cols), kThreads, 0, s>>>(
        dtable, dout, tokens, vocab_start, vocab_rows, rows, cols);
    PARASOL_CUDA_LAUNCHED();
  }
  if (dpos != nullptr) {
    embedding_pos_grad_kernel<<<grid_for((seq < rows ? seq : rows) * cols), kThreads, 0, s>>>(
        dpos, dout, pos_offset, rows, seq, cols);
    PARASOL_CUDA_LAUNCHED();
  }
}

}  // namespace parasol::runtime::cuda
