// `parasol sweep`: what-if clusters. A grid of clusters and jobs (axes over the cluster
// generator's fields, the GPU count, the model, the global batch and the sequence length), the
// full plan search at every point (tools/api.h run_search, as `parasol search` runs it), and one
// row per point: the best plan, its step time and band, tokens/s, MFU, memory, and the time,
// GPU-hours, cost and energy of training (the given --tokens, or 1e9 tokens at the steady step).
//
// A point's cluster is a generator JSON (core/cluster.h): the base cluster's (a server preset's
// cluster_preset_generator, or a generator file) with the point's axis values set. Two rules keep
// a point a cluster someone could build:
//  - varying `device` from a preset base takes the servers that hold that device
//    (cluster_preset_for_device: DGX B200's NVLink5 and host for B200), unless the preset's
//    figures are themselves axes; a generator file's figures stay as written;
//  - varying `gpus_per_server` keeps the base's figures per GPU: NICs, host memory and CPU
//    sockets scale with it (unless they are axes), and a GPU count that is not a whole number
//    of servers leaves the last server partly used ("partial_last_server"); unless another
//    product of the device's silicon comes in servers of that size, whose servers it then takes
//    (core/sibling_presets.h: 72 per server on a B200 base is the GB200 NVL72 rack; one per
//    server on DGX H200 stays DGX H200's servers per GPU, not the h200-1 box).
//
// The runner is process-agnostic: it takes this process's share (rank of ranks) of the points,
// runs them on threads, and appends each finished row to a journal (JSON Lines) so that an
// interrupted sweep resumes without recomputing finished points. tools/sweep_cmd.cc adds MPI.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "core/json_reader.h"
#include "tools/api.h"

namespace parasol::tools {

// One axis: a key (sweep_axis_keys()) and its values, as JSON (numbers or strings).
struct SweepAxis {
  std::string key;
  std::vector<Json> values;
};

// The keys an axis may vary: "cluster" (a server preset), "gpus", "model", "gbs", "seq", and the
// rail / fat-tree generator's fields ("device", "gpus_per_server", "nvlink_GBps", "nic_GBps",
// "nics_per_server", "oversubscription", "servers_per_leaf", "host_memory_GiB", ...).
const std::vector<std::string>& sweep_axis_keys();

// "KEY=V1,V2,..." where each numeric item may be a range "START:STOP:STEP" (inclusive) or a
// geometric one "START:STOP:xFACTOR". Throws parasol::Error naming "--vary KEY" (or "--vary"
// when the key is missing) and the value.
SweepAxis parse_sweep_axis(const std::string& text);

struct SweepSpec {
  std::string model = "gpt3-175b";       // preset or path
  std::string cluster = "dgx-a100-80g";  // server preset or generator JSON file
  Json base_cluster;                     // its generator JSON
  bool base_is_preset = true;
  int gpus = 1024;
  std::string profile;  // profile file; "" = defaults
  std::vector<SweepAxis> axes;
  SearchSettings search;  // gbs, seq, framework, robust, simulate_top, precision, job flags
  std::map<std::string, double> device_price;  // per-device price per GPU-hour (over the flag's)
};

// Finishes a spec: reads the base cluster, checks every axis (a known key, at least one value,
// no key twice, each value in its field's range: the generator's own checks) and the point
// count (at most 100,000), and that each axis value leaves some point able to hold the model's
// training state. Throws parasol::Error naming "--vary KEY" and the value.
void prepare_sweep(SweepSpec& spec);

// The sweep as a JSON file: {"model", "cluster" (a preset name, a path or a generator object),
// "gpus", "gbs", "seq", "precision", "framework", "robust", "simulate_top", "no_offload",
// "tokens", "price_per_gpu_hour", "device_price": {DEVICE: price}, "vary": {KEY: [values] or
// "range text"} (axes in key order) or [{"key": KEY, "values": [values] or "range text"}] (axes
// in that order)}. Keys are checked as the flags are.
SweepSpec sweep_from_json(const Json& j, const std::string& path);

// The number of points and the axis values of point `index` (first axis slowest).
int64_t sweep_point_count(const SweepSpec& spec);
Json sweep_point_values(const SweepSpec& spec, int64_t index);

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

struct SweepRunOptions {
  int threads = 0;          // 0: all cores
  int rank = 0, ranks = 1;  // this process's share: points with index % ranks == rank
  std::string journal;      // JSON Lines file written as points finish; "" = none
  bool resume = false;      // read the journal and skip its finished points
  // Called (under a lock, from the workers) after each point: points done, points in this share.
  std::function<void(int64_t, int64_t)> progress;
};

// Runs this process's share of the points and returns its rows, in index order. With a journal:
// a fresh one starts with the header line; with resume, the journal must hold the same sweep
// (its header), its finished rows are kept, a torn last line is dropped, and the rest appended.
// Returns the resumed count through `resumed` when given. Throws parasol::Error naming
// "--resume" for a journal of another sweep.
std::vector<Json> run_sweep(const SweepSpec& spec, const SweepRunOptions& options,
                            int64_t* resumed = nullptr);

// `parasol sweep --json`: {"sweep": header, "rows": [...]} with rows in index order.
Json sweep_document(const SweepSpec& spec, std::vector<Json> rows);
// Reads a sweep document or a journal (header line, then rows) into a document. Throws
// parasol::Error naming the path.
Json read_sweep_file(const std::string& path);
// `parasol sweep --csv`.
std::string sweep_csv(const Json& document);

// `parasol.sweep({...})`: the keys of sweep_from_json plus "threads"; returns the document.
Json sweep_request(const Json& request);

}  // namespace parasol::tools
