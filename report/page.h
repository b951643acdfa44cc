// The fixed parts of the report page: its stylesheet, its markup skeleton and the script that
// draws the charts from the inlined data (report.h documents the data). No external resource.
#pragma once

namespace parasol::report {

extern const char* const kPageStyle;     // CSS
extern const char* const kErrorCounter;  // script run first: counts errors in body[data-errors]
extern const char* const kPageBody;      // sections: timeline, memory, time breakdown
extern const char* const kJobBody;       // section with a token count: time to train, goodput
extern const char* const kSearchBody;    // section of a search: Pareto plot and top plans
// Script before a page's own (report and sweep pages): NS, el, txt (SVG elements), fmtS, pct,
// ticks (round axis ticks), as globals.
extern const char* const kChartHelpers;
// Draws every section from <script id="parasol-data">, then sets body[data-rendered="ok"].
extern const char* const kPageScript;

}  // namespace parasol::report
