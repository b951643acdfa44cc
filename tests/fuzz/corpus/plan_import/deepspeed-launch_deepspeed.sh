#!/usr/bin/env bash
# Written by parasol export --to deepspeed: tiny on dgx-h100, 8 GPUs (1 x 8).
# Plan: tp 1, pp 1, dp 8, ZeRO 3, micro batch 1, global batch 8, recompute none, offload optimizer.
# Checked against DeepSpeed 0.19.6 (deepspeedai/DeepSpeed edaa722), Megatron-DeepSpeed (deepspeedai/Megatron-DeepSpeed 4efb479).
# parasol-export: model=tiny cluster=dgx-h100 gpus=8
set -euo pipefail
# This folder's files (hostfile, ds_config.json), wherever the script runs from.
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# A script that calls deepspeed.initialize (for a Hugging Face model: the Trainer with --deepspeed ds_config.json).
TRAIN_SCRIPT=${TRAIN_SCRIPT:-train.py}
deepspeed --hostfile="$HERE/hostfile" --num_nodes 1 --num_gpus 8 \
  "$TRAIN_SCRIPT" --deepspeed --deepspeed_config "$HERE/ds_config.json" "$@"
