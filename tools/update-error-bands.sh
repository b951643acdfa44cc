#!/usr/bin/env bash
# Regenerates cost_models/error_bands.json, the step-time error bands per family that parasol
# compiles into its default profiles, from the accuracy suites in tests/data/published/ (the
# closed-form estimate's residuals: `parasol accuracy --write-bands`). Run it after any change
# to the cost models or the suites; tests/cost_models/error_bands_test.cc fails until it is run.
#
#   tools/update-error-bands.sh [--build-dir DIR]    (default: build)
#
# It builds the parasol binary in DIR (-j2), writes the file, then rebuilds so that the binary
# carries the new bands.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="$root/build"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build-dir) build="$2"; shift 2 ;;
    -h|--help) sed -n '2,10p' "${BASH_SOURCE[0]}"; exit 0 ;;
    *) echo "update-error-bands.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
cd "$root"
[[ -f "$build/CMakeCache.txt" ]] || cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release
cmake --build "$build" -j2 --target parasol
suites=(tests/data/published/*.json)
"$build/tools/parasol" accuracy --write-bands cost_models/error_bands.json "${suites[@]}" |
  awk 'f; /^$/ {f = 1}'
cmake --build "$build" -j2 --target parasol
echo "wrote cost_models/error_bands.json from ${#suites[@]} suites"
