#!/usr/bin/env bash
# Configures and builds parasol into ./build (Release), two jobs at a time.
# Extra arguments go to CMake's configure step (e.g. -DPARASOL_CUDA=OFF).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
cmake --build build -j "${PARASOL_JOBS:-2}"
