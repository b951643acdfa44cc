#!/usr/bin/env bash
# `parasol report` rendered in a real browser: writes the report of a small plan, of the same plan
# with --tokens (time to train) and of a small search with --tokens, loads each in headless
# Chromium, and checks that the page's script ran to the end
# without an error (body data-rendered="ok" data-errors="0" in the DOM after load), that the
# drawing has the expected elements (one timeline rect per op of the inlined timeline, none merged
# as the plans are small, rows of
# both stages, a memory bar segment per non-empty buffer class of each stage, the time bars with
# their error-band whiskers; with --tokens the goodput bar's five segments and the figures of
# `parasol estimate --tokens --json`'s "job"; for the search one Pareto point per plan of `parasol
# search --tokens --json`'s front, one table row per top plan in its order and its best plan's
# time to train), and that the screenshots are 1200 x 1600 PNGs.
# Without Chromium the test is skipped, the reason printed (tests/report/chromium.sh).
# Usage: render_test.sh PARASOL_BIN OUT_DIR
set -euo pipefail
bin=$1
out=$2
mkdir -p "$out"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
test_name=render_test
# shellcheck source=tests/report/chromium.sh
source "$(dirname "$0")/chromium.sh"

plan_flags=(--model gpt2-124m --gpus 8 --tp 2 --pp 2 --mbs 1 --gbs 8)
# With planned stops every part of the goodput breakdown is non-zero.
job_flags=(--tokens 1e12 --price-per-gpu-hour 2.5 --planned-per-day 1)
search_flags=(--model gpt2-124m --gpus 8 --gbs 16 --tokens 1e12)
"$bin" report "${plan_flags[@]}" -o "$out/plan.html"
"$bin" report "${plan_flags[@]}" "${job_flags[@]}" -o "$out/job.html"
"$bin" report --search "${search_flags[@]}" --top 8 -o "$out/search.html"
"$bin" estimate "${plan_flags[@]}" --json > "$tmp/estimate.json"
"$bin" estimate "${plan_flags[@]}" "${job_flags[@]}" --json > "$tmp/estimate-job.json"
"$bin" search "${search_flags[@]}" --top 8 --json > "$tmp/search.json"

for page in plan job search; do
  browse --dump-dom "file://$out/$page.html" > "$out/$page.dom.html"
  browse --screenshot="$out/$page.png" "file://$out/$page.html"
done
# Zoom: the plan's page with a script after the page's own that presses "zoom in" and records the
# timeline's time window before and after (data-view-us: "start,end" in microseconds).
sed 's|</body>|<script>var s = document.getElementById("tl-svg"); document.body.setAttribute("data-view-before", s.getAttribute("data-view-us")); document.getElementById("tl-in").click(); document.body.setAttribute("data-view-after", s.getAttribute("data-view-us"));</script></body>|' \
  "$out/plan.html" > "$tmp/zoom.html"
browse --dump-dom "file://$tmp/zoom.html" > "$out/zoom.dom.html"

# A report's own command must reject a plan beside --search, naming the field.
set +e
msg=$("$bin" report --search --tp 2 "${search_flags[@]}" -o "$tmp/x.html" 2>&1)
code=$?
set -e
if [[ $code -ne 2 || $msg != *"error: report.search:"* ]]; then
  echo "render_test: FAIL: report --search --tp 2 gave exit $code: $msg" >&2
  exit 1
fi
# A job flag without --tokens is an error naming job.tokens (as `estimate`).
set +e
msg=$("$bin" report "${plan_flags[@]}" --planned-per-day 1 -o "$tmp/x.html" 2>&1)
code=$?
set -e
if [[ $code -ne 2 || $msg != *"error: job.tokens:"* ]]; then
  echo "render_test: FAIL: report --planned-per-day 1 without --tokens gave exit $code: $msg" >&2
  exit 1
fi

python3 - "$out" "$tmp/estimate.json" "$tmp/search.json" "$tmp/estimate-job.json" << 'PY'
import html.parser, json, struct, sys

out, estimate_path, search_path, estimate_job_path = sys.argv[1:5]
failures = []

def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)

class Dom(html.parser.HTMLParser):
    """Counts elements by class and keeps <body>'s attributes, those of elements with an id, the
    data block and texts."""
    def __init__(self):
        super().__init__()
        self.body, self.classes, self.texts, self.data, self._in_data = {}, {}, [], "", False
        self.ids = {}
    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "body":
            self.body = a
        if a.get("id"):
            self.ids[a["id"]] = a
        for c in (a.get("class") or "").split():
            self.classes[c] = self.classes.get(c, 0) + 1
        self._in_data = tag == "script" and a.get("id") == "parasol-data"
    def handle_endtag(self, tag):
        self._in_data = False
    def handle_data(self, d):
        if self._in_data:
            self.data += d
        else:
            self.texts.append(d)

def parse(name):
    d = Dom()
    with open(f"{out}/{name}.dom.html", encoding="utf-8") as f:
        d.feed(f.read())
    return d, json.loads(d.data)

def png_size(path):
    with open(path, "rb") as f:
        head = f.read(24)
    check(head[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is a PNG")
    return struct.unpack(">II", head[16:24])

estimate = json.load(open(estimate_path))
estimate_job = json.load(open(estimate_job_path))
search = json.load(open(search_path))
for name in ("plan", "job", "search"):
    dom, data = parse(name)
    check(dom.body.get("data-rendered") == "ok", f"{name}: the script drew everything "
          f"(data-rendered={dom.body.get('data-rendered')})")
    check(dom.body.get("data-errors") == "0", f"{name}: no script error "
          f"(data-errors={dom.body.get('data-errors')})")
    # A small plan's ops are fewer than the page draws one by one: a rect each, none merged.
    events = data["timeline"]["total_events"]
    check(0 < events <= data["timeline"]["draw_limit"] and dom.classes.get("ev", 0) == events
          and dom.classes.get("span", 0) == 0,
          f"{name}: one timeline rect per op ({dom.classes.get('ev', 0)} of {events})")
    check(dom.ids.get("tl-svg", {}).get("data-mode") == "ops", f"{name}: the timeline draws ops")
    labels = [t for t in dom.texts if t.startswith("stage ")]
    stages = len(data["memory"]["stages"])
    for s in range(stages):
        check(any(t.startswith(f"stage {s} compute") for t in labels),
              f"{name}: a timeline row for stage {s}'s compute stream")
    segments = sum(1 for st in data["memory"]["stages"] for b in st["peak_by_class_bytes"] if b > 0)
    check(segments >= stages and dom.classes.get("membar", 0) == segments,
          f"{name}: memory bar segments ({dom.classes.get('membar', 0)} of {segments})")
    check(dom.classes.get("hostbar", 0) == 1, f"{name}: the host memory bar")
    check(dom.classes.get("timebar", 0) >= 2, f"{name}: time breakdown bars")
    check(dom.classes.get("whisker", 0) == 6, f"{name}: two error-band whiskers")
    check(png_size(f"{out}/{name}.png") == (1200, 1600), f"{name}: a 1200 x 1600 screenshot")

dom, data = parse("plan")
zd = Dom()
zd.feed(open(f"{out}/zoom.dom.html", encoding="utf-8").read())
before = [float(x) for x in zd.body.get("data-view-before", "0,0").split(",")]
after = [float(x) for x in zd.body.get("data-view-after", "0,0").split(",")]
step_us = data["timeline"]["step_time_s"] * 1e6
check(before[0] == 0 and abs(before[1] - step_us) <= 1e-3 * step_us,
      f"plan: the timeline shows the whole step at first ({before})")
check(abs((after[1] - after[0]) - (before[1] - before[0]) / 2) <= 1e-3 * step_us and
      zd.body.get("data-errors") == "0", f"plan: zoom in halves the time window ({after})")
check(data["estimate"]["step_time_s"] == estimate["step_time_s"],
      "plan: the step time of `estimate --json`")
check(data["plan"]["tp"] == 2 and data["plan"]["pp"] == 2, "plan: the plan's degrees")
check(len(data["memory"]["stages"]) == 2, "plan: two stages")

dom, data = parse("search")
check(dom.classes.get("pareto-pt", 0) == len(search["pareto"]) > 0,
      f"search: one Pareto point per plan of `search --json`'s front "
      f"({dom.classes.get('pareto-pt', 0)} of {len(search['pareto'])})")
check(dom.classes.get("top-pt", 0) == len(search["top"]) == dom.classes.get("top-row", 0),
      f"search: one point and one table row per top plan ({len(search['top'])})")
check([c["estimate"]["step_time_s"] for c in data["search"]["top"]] ==
      [c["estimate"]["step_time_s"] for c in search["top"]], "search: the top plans of `search`")
check(data["plan"] == search["best_plan"] or
      {k: v for k, v in data["plan"].items() if k not in ("model", "cluster", "gpus")} ==
      {k: v for k, v in search["best_plan"].items() if k not in ("model", "cluster", "gpus")},
      "search: the sections below show the best plan")
dom, data = parse("plan")
check("job" not in data and "job-wall" not in dom.ids and "job" not in dom.ids,
      "plan: no time to train without --tokens")

dom, data = parse("job")
job = estimate_job["job"]
check(data["job"] == job, "job: the time to train of `estimate --tokens --json` (\"job\")")
parts = [k for k, v in job["breakdown_s"].items() if v > 0]
check(len(parts) == 5 and dom.classes.get("goodbar", 0) == 5,
      f"job: the goodput bar's five segments ({dom.classes.get('goodbar', 0)}; parts {parts})")
wall = dom.ids.get("job-wall", {})
check(wall.get("data-value") is not None and float(wall["data-value"]) == job["time_to_train_s"],
      f"job: the wall-clock figure is `estimate`'s time_to_train_s "
      f"({wall.get('data-value')} vs {job['time_to_train_s']})")
days = f"{job['time_to_train_days']:.1f} days"
check(job["time_to_train_days"] >= 1 and days in dom.texts, f"job: the page shows {days}")
check(f"{job['gpu_hours'] / 1e3:.1f}k" in dom.texts and f"{job['energy_MWh']:.1f} MWh" in dom.texts,
      "job: GPU-hours and energy as `estimate` gives them")
check(dom.classes.get("fig", 0) == 6 + 7, f"job: seven time-to-train figures beside the header's six")

dom, data = parse("search")
check(data["job"] == search["top"][0]["job"],
      "search: the best plan's time to train is `search --tokens`'s first")
check(all("job" in c for c in data["search"]["top"]), "search: each top plan's time to train")

if failures:
    print(f"render_test: FAIL: {len(failures)} check(s) failed", file=sys.stderr)
    sys.exit(1)
print("render_test: all checks passed")
PY
