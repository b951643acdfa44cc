#!/usr/bin/env bash
# The sanitizer half of the README's test command: builds parasol and its tests with clang under
# AddressSanitizer and UndefinedBehaviorSanitizer into ./build-san (libFuzzer targets included,
# PARASOL_FUZZ), then runs every CPU test there, the mpirun ones included, and fuzzes each reader
# for PARASOL_FUZZ_SECONDS (ctest label `fuzz`). Tests that measure time or resident memory are
# left to the plain build (a sanitizer multiplies both); scripts/sanitize.supp lists what the
# sanitizers are told to ignore, each with its reason.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=${PARASOL_JOBS:-2}
CC=clang CXX=clang++ cmake -S . -B build-san -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -gline-tables-only" -DPARASOL_CUDA=OFF \
  -DPARASOL_SANITIZE=ON -DPARASOL_FUZZ=ON \
  -DPARASOL_FUZZ_SECONDS="${PARASOL_FUZZ_SECONDS:-30}" >/dev/null
cmake --build build-san -j "$jobs"
supp=$PWD/scripts/sanitize.supp
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:detect_stack_use_after_return=0"
export LSAN_OPTIONS="suppressions=$supp:print_suppressions=0"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
cd build-san
# Timed or memory-measuring tests: the loop check (calibration against wall-clock time), the
# 131,072-GPU memory bound, and the benchmarks' GPU tests (no GPU here).
ctest --output-on-failure -j "$jobs" -LE gpu -E '^(loop_check|CliScale\.)'
