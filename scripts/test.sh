#!/usr/bin/env bash
# The README's test command: installs what is missing, builds everything and runs every test.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh "$@"
cd build
ctest --output-on-failure -j "${PARASOL_JOBS:-2}"
