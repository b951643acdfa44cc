// Checkpoint cost: the bytes a plan's checkpoint holds (the weights, the fp32 master weights and
// the optimizer state, as the plan shards them) and the time to write or read them through the
// cluster's checkpoint storage. Every rank writes its own part at once (Megatron's fully
// parallel distributed checkpoint: the ranks that hold the same replica split its bytes), and a
// write blocks training until the last byte is stored.
#pragma once

#include "core/cluster.h"
#include "core/json_reader.h"
#include "core/model.h"
#include "core/plan.h"

namespace parasol::cost {

struct CheckpointSize {
  double total_bytes = 0;      // the whole checkpoint (one copy of every tensor)
  double weights_bytes = 0;    // of which the weights in the plan's precision
  double master_bytes = 0;     // the fp32 master weights (mixed precision)
  double optimizer_bytes = 0;  // the AdamW moments
  double max_rank_bytes = 0;   // the largest part one rank writes
};

// REQUIRES: validate(plan, model, cluster) passed for some cluster.
CheckpointSize checkpoint_size(const Model& m, const Plan& p);

// The storage bandwidth a checkpoint of `c` moves through (bytes/s): Cluster::storage_bw, or
// parasol's default of 122 MB/s per GPU: Llama 3's checkpoint storage (Meta's Tectonic, arXiv
// 2407.21783 section 3.3.1) sustains 2 TB/s for the 16,384 GPUs of its 405B run (derived:
// 2e12 / 16,384).
double storage_bandwidth(const Cluster& c);

// Seconds to write (or read) `size` through `storage_bw` bytes/s. REQUIRES: storage_bw > 0.
double checkpoint_transfer_s(const CheckpointSize& size, double storage_bw);

// {"total_GB", "weights_GB", "master_GB", "optimizer_GB", "max_rank_GB"}.
Json checkpoint_size_to_json(const CheckpointSize& s);

}  // namespace parasol::cost
