// `parasol run`: trains a model under a plan for real, on this host's CPUs with MPI, or on its
// GPUs with the cuda backend and NCCL (--backend cuda, where built), one rank per GPU (launch
// with `mpirun -np N parasol run ...`; N must be the plan's rank count). Rank 0 prints the loss,
// step time and tokens/s of every step, then each rank's measured peak memory beside the liveness
// prediction; --trace writes the last --trace-steps steps' ops (all ranks merged) in the
// simulator's schema, with the plan and the communication groups, so that `parasol compare` and
// `parasol calibrate` read it as it is, each rank's device-memory counter, stage names and the
// dependency flows (sim/trace_annotate.h).
#include <mpi.h>

#include <cstdio>
#include <filesystem>
#include <iostream>

#include "core/error.h"
#include "core/liveness.h"
#include "core/lower.h"
#include "core/rank_layout.h"
#include "runtime/comm/comm_timeout.h"
#include "runtime/comm/mpi_communicator.h"
#include "runtime/cpu/cpu_backend.h"
#include "runtime/trainer.h"
#include "sim/trace_annotate.h"
#ifdef PARASOL_HAVE_CUDA
#include "runtime/comm/nccl_communicator.h"
#include "runtime/cuda/cuda_backend.h"
#endif
#include "core/format.h"
#include "tools/commands.h"
#include "tools/flag_checks.h"
#include "tools/mpi_session.h"
#include "tools/spec.h"
#include "traces/trace.h"

namespace parasol::tools {

namespace {

struct RunOptions {
  int steps = 10;
  int trace_steps = 1;  // the last trace_steps steps are recorded
  std::string data, trace, checkpoint, resume, backend = "cpu";
  uint64_t seed = 42;
  double lr = 1e-3;
  int keep = 0;               // checkpoints kept under --checkpoint (0: all)
  int checkpoint_every = 0;   // also save every this many steps (0: only at the end)
  double comm_timeout_s = 0;  // 0: PARASOL_COMM_TIMEOUT_S or the default
  bool json = false;
};

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

// One training step. A failure inside a step may be this rank's alone (a kernel, a transfer, a
// peer that died) while the others wait in a collective for it: the rank names itself and the
// error (the executor's errors name the op) and aborts the whole job, so that every rank exits
// non-zero at once instead of waiting forever. (Errors before the first step are every rank's
// alike and end the run normally.)
runtime::StepStats step_or_abort(runtime::Trainer& trainer, bool trace, int rank, int world) {
  try {
    return trainer.step(trace);
  } catch (const std::exception& e) {
    // The line of the failure's kind (core/error.h): "error: ", "internal error (...): " or
    // "system error: ", then the rank and the step.
    const auto* error = dynamic_cast<const Error*>(&e);
    const std::string line = error_line(error ? *error : InternalError("", e.what()));
    const std::string prefix = line.substr(0, line.size() - std::string(e.what()).size());
    std::fprintf(stderr, "%srank %d of %d failed in step %lld: %s\n", prefix.c_str(), rank, world,
                 static_cast<long long>(trainer.steps_done() + 1), e.what());
    std::fflush(stderr);
    if (world > 1) MPI_Abort(MPI_COMM_WORLD, error ? exit_code(error->kind()) : 1);
    throw;
  }
}

int train(const Spec& s, const RunOptions& ro) {
  using namespace runtime;
  if (ro.backend != "cpu" && ro.backend != "cuda")
    throw Error("backend", "'" + ro.backend + "' is not a backend (cpu, cuda)");
  if (ro.steps < 1) throw Error("steps", "must be at least 1");
  if (ro.trace_steps < 1 || ro.trace_steps > ro.steps)
    throw Error("trace-steps", std::to_string(ro.trace_steps) + " must be in [1, --steps (" +
                                   std::to_string(ro.steps) + ")]");
  Plan plan = s.plan;
  validate(plan, s.model, *s.cluster);
  if (ro.comm_timeout_s > 0) set_comm_timeout_s(ro.comm_timeout_s);
  std::unique_ptr<CommSet> comms;
  std::unique_ptr<Backend> owned;
  if (ro.backend == "cpu") {
    comms = make_mpi_comm_set(plan);
    // One OpenBLAS thread per rank when several ranks share the host.
    owned = std::make_unique<CpuBackend>(comms->world_size() > 1 ? 1 : 0);
  } else {
#ifdef PARASOL_HAVE_CUDA
    comms = make_nccl_comm_set(plan);
    owned = std::make_unique<CudaBackend>(select_nccl_device());
#else
    throw Error("backend", "cuda: this parasol was built without the CUDA parts");
#endif
  }
  Backend& backend = *owned;
  const bool root = comms->world_rank() == 0;
  int world = comms->world_size();
  TrainerOptions opt;
  opt.seed = ro.seed;
  opt.data = ro.data;
  opt.adamw.lr = ro.lr;
  opt.keep_checkpoints = ro.keep;
  Trainer trainer(s.model, plan, backend, *comms, opt);
  if (!ro.resume.empty()) trainer.load(ro.resume);
  const Liveness lv = liveness(trainer.program());
  Json steps = Json::array();
  StepStats last;
  std::vector<traces::TraceEvent> recorded;
  std::vector<traces::TraceCounter> recorded_counters;
  double offset = 0;  // where the next recorded step starts in the trace
  for (int i = 0; i < ro.steps; ++i) {
    const bool trace = !ro.trace.empty() && i >= ro.steps - ro.trace_steps;
    last = step_or_abort(trainer, trace, comms->world_rank(), world);
    if (trace) {
      // Recorded steps follow one another: each rank's times are from its own step start
      // (after a barrier), and the slowest rank's step time is the same on every rank.
      for (traces::TraceEvent e : trainer.last_events()) {
        e.start_s += offset;
        recorded.push_back(std::move(e));
      }
      for (traces::TraceCounter c : trainer.last_counters()) {
        c.t_s += offset;
        recorded_counters.push_back(std::move(c));
      }
      offset += last.seconds;
    }
    if (root && !ro.json) {
      std::printf("step %lld  loss %.4f  grad-norm %.3f  %.3f s  %s tokens/s",
                  static_cast<long long>(last.step), last.loss, last.grad_norm, last.seconds,
                  count(last.tokens_per_s).c_str());
      // Whole-step graphs asked for: what the step did (runtime/step_graph.h), and why not.
      if (plan.cuda_graphs == CudaGraphs::kFullIteration)
        std::printf("  graph %s%s%s", last.graph_action.c_str(),
                    last.graph_reason.empty() ? "" : ": ", last.graph_reason.c_str());
      std::printf("\n");
    }
    if (ro.checkpoint_every > 0 && !ro.checkpoint.empty() && last.step % ro.checkpoint_every == 0 &&
        i + 1 < ro.steps)
      trainer.save(ro.checkpoint);
    Json st = {{"step", last.step},
               {"loss", last.loss},
               {"grad_norm", last.grad_norm},
               {"seconds", last.seconds},
               {"tokens_per_s", last.tokens_per_s},
               {"graph", last.graph_action}};
    if (!last.graph_reason.empty()) st["graph_reason"] = last.graph_reason;
    if (last.step_host_reads >= 0) st["host_reads"] = last.step_host_reads;
    steps.push_back(std::move(st));
    std::fflush(stdout);
  }
  // Measured peak memory per rank (last step) against the liveness prediction.
  std::vector<float> peaks(static_cast<size_t>(world), 0.0f), predicted(peaks);
  peaks[comms->world_rank()] = static_cast<float>(last.peak_bytes);
  predicted[comms->world_rank()] = static_cast<float>(lv.peak_bytes);
  all_reduce_host(comms->world(), backend, peaks);
  all_reduce_host(comms->world(), backend, predicted);
  if (!ro.trace.empty()) {
    const std::string part = ro.trace + ".rank" + std::to_string(comms->world_rank());
    traces::Trace t;
    t.source = "measured";
    t.plan = plan_to_json(plan);  // with its model, cluster and GPU-count references
    t.steps = ro.trace_steps;     // stated: a trace stripped of its op ids still counts them
    t.events = std::move(recorded);
    t.counters = std::move(recorded_counters);
    const Program& prog = trainer.program();
    for (traces::TraceEvent& e : t.events) {
      const Op& op = prog.ops.at(static_cast<size_t>(e.op_id));
      if (is_communication(op.kind)) e.group = group_name(op.group);
    }
    for (int st = 0; st < static_cast<int>(trainer.program().streams.size()); ++st)
      t.streams.push_back({comms->world_rank(), st, trainer.program().stream_name(st)});
    traces::write_trace_file(t, part);
    comms->world().barrier();
    if (root) {
      std::vector<std::string> parts;
      for (int r = 0; r < world; ++r) parts.push_back(ro.trace + ".rank" + std::to_string(r));
      // Stage names and dependency flows (sim/trace_annotate.h) need every stage's Program.
      traces::Trace merged = traces::read_trace_files(parts);
      std::vector<Program> programs;
      for (int st = 0; st < plan.pp; ++st)
        programs.push_back(lower_stage(s.model, runtime_plan(plan), st));
      sim::annotate_trace(merged, plan, programs);
      traces::write_trace_file(merged, ro.trace);
      for (const std::string& p : parts) std::filesystem::remove(p);
    }
  }
  if (!ro.checkpoint.empty()) trainer.save(ro.checkpoint);
  if (root) {
    if (ro.json) {
      Json ranks = Json::array();
      for (int r = 0; r < world; ++r)
        ranks.push_back({{"rank", r},
                         {"peak_bytes", static_cast<double>(peaks[r])},
                         {"predicted_peak_bytes", static_cast<double>(predicted[r])}});
      Json out = {{"plan", plan_to_json(plan)}, {"steps", steps}, {"ranks", ranks}};
      if (!ro.trace.empty()) out["trace"] = ro.trace;
      if (!ro.checkpoint.empty()) out["checkpoint"] = ro.checkpoint;
      std::cout << out.dump(1) << "\n";
    } else {
      std::printf("peak memory per rank (measured / liveness prediction):\n");
      for (int r = 0; r < world; ++r)
        std::printf("  rank %d: %.3f MiB / %.3f MiB\n", r, peaks[r] / 1048576.0,
                    predicted[r] / 1048576.0);
      if (!ro.trace.empty()) std::printf("trace: %s\n", ro.trace.c_str());
      if (!ro.checkpoint.empty()) std::printf("checkpoint: %s\n", ro.checkpoint.c_str());
    }
  }
  return 0;
}

}  // namespace

Runner add_run(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "run", "train for real on this host's CPUs (launch with mpirun -np <plan ranks>)");
  auto o = std::make_shared<SpecOptions>();
  o->model = "tiny";
  o->cluster = "localhost";
  auto ro = std::make_shared<RunOptions>();
  add_target_flags(cmd, *o);
  add_plan_flags(cmd, *o);
  cmd->add_option("--steps", ro->steps, "training steps")
      ->capture_default_str()
      ->check(count_in(1));
  cmd->add_option("--data", ro->data, "llm.c .bin token file (default: seeded synthetic tokens)");
  cmd->add_option("--trace", ro->trace,
                  "write the trace (Chrome JSON) of the last --trace-steps steps here");
  cmd->add_option("--trace-steps", ro->trace_steps,
                  "steps the trace records (the last ones; compare and calibrate take medians)")
      ->capture_default_str()
      ->check(count_in(1));
  cmd->add_option("--checkpoint", ro->checkpoint,
                  "save the training state under this directory at the end (atomically: a new "
                  "step-<N> directory, then `latest` names it)");
  cmd->add_option("--checkpoint-every", ro->checkpoint_every,
                  "also save under --checkpoint every this many steps (step numbers count from the "
                  "start of training; 0: only at the end)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--keep", ro->keep,
                  "checkpoints kept under --checkpoint, the newest (default 0: all)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--comm-timeout", ro->comm_timeout_s,
                  "seconds a transfer may go without completing before the job is ended, naming "
                  "it (default: PARASOL_COMM_TIMEOUT_S, else 600)")
      ->check(finite_number(true));
  cmd->add_option("--resume", ro->resume,
                  "resume from this checkpoint (a step directory, or the directory whose `latest` "
                  "names one)");
  cmd->add_option("--backend", ro->backend, "cpu (MPI) or cuda (NCCL, where built)")
      ->capture_default_str();
  cmd->add_option("--seed", ro->seed, "initialisation, data and dropout seed")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--lr", ro->lr, "AdamW learning rate")
      ->capture_default_str()
      ->check(finite_number(true));
  cmd->add_flag("--json", ro->json, "print JSON (rank 0)");
  return [=]() {
    MpiSession mpi;
    SpecOptions so = *o;
    // fp32 unless --precision says otherwise: bf16 / fp16 run mixed precision (16-bit storage,
    // fp32 math, master weights and Adam moments; fp16 with dynamic loss scaling).
    if (!so.precision) so.precision = "fp32";
    if (so.gpus == 0 && !so.plan_file.empty()) so.gpus = 0;
    int code = 0;
    try {
      Spec s = load_spec(so, cmd, true);
      code = train(s, *ro);
    } catch (const Error& e) {
      // Every rank reports the same error; print it once.
      if (world_rank() == 0) std::cerr << error_line(e) << "\n";
      return exit_code(e.kind());
    }
    return code;
  };
}

}  // namespace parasol::tools
