#!/usr/bin/env bash
# tools/loop-check.sh: closes parasol's loop on this host's CPU runtime (issue 7). For a set of
# plans of tiny-to-small models on the `localhost` cluster it
#   (a) probes the host (`parasol calibrate --probe`: the cpu-host profile),
#   (b) predicts each plan's step time (`parasol simulate --profile`, fp32),
#   (c) runs it (`mpirun -np N parasol run --trace`, the median of the last steps),
#   (d) calibrates a profile on every other plan (`parasol calibrate --base host profile`) and
#       predicts the held-out ones with it,
#   (e) prints predicted and measured step times and the mean absolute step-time error of the
#       held-out plans before (probed profile) and after calibration.
# Exit status: 0; 1 when the held-out error after calibration exceeds --bound PCT (default 15,
# the issue's bar); 3 when it does but other processes took over 20% of the CPUs during a kept
# run (inconclusive: the host was too busy to measure); 2 for a usage error or a failed command.
#
# One rank is one core (OPENBLAS_NUM_THREADS=1, as the probe measures one thread): plans of more
# ranks than the host has cores are skipped, since time-sliced ranks are not what the cost
# models describe. The host may be shared: before each run the script waits (up to --quiet-wait
# seconds, --wait-budget in all) until the other processes use under 10% of the CPUs, and a run
# during which they took more than 5% of the CPU time is repeated (up to --attempts times; the
# least disturbed one is kept, its share shown in the "other" column).
#
# --quick: four plans (two fitted, two held out), fewer steps, shorter waits: the CI version
# (tests/tools/CMakeLists.txt).
#
# Usage: tools/loop-check.sh [--bin build/tools/parasol] [--mpirun mpirun] [--out DIR] [--quick]
#          [--bound PCT (default 15)] [--steps S] [--trace-steps K] [--max-ranks N]
#          [--quiet-wait S] [--wait-budget S] [--attempts A] [--deadline S]
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
bin="${PARASOL:-$root/build/tools/parasol}"
mpirun="mpirun"
out=""
quick=0
bound=15
steps=""
trace_steps=""
cores="$(getconf _NPROCESSORS_ONLN 2>/dev/null || echo 1)"
max_ranks=$((cores < 8 ? cores : 8))
quiet_wait=60    # seconds to wait for a quiet host before one run
wait_budget=600  # seconds of such waits in all
deadline=0       # seconds for the whole check; past it on a busy host: inconclusive (exit 3)
attempts=3
while (($#)); do
  case "$1" in
    --bin) bin="$2"; shift 2 ;;
    --mpirun) mpirun="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --quick) quick=1; quiet_wait=5; wait_budget=20; attempts=2; deadline=90; shift ;;
    --deadline) deadline="$2"; shift 2 ;;
    --bound) bound="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    --trace-steps) trace_steps="$2"; shift 2 ;;
    --max-ranks) max_ranks="$2"; shift 2 ;;
    --quiet-wait) quiet_wait="$2"; shift 2 ;;
    --wait-budget) wait_budget="$2"; shift 2 ;;
    --attempts) attempts="$2"; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "loop-check: unknown argument '$1' (--help)" >&2; exit 2 ;;
  esac
done
[ -x "$bin" ] || { echo "loop-check: no parasol binary at $bin (--bin)" >&2; exit 2; }
bin="$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")"
if [ -z "$steps" ]; then steps=$((quick ? 5 : 8)); fi
if [ -z "$trace_steps" ]; then trace_steps=$((quick ? 3 : 5)); fi
if [ -z "$out" ]; then out="$(mktemp -d "${TMPDIR:-/tmp}/parasol-loop.XXXXXX")"; fi
mkdir -p "$out"
out="$(cd "$out" && pwd)"
data="$root/tests/data/loop"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1

# Plans: "name|model|ranks|flags"; "@x" is tests/data/loop/x.json. Of the plans that fit the
# host, the 1st, 3rd, ... are the calibration set and the 2nd, 4th, ... the held-out set, so
# both mix models and degrees.
if ((quick)); then
  plans=(
    "llama-1|@llama-s|1|--mbs 2 --gbs 4"
    "gpt-1|@gpt-s|1|--mbs 2 --gbs 4"
    "llama-tp2|@llama-s|2|--tp 2 --mbs 2 --gbs 4"
    "llama-dp2|@llama-s|2|--dp 2 --mbs 2 --gbs 4"
  )
else
  plans=(
    "llama-1|@llama-s|1|--mbs 2 --gbs 4"
    "gpt-1|@gpt-s|1|--mbs 2 --gbs 4"
    "llama-tp2|@llama-s|2|--tp 2 --mbs 2 --gbs 4"
    "llama-dp2|@llama-s|2|--dp 2 --mbs 2 --gbs 4"
    "gpt-dp2-zero1|@gpt-s|2|--dp 2 --zero 1 --mbs 2 --gbs 4"
    "gpt-tp2|@gpt-s|2|--tp 2 --mbs 2 --gbs 4"
    "llama-pp2|@llama-s|2|--pp 2 --mbs 1 --gbs 4"
    "llama-tp2-selective|@llama-s|2|--tp 2 --recompute selective --mbs 2 --gbs 4"
    "llama-dp2-zero3|@llama-s|2|--dp 2 --zero 3 --mbs 2 --gbs 4"
    "gpt-pp2|@gpt-s|2|--pp 2 --mbs 1 --gbs 4"
    "gpt-tp2-recompute|@gpt-s|2|--tp 2 --recompute full --mbs 2 --gbs 4"
    "llama-dp2-zero2|@llama-s|2|--dp 2 --zero 2 --mbs 2 --gbs 4"
    "tiny-mbs8|tiny|1|--mbs 8 --gbs 16"
    "tiny-gpt-dp2|tiny-gpt|2|--dp 2 --mbs 8 --gbs 16"
    "llama-tp2-dp2|@llama-s|4|--tp 2 --dp 2 --mbs 2 --gbs 8"
    "gpt-pp2-dp2|@gpt-s|4|--pp 2 --dp 2 --mbs 1 --gbs 8"
    "llama-tp4|@llama-s|4|--tp 4 --mbs 2 --gbs 4"
    "gpt-tp2-pp2|@gpt-s|4|--tp 2 --pp 2 --mbs 1 --gbs 4"
    "llama-tp2-pp2-dp2|@llama-s|8|--tp 2 --pp 2 --dp 2 --mbs 1 --gbs 8"
    "gpt-tp2-dp4|@gpt-s|8|--tp 2 --dp 4 --mbs 1 --gbs 8"
  )
fi

# CPU jiffies of the whole host: "busy total".
cpu_ticks() {
  local _ u n s i w q sq st rest
  read -r _ u n s i w q sq st rest </proc/stat
  echo "$((u + n + s + q + sq)) $((u + n + s + i + w + q + sq + st))"
}
hz="$(getconf CLK_TCK 2>/dev/null || echo 100)"
have_stat=0
[ -r /proc/stat ] && have_stat=1

# Waits until the host's CPUs are at least 90% idle over half a second: at most quiet_wait
# seconds, and at most what is left of wait_budget.
wait_quiet() {
  ((have_stat)) || return 0
  local start=$SECONDS b0 t0 b1 t1 limit=$quiet_wait
  ((limit < wait_budget)) || limit=$wait_budget
  while :; do
    read -r b0 t0 <<<"$(cpu_ticks)"
    sleep 0.5
    read -r b1 t1 <<<"$(cpu_ticks)"
    if ((t1 > t0 && 10 * (b1 - b0) < (t1 - t0))) || ((SECONDS - start >= limit)); then break; fi
  done
  wait_budget=$((wait_budget - (SECONDS - start)))
  ((wait_budget > 0)) || wait_budget=0
}

# Children's CPU seconds (user + system) of this shell so far, from `times` (run in this shell,
# not in a subshell, whose children's times start at 0), into the variable child_s.
child_cpu() {
  times >"$out/.times"
  child_s="$(awk 'END { s = 0
    for (i = 1; i <= NF; i++) { split($i, p, "m"); sub("s", "", p[2]); s += 60 * p[1] + p[2] }
    print s }' "$out/.times")"
}

# A numeric field of the "step" object of `parasol compare --json`.
step_field() {
  awk -v k="\"$2\":" '/^ "step": \{/ { f = 1; next } f && /^ \}/ { f = 0 }
    f && index($0, k) { gsub(/[ ,]/, ""); split($0, a, ":"); print a[2] }' "$1"
}

fail() {
  echo "loop-check: $1 failed; its output:" >&2
  cat "$2" >&2
  exit 2
}

echo "loop-check: $bin, $cores core(s), plans of <= $max_ranks ranks, $steps steps (median of" \
  "the last $trace_steps), output in $out"
wait_quiet
"$bin" calibrate --probe --threads 1 -o "$out/host.json" >"$out/probe.txt" 2>&1 ||
  fail "calibrate --probe" "$out/probe.txt"
head -n 1 "$out/probe.txt"

names=() models=() ranks=() flags=() others=() roles=()
for row in "${plans[@]}"; do
  IFS='|' read -r name model n fl <<<"$row"
  if ((n > max_ranks)); then continue; fi
  [[ "$model" == @* ]] && model="$data/${model#@}.json"
  names+=("$name") models+=("$model") ranks+=("$n") flags+=("$fl")
done
((${#names[@]} >= 2)) || { echo "loop-check: fewer than 2 plans fit $max_ranks ranks" >&2; exit 2; }

# (b) predict and (c) run every plan.
for i in "${!names[@]}"; do
  name="${names[$i]}" n="${ranks[$i]}"
  read -ra fl <<<"${flags[$i]}"
  spec=(--model "${models[$i]}" --cluster localhost --gpus "$n" --precision fp32 "${fl[@]}")
  "$bin" simulate "${spec[@]}" --profile "$out/host.json" --trace "$out/$name.probed.json" \
    >"$out/$name.simulate.txt" 2>&1 || fail "simulate of $name" "$out/$name.simulate.txt"
  best=""
  if ((deadline > 0 && SECONDS > deadline)); then
    echo "loop-check: inconclusive: ${deadline} s spent and the host is too busy to finish" >&2
    exit 3
  fi
  for ((a = 1; a <= attempts; a++)); do
    wait_quiet
    read -r b0 t0 <<<"$( ((have_stat)) && cpu_ticks || echo "0 0")"
    child_cpu
    c0="$child_s"
    w0="$(date +%s.%N)"
    "$mpirun" --oversubscribe --bind-to none -x OPENBLAS_NUM_THREADS -np "$n" "$bin" run \
      "${spec[@]}" --steps "$steps" --trace-steps "$trace_steps" --trace "$out/$name.try.json" \
      >"$out/$name.run.txt" 2>&1 || fail "run of $name" "$out/$name.run.txt"
    w1="$(date +%s.%N)"
    child_cpu
    c1="$child_s"
    read -r b1 t1 <<<"$( ((have_stat)) && cpu_ticks || echo "0 0")"
    # CPU share the other processes took during the run.
    other="$(awk -v b="$((b1 - b0))" -v hz="$hz" -v c0="$c0" -v c1="$c1" -v w0="$w0" -v w1="$w1" \
      -v cores="$cores" 'BEGIN { o = b / hz - (c1 - c0); if (o < 0) o = 0
        printf "%.3f", o / ((w1 - w0) * cores) }')"
    ((have_stat)) || other=0
    if [ -z "$best" ] || awk -v o="$other" -v b="$best" 'BEGIN { exit !(o < b) }'; then
      best="$other"
      mv "$out/$name.try.json" "$out/$name.measured.json"
    fi
    if awk -v o="$best" 'BEGIN { exit !(o <= 0.05) }'; then break; fi
  done
  rm -f "$out/$name.try.json"
  others+=("$best")
done

# (d) calibrate on the 1st, 3rd, ... plan; predict every plan with the fitted profile.
fit=()
for i in "${!names[@]}"; do
  if ((i % 2 == 0)); then roles+=("fit"); fit+=("$out/${names[$i]}.measured.json")
  else roles+=("held-out"); fi
done
"$bin" calibrate "${fit[@]}" --base "$out/host.json" -o "$out/fitted.json" \
  >"$out/calibrate.txt" 2>&1 || fail "calibrate" "$out/calibrate.txt"
sed -n 1p "$out/calibrate.txt"
sed -n '/parameter/,/^step time/p' "$out/calibrate.txt" | sed '$d'

# (e) the table.
printf '\n%-20s %-8s %5s %11s %11s %8s %11s %8s %6s\n' plan role ranks measured probed error \
  calibrated error other
rows=""
for i in "${!names[@]}"; do
  name="${names[$i]}" n="${ranks[$i]}"
  read -ra fl <<<"${flags[$i]}"
  spec=(--model "${models[$i]}" --cluster localhost --gpus "$n" --precision fp32 "${fl[@]}")
  "$bin" simulate "${spec[@]}" --profile "$out/fitted.json" --trace "$out/$name.fitted.json" \
    >"$out/$name.simulate-fitted.txt" 2>&1 || fail "simulate of $name" "$out/$name.simulate-fitted.txt"
  for p in probed fitted; do
    "$bin" compare "$out/$name.$p.json" "$out/$name.measured.json" --json \
      >"$out/$name.compare-$p.json" 2>&1 || fail "compare of $name" "$out/$name.compare-$p.json"
    "$bin" compare "$out/$name.$p.json" "$out/$name.measured.json" \
      >"$out/$name.compare-$p.txt" 2>&1 || true
  done
  m="$(step_field "$out/$name.compare-probed.json" measured_s)"
  p0="$(step_field "$out/$name.compare-probed.json" predicted_s)"
  p1="$(step_field "$out/$name.compare-fitted.json" predicted_s)"
  rows+="$name ${roles[$i]} $n $m $p0 $p1 ${others[$i]}"$'\n'
done
printf '%s' "$rows" | awk -v bound="$bound" '
  function ms(s) { return sprintf("%.2f ms", 1e3 * s) }
  function pct(x) { return sprintf("%+.1f%%", 100 * x) }
  NF == 7 {
    e0 = ($5 - $4) / $4; e1 = ($6 - $4) / $4
    printf "%-20s %-8s %5d %11s %11s %8s %11s %8s %5.0f%%\n", $1, $2, $3, ms($4), ms($5), pct(e0),
      ms($6), pct(e1), 100 * $7
    if ($7 > busiest) busiest = $7
    k = ($2 == "fit") ? "fit" : "held"
    n[k]++; a0[k] += (e0 < 0 ? -e0 : e0); a1[k] += (e1 < 0 ? -e1 : e1)
  }
  END {
    printf "\nmean absolute step-time error (probed profile -> calibrated profile):\n"
    printf "  calibration plans (%d): %.1f%% -> %.1f%%\n", n["fit"], 100 * a0["fit"] / n["fit"],
      100 * a1["fit"] / n["fit"]
    held = a1["held"] / n["held"]
    printf "  held-out plans    (%d): %.1f%% -> %.1f%%\n", n["held"], 100 * a0["held"] / n["held"],
      100 * held
    if (bound != "") {
      ok = (100 * held <= bound)
      printf "held-out error after calibration %.1f%% %s the bound of %s%%\n", 100 * held,
        ok ? "is within" : "EXCEEDS", bound
      if (!ok && busiest > 0.2) {
        printf "inconclusive: other processes took up to %.0f%% of the CPUs during a run\n",
          100 * busiest
        exit 3
      }
      exit !ok
    }
  }'
