#!/usr/bin/env bash
# The README's main command: installs what is missing, builds the parasol executable (only it and
# its libraries: no test, benchmark or fuzz target) and runs the plan search on its embedded
# defaults (gpt3-175b on 1,024 GPUs of dgx-a100-80g, global batch 1,536).
# Arguments replace the default command line, e.g. scripts/run.sh show model llama3-8b.
# On a terminal the build shows CMake's progress; otherwise it is quiet unless it fails.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --build-only >&2
if [[ ! -f build/CMakeCache.txt ]]; then
  echo "run.sh: configuring the build (first run only)" >&2
  cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
fi
jobs=${PARASOL_JOBS:-$(nproc)}
if [[ -t 2 ]]; then
  echo "run.sh: building the parasol executable ($jobs jobs; the first build takes a few minutes)" >&2
  cmake --build build -j "$jobs" --target parasol >&2
else
  log=build/run-build.log
  if ! cmake --build build -j "$jobs" --target parasol >"$log" 2>&1; then
    tail -40 "$log" >&2
    echo "run.sh: the build failed; the whole log is in $log" >&2
    exit 1
  fi
fi
if (($#)); then exec build/tools/parasol "$@"; else exec build/tools/parasol search; fi
