// The self-contained HTML page of a `parasol sweep` (tools/sweep.h): the document
// {"sweep": header, "rows": [...]} that `sweep --json` prints (or read_sweep_file reads from a
// journal) drawn as a heatmap over two axes of the grid (one metric at a time: tokens/s, time to
// train, cost per trained token, energy; the other axes fixed at a chosen value), the Pareto front
// of cost against time to train over every point with a plan, a panel with one point's best plan
// and the `parasol search` command that reproduces it, and a table of every row. As the plan
// report (report.h): no external resource, the document inlined as JSON and drawn into SVG by an
// inline script, every user string escaped; nothing the sweep computed is recomputed, only the
// front (which points no other point dominates on cost and time, sim/pareto.h) is derived here.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/json_reader.h"
#include "report/sweep_document.h"

namespace parasol::report {

// The whole page: one HTML document with no external resource. The document is inlined in
// <script type="application/json" id="sweep-data"> as {"doc": doc, "front": sweep_pareto_front,
// "cost_key": sweep_cost_key, "grid": sweep_grid}. After load the DOM holds:
//  - the heatmap (svg#hm-svg) of the selected metric (select#hm-metric: tokens_per_s, time_s,
//    cost_per_token, energy_MWh) over the x and y axes (select#hm-x, select#hm-y, default the
//    first two axes; y "none" gives one row), the other axes at select.hm-fix's values (default
//    the first): one rect.hm-cell per (x value, y value) with data-index (the row's "index"; none
//    for a point not in the document) and data-value (the metric, unformatted; none for a point
//    without a plan, class hm-noplan with the reason in a <title>);
//  - the front (svg#pf-svg): one circle.pf-point per row with a plan (data-index), class pf-front
//    too for the rows of sweep_pareto_front, joined by path.pf-step;
//  - div#point-detail: the clicked cell's, point's or table row's point (data-index), its best
//    plan (code.pd-plan, pre.pd-plan-json), figures and the `parasol search` command;
//  - table#sweep-table: one tr.sweep-row per row (data-index), sorted by clicking a header.
// <body> carries data-rendered="ok" once the script ran, data-errors the script errors (0).
// Throws as check_sweep_document.
std::string sweep_html(const Json& doc);

}  // namespace parasol::report
