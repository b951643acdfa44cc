// Parameter initialisation that is identical whatever the plan: element i of a full model tensor
// is a pure function of (seed, tensor name, i), a counter-based draw (SplitMix64, no RNG state),
// so every rank cuts its slice or ZeRO shard from the same full tensor and a TP=4 run starts
// from exactly the weights of the serial run.
//
// The scheme is GPT-2's: weights N(0, 0.02); the residual projections (out, fc2, shared_fc2,
// efc2) N(0, 0.02 / sqrt(2 * layers)); emb.pos N(0, 0.01); biases 0; norm weights 1 and layernorm
// bias rows 0. head.head of tied embeddings (the pp > 1 copy) is emb.table transposed.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "core/model.h"
#include "core/plan.h"
#include "core/program.h"
#include "core/rank_layout.h"
#include "runtime/param_layout.h"

namespace parasol::runtime {

// A standard normal draw: a pure function of (seed, stream, index) (Box-Muller over two 53-bit
// uniforms of the SplitMix64 stream), in double.
double normal_draw(uint64_t seed, uint64_t stream, uint64_t index);
// The 64-bit FNV-1a hash of a tensor name (the stream of its draws).
uint64_t name_hash(const std::string& name);

// Element `index` (row-major) of full tensor `t` (from tensor_info) under `seed`.
// REQUIRES: 0 <= index < t.elements().
float init_value(const Model& model, const TensorInfo& t, uint64_t seed, int64_t index);
// The same by name. Throws parasol::Error as tensor_info does.
float init_value(const Model& model, const std::string& name, uint64_t seed, int64_t index);

// The memory of a Program buffer by id, as fp32 elements (the CPU runtime keeps parameter,
// gradient and optimizer buffers in fp32).
using BufferAccess = std::function<float*(int buffer_id)>;

// Fills the state of bucket `b` of the rank at `coord` (index `index` in b.group, see
// group_index()) with the initial values: the parameter buffers (each spec's full slice when
// b.zero < 3, else param_shard's flat ZeRO shard), the fp32 master row of b.opt when
// b.master_in_opt (this rank's shard), padding elements 0, and the Adam m and v rows 0.
// Throws parasol::Error when a spec does not match the model and plan (param_layout.h).
void init_bucket(const Model& model, const Plan& plan, const RankCoord& coord, int index,
                 const ParamBucket& b, const BufferAccess& buffer, uint64_t seed);

// init_bucket for every bucket of a Program, each with this rank's group_index().
void init_buckets(const Model& model, const Plan& plan, const RankCoord& coord,
                  const std::vector<ParamBucket>& buckets, const BufferAccess& buffer,
                  uint64_t seed);

}  // namespace parasol::runtime
