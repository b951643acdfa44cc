#!/usr/bin/env bash
# Runs one libFuzzer target as CI does (ctest fuzz_<target>, tests/fuzz/CMakeLists.txt): from an
# empty output corpus, with a fixed seed and a fixed number of runs, corpus reloading off, so that
# the same tree and inputs always give the same verdict. libFuzzer first runs every seed and
# regression, then mutates. A finding (crash, leak, timeout, out-of-memory input) fails the test,
# and each input found is printed as base64 of its gzip with the command that keeps it as a
# regression: CI's log then carries it to whoever reads it next, even when the build folder is
# gone. Usage: run_fuzzer.sh TARGET EXE WORKDIR SEED RUNS INPUT_FOLDER...
set -uo pipefail
target=$1 exe=$2 work=$3 seed=$4 runs=$5
shift 5
rm -rf "$work"
mkdir -p "$work/corpus" "$work/found"
"$exe" -seed="$seed" -runs="$runs" -reload=0 -timeout=60 -rss_limit_mb=4096 -print_final_stats=1 \
  -artifact_prefix="$work/found/" "$work/corpus" "$@"
rc=$?
found=0
for f in "$work"/found/*; do
  [ -f "$f" ] || continue
  found=$((found + 1))
  name=$(basename "$f")
  echo "fuzz_$target: found $name ($(stat -c %s "$f") bytes, kept in $f). To keep it as a regression"
  echo "(then fix the reader it breaks), run from the repository root:"
  echo "base64 -d <<'B64' | gunzip > tests/fuzz/regressions/$target/$name"
  gzip -9c "$f" | base64 -w 100 | head -c 200000
  echo "B64"
done
if [ "$rc" -ne 0 ] && [ "$found" -eq 0 ]; then
  echo "fuzz_$target: the fuzzer exited $rc without an input to keep"
fi
exit "$rc"
