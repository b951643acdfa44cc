// torchtitan: see interop/torchtitan.h.
//
// Keys checked against pytorch/torchtitan tag v0.2.2 = 73a0e6979dd10b6b1904098eb3c8f62c18ab87ce
// (2026-02-20; the last release with TOML job files: 9810191 replaced them with Python config
// functions):
//  - torchtitan/config/job_config.py: [model] name/flavor/hf_assets_path; [training]
//    local_batch_size, global_batch_size, seq_len, dtype, mixed_precision_param,
//    mixed_precision_reduce (only "float32"), enable_cpu_offload (params, grads and optimizer);
//    [parallelism] data_parallel_replicate_degree, data_parallel_shard_degree,
//    fsdp_reshard_after_forward (default|always|never), tensor_parallel_degree,
//    enable_async_tensor_parallel, pipeline_parallel_degree, pipeline_parallel_schedule,
//    pipeline_parallel_layers_per_stage, pipeline_parallel_first/last_stage_less_layers
//    (default 1), pipeline_parallel_microbatch_size, context_parallel_degree,
//    context_parallel_rotate_method, expert_parallel_degree, expert_tensor_parallel_degree,
//    expert_parallel_comm_backend; [activation_checkpoint] mode (default "selective");
//    [compile] enable, components.
//  - torchtitan/distributed/parallel_dims.py: dp_replicate x dp_shard x cp x tp x pp = world;
//    etp = tp or 1; FSDP whenever dp_shard > 1 or cp > 1 (fsdp mesh = dp_shard x cp); experts
//    on ["pp", "dp_replicate", "efsdp", "ep", "etp"], efsdp = dp_shard x cp x tp / (etp x ep);
//    seq_len divisible by tp x 2 cp.
//  - torchtitan/models/llama3/infra/parallelize.py: reshard_after_forward "default" = not
//    pp_enabled (and the last block never resharded), DDP only as the sole parallelism, tensor
//    parallelism with SequenceParallel norms.
//  - torchtitan/distributed/pipeline_parallel.py: stage split, layers_per_stage rule,
//    microbatches = local_batch_size / pipeline_parallel_microbatch_size.
//  - torchtitan/models/llama3/__init__.py (flavors 8B, 70B, 405B), train_configs/llama3_70b.toml,
//    run_train.sh and multinode_trainer.slurm (the launch lines).
#include "interop/torchtitan.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <sstream>
#include <string>

#include "core/error.h"

namespace parasol::interop {

const char* const kTorchtitanVersion = "torchtitan v0.2.2 (pytorch/torchtitan 73a0e69)";

namespace {

std::string toml_str(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out + "\"";
}

const char* toml_bool(bool b) { return b ? "true" : "false"; }

// Llama 3 FFN width of torchtitan's TransformerModelArgs (FeedForward in
// torchtitan/models/llama3/model/model.py): 4 dim, x 2/3, x multiplier, rounded up to multiple_of.
int64_t llama3_ffn(int64_t dim, double multiplier, int64_t multiple_of) {
  int64_t h = 4 * dim;
  h = 2 * h / 3;
  h = static_cast<int64_t>(multiplier * static_cast<double>(h));
  return multiple_of * ((h + multiple_of - 1) / multiple_of);
}

struct Flavor {
  const char* flavor;
  const char* hf_assets;
  int layers;
  int64_t dim;
  int heads;
  int kv_heads;
  double ffn_multiplier;
  int64_t multiple_of;
};

// torchtitan/models/llama3/__init__.py llama3_args at v0.2.2 (rope_theta 500000; the vocabulary
// comes from the tokenizer in hf_assets_path: Llama 3's 128256).
constexpr Flavor kLlama3[] = {
    {"8B", "./assets/hf/Llama-3.1-8B", 32, 4096, 32, 8, 1.3, 1024},
    {"70B", "./assets/hf/Llama-3.1-70B", 80, 8192, 64, 8, 1.3, 4096},
    {"405B", "./assets/hf/Llama-3.1-405B", 126, 16384, 128, 8, 1.2, 4096},
};

const Flavor* llama3_flavor(const Model& m) {
  const bool llama_shape = m.norm == Norm::kRmsNorm && m.activation == Activation::kSwiglu &&
                           !m.tied_embeddings && !m.learned_positions && !m.linear_bias &&
                           !m.is_moe() && !m.mla.enabled() && m.sliding_window == 0 &&
                           m.rope_theta == 500000 && m.vocab == 128256;
  if (!llama_shape) return nullptr;
  for (const Flavor& f : kLlama3)
    if (m.layers == f.layers && m.hidden == f.dim && m.heads == f.heads &&
        m.kv_heads == f.kv_heads && m.head_dim == f.dim / f.heads &&
        m.ffn == llama3_ffn(f.dim, f.ffn_multiplier, f.multiple_of))
      return &f;
  return nullptr;
}

// The FSDP degrees: data_parallel_replicate_degree and data_parallel_shard_degree.
struct DpDegrees {
  int replicate = 1;
  int shard = 1;
};

DpDegrees dp_degrees(const Plan& p) {
  if (p.zero == 1 || p.zero == 2)
    throw Error("plan.zero",
                "torchtitan shards with FSDP2 (ZeRO-3: zero 3) or replicates "
                "(zero 0); it has no ZeRO-1/2 (for FSDP's SHARD_GRAD_OP use zero 3 "
                "with reshard after_backward)");
  if (p.zero == 0) {
    if (p.cp > 1)
      throw Error("plan.zero",
                  "torchtitan applies FSDP over the context-parallel group whenever "
                  "cp > 1 (parallel_dims.py fsdp_enabled); use zero 3");
    if (p.dp > 1 && p.gpus() != p.dp)
      throw Error("plan.zero",
                  "torchtitan's DDP (zero 0) runs only as the sole parallelism "
                  "(\"DDP has not supported > 1D parallelism\"); use zero 3");
    return {p.dp, 1};
  }
  const int group = p.dense_shard_ranks();  // FSDP mesh: dp_shard x cp
  if (group % p.cp != 0)
    throw Error("plan.shard_degree", "torchtitan's FSDP group is dp_shard x cp; " +
                                         std::to_string(group) + " is not a multiple of cp " +
                                         std::to_string(p.cp));
  const int shard = group / p.cp;
  return {p.dp / shard, shard};
}

const char* reshard_policy(const Plan& p, const DpDegrees& d) {
  if (p.zero != 3 || (d.shard == 1 && p.cp == 1)) return "default";  // no FSDP
  if (p.pp == 1) {
    if (p.reshard == Reshard::kAfterForward) return "always";
    if (p.reshard == Reshard::kAfterBackward) return "never";
    throw Error("plan.reshard",
                "torchtitan without pipeline parallelism reduce-scatters "
                "gradients every micro-batch (train.py gradient accumulation "
                "keeps FSDP's gradient sync on); after_step needs pp > 1");
  }
  if (p.reshard == Reshard::kAfterStep) return "default";  // never resharded under pp
  throw Error("plan.reshard",
              "with pipeline parallelism torch.distributed.pipelining keeps FSDP "
              "parameters unsharded and reduce-scatters gradients once per step "
              "(after_step); use reshard after_step");
}

// Pipeline keys: the schedule, layers per virtual stage and the first/last stage reductions that
// reproduce the plan's split exactly.
struct PipelineKeys {
  const char* schedule = "1F1B";
  int layers_per_stage = 0;  // 0: leave torchtitan's default stage count
  int first_less = 0;
  int last_less = 0;
};

PipelineKeys pipeline_keys(const Model& model, const Plan& p) {
  PipelineKeys k;
  const int chunks = p.chunks();
  k.schedule = p.schedule == Schedule::kGpipe ? "GPipe" : chunks > 1 ? "Interleaved1F1B" : "1F1B";
  if (p.schedule == Schedule::kInterleaved && chunks < 2)
    throw Error("plan.vpp", "torchtitan's Interleaved1F1B needs at least 2 stages per rank");
  const int stages = p.pp * chunks;
  std::vector<int> want(stages);
  for (int c = 0; c < chunks; ++c)
    for (int s = 0; s < p.pp; ++s) want[c * p.pp + s] = p.layers_in_chunk(model.layers, s, c);
  bool found = false;
  for (int first = 0; first <= model.layers && !found; ++first)
    for (int last = 0; last <= model.layers && !found; ++last)
      if (torchtitan_stage_split(model.layers, stages, first, last) == want) {
        k.first_less = first;
        k.last_less = last;
        found = true;
      }
  if (!found)
    throw Error(p.stage_layers.empty() ? "plan.first_stage_layers" : "plan.stage_layers",
                "torchtitan splits layers evenly except for fewer layers on the first and last "
                "stage; it cannot place this plan's split");
  const int eff = model.layers + k.first_less + k.last_less;
  for (int lps = 1; lps <= eff; ++lps)
    if ((eff + lps - 1) / lps == stages) {
      k.layers_per_stage = lps;
      break;
    }
  if (k.layers_per_stage == 0 && chunks != (chunks > 1 ? 2 : 1))
    throw Error("plan.vpp", "no pipeline_parallel_layers_per_stage gives " +
                                std::to_string(stages) + " stages");
  return k;
}

void check_expressible(const Model& model, const Plan& p) {
  constexpr std::array<Dim, 5> kTitanOrder = {Dim::kTp, Dim::kCp, Dim::kEp, Dim::kDp, Dim::kPp};
  if (p.rank_order != kTitanOrder)
    throw Error("plan.rank_order",
                "torchtitan's device mesh is pp, dp_replicate, dp_shard, cp, "
                "tp (tp fastest): rank order tp-cp-ep-dp-pp");
  if (p.precision != Dtype::kBf16 && p.precision != Dtype::kFp32)
    throw Error("plan.precision", std::string("torchtitan's mixed_precision_param is bfloat16 or "
                                              "float32, not ") +
                                      dtype_name(p.precision));
  if (p.grad_reduce_dtype != Dtype::kFp32)
    throw Error("plan.grad_reduce_dtype", "torchtitan's mixed_precision_reduce is float32 only");
  if (p.optimizer_dtype == Dtype::kBf16 && p.precision != Dtype::kBf16)
    throw Error("plan.optimizer_dtype", "torchtitan's training.dtype bfloat16 trains in bf16");
  if (p.offload.activations)
    throw Error("plan.offload", "torchtitan v0.2.2 has no activation offload");
  if (p.offload.optimizer != p.offload.params)
    throw Error("plan.offload",
                "torchtitan's training.enable_cpu_offload (FSDP2 CPUOffloadPolicy) "
                "moves parameters, gradients and optimizer state together; offload "
                "optimizer,params or nothing");
  if (p.offload.params && p.zero != 3)
    throw Error("plan.offload", "torchtitan offloads through FSDP: needs zero 3");
  if (p.recompute == Recompute::kSelective)
    throw Error("plan.recompute",
                "torchtitan's selective AC is per-op (save matmuls, recompute "
                "the rest) or every n-th layer, not Megatron's module sets");
  if (p.recompute == Recompute::kFull && p.recompute_layers >= 0 &&
      p.recompute_layers < p.max_layers_in_stage(model.layers))
    throw Error("plan.recompute_layers",
                "torchtitan's full AC wraps every layer (its n-th "
                "layer option is not the first k per stage)");
  if (p.tp > 1 && !p.sequence_parallel)
    throw Error("plan.sequence_parallel",
                "torchtitan's tensor parallelism always shards norms "
                "and dropout over the sequence (SequenceParallel)");
  if (p.tp_comm_overlap && !p.fused_kernels)
    throw Error("plan.tp_comm_overlap",
                "torchtitan's async tensor parallelism needs "
                "torch.compile (plan.fused_kernels)");
  if (!p.flash_attention)
    throw Error("plan.flash_attention", "torchtitan's attention is SDPA's fused kernel");
  if (p.ep_comm_overlap)
    throw Error("plan.ep_comm_overlap",
                "torchtitan overlaps expert communication only under "
                "its DualPipeV schedule, which parasol does not model");
  const int64_t seq = p.seq(model);
  if (seq % (2 * p.tp * p.cp) != 0)
    throw Error("plan.seq", "torchtitan needs seq_len divisible by tp x 2 cp = " +
                                std::to_string(2 * p.tp * p.cp));
  if (p.ep > 1 && p.expert_tp() != 1 && p.expert_tp() != p.tp)
    throw Error("plan.etp",
                "torchtitan supports expert tensor parallelism 1 or tp "
                "(parallel_dims.py: \"Currently we only support ETP=TP or ETP=1\")");
}

}  // namespace

std::vector<int> torchtitan_stage_split(int layers, int stages, int first_less, int last_less) {
  if (stages < 1 || layers < 1 || first_less < 0 || last_less < 0) return {};
  if (stages == 1) return {layers};
  const int eff = layers + first_less + last_less;
  if (stages > eff) return {};
  const int per = eff / stages, extra = eff % stages;
  if (per == 0 || first_less > per || last_less > per) return {};
  std::vector<int> out;
  int current = 0;
  for (int i = 0; i < stages; ++i) {
    int n = per + (i < extra ? 1 : 0);
    if (i == 0)
      n -= first_less;
    else if (i == stages - 1)
      n -= last_less;
    n = std::max(0, std::min(n, layers - current));
    current += n;
    out.push_back(n);
  }
  if (current != layers) return {};  // torchtitan would drop layers: not a split parasol can use
  return out;
}

Export export_torchtitan(const Model& model, const Cluster& cluster, const Plan& plan) {
  validate(plan, model, cluster);
  check_expressible(model, plan);
  const DpDegrees d = dp_degrees(plan);
  const char* reshard = reshard_policy(plan, d);
  if (plan.offload.params && d.shard == 1 && plan.cp == 1)
    throw Error("plan.offload",
                "torchtitan offloads through FSDP (fully_shard's "
                "CPUOffloadPolicy), which it applies only when dp_shard or cp > 1");
  if (plan.ep > 1) {
    const int span = d.shard * plan.cp * plan.tp / plan.expert_tp();
    if (span % plan.ep != 0)
      throw Error("plan.ep",
                  "torchtitan carves expert parallelism out of dp_shard x cp x tp / "
                  "etp = " +
                      std::to_string(span) +
                      " ranks (not across "
                      "data_parallel_replicate_degree)");
  }
  const int gpus = plan.gpus();
  const ServerLayout servers = server_layout(cluster, gpus);
  const int per_node = servers.per_node, nodes = servers.nodes;
  const Flavor* flavor = llama3_flavor(model);

  std::ostringstream t;
  t << "# " << kTorchtitanVersion << " job config (torchtitan/config/job_config.py at v0.2.2,\n"
    << "# the last release with TOML job files), written by parasol export --to torchtitan.\n"
    << "# " << model.name << " on " << cluster.name << ", " << gpus << " GPUs (" << nodes << " x "
    << per_node << "); plan: tp " << plan.tp << ", pp " << plan.pp << ", dp " << plan.dp << ", cp "
    << plan.cp << ", ep " << plan.ep << ", zero " << plan.zero << ".\n"
    << "# Launch: launch_torchtitan.sh (run_train.sh with NGPU and CONFIG_FILE, or torchrun).\n\n";
  t << "[job]\n"
    << "dump_folder = \"./outputs\"\n"
    << "description = " << toml_str("parasol plan: " + model.name + " on " + cluster.name)
    << "\n\n";
  t << "[model]\n";
  if (flavor) {
    t << "name = \"llama3\"\n"
      << "flavor = " << toml_str(flavor->flavor) << "\n"
      << "hf_assets_path = " << toml_str(flavor->hf_assets) << "\n\n";
  } else {
    t << "# parasol model " << model.name
      << " matches no torchtitan v0.2.2 flavor: add it (e.g. a\n"
      << "# TransformerModelArgs entry in torchtitan/models/llama3/__init__.py llama3_args:\n"
      << "# dim=" << model.hidden << ", n_layers=" << model.layers << ", n_heads=" << model.heads
      << ", n_kv_heads=" << model.kv_heads << ", FFN " << model.ffn << ", vocabulary "
      << model.vocab << ") or pick its model's name and flavor.\n"
      << "name = " << toml_str(model.is_moe() ? model.name : "llama3") << "\n"
      << "flavor = " << toml_str(model.name) << "\n\n";
  }
  const int64_t local_batch = plan.pp > 1 ? plan.global_batch / plan.dp : plan.micro_batch;
  const bool bf16 = plan.precision == Dtype::kBf16;
  t << "[training]\n"
    << "# local_batch_size per data-parallel rank; global_batch_size / (local x dp) = "
    << plan.global_batch / (local_batch * plan.dp) << " gradient accumulation step(s)\n"
    << "local_batch_size = " << local_batch << "\n"
    << "global_batch_size = " << plan.global_batch << "\n"
    << "seq_len = " << plan.seq(model) << "\n"
    << "dtype = " << (plan.optimizer_dtype == Dtype::kBf16 ? "\"bfloat16\"" : "\"float32\"") << "\n"
    << "mixed_precision_param = " << (bf16 ? "\"bfloat16\"" : "\"float32\"") << "\n"
    << "mixed_precision_reduce = \"float32\"\n"
    << "enable_cpu_offload = " << toml_bool(plan.offload.params) << "\n\n";
  t << "[parallelism]\n"
    << "data_parallel_replicate_degree = " << d.replicate << "\n"
    << "data_parallel_shard_degree = " << d.shard << "\n"
    << "fsdp_reshard_after_forward = \"" << reshard << "\"\n"
    << "tensor_parallel_degree = " << plan.tp << "\n";
  if (plan.tp > 1)
    t << "enable_async_tensor_parallel = " << toml_bool(plan.tp_comm_overlap) << "\n";
  t << "pipeline_parallel_degree = " << plan.pp << "\n";
  if (plan.pp > 1) {
    const PipelineKeys k = pipeline_keys(model, plan);
    t << "pipeline_parallel_schedule = " << toml_str(k.schedule) << "\n";
    if (k.layers_per_stage > 0)
      t << "pipeline_parallel_layers_per_stage = " << k.layers_per_stage << "\n";
    t << "pipeline_parallel_first_stage_less_layers = " << k.first_less << "\n"
      << "pipeline_parallel_last_stage_less_layers = " << k.last_less << "\n"
      << "pipeline_parallel_microbatch_size = " << plan.micro_batch << "\n";
  }
  t << "context_parallel_degree = " << plan.cp << "\n";
  if (plan.cp > 1)
    t << "# ring attention: K/V shards passed on each step (parasol's model of cp)\n"
      << "context_parallel_rotate_method = \"alltoall\"\n";
  t << "expert_parallel_degree = " << plan.ep << "\n"
    << "expert_tensor_parallel_degree = " << (plan.ep > 1 ? plan.expert_tp() : 1) << "\n";
  if (plan.ep > 1)
    t << "expert_parallel_comm_backend = "
      << (plan.moe_dispatcher == MoeDispatcher::kDeepEp ? "\"deepep\"" : "\"standard\"") << "\n";
  t << "\n[activation_checkpoint]\n"
    << "mode = " << (plan.recompute == Recompute::kFull ? "\"full\"" : "\"none\"") << "\n\n";
  t << "[compile]\n"
    << "# fused element-wise kernels (parasol's fused_kernels) come from torch.compile\n"
    << "enable = " << toml_bool(plan.fused_kernels) << "\n"
    << "components = [\"model\", \"loss\"]\n";

  std::ostringstream sh;
  sh << "#!/usr/bin/env bash\n"
     << "# Written by parasol export --to torchtitan (" << kTorchtitanVersion << ").\n"
     << "# Run from a torchtitan v0.2.2 checkout; CONFIG_FILE is this folder's torchtitan.toml.\n"
     << "set -euo pipefail\n"
     << "CONFIG_FILE=${CONFIG_FILE:-$(dirname \"$0\")/torchtitan.toml}\n";
  if (nodes == 1) {
    sh << "NGPU=" << per_node << " CONFIG_FILE=\"$CONFIG_FILE\" ./run_train.sh \"$@\"\n";
  } else {
    sh << "# Run on each of the " << nodes
       << " servers (as multinode_trainer.slurm does); "
          "MASTER_ADDR = the first server.\n"
       << "torchrun --nnodes " << nodes << " --nproc_per_node " << per_node
       << " --rdzv_id 101 --rdzv_backend c10d \\\n"
       << "  --rdzv_endpoint \"${MASTER_ADDR:?set MASTER_ADDR}:29500\" \\\n"
       << "  -m torchtitan.train --job.config_file \"$CONFIG_FILE\" \"$@\"\n";
  }

  Export e;
  e.framework = "torchtitan";
  e.version = kTorchtitanVersion;
  e.files.push_back({"torchtitan.toml", t.str(), false});
  e.files.push_back({"launch_torchtitan.sh", sh.str(), true});
  return e;
}

}  // namespace parasol::interop
