// The parasol subcommands. Each registers its flags on the app and returns the exit code when
// run; user errors throw parasol::Error (printed by main, exit 2).
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <string>
#include <vector>

#include "core/cluster.h"
#include "core/model.h"
#include "core/plan.h"
#include "cost_models/framework_memory.h"
#include "cost_models/profile.h"
#include "interop/interop.h"
#include "tools/host_probe.h"

namespace parasol::tools {

using Runner = std::function<int()>;

// tools/estimate_cmd.cc: one rank's peak as the framework measures it (allocated, reserved with
// its band, outside the allocator), naming its stage and rank (stage -1: not named); and every
// stage's peak, the largest marked.
void print_framework_memory(const cost::FrameworkMemory& f, int stage, int rank);
// The device verdict on `f` against `device_bytes`: "fits"; "fits; not with reserved at the top
// of its band ...: the search drops it" (`fit`, cost::memory_fit, is kNotByReserved); "DOES NOT
// FIT by the reserved figure: allocated ... fits, reserved ... does not"; or "DOES NOT FIT".
std::string memory_fit_verdict(const cost::FrameworkMemory& f, cost::MemoryFit fit,
                               double device_bytes);
void print_stage_memory(const std::vector<cost::FrameworkMemory>& stages, int peak);

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
// `chakra`: what `export --to chakra` writes (main.cc passes traces/chakra_export.h's files, so
// that protobuf stays out of this library; without it `--to chakra` is an error).
using ChakraExport = std::function<std::vector<interop::ExportedFile>(
    const Model&, const Cluster&, const Plan&, const cost::Profile&)>;
Runner add_export(CLI::App& app, ChakraExport chakra = {});
Runner add_report(CLI::App& app);
// tools/sweep_cmd.cc (with MPI: a sweep under mpirun shares its points among the ranks).
Runner add_sweep(CLI::App& app);
// tools/trace_cmd.cc: `trace import`.
Runner add_trace(CLI::App& app);

}  // namespace parasol::tools
