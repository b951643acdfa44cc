// The vocabulary split tensor-parallel ways (Megatron's VocabParallelEmbedding and
// VocabParallelCrossEntropy): the one statement of how many rows of the embedding table, columns
// of the output layer and logits of a token each TP rank holds. The lowering (core/lower_emit.cc),
// the closed form (cost_models/estimate.cc, memory.cc) and the runtime (runtime/executor.cc) read
// it here.
#pragma once

#include <cstdint>

#include "core/model.h"

namespace parasol {

// Rows of the vocabulary on each of `tp` ranks: ceil(vocab / tp), the last rank's part padded
// (every rank runs the same shapes). REQUIRES: tp >= 1.
inline int64_t vocab_shard(const Model& m, int64_t tp) { return (m.vocab + tp - 1) / tp; }

}  // namespace parasol
