// Checkpoints of the full training state in a plan-independent layout, so that a run saved under
// one plan resumes under another. A checkpoint is a directory:
//
//   manifest.json          {"format": "parasol-checkpoint", "version": 1, "model": {...},
//                           "step", "tokens", "data_position", "seed", "adamw": {...},
//                           "loss_scaler": {"scale", "growth_tracker", "hysteresis_tracker"}
//                           (with loss scaling only),
//                           "plan": {...} (informational), "tensors": [{"name", "shape"}, ...],
//                           "checksums": {"params/<tensor>.bin": "xxh3-64:<hex>", ...}}
//   params/<tensor>.bin    the fp32 master values of full tensor <tensor> (runtime/param_layout.h)
//   adam_m/<tensor>.bin    AdamW's first moment
//   adam_v/<tensor>.bin    AdamW's second moment
//
// Each .bin file is the row-major full tensor as raw little-endian fp32, no header. Saving and
// loading are per rank and MPI-free; each rank writes (pwrite) only the elements it owns (its
// ZeRO shard of each bucket; tp-replicated tensors on tp rank 0 only; under ZeRO 0 group index 0
// only), so every element is written exactly once, and reads (pread) only what it holds.
// A save is three steps with a barrier between them (the caller's):
//   1. one rank:   begin_checkpoint()   (directories, files at their full size, old manifest gone)
//   2. every rank: save_checkpoint_rank()
//   3. one rank:   commit_checkpoint()  (manifest.json with every file's XXH3 checksum, written
//                                        atomically: a checkpoint without one is incomplete and
//                                        does not load)
// A resume first verifies every file against its checksum on one rank (verify_checkpoint), so
// that flipped bytes in a file of the right size are an error, not silently wrong weights.
// Version 1 checkpoints (no checksums) still load, unverified.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/model.h"
#include "core/plan.h"
#include "core/program.h"
#include "core/rank_layout.h"
#include "runtime/backend.h"
#include "runtime/loss_scaler.h"
#include "runtime/param_init.h"

namespace parasol::runtime {

inline constexpr int kCheckpointVersion = 2;

// The training state beyond the tensors.
struct TrainProgress {
  int64_t step = 0;           // steps taken (skipped ones included: adamw.step - 1 updates)
  int64_t tokens = 0;         // tokens consumed
  int64_t data_position = 0;  // the next sequence index of the data source
  uint64_t seed = 0;          // the run's seed (initialisation, data, dropout)
  AdamWConfig adamw;          // the optimizer's hyperparameters (adamw.step: the next step)
  std::optional<LossScalerState> loss_scaler;  // "loss_scaler" in the manifest, when scaling
};

// Step 1 (one rank): creates `dir` and its params/, adam_m/, adam_v/ folders, creates or
// truncates every tensor file of the model (model_tensors(model, has_tied_head_copy(model,
// plan))) at its full size (zeros), and removes an existing manifest.json. Throws
// parasol::Error naming the path that cannot be created.
void begin_checkpoint(const std::string& dir, const Model& model, const Plan& plan);

// Step 2 (every rank, after begin_checkpoint): writes the elements this rank owns of every
// bucket of its Program: the fp32 master values (b.opt row 0 when b.master_in_opt, else the
// parameter buffers), m and v. buffer(id) is the memory of Program buffer `id` (fp32).
void save_checkpoint_rank(const std::string& dir, const Model& model, const Plan& plan,
                          const RankCoord& coord, const std::vector<ParamBucket>& buckets,
                          const BufferAccess& buffer);

// Step 3 (one rank, after every rank saved): writes manifest.json.
void commit_checkpoint(const std::string& dir, const Model& model, const Plan& plan,
                       const TrainProgress& progress);

// ---- Atomic saves under a root directory. A save goes into a fresh staging directory
// root/.step-<N>.partial (the three steps above), becomes root/step-<N> by a rename once it is
// complete and on disk (publish_checkpoint), and only then does root/latest (a one-line file,
// replaced by a rename) name it. A crash at any moment leaves the previous checkpoint and latest
// as they were: the newest complete checkpoint is always the one latest names.

// The staging directory of the save of step `step` under `root` (begin_checkpoint creates it, or
// truncates what a crashed save of that step left there).
std::string checkpoint_staging_dir(const std::string& root, int64_t step);

// Step 4 (one rank, after commit_checkpoint in the staging directory): flushes every file and
// the directory to disk, renames the staging directory to root/step-<N> (replacing an older save
// of the same step), points root/latest at it, and removes the step directories beyond the
// newest `keep` (0: keep them all) and the staging directories of crashed saves. Returns the
// step directory.
std::string publish_checkpoint(const std::string& root, int64_t step, int keep);

// The checkpoint directory `path` names: the step directory its `latest` names, else `path`
// itself when it holds manifest.json (a step directory, or a checkpoint written before atomic
// saves). Throws parasol::Error naming `path` when it is neither.
std::string resolve_checkpoint(const std::string& path);

// Recomputes the XXH3 checksum of every tensor file listed in the manifest and compares it with
// the manifest's. Throws parasol::Error naming the file on a mismatch or a missing file (and as
// read_checkpoint_manifest on a bad manifest). Nothing to check in a version 1 checkpoint.
void verify_checkpoint(const std::string& dir, const Model& model);

// Reads manifest.json and checks it against `model` (format, version, every shape figure of the
// model). Throws parasol::Error naming the file and field: "<dir>/manifest.json" when missing
// or malformed, "<dir>/manifest.json.model.hidden" for a model mismatch.
TrainProgress read_checkpoint_manifest(const std::string& dir, const Model& model);

// Every rank: reads the manifest (as read_checkpoint_manifest) and fills the state of every
// bucket of its Program: the parameter buffers (each spec's full slice when b.zero < 3, else
// param_shard's ZeRO shard), the master row of b.opt when b.master_in_opt, and m and v of its
// shard; padding elements 0. A tied model's head.head copy missing from the checkpoint (saved
// with pp == 1) is read from emb.table, transposed. Throws parasol::Error naming the file when
// a tensor file is missing or is not the full tensor's size (truncated).
TrainProgress load_checkpoint_rank(const std::string& dir, const Model& model, const Plan& plan,
                                   const RankCoord& coord, const std::vector<ParamBucket>& buckets,
                                   const BufferAccess& buffer);

// The file of tensor `name` of state `kind` ("params", "adam_m", "adam_v") in checkpoint `dir`.
std::string checkpoint_file(const std::string& dir, const std::string& kind,
                            const std::string& name);

}  // namespace parasol::runtime
