// Trainer: lowering of this rank's stage, initialisation, data feeding, steps and checkpoints.
#include "runtime/trainer.h"

#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <cstring>

#include "core/error.h"
#include "core/lower.h"
#include "runtime/checkpoint.h"
#include "runtime/host_staging.h"
#include "runtime/param_init.h"

namespace parasol::runtime {

void all_reduce_host(Communicator& comm, Backend& backend, std::span<float> values, bool max) {
  const size_t bytes = values.size() * sizeof(float);
  auto* dev = static_cast<float*>(backend.alloc(bytes, BufferClass::kWorkspace));
  backend.copy(dev, values.data(), bytes);
  const auto n = static_cast<int64_t>(values.size());
  (max ? comm.iall_reduce_max(dev, n, Dtype::kFp32) : comm.iall_reduce(dev, n, Dtype::kFp32))
      .wait();
  backend.copy(values.data(), dev, bytes);
  backend.free(dev);
}

namespace {
// fp16 trains with dynamic loss scaling (Megatron's default for --fp16 without --loss-scale,
// torch AMP's GradScaler): its gradients underflow without it. bf16 has fp32's exponent range
// and trains unscaled, as both frameworks do.
LossScalerConfig scaling_for(const Plan& plan, LossScalerConfig c) {
  if (plan.precision == Dtype::kFp16) c.enabled = true;
  return c;
}
}  // namespace

Trainer::Trainer(const Model& model, const Plan& plan, Backend& backend, CommSet& comms,
                 TrainerOptions options)
    : model_(model),
      plan_(runtime_plan(plan)),
      backend_(backend),
      comms_(comms),
      options_(std::move(options)),
      program_(lower_stage(model, plan_, comms.stage())),
      scaler_(scaling_for(plan_, options_.loss_scaling)) {
  executor_ = std::make_unique<Executor>(model_, plan_, program_, backend_, comms_);
  data_ = open_token_source(options_.data, model_.vocab, plan_.seq(model_), options_.seed);
  // The host fills the parameters in host copies (it cannot touch device memory on a GPU).
  HostStaging staging(*executor_, backend_, /*load=*/false);
  init_buckets(model_, plan_, comms_.groups().coord, program_.buckets, staging.access(),
               options_.seed);
  staging.store();
}

Trainer::~Trainer() = default;

void Trainer::fill_batch(int mb, int32_t* tokens, int32_t* labels) const {
  const RankCoord& c = comms_.groups().coord;
  const int64_t per_replica = plan_.global_batch / plan_.dp;
  const int64_t Sl = plan_.seq(model_) / plan_.cp;
  for (int64_t b = 0; b < plan_.micro_batch; ++b) {
    const int64_t sequence =
        data_position_ + c.dp(grid_ep(plan_)) * per_replica + int64_t{mb} * plan_.micro_batch + b;
    data_->fill(sequence, int64_t{c.cp} * Sl, Sl, tokens + b * Sl, labels + b * Sl);
  }
}

void Trainer::skip_step() {
  ++steps_;
  data_position_ += plan_.global_batch;
}

StepStats Trainer::step(bool trace) {
  StepConfig cfg;
  cfg.step = steps_ + 1;
  cfg.adamw = options_.adamw;
  cfg.clip_norm = options_.clip_norm;
  cfg.dropout_p = options_.dropout_p;
  cfg.seed = options_.seed;
  cfg.tokens_per_step = int64_t{plan_.global_batch} * plan_.seq(model_);
  cfg.trace = trace;
  cfg.batch = [this](int mb, int32_t* tokens, int32_t* labels) { fill_batch(mb, tokens, labels); };
  cfg.loss_scale = static_cast<float>(scaler_.scale());
  cfg.skip_on_overflow = scaler_.enabled();
  cfg.optimizer_step = updates_ + 1;
  cfg.typed_bf16 = options_.typed_bf16;
  cfg.stage_host_traffic = options_.stage_host_traffic;
  cfg.inject_overflow =
      std::find(options_.inject_overflow_steps.begin(), options_.inject_overflow_steps.end(),
                steps_ + 1) != options_.inject_overflow_steps.end();
  backend_.reset_peaks();
  comms_.world().barrier();
  StepResult r = executor_->step(cfg);
  const RankGroups& g = comms_.groups();
  // The loss: last stage, one tensor-parallel rank per replica and chunk; the slowest rank's time.
  const bool reports = g.last_stage() && g[Group::kTp].index == 0;
  std::vector<float> sums = {reports ? static_cast<float>(r.loss_sum) : 0.0f,
                             reports ? static_cast<float>(r.loss_tokens) : 0.0f};
  all_reduce_host(comms_.world(), backend_, sums);
  std::vector<float> slowest = {static_cast<float>(r.seconds)};
  all_reduce_host(comms_.world(), backend_, slowest, true);
  ++steps_;
  data_position_ += plan_.global_batch;
  StepStats s;
  s.step = steps_;
  s.loss_scale = cfg.loss_scale;
  s.skipped = r.overflow && scaler_.enabled();
  if (!s.skipped) ++updates_;
  scaler_.update(r.overflow);
  s.loss = sums[1] > 0 ? sums[0] / sums[1] : 0.0;
  s.grad_norm = r.grad_norm;
  s.seconds = slowest[0];
  s.tokens_per_s = s.seconds > 0 ? static_cast<double>(cfg.tokens_per_step) / s.seconds : 0.0;
  // A replayed graph's buffers were allocated at its capture: that step's peak is its peak.
  s.peak_bytes = std::max(backend_.device_memory().peak_total, r.graph_peak_bytes);
  s.typed_bf16_ops = r.typed_bf16_ops;
  s.widened_bytes = r.widened_bytes;
  s.widened_typed_kind_bytes = r.widened_typed_kind_bytes;
  s.widened_attention_bytes = r.widened_attention_bytes;
  s.moe_count_syncs = r.moe_count_syncs;
  s.graph_action = graph_action_name(r.graph_action);
  s.graph_reason = r.graph_reason;
  s.step_host_reads = r.step_host_reads;
  s.step_host_writes = r.step_host_writes;
  events_ = std::move(r.events);
  counters_ = std::move(r.counters);
  return s;
}

namespace {

// Runs `f` on every rank; when it throws on any, every rank throws (so none waits forever in a
// collective that a failed rank never joins).
template <typename F>
void on_every_rank(Communicator& world, Backend& backend, const char* field, F&& f) {
  std::string error;
  ErrorKind kind = ErrorKind::kUser;
  try {
    f();
  } catch (const Error& e) {
    error = e.what();
    kind = e.kind();
  }
  // 0: no failure; 1 + the ErrorKind otherwise. The failing rank throws its own kind; the others
  // throw the gravest kind of any rank (the maximum: a system fault or a parasol bug over the
  // user's error), so that no rank reports another's internal error as the user's (exit 2).
  std::vector<float> failed = {error.empty() ? 0.0f : 1.0f + static_cast<float>(kind)};
  all_reduce_host(world, backend, failed, true);
  if (!error.empty()) throw Error(field, error, kind);
  if (failed[0] > 0)
    throw Error(field, "failed on another rank",
                static_cast<ErrorKind>(std::lround(failed[0]) - 1));
}

}  // namespace

namespace {
// Fault injection for the tests of atomic saves (tests/tools/cli_test.cc): with
// PARASOL_TEST_KILL_IN_SAVE=<point> in the environment, this process kills itself (SIGKILL) at
// that point of a save: begin, rank, commit or publish.
void kill_point(const char* point) {
  static const char* where = std::getenv("PARASOL_TEST_KILL_IN_SAVE");
  if (where != nullptr && std::strcmp(where, point) == 0) std::raise(SIGKILL);
}
}  // namespace

void Trainer::save(const std::string& root) {
  Communicator& world = comms_.world();
  std::string dir;
  on_every_rank(world, backend_, "checkpoint", [&] {
    dir = checkpoint_staging_dir(root, steps_);
    kill_point("begin");
    if (world.index() == 0) begin_checkpoint(dir, model_, plan_);
  });
  on_every_rank(world, backend_, "checkpoint", [&] {
    HostStaging staging(*executor_, backend_, /*load=*/true);
    save_checkpoint_rank(dir, model_, plan_, comms_.groups().coord, program_.buckets,
                         staging.access());
    kill_point("rank");
  });
  on_every_rank(world, backend_, "checkpoint", [&] {
    if (world.index() != 0) return;
    TrainProgress p;
    p.step = steps_;
    p.tokens = steps_ * plan_.global_batch * plan_.seq(model_);
    p.data_position = data_position_;
    p.seed = options_.seed;
    p.adamw = options_.adamw;
    p.adamw.step = updates_ + 1;
    if (scaler_.enabled()) p.loss_scaler = scaler_.state();
    commit_checkpoint(dir, model_, plan_, p);
    kill_point("commit");
  });
  on_every_rank(world, backend_, "checkpoint", [&] {
    if (world.index() != 0) return;
    kill_point("publish");
    publish_checkpoint(root, steps_, options_.keep_checkpoints);
  });
}

void Trainer::load(const std::string& path) {
  TrainProgress p;
  std::string dir;
  on_every_rank(comms_.world(), backend_, "resume", [&] { dir = resolve_checkpoint(path); });
  // One rank checks every file against the manifest's checksums before any rank reads.
  on_every_rank(comms_.world(), backend_, "resume", [&] {
    if (comms_.world().index() == 0) verify_checkpoint(dir, model_);
  });
  on_every_rank(comms_.world(), backend_, "resume", [&] {
    HostStaging staging(*executor_, backend_, /*load=*/true);
    p = load_checkpoint_rank(dir, model_, plan_, comms_.groups().coord, program_.buckets,
                             staging.access());
    staging.store();
  });
  steps_ = p.step;
  updates_ = std::max<int64_t>(0, p.adamw.step - 1);
  data_position_ = p.data_position;
  if (scaler_.enabled() && p.loss_scaler) scaler_.restore(*p.loss_scaler);
}

}  // namespace parasol::runtime
