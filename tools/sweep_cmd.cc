// `parasol sweep`: the command line of tools/sweep.h. Axes from --vary (or a sweep JSON file),
// the search's flags as `parasol search` takes them, a table / --json / --csv, a journal (--out)
// that --resume continues, a progress bar on a terminal, and under `mpirun -np N` each rank its
// share of the points (index % N), gathered by rank 0.
#include <mpi.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>

#include "core/error.h"
#include "core/format.h"
#include "interop/interop.h"
#include "tools/commands.h"
#include "tools/flag_checks.h"
#include "tools/job_flags.h"
#include "tools/mpi_session.h"
#include "tools/progress.h"
#include "tools/sweep.h"

namespace parasol::tools {

namespace {

// The size of the MPI job this process was started in by mpirun (1 outside one).
int launched_ranks() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE"})
    if (const char* v = std::getenv(var)) return std::max(1, std::atoi(v));
  return 1;
}

// Every rank's rows on rank 0 (other ranks get theirs back): one JSON line per row.
std::vector<Json> gather_rows(const std::vector<Json>& mine, int rank, int ranks) {
  std::string text;
  for (const Json& r : mine) text += r.dump() + "\n";
  int length = static_cast<int>(text.size());
  std::vector<int> lengths(ranks), offsets(ranks);
  MPI_Gather(&length, 1, MPI_INT, lengths.data(), 1, MPI_INT, 0, MPI_COMM_WORLD);
  std::string all;
  if (rank == 0) {
    int total = 0;
    for (int r = 0; r < ranks; ++r) {
      offsets[r] = total;
      total += lengths[r];
    }
    all.resize(total);
  }
  MPI_Gatherv(text.data(), length, MPI_CHAR, all.data(), lengths.data(), offsets.data(), MPI_CHAR,
              0, MPI_COMM_WORLD);
  if (rank != 0) return mine;
  std::vector<Json> rows;
  size_t start = 0;
  for (size_t i = 0; i < all.size(); ++i)
    if (all[i] == '\n') {
      rows.push_back(Json::parse(all.substr(start, i - start)));
      start = i + 1;
    }
  return rows;
}

void print_table(const Json& doc) {
  const Json& h = doc["sweep"];
  const bool tokens = !h["tokens"].is_null();
  std::vector<std::string> header = {"#"};
  for (const Json& a : h["axes"]) header.push_back(a["key"].get<std::string>());
  for (const char* c : {"best plan", "step", "band", "tokens/s", "MFU", "mem/GPU"})
    header.push_back(c);
  header.push_back(tokens ? "time to train" : "time/1B tok");
  header.push_back("GPU-hours");
  header.push_back("cost");
  header.push_back("energy");
  bool any_without = false;
  for (const Json& r : doc["rows"]) any_without = any_without || r["status"] != "ok";
  if (any_without) header.push_back("why no plan");
  Table t(header);
  for (const Json& r : doc["rows"]) {
    std::vector<std::string> row = {std::to_string(r["index"].get<int64_t>() + 1)};
    for (const Json& a : h["axes"])
      row.push_back(sim::sweep_value_text(r["point"][a["key"].get<std::string>()]));
    if (r["status"] != "ok") {
      row.push_back("no plan");
      row.resize(header.size() - 1, "-");
      row.push_back(r.value("reason", ""));
      t.add(row);
      continue;
    }
    const Json& tr = r["train"];
    const double time_s = tr["time_s"].get<double>();
    row.push_back(r["plan"].get<std::string>());
    row.push_back(secs(r.contains("simulated_step_time_s")
                           ? r["simulated_step_time_s"].get<double>()
                           : r["step_time_s"].get<double>()));
    row.push_back(r["band"].value("validated", false)
                      ? fmt("± %.0f%%", 100 * r["band"]["fraction"].get<double>())
                      : "unvalidated");
    row.push_back(count(r["tokens_per_s"].get<double>()));
    row.push_back(pct(r["mfu"].get<double>()));
    row.push_back(gib(r["memory_per_gpu_bytes"].get<double>()));
    row.push_back(time_s >= 86400 ? fmt("%.1f d", time_s / 86400) : fmt("%.2f h", time_s / 3600));
    row.push_back(count(tr["gpu_hours"].get<double>()));
    row.push_back(tr["cost"].is_null() ? "-" : "$" + count(tr["cost"].get<double>()));
    row.push_back(fmt("%.3g MWh", tr["energy_MWh"].get<double>()));
    t.add(row);
  }
  std::cout << t.render();
}

}  // namespace

Runner add_sweep(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "sweep",
      "the best plan on every cluster of a grid of what-if clusters (--vary KEY=V1,V2,...)");
  auto spec = std::make_shared<SweepSpec>();
  auto vary = std::make_shared<std::vector<std::string>>();
  auto file = std::make_shared<std::string>();
  auto prices = std::make_shared<std::vector<std::string>>();
  auto threads = std::make_shared<int>(0);
  auto out = std::make_shared<std::string>();
  auto resume = std::make_shared<bool>(false);
  auto json = std::make_shared<bool>(false);
  auto csv = std::make_shared<bool>(false);
  cmd->add_option("--model", spec->model, "model preset or JSON file")->capture_default_str();
  cmd->add_option("--cluster", spec->cluster,
                  "the base cluster: a server preset or a rail/fat-tree generator JSON file")
      ->capture_default_str();
  cmd->add_option("--gpus", spec->gpus, "GPU count (unless an axis)")
      ->capture_default_str()
      ->check(count_in(1, 1 << 20));
  cmd->add_option("--profile", spec->profile, "profile JSON (default: datasheet defaults)");
  cmd->add_option("--vary", *vary,
                  "an axis: KEY=V1,V2,... with numeric items as START:STOP:STEP or "
                  "START:STOP:xFACTOR (repeatable; keys: " +
                      join(sweep_axis_keys(), ", ") + ")");
  cmd->add_option("--file", *file, "a sweep JSON file (its settings and \"vary\"; flags add axes)");
  cmd->add_option("--gbs", spec->search.gbs, "global batch size (sequences), unless an axis")
      ->capture_default_str()
      ->check(count_in(1, 1 << 30));
  cmd->add_option("--seq", spec->search.seq, "sequence length (default: the model's)")
      ->check(count_in(1));
  cmd->add_option("--precision", spec->search.precision, "fp32|bf16|fp16|fp8")
      ->capture_default_str()
      ->check(CLI::IsMember({"fp32", "bf16", "fp16", "fp8"}));
  cmd->add_flag("--no-offload", spec->search.no_offload, "do not consider offloading");
  cmd->add_flag("--robust", spec->search.robust,
                "rank by the pessimistic end of each plan's error band");
  cmd->add_option("--simulate-top", spec->search.simulate_top,
                  "re-rank each point's best N plans by the event simulator")
      ->check(count_in(0));
  cmd->add_option("--framework", spec->search.framework,
                  "only plans this framework can run: megatron|deepspeed|torchtitan")
      ->check(CLI::IsMember(interop::framework_names()));
  add_job_flags(cmd, spec->search.job);
  cmd->add_option("--device-price", *prices,
                  "price per GPU-hour by device, DEVICE=PRICE (repeatable; over "
                  "--price-per-gpu-hour)");
  cmd->add_option("--threads", *threads, "worker threads (default: all cores)")
      ->check(count_in(1, 4096));
  cmd->add_option("--out", *out,
                  "write the rows to this journal as points finish (JSON Lines; under mpirun "
                  "each rank writes FILE.rankN until rank 0 merges them)");
  cmd->add_flag("--resume", *resume, "continue the sweep in --out without redoing its points");
  cmd->add_flag("--json", *json, "print JSON");
  cmd->add_flag("--csv", *csv, "print CSV");
  return [=]() {
    SweepSpec s = *spec;
    if (!file->empty()) {
      SweepSpec from = sweep_from_json(read_json_file(*file), *file);
      // Flags given on the command line win over the file's settings.
      auto given = [&](const char* flag) { return cmd->count(flag) > 0; };
      if (given("--model")) from.model = s.model;
      if (given("--cluster")) from.cluster = s.cluster;
      if (given("--gpus")) from.gpus = s.gpus;
      if (given("--gbs")) from.search.gbs = s.search.gbs;
      if (given("--seq")) from.search.seq = s.search.seq;
      if (given("--profile")) from.profile = s.profile;
      if (given("--precision")) from.search.precision = s.search.precision;
      if (given("--no-offload")) from.search.no_offload = s.search.no_offload;
      if (given("--robust")) from.search.robust = s.search.robust;
      if (given("--simulate-top")) from.search.simulate_top = s.search.simulate_top;
      if (given("--framework")) from.search.framework = s.search.framework;
      JobFlags& job = from.search.job;
      const JobFlags& flag = s.search.job;
      if (given("--tokens")) job.tokens = flag.tokens;
      if (given("--price-per-gpu-hour")) job.price_per_gpu_hour = flag.price_per_gpu_hour;
      if (given("--checkpoint-interval")) job.checkpoint_interval_s = flag.checkpoint_interval_s;
      if (given("--storage-GBps")) job.storage_GBps = flag.storage_GBps;
      if (given("--restart-s")) job.restart_s = flag.restart_s;
      if (given("--planned-per-day")) job.planned_per_day = flag.planned_per_day;
      s = from;
    }
    for (const std::string& v : *vary) s.axes.push_back(parse_sweep_axis(v));
    for (const std::string& p : *prices) {
      const size_t eq = p.find('=');
      if (eq == std::string::npos || eq == 0)
        throw Error("--device-price", "'" + p + "' is not DEVICE=PRICE");
      device_spec(p.substr(0, eq), "--device-price");
      double v = 0;
      size_t used = 0;
      try {
        v = std::stod(p.substr(eq + 1), &used);
      } catch (...) {
        used = 0;
      }
      if (used == 0 || used != p.size() - eq - 1 || !(v >= 0) || v > 1e9)
        throw Error("--device-price", "'" + p.substr(eq + 1) + "' is not a price >= 0");
      s.device_price[p.substr(0, eq)] = v;
    }
    if (*json && *csv) throw Error("--csv", "cannot be given with --json");
    if (*resume && out->empty()) throw Error("--resume", "needs --out, the journal to resume");
    {
      // The job flags' own checks, as search makes them; a price needs no --tokens here (the
      // rows then price 1B tokens at the steady step).
      JobFlags job = s.search.job;
      if (!(job.price_per_gpu_hour >= 0) || !std::isfinite(job.price_per_gpu_hour))
        throw Error("job.price_per_gpu_hour", "must be >= 0");
      if (!job.tokens) job.price_per_gpu_hour = 0;
      Cluster probe = cluster_preset("dgx-a100-80g", 8);
      job_options(job, probe);
    }
    prepare_sweep(s);

    const int launched = launched_ranks();
    std::unique_ptr<MpiSession> mpi;
    int rank = 0, ranks = 1;
    if (launched > 1) {
      mpi = std::make_unique<MpiSession>();
      MPI_Comm_rank(MPI_COMM_WORLD, &rank);
      MPI_Comm_size(MPI_COMM_WORLD, &ranks);
    }
    SweepRunOptions o;
    o.threads = *threads;
    o.rank = rank;
    o.ranks = ranks;
    o.resume = *resume;
    if (!out->empty()) o.journal = ranks > 1 ? *out + ".rank" + std::to_string(rank) : *out;
    auto bar =
        std::make_shared<ProgressBar>(stderr, rank == 0 && stream_is_terminal(stderr), "sweeping");
    o.progress = [bar](int64_t done, int64_t total) {
      bar->update(static_cast<double>(done) / std::max<int64_t>(1, total));
    };
    int64_t resumed = 0;
    std::vector<Json> rows;
    int failed = 0;
    std::exception_ptr failure;
    try {
      rows = run_sweep(s, o, &resumed);
    } catch (...) {
      failed = 1;
      failure = std::current_exception();
    }
    bar->finish();
    if (ranks > 1) {
      int any = 0;
      MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
      if (any && !failed) return 1;  // the failing rank reports
    }
    if (failure) std::rethrow_exception(failure);
    if (ranks > 1) rows = gather_rows(rows, rank, ranks);
    if (rank != 0) return 0;
    const Json doc = sweep_document(s, rows);
    if (ranks > 1 && !out->empty()) {
      // The merged journal: the header, then every row in index order.
      std::ofstream f(*out, std::ios::trunc);
      f << Json{{"sweep", doc["sweep"]}}.dump() << "\n";
      for (const Json& r : doc["rows"]) f << r.dump() << "\n";
      if (!f) throw SystemError("write", "cannot write '" + *out + "'");
      f.close();
      for (int r = 0; r < ranks; ++r) std::filesystem::remove(*out + ".rank" + std::to_string(r));
    }
    if (*json) {
      std::cout << doc.dump(1) << "\n";
      return 0;
    }
    if (*csv) {
      std::cout << sweep_csv(doc);
      return 0;
    }
    int ok = 0;
    for (const Json& r : doc["rows"]) ok += r["status"] == "ok";
    std::cout << "sweep: " << s.model << " on " << s.cluster << " varied over "
              << doc["rows"].size() << " points (" << ok << " with a plan";
    if (resumed > 0) std::cout << ", " << resumed << " resumed from " << o.journal;
    if (ranks > 1) std::cout << ", " << ranks << " ranks";
    std::cout << "), global batch " << s.search.gbs << "\n";
    std::cout << (doc["sweep"]["tokens"].is_null()
                      ? "time, GPU-hours, cost and energy: of 1B tokens at the steady step\n"
                      : "time, GPU-hours, cost and energy: of training the --tokens\n");
    print_table(doc);
    if (!out->empty()) std::cout << "\nrows written to " << *out << "\n";
    return 0;
  };
}

}  // namespace parasol::tools
