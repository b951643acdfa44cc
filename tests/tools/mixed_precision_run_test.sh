#!/usr/bin/env bash
# `parasol run` of a bf16 plan with flash attention on the CPU runtime, 2 ranks (tp 2): it trains
# (the loss falls), and each rank's measured peak device memory (the allocator's, the Program's
# buffers at their stored dtype) equals the liveness prediction (core/liveness.h) of its Program;
# once with Megatron's fused loss and once with the vocab-tiled loss (--tiled-loss: no fp32
# logits), whose peak is then lower.
# Usage: mixed_precision_run_test.sh PARASOL_BIN MPIRUN
set -uo pipefail
bin="$1"
mpirun="$2"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
check='
import json, sys
text = sys.argv[1]
j = json.loads(text[text.index("{"):])
fails = 0
assert j["plan"]["precision"] == "bf16", j["plan"]["precision"]
steps = j["steps"]
if not steps[-1]["loss"] < steps[0]["loss"]:
    print("FAIL: the loss did not fall:", [s["loss"] for s in steps]); fails += 1
if len(j["ranks"]) != 2:
    print("FAIL: ranks", j["ranks"]); fails += 1
for r in j["ranks"]:
    if r["peak_bytes"] != r["predicted_peak_bytes"] or r["peak_bytes"] <= 0:
        print("FAIL rank %d: measured %d bytes, liveness %d" %
              (r["rank"], r["peak_bytes"], r["predicted_peak_bytes"])); fails += 1
    else:
        print("ok   rank %d: measured peak = liveness prediction = %d bytes" %
              (r["rank"], r["peak_bytes"]), file=sys.stderr)
print(int(max(r["peak_bytes"] for r in j["ranks"])))
sys.exit(1 if fails else 0)
'
peaks=()
for tiled in off on; do
  echo "-- tiled loss $tiled"
  out="$(timeout 240 "$mpirun" --oversubscribe --bind-to none -np 2 "$bin" run --model tiny --tp 2 \
         --gbs 4 --mbs 2 --precision bf16 --flash-attention on --tiled-loss "$tiled" --steps 8 \
         --lr 0.003 --json 2>&1)"
  rc=$?
  if ((rc != 0)); then
    echo "FAIL: exit $rc"; echo "$out" | tail -20; exit 1
  fi
  peak="$(python3 -c "$check" "$out")" || { echo "$peak"; exit 1; }
  peaks+=("$peak")
done
if ((peaks[1] >= peaks[0])); then
  echo "FAIL: the tiled loss's peak ${peaks[1]} bytes is not below the fused loss's ${peaks[0]}"
  exit 1
fi
echo "ok   peak ${peaks[0]} bytes (fused loss), ${peaks[1]} bytes (tiled loss)"
