#!/usr/bin/env bash
# The README's test command: installs what is missing, builds everything and runs every test,
# then builds the tests again under ASan and UBSan (build-san) and runs them with the fuzzers
# (scripts/sanitize.sh). It ends with the count of skipped tests and why (scripts/skipped-summary.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
# The libraries are compiled as unity sources (CMAKE_UNITY_BUILD, batches of 8 files; the test
# suites are not, tests/CMakeLists.txt), for CI time: they are compiled three times here (this
# build, the pip_install test's and the sanitizer build). A developer's build (scripts/build.sh)
# compiles file by file, so that both ways are built.
unity=(-DCMAKE_UNITY_BUILD=ON -DCMAKE_UNITY_BUILD_BATCH_SIZE=8)
bash scripts/build.sh "${unity[@]}" "$@"
echo "test.sh: set-up and build took ${SECONDS} s"
(cd build && ctest --output-on-failure -j "${PARASOL_JOBS:-2}" --output-junit ctest.xml)
echo "test.sh: plain build and tests took ${SECONDS} s"
bash scripts/sanitize.sh "${unity[@]}"
# Tests that could not run here (a missing dependency, no GPU), by name and reason.
bash scripts/skipped-summary.sh build/ctest.xml build-san/ctest-nompi.xml build-san/ctest-mpi.xml \
  build-san/ctest-mpirun.xml
echo "test.sh: everything took ${SECONDS} s"
