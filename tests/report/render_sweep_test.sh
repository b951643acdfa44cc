#!/usr/bin/env bash
# `parasol report --sweep` rendered in a real browser: runs a 36-point sweep (gpt2-1.5b, device x
# gpus_per_server x nic_GBps x gpus of 256 and 512; about 30 s of CPU, where gpt3-175b's searches
# took 210 s: the page's checks below do not depend on the model, and every point still has a
# plan, its own figures and a front), writes its page, loads it in
# headless Chromium and checks the DOM after the script ran against the sweep's document: no
# script error (body data-rendered="ok" data-errors="0"); the default heatmap (device x
# gpus_per_server at the first nic_GBps and gpus) has 3 x 2 cells, each the row of its point with
# data-value the document's tokens/s, and with each other metric selected the document's time to
# train, GPU-hours (or cost) per token and energy; one front point per row with a plan, those
# marked on the front the non-dominated set of (GPU-hours or cost, time) computed here; one table
# row per row. A script injected after the page's own (as render_test.sh's zoom) clicks a cell and
# a front point: the point panel shows that row's plan, and the `parasol search` command it shows
# (with its cluster JSON) finds the same best plan. Also: `report --sweep` beside another flag is
# an error naming report.sweep (exit 2), and the screenshot is a 1200 x 1600 PNG.
# Without Chromium the test is skipped before the sweep runs (tests/report/chromium.sh).
# Usage: render_sweep_test.sh PARASOL_BIN OUT_DIR
set -euo pipefail
bin=$(realpath "$1")
out=$2
mkdir -p "$out"
out=$(realpath "$out")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
test_name=render_sweep_test
# shellcheck source=tests/report/chromium.sh
source "$(dirname "$0")/chromium.sh"

"$bin" sweep --model gpt2-1.5b --gbs 1536 --vary device=A100-80G,H100-SXM,B200 --vary gpus_per_server=8,72 --vary nic_GBps=25,50,100 --vary gpus=256,512 --json > "$tmp/sweep.json"
"$bin" report --sweep "$tmp/sweep.json" -o "$out/sweep.html"
browse --dump-dom "file://$out/sweep.html" > "$out/sweep.dom.html"
browse --screenshot="$out/sweep.png" "file://$out/sweep.html"

# Clicks: the page with a script after its own that selects each metric in turn (recording the
# cells' data-index and data-value), then clicks the heatmap's last cell and a point of the front,
# recording the point panel's row and plan after each click.
cat > "$tmp/click.js" << 'JS'
<script>
(function () {
  var b = document.body, m = document.getElementById('hm-metric'), metrics = {};
  function cells() {
    return Array.prototype.map.call(document.querySelectorAll('#hm-svg rect.hm-cell'),
        function (r) { return [r.getAttribute('data-index'), r.getAttribute('data-value')]; });
  }
  for (var i = 0; i < m.options.length; ++i) {
    m.value = m.options[i].value;
    m.dispatchEvent(new Event('change'));
    metrics[document.getElementById('hm-svg').getAttribute('data-metric')] = cells();
  }
  b.setAttribute('data-metrics', JSON.stringify(metrics));
  function click(e, name) {
    e.dispatchEvent(new MouseEvent('click', {bubbles: true}));
    var p = document.getElementById('point-detail');
    b.setAttribute('data-' + name + '-clicked', e.getAttribute('data-index'));
    b.setAttribute('data-' + name + '-shown', p.getAttribute('data-index'));
    b.setAttribute('data-' + name + '-plan', p.querySelector('code.pd-plan').textContent);
    b.setAttribute('data-' + name + '-command', p.querySelector('pre.pd-command').textContent);
  }
  var all = document.querySelectorAll('#hm-svg rect.hm-cell');
  click(all[all.length - 1], 'cell');
  click(document.querySelector('#pf-svg circle.pf-front'), 'front');
})();
</script>
JS
awk -v f="$tmp/click.js" '/<\/body>/ { while ((getline l < f) > 0) print l } { print }' \
  "$out/sweep.html" > "$tmp/click.html"
browse --dump-dom "file://$tmp/click.html" > "$out/click.dom.html"

# `report --sweep` takes only -o: any other flag is an error naming report.sweep.
for extra in --search "--tp 2" "--tokens 1e12"; do
  set +e
  # shellcheck disable=SC2086
  msg=$("$bin" report --sweep "$tmp/sweep.json" $extra -o "$tmp/x.html" 2>&1)
  code=$?
  set -e
  if [[ $code -ne 2 || $msg != *"error: report.sweep:"* ]]; then
    echo "render_sweep_test: FAIL: report --sweep with $extra gave exit $code: $msg" >&2
    exit 1
  fi
done

# The shown command runs with this build's parasol.
mkdir -p "$tmp/bin"
ln -s "$bin" "$tmp/bin/parasol"

python3 - "$out" "$tmp" << 'PY'
import html.parser, json, os, struct, subprocess, sys

out, tmp = sys.argv[1:3]
failures = []

def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)

class Dom(html.parser.HTMLParser):
    """Keeps <body>'s attributes and those of every element, by class."""
    def __init__(self):
        super().__init__()
        self.body, self.by_class = {}, {}
    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "body":
            self.body = a
        for c in (a.get("class") or "").split():
            self.by_class.setdefault(c, []).append(a)

def parse(path):
    d = Dom()
    with open(path, encoding="utf-8") as f:
        d.feed(f.read())
    return d

def close(a, b):
    return abs(a - b) <= 1e-9 * max(abs(a), abs(b), 1e-300)

doc = json.load(open(f"{tmp}/sweep.json"))
rows = doc["rows"]
by_index = {r["index"]: r for r in rows}
ok_rows = [r for r in rows if r["status"] == "ok"]
check(len(rows) == 36 and doc["sweep"]["points"] == 36, f"the sweep has 36 rows ({len(rows)})")
check([a["key"] for a in doc["sweep"]["axes"]] == ["device", "gpus_per_server", "nic_GBps", "gpus"],
      "the sweep's axes")
axes = {a["key"]: a["values"] for a in doc["sweep"]["axes"]}
priced = len(ok_rows) > 0 and all(r["train"].get("cost") is not None for r in ok_rows)
cost_key = "cost" if priced else "gpu_hours"

dom = parse(f"{out}/sweep.dom.html")
check(dom.body.get("data-rendered") == "ok", f"the script drew everything "
      f"(data-rendered={dom.body.get('data-rendered')})")
check(dom.body.get("data-errors") == "0", f"no script error (data-errors={dom.body.get('data-errors')})")

# The default heatmap: device x gpus_per_server at nic_GBps = 25 and gpus = 256.
def default_rows():
    return {r["index"]: r for r in rows if r["point"]["nic_GBps"] == axes["nic_GBps"][0]
            and r["point"]["gpus"] == axes["gpus"][0]}
expected = default_rows()
cells = dom.by_class.get("hm-cell", [])
check(len(cells) == 3 * 2 == len(expected), f"the default heatmap has 3 x 2 cells ({len(cells)})")
got = {int(c["data-index"]): c.get("data-value") for c in cells if "data-index" in c}
check(set(got) == set(expected), f"a cell per point at nic_GBps 25, gpus 256 ({sorted(got)})")
for i, v in got.items():
    r = expected.get(i)
    if r is None or r["status"] != "ok":
        check(v is None and r is not None, f"cell {i}: no plan, no value")
        continue
    check(v is not None and close(float(v), r["tokens_per_s"]),
          f"cell {i} ({r['point']['device']}, {r['point']['gpus_per_server']}): tokens/s "
          f"{v} is the document's {r['tokens_per_s']}")

# Each metric, selected by the injected script.
click = parse(f"{out}/click.dom.html")
check(click.body.get("data-rendered") == "ok" and click.body.get("data-errors") == "0",
      "the clicks ran without a script error")
metrics = json.loads(click.body.get("data-metrics", "{}"))
figure = {
    "tokens_per_s": lambda r: r["tokens_per_s"],
    "time_s": lambda r: r["train"]["time_s"],
    "cost_per_token": lambda r: r["train"][cost_key] / r["train"]["tokens"],
    "energy_MWh": lambda r: r["train"]["energy_MWh"],
}
check(sorted(metrics) == sorted(figure), f"four metrics ({sorted(metrics)})")
for name, cells in metrics.items():
    good = len(cells) == 6 and all(
        i is not None and int(i) in expected and
        (close(float(v), figure[name](expected[int(i)])) if expected[int(i)]["status"] == "ok"
         else v is None)
        for i, v in cells)
    check(good, f"metric {name}: the 6 cells carry the document's figures")

# The front.
points = dom.by_class.get("pf-point", [])
check(sorted(int(p["data-index"]) for p in points) == sorted(r["index"] for r in ok_rows),
      f"one front-chart point per row with a plan ({len(points)} of {len(ok_rows)})")
def dominated(p):
    pt, pc = p["train"]["time_s"], p["train"][cost_key]
    return any(q["train"]["time_s"] <= pt and q["train"][cost_key] <= pc and
               (q["train"]["time_s"] < pt or q["train"][cost_key] < pc) for q in ok_rows)
front = {r["index"] for r in ok_rows if not dominated(r)}
marked = {int(p["data-index"]) for p in dom.by_class.get("pf-front", [])}
check(len(front) > 0 and marked == front,
      f"the marked points are the non-dominated set of ({cost_key}, time): {sorted(marked)} vs "
      f"{sorted(front)}")
check(len(dom.by_class.get("pf-step", [])) == 1, "the front's step line")

# The table.
table = dom.by_class.get("sweep-row", [])
check(len(table) == 36 and sorted(int(t["data-index"]) for t in table) == sorted(by_index),
      f"one table row per row ({len(table)})")

# The clicks: the panel shows the clicked row's plan.
for name in ("cell", "front"):
    i = click.body.get(f"data-{name}-clicked")
    r = by_index.get(int(i)) if i is not None else None
    check(r is not None and click.body.get(f"data-{name}-shown") == i and
          click.body.get(f"data-{name}-plan") == r.get("plan"),
          f"clicking a {name} shows row {i}'s plan ({click.body.get(f'data-{name}-plan')})")
check(int(click.body.get("data-front-clicked", -1)) in front, "the clicked front point is on the front")

# The shown command (cluster JSON, then `parasol search`) finds the row's best plan.
i = int(click.body["data-cell-clicked"])
command = click.body["data-cell-command"]
check(f"parasol search --model gpt2-1.5b --cluster cluster.json --gpus {by_index[i]['gpus']} "
      f"--gbs 1536" in command, "the panel shows the `parasol search` command")
work = os.path.join(tmp, "command")
os.makedirs(work)
env = dict(os.environ, PATH=os.path.join(tmp, "bin") + os.pathsep + os.environ["PATH"])
run = subprocess.run(["bash", "-c", "set -e\n" + command + " --json"], cwd=work, env=env,
                     capture_output=True, text=True)
ok = run.returncode == 0
# As render_test.sh compares search plans: the degrees and switches, not the names around them.
def plan(p):
    return {k: v for k, v in p.items() if k not in ("model", "cluster", "gpus")}
best = plan(json.loads(run.stdout)["best_plan"]) if ok else None
check(ok and best == plan(by_index[i]["best_plan"]),
      f"the panel's command finds row {i}'s best plan "
      f"({run.stderr.strip()[-300:] if not ok else 'same' if best == plan(by_index[i]['best_plan']) else best})")

with open(f"{out}/sweep.png", "rb") as f:
    head = f.read(24)
check(head[:8] == b"\x89PNG\r\n\x1a\n" and struct.unpack(">II", head[16:24]) == (1200, 1600),
      "a 1200 x 1600 screenshot")

if failures:
    print(f"render_sweep_test: FAIL: {len(failures)} check(s) failed", file=sys.stderr)
    sys.exit(1)
print("render_sweep_test: all checks passed")
PY
