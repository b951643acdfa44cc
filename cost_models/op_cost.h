// The price of one op of a lowered plan's Program, on the rank that plays its pipeline stage:
// the formulas the event simulator (sim/engine) plays and calibration (traces/calibrate) fits,
// kept in one place so that a prediction and a fit of it price an op the same way.
//
// Prices: a GEMM's or element-wise op's memory-bound epilogue (Op::epilogue_bytes: RoPE) adds
// memory_time of its bytes (a kernel of its own), a GEMM's GELU epilogue (OpRole::kGeluFc1,
// kGeluFc2Dx: inside the GEMM) its bytes at the same bandwidth without a launch; the fills a
// deterministic plan adds to the outputs an op allocates (host_cost.h deterministic_fills)
// small_kernels_time of theirs. An MoE expert-side op is priced at the busiest expert-parallel
// rank's rows: its price times Op::load (core/moe_load.h), which sets when the layer's combine can
// finish. Compute ops run on the rank's device in plan.precision: GEMMs (linear, expert linear,
// router) by gemm_time (or FLOPs at gemm efficiency, or bytes when they have no shape), the
// attention core by attention_{forward,backward}_time, memory-bound ops by memory_time of Op::bytes
// (or 2 x elements x dtype bytes), AdamW likewise (or optimizer_time of its parameters); an
// optimizer-step op whose buffers all live in host memory (runs_on_host) runs on the host at the
// profile's CPU-Adam rate per server shared by its GPUs. Collectives by the GroupModel of the op's
// group placed on the topology, with the same-kind groups of the stage running concurrently;
// pipeline sends by the bottleneck bandwidth of all ranks of the stage sending to their peers at
// once, plus path and software latency; ring steps of another group (context-parallel K/V) as one
// ring step of that group; offload and prefetch by the GPU's host link bandwidth times the
// profile's copy efficiency. Receives cost nothing (the send carries the transfer).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/cluster.h"
#include "core/model.h"
#include "core/plan.h"
#include "core/program.h"
#include "core/rank_layout.h"
#include "cost_models/collective.h"
#include "cost_models/profile.h"

namespace parasol::cost {

// The Collective of a collective OpKind (kAllReduce for any other kind).
Collective collective_of(OpKind k);

// True for ops that compute (neither communication, host <-> device copies nor host syncs). A
// sync (OpKind::kSync) is priced at Profile::host_sync_s: the host's wake-up after its wait.
bool is_compute_kind(OpKind k);

// An optimizer-step compute op (AdamW, cast, grad norm) runs on the host CPU when every buffer
// it touches lives in host memory (AdamW and cast under optimizer offload; lower.h's
// convention). Other ops are not checked (looking their buffers up would cost a cache miss per
// op).
bool runs_on_host(const Program& p, const Op& op);

// Prices of placed groups and pipeline links. They depend only on where the ranks sit and on
// the profile, so one cache serves every plan of one cluster priced with one profile.
struct PlacementCache {
  explicit PlacementCache(const Cluster& cluster);
  std::vector<int> first_gpu_of_server;
  std::map<std::vector<int64_t>, std::unique_ptr<GroupModel>> groups;
  std::map<std::vector<int64_t>, std::pair<double, double>> links;  // (bandwidth, latency)
  std::map<int, double> host_bw;  // per GPU, copy efficiency applied
  // The group models of (a plan's rank layout, stage, group): pricers of plans that share a
  // layout find their groups without placing them again.
  std::map<std::vector<int64_t>, const GroupModel*> by_layout;
};

// The shape of an op as far as its price is concerned (OpPricer::shape): two ops of one shape
// are priced alike by one pricer.
struct OpShape {
  int kind, phase, group, stage, peer, host;
  int flags;  // what the price depends on besides the shape (a linear's pass, the router, ...)
  int64_t m, n, k, batch;
  double elements, bytes, flops, epilogue, load;
  int64_t ab, aq, akv, ah, akvh, ad;  // attention: batch, seq_q, seq_kv, heads, kv_heads, dim
  int aflags;
  bool operator==(const OpShape& o) const = default;
};
struct OpShapeHash {
  size_t operator()(const OpShape& s) const;
};

// Which link an op's data crosses on its rank (the simulator shares a link among the
// concurrent ops that cross it).
enum class LinkUse { kNone, kIntraServer, kInterServer, kDeviceToHost, kHostToDevice };

// Prices the ops of the Programs of one plan (one representative rank per pipeline stage).
// Each distinct op shape is priced once. Not thread-safe; all references must outlive it, and
// `places` must have been built for `cluster` and used with `profile` only.
class OpPricer {
 public:
  // reps[s]: the rank that plays stage s.
  OpPricer(const Model& model, const Cluster& cluster, const Plan& plan, const Profile& profile,
           const RankLayout& layout, const std::vector<int>& reps, PlacementCache& places);
  ~OpPricer();

  // Seconds of `op` of stage `stage` alone on its representative rank (`host`: it runs on the
  // host CPU, see runs_on_host). Group::kPp collectives are priced by pp_collective_time().
  double time(const Op& op, int stage, bool host);
  // The same price without the shape memo, for a caller that prices each shape once.
  double time_once(const Op& op, int stage, bool host) { return price(op, stage, host); }
  // The shape time() keys its prices by.
  OpShape shape(const Op& op, int stage, bool host) const;
  // Seconds of a Group::kPp collective (a rendezvous) of the representatives of `stages`.
  double pp_collective_time(const Op& op, const std::vector<int>& stages);
  // The link an op of `stage` crosses (kNone for compute, receives and local groups).
  LinkUse link_use(const Op& op, int stage);
  // The rank of stage `peer_stage` whose other coordinates are those of stage `stage`'s
  // representative.
  int peer_rank(int stage, int peer_stage) const;
  // Seconds of host time to issue `op` (cost_models/host_cost.h) under this plan and profile.
  double host_time(const Op& op) const;

 private:
  struct ShapeCache;
  double price(const Op& op, int stage, bool host);       // with the op's epilogue
  double body_price(const Op& op, int stage, bool host);  // without it
  const std::vector<int>& group_ranks(int stage, Group g);
  const GroupModel& group_model(int stage, Group g);
  void append_place(std::vector<int64_t>& sig, int gpu, int base_server) const;
  std::pair<double, double> p2p_link(int from, int to);
  double host_bw(int stage);
  double elementwise_bytes(const Op& op) const;
  AttnShape attention_shape(const Op& op) const;

  const Model& model_;
  const Cluster& cluster_;
  const Plan& plan_;
  const Profile& prof_;
  const RankLayout& layout_;
  const std::vector<int>& reps_;
  PlacementCache& places_;
  std::unique_ptr<ShapeCache> shapes_;
  std::map<std::pair<int, int>, std::vector<int>> ranks_;           // (stage, group)
  std::map<std::pair<int, int>, const GroupModel*> groups_;         // (stage, group)
  std::map<std::pair<int, int>, std::pair<double, double>> links_;  // (from, to)
  std::vector<int64_t> layout_signature_;  // what decides the plan's rank layout
};

}  // namespace parasol::cost
