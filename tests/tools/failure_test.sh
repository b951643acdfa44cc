#!/usr/bin/env bash
# Failures end the job, cleanly, everywhere (issue 13, item 2), on the CPU runtime under mpirun:
#   1. one rank's step throws (fault injection: PARASOL_TEST_FAIL_AT=<rank>:<op id>) while the
#      other waits in a collective: every rank exits non-zero within 30 s, and the failing rank
#      and op are named;
#   2. one rank stalls (alive, silent): the other's transfer hits the communication timeout
#      (PARASOL_COMM_TIMEOUT_S), names the op, and the job ends non-zero;
#   3. one rank is killed (SIGKILL) mid-run: the job ends non-zero within 30 s.
# Usage: failure_test.sh PARASOL_BIN MPIRUN
set -uo pipefail
bin="$1"
mpirun="$2"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fails=0
args=("$bin" run --model tiny --dp 2 --gbs 4 --steps 200)

# 1. An injected failure on rank 1 at op 40 of its Program.
start=$SECONDS
out="$(PARASOL_TEST_FAIL_AT=1:40 timeout 40 "$mpirun" --oversubscribe -np 2 -x PARASOL_TEST_FAIL_AT \
       "${args[@]}" 2>&1)"
rc=$?
took=$((SECONDS - start))
if ((rc == 0 || rc == 124 || took > 30)); then
  echo "FAIL injected: exit $rc after $took s"; echo "$out" | tail -20; fails=1
elif ! grep -q "rank 1 of 2 failed in step 1" <<<"$out" || ! grep -q "op 40): injected failure" <<<"$out"; then
  echo "FAIL injected: the failing rank and op are not named:"; echo "$out" | tail -20; fails=1
else
  echo "ok   injected failure: exit $rc after $took s, rank and op named"
fi

# 2. A stalled rank (alive, silent) at op 40: its peer's transfer outlives the communication
#    timeout (--comm-timeout 3), which names the op and ends the job.
start=$SECONDS
out="$(PARASOL_TEST_STALL_AT=1:40 timeout 60 "$mpirun" --oversubscribe -np 2 \
       -x PARASOL_TEST_STALL_AT "${args[@]}" --comm-timeout 3 2>&1)"
rc=$?
took=$((SECONDS - start))
if ((rc == 0 || rc == 124 || took > 30)); then
  echo "FAIL stalled: exit $rc after $took s"; echo "$out" | tail -20; fails=1
elif ! grep -q "rank 0 of 2 failed" <<<"$out" || ! grep -q "no progress in" <<<"$out"; then
  echo "FAIL stalled: the timeout is not reported by the waiting rank:"; echo "$out" | tail -20
  fails=1
else
  echo "ok   stalled rank: exit $rc after $took s; $(grep -o 'rank 0 of 2 failed[^;]*' <<<"$out" | head -1)"
fi

# 3. SIGKILL of one rank while the job runs.
log="$(mktemp)"
start=$SECONDS
timeout 60 "$mpirun" --oversubscribe -np 2 "${args[@]}" >"$log" 2>&1 &
job=$!
victim=""
for _ in $(seq 1 100); do  # wait until both ranks train (up to 10 s)
  victim="$(pgrep -f "$bin run --model tiny --dp 2" | while read -r p; do
    [[ "$(ps -o comm= -p "$p")" == parasol* ]] && echo "$p"; done | tail -n1)"
  [[ -n "$victim" ]] && grep -q "^step 2 " "$log" && break
  sleep 0.1
done
if [[ -z "$victim" ]]; then
  echo "FAIL killed: no rank found to kill"; cat "$log" | tail -20; fails=1
else
  kill -9 "$victim"
  wait "$job"
  rc=$?
  took=$((SECONDS - start))
  if ((rc == 0 || rc == 124 || took > 40)); then
    echo "FAIL killed: exit $rc after $took s"; tail -20 "$log"; fails=1
  else
    echo "ok   killed rank $victim: the job ended with exit $rc after $took s"
  fi
fi
rm -f "$log"
exit "$fails"
