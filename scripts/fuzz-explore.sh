#!/usr/bin/env bash
# Exploratory fuzzing, for developers (CI fuzzes deterministically: scripts/sanitize.sh): builds
# the fuzz targets under ASan and UBSan (./build-san, scripts/configure-san.sh) and runs each named
# target (default: all) for SECONDS (default 600) from a random seed, growing a corpus kept
# between runs in ./fuzz-findings/<target>/corpus (not committed). Prints a line per target: the
# seconds it ran, its executions, the corpus it grew and what it found. Each input found is kept
# in ./fuzz-findings/<target>/; commit it to tests/fuzz/regressions/<target>/ with the fix of the
# reader it breaks (then every build replays it, and fuzz_regressions_cli runs it through the
# command line).
# Usage: scripts/fuzz-explore.sh [-t SECONDS] [-j PARALLEL] [TARGET...]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=600 parallel=1
while getopts "t:j:" o; do
  case $o in
    t) seconds=$OPTARG ;;
    j) parallel=$OPTARG ;;
    *) echo "usage: $0 [-t SECONDS] [-j PARALLEL] [TARGET...]" >&2; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
bash scripts/configure-san.sh
targets=("$@")
[ ${#targets[@]} -gt 0 ] ||
  mapfile -t targets < <(ctest --test-dir build-san -N -L fuzz | sed -n 's/.*Test *#[0-9]*: fuzz_//p')
cmake --build build-san -j "${PARASOL_JOBS:-2}" --target "${targets[@]/%/_fuzz}" >/dev/null
source scripts/san-env.sh
root=$PWD/fuzz-findings
# The seeds and regressions each target starts from, as ctest gives them (fuzz_<target>).
inputs_of() {
  ctest --test-dir build-san -N -V -R "^fuzz_$1\$" | sed -n 's/.* Test command: //p' |
    tr -d '"' | tr ' ' '\n' | grep -v '/found/' | while read -r p; do [ -d "$p" ] && echo "$p"; done
}
explore() {
  local t=$1 dir=$root/$1
  mkdir -p "$dir/corpus"
  local start=$SECONDS
  build-san/tests/fuzz/"$t"_fuzz -seed=0 -max_total_time="$seconds" -timeout=60 \
    -rss_limit_mb=4096 -print_final_stats=1 -artifact_prefix="$dir/" "$dir/corpus" \
    $(inputs_of "$t") >"$dir/log.txt" 2>&1 || true
  local execs found
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$dir/log.txt" | tail -1)
  found=$(find "$dir" -maxdepth 1 -type f \( -name 'crash-*' -o -name 'leak-*' -o -name 'timeout-*' \
    -o -name 'oom-*' -o -name 'slow-unit-*' \) | wc -l)
  printf '%-20s %5d s %10s execs %6d corpus %3d found (%s)\n' "$t" $((SECONDS - start)) \
    "${execs:-?}" "$(ls "$dir/corpus" | wc -l)" "$found" "$dir/log.txt"
}
export -f explore inputs_of
export root seconds
printf '%s\n' "${targets[@]}" | xargs -P "$parallel" -I{} bash -c 'explore {}'
