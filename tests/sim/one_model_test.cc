// The closed form and the simulator are one model: on a grid of plans that uses every plan
// switch (GQA, MLA, sliding windows, MoE with shared experts, first-dense layers, an expert grid
// and DeepEP, CP rings, all-gathers and all-to-alls, ZeRO 0-3 in every reshard mode and HSDP,
// offload, GPipe / 1F1B / interleaved / uneven stages (Megatron's embedding/loss accounting too),
// recompute, fp8, unfused kernels, and TP and EP communication overlap on and off), the event
// simulator's step on the lowered Programs agrees with the closed-form estimate within a stated
// band. Each switch the Program says (core/lower.h) is priced by the same op prices in both, so the
// band is 2% but where a case names what the two still model differently.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "core/cluster.h"
#include "core/gather_units.h"
#include "core/liveness.h"
#include "core/lower.h"
#include "core/model.h"
#include "core/plan.h"
#include "core/zero3_live.h"
#include "cost_models/collective.h"
#include "cost_models/estimate.h"
#include "cost_models/memory.h"
#include "cost_models/profile.h"
#include "sim/engine.h"

namespace parasol::sim {
namespace {

struct Case {
  std::string name;
  std::string model;  // a preset
  int layers = 0;     // > 0: the preset cut to this many layers (a short test)
  int gpus = 16;
  std::function<void(Plan&)> plan;
  double band = 0.02;  // |simulated / estimated - 1| at most this
  std::string why;     // what the two still model differently, where band > 2%
  // |closed-form memory / liveness - 1| at most this, and what the two count differently where
  // it is not 1e-9.
  double mem_band = 1e-9;
  std::string mem_why;
  std::string cluster = "dgx-h100";  // the cluster preset (its device's facts: core/fp8_params.h)
};

Plan base_plan(int gpus) {
  Plan p;
  p.micro_batch = 1;
  p.global_batch = 8 * gpus;
  p.dp = gpus;
  return p;
}

// Sets the degrees and makes dp the GPUs left.
void degrees(Plan& p, int gpus, int tp, int pp = 1, int cp = 1) {
  p.tp = tp, p.pp = pp, p.cp = cp;
  p.dp = gpus / (tp * pp * cp);
  p.sequence_parallel = tp > 1;
}

std::vector<Case> cases() {
  std::vector<Case> out;
  const int n = 16;
  auto dense = [&](std::string name, std::function<void(Plan&)> f, double band = 0.02,
                   std::string why = "") {
    out.push_back({"llama3-8b " + name, "llama3-8b", 0, n, std::move(f), band, std::move(why)});
  };
  dense("tp2", [](Plan& p) { degrees(p, 16, 2); });
  dense("tp4 pp2", [](Plan& p) { degrees(p, 16, 4, 2); });
  dense("tp2 without sp", [](Plan& p) {
    degrees(p, 16, 2);
    p.sequence_parallel = false;
  });
  for (bool sp : {true, false})
    dense(std::string("tp4 tp_comm_overlap") + (sp ? "" : " without sp"), [sp](Plan& p) {
      degrees(p, 16, 4, 2);
      p.sequence_parallel = sp;
      p.tp_comm_overlap = true;
    });
  dense("unfused kernels", [](Plan& p) {
    degrees(p, 16, 2);
    p.fused_kernels = false;
  });
  // torchtitan's eager loss (fp32 upcast, NLL and log-softmax gradients as kernels of their
  // own) on the last stage of a pipeline.
  dense("eager loss tp2 pp2", [](Plan& p) {
    degrees(p, 16, 2, 2);
    p.eager_loss = true;
  });
  // The vocab-tiled loss (no fp32 softmax; the logits saved) on the last stage of a pipeline.
  dense("tiled loss tp2 pp2", [](Plan& p) {
    degrees(p, 16, 2, 2);
    p.tiled_loss = true;
  });
  // Megatron's unfused loss (core/unfused_xent.h) on the last stage of a pipeline, and without TP.
  dense("unfused loss tp2 pp2", [](Plan& p) {
    degrees(p, 16, 2, 2);
    p.cross_entropy_loss_fusion = false;
  });
  dense("unfused loss tp1", [](Plan& p) {
    degrees(p, 16, 1);
    p.cross_entropy_loss_fusion = false;
  });
  dense("fp8", [](Plan& p) {
    degrees(p, 16, 2);
    p.precision = Dtype::kFp8;
  });
  for (int cp : {2, 4})
    dense("cp" + std::to_string(cp), [cp](Plan& p) {
      degrees(p, 16, 2, 1, cp);
      p.seq_len = 8192 * cp;
    });
  // Megatron's --cp-comm-type all_gather and a2a (Transformer Engine's exchanges).
  dense("cp4 all_gather", [](Plan& p) {
    degrees(p, 16, 2, 1, 4);
    p.seq_len = 32768;
    p.cp_comm_type = CpCommType::kAllGather;
  });
  dense("cp4 a2a", [](Plan& p) {
    degrees(p, 16, 2, 1, 4);
    p.seq_len = 32768;
    p.cp_comm_type = CpCommType::kA2a;
  });
  // a2a+p2p: all-to-alls in groups of 2, a ring of 2 across them.
  dense("cp4 a2a+p2p", [](Plan& p) {
    degrees(p, 16, 2, 1, 4);
    p.seq_len = 32768;
    p.cp_comm_type = CpCommType::kA2aP2p;
    p.cp_a2a_size = 2;
  });
  dense("cp4 fp8", [](Plan& p) {
    degrees(p, 16, 2, 1, 4);
    p.seq_len = 32768;
    p.precision = Dtype::kFp8;
  });
  for (int zero : {1, 2, 3})
    dense("zero" + std::to_string(zero), [zero](Plan& p) {
      degrees(p, 16, 2);
      p.zero = zero;
    });
  for (Reshard r : {Reshard::kAfterBackward, Reshard::kAfterStep})
    dense(std::string("zero3 ") + reshard_name(r), [r](Plan& p) {
      degrees(p, 16, 1);
      p.zero = 3;
      p.reshard = r;
    });
  // FSDP2 keeps its root group (the embedding) gathered from each forward to its backward.
  for (Reshard r : {Reshard::kAfterForward, Reshard::kAfterBackward})
    dense(std::string("zero3 fsdp2 ") + reshard_name(r), [r](Plan& p) {
      degrees(p, 16, 1);
      p.zero = 3;
      p.reshard = r;
      p.fsdp_impl = FsdpImpl::kFsdp2;
    });
  // Compute beside both kinds of communication at once (cost_models/compute_overlap.h): the
  // tensor-parallel overlap's and ZeRO-3's gathers and reductions, CP's ring and the
  // distributed optimizer's.
  dense("zero3 tp4 tp_comm_overlap", [](Plan& p) {
    degrees(p, 16, 4);
    p.zero = 3;
    p.tp_comm_overlap = true;
  });
  // Megatron's gradients reduced in bf16: its gradient buffer in the parameters' dtype.
  dense("grad reduce bf16", [](Plan& p) {
    degrees(p, 16, 2, 2);
    p.grad_reduce_dtype = Dtype::kBf16;
  });
  // Megatron's --fp8-param-gather: the linear weights in fp8 with their transposes, gathered in
  // fp8 by the distributed optimizer.
  dense("fp8 param gather", [](Plan& p) {
    degrees(p, 16, 2, 2);
    p.zero = 1;
    p.precision = Dtype::kFp8;
    p.grad_reduce_dtype = Dtype::kBf16;
    p.fp8_param_gather = true;
  });
  // The same on GB200: Blackwell's fp8 GEMMs take either layout, so no transposes are kept.
  dense("fp8 param gather gb200", [](Plan& p) {
    degrees(p, 16, 2, 2);
    p.zero = 1;
    p.precision = Dtype::kFp8;
    p.grad_reduce_dtype = Dtype::kBf16;
    p.fp8_param_gather = true;
  });
  out.back().cluster = "gb200-nvl72";
  // Without it, Transformer Engine's cached fp8 copy of each bf16 linear weight (core/
  // te_weight_cache.h), with its transpose on H100 and without on GB200.
  for (const char* cluster : {"dgx-h100", "gb200-nvl72"}) {
    dense(std::string("fp8 te weight cache ") + cluster, [](Plan& p) {
      degrees(p, 16, 2, 2);
      p.zero = 1;
      p.precision = Dtype::kFp8;
      p.transformer_impl = TransformerImpl::kTransformerEngine;
    });
    out.back().cluster = cluster;
  }
  // LoRA (Plan::lora_rank, core/lower_lora.cc): the frozen base weights, the adapters' parameters,
  // gradients, Adam state, saved tensors and GEMMs. As the MLPerf llama2_70b_lora reference runs
  // it: fp8 weights, rank 16 on QKV and the projection with dropout, the SwiGLU input kept in fp8,
  // on GB200.
  dense("lora mlperf-like fp8", [](Plan& p) {
    degrees(p, 16, 1, 2);
    p.zero = 1;
    p.precision = Dtype::kFp8;
    p.fp8_param_gather = true;
    p.grad_reduce_dtype = Dtype::kBf16;
    p.lora_rank = 16;
    p.lora_targets =
        (1u << static_cast<int>(LoraTarget::kQkv)) | (1u << static_cast<int>(LoraTarget::kProj));
    p.lora_dropout = 0.1;
    p.activation_fp8_input_store = true;
  });
  out.back().cluster = "gb200-nvl72";
  // Context parallelism by all-to-alls (the reference's 4-GPU GB200 plan): the attention's backward
  // reads the kernel's own output, so the projection's input is kept for nothing under dropout.
  dense("lora cp2 a2a", [](Plan& p) {
    degrees(p, 16, 1, 1, 2);
    p.seq_len = 16384;
    p.zero = 1;
    p.cp_comm_type = CpCommType::kA2a;
    p.lora_rank = 16;
    p.lora_targets =
        (1u << static_cast<int>(LoraTarget::kQkv)) | (1u << static_cast<int>(LoraTarget::kProj));
    p.lora_dropout = 0.1;
  });
  // Every linear adapted, under full recompute (the adapters rebuilt with their layer).
  dense("lora all targets full recompute", [](Plan& p) {
    degrees(p, 16, 1, 2);
    p.recompute = Recompute::kFull;
    p.lora_rank = 32;
  });
  // The projection's adapter with dropout under selective recompute: its input kept for nothing.
  // (One stage: the lowering recomputes the core attention before the layer's MLP backward, which
  // the closed form's first-backward working set does not count yet.)
  dense("lora selective recompute", [](Plan& p) {
    degrees(p, 16, 1);
    p.recompute = Recompute::kSelective;
    p.lora_rank = 8;
    p.lora_targets =
        (1u << static_cast<int>(LoraTarget::kProj)) | (1u << static_cast<int>(LoraTarget::kFc2));
    p.lora_dropout = 0.05;
  });
  dense("cp2 zero1", [](Plan& p) {
    degrees(p, 16, 2, 1, 2);
    p.seq_len = 16384;
    p.zero = 1;
  });
  dense("hsdp", [](Plan& p) {
    degrees(p, 16, 1);
    p.zero = 3;
    p.shard_degree = 8;
  });
  dense("interleaved", [](Plan& p) {
    degrees(p, 16, 2, 4);
    p.vpp = 2;
    p.schedule = Schedule::kInterleaved;
  });
  dense("gpipe", [](Plan& p) {
    degrees(p, 16, 2, 4);
    p.schedule = Schedule::kGpipe;
  });
  dense("uneven stages", [](Plan& p) {
    degrees(p, 16, 2, 4);
    p.stage_layers = {6, 10, 10, 6};
  });
  // Megatron's embedding/loss accounting: 30 layers + 2 = 32 slots on pp 4 x vpp 2, the first
  // and last virtual stages one layer short.
  out.push_back({"llama3-8b accounted split interleaved", "llama3-8b", 30, n, [](Plan& p) {
                   degrees(p, 16, 2, 4);
                   p.vpp = 2;
                   p.schedule = Schedule::kInterleaved;
                   p.account_for_embedding = true;
                   p.account_for_loss = true;
                 }});
  dense("full recompute", [](Plan& p) {
    degrees(p, 16, 2);
    p.recompute = Recompute::kFull;
  });
  // Full recompute on a stage without the loss: its first backward rebuilds the last layer.
  dense("full recompute pp2", [](Plan& p) {
    degrees(p, 16, 2, 2);
    p.recompute = Recompute::kFull;
  });
  dense("selective recompute", [](Plan& p) {
    degrees(p, 16, 2);
    p.recompute = Recompute::kSelective;
  });
  // torchtitan's op-level selective AC (every other mm's output kept; wk, wo, w3, the norms and
  // the SwiGLU re-run in the backward), with SP's gathers re-run for wk and w3.
  dense("torchtitan op-level recompute", [](Plan& p) {
    degrees(p, 16, 2);
    p.recompute = Recompute::kSelectiveOp;
  });
  dense("optimizer offload", [](Plan& p) {
    degrees(p, 16, 2);
    p.offload.optimizer = true;
  });
  // DeepSpeed ZeRO-Offload: gradients streamed to host memory as each layer's backward ends
  // (one micro-batch a step: the micro-batch is the 8 sequences a rank gets), ZeRO-2 and ZeRO-3,
  // and ZeRO-2 without DeepSpeed's overlap_comm: each bucket's copy in the backward's stream
  // (core/offload_rules.h).
  for (int zero : {2, 3})
    dense("zero" + std::to_string(zero) + " offload", [zero](Plan& p) {
      degrees(p, 16, 2);
      p.zero = zero;
      p.offload.optimizer = true;
      p.micro_batch = 8;
    });
  // DeepSpeed's ZeRO-3 with optimizer offload and full recompute, as Megatron-DeepSpeed's Azure
  // recipes run it: gathers per module, the modules a short stage3_max_reuse_distance releases
  // after the recompute gathered again for the backward (core/gather_units.h), and the host
  // waiting on each bucket's blocking copy to the host (core/offload_rules.h).
  dense("deepspeed zero3 offload", [](Plan& p) {
    degrees(p, 16, 1);
    p.zero = 3;
    p.zero3_unit = GatherUnit::kModule;
    p.zero3_max_reuse_distance = 100000000;
    p.zero3_reduce_bucket = 90000000;
    p.offload.optimizer = true;
    p.recompute = Recompute::kFull;
    p.micro_batch = 8;
  });
  // The same on a GPT-3 175B layer (cut to 4 layers), whose weights outweigh its loss: this
  // last stage peaks in its first backward op (FC2's data gradient), not at the loss, where
  // DeepSpeed's coordinator (core/zero3_live.h) holds the module in use and the one prefetched,
  // gathered lazily in the lowering, beside the tied table's gradient (from the head's weight
  // gradient to the embedding's backward), FC2's bias gradient and the final norm's residual
  // gradient.
  out.push_back({"gpt3-175b deepspeed zero3 offload live parameters", "gpt3-175b", 4, n,
                 [](Plan& p) {
                   degrees(p, 16, 1);
                   p.zero = 3;
                   p.zero3_unit = GatherUnit::kModule;
                   p.zero3_reduce_bucket = 90000000;
                   p.offload.optimizer = true;
                   p.recompute = Recompute::kFull;
                   p.micro_batch = 4;
                 },
                 0.02});
  // DeepSpeed's ZeRO-3 where its gathers outlast the compute: GPT-3 175B layers (cut to 8) at
  // 2,048 A100s, one sequence each, full recompute. The closed form plays the coordinator's
  // one-module-ahead gathers and the reduce-scatters queued between them use by use
  // (cost_models/zero3_play.h) as the simulator plays the lowered Program, so the gathers the
  // compute cannot hide are exposed in both.
  out.push_back({"gpt3-175b deepspeed zero3 at 2048 ranks", "gpt3-175b", 8, 2048,
                 [](Plan& p) {
                   p.dp = 2048;
                   p.zero = 3;
                   p.zero3_unit = GatherUnit::kModule;
                   p.recompute = Recompute::kFull;
                   p.grad_reduce_dtype = Dtype::kBf16;
                 },
                 0.03,
                 "the closed form plays one micro-batch's uses and repeats it; the lowering's "
                 "schedule runs on across the step's eight micro-batches (ds_stage_schedule), "
                 "whose boundaries the simulator plays: 2.7% longer (17.4 s estimated before the "
                 "play against 20.2 s simulated on the 96-layer model at one micro-batch)",
                 1e-9, "", "dgx-a100-80g"});
  dense("zero2 offload without overlap", [](Plan& p) {
    degrees(p, 16, 2);
    p.zero = 2;
    p.offload.optimizer = true;
    p.micro_batch = 8;
    p.overlap_grad_reduce = false;
  });
  dense("parameter offload", [](Plan& p) {
    degrees(p, 16, 2);
    p.offload.params = true;
  });
  dense("zero3 parameter offload", [](Plan& p) {
    degrees(p, 16, 1);
    p.zero = 3;
    p.offload.params = true;
  });
  // FSDP2's CPU offload as torchtune runs it (CPUOffloadPolicy, torch's fused AdamW on the host,
  // bf16 throughout, full recompute): each gradient shard's copy to the host follows its
  // reduce-scatter, the shards' copies in run on their own stream (core/offload_rules.h), and a
  // layer is gathered once for its recompute and backward, as the closed form counts (a second
  // gather and copy in per backward put the simulator 2.8% above the estimate here).
  dense("fsdp2 cpu offload", [](Plan& p) {
    degrees(p, 16, 1);
    p.zero = 3;
    p.fsdp_impl = FsdpImpl::kFsdp2;
    p.offload.optimizer = true;
    p.offload.params = true;
    p.cpu_optimizer = CpuOptimizer::kTorch;
    p.optimizer_dtype = Dtype::kBf16;
    p.grad_reduce_dtype = Dtype::kBf16;
    p.recompute = Recompute::kFull;
  });
  dense(
      "activation offload",
      [](Plan& p) {
        degrees(p, 16, 2);
        p.offload.activations = true;
      },
      0.05,
      "the closed form copies a stage's saved activations (cost::layer_activation_bytes) behind "
      "one micro-batch's forward and backward as a whole; the Program copies each layer's after "
      "its forward and prefetches them one layer ahead");
  // MoE: Mixtral (top-2 of 8), with and without the combined-1F1B all-to-all overlap.
  auto moe = [&](std::string name, std::function<void(Plan&)> f, double band = 0.02,
                 std::string why = "") {
    out.push_back(
        {"mixtral-8x7b " + name, "mixtral-8x7b", 8, 32, std::move(f), band, std::move(why)});
  };
  moe("ep8", [](Plan& p) {
    degrees(p, 32, 1);
    p.ep = 8;
  });
  moe("ep4 tp2", [](Plan& p) {
    degrees(p, 32, 2);
    p.ep = 4;
  });
  // fp8 expert weights gathered over the expert data-parallel group.
  moe("ep4 tp2 fp8 param gather", [](Plan& p) {
    degrees(p, 32, 2);
    p.ep = 4;
    p.zero = 1;
    p.precision = Dtype::kFp8;
    p.fp8_param_gather = true;
  });
  // TE's cached fp8 copies of the bf16 expert weights (TEGroupedLinear, one per local expert).
  moe("ep4 tp2 fp8 te weight cache", [](Plan& p) {
    degrees(p, 32, 2);
    p.ep = 4;
    p.zero = 1;
    p.precision = Dtype::kFp8;
    p.transformer_impl = TransformerImpl::kTransformerEngine;
  });
  // Megatron-Core's probabilities in the experts' activation: the combine keeps no outputs.
  moe(
      "ep8 probs in experts",
      [](Plan& p) {
        degrees(p, 32, 1, 2);
        p.ep = 8;
        p.moe_probs_in_experts = true;
      },
      0.03,
      "the pipeline schedule is arithmetic in the closed form and played in the simulator "
      "(issue 46's first item): 2.4% apart at pp 2");
  moe("ep8 ep_comm_overlap", [](Plan& p) {
    degrees(p, 32, 1);
    p.ep = 8;
    p.ep_comm_overlap = true;
  });
  moe("ep8 ep_comm_overlap interleaved", [](Plan& p) {
    degrees(p, 32, 1, 2);
    p.ep = 8;
    p.vpp = 2;
    p.schedule = Schedule::kInterleaved;
    p.ep_comm_overlap = true;
  });
  // DeepEP on two nodes, in bf16 and fp8 (its forward dispatch in fp8).
  for (Dtype d : {Dtype::kBf16, Dtype::kFp8})
    out.push_back({std::string("qwen3-30b-a3b deepep ") + dtype_name(d), "qwen3-30b-a3b", 4, 16,
                   [d](Plan& p) {
                     degrees(p, 16, 1);
                     p.ep = 16;
                     p.moe_dispatcher = MoeDispatcher::kDeepEp;
                     p.precision = d;
                   }});
  // MLA with shared experts after a first dense layer, an expert grid of its own (etp 1 under
  // tp 2, ep 8 over more than dp).
  out.push_back({"deepseek-v3 mla expert grid", "deepseek-v3", 8, 16, [](Plan& p) {
                   degrees(p, 16, 2, 2);
                   p.ep = 8;
                   p.etp = 1;
                 }});
  // Alternating sliding windows with experts.
  out.push_back({"gpt-oss-20b windows", "gpt-oss-20b", 4, 16, [](Plan& p) {
                   degrees(p, 16, 2);
                   p.ep = 8;
                 }});
  // The host (core/host_issue.h): GPT-2 124M at one short sequence per micro-batch, where the
  // host's launches and dispatch pace the step, eager, with per-layer CUDA graphs, compiled, and
  // as a native program with a for-loop optimizer. Both price the gradient buckets the lowering
  // emits (one per layer, the embedding's and the head's); the host's pacing is played op by op
  // in both (core/host_issue.h's HostPace).
  auto host = [&](std::string name, std::function<void(Plan&)> f, double band = 0.02,
                  std::string why = "") {
    out.push_back({"gpt2-124m host " + name, "gpt2-124m", 0, 8,
                   [f](Plan& p) {
                     p.seq_len = 256;
                     f(p);
                   },
                   band, std::move(why)});
  };
  const std::string pipeline =
      "the pipeline schedule is arithmetic in the closed form and played in the simulator "
      "(issue 46's first item): 2.2% apart at pp 2";
  host("eager", [](Plan&) {});
  host("cuda graphs", [](Plan& p) { p.cuda_graphs = CudaGraphs::kLayers; });
  host("compile", [](Plan& p) { p.torch_compile = true; });
  host("native for-loop adam", [](Plan& p) {
    p.host_framework = HostFramework::kNative;
    p.optimizer_impl = OptimizerImpl::kForLoop;
  });
  host(
      "tp2 pp2", [](Plan& p) { degrees(p, 8, 2, 2); }, 0.03, pipeline);
  // Megatron's per-step statistics: the zero count's .item() before the optimizer step, the
  // parameter norm's after it (core/lower_optimizer.cc).
  host("logged statistics", [](Plan& p) {
    p.log_params_norm = true;
    p.log_num_zeros_in_grad = true;
  });
  host(
      "tp2 pp2 logged statistics",
      [](Plan& p) {
        degrees(p, 8, 2, 2);
        p.log_params_norm = true;
        p.log_num_zeros_in_grad = true;
      },
      0.03, pipeline);
  return out;
}

TEST(OneModel, TheSimulatorAgreesWithTheEstimateOnEveryPlanSwitch) {
  for (const Case& k : cases()) {
    SCOPED_TRACE(k.name);
    Model m = model_preset(k.model);
    if (k.layers > 0) {
      m.layers = k.layers;
      m.moe.first_dense = std::min(m.moe.first_dense, 1);
    }
    Plan p = base_plan(k.gpus);
    k.plan(p);
    p.global_batch = 8 * p.dp;
    const Cluster c = cluster_preset(k.cluster, k.gpus);
    validate(p, m, c);
    const cost::Profile prof = cost::default_profile(c.gpu_device(0));
    const cost::Estimate e = cost::estimate(m, c, p, prof);
    const SimResult r = simulate(m, c, lower(m, c, p), prof, false);
    const double est = e.step_time_s, sim = r.step_time_s;
    EXPECT_NEAR(sim / est, 1.0, k.band) << "simulated " << sim << " s, estimated " << est << " s"
                                        << (k.why.empty() ? "" : ": ") << k.why;
    // The caching allocator's reserve beyond the tensors is one replay both predictors read
    // (cost::allocator_reserve_bytes): the same bytes on every stage, up to the persistent
    // buffers' segment rounding, which each takes from its own tensors.
    ASSERT_EQ(e.stage_memory.size(), r.memory_per_stage.size());
    for (size_t s = 0; s < e.stage_memory.size(); ++s) {
      const cost::FrameworkMemory &a = e.stage_memory[s], &b = r.memory_per_stage[s];
      EXPECT_GE(a.reserved, a.allocated);
      EXPECT_NEAR(a.reserved - a.allocated, b.reserved - b.allocated, 8 * 1024 * 1024)
          << "stage " << s;
    }
  }
}

// Compute slowed beside communication is one rule in both (cost_models/compute_overlap.h): on
// the plans where compute runs beside both kinds at once, what the H100's two slowdowns add to
// the step (the step with them less the step without) agrees between the simulator, which plays
// the kinds running at each instant, and the closed form, which integrates the rule over a
// micro-batch's compute.
TEST(OneModel, ComputeBesideCommunicationIsSlowedByOneRuleInBoth) {
  for (const Case& k : cases()) {
    if (k.name != "llama3-8b zero3 tp4 tp_comm_overlap" && k.name != "llama3-8b cp2 zero1")
      continue;
    SCOPED_TRACE(k.name);
    const Model m = model_preset(k.model);
    Plan p = base_plan(k.gpus);
    k.plan(p);
    p.global_batch = 8 * p.dp;
    // The distributed optimizer's parameter gathers run beside the forward in both (Megatron's
    // overlap_param_gather: the lowering issues them in the forward, bucket by bucket).
    const Cluster c = cluster_preset(k.cluster, k.gpus);
    const LoweredPlan lowered = lower(m, c, p);
    const cost::Profile on = cost::default_profile(c.gpu_device(0));
    cost::Profile off = on, other_only = on, dp_only = on;
    off.overlap_compute_slowdown = off.dp_overlap_compute_slowdown = 0;
    other_only.dp_overlap_compute_slowdown = 0;
    dp_only.overlap_compute_slowdown = 0;
    auto est = [&](const cost::Profile& f) { return cost::estimate(m, c, p, f).step_time_s; };
    auto sim = [&](const cost::Profile& f) {
      return simulate(m, c, lowered, f, false).step_time_s;
    };
    const double e0 = est(off), s0 = sim(off);
    // Both kinds slow this plan's compute.
    ASSERT_GT(est(other_only), e0);
    ASSERT_GT(est(dp_only), e0);
    ASSERT_GT(sim(other_only), s0);
    ASSERT_GT(sim(dp_only), s0);
    const double added_est = est(on) - e0, added_sim = sim(on) - s0;
    EXPECT_NEAR(added_sim / added_est, 1.0, 0.15)
        << "simulated +" << added_sim << " s, estimated +" << added_est << " s";
  }
}

// Memory on the same grid: each stage's tensors as the closed form counts them
// (cost_models/memory.h: weights, gradients, optimizer state, saved activations and the working
// set at the op where the stage peaks) against the liveness peak of that stage's lowered Program
// (core/liveness.h), which the simulator reports: equal to the byte (up to the doubles'
// rounding) on every plan, and the persistent part too wherever no weights are gathered or
// streamed.
TEST(OneModel, ClosedFormMemoryPerStageAgreesWithLiveness) {
  for (const Case& k : cases()) {
    Model m = model_preset(k.model);
    if (k.layers > 0) {
      m.layers = k.layers;
      m.moe.first_dense = std::min(m.moe.first_dense, 1);
    }
    Plan p = base_plan(k.gpus);
    k.plan(p);
    p.global_batch = 8 * p.dp;
    const Cluster c = cluster_preset(k.cluster, k.gpus);
    const std::vector<cost::MemoryBreakdown> closed = cost::memory_per_stage(m, c, p);
    const LoweredPlan lowered = lower(m, c, p);
    for (int s = 0; s < p.pp; ++s) {
      SCOPED_TRACE(k.name + " stage " + std::to_string(s));
      const Liveness lv = liveness(lowered.programs[s]);
      const cost::MemoryBreakdown& b = closed[s];
      const double tensors = b.weights + b.gradients + b.optimizer + b.activations + b.transient;
      EXPECT_NEAR(tensors / lv.peak_bytes, 1.0, k.mem_band)
          << "closed " << tensors << " B, liveness " << lv.peak_bytes << " B " << k.mem_why;
      if (p.zero < 3 && !p.offload.params)
        EXPECT_NEAR(b.weights + b.gradients + b.optimizer, lv.persistent_bytes,
                    1e-9 * lv.persistent_bytes);
    }
  }
}

// DeepSpeed's stage3_max_live_parameters bound (core/zero3_live.h) is the memory of both
// predictors: on a GPT-3 175B stage of 4 layers under ZeRO-3 with per-module gathers, the most
// gathered weights the lowering's Program holds at once are the coordinator's most live elements
// (2-byte weights), fewer than the two whole layers FSDP's units would hold (the closed form's
// count of them: ClosedFormMemoryPerStageAgreesWithLiveness, case gpt3-175b deepspeed zero3
// offload).
TEST(OneModel, DeepSpeedsLiveParameterBoundIsTheGatheredMemoryOfBoth) {
  Model m = model_preset("gpt3-175b");
  m.layers = 4;
  Plan p = base_plan(16);
  p.zero = 3;
  p.zero3_unit = GatherUnit::kModule;
  p.recompute = Recompute::kFull;
  p.micro_batch = 4;
  p.global_batch = 4 * p.dp;
  const Cluster c = cluster_preset("dgx-h100", 16);
  ASSERT_TRUE(ds_lazy_gathers(m, p));
  const double live = ds_stage_schedule(m, p, 0, m.layers, 1).peak;
  double layer = 0;
  for (double x : dense_layer_weights(m, 1, 0)) layer += x;
  EXPECT_LT(live, 2 * layer);
  // The most gathered weight bytes the lowering's Program holds while an op runs.
  const Program prog = lower(m, c, p).programs[0];
  std::vector<double> at(prog.ops.size() + 1, 0);
  for (const Allocation& a : allocations(prog)) {
    const Buffer& b = prog.buffers[static_cast<size_t>(a.buffer)];
    if (a.persistent || a.host || a.first < 0 || b.cls != BufferClass::kParam) continue;
    at[static_cast<size_t>(a.first)] += a.bytes;
    at[static_cast<size_t>(a.last) + 1] -= a.bytes;
  }
  double held = 0, most = 0;
  for (double d : at) most = std::max(most, held += d);
  EXPECT_NEAR(most / (2 * live), 1.0, 1e-9);
}

// DeepSpeed's ZeRO-3 at a fixed global batch over more ranks in the simulator (the estimate's
// side: cost_models/estimate_test.cc Zero3AtScale): GPT-3 175B, global batch 2,048 on 256 to
// 2,048 A100s. Each rank's compute falls as 1/N while it still gathers every module's weights
// for the forward, the recompute and the backward and reduce-scatters its gradients, the gathers
// one module ahead of their use (core/zero3_live.h). The simulated step is never shorter than
// those collectives counted independently (DeepSpeed's calls of a 175B layer by hand, priced one
// by one on the data-parallel group), and each doubling of the ranks buys less than the one
// before.
TEST(OneModel, DeepSpeedZero3AtAFixedGlobalBatchBendsInTheSimulator) {
  const Model m = gpt_model("gpt3-175b", 96, 12288, 96, 51200, 2048, true);
  const double h = 12288;
  // Gathers (norm + qkv, out, norm + fc1, fc2) and 5e8-element gradient buckets (fc2, fc1,
  // norm + out, qkv + norm), as estimate_test.cc counts them.
  const std::vector<double> ag = {2 * h + 3 * h * h + 3 * h, h * h + h, 2 * h + 4 * h * h + 4 * h,
                                  4 * h * h + h};
  const std::vector<double> rs = {4 * h * h + h, 4 * h * h + 4 * h, 2 * h + h * h + h,
                                  3 * h * h + 3 * h + 2 * h};
  double prev_step = 0, prev_speedup = 2.0;
  for (int n : {256, 512, 1024, 2048}) {
    const Cluster c = cluster_preset("dgx-a100-80g", n);
    Plan p;
    p.dp = n;
    p.micro_batch = 2048 / n;
    p.global_batch = 2048;
    p.zero = 3;
    p.zero3_unit = GatherUnit::kModule;
    p.recompute = Recompute::kFull;
    p.grad_reduce_dtype = Dtype::kBf16;
    ASSERT_TRUE(ds_lazy_gathers(m, p));
    const cost::Profile prof = cost::default_profile(c.gpu_device(0));
    const double step = simulate(m, c, lower(m, c, p), prof, false).step_time_s;
    std::vector<int> group(n);
    for (int i = 0; i < n; ++i) group[i] = i;
    const cost::GroupModel g(c, prof, group);
    double comm = 0;
    // The forward and the recompute gather every module; the backward all but fc2, which the
    // default stage3_max_reuse_distance (1e9) keeps from its recompute (nothing lies between).
    for (size_t k = 0; k < ag.size(); ++k)
      comm += (k + 1 < ag.size() ? 3 : 2) * g.cost(cost::Collective::kAllGather, 2 * ag[k]).time_s;
    for (double x : rs) comm += g.cost(cost::Collective::kReduceScatter, 2 * x).time_s;
    comm *= m.layers;
    EXPECT_GE(step, comm * 0.98) << n << " ranks";
    if (prev_step > 0) {
      const double speedup = prev_step / step;
      EXPECT_LT(speedup, prev_speedup) << n << " ranks: scaling does not bend";
      prev_speedup = speedup;
    }
    prev_step = step;
  }
}

}  // namespace
}  // namespace parasol::sim
