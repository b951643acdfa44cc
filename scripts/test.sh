#!/usr/bin/env bash
# The README's test command: installs what is missing, builds everything and runs every test,
# then builds the tests again under ASan and UBSan (build-san) and runs them with the fuzzers
# (scripts/sanitize.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh "$@"
echo "test.sh: set-up and build took ${SECONDS} s"
(cd build && ctest --output-on-failure -j "${PARASOL_JOBS:-2}")
echo "test.sh: plain build and tests took ${SECONDS} s"
bash scripts/sanitize.sh
echo "test.sh: everything took ${SECONDS} s"
