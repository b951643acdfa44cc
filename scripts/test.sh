#!/usr/bin/env bash
# The README's test command: installs what is missing, builds everything and runs every test,
# then builds the tests again under ASan and UBSan (build-san) and runs them with the fuzzers
# (scripts/sanitize.sh). It ends with the count of skipped tests and why (scripts/skipped-summary.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh "$@"
echo "test.sh: set-up and build took ${SECONDS} s"
(cd build && ctest --output-on-failure -j "${PARASOL_JOBS:-2}" --output-junit ctest.xml)
echo "test.sh: plain build and tests took ${SECONDS} s"
bash scripts/sanitize.sh
# Tests that could not run here (a missing dependency, no GPU), by name and reason.
bash scripts/skipped-summary.sh build/ctest.xml build-san/ctest-nompi.xml build-san/ctest-mpi.xml \
  build-san/ctest-mpirun.xml
echo "test.sh: everything took ${SECONDS} s"
