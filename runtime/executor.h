// Executor: runs one rank's Program (core/program.h) for real, with a Backend's kernels and a
// CommSet's communicators. It allocates each buffer (or block of buffers) when the first op that
// touches it starts and frees it when every op that touches it has finished, as liveness()
// predicts; issues the ops as the Program's execution rules let them go (core/issue_graph.h:
// dependencies, stream order, the host's cursor, the transfers of one p2p group together as one
// communicator group), its host thread reaching no op past a compute op it has not run yet (as a
// framework's host thread launches it); runs compute and copies on the calling thread and
// communication as non-blocking transfers that it polls after every op, so that they progress
// beside compute (runtime/comm/idle_wait.h: how it waits when nothing else can run); and records
// each op's start and end in the trace schema of the simulator (same op ids).
//
// How each op is executed follows the conventions of core/lower.h (which buffers an op reads
// and writes, in which order); runtime/executor_ops.cc maps the compute ops to Backend kernels.
// The persistent buffers (parameters, gradients, optimizer state) are allocated by the
// constructor and live as long as the Executor; the trainer fills and reads them
// (runtime/param_init.h, runtime/checkpoint.h) through host copies (runtime/host_staging.h):
// data() is device memory, which host code must not dereference.
//
// Mixed precision (plan.precision bf16 or fp16), as Megatron and torch AMP run it: the Program's
// parameters, activations and their gradients are 16-bit buffers, the parameters' gradients fp32
// (Megatron's main_grad), the fp32 master weights and Adam moments in the optimizer state, and
// the step's cast op rounds the updated masters into the 16-bit weights. The kernels compute in
// fp32: each op's 16-bit operands are widened into fp32 for the op and what it wrote is rounded
// back to nearest even (Backend::alloc_widened, counted apart from device_memory(), so that the
// measured peak is the Program's buffers at their stored dtype, as liveness predicts). Transfers
// move each buffer's dtype; data-parallel gradient reductions the plan's grad_reduce_dtype (fp32,
// or bf16 rounded from the fp32 gradients and widened back).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/model.h"
#include "core/plan.h"
#include "core/program.h"
#include "runtime/backend.h"
#include "runtime/comm/communicator.h"
#include "runtime/step_graph.h"
#include "traces/trace.h"

namespace parasol::runtime {

struct StepConfig {
  int64_t step = 1;        // optimizer step, from 1 (AdamW's bias correction; dropout seeds)
  AdamWConfig adamw;       // its `step` is set from `step`
  float clip_norm = 1.0f;  // global gradient-norm clipping threshold (0: no clipping)
  float dropout_p = 0.1f;  // dropout probability where the model has dropout
  uint64_t seed = 1234;    // base of the dropout seeds
  // Fills micro-batch `mb`'s token ids and labels on this rank: [micro_batch x seq / cp] int32
  // each (this rank's data-parallel shard and context-parallel chunk).
  std::function<void(int mb, int32_t* tokens, int32_t* labels)> batch;
  int64_t tokens_per_step = 1;  // tokens in the global batch: the loss is their mean
  bool trace = false;           // record the ops into StepResult::events
  // Loss scaling (runtime/loss_scaler.h): the loss gradient is multiplied by loss_scale, the
  // gradients are unscaled before clipping and AdamW, and the reported norm is the unscaled one.
  float loss_scale = 1.0f;
  // When the global gradient norm is not finite, skip the update: no AdamW op and no cast runs
  // (parameters and moments stay as they were). The decision reads the reduced norm on the host.
  bool skip_on_overflow = false;
  int64_t optimizer_step = 0;  // AdamW's step (bias correction) when > 0; else `step`
  // Fault injection: +inf into one logit gradient of this rank's loss (last pipeline stage), from
  // which the backward pass and the gradient reductions spread it, as an fp16 overflow would.
  bool inject_overflow = false;
  // Mixed precision: run the ops the Backend has typed bf16 entries for (backend.h) on them,
  // without widening their operands; false: widen every op (the reference path).
  bool typed_bf16 = true;
  // The step's host traffic outside its ops: every micro-batch's tokens and labels uploaded in
  // one copy before the first op (Backend::alloc_staging: fixed addresses; each token buffer is
  // filled from it by a device copy when allocated), the per-token losses summed on the device
  // (Backend::loss_accumulate) and read once after the last op. No op of the step then reads or
  // writes host memory, so that it can be captured into a graph. false: the former path, each
  // micro-batch's tokens uploaded when its buffer is allocated and its losses read when computed
  // (the reference the staged path is tested against: the same losses bit for bit).
  bool stage_host_traffic = true;
};

struct StepResult {
  // Sum of the per-token losses this rank computed (last pipeline stage; every tensor-parallel
  // rank computes the same rows) and their count.
  double loss_sum = 0;
  int64_t loss_tokens = 0;
  double grad_norm = 0;   // global gradient norm before clipping (0 when the Program has none)
  bool overflow = false;  // that norm is not finite (with skip_on_overflow: no update applied)
  double seconds = 0;     // wall time of the step
  std::vector<traces::TraceEvent> events;  // when StepConfig::trace; times from the step start
  // When StepConfig::trace: the "device memory" counter (key "bytes") of this rank, sampled where
  // the executor allocates and frees (host clock, from the step start); its maximum is the step's
  // peak device bytes (Backend::device_memory().peak_total, as the trainer reports it).
  std::vector<traces::TraceCounter> counters;
  // Mixed precision: compute ops run on the Backend's typed bf16 entries; bytes of fp32 views
  // the widening path allocated (Backend::alloc_widened) for all ops, and for the ops of the
  // kinds that have a typed entry (Executor::Impl::typed_kind), taken or not, and of those for
  // the attention ops alone.
  int64_t typed_bf16_ops = 0;
  int64_t widened_bytes = 0;
  int64_t widened_typed_kind_bytes = 0;
  int64_t widened_attention_bytes = 0;
  // MoE: host reads of a routing's per-expert counts (each a device-to-host synchronisation on a
  // GPU): 0 where the routing stays on the device (Backend::device_moe_routing) and no host
  // needs the counts; one per layer and micro-batch where the expert-parallel exchange, the
  // gather over the experts' tensor-parallel group or an fp32 grouped GEMM sizes by them.
  int64_t moe_count_syncs = 0;
  // Whole-step CUDA graphs (Plan::cuda_graphs full_iteration; runtime/step_graph.h): what this
  // step did (eager, warmup, capture, replay) and, when eager, why (the first blocker).
  GraphAction graph_action = GraphAction::kEager;
  std::string graph_reason;
  // Copies between host and device memory while the step's ops ran (from its first op to its
  // last, the optimizer's included; the staging upload before and the reads of the loss and the
  // norm after are not counted), as the backend counted them (Backend::host_traffic): `reads`
  // device to host (each a host synchronisation on a GPU), `writes` host to device. -1 where the
  // backend cannot tell host from device memory (the plain cpu backend).
  int64_t step_host_reads = -1;
  int64_t step_host_writes = -1;
  // A replayed step's buffers were allocated when the graph was captured and are not allocated
  // again: the device bytes that step peaked at (0 on other steps), which the graph's replays use.
  int64_t graph_peak_bytes = 0;
};

class Executor {
 public:
  // REQUIRES: `program` is the Program of comms' rank under `plan` (lower()); the objects
  // outlive the Executor. Throws parasol::Error for what this runtime cannot execute (named
  // field and reason), e.g. a precision the backend does not compute in.
  Executor(const Model& model, const Plan& plan, const Program& program, Backend& backend,
           CommSet& comms);
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  // The device memory of buffer `id`: persistent buffers at any time, others while a step runs
  // (nullptr when not allocated). Only kernels, Backend::copy and communicators touch it.
  void* data(int id) const;
  float* fdata(int id) const { return static_cast<float*>(data(id)); }
  // This rank's position in the reduction group of bucket `b` (the ZeRO shard index).
  int group_index(const ParamBucket& b) const;

  // Runs one training step: forward, backward and optimizer step of every micro-batch.
  StepResult step(const StepConfig& config);

  const Program& program() const { return program_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  const Program& program_;
};

}  // namespace parasol::runtime
