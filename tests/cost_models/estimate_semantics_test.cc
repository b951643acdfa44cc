// Tests the framework semantics and physical effects of the closed-form estimate
// (cost_models/estimate.h, memory.h): ZeRO stages as the frameworks run them (Megatron's
// distributed optimizer, DeepSpeed ZeRO-2, ZeRO-3 reshard modes, HSDP), TP communication
// overlap, the overlap slowdown, DeepEP's deduplicated dispatch, expert tensor parallelism,
// bf16 optimizer state, host memory as a limit of offloading, and PyTorch FSDP's own copies.
// Each figure is worked from independently priced collectives or counted bytes.
#include <gtest/gtest.h>

#include <cmath>

#include "core/cluster.h"
#include "core/model.h"
#include "core/plan.h"
#include "core/rank_layout.h"
#include "cost_models/collective.h"
#include "cost_models/compute.h"
#include "cost_models/estimate.h"
#include "cost_models/memory.h"

namespace parasol::cost {
namespace {

Estimate run(const Model& m, const Cluster& c, const Plan& p, const Profile* prof = nullptr) {
  validate(p, m, c);
  return estimate(m, c, p, prof ? *prof : default_profile(c.gpu_device(0)));
}

// Llama-style 8-layer model, data parallel over 16 H100s on 2 servers, nothing overlapped so
// that the data-parallel time is the sum of its collectives.
class DataParallelSemantics : public ::testing::Test {
 protected:
  Model m = llama_model("dp-test", 8, 4096, 32, 8, 14336, 32000, 4096);
  Cluster c = cluster_preset("dgx-h100", 16);
  Plan plan(int zero, int micro_batches = 4) const {
    Plan p;
    p.dp = 16;
    p.micro_batch = 1;
    p.global_batch = 16 * micro_batches;
    p.zero = zero;
    p.overlap_grad_reduce = false;
    p.overlap_param_gather = false;
    p.grad_reduce_dtype = Dtype::kBf16;  // gradients and parameters move the same bytes
    return p;
  }
};

TEST_F(DataParallelSemantics, DistributedOptimizerReducesOncePerStepZero2EveryMicroBatch) {
  // Megatron's distributed optimizer (ZeRO-1) reduce-scatters the accumulated gradients once
  // per step; DeepSpeed ZeRO-2 keeps only a gradient shard, so it reduce-scatters every
  // micro-batch. Both gather the updated parameters once. With 4 micro-batches ZeRO-2 moves
  // 3 more reduce-scatters: dp(z2) - dp(z1) = 3 x reduce-scatter = 3 x (dp(z1) / 2).
  const double z1 = run(m, c, plan(1)).time.dp_comm;
  const double z2 = run(m, c, plan(2)).time.dp_comm;
  EXPECT_GT(z1, 0);
  EXPECT_NEAR(z2 - z1, 3 * z1 / 2, 1e-9 * z2);
  // A Megatron run described as "ZeRO-2" (MegaScale) entered as --zero 2 would pay that.
  EXPECT_GT(run(m, c, plan(2, 8)).step_time_s, run(m, c, plan(1, 8)).step_time_s);
}

TEST_F(DataParallelSemantics, Zero3ReshardModesCountTheirGathers) {
  // Per layer, per micro-batch: after_forward gathers twice (forward, backward) and reduces once;
  // after_backward gathers once; after_step gathers and reduces once per step. Gathers and
  // reduce-scatters of the same bytes cost the same on a ring.
  const int mb = 4;
  Plan p = plan(3, mb);
  p.reshard = Reshard::kAfterForward;
  const double fwd = run(m, c, p).time.dp_comm;
  p.reshard = Reshard::kAfterBackward;
  const double bwd = run(m, c, p).time.dp_comm;
  p.reshard = Reshard::kAfterStep;
  const double step = run(m, c, p).time.dp_comm;
  EXPECT_NEAR(fwd / bwd, 1.5, 1e-9);
  EXPECT_NEAR(bwd / step, mb, 1e-6 * mb);
}

TEST_F(DataParallelSemantics, PipelinedFsdpReductionsAfterTheStepAreExposedWhole) {
  // FSDP2 under torch.distributed.pipelining (ZeRO-3 resharded after the step, pp 2) reduces a
  // chunk's gradients after its last backward, one unit after another, with the compute stream
  // waiting (core/fsdp_pipeline_reduce.h), and its gradient sends after them: overlap_grad_reduce
  // hides none of it, and the drain waits for both stages' reduce-scatters. Stage 0 is the 8
  // GPUs of the first server (dp varies fastest); 4 layers' bf16 gradients a stage, the
  // embedding or the head spread over them.
  Plan p = plan(3, 8);
  p.dp = 8;
  p.pp = 2;
  p.reshard = Reshard::kAfterStep;
  const double exposed = run(m, c, p).time.dp_comm;
  p.overlap_grad_reduce = true;
  EXPECT_NEAR(run(m, c, p).time.dp_comm, exposed, 1e-9 * exposed);
  const Profile prof = default_profile(c.gpu_device(0));
  std::vector<std::vector<int>> groups;
  for (int s = 0; s < 2; ++s) {
    std::vector<int> g;
    for (int i = 0; i < 8; ++i) g.push_back(8 * s + i);
    groups.push_back(g);
  }
  GroupModel dp(c, prof, groups[0], groups, false);
  const double per_layer =
      std::min(stage_params(m, p, 0).dense, stage_params(m, p, 1).dense) / 4 * 2;
  EXPECT_GE(exposed, 2 * 4 * dp.cost(Collective::kReduceScatter, per_layer).time_s * (1 - 1e-9));
  // Without a pipeline FSDP's hooks reduce each layer as its backward ends, beside the rest.
  Plan flat = plan(3, 8);
  flat.reshard = Reshard::kAfterStep;
  const double serial = run(m, c, flat).time.dp_comm;
  flat.overlap_grad_reduce = true;
  EXPECT_LT(run(m, c, flat).time.dp_comm, serial);
}

TEST_F(DataParallelSemantics, PipelinedFsdpReductionsOfALaterChunkFallInTheCoolDownsWaits) {
  // Interleaved, two chunks a stage (core/fsdp_pipeline_reduce.h exposed_chunk_reductions): a
  // stage's chunk-1 reductions come in the cool-down's rounds, its chunk-0 ones on the drain's
  // last pass. Stage 0 holds 5 layers (3 + 2), stage 1 holds 3 (2 + 1): stage 1 feeds the longer
  // stage 0 in the backward, runs each round ahead of it and waits, and its chunk-1 reductions
  // (1 of its 3 layers) fall in those waits. 1F1B with the same stages passes both stages' whole
  // reductions: the step exposes one of stage 1's layer reduce-scatters more (over its 8 GPUs,
  // bf16 gradients; a layer's share of the stage's parameters, the head's spread over them).
  Plan p = plan(3, 8);
  p.dp = 8;
  p.pp = 2;
  p.reshard = Reshard::kAfterStep;
  p.stage_layers = {5, 3};
  const double one_f_one_b = run(m, c, p).time.dp_comm;
  p.schedule = Schedule::kInterleaved;
  p.vpp = 2;
  p.stage_layers = {3, 2, 2, 1};
  const double interleaved = run(m, c, p).time.dp_comm;
  const Profile prof = default_profile(c.gpu_device(0));
  std::vector<std::vector<int>> groups(2);
  for (int s = 0; s < 2; ++s)
    for (int i = 0; i < 8; ++i) groups[s].push_back(8 * s + i);
  GroupModel dp(c, prof, groups[1], groups, false);
  const double per_layer = stage_params(m, p, 1).dense / 3 * 2;
  const double layer = dp.cost(Collective::kReduceScatter, per_layer).time_s;
  EXPECT_GT(layer, 0);
  EXPECT_NEAR(one_f_one_b - interleaved, layer, 1e-6 * one_f_one_b);
}

TEST_F(DataParallelSemantics, HsdpReduceScattersInsideTheServerAndAllReducesAcross) {
  // shard_degree 8: shards inside a server, replicas across the two servers. Once per step
  // (after_step, nothing overlapped): per layer a gather and a reduce-scatter over the 8 GPUs
  // of a server, and an all-reduce of the 1/8 shard between the two replicas.
  Plan p = plan(3, 1);
  p.reshard = Reshard::kAfterStep;
  p.shard_degree = 8;
  const Estimate e = run(m, c, p);
  const Profile prof = default_profile(c.gpu_device(0));
  RankLayout layout(p);
  std::vector<std::vector<int>> shards, replicas;
  for (int s = 0; s < 2; ++s) {
    std::vector<int> g;
    for (int i = 0; i < 8; ++i) g.push_back(8 * s + i);
    shards.push_back(g);
  }
  for (int i = 0; i < 8; ++i) replicas.push_back({i, 8 + i});
  GroupModel shard(c, prof, shards[0], shards, false),
      replica(c, prof, replicas[0], replicas, false);
  // Stage parameters per layer: the dense layer, and the embedding and head spread evenly over
  // the layers by the per-layer units (the estimate's FSDP units).
  const StageParams sp = stage_params(m, p, 0);
  const double per_layer = sp.dense / m.layers * 2;  // bf16 bytes
  const double expected = m.layers * (shard.cost(Collective::kAllGather, per_layer).time_s +
                                      shard.cost(Collective::kReduceScatter, per_layer).time_s +
                                      replica.cost(Collective::kAllReduce, per_layer / 8).time_s);
  EXPECT_NEAR(e.time.dp_comm, expected, 1e-9 * expected);
  // Full sharding over both servers moves the shards through the NICs instead.
  Plan full = p;
  full.shard_degree = 0;
  EXPECT_NE(run(m, c, full).time.dp_comm, e.time.dp_comm);
}

TEST(TpSemantics, CommOverlapHidesTpCollectivesBehindTheirGemmsAndSlowsThem) {
  Model m = model_preset("llama3-70b");
  Cluster c = cluster_preset("dgx-h100", 8);
  Plan p;
  p.tp = 8;
  p.sequence_parallel = true;
  p.micro_batch = 1;
  p.global_batch = 1;
  p.seq_len = 8192;
  const Estimate plain = run(m, c, p);
  p.tp_comm_overlap = true;
  const Estimate ub = run(m, c, p);
  EXPECT_LT(ub.time.tp_comm, 0.5 * plain.time.tp_comm);
  EXPECT_GT(ub.time.overlap, plain.time.overlap);
  EXPECT_LT(ub.step_time_s, plain.step_time_s);
}

TEST(OverlapSlowdown, IsTheProfileFractionOfTheHiddenCommunication) {
  // Same plan, slowdowns 0 and the H100's defaults (0.19; 0.5 beside its ZeRO-3 gathers and
  // reductions): the step differs by exactly the overlap term.
  Model m = model_preset("llama3-8b");
  Cluster c = cluster_preset("dgx-h100", 64);
  Plan p;
  p.dp = 64;
  p.zero = 3;
  p.micro_batch = 1;
  p.global_batch = 64;
  Profile off = default_profile(c.gpu_device(0)), on = off;
  off.overlap_compute_slowdown = 0;
  off.dp_overlap_compute_slowdown = 0;
  on.overlap_compute_slowdown = 0.19;
  ASSERT_GT(on.dp_overlap_compute_slowdown, 0);
  const Estimate a = run(m, c, p, &off), b = run(m, c, p, &on);
  EXPECT_EQ(a.time.overlap, 0);
  EXPECT_GT(b.time.overlap, 0);
  EXPECT_NEAR(b.step_time_s - a.step_time_s, b.time.overlap, 1e-9 * b.step_time_s);
}

// Megatron's overlapped expert all-to-alls hold SMs the GEMMs beside them were sized to use
// (cost_models/compute_overlap.h holds_gemm_sms): the compute they hide behind is slowed at the
// data-parallel kind's figure (Hopper: 0.5), not the tensor-parallel kind's; without the overlap
// they run in compute order and slow nothing.
TEST(OverlapSlowdown, OverlappedExpertExchangesSlowComputeAsDataParallelTrafficDoes) {
  Model m = model_preset("qwen3-30b-a3b");
  m.layers = 4;
  Cluster c = cluster_preset("dgx-h100", 16);
  Plan p;
  p.dp = 16;
  p.ep = 16;
  p.micro_batch = 1;
  p.global_batch = 64;
  p.moe_dispatcher = MoeDispatcher::kDeepEp;
  p.ep_comm_overlap = true;
  p.overlap_grad_reduce = false;
  p.overlap_param_gather = false;
  Profile base = default_profile(c.gpu_device(0));
  base.overlap_compute_slowdown = 0.19;
  Profile dp_kind = base, none = base;
  dp_kind.dp_overlap_compute_slowdown = 0.5;
  none.dp_overlap_compute_slowdown = 0;
  const Estimate slowed = run(m, c, p, &dp_kind), free = run(m, c, p, &none);
  ASSERT_GT(slowed.time.overlap, 0);
  EXPECT_EQ(free.time.overlap, 0);  // the other kind's 0.19 does not apply to them
  p.ep_comm_overlap = false;
  EXPECT_EQ(run(m, c, p, &dp_kind).time.overlap, 0);
}

TEST(MoeSemantics, DeepEpDeduplicatesCopiesToRemoteNodes) {
  // 64 experts, top-8, ep 16 over 2 servers: a remote server holds 32 experts, and gets none
  // of a token's 8 with probability C(32, 8) / C(64, 8); DeepEP sends one copy per remote server
  // holding any, against 8 x 1/2 copies per token without it.
  Model m = model_preset("mixtral-8x7b");
  m.moe.experts = 64;
  m.moe.top_k = 8;
  Cluster two = cluster_preset("dgx-h100", 16), one = cluster_preset("dgx-h100", 8);
  Plan p;
  p.dp = 16;
  p.ep = 16;
  p.micro_batch = 1;
  p.global_batch = 16;
  // The deduplication alone: DeepEP's internode kernels at NCCL's link efficiency (their own,
  // Profile::expert_exchange_network_efficiency, is moe_dispatch_test's subject).
  Profile same_links = default_profile(two.gpu_device(0));
  same_links.expert_exchange_network_efficiency = 0;
  same_links.expert_exchange_network_efficiency_two_servers = 0;
  const double a2a = run(m, two, p, &same_links).time.ep_comm;
  p.moe_dispatcher = MoeDispatcher::kDeepEp;
  const double deepep = run(m, two, p, &same_links).time.ep_comm;
  EXPECT_GT(run(m, two, p).time.ep_comm, deepep);  // Hopper's DeepEP NIC efficiency < NCCL's
  double none = 1;
  for (int i = 0; i < 8; ++i) none *= (32.0 - i) / (64.0 - i);
  const double ratio = (1 - none) / (8 * 0.5);
  EXPECT_LT(deepep, a2a);
  EXPECT_NEAR(deepep / a2a, ratio, 0.05);  // bandwidth-bound all-to-alls (latency aside)
  // Inside one server there is nothing to deduplicate.
  Plan q = p;
  q.dp = q.ep = 8;
  q.global_batch = 8;
  const double local_deepep = run(m, one, q).time.ep_comm;
  q.moe_dispatcher = MoeDispatcher::kAllToAll;
  EXPECT_DOUBLE_EQ(local_deepep, run(m, one, q).time.ep_comm);
}

TEST(MoeSemantics, ExpertTensorParallelismSplitsExpertsEtpWays) {
  // tp 2 with etp 1 (Megatron's MoE parallel folding): each expert whole on a rank, ep 16 over
  // the 2 x 8 ranks; with etp = tp = 2 and ep 8 the same experts per rank are split in two.
  Model m = model_preset("mixtral-8x7b");
  m.moe.experts = 16;
  Cluster c = cluster_preset("dgx-h100", 16);
  Plan folded;
  folded.tp = 2;
  folded.dp = 8;
  folded.ep = 16;
  folded.etp = 1;
  folded.sequence_parallel = true;
  folded.micro_batch = 1;
  folded.global_batch = 8;
  Plan split = folded;
  split.ep = 8;
  split.etp = 0;
  validate(folded, m, c);
  validate(split, m, c);
  const double expert_params = static_cast<double>(param_counts(m).expert_mlp) * m.layers;
  EXPECT_NEAR(stage_params(m, folded, 0).expert, expert_params * 16 / 16 / 1, 1);
  EXPECT_NEAR(stage_params(m, split, 0).expert, expert_params * 16 / 8 / 2, 1);
  EXPECT_EQ(folded.expert_dp(), 1);
  EXPECT_EQ(split.expert_dp(), 1);
  EXPECT_GT(run(m, c, folded).step_time_s, 0);
}

TEST(MemorySemantics, Bf16OptimizerStateIsFourBytesAParameter) {
  // fp32 master and moments (12 bytes a parameter) against bf16 moments on bf16 weights (4),
  // and bf16 gradients (2 instead of 4).
  Model m = model_preset("llama3-8b");
  Cluster c = cluster_preset("dgx-h100", 8);
  Plan p;
  p.dp = 8;
  p.global_batch = 8;
  const MemoryBreakdown a = memory_per_rank(m, c, p);
  p.optimizer_dtype = Dtype::kBf16;
  const MemoryBreakdown b = memory_per_rank(m, c, p);
  const double params = stage_params(m, p, 0).total();
  EXPECT_NEAR(a.optimizer, 12 * params, 1);
  EXPECT_NEAR(b.optimizer, 4 * params, 1);
  EXPECT_NEAR(b.gradients, 2 * params, 1);
  EXPECT_DOUBLE_EQ(a.weights, b.weights);
}

TEST(MemorySemantics, ReshardModesHoldWhatTheyKeep) {
  // ZeRO-3 over 8 ranks: after_forward holds the shard (and two gathered layers in the
  // backward); after_backward the shard and the whole stage's weights gathered but the
  // embedding's (freed after its forward: its backward reads no weight); after_step the shard,
  // the whole stage gathered and its unsharded gradients.
  Model m = model_preset("llama3-8b");
  Cluster c = cluster_preset("dgx-h100", 8);
  Plan p;
  p.dp = 8;
  p.global_batch = 8;
  p.zero = 3;
  const double params = stage_params(m, p, 0).total();
  const MemoryBreakdown fwd = memory_per_rank(m, c, p, 0);
  EXPECT_NEAR(fwd.weights, 2 * params / 8, 1);
  p.reshard = Reshard::kAfterBackward;
  const MemoryBreakdown bwd = memory_per_rank(m, c, p, 0);
  EXPECT_NEAR(bwd.weights, 2 * params / 8 + 2 * (params - stage_params(m, p, 0).embedding), 1);
  p.reshard = Reshard::kAfterStep;
  const MemoryBreakdown step = memory_per_rank(m, c, p, 0);
  EXPECT_NEAR(step.weights, 2 * params / 8 + 2 * params, 1);
  EXPECT_NEAR(step.gradients - fwd.gradients, 4 * params, 1);  // fp32 gradient accumulators
}

TEST(HostMemory, OffloadBeyondTheServersHostMemoryDoesNotFit) {
  // GPT-3 175B on one 8-GPU server with 256 GiB of host memory: offloading the optimizer state
  // (12 bytes a parameter, ~2.1 TB over the server) cannot fit, though the GPUs could hold
  // what stays; with 4 TiB of host memory it fits.
  Model m = model_preset("gpt3-175b");
  auto server = [](double host_gib) {
    return cluster_from_json({{"generator", "rail"},
                              {"gpus", 8},
                              {"device", "H200"},
                              {"gpus_per_server", 8},
                              {"host_memory_GiB", host_gib}});
  };
  Plan p;
  p.tp = 8;
  p.recompute = Recompute::kFull;
  p.offload.optimizer = true;
  p.offload.params = true;
  p.global_batch = 1;
  const Cluster small = server(256), big = server(4096);
  const Estimate a = run(m, small, p), b = run(m, big, p);
  EXPECT_GT(a.host_memory_per_server_bytes, a.host_memory_capacity_bytes);
  EXPECT_FALSE(a.fits);
  EXPECT_LE(b.host_memory_per_server_bytes, b.host_memory_capacity_bytes);
  EXPECT_LE(b.memory_per_gpu_bytes, b.device_memory_bytes);
  EXPECT_TRUE(b.fits);
}

// Parameter offload under ZeRO-3 copies the shard in when the reshard policy gathers it: every
// forward and backward of every micro-batch (after_forward), every forward (after_backward),
// once per step (after_step); so the offload time falls in that order, and with one micro-batch
// after_backward and after_step copy the same.
TEST(Zero3ParamOffload, CopiesTheShardAsOftenAsTheReshardPolicyGathers) {
  // Short sequences on two GPUs: half the weights come over PCIe per gather, more than the
  // compute of a layer hides.
  Model m = model_preset("llama3-8b");
  Cluster c = cluster_preset("dgx-h100", 2);
  Plan p;
  p.dp = 2;
  p.zero = 3;
  p.offload.params = true;
  p.recompute = Recompute::kFull;
  p.micro_batch = 1;
  p.seq_len = 256;
  auto offload = [&](Reshard r, int gbs) {
    Plan q = p;
    q.reshard = r;
    q.global_batch = gbs;
    return run(m, c, q).time.offload;
  };
  const double fwd = offload(Reshard::kAfterForward, 8);
  const double bwd = offload(Reshard::kAfterBackward, 8);
  const double step = offload(Reshard::kAfterStep, 8);
  EXPECT_GT(fwd, bwd);
  EXPECT_GT(bwd, step);
  EXPECT_NEAR(offload(Reshard::kAfterBackward, 2), offload(Reshard::kAfterStep, 2), 1e-12);
}

// Selective recompute of Megatron's modules re-runs their forward in the backward: with {mlp}
// on a dense swiglu model the executed FLOPs exceed the model's by the MLP's forward, 2 x 3 x h
// x ffn per token and layer (independent of the attention); the recompute time grows with it.
TEST(RecomputeModules, MlpRecomputeReRunsTheMlpForward) {
  Model m = model_preset("llama3-8b");
  Cluster c = cluster_preset("dgx-h100", 8);
  Plan p;
  p.tp = 2;
  p.dp = 4;
  p.sequence_parallel = true;
  p.micro_batch = 1;
  p.global_batch = 16;
  p.recompute = Recompute::kSelective;
  p.recompute_modules = 1u << static_cast<int>(RecomputeModule::kMlp);
  const Estimate e = run(m, c, p);
  const double tokens = 16.0 * m.seq_len;
  const double mlp_flops = 2.0 * 3 * m.hidden * m.ffn * m.layers * tokens;
  EXPECT_NEAR(e.hardware_flops_per_step - e.model_flops_per_step, mlp_flops, 1e-9 * mlp_flops);
  // Core attention only (Megatron's default) re-runs the attention; no modules, nothing.
  Plan q = p;
  q.recompute_modules = 1u << static_cast<int>(RecomputeModule::kCoreAttn);
  const Estimate a = run(m, c, q);
  EXPECT_GT(a.time.recompute, 0);
  EXPECT_GT(e.time.recompute, a.time.recompute);  // MLP GEMMs outweigh flash attention at 8k
  q.recompute_modules = 0;
  EXPECT_EQ(run(m, c, q).time.recompute, 0);
  EXPECT_LT(run(m, c, q).step_time_s, a.step_time_s);
}

// MoE modules: moe re-runs the whole block with its forward all-to-alls, so it costs more than
// the experts' activation alone; layernorm re-runs only the pre-MLP norm.
TEST(RecomputeModules, MoeBlockCostsMoreThanItsParts) {
  Model m = model_preset("mixtral-8x7b");
  Cluster c = cluster_preset("dgx-h100", 16);
  Plan p;
  p.dp = 16;
  p.ep = 8;
  p.micro_batch = 1;
  p.global_batch = 16;
  p.recompute = Recompute::kSelective;
  auto recompute = [&](std::initializer_list<RecomputeModule> modules) {
    Plan q = p;
    q.recompute_modules = 0;
    for (RecomputeModule r : modules) q.recompute_modules |= 1u << static_cast<int>(r);
    return run(m, c, q).time.recompute;
  };
  const double act = recompute({RecomputeModule::kMoeAct});
  const double norm = recompute({RecomputeModule::kLayernorm});
  const double block = recompute({RecomputeModule::kMoe});
  EXPECT_GT(act, 0);
  EXPECT_GT(norm, 0);
  EXPECT_GT(block, act + norm);
  EXPECT_NEAR(recompute({RecomputeModule::kMoeAct, RecomputeModule::kLayernorm}), act + norm,
              1e-12);
}

// Megatron's 1F1B all-to-all overlap pairs each of a layer's four all-to-alls with one compute
// segment of another micro-batch (attention or MLP, forward or backward). Inside one server the
// all-to-alls are shorter than every segment and all hide; across servers on a slow network
// they outgrow the segments and the excess shows, still less than without the overlap.
TEST(MoeSemantics, EpOverlapHidesEachAllToAllBehindOneSegment) {
  Model m = model_preset("mixtral-8x7b");
  Plan p;
  p.dp = 8;
  p.ep = 8;
  p.micro_batch = 1;
  p.global_batch = 8;
  p.ep_comm_overlap = true;
  const Cluster one = cluster_preset("dgx-h100", 8);
  EXPECT_EQ(run(m, one, p).time.ep_comm, 0);
  p.ep_comm_overlap = false;
  EXPECT_GT(run(m, one, p).time.ep_comm, 0);
  // Eight servers of one GPU each, 1 GB/s apart: every all-to-all is network-bound.
  Cluster slow = cluster_from_json({{"generator", "rail"},
                                    {"gpus", 8},
                                    {"device", "H100-SXM"},
                                    {"gpus_per_server", 1},
                                    {"nic_GBps", 1}});
  const double without = run(m, slow, p).time.ep_comm;
  p.ep_comm_overlap = true;
  const Estimate with = run(m, slow, p);
  EXPECT_GT(with.time.ep_comm, 0);
  EXPECT_LT(with.time.ep_comm, without);
  // What hides is at most the layer's compute (each all-to-all behind one segment of it).
  EXPECT_GE(with.time.ep_comm, without - with.time.forward - with.time.backward);
}

}  // namespace
}  // namespace parasol::cost

namespace parasol::cost {
namespace {

// PyTorch FSDP1's own kernels (Plan::fsdp_impl fsdp1, core/fsdp_copies.h) add to each
// micro-batch, per unit (each layer, the embedding, the head) of n parameters over 8 ranks with
// bf16 parameters and an fp32 reduction: the shard cast before each gather (4 + 2 bytes a shard
// element; one gather a micro-batch when resharded after the backward), and before the
// reduce-scatter the gradient's concatenation (2 x 2 bytes), its cast (2 + 4) and pre-division
// by 4 (2 x 4), the shard's post-division by 2 after it (2 x 4): each a memory-bound kernel,
// counted here by hand. One server: the collectives stay hidden, so the step grows by them.
TEST(FsdpCopies, Fsdp1AddsItsKernelsToEachMicroBatch) {
  const Model m = llama_model("fsdp-test", 4, 4096, 32, 32, 11008, 32000, 2048);
  const Cluster c = cluster_preset("dgx-h100", 8);
  Plan p;
  p.dp = 8;
  p.zero = 3;
  p.reshard = Reshard::kAfterBackward;
  p.micro_batch = 1;
  p.global_batch = 16;  // two micro-batches
  const Estimate plain = run(m, c, p);
  p.fsdp_impl = FsdpImpl::kFsdp1;
  const Estimate fsdp = run(m, c, p);
  const DeviceSpec& d = c.gpu_device(0);
  const Profile prof = default_profile(d);
  const StageParams sp = stage_params(m, p, 0);
  double per_mb = 0;
  auto unit = [&](double n) {
    const double shard = std::ceil(n / 8), padded = shard * 8;
    per_mb += memory_time(d, prof, 6 * shard) + memory_time(d, prof, 4 * padded) +
              memory_time(d, prof, 6 * padded) + memory_time(d, prof, 8 * padded) +
              memory_time(d, prof, 8 * shard);
  };
  for (int l = 0; l < sp.dense_layers; ++l) unit(sp.dense_layer);
  unit(sp.embedding);
  unit(sp.head);
  const double added = fsdp.step_time_s - plain.step_time_s;
  EXPECT_GT(added, 0.9 * 2 * per_mb);
  EXPECT_LT(added, 1.0001 * 2 * per_mb);
  // FSDP2's copies differ (the copy-out of each gather, the cast copy-in): not FSDP1's.
  p.fsdp_impl = FsdpImpl::kFsdp2;
  EXPECT_NE(run(m, c, p).step_time_s, fsdp.step_time_s);
}

}  // namespace
}  // namespace parasol::cost
