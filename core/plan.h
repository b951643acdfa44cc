// Plan: how to train. Parallel degrees, sharding, pipeline schedule, recompute, offload,
// precision and rank order, with JSON I/O and validation against a model and a cluster.
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "core/cluster.h"
#include "core/device.h"
#include "core/json_reader.h"
#include "core/model.h"

namespace parasol {

enum class Schedule { kGpipe, k1F1B, kInterleaved };
enum class Recompute { kNone, kSelective, kFull };

const char* schedule_name(Schedule s);
const char* recompute_name(Recompute r);
Schedule parse_schedule(const std::string& s, const std::string& field);
Recompute parse_recompute(const std::string& s, const std::string& field);

struct Offload {
  bool optimizer = false;    // optimizer state (and its update) in host memory
  bool params = false;       // master parameters in host memory, streamed per layer
  bool activations = false;  // saved activations copied to host between forward and backward
  bool any() const { return optimizer || params || activations; }
  bool operator==(const Offload&) const = default;
};
// "none" or a comma list of optimizer,params,activations.
Offload parse_offload(const std::string& s, const std::string& field);
std::string offload_name(const Offload& o);

// The parallel dimensions in Megatron's order; rank_order lists them first-fastest.
enum class Dim { kTp, kCp, kEp, kDp, kPp };
const char* dim_name(Dim d);

struct Plan {
  int tp = 1;  // tensor parallel
  int pp = 1;  // pipeline parallel
  int dp = 1;  // data parallel (includes ep: expert parallel groups live inside dp x cp)
  int cp = 1;  // context parallel
  int ep = 1;  // expert parallel (divides dp: expert groups are carved out of data parallelism)
  bool sequence_parallel = false;
  int vpp = 1;   // virtual pipeline stages per rank (interleaved schedule when > 1)
  int zero = 0;  // ZeRO stage 0..3 over the data-parallel group
  int micro_batch = 1;
  int global_batch = 1;  // sequences per optimizer step
  int64_t seq_len = 0;   // 0 = model.seq_len
  Schedule schedule = Schedule::k1F1B;
  Recompute recompute = Recompute::kNone;
  int recompute_layers = -1;  // -1 = all layers of a stage; k = the first k layers per stage
  Offload offload;
  Dtype precision = Dtype::kBf16;    // math and activation dtype (fp32 master weights otherwise)
  bool flash_attention = true;       // fused attention (no s x s score matrix in memory)
  bool overlap_grad_reduce = true;   // data-parallel gradient reduction overlapped with backward
  bool overlap_param_gather = true;  // ZeRO parameter gathers overlapped with compute
  std::array<Dim, 5> rank_order = {Dim::kTp, Dim::kCp, Dim::kEp, Dim::kDp, Dim::kPp};
  // Optional names of the model and cluster the plan was made for (preset or path).
  std::string model_ref;
  std::string cluster_ref;
  int gpus_ref = 0;

  int gpus() const { return tp * pp * dp * cp; }
  int micro_batches() const { return global_batch / (dp * micro_batch); }
  int64_t seq(const Model& m) const { return seq_len > 0 ? seq_len : m.seq_len; }
  // Layers recomputed fully per stage under kFull (all when recompute_layers < 0).
  int full_recompute_layers(int layers_per_stage) const;
};

// Rank order string such as "tp-cp-ep-dp-pp".
std::string rank_order_name(const std::array<Dim, 5>& order);
std::array<Dim, 5> parse_rank_order(const std::string& s, const std::string& field);

// Rejects every plan that cannot run on `cluster` for `model`, naming the field:
// "plan.tp: 3 does not divide attention heads (32)". Returns normally when it can run.
void validate(const Plan& plan, const Model& model, const Cluster& cluster);

Plan plan_from_json(const Json& j, const std::string& path = "plan");
Json plan_to_json(const Plan& p);

}  // namespace parasol
