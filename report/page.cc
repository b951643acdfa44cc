// The report page's stylesheet, markup skeleton and drawing script (see page.h). The script
// builds SVG with createElementNS and sets every text with textContent, so no data string is
// ever parsed as markup. The timeline draws by level of detail (merged spans per pixel, or every
// op in view) from the encoding report.h describes, so a step of a million ops stays responsive.
#include "report/page.h"

namespace parasol::report {

const char* const kPageStyle = R"CSS(
body { font-family: "DejaVu Sans", Arial, sans-serif; margin: 16px 24px; color: #222;
       background: #fff; font-size: 13px; }
h1 { font-size: 20px; margin: 0 0 4px 0; }
h2 { font-size: 16px; margin: 18px 0 4px 0; border-bottom: 1px solid #ccc; padding-bottom: 2px; }
p.sub, p.degrees, p.note { margin: 2px 0; color: #444; }
p.degrees { font-family: "DejaVu Sans Mono", monospace; font-size: 12px; }
.figs { display: flex; flex-wrap: wrap; gap: 8px; margin: 8px 0; }
.fig { border: 1px solid #ddd; border-radius: 4px; padding: 4px 10px; min-width: 150px; }
.fig-name { color: #666; font-size: 11px; }
.fig-value { font-size: 16px; font-weight: bold; }
.fig-note { color: #666; font-size: 11px; }
.row { display: flex; flex-wrap: wrap; gap: 16px; }
.controls button { font-size: 12px; margin-right: 4px; }
svg text { font-size: 11px; fill: #333; }
svg .axis line, svg .axis path { stroke: #888; }
svg .grid, svg .axis line.grid { stroke: #e6e6e6; }
svg .title { font-size: 12px; font-weight: bold; }
svg .cap { stroke: #c00; stroke-dasharray: 5 3; stroke-width: 1.5; }
svg .est { stroke: #333; stroke-dasharray: 2 2; stroke-width: 1.5; }
svg .whisker { stroke: #000; stroke-width: 1.5; }
.legend { display: flex; flex-wrap: wrap; gap: 10px; margin: 4px 0; font-size: 12px; }
.legend span.sw { display: inline-block; width: 11px; height: 11px; margin-right: 4px;
                  vertical-align: -1px; }
table { border-collapse: collapse; font-size: 12px; margin-top: 6px; }
th, td { border: 1px solid #ddd; padding: 2px 6px; text-align: right; }
th { background: #f3f3f3; }
td.l, th.l { text-align: left; }
#tl-wrap { border: 1px solid #ddd; overflow: hidden; }
#tl-info { font-family: "DejaVu Sans Mono", monospace; font-size: 11px; min-height: 14px; }
#errors { color: #c00; white-space: pre-wrap; }
footer { margin-top: 20px; color: #888; font-size: 11px; }
)CSS";

const char* const kErrorCounter = R"JS(
window.addEventListener('error', function (ev) {
  var b = document.body;
  b.setAttribute('data-errors', String(Number(b.getAttribute('data-errors') || 0) + 1));
  var p = document.getElementById('errors');
  if (p) p.textContent += 'script error: ' + ev.message + '\n';
});
)JS";

const char* const kPageBody = R"HTML(
<p id="errors"></p>
<section id="timeline">
<h2>Pipeline timeline (simulated step, one representative rank per stage)</h2>
<div class="controls">
<button id="tl-in" type="button">zoom in</button><button id="tl-out" type="button">zoom out</button>
<button id="tl-left" type="button">&#8592;</button><button id="tl-right" type="button">&#8594;</button>
<button id="tl-reset" type="button">reset</button>
<span class="note">mouse wheel over the timeline zooms around the pointer; drag pans</span>
</div>
<div id="tl-wrap"><svg id="tl-svg"></svg></div>
<div id="tl-legend" class="legend"></div>
<p class="note">Streams of a rank's Program: compute; comm0 its layers' communication (TP, CP,
EP); copy the offload copies; comm1 data-parallel communication; comm2 pipeline sends and
receives. With many ops in view, the ops of a stream closer together than a pixel are drawn as
one span, coloured by the kind that fills most of it and paler where they fill less of it; zoom
in to see every op. The red line is the end of the simulated step.</p>
<p id="tl-info"></p>
</section>
<section id="memory">
<h2>Memory per stage (liveness of each stage's Program) against capacity</h2>
<div class="row"><svg id="mem-svg"></svg>
<svg id="host-svg"></svg></div>
<div id="mem-legend" class="legend"></div>
</section>
<section id="time">
<h2>Where the step time goes, with the error band</h2>
<svg id="time-svg"></svg>
<div id="time-legend" class="legend"></div>
<p class="note" id="band-note"></p>
</section>
)HTML";

const char* const kJobBody = R"HTML(
<section id="job">
<h2>Time to train (the closed-form step, as <code>parasol estimate --tokens</code>)</h2>
<div class="figs" id="job-figs"></div>
<svg id="goodput-svg"></svg>
<div id="goodput-legend" class="legend"></div>
<p class="note" id="job-note"></p>
</section>
)HTML";

const char* const kSearchBody = R"HTML(
<section id="search">
<h2>Search: throughput against memory (Pareto front)</h2>
<svg id="pareto-svg"></svg>
<div id="pareto-legend" class="legend"></div>
<h2>Top plans (closed-form estimate)</h2>
<table id="top-table"></table>
</section>
)HTML";

// Shared by the report's and the sweep's pages, in a script of its own before each page's.
const char* const kChartHelpers = R"JS(
'use strict';
var NS = 'http://www.w3.org/2000/svg';
function el(tag, attrs, parent) {
  var e = document.createElementNS(NS, tag);
  for (var k in attrs) e.setAttribute(k, attrs[k]);
  if (parent) parent.appendChild(e);
  return e;
}
function txt(parent, x, y, s, attrs) {
  var a = attrs || {};
  a.x = x; a.y = y;
  var t = el('text', a, parent);
  t.textContent = s;
  return t;
}
function fmtS(s) {
  if (s >= 1) return s.toFixed(3) + ' s';
  if (s >= 1e-3) return (s * 1e3).toFixed(2) + ' ms';
  return (s * 1e6).toFixed(1) + ' \u00b5s';
}
function pct(f) { return (100 * f).toFixed(1) + '%'; }
// About n round ticks covering [lo, hi].
function ticks(lo, hi, n) {
  var span = hi - lo;
  if (!(span > 0)) return [lo];
  var step = Math.pow(10, Math.floor(Math.log10(span / n)));
  var err = span / n / step;
  if (err >= 7.5) step *= 10; else if (err >= 3.5) step *= 5; else if (err >= 1.5) step *= 2;
  var out = [];
  for (var v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) out.push(v);
  return out;
}
)JS";

const char* const kPageScript = R"JS(
(function () {
'use strict';
var D = JSON.parse(document.getElementById('parasol-data').textContent);
var GiB = 1024 * 1024 * 1024;

function fmtGiB(b) { return (b / GiB).toFixed(b / GiB >= 10 ? 1 : 2) + ' GiB'; }
function fmtCount(n) {
  if (n >= 1e12) return (n / 1e12).toFixed(2) + 'T';
  if (n >= 1e9) return (n / 1e9).toFixed(2) + 'B';
  if (n >= 1e6) return (n / 1e6).toFixed(2) + 'M';
  if (n >= 1e3) return (n / 1e3).toFixed(1) + 'k';
  return n.toFixed(0);
}
// Colours of names not in FIXED (kinds of ops, other groups): none of FIXED's.
var PALETTE = ['#86bcb6', '#a0cbe8', '#ffbe7d', '#499894', '#f1ce63', '#8f6d31', '#79706e',
               '#d4a6c8', '#b6992d', '#fabfd2', '#4b4b8f', '#c9b18f'];
var FIXED = {fwd: '#4e79a7', forward: '#4e79a7', bwd: '#f28e2b', backward: '#f28e2b',
             recompute: '#edc948', optimizer: '#76b7b2', 'tp comm': '#e15759',
             'pp comm': '#59a14f', 'dp comm': '#b07aa1', 'dp-cp comm': '#b07aa1',
             'cp comm': '#ff9da7', 'ep comm': '#9c755f', copy: '#8cd17d', offload: '#8cd17d',
             bubble: '#d9d9d9', overlap: '#d37295', param: '#4e79a7', grad: '#f28e2b',
             activation: '#59a14f', workspace: '#bab0ac',
             'productive steps': '#6a9f58', 'checkpoint writes': '#5778a4',
             'lost work': '#d1615d', restarts: '#e49444', 'planned stops': '#a5a5a5'};
var used = {};
function color(name) {
  if (FIXED[name]) return FIXED[name];
  if (!used[name]) used[name] = PALETTE[Object.keys(used).length % PALETTE.length];
  return used[name];
}
function legend(id, names) {
  var div = document.getElementById(id);
  names.forEach(function (n) {
    var s = document.createElement('span');
    var sw = document.createElement('span');
    sw.className = 'sw';
    sw.style.background = color(n);
    s.appendChild(sw);
    s.appendChild(document.createTextNode(n));
    div.appendChild(s);
  });
}
// A horizontal axis at y from x0 to x1 for values lo..hi.
function xAxis(g, x0, x1, y, lo, hi, label, fmt, gridTop) {
  var a = el('g', {'class': 'axis'}, g);
  el('line', {x1: x0, x2: x1, y1: y, y2: y}, a);
  ticks(lo, hi, 8).forEach(function (v) {
    var x = x0 + (v - lo) / (hi - lo) * (x1 - x0);
    if (gridTop !== undefined) el('line', {'class': 'grid', x1: x, x2: x, y1: gridTop, y2: y}, a);
    el('line', {x1: x, x2: x, y1: y, y2: y + 4}, a);
    txt(a, x, y + 15, fmt(v), {'text-anchor': 'middle'});
  });
  txt(a, (x0 + x1) / 2, y + 30, label, {'text-anchor': 'middle'});
  return a;
}
function yAxis(g, x, y0, y1, lo, hi, label, fmt, gridRight) {
  var a = el('g', {'class': 'axis'}, g);
  el('line', {x1: x, x2: x, y1: y0, y2: y1}, a);
  ticks(lo, hi, 6).forEach(function (v) {
    var y = y0 - (v - lo) / (hi - lo) * (y0 - y1);
    if (gridRight !== undefined) el('line', {'class': 'grid', x1: x, x2: gridRight, y1: y, y2: y}, a);
    el('line', {x1: x - 4, x2: x, y1: y, y2: y}, a);
    txt(a, x - 6, y + 4, fmt(v), {'text-anchor': 'end'});
  });
  txt(a, 0, 0, label, {'text-anchor': 'middle',
                       transform: 'translate(' + (x - 48) + ',' + (y0 + y1) / 2 + ') rotate(-90)'});
  return a;
}

// ---- Timeline ----
// Level of detail (report.h): a row's items are its coarse spans while a pixel covers more than
// coarse.gap ticks, else its ops (parsed from #parasol-ops the first time they are needed). When
// at most draw_limit ops are in view, each is its own rect (class "ev"); else the items of a row
// closer than a pixel are merged into one rect (class "span": the busy time of its ops, coloured
// by the kind with the most of it, paler where the ops fill less of it). Rects are in pixels of
// the plot and drawn again at each zoom or pan; only what is in view is drawn.
function decodeRows(rows, stride) {
  return rows.map(function (flat) {
    var n = flat.length / stride, s = new Float64Array(n), e = new Float64Array(n);
    var c = new Int32Array(n), x = new Float64Array(n), k = new Float64Array(n);
    var t = 0, maxDur = 0;
    for (var i = 0; i < n; ++i) {
      var j = i * stride;
      s[i] = t + flat[j];
      e[i] = s[i] + flat[j + 1];
      t = e[i];
      c[i] = flat[j + 2];
      x[i] = flat[j + 3];
      k[i] = stride > 4 ? flat[j + 4] : 1;
      if (flat[j + 1] > maxDur) maxDur = flat[j + 1];
    }
    return {n: n, s: s, e: e, c: c, x: x, k: k, maxDur: maxDur};
  });
}
// The first index of sorted a[0..n) whose value is >= v.
function lowerBound(a, n, v) {
  var lo = 0, hi = n;
  while (lo < hi) { var m = (lo + hi) >> 1; if (a[m] < v) lo = m + 1; else hi = m; }
  return lo;
}
function drawTimeline() {
  var T = D.timeline, svg = document.getElementById('tl-svg');
  var W = 1140, L = 130, R = 10, top = 24, rowH = 16;
  var rows = T.rows.length, H = top + rows * rowH + 40;
  var PW = W - L - R, PH = rows * rowH;
  var tick = T.tick_s, nCat = T.categories.length;
  var stepT = T.step_time_s / tick;                                   // the end marker
  var end = Math.max(T.end_s / tick, stepT, 1);                       // the drawn span
  var coarse = decodeRows(T.coarse.rows, 5), detail = null;
  function ops() {
    if (!detail) detail = decodeRows(JSON.parse(document.getElementById('parasol-ops').textContent), 4);
    return detail;
  }
  svg.setAttribute('width', W); svg.setAttribute('height', H);
  svg.setAttribute('viewBox', '0 0 ' + W + ' ' + H);
  var title = txt(svg, L, 14, '', {'class': 'title', id: 'tl-title'});
  T.rows.forEach(function (r, i) {
    txt(svg, L - 6, top + i * rowH + 12, r.label, {'text-anchor': 'end', 'class': 'row-label'});
    if (i > 0 && T.rows[i - 1].stage !== r.stage)
      el('line', {x1: 0, x2: L + PW, y1: top + i * rowH, y2: top + i * rowH, stroke: '#999'}, svg);
  });
  var plot = el('svg', {id: 'tl-plot', x: L, y: top, width: PW, height: PH}, svg);
  el('rect', {x: 0, y: 0, width: PW, height: PH, fill: '#fafafa'}, plot);
  var items = el('g', {}, plot);
  // The end marker: outside the plot's clip, so that it shows whole at the plot's right edge.
  var marker = el('line', {id: 'tl-end', y1: top - 3, y2: top + PH + 3, stroke: '#c00',
                           'stroke-width': 2, 'data-t-s': T.step_time_s}, svg);
  el('title', {}, marker).textContent = 'end of the simulated step: ' + fmtS(T.step_time_s);
  legend('tl-legend', T.categories);
  var axis = null, view = [0, end];
  // The axis unit: what keeps the step's ticks short.
  var endS = end * tick;
  var unit = endS >= 2 ? ['s', 1] : endS >= 2e-3 ? ['ms', 1e3] : ['\u00b5s', 1e6];
  function r2(v) { return Math.round(v * 100) / 100; }
  function rect(frag, row, a, b, v0, px, attrs) {
    var x0 = Math.max((a - v0) / px, -1), x1 = Math.min((b - v0) / px, PW + 1);
    attrs.x = r2(x0); attrs.width = r2(Math.max(x1 - x0, 1));
    attrs.y = row * rowH + 2; attrs.height = rowH - 4; attrs['data-r'] = row;
    frag.appendChild(el('rect', attrs));
  }
  // Per pixel column of the row being drawn: busy ticks by category, and ops started.
  var colBusy = new Float64Array(PW * nCat), colN = new Float64Array(PW);
  function drawItems() {
    var v0 = view[0], v1 = view[1], px = (v1 - v0) / PW;
    var src = T.total_events <= T.draw_limit || px < T.coarse.gap ? ops() : coarse;
    function range(R) {
      return [lowerBound(R.s, R.n, v0 - R.maxDur), lowerBound(R.s, R.n, v1 + 0.5)];
    }
    var ranges = src.map(range);
    var inView = 0;
    ranges.forEach(function (g) { inView += g[1] - g[0]; });
    var mode = src === coarse ? 'coarse' : inView <= T.draw_limit ? 'ops' : 'merged';
    var frag = document.createDocumentFragment(), drawn = 0;
    function col(t) { return Math.max(0, Math.min(PW - 1, Math.floor((t - v0) / px))); }
    // Without every op inlined: the coarse spans under the longest ops.
    var layers = src !== coarse && !T.detail.complete ? [coarse, src] : [src];
    layers.forEach(function (S) {
      var isCoarse = S === coarse, single = mode === 'ops' && !isCoarse;
      S.forEach(function (Rw, row) {
        var g = S === src ? ranges[row] : range(Rw);
        // Items first..last (those of them in view) merge into one span [a, b).
        function emit(a, b, first, last) {
          if (!isCoarse && first === last) {
            rect(frag, row, a, b, v0, px,
                 {'class': 'ev', fill: color(T.categories[Rw.c[first]]), 'data-i': first});
            ++drawn;
            return;
          }
          var c0 = col(a), c1 = col(b), c, k;
          colBusy.fill(0, c0 * nCat, (c1 + 1) * nCat);
          colN.fill(0, c0, c1 + 1);
          for (var j = first; j <= last; ++j) {
            var s = Rw.s[j], e = Rw.e[j];
            if (e < v0) continue;
            var busy = isCoarse ? Rw.x[j] : e - s, cat = Rw.c[j];
            colN[col(s)] += Rw.k[j];
            var lo = Math.max(s, v0), hi = Math.min(e, v1);
            if (!(hi > lo) || !(e > s)) { colBusy[col(lo) * nCat + cat] += Math.max(busy, 1e-9); continue; }
            for (c = col(lo); c <= col(hi); ++c) {
              var ov = Math.min(hi, v0 + (c + 1) * px) - Math.max(lo, v0 + c * px);
              if (ov > 0) colBusy[c * nCat + cat] += busy * ov / (e - s);
            }
          }
          // Runs of columns whose busiest kind is the same: one rect each.
          var runStart = c0, runKind = -1, runBusy = 0, runN = 0;
          function flush(cEnd) {
            var ta = Math.max(a, v0 + runStart * px), tb = Math.min(b, v0 + (cEnd + 1) * px);
            var fill = Math.min(1, runBusy / Math.max(tb - ta, 1));
            rect(frag, row, ta, tb, v0, px,
                 {'class': 'span', fill: color(T.categories[runKind]), 'fill-opacity': r2(0.45 + 0.55 * fill),
                  'data-a': Math.round(ta), 'data-b': Math.round(tb), 'data-n': runN,
                  'data-busy': Math.round(runBusy), 'data-c': runKind});
            ++drawn;
          }
          for (c = c0; c <= c1; ++c) {
            var dom = 0, sum = 0;
            for (k = 0; k < nCat; ++k) {
              sum += colBusy[c * nCat + k];
              if (colBusy[c * nCat + k] > colBusy[c * nCat + dom]) dom = k;
            }
            if (sum === 0) dom = runKind >= 0 ? runKind : dom;
            if (runKind >= 0 && dom !== runKind) {
              flush(c - 1);
              runStart = c; runBusy = 0; runN = 0;
            }
            runKind = dom; runBusy += sum; runN += colN[c];
          }
          flush(c1);
        }
        var a = 0, b = 0, first = -1, last = -1;
        for (var i = g[0]; i < g[1]; ++i) {
          var s = Rw.s[i], e = Rw.e[i];
          if (e < v0) continue;
          if (first >= 0 && (single || s - b >= px)) { emit(a, b, first, last); first = -1; }
          if (first < 0) { first = i; a = s; b = e; }
          b = Math.max(b, e);
          last = i;
        }
        if (first >= 0) emit(a, b, first, last);
      });
    });
    var fresh = el('g', {id: 'tl-items'});
    fresh.appendChild(frag);
    plot.replaceChild(fresh, items);
    items = fresh;
    svg.setAttribute('data-mode', mode);
    svg.setAttribute('data-drawn', drawn);
    var mx = (stepT - v0) / px;
    marker.setAttribute('x1', r2(L + mx)); marker.setAttribute('x2', r2(L + mx));
    marker.setAttribute('visibility', mx >= -1 && mx <= PW + 1 ? 'visible' : 'hidden');
    title.textContent = 'simulated step ' + fmtS(T.step_time_s) + ' (red line): ' +
        T.total_events.toLocaleString('en-US') + ' ops on ' + rows + ' streams; ' +
        (mode === 'ops' ? inView.toLocaleString('en-US') + ' in view, each drawn' :
         'ops closer than a pixel drawn as one span (zoom in for single ops)') +
        (T.detail.complete ? '' : '; the longest ' + T.detail.ops.toLocaleString('en-US') +
         ' inlined one by one');
  }
  function redraw() {
    svg.setAttribute('data-view-us', (view[0] * tick * 1e6).toFixed(3) + ',' +
                     (view[1] * tick * 1e6).toFixed(3));
    if (axis) svg.removeChild(axis);
    axis = xAxis(svg, L, L + PW, top + PH, view[0] * tick * unit[1], view[1] * tick * unit[1],
                 'time from the start of the step (' + unit[0] + ')',
                 function (v) { return String(Math.round(v * 1e6) / 1e6); });
    drawItems();
  }
  // Mouse-driven changes are drawn once per frame.
  var pending = false;
  function later() {
    if (pending) return;
    pending = true;
    requestAnimationFrame(function () { pending = false; redraw(); });
  }
  function zoom(f, center, draw) {
    var span = view[1] - view[0], c = center === undefined ? view[0] + span / 2 : center;
    var ns = Math.min(end, Math.max(end * 1e-7, 10, span * f));
    var a = c - (c - view[0]) * ns / span;
    a = Math.max(0, Math.min(end - ns, a));
    view = [a, a + ns];
    (draw || redraw)();
  }
  function pan(f, draw) {
    var span = view[1] - view[0];
    var a = Math.max(0, Math.min(end - span, view[0] + f * span));
    view = [a, a + span];
    (draw || redraw)();
  }
  document.getElementById('tl-in').onclick = function () { zoom(0.5); };
  document.getElementById('tl-out').onclick = function () { zoom(2); };
  document.getElementById('tl-left').onclick = function () { pan(-0.25); };
  document.getElementById('tl-right').onclick = function () { pan(0.25); };
  document.getElementById('tl-reset').onclick = function () { view = [0, end]; redraw(); };
  function timeAt(clientX) {
    var b = plot.getBoundingClientRect();
    return view[0] + (clientX - b.left) / b.width * (view[1] - view[0]);
  }
  plot.addEventListener('wheel', function (ev) {
    ev.preventDefault();
    zoom(ev.deltaY > 0 ? 1.25 : 0.8, timeAt(ev.clientX), later);
  }, {passive: false});
  var drag = null;
  plot.addEventListener('mousedown', function (ev) { drag = ev.clientX; ev.preventDefault(); });
  window.addEventListener('mouseup', function () { drag = null; });
  var info = document.getElementById('tl-info');
  plot.addEventListener('mousemove', function (ev) {
    if (drag !== null) {
      var b = plot.getBoundingClientRect();
      pan(-(ev.clientX - drag) / b.width, later);
      drag = ev.clientX;
    }
    var t = ev.target, r = t.getAttribute('data-r');
    if (r === null) return;
    var label = T.rows[Number(r)].label + ': ';
    if (t.getAttribute('class') === 'ev') {
      var Rw = ops()[Number(r)], i = Number(t.getAttribute('data-i'));
      info.textContent = label + T.names[Rw.x[i]] + ' [' + T.categories[Rw.c[i]] + '] at ' +
          fmtS(Rw.s[i] * tick) + ', ' + fmtS((Rw.e[i] - Rw.s[i]) * tick);
    } else {
      var a = Number(t.getAttribute('data-a')), bb = Number(t.getAttribute('data-b'));
      info.textContent = label + Number(t.getAttribute('data-n')).toLocaleString('en-US') +
          ' ops from ' + fmtS(a * tick) + ' to ' + fmtS(bb * tick) + ', busy ' +
          fmtS(Number(t.getAttribute('data-busy')) * tick) + ', mostly ' +
          T.categories[Number(t.getAttribute('data-c'))];
    }
  });
  redraw();
}

// ---- Memory ----
function drawMemory() {
  var M = D.memory, svg = document.getElementById('mem-svg');
  var W = 620, H = 330, L = 70, R = 150, top = 44, bottom = 50;
  svg.setAttribute('width', W); svg.setAttribute('height', H);
  var n = M.stages.length;
  var peak = 0;
  M.stages.forEach(function (s) { peak = Math.max(peak, s.peak_bytes); });
  var cap = M.device_capacity_bytes;
  var high = Math.max(peak, M.estimate_per_gpu_bytes);
  // Against capacity when the bars would still be readable; else scaled to the data.
  var capOnScale = high >= 0.25 * cap;
  var ymax = (capOnScale ? Math.max(cap, high) : high) * 1.08 || 1;
  var y0 = H - bottom, y1 = top, x0 = L, x1 = W - R;
  var Y = function (b) { return y0 - b / ymax * (y0 - y1); };
  txt(svg, L, 16, 'GPU memory per rank at the peak, by buffer class', {'class': 'title'});
  yAxis(svg, x0, y0, y1, 0, ymax / GiB, 'GiB', function (v) { return v.toFixed(v < 10 ? 1 : 0); }, x1);
  var bw = (x1 - x0) / Math.max(n, 1);
  M.stages.forEach(function (s, i) {
    var x = x0 + i * bw + bw * 0.2, w = bw * 0.6, acc = 0;
    s.peak_by_class_bytes.forEach(function (b, c) {
      if (b <= 0) return;
      var r = el('rect', {'class': 'membar', x: x, y: Y(acc + b), width: w,
                          height: Math.max(0, Y(acc) - Y(acc + b)), fill: color(M.classes[c])}, svg);
      var t = el('title', {}, r);
      t.textContent = 'stage ' + s.stage + ' ' + M.classes[c] + ': ' + fmtGiB(b);
      acc += b;
    });
    txt(svg, x + w / 2, Y(acc) - 4, fmtGiB(s.peak_bytes), {'text-anchor': 'middle'});
    txt(svg, x + w / 2, y0 + 15, 'stage ' + s.stage, {'text-anchor': 'middle'});
  });
  txt(svg, (x0 + x1) / 2, y0 + 32, 'pipeline stage', {'text-anchor': 'middle'});
  if (capOnScale) {
    el('line', {'class': 'cap', x1: x0, x2: x1, y1: Y(cap), y2: Y(cap)}, svg);
    txt(svg, x1 + 4, Y(cap) + 4, 'capacity ' + fmtGiB(cap));
  } else {
    txt(svg, L, 32, 'capacity ' + fmtGiB(cap) + ' is off this scale: the peak is ' +
        pct(high / cap) + ' of it', {fill: '#c00'});
  }
  var e = M.estimate_per_gpu_bytes;
  el('line', {'class': 'est', x1: x0, x2: x1, y1: Y(e), y2: Y(e)}, svg);
  txt(svg, x1 + 4, Y(e) + 4, 'closed form ' + fmtGiB(e));
  txt(svg, x1 + 4, Y(e) + 17, '(incl. runtime buffers)');
  legend('mem-legend', M.classes.concat([]));

  // Host memory: the offloaded bytes of a server against what it can pin, and per stage.
  var hs = document.getElementById('host-svg');
  var HW = 480, HH = 320;
  hs.setAttribute('width', HW); hs.setAttribute('height', HH);
  txt(hs, 10, 16, 'Host memory (offload)', {'class': 'title'});
  var hcap = M.host_capacity_bytes, hused = M.host_per_server_bytes;
  var bx0 = 10, bx1 = HW - 20, by = 40;
  el('rect', {x: bx0, y: by, width: bx1 - bx0, height: 22, fill: '#eee', stroke: '#999'}, hs);
  var frac = hcap > 0 ? Math.min(1, hused / hcap) : 0;
  el('rect', {'class': 'hostbar', x: bx0, y: by, width: (bx1 - bx0) * frac, height: 22,
              fill: hused <= hcap ? '#8cd17d' : '#e15759'}, hs);
  txt(hs, bx0, by + 40, 'per server (closed form): ' + fmtGiB(hused) + ' of ' + fmtGiB(hcap) +
      ' pinnable (' + pct(hcap > 0 ? hused / hcap : 0) + ')' + (hused <= hcap ? '' : ' DOES NOT FIT'));
  txt(hs, bx0, by + 70, 'host bytes per rank (liveness of the Program):');
  M.stages.forEach(function (s, i) {
    txt(hs, bx0 + 12, by + 88 + 16 * i, 'stage ' + s.stage + ': ' + fmtGiB(s.host_bytes));
  });
}

// ---- Time breakdown ----
function drawTime() {
  var svg = document.getElementById('time-svg');
  var E = D.estimate, S = D.simulation;
  var est = [], sim = [];
  var tb = E.time_breakdown_s;
  for (var k in tb) if (tb[k] > 0) est.push([k.replace('_', ' ').replace('overlap slowdown', 'overlap'), tb[k]]);
  var b = S.breakdown_s;
  // One legend for both bars, one name per colour: the simulator's phase and group names as the
  // closed form's (its dp comm runs over the dp x cp group when cp > 1).
  var SAME = {fwd: 'forward', bwd: 'backward', 'dp-cp comm': 'dp comm'};
  function part(name, v) { sim.push([SAME[name] || name, v]); }
  for (var p in b.compute_by_phase) if (b.compute_by_phase[p] > 0) part(p, b.compute_by_phase[p]);
  for (var g in b.exposed_comm) if (b.exposed_comm[g] > 0) part(g + ' comm', b.exposed_comm[g]);
  if (b.exposed_offload > 0) sim.push(['offload', b.exposed_offload]);
  if (b.host_bound > 0) sim.push(['host bound', b.host_bound]);
  if (b.bubble > 0) sim.push(['bubble', b.bubble]);
  var bars = [['closed-form estimate', est, E.step_time_s, D.band],
              ['simulator (stage ' + S.critical_stage + ')', sim, S.step_time_s, S.band]];
  var W = 1140, L = 170, R = 30, top = 30, bh = 34, gap = 26;
  var H = top + bars.length * (bh + gap) + 40;
  svg.setAttribute('width', W); svg.setAttribute('height', H);
  var tmax = 0;
  bars.forEach(function (x) { tmax = Math.max(tmax, x[3].high_s, x[2]); });
  tmax *= 1.05;
  var X = function (s) { return L + s / tmax * (W - L - R); };
  txt(svg, L, 16, 'step time by part (the simulator\'s parts: its critical stage; whisker: error band)',
      {'class': 'title'});
  var names = [];
  bars.forEach(function (bar, i) {
    var y = top + i * (bh + gap), acc = 0;
    txt(svg, L - 8, y + bh / 2 + 4, bar[0], {'text-anchor': 'end'});
    bar[1].forEach(function (part) {
      if (names.indexOf(part[0]) < 0) names.push(part[0]);
      var r = el('rect', {'class': 'timebar', x: X(acc), y: y, width: X(acc + part[1]) - X(acc),
                          height: bh, fill: color(part[0])}, svg);
      el('title', {}, r).textContent = part[0] + ': ' + fmtS(part[1]) + ' (' + pct(part[1] / bar[2]) + ')';
      acc += part[1];
    });
    var band = bar[3], ym = y + bh / 2;
    el('line', {'class': 'whisker', x1: X(band.low_s), x2: X(band.high_s), y1: ym, y2: ym}, svg);
    el('line', {'class': 'whisker', x1: X(band.low_s), x2: X(band.low_s), y1: y + 4, y2: y + bh - 4}, svg);
    el('line', {'class': 'whisker', x1: X(band.high_s), x2: X(band.high_s), y1: y + 4, y2: y + bh - 4}, svg);
    txt(svg, X(band.high_s) + 4, y - 3, fmtS(bar[2]) + ' \u00b1 ' + pct(band.fraction) + ' (' +
        fmtS(band.low_s) + ' - ' + fmtS(band.high_s) + ')', {'text-anchor': 'end'});
  });
  var unit = tmax >= 2 ? ['seconds', 1] : tmax >= 2e-3 ? ['milliseconds', 1e3] : ['microseconds', 1e6];
  xAxis(svg, L, W - R, top + bars.length * (bh + gap) - gap + 6, 0, tmax * unit[1], unit[0],
        function (v) { return String(Math.round(v * 1e6) / 1e6); });
  legend('time-legend', names);
  var note = D.band.validated ? 'error band: the largest rms error of the accuracy suites this plan draws on (' +
      D.band.families.join(', ') + ')' : 'unvalidated: ' + (D.band.unvalidated_reason || '');
  document.getElementById('band-note').textContent = note;
}

// ---- Time to train ----
// A duration as the command line writes it (tools/job_flags.cc): days, hours, minutes, seconds.
function fmtDur(s) {
  if (!isFinite(s)) return 'never';
  if (s >= 86400) return (s / 86400).toFixed(1) + ' days';
  if (s >= 3600) return (s / 3600).toFixed(2) + ' h';
  if (s >= 60) return (s / 60).toFixed(1) + ' min';
  return fmtS(s);
}
function figure(parent, id, name, value, note, raw) {
  var f = document.createElement('div');
  f.className = 'fig';
  f.id = id;
  [['fig-name', name], ['fig-value', value], ['fig-note', note]].forEach(function (x) {
    var d = document.createElement('div');
    d.className = x[0];
    d.textContent = x[1];
    f.appendChild(d);
  });
  // The figure's number unformatted, as inlined (the render test compares it with `estimate`'s).
  if (raw !== undefined) f.setAttribute('data-value', String(raw));
  parent.appendChild(f);
}
function drawJob() {
  var J = D.job, C = J.checkpoint, R = J.reliability;
  var figs = document.getElementById('job-figs');
  figure(figs, 'job-wall', 'wall-clock time', fmtDur(J.time_to_train_s),
         fmtCount(J.tokens) + ' tokens in ' + fmtCount(J.steps) + ' steps', J.time_to_train_s);
  figure(figs, 'job-gpu-hours', 'GPU-hours', fmtCount(J.gpu_hours), D.gpus + ' GPUs', J.gpu_hours);
  figure(figs, 'job-energy', 'energy (facility)', J.energy_MWh.toFixed(1) + ' MWh',
         'IT power x PUE ' + J.power.pue, J.energy_MWh);
  if (J.cost !== undefined)
    figure(figs, 'job-cost', 'cost', fmtCount(J.cost), 'at ' + J.price_per_gpu_hour +
           ' per GPU-hour', J.cost);
  else
    figure(figs, 'job-cost', 'cost', '-', 'no --price-per-gpu-hour');
  figure(figs, 'job-goodput', 'goodput', pct(J.goodput), 'expected step ' +
         fmtS(J.expected_step_time_s) + ' (step ' + fmtS(J.step_time_s) + ')', J.goodput);
  figure(figs, 'job-interruptions', 'interruptions', J.interruptions.toFixed(J.interruptions < 10 ? 1 : 0) + ' expected',
         'MTBI ' + fmtDur(R.mtbi_h * 3600) + ', ' + R.interruptions_per_day.toFixed(1) +
         ' a day; restart ' + fmtDur(J.restart_s), J.interruptions);
  figure(figs, 'job-checkpoint', 'checkpoint interval', fmtDur(C.interval_s),
         'every ' + fmtCount(C.interval_steps) + ' steps (' + (C.interval_source === 'given' ?
         '--checkpoint-interval' : 'Daly\'s optimum') + '); write ' + fmtS(C.write_s),
         C.interval_s);

  // The goodput breakdown: where the wall-clock time goes, one stacked bar.
  var parts = [['productive steps', J.breakdown_s.productive],
               ['checkpoint writes', J.breakdown_s.checkpoint],
               ['lost work', J.breakdown_s.lost_work],
               ['restarts', J.breakdown_s.restart],
               ['planned stops', J.breakdown_s.planned_restart]];
  var total = J.time_to_train_s;
  var svg = document.getElementById('goodput-svg');
  var W = 1140, L = 10, R = 10, top = 24, bh = 34;
  svg.setAttribute('width', W); svg.setAttribute('height', top + bh + 10);
  txt(svg, L, 16, 'where the ' + fmtDur(total) + ' go (goodput ' + pct(J.goodput) + ')',
      {'class': 'title'});
  var X = function (s) { return L + s / total * (W - L - R); }, acc = 0;
  var div = document.getElementById('goodput-legend');
  parts.forEach(function (p) {
    var s = document.createElement('span'), sw = document.createElement('span');
    sw.className = 'sw';
    sw.style.background = color(p[0]);
    s.appendChild(sw);
    s.appendChild(document.createTextNode(p[0] + ' ' + fmtDur(p[1]) + ' (' + pct(p[1] / total) + ')'));
    div.appendChild(s);
    if (!(p[1] > 0)) return;
    var w = X(acc + p[1]) - X(acc);
    var r = el('rect', {'class': 'goodbar', x: X(acc), y: top, width: w, height: bh,
                        fill: color(p[0]), 'data-part': p[0]}, svg);
    el('title', {}, r).textContent = p[0] + ': ' + fmtDur(p[1]) + ' (' + pct(p[1] / total) + ')';
    if (w > 60) txt(svg, X(acc) + w / 2, top + bh / 2 + 4, pct(p[1] / total),
                    {'text-anchor': 'middle', fill: '#fff'});
    acc += p[1];
  });
  var by = [];
  for (var c in R.by_component) if (R.by_component[c].per_day > 0)
    by.push(c + ' ' + R.by_component[c].per_day.toFixed(2));
  document.getElementById('job-note').textContent = 'Checkpoint ' +
      C.size.total_GB.toFixed(C.size.total_GB >= 10 ? 0 : 2) + ' GB (' +
      C.size.max_rank_GB.toFixed(2) + ' GB per rank at most) at ' + C.storage_GBps.toFixed(0) +
      ' GB/s: write ' + fmtS(C.write_s) + ', read ' + fmtS(C.read_s) + ' at each restart (Young ' +
      fmtDur(C.young_interval_s) + ', Daly ' + fmtDur(C.daly_interval_s) + '). Interruptions a day by component: ' + (by.length ? by.join(', ') : 'none') +
      (J.planned_stops > 0 ? '; ' + J.planned_stops.toFixed(0) + ' planned stops' : '') + '.';
}

// ---- Search ----
function planLabel(p) {
  return 'tp' + p.tp + ' pp' + p.pp + ' dp' + p.dp + ' cp' + p.cp + ' ep' + p.ep +
         ' mbs' + p.mbs + ' ' + p.schedule + (p.vpp > 1 ? p.vpp : '') + ' z' + p.zero +
         ' rc:' + p.recompute + ' off:' + p.offload;
}
function drawSearch() {
  var S = D.search, svg = document.getElementById('pareto-svg');
  var W = 1140, H = 380, L = 90, R = 30, top = 30, bottom = 50;
  svg.setAttribute('width', W); svg.setAttribute('height', H);
  var pts = S.top.map(function (c) { return [c.estimate.memory_per_gpu_bytes, c.estimate.tokens_per_s]; })
      .concat(S.pareto.map(function (c) { return [c.memory_per_gpu_bytes, c.tokens_per_s]; }));
  var mx = 0, my = 0, mn = Infinity;
  pts.forEach(function (p) { mx = Math.max(mx, p[0]); my = Math.max(my, p[1]); mn = Math.min(mn, p[0]); });
  var xlo = Math.max(0, mn - (mx - mn) * 0.1) / GiB, xhi = (mx + (mx - mn) * 0.1) / GiB || 1;
  if (xhi <= xlo) { xhi = xlo * 1.1 + 0.1; }
  var yhi = my * 1.1 || 1;
  var x0 = L, x1 = W - R, y0 = H - bottom, y1 = top;
  var X = function (b) { return x0 + (b / GiB - xlo) / (xhi - xlo) * (x1 - x0); };
  var Y = function (t) { return y0 - t / yhi * (y0 - y1); };
  txt(svg, L, 16, 'tokens/s against memory per GPU: ' + S.pareto.length + ' plans on the Pareto front, ' +
      S.top.length + ' top plans', {'class': 'title'});
  xAxis(svg, x0, x1, y0, xlo, xhi, 'memory per GPU (GiB)', function (v) { return String(Math.round(v * 100) / 100); }, y1);
  yAxis(svg, x0, y0, y1, 0, yhi, 'tokens/s', fmtCount, x1);
  var front = S.pareto.slice().sort(function (a, b) { return a.memory_per_gpu_bytes - b.memory_per_gpu_bytes; });
  if (front.length > 1) {
    var d = '';
    front.forEach(function (c, i) {
      d += (i ? ' L' : 'M') + X(c.memory_per_gpu_bytes) + ' ' + Y(c.tokens_per_s);
    });
    el('path', {d: d, fill: 'none', stroke: '#e15759', 'stroke-width': 1.5}, svg);
  }
  S.top.forEach(function (c, i) {
    var e = el('circle', {'class': 'top-pt', cx: X(c.estimate.memory_per_gpu_bytes),
                          cy: Y(c.estimate.tokens_per_s), r: i === 0 ? 7 : 5, fill: 'none',
                          stroke: '#4e79a7', 'stroke-width': i === 0 ? 2.5 : 1.5}, svg);
    el('title', {}, e).textContent = '#' + (i + 1) + ' ' + planLabel(c.plan) + ': ' +
        fmtCount(c.estimate.tokens_per_s) + ' tokens/s, ' + fmtGiB(c.estimate.memory_per_gpu_bytes);
  });
  S.pareto.forEach(function (c) {
    var e = el('circle', {'class': 'pareto-pt', cx: X(c.memory_per_gpu_bytes), cy: Y(c.tokens_per_s),
                          r: 3.5, fill: '#e15759'}, svg);
    el('title', {}, e).textContent = planLabel(c.plan) + ': ' + fmtCount(c.tokens_per_s) +
        ' tokens/s, ' + fmtGiB(c.memory_per_gpu_bytes);
  });
  if (S.top.length) {
    var b = S.top[0];
    txt(svg, X(b.estimate.memory_per_gpu_bytes) + 9, Y(b.estimate.tokens_per_s) - 6, 'best (#1)');
  }
  var lg = document.getElementById('pareto-legend');
  [['#e15759', 'Pareto front (filled)'], ['#4e79a7', 'top plans (rings; #1 thick)']].forEach(function (x) {
    var s = document.createElement('span'), sw = document.createElement('span');
    sw.className = 'sw'; sw.style.background = x[0];
    s.appendChild(sw); s.appendChild(document.createTextNode(x[1])); lg.appendChild(s);
  });

  var table = document.getElementById('top-table');
  var cols = ['#', 'tp', 'pp', 'dp', 'cp', 'ep', 'sp', 'schedule', 'mbs', 'recompute', 'offload',
              'ZeRO', 'step', 'band', 'tokens/s', 'MFU', 'mem/GPU', 'simulated'];
  var train = S.top.length > 0 && S.top[0].job !== undefined;
  if (train) cols.push('train (days, goodput)');
  var tr = document.createElement('tr');
  cols.forEach(function (c) { var th = document.createElement('th'); th.textContent = c; tr.appendChild(th); });
  table.appendChild(tr);
  S.top.forEach(function (c, i) {
    var p = c.plan, e = c.estimate;
    var rc = p.recompute + (p.recompute_layers !== undefined && p.recompute_layers >= 0 ? ':' + p.recompute_layers : '');
    var cells = [i + 1, p.tp, p.pp, p.dp, p.cp, p.ep, p.sp ? 'on' : 'off',
                 p.schedule + (p.vpp > 1 ? ' ' + p.vpp : ''), p.mbs, rc, p.offload, p.zero,
                 fmtS(e.step_time_s), c.band.validated ? '\u00b1 ' + pct(c.band.fraction) : 'unvalidated',
                 fmtCount(e.tokens_per_s), pct(e.mfu), fmtGiB(e.memory_per_gpu_bytes),
                 c.simulated_step_time_s ? fmtS(c.simulated_step_time_s) : ''];
    if (train) cells.push(c.job.time_to_train_days.toFixed(1) + ' d ' + pct(c.job.goodput));
    var row = document.createElement('tr');
    row.className = 'top-row';
    cells.forEach(function (v, j) {
      var td = document.createElement('td');
      td.textContent = String(v);
      if (j === 7 || j === 9 || j === 10) td.className = 'l';
      row.appendChild(td);
    });
    table.appendChild(row);
  });
}

drawTimeline();
drawMemory();
drawTime();
if (D.job) drawJob();
if (D.search) drawSearch();
document.body.setAttribute('data-rendered', 'ok');
})();
)JS";

}  // namespace parasol::report
