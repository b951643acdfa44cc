#!/usr/bin/env bash
# Soak (issue 13, item 5): trains `tiny` for 1,000 steps, checkpointing every 100, killed
# (SIGKILL) twice at random moments and resumed from the latest checkpoint each time; the steps
# after the last resume give exactly the uninterrupted run's losses and gradient norms (CPU,
# bit for bit: the data position, seeds and optimizer state all come back). The kill moments
# are random (printed, with the seed to rerun: SOAK_SEED).
# Usage: soak_test.sh PARASOL_BIN
set -uo pipefail
bin="$1"
seed="${SOAK_SEED:-$RANDOM}"
RANDOM=$seed
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
total=1000
common=(run --model tiny --gbs 2)
"$bin" "${common[@]}" --steps "$total" --json >"$dir/whole.json" 2>&1 || {
  echo "FAIL: the uninterrupted run failed"; tail "$dir/whole.json"; exit 1; }

latest_step() {  # the step of the checkpoint `latest` names, 0 without one
  [[ -f "$dir/ckpt/latest" ]] || { echo 0; return; }
  local name; name="$(cat "$dir/ckpt/latest")"; echo "$((10#${name#step-}))"
}

for kill in 1 2; do
  done_steps="$(latest_step)"
  resume=()
  ((done_steps > 0)) && resume=(--resume "$dir/ckpt")
  "$bin" "${common[@]}" --steps "$((total - done_steps))" "${resume[@]}" \
    --checkpoint "$dir/ckpt" --checkpoint-every 100 >"$dir/run$kill.log" 2>&1 &
  pid=$!
  # Kill once the run is past its next checkpoint, at a random step after it.
  target=$((done_steps + 100 + RANDOM % 300))
  for _ in $(seq 1 600); do
    last="$(grep -o '^step [0-9]*' "$dir/run$kill.log" | tail -n1 | cut -d' ' -f2)"
    [[ -n "$last" ]] && ((last >= target)) && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.01
  done
  kill -9 "$pid" 2>/dev/null
  wait "$pid" 2>/dev/null
  echo "kill $kill: at step ${last:-?} (target $target); latest checkpoint: step $(latest_step)"
done

from="$(latest_step)"
if ((from == 0)); then echo "FAIL: no checkpoint survived the kills (seed $seed)"; exit 1; fi
"$bin" "${common[@]}" --steps "$((total - from))" --resume "$dir/ckpt" --json \
  >"$dir/rest.json" 2>&1 || { echo "FAIL: the last resume failed"; tail "$dir/rest.json"; exit 1; }
python3 - "$dir/whole.json" "$dir/rest.json" "$from" "$seed" <<'PY'
import json, sys
whole = json.load(open(sys.argv[1]))["steps"]
rest = json.load(open(sys.argv[2]))["steps"]
start, seed = int(sys.argv[3]), sys.argv[4]
want = whole[start:]
bad = [(a["step"], a["loss"], b["loss"]) for a, b in zip(rest, want)
       if a["step"] != b["step"] or a["loss"] != b["loss"] or a["grad_norm"] != b["grad_norm"]]
if len(rest) != len(want) or bad:
    print(f"FAIL: resumed from step {start}: {len(rest)} steps, {len(want)} expected; "
          f"first differences (step, got, want): {bad[:3]} (seed {seed})")
    sys.exit(1)
print(f"ok   steps {start + 1}..{whole[-1]['step']} after two kills equal the uninterrupted run "
      f"bit for bit (seed {seed})")
PY
