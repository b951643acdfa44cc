#!/usr/bin/env bash
# Speed of this checkout against an earlier revision, in one run on one machine: builds REV's
# parasol, search_bench and sim_bench (Release, CUDA off) in a worktree beside the repository
# (or takes them from --base-build DIR), then runs each benchmark of both builds alternately and
# prints the new/base ratio of each figure (> 1: the new build is faster for rates, slower for
# times, as the column says). Also times the default `parasol search` and the 131,072-GPU search.
#
#   tools/bench-against.sh REV [--base-build DIR] [--build-dir DIR] [--repetitions N]
#
# The figures are CPU timings of this machine; run it on an idle one.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
rev="" base_build="" build="$root/build" reps=3
while [[ $# -gt 0 ]]; do
  case "$1" in
    --base-build) base_build="$2"; shift 2 ;;
    --build-dir) build="$2"; shift 2 ;;
    --repetitions) reps="$2"; shift 2 ;;
    -h|--help) sed -n '2,10p' "${BASH_SOURCE[0]}"; exit 0 ;;
    -*) echo "bench-against.sh: unknown argument '$1'" >&2; exit 2 ;;
    *) rev="$1"; shift ;;
  esac
done
if [[ -z "$base_build" ]]; then
  [[ -n "$rev" ]] || { echo "bench-against.sh: give a revision or --base-build" >&2; exit 2; }
  tree="$root/../parasol-bench-base"
  git -C "$root" worktree add -f "$tree" "$rev" >/dev/null
  cmake -S "$tree" -B "$tree/build" -DCMAKE_BUILD_TYPE=Release -DPARASOL_CUDA=OFF >/dev/null
  cmake --build "$tree/build" -j "${PARASOL_JOBS:-2}" --target parasol search_bench sim_bench
  base_build="$tree/build"
fi
cmake --build "$build" -j "${PARASOL_JOBS:-2}" --target parasol search_bench sim_bench >/dev/null

filter='BM_PlanEvaluation/classic|BM_Search/gpt3_175b_1024|BM_LowerAndSimulateGpt3_1024|BM_LowerGpt3_1024|BM_SimulateGpt3_1024/0'
out=$(mktemp -d)
for i in $(seq "$reps"); do
  for which in base new; do
    dir=$base_build; [[ $which == new ]] && dir=$build
    for b in search_bench sim_bench; do
      "$dir/tests/bench/$b" --benchmark_filter="$filter" --benchmark_format=json \
        --benchmark_min_time=0.5 2>/dev/null >"$out/$which.$b.$i.json" || true
    done
  done
done
python3 - "$out" "$reps" <<'EOF'
import json, sys, glob, statistics
out, reps = sys.argv[1], int(sys.argv[2])
def load(which):
    r = {}
    for f in glob.glob(f"{out}/{which}.*.json"):
        try:
            for b in json.load(open(f))["benchmarks"]:
                r.setdefault(b["name"], []).append(b)
        except Exception:
            pass
    return r
base, new = load("base"), load("new")
print(f"{'benchmark':44s} {'base':>14s} {'new':>14s} {'new/base':>9s}")
for name in sorted(set(base) & set(new)):
    rates = [k for k in ("plans_per_s", "items_per_second") if k in base[name][0]]
    key = rates[0] if rates else "real_time"
    b = statistics.median(x[key] for x in base[name])
    n = statistics.median(x[key] for x in new[name])
    unit = key if rates else base[name][0].get("time_unit", "ns")
    print(f"{name:44s} {b:14.4g} {n:14.4g} {n / b:9.3f}  ({unit}, median of {reps})")
EOF
for which in base new; do
  dir=$base_build; [[ $which == new ]] && dir=$build
  for gpus in 1024 131072; do
    gbs=1536; [[ $gpus == 131072 ]] && gbs=16384
    s=$(date +%s.%N)
    "$dir/tools/parasol" search --model gpt3-175b --cluster dgx-a100-80g --gpus "$gpus" \
      --gbs "$gbs" --top 1 >/dev/null
    e=$(date +%s.%N)
    printf '%-4s parasol search gpt3-175b on %6d GPUs: %.2f s\n' "$which" "$gpus" \
      "$(echo "$e - $s" | bc)"
  done
done
rm -rf "$out"
