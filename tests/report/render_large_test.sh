#!/usr/bin/env bash
# The timeline of a step of about a million ops, rendered in a real browser: `parasol report` of
# llama3-70b on 64 H100s (the best plan of `parasol search --gbs 512` for it, about 1.08 M ops),
# loaded in headless Chromium with a script after the page's own that records what the timeline
# drew at its first, coarsest zoom, then presses "zoom in" twelve times. It checks that
#  - the page's script ran to the end without an error, and every op is inlined (the ops block
#    decodes to as many ops as `parasol simulate --json` simulated);
#  - at the coarsest zoom the view is the whole step, the end marker stands at the step time that
#    `parasol simulate --json` prints, and the drawing reaches it;
#  - every pipeline stage's compute row is drawn busy wherever its ops are (each pixel column an
#    op of the row touches is drawn, and nothing is drawn more than a pixel away from one), and
#    covers at least the stage's compute time of `simulate --json`;
#  - zoomed in, every op in view is drawn as its own rect (as many as the ops block has in the
#    window) at its own place;
# and takes a 1200 x 1600 screenshot (large.png under OUT_DIR). Prints how long the report took
# to write and the page to load.
# Without Chromium the test is skipped, the reason printed (tests/report/chromium.sh).
# Usage: render_large_test.sh PARASOL_BIN OUT_DIR
set -euo pipefail
bin=$1
out=$2
mkdir -p "$out"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
test_name=render_large_test
# shellcheck source=tests/report/chromium.sh
source "$(dirname "$0")/chromium.sh"

# The plan `parasol search --model llama3-70b --cluster dgx-h100 --gpus 64 --gbs 512` ranks
# first (written out so that the test does not depend on the search's ranking).
cat > "$out/plan.json" << 'JSON'
{"model": "llama3-70b", "cluster": "dgx-h100", "gpus": 64, "tp": 4, "pp": 4, "dp": 2, "cp": 2,
 "ep": 1, "sp": true, "schedule": "interleaved", "vpp": 2, "mbs": 1, "gbs": 512, "zero": 3,
 "reshard": "after_step", "recompute": "none", "offload": "none", "precision": "bf16",
 "flash_attention": true, "tp_comm_overlap": true, "overlap_grad_reduce": true,
 "overlap_param_gather": true, "rank_order": "tp-cp-ep-dp-pp"}
JSON
start=$(date +%s.%N)
"$bin" report --plan "$out/plan.json" -o "$out/large.html"
written=$(date +%s.%N)
"$bin" simulate --plan "$out/plan.json" --json > "$tmp/simulate.json"
echo "render_large_test: report written in $(awk "BEGIN { printf \"%.1f\", $written - $start }") s," \
     "$(( $(stat -c %s "$out/large.html") / 1000000 )) MB"

# After the page's script: what the timeline drew first (its rects, marker and view, as JSON in
# body[data-coarse]), how long the page took to get there, then twelve presses of "zoom in".
probe='<script>(function () {
var s = document.getElementById("tl-svg"), b = document.body;
var rects = [].map.call(document.querySelectorAll("#tl-items rect"), function (r) {
  return [Number(r.getAttribute("data-r")), Number(r.getAttribute("x")), Number(r.getAttribute("width"))];
});
var m = document.getElementById("tl-end"), plot = document.getElementById("tl-plot");
b.setAttribute("data-load-ms", String(Math.round(performance.now())));
b.setAttribute("data-coarse", JSON.stringify({rects: rects, mode: s.getAttribute("data-mode"),
  view: s.getAttribute("data-view-us"), marker: Number(m.getAttribute("x1")) - Number(plot.getAttribute("x")),
  marker_visible: m.getAttribute("visibility"),
  width: Number(plot.getAttribute("width"))}));
var t0 = performance.now();
for (var i = 0; i < 12; ++i) document.getElementById("tl-in").click();
b.setAttribute("data-zoom-ms", String(Math.round(performance.now() - t0)));
})();</script>'
python3 -c 'import sys; page = open(sys.argv[1], encoding="utf-8").read(); i = page.rindex("</body>")
open(sys.argv[3], "w", encoding="utf-8").write(page[:i] + sys.argv[2] + page[i:])' \
  "$out/large.html" "$probe" "$tmp/probe.html"
browse --dump-dom "file://$tmp/probe.html" > "$out/large.dom.html"
browse --screenshot="$out/large.png" "file://$out/large.html"

python3 - "$out" "$tmp/simulate.json" << 'PY'
import html, json, re, struct, sys

out, simulate_path = sys.argv[1:3]
failures = []

def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)

sim = json.load(open(simulate_path))
page = open(f"{out}/large.html", encoding="utf-8").read()
def block(text, name):
    m = re.search(r'<script type="application/json" id="%s">(.*?)</script>' % name, text, re.S)
    return json.loads(m.group(1))
data = block(page, "parasol-data")
T = data["timeline"]
detail = block(page, "parasol-ops")
dom = open(f"{out}/large.dom.html", encoding="utf-8").read()
body = dict(re.findall(r'([\w-]+)="([^"]*)"', re.search(r"<body([^>]*)>", dom).group(1)))

check(body.get("data-rendered") == "ok", f"the script drew everything ({body.get('data-rendered')})")
check(body.get("data-errors") == "0", f"no script error ({body.get('data-errors')})")
print(f"page: {T['total_events']} ops, {len(page) / 1e6:.1f} MB; drawn in {body.get('data-load-ms')} ms "
      f"after navigation; 12 zooms in {body.get('data-zoom-ms')} ms")

# Every op inlined, as many as the simulator played.
tick = T["tick_s"]
rows = []  # per row: [(start, end)] in ticks
for flat in detail:
    t, ops = 0, []
    for j in range(0, len(flat), 4):
        s = t + flat[j]
        t = s + flat[j + 1]
        ops.append((s, t))
    rows.append(ops)
n_ops = sum(len(r) for r in rows)
check(T["detail"]["complete"] and n_ops == T["total_events"] == sim["ops_simulated"] >= 900000,
      f"every one of the simulator's {sim['ops_simulated']} ops is inlined ({n_ops})")
step = sim["step_time_s"]
check(abs(T["step_time_s"] - step) <= 1e-12 * step,
      f"the timeline's step time is `simulate --json`'s ({T['step_time_s']} vs {step})")

# The coarsest zoom: the whole step, the marker at the step time, the drawing up to it.
C = json.loads(html.unescape(body["data-coarse"]))
v0, v1 = (float(x) for x in C["view"].split(","))
PW = C["width"]
check(v0 == 0 and v1 >= step * 1e6 * (1 - 1e-9), f"the first view is the whole step ({C['view']} us)")
want = (step * 1e6 - v0) / (v1 - v0) * PW
check(C["marker_visible"] == "visible" and abs(C["marker"] - want) <= 0.5,
      f"the end marker at the simulated step time: x {C['marker']} (want {want:.2f} of {PW})")
check(C["mode"] == "coarse", f"first drawn from the coarse level ({C['mode']})")
right = max(x + w for _, x, w in C["rects"])
# A rect is at least a pixel wide, so the step's last op (the host's closing sync, microseconds
# long) may start at the last pixel and end a pixel past it; the view ends a hair after the step.
check(-1 <= right - want <= 1 + 1e-3, f"the drawing reaches the end of the step (x {right:.2f}, want {want:.4f})")
check(len(C["rects"]) <= len(T["rows"]) * PW, f"at most a rect a pixel per row ({len(C['rects'])})")

px = (v1 - v0) * 1e-6 / tick / PW  # ticks per pixel
def columns(spans):
    cols = set()
    for a, b in spans:
        lo = int(a // 1)
        hi = max(lo + 1, int(-(-b // 1)))
        cols.update(range(max(lo, 0), min(hi, int(PW) + 1)))
    return cols
def dilate(cols):
    return cols | {c - 1 for c in cols} | {c + 1 for c in cols}
labels = [r["label"] for r in T["rows"]]
stages = sim["stages"]
for st in stages:
    s = st["stage"]
    label = f"stage {s} compute"
    if label not in labels:
        check(False, f"a row for {label}")
        continue
    r = labels.index(label)
    drawn = columns((x, x + w) for rr, x, w in C["rects"] if rr == r)
    busy = columns(((a - v0 * 1e-6 / tick) / px, (b - v0 * 1e-6 / tick) / px) for a, b in rows[r])
    cover = len(drawn) / PW
    check(busy <= dilate(drawn) and drawn <= dilate(busy),
          f"{label}: drawn where its ops are ({len(drawn)} columns drawn, {len(busy)} busy; "
          f"{len(busy - dilate(drawn))} busy not drawn, {len(drawn - dilate(busy))} drawn not busy)")
    check(cover >= st["compute"] / step - 0.01 and cover > 0.5,
          f"{label}: covers {100 * cover:.1f}% of the step, its compute time is "
          f"{100 * st['compute'] / step:.1f}%")

# Zoomed in: every op in view is its own rect, where it is.
mode = re.search(r'<svg id="tl-svg"[^>]*data-mode="(\w+)"', dom)
view = re.search(r'<svg id="tl-svg"[^>]*data-view-us="([\d.]+),([\d.]+)"', dom)
z0, z1 = float(view.group(1)) * 1e-6 / tick, float(view.group(2)) * 1e-6 / tick
zpx = (z1 - z0) / PW
evs = [dict(re.findall(r'([\w-]+)="([^"]*)"', m)) for m in re.findall(r'<rect class="ev"([^>]*)>', dom)]
spans = re.findall(r'<rect class="span"', dom)
# An op in view: it ends at or after the window's start and starts by its end (1 tick of
# rounding either way in data-view-us).
inside = sum(1 for ops in rows for a, b in ops if b >= z0 + 1 and a <= z1 - 1)
maybe = sum(1 for ops in rows for a, b in ops if b >= z0 - 1 and a <= z1 + 1)
check(mode and mode.group(1) == "ops" and not spans and inside > 0 and inside <= len(evs) <= maybe,
      f"zoomed in to {(z1 - z0) * tick * 1e3:.2f} ms: every op in view drawn on its own "
      f"({len(evs)} rects, {inside}..{maybe} ops)")
placed = all(abs(float(e["x"]) - max((rows[int(e["data-r"])][int(e["data-i"])][0] - z0) / zpx, -1)) <= 0.02
             for e in evs)
check(placed, "zoomed in: each op's rect starts at the op's start")

with open(f"{out}/large.png", "rb") as f:
    head = f.read(24)
check(head[:8] == b"\x89PNG\r\n\x1a\n" and struct.unpack(">II", head[16:24]) == (1200, 1600),
      "a 1200 x 1600 screenshot")
if failures:
    print(f"render_large_test: FAIL: {len(failures)} check(s) failed", file=sys.stderr)
    sys.exit(1)
print("render_large_test: all checks passed")
PY
