// A `parasol sweep` document ({"sweep": header, "rows": [...]}, tools/sweep.h) as the sweep's page
// (sweep_page.h) reads it: its checks, and what the page derives from it without recomputing the
// sweep: the cost axis of the front, the Pareto front of cost against time to train
// (sim/pareto.h), and the grid of its points (sim/what_if_cluster.h numbers them).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/json_reader.h"

namespace parasol::report {

// Whether a row of the document has a plan (its "status" is "ok").
bool sweep_row_has_plan(const Json& row);

// A number of a planned row's "train" object (time to train, tokens, ...), by key.
double sweep_train_number(const Json& row, const char* key);

// What the front's cost axis is: "cost" (train.cost) when every row with a plan has a price,
// else "gpu_hours" (train.gpu_hours: what the cost would be per unit price).
// REQUIRES: `doc` passed check_sweep_document.
std::string sweep_cost_key(const Json& doc);

// The rows with a plan on the Pareto front of cost (sweep_cost_key) against train.time_s, both
// lower-better: those that no other row with a plan dominates (no more cost and no more time, and
// less of one). Rows equal on both are all on it. Returns their "index" fields, by time, then
// cost, then index. REQUIRES: `doc` passed check_sweep_document.
std::vector<int64_t> sweep_pareto_front(const Json& doc);

// The grid of the sweep's points: for each point of the axes' product (its flat index, first
// axis slowest, as sim/what_if_cluster.h numbers points), the position in doc["rows"] of the row
// whose "point" holds those values, or -1 when the document has none (an unfinished journal). The
// heatmap's cells are the points of this grid along its two axes. REQUIRES: as sweep_cost_key.
std::vector<int64_t> sweep_grid(const Json& doc);

// Throws parasol::Error naming `field` ("report.sweep" for the command) when `doc` is not a sweep
// document: a "sweep" object with "axes" [{"key", "values": [...]}], a "rows" array of objects
// each with an integer "index", a "point" object and a "status"; an "ok" row needs the numbers
// step_time_s, tokens_per_s, mfu, memory_per_gpu_bytes and train.{time_s, gpu_hours, energy_MWh,
// tokens} (train.cost a number or null).
void check_sweep_document(const Json& doc, const std::string& field = "report.sweep");

}  // namespace parasol::report
