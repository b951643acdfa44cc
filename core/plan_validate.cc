// validate(plan, model, cluster): every rule that makes a plan impossible to run, each naming
// the offending field and the reason.
#include <string>

#include "core/error.h"
#include "core/plan.h"

namespace parasol {

namespace {
std::string s(int64_t v) { return std::to_string(v); }

void require_divides(int64_t d, int64_t n, const std::string& field, const std::string& what) {
  if (n % d != 0) throw Error(field, s(d) + " does not divide " + what + " (" + s(n) + ")");
}
}  // namespace

void validate(const Plan& p, const Model& m, const Cluster& c) {
  // Ranges first: plans built in code (search) skip plan_from_json's checks, and a degree of 0
  // would divide by zero below.
  for (const auto& [v, name] : {std::pair{p.tp, "tp"},
                                {p.pp, "pp"},
                                {p.dp, "dp"},
                                {p.cp, "cp"},
                                {p.ep, "ep"},
                                {p.vpp, "vpp"},
                                {p.micro_batch, "mbs"},
                                {p.global_batch, "gbs"}})
    if (v < 1) throw Error(std::string("plan.") + name, s(v) + " must be >= 1");
  if (p.zero < 0 || p.zero > 3) throw Error("plan.zero", s(p.zero) + " must be 0 to 3");
  if (p.recompute_layers < -1)
    throw Error("plan.recompute_layers", s(p.recompute_layers) + " must be >= -1 (-1 = all)");
  if (p.seq_len < 0) throw Error("plan.seq", s(p.seq_len) + " must be >= 0 (0 = the model's)");
  // Tensor parallelism splits heads, KV heads and MLP columns.
  require_divides(p.tp, m.heads, "plan.tp", "attention heads");
  require_divides(p.tp, m.kv_heads, "plan.tp", "KV heads");
  require_divides(p.tp, m.ffn, "plan.tp", "the MLP size ffn");
  if (m.is_moe()) require_divides(p.tp, m.moe.expert_ffn, "plan.tp", "the expert MLP size");
  const int gpus = c.num_gpus();
  // In double: four int degrees can overflow int64; a product equal to gpus is exact.
  const double product = static_cast<double>(p.tp) * p.pp * p.dp * p.cp;
  if (product != gpus)
    throw Error("plan", "tp x pp x dp x cp = " + s(p.tp) + " x " + s(p.pp) + " x " + s(p.dp) +
                            " x " + s(p.cp) + " = " +
                            (product < 9e18 ? s(static_cast<int64_t>(product)) : "more than 9e18") +
                            " differs from the " + s(gpus) + " GPUs of the cluster");
  const int64_t seq = p.seq(m);
  if (m.learned_positions && seq > m.seq_len)
    throw Error("plan.seq",
                s(seq) + " exceeds the " + s(m.seq_len) + " learned positions of the model");
  if (p.sequence_parallel) {
    if (p.tp == 1) throw Error("plan.sp", "sequence parallelism needs tp > 1");
    require_divides(p.tp, seq / p.cp, "plan.tp", "the sequence per context rank with sp");
  }
  // Pipelines.
  if (p.vpp > 1 && p.schedule != Schedule::kInterleaved)
    throw Error("plan.vpp", s(p.vpp) + " virtual stages need schedule interleaved, not " +
                                schedule_name(p.schedule));
  if (p.schedule == Schedule::kInterleaved) {
    if (p.pp < 2) throw Error("plan.schedule", "interleaved needs pp > 1");
    if (p.vpp < 2) throw Error("plan.vpp", "interleaved needs vpp >= 2");
  }
  require_divides(int64_t{p.pp} * p.vpp, m.layers, "plan.pp", "layers (pp x vpp must divide them)");
  // Batches.
  if (p.global_batch % (int64_t{p.dp} * p.micro_batch) != 0)
    throw Error("plan.gbs", s(p.global_batch) + " is not a multiple of dp x mbs = " + s(p.dp) +
                                " x " + s(p.micro_batch));
  if (p.schedule == Schedule::kInterleaved && p.micro_batches() % p.pp != 0)
    throw Error("plan.gbs", "interleaved needs the micro-batch count (" + s(p.micro_batches()) +
                                ") to be a multiple of pp (" + s(p.pp) + ")");
  // Experts.
  if (p.ep > 1 && !m.is_moe())
    throw Error("plan.ep", s(p.ep) + " > 1 but the model has no experts");
  if (m.is_moe()) require_divides(p.ep, m.moe.experts, "plan.ep", "experts");
  require_divides(p.ep, p.dp, "plan.ep",
                  "dp (expert parallelism is carved out of data parallelism)");
  // Context parallelism: causal load balancing cuts each sequence into 2 x cp chunks.
  if (p.cp > 1) require_divides(2 * p.cp, seq, "plan.cp", "the sequence length (2 x cp chunks)");
  // Sharding.
  if (p.zero == 3 && p.pp > 1)
    throw Error("plan.zero",
                "ZeRO-3 with pp > 1 is not supported (parameters would be "
                "re-gathered for every micro-batch)");
  // Recompute.
  if (p.recompute_layers >= 0 && p.recompute != Recompute::kFull)
    throw Error("plan.recompute_layers", "only applies to recompute full");
  if (p.recompute_layers > m.layers / p.pp)
    throw Error("plan.recompute_layers", s(p.recompute_layers) + " exceeds the " +
                                             s(m.layers / p.pp) + " layers of a stage");
  // Offload and precision.
  if (p.offload.any() && c.host_memory_per_gpu(0) <= 0)
    throw Error("plan.offload", offload_name(p.offload) +
                                    " needs host memory, and the cluster's "
                                    "servers have none");
  if (p.offload.any() && c.host_link_bw(0) <= 0)
    throw Error("plan.offload", "no link joins the GPUs to host memory");
  const DeviceSpec& dev = c.gpu_device(0);
  if (p.precision == Dtype::kFp8 && dev.peak_fp8_flops <= 0)
    throw Error("plan.precision", std::string("fp8 is not supported by ") + dev.name);
  if (p.precision == Dtype::kTf32)
    throw Error("plan.precision", "tf32 is a math mode, not a training precision; use fp32");
}

}  // namespace parasol
