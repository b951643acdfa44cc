// The parasol subcommands. Each registers its flags on the app and returns the exit code when
// run; user errors throw parasol::Error (printed by main, exit 2).
#pragma once

#include <CLI/CLI.hpp>
#include <functional>

#include "tools/host_probe.h"

namespace parasol::tools {

using Runner = std::function<int()>;

Runner add_show(CLI::App& app);
Runner add_validate(CLI::App& app);
Runner add_estimate(CLI::App& app);
Runner add_simulate(CLI::App& app);
Runner add_search(CLI::App& app);
Runner add_accuracy(CLI::App& app);
Runner add_compare(CLI::App& app);
// `probe`: what --probe runs (tools/link_probe.h adds the MPI link; default: the CPU alone).
Runner add_calibrate(CLI::App& app, PeerProbe probe = {});
Runner add_run(CLI::App& app);
Runner add_export(CLI::App& app);
Runner add_report(CLI::App& app);
// tools/sweep_cmd.cc (with MPI: a sweep under mpirun shares its points among the ranks).
Runner add_sweep(CLI::App& app);
// tools/trace_cmd.cc: `trace import`.
Runner add_trace(CLI::App& app);

}  // namespace parasol::tools
