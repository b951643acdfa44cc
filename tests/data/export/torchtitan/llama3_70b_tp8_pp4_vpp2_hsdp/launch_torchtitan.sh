#!/usr/bin/env bash
# Written by parasol export --to torchtitan (torchtitan v0.2.2 (pytorch/torchtitan 73a0e69)).
# Run from a torchtitan v0.2.2 checkout; CONFIG_FILE is this folder's torchtitan.toml.
set -euo pipefail
CONFIG_FILE=${CONFIG_FILE:-$(dirname "$0")/torchtitan.toml}
# Run on each of the 16 servers (as multinode_trainer.slurm does); MASTER_ADDR = the first server.
torchrun --nnodes 16 --nproc_per_node 8 --rdzv_id 101 --rdzv_backend c10d \
  --rdzv_endpoint "${MASTER_ADDR:?set MASTER_ADDR}:29500" \
  -m torchtitan.train --job.config_file "$CONFIG_FILE" "$@"
