// The sweep's page (sweep_page.h): the header in escaped markup, and the script that draws the
// heatmap, the front, the point panel and the table from the inlined document. As page.cc's script,
// it builds SVG with createElementNS and sets every text with textContent, so no data string is
// ever parsed as markup.
#include "report/sweep_page.h"

#include <string>

#include "core/format.h"
#include "report/html.h"
#include "report/page.h"
#include "report/sweep_document.h"
#include "sim/what_if_cluster.h"

namespace parasol::report {

namespace {

// A count of tokens as written on the header: 1B, 15T, 2.5M.
std::string tokens_text(double n) {
  if (n >= 1e12) return fmt("%gT", n / 1e12);
  if (n >= 1e9) return fmt("%gB", n / 1e9);
  if (n >= 1e6) return fmt("%gM", n / 1e6);
  return fmt("%g", n);
}

const char* const kSweepStyle = R"CSS(
#hm-controls, #pf-controls { margin: 6px 0; }
#hm-controls label { margin-right: 14px; white-space: nowrap; }
select { font-size: 12px; }
svg rect.hm-cell { stroke: #fff; stroke-width: 1; cursor: pointer; }
svg rect.hm-cell.hm-selected { stroke: #000; stroke-width: 3; }
svg rect.hm-missing { cursor: default; }
svg text.hm-text { font-size: 11px; pointer-events: none; }
svg circle.pf-point { cursor: pointer; }
svg circle.pf-point.pf-selected { stroke: #000; stroke-width: 3; }
svg path.pf-step { fill: none; stroke: #e15759; stroke-width: 1.5; }
#point-detail { border: 1px solid #ccc; border-radius: 4px; padding: 6px 12px; margin: 8px 0;
                background: #fbfbfb; }
#point-detail h3 { font-size: 14px; margin: 4px 0; }
#point-detail pre { background: #f3f3f3; padding: 6px; overflow: auto; font-size: 11px;
                    max-height: 300px; margin: 4px 0; }
#point-detail code.pd-plan { font-size: 13px; font-weight: bold; }
#point-detail table { margin: 4px 0; }
.pd-cols { display: flex; flex-wrap: wrap; gap: 24px; }
tr.sweep-row { cursor: pointer; }
tr.sweep-row:hover { background: #eef5ff; }
tr.sweep-row.sel { background: #fff3c4; }
tr.sweep-row.noplan td { color: #888; }
th.sortable { cursor: pointer; user-select: none; }
th.sortable.asc::after { content: " \25B2"; }
th.sortable.desc::after { content: " \25BC"; }
#sweep-table td { white-space: nowrap; }
#sweep-table td.mono { font-family: "DejaVu Sans Mono", monospace; font-size: 11px;
                       text-align: left; white-space: normal; }
)CSS";

const char* const kSweepBody = R"HTML(
<p id="errors"></p>
<section id="heatmap">
<h2>Heatmap over two axes of the grid</h2>
<div id="hm-controls"></div>
<svg id="hm-svg"></svg>
<p class="note" id="hm-note"></p>
</section>
<section id="front">
<h2>Cost against time to train (Pareto front)</h2>
<svg id="pf-svg"></svg>
<div id="pf-legend" class="legend"></div>
<p class="note" id="pf-note"></p>
</section>
<section id="detail">
<h2>Point</h2>
<div id="point-detail"><p class="note">Click a heatmap cell, a point of the front or a row of
the table to see its best plan and the command that reproduces it.</p></div>
</section>
<section id="rows">
<h2>Every point</h2>
<p class="note">Click a column's header to sort by it; click a row to show its point.</p>
<table id="sweep-table"></table>
</section>
)HTML";

const char* const kSweepScript = R"JS(
(function () {
'use strict';
var S = JSON.parse(document.getElementById('sweep-data').textContent);
var DOC = S.doc, H = DOC.sweep, ROWS = DOC.rows, AXES = H.axes || [];
var COST_KEY = S.cost_key, PRICED = COST_KEY === 'cost';
var FRONT = {};
S.front.forEach(function (i) { FRONT[i] = true; });
var BY_INDEX = {};
ROWS.forEach(function (r) { BY_INDEX[r.index] = r; });
function axisOf(key) {
  for (var i = 0; i < AXES.length; ++i) if (AXES[i].key === key) return AXES[i];
  return null;
}
// The row at each point of the grid (S.grid: the row's position in ROWS or -1, by the point's
// flat index, first axis slowest), from each axis' value position.
var STRIDE = {}, stride = 1;
for (var ax = AXES.length - 1; ax >= 0; --ax) { STRIDE[AXES[ax].key] = stride; stride *= AXES[ax].values.length; }
function rowAt(pos) {
  var flat = 0;
  AXES.forEach(function (a) { flat += (pos[a.key] || 0) * STRIDE[a.key]; });
  var k = S.grid[flat];
  return k === undefined || k < 0 ? null : ROWS[k];
}
// Each row's value positions, axis by axis (by its "index"; none for a row off the grid).
var POS = {};
S.grid.forEach(function (k, flat) {
  if (k < 0) return;
  POS[ROWS[k].index] = AXES.map(function (a) {
    return Math.floor(flat / STRIDE[a.key]) % a.values.length;
  });
});

function html(tag, text, parent, cls) {
  var e = document.createElement(tag);
  if (text !== undefined && text !== null) e.textContent = text;
  if (cls) e.className = cls;
  if (parent) parent.appendChild(e);
  return e;
}
function fmtNum(v) {
  if (v === 0) return '0';
  var a = Math.abs(v);
  if (a >= 1e12) return (v / 1e12).toFixed(2) + 'T';
  if (a >= 1e9) return (v / 1e9).toFixed(2) + 'B';
  if (a >= 1e6) return (v / 1e6).toFixed(2) + 'M';
  if (a >= 1e4) return (v / 1e3).toFixed(1) + 'k';
  if (a >= 100) return v.toFixed(0);
  if (a >= 1) return v.toPrecision(3);
  return v.toPrecision(3);
}
function fmtDur(s) {
  if (!isFinite(s)) return 'never';
  if (s >= 86400) return (s / 86400).toFixed(2) + ' days';
  if (s >= 3600) return (s / 3600).toFixed(2) + ' h';
  if (s >= 60) return (s / 60).toFixed(1) + ' min';
  return fmtS(s);
}
function fmtGiB(b) { return (b / (1024 * 1024 * 1024)).toFixed(1) + ' GiB'; }
function valueText(v) { return typeof v === 'string' ? v : v === undefined ? '-' : String(v); }
function money(v) { return '$' + fmtNum(v); }
function round(v) { return String(Math.round(v * 1e6) / 1e6); }

// The train figures' basis, as the header says it.
var T0 = null;
ROWS.forEach(function (r) { if (!T0 && r.status === 'ok') T0 = r.train; });
var STEADY = H.tokens === null || H.tokens === undefined;
// A token count as 1B, 15T, 2.5M.
function fmtTokens(n) {
  var u = n >= 1e12 ? ['T', 1e12] : n >= 1e9 ? ['B', 1e9] : n >= 1e6 ? ['M', 1e6] : ['', 1];
  return Number((n / u[1]).toPrecision(3)) + u[0];
}
var BASIS = STEADY ? (T0 ? fmtTokens(T0.tokens) : '1B') + ' tokens at the steady step'
                   : fmtTokens(H.tokens) + ' tokens';

// ---- Metrics of the heatmap ----
function costOf(r) { return PRICED ? r.train.cost : r.train.gpu_hours; }
var METRICS = [
  {id: 'tokens_per_s', name: 'tokens/s', label: 'tokens/s', better: 'higher',
   get: function (r) { return r.tokens_per_s; }, fmt: fmtNum},
  {id: 'time_s', name: 'time to train (' + BASIS + ')', label: 'time to train', better: 'lower',
   get: function (r) { return r.train.time_s; }, fmt: fmtDur},
  {id: 'cost_per_token', name: PRICED ? 'cost per trained token (shown per 1M tokens)' :
       'GPU-hours per trained token (no price; shown per 1M tokens)',
   label: PRICED ? 'cost per token' : 'GPU-hours per token (no price)', better: 'lower',
   get: function (r) { return costOf(r) / r.train.tokens; },
   fmt: function (v) { return PRICED ? money(v * 1e6) : fmtNum(v * 1e6) + ' GPU-h'; }},
  {id: 'energy_MWh', name: 'energy (MWh, facility)', label: 'energy', better: 'lower',
   get: function (r) { return r.train.energy_MWh; },
   fmt: function (v) { return fmtNum(v) + ' MWh'; }}];
function metricOf(id) {
  for (var i = 0; i < METRICS.length; ++i) if (METRICS[i].id === id) return METRICS[i];
  return METRICS[0];
}
// A sequential scale (YlGnBu): t = 0 the worst of the drawn cells (light), 1 the best (dark).
var STOPS = [[255, 255, 217], [199, 233, 180], [65, 182, 196], [34, 94, 168], [8, 29, 88]];
function scale(t) {
  t = Math.max(0, Math.min(1, t)) * (STOPS.length - 1);
  var i = Math.min(STOPS.length - 2, Math.floor(t)), f = t - i, a = STOPS[i], b = STOPS[i + 1];
  return 'rgb(' + [0, 1, 2].map(function (k) { return Math.round(a[k] + (b[k] - a[k]) * f); }).join(',') + ')';
}

// ---- Selection shared by the views ----
var selected = null;  // the shown row's index
var listeners = [];
function select(index) {
  selected = index;
  showDetail(BY_INDEX[index]);
  listeners.forEach(function (f) { f(); });
}

// ---- Heatmap ----
// The axes drawn, the value position of each other axis, and the metric.
var state = {x: AXES.length > 0 ? AXES[0].key : '', y: AXES.length > 1 ? AXES[1].key : '',
             fix: {}, metric: METRICS[0].id};
AXES.forEach(function (a) { state.fix[a.key] = 0; });
var controls = document.getElementById('hm-controls');
function selectBox(id, label, options, value, onchange, cls) {
  var l = html('label', label + ' ', controls);
  var s = html('select', null, l, cls);
  if (id) s.id = id;
  options.forEach(function (o, i) {
    var op = html('option', o[1], s);
    op.value = String(i);
    if (o[0] === value) s.value = String(i);
  });
  s.addEventListener('change', function () { onchange(options[Number(s.value)][0]); });
  return s;
}
function buildControls() {
  controls.textContent = '';
  var axisOptions = AXES.map(function (a) { return [a.key, a.key]; });
  selectBox('hm-x', 'x axis', axisOptions.length ? axisOptions : [['', 'none']], state.x, function (k) {
    if (k === state.y) state.y = state.x;
    state.x = k;
    buildControls(); drawHeatmap();
  });
  selectBox('hm-y', 'y axis', [['', 'none']].concat(axisOptions), state.y, function (k) {
    if (k !== '' && k === state.x) state.x = state.y !== '' ? state.y : AXES.filter(function (a) { return a.key !== k; }).concat([{key: ''}])[0].key;
    state.y = k;
    buildControls(); drawHeatmap();
  });
  AXES.forEach(function (a) {
    if (a.key === state.x || a.key === state.y) return;
    var s = selectBox(null, a.key, a.values.map(function (v, i) { return [i, valueText(v)]; }),
                      state.fix[a.key], function (i) { state.fix[a.key] = i; drawHeatmap(); }, 'hm-fix');
    s.setAttribute('data-key', a.key);
  });
  selectBox('hm-metric', 'metric', METRICS.map(function (m) { return [m.id, m.label]; }), state.metric,
            function (id) { state.metric = id; drawHeatmap(); });
}
function drawHeatmap() {
  var svg = document.getElementById('hm-svg');
  svg.textContent = '';
  var M = metricOf(state.metric);
  var xa = axisOf(state.x), ya = axisOf(state.y);
  var xs = xa ? xa.values : [undefined], ys = ya ? ya.values : [undefined];
  var L = 150, top = 56, R = 20, W0 = 1140;
  var cw = Math.max(12, Math.min(170, Math.floor((W0 - L - R) / xs.length)));
  var ch = Math.max(12, Math.min(48, Math.floor(560 / ys.length)));
  var W = Math.max(W0, L + xs.length * cw + R), Hh = top + ys.length * ch + 64;
  svg.setAttribute('width', W); svg.setAttribute('height', Hh);
  svg.setAttribute('viewBox', '0 0 ' + W + ' ' + Hh);
  svg.setAttribute('data-metric', M.id);
  var defs = el('defs', {}, svg);
  var pat = el('pattern', {id: 'hm-hatch', width: 8, height: 8, patternUnits: 'userSpaceOnUse',
                           patternTransform: 'rotate(45)'}, defs);
  el('rect', {width: 8, height: 8, fill: '#e4e4e4'}, pat);
  el('line', {x1: 0, y1: 0, x2: 0, y2: 8, stroke: '#aaa', 'stroke-width': 3}, pat);
  var grad = el('linearGradient', {id: 'hm-grad', x1: 0, x2: 1, y1: 0, y2: 0}, defs);
  for (var g = 0; g <= 10; ++g) el('stop', {offset: g / 10, 'stop-color': scale(g / 10)}, grad);
  // The cells' rows and values.
  var cells = [], lo = Infinity, hi = -Infinity;
  ys.forEach(function (yv, j) {
    xs.forEach(function (xv, i) {
      var pos = {};
      for (var k in state.fix) pos[k] = state.fix[k];
      if (xa) pos[xa.key] = i;
      if (ya) pos[ya.key] = j;
      var r = rowAt(pos), v = null;
      if (r && r.status === 'ok') {
        v = M.get(r);
        if (isFinite(v)) { lo = Math.min(lo, v); hi = Math.max(hi, v); } else v = null;
      }
      cells.push({i: i, j: j, r: r, v: v});
    });
  });
  var fixed = AXES.filter(function (a) { return a !== xa && a !== ya; })
      .map(function (a) { return a.key + ' = ' + valueText(a.values[state.fix[a.key]]); });
  txt(svg, L, 16, M.name + (fixed.length ? ' at ' + fixed.join(', ') : ''), {'class': 'title'});
  cells.forEach(function (c) {
    var x = L + c.i * cw, y = top + c.j * ch, a = {x: x, y: y, width: cw, height: ch};
    var t = null;
    if (!c.r) {
      a['class'] = 'hm-cell hm-missing'; a.fill = '#fff'; a.stroke = '#ccc';
    } else if (c.v === null) {
      a['class'] = 'hm-cell hm-noplan'; a.fill = 'url(#hm-hatch)';
      a['data-index'] = c.r.index;
    } else {
      t = hi > lo ? (M.better === 'higher' ? (c.v - lo) / (hi - lo) : (hi - c.v) / (hi - lo)) : 0.5;
      a['class'] = 'hm-cell'; a.fill = scale(t);
      a['data-index'] = c.r.index; a['data-value'] = String(c.v);
    }
    if (c.r && c.r.index === selected) a['class'] += ' hm-selected';
    var rect = el('rect', a, svg);
    var tip = el('title', {}, rect);
    if (!c.r) tip.textContent = 'not in the document (the sweep has not run this point)';
    else if (c.v === null) tip.textContent = 'no plan: ' + (c.r.reason || M.name + ' unknown');
    else tip.textContent = c.r.plan + ': ' + M.fmt(c.v);
    if (c.r) rect.addEventListener('click', function () { select(c.r.index); });
    if (cw >= 44 && ch >= 16) {
      var label = !c.r ? '-' : c.v === null ? 'no plan' : M.fmt(c.v);
      // A style, not a fill attribute: the page's stylesheet sets the fill of every svg text.
      txt(svg, x + cw / 2, y + ch / 2 + 4, label, {'class': 'hm-text', 'text-anchor': 'middle',
          style: 'fill: ' + (t !== null && t > 0.45 ? '#fff' : '#222')});
    }
  });
  // Axis labels: x values above the cells, y values to their left.
  var every = Math.max(1, Math.ceil(40 / cw));
  xs.forEach(function (xv, i) {
    if (i % every === 0)
      txt(svg, L + i * cw + cw / 2, top - 6, xa ? valueText(xv) : '', {'text-anchor': 'middle', 'class': 'hm-xlabel'});
  });
  txt(svg, L + xs.length * cw / 2, top - 24, xa ? xa.key : '', {'text-anchor': 'middle', 'class': 'title'});
  var everyY = Math.max(1, Math.ceil(14 / ch));
  ys.forEach(function (yv, j) {
    if (j % everyY === 0)
      txt(svg, L - 8, top + j * ch + ch / 2 + 4, ya ? valueText(yv) : '', {'text-anchor': 'end', 'class': 'hm-ylabel'});
  });
  if (ya) txt(svg, 0, 0, ya.key, {'text-anchor': 'middle', 'class': 'title',
              transform: 'translate(' + 16 + ',' + (top + ys.length * ch / 2) + ') rotate(-90)'});
  // The legend: the scale from the worse end to the better one, and the other cells.
  var ly = top + ys.length * ch + 22, lx = L;
  txt(svg, lx, ly + 12, M.better === 'higher' ? 'lower (worse)' : 'higher (worse)', {'text-anchor': 'start'});
  var gx = lx + 96;
  el('rect', {x: gx, y: ly, width: 220, height: 16, fill: 'url(#hm-grad)', stroke: '#999', 'class': 'hm-legend-bar'}, svg);
  txt(svg, gx + 226, ly + 12, (M.better === 'higher' ? 'higher' : 'lower') + ' (better): darker is better');
  if (isFinite(lo)) {
    var worst = M.better === 'higher' ? lo : hi, best = M.better === 'higher' ? hi : lo;
    txt(svg, gx, ly + 30, M.fmt(worst), {'text-anchor': 'start'});
    txt(svg, gx + 220, ly + 30, M.fmt(best), {'text-anchor': 'end'});
  }
  el('rect', {x: gx + 470, y: ly, width: 16, height: 16, fill: 'url(#hm-hatch)'}, svg);
  txt(svg, gx + 492, ly + 12, 'no plan fits (hover: the reason)');
  el('rect', {x: gx + 700, y: ly, width: 16, height: 16, fill: '#fff', stroke: '#ccc'}, svg);
  txt(svg, gx + 722, ly + 12, 'not in the document');
  document.getElementById('hm-note').textContent = 'Colours compare the drawn cells only. ' +
      (PRICED ? '' : 'No price per GPU-hour in the sweep: cost is shown as GPU-hours. ') +
      'Click a cell to show its point below.';
}
listeners.push(drawHeatmap);

// ---- Pareto front: cost against time ----
var PALETTE = ['#4e79a7', '#f28e2b', '#59a14f', '#b07aa1', '#76b7b2', '#edc948', '#ff9da7',
               '#9c755f', '#bab0ac', '#86bcb6', '#d37295', '#a0cbe8'];
var pfCircles = [];
function drawFront() {
  var svg = document.getElementById('pf-svg');
  var W = 1140, Hh = 440, L = 100, R = 30, top = 30, bottom = 56;
  svg.setAttribute('width', W); svg.setAttribute('height', Hh);
  svg.setAttribute('viewBox', '0 0 ' + W + ' ' + Hh);
  var ok = ROWS.filter(function (r) { return r.status === 'ok'; });
  var costName = PRICED ? 'cost' : 'GPU-hours (no price in the sweep)';
  txt(svg, L, 16, costName + ' against time to train (' + BASIS + '): ' + S.front.length +
      ' of ' + ok.length + ' points on the front; lower left is better', {'class': 'title'});
  if (!ok.length) { txt(svg, L, 60, 'no point has a plan'); return; }
  var tmax = 0, tmin = Infinity, cmax = 0, cmin = Infinity;
  ok.forEach(function (r) {
    tmax = Math.max(tmax, r.train.time_s); tmin = Math.min(tmin, r.train.time_s);
    cmax = Math.max(cmax, costOf(r)); cmin = Math.min(cmin, costOf(r));
  });
  var tu = tmax >= 3 * 86400 ? ['days', 86400] : tmax >= 3 * 3600 ? ['hours', 3600] :
           tmax >= 180 ? ['minutes', 60] : ['seconds', 1];
  function pad(lo, hi) {
    var span = hi - lo || Math.abs(hi) * 0.1 || 1;
    return [Math.max(0, lo - span * 0.08), hi + span * 0.08];
  }
  var xr = pad(tmin / tu[1], tmax / tu[1]), yr = pad(cmin, cmax);
  var x0 = L, x1 = W - R, y0 = Hh - bottom, y1 = top;
  function X(t) { return x0 + (t / tu[1] - xr[0]) / (xr[1] - xr[0]) * (x1 - x0); }
  function Y(c) { return y0 - (c - yr[0]) / (yr[1] - yr[0]) * (y0 - y1); }
  var ax = el('g', {'class': 'axis'}, svg);
  el('line', {x1: x0, x2: x1, y1: y0, y2: y0}, ax);
  ticks(xr[0], xr[1], 8).forEach(function (v) {
    var x = x0 + (v - xr[0]) / (xr[1] - xr[0]) * (x1 - x0);
    el('line', {'class': 'grid', x1: x, x2: x, y1: y1, y2: y0}, ax);
    el('line', {x1: x, x2: x, y1: y0, y2: y0 + 4}, ax);
    txt(ax, x, y0 + 16, round(v), {'text-anchor': 'middle', 'class': 'pf-xtick'});
  });
  txt(ax, (x0 + x1) / 2, y0 + 36, 'time to train ' + BASIS + ' (' + tu[0] + ')',
      {'text-anchor': 'middle', 'class': 'pf-xlabel'});
  el('line', {x1: x0, x2: x0, y1: y0, y2: y1}, ax);
  ticks(yr[0], yr[1], 6).forEach(function (v) {
    var y = y0 - (v - yr[0]) / (yr[1] - yr[0]) * (y0 - y1);
    el('line', {'class': 'grid', x1: x0, x2: x1, y1: y, y2: y}, ax);
    el('line', {x1: x0 - 4, x2: x0, y1: y, y2: y}, ax);
    txt(ax, x0 - 6, y + 4, PRICED ? money(v) : fmtNum(v), {'text-anchor': 'end', 'class': 'pf-ytick'});
  });
  txt(ax, 0, 0, PRICED ? 'cost' : 'GPU-hours', {'text-anchor': 'middle', 'class': 'pf-ylabel',
      transform: 'translate(' + (x0 - 70) + ',' + (y0 + y1) / 2 + ') rotate(-90)'});
  // The front, joined by a step line: from each point across to the next one's time, then down.
  var front = S.front.map(function (i) { return BY_INDEX[i]; });
  if (front.length) {
    var d = 'M' + X(front[0].train.time_s) + ' ' + Y(costOf(front[0]));
    for (var k = 1; k < front.length; ++k)
      d += ' L' + X(front[k].train.time_s) + ' ' + Y(costOf(front[k - 1])) +
           ' L' + X(front[k].train.time_s) + ' ' + Y(costOf(front[k]));
    el('path', {'class': 'pf-step', d: d}, svg);
  }
  // Points coloured by the first axis' value.
  var colorAxis = AXES.length ? AXES[0] : null;
  function colorOf(r) {
    if (!colorAxis) return PALETTE[0];
    var i = POS[r.index] ? POS[r.index][0] : -1;
    return i >= 0 ? PALETTE[i % PALETTE.length] : '#888';
  }
  pfCircles = [];
  // Points off the front first, so that the front's are drawn over them.
  ok.slice().sort(function (a, b) { return (FRONT[a.index] ? 1 : 0) - (FRONT[b.index] ? 1 : 0); })
    .forEach(function (r) {
      var on = FRONT[r.index] === true;
      var c = el('circle', {'class': 'pf-point' + (on ? ' pf-front' : ''), cx: X(r.train.time_s),
                            cy: Y(costOf(r)), r: on ? 6.5 : 5, fill: colorOf(r),
                            stroke: on ? '#c00' : '#fff', 'stroke-width': on ? 2.5 : 1,
                            'data-index': r.index}, svg);
      el('title', {}, c).textContent = AXES.map(function (a) { return a.key + '=' + valueText(r.point[a.key]); }).join(', ') +
          ': ' + r.plan + '; ' + fmtDur(r.train.time_s) + ', ' + (PRICED ? money(r.train.cost) :
          fmtNum(r.train.gpu_hours) + ' GPU-hours') + (on ? ' (on the front)' : '');
      c.addEventListener('click', function () { select(r.index); });
      pfCircles.push(c);
    });
  var lg = document.getElementById('pf-legend');
  function sw(color, label, ring) {
    var s = html('span', null, lg), b = html('span', null, s, 'sw');
    b.style.background = color;
    if (ring) b.style.border = '2px solid #c00';
    s.appendChild(document.createTextNode(label));
  }
  if (colorAxis)
    colorAxis.values.forEach(function (v, i) { sw(PALETTE[i % PALETTE.length], colorAxis.key + ' = ' + valueText(v)); });
  sw('#fff', 'on the front (ringed, joined by the step line)', true);
  document.getElementById('pf-note').textContent = 'A point is on the front when no other point ' +
      'trains as fast for no more ' + (PRICED ? 'cost' : 'GPU-hours') + ', or as cheaply in no more time. ' +
      'Click a point to show it below.';
}
listeners.push(function () {
  pfCircles.forEach(function (c) {
    var on = Number(c.getAttribute('data-index')) === selected;
    c.setAttribute('class', c.getAttribute('class').replace(/ ?pf-selected/, '') + (on ? ' pf-selected' : ''));
  });
});

// ---- The point panel ----
function shellQuote(s) {
  s = String(s);
  return /^[A-Za-z0-9_.\/:=+,@-]+$/.test(s) ? s : "'" + s.replace(/'/g, "'\\''") + "'";
}
// The `parasol search` command that finds the point's plan (with the cluster JSON to write first).
function searchCommand(r) {
  var lines = [], args = ['parasol', 'search', '--model', shellQuote(r.model)];
  if (r.cluster !== null && typeof r.cluster === 'object') {
    lines.push('# the point\'s cluster, a generator (the row\'s "cluster"), written to a file:');
    lines.push("cat > cluster.json << 'EOF'");
    lines.push(JSON.stringify(r.cluster, null, 2));
    lines.push('EOF');
    args.push('--cluster', 'cluster.json');
  } else {
    args.push('--cluster', shellQuote(r.cluster));
  }
  args.push('--gpus', String(r.gpus), '--gbs', String(r.gbs));
  if ((H.seq && H.seq > 0) || (r.point && r.point.seq !== undefined)) args.push('--seq', String(r.seq));
  if (H.precision) args.push('--precision', shellQuote(H.precision));
  if (H.profile) args.push('--profile', shellQuote(H.profile));
  if (H.no_offload) args.push('--no-offload');
  if (H.robust) args.push('--robust');
  if (H.simulate_top > 0) args.push('--simulate-top', String(H.simulate_top));
  if (H.framework) args.push('--framework', shellQuote(H.framework));
  if (!STEADY) {
    args.push('--tokens', String(H.tokens));
    if (r.train && r.train.price_per_gpu_hour > 0) args.push('--price-per-gpu-hour', String(r.train.price_per_gpu_hour));
  }
  lines.push(args.join(' '));
  return lines.join('\n');
}
function kvTable(parent, pairs, cls) {
  var t = html('table', null, parent, cls);
  pairs.forEach(function (p) {
    var tr = html('tr', null, t);
    html('th', p[0], tr, 'l');
    var td = html('td', p[1], tr, 'l');
    if (p[2]) td.className += ' ' + p[2];
  });
  return t;
}
function showDetail(r) {
  var P = document.getElementById('point-detail');
  P.textContent = '';
  if (!r) return;
  P.setAttribute('data-index', r.index);
  html('h3', 'point #' + (r.index + 1) + ': ' + AXES.map(function (a) {
    return a.key + ' = ' + valueText(r.point[a.key]); }).join(', '), P);
  var cols = html('div', null, P, 'pd-cols');
  var left = html('div', null, cols), right = html('div', null, cols);
  html('div', 'axis values', left, 'fig-name');
  kvTable(left, AXES.map(function (a) { return [a.key, valueText(r.point[a.key])]; }), 'pd-axes');
  html('div', 'job', left, 'fig-name');
  kvTable(left, [['model', r.model], ['device', r.device], ['GPUs', String(r.gpus)],
                 ['servers', String(r.servers)], ['global batch', String(r.gbs)],
                 ['sequence', r.seq !== undefined ? String(r.seq) : '-']], 'pd-job');
  if (r.status !== 'ok') {
    html('div', 'no plan', right, 'fig-name');
    html('p', r.reason || '', right, 'pd-reason');
  } else {
    html('div', 'best plan', right, 'fig-name');
    html('code', r.plan, right, 'pd-plan');
    var b = r.band;
    var band = b.validated ? ' \u00b1 ' + pct(b.fraction) + ' (' + fmtS(b.low_s) + ' - ' + fmtS(b.high_s) + ')'
                           : ' (unvalidated' + (b.unvalidated_reason ? ': ' + b.unvalidated_reason : '') + ')';
    var T = r.train;
    var figs = [['step time', fmtS(r.step_time_s) + band, 'pd-step']];
    if (r.simulated_step_time_s) figs.push(['simulated step', fmtS(r.simulated_step_time_s)]);
    figs = figs.concat([['tokens/s', fmtNum(r.tokens_per_s), 'pd-tps'], ['MFU', pct(r.mfu)],
        ['memory per GPU', fmtGiB(r.memory_per_gpu_bytes)],
        ['train', T.basis === 'steady' ? fmtTokens(T.tokens) + ' tokens at the steady step' :
                  fmtTokens(T.tokens) + ' tokens (--tokens' + (T.goodput !== undefined ? ', goodput ' + pct(T.goodput) : '') + ')'],
        ['time', fmtDur(T.time_s), 'pd-time'], ['GPU-hours', fmtNum(T.gpu_hours)],
        ['energy', fmtNum(T.energy_MWh) + ' MWh'],
        ['cost', T.cost === null || T.cost === undefined ? '- (no price)' :
                 money(T.cost) + ' at $' + T.price_per_gpu_hour + ' per GPU-hour']]);
    kvTable(right, figs, 'pd-figs');
    html('div', 'plan JSON', P, 'fig-name');
    html('pre', JSON.stringify(r.best_plan, null, 1), P, 'pd-plan-json');
  }
  html('div', 'reproduce with `parasol search`', P, 'fig-name');
  html('pre', searchCommand(r), P, 'pd-command');
}

// ---- The table of every row ----
var tableRows = [];
function drawTable() {
  var table = document.getElementById('sweep-table');
  var cols = [['#', function (r) { return [r.index + 1, r.index]; }]];
  AXES.forEach(function (a) {
    cols.push([a.key, function (r) { var v = r.point[a.key]; return [valueText(v), v]; }]);
  });
  function ok(f) { return function (r) { return r.status === 'ok' ? f(r) : ['', null]; }; }
  cols = cols.concat([
    ['best plan', function (r) { return r.status === 'ok' ? [r.plan, r.plan] : ['no plan: ' + (r.reason || ''), '~' + (r.reason || '')]; }],
    ['step', ok(function (r) { return [fmtS(r.step_time_s), r.step_time_s]; })],
    ['band', ok(function (r) { return [r.band.validated ? '\u00b1 ' + pct(r.band.fraction) : 'unvalidated', r.band.validated ? r.band.fraction : Infinity]; })],
    ['tokens/s', ok(function (r) { return [fmtNum(r.tokens_per_s), r.tokens_per_s]; })],
    ['MFU', ok(function (r) { return [pct(r.mfu), r.mfu]; })],
    ['mem/GPU', ok(function (r) { return [fmtGiB(r.memory_per_gpu_bytes), r.memory_per_gpu_bytes]; })],
    ['time', ok(function (r) { return [fmtDur(r.train.time_s), r.train.time_s]; })],
    ['GPU-hours', ok(function (r) { return [fmtNum(r.train.gpu_hours), r.train.gpu_hours]; })],
    ['cost', ok(function (r) { return r.train.cost === null ? ['-', null] : [money(r.train.cost), r.train.cost]; })],
    ['energy', ok(function (r) { return [fmtNum(r.train.energy_MWh) + ' MWh', r.train.energy_MWh]; })],
    ['front', ok(function (r) { return FRONT[r.index] ? ['yes', 1] : ['', 0]; })]]);
  var head = html('tr', null, table), ths = [];
  var body = html('tbody', null, table);
  var sortCol = -1, asc = true;
  cols.forEach(function (c, k) {
    var th = html('th', c[0], head, 'sortable');
    ths.push(th);
    th.addEventListener('click', function () {
      asc = sortCol === k ? !asc : true;
      sortCol = k;
      ths.forEach(function (t, i) { t.className = 'sortable' + (i === k ? (asc ? ' asc' : ' desc') : ''); });
      var sorted = tableRows.slice().sort(function (a, b) {
        var x = a.keys[k], y = b.keys[k];
        if (x === null || x === undefined) return y === null || y === undefined ? a.r.index - b.r.index : 1;
        if (y === null || y === undefined) return -1;
        var c2 = typeof x === 'number' && typeof y === 'number' ? x - y : String(x) < String(y) ? -1 : String(x) > String(y) ? 1 : 0;
        return (asc ? c2 : -c2) || a.r.index - b.r.index;
      });
      sorted.forEach(function (t) { body.appendChild(t.tr); });
    });
  });
  ROWS.forEach(function (r) {
    var tr = html('tr', null, body, 'sweep-row' + (r.status === 'ok' ? '' : ' noplan'));
    tr.setAttribute('data-index', r.index);
    var keys = [];
    cols.forEach(function (c, k) {
      var v = c[1](r);
      keys.push(v[1]);
      var td = html('td', String(v[0]), tr, k > 0 && k <= AXES.length + 1 ? (k === AXES.length + 1 ? 'mono' : 'l') : '');
    });
    tr.addEventListener('click', function () { select(r.index); });
    tableRows.push({tr: tr, r: r, keys: keys});
  });
}
listeners.push(function () {
  tableRows.forEach(function (t) {
    t.tr.className = 'sweep-row' + (t.r.status === 'ok' ? '' : ' noplan') + (t.r.index === selected ? ' sel' : '');
  });
});

buildControls();
drawHeatmap();
drawFront();
drawTable();
document.body.setAttribute('data-rendered', 'ok');
})();
)JS";

std::string header_html(const Json& doc) {
  const Json& h = doc["sweep"];
  const Json& rows = doc["rows"];
  int64_t ok = 0;
  for (const Json& r : rows) ok += sweep_row_has_plan(r);
  const std::string model = h.contains("model") ? sim::sweep_value_text(h["model"]) : "?";
  const std::string cluster = h.contains("cluster") ? sim::sweep_value_text(h["cluster"]) : "?";
  const int64_t points = h.contains("points") && h["points"].is_number_integer()
                             ? h["points"].get<int64_t>()
                             : static_cast<int64_t>(rows.size());
  std::vector<std::string> axes;
  for (const Json& a : h["axes"])
    axes.push_back(a["key"].get<std::string>() + " (" + std::to_string(a["values"].size()) + ")");
  std::string s = "<header><h1>parasol sweep: " + html_escape(model) +
                  " on what-if clusters from " + html_escape(cluster) + "</h1>";
  s += "<p class=\"sub\" id=\"sweep-points\" data-points=\"" + std::to_string(points) +
       "\" data-ok=\"" + std::to_string(ok) + "\">" + std::to_string(points) + " points, " +
       std::to_string(ok) + " with a plan";
  if (static_cast<int64_t>(rows.size()) < points)
    s += " (" + std::to_string(points - static_cast<int64_t>(rows.size())) +
         " not in the document: an unfinished journal)";
  s += "; axes: " + html_escape(axes.empty() ? "none" : join(axes, " \u00d7 ")) + "</p>";
  std::string job = "model " + model + ", base cluster " + cluster;
  if (h.contains("gpus") && h["gpus"].is_number())
    job += ", " + sim::sweep_value_text(h["gpus"]) + " GPUs";
  if (h.contains("gbs") && h["gbs"].is_number())
    job += ", global batch " + sim::sweep_value_text(h["gbs"]);
  if (h.contains("seq") && h["seq"].is_number() && h["seq"].get<double>() > 0)
    job += ", sequence " + sim::sweep_value_text(h["seq"]);
  if (h.contains("precision") && h["precision"].is_string())
    job += ", " + sim::sweep_value_text(h["precision"]);
  job += " (unless an axis varies it)";
  s += "<p class=\"sub\">" + html_escape(job) + "</p>";
  const bool steady = !h.contains("tokens") || h["tokens"].is_null();
  std::string basis;
  if (steady) {
    double tokens = 1e9;
    for (const Json& r : rows)
      if (sweep_row_has_plan(r)) {
        tokens = sweep_train_number(r, "tokens");
        break;
      }
    basis = tokens_text(tokens) + " tokens at the steady step";
  } else {
    basis = "the --tokens count, " + tokens_text(h["tokens"].get<double>()) + " tokens";
  }
  s += "<p class=\"sub\" id=\"sweep-basis\" data-basis=\"" +
       std::string(steady ? "steady" : "tokens") + "\">time, GPU-hours, cost and energy: of " +
       html_escape(basis) + "; " +
       html_escape(sweep_cost_key(doc) == "cost"
                       ? "cost at each point's price per GPU-hour"
                       : "no price per GPU-hour for every point: GPU-hours stand for cost") +
       "</p></header>\n";
  return s;
}

}  // namespace

std::string sweep_html(const Json& doc) {
  check_sweep_document(doc);
  const Json data = {{"doc", doc},
                     {"front", sweep_pareto_front(doc)},
                     {"cost_key", sweep_cost_key(doc)},
                     {"grid", sweep_grid(doc)}};
  const Json& h = doc["sweep"];
  const std::string title =
      "parasol sweep: " +
      (h.contains("model") ? sim::sweep_value_text(h["model"]) : std::string("?")) + " on " +
      (h.contains("cluster") ? sim::sweep_value_text(h["cluster"]) : std::string("?"));
  std::string s;
  s += "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n";
  s += "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n";
  s += "<title>" + html_escape(title) + "</title>\n";
  s += "<style>\n" + std::string(kPageStyle) + kSweepStyle + "</style>\n</head>\n";
  s += "<body data-rendered=\"no\" data-errors=\"0\">\n";
  s += "<script>\n" + std::string(kErrorCounter) + "</script>\n";
  s += header_html(doc);
  s += kSweepBody;
  s += "<footer>Generated by parasol from a sweep document (<code>parasol sweep --json</code> or "
       "its journal). Self-contained: no network access; the document is inlined below.</footer>\n";
  s += "<script type=\"application/json\" id=\"sweep-data\">" + json_for_script(data) +
       "</script>\n";
  s += "<script>\n" + std::string(kChartHelpers) + "</script>\n";
  s += "<script>\n" + std::string(kSweepScript) + "</script>\n</body>\n</html>\n";
  return s;
}

}  // namespace parasol::report
