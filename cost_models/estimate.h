// The closed-form plan estimate: step time with its breakdown, throughput, MFU/HFU and peak
// memory per GPU (and host memory per server), priced with the compute, collective and memory
// models. Fast enough for the plan search: an Estimator caches, per instance, the placed-group,
// per-layer and per-stage prices that many plans share. An Estimator is not thread-safe; use one
// per thread, and keep the Cluster it was given alive while it is used.
#pragma once

#include <array>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "core/cluster.h"
#include "core/model.h"
#include "core/plan.h"
#include "core/rank_layout.h"
#include "cost_models/collective.h"
#include "cost_models/framework_memory.h"
#include "cost_models/layer_fragment.h"
#include "cost_models/memory.h"
#include "cost_models/profile.h"

namespace parasol::cost {

struct TimeBreakdown {
  double forward = 0;    // forward compute of all micro-batches (slowest stage)
  double backward = 0;   // backward compute
  double recompute = 0;  // forward compute re-run for activation checkpointing
  double tp_comm = 0;    // exposed tensor/sequence-parallel communication
  double cp_comm = 0;    // exposed context-parallel K/V exchange
  double ep_comm = 0;    // exposed expert all-to-all (dispatch and combine)
  double pp_comm = 0;    // pipeline sends/receives on the critical path
  double bubble = 0;     // pipeline fill and drain (and waiting on slower stages)
  double dp_comm = 0;    // exposed gradient reduction and ZeRO gathers
  double optimizer = 0;  // optimizer step
  double offload = 0;    // exposed host<->device traffic and CPU optimizer time
  double overlap = 0;    // compute slowed by the communication it overlaps (Profile)
  // Host-bound: the device waiting for the host to issue its kernels, and for the host to wake
  // from device-to-host syncs (core/host_issue.h; the critical stage's micro-batches and the
  // step's tail).
  double host = 0;
  double total() const {
    return forward + backward + recompute + tp_comm + cp_comm + ep_comm + pp_comm + bubble +
           dp_comm + optimizer + offload + overlap + host;
  }
};

struct Estimate {
  double step_time_s = 0;
  TimeBreakdown time;
  double tokens_per_s = 0;
  double samples_per_s = 0;
  double mfu = 0;  // model FLOPs (3 x forward, Megatron convention) / (time x GPUs x peak)
  double hfu = 0;  // executed FLOPs including recompute / (time x GPUs x peak)
  double model_flops_per_step = 0;
  double hardware_flops_per_step = 0;
  // Seconds one micro-batch costs each pipeline stage (its forward, backward, recompute and
  // exposed communication); the slowest stage paces the pipeline.
  std::vector<double> stage_slot_s;
  int critical_stage = 0;
  // The MoE block's compute on the critical stage over the step, by part (shares of forward,
  // backward and recompute, not further terms of the step); all 0 for a dense model. Its
  // exposed token exchange is time.ep_comm.
  MoeParts moe;
  MemoryBreakdown memory;  // the rank with the largest peak
  // What the framework measures on that rank: allocated, reserved (with its band) and outside
  // the allocator (framework_memory.h). memory_per_gpu_bytes is its device_used(), what
  // nvidia-smi shows and what must fit in device_memory_bytes (DeviceSpec::hbm_bytes).
  FrameworkMemory framework;
  // One rank of each pipeline stage, stage 0 first (empty when estimate() was given the memory),
  // the stage whose rank holds the largest peak and that rank.
  std::vector<FrameworkMemory> stage_memory;
  int peak_stage = -1;
  int peak_rank = -1;
  double memory_per_gpu_bytes = 0;
  double device_memory_bytes = 0;
  // Offloaded bytes of a server's GPUs against the host memory the server can pin for them.
  double host_memory_per_server_bytes = 0;
  double host_memory_capacity_bytes = 0;
  // The search's verdict (memory_fit on `framework`: reserved at the top of its band, no margin)
  // and `fits`: the predicted device_used() within device_memory_bytes, and the host memory.
  MemoryFit memory_fit = MemoryFit::kNotByAllocated;
  bool fits = false;  // device and host memory, at the predicted reserved figure
};

Json estimate_to_json(const Estimate& e);

// Bytes one rank's communication moves in one micro-batch of one layer, by group.
struct CommBytes {
  double tp = 0, cp = 0, ep = 0;
};

class Estimator {
 public:
  // REQUIRES: `cluster` outlives the Estimator.
  Estimator(const Model& model, const Cluster& cluster, Profile profile);
  ~Estimator();
  Estimator(Estimator&&) noexcept;

  // REQUIRES: validate(plan, model, cluster) passed. `reserved`: how each stage's reserved
  // bytes are priced (framework_memory.h; the step time and the fit do not depend on it).
  Estimate estimate(const Plan& plan, Reserved reserved = Reserved::kReplay);
  // The same, with the plan's memory already computed by memory_per_rank() (no per-stage
  // figures; the outside-the-allocator part taken for a stage with both pipeline neighbours).
  Estimate estimate(const Plan& plan, const MemoryBreakdown& memory);

  // The bytes layer `layer`'s TP, CP and EP communication moves per micro-batch on one rank
  // (forward, backward, and the forward again under full recompute): the volumes the closed form
  // prices, for tests against the lowered Programs. Not on the search's path.
  // REQUIRES: validate(plan, model, cluster) passed; 0 <= layer < model.layers.
  CommBytes layer_comm_bytes(const Plan& plan, int layer);

  // Shares lowered layer fragments with other Estimators of the same model, cluster and profile
  // (the plan search's workers), so that each is lowered once.
  void share_fragments(std::shared_ptr<FragmentCache> cache) {
    shared_fragments_ = std::move(cache);
  }

  const Model& model() const { return model_; }
  const Cluster& cluster() const { return cluster_; }
  const Profile& profile() const { return profile_; }

  // Prices of one pipeline stage for one micro-batch (seconds; see estimate.cc).
  struct StagePrice {
    double forward = 0, backward = 0, recompute = 0;
    double tp = 0, cp = 0, ep = 0, pp = 0;  // exposed communication
    double hidden = 0;                      // communication overlapped with compute
    double ep_hidden = 0;                   // of it, the expert all-to-alls (compute_overlap.h)
    double dp = 0;                          // exposed per-micro-batch ZeRO traffic
    double dp_hidden = 0;
    double recompute_flops = 0;
    MoeParts moe;  // the MoE block's compute by part
    // The host (core/host_issue.h): seconds it spends issuing a micro-batch's forward and
    // backward (with recompute), and what the host adds to the slot (estimate() adds it after
    // slot()).
    double host_forward = 0, host_backward = 0;
    double syncs = 0;  // device-to-host syncs inside the layers (dropless MoE token counts)
    // A micro-batch's forward and backward (edges, layers and pipeline transfers, in the order
    // the lowering issues them) played with the host cursor (core/host_issue.h's HostPace).
    HostPace pace_forward, pace_backward;
    double paced_device = 0;  // the device's seconds in the two: pace_forward then pace_backward
    HostPace cycle;           // a micro-batch as the host paces it (host_excess sets it)
    double host = 0;
    double slot() const;  // everything a micro-batch costs the stage on the device
  };

 private:
  // Placement key: the degrees and rank order that decide where a group lands.
  using PlacementKey = std::tuple<int, int, int, int, int, int, int, int, int>;
  PlacementKey placement(const Plan& plan, int what) const;
  const GroupModel& group_model(const Plan& plan, Group g);
  // Expert groups under Megatron's expert grid (etp x ep x edp over a stage's ranks), the HSDP
  // shard and replica groups: the group of stage 0 containing rank 0, with its stage-0 siblings.
  enum class ExtraGroup {
    kExpertParallel,
    kExpertData,
    kDenseShard,
    kDenseReplica,
    kExpertShard,
    kExpertReplica
  };
  const GroupModel& extra_group_model(const Plan& plan, ExtraGroup g);
  // A layer kind's lowered fragment, playable, its compute priced (layer_fragment.h).
  const PlayableFragment& fragment(const Plan& plan, bool moe_layer, bool windowed);
  const LayerPrice& layer_price(const Plan& plan, bool moe_layer, bool windowed);
  StagePrice stage_price(const Plan& plan, int stage);
  // The host's share of the edges (embedding, head and loss, pipeline transfers), added to
  // `price`; what the host adds to a stage's micro-batch and to the step's tail (estimate.cc).
  // `device` holds the edges' device seconds (estimate.cc).
  struct EdgeDevice;
  void edge_host(const Plan& plan, int stage, const EdgeDevice& device, StagePrice& price) const;
  // Sets price.cycle, one micro-batch of a stage as the host paces it (its forward, with the
  // NaN/Inf check's syncs, and its backward, with what of the slot the fragments do not hold),
  // and returns what the host adds to a micro-batch in the steady state.
  double host_excess(const Plan& plan, int stage, StagePrice& price) const;
  // What the step's first forward and last backward add beyond `micro_batches` x the
  // micro-batch's host excess, and the device's backlog when the host has issued the last.
  double host_edges(const StagePrice& price, int micro_batches, double& backlog) const;
  double optimizer_host(const Plan& plan, int stage, double device_before, double device_step,
                        double& statistics_device) const;
  // Seconds for every rank of stage 0 to send `bytes` to its peer in stage 1 at once.
  double pp_transfer_time(const Plan& plan, double bytes);
  // Data-parallel synchronisation of one stage: exposed and hidden seconds per micro-batch
  // (ZeRO-2/3 traffic inside every micro-batch) and per step (after the pipeline).
  struct DataParallel {
    double per_micro_batch = 0, per_micro_batch_hidden = 0;
    double per_step = 0, per_step_hidden = 0;
    // Of the exposed seconds, those by which the communication outlasts the compute it hides
    // behind (it is the longer of the two): the compute slowed beside it ends no later until
    // it outlasts them (compute_overlap.h).
    double per_micro_batch_excess = 0, per_step_excess = 0;
    // Seconds of the stage's gradient reductions held back to each chunk's last backward
    // (core/fsdp_pipeline_reduce.h chunk_reductions_block_compute; else 0): not in per_step,
    // the step exposes them as a whole pipeline (held_reductions_exposed).
    double held = 0;
  };
  DataParallel data_parallel(const Plan& plan, int stage, const StagePrice& price);
  struct DataParallelQueues;  // the data-parallel stream beside a micro-batch (estimate.cc)
  struct DataParallelSync;    // data_parallel's pricing of one parameter class (estimate.cc)

  // The parts of estimate(), in the order it calls them (see estimate.cc).
  bool repeats_previous(const Plan& plan, int stage) const;
  void price_stages(const Plan& plan, std::vector<double>& slots);
  double offload_bandwidth(const Plan& plan, int critical_stage, int micro_batches,
                           double pipeline);
  double held_reductions_exposed(const Plan& plan) const;
  TimeBreakdown stage_tail(const Plan& plan, int stage, int micro_batches, double host_bw) const;
  TimeBreakdown slowest_tail(const Plan& plan, int critical_stage, int micro_batches,
                             double pipeline);
  void fill_throughput(const Plan& plan, int micro_batches, Estimate& e) const;
  void fill_memory(const Plan& plan, const MemoryBreakdown& memory, int stage, Estimate& e) const;

  Model model_;
  ParamCounts param_counts_;  // param_counts(model_), once
  const Cluster& cluster_;
  Profile profile_;
  DeviceSpec device_;
  // The band of the caching allocator's fragmentation (its range in profile_ranges.cc), read once.
  double fragmentation_low_ = 0, fragmentation_high_ = 0;
  double host_bw_ = 0;            // GPU <-> host bandwidth with every GPU of the server copying
  double nic_share_of_pcie_ = 0;  // NIC bandwidth / the GPU's PCIe link bandwidth
  // A layer index of each kind (dense/MoE x full/windowed attention), -1 when absent.
  std::array<int, 4> kind_layer_{-1, -1, -1, -1};
  // Each layer's dense weight tensors (layer_weight_tensors), once: the optimizer's host issue
  // counts them per bucket on every evaluation.
  std::vector<int> layer_tensors_;
  int expert_tensors_ = 0;  // an MoE layer's expert weight tensors (layer_weight_tensors)
  // The price caches, looked up on every evaluation (ordered maps: the tuple comparisons
  // measured faster than hashing the keys in search_bench).
  template <typename K, typename V>
  using Cache = std::map<K, V>;
  Cache<PlacementKey, std::unique_ptr<GroupModel>> groups_;
  // The op pricer's placed groups and links, shared by the layer fragments of every plan.
  std::unique_ptr<PlacementCache> places_;
  // Fragments by FragmentCache::Key: this Estimator's, and those shared with others.
  Cache<FragmentCache::Key, std::shared_ptr<const PlayableFragment>> fragments_;
  std::shared_ptr<FragmentCache> shared_fragments_;
  // The two int64_t switch words are price_flags and price_flags_more (estimate.cc).
  Cache<std::tuple<PlacementKey, int, int64_t, bool, bool, int, int64_t, bool, int, int64_t>,
        LayerPrice>
      layers_;
  Cache<PlacementKey, std::pair<double, double>> pp_links_;  // (bandwidth, latency)
  using StageKey =
      std::tuple<PlacementKey, int, int64_t, int, int64_t, int64_t, int, int, int, int64_t>;
  Cache<StageKey, StagePrice> stage_prices_;
  // data_parallel by everything it reads: the placement, the sharding switches (zero, reshard,
  // overlap_grad_reduce | overlap_param_gather << 1, grad_reduce_dtype, precision), micro-batches,
  // the stage's dense and expert parameters, layers, MoE layers and bucket edges (the first stage,
  // the last, an MoE first layer), its forward and backward windows, and DeepSpeed ZeRO-3's
  // prefetch bucket, reduce bucket and reuse distance (Plan::zero3_*; 0 unless zero3_unit module).
  using DataParallelKey =
      std::tuple<PlacementKey, int, int, int, int, int, int, double, double, int, int, int, double,
                 double, int64_t, int64_t, int64_t, int64_t>;
  Cache<DataParallelKey, DataParallel> data_parallel_;
  std::vector<StagePrice> scratch_stages_;  // estimate()'s per-stage prices
  std::vector<DataParallel> scratch_dps_;   // and data-parallel times
  double scratch_held_ = 0;                 // and held_reductions_exposed() of them
};

// One-off convenience wrapper.
Estimate estimate(const Model& model, const Cluster& cluster, const Plan& plan,
                  const Profile& profile, Reserved reserved = Reserved::kReplay);

}  // namespace parasol::cost
