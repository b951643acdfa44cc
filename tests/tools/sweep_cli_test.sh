#!/usr/bin/env bash
# `parasol sweep` through the executable:
#  - the sweep given as a file (--file) gives the rows of its flags;
#  - a point equals `parasol search` on the same cluster written out by hand (the row's generator
#    JSON as a --cluster file): same best plan and step time;
#  - a sweep killed midway (SIGKILL once its journal holds two rows) and resumed gives the rows of
#    an uninterrupted run, keeps the journal's finished rows as written and says how many it
#    resumed; --csv has a line per point;
#  - under `mpirun -np 2` the rows equal one process's, and the ranks' journals merge into --out;
#  - bad axes exit 2 naming the axis and the value; a point without a plan is a row.
# Usage: sweep_cli_test.sh PARASOL_BIN MPIRUN WORK_DIR
set -euo pipefail
bin=$1
mpirun=$2
work=$3
rm -rf "$work"
mkdir -p "$work"
fail() {
  echo "sweep_cli_test: FAIL: $*" >&2
  exit 1
}
sweep=(sweep --model llama3-8b --cluster dgx-h100 --gbs 64 --vary device=A100-80G,H100-SXM,B200
       --vary gpus=8,16,32,64)
# Rows without the time each search took (the only field that may differ between runs).
rows() { python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); [r.pop("search_s") for r in d["rows"]]; print(json.dumps(d["rows"], sort_keys=True))' "$1"; }

"$bin" "${sweep[@]}" --threads 1 --json > "$work/whole.json"
python3 - "$work/whole.json" <<'PY' || fail "the sweep does not have 12 ok rows in order"
import json, sys
d = json.load(open(sys.argv[1]))
assert [r["index"] for r in d["rows"]] == list(range(12)), d["rows"]
assert all(r["status"] == "ok" for r in d["rows"])
assert d["rows"][5]["point"] == {"device": "H100-SXM", "gpus": 16}
PY

# The same sweep as a file (--file): the same rows.
cat > "$work/sweep-file.json" <<'JSON'
{"model": "llama3-8b", "cluster": "dgx-h100", "gbs": 64,
 "vary": {"device": ["A100-80G", "H100-SXM", "B200"], "gpus": "8:64:x2"}}
JSON
"$bin" sweep --file "$work/sweep-file.json" --threads 1 --json > "$work/from-file.json"
[[ $(rows "$work/from-file.json") == "$(rows "$work/whole.json")" ]] ||
  fail "sweep --file gives other rows than the same sweep's flags"
# An array of axes keeps its order: gpus first, then device (index = gpus slowest).
cat > "$work/sweep-array.json" <<'JSON'
{"model": "llama3-8b", "cluster": "dgx-h100", "gbs": 64,
 "vary": [{"key": "gpus", "values": [8, 16]}, {"key": "device", "values": ["A100-80G", "B200"]}]}
JSON
"$bin" sweep --file "$work/sweep-array.json" --threads 1 --csv > "$work/array.csv"
[[ $(sed -n 2p "$work/array.csv") == 0,8,A100-80G,ok,* && $(sed -n 3p "$work/array.csv") == 1,8,B200,ok,* ]] ||
  fail "an array of axes is not kept in its order: $(head -3 "$work/array.csv")"

# A point against `parasol search` on its cluster written out by hand.
for i in 1 10; do
  python3 -c 'import json,sys; r=json.load(open(sys.argv[1]))["rows"][int(sys.argv[2])]; json.dump(r["cluster"], open(sys.argv[3], "w")); print(r["gpus"])' \
    "$work/whole.json" $i "$work/cluster$i.json" > "$work/gpus$i"
  "$bin" search --model llama3-8b --cluster "$work/cluster$i.json" --gpus "$(cat "$work/gpus$i")" \
    --gbs 64 --top 1 --json > "$work/search$i.json"
  python3 - "$work/whole.json" $i "$work/search$i.json" <<'PY' || fail "point $i differs from parasol search"
import json, sys
row = json.load(open(sys.argv[1]))["rows"][int(sys.argv[2])]
search = json.load(open(sys.argv[3]))
best = dict(search["best_plan"]); best.pop("cluster")  # the file's path; the row holds the cluster
assert row["best_plan"] == best, (row["best_plan"], best)
assert row["step_time_s"] == search["top"][0]["estimate"]["step_time_s"]
PY
done

# Killed midway, then resumed.
"$bin" "${sweep[@]}" --threads 1 --out "$work/journal.jsonl" > /dev/null &
pid=$!
# Until the journal holds its header and two rows (however slow the build: sanitizers), while
# the sweep still runs.
while kill -0 $pid 2> /dev/null; do
  [[ -f $work/journal.jsonl && $(wc -l < "$work/journal.jsonl") -ge 3 ]] && break
  sleep 0.01
done
kill -9 $pid 2> /dev/null || fail "the sweep ended before it could be killed"
wait $pid 2> /dev/null || true
done_before=$(($(wc -l < "$work/journal.jsonl") - 1))
((done_before >= 2 && done_before < 12)) || fail "killed with $done_before rows done"
head -n 3 "$work/journal.jsonl" > "$work/first-rows.jsonl"
"$bin" "${sweep[@]}" --threads 1 --out "$work/journal.jsonl" --resume > "$work/resumed.txt"
grep -q "$done_before resumed from $work/journal.jsonl" "$work/resumed.txt" ||
  fail "the resumed run does not say it resumed $done_before points: $(head -2 "$work/resumed.txt")"
head -n 3 "$work/journal.jsonl" | cmp -s - "$work/first-rows.jsonl" ||
  fail "the finished rows were rewritten"
[[ $(wc -l < "$work/journal.jsonl") -eq 13 ]] || fail "the journal has $(wc -l < "$work/journal.jsonl") lines, not 13"
"$bin" "${sweep[@]}" --threads 1 --out "$work/journal.jsonl" --resume --json > "$work/resumed.json"
[[ $(rows "$work/resumed.json") == "$(rows "$work/whole.json")" ]] ||
  fail "the resumed sweep's rows differ from the uninterrupted one's"
"$bin" "${sweep[@]}" --threads 1 --out "$work/journal.jsonl" --resume --csv > "$work/rows.csv"
[[ $(wc -l < "$work/rows.csv") -eq 13 ]] || fail "--csv has $(wc -l < "$work/rows.csv") lines, not 13"

# Two MPI ranks: the same rows, the journal merged.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
"$mpirun" -np 2 --oversubscribe --bind-to none "$bin" "${sweep[@]}" --threads 1 --json \
  --out "$work/mpi.jsonl" > "$work/mpi.json"
[[ $(rows "$work/mpi.json") == "$(rows "$work/whole.json")" ]] ||
  fail "mpirun -np 2 gives other rows than one process"
[[ $(wc -l < "$work/mpi.jsonl") -eq 13 && ! -e $work/mpi.jsonl.rank0 && ! -e $work/mpi.jsonl.rank1 ]] ||
  fail "the ranks' journals were not merged into --out"

# Bad axes: exit 2, naming the axis and the value.
expect_error() {
  local want=$1
  shift
  set +e
  msg=$("$bin" sweep --model llama3-8b --cluster dgx-h100 "$@" 2>&1 > /dev/null)
  code=$?
  set -e
  [[ $code -eq 2 && $msg == *"$want"* ]] || fail "sweep $* gave exit $code: $msg (wanted: $want)"
}
expect_error "error: --vary nics: unknown key" --vary nics=8
expect_error "error: --vary gpus: has no values" --vary gpus=
expect_error "error: --vary nic_GBps: '0': cluster.nic_GBps:" --vary nic_GBps=50,0
expect_error "error: --vary device: 'Z100': " --vary device=H100-SXM,Z100
expect_error "error: --vary gpus: 'x8' is not a number" --vary gpus=x8
expect_error "error: --vary gpus: '1': no cluster of the sweep with gpus=1 can hold" --no-offload --vary gpus=1
expect_error "error: --resume: needs --out" --resume
# A point without a plan (one A100 cannot hold Llama 3 8B's 144.5 GB of bf16 training state, 18
# bytes a parameter; one 180 GB B200 and 16 of either can) is a row, exit 0.
"$bin" sweep --model llama3-8b --cluster dgx-h100 --gbs 64 --no-offload --vary gpus=1,16 \
  --vary device=A100-80G,B200 --json > "$work/mixed.json"
python3 - "$work/mixed.json" <<'PY' || fail "a point without a plan is not a no_plan row"
import json, sys
rows = json.load(open(sys.argv[1]))["rows"]
assert [r["status"] for r in rows] == ["no_plan", "ok", "ok", "ok"], rows
assert "cannot hold" in rows[0]["reason"]
PY
echo "sweep_cli_test: ok"
