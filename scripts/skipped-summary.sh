#!/usr/bin/env bash
# Counts the tests ctest did not run, and why, from the JUnit files of scripts/test.sh's ctest
# runs (ctest --output-junit): the suites registered as skipped because a dependency is missing
# (tests/CMakeLists.txt parasol_skipped_test, whose output starts "skipped: <reason>"), GTEST_SKIP
# inside a test ("[  SKIPPED ]", with the message gtest printed), and an MPI binary that exited
# with the skip code (tests/runtime/mpi_test_util.h: "N test(s) skipped: ...").
# Usage: skipped-summary.sh JUNIT.xml...   Prints one line per skipped test, then the count line.
set -uo pipefail
total=0
for f in "$@"; do
  [[ -f $f ]] || continue
  out=$(awk -v file="$f" '
    /<testcase / {
      name = $0; sub(/.*<testcase name="/, "", name); sub(/".*/, "", name)
      skipped = ($0 ~ /status="notrun"/); reason = ""; in_out = 0; next
    }
    skipped && /<skipped message=/ && reason == "" {
      msg = $0; sub(/.*message="/, "", msg); sub(/".*/, "", msg); fallback = msg
    }
    skipped && /<system-out>/ { in_out = 1; sub(/.*<system-out>/, "") }
    skipped && in_out && reason == "" {
      if (tolower($0) ~ /^skipped: /) { reason = substr($0, 10) }
      else if ($0 ~ /test\(s\) skipped:/) { reason = $0 }
      else if (prev ~ /Skipped$/ && $0 != "") { reason = $0 }
      prev = $0
    }
    /<\/testcase>/ {
      if (skipped) {
        if (reason == "") reason = fallback
        gsub(/&apos;/, "\x27", reason); gsub(/&quot;/, "\"", reason); gsub(/&lt;/, "<", reason)
        gsub(/&gt;/, ">", reason); gsub(/&amp;/, "\\&", reason)
        printf "  skipped %s: %s\n", name, reason
      }
      skipped = 0; in_out = 0; prev = ""
    }' "$f")
  if [[ -n $out ]]; then
    echo "$out"
    total=$((total + $(grep -c '^  skipped ' <<<"$out")))
  fi
done
echo "test.sh: $total test(s) skipped"
