#!/usr/bin/env bash
# The sanitizer half of the README's test command: builds parasol and its tests with clang under
# AddressSanitizer and UndefinedBehaviorSanitizer into ./build-san (libFuzzer targets included,
# PARASOL_FUZZ; scripts/configure-san.sh), then runs every CPU test there, the mpirun ones
# included, and fuzzes each reader deterministically (ctest label `fuzz`: a fixed seed and a fixed
# run count per target, tests/fuzz/CMakeLists.txt; random, longer fuzzing is
# scripts/fuzz-explore.sh). Tests that measure time or resident memory are
# left to the plain build (a sanitizer multiplies both); scripts/sanitize.supp lists what the
# sanitizers are told to ignore, each with its reason.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=${PARASOL_JOBS:-2}
bash scripts/configure-san.sh "$@"  # extra CMake arguments (scripts/test.sh: a unity build)
cmake --build build-san -j "$jobs"
echo "sanitize.sh: build took ${SECONDS} s"
source scripts/san-env.sh
cd build-san
# Left to the plain build: tests that measure time or resident memory (the loop check, the
# 131,072-GPU memory bound), the GPU tests (no GPU here), and the trainer suite's second and third
# runs in the strict device and NCCL-semantics modes (the same kernels and ops as its first run,
# which does run here; they test what the host may touch and when transfers complete). The trainer
# suite itself (trainer_mpi_test_np8) is out too, for CI time: under ASan it takes 190-260 s on
# two cores (it passed so, alone and beside the other MPI suites, after one unexplained failure
# at 208 s in a CI run whose output was not kept); executor_names_test and `parasol run` run the
# trainer here. The accuracy bars of the event simulator (the published suites played op by op,
# about 5 min under ASan; the plain build checks the figures and the engine's other suites run
# here) are left out for CI time.
skip='loop_check|CliScale\..*|trainer_mpi_test_np8.*|.*_strict_device|.*_nccl_semantics'
skip+='|Predictors/AccuracyBars\..*simulate.*'
# Also left to the plain build: the JSON Schema check of every command's --json (the same outputs
# the suites here produce), the Chromium render of the HTML report (the report library's suite
# runs here), the install test (a sanitized static library needs a sanitized consumer) and the
# numeric-flag sweep (the executable started some 500 times; its checks are CLI11 validators).
skip+='|json_schemas|report_render|report_render_large|report_render_sweep|install_package|numeric_flags'
# For CI time (each over 30 s under ASan, up to 16 times their plain time, and checked there):
# the profile sensitivity of the published suites (numerics of the closed form), the CLI tests
# that search big spaces (the search, export and progress-bar code runs here in their own
# suites), and the seeded JSON mutations (the libFuzzer targets below fuzz the same readers).
skip+='|ProfileSensitivity.*|SearchCommandProgress\..*|ExportCli\..*Search.*'
skip+='|JsonFuzz\.SeededRandomMutations'
# The soak (1,000 steps killed and resumed, about 2 min under ASan): checkpoints and resumes run
# here in the CliRun suite.
skip+='|soak'
# Searches that export every plan they list (minutes in the plain build): the plain build runs them.
skip+='|FrameworkFilter\..*|Models/FrameworkFilter\..*'
# The sweep through the executable (a dozen full searches, several times over, and under mpirun:
# over 3 min under ASan); the sweep's own suite (tools/sweep_test) runs here.
skip+='|sweep_cli'
# The binaries of which every test is left to the plain build above (trainer_mpi_test,
# profile_sensitivity_test, framework_filter_test) are not built here either (PARASOL_SANITIZE in
# their tests/*/CMakeLists.txt): their three compiles took 94 s of CPU under clang and ASan.
# Tests that call MPI_Init (mpirun tests, `parasol run`): Open MPI's libraries have no frame
# pointers, so their leak stacks need the slow unwinder (slow everywhere: only for these) for the
# suppressions to see which library allocated.
mpi_run='CliRun\..*|Cli\.RunTraceFeedsCompareAndCalibrate|Cli\.RunTraceWithoutOpIdsComparesByKindAsPlainCompare'
# The executor's contract check through `parasol run` (MPI_Init, then an internal error).
mpi_run+='|FailureKinds\.AMalformedProgramFailsTheExecutorAsABug'
# The fuzzers' findings through the command line start `parasol run` too (token files, checkpoints).
mpi_run+='|fuzz_regressions_cli'
# The suites registered as skipped (label `skipped`: the CUDA parts and the Python module are not
# built here) are the plain build's; each ctest run writes a JUnit file for skipped-summary.sh.
ASAN_OPTIONS=$asan ctest --output-on-failure -j "$jobs" -LE 'gpu|mpi|skipped' \
  -E "^($skip|$mpi_run)$" --output-junit ctest-nompi.xml
echo "sanitize.sh: build and tests without MPI took ${SECONDS} s"
export ASAN_OPTIONS="$asan:fast_unwind_on_malloc=0"
ctest --output-on-failure -j "$jobs" -L mpi -E "^($skip)$" --output-junit ctest-mpi.xml
ctest --output-on-failure -j "$jobs" -R "^($mpi_run)$" --output-junit ctest-mpirun.xml
echo "sanitize.sh: left to the plain build (time or memory measured, or too slow under ASan):" \
  "${skip//|/, }"
