// Trainer: one rank's training loop under a Plan. It lowers the rank's pipeline stage, builds the
// Executor, initialises the parameters from the seeded full tensors (runtime/param_init.h) or a
// checkpoint (runtime/checkpoint.h), feeds each micro-batch its tokens (this rank's data-parallel
// shard and context-parallel chunk of the global batch, runtime/data.h), and runs steps. Every
// call is collective over the CommSet's world: all ranks call it in the same order.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/model.h"
#include "core/plan.h"
#include "core/program.h"
#include "runtime/backend.h"
#include "runtime/comm/communicator.h"
#include "runtime/data.h"
#include "runtime/executor.h"
#include "runtime/loss_scaler.h"

namespace parasol::runtime {

struct TrainerOptions {
  uint64_t seed = 42;  // initialisation, synthetic data and dropout
  std::string data;    // llm.c .bin token file; empty: seeded synthetic tokens
  AdamWConfig adamw;
  float clip_norm = 1.0f;
  float dropout_p = 0.1f;    // where the model has dropout
  int keep_checkpoints = 0;  // step directories a save keeps (the newest ones); 0: all
  // Dynamic loss scaling (fp16 training): a step whose gradients overflow is skipped. Always on
  // for fp16 plans (the config's factors and intervals apply); off by default otherwise.
  LossScalerConfig loss_scaling;
  // Fault injection (tests): the steps (1-based) whose loss gradient gets an +inf on this rank.
  std::vector<int64_t> inject_overflow_steps;
  // Mixed precision: the Backend's typed bf16 entries where it has them (StepConfig::typed_bf16).
  bool typed_bf16 = true;
  // StepConfig::stage_host_traffic: the tokens uploaded before each step, the loss read after.
  bool stage_host_traffic = true;
};

struct StepStats {
  int64_t step = 0;         // 1-based
  double loss = 0;          // mean loss over the global batch's tokens
  double grad_norm = 0;     // global gradient norm before clipping
  double seconds = 0;       // slowest rank's step time
  double tokens_per_s = 0;  // global batch tokens / seconds
  int64_t peak_bytes = 0;   // this rank's peak device memory during the step
  double loss_scale = 1;    // the loss scale the step ran with (1 without loss scaling)
  bool skipped = false;     // the gradients overflowed under loss scaling: no update applied
  // This rank's StepResult::typed_bf16_ops, widened_bytes, widened_typed_kind_bytes,
  // widened_attention_bytes.
  int64_t typed_bf16_ops = 0;
  int64_t widened_bytes = 0;
  int64_t widened_typed_kind_bytes = 0;
  int64_t widened_attention_bytes = 0;
  int64_t moe_count_syncs = 0;             // this rank's StepResult::moe_count_syncs
  std::string graph_action, graph_reason;  // StepResult::graph_action (its name), graph_reason
  int64_t step_host_reads = -1;            // this rank's StepResult::step_host_reads
  int64_t step_host_writes = -1;           // and step_host_writes
};

// Sums (or maximises) a few host values over `comm` through the backend's memory, so that the
// same call works with communicators of device memory (NCCL) and of host memory (MPI).
void all_reduce_host(Communicator& comm, Backend& backend, std::span<float> values,
                     bool max = false);

class Trainer {
 public:
  Trainer(const Model& model, const Plan& plan, Backend& backend, CommSet& comms,
          TrainerOptions options);
  ~Trainer();

  // Runs one step; trace: record its ops (last_events()).
  StepStats step(bool trace = false);
  // Consumes one step's global batch without training on it (Megatron's
  // --skip-train-iteration-range): the data and the step count advance, the model does not.
  void skip_step();
  // Saves / loads the full training state (plan-independent). Collective.
  void save(const std::string& dir);
  void load(const std::string& dir);

  int64_t steps_done() const { return steps_; }
  int64_t updates_done() const { return updates_; }  // steps that updated the parameters
  const LossScaler& loss_scaler() const { return scaler_; }
  const Program& program() const { return program_; }
  const Executor& executor() const { return *executor_; }
  const std::vector<traces::TraceEvent>& last_events() const { return events_; }
  // The last traced step's device-memory counter samples (StepResult::counters).
  const std::vector<traces::TraceCounter>& last_counters() const { return counters_; }

 private:
  void fill_batch(int mb, int32_t* tokens, int32_t* labels) const;

  const Model& model_;
  const Plan plan_;  // runtime_plan() of the plan given: what the CPU runtime executes
  Backend& backend_;
  CommSet& comms_;
  TrainerOptions options_;
  Program program_;
  std::unique_ptr<Executor> executor_;
  std::unique_ptr<TokenSource> data_;
  int64_t steps_ = 0;
  int64_t updates_ = 0;        // optimizer updates applied (steps less the skipped ones)
  int64_t data_position_ = 0;  // first sequence of the next step's global batch
  LossScaler scaler_;
  std::vector<traces::TraceEvent> events_;
  std::vector<traces::TraceCounter> counters_;
};

}  // namespace parasol::runtime
