// defines: cuda::embedding_forward, embedding_backward (runtime/cpu/embedding.cc's kernels on the
// GPU): the vocab-parallel lookup plus learned positions, one thread per output element; the
// backward scatter-adds the table gradient with atomicAdd (order-dependent in the last bits) and
// sums the position gradient deterministically (one thread per (position, column), sequences in
// order). The _bf16 launchers run the same kernels on bf16 tables, positions and outputs (the
// sums in fp32, each output rounded once) and bf16 output gradients into fp32 dtable and dpos.
#include "runtime/cuda/cuda_common.cuh"

namespace parasol::runtime::cuda {

namespace {

__device__ inline float load(const float* p, int64_t i) { return p[i]; }
__device__ inline float load(const uint16_t* p, int64_t i) { return bf16_to_fp32(p[i]); }
__device__ inline void store(float* p, int64_t i, float v) { p[i] = v; }
__device__ inline void store(uint16_t* p, int64_t i, float v) { p[i] = fp32_to_bf16(v); }

template <typename T>
__global__ void embedding_forward_kernel(T* out, const int32_t* tokens, const T* table,
                                         int64_t vocab_start, int64_t vocab_rows, const T* pos,
                                         int64_t pos_offset, int64_t rows, int64_t seq,
                                         int64_t cols) {
  PARASOL_GRID_STRIDE(i, rows * cols) {
    const int64_t t = i / cols, c = i % cols;
    const int64_t id = static_cast<int64_t>(tokens[t]) - vocab_start;
    float o = id >= 0 && id < vocab_rows ? load(table, id * cols + c) : 0.0f;
    if (pos != nullptr) o += load(pos, (t % seq + pos_offset) * cols + c);
    store(out, i, o);
  }
}

template <typename T>
__global__ void embedding_table_grad_kernel(float* dtable, const T* dout, const int32_t* tokens,
                                            int64_t vocab_start, int64_t vocab_rows, int64_t rows,
                                            int64_t cols) {
  PARASOL_GRID_STRIDE(i, rows * cols) {
    const int64_t t = i / cols, c = i % cols;
    const int64_t id = static_cast<int64_t>(tokens[t]) - vocab_start;
    if (id >= 0 && id < vocab_rows) atomicAdd(dtable + id * cols + c, load(dout, i));
  }
}

template <typename T>
__global__ void embedding_pos_grad_kernel(float* dpos, const T* dout, int64_t pos_offset,
                                          int64_t rows, int64_t seq, int64_t cols) {
  const int64_t positions = seq < rows ? seq : rows;
  PARASOL_GRID_STRIDE(i, positions * cols) {
    const int64_t p = i / cols, c = i % cols;
    float s = 0.0f;
    for (int64_t t = p; t < rows; t += seq) s += load(dout, t * cols + c);
    dpos[(p + pos_offset) * cols + c] += s;
  }
}

template <typename T>
void forward(T* out, const int32_t* tokens, const T* table, int64_t vocab_start, int64_t vocab_rows,
             const T* pos, int64_t pos_offset, int64_t rows, int64_t seq, int64_t cols,
             cudaStream_t s) {
  if (rows <= 0 || cols <= 0) return;
  embedding_forward_kernel<T><<<grid_for(rows * cols), kThreads, 0, s>>>(
      out, tokens, table, vocab_start, vocab_rows, pos, pos_offset, rows, seq, cols);
  PARASOL_CUDA_LAUNCHED();
}

template <typename T>
void backward(float* dtable, float* dpos, const T* dout, const int32_t* tokens, int64_t vocab_start,
              int64_t vocab_rows, int64_t pos_offset, int64_t rows, int64_t seq, int64_t cols,
              cudaStream_t s) {
  if (rows <= 0 || cols <= 0) return;
  if (dtable != nullptr) {
    embedding_table_grad_kernel<T><<<grid_for(rows * cols), kThreads, 0, s>>>(
        dtable, dout, tokens, vocab_start, vocab_rows, rows, cols);
    PARASOL_CUDA_LAUNCHED();
  }
  if (dpos != nullptr) {
    embedding_pos_grad_kernel<T><<<grid_for((seq < rows ? seq : rows) * cols), kThreads, 0, s>>>(
        dpos, dout, pos_offset, rows, seq, cols);
    PARASOL_CUDA_LAUNCHED();
  }
}

}  // namespace

void embedding_forward(float* out, const int32_t* tokens, const float* table, int64_t vocab_start,
                       int64_t vocab_rows, const float* pos, int64_t pos_offset, int64_t rows,
                       int64_t seq, int64_t cols, cudaStream_t s) {
  forward(out, tokens, table, vocab_start, vocab_rows, pos, pos_offset, rows, seq, cols, s);
}

void embedding_backward(float* dtable, float* dpos, const float* dout, const int32_t* tokens,
                        int64_t vocab_start, int64_t vocab_rows, int64_t pos_offset, int64_t rows,
                        int64_t seq, int64_t cols, cudaStream_t s) {
  backward(dtable, dpos, dout, tokens, vocab_start, vocab_rows, pos_offset, rows, seq, cols, s);
}

void embedding_forward_bf16(uint16_t* out, const int32_t* tokens, const uint16_t* table,
                            int64_t vocab_start, int64_t vocab_rows, const uint16_t* pos,
                            int64_t pos_offset, int64_t rows, int64_t seq, int64_t cols,
                            cudaStream_t s) {
  forward(out, tokens, table, vocab_start, vocab_rows, pos, pos_offset, rows, seq, cols, s);
}

void embedding_backward_bf16(float* dtable, float* dpos, const uint16_t* dout,
                             const int32_t* tokens, int64_t vocab_start, int64_t vocab_rows,
                             int64_t pos_offset, int64_t rows, int64_t seq, int64_t cols,
                             cudaStream_t s) {
  backward(dtable, dpos, dout, tokens, vocab_start, vocab_rows, pos_offset, rows, seq, cols, s);
}

}  // namespace parasol::runtime::cuda
