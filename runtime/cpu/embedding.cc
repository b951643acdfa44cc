// defines: CpuBackend::embedding_forward, embedding_backward: the vocab-parallel token lookup
// (rows of other shards are zero; the tensor-parallel all-reduce completes them) plus learned
// positions, and its scatter-add gradient.
#include <algorithm>
#include <cstring>

#include "runtime/cpu/cpu_backend.h"

namespace parasol::runtime {

void CpuBackend::embedding_forward(float* out, const int32_t* tokens, const float* table,
                                   int64_t vocab_start, int64_t vocab_rows, const float* pos,
                                   int64_t pos_offset, int64_t rows, int64_t seq, int64_t cols) {
  for (int64_t t = 0; t < rows; ++t) {
    float* o = out + t * cols;
    const int64_t id = static_cast<int64_t>(tokens[t]) - vocab_start;
    if (id >= 0 && id < vocab_rows)
      std::memcpy(o, table + id * cols, sizeof(float) * cols);
    else
      std::fill(o, o + cols, 0.0f);
    if (pos != nullptr) {
      const float* p = pos + (t % seq + pos_offset) * cols;
      for (int64_t c = 0; c < cols; ++c) o[c] += p[c];
    }
  }
}

void CpuBackend::embedding_backward(float* dtable, float* dpos, const float* dout,
                                    const int32_t* tokens, int64_t vocab_start, int64_t vocab_rows,
                                    int64_t pos_offset, int64_t rows, int64_t seq, int64_t cols) {
  for (int64_t t = 0; t < rows; ++t) {
    const float* d = dout + t * cols;
    const int64_t id = static_cast<int64_t>(tokens[t]) - vocab_start;
    if (dtable != nullptr && id >= 0 && id < vocab_rows) {
      float* g = dtable + id * cols;
      for (int64_t c = 0; c < cols; ++c) g[c] += d[c];
    }
    if (dpos != nullptr) {
      float* g = dpos + (t % seq + pos_offset) * cols;
      for (int64_t c = 0; c < cols; ++c) g[c] += d[c];
    }
  }
}

}  // namespace parasol::runtime
