// `parasol sweep`: what-if clusters. A grid of clusters and jobs (sim/what_if_cluster.h: axes over
// the cluster generator's fields, the GPU count, the model, the global batch and the sequence
// length, and the cluster of each point), the full plan search at every point (tools/api.h
// run_search, as `parasol search` runs it), and one row per point: the best plan, its step time
// and band, tokens/s, MFU, memory, and the time, GPU-hours, cost and energy of training (the given
// --tokens, or 1e9 tokens at the steady step).
//
// The runner (sim/sweep.h) is process-agnostic: it takes this process's share (rank of ranks) of
// the points, runs them on threads, and appends each finished row to a journal (JSON Lines) so
// that an interrupted sweep resumes without recomputing finished points. tools/sweep_cmd.cc adds
// MPI.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "core/json_reader.h"
#include "sim/sweep.h"
#include "sim/what_if_cluster.h"
#include "tools/api.h"

namespace parasol::tools {

using sim::parse_sweep_axis;
using sim::read_sweep_file;
using sim::sweep_axis_keys;
using sim::sweep_point_count;
using sim::sweep_point_values;
using sim::SweepAxis;
using sim::SweepRunOptions;

// The grid (model, cluster, gpus, axes) and what each point's search is given.
struct SweepSpec : sim::WhatIfGrid {
  std::string profile;    // profile file; "" = defaults
  SearchSettings search;  // gbs, seq, framework, robust, simulate_top, precision, job flags
  std::map<std::string, double> device_price;  // per-device price per GPU-hour (over the flag's)
};

// Finishes a spec: sim::prepare_what_if of its grid, the training state in the search's
// precision, host memory counted unless search.no_offload. Throws parasol::Error naming
// "--vary KEY" and the value.
void prepare_sweep(SweepSpec& spec);

// The sweep as a JSON file: {"model", "cluster" (a preset name, a path or a generator object),
// "gpus", "gbs", "seq", "precision", "framework", "robust", "simulate_top", "no_offload",
// "tokens", "price_per_gpu_hour", "device_price": {DEVICE: price}, "vary": {KEY: [values] or
// "range text"} (axes in key order) or [{"key": KEY, "values": [values] or "range text"}] (axes
// in that order)}. Keys are checked as the flags are.
SweepSpec sweep_from_json(const Json& j, const std::string& path);

// The search request of a point (tools/api.h search_request's keys, "cluster" a generator
// object): what `parasol search` is given to find the same best plan.
Json sweep_point_request(const SweepSpec& spec, int64_t index);

// Runs the search of one point with `threads` threads and returns its row:
// {"index", "point": {KEY: value}, "model", "device", "gpus", "servers", "gbs", "seq",
//  "cluster": generator JSON, "status": "ok" | "no_plan", "reason" (no_plan),
//  "plan" (compact), "best_plan", "step_time_s", "band", "tokens_per_s", "mfu",
//  "memory_per_gpu_bytes", "simulated_step_time_s" (with simulate_top), "train": {"basis":
//  "tokens" | "steady", "tokens", "time_s", "gpu_hours", "energy_MWh", "cost",
//  "price_per_gpu_hour", "goodput"}, "enumerated", "fitting", "search_s"}.
// A point where no plan fits is a "no_plan" row, not an error.
Json run_sweep_point(const SweepSpec& spec, int64_t index, int threads);

// The header line of a sweep's journal: the settings that decide its rows.
Json sweep_header(const SweepSpec& spec);

// Runs this process's share of the points (sim::run_sweep_points with sweep_header and
// run_sweep_point) and returns its rows, in index order.
std::vector<Json> run_sweep(const SweepSpec& spec, const SweepRunOptions& options,
                            int64_t* resumed = nullptr);

// `parasol sweep --json`: {"sweep": header, "rows": [...]} with rows in index order.
Json sweep_document(const SweepSpec& spec, std::vector<Json> rows);
// `parasol sweep --csv`.
std::string sweep_csv(const Json& document);

// `parasol.sweep({...})`: the keys of sweep_from_json plus "threads"; returns the document.
Json sweep_request(const Json& request);

}  // namespace parasol::tools
