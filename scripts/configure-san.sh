#!/usr/bin/env bash
# Configures ./build-san: clang, AddressSanitizer and UndefinedBehaviorSanitizer, libFuzzer
# targets (PARASOL_FUZZ), CUDA off. Shared by scripts/sanitize.sh (the test command's sanitizer
# half) and scripts/fuzz-explore.sh (exploratory fuzzing). Extra arguments go to CMake.
set -euo pipefail
cd "$(dirname "$0")/.."
CC=clang CXX=clang++ cmake -S . -B build-san -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -gline-tables-only" -DPARASOL_CUDA=OFF \
  -DPARASOL_SANITIZE=ON -DPARASOL_FUZZ=ON "$@" >/dev/null
