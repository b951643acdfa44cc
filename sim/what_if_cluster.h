// What-if clusters: the grid of a `parasol sweep` (sim/sweep.h runs it, tools/sweep.h searches
// each point). Axes over the cluster generator's fields, the GPU count, the model, the global
// batch and the sequence length; the numbering of the grid's points; the cluster of each point.
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
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/cluster.h"
#include "core/device.h"
#include "core/json_reader.h"
#include "core/model.h"

namespace parasol::sim {

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
// The axis `key` of a sweep file: `v` an array of values or a range text as after "KEY=". Throws
// parasol::Error naming `path` (or "--vary KEY").
SweepAxis sweep_axis_from_json(const std::string& key, const Json& v, const std::string& path);
// An axis value as the user wrote it: "B200", "8", "12.5".
std::string sweep_value_text(const Json& v);

// The grid: the job and the base cluster every point starts from, and the axes.
struct WhatIfGrid {
  std::string model = "gpt3-175b";       // preset or path
  std::string cluster = "dgx-a100-80g";  // server preset or generator JSON file
  Json base_cluster;                     // its generator JSON (prepare_what_if)
  bool base_is_preset = true;
  int gpus = 1024;
  std::vector<SweepAxis> axes;
};

// Finishes a grid: reads the base cluster, checks every axis (a known key, at least one value,
// no key twice, each value in its field's range: the generator's own checks) and the point
// count (at most 100,000), and that each axis value leaves some point able to hold the model's
// training state (in `precision`, GPU memory with host memory when `offload`). Throws
// parasol::Error naming "--vary KEY" and the value.
void prepare_what_if(WhatIfGrid& grid, Dtype precision, bool offload);

// The numbering of a grid's points, axes of `sizes` values each, the first axis slowest: the
// number of points, the position on each axis of point `index`, and the index of a point.
int64_t grid_point_count(const std::vector<int64_t>& sizes);
std::vector<int64_t> grid_positions(const std::vector<int64_t>& sizes, int64_t index);
int64_t grid_index(const std::vector<int64_t>& sizes, const std::vector<int64_t>& positions);

// The number of points and the axis values of point `index` ({KEY: value}).
int64_t sweep_point_count(const WhatIfGrid& grid);
Json sweep_point_values(const WhatIfGrid& grid, int64_t index);

// The point's cluster as a generator JSON (without its GPU count), its GPU count and its model
// (preset or path). REQUIRES: prepare_what_if(grid) ran; `values` from sweep_point_values.
Json point_cluster(const WhatIfGrid& grid, const Json& values);
int point_gpus(const WhatIfGrid& grid, const Json& values);
std::string point_model(const WhatIfGrid& grid, const Json& values);

// The cluster's GPU memory, with its host memory when `offload` (bytes).
double memory_capacity(const Cluster& c, bool offload);
// A model's training state in `precision` (bytes): the weights, gradients and optimizer state
// of one replica as the memory model holds them (cost::memory_per_rank of the plan with every
// degree 1; mixed-precision Adam: 18 bytes per parameter).
double training_state_bytes(const Model& m, const Cluster& c, Dtype precision);
// Whether memory_capacity is at least the training state: below it no plan can fit, whatever
// its sharding.
bool can_hold(const Cluster& c, const Model& m, Dtype precision, bool offload);

}  // namespace parasol::sim
