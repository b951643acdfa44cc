#!/usr/bin/env bash
# Written by parasol export --to torchtitan (torchtitan v0.2.2 (pytorch/torchtitan 73a0e69)).
# Run from a torchtitan v0.2.2 checkout; CONFIG_FILE is this folder's torchtitan.toml.
set -euo pipefail
CONFIG_FILE=${CONFIG_FILE:-$(dirname "$0")/torchtitan.toml}
NGPU=8 CONFIG_FILE="$CONFIG_FILE" ./run_train.sh "$@"
